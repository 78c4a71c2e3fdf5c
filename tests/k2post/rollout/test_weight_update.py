"""Weight pushes into a live vLLM engine (CPU build): tiny Qwen2 and the tiny K2-shaped model.

Engine A is built from the tiny model, every tensor is perturbed (seeded noise x0.05) and pushed
into A; A must then generate exactly what a fresh engine B built from the perturbed checkpoint
generates, with bit-identical parameters. Tiny Qwen2: in place, through a real checkpoint_engine
WeightSender -> WeightReceiver pair and directly; pushing the original tensors back restores the
original outputs and parameters. Tiny K2 (MLA + MoE): in place with MLA disabled (the CPU default:
the MoE patch refreshes the packed experts), and the automatic rebuild fallback when the MLA kernels
absorb kv_b_proj.
"""

from __future__ import annotations

import gc
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from k2post.rollout import vllm_cpu_patch

NOISE = 0.05
MAX_NEW_TOKENS = 12
# At least 5 tokens each: bf16 prefill of 1-4 tokens crashed the CPU build here.
PROMPTS = [[2, 17, 3, 40, 41, 42, 99], [17, 3, 99, 124, 7], [5, 6, 7, 8, 9, 10, 11], [200, 31, 64, 12, 13]]


def _perturb(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Add seeded noise to every tensor; all-zero rows (vocab padding) stay zero."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(tensors):
        t = tensors[name]
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype) * NOISE
        if t.ndim == 2:
            noise = noise * (t.abs().sum(dim=1, keepdim=True) != 0)
        out[name] = (t + noise).contiguous()
    return out


@pytest.fixture(scope="module")
def original_tensors(tiny_qwen2_dir) -> dict[str, torch.Tensor]:
    return load_file(str(Path(tiny_qwen2_dir) / "model.safetensors"))


def _perturbed_copy(model_dir: Path, out: Path) -> Path:
    shutil.copytree(model_dir, out)
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    save_file(_perturb(tensors, seed=1), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def perturbed_dir(tiny_qwen2_dir, tmp_path_factory) -> Path:
    return _perturbed_copy(tiny_qwen2_dir, tmp_path_factory.mktemp("perturbed") / "tiny-qwen2-perturbed")


@pytest.fixture(scope="module")
def perturbed_k2_dir(tiny_k2_dir, tmp_path_factory) -> Path:
    return _perturbed_copy(tiny_k2_dir, tmp_path_factory.mktemp("perturbed") / "tiny-k2-perturbed")


def _engine(path, dtype: str, **cfg):
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(path, VLLMEngineConfig(dtype=dtype, max_model_len=256, max_num_seqs=8, **cfg))


def _close(*engines) -> None:
    for engine in engines:
        engine.close()
    gc.collect()


def _greedy(engine) -> list[list[int]]:
    from k2post.rollout.config import SamplingConfig

    sampling = SamplingConfig(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    return [g[0].token_ids for g in engine.generate(PROMPTS, sampling)]


def _assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape and a[name].numel() > 0, name
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_push_equals_fresh_engine_and_checkpoint_engine_push(tiny_qwen2_dir, original_tensors, perturbed_dir, dtype):
    from k2post.rollout.weight_update import model_state

    engine_a = _engine(tiny_qwen2_dir, dtype)
    before, state_before = _greedy(engine_a), model_state(engine_a.llm)
    perturbed = load_file(str(perturbed_dir / "model.safetensors"))

    _push_through_checkpoint_engine(engine_a, perturbed)  # real sender -> receiver -> engine
    after_ce, state_ce = _greedy(engine_a), model_state(engine_a.llm)
    assert after_ce != before
    assert engine_a.load_weights(sorted(original_tensors.items())) == len(original_tensors)
    assert _greedy(engine_a) == before  # the push is reversible: back to the original weights
    _assert_same_params(state_before, model_state(engine_a.llm))

    t0 = time.perf_counter()
    engine_a.load_weights(sorted(perturbed.items()))
    print(f"\npush (load_weights, tiny-qwen2, {dtype}): {(time.perf_counter() - t0) * 1e3:.1f} ms")
    after, state_after = _greedy(engine_a), model_state(engine_a.llm)
    assert after == after_ce
    _assert_same_params(state_after, state_ce)

    # Two engines share vLLM's process-global parallel state: keep A alive until B is built and
    # tear both down together at the end (deleting B first would break A).
    engine_b = _engine(perturbed_dir, dtype)
    assert _greedy(engine_b) == after
    _assert_same_params(state_after, model_state(engine_b.llm))
    assert engine_a.weights_version == 3  # one per update: the bucketed push counts once
    _close(engine_b, engine_a)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_k2_in_place_push_equals_fresh_engine(tiny_k2_dir, perturbed_k2_dir, dtype):
    from k2post.rollout.weight_update import model_state

    engine_a = _engine(tiny_k2_dir, dtype)  # CPU default: MLA disabled, MoE experts patched
    assert engine_a.weight_update_mode == "in_place"
    before = _greedy(engine_a)
    _push_through_checkpoint_engine(
        engine_a, load_file(str(perturbed_k2_dir / "model.safetensors")), via="receive_update"
    )
    after, state = _greedy(engine_a), model_state(engine_a.llm)
    assert after != before
    engine_b = _engine(perturbed_k2_dir, dtype)
    assert _greedy(engine_b) == after
    _assert_same_params(state, model_state(engine_b.llm))  # packed experts included
    _close(engine_b, engine_a)


@pytest.mark.slow
def test_tiny_k2_with_mla_kernels_rebuilds_from_shared_memory(tiny_k2_dir, perturbed_k2_dir, tmp_path):
    from k2post.rollout.weight_update import WeightUpdateError

    shm = tmp_path / "shm"
    engine_a = _engine(tiny_k2_dir, "bfloat16", disable_mla=False, shm_dir=str(shm))
    assert engine_a.weight_update_mode == "rebuild"  # the MLA kernels absorbed kv_b_proj
    before = _greedy(engine_a)
    _push_through_checkpoint_engine(
        engine_a, load_file(str(perturbed_k2_dir / "model.safetensors")), via="receive_update"
    )
    assert engine_a.weights_version == 1 and Path(engine_a.llm.llm_engine.model_config.model).is_relative_to(shm)
    after = _greedy(engine_a)
    assert after != before
    engine_b = _engine(perturbed_k2_dir, "bfloat16", disable_mla=False, shm_dir=str(shm))
    assert _greedy(engine_b) == after
    _close(engine_b, engine_a)
    assert list(shm.iterdir()) == []  # the shared-memory checkpoints are gone
    with pytest.raises(WeightUpdateError, match="in_place is not possible.*kv_b_proj.*weight_update: auto"):
        _engine(tiny_k2_dir, "bfloat16", disable_mla=False, weight_update="in_place")


def _push_through_checkpoint_engine(engine, tensors: dict[str, torch.Tensor], via: str = "load_fn") -> None:
    """One update: WeightSender (this thread) -> WeightReceiver (a thread) -> the engine, either
    through `make_vllm_load_fn(engine)` or `engine.receive_update` (receiver in the vLLM worker)."""
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightReceiver, WeightSender

    from k2post.rollout.weight_update import make_vllm_load_fn

    cfg = CheckpointEngineConfig(bucket_nbytes=1 << 20, timeout_s=60.0)
    with WeightSender(cfg) as sender:
        for name in sorted(tensors):
            sender.register(name, tensors[name])
        errors: list[BaseException] = []
        receiver = (
            WeightReceiver(sender.address, make_vllm_load_fn(engine), timeout_s=60.0) if via == "load_fn" else None
        )

        def receive() -> None:
            try:
                if via == "receive_update":
                    engine.receive_update(sender.address, timeout_s=60.0)
                    return
                with receiver, engine.weight_update():
                    receiver.run_update()
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=receive)
        thread.start()
        stats = sender.push()
        thread.join(timeout=60)
    assert not errors and not thread.is_alive()
    assert stats.n_tensors == len(tensors)


def test_version_check_fails_loudly_and_can_be_overridden(monkeypatch):
    monkeypatch.delenv(vllm_cpu_patch.OVERRIDE_ENV, raising=False)
    assert vllm_cpu_patch.check_vllm_version("0.32.0+cpu") == "0.32.0+cpu"
    with pytest.raises(vllm_cpu_patch.UntestedVLLMError, match="0.32.0.*K2POST_ALLOW_UNTESTED_VLLM=1"):
        vllm_cpu_patch.check_vllm_version("0.99.0")
    monkeypatch.setenv(vllm_cpu_patch.OVERRIDE_ENV, "1")
    assert vllm_cpu_patch.check_vllm_version("0.99.0") == "0.99.0"


def test_patch_keeps_weight_and_repack_follows_updates():
    vllm_cpu_patch.apply_cpu_weight_patch()
    assert vllm_cpu_patch.is_applied() and not vllm_cpu_patch.apply_cpu_weight_patch()
    import vllm.model_executor.layers.utils as utils

    layer = torch.nn.Linear(64, 32, bias=False)
    layer.weight.requires_grad_(False)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight.shape == (32, 64)
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T)
    layer.weight.copy_(torch.randn(32, 64))
    assert vllm_cpu_patch.repack_cpu_linears(layer) == 1
    torch.testing.assert_close(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T)
    assert vllm_cpu_patch.empty_cpu_linears(layer) == []


def test_repack_can_be_limited_to_the_written_weights():
    vllm_cpu_patch.apply_cpu_weight_patch()
    import vllm.model_executor.layers.utils as utils

    model = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(32, 16, bias=False))
    for layer in model:
        layer.weight.requires_grad_(False)
        utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    first = model[0]
    first.weight.copy_(torch.randn(32, 64))
    assert vllm_cpu_patch.repack_cpu_linears(model, written=[first.weight]) == 1  # one bucket's layers only
    x = torch.randn(3, 64)
    torch.testing.assert_close(first.cpu_linear(x, first.weight, None), x @ first.weight.T)
    assert vllm_cpu_patch.repack_cpu_linears(model, written=[]) == 0
    assert vllm_cpu_patch.repack_cpu_linears(model) == 2


def test_rope_patch_makes_cpu_kernel_match_reference_for_3d_heads():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    vllm_cpu_patch.apply_cpu_rope_patch()
    assert vllm_cpu_patch.rope_patch_applied() and not vllm_cpu_patch.apply_cpu_rope_patch()
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            64, max_position=256, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, is_neox_style=False
        )
    positions = torch.arange(7)
    wide = torch.randn(7, 4, 128)
    query, key = wide[..., 64:], torch.randn(7, 1, 64)  # DeepSeek-V3 without MLA: strided q_pe, 1 key head
    expected_q, expected_k = rope.forward_native(positions, query.clone(), key.clone())
    got_q, got_k = rope.forward_cpu(positions, query, key)
    torch.testing.assert_close(got_q, expected_q)
    torch.testing.assert_close(got_k, expected_k)
    torch.testing.assert_close(wide[..., 64:], expected_q)  # written back in place into the view
    # one decode token, q and k sliced from wider tensors: the flat views share their memory (no copy back)
    wide_q, wide_k = torch.randn(1, 4, 128), torch.randn(1, 1, 192)
    query, key = wide_q[..., 64:], wide_k[..., 128:]
    expected_q, expected_k = rope.forward_native(torch.arange(1), query.clone(), key.clone())
    got_q, got_k = rope.forward_cpu(torch.arange(1), query, key)
    torch.testing.assert_close(got_q, expected_q)
    torch.testing.assert_close(got_k, expected_k)
    torch.testing.assert_close(wide_k[..., 128:], expected_k)


@pytest.mark.slow
def test_verified_push_catches_transport_and_loader_faults_and_names_rounded_tensors(tiny_qwen2_dir, tiny_k2_dir):
    """Real engines, their own process (tests/k2post/rollout/verified_push_worker.py): each fault is named, a
    sabotaged loader (tensors intact on arrival) included; a bf16 engine holds the fp32 weights rounded."""
    import json
    import os
    import sys

    from proc_helpers import run_bounded

    worker = Path(__file__).with_name("verified_push_worker.py")
    repo = Path(__file__).resolve().parents[3]
    done = run_bounded(
        [sys.executable, str(worker), str(tiny_qwen2_dir), str(tiny_k2_dir)],
        timeout=420,
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=str(repo)),
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdicts["whole"] == "ok"
    assert verdicts["skipped"].startswith("PushVerificationError") and "unwritten" in verdicts["skipped"]
    assert "model.layers.0.mlp.down_proj.weight" in verdicts["skipped"]
    assert verdicts["swapped"].startswith("PushVerificationError")
    assert re.search(r"model\.layers\.0\.self_attn\.[qo]_proj\.weight", verdicts["swapped"])
    assert verdicts["flipped"].startswith("PushVerificationError") and "model.norm.weight" in verdicts["flipped"]
    # the loader itself wrong, the tensors intact on arrival: only the engine's own parameters show it
    q = "model.layers.0.self_attn.q_proj.weight"
    assert verdicts["loader_transposed"].startswith("PushVerificationError: tensor 'model.layers.0.self_attn.q_proj")
    assert "(1 of" in verdicts["loader_transposed"]
    assert re.search(
        r"PushVerificationError: tensor 'model\.layers\.0\.self_attn\.[qo]_proj.*\(2 of", verdicts["loader_swapped"]
    )
    held, row = verdicts["k2_bf16"]["held"], verdicts["k2_bf16"]["row"]
    assert set(held.values()) == {"equal", "rounded"}, verdicts["k2_bf16"]
    for name in (q.replace(".0.", ".1.").replace("q_proj", "q_a_proj"), "model.layers.1.mlp.experts.3.up_proj.weight"):
        assert held[name] == "rounded", name  # fp32 random weights in a bf16 engine
    assert held["model.norm.weight"] == "equal"  # ones: bf16 holds them exactly
    assert held["model.layers.1.mlp.gate.e_score_correction_bias"] == "equal"  # vLLM keeps it fp32
    assert row["push/verified_held"] == 1.0 and row["push/held_rounded"] == sum(v == "rounded" for v in held.values())


def _tied_copy(model_dir: Path, out: Path) -> Path:
    """`model_dir` with tied embeddings (Qwen2-0.5B's layout): config says so, the checkpoint has no lm_head."""
    import json

    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_tied_embeddings_are_served_once_under_the_checkpoint_name(tiny_qwen2_dir, tmp_path):
    from k2post.models.loading import load_causal_lm
    from k2post.rollout.weight_update import checkpoint_named_tensors

    tied = _tied_copy(Path(tiny_qwen2_dir), tmp_path / "tied")
    model = load_causal_lm(tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight and "lm_head.weight" in model.state_dict()
    names = [name for name, _ in checkpoint_named_tensors(model)]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert sorted(names) == sorted(load_file(str(tied / "model.safetensors")))  # what save_pretrained wrote
    untied = [name for name, _ in checkpoint_named_tensors(load_causal_lm(tiny_qwen2_dir))]
    assert "lm_head.weight" in untied


@pytest.mark.slow
def test_tied_embeddings_push_bucket_by_bucket_equals_fresh_engine(tiny_qwen2_dir, tmp_path):
    """The push of a tied model (Qwen2-0.5B's layout): vLLM's load_weights raised on `lm_head.weight` arriving in
    a bucket without `model.embed_tokens.weight` ("the tied weight is uninitialized") before the trainer served
    tied tensors once."""
    from k2post.models.loading import load_causal_lm
    from k2post.rollout.weight_update import checkpoint_named_tensors, model_state

    tied = _tied_copy(Path(tiny_qwen2_dir), tmp_path / "tied")
    perturbed = _perturbed_copy(tied, tmp_path / "tied-perturbed")
    served = dict(checkpoint_named_tensors(load_causal_lm(perturbed)))  # what an RL trainer rank registers
    engine_a = _engine(tied, "float32")
    before = _greedy(engine_a)
    _push_through_checkpoint_engine(engine_a, served, via="receive_update")  # 1 MiB buckets: embed != last bucket
    after, state = _greedy(engine_a), model_state(engine_a.llm)
    assert after != before
    engine_b = _engine(perturbed, "float32")
    assert _greedy(engine_b) == after
    _assert_same_params(state, model_state(engine_b.llm))
    _close(engine_b, engine_a)
