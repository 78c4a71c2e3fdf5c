"""Answer extraction: each extractor on a table of responses, the ordered dispatcher, numbers."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k2post_environments.answer_extraction import (
    clean_response,
    extract_answer,
    extract_answer_is,
    extract_boxed,
    extract_hash,
    extract_last_line,
    extract_last_number,
    parse_number,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{42}", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{\\frac{a}{b}}} done", "\\sqrt{\\frac{a}{b}}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{ 7 }", "7"),
        ("\\fbox{9}", "9"),
        ("\\boxed 5", "5"),
        ("\\boxed{1} and a broken \\boxed{2", "1"),
        ("\\boxed{42", None),
        ("\\boxed{}", None),
        ("no box here", None),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{ü}", "ü"),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("work\n#### 42", "42"),
        ("#### 1,000\n", "1,000"),
        ("#### 3\nmore\n#### 4", "4"),
        ("####", None),
        ("no hashes", None),
        ("#### **12**.", "12"),
    ],
)
def test_extract_hash(text, expected):
    assert extract_hash(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 42.", "42"),
        ("So the final answer is: 3.5.", "3.5"),
        ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}"),
        ("the answer is 7\nbut wait, the answer is 8", "8"),
        ("THE ANSWER IS ainomma.", "ainomma"),
        ("He answered yes.", None),
        ("I don't know.", None),
    ],
)
def test_extract_answer_is(text, expected):
    assert extract_answer_is(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 + 4 = 7", "7"),
        ("it costs 1,234 dollars", "1234"),
        ("-5 degrees", "-5"),
        ("x = 2.50.", "2.50"),
        ("ratio 3/4", "3/4"),
        ("minus − 2 no, −3", "-3"),
        ("４２", "42"),
        ("no digits", None),
    ],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("thinking\nainomma", "ainomma"),
        ("work\n\nAnswer: 12.\n\n", "12"),
        ("**Final answer:** blue", "blue"),
        ("`x`", "x"),
        ("   \n  ", None),
        ("", None),
    ],
)
def test_extract_last_line(text, expected):
    assert extract_last_line(text) == expected


@pytest.mark.parametrize(
    "text, order, value, method",
    [
        ("\\boxed{3} the answer is 4", ["boxed", "answer_is"], "3", "boxed"),
        ("\\boxed{3} the answer is 4", ["answer_is", "boxed"], "4", "answer_is"),
        ("just 5", ["boxed", "hash", "last_number"], "5", "last_number"),
        ("nothing", ["boxed", "last_number"], None, None),
        ("<think>\\boxed{1}</think> \\boxed{2}", ["boxed"], "2", "boxed"),
        ("<think>\\boxed{1}</think> no answer", ["boxed"], None, None),
        ("\\boxed{6}<|im_end|>", ["boxed"], "6", "boxed"),
        ("7<|tool_call_begin|>", ["last_number"], "7", "last_number"),
    ],
)
def test_extract_answer_order(text, order, value, method):
    found = extract_answer(text, order)
    assert (found.value, found.method) == (value, method)


def test_extract_answer_reads_only_the_tail():
    text = "\\boxed{1}" + " filler" * 1000
    assert extract_answer(text, ["boxed"], tail_chars=100).value is None
    assert extract_answer(text, ["boxed"], tail_chars=10_000).value == "1"
    assert len(clean_response("x" * 10_000, 2000)) == 2000


@pytest.mark.parametrize(
    "text",
    ["x" * 1_000_000, "\\boxed{" * 50_000, "{" * 100_000 + "}", "####" * 10_000, "answer is " * 10_000, "\x00\ud7ff"],
)
def test_extractors_survive_junk(text):
    found = extract_answer(text, ["boxed", "hash", "answer_is", "last_number", "last_line"])
    assert found.value is None or isinstance(found.value, str)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", Fraction(42)),
        ("-3/4", Fraction(-3, 4)),
        ("1,234.5", Fraction(12345, 10)),
        ("$7$", Fraction(7)),
        ("\\frac{1}{2}", Fraction(1, 2)),
        ("−3", Fraction(-3)),
        ("\\text{12}", Fraction(12)),
        (".5", Fraction(1, 2)),
        ("1/0", None),
        ("x", None),
        ("4 2", None),
        ("", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("\\boxed{}#answer is:0123456789.,-−/ \n$⁄４")), max_size=120))
def test_extract_answer_never_raises_property(text):
    found = extract_answer(text, ["boxed", "hash", "answer_is", "last_number", "last_line"])
    assert (found.value is None) == (found.method is None)
    if found.value is not None:
        assert found.value.strip()
        assert parse_number(found.value) is None or isinstance(parse_number(found.value), Fraction)


@pytest.mark.parametrize(
    "text,boxes",
    [
        ("\\boxed{1} and \\boxed{2}", ["1", "2"]),
        ("\\boxed{\\frac{1}{2}} \\fbox{3}", ["\\frac{1}{2}", "3"]),
        ("\\boxed{} \\boxed{ 4 } \\boxed{", ["4"]),
        ("no box", []),
    ],
)
def test_boxed_answers_lists_every_box(text, boxes):
    from k2post_environments.answer_extraction import boxed_answers

    assert boxed_answers(text) == boxes
