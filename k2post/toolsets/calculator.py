"""A calculator: integer `add` and `multiply` on typed JSON arguments (nothing is parsed or eval'd).

Made for a model too small to do multi-digit arithmetic in its head but able to copy numbers:
the right episode copies the operands from the request into a call, then copies the tool's
result into the final answer. The state only logs the computations, so the success check is
"the exact result was computed with the tool from the right operands" (a wrong call whose result
happens to match does not count) and the answer check is "the final answer states it";
checkpoints give partial credit for the right tool and for each operand copied right.

Templates (`make_multiply` / `make_sum` / `make_multiply_add` build other sizes):
- `calc_multiply`: a 2-digit times a 2-digit number, one `multiply` call;
- `calc_sum`: three 2-digit numbers, one `add` call;
- shifted: `calc_multiply_wide` (3-digit times 3-digit: more digits than training) and
  `calc_multiply_add` ((a x b) + c: two calls over two turns, the second uses the first's result).

    toolset = CalculatorToolset(); state = CalculatorState()
    toolset.call(state, "multiply", {"a": 47, "b": 29})       # "1363"
    toolset.call(state, "multiply", {"a": "47", "b": 29})     # "Error: multiply: argument 'a' ..."
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from k2post.toolsets.base import ToolError, Toolset, ToolsetState, tool_spec
from k2post.toolsets.checks import Checkpoint, Scenario, called, expect, ref_call

LIMIT = 999_999_999
"""Largest operand magnitude (products stay inside a signed 64-bit integer)."""
MAX_TERMS = 6
_INTEGER = {"type": "integer"}
_NUMBERS = {"type": "array", "items": _INTEGER}
"""Bounds are checked by the tools, not declared: the declaration is most of a short prompt."""


class Computation(BaseModel):
    """One successful tool call: the tool, its operands and the result."""

    model_config = ConfigDict(extra="forbid")

    tool: Literal["add", "multiply"] = Field(description="Which tool computed it.")
    operands: list[int] = Field(description="The operands, in call order.")
    result: int = Field(description="The exact result.")


class CalculatorState(ToolsetState):
    """The log of computations (the calculator itself has no other state)."""

    toolset: Literal["calculator"] = "calculator"
    history: list[Computation] = Field(default_factory=list, description="Oldest first.")


def _ints(values: list[Any]) -> list[int]:
    """Schema-checked integers (an integral float such as 30.0 is one) as ints, within LIMIT."""
    operands = [int(value) for value in values]
    if any(abs(value) > LIMIT for value in operands):
        raise ToolError(f"operands must be between -{LIMIT} and {LIMIT}")
    return operands


class CalculatorToolset(Toolset):
    """Exact integer arithmetic over a CalculatorState."""

    name: ClassVar[str] = "calculator"
    description: ClassVar[str] = "a calculator"
    context: ClassVar[str] = ""
    state_cls: ClassVar[type[ToolsetState]] = CalculatorState
    specs = (
        tool_spec("add", "Sum of integers.", {"numbers": _NUMBERS}, ["numbers"]),
        tool_spec("multiply", "Product of a and b.", {"a": _INTEGER, "b": _INTEGER}, ["a", "b"]),
    )

    def canonical_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        def canonical(value: Any) -> Any:
            if isinstance(value, float) and value.is_integer():
                return int(value)
            return [canonical(item) for item in value] if isinstance(value, list) else value

        return {key: canonical(value) for key, value in arguments.items()}

    @staticmethod
    def _log(state: CalculatorState, tool: str, operands: list[int], result: int) -> str:
        """Record a computation; its result is the tool message."""
        entry = Computation(tool=tool, operands=operands, result=result)  # type: ignore[arg-type]
        state.history.append(entry)
        return str(result)

    def tool_add(self, state: CalculatorState, numbers: list[Any]) -> str:
        if not 2 <= len(numbers) <= MAX_TERMS:
            raise ToolError(f"numbers must list 2 to {MAX_TERMS} integers, got {len(numbers)}")
        operands = _ints(numbers)
        return self._log(state, "add", operands, sum(operands))

    def tool_multiply(self, state: CalculatorState, a: Any, b: Any) -> str:
        operands = _ints([a, b])
        return self._log(state, "multiply", operands, operands[0] * operands[1])


# --- task templates -----------------------------------------------------------------------

TemplateFn = Callable[[random.Random], Scenario]

_MULTIPLY_PROMPTS = (
    "What is {a} times {b}?",
    "Multiply {a} by {b}.",
    "Compute {a} * {b}.",
    "What is the product of {a} and {b}?",
)
_SUM_PROMPTS = (
    "What is {terms}?",
    "Add up {listed}.",
    "What is the sum of {listed}?",
)
_MULTIPLY_ADD_PROMPTS = (
    "What is {a} times {b}, plus {c}?",
    "Multiply {a} by {b}, then add {c}.",
)


def number(rng: random.Random, digits: int) -> int:
    """A random positive integer with exactly `digits` digits."""
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _listed(values: list[int]) -> str:
    """`1, 2 and 3`."""
    return ", ".join(str(value) for value in values[:-1]) + f" and {values[-1]}"


def _scenario(template: str, prompt: str, result: int, **parts: Any) -> Scenario:
    """A calculator Scenario: the exact result computed with the tool from the right operands
    (those of the reference's last call, in any order), then stated."""
    last = parts["reference_turns"][-1][-1].arguments
    operands = list(last["numbers"]) if "numbers" in last else [last["a"], last["b"]]
    computed = {"result": result, "operands": operands}
    return Scenario(
        toolset="calculator",
        template=template,
        prompt=prompt,
        initial_state=CalculatorState().model_dump(mode="json"),
        success=[expect(["history"], "contains", computed, f"computed {result} from {operands}")],
        answer=[[str(result)]],
        reference_answer=f"The answer is {result}.",
        **parts,
    )


def _operand(checkpoint_id: str, tool: str, value: int) -> Checkpoint:
    """A call of `multiply` with `value` as either operand (or of `add` with it in the list)."""
    calls = (
        [called("multiply", a=value), called("multiply", b=value)]
        if tool == "multiply"
        else [called("add", numbers=[value])]
    )
    return Checkpoint(id=checkpoint_id, description=f"{tool} called with {value}", calls=calls)


def _used(tool: str) -> Checkpoint:
    return Checkpoint(id=f"used_{tool}", description=f"a valid {tool} call", calls=[called(tool)])


def make_multiply(digits_a: int = 2, digits_b: int = 2, name: str = "calc_multiply") -> TemplateFn:
    """Template: the product of a `digits_a`-digit and a `digits_b`-digit number."""

    def template(rng: random.Random) -> Scenario:
        a, b = number(rng, digits_a), number(rng, digits_b)
        prompt = rng.choice(_MULTIPLY_PROMPTS).format(a=a, b=b)
        return _scenario(
            name,
            prompt,
            a * b,
            checkpoints=[
                _used("multiply"),
                _operand("first", "multiply", a),
                _operand("second", "multiply", b),
            ],
            reference_turns=[[ref_call("multiply", a=a, b=b)]],
        )

    template.__doc__ = f"{digits_a}-digit times {digits_b}-digit, one multiply call."
    return template


def make_sum(terms: int = 3, digits: int = 2, name: str = "calc_sum") -> TemplateFn:
    """Template: the sum of `terms` numbers of `digits` digits (one `add` call)."""

    def template(rng: random.Random) -> Scenario:
        values = [number(rng, digits) for _ in range(terms)]
        text = rng.choice(_SUM_PROMPTS)
        prompt = text.format(terms=" + ".join(map(str, values)), listed=_listed(values))
        copied = [_operand(f"term_{i + 1}", "add", v) for i, v in enumerate(values)]
        checkpoints = [_used("add"), *copied]
        return _scenario(
            name,
            prompt,
            sum(values),
            checkpoints=checkpoints,
            reference_turns=[[ref_call("add", numbers=values)]],
        )

    template.__doc__ = f"Sum of {terms} {digits}-digit numbers, one add call."
    return template


def make_multiply_add(
    digits_a: int = 2, digits_b: int = 2, digits_c: int = 2, name: str = "calc_multiply_add"
) -> TemplateFn:
    """Template: (a x b) + c, multiply then add the product and c (two turns)."""

    def template(rng: random.Random) -> Scenario:
        a, b, c = number(rng, digits_a), number(rng, digits_b), number(rng, digits_c)
        prompt = rng.choice(_MULTIPLY_ADD_PROMPTS).format(a=a, b=b, c=c)
        product = [called("multiply", a=a, b=b), called("multiply", a=b, b=a)]
        checkpoints = [
            Checkpoint(id="product", description=f"computed {a * b}", calls=product),
            _operand("added_c", "add", c),
        ]
        return _scenario(
            name,
            prompt,
            a * b + c,
            checkpoints=checkpoints,
            reference_turns=[
                [ref_call("multiply", a=a, b=b)],
                [ref_call("add", numbers=[a * b, c])],
            ],
        )

    template.__doc__ = f"({digits_a}-digit x {digits_b}-digit) + {digits_c}-digit, two calls."
    return template


TEMPLATES: dict[str, TemplateFn] = {
    "calc_multiply": make_multiply(2, 2, "calc_multiply"),
    "calc_sum": make_sum(3, 2, "calc_sum"),
    "calc_multiply_add": make_multiply_add(2, 2, 2, "calc_multiply_add"),
    "calc_multiply_wide": make_multiply(3, 3, "calc_multiply_wide"),
}
"""In-distribution: calc_multiply, calc_sum; shifted: calc_multiply_wide (more digits) and
calc_multiply_add (a two-call composition of the same tools)."""

TRAIN_TEMPLATES = ("calc_multiply", "calc_sum")
SHIFTED_TEMPLATES = ("calc_multiply_wide", "calc_multiply_add")
