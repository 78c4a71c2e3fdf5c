"""The RL knobs docs/SCALING.md names, at small size: placement bundles, ZeRO stage and its gather limits.

(The rest are tested where they act: trainer.world_size / zero_stage 3 pushes in test_zero3_push.py, rollout.replicas
and actor restarts in tests/pipelines/test_rl.py, trainer.bucket_mb in tests/checkpoint_engine, reward.workers in
tests/k2post/envs.)
Run: python -m pytest tests/k2post/rl/test_scaling_knobs.py -q
"""

from __future__ import annotations

import pytest

from k2post.config.loader import validate_config
from k2post.rl.run_config import RLConfig


def _cfg(**sections) -> RLConfig:
    return validate_config(RLConfig, {"envs": [{"name": "math"}], **sections}, "test")


@pytest.mark.parametrize(
    ("ray", "cuda", "bundle"),
    [
        ({}, False, {"CPU": 1.0}),
        ({}, True, {"CPU": 1.0, "GPU": 1.0}),
        ({"cpus_per_bundle": 8, "gpus_per_bundle": 1}, False, {"CPU": 8.0, "GPU": 1.0}),
        ({"cpus_per_bundle": 4, "gpus_per_bundle": 0}, True, {"CPU": 4.0}),
        ({"gpus_per_bundle": 2}, True, {"CPU": 1.0, "GPU": 2.0}),
    ],
)
def test_placement_bundle(ray, cuda, bundle):
    from k2post.rl.actors import bundle_resources

    assert bundle_resources(_cfg(ray=ray).ray, cuda) == bundle


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_config_carries_the_stage_and_its_gather_limits(stage):
    from k2post.rl.trainer import deepspeed_config

    limits = {"prefetch_bucket_numel": 0, "max_live_numel": 3_000_000, "persistence_threshold_numel": 10}
    zero = deepspeed_config(_cfg(trainer={"zero_stage": stage, "zero3": limits}))["zero_optimization"]
    if stage < 3:
        assert zero == {"stage": stage}
        return
    assert zero == {
        "stage": 3,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_live_parameters": 3_000_000,
        "stage3_param_persistence_threshold": 10,
        "stage3_max_reuse_distance": 1_000_000_000,
        "reduce_bucket_size": 500_000_000,
    }


def test_zero3_knob_names_are_checked():
    from k2post.config.loader import ConfigError

    with pytest.raises(ConfigError, match="prefetch_bucket_size"):
        _cfg(trainer={"zero_stage": 3, "zero3": {"prefetch_bucket_size": 0}})


def _field_exists(model: type, dotted: str) -> bool:
    """Whether `a.b.c` names a field of the pydantic config `model` (through nested config models)."""
    import typing

    from pydantic import BaseModel

    head, _, rest = dotted.partition(".")
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    candidates = [field.annotation, *typing.get_args(field.annotation)]
    return any(isinstance(c, type) and issubclass(c, BaseModel) and _field_exists(c, rest) for c in candidates)


def test_every_knob_docs_scaling_names_is_an_rl_config_field():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "SCALING.md").read_text()
    names = set(re.findall(r"`((?:ray|trainer|optim|rollout|reward|lora|loss|model)\.[a-z0-9_.]+)`", text))
    assert len(names) > 20, names
    missing = sorted(n for n in names if not _field_exists(RLConfig, n))
    assert not missing, f"docs/SCALING.md names fields RLConfig does not have: {missing}"
