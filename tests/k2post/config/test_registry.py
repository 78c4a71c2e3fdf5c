"""Run-config registry: kind dispatch, duplicates, kind errors."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from k2post.config.base import K2Config
from k2post.config.loader import ConfigError
from k2post.config.registry import RUN_CONFIGS, load_run_config, register_run_config
from k2post.config.runs import DemoConfig


def test_demo_is_registered():
    assert RUN_CONFIGS["demo"] is DemoConfig


def test_duplicate_kind_is_an_error():
    with pytest.raises(ValueError, match="already registered"):

        @register_run_config
        class _Dup(K2Config):
            kind: Literal["demo"] = Field("demo", description="kind")


def test_class_without_kind_cannot_register():
    with pytest.raises(TypeError, match="needs a field `kind"):

        @register_run_config
        class _NoKind(K2Config):
            x: int = Field(1, description="x")


@pytest.mark.parametrize(
    "text, expected_kind, pattern",
    [
        ("run_dir: x\n", None, r"kind: missing; add `kind: <one of .*demo"),
        ("kind: dmeo\n", None, r"kind: unknown run kind 'dmeo' \(did you mean 'demo'\?\)"),
        ("kind: demo\n", "rl", r"this is a 'demo' config but the command needs kind 'rl'"),
        ("kind: demo\nsampling:\n  temperature: 0.7\n", None, r"set sampling.temperature: 0"),
        ("kind: demo\nsampling:\n  temperature: 0\n  n: 4\n", None, r"sampling: temperature 0 \(greedy\) with n > 1"),
    ],
)
def test_run_config_errors(tmp_path, text, expected_kind, pattern):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        load_run_config(path, expected_kind=expected_kind)
