"""Chat-test fixtures: one K2 tokenizer per test session."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from k2post.models.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def k2_tokenizer() -> PreTrainedTokenizerFast:
    """The default K2 BPE tokenizer (vocab 4096, seed 0)."""
    return build_tokenizer(vocab_size=4096, seed=0)
