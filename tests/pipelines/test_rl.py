"""The RL pipeline end to end on the real engines (slow): Ray actors, DeepSpeed + MuonClip, vLLM, checkpoint engine.

- a bad config fails with one line before Ray or any actor starts;
- `k2post rl CONFIG` writes the run dir (config, metrics.jsonl, TensorBoard, PNG plots, HF checkpoints, final/);
- a run SIGKILLed between steps (just after a checkpoint), resumed with `k2post rl --resume RUN_DIR`, SIGKILLed
  again at a random point and resumed to the end, ends with the same metrics and bit-identical weights as the
  uninterrupted run: the same prompts drawn, episodes finished, partial rollouts paused and resumed, groups
  trained and judge tasks harvested into critic_calibration's pool (`ledger/*`), with the IS correction on;
- LoRA, pushed merged (the default) and adapter-only: only the adapters train (AdamW); every push is verified to
  have reached the engine (merged: no adapted weight is the base's; adapter: the engine registered it), and final/
  is the merged model (frozen tensors bit-identical to the start) with the adapter beside it;
- 2 trainer ranks (ZeRO-2) + 2 rollout replicas on tiny-k2 (MoE) with bf16 engines, routing replay and INT4 QAT:
  a SIGKILLed rollout actor is replaced, re-synced and the run goes on; the trainer used the engines' experts and
  the engines were pushed the INT4 experts the trainer's forward used (verified push).

The kill chain's policy is the coin policy (tests/pipelines/coin_policy.py: mixed rewards on lowercase prompts);
the others run the untrained tiny models on instruction_following. Learning itself is shown by `make demo`
(docs/RL.md).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from coin_policy import IF_CONFIG
from proc_helpers import run_bounded

REPO = Path(__file__).resolve().parents[2]
VOLATILE = ("time/", "memory/", "push/", "perf/")  # wall-clock and RSS figures differ between any two runs


def _config(run_dir: Path, model_dir: Path, ray_tmp: Path, **overrides) -> dict:
    cfg = {
        "kind": "rl",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"path": str(model_dir), "flavor": None},
        # require_answer off: an untrained tiny model answers no request, and rules alone give its groups mixed rewards
        "envs": [{"name": "instruction_following", "config": {"max_constraints": 2, "require_answer": False}}],
        "rollout": {
            "replicas": 1,
            "prompts_per_iteration": 4,
            "samples_per_prompt": 4,
            "engine": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 32, "kv_cache_gib": 0.5},
            "agentic": {"max_turns": 1, "max_turn_tokens": 32, "max_episode_tokens": 64},
        },
        "loss": {"groups_per_step": 4, "micro_batch_size": 8, "tau": 0.05},
        "optim": {"lr": 0.02},
        "budget": {"default_max_tokens": 32, "penalty": "none"},
        "trainer": {"world_size": 1, "zero_stage": 1},
        "train": {
            "iterations": 3,
            "prompt_pool_per_env": 32,
            "eval_every": 0,
            "eval_tasks_per_env": 8,
        },
        "checkpoint": {"every": 1, "keep": 5},
        "ray": {"num_cpus": 2, "temp_dir": str(ray_tmp)},
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return run_bounded([sys.executable, "-m", "k2post.cli", "rl", *args], timeout=timeout, cwd=REPO, env=env)


def _kill_leftovers(marker: str) -> None:
    """SIGKILL processes whose command line names `marker` (our run's private Ray temp dir)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _metrics(run_dir: Path) -> list[dict]:
    from k2post.rl.metrics import read_metrics

    return read_metrics(run_dir / "metrics.jsonl")


# the kill chain: the coin policy (mixed groups, so judge tasks are harvested into critic_calibration's pool),
# partial rollouts (an episode pauses after 12 tokens an iteration; turns end by 24: <= 2 iterations), IS correction
CHAIN = {
    "envs": [
        {"name": "instruction_following", "config": IF_CONFIG},
        {"name": "critic_calibration", "config": {"sources": [{"name": "instruction_following", "config": IF_CONFIG}]}},
    ],
    "rollout": {
        "prompts_per_iteration": 8,
        "engine": {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 32, "kv_cache_gib": 0.5},
        "agentic": {"max_turns": 1, "max_turn_tokens": 24, "max_episode_tokens": 48, "iteration_token_budget": 12},
    },
    "loss": {"groups_per_step": 4, "micro_batch_size": 8, "tau": 0.05, "is_correction": {"enabled": True}},
}


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="k2rl_", dir="/tmp") as tmp:  # short: Ray's socket paths have a limit
        yield Path(tmp)


def test_bad_config_is_rejected_before_any_actor_starts(work, tiny_qwen2_dir):
    run_dir = work / "bad"
    config = _write(work / "bad.yaml", _config(run_dir, tiny_qwen2_dir, work / "ray_bad", loss={"ptx_coef": 0.5}))
    done = _cli(str(config), timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "ptx_coef > 0 needs ptx_data" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not run_dir.exists()
    done = _cli(str(config), "rollout.replicas=2", "loss.ptx_coef=0", timeout=120)
    assert done.returncode == 2 and "rollout.replicas (2) > trainer.world_size (1)" in done.stderr


@pytest.mark.slow
def test_run_dir_then_sigkill_and_resume_matches_the_uninterrupted_run(work, coin_policy_dir):
    """One chain of kills against one uninterrupted run (started alongside, so the two share the 2 cores):
    the chain is SIGKILLed between steps (just after the iteration-1 checkpoint), resumed, SIGKILLed again at a
    random point of the resumed run, and resumed to the end; it must end like the uninterrupted run."""
    straight, straight_log = work / "straight", work / "straight.log"
    cfg = _config(straight, coin_policy_dir, work / "ray_s", **CHAIN)
    reference = _start(["rl", str(_write(work / "straight.yaml", cfg))], straight_log)
    killed, log = work / "killed", work / "killed.log"
    try:
        # between steps: just after the iteration-1 checkpoint
        cfg = _config(killed, coin_policy_dir, work / "ray_k1", **CHAIN)
        proc = _start(["rl", str(_write(work / "killed.yaml", cfg))], log)
        _kill_when(proc, lambda: (killed / "checkpoints/iter-1/controller.pkl").exists(), 0.0, log, work / "ray_k1")
        assert not (killed / "final").exists() and _metrics(killed)[-1]["iteration"] == 1
        # at a random point of the resumed run: a seeded short delay after a seeded progress point (its setup
        # rewrote metrics.jsonl, or it logged iteration 2); iteration 3 and the final model are still to come
        rng = random.Random(int(os.environ.get("K2POST_KILL_SEED", time.time_ns() % 10_000)))
        after_setup, delay = rng.random() < 0.5, rng.uniform(0.0, 0.5)
        point = "its setup" if after_setup else "iteration 2 was logged"
        print(f"random kill point: {delay:.2f}s after {point} (K2POST_KILL_SEED to replay)")
        stamp = (killed / "metrics.jsonl").stat().st_mtime_ns

        def reached() -> bool:
            if after_setup:
                return (killed / "metrics.jsonl").stat().st_mtime_ns != stamp
            return any(r["iteration"] == 2 for r in _metrics(killed))

        proc = _start(["rl", "--resume", str(killed), f"ray.temp_dir={work / 'ray_k2'}"], log)
        _kill_when(proc, reached, delay, log, work / "ray_k2")
        assert not (killed / "final").exists()
        done = _cli("--resume", str(killed), f"ray.temp_dir={work / 'ray_r'}")
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        reference.wait(timeout=600)
    finally:
        if reference.poll() is None:  # the chain failed: do not leave the uninterrupted run behind
            os.killpg(reference.pid, signal.SIGKILL)
            reference.wait()
            _kill_leftovers(str(work / "ray_s"))
    assert reference.returncode == 0, straight_log.read_text()[-3000:]
    _check_run_dir(straight, coin_policy_dir)
    _check_console(straight_log, straight)
    assert f"rl: resuming from {killed / 'checkpoints' / 'iter-1'}" in log.read_text()  # the first --resume says so
    got, want = _stable(_metrics(killed)), _stable(_metrics(straight))
    differing = [
        (r["iteration"], k, r.get(k), w.get(k))
        for r, w in zip(got, want)
        for k in set(r) | set(w)
        if r.get(k) != w.get(k)
    ]
    assert len(got) == len(want) and not differing, differing[:8]
    # ... ledger/* included: per iteration the same prompts drawn, episodes finished (paused partial rollouts
    # among them), groups trained and paused, harvested pool — nothing lost or repeated across the kills
    ledgers = [{k: v for k, v in r.items() if k.startswith("ledger/")} for r in _metrics(killed)[1:]]
    assert ledgers and all(len(ledger) == 10 for ledger in ledgers), ledgers[:1]
    for what in ("finished", "paused", "pool"):  # each kind of thing the ledger counts was there to lose
        assert sum(ledger[f"ledger/{what}_n"] for ledger in ledgers) > 0, what
    rows = [r for r in _metrics(killed)[1:] if "consistency/kl" in r]  # the iterations that trained
    assert max(r["consistency/older_version_share"] for r in rows) > 0  # continued partial rollouts: older tokens
    assert all(r["consistency/kl_current"] < 1e-9 for r in rows)  # fp32 engine: current-version tokens in sync
    a, b = (
        load_file(str(straight / "final" / "model.safetensors")),
        load_file(str(killed / "final" / "model.safetensors")),
    )
    assert all((a[k] == b[k]).all() for k in a)


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """`k2post ARGS` in its own session, its output appended to `log`."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "k2post.cli", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill_when(proc: subprocess.Popen, ready, wait_s: float, log: Path, ray_tmp: Path) -> None:
    """SIGKILL `proc`'s whole process group (and its Ray's workers) `wait_s` after `ready()` turns true."""
    try:
        deadline = time.monotonic() + 420
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the kill point never came (rc={proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        time.sleep(wait_s)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _kill_leftovers(str(ray_tmp))


# k2post's progress lines, its MFU peak, its own warnings and errors, the summary JSON
OWN_LINE = re.compile(r"rl: |perf/|(WARNING|ERROR) k2post\.|\{")


def _check_console(log: Path, run_dir: Path) -> None:
    """The console holds k2post's own lines only: the first names the run dir and the log file, which holds the
    libraries' warnings and the Ray workers' output instead of the console."""
    lines = log.read_text().splitlines()
    assert lines[0] == f"rl: run_dir {run_dir} (library logs and warnings: {run_dir / 'run.log'})", lines[:3]
    assert [line for line in lines if not OWN_LINE.match(line)] == [], lines[:40]
    assert 3 <= len(lines) <= 12, lines  # run dir, MFU peak, one line per iteration, k2post's warnings, the summary
    held = (run_dir / "run.log").read_text()
    assert "pid=" in held and "WARNING" in held and lines[0] in held


def _check_run_dir(run_dir: Path, start_dir: Path) -> None:
    """Everything a run dir holds: every iteration's timings and memory, rollout figures where episodes finished,
    training figures where steps were taken (partial rollouts can leave an iteration without either)."""
    rows = _metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    finished = [r for r in rows[1:] if r.get("rollout/finished")]
    trained = [r for r in rows[1:] if r.get("train/steps")]
    assert finished and trained
    for key in ("time/rollout_s", "memory/colocated_peak_mib"):
        assert all(key in r for r in rows[1:]), key
    for key in ("reward/mean", "rollout/truncation_rate"):
        assert all(key in r for r in finished), key
    for key in (
        "time/train_s",
        "time/push_s",
        "train/k15_loss",
        "rollout/groups_nonzero_adv_frac",
        "rollout/reward_std_mean",
        "consistency/kl",
    ):
        assert all(key in r for r in trained), key
    assert "eval/instruction_following/accuracy" in rows[0] and "eval/instruction_following/accuracy" in rows[-1]
    assert (run_dir / "config.yaml").is_file() and list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert {p.name for p in (run_dir / "plots").glob("*.png")} >= {
        "reward.png",
        "heldout_accuracy.png",
        "phase_times.png",
        "weight_sync.png",
        "length_truncation.png",
        "diagnostics.png",
    }
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter-1", "iter-2", "iter-3"]
    from k2post.models.loading import load_causal_lm

    load_causal_lm(run_dir / "final")  # an HF model dir
    before, after = (
        load_file(str(start_dir / "model.safetensors")),
        load_file(str(run_dir / "final" / "model.safetensors")),
    )
    assert any(not (before[k] == after[k]).all() for k in after)  # MuonClip steps moved the policy


@pytest.mark.slow
@pytest.mark.parametrize("push", ["merged", "adapter"])
def test_lora_run_trains_adapters_and_pushes_them(work, coin_policy_dir, push):
    run_dir = work / f"lora_{push}"
    lora = {"enabled": True, "rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "o_proj"], "push": push}
    cfg = _config(
        run_dir,
        coin_policy_dir,
        work / f"ray_l{push}",
        envs=[{"name": "instruction_following", "config": IF_CONFIG}],
        lora=lora,
        optim={"lr": 0.01, "qk_clip": {"enabled": False}},
        trainer={"world_size": 1, "zero_stage": 1, "verify_push_every": 1},
        train={"iterations": 2},
        checkpoint={"every": 0},
    )
    done = _cli(str(_write(work / f"lora_{push}.yaml", cfg)))
    _kill_leftovers(str(work / f"ray_l{push}"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    rows = [r for r in _metrics(run_dir) if "push/verified_held" in r]
    assert len(rows) == 2 and all(r["push/verified_held"] == 1.0 for r in rows)
    if push == "merged":  # q_proj and o_proj of 4 layers arrived merged, their adapters nonzero
        assert rows[-1]["push/lora_adapted"] == 8.0
    else:  # only the adapters travelled: 2 x 8 small matrices
        assert rows[-1]["push/mb"] < 0.5 and "push/lora_adapted" not in rows[-1]
    start = load_file(str(coin_policy_dir / "model.safetensors"))
    final = load_file(str(run_dir / "final" / "model.safetensors"))
    adapter = load_file(str(run_dir / "final" / "adapter" / "adapter_model.safetensors"))
    assert final.keys() == start.keys()
    adapted = {n for n in start if n.endswith(("q_proj.weight", "o_proj.weight"))}
    assert len(adapted) == 8 and all(torch.equal(final[n], start[n]) for n in start if n not in adapted)
    for name in adapted:
        prefix = "base_model.model." + name.removesuffix(".weight")
        delta = (16.0 / 8) * adapter[f"{prefix}.lora_B.weight"] @ adapter[f"{prefix}.lora_A.weight"]
        assert float(delta.abs().max()) > 0, name
        torch.testing.assert_close(final[name], start[name] + delta, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_two_ranks_two_replicas_survive_a_killed_rollout_actor(work, tiny_k2_dir):
    import ray

    from k2post.config.loader import validate_config
    from k2post.rl.controller import RLRun
    from k2post.rl.run_config import RLConfig

    engine = {"dtype": "bfloat16", "max_model_len": 512, "max_num_seqs": 32, "kv_cache_gib": 0.5}
    raw = _config(
        work / "dp",
        tiny_k2_dir,  # MoE: bf16 engines record their experts, the fp32 trainer replays them
        work / "ray_d",
        rollout={"replicas": 2, "prompts_per_iteration": 2, "engine": engine},  # one group per replica
        loss={"groups_per_step": 2, "micro_batch_size": 4},
        trainer={"world_size": 2, "zero_stage": 2},
        train={"iterations": 4},  # iterations 0-2 are driven below; no held-out eval falls due in them
        routing_replay=True,
        qat={"enabled": True},  # INT4 experts in the trainer's forward (ZeRO-2 + MuonClip), pushed as such
    )
    run = RLRun(validate_config(RLConfig, raw, "test"))
    try:
        run.setup()
        first = run.iteration(0)
        run.state.iteration = 1
        assert first["train/steps"] == 1 and first["time/push_s"] > 0
        assert (
            first["push/verified_held"] == 1.0
        )  # the engines hold the INT4 round trip, equal or rounded to their dtype
        victim = ray.get(run.rollouts.actors[1].ready.remote())["pid"]
        os.kill(victim, signal.SIGKILL)
        second = run.iteration(1)
        assert second["rollout/actor_restarts"] == 1
        third = run.iteration(2)  # the replacement serves and receives pushes like the others
        assert third["rollout/finished"] > 0 and run.rollouts.restarts == 1
        for row in (first, second, third):  # every trained token came with the engine's experts, and they were used
            if row["train/steps"]:
                assert row["routing/tokens"] > 0 and row["routing/disagree_used"] == 0.0, row
                assert row["consistency/kl"] > 0  # a bf16 engine against the fp32 trainer
        versions = ray.get([a.weights_version.remote() for a in run.rollouts.actors])
        assert all(v >= 1 for v in versions)
    finally:
        run.close()
        ray.shutdown()
        _kill_leftovers(str(work / "ray_d"))
