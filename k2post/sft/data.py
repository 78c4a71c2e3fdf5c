"""Chat rows -> training examples: load the dataset, check each row, render it, split it.

The input is an HF dataset saved with `save_to_disk` (what `k2post synth` writes) or JSONL files, one row
per dialogue (k2post/sft/sources.py reads them; `data.columns` maps other column names to these):

    id        str   unique row id (also picks the held-out split, by hash); derived from the content if absent
    messages  list  OpenAI/TRL-style chat dicts, or JSON text of them: role system|user|assistant|tool, content,
                    optional tool_calls [{id, type: function, function: {name, arguments}}],
                    tool_call_id (tool messages), reasoning_content (assistant thinking)
                    or ShareGPT turns {from, value} (converted: k2post.sft.sources.sharegpt_messages)
    tools     list  OpenAI tool entries {type: function, function: {name, description, parameters}} (or JSON text;
                    a bare {name, description, parameters} is wrapped)
    metadata, domain, verdict   carried through; `domain` is counted in the report

Each row is rendered with the K2 template the tokenizer declares (`k2post.chat.template.render_ids`, instruct or
thinking): the loss mask is 1 on every assistant body (content, thinking, tool-call tokens) and its closing
`<|im_end|>`, 0 on headers (and the thinking header's `<think>`) and on history messages whose reasoning the thinking
template hides; the row's final assistant message is trained as the model writes it (its reasoning visible).
A row that fails (bad JSON, schema violation, dialogue the template rejects, no assistant
token, longer than `max_seq_len` - rows are never truncated) is a `BadRow`
`row <index> (id <id>): <reason>`; `bad_rows: skip` drops and lists it, `bad_rows: error`
raises `BadRowError` with that line.

    data = load_sft_data(cfg.data, tokenizer)
    data.train, data.eval      # lists of packing.Example
    data.report.to_json()      # counts, tokens, domains, every bad row
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k2post.chat.template import assign_tool_call_ids, chat_format, render_ids, special_token_ids, validate_dialogue
from k2post.chat.types import Message, ToolSpec, dialogue_from_openai
from k2post.envs.splits import hash_bucket
from k2post.sft.config import SFTDataConfig
from k2post.sft.packing import Example
from k2post.sft.sources import PROBLEM_KEY, SFTDataError, is_sharegpt, open_dataset, openai_tool, sharegpt_messages

logger = logging.getLogger(__name__)

__all__ = ["BadRowError", "SFTData", "SFTDataError", "load_sft_data", "open_dataset", "row_example", "row_examples"]
MAX_LISTED_BAD_ROWS = 1000  # data_report.json lists at most this many (all are counted)


class BadRowError(SFTDataError):
    """A bad row with `bad_rows: error`; the message is the row's report line."""


class RowError(ValueError):
    """Why one row cannot become an example (internal: turned into a BadRow)."""


@dataclass(frozen=True)
class BadRow:
    """A row that was not used, and why."""

    index: int
    id: str | None
    reason: str

    def __str__(self) -> str:
        return f"row {self.index} (id {self.id if self.id is not None else '?'}): {self.reason}"


# --------------------------------------------------------------------------- row schema


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RowFunction(_Schema):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class RowToolCall(_Schema):
    id: str = ""
    type: Literal["function"] = "function"
    function: RowFunction


class RowMessage(_Schema):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[RowToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    name: str | None = None  # K2 heads a message with its name (a tool result: the function's) instead of the role


class RowToolFunction(_Schema):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class RowTool(_Schema):
    type: Literal["function"] = "function"
    function: RowToolFunction


def _first_error(err: ValidationError, prefix: str) -> str:
    """One line for a pydantic error: `prefix[3].role: Input should be ...` (+N more)."""
    errors = err.errors(include_url=False)
    loc = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in errors[0]["loc"])
    message = errors[0]["msg"].removeprefix("Value error, ")
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{prefix}{loc}: {message}{more}"


def _failing_message(messages: list[dict[str, Any]]) -> int:
    """Index of the first message that `dialogue_from_openai` rejects (only called after it failed)."""
    for stop in range(1, len(messages) + 1):
        try:
            dialogue_from_openai(messages[:stop])
        except (ValidationError, ValueError, KeyError):
            return stop - 1
    return len(messages) - 1


def _json_list(row: dict[str, Any], column: str) -> list[Any]:
    """The list in `row[column]`: a list of dicts, or JSON text of one (an absent/None tools column is [])."""
    raw = row.get(column)
    if raw is None and column == "tools":
        return []
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str):
        raise RowError(f"{column}: expected a list of dicts or JSON text of one, got {type(raw).__name__}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise RowError(f"{column}: invalid JSON ({err})") from None
    if not isinstance(value, list):
        raise RowError(f"{column}: expected a JSON list, got {type(value).__name__}")
    return value


def _validated(items: list[Any], schema: type[_Schema], column: str) -> list[dict[str, Any]]:
    """Each item checked against `schema`; returned as plain dicts without unset fields."""
    out = []
    for position, item in enumerate(items):
        try:
            out.append(schema.model_validate(item).model_dump(exclude_none=True))
        except ValidationError as err:
            raise RowError(_first_error(err, f"{column}[{position}]")) from None
    return out


def _conversion_error(messages: list[dict[str, Any]], err: Exception) -> str:
    """`messages[i]: why` for a dialogue that `dialogue_from_openai` rejected."""
    where = f"messages[{_failing_message(messages)}]"
    if isinstance(err, ValidationError):
        return _first_error(err, where)
    return f"{where}: {type(err).__name__}: {err}"


def row_dialogue(row: dict[str, Any], tool_call_ids: str) -> tuple[list[Message], list[ToolSpec]]:
    """The row's messages and tools, checked against the schema and the template's dialogue rules."""
    try:
        return _row_dialogue(row, tool_call_ids)
    except RecursionError:
        raise RowError("nested too deeply (deeper than Python can handle)") from None


def _row_dialogue(row: dict[str, Any], tool_call_ids: str) -> tuple[list[Message], list[ToolSpec]]:
    items = _json_list(row, "messages")
    if is_sharegpt(items):
        try:
            items = sharegpt_messages(items)
        except ValueError as err:
            raise RowError(str(err)) from None
    messages = _validated(items, RowMessage, "messages")
    raw_tools = [openai_tool(tool) for tool in _json_list(row, "tools")]
    tools = [ToolSpec.from_openai(tool) for tool in _validated(raw_tools, RowTool, "tools")]
    if not messages:
        raise RowError("messages: empty dialogue")
    try:
        dialogue = dialogue_from_openai(messages)  # e.g. bad call-argument JSON, tool message without tool_call_id
    except (ValueError, KeyError) as err:  # ValidationError and JSONDecodeError are ValueErrors
        raise RowError(_conversion_error(messages, err)) from None
    try:
        if tool_call_ids == "renumber":
            dialogue = assign_tool_call_ids(dialogue)
        validate_dialogue(dialogue, require_k2_ids=True)
    except ValueError as err:
        hint = " (set data.tool_call_ids: renumber to rewrite ids)" if "should be" in str(err) else ""
        raise RowError(f"template: {err}{hint}") from None
    return dialogue, tools


def exchange_ends(messages: Sequence[Message], chat_format: str = "thinking") -> list[int]:
    """Where to cut a dialogue so each reasoning is trained while visible (K2-Thinking hides the reasoning of every
    assistant message up to the last one without tool calls): one past every such plain assistant message that ends
    an exchange with non-empty reasoning and is not the last message, then len(messages). The instruct format renders
    no reasoning: no cuts."""
    ends, pending = [], False
    if chat_format != "thinking":
        return [len(messages)]
    for index, message in enumerate(messages):
        pending = pending or (message.role == "assistant" and bool(message.reasoning))
        if message.role == "assistant" and not message.tool_calls and pending and index + 1 < len(messages):
            ends.append(index + 1)
            pending = False
    return [*ends, len(messages)]


def text_example(row: dict[str, Any], index: int, tokenizer: Any, cfg: SFTDataConfig) -> Example:
    """A plain-text row (`text`, no `messages`): its tokens + end of text, every token trained. The text is data:
    a special-token string in it is tokenized as plain text (`split_special_tokens=True`), never as structure."""
    text = row.get("text")
    if not isinstance(text, str) or not text.strip():
        raise RowError(f"text: expected a non-empty string, got {str(text)[:60]!r}")
    ids = [*tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True), int(tokenizer.eos_token_id)]
    if len(ids) > cfg.max_seq_len:
        raise RowError(f"{len(ids)} tokens > data.max_seq_len {cfg.max_seq_len} (rows are never truncated)")
    return Example(tuple(ids), (1,) * len(ids), index, str(row["id"]))


def row_examples(row: dict[str, Any], index: int, tokenizer: Any, cfg: SFTDataConfig) -> list[Example]:
    """The row's examples: one, or with reasoning_history: split, one per exchange whose reasoning a later user
    message hides (ids `ID`, `ID#x1`, ...; the last is the whole dialogue). A text row is one example."""
    if row.get("messages") is None and row.get("text") is not None:
        return [text_example(row, index, tokenizer, cfg)]
    dialogue, tools = row_dialogue(row, cfg.tool_call_ids)
    ends = exchange_ends(dialogue, chat_format(tokenizer)) if cfg.reasoning_history == "split" else [len(dialogue)]
    examples = [_example(dialogue[:end], tools, index, str(row["id"]), tokenizer, cfg) for end in ends]
    if len(examples) > 1:
        examples = [replace(e, id=f"{e.id}#x{k}") for k, e in enumerate(examples[:-1])] + examples[-1:]
    return examples


def row_example(row: dict[str, Any], index: int, tokenizer: Any, cfg: SFTDataConfig) -> Example:
    """Render one row into a single `Example` (the whole dialogue); RowError says why it cannot be used."""
    dialogue, tools = row_dialogue(row, cfg.tool_call_ids)
    return _example(dialogue, tools, index, str(row["id"]), tokenizer, cfg)


def _example(
    dialogue: list[Message], tools: list[ToolSpec], index: int, row_id: str, tokenizer: Any, cfg: SFTDataConfig
) -> Example:
    try:
        rendered = render_ids(tokenizer, dialogue, tools=tools, last_turn_open=True)
    except ValueError as err:
        raise RowError(f"template: {err}") from None
    if not any(rendered.assistant_mask):
        raise RowError("no assistant tokens to train on (the dialogue has no assistant message)")
    if len(rendered.input_ids) > cfg.max_seq_len:
        raise RowError(
            f"{len(rendered.input_ids)} tokens > data.max_seq_len {cfg.max_seq_len} (rows are never truncated: "
            "raise max_seq_len or shorten the dialogue)"
        )
    return Example(tuple(rendered.input_ids), tuple(rendered.assistant_mask), index, row_id)


# --------------------------------------------------------------------------- split + report


def is_eval_id(row_id: str, fraction: float, salt: str) -> bool:
    """Whether a row id falls in the held-out split (`hash_bucket` of salt + id; independent of row order)."""
    return fraction > 0 and hash_bucket(f"{salt}\0{row_id}") < fraction


@dataclass
class DataReport:
    """What loading the dataset found: counts, tokens, domains and every bad row."""

    path: str
    rows: int = 0
    train_examples: int = 0
    eval_examples: int = 0
    train_tokens: int = 0
    train_label_tokens: int = 0
    eval_tokens: int = 0
    domains: Counter = field(default_factory=Counter)
    bad_rows: list[BadRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-able summary (bad rows listed up to MAX_LISTED_BAD_ROWS)."""
        data = {k: v for k, v in self.__dict__.items() if k not in ("bad_rows", "domains")}
        data["domains"] = dict(sorted(self.domains.items()))
        data["num_bad_rows"] = len(self.bad_rows)
        data["bad_rows"] = [str(bad) for bad in self.bad_rows[:MAX_LISTED_BAD_ROWS]]
        return data


@dataclass
class SFTData:
    """Train and held-out examples plus the loading report."""

    train: list[Example]
    eval: list[Example]
    report: DataReport


# --------------------------------------------------------------------------- loading


def _row_id(row: dict[str, Any], seen: dict[str, int]) -> str:
    """The row's id, checked: a non-empty string not used by an earlier row (a row that could not be read at all
    fails here with its reason)."""
    if PROBLEM_KEY in row:
        raise RowError(row[PROBLEM_KEY])
    row_id = row.get("id")
    if not isinstance(row_id, str) or not row_id:
        raise RowError(f"id: expected a non-empty string, got {row_id!r}")
    if row_id in seen:
        raise RowError(f"duplicate id (first used by row {seen[row_id]})")
    return row_id


def _add(report: DataReport, data: SFTData, example: Example, row: dict[str, Any], cfg: SFTDataConfig) -> None:
    """File an example under train or eval (by its row's id: a split row's examples stay together) and count it."""
    report.domains[str(row.get("domain") or "?")] += 1
    if is_eval_id(str(row["id"]), cfg.eval_fraction, cfg.split_salt):
        data.eval.append(example)
        report.eval_examples += 1
        report.eval_tokens += len(example)
    else:
        data.train.append(example)
        report.train_examples += 1
        report.train_tokens += len(example)
        report.train_label_tokens += example.num_label_tokens


def _reject(report: DataReport, bad: BadRow, cfg: SFTDataConfig) -> None:
    """Record a bad row, or raise it when bad_rows is 'error'."""
    if cfg.bad_rows == "error":
        raise BadRowError(f"{bad} (data.bad_rows: error; set it to skip to drop such rows)")
    report.bad_rows.append(bad)


def load_sft_data(cfg: SFTDataConfig, tokenizer: Any) -> SFTData:
    """Read, check, render and split every row of the dataset at `cfg.path`."""
    special_token_ids(tokenizer)  # a tokenizer without the K2 tokens fails here, not on every row
    chat_format(tokenizer)  # so does one with a foreign chat template
    dataset = open_dataset(cfg.path, cfg.limit, cfg.columns)
    report = DataReport(path=str(cfg.path), rows=len(dataset))
    data, seen = SFTData([], [], report), {}
    for index, row in enumerate(dataset):
        row_id = row.get("id") if isinstance(row.get("id"), str) and row.get("id") else None
        try:
            row_id = _row_id(row, seen)
            seen[row_id] = index
            for example in row_examples(row, index, tokenizer, cfg):
                _add(report, data, example, row, cfg)
        except RowError as err:
            _reject(report, BadRow(index, row_id, str(err)), cfg)
        except RecursionError:  # JSON text or values deeper than Python can walk
            _reject(report, BadRow(index, row_id, "nested too deeply (deeper than Python can handle)"), cfg)
    _check_usable(report, data, cfg)
    return data


def _check_usable(report: DataReport, data: SFTData, cfg: SFTDataConfig) -> None:
    """Fail on too many bad rows or an empty train split; log the skipped rows."""
    if report.bad_rows:
        shown = "; ".join(str(bad) for bad in report.bad_rows[:3])
        logger.warning(
            "skipped %d of %d rows (listed in data_report.json): %s", len(report.bad_rows), report.rows, shown
        )
    if report.rows and len(report.bad_rows) / report.rows > cfg.max_bad_fraction:
        raise SFTDataError(
            f"{len(report.bad_rows)} of {report.rows} rows are bad (> data.max_bad_fraction {cfg.max_bad_fraction}); "
            f"first: {report.bad_rows[0]}"
        )
    if not data.train:
        raise SFTDataError(
            f"no train examples in {cfg.path!r} ({report.rows} rows, {len(report.bad_rows)} bad, "
            f"{report.eval_examples} held out): add rows or lower data.eval_fraction"
        )
    if cfg.eval_fraction > 0 and not data.eval:
        raise SFTDataError(
            f"data.eval_fraction {cfg.eval_fraction} held out no row of {report.rows}: raise it, add rows, "
            "or set eval_fraction: 0 and train.eval_every: 0"
        )
