"""math-verify equivalence of two answers, unbounded in time: what a math scorer's `k2post.envs.child_call`
child runs (this module imports nothing of the gyms, so the child starts quickly).

    verify_equal("\\\\frac{1}{2}", "0.5")    # True

Never call it in a scorer's own process on an answer not proven small: one sympy big-integer operation can run
for minutes and no signal interrupts it (environments/math_env.py decides which answers may run in-process).
"""

from __future__ import annotations

import logging
from typing import Any

# math-verify warns that its own timeouts are off; the child's hard timeout replaces them.
logging.getLogger("math_verify").setLevel(logging.ERROR)

WARMUP = ["\\binom{4}{2} \\cdot x^2", "6x^2"]
"""A first comparison the child makes before it says ready (math-verify imports its LaTeX and sympy parts lazily:
paid there, not inside a timed call)."""


def verify_equal(gold: str, pred: str) -> bool:
    """math-verify equivalence with its signal timeouts off; never raises (False on junk)."""
    try:
        from math_verify import parse, verify

        def parsed(text: str) -> list[Any]:
            # LaTeX first: bare `\frac{84}{4} \cdot 2` parses as [2] without the $...$ wrapper.
            return parse(f"${text}$", parsing_timeout=None) or parse(text, parsing_timeout=None)

        gold_parsed, pred_parsed = parsed(gold), parsed(pred)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception:  # sympy/latex2sympy can raise almost anything on junk (MemoryError in the child included)
        return False
