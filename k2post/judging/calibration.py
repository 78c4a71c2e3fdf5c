"""The critic's closed loop: verifiable prompts give (correct, wrong) response pairs the critic must rank.

    pairs = pairs_from_group("math", task, responses, rewards, threshold=0.5, max_pairs=2, seed=0)
    judge_task = calibration_task(pairs[0], rubrics=[CORRECTNESS_RUBRIC], seed=0)   # a Task for the policy
    reward = agreement(judge_task, "...[[B]]")                                        # 1.0 if it picks the verified one

A `CalibrationPair` is one verifiable prompt with two responses the verifier scored apart: one at
or above the success threshold, one below. Pairs come from on-policy samples (a rollout group with
mixed rewards: `pairs_from_group`; the RL controller harvests them every iteration) or from a
model sampled offline (`k2post critic pairs`, for held-out pairs). `calibration_task` turns a pair
into the pairwise judge prompt of `k2post.judging.prompts.judge_messages`, with the correct response at
A or B by a seeded coin (so a judge that always says A agrees half the time), and the gold
position in `Task.answer`. The `critic_calibration` environment serves these tasks and rewards a
verdict that agrees with the verifier (`agreement`).

Reference pairs (no sampled model) pit the gold answer against either a wrong number that looks like it
(`pair_kind: reference`, `matched_wrong_answer`: same sign, digit count and parity; the judge has to check the
arithmetic, as no surface cue tells the two apart) or a malformed reply
(`pair_kind: malformed`; `malformed_reply`: an empty box, a truncated or repeated reply, no
answer at all), which the verifier rejects because it reads no answer: a local, salient
difference that a very small judge can learn, and a surface cue ("pick the reply with more digits" agrees 1.0).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k2post.chat.types import Message
from k2post.envs.base import Reward, Task
from k2post.judging.prompts import compact_judge_messages, judge_messages
from k2post.judging.rubric import Rubric
from k2post.judging.verdict import MAX_CHARS, parse_verdict

CORRECTNESS_RUBRIC = Rubric(
    name="verified_correctness",
    kind="task",
    title="Correct final answer",
    text="The question has one correct final answer. The response whose final answer is correct is better, "
    "whatever its style or length; a wrong final answer loses.",
)

MALFORMED_REPLIES: dict[str, str] = {
    "empty_box": "\\boxed{}",
    "truncated": "{prefix}",
    "repeated": "{prefix} {prefix} {prefix}",
    "no_answer": "I do not know.",
    "unknown": "{prefix} unknown.",
}
"""Malformed replies by kind; `{prefix}` is the answer template's text before `{answer}` (e.g. "The answer is")."""


def malformed_reply(answer_template: str, rng: random.Random) -> tuple[str, str]:
    """(kind, reply): a seeded malformed reply in the style of `answer_template`, with no answer in it."""
    kind = rng.choice(sorted(MALFORMED_REPLIES))
    prefix = answer_template.split("{answer}")[0].replace("{{", "{").replace("}}", "}").strip() or "The answer is"
    return kind, MALFORMED_REPLIES[kind].replace("{prefix}", prefix)


MATCHED_OFFSETS = (2, 10)
"""Distances of a surface-matched wrong number: even, so parity never tells the two apart; 10 keeps the last digit."""


def matched_wrong_answer(gold: str, rng: random.Random) -> str:
    """A wrong integer that looks like `gold`: the same sign, digit count and parity, `MATCHED_OFFSETS` above or below
    it (the side by a seeded coin; the other side where the first has no such number), so no surface cue (digits,
    length, parity, size) picks the correct reply of a pair; a non-integer gold gets its text reversed (or "x"
    appended when that is the same)."""
    try:
        value = int(gold.strip())
    except ValueError:
        flipped = gold[::-1]
        return flipped if flipped != gold else f"{gold}x"
    sides = [1, -1] if rng.random() < 0.5 else [-1, 1]
    for side in sides:
        options = [value + side * d for d in MATCHED_OFFSETS if _looks_alike(value, value + side * d)]
        if options:
            return str(rng.choice(options))
    return str(value + 2)


def _looks_alike(gold: int, other: int) -> bool:
    return len(str(abs(gold))) == len(str(abs(other))) and (gold < 0) == (other < 0)


class CalibrationPair(BaseModel):
    """A verifiable prompt and two of its responses the verifier told apart."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source_env: str = Field(description="The verifiable environment that scored the responses.")
    source_task_id: str = Field(description="Its task id.")
    prompt: list[Message] = Field(description="The verifiable task's prompt messages.")
    correct: str = Field(description="A response at or above the success threshold.")
    wrong: str = Field(description="A response below it.")
    correct_reward: float = Field(1.0, description="The verifier's reward of `correct`.")
    wrong_reward: float = Field(0.0, description="The verifier's reward of `wrong`.")

    @property
    def key(self) -> str:
        """A stable id of the pair (source task + both texts)."""
        digest = hashlib.sha1(
            f"{self.source_env}\0{self.source_task_id}\0{self.correct}\0{self.wrong}".encode()
        ).hexdigest()
        return f"{self.source_env}-{self.source_task_id}-{digest[:10]}"


def verified_pair(env: Any, task: Task, correct: str, wrong: str) -> CalibrationPair:
    """A (correct, wrong) pair of replies to `task`, both scored by `env`, the task's own verifier (callers keep
    it when `correct_reward >= threshold > wrong_reward`). Reference pairs and the critic's SFT rows use it."""
    return CalibrationPair(
        source_env=env.name,
        source_task_id=task.id,
        prompt=list(task.messages),
        correct=correct,
        wrong=wrong,
        correct_reward=env.score(task, correct).value,
        wrong_reward=env.score(task, wrong).value,
    )


def pairs_from_group(
    source_env: str,
    task: Task,
    responses: Sequence[str],
    rewards: Sequence[float],
    threshold: float,
    max_pairs: int,
    seed: int,
) -> list[CalibrationPair]:
    """Up to `max_pairs` (correct, wrong) pairs of distinct texts from one prompt's K scored responses."""
    correct = list(dict.fromkeys((r, v) for r, v in zip(responses, rewards) if v >= threshold and r.strip()))
    wrong = list(dict.fromkeys((r, v) for r, v in zip(responses, rewards) if v < threshold and r.strip()))
    combos = [(c, w) for c in correct for w in wrong if c[0] != w[0]]
    random.Random(f"{seed}:{task.id}").shuffle(combos)
    return [
        CalibrationPair(
            source_env=source_env,
            source_task_id=task.id,
            prompt=list(task.messages),
            correct=c[0],
            wrong=w[0],
            correct_reward=c[1],
            wrong_reward=w[1],
        )
        for c, w in combos[:max_pairs]
    ]


def correct_position(pair: CalibrationPair, seed: int, correct_at_a: float = 0.5) -> str:
    """'A' or 'B': where the correct response goes (a seeded coin per pair, A with probability `correct_at_a`)."""
    return "A" if random.Random(f"{seed}:{pair.key}").random() < correct_at_a else "B"


def calibration_task(
    pair: CalibrationPair,
    rubrics: Sequence[Rubric],
    seed: int,
    env_name: str = "critic_calibration",
    compact: bool = False,
    correct_at_a: float = 0.5,
) -> Task:
    """The judge prompt of a pair as a Task; `answer` is the position of the verified-correct response.

    `compact`: the short one-message prompt (`compact_judge_messages`) instead of the full one.
    `correct_at_a`: how often the correct response is put first (0.5: a fair coin).
    """
    gold = correct_position(pair, seed, correct_at_a)
    first, second = (pair.correct, pair.wrong) if gold == "A" else (pair.wrong, pair.correct)
    messages = (compact_judge_messages if compact else judge_messages)(pair.prompt, first, second, rubrics)
    return Task(
        id=f"cal-{pair.key}",
        env=env_name,
        task_type="critic",
        messages=messages,
        answer=gold,
        metadata={
            "source_env": pair.source_env,
            "source_task_id": pair.source_task_id,
            "source_prompt": [m.model_dump(mode="json", exclude_none=True) for m in pair.prompt],
            "responses": [first, second],
        },
    )


def agreement(task: Task, response: Any) -> Reward:
    """1.0 when the verdict names the verified-correct position; 0 for the other, a tie, no verdict, or a hedge
    (`hedged_verdict`: lines naming both A and B, e.g. "[[B]]\\n[[A]]", which the judges' parser reads as the last)."""
    text = response if isinstance(response, str) else ""
    verdict = parse_verdict(text)
    hedged = hedged_verdict(text)
    agree = float(verdict.winner is not None and verdict.winner == task.answer and not hedged)
    shown = "hedged" if hedged else verdict.winner or ("tie" if verdict.parsed else "unparseable")
    return Reward(
        value=agree,
        breakdown={"agree": agree, "parsed": float(verdict.parsed and not hedged)},
        info={"verdict": shown, "gold": task.answer},
    )


_VERDICT_BRACKET = re.compile(r"\[\[\s*([ab])\s*\]\]", re.IGNORECASE)
HEDGE_LINES = 64
"""Trailing non-empty lines whose verdicts (phrases, lone letters) are compared for a hedge; brackets: the whole
read part."""


def hedged_verdict(text: str) -> bool:
    """Whether the read part of a reply names both A and B as the winner (on different lines: a verdict on each)."""
    _head, sep, after = text.rpartition("</think>")
    tail = (after if sep else text)[-MAX_CHARS:]
    brackets = {letter.upper() for letter in _VERDICT_BRACKET.findall(tail)}
    lines = [line for line in tail.splitlines() if line.strip()][-HEDGE_LINES:]
    return {"A", "B"} <= brackets or {"A", "B"} <= {parse_verdict(line).winner for line in lines}
