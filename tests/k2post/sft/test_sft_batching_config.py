"""The deterministic SFT batch plan, the SFT config's checks and `config show` of an SFT config."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2post.config.loader import ConfigError, load_config
from k2post.sft.batching import BatchPlan, BatchShape
from k2post.sft.config import SFTConfig
from k2post.sft.packing import Example

REPO = Path(__file__).resolve().parents[3]


def _examples(n: int) -> list[Example]:
    return [Example(tuple(range(1, 3 + i % 5)), tuple([0] + [1] * (1 + i % 5)), i, f"e{i}") for i in range(n)]


def test_batch_plan_is_a_function_of_the_step():
    shape = BatchShape(micro_batch_size=2, gradient_accumulation_steps=2, world_size=2)
    first, second = BatchPlan(_examples(23), 8, shape, seed=3), BatchPlan(_examples(23), 8, shape, seed=3)
    for step in (0, 5, 3, 11, 1):  # any order: no iteration state
        assert first.step_micro_batches(step) == second.step_micro_batches(step)
    batches = first.step_micro_batches(2)
    assert len(batches) == 4 and all(len(b) == 2 for b in batches)
    assert first.rank_micro_batches(2, 1) == batches[2:4]
    assert first.step_label_tokens(2) == sum(r.num_label_tokens for b in batches for r in b)


def test_batch_plan_walks_epochs_with_new_shuffles():
    plan = BatchPlan(_examples(10), 8, BatchShape(1, 1), seed=0, packing=False)
    assert plan.epoch_length(0) == 10
    stream = [plan.step_micro_batches(s)[0][0].example_ids for s in range(30)]
    assert sorted(stream[:10]) == sorted(stream[10:20]) == sorted(stream[20:30])  # each epoch covers all once
    assert stream[:10] != stream[10:20]  # reshuffled
    assert plan.epoch_of_step(15) == 1.5
    assert plan.steps_for_epochs(3) == 30
    assert BatchPlan(_examples(10), 8, BatchShape(1, 1), seed=1).fingerprint() != plan.fingerprint()


def test_sft_yaml_and_checks():
    cfg = load_config(REPO / "configs" / "sft_tool_use.yaml", SFTConfig)
    assert cfg.kind == "sft" and cfg.data.path == "runs/synth_tool_use/dataset" and cfg.model.flavor == "tiny-qwen2"
    bad = [
        (["schedule.warmup_steps=10", "train.max_steps=10"], "warmup_steps (10) must be < train.max_steps (10)"),
        (["train.warmup_steps=10"], "train: `warmup_steps` is now `schedule.warmup_steps`: change the key"),
        (["data.eval_fraction=0", "train.eval_every=10"], "needs held-out rows"),
        (["deepspeed.precision=bf16", "deepspeed.zero_stage=0"], "needs zero_stage >= 1"),
        (["deepspeed.zero_stage=4"], "deepspeed.zero_stage: Input should be 0, 1, 2 or 3"),
        (["deepspeed.extra={optimizer: {type: Adam}}"], "extra must not hold ['optimizer']"),
        (["data.bad_rows=ignore"], "data.bad_rows: Input should be 'skip' or 'error'"),
        (["model.dtype=bfloat16"], "model.dtype must be float32"),
        (
            ["train.max_steps=5", "schedule.warmup_steps=0", "train.stop_at_step=5"],
            "stop_at_step (5) must be < max_steps (5)",
        ),
        (["train.max_step=5"], "train.max_step: unknown key (did you mean 'max_steps'?)"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError) as err:
            load_config(REPO / "configs" / "sft_tool_use.yaml", SFTConfig, overrides)
        assert message in str(err.value), (overrides, str(err.value))


def test_config_show_knows_the_sft_kind(capsys):
    from k2post.cli import main

    assert main(["config", "show", str(REPO / "configs" / "sft_tool_use.yaml"), "train.max_steps=70"]) == 0
    out = capsys.readouterr().out
    assert "kind: sft" in out and "max_steps: 70" in out and "zero_stage:" in out
