"""The real-engine half of the verified-push test (tests/k2post/rollout/test_weight_update.py), in its own process:
a push the vLLM worker refuses leaves process-global vLLM/torch.distributed state behind that later in-process
DeepSpeed tests trip over, so this runs apart.

    python tests/k2post/rollout/verified_push_worker.py MODEL_DIR   # prints one JSON line: outcome per case

Cases, each one `VLLMEngine.receive_update(verify_push=True)` from a `WeightSender` in this process, compared with
the trainer-side digests of what should have arrived (`compare_digests`): the whole model (must pass), a tensor
the engine never got (skipped), two same-shape tensors swapped, one byte flipped.
"""

from __future__ import annotations

import json
import sys
import threading

import torch


def verified_push(engine, tensors: dict[str, torch.Tensor]) -> dict:
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

    outcome: dict = {}
    with WeightSender(CheckpointEngineConfig(bucket_nbytes=1 << 20, timeout_s=60.0)) as sender:
        for name in sorted(tensors):
            sender.register(name, tensors[name])

        def receive() -> None:
            try:
                outcome["result"] = engine.receive_update(sender.address, timeout_s=60.0, verify_push=True)
            except BaseException as exc:  # reported below
                outcome["error"] = exc

        thread = threading.Thread(target=receive)
        thread.start()
        try:
            sender.push()
        except Exception as exc:  # the receiver's failure, seen from the sender
            outcome.setdefault("sender_error", exc)
        thread.join(timeout=60)
    return outcome


def verdict(trainer: dict[str, torch.Tensor], pushed: dict[str, torch.Tensor], engine) -> str:
    """ "ok", or the error that stopped the push (`TypeName: message`)."""
    from k2post.rollout.weight_update import compare_digests, tensor_digests

    outcome = verified_push(engine, pushed)
    try:
        if "error" in outcome:
            raise outcome["error"]
        compare_digests(tensor_digests(trainer.items()), outcome["result"]["digests"])
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def main(model_dir: str) -> int:
    from safetensors.torch import load_file

    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    weights = load_file(f"{model_dir}/model.safetensors")
    engine = VLLMEngine(model_dir, VLLMEngineConfig(dtype="float32", max_model_len=256, max_num_seqs=4))
    skipped = "model.layers.0.mlp.down_proj.weight"
    q, o = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"
    assert weights[q].shape == weights[o].shape
    flipped = weights["model.norm.weight"].clone()
    flipped.view(torch.uint8)[5] ^= 0x10
    cases = {
        "whole": weights,
        "skipped": {k: v for k, v in weights.items() if k != skipped},
        "swapped": {**weights, q: weights[o], o: weights[q]},
        "flipped": {**weights, "model.norm.weight": flipped},
    }
    print(json.dumps({name: verdict(weights, pushed, engine) for name, pushed in cases.items()}))
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
