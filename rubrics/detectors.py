"""Deterministic detectors for the prescriptive rubrics, and the penalty they add.

The judge model checks the prescriptive rubrics too, but a small policy-as-critic misses them
often; these regex detectors make the two rules bite regardless:

- `initial_praise(text)`: the response OPENS by praising the user or the question
  ("Great question!", "What a fascinating question", "That's a great point",
  "Thanks for the great question", "I love this question"). Only the opening is read (after
  an optional greeting / interjection such as "Hi!", "Sure,", "Oh,"), and bare forms like
  "Good question" must end the clause ("Good question —", "Great question!", "Great
  question, ...") so "Great Britain is ...", "Great news: ..." and "A good question to ask
  is ..." are not praise.
- `self_justification(text)`: the response argues its own quality anywhere ("This response is
  clear and concise", "I have provided a comprehensive answer", "My response covers all
  aspects"). The subject must be the response itself (this/my/the above + response, answer,
  explanation, ...) or "I have provided/ensured ..."; hedges ("I hope this answer is
  helpful", "let me know if this explanation is clear") and negations are not flagged.

Both read normalized text (`normalize`: lower case, curly quotes → straight, whitespace
collapsed) and return the matched phrase or None.

    cfg = PrescriptiveConfig()
    penalty, hits = prescriptive_penalty("Great question! Paris.", cfg)
    # 0.5, {"initial_praise": "great question!"}
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import Field

from k2post.config.base import K2Config

_QUOTES = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'"}
    | {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"'}
)
OPENING_CHARS = 120
"""Praise must start within this many characters of the (normalized) response."""


def normalize(text: str) -> str:
    """Lower case, straight quotes, collapsed whitespace, leading markdown marks removed."""
    text = (text or "").translate(_QUOTES).lower()
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"^(?:[#>*_`~\-\s]+)", "", text)


# ---- initial praise -------------------------------------------------------------------------

_OPENER = (
    r"(?:(?:oh|ooh|ah|ahh|aw|wow|hey|hi|hello|there|sure|thing|well|ok|okay|so|yes|yeah|"
    r"absolutely|certainly|alright|of course|first of all|first off|firstly|honestly|"
    r"and)\b[\s,!.:;\-—–]*)*"
)
_INTENS = r"(?:(?:really|very|truly|super|such|absolutely|incredibly|excellent|an|a)\s+)*"
_STRONG = (
    r"(?:great|excellent|fantastic|fascinating|wonderful|brilliant|amazing|awesome|superb|"
    r"terrific|insightful|thoughtful|astute|perceptive|lovely|good|nice|cool|smart|clever|"
    r"thought-provoking|intriguing|profound|outstanding|stellar|splendid|marvelous|marvellous)"
)
_ADJ = rf"(?:{_STRONG}|interesting|important|valid|fair|deep|pertinent|relevant|timely|neat|solid)"
_ADJS = rf"{_ADJ}(?:(?:,\s*|\s+and\s+){_ADJ})*"
_NOUN = (
    r"(?:question|query|point|observation|topic|thought|inquiry|ask|idea|catch|insight|puzzle|"
    r"problem|choice|one|remark)"
)
_END = (
    r"(?=\s*(?:[!.,;:?…)]|—|–|\s-\s|--|$)"
    r"|\s+(?:you(?:'ve|\s+have)?\s+(?:asked|raised|posed|made|brought\s+up)|indeed|there)\b)"
)
_THANKS = (
    r"(?:thanks|thank\s+you)(?:\s+so\s+much|\s+very\s+much)?\s+for\s+"
    r"(?:the|this|your|such|asking|raising|sharing|a|an|\s)*"
)
_LOVE = (
    r"(?:i\s+(?:really\s+|absolutely\s+|just\s+)?(?:love|adore|like|enjoy)"
    r"|(?:really\s+|absolutely\s+|just\s+)?(?:love|adore))"
)
_LOVED = r"(?:question|query|thought|idea|curiosity|point|topic|observation)s?\b"
_YOU_RAISED = (
    r"you(?:'ve|\s+have)?\s+(?:asked|raised|raise|posed|made|make|brought\s+up|hit\s+on|touched\s+on)"
    r"\s+(?:a|an|such\s+an?|some)\s+"
)
_ABOUT = r"\s+(?:about|on|regarding)\b(?:(?!\s(?:is|are|was|were)\s)[^.!?]){0,60}!"
_PRAISE = tuple(
    re.compile(rf"^{_OPENER}(?P<p>{body})")
    for body in (
        # "What a fascinating question", "Such an interesting point"
        rf"(?:what|such)\s+an?\s+{_INTENS}{_ADJS}\s+{_NOUN}s?\b",
        # "That's a great point" (strong adjectives need no clause end)
        rf"(?:that'?s|that\s+is|this\s+is|these\s+are)\s+{_INTENS}{_STRONG}\s+{_NOUN}s?\b",
        # "It's an interesting question." / "That's a valid point,"
        rf"(?:that'?s|that\s+is|this\s+is|it'?s|it\s+is)\s+{_INTENS}{_ADJS}\s+{_NOUN}s?{_END}",
        # "Great question!", "Excellent question.", "Good question —", "A great question, ..."
        rf"{_INTENS}{_ADJS}\s+{_NOUN}{_END}",
        rf"{_INTENS}{_ADJS}\s+{_NOUN}s(?=\s*[!,])",
        rf"{_INTENS}{_ADJS}\s+{_NOUN}{_ABOUT}",
        # "Thanks for the great question", "Thank you for such an insightful question"
        rf"{_THANKS}{_INTENS}{_ADJS}\s+{_NOUN}s?\b",
        # "I love this question", "Love that you asked"
        rf"{_LOVE}\s+(?:this|that|your|the|such\s+a)\s+(?:\w+\s+)?{_LOVED}",
        rf"{_LOVE}\s+(?:that|how)\s+you(?:'re|\s+are)?\s+(?:asked|asking|ask|curious|thinking)\b",
        # "You've asked a great question", "You raise an excellent point"
        rf"{_YOU_RAISED}{_INTENS}{_ADJS}\s+{_NOUN}s?\b",
    )
)


def initial_praise(text: str) -> str | None:
    """The praise phrase the response opens with ("great question!"), else None."""
    head = normalize(text)[: OPENING_CHARS + 80]
    for pattern in _PRAISE:
        match = pattern.match(head)
        if match is not None and match.start("p") < OPENING_CHARS:
            return match.group("p").strip()
    return None


# ---- self-justification ---------------------------------------------------------------------

_SELF = (
    r"(?:this|my|the\s+above|the\s+preceding|the\s+previous|this\s+entire|my\s+entire|"
    r"the\s+present|this\s+final|my\s+final)\s+"
    r"(?:response|answer|reply|explanation|write-?up|summary|overview|breakdown|guide|walkthrough)"
)
_QUALITY = (
    r"(?:clear(?:er)?|concise|succinct|accurate|comprehensive|thorough|complete|detailed|precise|"
    r"informative|correct|objective|balanced|unbiased|relevant|engaging|rigorous|coherent|"
    r"logical|factual|exhaustive|polished|professional|insightful|helpful|excellent|good|great|"
    r"best|high[- ]quality|well[- ](?:structured|organi[sz]ed|written|reasoned|rounded|researched)|"
    r"easy\s+to\s+(?:understand|follow|read)|to\s+the\s+point)\b"
)
_FILLER = (
    r"(?:(?:very|quite|both|also|highly|extremely|fully|entirely|completely|overall|indeed|now|"
    r"thus|therefore|hence|so|as|more|most|really|truly|sufficiently|reasonably|generally)[\s,]+){0,3}"
)
_NOUNS = r"(?:response|answer|reply|explanation|overview|summary|breakdown|guide|walkthrough|write-?up)"
_BE = (
    r"(?:is|was|remains|should\s+be|will\s+be|has\s+been|aims\s+to\s+be|tries\s+to\s+be|"
    r"(?:is\s+)?(?:designed|written|structured|crafted|intended|meant)\s+to\s+be)"
)
_I_HAVE = r"\bi(?:'ve|\s+have)?\s+"
_A = r"(?:you\s+)?(?:with\s+)?(?:a|an)\s+"
_PROVIDED = r"(?:provided|given|written|offered|presented|delivered|put\s+together|crafted|laid\s+out)"
_COVERS = r"(?:covers|addresses|answers|tackles|handles)\s+(?:all|every|each|both|the\s+full|the\s+key)\b"
_ENSURED = r"(?:ensured|made\s+sure|tried\s+to\s+make\s+sure|made)\s+(?:that\s+)?(?:this|the|my)\s+"
_ADVERB = r"(?:clearly|concisely|thoroughly|comprehensively|accurately|carefully)(?:\s+and\s+\w+ly)?"
_DID = r"(?:explained|addressed|covered|answered|outlined|described)\b"
_JUSTIFY = tuple(
    re.compile(pattern)
    for pattern in (
        # "This response is clear and concise", "The above explanation is well-structured"
        rf"\b{_SELF}\s+{_BE}\s+{_FILLER}{_QUALITY}",
        # "My response covers all aspects"
        rf"\b{_SELF}\s+{_COVERS}(?:\s+\w+){{0,2}}",
        # "This response provides a thorough overview"
        rf"\b{_SELF}\s+(?:provides|offers|gives|delivers|presents)\s+{_A}{_FILLER}{_QUALITY}",
        # "I have provided a comprehensive answer" (the noun must be the response itself)
        rf"{_I_HAVE}{_PROVIDED}\s+{_A}{_FILLER}{_QUALITY}(?:[\w\s,-]{{0,20}}?)\b{_NOUNS}\b",
        # "I ensured that the answer is accurate", "I made this explanation as clear as possible"
        rf"{_I_HAVE}{_ENSURED}{_NOUNS}\s+(?:is\s+|as\s+)?{_FILLER}{_QUALITY}",
        # "I have thoroughly explained each step"
        rf"{_I_HAVE}{_ADVERB}\s+{_DID}",
        # "Overall, this is a clear, accurate and complete answer"
        rf"\bthis\s+(?:is|was)\s+(?:a|an)\s+{_FILLER}{_QUALITY}(?:,?\s+(?:and\s+)?[\w-]+){{0,4}}?\s+{_NOUNS}\b",
    )
)
_HEDGE = re.compile(r"\b(?:hope|if|whether|unsure|not\s+sure|let\s+me\s+know)\b")


def _sentence_prefix(text: str, pos: int) -> str:
    """The part of the sentence holding `pos` that comes before it."""
    start = max(text.rfind(mark, 0, pos) for mark in (". ", "! ", "? ", "\n"))
    return text[start + 1 : pos]


def self_justification(text: str) -> str | None:
    """The phrase where the response argues its own quality, else None."""
    norm = normalize(text)
    for pattern in _JUSTIFY:
        for match in pattern.finditer(norm):
            if not _HEDGE.search(_sentence_prefix(norm, match.start())):
                return match.group(0).strip()
    return None


# ---- penalty --------------------------------------------------------------------------------

DETECTORS: dict[str, Callable[[str], str | None]] = {
    "initial_praise": initial_praise,
    "self_justification": self_justification,
}
"""Detector name → function; the names key `PrescriptiveConfig` fields and penalty hits."""


class PrescriptiveConfig(K2Config):
    """Which prescriptive detectors run and how much score each hit costs."""

    initial_praise: bool = Field(True, description="Run the initial-praise detector ('Great question!').")
    initial_praise_penalty: float = Field(
        0.5, ge=0.0, le=1.0, description="Score subtracted when the response opens with praise."
    )
    self_justification: bool = Field(
        True, description="Run the self-justification detector ('This response is clear and concise')."
    )
    self_justification_penalty: float = Field(
        0.5, ge=0.0, le=1.0, description="Score subtracted when the response argues its own quality."
    )


def prescriptive_penalty(text: str, cfg: PrescriptiveConfig) -> tuple[float, dict[str, str]]:
    """Total penalty of the enabled detectors that fire, and detector name → matched phrase."""
    total, hits = 0.0, {}
    for name, detect in DETECTORS.items():
        if not getattr(cfg, name):
            continue
        phrase = detect(text)
        if phrase is not None:
            hits[name] = phrase
            total += getattr(cfg, f"{name}_penalty")
    return total, hits
