"""Calculator toolset: call tables (good args, wrong types, missing args, huge numbers, hostile
strings), its templates' determinism and splits, and episode rewards in the tool_use gym
(reference = 1, no tool call or wrong operands never full credit, partial credit per operand)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from k2post_environments.tool_use import ToolUseEnv
from k2post.toolsets import get_toolset, is_error, load_state
from k2post.toolsets.calculator import (
    LIMIT,
    SHIFTED_TEMPLATES,
    TEMPLATES,
    TRAIN_TEMPLATES,
    CalculatorState,
    make_multiply,
    make_sum,
)
from k2post.toolsets.checks import scenario_split
from k2post.chat.types import Message, ToolCall
from k2post.envs import Task, make_environment

CALCULATOR = get_toolset("calculator")

GOOD: list[tuple[str, dict[str, Any], str]] = [
    ("multiply", {"a": 347, "b": 29}, "10063"),
    ("multiply", {"a": 29, "b": 347}, "10063"),
    ("multiply", {"a": -12, "b": 12}, "-144"),
    ("multiply", {"a": 30.0, "b": 2}, "60"),  # an integral float is an integer (JSON Schema)
    ("multiply", {"a": LIMIT, "b": LIMIT}, str(LIMIT * LIMIT)),
    ("add", {"numbers": [412, 509, 88]}, "1009"),
    ("add", {"numbers": [1, -1]}, "0"),
    ("add", {"numbers": [LIMIT] * 6}, str(6 * LIMIT)),
]


@pytest.mark.parametrize(("tool", "arguments", "expected"), GOOD)
def test_good_calls_return_the_exact_result_and_log_it(tool: str, arguments: dict[str, Any], expected: str) -> None:
    state = CalculatorState()
    assert CALCULATOR.call(state, tool, arguments) == expected
    assert [entry.result for entry in state.history] == [int(expected)]
    assert state.history[0].tool == tool


BAD: list[tuple[str, Any, str]] = [
    ("multiply", {"a": "347", "b": 29}, "argument 'a' must be an integer, got string"),
    ("multiply", {"a": 3.5, "b": 2}, "argument 'a' must be an integer, got number"),
    ("multiply", {"a": True, "b": 2}, "argument 'a' must be an integer, got boolean"),
    ("multiply", {"a": None, "b": 2}, "argument 'a' must be an integer, got null"),
    ("multiply", {"a": [3], "b": 2}, "argument 'a' must be an integer, got array"),
    ("multiply", {"a": 3}, "missing required argument 'b'"),
    ("multiply", {}, "missing required argument 'a'"),
    ("multiply", {"a": 3, "b": 4, "c": 5}, "unexpected argument 'c'"),
    ("multiply", {"a": 10**10, "b": 2}, f"between -{LIMIT} and {LIMIT}"),
    ("multiply", {"a": 1e300, "b": 2}, f"between -{LIMIT} and {LIMIT}"),
    ("multiply", {"a": float("nan"), "b": 2}, "must be an integer, got number"),
    ("multiply", {"a": float("inf"), "b": 2}, "must be an integer, got number"),
    ("multiply", [347, 29], "arguments must be a JSON object, got array"),
    ("multiply", "347 * 29", "arguments must be a JSON object, got string"),
    ("multiply", {"a": "__import__('os').system('true')", "b": 1}, "must be an integer"),
    ("add", {"numbers": "1+2"}, "argument 'numbers' must be an array, got string"),
    ("add", {"numbers": [1, "2"]}, "argument 'numbers[1]' must be an integer, got string"),
    ("add", {"numbers": [1, {"x": 1}]}, "argument 'numbers[1]' must be an integer, got object"),
    ("add", {"numbers": [5]}, "numbers must list 2 to 6 integers, got 1"),
    ("add", {"numbers": list(range(7))}, "numbers must list 2 to 6 integers, got 7"),
    ("add", {"numbers": [1, -(10**12)]}, f"between -{LIMIT} and {LIMIT}"),
    ("add", {}, "missing required argument 'numbers'"),
    ("subtract", {"a": 1, "b": 2}, "unknown tool 'subtract' (available: add, multiply)"),
    ("eval", {"expression": "1+1"}, "unknown tool 'eval'"),
]


@pytest.mark.parametrize(("tool", "arguments", "fragment"), BAD)
def test_bad_calls_are_error_messages_and_change_nothing(tool: str, arguments: Any, fragment: str) -> None:
    state = CalculatorState()
    result = CALCULATOR.call(state, tool, arguments)
    assert is_error(result) and fragment in result, result
    assert state.history == []


def test_canonical_arguments_make_integral_floats_ints() -> None:
    assert CALCULATOR.canonical_arguments("add", {"numbers": [1.0, 2]}) == {"numbers": [1, 2]}
    assert CALCULATOR.canonical_arguments("multiply", {"a": 3.0, "b": 4}) == {"a": 3, "b": 4}


def test_state_round_trips_through_the_toolset_union() -> None:
    state = CalculatorState()
    CALCULATOR.call(state, "multiply", {"a": 12, "b": 34})
    loaded = load_state(state.model_dump(mode="json"))
    assert isinstance(loaded, CalculatorState) and loaded == state


def test_declaration_is_short() -> None:
    assert [spec.name for spec in CALCULATOR.tools()] == ["add", "multiply"]
    assert sum(len(str(spec.to_openai())) for spec in CALCULATOR.tools()) < 600


@pytest.mark.parametrize("name", [*TRAIN_TEMPLATES, *SHIFTED_TEMPLATES])
def test_templates_are_deterministic_and_show_the_operands(name: str) -> None:
    make = TEMPLATES[name]
    assert make(random.Random(3)) == make(random.Random(3))
    for seed in range(20):
        scenario = make(random.Random(seed))
        first_turn = scenario.reference_turns[0]
        operands = [arg for call in first_turn for arg in _ints(call.arguments)]
        assert all(str(value) in scenario.prompt for value in operands), scenario.prompt
        assert scenario.reference_answer == f"The answer is {scenario.answer[0][0]}."


def _ints(arguments: dict[str, Any]) -> list[int]:
    """Every integer of a call's arguments (lists flattened)."""
    values = [value if isinstance(value, list) else [value] for value in arguments.values()]
    return [item for group in values for item in group]


def test_template_parameters_set_the_digits() -> None:
    assert len(str(TEMPLATES["calc_multiply_wide"](random.Random(0)).answer[0][0])) >= 5
    scenario = make_multiply(5, 4, "wide")(random.Random(0))
    call = scenario.reference_turns[0][0]
    assert (len(str(call.arguments["a"])), len(str(call.arguments["b"]))) == (5, 4)
    terms = make_sum(4, 2, "sum4")(random.Random(0)).reference_turns[0][0].arguments["numbers"]
    assert len(terms) == 4 and all(10 <= term <= 99 for term in terms)


def test_the_split_depends_on_content_only() -> None:
    scenarios = [TEMPLATES["calc_multiply"](random.Random(seed)) for seed in range(400)]
    test = [s for s in scenarios if scenario_split(s, 0.1) == "test"]
    assert 15 <= len(test) <= 70
    same = scenarios[0].model_copy()
    assert scenario_split(same, 0.1) == scenario_split(scenarios[0], 0.1)


# --- episodes in the tool_use gym ----------------------------------------------------------


def _env() -> ToolUseEnv:
    config = {"toolsets": ["calculator"], "templates": list(TEMPLATES), "max_turns": 4}
    return make_environment("tool_use", config)  # type: ignore[return-value]


def _task(template: str) -> Task:
    env = make_environment("tool_use", {"toolsets": ["calculator"], "templates": [template]})
    return next(env.tasks("test", seed=0, n=1))


def _calls(*calls: tuple[str, dict[str, Any]]) -> Message:
    return Message(
        role="assistant",
        tool_calls=[
            ToolCall(id=f"functions.{name}:{i}", name=name, arguments=args) for i, (name, args) in enumerate(calls)
        ],
    )


def _play(task: Task, turns: list[Message | str]) -> tuple[float, dict[str, float]]:
    env = _env()
    state = env.reset(task)
    for turn in turns:
        env.step(state, turn)
    reward = env.score_state(task, state)
    return reward.value, reward.breakdown


def _reference(task: Task) -> list[Message | str]:
    turns: list[Message | str] = [
        _calls(*[(call["name"], call["arguments"]) for call in turn]) for turn in task.answer["reference_turns"]
    ]
    return [*turns, task.answer["reference_answer"]]


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_reference_solution_gets_full_reward(template: str) -> None:
    task = _task(template)
    assert task.metadata["toolset"] == "calculator" and len(task.metadata["tools"]) == 2
    assert _play(task, _reference(task))[0] == pytest.approx(1.0)


def test_rewards_of_partial_and_wrong_episodes() -> None:
    task = _task("calc_multiply")
    (call,) = task.answer["reference_turns"][0]
    a, b = call["arguments"]["a"], call["arguments"]["b"]
    right = str(a * b)
    # the right number without the tool: the answer check only (0.1), never a success
    assert _play(task, [f"The answer is {right}."])[0] == pytest.approx(0.1)
    # swapped operands are as good as the reference
    swapped = [_calls(("multiply", {"a": b, "b": a})), f"It is {right}."]
    assert _play(task, swapped)[0] == pytest.approx(1.0)
    # the right call, then an answer without the number: 0.9 (success, partial credit)
    assert _play(task, [_calls(("multiply", {"a": a, "b": b})), "Done."])[0] == pytest.approx(0.9)
    # one operand copied wrong: tool used + one operand = 2/3 of the checkpoints
    one_off = [_calls(("multiply", {"a": a, "b": b + 1})), f"It is {a * (b + 1)}."]
    value, breakdown = _play(task, one_off)
    assert value == pytest.approx(0.2) and breakdown["final_state"] == 0.0
    # a string argument is an Error: tool message, no credit
    assert _play(task, [_calls(("multiply", {"a": str(a), "b": b})), "Done."])[0] == 0.0
    # a result glued to more digits does not count as the answer
    assert _play(task, [f"The answer is {right}1."])[0] == 0.0


def test_multiply_add_needs_both_calls() -> None:
    task = _task("calc_multiply_add")
    first, second = task.answer["reference_turns"]
    answer = task.answer["reference_answer"]
    only_first = _play(task, [_calls((first[0]["name"], first[0]["arguments"])), answer])
    assert only_first[0] < 0.5 and only_first[1]["final_state"] == 0.0
    assert _play(task, _reference(task))[0] == pytest.approx(1.0)


def test_a_wrong_call_with_the_right_result_by_coincidence_is_no_success() -> None:
    task = _task("calc_sum")
    (call,) = task.answer["reference_turns"][0]
    numbers = call["arguments"]["numbers"]
    lucky = [numbers[0] - 1, numbers[1] + 1, numbers[2]]  # same sum, two operands wrong
    value, breakdown = _play(task, [_calls(("add", {"numbers": lucky})), f"It is {sum(numbers)}."])
    assert breakdown["final_state"] == 0.0 and value < 0.5
    reordered = [numbers[2], numbers[0], numbers[1]]
    assert _play(task, [_calls(("add", {"numbers": reordered})), f"It is {sum(numbers)}."])[0] == 1.0
