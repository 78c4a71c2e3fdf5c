"""Infrastructure failures are not rewards: an episode whose scoring failed for an infrastructure reason (a reward
worker died twice, the sandbox never started) is left out of training and counted, never trained on as 0.

Pure parts (k2post.rl.batch) on tables, then the controller on its in-process fakes (tests/k2post/rl/rl_fakes.py)."""

from __future__ import annotations

import pytest

from k2post.rl import batch as rb
from k2post.rl.config import ISCorrectionConfig
from k2post.rl.controller import RLRun, apply_is_correction
from k2post.rl.critic_loop import group_of
from k2post.rl.metrics import read_metrics
from rl_fakes import FakeCluster, FakeTrainerGroup
from test_controller import _config


def _sample(index: int, reward: float, infra: bool = False, group: str = "g") -> rb.Sample:
    return rb.Sample(
        group, index, "math", "math", f"t-{group}", [1, 1, 1, 1], [0, 0, 1, 1], reward, False, "env_done",
        infra_failure=infra,
    )  # fmt: skip


@pytest.mark.parametrize(
    "rewards, infra, trainable, advantages",
    [
        ([1.0, 0.0, 0.0, 1.0], [False] * 4, True, [0.5, -0.5, -0.5, 0.5]),
        # the failed episode's 0 is no reward: the mean is over the three scored ones (1, 1, 0 -> 2/3)
        ([1.0, 0.0, 1.0, 0.0], [False, True, False, False], True, [1 / 3, 0.0, 1 / 3, -2 / 3]),
        ([1.0, 0.0, 0.0, 0.0], [False, True, True, True], False, None),
        ([0.0, 0.0, 0.0, 0.0], [True] * 4, False, None),
    ],
    ids=["all-scored", "one-failed", "one-scored-left", "none-scored"],
)
def test_a_failed_episode_is_masked_and_left_out_of_its_group_mean(rewards, infra, trainable, advantages):
    group = [_sample(i, r, f) for i, (r, f) in enumerate(zip(rewards, infra))]
    assert rb.trainable(group) is trainable
    assert [s.index for s in rb.scored(group)] == [i for i, f in enumerate(infra) if not f]
    if not trainable:
        return
    rows = rb.step_sequences([group], [[s.reward for s in rb.scored(group)]])
    assert len(rows) == len(group)  # the step keeps its shape
    assert [row.advantage for row in rows] == pytest.approx(advantages)
    assert [row.scored for row in rows] == [not f for f in infra]
    assert [row.keep for row in rows] == [not f for f in infra]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_is_pass_never_unmasks_a_failed_episode(enabled):
    group = [_sample(0, 1.0), _sample(1, 0.0, infra=True), _sample(2, 0.0)]
    rows = rb.step_sequences([group], [[1.0, 0.0]])
    old = [{"token_logprobs": [[-0.5, -0.5] for _ in rows]}]
    _, keeps = apply_is_correction([rows], old, ISCorrectionConfig(enabled=enabled))
    assert keeps == [True, False, True]
    assert [row.keep for row in rows] == [True, False, True]
    assert rb.kept_episodes(rows) == 2  # the loss's N counts the scored episodes only


def test_the_book_drops_groups_with_fewer_than_two_scored_episodes():
    book = rb.GroupBook(k=3)
    book.open("a"), book.open("b")
    book.add([_sample(i, 1.0, infra=i == 0, group="a") for i in range(3)])
    book.add([_sample(i, 1.0, infra=i > 0, group="b") for i in range(3)])
    assert book.discard(rb.trainable) == 1
    assert [g[0].group_id for g in book.ready] == ["a"]


BROKEN = {"value": 0.0, "error": "reward worker died (exit code -9)", "infra_failure": True}


def test_the_controller_trains_on_no_failed_episode_and_counts_them(tmp_path, monkeypatch):
    """4 prompts x 4 samples, one iteration: every group's episode 0 failed twice (as the pool returns it after its
    one re-score: left out, masked, counted) and one whole group failed (dropped); the error guard counts them."""
    trained, doomed = [], []
    real_rewards, real_step = RLRun.rewards, FakeTrainerGroup.train_step

    def failing(self, episodes):
        groups = sorted({group_of(e.id)[0] for e in episodes})
        doomed[:] = doomed or groups[:1]
        rewards = real_rewards(self, episodes)
        hit = [group_of(e.id)[1] == 0 or group_of(e.id)[0] in doomed for e in episodes]
        return [r.model_copy(update=BROKEN) if h else r for r, h in zip(rewards, hit)]

    def recording(self, micro, old, step):
        trained.extend(row for ranks in micro for batch in ranks for row in batch)
        return real_step(self, micro, old, step)

    monkeypatch.setattr(RLRun, "rewards", failing)
    monkeypatch.setattr(FakeTrainerGroup, "train_step", recording)
    cfg = _config(tmp_path, train={"iterations": 1, "eval_every": 0}, reward={"max_reward_error_fraction": 1.0})
    RLRun(cfg, FakeCluster(cfg)).run()
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert row["reward/infra_failures"] == 4 + 3 and row["rollout/reward_errors"] == 7
    assert row["reward/infra_dropped_groups"] == 1
    assert trained and not any(r.key.split("/")[0] in doomed for r in trained)  # the dropped group: no row at all
    failed = [r for r in trained if r.key.endswith("/0")]
    assert failed and all(not r.keep and not r.scored and r.advantage == 0.0 for r in failed)
    assert all(r.scored for r in trained if not r.key.endswith("/0"))


def test_infrastructure_failures_still_count_toward_the_error_guard(tmp_path, monkeypatch):
    """A broken sandbox (every reward an infrastructure error) still stops the run with its one line."""
    from k2post.envs.reward_errors import RewardErrorsExceeded

    real_rewards = RLRun.rewards
    monkeypatch.setattr(
        RLRun, "rewards", lambda self, eps: [r.model_copy(update=BROKEN) for r in real_rewards(self, eps)]
    )
    cfg = _config(tmp_path, train={"iterations": 1, "eval_every": 0}, reward={"max_reward_error_fraction": 0.5})
    with pytest.raises(RewardErrorsExceeded, match="16 of 16 rewards failed .* first: math: reward worker died"):
        RLRun(cfg, FakeCluster(cfg)).run()
