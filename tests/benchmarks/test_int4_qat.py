"""benchmarks/int4_qat.py's parts: the served INT4 model dir, the QAT arm's branch and overrides, the summary (the
heavy recipe runs are the benchmark itself)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("int4_qat", ROOT / "benchmarks" / "int4_qat.py")
int4_qat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(int4_qat)


def test_int4_served_dir_holds_the_fake_quant_experts_and_loads(tiny_k2_dir, tmp_path):
    from k2post.models.loading import load_causal_lm
    from k2post.quant.config import QATConfig
    from k2post.quant.qat import quantized_weights

    served, weights = int4_qat.int4_served(Path(tiny_k2_dir), tmp_path / "int4")
    original, loaded = load_causal_lm(tiny_k2_dir), load_causal_lm(served)
    expected = quantized_weights(original, QATConfig(enabled=True))
    assert expected and weights == sum(t.numel() for t in expected.values())
    state = loaded.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name  # the served model computes with the INT4 round trip
    untouched = [n for n in original.state_dict() if n not in expected and "experts" not in n]
    assert all(torch.equal(state[n], original.state_dict()[n]) for n in untouched)
    assert int4_qat.int4_served(Path(tiny_k2_dir), tmp_path / "int4") == (served, weights)  # reused


def test_expert_bytes_ratio_is_nibbles_plus_bf16_scales_over_bf16():
    assert int4_qat.expert_bytes_ratio(32 * 1000) == pytest.approx((0.5 + 2 / 32) / 2)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], ["rl_overrides=[qat.enabled=true]"]),
        (
            ["eval_n=5", "rl_overrides=[train.iterations=3, a.b=1]"],
            ["rl_overrides=[train.iterations=3, a.b=1, qat.enabled=true]"],
        ),
    ],
)
def test_qat_arm_adds_qat_to_the_rl_overrides(overrides, expected):
    assert int4_qat.qat_rl_overrides(overrides) == expected


def test_qat_arm_branches_from_the_plain_runs_sft_but_not_its_rl(tmp_path):
    plain = tmp_path / "plain"
    for path in ("model/config.json", "sft/final/config.json", "eval/before_rl.json", "eval/after_rl.json", "rl/x"):
        (plain / path).parent.mkdir(parents=True, exist_ok=True)
        (plain / path).write_text("{}")
    (plain / "rl_config.yaml").write_text("kind: rl\n")
    int4_qat.branch_from(plain, tmp_path / "qat")
    copied = sorted(str(p.relative_to(tmp_path / "qat")) for p in (tmp_path / "qat").rglob("*") if p.is_file())
    assert copied == ["eval/before_rl.json", "model/config.json", "rl_config.yaml", "sft/final/config.json"]


def test_summary_is_mean_and_std_over_seeds():
    rows = [
        {"seed": s, "bf16_acc": b, "ptq_int4_acc": p, "qat_int4_acc": q, "weights": 3200, "minutes": 10.0}
        for s, b, p, q in ((0, 0.5, 0.4, 0.5), (1, 0.7, 0.5, 0.6))
    ]
    out = int4_qat.summarize(rows)
    assert (
        out["seeds"] == [0, 1] and out["bf16_acc"] == pytest.approx(0.6) and out["ptq_int4_acc"] == pytest.approx(0.45)
    )
    assert out["qat_int4_acc_std"] == pytest.approx(0.0707, abs=1e-4) and out["minutes_per_seed"] == 10.0
