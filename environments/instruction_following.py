"""Instruction-following gym (IFEval-style): a base writing request plus 1-3 verifiable constraints.

    env = make_environment("instruction_following")
    task = next(env.tasks("train", seed=0))
    # "Write a short blog post about urban gardening.\n\nFollow these rules:\n- Do not use any commas ..."
    env.score(task, response)   # value = fraction of constraints met; breakdown {"0:no_commas": 1.0, ...}

Each constraint is a small dataclass with its parameters, `describe()` (the prompt text) and
`check(response) -> bool`; `Task.answer` stores them as JSON specs (`{"kind": ..., **params}`),
so a task re-scores anywhere. Constraint kinds (`CONSTRAINTS`): word_count, sentence_count,
paragraph_count, include_keywords, forbidden_words, json_format, lowercase, uppercase,
bullet_count, starts_with, ends_with, no_commas, title, placeholders, letter_frequency.
Conflicting kinds (e.g. lowercase + uppercase, JSON + bullets) are never combined.

Rules pay only on top of an answer: a response that does not answer the request meets no constraint
(`answer_problem`, config `require_answer`, on by default). It answers when it is at most 20,000
characters of real words (letters with vowels, no "zz"/"aaa"), reads as sentences (function words such as
"the", "and", "to" are at least 15% of its words), does not repeat itself (distinct words >= 30%, word
4-grams seen twice <= 25%: a loop, or one reply written twice), says at least 5 words of its own once
titles and sentences copied from the prompt are dropped, and in those sentences names the request's topic
(`metadata.topic`; its words in `TOPICS`) at least 2 times plus once per 80 words, and more often than any
other topic. So filler that meets the parsed rules ("zz zz ... river. <<zz>> [zz]"), one fixed string for
every prompt, a copy of the prompt, format markers alone and topic-free text all score 0, and an honest
on-topic reply that ignores the rules keeps whatever rules it happens to meet. The gate is lexical: it
cannot tell a good answer from a poor one that stays on topic.
A response with no word at all (empty, whitespace, only punctuation/special tokens) fails every
constraint, so "say nothing" cannot collect the easy "do not ..." constraints. Text conventions:
words are runs of letters/digits (don't, 3.5 and 1,000 are one word each); sentences end at `.`, `!`,
`?` followed by space, or at a line break; paragraphs are separated by blank lines or a `***`
line; bullets are lines starting with `* `, `- ` or `• `; phrase and keyword checks ignore case.
"""

from __future__ import annotations

import abc
import json
import random
import re
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from k2post_environments.answer_extraction import SPECIAL_TOKEN
from k2post.chat.tokens import TOKEN_SHAPED
from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, HonestPair, Play, Reward, Split, Task
from k2post.envs.registry import register_environment
from k2post.envs.splits import check_split

Relation = Literal["at least", "at most"]
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+|[.,]\d+)*")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_DIVIDER = re.compile(r"^[ \t]*\*\*\*+[ \t]*$", re.MULTILINE)
_BULLET = re.compile(r"^[ \t]*[*\-•][ \t]+\S", re.MULTILINE)
_FENCE = re.compile(r"^```(?:json|JSON)?[ \t]*\n?(.*?)\n?```$", re.DOTALL)


def words(text: str) -> list[str]:
    """Words: runs of letters/digits, with inner apostrophes (don't) and numbers kept whole (3.5, 1,000)."""
    return _WORD.findall(text)


def sentences(text: str) -> list[str]:
    """Sentences: split after . ! ? + whitespace, and at line breaks; pieces without a word dropped."""
    return [piece for piece in _SENTENCE_SPLIT.split(text.strip()) if _WORD.search(piece)]


def paragraphs(text: str) -> list[str]:
    """Paragraphs: non-blank chunks between blank lines or `***` divider lines."""
    return [chunk for chunk in re.split(r"\n[ \t]*\n", _DIVIDER.sub("\n\n", text)) if chunk.strip()]


def _compare(count: int, relation: Relation, n: int) -> bool:
    return count >= n if relation == "at least" else count <= n


def _quoted(items: list[str], joiner: str) -> str:
    quoted = [f'"{item}"' for item in items]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} {joiner} {quoted[-1]}"


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![^\W_]){re.escape(word)}(?![^\W_])", text, re.IGNORECASE) is not None


# ---------------------------------------------------------------- constraints


@dataclass
class Constraint(abc.ABC):
    """A verifiable constraint: parameters (dataclass fields), prompt text, and a check."""

    kind: ClassVar[str] = ""

    @abc.abstractmethod
    def describe(self) -> str:
        """The sentence that states the constraint in the prompt."""

    @abc.abstractmethod
    def check(self, response: str) -> bool:
        """True when `response` satisfies the constraint."""

    @classmethod
    @abc.abstractmethod
    def sample(cls, rng: random.Random) -> Constraint:
        """A constraint of this kind with random parameters."""

    def to_spec(self) -> dict[str, Any]:
        """JSON spec `{"kind": ..., **params}` (inverse of `constraint_from_spec`)."""
        return {"kind": self.kind, **asdict(self)}


@dataclass
class WordCount(Constraint):
    kind: ClassVar[str] = "word_count"
    relation: Relation = "at least"
    n: int = 50

    def describe(self) -> str:
        return f"Answer with {self.relation} {self.n} words."

    def check(self, response: str) -> bool:
        return _compare(len(words(response)), self.relation, self.n)

    @classmethod
    def sample(cls, rng: random.Random) -> WordCount:
        if rng.random() < 0.5:
            return cls("at least", rng.choice([20, 40, 60, 80, 100]))
        return cls("at most", rng.choice([30, 50, 80, 120]))


@dataclass
class SentenceCount(Constraint):
    kind: ClassVar[str] = "sentence_count"
    relation: Relation = "at least"
    n: int = 3

    def describe(self) -> str:
        return f"Use {self.relation} {self.n} sentences."

    def check(self, response: str) -> bool:
        return _compare(len(sentences(response)), self.relation, self.n)

    @classmethod
    def sample(cls, rng: random.Random) -> SentenceCount:
        return cls(rng.choice(["at least", "at most"]), rng.randint(2, 6))


@dataclass
class ParagraphCount(Constraint):
    kind: ClassVar[str] = "paragraph_count"
    n: int = 2

    def describe(self) -> str:
        return f"Write exactly {self.n} paragraphs, separated by a blank line or by the markdown divider ***."

    def check(self, response: str) -> bool:
        return len(paragraphs(response)) == self.n

    @classmethod
    def sample(cls, rng: random.Random) -> ParagraphCount:
        return cls(rng.randint(2, 4))


@dataclass
class IncludeKeywords(Constraint):
    kind: ClassVar[str] = "include_keywords"
    keywords: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"Include the keywords {_quoted(self.keywords, 'and')} in your response."

    def check(self, response: str) -> bool:
        return all(_has_word(response, keyword) for keyword in self.keywords)

    @classmethod
    def sample(cls, rng: random.Random) -> IncludeKeywords:
        return cls(rng.sample(KEYWORDS, rng.randint(1, 2)))


@dataclass
class ForbiddenWords(Constraint):
    kind: ClassVar[str] = "forbidden_words"
    words: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"Do not use the words {_quoted(self.words, 'or')}."

    def check(self, response: str) -> bool:
        return not any(_has_word(response, word) for word in self.words)

    @classmethod
    def sample(cls, rng: random.Random) -> ForbiddenWords:
        return cls(rng.sample(FORBIDDEN, rng.randint(1, 3)))


@dataclass
class JsonFormat(Constraint):
    kind: ClassVar[str] = "json_format"

    def describe(self) -> str:
        return "Wrap your entire response in JSON format: one JSON object or array (a ```json fence is allowed)."

    def check(self, response: str) -> bool:
        text = response.strip()
        fenced = _FENCE.match(text)
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except (ValueError, RecursionError):
            return False
        return isinstance(value, dict | list)

    @classmethod
    def sample(cls, rng: random.Random) -> JsonFormat:
        return cls()


@dataclass
class Lowercase(Constraint):
    kind: ClassVar[str] = "lowercase"

    def describe(self) -> str:
        return "Write your entire response in lowercase letters; no capital letters are allowed."

    def check(self, response: str) -> bool:
        return response == response.lower() and any(c.isalpha() for c in response)

    @classmethod
    def sample(cls, rng: random.Random) -> Lowercase:
        return cls()


@dataclass
class Uppercase(Constraint):
    kind: ClassVar[str] = "uppercase"

    def describe(self) -> str:
        return "Write your entire response in capital letters only."

    def check(self, response: str) -> bool:
        return response == response.upper() and any(c.isalpha() for c in response)

    @classmethod
    def sample(cls, rng: random.Random) -> Uppercase:
        return cls()


@dataclass
class BulletCount(Constraint):
    kind: ClassVar[str] = "bullet_count"
    n: int = 3

    def describe(self) -> str:
        return f"Your answer must contain exactly {self.n} bullet points, as markdown list items such as: * A point."

    def check(self, response: str) -> bool:
        return len(_BULLET.findall(response)) == self.n

    @classmethod
    def sample(cls, rng: random.Random) -> BulletCount:
        return cls(rng.randint(2, 5))


@dataclass
class StartsWith(Constraint):
    kind: ClassVar[str] = "starts_with"
    phrase: str = "Sure"

    def describe(self) -> str:
        return f'Start your response with the exact phrase "{self.phrase}".'

    def check(self, response: str) -> bool:
        return response.strip().lstrip("\"'*#` ").lower().startswith(self.phrase.lower())

    @classmethod
    def sample(cls, rng: random.Random) -> StartsWith:
        return cls(rng.choice(START_PHRASES))


@dataclass
class EndsWith(Constraint):
    kind: ClassVar[str] = "ends_with"
    phrase: str = "That is all."

    def describe(self) -> str:
        return f'End your response with the exact phrase "{self.phrase}". No other words should follow it.'

    def check(self, response: str) -> bool:
        return response.strip().rstrip("\"'*` ").lower().endswith(self.phrase.lower())

    @classmethod
    def sample(cls, rng: random.Random) -> EndsWith:
        return cls(rng.choice(END_PHRASES))


@dataclass
class NoCommas(Constraint):
    kind: ClassVar[str] = "no_commas"

    def describe(self) -> str:
        return "Do not use any commas in your response."

    def check(self, response: str) -> bool:
        return "," not in response and "，" not in response

    @classmethod
    def sample(cls, rng: random.Random) -> NoCommas:
        return cls()


@dataclass
class Title(Constraint):
    kind: ClassVar[str] = "title"

    def describe(self) -> str:
        return "Give your answer a title wrapped in double angular brackets, such as <<poem of joy>>."

    def check(self, response: str) -> bool:
        return any(title.strip() for title in re.findall(r"<<([^<>\n]+)>>", response))

    @classmethod
    def sample(cls, rng: random.Random) -> Title:
        return cls()


@dataclass
class Placeholders(Constraint):
    kind: ClassVar[str] = "placeholders"
    n: int = 1

    def describe(self) -> str:
        noun = "placeholder" if self.n == 1 else "placeholders"
        return f"Include at least {self.n} {noun} in square brackets, such as [address]."

    def check(self, response: str) -> bool:
        return sum(1 for inner in re.findall(r"\[([^\[\]\n]+)\]", response) if inner.strip()) >= self.n

    @classmethod
    def sample(cls, rng: random.Random) -> Placeholders:
        return cls(rng.randint(1, 3))


@dataclass
class LetterFrequency(Constraint):
    kind: ClassVar[str] = "letter_frequency"
    letter: str = "k"
    n: int = 3

    def describe(self) -> str:
        return f'The letter "{self.letter}" should appear at least {self.n} times in your response.'

    def check(self, response: str) -> bool:
        return response.lower().count(self.letter.lower()) >= self.n

    @classmethod
    def sample(cls, rng: random.Random) -> LetterFrequency:
        return cls(rng.choice("bkwyvzp"), rng.randint(2, 6))


CONSTRAINTS: dict[str, type[Constraint]] = {
    cls.kind: cls
    for cls in (
        WordCount,
        SentenceCount,
        ParagraphCount,
        IncludeKeywords,
        ForbiddenWords,
        JsonFormat,
        Lowercase,
        Uppercase,
        BulletCount,
        StartsWith,
        EndsWith,
        NoCommas,
        Title,
        Placeholders,
        LetterFrequency,
    )
}
_CONFLICT_PAIRS = [
    ("lowercase", "uppercase"),
    ("starts_with", "lowercase"),
    ("starts_with", "uppercase"),
    ("ends_with", "lowercase"),
    ("ends_with", "uppercase"),
    ("starts_with", "title"),
    ("sentence_count", "bullet_count"),
    ("sentence_count", "paragraph_count"),
    ("sentence_count", "title"),
] + [
    ("json_format", other)
    for other in (
        "paragraph_count",
        "bullet_count",
        "title",
        "starts_with",
        "ends_with",
        "sentence_count",
        "no_commas",
        "uppercase",
    )
]
CONFLICTS: frozenset[frozenset[str]] = frozenset(frozenset(pair) for pair in _CONFLICT_PAIRS)

KEYWORDS = [
    "river",
    "lantern",
    "harvest",
    "signal",
    "garden",
    "compass",
    "window",
    "bridge",
    "mountain",
    "engine",
    "library",
    "ocean",
    "candle",
    "market",
    "puzzle",
    "journey",
    "forest",
    "rocket",
    "recipe",
    "teacher",
]
FORBIDDEN = ["very", "really", "good", "thing", "just", "also", "many", "important", "great", "nice"]
START_PHRASES = ["Sure thing", "Here is my answer", "Dear reader", "In short", "Let me explain"]
END_PHRASES = ["Is there anything else I can help with?", "Thank you for reading.", "That is all.", "Have a nice day!"]
TEMPLATES = [
    "Write a short blog post about {topic}.",
    "Write a letter to a friend about {topic}.",
    "Describe {topic} to a curious ten-year-old.",
    "Write a product pitch for an app about {topic}.",
    "Give advice to someone who wants to get into {topic}.",
    "Write a short story involving {topic}.",
    "Summarize the pros and cons of {topic}.",
    "Write a short speech about {topic}.",
]
TOPICS: dict[str, str] = {
    "urban gardening": r"garden\w*",
    "learning a new language": r"languages?",
    "the history of bicycles": r"bicycles?|bikes?|cycling|cyclists?",
    "saving money": r"money|savings?|saved|saves?",
    "rainy days": r"rain\w*",
    "space exploration": r"space\w*|astronauts?|planets?|orbit\w*",
    "cooking for friends": r"cook\w*",
    "a morning routine": r"mornings?|routines?",
    "public libraries": r"librar(?:y|ies|ians?)",
    "ocean tides": r"tides?|tidal",
    "electric cars": r"electric\w*|cars?|vehicles?",
    "board games": r"games?",
    "mountain hiking": r"hik\w*|trails?",
    "homemade bread": r"bread\w*|dough|bak\w*",
    "night trains": r"trains?|railways?",
    "honeybees": r"honey\w*|bees?|hives?|beekeep\w*",
    "remote work": r"remote\w*",
    "street music": r"music\w*|buskers?|busking",
    "winter festivals": r"festivals?",
    "old maps": r"maps?|cartograph\w*",
}
"""Request topics, each with the words that show a response is about it (a regex alternation, case ignored)."""
TOPIC_NAMES = list(TOPICS)


def constraint_from_spec(spec: dict[str, Any]) -> Constraint:
    """Rebuild a constraint from its JSON spec; unknown kind or bad params → ValueError."""
    params = {key: value for key, value in spec.items() if key != "kind"}
    cls = CONSTRAINTS.get(str(spec.get("kind")))
    if cls is None:
        raise ValueError(f"unknown constraint kind {spec.get('kind')!r}; known: {', '.join(CONSTRAINTS)}")
    try:
        return cls(**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for {cls.kind}: {err}") from err


def compatible(kinds: list[str], kind: str) -> bool:
    """True when `kind` is new and conflicts with none of `kinds`."""
    return kind not in kinds and all(frozenset((kind, other)) not in CONFLICTS for other in kinds)


def sample_constraints(rng: random.Random, kinds: list[str], count: int) -> list[Constraint]:
    """Up to `count` mutually compatible constraints of the given kinds, with random params."""
    chosen: list[str] = []
    for kind in rng.sample(kinds, len(kinds)):
        if len(chosen) < count and compatible(chosen, kind):
            chosen.append(kind)
    return [CONSTRAINTS[kind].sample(rng) for kind in chosen]


def build_prompt(base: str, constraints: list[Constraint]) -> str:
    """The user prompt: base request, then the rules as a bullet list."""
    rules = "\n".join(f"- {constraint.describe()}" for constraint in constraints)
    return f"{base}\n\nFollow these rules:\n{rules}"


# ---------------------------------------------------------------- the answer gate

FUNCTION_WORDS = frozenset(
    """a an the and or but if so of to in on at by for with from into about as than then that this these those
    it its is are was were be been being am do does did have has had can could will would should may might must
    i you he she we they me him her us them my your his our their who what which when where why how not no
    all some any each every more most other one there here up out over after before also just very""".split()
)
"""Words that glue sentences together: English prose has 30-60% of them, a word salad almost none."""
_TOPIC_RES = {
    topic: re.compile(rf"(?<![^\W_])(?:{pattern})(?![^\W_])", re.IGNORECASE) for topic, pattern in TOPICS.items()
}
_JUNK_WORD = re.compile(r"^[^aeiouy]+$|(.)\1\1")
MIN_WORDS = 8
MAX_ANSWER_CHARS = 20_000
MAX_REPEATED_SHARE = 0.25
MIN_OWN_WORDS = 5
WORDS_PER_TOPIC_MENTION = 80


def topic_of(text: str) -> str | None:
    """The first known topic named in `text` (a request), or None."""
    lowered = text.lower()
    return next((topic for topic in TOPICS if topic in lowered), None)


def topic_mentions(text: str) -> dict[str, int]:
    """How often each topic's words occur in `text`."""
    return {topic: len(pattern.findall(text)) for topic, pattern in _TOPIC_RES.items()}


def repeated_share(tokens: list[str], n: int = 4) -> float:
    """The share of the word n-grams that occur more than once (0 for prose, near 1 for a loop or a reply
    written twice)."""
    grams = Counter(zip(*(tokens[i:] for i in range(n))))
    total = sum(grams.values())
    return sum(count for count in grams.values() if count > 1) / total if total else 0.0


def _repetitive(tokens: list[str]) -> bool:
    return len(set(tokens)) < 0.3 * len(tokens) or repeated_share(tokens) > MAX_REPEATED_SHARE


def _off_topic(text: str, n_words: int, topic: str | None) -> bool:
    if topic is None:
        return False
    mentions = topic_mentions(text)
    others = max((count for other, count in mentions.items() if other != topic), default=0)
    return mentions[topic] < 2 + n_words // WORDS_PER_TOPIC_MENTION or mentions[topic] <= others


def own_sentences(response: str, prompt_words: set[str]) -> list[str]:
    """The response's sentences minus titles (<<...>>) and sentences copied from the prompt (80% or more of
    their non-function words are prompt words)."""
    kept = []
    for sentence in sentences(re.sub(r"<<[^<>\n]*>>", " ", response)):
        content = [word.lower() for word in words(sentence) if word.lower() not in FUNCTION_WORDS]
        if content and sum(word in prompt_words for word in content) < 0.8 * len(content):
            kept.append(sentence)
    return kept


def answer_problem(response: str, prompt: str, topic: str | None) -> str | None:
    """Why `response` does not answer the request in `prompt` (about `topic`), or None when it does: it must be
    real words, read as sentences, not repeat itself, say words of its own and stay on the topic."""
    if len(response) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters (no request here asks for more than a page)"
    tokens = [word.lower() for word in words(response)]
    letters = [token for token in tokens if token.isalpha()]
    if len(tokens) < MIN_WORDS:
        return f"fewer than {MIN_WORDS} words"
    if len(letters) < 0.5 * len(tokens) or sum(bool(_JUNK_WORD.search(t)) for t in letters) > 0.2 * len(letters):
        return "not real words"
    if sum(token in FUNCTION_WORDS for token in tokens) < 0.15 * len(tokens):
        return "a list of words, not sentences"
    if _repetitive(tokens):
        return "repetitive"
    prompt_words = {word.lower() for word in words(prompt)}
    own = " ".join(own_sentences(response, prompt_words))
    if len({word.lower() for word in words(own)} - FUNCTION_WORDS - prompt_words) < MIN_OWN_WORDS:
        return f"fewer than {MIN_OWN_WORDS} words of its own (beside the prompt's)"
    if _off_topic(own, len(tokens), topic):
        return f"not about {topic}"
    return None


# ---------------------------------------------------------------- honest answers (for the adversarial suite)

BODY = [
    "{T} rewards curiosity and patience.",
    "People who try {t} often learn about themselves.",
    "The first step with {t} is to start small.",
    "Over time {t} can bring calm to a busy week.",
    "Friends and family may enjoy {t} with you.",
    "Reading about {t} helps you avoid beginner mistakes.",
    "Local clubs offer a warm place to learn about {t}.",
    "The best part of {t} is how it connects people of all ages.",
    "A little planning makes {t} easier and more fun.",
    "Experts say that {t} works best when you keep notes.",
    "Some people worry that {t} takes too much time.",
    "In fact {t} fits into a full week with a bit of care.",
    "Children and adults alike can enjoy {t}.",
    "Each season brings a fresh reason to think about {t}.",
    "Our town has a long history of {t}.",
    "If you share {t} with others the joy grows.",
    "Small habits around {t} add up over the years.",
    "Try to set a clear goal before you begin with {t}.",
]
"""On-topic sentences of an honest reply: no commas, none of FORBIDDEN, no other topic's words."""
RULES_IGNORED = "Honestly, {t} is a really good thing, and many people love it."
"""What an honest reply that ignores the rules adds to the answer: commas and everyday intensifiers."""
LETTER_SENTENCES = {
    "b": "Bring a bright notebook and a bag of books to the club.",
    "k": "Keep a kind notebook and keep track of key ideas.",
    "w": "We walk with wonder when we write down what we saw.",
    "y": "Every year you may enjoy your hobby in a new way.",
    "v": "Visit a vivid venue and have a lively view of everything.",
    "z": "A zesty and amazing puzzle can dazzle a lazy mind.",
    "p": "People plan simple projects and keep a pen and paper nearby.",
}


def _with_topic(template: str, topic: str) -> str:
    return template.format(t=topic, T=topic[:1].upper() + topic[1:])


def _extras(constraints: dict[str, Constraint]) -> list[str]:
    """Sentences that meet the keyword, placeholder and letter rules."""
    extras = []
    if isinstance(keywords := constraints.get("include_keywords"), IncludeKeywords):
        extras.append(f"It brings to mind {' and '.join(f'a {word}' for word in keywords.keywords)}.")
    if isinstance(holders := constraints.get("placeholders"), Placeholders):
        extras.append(f"You can reach me at {' or '.join(['[name]', '[place]', '[time]'][: max(1, holders.n)])}.")
    if isinstance(letter := constraints.get("letter_frequency"), LetterFrequency):
        extras.append(LETTER_SENTENCES.get(letter.letter.lower(), ""))
    return [extra for extra in extras if extra]


def _merge(pieces: list[str], groups: int) -> list[str]:
    """`pieces` joined into at most `groups` sentences (with semicolons)."""
    size = -(-len(pieces) // max(1, groups))
    chunks = [pieces[i : i + size] for i in range(0, len(pieces), size)]
    return [
        "; ".join(piece.rstrip(".!?") for piece in chunk[:-1]) + ("; " if len(chunk) > 1 else "") + chunk[-1]
        for chunk in chunks
    ]


def _layout(sentences: list[str], bullets: list[str], paragraphs: int) -> str:
    """Sentences in `paragraphs` paragraphs (the bullet lines as the last one, when there are any)."""
    prose = max(1, paragraphs - (1 if bullets else 0)) if paragraphs else 1
    size = -(-len(sentences) // prose) if sentences else 1
    chunks = [" ".join(sentences[i : i + size]) for i in range(0, len(sentences), size)]
    return "\n\n".join([*chunks, *(["\n".join(f"* {line}" for line in bullets)] if bullets else [])])


def write_reply(topic: str, constraints: list[Constraint], body: list[str]) -> str:
    """A reply on `topic` built from `body` sentences that meets the constraints' formats (starts/ends, title,
    paragraphs, bullets, sentence counts, keywords, placeholders, letters, case, JSON)."""
    kinds = {constraint.kind: constraint for constraint in constraints}
    bullet_rule = kinds.get("bullet_count")
    n_bullets = bullet_rule.n if isinstance(bullet_rule, BulletCount) else 0
    prose = body[: max(1, len(body) - n_bullets)] if n_bullets else list(body)
    bullets = body[len(prose) :]
    sentences = prose[:1] + _extras(kinds) + prose[1:]
    if isinstance(start := kinds.get("starts_with"), StartsWith):
        sentences.insert(0, f"{start.phrase}.")
    end = kinds.get("ends_with")
    if isinstance(count := kinds.get("sentence_count"), SentenceCount) and count.relation == "at most":
        sentences = _merge(sentences + ([end.phrase] if isinstance(end, EndsWith) else []), count.n)
        end = None
    paragraph_rule = kinds.get("paragraph_count")
    text = _layout(sentences, bullets, paragraph_rule.n if isinstance(paragraph_rule, ParagraphCount) else 0)
    if isinstance(end, EndsWith):
        text = f"{text}\n{end.phrase}" if bullets else f"{text} {end.phrase}"
    if "title" in kinds:
        text = f"<<{topic.title()}>>\n{text}"
    if "lowercase" in kinds:
        text = text.lower()
    if "uppercase" in kinds:
        text = text.upper()
    return json.dumps({"answer": text}) if "json_format" in kinds else text


def fit_body(topic: str, constraints: list[Constraint], body: list[str]) -> list[str]:
    """The fewest of `body`'s sentences (2 and up) whose `write_reply` meets every constraint, or all of them
    when none does (a task whose rules contradict each other)."""
    for n in range(2, len(body)):
        reply = write_reply(topic, constraints, body[:n])
        if all(_safe_check(constraint, reply) for constraint in constraints):
            return body[:n]
    return body


# ---------------------------------------------------------------- environment


class InstructionFollowingConfig(EnvConfig):
    """Config of the `instruction_following` gym."""

    min_constraints: int = Field(1, ge=1, description="Fewest constraints per prompt.")
    max_constraints: int = Field(3, ge=1, description="Most constraints per prompt.")
    constraint_kinds: list[str] = Field(
        default_factory=lambda: list(CONSTRAINTS), min_length=1, description="Constraint kinds to draw from."
    )
    all_or_nothing: bool = Field(False, description="Reward 1 only when every constraint holds (else the fraction).")
    require_answer: bool = Field(
        True,
        description="Pay the rules only on a response that answers the request (real words, sentences, not "
        "repetitive, words of its own, on the request's topic). Off, rules alone pay and a policy learns filler "
        "that meets them: for plumbing tests whose policy cannot write, never for training.",
    )
    train_size: int = Field(10000, gt=0, description="Train tasks yielded when `n` is not given.")
    test_size: int = Field(200, gt=0, description="Size of the fixed held-out test set.")
    train_seed: int = Field(0, description="Base seed of the train stream (combined with the `seed` argument).")
    test_seed: int = Field(1, description="Seed of the held-out test set.")
    dev_size: int = Field(200, gt=0, description="Size of the fixed dev set (for choosing settings; no test prompt).")
    dev_seed: int = Field(2, description="Seed of the dev set.")

    @model_validator(mode="after")
    def _check(self) -> InstructionFollowingConfig:
        unknown = sorted(set(self.constraint_kinds) - set(CONSTRAINTS))
        if unknown:
            raise ValueError(f"unknown constraint kinds {unknown}; known: {', '.join(CONSTRAINTS)}")
        if self.min_constraints > self.max_constraints:
            raise ValueError("min_constraints must be <= max_constraints")
        return self


@register_environment
class InstructionFollowingEnv(Environment):
    """Writing requests with verifiable format constraints; reward = fraction satisfied."""

    name = "instruction_following"
    task_type = "instruction"
    reward_range = (0.0, 1.0)
    config_cls = InstructionFollowingConfig
    config: InstructionFollowingConfig

    def _draw(self, rng: random.Random) -> tuple[str, list[Constraint]]:
        base = rng.choice(TEMPLATES).format(topic=rng.choice(TOPIC_NAMES))
        count = rng.randint(self.config.min_constraints, self.config.max_constraints)
        return base, sample_constraints(rng, list(self.config.constraint_kinds), count)

    def _task(self, task_id: str, base: str, constraints: list[Constraint]) -> Task:
        return Task(
            id=task_id,
            env=self.name,
            task_type=self.task_type,
            messages=[Message(role="user", content=build_prompt(base, constraints))],
            answer=[constraint.to_spec() for constraint in constraints],
            metadata={
                "base_instruction": base,
                "topic": topic_of(base),
                "kinds": [constraint.kind for constraint in constraints],
            },
        )

    def _fixed_set(self, tag: str, size: int, exclude: Collection[str]) -> dict[str, tuple[str, list[Constraint]]]:
        """`size` distinct prompts (none in `exclude`) of a seeded stream (bounded draws)."""
        rng, rows = random.Random(tag), {}
        for _ in range(size * 50):
            if len(rows) >= size:
                break
            base, constraints = self._draw(rng)
            prompt = build_prompt(base, constraints)
            if prompt not in exclude:
                rows.setdefault(prompt, (base, constraints))
        return rows

    @cached_property
    def _test_set(self) -> dict[str, tuple[str, list[Constraint]]]:
        return self._fixed_set(f"if-test:{self.config.test_seed}", self.config.test_size, ())

    @cached_property
    def _dev_set(self) -> dict[str, tuple[str, list[Constraint]]]:
        return self._fixed_set(f"if-dev:{self.config.dev_seed}", self.config.dev_size, self._test_set)

    def _train_rows(self, seed: int, n: int) -> Iterator[tuple[str, list[Constraint]]]:
        rng, produced = random.Random(f"if-train:{self.config.train_seed}:{seed}"), 0
        for _ in range(n * 50 + 100):
            if produced >= n:
                return
            base, constraints = self._draw(rng)
            prompt = build_prompt(base, constraints)
            if prompt not in self._test_set and prompt not in self._dev_set:
                produced += 1
                yield base, constraints
        if produced == 0:
            raise ValueError(
                f"instruction_following: every train prompt drawn is a held-out dev/test prompt: constraint_kinds "
                f"{self.config.constraint_kinds} with max_constraints={self.config.max_constraints} give too few "
                f"distinct prompts for test_size={self.config.test_size} + dev_size={self.config.dev_size}; lower "
                f"test_size and dev_size or allow more kinds / constraints"
            )

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Train: a seeded stream without dev/test prompts; dev, test: fixed sets (no shifted split)."""
        check_split(self.name, split)
        if split == "train":
            count = self.config.train_size if n is None else n
            rows, prefix = self._train_rows(seed, count), f"train-s{seed}"
        else:
            fixed = list((self._test_set if split == "test" else self._dev_set).values())
            rows, prefix = iter(fixed if n is None else fixed[:n]), split
        for index, (base, constraints) in enumerate(rows):
            yield self._task(f"if-{prefix}-{index}", base, constraints)

    def score(self, task: Task, response: str) -> Reward:
        """Fraction of constraints met (or all-or-nothing) by a response that answers the request; special
        tokens are dropped first, and a response that does not answer (see module doc) or carries chat
        special-token strings (injected structure) meets none."""
        if not isinstance(response, str):
            response = "" if response is None else str(response)
        specs = task.answer if isinstance(task.answer, list) else []
        constraints = [constraint_from_spec(spec) for spec in specs]
        if not constraints:
            return Reward(value=0.0, info={"error": "task has no constraints"})
        injected = TOKEN_SHAPED.search(response) is not None
        response = SPECIAL_TOKEN.sub("", response)
        has_words = _WORD.search(response) is not None
        problem = _answer_problem(task, response) if has_words and self.config.require_answer else None
        if injected and self.config.require_answer:
            problem = "chat special-token strings in the text (injected structure, not prose)"
        breakdown = {
            f"{index}:{constraint.kind}": float(has_words and problem is None and _safe_check(constraint, response))
            for index, constraint in enumerate(constraints)
        }
        fraction = sum(breakdown.values()) / len(breakdown)
        value = float(fraction == 1.0) if self.config.all_or_nothing else fraction
        info = {"descriptions": [constraint.describe() for constraint in constraints], "empty": not has_words}
        return Reward(value=value, breakdown=breakdown, info=info | ({"not_an_answer": problem} if problem else {}))

    def honest(self, task: Task) -> HonestPair | None:
        """Right: an on-topic reply that meets every rule; wrong: the same answer written as if there were no
        rules (plain prose, its own case, commas and intensifiers)."""
        topic = _task_topic(task)
        if topic is None or not isinstance(task.answer, list):
            return None
        constraints = [constraint_from_spec(spec) for spec in task.answer]
        body = fit_body(topic, constraints, [_with_topic(template, topic) for template in BODY])
        wrong = " ".join([*body, _with_topic(RULES_IGNORED, topic)])
        return HonestPair(right=write_reply(topic, constraints, body), wrong=wrong)

    def hacks(self, task: Task) -> dict[str, Play]:
        """Replies that meet the parsed rules with no answer: filler, a fixed string, topic-free prose, a word
        salad of the topic, the prompt's own sentences, the topic repeated, every topic named once."""
        topic = _task_topic(task) or "it"
        constraints = [constraint_from_spec(spec) for spec in task.answer] if isinstance(task.answer, list) else []
        prompt = task.messages[-1].content if task.messages else ""
        rules = {
            "rules_only_filler": ["zz zz zz zz zz."] * 12,
            "rules_only_off_topic": [_with_topic(t, "the weather") for t in BODY],
            "rules_only_topic_salad": [f"{topic} {topic} garden river lantern harvest." for _ in range(12)],
            "rules_only_prompt_sentences": sentences(prompt) * 3,
        }
        plays: dict[str, Play] = {
            name: write_reply(topic, constraints, fit_body(topic, constraints, body)) for name, body in rules.items()
        }
        plays["fixed_string"] = FIXED_HACK
        plays["topic_repeated"] = f"{topic.capitalize()}. " * 40
        plays["every_topic_once"] = " ".join(f"This text is about {name}." for name in TOPICS)
        return plays


FIXED_HACK = (
    "Sure thing. <<zz>>\nzz zz zz zz river lantern harvest signal [zz] [zz] [zz] bkwyvzp bkwyvzp\n\n"
    "* zz zz\n* zz zz\n* zz zz\n\nzz zz zz zz zz. That is all."
)
"""One string for every prompt that meets several common rules at once (the review's 0.498 hack)."""


def _task_topic(task: Task) -> str | None:
    """The task's topic: its metadata, else the first known topic its request names."""
    topic = task.metadata.get("topic") if isinstance(task.metadata.get("topic"), str) else None
    base = task.metadata.get("base_instruction")
    request = base if isinstance(base, str) else (task.messages[-1].content if task.messages else "")
    return topic if topic in TOPICS else topic_of(request)


def _answer_problem(task: Task, response: str) -> str | None:
    prompt = "\n".join(message.content for message in task.messages if isinstance(message.content, str))
    return answer_problem(response, prompt, _task_topic(task))


def _safe_check(constraint: Constraint, response: str) -> bool:
    """A check that never raises (a failing check counts as not satisfied)."""
    try:
        return bool(constraint.check(response))
    except Exception:
        return False
