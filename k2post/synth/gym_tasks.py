"""SFT rows from verifiable single-turn gyms: the gym's train tasks, a reference answer, the gym's own verifier
as judge.

    cfg = GymTasksConfig(env="math", config={"difficulty": 1}, tasks=600)
    env, tasks = gym_tasks(cfg, seed=0)
    row = gym_row(cfg, env, tasks[0], seed=0, mistake_rate=0.15)   # accepted iff the gym scores the reply solved

The reference answer is `Task.answer` written with one of `answer_templates` (seeded, by weight;
default `\\boxed{...}`): data in more than one answer style, as synthesized data usually is. A template
without `{answer}` is a fixed reply (a lazy or biased teacher's: `[[A]]` to every judging prompt); the
verifier keeps only the rows it accepts unless `accept_at` is lowered (0: keep unverified data). A template
may also restate the question's numbers (`{numbers}`: its integers in order, comma-separated), a copy
step that trains the attention a tool call's arguments need, or work the answer out first (`{steps}`:
the env's `worked_solution`, e.g. "7 - 3 = 4, 4 + 9 = 13"; an env that cannot write one is an error).
With `mistake_rate`, a seeded share of answers is perturbed (a neighbouring number, or a reversed
string) so the judge has something to reject: it is rejection sampling against the verifier, as
for the tool-use trajectories; a style the verifier cannot read is rejected the same way. Rows
share the tool-use rows' columns; their `domain` is `gym:<env>`. Used by `k2post synth`
(`gym_tasks:` in the config).
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

from pydantic import Field, model_validator

from k2post.config.base import K2Config
from k2post.envs.base import Environment, Task
from k2post.envs.mix import EnvEntryConfig

DOMAIN_PREFIX = "gym:"
TEMPLATE_SLOTS = frozenset({"answer", "numbers", "steps"})
_INTEGER = re.compile(r"-?\d+")


class GymTasksConfig(K2Config):
    """Train tasks of one single-turn verifiable environment, answered by the reference and judged by the env."""

    env: str = Field(
        "math",
        description="Registered single-turn environment whose tasks carry a gold `answer` (math, reasoning_gym).",
    )
    label: str | None = Field(
        None,
        min_length=1,
        description="This entry's name in row ids (default: the env's name); give one to list an environment "
        "twice, e.g. math at two difficulties.",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="The environment's config (validated against its config class)."
    )
    tasks: int = Field(200, gt=0, description="Train tasks drawn (fewer when the split is smaller).")
    seed_offset: int = Field(
        1000,
        description="The train split is drawn with seed = synth seed + this (keep it apart from the RL pool's seed).",
    )
    answer_templates: dict[str, float] = Field(
        default_factory=lambda: {"\\boxed{{{answer}}}": 1.0},
        description="Reply templates (`{answer}` = the gold answer, or none: a fixed reply such as a position-biased "
        "judge's '[[A]]', kept only where the verifier agrees unless accept_at is lowered; optional `{numbers}` = the "
        "question's integers, comma-separated; optional `{steps}` = the env's worked solution, e.g. "
        "'7 - 3 = 4, 4 + 9 = 13') and their sampling weights, e.g. "
        "{'The answer is {answer}.': 0.7, '\\boxed{{{answer}}}': 0.3}; replies the gym's verifier rejects are dropped.",
    )
    accept_at: float = Field(
        1.0,
        description="The gym's reward a reply needs to be kept (0: every row is kept, unverified "
        "teacher data, e.g. a position-biased judge's verdicts).",
    )
    judge_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of tasks written as a pairwise judging row instead (the critic's SFT data): the "
        "reference reply and a perturbed one as Response A/B (seeded order), answered with the verifier's verdict "
        "[[A]]/[[B]].",
    )

    @model_validator(mode="after")
    def _check(self) -> "GymTasksConfig":
        entry = EnvEntryConfig(name=self.env, config=self.config)  # unknown env / bad config -> field error
        if entry.make().multi_turn:
            raise ValueError(
                f"gym_tasks: {self.env!r} is multi-turn; use it through `domains` (tool-use trajectories) instead"
            )
        if not self.answer_templates:
            raise ValueError("answer_templates must list at least one template")
        for template, weight in self.answer_templates.items():
            if weight <= 0:
                raise ValueError(f"answer_templates: {template!r} needs a positive weight (got {weight})")
            unknown = {name for _, name, _, _ in string.Formatter().parse(template) if name} - TEMPLATE_SLOTS
            if unknown:
                raise ValueError(
                    f"answer_templates: {template!r} has unknown slot(s) {sorted(unknown)}; "
                    f"known: {sorted(TEMPLATE_SLOTS)}"
                )
        self.config = entry.config
        return self

    @property
    def key(self) -> str:
        """The entry's name in row ids: `label`, else the env name."""
        return self.label or self.env

    def make_env(self) -> Environment:
        return EnvEntryConfig(name=self.env, config=self.config).make()


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: a neighbouring integer, else the reversed text (or a suffix when that is the same)."""
    try:
        return str(int(answer) + rng.choice((-2, -1, 1, 2)))
    except ValueError:
        flipped = answer[::-1]
        return flipped if flipped != answer else f"{answer}x"


def question_numbers(task: Task) -> str:
    """The integers of the task's last user message, in order, comma-separated ("" when it has none)."""
    question = next((m.content for m in reversed(task.messages) if m.role == "user"), "")
    return ", ".join(_INTEGER.findall(question))


def reference_reply(
    cfg: GymTasksConfig, env: Environment, task: Task, rng: random.Random, mistake_rate: float
) -> tuple[str, str | None, str]:
    """(reply, mistake or None, template used) for one task."""
    gold, mistake = str(task.answer), None
    if rng.random() < mistake_rate:
        gold, mistake = wrong_answer(gold, rng), "wrong_answer"
    template = rng.choices(list(cfg.answer_templates), weights=list(cfg.answer_templates.values()))[0]
    return render_reply(template, gold, task, env), mistake, template


def render_reply(template: str, answer: str, task: Task, env: Environment | None = None) -> str:
    """`template` with its `{answer}`, `{numbers}` and `{steps}` slots filled for `task` (`{steps}` needs the env)."""
    steps = ""
    if "{steps}" in template:
        steps = env.worked_solution(task) if env is not None else None
        if steps is None:
            raise ValueError(
                f"answer_templates: {template!r} has a {{steps}} slot but {task.env!r} writes no worked solution "
                f"for task {task.id!r}"
            )
    return template.format(answer=answer, numbers=question_numbers(task), steps=steps)


def gym_row(cfg: GymTasksConfig, env: Environment, task: Task, seed: int, mistake_rate: float) -> dict[str, Any]:
    """One decided row (the same keys as a tool-use trajectory row): an answer, or a judging row (judge_share)."""
    rng = random.Random(f"{seed}:{task.id}")
    if rng.random() < cfg.judge_share:
        return judge_row(cfg, env, task, rng, seed, mistake_rate)
    reply, mistake, template = reference_reply(cfg, env, task, rng, mistake_rate)
    reward = env.score(task, reply)
    return _row(
        env,
        task,
        list(task.messages),
        reply,
        reward.value,
        reward.error,
        cfg.accept_at,
        {"mistake": mistake, "template": template},
    )


def judge_row(
    cfg: GymTasksConfig, env: Environment, task: Task, rng: random.Random, seed: int, mistake_rate: float
) -> dict[str, Any]:
    """The critic's SFT row: judge the reference reply against a perturbed one; the verifier decides the verdict."""
    from k2post.judging.calibration import CORRECTNESS_RUBRIC, agreement, calibration_task, verified_pair

    template = next(iter(cfg.answer_templates))
    correct = render_reply(template, str(task.answer), task, env)
    wrong = render_reply(template, wrong_answer(str(task.answer), rng), task, env)
    pair = verified_pair(env, task, correct, wrong)
    judge_task = calibration_task(pair, [CORRECTNESS_RUBRIC], seed)
    mistake = "wrong_verdict" if rng.random() < mistake_rate else None
    verdict = judge_task.answer if mistake is None else ("B" if judge_task.answer == "A" else "A")
    reply = f"[[{verdict}]]"
    told_apart = pair.correct_reward >= cfg.accept_at > pair.wrong_reward
    score = agreement(judge_task, reply).value if told_apart else 0.0
    return _row(
        env,
        task,
        [m.model_dump(include={"role", "content"}) for m in judge_task.messages],
        reply,
        score,
        None,
        cfg.accept_at,
        {"mistake": mistake, "template": "judge", "gold_position": judge_task.answer},
        judge=True,
    )


def _row(
    env: Environment,
    task: Task,
    prompt: list[Any],
    reply: str,
    value: float,
    error: str | None,
    accept_at: float,
    extra: dict[str, Any],
    judge: bool = False,
) -> dict[str, Any]:
    accepted = value >= accept_at and error is None
    reasons = [] if accepted else [f"verifier: reward {value:.3f} < {accept_at}"]
    messages = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in prompt]
    return {
        "id": task.id,
        "domain": ("critic:" if judge else DOMAIN_PREFIX) + env.name,
        "attempt": 0,
        "accepted": accepted,
        "messages": messages + [{"role": "assistant", "content": reply}],
        "tools": [],
        "metadata": {
            "task_id": task.id,
            "env": env.name,
            "task_type": "critic" if judge else task.task_type,
            **extra,
            "reward": value,
        },
        "verdict": {"accepted": accepted, "reasons": reasons, "error": error},
    }


def gym_tasks(cfg: GymTasksConfig, seed: int) -> tuple[Environment, list[Task]]:
    """The environment and its train tasks for this synthesis (tasks without a gold answer are an error)."""
    env = cfg.make_env()
    tasks = list(env.tasks("train", seed=seed + cfg.seed_offset, n=cfg.tasks))
    missing = [t.id for t in tasks if t.answer is None]
    if missing:
        raise ValueError(
            f"gym_tasks: {cfg.env!r} task {missing[0]!r} has no gold answer; "
            "only gyms with Task.answer can be synthesized"
        )
    return env, tasks
