"""Which weight pushes RL verifies, how a trainer/engine digest comparison fails, and the ledger fingerprint
(the real engine side: tests/k2post/rollout/test_weight_update.py::test_verified_push_catches_a_skipped_and_a_
swapped_tensor; the ledger across a SIGKILL and resume: tests/pipelines/test_rl.py)."""

from __future__ import annotations

import pytest

from k2post.rl.actors import verify_this_push
from k2post.rollout.weight_update import PushVerificationError, compare_digests


@pytest.mark.parametrize(
    ("every", "verified"),
    [(10, [0, 10, 20]), (1, list(range(25))), (3, [0, 3, 6, 9, 12, 15, 18, 21, 24]), (0, [])],
)
def test_the_first_push_and_every_nth_are_verified(every, verified):
    assert [i for i in range(25) if verify_this_push(i, every)] == verified


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"a": "1", "b": "2"}, None),
        ({"a": "1"}, r"the engine never received 'b' \(1 tensors missing\)"),
        ({"a": "1", "b": "2", "c": "3"}, "the engine received 'c', which the trainer does not have"),
        ({"a": "1", "b": "9"}, "tensor 'b': the engine loaded digest 9, the trainer has 2"),
        ({"a": "2", "b": "1"}, "tensor 'a': the engine loaded digest 2"),  # swapped
    ],
)
def test_compare_digests_names_the_tensor(engine, message):
    trainer = {"a": "1", "b": "2"}
    if message is None:
        compare_digests(trainer, engine)
        return
    with pytest.raises(PushVerificationError, match=message):
        compare_digests(trainer, engine)


def test_ledger_digest_is_a_multiset_fingerprint():
    from k2post.rl.metrics import ledger_digest

    assert ledger_digest(["a", "b"]) == ledger_digest(["b", "a"])
    assert ledger_digest(["a", "b"]) != ledger_digest(["a"])  # one lost
    assert ledger_digest(["a", "b"]) != ledger_digest(["a", "b", "b"])  # one repeated
    assert ledger_digest([]) == ledger_digest(())
