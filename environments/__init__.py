"""Built-in verifiable-reward gyms. Importing this package registers them.

Each module defines one environment class decorated with `@register_environment`:
math, reasoning_gym, instruction_following, faithfulness, code (sandboxed unit tests),
tool_use (multi-turn, stateful toolsets), record_audit (100+ tool calls per task), self_critique (the
rubric critic's reward for prompts without a verifiable answer), critic_calibration (the critic judging
verifier-labelled pairs).
See docs/ENVIRONMENTS.md and docs/CRITIC.md.
"""

from k2post_environments import (  # noqa: F401  (imported for their registrations)
    code,
    critic_calibration,
    faithfulness,
    instruction_following,
    math_env,
    reasoning_gym_env,
    record_audit,
    self_critique,
    tool_use,
)
