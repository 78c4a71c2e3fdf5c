"""Built-in verifiable-reward gyms. Importing this package registers them.

Each module defines one environment class decorated with `@register_environment`.
"""

import importlib

_BUILTIN_MODULES = ("math_env", "reasoning_gym_env", "instruction_following", "faithfulness", "code", "tool_use")

for _module in _BUILTIN_MODULES:
    try:
        importlib.import_module(f"environments.{_module}")
    except ModuleNotFoundError as _err:  # a gym still being written in this checkout
        if _err.name != f"environments.{_module}":
            raise
