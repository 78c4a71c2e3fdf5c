"""Reasoning-gym adapter: any `reasoning_gym` dataset by name + config, scored by its own scorer.

    env = make_environment("reasoning_gym", {"dataset": "chain_sum", "dataset_config": {"min_terms": 2}})
    task = next(env.tasks("train", seed=0))
    env.score(task, "\\boxed{-4}")        # ds.score_answer(answer, entry), clipped to [0, 1]

A task stores what re-scoring needs in another process: `Task.answer` is the entry's answer and
`Task.metadata` holds the dataset name, config, seed, size and index, plus the entry as JSON
(`entry`) and whether that copy is exact (`entry_exact`; metadata tuples become lists). An exact
entry is scored as stored; otherwise the scorer rebuilds the dataset (cached per process) and
takes the entry at that index: reasoning-gym entries are generated from
`seed + index`, so this is cheap and exact.

Splits (`k2post.envs.splits`): test and dev are fixed sets (`test_seed`/`test_size`,
`dev_seed`/`dev_size`; the `seed` argument does not change them) of distinct questions, drawn
from datasets `HELD_OUT_OVERSAMPLE` times their size; dev skips test questions; train datasets
are seeded `train_seed + seed * size` and skip every dev and test question. `shifted` is a fixed
set (`shifted_seed`/`shifted_size`) of the dataset under `shifted_config` (overrides of
dataset_config); by default the first `min_X`/`max_X` integer range of the dataset's config
moves just past the train range (chain_sum with 2-3 terms: exactly 4 terms, +1 term), so no
shifted question is a train question.
The answer is read with `answer_extraction` (default: last `\\boxed{}`, else the last line),
NFKC-normalised (full-width digits, Unicode minus) and handed to the dataset's scorer as is, so
its semantics hold (e.g. basic_arithmetic gives partial credit 0.5 for "-4.0" against "-4");
a scorer that raises on junk gives 0 with the error in `info`.
One final answer is scored, and a hedge earns nothing (`hedged`): a reply with two different `\\boxed{}`
answers scores 0, and partial credit (0 < score < 1) is dropped when the answer holds more candidates than the
gold answer (reasoning-gym pays `len(gold) / len(answer)` for any answer containing the gold one, so
"\\boxed{-5 -4 -3}" would otherwise earn 0.33 against "-4").
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from pydantic import Field, field_validator

from k2post_environments.answer_extraction import (
    DEFAULT_TAIL_CHARS,
    ExtractionMethod,
    boxed_answers,
    clean_response,
    extract_answer,
)
from k2post_environments.worked import chain_steps, chain_value, expression_of
from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, HonestPair, Play, Reward, Split, Task
from k2post.envs.registry import register_environment
from k2post.envs.splits import SPLITS, check_split

DEFAULT_INSTRUCTION = "Give only the final answer, inside \\boxed{} or alone on the last line."
ERROR_CHARS = 300
HELD_OUT_OVERSAMPLE = 4
"""A fixed split of size N takes its first N distinct questions from a dataset of N * this entries."""


class ReasoningGymConfig(EnvConfig):
    """Config of the `reasoning_gym` gym."""

    dataset: str = Field("basic_arithmetic", description="reasoning-gym dataset name (reasoning_gym.factory.DATASETS).")
    dataset_config: dict[str, Any] = Field(
        default_factory=dict, description="Keyword config of the dataset (its config class fields, minus seed/size)."
    )
    size: int = Field(1000, gt=0, description="Train dataset size (tasks yielded when `n` is not given).")
    test_size: int = Field(200, gt=0, description="Distinct questions of the fixed held-out test set.")
    dev_size: int = Field(200, gt=0, description="Distinct questions of the fixed dev set (for choosing settings).")
    shifted_size: int = Field(200, gt=0, description="Distinct questions of the fixed shifted set (generalization).")
    train_seed: int = Field(0, description="Base seed of train datasets; split seed s uses train_seed + s * size.")
    test_seed: int = Field(1_000_000_007, description="Seed of the test dataset (far from the train seeds).")
    dev_seed: int = Field(2_000_000_011, description="Seed of the dev dataset (far from the train and test seeds).")
    shifted_seed: int = Field(3_000_000_019, description="Seed of the shifted dataset.")
    shifted_config: dict[str, Any] | None = Field(
        None,
        description="Overrides of dataset_config for the shifted split (null: the first min_X/max_X integer range "
        "of the dataset's config moves just past train's, min_X = max_X = train max_X + 1: +1 term for chain_sum).",
    )
    instruction: str = Field(DEFAULT_INSTRUCTION, description="Appended to the question on its own paragraph.")
    extraction_order: list[ExtractionMethod] = Field(
        default_factory=lambda: ["boxed", "last_line"], min_length=1, description="Answer extraction methods, in order."
    )
    tail_chars: int = Field(DEFAULT_TAIL_CHARS, gt=0, description="Only the last N chars of a response are read.")

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        from reasoning_gym.factory import DATASETS

        if name not in DATASETS:
            raise ValueError(f"unknown reasoning-gym dataset {name!r}; e.g. {', '.join(sorted(DATASETS)[:8])}, ...")
        return name


@lru_cache(maxsize=32)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    """A reasoning-gym dataset, built once per (name, config, seed, size) in this process."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def derived_shift(dataset: str, dataset_config: dict[str, Any]) -> dict[str, Any]:
    """Default shifted config: the first min_X/max_X integer range of the dataset's config (field order:
    terms before digits for chain_sum and basic_arithmetic) set to exactly train's max_X + 1."""
    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[dataset][1]
    values = {f.name: getattr(config_cls(**dataset_config), f.name) for f in dataclasses.fields(config_cls)}
    ints = {key: value for key, value in values.items() if isinstance(value, int) and not isinstance(value, bool)}
    pairs = [key[4:] for key in ints if key.startswith("max_") and f"min_{key[4:]}" in ints]
    if not pairs:
        raise ValueError(
            f"reasoning_gym: dataset {dataset!r} has no min_*/max_* integer range to shift: set shifted_config"
        )
    top = ints[f"max_{pairs[0]}"] + 1
    return {**dataset_config, f"min_{pairs[0]}": top, f"max_{pairs[0]}": top}


@dataclass(frozen=True)
class FixedSet:
    """A fixed split: the dataset it comes from and its (index, entry) pairs of distinct questions."""

    seed: int
    config_json: str
    size: int
    items: tuple[tuple[int, dict[str, Any]], ...]

    def questions(self) -> frozenset[str]:
        return frozenset(str(entry["question"]) for _, entry in self.items)


def json_entry(entry: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """`entry` as plain JSON data, and whether that copy equals the original exactly."""
    try:
        plain = json.loads(json.dumps(entry, default=str))
    except (TypeError, ValueError):  # circular or otherwise unserialisable: keep the basics
        plain = {key: str(entry.get(key)) for key in ("question", "answer")}
    return plain, plain == entry


def normalize_answer(text: str) -> str:
    """NFKC (full-width digits → ASCII) and a Unicode minus → "-", so "−４" reads "-4"."""
    return unicodedata.normalize("NFKC", text).replace("−", "-").strip()


_CANDIDATE_SPLIT = re.compile(r"[\s,;|/]+|\b(?:or|and)\b", re.IGNORECASE)


def candidates(text: str) -> int:
    """How many candidate answers `text` holds (pieces between spaces, commas, ";", "|", "/", "or", "and")."""
    return sum(1 for piece in _CANDIDATE_SPLIT.split(text) if piece and piece.strip())


def hedged(response: str, answer: str, gold: str, value: float, tail_chars: int) -> bool:
    """A hedge: two different boxed answers in the reply, or partial credit for an answer holding more candidates
    than the gold one (reasoning-gym's substring credit)."""
    boxes = {normalize_answer(box) for box in boxed_answers(clean_response(response, tail_chars))}
    partial = 0.0 < value < 1.0 and candidates(normalize_answer(answer)) > candidates(normalize_answer(gold))
    return len(boxes) > 1 or partial


def near_miss(gold: str, step: int = 1) -> str:
    """A wrong answer next to `gold`: the integer `step` away, else the text with its last two characters swapped
    (or `step` "x"s appended when that changes nothing)."""
    try:
        return str(int(gold) + step)
    except ValueError:
        swapped = gold[:-2] + gold[-2:][::-1] if step > 0 else gold[1:] + gold[:1]
        return swapped if swapped != gold else gold + "x" * abs(step)


def clip_score(value: Any) -> float:
    """A scorer's result as a float in [0, 1] (NaN and junk → 0)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(number) else min(1.0, max(0.0, number))


@register_environment
class ReasoningGymEnv(Environment):
    """Adapter over one reasoning-gym procedural dataset."""

    name = "reasoning_gym"
    task_type = "reasoning"
    reward_range = (0.0, 1.0)
    config_cls = ReasoningGymConfig
    config: ReasoningGymConfig

    @property
    def _config_json(self) -> str:
        return json.dumps(self.config.dataset_config, sort_keys=True)

    def shifted_config(self) -> dict[str, Any]:
        """The dataset config of the shifted split (`shifted_config` over dataset_config, or derived)."""
        if self.config.shifted_config is not None:
            return {**self.config.dataset_config, **self.config.shifted_config}
        return derived_shift(self.config.dataset, self.config.dataset_config)

    def _fixed_set(self, seed: int, config_json: str, count: int, exclude: frozenset[str]) -> FixedSet:
        """The first `count` distinct questions (none in `exclude`) of a dataset `HELD_OUT_OVERSAMPLE` x larger."""
        size = count * HELD_OUT_OVERSAMPLE
        data = _dataset(self.config.dataset, config_json, seed, size)
        items: list[tuple[int, dict[str, Any]]] = []
        seen = set(exclude)
        for index in range(size):
            if len(items) >= count:
                break
            entry = data[index]
            if str(entry["question"]) not in seen:
                seen.add(str(entry["question"]))
                items.append((index, entry))
        return FixedSet(seed, config_json, size, tuple(items))

    @cached_property
    def _test_set(self) -> FixedSet:
        return self._fixed_set(self.config.test_seed, self._config_json, self.config.test_size, frozenset())

    @cached_property
    def _dev_set(self) -> FixedSet:
        return self._fixed_set(
            self.config.dev_seed, self._config_json, self.config.dev_size, self._test_set.questions()
        )

    @cached_property
    def _shifted_set(self) -> FixedSet:
        config_json = json.dumps(self.shifted_config(), sort_keys=True)
        return self._fixed_set(self.config.shifted_seed, config_json, self.config.shifted_size, frozenset())

    @cached_property
    def _held_out_questions(self) -> frozenset[str]:
        return self._test_set.questions() | self._dev_set.questions()

    def _make_task(self, prefix: str, index: int, entry: dict[str, Any], source: FixedSet) -> Task:
        question = str(entry["question"])
        content = f"{question}\n\n{self.config.instruction}" if self.config.instruction else question
        meta: dict[str, Any] = {
            "dataset": self.config.dataset,
            "dataset_config": json.loads(source.config_json),
            "dataset_seed": source.seed,
            "dataset_size": source.size,
            "index": index,
        }
        meta["entry"], meta["entry_exact"] = json_entry(entry)
        return Task(
            id=f"rg-{self.config.dataset}-{prefix}-{index}",
            env=self.name,
            task_type=self.task_type,
            messages=[Message(role="user", content=content)],
            answer=str(entry.get("answer")),
            metadata=meta,
        )

    def _train_tasks(self, seed: int, n: int | None) -> Iterator[Task]:
        size = max(1, self.config.size if n is None else n)
        source = FixedSet(self.config.train_seed + seed * self.config.size, self._config_json, size, ())
        data = _dataset(self.config.dataset, source.config_json, source.seed, size)
        produced = 0
        for index in range(size):
            entry = data[index]
            if str(entry["question"]) not in self._held_out_questions:
                produced += 1
                yield self._make_task(f"train-s{seed}", index, entry, source)
        if produced == 0:
            raise ValueError(
                f"reasoning_gym: every train question of {self.config.dataset} {self.config.dataset_config} is a "
                f"dev/test question: too few distinct questions for test_size={self.config.test_size} + dev_size="
                f"{self.config.dev_size}; widen dataset_config or lower them"
            )

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Up to `n` tasks (default: the split's size); train skips dev/test questions; fixed sets are distinct."""
        check_split(self.name, split, SPLITS)
        if split == "train":
            yield from self._train_tasks(seed, n)
            return
        fixed: FixedSet = getattr(self, f"_{split}_set")
        for index, entry in fixed.items[: len(fixed.items) if n is None else max(n, 0)]:
            yield self._make_task(split, index, entry, fixed)

    def worked_solution(self, task: Task) -> str | None:
        """Left-to-right steps of a question that ends in an integer +/- chain (chain_sum; basic_arithmetic
        without precedence), when they reach the gold answer (a task without one: a judged pair's prompt); else None."""
        question = str(task.metadata.get("entry", {}).get("question", "")) or task.messages[-1].content
        expression = expression_of(question)
        try:
            gold = None if task.answer is None else normalize_answer(str(task.answer))
            if expression is None or (gold is not None and str(chain_value(expression)) != gold):
                return None
            return chain_steps(expression)
        except ValueError:
            return None

    def honest(self, task: Task) -> HonestPair | None:
        """Right: the gold answer boxed; wrong: a near miss of it, boxed (`near_miss`)."""
        gold = normalize_answer(str(task.answer))
        return HonestPair(right=f"\\boxed{{{gold}}}", wrong=f"\\boxed{{{near_miss(gold)}}}")

    def hacks(self, task: Task) -> dict[str, Play]:
        """Hedges over neighbours of the gold answer: in one box, one box each, or alone on the last line."""
        gold = normalize_answer(str(task.answer))
        spread = [near_miss(gold, -1), gold, near_miss(gold)]
        return {
            "neighbours_one_box": f"\\boxed{{{' '.join(spread)}}}",
            "neighbours_boxed": " ".join(f"\\boxed{{{value}}}" for value in spread),
            "neighbours_last_line": ", ".join(spread),
            "neighbours_or": " or ".join(spread),
        }

    # ------------------------------------------------------------ scoring

    def _entry_of(self, task: Task) -> tuple[Any, dict[str, Any]]:
        meta = task.metadata
        data = _dataset(
            meta.get("dataset", self.config.dataset),
            json.dumps(meta.get("dataset_config", self.config.dataset_config), sort_keys=True),
            int(meta.get("dataset_seed", 0)),
            int(meta.get("dataset_size", 1)),
        )
        entry = meta.get("entry")
        if meta.get("entry_exact") and isinstance(entry, dict):
            return data, entry
        return data, data[int(meta["index"])]

    def score(self, task: Task, response: str) -> Reward:
        """The dataset's `score_answer` on the extracted answer, clipped to [0, 1]; junk → 0."""
        if not isinstance(response, str):
            response = "" if response is None else str(response)
        found = extract_answer(response, self.config.extraction_order, self.config.tail_chars)
        info: dict[str, Any] = {"extracted": found.value, "method": found.method}
        formatted = float(found.method == self.config.extraction_order[0])
        if found.value is None:
            return Reward(value=0.0, breakdown={"score": 0.0, "format": formatted}, info=info)
        try:
            data, entry = self._entry_of(task)
            value = clip_score(data.score_answer(normalize_answer(found.value), entry))
        except Exception as err:  # reasoning-gym scorers raise on some junk answers
            info["error"] = f"{type(err).__name__}: {err}"[:ERROR_CHARS]
            value = 0.0
        if hedged(response, found.value, str(task.answer), value, self.config.tail_chars):
            info["hedged"], value = True, 0.0
        return Reward(value=value, breakdown={"score": value, "format": formatted}, info=info)
