"""Environment mix config: which environments an RL run samples from, with what weight and config.

In a run YAML:

    envs:
      - name: math
        weight: 2.0
        config: {difficulty: 3}
      - name: instruction_following
        weight: 1.0

Each entry's `config` is validated against that environment's `config_cls` (defaults filled
in); an unknown name fails with a did-you-mean hint. `EnvMixConfig.sample_env(rng)` picks an
entry with probability weight / sum(weights).
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any, Protocol

from pydantic import Field, ValidationError, field_validator, model_validator

from k2post.config.base import K2Config
from k2post.config.loader import format_validation_error
from k2post.envs.base import Environment
from k2post.envs.registry import get_environment, resolve_name


class RandomLike(Protocol):
    """`random.Random` or `numpy.random.Generator`: anything with `.random()` in [0, 1)."""

    def random(self) -> float: ...


class EnvEntryConfig(K2Config):
    """One environment of the mix: registry name, sampling weight, its own config."""

    name: str = Field(
        "math",
        description="Registered environment name (see `k2post envs list`), or a class reference "
        "`package.module:Class` / `path/to/file.py:Class` (loaded and registered; the entry keeps its `name`).",
    )
    weight: float = Field(1.0, gt=0, description="Sampling weight; probability is weight / sum of weights.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="The environment's config, validated against its config class."
    )
    plugin: str | None = Field(
        None,
        description="Set from a `module:Class` / `file.py:Class` name (absolute for a file): where the class is "
        "loaded from when this config is read again (a resumed run, another process).",
    )

    @model_validator(mode="before")
    @classmethod
    def _resolve_reference(cls, data: Any) -> Any:
        """`name: pkg.mod:Class` -> the class's registered name, the reference kept in `plugin`."""
        if not isinstance(data, dict):
            return data
        name, plugin = data.get("name"), data.get("plugin")
        if not isinstance(name, str):
            return data
        name, plugin = resolve_name(name, plugin)
        return {**data, "name": name, "plugin": plugin} if plugin else data

    @field_validator("name")
    @classmethod
    def _known_name(cls, name: str) -> str:
        get_environment(name)  # unknown → EnvironmentRegistryError (a ValueError) with did-you-mean
        return name

    @model_validator(mode="after")
    def _valid_env_config(self) -> EnvEntryConfig:
        config_cls = get_environment(self.name).config_cls
        try:
            validated = config_cls.model_validate(self.config)
        except ValidationError as err:
            message = format_validation_error(err, config_cls, f"environment {self.name!r}")
            prefix = f"environment {self.name!r}: "
            raise ValueError(prefix + "config." + message[len(prefix) :]) from None
        self.config = validated.model_dump(mode="json")
        return self

    def make(self) -> Environment:
        """A new instance of this entry's environment with its validated config."""
        cls = get_environment(self.name)
        return cls(cls.config_cls.model_validate(self.config))


class EnvMixConfig(K2Config):
    """The weighted set of environments an RL run draws tasks from."""

    envs: list[EnvEntryConfig] = Field(
        default_factory=lambda: [EnvEntryConfig()],
        description="Environments with weights and configs (non-empty, names unique).",
    )

    @field_validator("envs")
    @classmethod
    def _non_empty_unique(cls, envs: list[EnvEntryConfig]) -> list[EnvEntryConfig]:
        if not envs:
            raise ValueError("at least one environment is needed")
        seen: set[str] = set()
        for entry in envs:
            if entry.name in seen:
                raise ValueError(f"environment {entry.name!r} is listed twice (names must be unique)")
            seen.add(entry.name)
        return envs

    def names(self) -> list[str]:
        """Environment names in config order."""
        return [entry.name for entry in self.envs]

    def probabilities(self) -> dict[str, float]:
        """Sampling probability of each environment."""
        total = sum(entry.weight for entry in self.envs)
        return {entry.name: entry.weight / total for entry in self.envs}

    def sample_env(self, rng: RandomLike) -> EnvEntryConfig:
        """Draw one entry with probability proportional to its weight."""
        cumulative = list(itertools.accumulate(entry.weight for entry in self.envs))
        position = bisect.bisect_right(cumulative, float(rng.random()) * cumulative[-1])
        return self.envs[min(position, len(self.envs) - 1)]

    def make_environments(self) -> dict[str, Environment]:
        """One instance per entry, by name."""
        return {entry.name: entry.make() for entry in self.envs}
