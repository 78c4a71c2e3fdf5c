"""The rollout engine serves exactly the weights the QAT forward used: the trainer pushes the INT4 round trip of the
experts through the checkpoint engine into a real vLLM engine (fp32, tiny-k2), the engine's digests of what it
loaded equal the trainer's of the fake-quant values (bit-identical), and the engine's log-probs then match the QAT
forward's, not the full-precision model's."""

from __future__ import annotations

import threading

import pytest
import torch

from k2post.quant.qat import QATConfig, install_qat, quantized_weights

pytestmark = pytest.mark.slow
PROMPTS = [[(5 * i + 3 * t) % 3000 + 20 for t in range(9)] for i in range(4)]


def _push(engine, named: list[tuple[str, torch.Tensor]]) -> dict:
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

    result: dict = {}
    with WeightSender(CheckpointEngineConfig(bucket_nbytes=8 << 20, timeout_s=60.0)) as sender:
        for name, tensor in named:
            sender.register(name, tensor)
        thread = threading.Thread(
            target=lambda: result.update(engine.receive_update(sender.address, timeout_s=60.0, verify_push=True))
        )
        thread.start()
        sender.push()
        thread.join(timeout=60)
    assert not thread.is_alive() and "digests" in result
    return result


def _logprobs(model, prompt, response) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_pushed_int4_weights_are_what_the_qat_forward_used(tiny_k2_dir):
    from k2post.models.loading import load_causal_lm
    from k2post.rollout.config import SamplingConfig, VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine
    from k2post.rollout.weight_update import checkpoint_named_tensors, compare_digests, tensor_digests

    cfg = QATConfig(enabled=True)
    qat_model, plain = load_causal_lm(tiny_k2_dir, "float32").eval(), load_causal_lm(tiny_k2_dir, "float32").eval()
    install_qat(qat_model, cfg)
    served = checkpoint_named_tensors(qat_model, replace=quantized_weights(qat_model, cfg))
    engine = VLLMEngine(tiny_k2_dir, VLLMEngineConfig(dtype="float32", max_model_len=256, max_num_seqs=8))
    try:
        result = _push(engine, served)
        compare_digests(tensor_digests(served), result["digests"])  # loaded bit for bit
        outs = engine.generate(PROMPTS, SamplingConfig(temperature=1.0, max_tokens=24, n=2, seed=1))
    finally:
        engine.close()
    qat_gap, plain_gap = 0.0, 0.0
    for prompt, gens in zip(PROMPTS, outs):
        for gen in gens:
            engine_lp = torch.tensor(gen.logprobs)
            qat_gap = max(qat_gap, (engine_lp - _logprobs(qat_model, prompt, gen.token_ids)).abs().max().item())
            plain_gap = max(plain_gap, (engine_lp - _logprobs(plain, prompt, gen.token_ids)).abs().max().item())
    assert qat_gap < 1e-4  # the engine computes with the INT4 weights the trainer's forward used
    assert plain_gap > 10 * qat_gap  # ... and not with the full-precision ones
