"""SFT fixtures: the tiny model's tokenizer and solved tool_use dialogues in the synth row format."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sft_tokenizer(tiny_qwen2_dir):
    from k2post.models.loading import load_tokenizer

    return load_tokenizer(tiny_qwen2_dir)


@pytest.fixture(scope="session")
def tool_rows():
    """24 solved tool_use tasks (all three toolsets), as dataset rows."""
    from data_helpers import tool_use_rows

    return tool_use_rows(24, seed=0)
