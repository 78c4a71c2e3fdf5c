"""Long-horizon tool gym: audit a ledger of hundreds of records, one tool call at a time (K2 Thinking: 100+ calls).

A task holds `n_records` (default 120) records `{id, price, qty, total}`; a seeded share of them is broken
(`total != price * qty`). The model walks the ledger with `next_record()` (one record per call, in order),
repairs a broken one with `fix_total(id, total)`, and ends with a plain-text answer saying how many it fixed.
A clean audit takes n_records + broken + 1 calls (about 150 at the defaults); `max_turns` cuts it off.

Rubric checkpoints along the way: the ledger is cut into blocks of `checkpoint_every` records. When the cursor
moves past a block (or the episode ends), that block's checkpoint is decided there and then: every record of
the block was fetched, every broken one carries the right total, and no correct one was changed. A later fix
does not revise a decided checkpoint. Reward: 0.9 x the share of checkpoints passed + 0.1 for the report
(`report_ok`): the final answer states the number of records fixed, after the whole ledger was read and exactly
the broken records were changed (to any total). A report without the audit earns nothing ("I fixed 0 records."
with no calls scores 0), while an honest audit with wrong arithmetic (the right records, wrong totals) keeps it.

    env = make_environment("record_audit", {"n_records": 200})
    task = next(env.tasks("train", seed=0))
    state = env.reset(task)
    env.step(state, Message(role="assistant", tool_calls=[ToolCall(id="functions.next_record:0",
                                                                      name="next_record", arguments={})]))
    env.score_state(task, state)      # Reward(value, breakdown={"checkpoint_0": ..., "answer": ...})

Tool errors (unknown tool or id, bad arguments, malformed calls) come back as `Error:` tool messages; nothing
raises on model output.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from k2post.chat.types import Message, ToolCall, ToolSpec, dump_json
from k2post.envs.base import EnvConfig, HonestPair, MultiTurnEnvironment, Play, Reward, Split, StepResult, Task
from k2post.envs.registry import register_environment
from k2post.envs.splits import BASE_SPLITS, hash_bucket, hash_split, unsupported_split
from k2post.toolsets.base import ERROR_PREFIX, tool_spec
from k2post.toolsets.schema import check_arguments
from k2post_environments.tool_use import _split_turn

TEST_FRACTION, DEV_FRACTION = 0.2, 0.1  # shares of the ledger hash space held out
CHECKPOINT_WEIGHT = 0.9
ANSWER_WEIGHT = 0.1
SYSTEM = (
    "You audit a ledger. Call next_record() to read the next record; when its total is not price * qty, call "
    "fix_total(id, total) with the right total. When next_record says the ledger is done, reply in plain text with "
    "the number of records you fixed."
)


class RecordAuditConfig(EnvConfig):
    """Config of the long-horizon ledger audit."""

    n_records: int = Field(120, ge=1, le=5000, description="Records per ledger (each needs one next_record call).")
    broken_fraction: float = Field(0.2, ge=0, le=1, description="Share of records whose total is wrong.")
    checkpoint_every: int = Field(25, ge=1, description="Records per rubric checkpoint block.")
    max_turns: int = Field(600, ge=1, description="Assistant turns before the environment ends the episode.")
    dev_size: int = Field(32, ge=1, description="Ledgers in the fixed dev split.")
    test_size: int = Field(32, ge=1, description="Ledgers in the fixed test split.")


class AuditState(BaseModel):
    """One episode's ledger, cursor, fixes and decided checkpoints (JSON-able)."""

    records: list[dict[str, Any]] = Field(description="The ledger as dealt: {id, price, qty, total}.")
    totals: dict[str, int] = Field(default_factory=dict, description="Current total per record id.")
    cursor: int = Field(0, description="Records fetched so far (the next one to hand out).")
    checkpoints: list[bool] = Field(default_factory=list, description="Decided checkpoint verdicts, block by block.")
    checkpoint_calls: list[int] = Field(default_factory=list, description="Call count when each was decided.")
    calls: int = Field(0, description="Tool calls made (well-formed or not).")
    turns: int = Field(0, description="Assistant turns taken.")
    answer: str | None = Field(None, description="The final plain-text answer, once given.")
    done: bool = Field(False, description="The episode is over.")


def _tools() -> list[ToolSpec]:
    return [
        tool_spec("next_record", "Read the next record of the ledger (id, price, qty, total).", {}, []),
        tool_spec(
            "fix_total",
            "Set a fetched record's total.",
            {"id": {"type": "string"}, "total": {"type": "integer"}},
            ["id", "total"],
        ),
    ]


def make_ledger(rng: random.Random, n_records: int, broken_fraction: float) -> list[dict[str, Any]]:
    """`n_records` records; a `broken_fraction` share (rounded, at least one when > 0) with a wrong total."""
    records = []
    for index in range(n_records):
        price, qty = rng.randint(1, 40), rng.randint(1, 12)
        records.append({"id": f"r{index:04d}", "price": price, "qty": qty, "total": price * qty})
    broken = max(1, round(broken_fraction * n_records)) if broken_fraction > 0 else 0
    for record in rng.sample(records, broken):
        record["total"] += rng.choice([-10, -3, -1, 1, 2, 7, 10])
    return records


def stated_numbers(text: str) -> set[str]:
    """The whole numbers a final answer states (first 2,000 characters; leading zeros dropped; no int() of
    hostile digit strings)."""
    return {m.lstrip("0") or "0" for m in re.findall(r"\d+", text[:2000]) if len(m) <= 12}


def block_passes(state: AuditState, block: int, size: int) -> bool:
    """Checkpoint `block`: all its records fetched, broken ones repaired, correct ones untouched."""
    records = state.records[block * size : (block + 1) * size]
    if state.cursor < block * size + len(records):
        return False
    return all(state.totals[r["id"]] == r["price"] * r["qty"] for r in records)


def report_ok(state: AuditState) -> bool:
    """The final answer reports the audit: every record read, exactly the broken ones changed, their count stated."""
    broken = {r["id"] for r in state.records if r["total"] != r["price"] * r["qty"]}
    changed = {r["id"] for r in state.records if state.totals[r["id"]] != r["total"]}
    walked = state.cursor >= len(state.records)
    return walked and changed == broken and str(len(changed)) in stated_numbers(state.answer or "")


def _slip(total: int, dealt: int) -> int:
    """A wrong total for a broken record: one off the right one, never the dealt (broken) value."""
    return total + 1 if total + 1 != dealt else total + 2


def _messages(turns: list[list[tuple[str, dict[str, Any]]]]) -> list[Message]:
    """Assistant turns holding the given (tool, arguments) calls, ids numbered through the dialogue."""
    messages, index = [], 0
    for turn in turns:
        calls = [
            ToolCall(id=f"functions.{name}:{index + k}", name=name, arguments=args)
            for k, (name, args) in enumerate(turn)
        ]
        messages.append(Message(role="assistant", content="", tool_calls=calls))
        index += len(turn)
    return messages


@register_environment
class RecordAuditEnv(MultiTurnEnvironment):
    """Audit hundreds of records through tool calls; rubric checkpoints per block of records."""

    name: ClassVar[str] = "record_audit"
    task_type: ClassVar[str] = "long_tool_use"
    config_cls: ClassVar[type[EnvConfig]] = RecordAuditConfig
    max_turns: ClassVar[int] = 600
    config: RecordAuditConfig

    def tools(self) -> list[ToolSpec]:
        return _tools()

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Train: endless for a seed; dev and test: fixed lists (`dev_size`, `test_size`; the seed is not used).
        A ledger's split is a hash of its content, so no train ledger is ever a dev or test one."""
        if split not in BASE_SPLITS:
            raise unsupported_split(self.name, split)
        size = {"dev": self.config.dev_size, "test": self.config.test_size}.get(split)
        count = size if n is None else min(n, size) if size is not None else n
        draw_seed = 0 if size is not None else seed
        index = 0
        while count is None or index < count:
            yield self._task(split, draw_seed, index)
            index += 1

    def _task(self, split: str, seed: int, index: int) -> Task:
        for attempt in range(10_000):
            rng = random.Random(f"record_audit:{split}:{seed}:{index}:{attempt}")
            records = make_ledger(rng, self.config.n_records, self.config.broken_fraction)
            key = dump_json(records)
            if hash_split(key, TEST_FRACTION, DEV_FRACTION) == split:
                break
        ledger = f"L{int(hash_bucket(key) * 1e9):09d}"
        prompt = f"Audit ledger {ledger} ({len(records)} records) and fix every wrong total."
        return Task(
            id=f"{split}-{seed}-{index}",
            env=self.name,
            task_type=self.task_type,
            messages=[Message(role="system", content=SYSTEM), Message(role="user", content=prompt)],
            answer={"records": records},
        )

    # --- episode -----------------------------------------------------------------------------

    def reset(self, task: Task) -> AuditState:
        records = [dict(r) for r in task.answer["records"]]
        return AuditState(records=records, totals={r["id"]: r["total"] for r in records})

    def step(self, state: AuditState, assistant: Message) -> StepResult:
        content, calls, errors = _split_turn(assistant, state.calls)
        state.turns += 1
        observations = [self._run(state, call) for call in calls] + errors
        state.calls += len(calls) + len(errors)
        if not calls and not errors:
            state.answer, state.done = content, True
        if state.turns >= self.config.max_turns:
            state.done = True
        if state.done:
            self._decide_up_to(state, len(state.records))
        return StepResult(observations=observations, done=state.done)

    def _run(self, state: AuditState, call: ToolCall) -> Message:
        spec = {t.name: t for t in _tools()}.get(call.name)
        if spec is None:
            return self._result(call, f"{ERROR_PREFIX}unknown tool {call.name!r} (next_record, fix_total)")
        problem = check_arguments(spec.parameters, call.arguments)
        if problem:
            return self._result(call, f"{ERROR_PREFIX}{call.name}: {problem}")
        if call.name == "next_record":
            return self._result(call, self._next(state))
        record_id, total = call.arguments["id"], call.arguments["total"]
        fetched = {r["id"] for r in state.records[: state.cursor]}
        if record_id not in fetched:
            return self._result(call, f"{ERROR_PREFIX}fix_total: no fetched record {str(record_id)[:40]!r}")
        state.totals[record_id] = int(total)
        return self._result(call, f"ok: {record_id} total = {int(total)}")

    def _next(self, state: AuditState) -> str:
        if state.cursor >= len(state.records):
            return "The ledger is done: no more records."
        record = state.records[state.cursor]
        size = self.config.checkpoint_every
        self._decide_up_to(state, (state.cursor // size) * size)  # blocks before this record's are behind us
        state.cursor += 1
        return dump_json(record)

    def _decide_up_to(self, state: AuditState, records: int) -> None:
        """Decide every undecided checkpoint whose block ends at or before `records`."""
        size, total = self.config.checkpoint_every, len(state.records)
        blocks = -(-total // size) if records >= total else records // size
        while len(state.checkpoints) < blocks:
            state.checkpoints.append(block_passes(state, len(state.checkpoints), size))
            state.checkpoint_calls.append(state.calls)

    @staticmethod
    def _result(call: ToolCall, text: str) -> Message:
        return Message(role="tool", tool_call_id=call.id, content=text, name=call.name)

    # --- scoring -----------------------------------------------------------------------------

    def score_state(self, task: Task, state: AuditState) -> Reward:
        if not isinstance(state, AuditState):
            state = AuditState.model_validate(state)
        decided = AuditState.model_validate(state.model_dump())
        self._decide_up_to(decided, len(decided.records))
        passed = sum(decided.checkpoints) / max(1, len(decided.checkpoints))
        fixed = sum(1 for r in decided.records if decided.totals[r["id"]] != r["total"])
        answer = float(report_ok(decided))
        breakdown = {f"checkpoint_{i}": float(ok) for i, ok in enumerate(decided.checkpoints)}
        info = {"calls": state.calls, "fetched": state.cursor, "fixed": fixed, "checkpoint_pass_rate": passed}
        return Reward(
            value=CHECKPOINT_WEIGHT * passed + ANSWER_WEIGHT * answer,
            breakdown={**breakdown, "answer": answer},
            info=info,
        )

    def honest(self, task: Task) -> HonestPair:
        """Right: the reference audit and its report; wrong: the same walk with every fix one off (arithmetic slips
        on the right records), reported."""
        broken = sum(r["total"] != r["price"] * r["qty"] for r in task.answer["records"])
        report = Message(role="assistant", content=f"I fixed {broken} records.")
        right = _messages(self.reference_turns(task))
        dealt = {r["id"]: r["total"] for r in task.answer["records"]}
        slip = [
            [
                (name, {**args, "total": _slip(args["total"], dealt[args["id"]])} if name == "fix_total" else args)
                for name, args in turn
            ]
            for turn in self.reference_turns(task)
        ]
        wrong = _messages(slip)
        return HonestPair(right=right + [report], wrong=wrong + [report])

    def hacks(self, task: Task) -> dict[str, Play]:
        """Reports without the audit, and walks that fix nothing (with the true or the configured broken count)."""
        records = task.answer["records"]
        walk = _messages([[("next_record", {})]] * (len(records) + 1))
        broken = max(1, round(self.config.broken_fraction * len(records))) if self.config.broken_fraction else 0
        return {
            "report_only": [Message(role="assistant", content="I fixed 0 records.")],
            "report_guess": [Message(role="assistant", content=f"I fixed {broken} records.")],
            "walk_no_fix": walk + [Message(role="assistant", content="I fixed 0 records.")],
            "walk_guess_count": walk + [Message(role="assistant", content=f"I fixed {broken} records.")],
        }

    def reference_turns(self, task: Task) -> list[list[tuple[str, dict[str, Any]]]]:
        """The calls of a perfect audit, turn by turn (one call per turn), for tests and SFT data."""
        turns: list[list[tuple[str, dict[str, Any]]]] = []
        for record in task.answer["records"]:
            turns.append([("next_record", {})])
            if record["total"] != record["price"] * record["qty"]:
                turns.append([("fix_total", {"id": record["id"], "total": record["price"] * record["qty"]})])
        return turns + [[("next_record", {})]]
