"""Every built-in gym passes the adversarial suite (k2post/envs/adversary.py): no cheap strategy (empty, filler,
copies, hedges, format only, verdict spam, injected turns, forced errors, no / all / repeated tool calls, the gym's
own hacks) pays more than an honest wrong answer on average or more than an honest right one on any task, and no
attempt records a scoring error. `k2post envs test NAME` prints the same verdict as a table."""

from __future__ import annotations

import pytest

from k2post.envs.adversary import run_suite
from k2post.envs.registry import BUILTIN_PACKAGE, make_environment, registered_environments

N_TASKS = 4
FEW_TASKS = {"code": 2}  # every code attempt runs a sandbox (~0.6 s): ~17 attempts per task; a choice gym
# (critic_calibration) is scored on at least 64 tasks whatever is asked (adversary.CHANCE_MIN_TASKS)
BUILTINS = sorted(
    name for name, cls in registered_environments().items() if cls.__module__.startswith(BUILTIN_PACKAGE + ".")
)


def test_every_gym_of_the_issue_is_covered():
    expected = {"code", "critic_calibration", "faithfulness", "instruction_following", "math", "reasoning_gym"}
    assert expected | {"record_audit", "self_critique", "tool_use"} <= set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_gym_passes_the_adversarial_suite(name):
    report = run_suite(make_environment(name), n_tasks=FEW_TASKS.get(name, N_TASKS))
    assert report.judged, f"{name}: {report.not_judged}"
    failures = report.failures()
    assert not failures, f"{name} fails the adversarial suite:\n" + "\n".join(failures)
