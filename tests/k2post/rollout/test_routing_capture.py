"""Routed-experts records (k2post/rollout/routing_capture.py): request ids, assembly, first-writer merge."""

from __future__ import annotations

import numpy as np
import torch
import pytest

from k2post.rollout.routing_capture import assemble, merge_first, request_key


@pytest.mark.parametrize(
    ("internal", "key"),
    [("0-b0782100", ("0", 0)), ("1_0-b0782100", ("0", 1)), ("0_12-a1df25ac", ("12", 0)), ("7", ("7", 0))],
)
def test_request_key_maps_engine_core_ids_to_the_llm_request_and_completion(internal, key):
    assert request_key(internal) == key


def test_assemble_keeps_the_first_record_of_a_position_and_marks_gaps():
    positions = np.array([0, 1, 2, 1])
    experts = np.arange(8, dtype=np.int16).reshape(4, 1, 2)
    out = assemble((positions, experts), length=4, layers=1, top_k=2)
    assert out[:3, 0].tolist() == [[0, 1], [2, 3], [4, 5]]  # position 1 recorded twice: the first wins
    assert (out[3] == -1).all() and out.dtype == np.int16
    assert (assemble(None, 2, 1, 2) == -1).all()


def test_merge_first_keeps_what_an_episode_already_recorded():
    first = np.array([[[1, 2]], [[-1, -1]]], dtype=np.int16)  # position 1 never an input yet
    later = np.array([[[5, 6]], [[7, 0]], [[3, 4]]], dtype=np.int16)
    merged = merge_first(first, later)
    assert merged[:, 0].tolist() == [[1, 2], [7, 0], [3, 4]]
    assert merge_first(None, later) is later


@pytest.mark.parametrize("flavor_dir", ["tiny_k2_dir", "tiny_qwen2_dir"])
def test_checkpoint_named_tensors_are_the_saved_checkpoint(request, flavor_dir):
    """What the RL trainer pushes: transformers' fused 3-D expert params split per expert, named and valued like
    the model's safetensors file (which is what vLLM's load_weights accepts)."""
    from safetensors.torch import load_file

    from k2post.models.loading import load_causal_lm
    from k2post.rollout.weight_update import checkpoint_named_tensors

    model_dir = request.getfixturevalue(flavor_dir)
    named = checkpoint_named_tensors(load_causal_lm(model_dir, "float32"))
    saved = load_file(f"{model_dir}/model.safetensors")
    assert sorted(name for name, _ in named) == sorted(saved)
    for name, tensor in named:
        assert tensor.is_contiguous() and torch.equal(tensor, saved[name]), name


@pytest.mark.parametrize(
    ("record_routing", "enforce_eager", "accepted"),
    [(False, False, True), (False, True, True), (True, True, True), (True, False, False)],
)
def test_recording_routing_needs_eager_execution(record_routing, enforce_eager, accepted):
    """CUDA-graph replay skips the Python capture callback: recording with graphs on is refused, not rewritten."""
    from pydantic import ValidationError

    from k2post.rollout.config import VLLMEngineConfig

    engine = {"record_routing": record_routing, "enforce_eager": enforce_eager}
    if accepted:
        assert VLLMEngineConfig.model_validate(engine).enforce_eager is enforce_eager
    else:
        with pytest.raises(ValidationError, match=r"needs rollout\.engine\.enforce_eager: true"):
            VLLMEngineConfig.model_validate(engine)


@pytest.mark.parametrize(
    ("engine", "refused"),
    [({"enforce_eager": False}, True), ({"enforce_eager": False, "record_routing": True}, True), ({}, False)],
)
def test_routing_replay_with_cuda_graphs_is_a_one_line_config_error(engine, refused):
    """routing_replay turns record_routing on after the engine section validated: the run config refuses too."""
    from pathlib import Path

    import yaml

    from k2post.config.loader import ConfigError, validate_config
    from k2post.rl.run_config import RLConfig

    data = yaml.safe_load((Path(__file__).parents[3] / "configs" / "rl_moe_bf16.yaml").read_text())
    assert data["routing_replay"] is True
    data["rollout"]["engine"].update(engine)
    if not refused:
        cfg = validate_config(RLConfig, data, "rl_moe_bf16.yaml")
        assert cfg.rollout.engine.record_routing and cfg.rollout.engine.enforce_eager
        return
    with pytest.raises(ConfigError) as err:
        validate_config(RLConfig, data, "rl_moe_bf16.yaml")
    assert "\n" not in str(err.value) and "set enforce_eager: true, or turn routing_replay" in str(err.value)
