"""The long-horizon ledger audit: 100+ calls per task, checkpoints decided along the way, hostile input."""

from __future__ import annotations

import pytest

from k2post.chat.types import Message, ToolCall
from k2post.envs.registry import make_environment


def _turn(name: str, index: int, **arguments) -> Message:
    return Message(
        role="assistant", tool_calls=[ToolCall(id=f"functions.{name}:{index}", name=name, arguments=arguments)]
    )


def _play(env, task, turns) -> object:
    state = env.reset(task)
    for index, calls in enumerate(turns):
        name, arguments = calls[0]
        env.step(state, _turn(name, index, **arguments))
    return state


def test_reference_audit_takes_over_100_calls_and_scores_full():
    env = make_environment("record_audit", {"n_records": 120})
    task = next(env.tasks("train", seed=0))
    turns = env.reference_turns(task)
    broken = sum(r["total"] != r["price"] * r["qty"] for r in task.answer["records"])
    assert broken == 24 and len(turns) == 120 + broken + 1
    state = _play(env, task, turns)
    assert state.cursor == 120 and not state.done
    result = env.step(state, Message(role="assistant", content=f"Fixed {broken} records."))
    assert result.done
    reward = env.score_state(task, state)
    assert reward.value == pytest.approx(1.0) and reward.info["calls"] == len(turns)
    assert len([k for k in reward.breakdown if k.startswith("checkpoint_")]) == 5  # 120 / 25 blocks, rounded up


def test_checkpoints_are_decided_along_the_way_not_revised_later():
    env = make_environment("record_audit", {"n_records": 50, "checkpoint_every": 25})
    task = next(env.tasks("dev", seed=1))
    turns = env.reference_turns(task)
    first_block_fixes = [t for t in turns if t[0][0] == "fix_total" and int(t[0][1]["id"][1:]) < 25]
    skipped = [t for t in turns if t not in first_block_fixes]
    state = _play(env, task, skipped)  # block 0's broken records left alone while walking past them ...
    late = len(skipped)
    for offset, turn in enumerate(first_block_fixes):  # ... then fixed at the end
        env.step(state, _turn(turn[0][0], late + offset, **turn[0][1]))
    env.step(state, Message(role="assistant", content="done"))
    reward = env.score_state(task, state)
    assert reward.breakdown["checkpoint_0"] == 0.0 and reward.breakdown["checkpoint_1"] == 1.0
    assert reward.info["checkpoint_pass_rate"] == 0.5


def test_bad_calls_are_errors_not_crashes_and_max_turns_ends_the_episode():
    env = make_environment("record_audit", {"n_records": 5, "max_turns": 4})
    task = next(env.tasks("test", seed=0))
    state = env.reset(task)
    out = env.step(state, _turn("fix_total", 0, id="r0003", total=1)).observations[0].content
    assert out.startswith("Error: fix_total: no fetched record")
    assert env.step(state, _turn("drop_table", 1)).observations[0].content.startswith("Error: unknown tool")
    assert env.step(state, _turn("fix_total", 2, id=3)).observations[0].content.startswith("Error: fix_total:")
    assert env.step(state, "<|tool_calls_section_begin|>garbage").done  # 4th turn: max_turns
    assert env.score_state(task, state).value == 0.0


def test_splits_differ_and_unknown_split_is_an_error():
    env = make_environment("record_audit", {"n_records": 10})
    ledgers = {split: next(env.tasks(split, seed=0)).answer["records"] for split in ("train", "dev", "test")}
    assert ledgers["train"] != ledgers["dev"] != ledgers["test"]
    with pytest.raises(ValueError, match="not supported"):
        next(env.tasks("shifted"))


# --- issue 43: the report pays only for an audit ---------------------------------------------------------------------

from cheap_strategies import assert_unhackable, means, strategy_table  # noqa: E402


def test_a_report_without_the_audit_pays_nothing_and_a_wrong_audit_keeps_its_report():
    env = make_environment("record_audit", {"n_records": 60})
    table = strategy_table(env, list(env.tasks("test", n=4)))
    assert_unhackable(table)
    got = means(table)
    assert got["report_only"] == 0.0 and got["walk_no_fix"] == 0.0 and got["walk_guess_count"] == 0.0
    assert got["honest_wrong"] == pytest.approx(0.1) and got["honest_right"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "walked,changes,answer,ok",
    [
        (True, "broken", "I fixed 2 records.", True),
        (True, "broken_wrong", "I fixed 2 records.", True),  # right records, wrong totals: the report is still true
        (True, "none", "I fixed 0 records.", False),  # nothing found in a ledger with broken records
        (False, "none", "I fixed 0 records.", False),  # no audit at all
        (True, "one_clean", "I fixed 2 records.", False),  # the count is right but a correct record was changed
        (False, "broken", "I fixed 2 records.", False),  # stopped before the end
        (True, "broken", "I fixed 3 records.", False),
    ],
)
def test_report_ok(walked, changes, answer, ok):
    from k2post_environments.record_audit import AuditState, report_ok

    records = [{"id": f"r{i}", "price": 2, "qty": 3, "total": 6 if i >= 2 else 7} for i in range(4)]
    totals = {r["id"]: r["total"] for r in records}
    edits = {
        "broken": {"r0": 6, "r1": 6},
        "broken_wrong": {"r0": 8, "r1": 9},
        "none": {},
        "one_clean": {"r0": 6, "r3": 5},
    }[changes]
    state = AuditState(records=records, totals={**totals, **edits}, cursor=4 if walked else 3, answer=answer)
    assert report_ok(state) is ok
