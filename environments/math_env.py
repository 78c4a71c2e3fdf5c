"""Math gym: generated arithmetic / word / linear-equation problems, scored with math-verify.

    env = make_environment("math", {"difficulty": 2})
    task = next(env.tasks("train", seed=0))        # "What is 17 + 25?\nPut your final answer in \\boxed{}."
    env.score(task, "17 + 25 = \\boxed{42}")       # value 1.0, breakdown {"correct": 1, "format": 1}

Tasks come from a seeded generator (deterministic per seed) or, when `hf_dataset_path` is set,
from a HF `datasets` dataset saved on disk (`save_to_disk`; nothing is downloaded). Splits
(`k2post.envs.splits`): test and dev are fixed held-out sets (`test_seed`/`test_size`,
`dev_seed`/`dev_size`; the `seed` argument does not change them, dev never repeats a test
question) and the train stream never yields one of their questions, so the splits are disjoint
by question text for every seed. `shifted` (generator only) asks larger numbers
(`shifted_difficulty`, default difficulty + 1) and/or unseen kinds (`shifted_problem_types`);
a shifted question of a trained kind has a number the train difficulty cannot produce, so it is
never a train question. An on-disk dataset's dev/test are its `validation`/`test` splits, else
carved out by question hash (`hf_dev_fraction`, `hf_test_fraction`).

Scoring: the answer is extracted (`answer_extraction`, order configurable; the last-number fallback reads the
last line with a digit that is not a copied prompt line), and the reply must commit to it: every answer it marks
as final (boxes, `####`, "the answer is N") must equal the gold, so a hedge scores 0, as does a line listing
several numbers side by side. The comparison is an
exact number first, then math-verify, bounded: plainly huge answers (`_EXPLOSIVE`, deep nesting, long) score 0
at once; an answer `proven_small` runs here; anything else runs in a child process
(`k2post.envs.child_call`) killed after `verify_timeout_s`, and then scores 0 without an error (no signal
interrupts one C big-integer operation in sympy, so the child is the only sound bound).
reward = (1 - format_weight) * correct + format_weight * format, where format means the answer was found by the
preferred (first) extraction method.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, model_validator

from k2post_environments.answer_extraction import (
    DEFAULT_TAIL_CHARS,
    ExtractionMethod,
    Extraction,
    clean_response,
    extract_answer,
    extract_boxed,
    extract_hash,
    extract_last_number,
    marked_answers,
    parse_number,
)
from k2post_environments.worked import chain_steps, expression_of
from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, HonestPair, Play, Reward, Split, Task
from k2post.envs.child_call import ChildTimeout, shared_child
from k2post.envs.math_equal import WARMUP, verify_equal
from k2post.envs.registry import register_environment
from k2post.envs.splits import SPLITS, check_split, hash_bucket, split_of_bucket

ProblemType = Literal["add", "sub", "mul", "div", "word", "linear"]
PROBLEM_TYPES: tuple[ProblemType, ...] = ("add", "sub", "mul", "div", "word", "linear")
MAX_VERIFY_CHARS = 300
HF_SPLIT_NAMES: dict[str, tuple[str, ...]] = {"train": ("train",), "dev": ("validation", "dev"), "test": ("test",)}
"""Names of an on-disk DatasetDict's splits that serve as our train / dev / test."""
Row = tuple[str, str, dict[str, Any]]
"""(question, gold answer, metadata) of one task."""
_EXPLOSIVE = re.compile(
    r"(?:\^|\*\*)\s*(?:\{[^{}]*(?:\^|\*\*)|\([^()]*(?:\^|\*\*)|[\w.]+\s*(?:\^|\*\*))"  # power towers
    r"|(?:\^|\*\*)\s*[{(]?\s*\d{5,}"  # huge exponents
    r"|\d{4,}\s*!"  # huge factorials
    r"|!\s*!\s*!"  # iterated factorials (10!!!!!!!!)
    r"|\d{3,}\s*!\s*!"  # double factorials of big numbers
    r"|[)}\]]\s*!"  # the factorial of an expression ((100!)!): its size has no bound here
    r"|(?:binom|choose|binomial)[^$]{0,60}?\d{5,}"  # binomials of huge numbers (\binom{1000000}{500000})
    r"|[)}]\s*(?:\^|\*\*)\s*[{(]?\s*\d{3,}"  # a group raised to a 3-digit power ((9999^{9999})^{9999})
    r"|(?:Gamma|gamma|factorial|Pi)\s*(?:\\left)?\s*[({]\s*\d{5,}"  # special functions of huge numbers
)
"""Answers plainly too big for sympy: they score as wrong at once. Not the bound itself (a hostile answer has many
shapes): whatever is not `proven_small` runs in a child process with a hard timeout; this only spares the child
the common shapes."""
VERIFY_TIMEOUT_S = 2.0
VERIFY_TARGET = "k2post.envs.math_equal:verify_equal"
"""What the verify child runs (`k2post.envs.child_call`)."""
MAX_COMMITTED = 4
"""Distinct final answers past which a reply is wrong without checking them (each costs a comparison)."""
_LOOSE_NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?")
_LIST_GAP = re.compile(r"(?:\s|[,;]|\bor\b|\band\b|\bmaybe\b|\bperhaps\b)*", re.IGNORECASE)
MAX_DEPTH = 40
"""Bracket nesting past which an answer scores as wrong at once (no answer nests that deep; latex2sympy takes
seconds on 140 levels)."""
MAX_SMALL_CHARS = 120
MAX_SMALL_DEPTH = 8
MAX_SMALL_POWERS = 1
_SMALL_TOKEN = re.compile(
    r"\\(?:d|t)?frac(?![A-Za-z])|\\(?:sqrt|cdot|times|div|pi|pm|mp|circ|infty|left|right|quad|qquad"
    r"|le|ge|leq|geq|neq|lt|gt|approx|in|cup|cap|emptyset|degree)(?![A-Za-z])"
    r"|\\[,;:! %{}]|\\text\{[A-Za-z ]{0,20}\}|(?<!\d)\d{1,20}(?!\d)|[A-Za-z]|[-+*/=<>()\[\]{},.:;%'^_|\s]"
)
"""The pieces of an answer math-verify parses quickly: numbers of at most 20 digits, single letters, plain LaTeX."""
_SMALL_EXPONENT = re.compile(r"\s*(?:\{\s*-?(?:\d{1,2}|[A-Za-z])\s*\}|-?\d|[A-Za-z])")
"""What may follow a `^` in a proven-small answer: a number below 100 (a digit when bare) or a letter."""


class MathConfig(EnvConfig):
    """Config of the `math` gym."""

    difficulty: int = Field(1, ge=1, le=5, description="Operand magnitude: numbers up to 10**difficulty.")
    problem_types: list[ProblemType] = Field(
        default_factory=lambda: list(PROBLEM_TYPES), min_length=1, description="Generated problem kinds to mix."
    )
    train_size: int = Field(10000, gt=0, description="Train tasks yielded when `n` is not given.")
    test_size: int = Field(200, gt=0, description="Size of the fixed held-out test set.")
    dev_size: int = Field(
        200, gt=0, description="Size of the fixed dev set (for choosing settings; disjoint from test)."
    )
    shifted_size: int = Field(200, gt=0, description="Size of the fixed shifted set (generalization; see shifted_*).")
    train_seed: int = Field(0, description="Base seed of the train stream (combined with the `seed` argument).")
    test_seed: int = Field(1, description="Seed of the held-out test set.")
    dev_seed: int = Field(2, description="Seed of the dev set.")
    shifted_seed: int = Field(3, description="Seed of the shifted set.")
    shifted_difficulty: int | None = Field(
        None, ge=1, le=5, description="Difficulty of the shifted split (null: difficulty + 1, at most 5)."
    )
    shifted_problem_types: list[ProblemType] | None = Field(
        None,
        min_length=1,
        description="Problem kinds of the shifted split (null: problem_types; others are unseen kinds).",
    )
    instruction: str = Field(
        "Put your final answer in \\boxed{}.", description="Appended to every question on its own line."
    )
    extraction_order: list[ExtractionMethod] = Field(
        default_factory=lambda: ["boxed", "hash", "answer_is", "last_number"],
        min_length=1,
        description="Answer extraction methods tried in order; the first is the preferred format.",
    )
    format_weight: float = Field(
        0.0, ge=0.0, le=1.0, description="Reward weight of the format flag: (1-w)*correct + w*format."
    )
    tail_chars: int = Field(DEFAULT_TAIL_CHARS, gt=0, description="Only the last N chars of a response are read.")
    verify_timeout_s: float = Field(
        VERIFY_TIMEOUT_S,
        gt=0,
        le=60,
        description="Wall-clock seconds math-verify may take on an answer not proven small (it runs in a child "
        "process, killed at this limit; the answer then scores as wrong).",
    )
    hf_dataset_path: str | None = Field(
        None, description="A HF dataset saved with save_to_disk to use instead of the generator (no downloads)."
    )
    hf_question_field: str = Field("question", description="Question column of the on-disk dataset.")
    hf_answer_field: str = Field(
        "answer", description="Answer column (plain answer, GSM8K '#### 42' or a solution with \\boxed{})."
    )
    hf_test_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Held-out fraction (by question hash) when the dataset has no test split."
    )
    hf_dev_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Dev fraction (by question hash) when the dataset has no validation/dev split."
    )

    @model_validator(mode="after")
    def _check_fractions(self) -> MathConfig:
        if self.hf_test_fraction + self.hf_dev_fraction >= 1.0:
            raise ValueError("hf_test_fraction + hf_dev_fraction must be below 1 (train needs the rest)")
        return self


# ---------------------------------------------------------------- problem generators

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jia", "Kofi", "Lena")
_ITEMS = ("apples", "marbles", "books", "stickers", "coins", "pencils", "cookies", "stamps", "shells", "cards")


def _operand(rng: random.Random, difficulty: int, low: int = 0) -> int:
    return rng.randint(low, 10**difficulty)


def _small(rng: random.Random, difficulty: int, low: int = 1) -> int:
    return rng.randint(low, max(10, 10 ** (difficulty - 1)))


def gen_add(rng: random.Random, d: int) -> tuple[str, int]:
    terms = [_operand(rng, d) for _ in range(3 if d >= 4 else 2)]
    return f"What is {' + '.join(map(str, terms))}?", sum(terms)


def gen_sub(rng: random.Random, d: int) -> tuple[str, int]:
    a, b = _operand(rng, d), _operand(rng, d)
    if d <= 2:
        a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a - b


def gen_mul(rng: random.Random, d: int) -> tuple[str, int]:
    a, b = _operand(rng, d), _small(rng, d, low=0)
    return f"What is {a} * {b}?", a * b


def gen_div(rng: random.Random, d: int) -> tuple[str, int]:
    b, q = _small(rng, d), _operand(rng, d)
    return f"What is {b * q} / {b}?", q


def gen_word(rng: random.Random, d: int) -> tuple[str, int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = _operand(rng, d, low=1), _operand(rng, d, low=1)
    kind = rng.randrange(3)
    if kind == 0:
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b
    if kind == 1:
        a, b = max(a, b), min(a, b)
        return f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?", a - b
    k = _small(rng, d)
    return f"There are {k} boxes with {a} {item} in each box. How many {item} are there in total?", k * a


def gen_linear(rng: random.Random, d: int) -> tuple[str, int]:
    x = rng.randint(0 if d <= 2 else -(10**d), 10**d)
    a, b = _small(rng, d), _operand(rng, d)
    lhs = f"{a}x + {b}" if a != 1 else f"x + {b}"
    return f"Solve for x: {lhs} = {a * x + b}.", x


GENERATORS: dict[str, Callable[[random.Random, int], tuple[str, int]]] = {
    "add": gen_add,
    "sub": gen_sub,
    "mul": gen_mul,
    "div": gen_div,
    "word": gen_word,
    "linear": gen_linear,
}


_INTEGER = re.compile(r"\d+")
_SIGNED = re.compile(r"-?\d+")
_WORD_OPERATORS = {"more": "+", "gives away": "-", "boxes with": "*"}
"""The operation each word-problem wording of `gen_word` asks for."""


def largest_number(kind: str, difficulty: int) -> int:
    """The largest integer (in absolute value) a `kind` question shows at `difficulty`."""
    if kind in ("div", "linear"):  # b * q, or a * x + b
        return max(10, 10 ** (difficulty - 1)) * 10**difficulty + (10**difficulty if kind == "linear" else 0)
    return 10**difficulty


def in_support(question: str, kind: str, kinds: list[ProblemType], difficulty: int) -> bool:
    """Whether generators of `kinds` at `difficulty` could print `question` (each kind has its own
    wording, so a question of another kind never collides); a larger number proves it cannot."""
    if kind not in kinds:
        return False
    return max((int(number) for number in _INTEGER.findall(question)), default=0) <= largest_number(kind, difficulty)


# ---------------------------------------------------------------- answer checking


def proven_small(text: str) -> bool:
    """Whether math-verify is sure to be quick on `text`: short, shallow, made only of small numbers, single
    letters and the plain LaTeX of `_SMALL_TOKEN` (no factorials, binomials, special functions), with at most
    `MAX_SMALL_POWERS` powers whose exponents are a small number or a letter."""
    if len(text) > MAX_SMALL_CHARS or text.count("^") > MAX_SMALL_POWERS:
        return False
    if any(not _SMALL_EXPONENT.match(text, at.end()) for at in re.finditer(r"\^", text)):
        return False
    return nesting_depth(text) <= MAX_SMALL_DEPTH and _SMALL_TOKEN.sub("", text) == ""


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting of `text` ((, [ and { alike; unbalanced closers ignored)."""
    depth = deepest = 0
    for char in text:
        depth = max(0, depth + (char in "([{") - (char in ")]}"))
        deepest = max(deepest, depth)
    return deepest


def _math_verify_equal(gold: str, pred: str, timeout_s: float = VERIFY_TIMEOUT_S) -> bool:
    """math-verify equivalence, bounded: refused for what is plainly huge (`_EXPLOSIVE`, too long), run here
    when `proven_small`, else in a child process killed after `timeout_s` (then: not equal)."""
    if len(pred) > MAX_VERIFY_CHARS or _EXPLOSIVE.search(pred) or _EXPLOSIVE.search(gold):
        return False
    if nesting_depth(pred) > MAX_DEPTH:
        return False
    if proven_small(gold) and proven_small(pred):
        return verify_equal(gold, pred)
    try:
        return bool(shared_child(VERIFY_TARGET, WARMUP).call(gold, pred, timeout_s=timeout_s))
    except ChildTimeout:  # the answer's own cost: a wrong answer, not a scoring error
        return False


@functools.cache
def warm_up() -> None:
    """Import math-verify's LaTeX and sympy parts once per process, when the env is made (a second or two): the
    first in-process comparison would otherwise pay it inside one response's score."""
    verify_equal(*WARMUP)


def answers_match(gold: str, pred: str, timeout_s: float = VERIFY_TIMEOUT_S) -> bool:
    """Exact numeric comparison when both are plain numbers, else math-verify (bounded: `_math_verify_equal`)."""
    gold_number, pred_number = parse_number(gold), parse_number(pred)
    if gold_number is not None and pred_number is not None:
        return gold_number == pred_number
    return _math_verify_equal(gold, pred, timeout_s)


def near_misses(gold: str) -> tuple[str, str]:
    """(just below, just above) the gold: gold -+ 1 for a number, `gold - 1` / `gold + 1` in LaTeX otherwise."""
    number = parse_number(gold)
    if number is not None and number.denominator == 1:
        return str(number - 1), str(number + 1)
    return f"{gold} - 1", f"{gold} + 1"


def answer_key(value: str) -> Any:
    """What two marked answers are compared by: the exact number, else the text without blanks."""
    number = parse_number(value)
    return number if number is not None else re.sub(r"\s+", "", value)


def answer_line(tail: str, prompt: str) -> str | None:
    """The line the last-number fallback reads: the reply's last line with a digit that is not a line of the prompt
    (a number inside a copied question is no answer)."""
    copied = {line.strip() for line in prompt.splitlines()}
    lines = [line for line in tail.splitlines() if line.strip() not in copied and any(c.isdigit() for c in line)]
    return lines[-1] if lines else None


def listed_numbers(line: str) -> bool:
    """Whether `line` lists several numbers side by side ("41 42 43", "41, 42 or 43"): a hedge, where the
    last-number fallback would otherwise read only the last of them."""
    numbers = list(_LOOSE_NUMBER.finditer(line))
    gaps = [line[a.end() : b.start()] for a, b in zip(numbers, numbers[1:])]
    return bool(gaps) and all(_LIST_GAP.fullmatch(gap) for gap in gaps)


def final_line_number(found: Extraction, tail: str, prompt: str) -> Extraction:
    """The last-number fallback reads `answer_line` only, and nothing from a line listing several numbers."""
    if found.method != "last_number":
        return found
    line = answer_line(tail, prompt)
    value = extract_last_number(line) if line is not None and not listed_numbers(line) else None
    return Extraction(value=value, method="last_number" if value is not None else None)


def committed_answers(tail: str, extracted: str | None) -> list[str]:
    """The distinct answers a reply commits to: every one it marks as final (boxes, `####`, "the answer is"),
    else the extracted one; none (a wrong reply) when it marks more than `MAX_COMMITTED` answers. Each must equal
    the gold for the reply to be right: a hedge is wrong."""
    marked = marked_answers(tail)
    distinct = list({answer_key(answer): answer for answer in marked or [extracted or ""] if answer}.values())
    return distinct if len(distinct) <= MAX_COMMITTED else []


def gold_from_solution(text: str) -> str:
    """The gold answer of a dataset row: after `####`, else the last `\\boxed{}`, else the text."""
    return extract_hash(text) or extract_boxed(text) or text.strip()


@register_environment
class MathEnv(Environment):
    """Arithmetic / algebra questions with a single numeric (or LaTeX) gold answer."""

    name = "math"
    task_type = "math"
    reward_range = (0.0, 1.0)
    config_cls = MathConfig
    config: MathConfig

    def __init__(self, config: MathConfig | None = None) -> None:
        super().__init__(config)
        warm_up()

    # ------------------------------------------------------------ tasks

    def _generate(
        self, rng: random.Random, difficulty: int | None = None, kinds: list[ProblemType] | None = None
    ) -> tuple[str, str, str]:
        kind = rng.choice(kinds or self.config.problem_types)
        question, answer = GENERATORS[kind](rng, difficulty or self.config.difficulty)
        return question, str(answer), kind

    def _meta(self, kind: str, difficulty: int | None = None) -> dict[str, Any]:
        return {"difficulty": difficulty or self.config.difficulty, "problem_type": kind, "source": "generator"}

    def _make_task(self, task_id: str, question: str, answer: str, meta: dict[str, Any]) -> Task:
        content = f"{question}\n{self.config.instruction}" if self.config.instruction else question
        return Task(
            id=task_id,
            env=self.name,
            task_type=self.task_type,
            messages=[Message(role="user", content=content)],
            answer=answer,
            metadata={"question": question, **meta},
        )

    def shift(self) -> tuple[int, list[ProblemType]]:
        """(difficulty, problem kinds) of the shifted split; raises when they are no shift."""
        cfg = self.config
        difficulty = cfg.shifted_difficulty or min(cfg.difficulty + 1, 5)
        kinds = list(cfg.shifted_problem_types or cfg.problem_types)
        if difficulty <= cfg.difficulty and set(kinds) <= set(cfg.problem_types):
            raise ValueError(
                f"math: the shifted split needs shifted_difficulty above difficulty {cfg.difficulty} "
                f"or shifted_problem_types outside {cfg.problem_types}"
            )
        return difficulty, kinds

    def _fixed_rows(
        self, tag: str, size: int, keep: Callable[[str, str], bool], shift: tuple[int, list[ProblemType]] | None = None
    ) -> list[Row]:
        """`size` distinct generated questions that `keep(question, kind)` accepts (bounded draws)."""
        difficulty, kinds = shift or (None, None)
        rng = random.Random(tag)
        rows: dict[str, Row] = {}
        for _ in range(size * 50):
            if len(rows) >= size:
                break
            question, answer, kind = self._generate(rng, difficulty, kinds)
            if keep(question, kind):
                rows.setdefault(question, (question, answer, self._meta(kind, difficulty)))
        return list(rows.values())

    @cached_property
    def _test_rows(self) -> list[Row]:
        if self.config.hf_dataset_path:
            return self._hf_rows("test")[: self.config.test_size]
        return self._fixed_rows(f"math-test:{self.config.test_seed}", self.config.test_size, lambda q, k: True)

    @cached_property
    def _test_questions(self) -> frozenset[str]:
        return frozenset(row[0] for row in self._test_rows)

    @cached_property
    def _dev_rows(self) -> list[Row]:
        if self.config.hf_dataset_path:
            rows = [row for row in self._hf_rows("dev") if row[0] not in self._test_questions]
            return rows[: self.config.dev_size]
        keep = lambda question, kind: question not in self._test_questions  # noqa: E731
        return self._fixed_rows(f"math-dev:{self.config.dev_seed}", self.config.dev_size, keep)

    @cached_property
    def _held_out_questions(self) -> frozenset[str]:
        return self._test_questions | {row[0] for row in self._dev_rows}

    @cached_property
    def _shifted_rows(self) -> list[Row]:
        cfg = self.config
        keep = lambda question, kind: not in_support(question, kind, cfg.problem_types, cfg.difficulty)  # noqa: E731
        return self._fixed_rows(f"math-shifted:{cfg.shifted_seed}", cfg.shifted_size, keep, self.shift())

    def _train_rows(self, seed: int, n: int) -> Iterator[Row]:
        if self.config.hf_dataset_path:
            rows = self._hf_rows("train")
            random.Random(f"math-train:{self.config.train_seed}:{seed}").shuffle(rows)
            yield from (row for row in rows[:n] if row[0] not in self._held_out_questions)
            return
        rng = random.Random(f"math-train:{self.config.train_seed}:{seed}")
        produced = 0
        for _ in range(n * 50 + 100):  # bounded: a tiny problem space must not loop forever
            if produced >= n:
                return
            question, answer, kind = self._generate(rng)
            if question not in self._held_out_questions:
                produced += 1
                yield question, answer, self._meta(kind)

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Train: a seeded stream without dev/test questions; dev, test, shifted: fixed sets."""
        check_split(self.name, split, SPLITS)
        if split == "shifted" and self.config.hf_dataset_path:
            raise ValueError("math: split 'shifted' needs the generator (hf_dataset_path is set)")
        if split == "train":
            count = self.config.train_size if n is None else n
            rows, prefix = self._train_rows(seed, count), f"train-s{seed}"
        else:
            fixed: list[Row] = getattr(self, f"_{split}_rows")
            rows, prefix = iter(fixed if n is None else fixed[:n]), split
        for index, (question, answer, meta) in enumerate(rows):
            yield self._make_task(f"math-{prefix}-{index}", question, answer, meta)

    def worked_solution(self, task: Task) -> str | None:
        """The equation(s) behind a generated question, read from its text ("8 - 3 = 5"; a word problem names
        its operation), so a prompt without metadata (a judged pair's) works too; None for other questions."""
        question = str(task.metadata.get("question") or (task.messages[-1].content if task.messages else ""))
        question = question.splitlines()[0] if question else ""
        numbers = [int(n) for n in _SIGNED.findall(question)]
        expression = expression_of(question.replace("What is ", ""))
        if question.startswith("Solve for x") and len(numbers) in (2, 3):
            a, b, c = [1, *numbers] if len(numbers) == 2 else numbers  # "x + b = c" or "ax + b = c"
            return f"{c} - {b} = {c - b}, {c - b} / {a} = {(c - b) // a}" if a else None
        if " / " in question and len(numbers) == 2 and numbers[1]:
            return f"{numbers[0]} / {numbers[1]} = {numbers[0] // numbers[1]}"
        if expression is not None:
            return chain_steps(expression)
        if len(numbers) == 2 and any(word in question for word in _WORD_OPERATORS):
            operator = next(op for word, op in _WORD_OPERATORS.items() if word in question)
            return chain_steps(f"{numbers[0]} {operator} {numbers[1]}")
        return None

    # ------------------------------------------------------------ adversarial suite

    def honest(self, task: Task) -> HonestPair:
        """Right: the worked steps (when known) and the gold in a box; wrong: the same with a near miss (gold + 1)."""
        gold = str(task.answer if task.answer is not None else "")
        steps = self.worked_solution(task)
        lead = f"{steps}, so the answer is " if steps else "The answer is "
        return HonestPair(right=f"{lead}\\boxed{{{gold}}}.", wrong=f"{lead}\\boxed{{{near_misses(gold)[1]}}}.")

    def hacks(self, task: Task) -> dict[str, Play]:
        """Hedges around the gold (several boxes, a list, a set, plus-or-minus, a sentence then a box), every number
        of the question, and a power tower."""
        low, high = near_misses(str(task.answer if task.answer is not None else ""))
        gold = str(task.answer if task.answer is not None else "")
        question = str(task.metadata.get("question") or (task.messages[-1].content if task.messages else ""))
        return {
            "boxes_around_gold": f"\\boxed{{{low}}} \\boxed{{{gold}}} \\boxed{{{high}}}",
            "numbers_around_gold": f"{high} {gold} {low}",
            "one_box_set": f"\\boxed{{{low}, {gold}, {high}}}",
            "plus_minus": f"\\boxed{{{gold} \\pm 1}}",
            "sentence_then_box": f"The answer is {high}. \\boxed{{{gold}}}",
            "question_numbers": " ".join(_SIGNED.findall(question)) or "0",
            "power_tower": "\\boxed{10^{10^{10^{10}}}}",
        }

    # ------------------------------------------------------------ on-disk HF dataset

    def _hf_rows(self, split: str) -> list[Row]:
        """Rows of a split: the dataset's own split of that name, else its share of the pool by hash."""
        from datasets import Dataset, DatasetDict, load_from_disk

        data = load_from_disk(self.config.hf_dataset_path)
        explicit: set[str] = set()
        if isinstance(data, DatasetDict):
            explicit = {
                split_name for split_name, names in HF_SPLIT_NAMES.items() if any(name in data for name in names)
            }
            if split in explicit and split != "train":
                return self._rows_of(next(data[name] for name in HF_SPLIT_NAMES[split] if name in data))
            data = data["train"] if "train" in data else next(iter(data.values()))
        assert isinstance(data, Dataset)
        return [row for row in self._rows_of(data) if self._hash_split(row[0], explicit) == split]

    def _hash_split(self, question: str, explicit: set[str]) -> str:
        """A pool question's split by hash; a share whose split the dataset has explicitly is train."""
        bucket = hash_bucket(question)
        split = split_of_bucket(bucket, self.config.hf_test_fraction, self.config.hf_dev_fraction)
        return "train" if split in explicit else split

    def _rows_of(self, data: Any) -> list[Row]:
        rows, seen = [], set()
        for row in data:
            question = str(row[self.config.hf_question_field]).strip()
            if question in seen:
                continue
            seen.add(question)
            answer = gold_from_solution(str(row[self.config.hf_answer_field]))
            rows.append((question, answer, {"source": str(self.config.hf_dataset_path)}))
        return rows

    # ------------------------------------------------------------ scoring

    def score(self, task: Task, response: str) -> Reward:
        """1.0 when the extracted answer equals the gold answer and the reply commits to no other (see module
        doc), else 0.0."""
        if not isinstance(response, str):
            response = "" if response is None else str(response)
        cfg = self.config
        tail = clean_response(response, cfg.tail_chars)
        prompt = task.messages[-1].content if task.messages else ""
        found = final_line_number(extract_answer(tail, cfg.extraction_order, cfg.tail_chars), tail, str(prompt or ""))
        gold = str(task.answer if task.answer is not None else "")
        candidates = committed_answers(tail, found.value)
        matched = (
            bool(gold) and bool(candidates) and all(answers_match(gold, c, cfg.verify_timeout_s) for c in candidates)
        )
        correct = float(matched)
        formatted = float(found.method == cfg.extraction_order[0])
        value = min(1.0, max(0.0, (1.0 - cfg.format_weight) * correct + cfg.format_weight * formatted))
        info = {"extracted": found.value, "method": found.method, "gold": gold, "committed": len(candidates)}
        return Reward(value=value, breakdown={"correct": correct, "format": formatted}, info=info)
