"""Explicit registry of environments, by name.

Every environment is an entry point in the group `k2post.environments` (`name = "pkg.module:EnvClass"`),
loaded on first lookup: the built-in gyms of `environments/` (import name `k2post_environments`) through k2post's
own pyproject (loaded first),
third-party packages through theirs. Core never imports the plug-in layer otherwise. The class registers
itself with the decorator when its module is imported (in-tree, and in tests, importing is enough).

    @register_environment
    class MathEnv(SingleTurn...):
        name = "math"

    env = make_environment("math", {"difficulty": 2})
"""

from __future__ import annotations

import difflib
import importlib.util
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from k2post.envs.base import Environment

ENTRY_POINT_GROUP = "k2post.environments"
BUILTIN_PACKAGE = "k2post_environments"  # the repo's environments/ folder, installed under this import name


def builtin_data_dir(*parts: str) -> Path:
    """A folder inside the built-in gyms' package (golden files, tool specs), located without importing it."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{BUILTIN_PACKAGE} is not installed: reinstall k2post (`pip install -e .`)")
    return Path(spec.origin).parent.joinpath(*parts)


_REGISTRY: dict[str, type[Environment]] = {}
_LOADED = {"entry_points": False}


class EnvironmentRegistryError(ValueError):
    """Duplicate or unknown environment name, or a bad entry point."""


def register_environment(cls: type[Environment]) -> type[Environment]:
    """Class decorator: register `cls` under `cls.name`; a duplicate name is an error."""
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise EnvironmentRegistryError(f"{cls!r} is not an Environment subclass")
    if not cls.name or not cls.task_type:
        raise EnvironmentRegistryError(f"{cls.__name__} must set class attributes `name` and `task_type`")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        other = _REGISTRY[cls.name]
        raise EnvironmentRegistryError(
            f"environment name {cls.name!r} is already registered by {other.__module__}.{other.__qualname__}"
        )
    _REGISTRY[cls.name] = cls
    return cls


def unregister_environment(name: str) -> None:
    """Remove a registration (tests)."""
    _REGISTRY.pop(name, None)


def _builtin_first(ep: Any) -> int:
    dist = getattr(ep, "dist", None)
    return 0 if dist is not None and dist.name == "k2post" else 1


def _load_entry_points() -> None:
    if _LOADED["entry_points"]:
        return
    # k2post's own gyms (its pyproject's entry points) first: a clash then names the third-party package
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=_builtin_first):
        where = f"entry point {ep.name!r} ({ep.value}"
        where += f", from {ep.dist.name})" if getattr(ep, "dist", None) is not None else ")"
        try:
            cls = ep.load()
        except Exception as err:  # a broken third-party package must not hide the others
            raise EnvironmentRegistryError(f"{where} failed to load: {err}") from err
        if getattr(cls, "name", None) != ep.name:
            raise EnvironmentRegistryError(f"{where} points at an environment named {getattr(cls, 'name', None)!r}")
        try:
            register_environment(cls)
        except EnvironmentRegistryError as err:
            raise EnvironmentRegistryError(f"{where}: {err}") from None
    _LOADED["entry_points"] = True  # only once all loaded: a failure is reported again, not hidden


def registered_environments() -> dict[str, type[Environment]]:
    """All environments: built-ins plus entry points, by name."""
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def get_environment(name: str) -> type[Environment]:
    """The environment class registered as `name`; unknown → error with a did-you-mean hint."""
    known = registered_environments()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
        raise EnvironmentRegistryError(f"unknown environment {name!r} ({hint})")
    return known[name]


def make_environment(name: str, config: dict[str, Any] | None = None) -> Environment:
    """Instantiate environment `name` with its config validated from a plain dict."""
    cls = get_environment(name)
    return cls(cls.config_cls.model_validate(config or {}))
