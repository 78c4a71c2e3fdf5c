"""Each benchmark script runs (in its smoke form where it has one, else its quick form) and ends with one JSON line of
its figures: a check that every step of the script runs, not a measurement. The scripts' `k2post` runner
(benchmarks/_k2post_cli.py) in this process: output in the log, working directory and environment restored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._k2post_cli import run_cli  # noqa: E402

CASES = {
    "critic_calibration.py": (
        ["--smoke"],
        {"agreement_before", "agreement_after", "math_before", "math_after", "pairs"},
    ),
    "faithfulness_judge.py": (["--smoke"], {"judge_acc", "lexical_acc", "pairs", "per_kind"}),
    "muon_step.py": (["--smoke"], {"ours_s", "torch_s", "ratio", "ns_overhead_tiny", "ns_overhead_100m"}),
    "qk_clip_stress.py": (["--steps", "6"], {"muon_peak_logit", "muonclip_peak_logit", "tau"}),
    "reward_throughput.py": (["--quick"], {"direct_scores_per_s", "pool_scores_per_s", "workers"}),
    "reward_hacks.py": (["--smoke"], {"gyms", "gyms_hackable", "gyms_not_judged", "worst_margin", "worst", "per_gym"}),
    "rl_consistency.py": (
        ["--quick"],
        {
            "mismatch_kl_no_replay",
            "mismatch_kl_replay",
            "router_disagree_no_replay",
            "router_disagree_replay",
            "verify_cost_ratio",
        },
    ),
    "rephrase_ablation.py": (
        ["--smoke"],
        {"acc_original_10ep", "acc_1rephrase_10ep", "acc_10rephrase_1ep", "seeds", "start_acc"},
    ),
    "rollout.py": (["--smoke"], {"vllm_tok_s", "hf_tok_s", "speedup", "push_ms", "rebuild_ms"}),
    "scale.py": (
        ["--smoke"],
        {"params", "trainer_peak_gib", "engine_peak_gib", "colocated_peak_gib", "push_ratio_vs_memcpy"},
    ),
    "sandbox_backends.py": (["--runs", "2"], {"k2post_ms", "bwrap_ms", "plain_ms", "k2post_over_bwrap", "runs"}),
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


# Scripts run side by side, in two groups (the two end-to-end smokes: synth -> SFT -> RL -> eval; the rest): most of
# a smoke is single-core process start-up, so the 2 cores take two at once (like the RL kill test's reference run).
# Only the JSON line is checked here, never a timing, so sharing the cores changes nothing: ~70 s less CI.
TOGETHER = [
    ("critic_calibration.py", "rl_vs_trl.py"),
    (
        "muon_step.py",
        "qk_clip_stress.py",
        "reward_throughput.py",
        "reward_hacks.py",
        "rollout.py",
        "weight_sync.py",
        "sandbox_backends.py",
        "rl_consistency.py",
        "faithfulness_judge.py",
        "rephrase_ablation.py",
    ),
]
GROUPS = [*TOGETHER, *((script,) for script in sorted(CASES) if not any(script in group for group in TOGETHER))]


def _command(script: str, out: Path) -> list[str]:
    args, _ = CASES[script]
    extra = (
        ["--out", str(out)]
        if script
        in (
            "qk_clip_stress.py",
            "rl_vs_trl.py",
            "critic_calibration.py",
            "scale.py",
            "faithfulness_judge.py",
            "rephrase_ablation.py",
        )
        else []
    )
    return [sys.executable, str(ROOT / "benchmarks" / script), *args, *extra]


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS, ids=["+".join(group) for group in GROUPS])
def test_benchmark_ends_with_json(group, tmp_path):
    procs = {}
    for script in group:
        out = tmp_path / script.removesuffix(".py")
        out.mkdir()
        with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
            procs[script] = subprocess.Popen(
                _command(script, out), cwd=ROOT, stdout=stdout, stderr=stderr, start_new_session=True
            )
    try:
        for proc in procs.values():
            proc.wait(timeout=900)
    finally:
        for proc in procs.values():
            if proc.poll() is None:  # timed out: the script and its children (SFT, RL and their Ray)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for script, proc in procs.items():
        out = tmp_path / script.removesuffix(".py")
        assert proc.returncode == 0, f"{script}: {(out / 'stderr').read_text()[-2000:]}"
        figures = json.loads((out / "stdout").read_text().strip().splitlines()[-1])
        assert CASES[script][1] <= set(figures), script


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
