"""Built-in verifiable-reward gyms. Importing this package registers them.

Each module defines one environment class decorated with `@register_environment`:
math, reasoning_gym, instruction_following, faithfulness, code (sandboxed unit tests),
tool_use (multi-turn, stateful toolsets). See docs/ENVIRONMENTS.md.
"""

from environments import (  # noqa: F401  (imported for their registrations)
    code,
    faithfulness,
    instruction_following,
    math_env,
    reasoning_gym_env,
    tool_use,
)
