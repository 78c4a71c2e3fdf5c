"""k2post/sft/sources.py: SFT data from JSONL files and HF datasets in the OpenAI / TRL conversational format
(messages as lists of dicts, optional tools, OpenAI call ids), a column mapping, ids derived from content."""

from __future__ import annotations

import json

import pytest

from data_helpers import write_dataset
from k2post.sft.config import SFTDataConfig
from k2post.sft.data import load_sft_data
from k2post.sft.sources import SFTDataError, derived_id, is_sharegpt, open_dataset, sharegpt_messages

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def trl_row(city: str, call_id: str = "call_abc123") -> dict:
    """A TRL/OpenAI conversational row: messages as dicts, arguments as a dict, an OpenAI call id, content parts."""
    return {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"Weather in {city}?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": city}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
            {"role": "assistant", "content": f"It is sunny in {city}."},
        ],
        "tools": [WEATHER_TOOL],
    }


def _config(path, **overrides) -> SFTDataConfig:
    return SFTDataConfig(path=str(path), eval_fraction=0.0, **overrides)


def _jsonl(path, rows) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def test_trl_jsonl_trains_with_k2_call_ids_and_derived_ids(tmp_path, sft_tokenizer):
    path = _jsonl(tmp_path / "chats.jsonl", [trl_row("Paris"), trl_row("Oslo", "call_zz")])
    data = load_sft_data(_config(path), sft_tokenizer)
    assert len(data.train) == 2 and data.report.to_json()["num_bad_rows"] == 0
    text = sft_tokenizer.decode(data.train[0].input_ids)
    assert "functions.get_weather:0" in text and "call_abc123" not in text and "Weather in Paris?" in text
    first = open_dataset(path)[0]
    assert data.train[0].id == derived_id(first["messages"], first["tools"]) and data.train[0].id.startswith("row-")
    explicit_nulls = trl_row("Paris")
    explicit_nulls["messages"][0]["name"] = None  # what an Arrow round trip adds: the same content, the same id
    assert open_dataset(_jsonl(tmp_path / "nulls.jsonl", [explicit_nulls]))[0]["id"] == data.train[0].id
    again = load_sft_data(_config(path), sft_tokenizer)
    assert [e.id for e in again.train] == [e.id for e in data.train]  # stable across runs


def test_hf_dataset_of_dict_lists_with_a_column_mapping(tmp_path, sft_tokenizer):
    """Arrow fills every struct field of every message (tool_calls: None on user turns, ...): nulls are dropped."""
    rows = []
    for i, city in enumerate(["Rome", "Lima", "Kyiv"]):
        messages = trl_row(city)["messages"]
        messages[0]["content"] = f"Weather in {city}?"  # one Arrow type per field: text, not parts, here
        rows.append({"uid": f"u{i}", "conversations": messages, "functions": [WEATHER_TOOL]})
    path = write_dataset(rows, tmp_path / "hf")
    mapping = {"id": "uid", "messages": "conversations", "tools": "functions"}
    data = load_sft_data(_config(path, columns=mapping), sft_tokenizer)
    assert [e.id for e in data.train] == ["u0", "u1", "u2"]
    with pytest.raises(SFTDataError, match=r"missing column\(s\) \['messages'\] .*map yours with data.columns"):
        load_sft_data(_config(path), sft_tokenizer)
    with pytest.raises(SFTDataError, match=r"data.columns: unknown key\(s\) \[.body.\]"):
        load_sft_data(_config(path, columns={"body": "conversations"}), sft_tokenizer)


def test_bad_jsonl_lines_are_bad_rows_naming_file_and_line(tmp_path, sft_tokenizer):
    path = _jsonl(tmp_path / "mixed.jsonl", [trl_row("Paris"), "{not json", "[1, 2]", {**trl_row("Oslo"), "id": 7}])
    data = load_sft_data(_config(path, max_bad_fraction=1.0), sft_tokenizer)
    bad = data.report.to_json()["bad_rows"]
    assert len(data.train) == 1 and len(bad) == 3
    assert bad[0].startswith(f"row 1 (id ?): {path}:2: invalid JSON")
    assert bad[1] == f"row 2 (id ?): {path}:3: expected a JSON object, got list"
    assert bad[2] == "row 3 (id ?): id: expected a non-empty string, got 7"


def test_a_directory_of_jsonl_files_is_read_in_name_order(tmp_path):
    (tmp_path / "d").mkdir()
    _jsonl(tmp_path / "d" / "b.jsonl", [trl_row("B")])
    _jsonl(tmp_path / "d" / "a.jsonl", [trl_row("A"), trl_row("A2")])
    rows = open_dataset(tmp_path / "d")
    assert [r["messages"][0]["content"] for r in rows] == ["Weather in A?", "Weather in A2?", "Weather in B?"]
    assert len(open_dataset(tmp_path / "d", limit=2)) == 2


def test_text_rows_train_on_every_token_and_mix_with_dialogues(tmp_path, sft_tokenizer):
    """Plain-text rows (k2post rephrase's output): the text + end of text, every token in the loss."""
    rows = [{"id": "doc#r1", "text": "Kalo was born in 1931. Kalo lives in Renvel."}, {"text": "No id here."}]
    data = load_sft_data(_config(_jsonl(tmp_path / "docs.jsonl", rows)), sft_tokenizer)
    first = data.train[0]
    assert [e.id for e in data.train][0] == "doc#r1" and data.train[1].id.startswith("row-")
    assert set(first.loss_mask) == {1} and first.input_ids[-1] == sft_tokenizer.eos_token_id
    assert sft_tokenizer.decode(first.input_ids[:-1]) == rows[0]["text"]
    mixed = [trl_row("Oslo"), {"id": "t", "text": "Short text."}, {"id": "bad", "text": ""}]
    data = load_sft_data(_config(_jsonl(tmp_path / "mixed.jsonl", mixed), max_bad_fraction=0.5), sft_tokenizer)
    assert len(data.train) == 2 and "text: expected a non-empty string" in str(data.report.bad_rows[0])


def sharegpt_row(city: str) -> dict:
    """The ShareGPT / LLaMA-Factory form of `trl_row(city)`: `conversations` of {from, value}, bare tool schemas."""
    call = json.dumps({"name": "get_weather", "arguments": {"city": city}})
    return {
        "conversations": [
            {"from": "human", "value": f"Weather in {city}?"},
            {"from": "function_call", "value": call},
            {"from": "observation", "value": "sunny"},
            {"from": "gpt", "value": f"It is sunny in {city}."},
        ],
        "tools": json.dumps([WEATHER_TOOL["function"]]),
    }


def test_sharegpt_rows_train_exactly_as_their_openai_form(tmp_path, sft_tokenizer):
    sharegpt = _jsonl(tmp_path / "sharegpt.jsonl", [{**sharegpt_row(c), "id": c} for c in ("Paris", "Oslo")])
    openai = _jsonl(tmp_path / "openai.jsonl", [{**trl_row(c), "id": c} for c in ("Paris", "Oslo")])
    got = load_sft_data(_config(sharegpt, columns={"messages": "conversations"}), sft_tokenizer)
    want = load_sft_data(_config(openai), sft_tokenizer)
    assert got.report.to_json()["num_bad_rows"] == 0 and len(got.train) == 2
    for mine, theirs in zip(got.train, want.train):
        assert list(mine.input_ids) == list(theirs.input_ids) and list(mine.loss_mask) == list(theirs.loss_mask)


CALL = json.dumps({"name": "f", "arguments": {"x": 1}})
TWO_CALLS = json.dumps([{"name": "f", "arguments": {}}, {"name": "g", "arguments": "{}"}])


def _call(name: str, index: int, arguments) -> dict:
    return {"id": f"functions.{name}:{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    "turns, messages",
    [
        (
            [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
            [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ],
        ),
        (  # a function_call after a gpt turn joins it; observations answer calls oldest first
            [
                {"from": "user", "value": "q"},
                {"from": "gpt", "value": "let me look"},
                {"from": "function_call", "value": TWO_CALLS},
                {"from": "observation", "value": "r1"},
                {"from": "tool", "value": "r2"},
                {"from": "function_call", "value": CALL},
                {"from": "observation", "value": "r3"},
                {"from": "assistant", "value": "done"},
            ],
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "let me look", "tool_calls": [_call("f", 0, {}), _call("g", 1, "{}")]},
                {"role": "tool", "tool_call_id": "functions.f:0", "content": "r1"},
                {"role": "tool", "tool_call_id": "functions.g:1", "content": "r2"},
                {"role": "assistant", "content": None, "tool_calls": [_call("f", 2, {"x": 1})]},
                {"role": "tool", "tool_call_id": "functions.f:2", "content": "r3"},
                {"role": "assistant", "content": "done"},
            ],
        ),
    ],
)
def test_sharegpt_turns_map_to_openai_messages(turns, messages):
    assert is_sharegpt(turns) and sharegpt_messages(turns) == messages
    assert not is_sharegpt(messages)


@pytest.mark.parametrize(
    "turns, error",
    [
        ([{"from": "bot", "value": "a"}], "messages[0].from: unknown ShareGPT role 'bot' (known: human, user, gpt"),
        ([{"from": "gpt", "value": None}], "messages[0].value: expected a string, got NoneType"),
        ([{"from": "gpt", "value": "a", "weight": 0}], "messages[0]: a ShareGPT turn is {from, value}, got ['from'"),
        ([{"from": "observation", "value": "r"}], "messages[0]: a 'observation' turn with no function_call waiting"),
        ([{"from": "function_call", "value": "f(1)"}], "messages[0].value: a function_call must be JSON {name,"),
        ([{"from": "function_call", "value": "[]"}], "messages[0].value: a function_call must be JSON {name,"),
    ],
)
def test_bad_sharegpt_turns_are_one_line_errors(turns, error):
    with pytest.raises(ValueError) as raised:
        sharegpt_messages(turns)
    assert str(raised.value).startswith(error), str(raised.value)


def test_a_bad_sharegpt_row_is_a_bad_row_naming_the_turn(tmp_path, sft_tokenizer):
    bad = sharegpt_row("Rome")
    bad["conversations"][2]["from"] = "function_response"
    path = _jsonl(tmp_path / "bad.jsonl", [{**sharegpt_row("Paris"), "id": "ok"}, {**bad, "id": "bad"}])
    data = load_sft_data(_config(path, columns={"messages": "conversations"}, max_bad_fraction=1.0), sft_tokenizer)
    (line,) = data.report.to_json()["bad_rows"]
    assert line.startswith("row 1 (id bad): messages[2].from: unknown ShareGPT role 'function_response'")
