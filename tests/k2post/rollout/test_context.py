"""The elision rule of long episodes (k2post/rollout/context.py): pure, and the same wherever it is applied."""

from __future__ import annotations

import pytest

from k2post.chat.types import Message, ToolCall
from k2post.rollout.config import ContextConfig
from k2post.rollout.context import elide_messages

NOTE = "[{turns} turns, {results} results elided]"


def _dialogue(turns: int) -> list[Message]:
    messages = [Message(role="system", content="sys"), Message(role="user", content="audit")]
    for i in range(turns):
        call = ToolCall(id=f"functions.next_record:{i}", name="next_record", arguments={})
        messages += [
            Message(role="assistant", reasoning=f"think {i}", tool_calls=[call]),
            Message(role="tool", tool_call_id=call.id, content=f"record {i}"),
        ]
    return messages


@pytest.mark.parametrize(
    ("turns", "keep", "elided", "kept"),
    [
        (3, 4, 0, ["think 0", "think 1", "think 2"]),  # fewer turns than kept: unchanged
        (5, 2, 3, ["think 3", "think 4"]),
        (5, 0, 5, []),
        (1, 1, 0, ["think 0"]),
    ],
)
def test_elide_messages_keeps_the_prompt_and_the_last_turns(turns, keep, elided, kept):
    dialogue = _dialogue(turns)
    out, count = elide_messages(dialogue, keep, NOTE)
    assert count == elided
    assert out[:2] == dialogue[:2]  # the task prompt stays
    assert [m.reasoning for m in out if m.role == "assistant"] == kept  # kept turns keep their reasoning
    if elided:
        assert out[2] == Message(role="system", content=f"[{elided} turns, {elided} results elided]")
        assert out[3:] == dialogue[len(dialogue) - 2 * keep :]
    else:
        assert out == dialogue


def test_eliding_later_elides_a_superset():
    dialogue = _dialogue(8)
    early, n_early = elide_messages(dialogue[:10], 2, NOTE)  # 4 turns
    late, n_late = elide_messages(dialogue, 2, NOTE)
    assert (n_early, n_late) == (2, 6)
    assert {m.content for m in late if m.role == "tool"} <= {m.content for m in early if m.role == "tool"} | {
        "record 6",
        "record 7",
    }


def test_placeholder_may_only_name_turns_and_results():
    assert ContextConfig(placeholder="[{turns} gone]").placeholder == "[{turns} gone]"
    with pytest.raises(ValueError, match="placeholder may use only"):
        ContextConfig(placeholder="[{calls} gone]")


def test_rl_config_refuses_elision_that_starts_after_the_context_runs_out():
    from pathlib import Path

    from k2post.config.loader import ConfigError
    from k2post.config.registry import load_run_config

    config = Path(__file__).resolve().parents[3] / "configs" / "rl_long_horizon.yaml"
    assert load_run_config(str(config)).rollout.agentic.context.enabled
    with pytest.raises(ConfigError, match="context limit before eliding; lower context.budget_tokens") as info:
        load_run_config(str(config), ["rollout.agentic.context.budget_tokens=2000"])
    assert "\n" not in str(info.value)
