"""Read the judge's pairwise verdict out of free text, robust to junk and never with `eval`.

The judge is asked to end with `[[A]]`, `[[B]]` or `[[TIE]]`. Small models wander, so
`parse_verdict` tries, strongest signal first, and stops at the first kind it finds:

1. `bracket` — `[[A]]` / `[[b]]` / `[[ tie ]]`: the LAST one counts (a judge that quotes an
   injected `[[A]]` and then writes `[[B]]` gives B);
2. `json` — the last JSON object (found with `json.JSONDecoder.raw_decode`, nested objects
   searched too) with a `winner` / `better` / `verdict` / `preferred` / `choice` / `answer` key;
3. `phrase` — "Winner: A", "Response B is better", "Verdict: tie", "I prefer Response A",
   "Response A is worse" (→ B), "both responses are equally good" (→ tie); the last one counts;
4. `lone` — the last non-empty line is just a verdict ("A", "**B**", "(A).", "Tie").

At levels 1 and 3, signals that disagree on the line of the last one (`[[A]] [[B]]`,
"Winner: A. Response B is better.") make the reply unparseable: it is contradictory.
A bare lower-case "a" is only read as a verdict after a keyword and before the end of a
clause ("winner: a", not "the winner is a tie" or "I prefer a longer answer").

Only the last `MAX_CHARS` characters are read (after the last `</think>`), so huge replies
cost little. A tie is `PairVerdict(None, True, ...)`; an unreadable reply is
`PairVerdict(None, False, ...)` — callers count it as a tie and report it in metrics.

    parse_verdict("Both are fine, but B is shorter. [[B]]")   # PairVerdict('B', True, 'bracket')
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

Winner = Literal["A", "B"]
MAX_CHARS = 2000
"""How many trailing characters of a reply are read."""
_MAX_JSON_STARTS = 64
_MAX_JSON_DEPTH = 4
_TIE = "TIE"


@dataclass(frozen=True)
class PairVerdict:
    """Outcome of one judge call, in position terms (A = first shown, B = second)."""

    winner: Winner | None
    parsed: bool
    method: str

    @property
    def is_tie(self) -> bool:
        """A parsed tie (not an unparseable reply)."""
        return self.parsed and self.winner is None


_BRACKET = re.compile(r"\[\[\s*(a|b|tie)\s*\]\]", re.IGNORECASE)

# A verdict letter: after "response"/"assistant"/... any case; bare, upper case only (not
# "A tie"); bare lower case only when the clause ends right after it.
_PREFIXED = r"(?:response|assistant|output|option|candidate|answer)\s*[(\[]?\s*(?P<p>[ab])\b[)\]]?"
_BARE = r"(?P<u>(?-i:[AB]))\b(?!\s+(?:tie|draw)\b)|(?P<l>(?-i:[ab]))(?![\w'])(?!\s+\w)"
_LETTER = rf"(?:{_PREFIXED}|{_BARE})"
_TIE_WORD = r"(?P<t>tie|tied|draw|neither|equal|equally good|both)\b"
_KEY = (
    r"(?:final\s+verdict|verdict|winner|final\s+answer|decision|choice|"
    r"(?:the\s+)?better\s+(?:one|response)|best\s+response|preferred(?:\s+response)?)"
)
_BETTER = (
    r"(?:is|was|wins|looks)\s+(?:\w+\s+)?(?:better|superior|stronger|preferred|preferable|"
    r"the\s+winner|the\s+better\s+one|more\s+helpful)\b"
)
_WORSE = r"(?:is|was)\s+(?:\w+\s+)?(?:worse|weaker|inferior|less\s+helpful)\b"
_PREFER = r"\bi\s+(?:would\s+)?(?:prefer|choose|pick|select|go\s+with)\s+"
_EQUAL = (
    r"\b(?P<t>it'?s\s+a\s+tie|(?:both|the\s+two)(?:\s+responses)?\s+are\s+"
    r"(?:equally|equal|tied|about\s+the\s+same))"
)
_SEP = r"[\s*_'\"]*(?:is\b\s*:?|:|=|-|–|—)[\s*_'\"]*(?:clearly\s+|the\s+)?"
_PHRASES: tuple[tuple[re.Pattern[str], bool], ...] = (
    # (pattern, names the loser)
    (re.compile(rf"\b{_KEY}{_SEP}(?:(?:an?\s+)?{_TIE_WORD}|{_LETTER})", re.IGNORECASE), False),
    (re.compile(rf"\b{_LETTER}[\s*_]*{_BETTER}", re.IGNORECASE), False),
    (re.compile(rf"\b{_LETTER}[\s*_]*{_WORSE}", re.IGNORECASE), True),
    (re.compile(rf"{_PREFER}{_LETTER}", re.IGNORECASE), False),
    (re.compile(_EQUAL, re.IGNORECASE), False),
)
_LONE = re.compile(
    r"^[\s*_`\"'(\[]*(?:(?:final\s+)?(?:verdict|answer|winner)\s*[:\-]?\s*)?"
    r"(?:(?:response|assistant|option)\s*)?(a|b|tie|draw)[\s*_`\"')\].!]*$",
    re.IGNORECASE,
)
_JSON_KEYS = ("winner", "better", "verdict", "preferred", "preference", "choice", "answer", "result")


def _normalize_value(value: Any) -> str | None:
    """'A' / 'B' / 'TIE' for a verdict-like string ("Response A", "b", "tie"), else None."""
    if not isinstance(value, str):
        return None
    text = re.sub(r"^(?:response|assistant|option)[\s_]*", "", value.strip().lower())
    if text in ("a", "b"):
        return text.upper()
    if text in ("tie", "draw", "equal", "neither", "both", "none"):
        return _TIE
    return None


def _json_value(obj: Any, depth: int = 0) -> str | None:
    """The verdict a decoded JSON object states (searching nested objects), else None."""
    if depth > _MAX_JSON_DEPTH:
        return None
    if isinstance(obj, dict):
        lowered = {str(key).lower(): value for key, value in obj.items()}
        for key in _JSON_KEYS:
            found = _normalize_value(lowered.get(key))
            if found is not None:
                return found
        children = list(obj.values())
    elif isinstance(obj, list):
        children = obj
    else:
        return None
    for child in reversed(children):
        found = _json_value(child, depth + 1)
        if found is not None:
            return found
    return None


def _json_objects(text: str) -> Iterator[Any]:
    """Decoded JSON objects in `text`, left to right (a decoded object's inside is skipped)."""
    decoder = json.JSONDecoder()
    pos, starts = 0, 0
    while starts < _MAX_JSON_STARTS:
        pos = text.find("{", pos)
        if pos < 0:
            return
        starts += 1
        try:
            obj, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            pos += 1
            continue
        yield obj
        pos = end


def _from_json(text: str) -> str | None:
    """The verdict of the last verdict-bearing JSON object, else None."""
    found = None
    for obj in _json_objects(text):
        value = _json_value(obj)
        if value is not None:
            found = value
    return found


def _line_bounds(text: str, pos: int) -> tuple[int, int]:
    """Start and end offsets of the line holding `pos`."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return start, len(text) if end < 0 else end


def _last_consistent(hits: list[tuple[int, str]], text: str) -> str | None:
    """Value of the last hit, or 'CONFLICT' when the hits on its line disagree."""
    if not hits:
        return None
    hits.sort()
    last_pos, last_value = hits[-1]
    start, end = _line_bounds(text, last_pos)
    values = {value for pos, value in hits if start <= pos < end}
    return last_value if len(values) == 1 else "CONFLICT"


def _phrase_value(match: re.Match[str], inverted: bool) -> str:
    """'A' / 'B' / 'TIE' of a phrase match; `inverted` phrases name the loser."""
    groups = match.groupdict()
    if groups.get("t"):
        return _TIE
    letter = (groups.get("p") or groups.get("u") or groups.get("l") or "").upper()
    if inverted:
        letter = "B" if letter == "A" else "A"
    return letter


def _from_phrases(text: str) -> str | None:
    """A verdict from wording like "Winner: A" or "Response B is better"; may be 'CONFLICT'."""
    hits = [
        (match.start(), _phrase_value(match, inverted))
        for pattern, inverted in _PHRASES
        for match in pattern.finditer(text)
    ]
    return _last_consistent(hits, text)


def _from_lone(text: str) -> str | None:
    """The verdict when the last non-empty line is only a verdict token."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    match = _LONE.match(lines[-1])
    return _normalize_value(match.group(1)) if match else None


def _tail(text: Any) -> str | None:
    """The part of a reply that is read: after the last `</think>`, last MAX_CHARS chars."""
    if not isinstance(text, str):
        return None
    _head, sep, after = text.rpartition("</think>")
    return (after if sep else text)[-MAX_CHARS:]


def _verdict(value: str, method: str) -> PairVerdict:
    """The verdict for an 'A' / 'B' / 'TIE' / 'CONFLICT' value found by `method`."""
    if value == "CONFLICT":
        return PairVerdict(None, False, f"{method}_conflict")
    return PairVerdict(None if value == _TIE else value, True, method)  # type: ignore[arg-type]


def parse_verdict(text: Any) -> PairVerdict:
    """The judge's verdict in `text` (see the module docstring for what is understood)."""
    tail = _tail(text)
    if tail is None:
        return PairVerdict(None, False, "not_text")
    if not tail.strip():
        return PairVerdict(None, False, "empty")
    brackets = [(m.start(), m.group(1).upper()) for m in _BRACKET.finditer(tail)]
    readers = (
        ("bracket", lambda: _last_consistent(brackets, tail)),
        ("json", lambda: _from_json(tail)),
        ("phrase", lambda: _from_phrases(tail)),
        ("lone", lambda: _from_lone(tail)),
    )
    for method, read in readers:
        value = read()
        if value is not None:
            return _verdict(value, method)
    return PairVerdict(None, False, "none")
