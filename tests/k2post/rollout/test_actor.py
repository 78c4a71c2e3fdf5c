"""`RolloutActor` in a real local Ray cluster (own temp dir): episodes with partial rollout,
checkpoint-engine weight pushes from the driver into the actor, sleep/wake-up, generation."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from k2post.rollout.config import AgenticRolloutConfig, SamplingConfig, VLLMEngineConfig

pytestmark = pytest.mark.slow
GREEDY = SamplingConfig(temperature=0.0, max_tokens=128)
PROMPT = [[2, 17, 3, 40, 41, 42, 99]]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    import ray

    temp_dir = tmp_path_factory.mktemp("ray")
    info = ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(temp_dir), log_to_driver=False)
    try:
        yield info
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def actor(ray_cluster, tool_model_dir):
    import ray

    from k2post.rollout.actor import make_rollout_actor

    handle = make_rollout_actor(
        tool_model_dir,
        VLLMEngineConfig(dtype="float32", max_model_len=2048, max_num_seqs=16),
        envs={"tool_use": {"toolsets": ["bank"]}},
        rollout_cfg=AgenticRolloutConfig(max_turn_tokens=128, max_episode_tokens=512, iteration_token_budget=64),
        sampling=GREEDY,
        num_cpus=1,
    )
    assert ray.get(handle.ready.remote(), timeout=300)["weight_update_mode"] == "in_place"
    yield handle
    ray.kill(handle)


def _push(actor, tensors: dict[str, torch.Tensor]) -> dict:
    """Driver-side WeightSender -> the actor's WeightReceiver -> its engine."""
    import ray
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

    with WeightSender(CheckpointEngineConfig(bucket_nbytes=4 << 20, timeout_s=120)) as sender:
        for name in sorted(tensors):
            sender.register(name, tensors[name])
        ref = actor.receive_weights.remote(sender.address, timeout_s=120)
        push = sender.push()
        stats = ray.get(ref, timeout=300)
    assert stats["n_tensors"] == push.n_tensors == len(tensors)
    return stats


def test_episodes_resume_across_checkpoint_engine_pushes(actor, tool_model_dir, bank_tasks, tool_trajectories):
    import ray

    weights = load_file(str(tool_model_dir / "model.safetensors"))
    assert ray.get(actor.start_episodes.remote([("tool_use", task) for task in bank_tasks])) == len(bank_tasks)
    finished, iteration = [], 0
    while len(finished) < len(bank_tasks):
        finished += ray.get(actor.run_iteration.remote(iteration=iteration), timeout=300)
        stats = _push(actor, weights)  # new policy version (same weights: greedy replays exactly)
        assert stats["weights_version"] == iteration + 1 and stats["n_buckets"] >= 4
        iteration += 1
        assert iteration < 40
    assert ray.get(actor.paused_episodes.remote()) == []
    by_id = {e.id: e for e in finished}
    for task, reference in zip(bank_tasks, tool_trajectories):
        episode = by_id[task.id]
        assert episode.reward.value == 1.0 and episode.token_ids == reference.ids
        assert len(episode.policy_versions()) > 1  # resumed after pushes: several versions wrote it


def test_push_changes_and_restores_generation(actor, tool_model_dir):
    import ray

    weights = load_file(str(tool_model_dir / "model.safetensors"))
    before = ray.get(actor.generate.remote(PROMPT, GREEDY))[0][0].token_ids
    noisy = {n: t + 0.05 * torch.randn(t.shape, generator=torch.Generator().manual_seed(7)) for n, t in weights.items()}
    _push(actor, noisy)
    assert ray.get(actor.generate.remote(PROMPT, GREEDY))[0][0].token_ids != before
    _push(actor, weights)
    assert ray.get(actor.generate.remote(PROMPT, GREEDY))[0][0].token_ids == before


def test_sleep_and_wake_up_through_the_actor(actor):
    import ray

    slept = ray.get(actor.sleep.remote())
    assert slept.nbytes == 1 << 30 and slept.rss_before - slept.rss_after > (1 << 30) * 0.8
    with pytest.raises(ray.exceptions.RayTaskError, match="asleep"):
        ray.get(actor.generate.remote(PROMPT, GREEDY))
    assert ray.get(actor.wake_up.remote()).nbytes == 1 << 30
    assert ray.get(actor.generate.remote(PROMPT, GREEDY))[0][0].token_ids


def test_unknown_environment_is_a_clear_error(actor, bank_tasks):
    import ray

    with pytest.raises(ray.exceptions.RayTaskError, match=r"environments \['nope'\].*has \['tool_use'\]"):
        ray.get(actor.start_episodes.remote([("nope", bank_tasks[0])]))
