"""benchmarks/scale.py's parts: the process-tree memory sampler, the role of each process, the run configs it writes
(valid configs of the real commands), the phase times and the summary (the SFT, eval and RL runs are the benchmark
itself; its `--smoke` runs in test_benchmark_scripts.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import scale  # noqa: E402

MIB = 2**20


@pytest.mark.parametrize(
    ("cmdline", "is_root", "role"),
    [
        (["python", "-m", "k2post.cli", "rl", "x.yaml"], True, "driver"),
        (["ray::RLTrainerWorker.train_step"], False, "trainer"),
        (["ray::RolloutWorker"], False, "rollout"),
        (["ray::IDLE"], False, "ray_idle_worker"),
        (["python", "/x/ray/_private/workers/default_worker.py", "--node-ip-address=1"], False, "ray_idle_worker"),
        (["ray::_StatsActor"], False, "ray_other_worker"),
        (["/x/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp"], False, "ray_infra"),
        (["/x/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/s"], False, "ray_infra"),
        (["python", "/x/ray/_private/log_monitor.py"], False, "ray_infra"),
        (["ray::DashboardAgent"], False, "ray_infra"),
        (["ray::RuntimeEnvAgent"], False, "ray_infra"),
        (["python", "/x/ray/autoscaler/_private/monitor.py", "--logs-dir=/tmp"], False, "ray_infra"),
        (["python", "-c", "from multiprocessing.forkserver import main; main(3, 4)"], False, "worker_pool"),
        (["bash"], False, "other"),
    ],
)
def test_role_of(cmdline, is_root, role):
    assert scale.role_of(cmdline, is_root) == role


def test_tree_memory_keeps_the_split_at_the_peak_and_per_process_peaks():
    def status(anon: int, file: int = 0, shmem: int = 0) -> dict[str, int]:
        return {"rss": anon + file + shmem, "anon": anon, "file": file, "shmem": shmem}

    memory = scale.TreeMemory()
    memory.add_sample({1: ("driver", status(100)), 2: ("trainer", status(300))}, pss_total=350)
    peak = {1: ("driver", status(100)), 2: ("trainer", status(150, 50)), 3: ("rollout", status(300, 60, 40))}
    memory.add_sample(peak, pss_total=None)
    memory.add_sample({1: ("driver", status(50)), 3: ("rollout", status(400))}, pss_total=380)
    memory.finish({1: ("driver", 100), 2: ("trainer", 300), 3: ("rollout", 450), 4: ("rollout", 10)})
    assert memory.peak_rss == 700 and memory.peak_rss_roles == {"driver": 100, "trainer": 200, "rollout": 400}
    assert memory.peak_rss_kinds == {"anon": 550, "file": 110, "shmem": 40}
    assert memory.peak_pss == 380 and memory.samples == 3
    assert memory.hwm_roles == {"driver": 100, "trainer": 300, "rollout": 460} and memory.processes == 4
    figures = memory.to_json()
    assert figures["peak_by_role_gib"]["rollout"] == round(400 / 2**30, 3)


def test_sampler_sums_the_whole_tree(tmp_path):
    # a parent holding ~200 MiB and a child holding ~120 MiB, both touched, alive together for ~1.5 s
    child = "import time; b = bytearray(120 * 2**20); time.sleep(1.5)"
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        b = bytearray(200 * 2**20)
        p = subprocess.Popen([sys.executable, "-c", {child!r}])
        p.wait()
    """)
    seconds, memory = scale.run_sampled([sys.executable, "-c", parent], tmp_path / "log", interval=0.1, pss_every=2)
    assert memory.processes == 2 and memory.samples >= 5
    assert 320 * MIB <= memory.peak_rss <= 420 * MIB, memory.to_json()
    assert memory.peak_rss_roles["driver"] >= 200 * MIB and memory.peak_rss_roles["other"] >= 120 * MIB
    assert memory.hwm_roles["driver"] >= 200 * MIB and memory.peak_pss >= 300 * MIB
    assert memory.peak_rss_kinds["anon"] >= 320 * MIB  # the bytearrays
    assert seconds >= 1.5


def test_a_failed_command_stops_with_its_log(tmp_path):
    with pytest.raises(SystemExit, match="failed \\(exit 3\\):\n.*boom"):
        scale.run_sampled([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "log")


def _args(**changes) -> argparse.Namespace:
    defaults = {"prompts": 2, "samples": 4, "micro_batch": 4, "max_tokens": 32, "eval_n": 4}
    return argparse.Namespace(**{**defaults, **changes})


def test_run_configs_are_valid_configs_of_the_real_commands(tmp_path):
    from k2post.config.registry import load_run_config

    data = scale.write_sft_data(tmp_path / "d.jsonl", 3)
    assert len(data.read_text().splitlines()) == 3
    sft_config = scale.sft_config(tmp_path / "m", data, tmp_path / "sft", 256, zero_stage=1)
    sft = load_run_config(str(scale.write_yaml(tmp_path / "sft.yaml", sft_config)), [], expected_kind="sft")
    assert sft.train.max_steps == 1 and sft.deepspeed.zero_stage == 1 and sft.model.flavor is None
    rl_config = scale.rl_config(tmp_path / "m", tmp_path / "rl", tmp_path, _args(zero_stage=0))
    rl = load_run_config(str(scale.write_yaml(tmp_path / "rl.yaml", rl_config)), [], expected_kind="rl")
    assert rl.train.iterations == 1 and rl.loss.groups_per_step == rl.rollout.prompts_per_iteration == 2
    assert rl.trainer.zero_stage == 0
    assert rl.rollout.engine.kv_cache_gib == 1.0 and rl.rollout.engine.max_num_seqs == 64  # eval's engine
    assert rl.trainer.verify_push_every == 0 and rl.ray.temp_dir == str(tmp_path)


def test_phase_times_excess_and_headline():
    row = {"time/rollout_s": 1.5, "time/push_s": 0.25, "time/push_digest_s": 0.1, "time/trainer_step_s": 2, "x": 1}
    assert scale.rl_phase_times(row) == {"rollout": 1.5, "push": 0.25}
    gib = 2**30
    trainer, engine, colocated = scale.TreeMemory(gib), scale.TreeMemory(2 * gib), scale.TreeMemory(4 * gib)
    colocated.peak_rss_roles = {"trainer": gib, "rollout": 2 * gib + gib // 2, "ray_infra": gib // 2}
    trainer.hwm_roles, engine.hwm_roles = {"driver": 2 * gib}, {"driver": 2 * gib, "worker_pool": gib}
    colocated.hwm_roles = {"trainer": 2 * gib, "rollout": 3 * gib, "ray_infra": gib // 2}
    excess = scale.excess_split(trainer, engine, colocated)
    assert excess == {
        "trainer_actor_minus_sft": 0.0,
        "rollout_actor_minus_eval": 0.5,
        "trainer_actor_own_peak_minus_sft": 0.0,
        "rollout_actor_own_peak_minus_eval": 1.0,
        "ray_infra": 0.5,
        "total_excess": 1.0,
    }
    results = [{"model": "qwen2-0.5b", "params": 5, "memory": {}}, {"model": "tiny-k2", "params": 2, "memory": {}}]
    figures = scale.headline(results)
    assert figures == {"model": "qwen2-0.5b", "params": 5, "tiny_k2": {"model": "tiny-k2", "params": 2}}


def test_memcpy_gbps_is_a_positive_rate():
    started = time.perf_counter()
    assert scale.memcpy_gbps(8 * MIB) > 0.1
    assert time.perf_counter() - started < 5


def test_rollout_child_is_reachable_from_the_command_line():
    help_text = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--models" in help_text and "--rollout-child" not in help_text  # internal flag, hidden
