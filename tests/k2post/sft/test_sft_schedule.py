"""The lr schedule, the deterministic batch plan, the SFT config's checks and the checkpoint dir helpers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from k2post.config.loader import ConfigError, load_config
from k2post.sft.batching import BatchPlan, BatchShape
from k2post.sft.checkpoint import (
    ENGINE_DIR,
    STATE_FILE,
    checkpoint_dir,
    complete_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
    write_atomically,
)
from k2post.sft.config import SFTConfig, SFTTrainConfig
from k2post.sft.packing import Example
from k2post.sft.runtime import DistInfo
from k2post.sft.schedule import lr_factor

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "schedule, warmup, step, total, expected",
    [
        ("constant", 0, 0, 10, 1.0),
        ("constant", 4, 0, 10, 0.25),
        ("constant", 4, 3, 10, 1.0),
        ("constant", 4, 9, 10, 1.0),
        ("cosine", 0, 0, 10, 1.0),
        ("cosine", 0, 5, 10, 0.1 + 0.9 * 0.5),
        ("cosine", 2, 1, 10, 1.0),
        ("cosine", 2, 2, 10, 1.0),
        ("cosine", 2, 6, 10, 0.1 + 0.9 * 0.5),
        ("cosine", 0, 9, 10, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.9))),
    ],
)
def test_lr_factor_table(schedule, warmup, step, total, expected):
    cfg = SFTTrainConfig(lr_schedule=schedule, warmup_steps=warmup, min_lr_ratio=0.1)
    assert lr_factor(step, total, cfg) == pytest.approx(expected)


def test_lr_factor_outside_the_run():
    with pytest.raises(ValueError, match="outside the run's steps"):
        lr_factor(10, 10, SFTTrainConfig())


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
        (["train.warmup_steps=10", "train.max_steps=10"], "warmup_steps (10) must be < max_steps (10)"),
        (["data.eval_fraction=0", "train.eval_every=10"], "needs held-out rows"),
        (["deepspeed.precision=bf16", "deepspeed.zero_stage=0"], "needs zero_stage >= 1"),
        (["deepspeed.zero_stage=4"], "deepspeed.zero_stage: Input should be 0, 1, 2 or 3"),
        (["deepspeed.extra={optimizer: {type: Adam}}"], "extra must not hold ['optimizer']"),
        (["data.bad_rows=ignore"], "data.bad_rows: Input should be 'skip' or 'error'"),
        (["model.dtype=bfloat16"], "model.dtype must be float32"),
        (["train.max_steps=5", "train.warmup_steps=0", "train.stop_at_step=5"], "stop_at_step (5) must be < max_steps (5)"),
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


SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, owns_group=False)


def _fake_checkpoint(tmp: Path) -> None:
    (tmp / ENGINE_DIR).mkdir()
    (tmp / STATE_FILE).write_text("{}")


def test_checkpoints_appear_atomically(tmp_path):
    target = checkpoint_dir(tmp_path, 3)
    target.parent.mkdir(parents=True)

    def crash(tmp: Path) -> None:
        _fake_checkpoint(tmp)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, SINGLE, crash)
    assert not target.exists() and list(target.parent.iterdir()) == []  # no partial dir, no temp left
    write_atomically(target, SINGLE, _fake_checkpoint)
    assert latest_checkpoint(tmp_path) == target


def test_latest_checkpoint_skips_incomplete_dirs(tmp_path):
    for step in (2, 10, 4):
        write_atomically(checkpoint_dir(tmp_path, step).absolute(), SINGLE, _fake_checkpoint) if step != 2 else None
    checkpoint_dir(tmp_path, 2).mkdir()  # no state file: a crash before the rename cannot produce this, but be safe
    (tmp_path / "checkpoints" / ".step-12.tmp").mkdir()
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [4, 10]
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 10)
    assert prune_checkpoints(tmp_path, keep=1) == [checkpoint_dir(tmp_path, 4)]
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [10]
