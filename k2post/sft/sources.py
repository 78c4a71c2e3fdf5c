"""Where chat rows come from: an HF dataset saved on disk, or JSONL files, in k2post's own columns or the
OpenAI / TRL conversational format, with a column mapping. Used by SFT (`data.path`) and RL's PTX data.

    rows = open_dataset("runs/synth/dataset")                                # k2post synth's output
    rows = open_dataset("chats.jsonl")                                       # {"messages": [...], "tools": [...]}
    rows = open_dataset("hf_dir", columns={"messages": "conversations"})    # the dataset's names for ours
    rows = open_dataset("runs/rephrase/dataset")                             # text rows: {"id", "text"}

Every row comes back as a dict with k2post's column names (`id`, `messages`, `tools`, `text`, `domain`, ...):
- a row is a dialogue (`messages`) or plain text (`text`, no `messages`: trained on every token, e.g. the
  rephrased knowledge documents of `k2post rephrase`);
- `messages` / `tools` may be JSON text (what `k2post synth` writes) or lists of dicts (TRL, OpenAI);
  keys whose value is null are dropped (Arrow fills every struct field in), and OpenAI content parts
  (`[{"type": "text", "text": ...}]`) are joined into one string;
- ShareGPT turns (`{"from": "human", "value": "..."}`) are converted to OpenAI chat dicts (`sharegpt_messages`:
  human/user -> user, gpt/assistant -> assistant, system -> system, function_call -> an assistant tool call,
  observation/tool -> the tool result of the oldest unanswered call), and bare function schemas in `tools`
  (`{name, description, parameters}`) are wrapped as OpenAI tool entries;
- a row without an id gets one derived from its content (`row-<16 hex of sha256>`), stable across runs;
- a JSONL line that is not a JSON object is kept as a row that fails with `file:line: why`.

Problems with the source as a whole (not found, not a dataset, a DatasetDict, a mapped column missing) raise
`SFTDataError` with one line naming `data.path` / `data.columns`.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from pathlib import Path
from typing import Any

OUR_COLUMNS = ("id", "messages", "tools", "text", "domain", "metadata", "verdict")
PROBLEM_KEY = "_row_problem"  # set on a row that could not be read (bad JSONL line); the row then fails


class SFTDataError(ValueError):
    """The dataset as a whole cannot be used (not a dataset, missing column, too many bad rows, empty split)."""


def open_dataset(path: str | Path, limit: int | None = None, columns: dict[str, str] | None = None) -> list[dict]:
    """The first `limit` rows at `path` (HF dataset dir, JSONL file, or dir of JSONL files) in our columns."""
    path, columns = Path(path), dict(columns or {})
    if path.is_file():
        raw = _jsonl_rows([path], limit)
    elif path.is_dir() and not (path / "dataset_info.json").exists() and sorted(path.glob("*.jsonl")):
        raw = _jsonl_rows(sorted(path.glob("*.jsonl")), limit)
    elif path.is_dir():
        raw = _hf_rows(path, limit)
    else:
        raise SFTDataError(
            f"data.path {str(path)!r} is not a file or directory (expected an HF dataset saved with save_to_disk, "
            "a JSONL file, or a directory of JSONL files)"
        )
    _check_columns(path, raw, columns)
    return [canonical_row(row, columns) for row in raw]


def _jsonl_rows(files: list[Path], limit: int | None) -> list[dict]:
    """Rows of JSONL files in order; a line that is not a JSON object becomes a row carrying its problem."""
    rows: list[dict] = []
    for file in files:
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if limit is not None and len(rows) >= limit:
                    return rows
                if line.strip():
                    rows.append(_json_line(line, f"{file}:{number}"))
    return rows


def _json_line(line: str, where: str) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as err:
        return {PROBLEM_KEY: f"{where}: invalid JSON ({err.msg}, column {err.colno})"}
    except RecursionError:
        return {PROBLEM_KEY: f"{where}: JSON nested too deeply"}
    if not isinstance(value, dict):
        return {PROBLEM_KEY: f"{where}: expected a JSON object, got {type(value).__name__}"}
    return value


def _hf_rows(path: Path, limit: int | None) -> list[dict]:
    from datasets import Dataset, load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise SFTDataError(f"data.path {str(path)!r}: not an HF dataset saved with save_to_disk ({err})") from None
    if not isinstance(dataset, Dataset):
        raise SFTDataError(f"data.path {str(path)!r} holds splits {list(dataset)}: point it at one split's directory")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset.to_list()


def _check_columns(path: Path, rows: list[dict], columns: dict[str, str]) -> None:
    """The mapped columns, and `messages` or `text` (under its mapped name), exist in the data."""
    unknown = sorted(set(columns) - set(OUR_COLUMNS))
    if unknown:
        raise SFTDataError(f"data.columns: unknown key(s) {unknown}; map these of ours: {list(OUR_COLUMNS)}")
    present = {key for row in rows[:100] if PROBLEM_KEY not in row for key in row}
    body = (
        "text"
        if columns.get("text", "text") in present and columns.get("messages", "messages") not in present
        else "messages"
    )
    wanted = {ours: columns.get(ours, ours) for ours in (body, *columns)}
    missing = sorted({theirs for theirs in wanted.values() if theirs not in present})
    if rows and present and missing:
        hint = (
            ""
            if columns
            else " (rows need `messages` or `text`; map yours with data.columns, e.g. {messages: conversations})"
        )
        raise SFTDataError(f"data.path {str(path)!r}: missing column(s) {missing} (has {sorted(present)}){hint}")


def canonical_row(row: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """The row under our column names, messages/tools cleaned, an id derived when it has none (a row nested
    too deeply to clean becomes a bad row saying so)."""
    if PROBLEM_KEY in row:
        return dict(row)
    try:
        return _canonical(row, columns)
    except RecursionError:
        return {PROBLEM_KEY: f"row {row.get(columns.get('id', 'id'))!r}: nested too deeply"}


def _canonical(row: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    out = {ours: row.get(columns.get(ours, ours)) for ours in OUR_COLUMNS}
    for key in ("messages", "tools"):
        if isinstance(out[key], list):
            out[key] = [_clean(item) for item in out[key]]
    if out["id"] is None or out["id"] == "":
        out["id"] = (
            derived_id(out["messages"], out["tools"])
            if out["messages"] is not None or out["text"] is None
            else derived_id(out["text"], None)
        )
    return out


def _clean(value: Any) -> Any:
    """Null-valued keys dropped (recursively); OpenAI text content parts joined into one string."""
    if isinstance(value, dict):
        cleaned = {key: _clean(item) for key, item in value.items() if item is not None}
        if isinstance(cleaned.get("content"), list) and all(_is_text_part(p) for p in cleaned["content"]):
            cleaned["content"] = "".join(part["text"] for part in cleaned["content"])
        return cleaned
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def derived_id(messages: Any, tools: Any) -> str:
    """`row-<16 hex>`: sha256 of the row's messages and tools as canonical JSON (the same row, the same id)."""
    text = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False, default=str)
    return "row-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
}


def is_sharegpt(messages: list[Any]) -> bool:
    """Whether a message list is in ShareGPT form: some turn has `from` and no `role`."""
    return any(isinstance(m, dict) and "from" in m and "role" not in m for m in messages)


def sharegpt_messages(turns: list[Any]) -> list[dict[str, Any]]:
    """OpenAI chat dicts of ShareGPT turns (SHAREGPT_ROLES). A `function_call` value is JSON of one call
    `{name, arguments}` or a list of them: it becomes the tool calls of an assistant message (of the assistant
    turn just before it, when that one has none), with K2 call ids `functions.NAME:IDX`; each `observation` /
    `tool` turn answers the oldest unanswered call. ValueError `messages[i]...: why` otherwise."""
    out: list[dict[str, Any]] = []
    pending: deque[str] = deque()
    for position, turn in enumerate(turns):
        kind, value = _sharegpt_turn(turn, position)
        if kind == "function_call":
            calls = _sharegpt_calls(value, position, sum(len(m.get("tool_calls", [])) for m in out))
            pending.extend(call["id"] for call in calls)
            last = out[-1] if out else {}
            if last.get("role") == "assistant" and "tool_calls" not in last:
                last["tool_calls"] = calls
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": calls})
        elif SHAREGPT_ROLES[kind] == "tool":
            if not pending:
                raise ValueError(f"messages[{position}]: a {kind!r} turn with no function_call waiting for it")
            out.append({"role": "tool", "tool_call_id": pending.popleft(), "content": value})
        else:
            out.append({"role": SHAREGPT_ROLES[kind], "content": value})
    return out


def _sharegpt_turn(turn: Any, position: int) -> tuple[str, str]:
    """(from, value) of one ShareGPT turn, checked."""
    where = f"messages[{position}]"
    if not isinstance(turn, dict) or set(turn) - {"from", "value"} or "from" not in turn:
        got = sorted(turn) if isinstance(turn, dict) else type(turn).__name__
        raise ValueError(f"{where}: a ShareGPT turn is {{from, value}}, got {got}")
    if turn["from"] not in SHAREGPT_ROLES:
        raise ValueError(f"{where}.from: unknown ShareGPT role {turn['from']!r} (known: {', '.join(SHAREGPT_ROLES)})")
    if not isinstance(turn.get("value"), str):
        raise ValueError(f"{where}.value: expected a string, got {type(turn.get('value')).__name__}")
    return turn["from"], turn["value"]


def _sharegpt_calls(value: str, position: int, first: int) -> list[dict[str, Any]]:
    """OpenAI tool calls of a `function_call` value, numbered from `first` over the dialogue."""
    where = f"messages[{position}].value"
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: a function_call must be JSON {{name, arguments}} ({err.msg})") from None
    calls = parsed if isinstance(parsed, list) else [parsed]
    if not calls or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        raise ValueError(f"{where}: a function_call must be JSON {{name, arguments}} or a list of them")
    return [
        {
            "id": f"functions.{call['name']}:{first + index}",
            "type": "function",
            "function": {"name": call["name"], "arguments": call.get("arguments", {})},
        }
        for index, call in enumerate(calls)
    ]


def openai_tool(tool: Any) -> Any:
    """An OpenAI tool entry: a bare function schema `{name, description, parameters}` (ShareGPT / LLaMA-Factory
    `tools`) wrapped as `{type: function, function: ...}`; anything else as it is."""
    if isinstance(tool, dict) and "name" in tool and "function" not in tool and "type" not in tool:
        return {"type": "function", "function": tool}
    return tool
