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
        assert row["push/verified_held"] == 1.0 and row["push/lora_adapted"] == 28.0  # 7 projections x 4 layers
        assert row["push/held_equal"] == len(served) and row["push/held_rounded"] == 0  # fp32 engine: bit for bit
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


def _adapter_push(engine, model, spec, extra: dict | None = None) -> dict:
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

    from k2post.train.lora import adapter_state

    out: dict = {}
    served = sorted({**adapter_state(model), **(extra or {})}.items())
    with WeightSender(CheckpointEngineConfig(bucket_nbytes=1 << 20, timeout_s=60.0)) as sender:
        for name, tensor in served:
            sender.register(name, tensor, owner=0)

        def receive() -> None:
            try:
                out.update(engine.receive_update(sender.address, timeout_s=60.0, verify_push=True, adapter=spec))
            except Exception as exc:  # raised below
                out["error"] = exc

        thread = threading.Thread(target=receive)
        thread.start()
        stats = sender.push()
        thread.join(timeout=60)
    if "error" in out:
        raise out["error"]
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
            row = verify_pushes([pushed["stats"]], [pushed["received"]])
            assert row == {"push/verified_held": 1.0, "push/lora_pushed": 16.0, "push/lora_mapped": 16.0}
            assert pushed["received"]["lora_modules"] == 4 * 3  # qkv (q, v packed), o_proj, down_proj x 4 layers
            got = [g[0].token_ids for g in engine.generate(PROMPTS, greedy)]
            assert got == _hf_greedy(model) and got != base, seed
        assert engine.weights_version == 2
    finally:
        engine.close()


MLA_TARGETS = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]


def test_cpu_engine_refuses_lora_for_the_moe_model_in_one_line(tiny_k2_dir, monkeypatch):
    """tiny-k2 (DeepSeek-V3: MLA + MoE) with adapter pushes on the CPU build: an adapter on the MLA projections
    (q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj) was received and every module mapped (20 of 20),
    then the first generation failed inside vLLM's MoE LoRA Triton kernel. So the engine refuses at build time."""
    from k2post.rollout import vllm_engine
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.weight_update import WeightUpdateError

    monkeypatch.setattr(vllm_engine, "on_cpu", lambda: True)
    monkeypatch.setattr(vllm_engine.VLLMEngine, "_build", lambda self, path: self._lora_kwargs())
    with pytest.raises(WeightUpdateError, match=r"^lora.push: adapter is not supported for the MoE model Deepseek"):
        vllm_engine.VLLMEngine(tiny_k2_dir, VLLMEngineConfig(lora_max_rank=4))


def test_adapter_modules_are_counted_and_each_must_map():
    from k2post.rollout.lora_adapter import adapter_modules, check_mapped, unmapped_modules
    from k2post.rollout.weight_update import PushVerificationError

    names = [
        f"base_model.model.model.layers.0.self_attn.{m}.lora_{ab}.weight"
        for m in ("q_proj", "o_proj", "x_proj")
        for ab in "AB"
    ]
    pushed = adapter_modules(names)
    assert pushed == [f"model.layers.0.self_attn.{m}" for m in ("o_proj", "q_proj", "x_proj")]
    engine = {"model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj"}
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert unmapped_modules(pushed, engine, packed) == ["model.layers.0.self_attn.x_proj"]
    assert check_mapped(pushed[:2], engine, packed) == {"lora_pushed": 2, "lora_mapped": 2}
    with pytest.raises(
        PushVerificationError, match=r"module 'model\.layers\.0\.self_attn\.x_proj'.*pushed 3, mapped 2"
    ):
        check_mapped(pushed, engine, packed)


def test_an_adapter_push_needs_an_engine_built_for_it():
    from k2post.config.loader import validate_config
    from k2post.rl.run_config import RLConfig

    raw = {"envs": [{"name": "math"}], "optim": {"qk_clip": {"enabled": False}}}
    lora = {"enabled": True, "rank": 32, "push": "adapter"}
    assert validate_config(RLConfig, {**raw, "lora": lora}, "t").rollout.engine.lora_max_rank == 32
    assert (
        validate_config(RLConfig, {**raw, "lora": {**lora, "push": "merged"}}, "t").rollout.engine.lora_max_rank is None
    )
