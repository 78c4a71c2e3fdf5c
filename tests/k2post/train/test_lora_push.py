"""A LoRA trainer's push into a real vLLM engine: the merged weights arrive, and a push that loses the adapter
fails loudly.

The trainer side is what `RLTrainerWorker` registers (`served_tensors(..., lora=True)`: base + (alpha / r) B A under
the base model's names) and what its verified push returns (the digests of the served tensors and of the frozen
base weights of every adapted module); the engine side is the real `VLLMEngine.receive_update(verify_push=True)`;
the check is the one `TrainerGroup.push_to` runs (`verify_pushes`). The saboteur serves the base weights without
the adapters (a merge that silently did nothing): the digests of trainer and engine agree, and only the adapter
check catches it. The whole RL loop with LoRA: tests/pipelines/test_rl.py.
Run: python -m pytest tests/k2post/train/test_lora_push.py -q
"""

from __future__ import annotations

import threading

import pytest
import torch

from k2post.train.lora_config import LoRAConfig


def _push(engine, served) -> dict:
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

    out: dict = {}
    with WeightSender(CheckpointEngineConfig(bucket_nbytes=1 << 20, timeout_s=60.0)) as sender:
        for name, tensor in served:
            sender.register(name, tensor, owner=0)
        thread = threading.Thread(
            target=lambda: out.update(engine.receive_update(sender.address, timeout_s=60.0, verify_push=True))
        )
        thread.start()
        sender.push()
        thread.join(timeout=60)
    assert "digests" in out, "the engine received nothing"
    return out


def _trainer_stats(model, served) -> dict:
    from k2post.rollout.weight_update import tensor_digests
    from k2post.train.lora import base_digests

    return {"digests": tensor_digests(served), "lora_base_digests": base_digests(model)}


def _unmerged(model) -> list:
    """The saboteur's merge: the frozen base weights under their HF names, no adapter."""
    from k2post.train.lora import hf_name

    return [(hf_name(n), v) for n, v in model.get_base_model().state_dict().items() if ".lora_" not in n]


@pytest.mark.slow
def test_merged_push_arrives_and_a_lost_adapter_fails_loudly(tiny_qwen2_dir, monkeypatch):
    from k2post.models.loading import load_causal_lm
    from k2post.quant.config import QATConfig
    from k2post.rl.actors import verify_pushes
    from k2post.rl.served_weights import served_tensors
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine
    from k2post.rollout.weight_update import PushVerificationError, model_state
    from k2post.train import lora

    model = lora.apply_lora(load_causal_lm(tiny_qwen2_dir, "float32"), LoRAConfig(enabled=True, rank=4, alpha=8.0))
    with torch.no_grad():  # a trained adapter: B != 0 on every target
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    engine = VLLMEngine(tiny_qwen2_dir, VLLMEngineConfig(dtype="float32", max_model_len=256, max_num_seqs=4))
    try:
        before = model_state(engine.llm)["model.layers.0.self_attn.o_proj.weight"].clone()
        served = served_tensors(model, QATConfig(), lora=True)
        row = verify_pushes([_trainer_stats(model, served)], [_push(engine, served)])
        assert row == {"push/verified": 1.0, "push/lora_adapted": 28.0}  # 7 projections x 4 layers
        after = model_state(engine.llm)["model.layers.0.self_attn.o_proj.weight"]
        want = dict(served)["model.layers.0.self_attn.o_proj.weight"]
        assert torch.equal(after, want) and not torch.equal(after, before)

        monkeypatch.setattr(lora, "merged_named_tensors", _unmerged)
        served = served_tensors(model, QATConfig(), lora=True)
        stats, received = _trainer_stats(model, served), _push(engine, served)
        with pytest.raises(PushVerificationError, match=r"frozen base weight.*28 of 28.*the adapter never arrived"):
            verify_pushes([stats], [received])
    finally:
        engine.close()


PROMPTS = [[2, 17, 3, 40, 41, 42, 99], [17, 3, 99, 124, 7], [200, 31, 64, 12, 13]]


def _hf_greedy(model, n_tokens: int = 12) -> list[list[int]]:
    """transformers' greedy continuation of PROMPTS by the merged model (the reference)."""
    from k2post.models.loading import load_causal_lm
    from k2post.train.lora import merged_state_dict

    plain = load_causal_lm(model.get_base_model().config._name_or_path, "float32")
    plain.load_state_dict(merged_state_dict(model))
    out = []
    for ids in PROMPTS:
        generated = plain.generate(torch.tensor([ids]), max_new_tokens=n_tokens, do_sample=False)
        out.append(generated[0, len(ids) :].tolist())
    return out


def _adapter_push(engine, model, spec) -> dict:
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

    from k2post.train.lora import adapter_state

    out: dict = {}
    served = sorted(adapter_state(model).items())
    with WeightSender(CheckpointEngineConfig(bucket_nbytes=1 << 20, timeout_s=60.0)) as sender:
        for name, tensor in served:
            sender.register(name, tensor, owner=0)
        receive = lambda: out.update(  # noqa: E731
            engine.receive_update(sender.address, timeout_s=60.0, verify_push=True, adapter=spec)
        )
        thread = threading.Thread(target=receive)
        thread.start()
        stats = sender.push()
        thread.join(timeout=60)
    assert "digests" in out, "the engine received nothing"
    assert stats.nbytes == sum(t.numel() * 4 for _, t in served)  # only the adapter travelled
    return {"stats": {"digests": _digests(served), "lora_adapter": True}, "received": out}


def _digests(named) -> dict:
    from k2post.rollout.weight_update import tensor_digests

    return tensor_digests(named)


@pytest.mark.slow
def test_adapter_only_push_generates_like_the_merged_model(tiny_qwen2_dir):
    """`lora.push: adapter`: only A and B travel; the engine (vLLM's LoRA kernels) then generates what transformers
    generates with the merged weights, push after push; the base weights stay."""
    from k2post.models.loading import load_causal_lm
    from k2post.rl.actors import verify_pushes
    from k2post.rollout.config import SamplingConfig, VLLMEngineConfig
    from k2post.rollout.lora_adapter import adapter_spec
    from k2post.rollout.vllm_engine import VLLMEngine
    from k2post.train import lora

    cfg = LoRAConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    model = lora.apply_lora(load_causal_lm(tiny_qwen2_dir, "float32"), cfg)
    spec = adapter_spec(cfg.rank, cfg.alpha, cfg.target_modules)
    engine = VLLMEngine(
        tiny_qwen2_dir, VLLMEngineConfig(dtype="float32", max_model_len=256, max_num_seqs=4, lora_max_rank=cfg.rank)
    )
    greedy = SamplingConfig(temperature=0.0, max_tokens=12)
    try:
        base = [g[0].token_ids for g in engine.generate(PROMPTS, greedy)]
        assert base == _hf_greedy(model)  # B = 0: the base model
        for seed in (1, 2):  # two trained adapters in turn: each push replaces the last
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed * 1000 + len(name)))
            pushed = _adapter_push(engine, model, spec)
            assert verify_pushes([pushed["stats"]], [pushed["received"]]) == {"push/verified": 1.0}
            assert pushed["received"]["lora_modules"] == 4 * 3  # qkv (q, v packed), o_proj, down_proj x 4 layers
            got = [g[0].token_ids for g in engine.generate(PROMPTS, greedy)]
            assert got == _hf_greedy(model) and got != base, seed
        assert engine.weights_version == 2
    finally:
        engine.close()


def test_an_adapter_push_needs_an_engine_built_for_it():
    from k2post.config.loader import validate_config
    from k2post.rl.run_config import RLConfig

    raw = {"envs": [{"name": "math"}], "optim": {"qk_clip": {"enabled": False}}}
    lora = {"enabled": True, "rank": 32, "push": "adapter"}
    assert validate_config(RLConfig, {**raw, "lora": lora}, "t").rollout.engine.lora_max_rank == 32
    assert (
        validate_config(RLConfig, {**raw, "lora": {**lora, "push": "merged"}}, "t").rollout.engine.lora_max_rank is None
    )
