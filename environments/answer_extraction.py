"""Pure functions that pull a final answer out of a model response.

Each extractor takes the response text and returns the answer string or None:

    extract_boxed("so \\boxed{\\frac{1}{2}}")        -> "\\frac{1}{2}"   (nested braces, last box)
    extract_hash("... #### 42")                       -> "42"            (GSM8K style)
    extract_answer_is("The answer is 42.")            -> "42"
    extract_last_number("3 + 4 = 7")                  -> "7"
    extract_last_line("work\\nAnswer: ainomma")       -> "ainomma"

`extract_answer(text, order)` tries the methods in `order` and reports which one matched, so
an environment can reward the preferred format (the first method of the order). Only the last
`tail_chars` characters are read (after dropping a `<think>…</think>` block and special
tokens like `<|im_end|>`), which keeps extraction cheap on megabyte-long responses.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

ExtractionMethod = Literal["boxed", "hash", "answer_is", "last_number", "last_line"]
DEFAULT_TAIL_CHARS = 2000

SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,64}\|>")
"""Special chat tokens such as `<|im_end|>` or `<|tool_call_begin|>`."""
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*")
_HASH = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?\s*(.+?)(?=\.\s|\.?$|\n)",
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")
_LABEL = re.compile(r"^(?:\*\*|__)?\s*(?:final\s+answer|answer)\s*(?:\*\*|__)?\s*[:=]\s*(?:\*\*|__)?", re.IGNORECASE)
_WRAPPERS = ("**", "__", "`", "$")


@dataclass(frozen=True)
class Extraction:
    """An extracted answer and the method that found it (both None when nothing was found)."""

    value: str | None
    method: ExtractionMethod | None


def clean_response(text: str, tail_chars: int = DEFAULT_TAIL_CHARS) -> str:
    """The part of a response answers are read from: after `</think>`, no special tokens, the tail."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    text = text[-(tail_chars * 2) :] if tail_chars > 0 else text
    text = SPECIAL_TOKEN.sub(" ", text)
    return text[-tail_chars:] if tail_chars > 0 else text


def _braced_content(text: str, open_index: int) -> str | None:
    """Content of the brace group opening at `open_index` (nested braces kept), None if unbalanced."""
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{" and text[index - 1 : index] != "\\":
            depth += 1
        elif char == "}" and text[index - 1 : index] != "\\":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : index]
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last balanced `\\boxed{...}` / `\\fbox{...}` (or `\\boxed 5`); None if none."""
    for match in reversed(list(_BOX_START.finditer(text))):
        end = match.end()
        if end < len(text) and text[end] == "{":
            content = _braced_content(text, end)
        else:
            bare = re.match(r"[^\s${}]+", text[end:]) if match.group(0)[-1:].isspace() else None
            content = bare.group(0) if bare else None
        if content is not None and content.strip():
            return content.strip()
    return None


def boxed_answers(text: str) -> list[str]:
    """Contents of every balanced, non-empty `\\boxed{...}` / `\\fbox{...}` in `text`, in order."""
    found = []
    for match in _BOX_START.finditer(text):
        end = match.end()
        content = _braced_content(text, end) if end < len(text) and text[end] == "{" else None
        if content is not None and content.strip():
            found.append(content.strip())
    return found


def _strip_answer(value: str) -> str | None:
    """Trim whitespace, markdown/math wrappers and a trailing period; None when nothing is left."""
    value = value.strip()
    changed = True
    while changed and value:
        changed = False
        for wrapper in _WRAPPERS:
            if len(value) > 2 * len(wrapper) and value.startswith(wrapper) and value.endswith(wrapper):
                value, changed = value[len(wrapper) : -len(wrapper)].strip(), True
        if len(value) > 1 and value.endswith((".", "。")):
            value, changed = value[:-1].rstrip(), True
    return value or None


def extract_hash(text: str) -> str | None:
    """What follows the last `####` on its line (GSM8K format); None if none."""
    matches = _HASH.findall(text)
    return _strip_answer(matches[-1]) if matches else None


def extract_answer_is(text: str) -> str | None:
    """The phrase after the last "answer is" / "answer:" up to the end of the sentence or line."""
    matches = _ANSWER_IS.findall(text)
    return _strip_answer(matches[-1]) if matches else None


def extract_last_number(text: str) -> str | None:
    """The last number (integer, decimal, 1,234 thousands, a/b fraction), commas removed."""
    matches = _NUMBER.findall(unicodedata.normalize("NFKC", text))
    if not matches:
        return None
    return re.sub(r"\s+", "", matches[-1]).replace(",", "").replace("−", "-")


def extract_last_line(text: str) -> str | None:
    """The last non-empty line, without an "Answer:" label, markdown wrappers or trailing period."""
    for line in reversed(text.splitlines()):
        line = _LABEL.sub("", line.strip()).strip()
        if line:
            return _strip_answer(line)
    return None


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each unescaped `{` -> index of its matching `}` (one pass; unbalanced ones left out)."""
    pairs, stack = {}, []
    for index, char in enumerate(text):
        escaped = text[index - 1 : index] == "\\"
        if char == "{" and not escaped:
            stack.append(index)
        elif char == "}" and not escaped and stack:
            pairs[stack.pop()] = index
    return pairs


def marked_answers(text: str) -> list[str]:
    """Every answer `text` marks as final, in order: each balanced `\\boxed{}`/`\\fbox{}`, each `####` line,
    each `####` or "the answer is ..." phrase that is a number (a box inside one counts once). A reply that marks
    two different answers hedges."""
    pairs = _closing_braces(text)
    boxed = []
    for match in _BOX_START.finditer(text):
        close = pairs.get(match.end()) if text[match.end() : match.end() + 1] == "{" else None
        content = text[match.end() + 1 : close].strip() if close is not None else ""
        if content:
            boxed.append(content)
    phrases = [_strip_answer(value) for value in _HASH.findall(text) + _ANSWER_IS.findall(text)]
    unboxed = [extract_boxed(value) or value for value in phrases if value]
    return boxed + [value for value in unboxed if value not in boxed and parse_number(value) is not None]


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "boxed": extract_boxed,
    "hash": extract_hash,
    "answer_is": extract_answer_is,
    "last_number": extract_last_number,
    "last_line": extract_last_line,
}


def extract_answer(text: str, order: Sequence[ExtractionMethod], tail_chars: int = DEFAULT_TAIL_CHARS) -> Extraction:
    """The first answer found by the methods in `order` (on the cleaned tail of `text`)."""
    tail = clean_response(text, tail_chars)
    for method in order:
        value = EXTRACTORS[method](tail)
        if value is not None:
            return Extraction(value=value, method=method)
    return Extraction(value=None, method=None)


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact number when it is just one (int, decimal, 1,234, a/b, $…$); else None."""
    value = unicodedata.normalize("NFKC", text).replace("−", "-").strip()
    value = re.sub(r"^\$+|\$+$|^\\text\{(.*)\}$", r"\1", value).strip()
    value = re.sub(r"^\\[dt]?frac\{(-?\d+)\}\{(\d+)\}$", r"\1/\2", value)
    if not re.fullmatch(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+", value):
        return None
    try:
        return Fraction(value.replace(",", "").replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None
