"""Each benchmark script runs (in its smoke form where it has one, else its quick form) and ends with one JSON line of
its figures: a check that every step of the script runs, not a measurement. The scripts' `k2post` runner
(benchmarks/_k2post_cli.py) in this process: output in the log, working directory and environment restored."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from proc_helpers import run_bounded

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._k2post_cli import run_cli  # noqa: E402

CASES = {
    "critic_calibration.py": (
        ["--smoke"],
        {"agreement_before", "agreement_after", "math_before", "math_after", "pairs"},
    ),
    "muon_step.py": (["--smoke"], {"ours_s", "torch_s", "ratio", "ns_overhead_tiny", "ns_overhead_100m"}),
    "qk_clip_stress.py": (["--steps", "6"], {"muon_peak_logit", "muonclip_peak_logit", "tau"}),
    "reward_throughput.py": (["--quick"], {"direct_scores_per_s", "pool_scores_per_s", "workers"}),
    "rollout.py": (["--smoke"], {"vllm_tok_s", "hf_tok_s", "speedup", "push_ms", "rebuild_ms"}),
    "rl_vs_trl.py": (
        ["--smoke", "--sft-model", "none"],
        {"k2post_final_acc", "trl_final_acc", "k2post_s_to_trl_acc", "trl_s", "time_ratio"},
    ),
    "weight_sync.py": (
        ["--quick", "--small-tensors", "0"],
        {
            "bytes",
            "engine_gbps",
            "memcpy_gbps",
            "disk_gbps",
            "per_tensor_bcast_gbps",
            "ratio_vs_memcpy",
            "speedup_vs_disk",
        },
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(CASES))
def test_benchmark_ends_with_json(script, tmp_path):
    args, keys = CASES[script]
    extra = ["--out", str(tmp_path)] if script in ("qk_clip_stress.py", "rl_vs_trl.py", "critic_calibration.py") else []
    proc = run_bounded([sys.executable, str(ROOT / "benchmarks" / script), *args, *extra], timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert keys <= set(figures)


def test_in_process_commands_write_their_log_and_leave_no_trace(tmp_path, monkeypatch, capfd):
    def no_child(*args, **kwargs):
        raise AssertionError("started a child process")

    monkeypatch.setattr("benchmarks._k2post_cli.subprocess.run", no_child)
    monkeypatch.chdir(tmp_path)  # relative paths resolve from the repo root, as in a child process
    monkeypatch.setenv("VLLM_PROBE", "kept")
    environ = dict(os.environ)
    log = tmp_path / "show.log"
    run_cli(["config", "show", "configs/demo.yaml", "sampling.max_tokens=7"], log, in_process=True)
    assert "max_tokens: 7" in log.read_text() and capfd.readouterr().out == ""
    assert Path.cwd() == tmp_path and dict(os.environ) == environ
    with pytest.raises(SystemExit, match=r"k2post config failed \(exit 2\):\n.*sampling.temprature: unknown key"):
        run_cli(["config", "show", "configs/demo.yaml", "sampling.temprature=0"], log, in_process=True)
    assert capfd.readouterr().out == ""
