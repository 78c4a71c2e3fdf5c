"""The generated-corpus K2 BPE tokenizer: special ids, determinism, save/load, byte coverage."""

from __future__ import annotations

import unicodedata

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from k2post.chat.template import CHAT_TEMPLATES, chat_format, render_text
from k2post.chat.tokens import EOS, IM_END, PAD, SPECIAL_TOKENS
from k2post.chat.types import Message, ToolCall, ToolSpec
from k2post.models.tokenizer import build_corpus, build_tokenizer, save_tokenizer

SAMPLES = [
    "What is 17 + 25? The answer is 42.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "  leading spaces, tabs\tand\nnewlines  ",
    "naïve café 東京 😀 привет",
    "<|im_user|>user<|im_middle|>hi<|im_end|>",
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer(vocab_size=4096, seed=0)


@pytest.fixture(scope="module")
def saved_dir(tok: PreTrainedTokenizerFast, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tokenizer(tok, tmp_path_factory.mktemp("tokenizer") / "k2")


def test_vocab_size_and_special_tokens(tok: PreTrainedTokenizerFast) -> None:
    assert len(tok) == 4096
    assert tok.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS)))) == list(SPECIAL_TOKENS)
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == (PAD, IM_END, None)
    assert (tok.pad_token_id, tok.eos_token_id) == (
        SPECIAL_TOKENS.index(PAD),
        SPECIAL_TOKENS.index(IM_END),
    )
    assert tok.model_max_length == 4096
    assert tok.chat_template == CHAT_TEMPLATES["instruct"] and chat_format(tok) == "instruct"
    assert set(SPECIAL_TOKENS) <= set(tok.all_special_tokens)


@pytest.mark.parametrize("token", SPECIAL_TOKENS)
def test_special_token_is_one_id(tok: PreTrainedTokenizerFast, token: str) -> None:
    assert tok(token, add_special_tokens=False).input_ids == [SPECIAL_TOKENS.index(token)]
    assert tok(f"a{token}b", add_special_tokens=False).input_ids[1:-1] == [SPECIAL_TOKENS.index(token)]


def test_no_bos_added(tok: PreTrainedTokenizerFast) -> None:
    assert tok("hello").input_ids == tok("hello", add_special_tokens=False).input_ids


def test_same_seed_same_vocab_in_both_formats(tok: PreTrainedTokenizerFast) -> None:
    again = build_tokenizer(vocab_size=4096, seed=0, chat_format="thinking")
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert again.chat_template == CHAT_TEMPLATES["thinking"] and chat_format(again) == "thinking"
    with pytest.raises(ValueError, match="chat format 'chatml' is not one of instruct, thinking"):
        build_tokenizer(vocab_size=512, chat_format="chatml")


def test_corpus_is_deterministic_and_varied() -> None:
    corpus = build_corpus(300, seed=3)
    assert corpus == build_corpus(300, seed=3)
    assert corpus != build_corpus(300, seed=4)
    joined = "\n".join(corpus)
    for needle in (
        "What is ",
        "The answer is ",
        "functions.",
        '"arguments": {',
        "def ",
        "<|tool_call_begin|>",
        "## Return of ",
        "<|im_system|>tool_declare<|im_middle|>",
        "You are Kimi, an AI assistant created by Moonshot AI.",
        "<think>",
    ):
        assert needle in joined


def test_learned_merges_cover_chat_vocabulary(tok: PreTrainedTokenizerFast) -> None:
    text = render_text(
        [
            Message(role="user", content="What is 2 + 2?"),
            Message(
                role="assistant",
                tool_calls=[
                    ToolCall(
                        id="functions.calculator:0",
                        name="calculator",
                        arguments={"expression": "2 + 2"},
                    )
                ],
            ),
        ],
        tools=[ToolSpec(name="calculator")],
    )
    assert len(tok(text, add_special_tokens=False).input_ids) < len(text.encode()) / 2.5


@pytest.mark.parametrize("vocab_size", [0, 100, 267])
def test_too_small_vocab_is_rejected(vocab_size: int) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(vocab_size=vocab_size)


def test_small_vocab_builds(tmp_path: Path) -> None:
    small = build_tokenizer(vocab_size=512, seed=1)
    assert len(small) == 512
    assert small.convert_tokens_to_ids(EOS) == SPECIAL_TOKENS.index(EOS)


def test_save_and_reload(tok: PreTrainedTokenizerFast, saved_dir: Path) -> None:
    loaded = AutoTokenizer.from_pretrained(saved_dir)
    assert len(loaded) == len(tok)
    assert loaded.chat_template == CHAT_TEMPLATES["instruct"]
    assert (loaded.pad_token, loaded.eos_token, loaded.bos_token) == (PAD, IM_END, None)
    assert loaded.model_max_length == tok.model_max_length
    for sample in SAMPLES:
        assert loaded(sample).input_ids == tok(sample).input_ids
    dialogue = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
    ]
    assert loaded.apply_chat_template(dialogue, tokenize=False) == tok.apply_chat_template(dialogue, tokenize=False)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60))
def test_any_text_round_trips(tok: PreTrainedTokenizerFast, text: str) -> None:
    """Decoding gives back the text up to NFC normalization (the Qwen2-style normalizer)."""
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)
    assert all(0 <= token_id < len(tok) for token_id in ids)


@pytest.mark.parametrize("text", [bytes(range(1, 128)).decode("ascii"), "\x00", "\u200b\ufeff", "a" * 3000, " " * 17])
def test_awkward_text_round_trips(tok: PreTrainedTokenizerFast, text: str) -> None:
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text


LOADER_TEXTS = [
    "Hello world 12345 678",
    "def f(x):\n    return x**2  # comment\n\n\n",
    "Ünïcödé café ﬁ   spaces   end",
    "e\u0301 and \u00e9 (NFC folds them)",
    '{"a": [1, 2, 3]}<|im_end|>tail',
    "emoji 🙂 and 中文 and tabs\tand\r\nCRLF",
]


@pytest.mark.parametrize("model_dir_fixture", ["tiny_qwen2_dir", "tiny_k2_dir"])
def test_auto_tokenizer_on_model_dir_encodes_like_ours(
    tok: PreTrainedTokenizerFast, model_dir_fixture: str, request: pytest.FixtureRequest
) -> None:
    """transformers picks a tokenizer class by model_type (Qwen2Tokenizer rebuilds its own
    pre-tokenizer); vLLM loads the same way. Every loader must encode exactly like ours."""
    from transformers import AutoTokenizer

    from k2post.chat.template import special_token_ids

    loaded = AutoTokenizer.from_pretrained(request.getfixturevalue(model_dir_fixture))
    for text in LOADER_TEXTS:
        assert loaded(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids, text
    assert special_token_ids(loaded) == special_token_ids(tok)
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|pad|>"
