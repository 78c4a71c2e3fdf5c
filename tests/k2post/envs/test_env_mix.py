"""EnvMixConfig: per-env config validation with clear errors, unique names, weighted sampling."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from k2post.config.loader import ConfigError, load_config, validate_config
from k2post.envs.mix import EnvEntryConfig, EnvMixConfig


def _mix(data):
    return validate_config(EnvMixConfig, data, "mix.yaml")


@pytest.mark.parametrize(
    "envs, message",
    [
        ([{"name": "toy_ech"}], "mix.yaml: envs.0.name: unknown environment 'toy_ech' (did you mean 'toy_echo'?)"),
        (
            [{"name": "toy_echo", "config": {"uper": True}}],
            "mix.yaml: envs.0: environment 'toy_echo': config.uper: unknown key (did you mean 'upper'?)",
        ),
        (
            [{"name": "toy_echo", "config": {"upper": "maybe"}}],
            "environment 'toy_echo': config.upper: Input should be a valid boolean",
        ),
        ([{"name": "toy_echo", "weight": 0}], "mix.yaml: envs.0.weight: Input should be greater than 0"),
        ([{"name": "toy_echo", "wieght": 2}], "mix.yaml: envs.0.wieght: unknown key (did you mean 'weight'?)"),
        ([], "mix.yaml: envs: at least one environment is needed"),
        ([{"name": "toy_echo"}, {"name": "toy_echo"}], "environment 'toy_echo' is listed twice"),
    ],
)
def test_errors_name_env_and_field(envs, message):
    with pytest.raises(ConfigError) as err:
        _mix({"envs": envs})
    assert str(err.value).startswith(message) or message in str(err.value)
    assert "\n" not in str(err.value)


def test_env_config_defaults_filled_and_env_built():
    mix = _mix({"envs": [{"name": "toy_echo", "weight": 3, "config": {"upper": True}}, {"name": "toy_counter"}]})
    assert mix.envs[0].config == {"upper": True} and mix.envs[1].config == {}
    assert mix.names() == ["toy_echo", "toy_counter"]
    assert mix.probabilities() == {"toy_echo": 0.75, "toy_counter": 0.25}
    env = mix.envs[0].make()
    assert env.name == "toy_echo" and env.config.upper is True
    assert set(mix.make_environments()) == {"toy_echo", "toy_counter"}


def test_sample_env_follows_weights():
    mix = _mix({"envs": [{"name": "toy_echo", "weight": 3}, {"name": "toy_counter", "weight": 1}]})
    rng = random.Random(0)
    counts = Counter(mix.sample_env(rng).name for _ in range(8000))
    assert abs(counts["toy_echo"] / 8000 - 0.75) < 0.02
    assert mix.sample_env(random.Random(1)).name == mix.sample_env(random.Random(1)).name


def test_sample_env_accepts_numpy_generator():
    import numpy as np

    mix = _mix({"envs": [{"name": "toy_echo"}, {"name": "toy_boxed_sum", "weight": 1e-9}]})
    assert mix.sample_env(np.random.default_rng(0)).name == "toy_echo"


def test_yaml_round_trip(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("envs:\n  - name: toy_echo\n    weight: 2\n    config: {upper: true}\n  - name: toy_boxed_sum\n")
    mix = load_config(path, EnvMixConfig)
    assert [e.weight for e in mix.envs] == [2.0, 1.0]
    assert isinstance(mix.envs[0], EnvEntryConfig)
