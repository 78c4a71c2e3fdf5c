"""ChildCall: a call past its time kills the child (ChildTimeout) and the next call gets a fresh one; a child that
cannot start or dies is a ChildFailure (an infrastructure fault, never a reward)."""

from __future__ import annotations

import time

import pytest

from k2post.envs.child_call import ChildCall, ChildFailure, ChildTimeout


@pytest.fixture
def sleeper():
    child = ChildCall("time:sleep")
    yield child
    child.close()


def test_a_call_answers_and_a_hung_call_is_killed(sleeper):
    assert sleeper.call(0, timeout_s=30.0) is None
    started = time.perf_counter()
    with pytest.raises(ChildTimeout, match="no answer in 0.3 s"):
        sleeper.call(60, timeout_s=0.3)
    assert time.perf_counter() - started < 5.0
    assert sleeper.kills == 1
    assert sleeper.call(0, timeout_s=30.0) is None  # a fresh child


def test_a_target_that_cannot_be_imported_is_a_failure_naming_it():
    child = ChildCall("no_such_module_k2:f", start_timeout_s=60.0)
    with pytest.raises(ChildFailure, match="no_such_module_k2.*(died|ModuleNotFoundError)"):
        child.call(1, timeout_s=5.0)


def test_an_exception_in_the_target_is_a_failure_and_the_child_lives_on():
    child = ChildCall("math:sqrt")
    try:
        with pytest.raises(ChildFailure, match="ValueError: math domain error"):
            child.call(-1, timeout_s=30.0)
        assert child.call(4, timeout_s=30.0) == 2.0
        assert child.kills == 0
    finally:
        child.close()


def test_a_child_that_dies_mid_call_is_a_failure_and_the_next_call_restarts_it():
    child = ChildCall("os:_exit")
    try:
        with pytest.raises(ChildFailure, match="child died"):
            child.call(3, timeout_s=30.0)
        with pytest.raises(ChildFailure, match="child died"):
            child.call(3, timeout_s=30.0)  # started again, died again: each is reported
    finally:
        child.close()


def test_a_forked_process_starts_its_own_child():
    import os

    from k2post.envs.child_call import shared_child

    first = shared_child("time:sleep")
    first.call(0, timeout_s=30.0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the forked child reports through its exit code)
        os._exit(
            0
            if shared_child("time:sleep") is not first and shared_child("time:sleep").call(0, timeout_s=30.0) is None
            else 1
        )
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert first.call(0, timeout_s=30.0) is None  # the parent's child still answers
