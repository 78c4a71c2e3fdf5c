"""An RL run with the self-critique critic in the mix (slow): group-scored self_critique prompts judged by the
policy's own engine, and critic_calibration fed on-policy by the closed loop.

Mix: instruction_following (a lowercase constraint; the policy, briefly trained on a lowercase and a
Title-Case reply, samples either, so groups have mixed results),
self_critique (rewards from the critic: every pair of the K responses judged in both orders on the
rollout actor's engine), critic_calibration (sources: instruction_following; it starts empty and
fills with judge tasks built from mixed groups). Checked: the run completes; critic metrics are
logged per iteration (calls = groups x K(K-1), tokens counted, rates in [0, 1]); judge tasks are
harvested and then rolled out; the critic plots are in the run dir; resume keeps the grown pool.

The resume is a Ray job: `ray job submit --working-dir . -- python -m k2post_pipelines.rl --resume RUN` on a private
head (fixture `ray_head`, tests/pipelines/conftest.py: its own temp dir and ports, RAY_AUTH_MODE set). The job joins
that cluster (RAY_ADDRESS; the config's own `ray:` init settings are then unused), places the trainer and rollout
actors there, and must reach SUCCEEDED with a loadable model in the run dir.

An environment plugin rides along (docs/ENVIRONMENTS.md, "Plugins in a `ray job submit` run"): the mix also names
`k2post_job_plugin.dice:DiceEnv`, a package the test writes into a temp dir (not installed, not in the repo, not on
the head's path). The first run finds it through PYTHONPATH; the resumed job only through `--runtime-env-json
'{"py_modules": [PKG_DIR]}'`. The plugin's one prompt per iteration gets a constant reward no built-in gives (no
advantage, so its groups never train and the critic part is as before), and each DiceEnv() records where it was
built: the job's metrics must carry its reward, and the job's driver and its rollout actor must have built it from
the shipped copy. Without the code a process told to load it fails with the registry's one-line reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from coin_policy import IF_CONFIG
from proc_helpers import run_bounded
from ray_jobs import job_status, submit

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
K = 4
PLUGIN_REF, PLUGIN_ENV, PLUGIN_REWARD = "k2post_job_plugin.dice:DiceEnv", "job_dice", 0.375
PLUGIN = """
import json, os, sys

from k2post.chat.types import Message
from k2post.envs import Environment, Reward, Task

MARKER = {marker!r}


class DiceEnv(Environment):
    name = {name!r}
    task_type = "toy"

    def __init__(self, config=None):
        super().__init__(config)
        actor = None
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            actor = sys.modules["ray"].get_runtime_context().get_actor_id()
        record = {{"pid": os.getpid(), "file": __file__, "actor": actor, "argv0": sys.argv[0]}}
        with open(MARKER, "a") as out:  # who built me, from which copy of this file
            out.write(json.dumps(record) + "\\n")

    def tasks(self, split="train", seed=0, n=None):
        for i in range(n or 4):
            prompt = Message(role="user", content=f"Roll die {{i}} and say the number.")
            yield Task(id=f"{{split}}-{{seed}}-{{i}}", env=self.name, task_type="toy", messages=[prompt], answer=i)

    def score(self, task, response):
        return Reward(value={reward!r})
"""


def _config(run_dir: Path, model_dir: Path, ray_tmp: Path) -> dict:
    return {
        "kind": "rl",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"path": str(model_dir), "flavor": None},
        "envs": [
            {"name": "instruction_following", "config": IF_CONFIG},
            {"name": "self_critique", "config": {"critic": {"rubric_kinds": ["core"], "max_tokens": 8}}},
            {
                "name": "critic_calibration",
                "config": {"sources": [{"name": "instruction_following", "config": IF_CONFIG}]},
            },
            {"name": PLUGIN_REF, "weight": 0.5},  # 7 prompts: 2 + 2 + 2 as before, + 1 for the plugin
        ],
        "rollout": {
            "prompts_per_iteration": 7,
            "samples_per_prompt": K,
            "engine": {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 64, "kv_cache_gib": 0.5},
            "agentic": {"max_turns": 1, "max_turn_tokens": 24, "max_episode_tokens": 48},
        },
        "loss": {"groups_per_step": 2, "micro_batch_size": 8, "max_steps_per_iteration": 3},
        "optim": {"lr": 0.001},
        "budget": {"default_max_tokens": 24, "penalty": "none"},
        "train": {
            "iterations": 3,
            "prompt_pool_per_env": 16,
            "eval_every": 0,
            "eval_tasks_per_env": 2,
        },
        "checkpoint": {"every": 2},
        "critic": {"harvest_pairs_per_group": 2},
        "ray": {"num_cpus": 2, "temp_dir": str(ray_tmp)},
    }


def write_plugin(root: Path, marker: Path) -> Path:
    """root/k2post_job_plugin/{__init__,dice}.py; returns the package dir."""
    package = root / "k2post_job_plugin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "dice.py").write_text(PLUGIN.format(marker=str(marker), name=PLUGIN_ENV, reward=PLUGIN_REWARD))
    return package


def test_rl_with_the_critic_in_the_mix_logs_critic_metrics_and_grows_the_calibration_pool(coin_policy_dir, ray_head):
    from k2post.rl.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="k2crit_", dir="/tmp") as tmp:
        work = Path(tmp)
        package = write_plugin(work / "plugins", work / "built_by.jsonl")
        config = work / "rl.yaml"
        config.write_text(yaml.safe_dump(_config(work / "run", coin_policy_dir, work / "ray")))
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
        )
        started = time.monotonic()
        first = run_bounded(
            [sys.executable, "-m", "k2post.cli", "rl", str(config), "train.stop_at_iteration=2"],
            timeout=900,
            cwd=REPO,
            env=env,
        )
        assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
        without_the_code_the_error_names_the_plugin(ray_head[1])
        (work / "built_by.jsonl").unlink()
        first_s, started = time.monotonic() - started, time.monotonic()
        resumed_as_a_job(ray_head, work / "run", package)
        print(f"first run {first_s:.1f}s, ray job {time.monotonic() - started:.1f}s")
        plugin_shipped_to_the_job(work / "built_by.jsonl", package)
        rows = read_metrics(work / "run" / "metrics.jsonl")[1:]
        judged = [r for r in rows if "critic/calls" in r]
        assert judged, "no self_critique group was judged"
        for row in judged:
            assert row["critic/calls"] % (K * (K - 1)) == 0 and row["critic/tokens"] > row["critic/calls"] * 50
            assert all(
                0.0 <= row[k] <= 1.0 for k in ("critic/unparseable_rate", "critic/tie_rate", "critic/position_a_rate")
            )
        harvested = [r["calibration/harvested_tasks"] for r in rows]
        pool = [r["calibration/pool"] for r in rows]
        assert len(rows) == 3 and harvested == sorted(harvested) and harvested[-1] > 0, (
            harvested
        )  # resume kept the count
        assert pool == sorted(pool) and pool[-1] >= harvested[-1], pool  # ... and the grown pool
        assert any("reward/critic_calibration" in r for r in rows), "harvested judge tasks were never rolled out"
        assert [r.get(f"reward/{PLUGIN_ENV}") for r in rows] == [PLUGIN_REWARD] * 3  # the plugin scored, job included
        plots = {p.name for p in (work / "run" / "plots").glob("*.png")}
        assert {"critic_judging.png", "critic_agreement.png"} <= plots


def without_the_code_the_error_names_the_plugin(head_env: dict) -> None:
    """The head's env cannot import the plugin (so the job must get it from py_modules); a process told to load it
    anyway (what an actor without the code is) fails with the registry's one line, not a bare 'unknown'."""
    code = "from k2post.envs.registry import make_environment; make_environment(%r)" % PLUGIN_ENV
    env = dict(head_env, K2POST_ENV_PLUGINS=PLUGIN_REF)
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and f"unknown environment {PLUGIN_ENV!r}" in last, done.stderr[-2000:]
    assert f"{PLUGIN_REF!r} failed to import: ModuleNotFoundError: No module named 'k2post_job_plugin'" in last, last


def plugin_shipped_to_the_job(built_by: Path, package: Path) -> None:
    """Every DiceEnv the job built came from the py_modules copy (not the test's dir), in the job's driver and in
    a Ray actor (the rollout replica builds its environments)."""
    records = [json.loads(line) for line in built_by.read_text().splitlines()]
    assert records and all(not r["file"].startswith(str(package)) for r in records), records
    assert any(r["actor"] for r in records), f"no Ray actor built the plugin env: {records}"
    assert any(not r["actor"] and r["argv0"].endswith("rl.py") for r in records), f"not built in the driver: {records}"


def resumed_as_a_job(ray_head: tuple[str, dict], run_dir: Path, plugin: Path) -> None:
    """`k2post_pipelines.rl --resume run_dir` as a Ray job on the private head, the plugin package shipped with
    `py_modules`: SUCCEEDED, its summary line came back through the job server, and the final model loads and gives
    finite logits."""
    import torch

    from k2post.models.loading import load_causal_lm, load_tokenizer

    address, env = ray_head
    job_id = f"k2post-rl-test-{uuid.uuid4().hex[:8]}"
    command = ("python", "-m", "k2post_pipelines.rl", "--resume", str(run_dir))
    py_modules = json.dumps({"py_modules": [str(plugin)]})
    job = submit(address, env, job_id, *command, timeout=900, runtime_env_json=py_modules)
    output = job.stdout + job.stderr
    assert job.returncode == 0, output[-4000:]
    assert job_status(address, env, job_id) == "SUCCEEDED"
    assert '"completed": true' in output  # the job's own summary line came back through the job server
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["optimizer_steps"] >= 1
    model = load_causal_lm(run_dir / "final")
    ids = load_tokenizer(run_dir / "final")("hello", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()
