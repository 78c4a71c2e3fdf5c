"""Fail closed: a sandbox that needs root, namespaces and seccomp refuses to start without them, in one line
naming what is missing and the opt-out; the code gym (and so an RL run with it) stops at its start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from k2post.sandbox import IsolationUnavailable, Sandbox, SandboxConfig
from k2post.sandbox import runner
from k2post.command import UserError

FULL = {"root": True, "namespaces": True, "netns": True, "seccomp": True}


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        (["root"], "no root (a fresh uid per run)"),
        (["namespaces", "netns"], "no mount/pid namespaces"),
        (["seccomp"], "no seccomp (the syscall deny-list)"),
        (["root", "namespaces", "netns", "seccomp"], "no root (a fresh uid per run), no mount/pid namespaces"),
    ],
)
def test_missing_isolation_is_one_line_naming_it_and_the_opt_out(missing, named):
    caps = {**FULL, **dict.fromkeys(missing, False)}
    with pytest.raises(IsolationUnavailable) as caught:
        runner.check_isolation(SandboxConfig(), caps)
    message = str(caught.value)
    assert "\n" not in message and named in message and "sandbox.require_isolation: false" in message
    assert isinstance(caught.value, UserError)  # commands print it as one line and exit 2
    runner.check_isolation(SandboxConfig(require_isolation=False, namespaces=False, seccomp=False), caps)


def test_full_isolation_passes_and_the_config_refuses_half_measures():
    runner.check_isolation(SandboxConfig(), FULL)
    with pytest.raises(ValidationError, match="namespaces: false turns isolation down: also set require_isolation"):
        SandboxConfig(namespaces=False)
    with pytest.raises(ValidationError, match="seccomp: false"):
        SandboxConfig(seccomp=False)


def test_the_code_gym_stops_when_it_is_built(monkeypatch):
    from k2post.envs.registry import make_environment

    monkeypatch.setattr(runner, "detect_isolation", lambda: {**FULL, "seccomp": False})
    with pytest.raises(IsolationUnavailable, match="no seccomp"):
        make_environment("code")
    with pytest.raises(IsolationUnavailable):
        Sandbox()
    relaxed = {"sandbox": {"require_isolation": False, "seccomp": False}}
    assert make_environment("code", relaxed).sandbox.config.require_isolation is False


def test_the_opt_out_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(runner, "detect_isolation", lambda: {**FULL, "namespaces": False, "netns": False})
    relaxed = SandboxConfig(require_isolation=False, namespaces=False, network="blocked")
    with caplog.at_level("WARNING", logger="k2post.sandbox.runner"):
        Sandbox(relaxed), Sandbox(relaxed)
    warnings = [r.getMessage() for r in caplog.records if "sandbox without" in r.getMessage()]
    what = "mount/pid namespaces (a private root and process tree)"
    assert warnings == [f"k2post: warning: sandbox without {what} (require_isolation: false)"]
