"""Environments (the RL signal): the Environment API, the registry, isolated reward workers,
and golden-file reward regression tests. Built-in gyms live in the top-level `environments/`
package. See docs/ENVIRONMENTS.md."""

from k2post.envs.base import (
    EnvConfig,
    Environment,
    HonestPair,
    MultiTurnEnvironment,
    Play,
    Reward,
    StepResult,
    Task,
)
from k2post.envs.registry import (
    ENTRY_POINT_GROUP,
    EnvironmentRegistryError,
    get_environment,
    make_environment,
    register_environment,
    registered_environments,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvConfig",
    "Environment",
    "EnvironmentRegistryError",
    "HonestPair",
    "MultiTurnEnvironment",
    "Play",
    "Reward",
    "StepResult",
    "Task",
    "get_environment",
    "make_environment",
    "register_environment",
    "registered_environments",
]
