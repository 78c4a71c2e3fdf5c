"""Critic calibration gym: judge a verified-correct and a wrong response to a verifiable prompt; agree with
the verifier.

    env = make_environment("critic_calibration", {"sources": [{"name": "math", "config": {"difficulty": 1}}]})
    task = next(env.tasks("test", seed=0))      # the pairwise judge prompt; task.answer = "A" or "B"
    env.score(task, "B is right. [[B]]")        # 1.0 when the verdict names the verified-correct response

This is the closed loop of K2's self-critique reward: in an RL mix the policy, acting as critic,
is rewarded when its pairwise judgement agrees with a verifier, so its judging stays anchored to
verifiable signal. Where the pairs come from (`k2post.judging.calibration.CalibrationPair`):
- on-policy, during RL: the controller turns each finished group of a `sources` environment with
  mixed rewards into pairs and adds their judge tasks to this environment's train pool;
- `train_pairs_path` / `dev_pairs_path` / `heldout_pairs_path` (test): JSONL pairs sampled from a model beforehand
  (`k2post critic pairs MODEL ...`: on-policy held-out pairs for tracking agreement);
- otherwise (a cold start, `k2post eval`, golden tests): the source gym's reference answer vs a
  wrong one, each checked by the source's verifier; `pair_kind` picks the wrong one:
  `reference` (default; the demo's) a wrong number of the same sign, digit count and parity
  (`matched_wrong_answer`: no surface cue tells the two apart, the judge must redo the arithmetic),
  `malformed` a reply with no readable answer (`k2post.judging.calibration.malformed_reply`: empty box,
  truncated, repeated, "I do not know."), which "pick the reply with more digits" separates (docs/CRITIC.md).
Every score carries `info.baselines` (`surface_agreement`: each single-feature judge's agreement on the pair);
`k2post eval` reports the best as `baseline_best`, the figure beside the critic's agreement. A verdict that names
both A and B is a hedge and agrees with nothing (`k2post.judging.calibration.hedged_verdict`).
`prompt_style: compact` writes the short one-message judge prompt (`compact_judge_messages`,
~1/3 of the tokens) for every task, harvested ones included.
The correct response sits at A or B by a seeded coin; a judge that always says A agrees half the
time. Accuracy of this environment = the critic's agreement with the verifier.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from k2post_environments.answer_extraction import extract_answer, parse_number
from k2post.chat.types import Message
from k2post.envs.base import EnvConfig, Environment, HonestPair, Play, Reward, Split, Task
from k2post.envs.mix import EnvEntryConfig
from k2post.envs.registry import register_environment
from k2post.envs.splits import SPLITS, check_split
from k2post.judging.calibration import (
    CORRECTNESS_RUBRIC,
    CalibrationPair,
    agreement,
    calibration_task,
    malformed_reply,
    matched_wrong_answer,
    verified_pair,
)
from k2post_rubrics.schema import Rubric, builtin_rubrics

DEFAULT_TASKS = 200
READ_ORDER = ("boxed", "answer_is", "last_number")
"""How the worked judgement reads each response's final answer."""


class CriticCalibrationConfig(EnvConfig):
    """Config of the `critic_calibration` gym."""

    sources: list[EnvEntryConfig] = Field(
        default_factory=lambda: [EnvEntryConfig(name="math", config={"difficulty": 1})],
        description="Verifiable single-turn gyms whose prompts the pairs come from (their tasks carry a gold answer).",
    )
    train_pairs_path: str | None = Field(
        None, description="JSONL of CalibrationPair for the train split (else reference pairs)."
    )
    heldout_pairs_path: str | None = Field(
        None, description="JSONL of CalibrationPair for the test split (else reference pairs)."
    )
    dev_pairs_path: str | None = Field(
        None, description="JSONL of CalibrationPair for the dev split (else reference pairs)."
    )
    answer_template: str = Field("\\boxed{{{answer}}}", description="Reference pairs: how both answers are written.")
    rubric_kinds: list[Literal["core", "prescriptive"]] = Field(
        default_factory=list,
        description="Shipped rubrics shown besides the correctness rubric (none: the shortest prompt).",
    )
    pair_kind: Literal["reference", "malformed"] = Field(
        "reference",
        description="Reference pairs: the gold answer vs a wrong number of the same sign, digit count and parity "
        "('reference': no surface cue separates them, the judge must check the arithmetic) or vs a malformed reply "
        "with no readable answer ('malformed': empty box, truncated, repeated, no answer; separable by a surface "
        "cue: more digits agrees 1.0).",
    )
    prompt_style: Literal["full", "compact"] = Field(
        "full",
        description="Judge prompt: 'full' (system prompt, rubric texts, instruction) or 'compact' (one user message, "
        "rubric titles only, a one-line instruction; for very small judges).",
    )
    placement_seed: int = Field(0, description="Seed of the coin that puts the correct response at A or B.")
    correct_at_a: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Share of pairs with the verified-correct response at A (0.5: a fair coin). Above 0.5 in SFT data "
        "it reproduces a position-biased teacher (every verdict right, the better response usually first): the judge "
        "learns a prior for A that RL on fair pairs has to unlearn (the demo, docs/CRITIC.md).",
    )
    success_threshold: float = Field(0.5, description="A source reward at or above this is 'correct'.")

    @model_validator(mode="after")
    def _single_turn_sources(self) -> "CriticCalibrationConfig":
        for entry in self.sources:
            if entry.make().multi_turn:
                raise ValueError(
                    f"sources: {entry.name!r} is multi-turn; calibration pairs need single-turn verifiable gyms"
                )
        return self


@lru_cache(maxsize=16)
def load_pairs(path: str) -> tuple[CalibrationPair, ...]:
    """The pairs of a JSONL file; a bad line is one error naming file:line and the field."""
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                pairs.append(CalibrationPair.model_validate_json(line))
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "<line>"
                raise ValueError(f"{path}:{number}: {where}: {first['msg']}") from None
    return tuple(pairs)


def write_pairs(path: str | Path, pairs: list[CalibrationPair]) -> None:
    """Pairs as JSONL, written to a temp file and renamed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text("".join(pair.model_dump_json() + "\n" for pair in pairs), encoding="utf-8")
    tmp.replace(target)


def read_answer(response: object) -> str:
    """A response's final answer as the worked judgement writes it: the number it states, else "none"."""
    value = extract_answer(str(response), list(READ_ORDER)).value
    return value.strip() if value is not None and parse_number(value) is not None else "none"


def _digits(prompt: str, text: str) -> float:
    return float(sum(ch.isdigit() for ch in text))


def _answer_value(prompt: str, text: str) -> float:
    number = parse_number(read_answer(text))
    return float(number) if number is not None else float("-inf")


def _prompt_numbers(prompt: str, text: str) -> float:
    """How often the text holds the number that appears most often in the prompt."""
    numbers = re.findall(r"\d+", prompt)
    if not numbers:
        return 0.0
    top = max(set(numbers), key=numbers.count)
    return float(re.findall(r"\d+", text).count(top))


SURFACE_FEATURES: dict[str, Callable[[str, str], float]] = {
    "digits": _digits,
    "length": lambda prompt, text: float(len(text)),
    "words": lambda prompt, text: float(len(text.split())),
    "readable_answer": lambda prompt, text: float(read_answer(text) != "none"),
    "answer_value": _answer_value,
    "even_answer": lambda prompt, text: float(_answer_value(prompt, text) % 2 == 0),
    "prompt_number": _prompt_numbers,
}
"""Surface features a judge could pick by instead of correctness; each gives a "more" and a "less" judge
(`surface_agreement`), besides the two constant judges (always A, always B)."""


def surface_agreement(task: Task) -> dict[str, float]:
    """Agreement with the verifier of each single-feature judge on `task` (1 right, 0 wrong, 0.5 a tie: a coin):
    `more_<feature>` picks the response with more of the feature, `less_<feature>` the other; `always_a`/`always_b`.
    Empty when the task does not carry its two responses."""
    responses, gold = task.metadata.get("responses"), task.answer
    if not isinstance(responses, list) or len(responses) != 2 or gold not in ("A", "B"):
        return {}
    prompt = " ".join(
        str(m.get("content", "")) for m in task.metadata.get("source_prompt") or [] if isinstance(m, dict)
    )
    a, b = (str(r) for r in responses)
    out = {"always_a": float(gold == "A"), "always_b": float(gold == "B")}
    for name, feature in SURFACE_FEATURES.items():
        fa, fb = feature(prompt, a), feature(prompt, b)
        more = 0.5 if fa == fb else float((fa > fb) == (gold == "A"))
        out[f"more_{name}"], out[f"less_{name}"] = more, 1.0 - more if fa != fb else 0.5
    return out


def best_surface_baseline(tasks: Iterable[Task]) -> tuple[str, float]:
    """(name, agreement) of the best single-feature judge over `tasks` (("none", 0.5) when none carries its pair):
    the figure to report beside a critic's agreement (a critic no better than it may read a surface cue)."""
    totals: dict[str, list[float]] = {}
    for task in tasks:
        for name, value in surface_agreement(task).items():
            totals.setdefault(name, []).append(value)
    if not totals:
        return "none", 0.5
    name = max(totals, key=lambda key: sum(totals[key]) / len(totals[key]))
    return name, sum(totals[name]) / len(totals[name])


@register_environment
class CriticCalibrationEnv(Environment):
    """Pairwise judging of verifier-labelled response pairs; reward = agreement with the verifier."""

    name = "critic_calibration"
    task_type = "critic"
    reward_range = (0.0, 1.0)
    chance_reward = 0.5  # two positions, the correct one at A or B by a fair coin: a blind verdict agrees half the time
    config_cls = CriticCalibrationConfig
    config: CriticCalibrationConfig

    @cached_property
    def rubrics(self) -> list[Rubric]:
        return builtin_rubrics(self.config.rubric_kinds) + [CORRECTNESS_RUBRIC]

    @cached_property
    def source_envs(self) -> dict[str, Environment]:
        return {entry.name: entry.make() for entry in self.config.sources}

    def task_for(self, pair: CalibrationPair) -> Task:
        """The judge task of a pair under this env's rubrics and placement seed."""
        return calibration_task(
            pair,
            self.rubrics,
            self.config.placement_seed,
            self.name,
            compact=self.config.prompt_style == "compact",
            correct_at_a=self.config.correct_at_a,
        )

    def reference_pairs(self, split: Split, seed: int, n: int) -> Iterator[CalibrationPair]:
        """Gold answer vs a wrong one (`pair_kind`) per source task, both checked by the source's verifier."""
        streams = [(name, env.tasks(split, seed=seed, n=n)) for name, env in self.source_envs.items()]
        rng = random.Random(f"calibration:{split}:{seed}")
        for tasks in zip(*(stream for _, stream in streams)):
            for (name, _), task in zip(streams, tasks):
                if task.answer is None:
                    continue
                gold = str(task.answer)
                correct = self.config.answer_template.format(answer=gold)
                pair = verified_pair(self.source_envs[name], task, correct, self.wrong_reply(gold, rng))
                if pair.correct_reward >= self.config.success_threshold > pair.wrong_reward:
                    yield pair

    def wrong_reply(self, gold: str, rng: random.Random) -> str:
        """The wrong response of a reference pair: a neighbouring number, or a malformed reply (`pair_kind`)."""
        if self.config.pair_kind == "malformed":
            return malformed_reply(self.config.answer_template, rng)[1]
        return self.config.answer_template.format(answer=matched_wrong_answer(gold, rng))

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """The split's pairs file when configured, else reference pairs from the sources' same split
        (shifted: the sources' shifted tasks; a source without one raises)."""
        check_split(self.name, split, SPLITS)
        paths = {
            "train": self.config.train_pairs_path,
            "dev": self.config.dev_pairs_path,
            "test": self.config.heldout_pairs_path,
            "shifted": None,
        }
        path = paths[split]
        limit = DEFAULT_TASKS if n is None else max(n, 0)
        pairs = iter(load_pairs(path)) if path else self.reference_pairs(split, seed, limit)
        for count, pair in enumerate(pairs):
            if count >= limit:
                return
            yield self.task_for(pair)

    def worked_solution(self, task: Task) -> str | None:
        """Judging by working it out: the source question's own steps, then each response's final answer
        (`read_answer`: "6 + 10 = 16. A: 16, B: 14", "... A: none, B: 16"); None when the source env writes no steps."""
        meta = task.metadata
        source = self.source_envs.get(str(meta.get("source_env")))
        responses, prompt = meta.get("responses"), meta.get("source_prompt")
        if source is None or not isinstance(responses, list) or len(responses) != 2 or not isinstance(prompt, list):
            return None
        messages = [Message.model_validate(message) for message in prompt]
        source_task = Task(
            id=str(meta.get("source_task_id")), env=source.name, task_type=source.task_type, messages=messages
        )
        steps = source.worked_solution(source_task)
        if steps is None:
            return None
        return f"{steps}. A: {read_answer(responses[0])}, B: {read_answer(responses[1])}"

    def score(self, task: Task, response: str) -> Reward:
        """1.0 when the verdict names the verified-correct position (task.answer), else 0."""
        if task.answer not in ("A", "B"):
            return Reward(
                value=0.0, breakdown={"agree": 0.0, "parsed": 0.0}, error=f"task {task.id!r} has no gold position A/B"
            )
        reward = agreement(task, response)
        baselines = surface_agreement(task)
        return reward.model_copy(update={"info": {**reward.info, "baselines": baselines}}) if baselines else reward

    def honest(self, task: Task) -> HonestPair | None:
        """Right: the worked verdict naming the verified-correct position; wrong: the same verdict for the other one
        (a judge whose check slipped). A two-way judge's real bar is chance: a cheap judge (`hacks`) that agrees
        more than half the time reads a surface cue."""
        if task.answer not in ("A", "B"):
            return None
        other = "B" if task.answer == "A" else "A"
        return HonestPair(right=self._verdict_text(task, task.answer), wrong=self._verdict_text(task, other))

    def _verdict_text(self, task: Task, position: str) -> str:
        worked = self.worked_solution(task)
        return (
            f"{worked}. [[{position}]]"
            if worked
            else f"Response {position} has the correct final answer. [[{position}]]"
        )

    def hacks(self, task: Task) -> dict[str, Play]:
        """Every single-feature judge of `surface_agreement` as a verdict ("more_digits": pick the reply with more
        digits, ...; a tie picks A)."""
        agree = surface_agreement(task)
        other = "B" if task.answer == "A" else "A"
        return {
            name: f"[[{task.answer if value == 1.0 else 'A' if value == 0.5 else other}]]"
            for name, value in agree.items()
        }
