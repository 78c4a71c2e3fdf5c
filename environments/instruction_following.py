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
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from k2post_environments.answer_extraction import SPECIAL_TOKEN
from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, Reward, Split, Task
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
TOPICS = [
    "urban gardening",
    "learning a new language",
    "the history of bicycles",
    "saving money",
    "rainy days",
    "space exploration",
    "cooking for friends",
    "a morning routine",
    "public libraries",
    "ocean tides",
    "electric cars",
    "board games",
    "mountain hiking",
    "homemade bread",
    "night trains",
    "honeybees",
    "remote work",
    "street music",
    "winter festivals",
    "old maps",
]


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


# ---------------------------------------------------------------- environment


class InstructionFollowingConfig(EnvConfig):
    """Config of the `instruction_following` gym."""

    min_constraints: int = Field(1, ge=1, description="Fewest constraints per prompt.")
    max_constraints: int = Field(3, ge=1, description="Most constraints per prompt.")
    constraint_kinds: list[str] = Field(
        default_factory=lambda: list(CONSTRAINTS), min_length=1, description="Constraint kinds to draw from."
    )
    all_or_nothing: bool = Field(False, description="Reward 1 only when every constraint holds (else the fraction).")
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
        base = rng.choice(TEMPLATES).format(topic=rng.choice(TOPICS))
        count = rng.randint(self.config.min_constraints, self.config.max_constraints)
        return base, sample_constraints(rng, list(self.config.constraint_kinds), count)

    def _task(self, task_id: str, base: str, constraints: list[Constraint]) -> Task:
        return Task(
            id=task_id,
            env=self.name,
            task_type=self.task_type,
            messages=[Message(role="user", content=build_prompt(base, constraints))],
            answer=[constraint.to_spec() for constraint in constraints],
            metadata={"base_instruction": base, "kinds": [constraint.kind for constraint in constraints]},
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
        """Fraction of constraints met (or all-or-nothing); special tokens are dropped first, and a
        wordless response meets none."""
        if not isinstance(response, str):
            response = "" if response is None else str(response)
        specs = task.answer if isinstance(task.answer, list) else []
        constraints = [constraint_from_spec(spec) for spec in specs]
        if not constraints:
            return Reward(value=0.0, info={"error": "task has no constraints"})
        response = SPECIAL_TOKEN.sub("", response)
        has_words = _WORD.search(response) is not None
        breakdown = {
            f"{index}:{constraint.kind}": float(has_words and _safe_check(constraint, response))
            for index, constraint in enumerate(constraints)
        }
        fraction = sum(breakdown.values()) / len(breakdown)
        value = float(fraction == 1.0) if self.config.all_or_nothing else fraction
        info = {"descriptions": [constraint.describe() for constraint in constraints], "empty": not has_words}
        return Reward(value=value, breakdown=breakdown, info=info)


def _safe_check(constraint: Constraint, response: str) -> bool:
    """A check that never raises (a failing check counts as not satisfied)."""
    try:
        return bool(constraint.check(response))
    except Exception:
        return False
