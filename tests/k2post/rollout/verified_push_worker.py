"""The real-engine half of the verified-push test (tests/k2post/rollout/test_weight_update.py), in its own process:
a push the vLLM worker refuses leaves process-global vLLM/torch.distributed state behind that later in-process
DeepSpeed tests trip over, so this runs apart.

    python tests/k2post/rollout/verified_push_worker.py QWEN2_DIR K2_DIR   # prints one JSON line: outcome per case

Cases on an fp32 tiny-qwen2 engine, each one `VLLMEngine.receive_update(verify_push=True)` from a `WeightSender` in
this process, checked as RL checks it (`compare_digests` of what arrived, `check_held` of what the engine's own
parameters hold after loading): the whole model (must pass), a tensor the engine never got (skipped), two same-shape
tensors swapped on the way, one byte flipped; then the engine's loader itself sabotaged (monkeypatched), the
tensors arriving intact: one weight transposed, two same-shape weights loaded into each other's places. Last, the
whole fp32 tiny-k2 model pushed into a bf16 engine (fused experts, MLA): the verdict per tensor.
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
    from k2post.rl.actors import verify_pushes
    from k2post.rollout.weight_update import tensor_digests

    outcome = verified_push(engine, pushed)
    try:
        if "error" in outcome:
            raise outcome["error"]
        verify_pushes([{"digests": tensor_digests(trainer.items())}], [outcome["result"]])
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def sabotaged_loader(change):
    """A context in which the worker's loader applies `change` to each bucket before loading it."""
    import contextlib

    from k2post.rollout import worker_extension

    @contextlib.contextmanager
    def patched():
        original = worker_extension.load_into_model
        worker_extension.load_into_model = lambda model, named, *a, **k: original(model, change(list(named)), *a, **k)
        try:
            yield
        finally:
            worker_extension.load_into_model = original

    return patched()


def swap(a: str, b: str):
    def change(named):
        values = dict(named)
        return [(n, values[b] if n == a else values[a] if n == b else t) for n, t in named]

    return change


def transpose(a: str):
    return lambda named: [(n, t.T.contiguous() if n == a else t) for n, t in named]


def bf16_verdicts(model_dir: str) -> dict:
    """The whole fp32 model pushed into a bf16 engine: the per-tensor verdicts."""
    from safetensors.torch import load_file

    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    weights = load_file(f"{model_dir}/model.safetensors")
    engine = VLLMEngine(model_dir, VLLMEngineConfig(dtype="bfloat16", max_model_len=256, max_num_seqs=4))
    outcome = verified_push(engine, weights)
    engine.close()
    if "error" in outcome:
        return {"error": f"{type(outcome['error']).__name__}: {outcome['error']}"}
    return {"held": outcome["result"]["held"], "row": verify_pushes_row(weights, outcome["result"])}


def verify_pushes_row(weights, result) -> dict:
    from k2post.rl.actors import verify_pushes
    from k2post.rollout.weight_update import tensor_digests

    return verify_pushes([{"digests": tensor_digests(weights.items())}], [result])


def main(model_dir: str, k2_dir: str) -> int:
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
    verdicts = {name: verdict(weights, pushed, engine) for name, pushed in cases.items()}
    for name, change in {"loader_transposed": transpose(q), "loader_swapped": swap(q, o)}.items():
        with sabotaged_loader(change):
            verdicts[name] = verdict(weights, weights, engine)
    engine.close()
    verdicts["k2_bf16"] = bf16_verdicts(k2_dir)
    print(json.dumps(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
