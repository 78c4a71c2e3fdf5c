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

Without packaging, a mix names a class directly: `name: mypkg.mymodule:MyEnv` (an importable module) or
`name: plugins/my_env.py:MyEnv` (a file). `EnvEntryConfig` loads and registers it and keeps its registered
`name`; the reference is added to `K2POST_ENV_PLUGINS` (`;`-separated), which every k2post process
(reward workers, Ray actors: docs/ENVIRONMENTS.md) loads beside the entry points. A plugin that fails to load,
or reuses a taken name, is disabled with one warning; the others, and the built-ins, keep working, and asking
for the disabled name says why it is missing.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import logging
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from k2post.envs.base import Environment

logger = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "k2post.environments"
PLUGINS_ENV_VAR = "K2POST_ENV_PLUGINS"
PLUGINS_SEPARATOR = ";"  # not os.pathsep: ':' separates module and class
BUILTIN_PACKAGE = "k2post_environments"  # the repo's environments/ folder, installed under this import name


def builtin_data_dir(*parts: str) -> Path:
    """A folder inside the built-in gyms' package (golden files, tool specs), located without importing it."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{BUILTIN_PACKAGE} is not installed: reinstall k2post (`pip install -e .`)")
    return Path(spec.origin).parent.joinpath(*parts)


_REGISTRY: dict[str, type[Environment]] = {}
_DISABLED: dict[str, str] = {}  # plugin name (or reference) -> why it was disabled
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


def _disable(name: str, why: str) -> None:
    """Leave a broken plugin out, with one warning; asking for `name` later says why."""
    _DISABLED[name] = why
    logger.warning("k2post: warning: environment plugin disabled: %s", why)


def _load_entry_point(ep: Any) -> None:
    where = f"entry point {ep.name!r} ({ep.value}"
    where += f", from {ep.dist.name})" if getattr(ep, "dist", None) is not None else ")"
    try:
        cls = ep.load()
    except Exception as err:  # a broken third-party package must not hide the others
        return _disable(ep.name, f"{where} failed to load: {type(err).__name__}: {err}")
    if getattr(cls, "name", None) != ep.name:
        return _disable(ep.name, f"{where} points at an environment named {getattr(cls, 'name', None)!r}")
    try:
        register_environment(cls)
    except EnvironmentRegistryError as err:
        return _disable(ep.name, f"{where}: {err}")


def _load_entry_points() -> None:
    if _LOADED["entry_points"]:
        return
    _LOADED["entry_points"] = True
    # k2post's own gyms (its pyproject's entry points) first: a clash then disables the third-party one
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=_builtin_first):
        _load_entry_point(ep)
    for reference in plugin_references():
        try:
            load_reference(reference)
        except EnvironmentRegistryError as err:
            _disable(reference, f"{PLUGINS_ENV_VAR} entry {err}")


def plugin_references() -> list[str]:
    """The `module:Class` / `file.py:Class` references in K2POST_ENV_PLUGINS (loaded by every process)."""
    return [ref.strip() for ref in os.environ.get(PLUGINS_ENV_VAR, "").split(PLUGINS_SEPARATOR) if ref.strip()]


def is_reference(name: str) -> bool:
    """Whether a mix `name` is a `module:Class` or `path/file.py:Class` reference (not a registered name)."""
    return ":" in name


def _import_target(target: str, reference: str) -> Any:
    """The module of a reference: a .py file by path (under a stable private name), else by import name."""
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise EnvironmentRegistryError(f"{reference!r}: file {str(path)!r} not found")
        module_name = f"k2post_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        if module_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except Exception:
                del sys.modules[module_name]
                raise
        return sys.modules[module_name]
    return importlib.import_module(target)


def load_reference(reference: str) -> type[Environment]:
    """The Environment class of `pkg.module:Class` or `path/to/file.py:Class`, registered (idempotent) and
    added to K2POST_ENV_PLUGINS so child processes load it too."""
    target, _, attr = reference.rpartition(":")
    if not target or not attr.isidentifier():
        raise EnvironmentRegistryError(f"{reference!r}: expected 'package.module:Class' or 'path/to/file.py:Class'")
    try:
        module = _import_target(target, reference)
    except EnvironmentRegistryError:
        raise
    except Exception as err:
        raise EnvironmentRegistryError(f"{reference!r} failed to import: {type(err).__name__}: {err}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise EnvironmentRegistryError(f"{reference!r}: module {target!r} has no {attr!r}")
    register_environment(cls)  # checks it is an Environment with a name; the same class again is fine
    _remember(absolute_reference(reference))
    return cls


def absolute_reference(reference: str) -> str:
    """The reference with a file path made absolute (a module reference as it is)."""
    target, _, attr = reference.rpartition(":")
    return f"{Path(target).expanduser().resolve()}:{attr}" if target.endswith(".py") else reference


def _remember(reference: str) -> None:
    known = plugin_references()
    if reference not in known:
        os.environ[PLUGINS_ENV_VAR] = PLUGINS_SEPARATOR.join([*known, reference])


def resolve_name(name: str, plugin: str | None = None) -> tuple[str, str | None]:
    """(registered name, plugin reference) of an env as a mix, `k2post eval`, `envs test` and `golden_test` name it:
    a `module:Class` / `file.py:Class` reference is loaded and gives its class's `name` and the absolute reference;
    a plain name is kept, its class loaded from `plugin` (a saved config's entry) when it is not registered yet."""
    if is_reference(name):
        return get_environment(name).name, absolute_reference(name)
    if plugin and name not in registered_environments():
        load_reference(plugin)
    return name, plugin


def registered_environments() -> dict[str, type[Environment]]:
    """All environments: built-ins plus entry points, by name."""
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def get_environment(name: str) -> type[Environment]:
    """The environment class registered as `name`; unknown → error with a did-you-mean hint."""
    known = registered_environments()
    if name not in known and is_reference(name):
        return load_reference(name)
    if name not in known and name in _DISABLED:
        raise EnvironmentRegistryError(f"environment {name!r} is disabled: {_DISABLED[name]}")
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
        # a process told to load a plugin that it cannot import (a Ray actor without the code) knows the env only
        # by name: say which plugin failed, not just "unknown"
        failed = [_DISABLED[ref] for ref in plugin_references() if ref in _DISABLED]
        raise EnvironmentRegistryError(f"unknown environment {name!r} ({hint})" + "".join(f"; {w}" for w in failed))
    return known[name]


def make_environment(name: str, config: dict[str, Any] | None = None) -> Environment:
    """Instantiate environment `name` with its config validated from a plain dict."""
    cls = get_environment(name)
    return cls(cls.config_cls.model_validate(config or {}))
