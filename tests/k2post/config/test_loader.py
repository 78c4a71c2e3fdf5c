"""Config loading: YAML, dotted overrides, one-line errors with did-you-mean hints."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from k2post.config.base import ConfigDefinitionError, K2Config
from k2post.config.loader import ConfigError, apply_overrides, load_config, parse_override


class _Inner(K2Config):
    lr: float = Field(1e-3, gt=0, description="learning rate")
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.95], description="betas")


class _Outer(K2Config):
    name: str = Field("run", description="run name")
    mode: Literal["a", "b"] = Field("a", description="mode")
    trainer: _Inner = Field(default_factory=_Inner, description="trainer")
    maybe: _Inner | None = Field(None, description="optional section")


def _write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a=1", (["a"], 1)),
        ("a.b=1e-4", (["a", "b"], 1e-4)),
        ("a.b=true", (["a", "b"], True)),
        ("a=[1, 2]", (["a"], [1, 2])),
        ("a=hello world", (["a"], "hello world")),
        ("a=null", (["a"], None)),
        ("a=", (["a"], "")),
    ],
)
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("bad", ["noequals", "=3", "a..b=1", ".a=1"])
def test_parse_override_rejects_malformed(bad):
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override(bad)


def test_apply_overrides_creates_sections_and_does_not_mutate():
    data = {"trainer": {"lr": 1.0}}
    merged = apply_overrides(data, ["trainer.lr=2", "maybe.lr=3"])
    assert merged == {"trainer": {"lr": 2}, "maybe": {"lr": 3}}
    assert data == {"trainer": {"lr": 1.0}}


@pytest.mark.parametrize(
    "override,expected",
    [
        ("envs.0.weight=2", {"envs": [{"name": "a", "weight": 2}, {"name": "b"}]}),
        ("envs.1.config.x=1", {"envs": [{"name": "a"}, {"name": "b", "config": {"x": 1}}]}),
        ("envs.1=c", {"envs": [{"name": "a"}, "c"]}),
    ],
)
def test_apply_overrides_indexes_lists(override, expected):
    assert apply_overrides({"envs": [{"name": "a"}, {"name": "b"}]}, [override]) == expected


@pytest.mark.parametrize("override", ["envs.2.weight=1", "envs.x.weight=1", "envs.5=1"])
def test_apply_overrides_bad_list_index(override):
    with pytest.raises(ConfigError, match="is not an index of a list of 2"):
        apply_overrides({"envs": [{"name": "a"}, {"name": "b"}]}, [override])


def test_apply_overrides_value_not_section():
    with pytest.raises(ConfigError, match="name is a value, not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_load_fills_defaults(tmp_path):
    cfg = load_config(_write(tmp_path, "trainer:\n  lr: 0.5\n"), _Outer, ["mode=b"])
    assert cfg.trainer.lr == 0.5 and cfg.trainer.betas == [0.9, 0.95] and cfg.mode == "b"


@pytest.mark.parametrize(
    "yaml_text, overrides, pattern",
    [
        ("trainer:\n  lrr: 0.1\n", [], r"c\.yaml: trainer\.lrr: unknown key \(did you mean 'lr'\?\)"),
        ("nmae: x\n", [], r"nmae: unknown key \(did you mean 'name'\?\)"),
        ("zzz: 1\n", [], r"zzz: unknown key \(known keys: maybe, mode, name, trainer\)"),
        ("maybe:\n  betass: 1\n", [], r"maybe\.betass: unknown key \(did you mean 'betas'\?\)"),
        ("trainer:\n  lr: -1\n", [], r"trainer\.lr: Input should be greater than 0 \(got -1\)"),
        ("trainer:\n  lr: abc\n", [], r"trainer\.lr: .*valid number.*\(got 'abc'\)"),
        ("mode: c\n", [], r"mode: Input should be 'a' or 'b' \(got 'c'\)"),
        ("", ["trainer.lr=oops"], r"trainer\.lr: .*valid number"),
        ("- 1\n- 2\n", [], r"top level must be a mapping"),
        ("a: [1, 2\n", [], r"line \d+ column \d+: invalid YAML"),
    ],
)
def test_errors_are_one_clear_line(tmp_path, yaml_text, overrides, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(_write(tmp_path, yaml_text), _Outer, overrides)
    assert "\n" not in str(info.value)


def test_error_counts_further_problems(tmp_path):
    with pytest.raises(ConfigError, match=r"\(\+1 more error\)"):
        load_config(_write(tmp_path, "mode: c\nname: [1]\n"), _Outer)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml", _Outer)


def test_field_without_description_is_rejected_at_definition():
    with pytest.raises(ConfigDefinitionError, match="has no description"):

        class _Bad(K2Config):
            x: int = 1


def test_field_without_default_is_rejected_at_definition():
    with pytest.raises(ConfigDefinitionError, match="has no default"):

        class _Bad(K2Config):
            x: int = Field(description="x")


@pytest.mark.parametrize(
    ("yaml_text", "where", "new_key"),
    [
        ("kind: rl\nsampling: {strategy: uniform}\n", "<top level>", "prompt_sampling"),
        ("kind: sft\noptim: {qk_clip: {tau: 30.0}}\n", "optim.qk_clip", "logit_threshold"),
    ],
)
def test_a_renamed_key_is_one_line_naming_the_new_key(tmp_path, yaml_text, where, new_key):
    from k2post.config.registry import load_run_config

    path = tmp_path / "run.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    message = str(info.value)
    assert "\n" not in message and f"{where}: " in message and f"is now `{new_key}`" in message
