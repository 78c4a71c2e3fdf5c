"""The rephrase run config (k2post/rephrase/config.py): defaults and the cross-field checks.
Run: python -m pytest tests/k2post/rephrase/test_config.py -q
"""

from __future__ import annotations

import pytest

from k2post.config.loader import ConfigError, validate_config
from k2post.rephrase.config import RephraseConfig


def test_defaults_are_the_offline_synthetic_corpus():
    cfg = validate_config(RephraseConfig, {}, "t")
    assert cfg.backend == "builtin" and cfg.input.path is None and len(cfg.styles) == 3


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"backend": "llm"}, "backend: llm needs an `llm:` section"),
        ({"input": {"path": "docs.jsonl"}}, "backend: builtin re-renders the synthetic corpus only"),
        ({"chunk_tokens": 4}, "chunk_tokens"),
        ({"stlyes": []}, "stlyes"),
    ],
)
def test_bad_configs_are_one_line(raw, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate_config(RephraseConfig, raw, "t")
    assert "\n" not in str(err.value)
