"""Worked solutions: the steps of an integer +/-/* expression, left to right, as text a small model can imitate.

    chain_steps("7 - 3 + 9")        # "7 - 3 = 4, 4 + 9 = 13"
    chain_steps("12 * 3")           # "12 * 3 = 36"
    expression_of("State the final answer to the following arithmetic problem: 0 - 4 - 8 =")   # "0 - 4 - 8"

An environment's `worked_solution(task)` uses these to write the reasoning that leads to its gold
answer: SFT data synthesis renders it in a reply template's `{steps}` slot (`k2post.synth.gym_tasks`),
so the data can hold both direct answers and answers that work the sum out first, and RL can find
out which of the two the verifier rewards more often. Evaluation is left to right (no precedence):
these expressions are chains (`a op b op c ...`); `*` is only accepted as a single operation.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\s*(-?\d+|[-+*])")
_EXPRESSION = re.compile(r"(-?\d+(?:\s*[-+*]\s*-?\d+)+)\s*=?\s*\??\s*$")


def _tokens(expression: str) -> list[str]:
    """Numbers and operators of `expression`; ValueError on anything else."""
    tokens, position, text = [], 0, expression.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match:
            raise ValueError(f"not an integer chain expression: {expression!r}")
        tokens.append(match.group(1))
        position = match.end()
    if len(tokens) < 3 or len(tokens) % 2 == 0:
        raise ValueError(f"not an integer chain expression: {expression!r}")
    return tokens


def _apply(left: int, operator: str, right: int) -> int:
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    return left * right


def chain_steps(expression: str) -> str:
    """`a op b = r1, r1 op c = r2, ...`: one step per operator, left to right (ValueError on junk)."""
    tokens = _tokens(expression)
    numbers, operators = [int(t) for t in tokens[0::2]], tokens[1::2]
    if "*" in operators and len(operators) > 1:
        raise ValueError(f"'*' is only supported as a single operation: {expression!r}")
    steps, total = [], numbers[0]
    for operator, number in zip(operators, numbers[1:]):
        result = _apply(total, operator, number)
        steps.append(f"{total} {operator} {number} = {result}")
        total = result
    return ", ".join(steps)


def chain_value(expression: str) -> int:
    """The value of the chain, left to right."""
    return int(chain_steps(expression).rsplit("= ", 1)[1])


def expression_of(question: str) -> str | None:
    """The trailing `a op b ...` expression of a question (before a final `=` or `?`), else None."""
    for line in reversed(question.strip().splitlines()):
        match = _EXPRESSION.search(line.split(":")[-1].strip())
        if match:
            return match.group(1).strip()
    return None
