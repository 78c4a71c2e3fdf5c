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

The test split is a fixed held-out set (`test_seed`, `test_size`; the `seed` argument does not
change it); train datasets are seeded `train_seed + seed * size` and skip every test question.
The answer is read with `answer_extraction` (default: last `\\boxed{}`, else the last line),
NFKC-normalised (full-width digits, Unicode minus) and handed to the dataset's scorer as is, so
its semantics hold (e.g. basic_arithmetic gives partial credit 0.5 for "-4.0" against "-4");
a scorer that raises on junk gives 0 with the error in `info`.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterator
from functools import cached_property, lru_cache
from typing import Any

from pydantic import Field, field_validator

from environments.answer_extraction import DEFAULT_TAIL_CHARS, ExtractionMethod, extract_answer
from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, Reward, Split, Task
from k2post.envs.registry import register_environment

DEFAULT_INSTRUCTION = "Give only the final answer, inside \\boxed{} or alone on the last line."
ERROR_CHARS = 300


class ReasoningGymConfig(EnvConfig):
    """Config of the `reasoning_gym` gym."""

    dataset: str = Field("basic_arithmetic", description="reasoning-gym dataset name (reasoning_gym.factory.DATASETS).")
    dataset_config: dict[str, Any] = Field(
        default_factory=dict, description="Keyword config of the dataset (its config class fields, minus seed/size)."
    )
    size: int = Field(1000, gt=0, description="Train dataset size (tasks yielded when `n` is not given).")
    test_size: int = Field(100, gt=0, description="Size of the fixed held-out test set.")
    train_seed: int = Field(0, description="Base seed of train datasets; split seed s uses train_seed + s * size.")
    test_seed: int = Field(1_000_000_007, description="Seed of the test dataset (far from the train seeds).")
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

    def _source(self, split: Split, seed: int, size: int) -> tuple[int, Any]:
        ds_seed = self.config.test_seed if split == "test" else self.config.train_seed + seed * self.config.size
        return ds_seed, _dataset(self.config.dataset, self._config_json, ds_seed, size)

    @cached_property
    def _test_questions(self) -> frozenset[str]:
        _, data = self._source("test", 0, self.config.test_size)
        return frozenset(str(data[i]["question"]) for i in range(self.config.test_size))

    def _make_task(self, split: Split, seed: int, index: int, entry: dict[str, Any], ds_seed: int, size: int) -> Task:
        question = str(entry["question"])
        content = f"{question}\n\n{self.config.instruction}" if self.config.instruction else question
        meta: dict[str, Any] = {
            "dataset": self.config.dataset,
            "dataset_config": json.loads(self._config_json),
            "dataset_seed": ds_seed,
            "dataset_size": size,
            "index": index,
        }
        meta["entry"], meta["entry_exact"] = json_entry(entry)
        prefix = "test" if split == "test" else f"train-s{seed}"
        return Task(
            id=f"rg-{self.config.dataset}-{prefix}-{index}",
            env=self.name,
            task_type=self.task_type,
            messages=[Message(role="user", content=content)],
            answer=str(entry.get("answer")),
            metadata=meta,
        )

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Up to `n` tasks (default: the split's size); train skips test questions, test dedupes."""
        size = self.config.test_size if split == "test" else max(1, self.config.size if n is None else n)
        limit = size if n is None else min(n, size)
        ds_seed, data = self._source(split, seed, size)
        seen: set[str] = set() if split == "test" else set(self._test_questions)
        produced = 0
        for index in range(size):
            if produced >= limit:
                return
            entry = data[index]
            if str(entry["question"]) in seen:
                continue
            if split == "test":
                seen.add(str(entry["question"]))
            produced += 1
            yield self._make_task(split, seed, index, entry, ds_seed, size)

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
        return Reward(value=value, breakdown={"score": value, "format": formatted}, info=info)
