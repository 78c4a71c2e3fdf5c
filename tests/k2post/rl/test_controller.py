"""The RL controller's loop on in-process fakes of its actor facades (tests/k2post/rl/rl_fakes.py): no Ray, no
engines. What the end-to-end tests (tests/pipelines/test_rl*.py) show on the real actors, shown here in seconds:
the iteration order (queue -> roll out -> score -> train -> push -> eval -> checkpoint), per-episode options,
checkpoint/prune/final, resume equal to the uninterrupted run, and a dead replica's recovery."""

from __future__ import annotations

import json
import types

import pytest

from k2post.config.loader import validate_config
from k2post.rl.actors import ActorRestartLimitError
from k2post.rl.controller import RLRun, episode_seed, progress_line
from k2post.rl.metrics import read_metrics
from k2post.rl.run_config import RLConfig
from k2post.rl.schedules import temperature_for
from rl_fakes import STEP_S, FakeCluster

VOLATILE = ("time/", "perf/")


def _config(tmp_path, **overrides) -> RLConfig:
    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")  # a model dir by its shape; the fakes never load it
    (model / "model.safetensors").write_bytes(b"\x02" + b"\x00" * 7 + b"{}")  # an empty but whole weights file
    raw = {
        "kind": "rl",
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
        "model": {"path": str(model), "flavor": None},
        "envs": [{"name": "math", "config": {"difficulty": 1}}],
        "rollout": {"replicas": 1, "prompts_per_iteration": 4, "samples_per_prompt": 4},
        "loss": {"groups_per_step": 2, "max_steps_per_iteration": 2, "micro_batch_size": 4},
        "temperature": {"default": {"kind": "linear", "start": 1.0, "end": 0.5, "decay_iterations": 4}},
        "train": {"iterations": 4, "prompt_pool_per_env": 16, "eval_every": 2, "eval_tasks_per_env": 4, "plots": False},
        "checkpoint": {"every": 1, "keep": 2},
        "reward": {"workers": 1},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return validate_config(RLConfig, raw, "test")


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(VOLATILE)} for row in rows]


def _run(cfg: RLConfig, **fake) -> tuple[dict, FakeCluster]:
    cluster = FakeCluster(cfg, **fake)
    return RLRun(cfg, cluster).run(), cluster


def test_loop_order_checkpoints_prune_and_final(tmp_path):
    cfg = _config(tmp_path)
    summary, cluster = _run(cfg)
    run_dir = tmp_path / "run"
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4]
    assert [("eval/mean_accuracy" in r) for r in rows] == [True, False, True, False, True]
    assert rows[0]["eval/mean_accuracy"] == 0.0 and rows[-1]["eval/mean_accuracy"] == 1.0  # eval sees the pushes
    assert all(r["train/steps"] == 2 and r["rollout/groups_completed"] == 4 for r in rows[1:])
    assert summary["completed"] and summary["optimizer_steps"] == 8
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["iter-3", "iter-4"]  # keep: 2
    assert json.loads((run_dir / "final" / "weights.json").read_text()) == {"version": 8}
    assert not (run_dir / "final" / "controller.pkl").exists()
    methods = [c[0] for c in cluster.calls]
    first = methods.index("start_episodes")  # per iteration: queue, train (sleep, pi_old, steps, wake), push
    assert methods[first : first + 10] == [
        "start_episodes",
        "sleep",
        "offload",
        "old_policy",  # pi_old of both steps' data: the weights at the start of the iteration
        "old_policy",
        "train_step",
        "train_step",
        "sleep",
        "push",
        "offload",
    ]
    assert methods[-2:] == ["kill_trainers", "kill_rollouts"]


def test_every_episode_gets_its_seed_temperature_and_budget(tmp_path):
    cfg = _config(tmp_path, budget={"default_max_tokens": 24})
    _, cluster = _run(cfg)
    queued = [ids for name, _, ids in (c for c in cluster.calls if c[0] == "start_episodes")]
    assert len(queued) == 4 and all(len(ids) == 16 for ids in queued)  # 4 prompts x K=4 per iteration
    assert queued[0][:4] == ["i0-math-0/0", "i0-math-0/1", "i0-math-0/2", "i0-math-0/3"]
    run, task = RLRun(cfg, FakeCluster(cfg)), types.SimpleNamespace(task_type="math")
    for iteration in (0, 3):
        options = run.episode_options(f"i{iteration}-math-0", 2, task, iteration)
        assert options.id == f"i{iteration}-math-0/2" and options.seed == episode_seed(3, options.id)
        assert options.temperature == temperature_for(cfg.temperature, "math", iteration)
        assert options.max_tokens == 24
    assert run.episode_options("g", 0, task, 0).temperature == 1.0
    assert run.episode_options("g", 0, task, 3).temperature < 1.0  # the decay reaches the episodes


@pytest.mark.parametrize("pause_odd", [False, True], ids=["whole", "partial-rollout"])
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path, pause_odd):
    whole, _ = _run(_config(tmp_path / "a"), pause_odd=pause_odd)
    _run(_config(tmp_path / "b", train={"stop_at_iteration": 2}), pause_odd=pause_odd)
    stopped = tmp_path / "b" / "run"
    assert not (stopped / "final").exists() and (stopped / "checkpoints" / "iter-2").is_dir()
    with pytest.raises(ValueError, match="already holds a run"):
        RLRun(_config(tmp_path / "b"), FakeCluster(None)).setup()
    resumed, cluster = _run(_config(tmp_path / "b", resume=True), pause_odd=pause_odd)
    assert [c for c in cluster.calls if c[0] == "start"]  # a fresh start, then the checkpoint
    first, second = (read_metrics(tmp_path / d / "run" / "metrics.jsonl") for d in ("a", "b"))
    assert _stable(second) == _stable(first)
    assert resumed["optimizer_steps"] == whole["optimizer_steps"]
    if pause_odd:
        assert any(r["rollout/paused_groups"] > 0 for r in first[1:])
    for d in ("a", "b"):
        final = json.loads((tmp_path / d / "run" / "final" / "weights.json").read_text())
        assert final["version"] == whole["optimizer_steps"]


def test_a_dead_replica_is_restarted_its_groups_dropped_and_resynced(tmp_path):
    cfg = _config(tmp_path, rollout={"replicas": 2}, trainer={"world_size": 2})
    summary, cluster = _run(cfg, die={1: 1})
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[2]["rollout/actor_restarts"] == 1 and summary["actor_restarts"] == 1
    assert rows[2]["rollout/groups_completed"] == 2  # replica 1's two groups died with it
    calls = cluster.calls
    restart = calls.index(("restart", 1))
    assert calls[restart + 1 : restart + 4] == [("offload", False), ("push", 2), ("offload", True)]  # re-synced
    assert rows[2]["train/steps"] == 1 and rows[3]["rollout/groups_completed"] == 4  # then back to full groups
    assert cluster.rollouts.versions == [summary["optimizer_steps"]] * 2  # the new replica took every push since


def test_past_the_restart_limit_the_run_fails_and_still_closes(tmp_path):
    cfg = _config(tmp_path, ray={"actor_restarts": 0})
    cluster = FakeCluster(cfg, die={0: 0})
    with pytest.raises(ActorRestartLimitError, match="ray.actor_restarts=0"):
        RLRun(cfg, cluster).run()
    assert cluster.calls[-2:] == [("kill_trainers", None), ("kill_rollouts", None)]


def test_reward_errors_are_logged_and_stop_the_run_past_the_limit(tmp_path, monkeypatch, caplog):
    """Every iteration with scorer errors logs each env's count and first text; a share above
    reward.max_reward_error_fraction stops the run with one line (the CLI prints it as `k2post rl: error: ...`)."""
    import logging

    from k2post.envs.reward_errors import RewardErrorsExceeded

    scored = RLRun.rewards

    def a_quarter_broken(self, episodes):
        rewards = scored(self, episodes)
        broken = {"value": 0.0, "error": "RuntimeError: scorer broke"}
        return [r.model_copy(update=broken) if i % 4 == 0 else r for i, r in enumerate(rewards)]

    monkeypatch.setattr(RLRun, "rewards", a_quarter_broken)
    short = {"iterations": 1, "eval_every": 0}
    with caplog.at_level(logging.WARNING, logger="k2post.rl.controller"):
        summary, _ = _run(_config(tmp_path / "a", train=short))
    assert summary["completed"]
    assert "iteration 1 reward errors: math: 4 of 16 rewards failed; first: RuntimeError: scorer broke" in caplog.text
    strict = _config(tmp_path / "b", train=short, reward={"max_reward_error_fraction": 0.2})
    with pytest.raises(RewardErrorsExceeded) as raised:
        _run(strict)
    assert str(raised.value).startswith(
        "iteration 1: 4 of 16 rewards failed (25% > reward.max_reward_error_fraction 0.2)"
    )
    assert not (tmp_path / "b" / "run" / "final").exists()


@pytest.mark.parametrize("plugins", ["", "/srv/envs/word.py:WordEnv;my_envs.dice:DiceEnv"])
def test_actor_options_carry_the_env_plugins(tmp_path, monkeypatch, plugins):
    """`module:Class` envs of the mix reach every trainer and rollout actor through the actor's runtime_env
    (merged by Ray into a job's own runtime_env), so a Ray job's workers load them as the driver did."""
    from k2post.envs.registry import PLUGINS_ENV_VAR
    from k2post.rl.actors import RayCluster

    monkeypatch.setenv(PLUGINS_ENV_VAR, plugins)
    options = RayCluster(_config(tmp_path)).options(0)
    assert options["num_cpus"] > 0
    assert options.get("runtime_env") == ({"env_vars": {PLUGINS_ENV_VAR: plugins}} if plugins else None)


def test_tokens_per_s_and_mfu_are_logged_from_the_step_time_and_the_model_flops(tmp_path, monkeypatch):
    """perf/train_tokens_per_s = the step's sequence tokens / time/trainer_step_s; perf/mfu = those tokens' training
    FLOPs (3 x (2 x matmul weights but the head + attention at the causal context) + the head on the 4 positions
    whose logits are computed) / peak; rollout tokens/s; the progress line."""
    from transformers import AutoModelForCausalLM

    from k2post.models.flavors import flavor_config
    from k2post.train import mfu

    cfg = _config(tmp_path, train={"iterations": 2, "eval_every": 0})
    config = flavor_config("tiny-qwen2", 4096)
    config.to_json_file(str(tmp_path / "model" / "config.json"))
    monkeypatch.setattr(mfu, "peak_flops", lambda device, dtype: (1e9, "test"))
    _run(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")[1:]
    tokens = 2 * 4 * 5  # groups_per_step x K x 5-token fake episodes
    model = AutoModelForCausalLM.from_config(config)  # materialized: its own weights, not the meta count
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n)
    head = model.lm_head.weight.numel()  # runs at 4 of 5 positions: the last prompt token's and the 3 written
    attention = 2 * 4 * 4 * 3.0 * (64 + 64)  # layers x heads x causal context (5 + 1) / 2 x (d_qk + d_v), x 2
    expected_mfu = tokens / STEP_S * 3 * (2 * (matmul - head) + 2 * head * 4 / 5 + attention) / 1e9
    assert all(r["perf/train_tokens_per_s"] == tokens / STEP_S for r in rows)
    assert all(r["perf/mfu"] == pytest.approx(expected_mfu, rel=1e-9) for r in rows)
    assert all(r["perf/rollout_tokens_per_s"] > 0 for r in rows)
    line = progress_line(rows[-1], 2, 2, 1.0)
    assert f"train {tokens / STEP_S:.0f} tok/s MFU {100 * expected_mfu:.1f}%" in line and "| rollout " in line
