"""Assert tests whose verdict is computed in the trusted process, never in the candidate's.

An MBPP-style test `assert f(3) == 9` is split at load time (`split_assert`, on the test's own source,
which is trusted data) into *probes* — the maximal sub-expressions that involve the candidate's names
(`f(3)`) — and the rest of the assertion, kept here. Only the probes' source goes into the sandbox; the
harness there evaluates them in the candidate's namespace and writes each value as tagged plain data
(`encode` in k2post/sandbox/assert_harness.py: builtin types only, exact types, no subclasses).
`decode_value` reads that data back strictly into builtin values, and `check_assert` evaluates the
assertion over them with a small AST evaluator (no `eval`): comparisons, boolean logic, arithmetic with
size bounds, subscripts and a few pure builtins (`abs`, `len`, `sorted`, `math.isclose`, ...). So nothing the
candidate can reach — `__eq__` overrides, forged harness lines, patched `json` — can decide a verdict: the
expected side never enters the sandbox, and what comes out of it is data, compared here.

A probe that names none of the candidate's names, only Python's builtins and a few stdlib modules
(`list(range(3))`, `math.factorial(20)`: expected values the evaluator here cannot run) is *clean*: the harness
evaluates it in a namespace of its own before the solution is loaded, so a solution that shadows `range` in its
module or patches `builtins` cannot change the expected side.

    split = split_assert('assert abs(to_f(37) - 98.6) < 1e-9', candidate_names={"to_f"})
    split.probes                      # ['to_f(37)']
    check_assert(split, [98.6])       # True
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROBE_PREFIX = "__probe_"
MAX_DECODE_DEPTH = 100
MAX_DECODE_ITEMS = 200_000
MAX_INT_DIGITS = 4000
MAX_POWER_EXPONENT = 10_000
MAX_REPEAT_ITEMS = 1_000_000

SAFE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        abs,
        all,
        any,
        bool,
        dict,
        float,
        frozenset,
        int,
        len,
        list,
        max,
        min,
        round,
        set,
        sorted,
        str,
        sum,
        tuple,
    )
}
SAFE_FUNCTIONS["isinstance"] = isinstance
UNBOUNDED_MATH = ("factorial", "comb", "perm", "prod", "pow", "ldexp")
MATH_NAMES: dict[str, Any] = {
    name: getattr(math, name) for name in dir(math) if not name.startswith("_") and name not in UNBOUNDED_MATH
}
"""`math.*` the trusted side may use: every constant and function but those whose cost grows without bound
with their arguments (a test using those keeps them on the candidate's side)."""
TRUSTED_NAMES = frozenset(SAFE_FUNCTIONS) | {"math"}
CLEAN_MODULES = frozenset(
    {"math", "cmath", "itertools", "functools", "collections", "operator", "string", "re", "heapq", "bisect",
     "fractions", "decimal", "statistics"}
)  # fmt: skip
"""Stdlib modules a clean probe may name (the harness imports them itself, before the solution runs)."""
CLEAN_NAMES = frozenset(n for n in dir(builtins) if not n.startswith("_")) | CLEAN_MODULES

_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class AssertSplitError(ValueError):
    """A test that is not one `assert` the trusted evaluator understands; the message says what."""


class ValueDecodeError(ValueError):
    """Harness output that is not tagged plain data."""


@dataclass(frozen=True)
class SplitAssert:
    """A test split into the candidate's probes (sources) and the trusted rest (an expression over
    `__probe_<i>` names)."""

    source: str
    probes: tuple[str, ...]
    check: ast.expr
    clean: tuple[bool, ...] = ()
    """Per probe: evaluated in a clean namespace before the solution loads (it names only builtins and
    `CLEAN_MODULES`), else in the solution's namespace after it."""

    def is_clean(self, index: int) -> bool:
        return index < len(self.clean) and self.clean[index]


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def free_names(node: ast.AST) -> set[str]:
    """Names `node` reads that it does not bind itself (comprehension targets, lambda arguments, walrus)."""
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def is_clean_probe(node: ast.AST, candidate_names: set[str] | frozenset[str]) -> bool:
    """Whether a probe needs nothing of the candidate: it names no candidate name at all, and every name it reads
    is a builtin or one of `CLEAN_MODULES`."""
    return not (_names(node) & set(candidate_names)) and free_names(node) <= CLEAN_NAMES


def _is_candidate(node: ast.AST, candidate_names: set[str]) -> bool:
    """Whether a sub-expression needs the candidate's namespace (it names something not trusted)."""
    return any(name in candidate_names or name not in TRUSTED_NAMES for name in _names(node))


_TRUSTED_SHAPES = (
    ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict,
    ast.IfExp, ast.Subscript, ast.Slice,
)  # fmt: skip
_NOT_PLAIN = (ast.GeneratorExp, ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom)


def _is_math(node: ast.AST, candidate_names: set[str]) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "math"
        and "math" not in candidate_names
        and node.attr in MATH_NAMES
    )


def _runs_here(node: ast.expr, candidate_names: set[str]) -> bool:
    """Whether the trusted evaluator runs this node itself (its children may still be probes)."""
    if isinstance(node, ast.Name):
        return node.id in TRUSTED_NAMES and node.id not in candidate_names
    if isinstance(node, ast.Call):
        function = node.func
        trusted_name = isinstance(function, ast.Name) and _runs_here(function, candidate_names)
        return trusted_name and function.id != "math" or _is_math(function, candidate_names)
    return isinstance(node, _TRUSTED_SHAPES) or _is_math(node, candidate_names)


class _ProbeCutter(ast.NodeTransformer):
    """Replaces each candidate sub-expression the trusted evaluator cannot run by a `__probe_<i>` name."""

    def __init__(self, candidate_names: set[str]):
        self.candidate_names, self.probes, self.clean = candidate_names, [], []

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr) and self._is_probe(node):
            if isinstance(node, _NOT_PLAIN):
                raise AssertSplitError(f"{type(node).__name__} values cannot leave the sandbox: use a list")
            self.probes.append(ast.unparse(node))
            self.clean.append(is_clean_probe(node, self.candidate_names))
            return ast.copy_location(ast.Name(id=f"{PROBE_PREFIX}{len(self.probes) - 1}", ctx=ast.Load()), node)
        return self.generic_visit(node)

    def _is_probe(self, node: ast.expr) -> bool:
        """A candidate sub-expression the evaluator here cannot run, or the largest clean one it cannot run whole
        (`list(range(3))` is cut whole: `range(3)` alone is no plain value)."""
        names = self.candidate_names
        if is_clean_probe(node, names) and _names(node):
            return _is_candidate(node, names) or not _supported_here(node)
        return not _runs_here(node, names) and _is_candidate(node, names)


def split_assert(source: str, candidate_names: set[str] | frozenset[str] = frozenset()) -> SplitAssert:
    """Split one `assert EXPR` test; AssertSplitError when it is not one or uses what the evaluator lacks.
    `candidate_names` are always the candidate's, even when they shadow a trusted builtin."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError) as err:
        raise AssertSplitError(f"not valid Python ({type(err).__name__}: {err})") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise AssertSplitError("a test must be one `assert EXPR` statement")
    cutter = _ProbeCutter(set(candidate_names))
    check = cutter.visit(tree.body[0].test)
    _check_supported(check)
    if all(cutter.clean):
        raise AssertSplitError("the assertion does not use the candidate's code")
    return SplitAssert(source=source, probes=tuple(cutter.probes), check=check, clean=tuple(cutter.clean))


_SUPPORTED = (
    ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Call, ast.Constant, ast.List, ast.Tuple, ast.Set,
    ast.Dict, ast.Name, ast.Attribute, ast.Subscript, ast.Slice, ast.IfExp, ast.keyword, ast.Load,
    ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd, *_COMPARE, *_BINARY,
)  # fmt: skip


def _supported_here(node: ast.AST) -> bool:
    try:
        _check_supported(node)
    except AssertSplitError:
        return False
    return True


def _check_supported(node: ast.AST) -> None:
    for sub in ast.walk(node):
        if not isinstance(sub, _SUPPORTED):
            raise AssertSplitError(f"the trusted side of the assertion uses {type(sub).__name__}, which it cannot run")
        if isinstance(sub, ast.Attribute) and not (
            isinstance(sub.value, ast.Name) and sub.value.id == "math" and sub.attr in MATH_NAMES
        ):
            raise AssertSplitError(f"attribute {ast.unparse(sub)!r} is not one of math.{', math.'.join(MATH_NAMES)}")


# ------------------------------------------------------------------------- decoding harness values


class _Budget:
    def __init__(self) -> None:
        self.items = 0

    def spend(self) -> None:
        self.items += 1
        if self.items > MAX_DECODE_ITEMS:
            raise ValueDecodeError(f"more than {MAX_DECODE_ITEMS} values")


def _decode_scalar(tag: str, body: Any) -> Any:
    if tag == "n" and body is None:
        return None
    if tag == "b" and isinstance(body, bool):
        return body
    if tag == "s" and isinstance(body, str):
        return body
    if tag == "i" and isinstance(body, str) and len(body) <= MAX_INT_DIGITS + 1:
        return int(body)
    if tag == "f" and isinstance(body, str) and len(body) <= 64:
        return float(body)
    raise ValueDecodeError(f"bad {tag!r} value")


def _decode(data: Any, depth: int, budget: _Budget) -> Any:
    budget.spend()
    if depth > MAX_DECODE_DEPTH:
        raise ValueDecodeError(f"nested deeper than {MAX_DECODE_DEPTH}")
    if not (isinstance(data, list) and len(data) == 2 and isinstance(data[0], str)):
        raise ValueDecodeError("not a [tag, value] pair")
    tag, body = data
    if tag in ("l", "t", "S", "F"):
        if not isinstance(body, list):
            raise ValueDecodeError(f"bad {tag!r} value")
        items = [_decode(item, depth + 1, budget) for item in body]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        if not isinstance(body, list) or not all(isinstance(p, list) and len(p) == 2 for p in body):
            raise ValueDecodeError("bad 'd' value")
        return {_decode(k, depth + 1, budget): _decode(v, depth + 1, budget) for k, v in body}
    return _decode_scalar(tag, body)


def decode_value(data: Any) -> Any:
    """The builtin value of the harness's tagged data (`["i", "3"]`, `["l", [...]]`, ...); ValueDecodeError
    for anything else (unhashable keys included)."""
    try:
        return _decode(data, 0, _Budget())
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueDecodeError(str(err) or type(err).__name__) from None


# ------------------------------------------------------------------------- the trusted evaluator


def _bounded_binary(op: ast.operator, left: Any, right: Any) -> Any:
    """Arithmetic whose result size is bounded (no `10 ** 10**9`, no `[0] * 10**12`)."""
    if isinstance(op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > MAX_POWER_EXPONENT:
        raise ValueError("exponent too large for the trusted evaluator")
    if isinstance(op, ast.Mult):
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
                if len(sequence) * count > MAX_REPEAT_ITEMS:
                    raise ValueError("repetition too large for the trusted evaluator")
    return _BINARY[type(op)](left, right)


class _Evaluator:
    def __init__(self, values: list[Any]):
        self.values = values

    def run(self, node: ast.AST) -> Any:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise ValueError(f"unsupported {type(node).__name__}")
        return method(node)

    def _Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id.startswith(PROBE_PREFIX):
            return self.values[int(node.id[len(PROBE_PREFIX) :])]
        if node.id in SAFE_FUNCTIONS:
            return SAFE_FUNCTIONS[node.id]
        raise ValueError(f"unknown name {node.id!r}")

    def _Attribute(self, node: ast.Attribute) -> Any:
        return MATH_NAMES[node.attr]

    def _List(self, node: ast.List) -> Any:
        return [self.run(e) for e in node.elts]

    def _Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.run(e) for e in node.elts)

    def _Set(self, node: ast.Set) -> Any:
        return {self.run(e) for e in node.elts}

    def _Dict(self, node: ast.Dict) -> Any:
        return {self.run(k): self.run(v) for k, v in zip(node.keys, node.values)}

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.run(node.operand)
        return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}[type(node.op)](value)

    def _BinOp(self, node: ast.BinOp) -> Any:
        return _bounded_binary(node.op, self.run(node.left), self.run(node.right))

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        result: Any = isinstance(node.op, ast.And)
        for value_node in node.values:
            result = self.run(value_node)
            if bool(result) != isinstance(node.op, ast.And):
                return result
        return result

    def _Compare(self, node: ast.Compare) -> Any:
        left = self.run(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.run(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.run(node.body) if self.run(node.test) else self.run(node.orelse)

    def _Subscript(self, node: ast.Subscript) -> Any:
        return self.run(node.value)[self.run(node.slice)]

    def _Slice(self, node: ast.Slice) -> Any:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if part is None else self.run(part) for part in parts))

    def _Call(self, node: ast.Call) -> Any:
        function = self.run(node.func)
        if function not in SAFE_FUNCTIONS.values() and function not in MATH_NAMES.values():
            raise ValueError("only the trusted builtins can be called")
        arguments = [self.run(a) for a in node.args]
        keywords = {k.arg: self.run(k.value) for k in node.keywords if k.arg is not None}
        return function(*arguments, **keywords)


def check_assert(split: SplitAssert, values: list[Any]) -> bool:
    """Whether the assertion holds for the probes' decoded values (False on any error: a wrong type,
    a failed operation, a missing value)."""
    if len(values) != len(split.probes):
        return False
    try:
        return bool(_Evaluator(values).run(split.check))
    except Exception:  # noqa: BLE001  (any failure of the assertion's own expression is a failed test)
        return False
