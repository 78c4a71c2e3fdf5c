"""benchmarks/demo_seeds.py's figures from hand-made recipe reports (the heavy runs are the benchmark itself)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("demo_seeds", ROOT / "benchmarks" / "demo_seeds.py")
demo_seeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo_seeds)


def _pair(before: float, after: float, n: int = 200) -> dict:
    return {"before": {"accuracy": before, "n": n}, "after": {"accuracy": after, "n": n}}


def _report(
    math: tuple, tool: tuple, critic: tuple | None = None, shifted: dict | None = None, wall_s: float = 600.0
) -> dict:
    envs = {"math": _pair(*math), "tool_use": _pair(*tool, n=210)}
    if critic:
        envs["critic_calibration"] = _pair(*critic)
    return {"envs": envs, "shifted": shifted or {}, "wall_s": wall_s}


def test_summary_of_three_seeds():
    reports = [
        _report((0.5, 0.7), (0.2, 0.5), (0.5, 0.7), {"math": _pair(0.1, 0.2)}),
        _report((0.5, 0.6), (0.3, 0.4), (0.5, 0.6), {"math": _pair(0.1, 0.1)}),
        _report((0.4, 0.7), (0.1, 0.3), (0.5, 0.8), {"math": _pair(0.2, 0.3)}, wall_s=1200.0),
    ]
    out = demo_seeds.summarize([0, 1, 2], reports)
    gains = [(0.2 + 0.3 + 0.2) / 3, (0.1 + 0.1 + 0.1) / 3, (0.3 + 0.2 + 0.3) / 3]
    assert out["gain_mean"] == pytest.approx(sum(gains) / 3)
    assert out["gain_min"] == pytest.approx(min(gains))
    assert out["gain_std"] > 0
    assert out["shifted_gain_mean"] == pytest.approx((0.1 + 0.0 + 0.1) / 3)
    assert out["tool_sft_acc"] == pytest.approx(0.2) and out["tool_gain_mean"] == pytest.approx(0.2)
    assert out["critic_agreement_before"] == pytest.approx(0.5) and out["critic_agreement_after"] == pytest.approx(0.7)
    assert out["test_tasks_min"] == 200 and out["demo_minutes"] == pytest.approx(800 / 60)


def test_summary_without_tool_critic_or_shifted_sets_says_none():
    report = {"envs": {"math": _pair(0.5, 0.6)}, "wall_s": 60.0}
    out = demo_seeds.summarize([0], [report])
    assert out["gain_std"] == 0.0 and out["shifted_gain_mean"] is None
    assert out["tool_sft_acc"] is None and out["critic_agreement_after"] is None


def test_ablation_summary_per_variant():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    _ab_spec = importlib.util.spec_from_file_location("demo_ablations", ROOT / "benchmarks" / "demo_ablations.py")
    ablations = importlib.util.module_from_spec(_ab_spec)
    _ab_spec.loader.exec_module(ablations)

    def report(gain: float, tokens: float, truncated: float) -> dict:
        pair = {
            "before": {"accuracy": 0.2, "n": 200},
            "after": {"accuracy": 0.2 + gain, "n": 200, "response_tokens_mean": tokens, "truncation_rate": truncated},
        }
        return {"envs": {"math": pair}, "shifted": {}}

    out = ablations.summarize(
        {"full": [report(0.2, 10, 0.0), report(0.1, 12, 0.1)], "no_budget": [report(0.0, 30, 0.5)]}
    )
    assert out["full"]["gain_mean"] == pytest.approx(0.15) and out["full"]["gain_std"] > 0
    assert out["full"]["response_tokens_after"] == pytest.approx(11) and out["full"][
        "truncation_after"
    ] == pytest.approx(0.05)
    assert out["no_budget"]["gain_mean"] == pytest.approx(0.0) and out["no_budget"]["shifted_gain_mean"] == 0.0
    assert set(ablations.VARIANTS) == {"full", "no_budget", "no_ptx", "no_temp_decay", "with_ptx", "tight_budget"}
    assert [n for n in ablations.VARIANTS if ablations.changes_budget(n)] == ["tight_budget"]


def test_ablation_overrides_are_valid_rl_config_fields():
    from k2post.config.registry import load_run_config

    spec = importlib.util.spec_from_file_location("demo_ablations", ROOT / "benchmarks" / "demo_ablations.py")
    ablations = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablations)
    for name in ablations.VARIANTS:
        overrides = ablations.overrides_of(name, Path("runs/x"))
        assert all("{" not in o for o in overrides), overrides
        load_run_config(str(ROOT / "configs" / "rl_demo.yaml"), overrides, expected_kind="rl")


def test_ablation_variant_that_changes_nothing_is_not_rerun():
    """A variant equal to the demo's RL config (no_ptx while the demo has PTX off) reuses full's runs."""
    import yaml

    spec = importlib.util.spec_from_file_location("demo_ablations", ROOT / "benchmarks" / "demo_ablations.py")
    ablations = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablations)
    ptx_off = yaml.safe_load((ROOT / "configs" / "rl_demo.yaml").read_text())["loss"].get("ptx_coef", 0.0) == 0
    assert ablations.same_as_full("configs/recipe_demo.yaml", "no_ptx") is ptx_off
    assert not ablations.same_as_full("configs/recipe_demo.yaml", "no_budget")
    assert not ablations.same_as_full("configs/recipe_demo.yaml", "no_temp_decay")
    assert not ablations.same_as_full("configs/recipe_demo.yaml", "with_ptx")


def test_summary_reports_the_critic_s_best_single_feature_baseline():
    reports = [_report((0.5, 0.7), (0.2, 0.5), (0.5, 0.7)) for _ in range(2)]
    assert demo_seeds.summarize([0, 1], reports)["critic_baseline_best"] is None  # reports from before it was measured
    for report, best in zip(reports, (0.52, 0.56)):
        report["envs"]["critic_calibration"]["before"]["baseline_best"] = best
    assert demo_seeds.summarize([0, 1], reports)["critic_baseline_best"] == pytest.approx(0.54)
