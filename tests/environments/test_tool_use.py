"""The multi-turn tool-use gym: tasks, episodes (scripted, partial, malformed, truncated),
scoring, JSON round trips and the golden-file replay."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from k2post_environments.tool_use import ToolUseConfig, ToolUseEnv, ToolUseState
from k2post.toolsets import TEMPLATES, TEMPLATES_BY_TOOLSET
from k2post.toolsets.checks import Scenario, scenario_key, scenario_split
from k2post.chat.template import render_assistant_body
from k2post.chat.types import Message, ToolCall, format_call_id
from k2post.envs import Task, make_environment

GOLDEN = Path(__file__).resolve().parents[2] / "environments" / "golden" / "tool_use.jsonl"
CALLS_BEGIN, CALLS_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def env_for(template: str | None = None, **config: Any) -> ToolUseEnv:
    if template is not None:
        config["templates"] = [template]
    return ToolUseEnv(ToolUseConfig(**config))


def first_task(template: str, split: str = "train", seed: int = 0) -> Task:
    return env_for(template).make_task(split, seed, 0)  # type: ignore[arg-type]


def reference_messages(task: Task, drop: str | None = None) -> list[Message]:
    """The task's reference solution as assistant messages (skipping calls of tool `drop`)."""
    messages, index = [], 0
    for turn in task.answer["reference_turns"]:
        calls = []
        for call in turn:
            if call["name"] != drop:
                calls.append(
                    ToolCall(
                        id=format_call_id(call["name"], index),
                        name=call["name"],
                        arguments=call["arguments"],
                    )
                )
                index += 1
        if calls:
            messages.append(Message(role="assistant", tool_calls=calls))
    return [*messages, Message(role="assistant", content=task.answer["reference_answer"])]


def play(env: ToolUseEnv, task: Task, turns: list[Any]) -> ToolUseState:
    state = env.reset(task)
    for turn in turns:
        env.step(state, turn)
    return state


def k2_text(name: str, index: int, arguments: str, content: str = "") -> str:
    call_id = f"functions.{name}:{index}"
    call = f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
    return f"{content}{CALLS_BEGIN}{call}{CALLS_END}"


def test_registered_with_metadata() -> None:
    env = make_environment("tool_use", {"max_turns": 3})
    assert isinstance(env, ToolUseEnv) and env.multi_turn and env.task_type == "tool_use"
    assert env.reward_range == (0.0, 1.0) and env.config.max_turns == 3
    names = [spec.name for spec in env.tools()]
    assert len(names) == len(set(names)) >= 14


def test_tasks_are_deterministic_per_seed_and_splits_disjoint() -> None:
    env = ToolUseEnv()
    first = list(env.tasks("train", seed=3, n=30))
    assert first == list(env.tasks("train", seed=3, n=30))
    assert first != list(env.tasks("train", seed=4, n=30))

    def contents(tasks: list[Task]) -> set[str]:
        return {json.dumps([t.answer["prompt"], t.answer["initial_state"]]) for t in tasks}

    train, test = list(env.tasks("train", n=300)), list(env.tasks("test", n=150))
    assert not contents(train) & contents(test)
    assert {t.metadata["template"] for t in train} == set(TEMPLATES)
    assert len({t.id for t in train}) == 300
    assert len(list(env_for(train_size=4, test_size=2).tasks("test"))) == 2


def test_task_shape() -> None:
    task = next(ToolUseEnv().tasks("train"))
    assert [m.role for m in task.messages] == ["system", "user"]
    assert task.env == "tool_use" and task.task_type == "tool_use"
    assert {"initial_state", "success", "checkpoints", "answer"} <= set(task.answer)
    assert [tool["function"]["name"] for tool in task.metadata["tools"]] == [
        spec.name for spec in ToolUseEnv().tools_for(task)
    ]


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_scripted_correct_episode_scores_one(template: str) -> None:
    env, task = env_for(template), first_task(template)
    state = env.reset(task)
    for message in reference_messages(task):
        result = env.step(state, message)
        assert all(obs.role == "tool" and not obs.content.startswith("Error") for obs in result.observations)
        calls = {call.id: call.name for call in message.tool_calls}
        assert [obs.name for obs in result.observations] == [calls[obs.tool_call_id] for obs in result.observations]
    assert result.done and not state.truncated
    reward = env.score_state(task, state)
    assert reward.value == pytest.approx(1.0), reward
    checkpoint_ids = [cp["id"] for cp in task.answer["checkpoints"]]
    assert set(reward.breakdown) == {"final_state", "answer", *checkpoint_ids}
    assert all(value == 1.0 for value in reward.breakdown.values())


@pytest.mark.parametrize("toolset", sorted(TEMPLATES_BY_TOOLSET))
def test_correct_episode_as_raw_k2_text(toolset: str) -> None:
    template = sorted(TEMPLATES_BY_TOOLSET[toolset])[0]
    env, task = env_for(template), first_task(template)
    texts = [render_assistant_body(message) for message in reference_messages(task)]
    state = play(env, task, texts)
    assert state.done and env.score_state(task, state).value == pytest.approx(1.0)
    assert [call.id for call in state.calls] == [format_call_id(c.name, i) for i, c in enumerate(state.calls)]


@pytest.mark.parametrize(
    ("template", "drop", "failed"),
    [
        ("fs_move_and_read", "read_file", "read_file"),
        ("cal_book_first_free", "find_free_slot", "checked_schedule"),
        ("bank_transfer_report", "get_balance", "checked_balance"),
        ("bank_cover_shortfall", "get_balance", "checked_balance"),
    ],
)
def test_partially_correct_episode_names_the_failed_checkpoint(template: str, drop: str, failed: str) -> None:
    env, task = env_for(template), first_task(template)
    reward = env.score_state(task, play(env, task, reference_messages(task, drop=drop)))
    assert 0.0 < reward.value < 1.0
    assert reward.breakdown[failed] == 0.0 and reward.breakdown["final_state"] == 1.0
    assert all(v == 1.0 for k, v in reward.breakdown.items() if k != failed)


def test_out_of_order_calls_fail_an_ordered_checkpoint() -> None:
    env, task = env_for("fs_append_line"), first_task("fs_append_line")
    read, write = reference_messages(task)[:2]
    reward = env.score_state(task, play(env, task, [write, read, Message(role="assistant", content="done")]))
    assert reward.breakdown["read_before_write"] == 0.0 and reward.breakdown["final_state"] == 1.0
    assert reward.value == pytest.approx(0.6 + 0.3 / 2 + 0.1)


def test_weights_are_configurable() -> None:
    task = first_task("fs_move_and_read")
    env = env_for("fs_move_and_read", success_weight=1.0, checkpoint_weight=0.0, answer_weight=0.0)
    state = play(env, task, reference_messages(task, drop="read_file"))
    assert env.score_state(task, state).value == pytest.approx(1.0)
    with pytest.raises(ValidationError):
        ToolUseConfig(success_weight=0, checkpoint_weight=0, answer_weight=0)


@pytest.mark.parametrize(
    ("turn", "fragment"),
    [
        (k2_text("read_file", 0, '{"path": '), "arguments are not valid JSON"),
        (k2_text("read_file", 0, '["a.txt"]'), "arguments must be a JSON object"),
        (k2_text("read_file", 0, "{}"), "read_file: missing required argument 'path'"),
        (k2_text("shred", 0, "{}"), "unknown tool 'shred'"),
        (
            f"{CALLS_BEGIN}<|tool_call_begin|>read_file<|tool_call_argument_begin|>{{}}<|tool_call_end|>{CALLS_END}",
            "does not read functions.NAME:IDX",
        ),
        (
            "<|tool_call_begin|>functions.list_dir:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
            "must start with",
        ),
        (
            Message(
                role="assistant",
                tool_calls=[ToolCall(id="c1", name="list_dir", arguments={"path": 7})],
            ),
            "argument 'path' must be a string",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "read_file", "arguments": "{oops"}}],
            },
            "tool call 0",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
            "tool call 0: unreadable call (missing field 'name')",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "move", "arguments": "{}"}}],
            },
            "missing required argument 'source'",
        ),
    ],
)
def test_malformed_calls_become_tool_errors(turn: Any, fragment: str) -> None:
    env, task = env_for("fs_move_and_read"), first_task("fs_move_and_read")
    state = env.reset(task)
    result = env.step(state, turn)
    assert not result.done and result.observations
    assert all(obs.role == "tool" and obs.tool_call_id for obs in result.observations)
    assert any(obs.content.startswith("Error: ") and fragment in obs.content for obs in result.observations), result
    assert state.world.model_dump() == env.reset(task).world.model_dump()
    reward = env.score_state(task, state)
    assert reward.breakdown["final_state"] == 0.0 and reward.info["tool_errors"] >= 1


@pytest.mark.parametrize(
    ("turn", "done"),
    [
        (None, True),
        ({"role": "assistant", "content": 5}, True),
        ({"role": "assistant", "tool_calls": "junk"}, False),
        ({"role": "assistant", "tool_calls": [None, 3]}, False),
        ("<think>still thinking", True),
        ("<think>plan</think>Done.<|im_end|>ignored", True),
    ],
)
def test_odd_turns_never_raise(turn: Any, done: bool) -> None:
    env, task = ToolUseEnv(), first_task("bank_sweep")
    state = env.reset(task)
    result = env.step(state, turn)
    assert result.done is done
    assert all(obs.content.startswith("Error: ") for obs in result.observations)
    assert 0.0 <= env.score_state(task, state).value <= 0.1


def test_errors_keep_the_episode_going_and_recovery_scores() -> None:
    env, task = env_for("fs_move_and_read"), first_task("fs_move_and_read")
    turns = [k2_text("read_file", 0, "{bad"), *reference_messages(task)]
    reward = env.score_state(task, play(env, task, turns))
    assert reward.value == pytest.approx(1.0) and reward.info["tool_errors"] == 1


def test_calls_without_ids_get_k2_ids_and_call_limit_applies() -> None:
    env = env_for("fs_move_and_read", max_calls_per_turn=2)
    state = env.reset(first_task("fs_move_and_read"))
    calls = [ToolCall(id="", name="list_dir", arguments={}) for _ in range(3)]
    result = env.step(state, Message(role="assistant", tool_calls=calls))
    assert [obs.tool_call_id for obs in result.observations] == [f"functions.list_dir:{i}" for i in range(3)]
    assert {obs.name for obs in result.observations} == {"list_dir"}  # K2 heads a result with its function's name
    assert "at most 2 tool calls" in result.observations[2].content and len(state.calls) == 2


def test_max_turns_stops_the_episode() -> None:
    env, task = env_for("fs_delete_tmp", max_turns=2), first_task("fs_delete_tmp")
    state = env.reset(task)
    probe = Message(
        role="assistant",
        tool_calls=[ToolCall(id="functions.list_dir:0", name="list_dir", arguments={})],
    )
    assert not env.step(state, probe).done
    last = env.step(state, probe)
    assert last.done and last.observations and state.truncated and state.turns == 2
    after = env.step(state, probe)
    assert after.done and not after.observations and len(state.calls) == 2
    assert env.score_state(task, state).info["truncated"] is True


def test_final_answer_without_calls_ends_the_episode() -> None:
    env, task = ToolUseEnv(), first_task("bank_sweep")
    state = env.reset(task)
    result = env.step(state, Message(role="assistant", content="All done!"))
    assert result.done and not result.observations and not state.truncated


@pytest.mark.parametrize(
    "response",
    [
        "I moved it.",
        "",
        "<|tool_calls_section_begin|><|tool_call_begin|>",
        "</think><think><|im_end|>\x00",
    ],
)
def test_single_turn_score_is_robust(response: str) -> None:
    for template in sorted(TEMPLATES):
        env, task = env_for(template), first_task(template)
        reward = env.score(task, response)
        assert 0.0 <= reward.value <= 0.1 and reward.breakdown["final_state"] == 0.0
        assert all(reward.breakdown[cp["id"]] == 0.0 for cp in task.answer["checkpoints"])


def test_single_turn_score_runs_k2_calls() -> None:
    env, task = env_for("fs_delete_tmp"), first_task("fs_delete_tmp")
    deletes = [
        ToolCall(id=format_call_id(c["name"], i), name=c["name"], arguments=c["arguments"])
        for i, c in enumerate(task.answer["reference_turns"][1])
    ]
    reward = env.score(task, render_assistant_body(Message(role="assistant", tool_calls=deletes)))
    assert reward.breakdown["final_state"] == 1.0 and reward.breakdown["listed_dir"] == 0.0


def test_task_and_state_survive_json_round_trips() -> None:
    env, task = ToolUseEnv(), first_task("cal_reschedule")
    assert Task.model_validate_json(task.model_dump_json()) == task
    messages = reference_messages(task)
    state = play(env, task, messages[:1])
    restored = ToolUseState.model_validate(json.loads(state.model_dump_json()))
    assert restored == state and type(restored.world) is type(state.world)
    for message in messages[1:]:
        assert env.step(restored, message) == env.step(state, message)
    assert env.score_state(task, json.loads(restored.model_dump_json())) == env.score_state(task, state)


def test_failure_rate_is_seeded_per_task() -> None:
    task = first_task("bank_transfer_report")

    def run(rate: float) -> list[str]:
        state = play(env_for(failure_rate=rate), task, reference_messages(task))
        return [call.result for call in state.calls]

    assert all("temporary failure" in result for result in run(1.0))
    assert run(0.5) == run(0.5)


def load_golden() -> list[dict[str, Any]]:
    return [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]


def test_golden_file_covers_the_required_cases() -> None:
    cases = load_golden()
    assert len(cases) >= 6 and len({case["id"] for case in cases}) == len(cases)
    assert {Task.model_validate(case["task"]).metadata["toolset"] for case in cases} >= set(TEMPLATES_BY_TOOLSET)


@pytest.mark.parametrize("case", load_golden(), ids=lambda case: case["id"])
def test_golden_replay(case: dict[str, Any]) -> None:
    env, task = make_environment("tool_use", case.get("config", {})), Task.model_validate(case["task"])
    state = play(env, task, [Message.from_openai(turn) for turn in case["turns"]])
    reward = env.score_state(task, state)
    assert reward.value == pytest.approx(case["expected"], abs=case["tol"])
    assert reward.breakdown == pytest.approx(case["expected_breakdown"])


@pytest.mark.parametrize(
    "config",
    [
        {"toolsets": ["shop"]},
        {"templates": ["nope"]},
        {"toolsets": ["bank"], "templates": ["fs_append_line"]},
        {"toolsets": []},
        {"max_turns": 0},
        {"failure_rate": 2.0},
        {"surprise": 1},
    ],
)
def test_bad_configs_are_rejected(config: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ToolUseConfig(**config)


def test_toolset_filter_limits_tasks_and_tools() -> None:
    env = env_for(toolsets=["bank"])
    assert {task.metadata["toolset"] for task in env.tasks("train", n=20)} == {"bank"}
    assert {spec.name for spec in env.tools()} == {
        "list_accounts",
        "get_balance",
        "transfer",
        "pay",
        "list_transactions",
    }


# --- splits: train / dev / test / shifted -------------------------------------------------

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl_demo.yaml"
DEMO = next(e["config"] for e in yaml.safe_load(DEMO_CONFIG.read_text())["envs"] if e["name"] == "tool_use")


def _contents(env: ToolUseEnv, split: str, **kwargs: Any) -> list[str]:
    """A task's question: its prompt with the initial state it acts on (they decide the answer)."""
    return [scenario_key(Scenario.model_validate(t.answer)) for t in env.tasks(split, **kwargs)]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def demo() -> ToolUseEnv:
    return ToolUseEnv(ToolUseConfig(**DEMO))


@pytest.mark.parametrize("split", ["dev", "test", "shifted"])
def test_demo_held_out_splits_are_large_distinct_and_deterministic(demo: ToolUseEnv, split: str) -> None:
    contents = _contents(demo, split)
    assert len(set(contents)) == len(contents) >= 200
    assert contents == _contents(ToolUseEnv(ToolUseConfig(**DEMO)), split)


@pytest.mark.parametrize("first,second", [("test", "dev"), ("test", "shifted"), ("dev", "shifted")])
def test_demo_held_out_splits_are_disjoint(demo: ToolUseEnv, first: str, second: str) -> None:
    assert not set(_contents(demo, first)) & set(_contents(demo, second))


@pytest.mark.parametrize("split", ["dev", "test", "shifted"])
def test_demo_train_never_yields_a_held_out_task(demo: ToolUseEnv, split: str) -> None:
    train = {c for seed in range(3) for c in _contents(demo, "train", seed=seed, n=300)}
    assert len(train) > 850 and not train & set(_contents(demo, split))  # seeds may repeat a few 2-digit requests


def test_demo_shifted_uses_unseen_templates_from_the_test_share(demo: ToolUseEnv) -> None:
    shifted = list(demo.tasks("shifted", n=60))
    assert {t.metadata["template"] for t in shifted} == {"calc_multiply_wide", "calc_multiply_add"}
    assert {t.metadata["template"] for t in demo.tasks("train", n=60)} == {"calc_multiply", "calc_sum"}
    assert all(demo.split_of(Scenario.model_validate(t.answer)) == "test" for t in shifted)
    assert all(t.id.startswith("shifted-0-") for t in shifted)


@pytest.mark.parametrize(
    "config,templates",
    [
        (
            {"toolsets": ["bank"]},
            {name for ts in TEMPLATES_BY_TOOLSET if ts != "bank" for name in TEMPLATES_BY_TOOLSET[ts]},
        ),
        ({"toolsets": ["bank"], "shifted_templates": ["fs_move_and_read"]}, {"fs_move_and_read"}),
    ],
)
def test_shifted_templates_default_to_unseen_toolsets_or_are_given(config: dict[str, Any], templates: set[str]) -> None:
    assert set(ToolUseEnv(ToolUseConfig(**config)).shifted_template_names()) == templates


@pytest.mark.parametrize(
    "config",
    [
        {"toolsets": ["bank"], "templates": ["bank_sweep"], "shifted_templates": ["bank_sweep"]},
        {"shifted_templates": ["nope"]},
        {"test_fraction": 0.5, "dev_fraction": 0.5},
    ],
)
def test_bad_split_configs_are_rejected(config: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ToolUseConfig(**config)


@pytest.mark.parametrize(
    "split,needle",
    [
        ("shifted", "tool_use: split 'shifted' has no unseen template"),
        ("holdout", "tool_use: unknown split 'holdout'"),
    ],
)
def test_unsupported_splits_are_one_line_errors(split: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as err:
        next(ToolUseEnv().tasks(split))  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_scenario_split_has_a_dev_share_that_synthesis_train_excludes() -> None:
    scenarios = [TEMPLATES["bank_transfer_report"](random.Random(seed)) for seed in range(400)]
    splits = [scenario_split(s, 0.1) for s in scenarios]
    assert {"train", "dev", "test"} == set(splits)
    assert [scenario_split(s, 0.1, 0.0) for s in scenarios] == [("test" if x == "test" else "train") for x in splits]


# --- domains from MCP tool specs and record-store blueprints ----------------------------------------------

WEATHER_SPEC = {
    "tools": [
        {
            "name": "get_forecast",
            "description": "Forecast for a city.",
            "inputSchema": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
                "required": ["city", "days"],
            },
            "outputSchema": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "summary": {"type": "string", "enum": ["dry", "wet"]}},
                "required": ["city", "summary"],
            },
        }
    ]
}


@pytest.fixture
def weather_spec(tmp_path: Path) -> Path:
    path = tmp_path / "weather.json"
    path.write_text(json.dumps(WEATHER_SPEC))
    return path


@pytest.mark.parametrize("toolset", ["weather", "inventory"])
def test_spec_and_record_store_domains_are_gym_toolsets(weather_spec: Path, toolset: str) -> None:
    env = ToolUseEnv(ToolUseConfig(toolsets=[toolset], tool_specs=[str(weather_spec)]))
    assert {tool.name for tool in env.tools()} <= {t.name for t in env.domain(toolset).tools()}
    for task in env.tasks("train", seed=0, n=4):
        state = play(env, task, reference_messages(task))
        assert state.done and not state.errors and all(call.ok for call in state.calls)
        assert env.score_state(task, state).value == pytest.approx(1.0)
        restored = ToolUseState.model_validate(json.loads(state.model_dump_json()))
        assert type(restored.world) is type(state.world) and restored == state
        assert env.score_state(task, play(env, task, [Message(role="assistant", content="done")])).value < 1.0


def test_spec_paths_are_made_absolute_and_bad_specs_name_the_file(
    weather_spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(weather_spec.parent)
    assert ToolUseConfig(toolsets=["weather"], tool_specs=["weather.json"]).tool_specs == [str(weather_spec)]
    with pytest.raises(ValidationError, match=r"unknown toolsets \['weather'\].*tool spec file"):
        ToolUseConfig(toolsets=["weather"])
    (tmp_path / "broken.json").write_text(json.dumps({"tools": [{"name": "x y"}]}))
    with pytest.raises(ValidationError, match=r"broken\.json: tools\[0\]\.name: 'x y' is not a valid tool name"):
        ToolUseConfig(tool_specs=[str(tmp_path / "broken.json")])
    with pytest.raises(ValidationError, match=r"nope\.json: tool spec file or directory does not exist"):
        ToolUseConfig(tool_specs=["nope.json"])


# --- issue 43: a read-only task needs the fact read ---------------------------------------------------------------

from cheap_strategies import assert_unhackable, means, strategy_table  # noqa: E402

RECORD_DOMAINS = ["inventory", "tickets", "recipes"]
LOOK_UPS = [f"{domain}_look_up" for domain in RECORD_DOMAINS]


def test_read_only_tasks_are_exactly_those_a_no_op_passes() -> None:
    env = make_environment("tool_use", {"toolsets": list(TEMPLATES_BY_TOOLSET) + RECORD_DOMAINS})
    read_only = {
        name
        for domain in env.config.domains().values()
        for name, maker in domain.templates.items()
        if env.read_only(maker(random.Random(0)))
    }
    assert read_only == set(LOOK_UPS)


def test_look_ups_pay_only_for_the_value_read() -> None:
    env = make_environment("tool_use", {"toolsets": RECORD_DOMAINS, "templates": LOOK_UPS})
    table = strategy_table(env, list(env.tasks("test", n=12)))
    assert_unhackable(table)
    got = means(table)
    assert got["no_calls_done"] == 0.0 and got["answer_unread"] <= 0.1 and got["every_candidate"] <= got["honest_wrong"]
    assert got["honest_right"] == 1.0


def test_no_cheap_strategy_beats_honest_wrong_on_the_other_templates() -> None:
    env = make_environment("tool_use", {})
    assert_unhackable(strategy_table(env, list(env.tasks("test", n=16))))


@pytest.mark.parametrize(
    "answer,ok",
    [("The location of 'nuts' is back room.", True), ("back room or aisle 1", False), ("aisle 1", False), ("", False)],
)
def test_answer_naming_other_candidates_is_no_answer(answer: str, ok: bool) -> None:
    from k2post.toolsets.checks import answer_ok

    scenario = Scenario(
        toolset="inventory",
        template="inventory_look_up",
        prompt="?",
        initial_state={},
        success=[],
        answer=[["back room"]],
        wrong_answers=["aisle 1", "aisle 2"],
    )
    assert answer_ok(scenario, answer) is ok
