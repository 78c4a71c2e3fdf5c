"""Assert tests split into candidate probes and a trusted check; strict decoding of harness values; the
trusted evaluator on tables (what passes, what fails, what it refuses)."""

from __future__ import annotations

import ast
import math

import pytest

from k2post.sandbox.trusted_asserts import (
    AssertSplitError,
    ValueDecodeError,
    check_assert,
    decode_value,
    split_assert,
)


@pytest.mark.parametrize(
    ("test", "names", "probes", "check"),
    [
        ('assert reverse_string("hello") == "olleh"', set(), ["reverse_string('hello')"], "__probe_0 == 'olleh'"),
        ("assert abs(to_f(37) - 98.6) < 1e-9", set(), ["to_f(37)"], "abs(__probe_0 - 98.6) < 1e-09"),
        ("assert is_prime(2) is True", set(), ["is_prime(2)"], "__probe_0 is True"),
        ("assert sorted(f([3, 1])) == [1, 3]", set(), ["f([3, 1])"], "sorted(__probe_0) == [1, 3]"),
        (
            "assert math.isclose(f(2), 1.41, rel_tol=0.01)",
            set(),
            ["f(2)"],
            "math.isclose(__probe_0, 1.41, rel_tol=0.01)",
        ),
        (
            "assert len(f(3)) == 3 and f(3)[0] == 1",
            set(),
            ["f(3)", "f(3)"],
            "len(__probe_0) == 3 and __probe_1[0] == 1",
        ),
        ("assert CONSTANT == 5", set(), ["CONSTANT"], "__probe_0 == 5"),
        ("assert sorted([3, 1]) == [1, 3]", {"sorted"}, ["sorted([3, 1])"], "__probe_0 == [1, 3]"),
        ("assert [g(x) for x in range(3)] == [0, 1, 4]", set(), ["[g(x) for x in range(3)]"], "__probe_0 == [0, 1, 4]"),
    ],
)
def test_split_keeps_the_expected_side_out_of_the_probes(test, names, probes, check):
    split = split_assert(test, names)
    assert list(split.probes) == probes and ast.unparse(split.check) == check


@pytest.mark.parametrize(
    ("test", "message"),
    [
        ("x = f(1)", "one `assert EXPR` statement"),
        ("assert f(1) == 1\nassert f(2) == 2", "one `assert EXPR` statement"),
        ("assert 1 + 1 == 2", "does not use the candidate's code"),
        ("assert all(v > 0 for v in f(3))", "GeneratorExp values cannot leave the sandbox"),
        ("assert f() == (lambda: 1)()", "the trusted side of the assertion uses Lambda"),
        ("assert f(", "not valid Python"),
    ],
)
def test_tests_the_split_cannot_handle_are_one_line_errors(test, message):
    with pytest.raises(AssertSplitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        split_assert(test)


@pytest.mark.parametrize(
    ("test", "values", "holds"),
    [
        ('assert f("a") == "b"', ["b"], True),
        ('assert f("a") == "b"', ["c"], False),
        ("assert f() is True", [True], True),
        ("assert f() is True", [1], False),
        ("assert f() == (1, 2)", [(1, 2)], True),
        ("assert f() == (1, 2)", [[1, 2]], False),
        ("assert f() == {'a': 1}", [{"a": 1}], True),
        ("assert abs(f() - 98.6) < 1e-9", [98.6], True),
        ("assert abs(f() - 98.6) < 1e-9", ["98.6"], False),  # a type error is a failed test
        ("assert f() ** 2 == 4", [10**6], False),  # exponent bound: fails, does not hang
        ("assert f() * 10**7 == 'x'", ["ab"], False),  # repetition bound
        ("assert math.isclose(f(), 0.1 + 0.2)", [0.3], True),
        ("assert f()[1:] == [2, 3]", [[1, 2, 3]], True),
        ("assert f() in (1, 2) or f() == 3", [2, 3], True),
        ("assert not f()", [[]], True),
        ("assert isinstance(f(), (int, float))", [1.5], True),
        ("assert f() == 1", [], False),  # missing value
    ],
)
def test_check_assert_truth_table(test, values, holds):
    assert check_assert(split_assert(test), values) is holds


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (["n", None], None),
        (["b", True], True),
        (["i", "123456789012345678901234567890"], 123456789012345678901234567890),
        (["f", "nan"], math.nan),
        (["s", "x"], "x"),
        (["t", [["i", "1"], ["s", "a"]]], (1, "a")),
        (["S", [["i", "1"]]], {1}),
        (["d", [[["t", [["i", "1"]]], ["l", []]]]], {(1,): []}),
    ],
)
def test_decode_value_reads_tagged_plain_data(data, value):
    decoded = decode_value(data)
    assert (math.isnan(decoded) and math.isnan(value)) if isinstance(value, float) else decoded == value
    assert type(decoded) is type(value)


@pytest.mark.parametrize(
    "data",
    [
        ["x", 1],
        ["i", 3],
        ["i", "9" * 5000],
        ["b", "true"],
        ["f", "1" * 100],
        ["d", [[["l", []], ["n", None]]]],  # an unhashable key
        ["S", [["l", []]]],
        ["l", "abc"],
        "plain",
        ["l", [["s", "x"]] * 300_000],
    ],
)
def test_decode_value_refuses_anything_else(data):
    with pytest.raises(ValueDecodeError):
        decode_value(data)


def test_decode_value_bounds_depth():
    data: list = ["n", None]
    for _ in range(150):
        data = ["l", [data]]
    with pytest.raises(ValueDecodeError, match="nested deeper"):
        decode_value(data)


@pytest.mark.parametrize(
    ("test", "names", "probes", "clean"),
    [
        ("assert f(3) == list(range(3))", {"f"}, ["f(3)", "list(range(3))"], [False, True]),
        ("assert f(4) == list(reversed(range(4)))", set(), ["f(4)", "list(reversed(range(4)))"], [False, True]),
        ("assert f(2) == [x * x for x in range(2)]", set(), ["f(2)", "[x * x for x in range(2)]"], [False, True]),
        ("assert f(5) == math.factorial(5)", set(), ["f(5)", "math.factorial(5)"], [False, True]),
        ("assert f(1) == sum((i for i in range(3)))", set(), ["f(1)", "sum((i for i in range(3)))"], [False, True]),
        # a name the candidate defines is never clean, even when it shadows a builtin
        ("assert range(3) == [0, 1, 2]", {"range"}, ["range(3)"], [False]),
        ("assert f(range(3)) == [0]", set(), ["f(range(3))"], [False]),
        ("assert [f(x) for x in range(2)] == [0, 1]", set(), ["[f(x) for x in range(2)]"], [False]),
        # what the evaluator here runs stays here
        ("assert f(3) == sorted([3, 1])", set(), ["f(3)"], [False]),
    ],
)
def test_expected_sides_that_call_builtins_are_clean_probes(test, names, probes, clean):
    """A probe that names only builtins and stdlib modules is computed apart from the candidate's code (a
    solution shadowing `range` in its module cannot change it), and cut whole (`range(3)` alone is no value)."""
    split = split_assert(test, names)
    assert list(split.probes) == probes and list(split.clean) == clean


def test_an_assertion_of_only_clean_probes_does_not_test_the_candidate():
    with pytest.raises(AssertSplitError, match="does not use the candidate's code"):
        split_assert("assert list(range(3)) == [0, 1, 2]")
