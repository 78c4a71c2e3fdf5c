"""MFU (k2post/train/mfu.py): the peak table by device name, the measured CPU peak, the MFU and training-FLOPs
functions, and the rows SFT (`k2post.sft.trainer.perf_metrics`) and RL (`k2post.rl.metrics.train_perf`) log."""

from __future__ import annotations

import types

import pytest

from k2post.models.stats import preset_config
from k2post.rl.metrics import PerfModel, rollout_perf, train_perf
from k2post.train import mfu
from k2post.train.metrics import perf_text


@pytest.fixture(scope="module")
def tiny_k2():
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(preset_config("tiny-k2"))


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H800", 989e12),
        ("NVIDIA H20", 148e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("AMD Instinct MI300X", 1307e12),
        ("NVIDIA GeForce RTX 4090", None),
        ("cpu", None),
    ],
)
def test_peak_table(name, peak):
    assert mfu.table_peak(name) == peak


@pytest.mark.parametrize(
    ("tokens_per_s", "flops_per_token", "peak", "expected"),
    [(1000.0, 1e9, 1e12, 1.0), (500.0, 2e9, 4e12, 0.25), (0.0, 1e9, 1e12, 0.0), (1.2e3, 141.6e6, 40e12, 0.004248)],
)
def test_mfu(tokens_per_s, flops_per_token, peak, expected):
    assert mfu.mfu(tokens_per_s, flops_per_token, peak) == pytest.approx(expected)


def test_mfu_needs_a_positive_peak():
    with pytest.raises(ValueError, match="peak FLOP/s must be positive"):
        mfu.mfu(1.0, 1.0, 0.0)


def test_gpu_peak_comes_from_the_table_by_device_name(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert mfu.peak_flops("cuda:0", "bfloat16") == (989e12, "table: NVIDIA H100 80GB HBM3")


def test_cpu_peak_is_measured_once_per_process():
    peak, source = mfu.peak_flops("cpu", "float32")
    assert 1e8 < peak < 1e14 and source.startswith("measured: CPU, float32 matmul")
    hits = mfu.measured_peak.cache_info().hits
    assert mfu.peak_flops("cpu", "torch.float32")[0] == peak and mfu.measured_peak.cache_info().hits == hits + 1


@pytest.mark.parametrize("context", [1.0, 100.0, 4096.0])
def test_train_flops_per_token_is_three_forwards(tiny_k2, context):
    params = dict(tiny_k2.named_parameters())
    matmul = sum(
        p.numel() * (2 / 8 if ".mlp.experts." in n else 1)
        for n, p in params.items()
        if p.dim() >= 2 and "embed_tokens" not in n
    )
    attention = 2 * 4 * 4 * context * (64 + 64 + 64)  # layers x heads x keys x (qk nope + rope + v), x 2
    expected = 3 * (2 * matmul + attention)
    assert mfu.train_flops_per_token(tiny_k2, context) == pytest.approx(expected)
    assert mfu.train_flops_per_token(tiny_k2, context, matrix_flops=2 * int(matmul)) == pytest.approx(expected)


def test_sft_perf_row(tiny_k2):
    from k2post.models.stats import matrix_flops_per_token
    from k2post.sft.trainer import perf_metrics

    matrix = matrix_flops_per_token(tiny_k2)
    run = types.SimpleNamespace(
        engine=types.SimpleNamespace(module=tiny_k2),
        matrix_flops=matrix,
        peak=(1e9, "test"),
        dist=types.SimpleNamespace(world_size=2),
    )
    row = perf_metrics(run, [3, 5], 2.0)  # two packed dialogues: 8 tokens in 2 s
    context = (6 + 15) / 8  # causal: keys per token averaged over both dialogues
    assert row["perf/tokens_per_s"] == 4.0
    assert row["perf/mfu"] == pytest.approx(4.0 * mfu.train_flops_per_token(tiny_k2, context) / 2e9)


def test_rl_perf_rows(tiny_k2):
    matrix = mfu.matrix_flops_per_token(tiny_k2)
    perf = PerfModel(tiny_k2.config, matrix, 1e10, "test")
    row = train_perf(perf, [4, 4, 2], 0.5, world_size=1)
    assert row["perf/train_tokens_per_s"] == 20.0
    assert row["perf/mfu"] == pytest.approx(20.0 * mfu.train_flops(tiny_k2.config, matrix, (10 + 10 + 3) / 10) / 1e10)
    assert train_perf(None, [4], 1.0, 1) == {"perf/train_tokens_per_s": 4.0}  # no model config: no MFU
    assert train_perf(perf, [4], None, 1) == {}  # no step time
    episodes = [types.SimpleNamespace(generated_tokens=n) for n in (30, 50)]
    assert rollout_perf(episodes, 2.0) == {"perf/rollout_tokens_per_s": 40.0}


@pytest.mark.parametrize(
    ("row", "text"),
    [
        ({"perf/tokens_per_s": 1234.0, "perf/mfu": 0.031}, "1.2k tok/s MFU 3.1%"),
        ({"perf/tokens_per_s": 950.0, "perf/mfu": 0.0042}, "950 tok/s MFU 0.42%"),
        ({"perf/tokens_per_s": 2.5e6}, "2.5M tok/s"),
        ({}, ""),
    ],
)
def test_progress_text(row, text):
    assert perf_text(row) == text
