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


def _matmul_seconds(monkeypatch, seconds: list[float]) -> None:
    """Every timed matmul takes the next of `seconds` (the last one from then on); no pause between rounds."""
    left = list(seconds)

    def timed(size, device, dtype):
        return left.pop(0) if len(left) > 1 else left[0]

    monkeypatch.setattr(mfu, "_time_mm", timed)
    monkeypatch.setattr(mfu, "MEASURE_PAUSE_S", 0.0)


def test_measured_peak_is_the_best_round_and_never_below_the_best_kept(tmp_path, monkeypatch):
    """Other processes on the cores make a measurement slow, never fast: the best of the rounds counts, and a
    later run measuring under contention keeps the best one measured before on this machine."""
    monkeypatch.setenv("K2POST_CACHE_DIR", str(tmp_path))
    flops = 2.0 * 128**3  # max_size 128: no doubling, each round = the best of MEASURE_REPEATS matmuls
    rounds = mfu.MEASURE_ROUNDS * mfu.MEASURE_REPEATS
    _matmul_seconds(monkeypatch, [0.004] * mfu.MEASURE_REPEATS + [0.001] + [0.004] * rounds)  # one quiet moment
    assert mfu.measured_peak.__wrapped__("cpu", "float32", 128) == pytest.approx(flops / 0.001)
    assert mfu.peak_cache_path() == tmp_path / "peak_flops.json" and mfu.peak_cache_path().exists()
    _matmul_seconds(monkeypatch, [0.002])  # contended now: half the speed
    assert mfu.measured_peak.__wrapped__("cpu", "float32", 128) == pytest.approx(flops / 0.001)
    _matmul_seconds(monkeypatch, [0.0005])  # faster than ever: the new best is kept
    assert mfu.measured_peak.__wrapped__("cpu", "float32", 128) == pytest.approx(flops / 0.0005)
    _matmul_seconds(monkeypatch, [0.002])
    assert mfu.measured_peak.__wrapped__("cpu", "float32", 128) == pytest.approx(flops / 0.0005)


def test_a_peak_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("K2POST_CACHE_DIR", str(tmp_path / "file" / "below"))
    assert mfu.remember_peak("key", 5.0) == 5.0
    monkeypatch.setenv("K2POST_CACHE_DIR", str(tmp_path))
    (tmp_path / "peak_flops.json").write_text("not json")
    assert mfu.remember_peak("key", 3.0) == 3.0 and mfu.remember_peak("key", 2.0) == 3.0


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


MASKS = [  # (loss mask: prompt 0s, model tokens 1s, tool output 0s inside; logits window the trainer computes)
    ([0, 0, 1, 1, 1], 4),  # 2 prompt + 3 response: logits from the last prompt position on
    ([0] * 10 + [1] * 6, 7),
    ([1, 1, 1, 1], 4),  # nothing before the first trained token: no position to spare
    ([0, 1], 2),
    ([0, 0, 1, 1, 0, 0, 1], 6),  # a tool result between turns is inside the window
    ([0, 0, 0], 1),  # nothing trained: the trainer still asks for one position
]


@pytest.mark.parametrize(("mask", "window"), MASKS)
def test_head_positions_are_the_trainers_logits_window(mask, window):
    import torch

    from k2post.rl.losses import logits_window

    assert mfu.head_positions(mask) == window == logits_window(torch.tensor([mask]))


def test_step_flops_count_the_head_only_where_logits_are_computed(tiny_k2):
    params = dict(tiny_k2.named_parameters())
    head = params["lm_head.weight"].numel()
    matmul = sum(
        p.numel() * (2 / 8 if ".mlp.experts." in n else 1)
        for n, p in params.items()
        if p.dim() >= 2 and "embed_tokens" not in n
    )
    rows = [(len(mask), window) for mask, window in MASKS]
    attention = sum(2 * 4 * 4 * (64 + 64 + 64) * n * (n + 1) / 2 for n, _ in rows)  # causal keys within a row
    expected = 3 * (sum(2 * (matmul - head) * n + 2 * head * w for n, w in rows) + attention)
    assert mfu.head_flops_per_token(tiny_k2) == 2 * head
    got = mfu.step_train_flops(tiny_k2.config, mfu.matrix_flops_per_token(tiny_k2), 2 * head, rows)
    assert got == pytest.approx(expected, rel=1e-12)
    # the head on every token (SFT's count) is what an RL step does not run
    every = sum(n for n, _ in rows) * mfu.train_flops(tiny_k2.config, 2 * matmul, 0) + 3 * attention
    assert every - got == pytest.approx(3 * 2 * head * sum(n - w for n, w in rows), rel=1e-12)


def test_rl_perf_rows(tiny_k2):
    matrix, head = mfu.matrix_flops_per_token(tiny_k2), mfu.head_flops_per_token(tiny_k2)
    perf = PerfModel(tiny_k2.config, matrix, head, 1e10, "test")
    row = train_perf(perf, [(4, 2), (4, 3), (2, 2)], 0.5, world_size=1)
    assert row["perf/train_tokens_per_s"] == 20.0
    flops = mfu.step_train_flops(tiny_k2.config, matrix, head, [(4, 2), (4, 3), (2, 2)])
    assert row["perf/mfu"] == pytest.approx(flops / 0.5 / 1e10)
    assert train_perf(None, [(4, 1)], 1.0, 1) == {"perf/train_tokens_per_s": 4.0}  # no model config: no MFU
    assert train_perf(perf, [(4, 1)], None, 1) == {}  # no step time
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
