"""Envs-layer tests: register the toy environments; report fuzz case counts in the summary."""

from __future__ import annotations

import k2post_toy_envs  # noqa: F401  (registers toy_echo, toy_boxed_sum, toy_counter, toy_faulty)

from k2post.envs.fuzz import CASES_RUN


def pytest_terminal_summary(terminalreporter):
    if not CASES_RUN:
        return
    total = sum(sum(counts.values()) for counts in CASES_RUN.values())
    terminalreporter.section("environment fuzzing")
    for name, counts in sorted(CASES_RUN.items()):
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    terminalreporter.write_line(f"total fuzz cases: {total}")
