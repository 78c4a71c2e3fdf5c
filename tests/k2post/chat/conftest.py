"""Chat-test fixtures: the K2 tokenizer in each chat format, built once per test session."""

from __future__ import annotations

import copy

import pytest
from transformers import PreTrainedTokenizerFast

from k2post.chat.template import CHAT_TEMPLATES
from k2post.models.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def k2_tokenizer() -> PreTrainedTokenizerFast:
    """The default K2 BPE tokenizer (vocab 4096, seed 0, K2-Instruct's template)."""
    return build_tokenizer(vocab_size=4096, seed=0)


@pytest.fixture(scope="session")
def k2_thinking_tokenizer(k2_tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The same vocabulary with K2-Thinking's template (what `build_tokenizer(chat_format="thinking")` gives)."""
    tokenizer = copy.deepcopy(k2_tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATES["thinking"]
    return tokenizer


@pytest.fixture(params=["instruct", "thinking"])
def fmt_tokenizer(request, k2_tokenizer, k2_thinking_tokenizer) -> tuple[str, PreTrainedTokenizerFast]:
    """(format, tokenizer) for each K2 chat format."""
    return request.param, k2_tokenizer if request.param == "instruct" else k2_thinking_tokenizer
