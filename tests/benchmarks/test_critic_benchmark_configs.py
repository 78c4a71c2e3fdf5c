"""benchmarks/critic_calibration.py's generated configs validate for both pair kinds (fast: no model, no run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from k2post.config.loader import validate_config
from k2post.rl.run_config import RLConfig
from k2post.synth.config import SynthConfig

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("critic_bench", ROOT / "benchmarks" / "critic_calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv",
    [["--quick"], ["--pair-kind", "malformed", "--judge-rows", "12", "--critic-weight", "3", "--drop-uniform-groups"]],
)
def test_synth_and_rl_configs_validate(argv, tmp_path, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(sys, "argv", ["critic_calibration.py", "--out", str(tmp_path), *argv])
    args = bench.parse_args()
    synth = validate_config(SynthConfig, yaml.safe_load(bench.synth_config(args, tmp_path).read_text()), "synth.yaml")
    rl = validate_config(RLConfig, bench.rl_config(args, tmp_path / "sft", tmp_path / "rl", None), "rl.yaml")
    calibration = next(e for e in rl.envs if e.name == "critic_calibration")
    if args.pair_kind == "malformed":
        judge = next(g for g in synth.gym_tasks if g.env == "critic_calibration")
        assert judge.tasks == 12 and judge.config["pair_kind"] == "malformed" and synth.gym_tasks[0].judge_share == 0
        assert (
            calibration.config["prompt_style"] == "compact"
            and rl.critic.harvest_pairs_per_group == 0
            and calibration.weight == 3
        )
        assert rl.loss.drop_uniform_groups
    else:
        assert [g.env for g in synth.gym_tasks] == ["math", "math", "reasoning_gym"] and synth.gym_tasks[
            0
        ].judge_share == 0.3
        assert (
            synth.gym_tasks[0].tasks == 300
            and synth.gym_tasks[2].tasks == 40
            and rl.critic.harvest_pairs_per_group == 2
        )
        assert not rl.loss.drop_uniform_groups


def test_from_demo_reads_each_seeds_critic_and_position_prior(tmp_path, capsys):
    """--from-demo: agreement before/after from the seeds' reports; the prior from each run's test pairs."""
    bench = _bench()
    entry = next(
        e
        for e in yaml.safe_load((ROOT / "configs" / "rl_demo.yaml").read_text())["envs"]
        if e["name"] == "critic_calibration"
    )
    for seed, (before, after) in enumerate([(0.5, 0.9), (0.6, 0.8)]):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        (run / "rl_config.yaml").write_text(yaml.safe_dump({"envs": [entry]}))
        pair = {"before": {"accuracy": before, "n": 40}, "after": {"accuracy": after, "n": 40}}
        (run / "report.json").write_text(__import__("json").dumps({"envs": {"critic_calibration": pair}}))
    out = bench.demo_figures(tmp_path, [0, 1])
    assert out["agreement_before"] == pytest.approx(0.55) and out["agreement_after"] == pytest.approx(0.85)
    at_a = out["per_seed"][0]["at_a"]
    assert out["position_prior"] == pytest.approx(max(at_a, 1 - at_a)) and out["position_prior"] >= 0.5
    assert out["gain_over_start_min"] == pytest.approx(0.2)
    assert out["gain_over_prior_min"] == pytest.approx(0.8 - out["position_prior"])
    assert "always B" in capsys.readouterr().out
