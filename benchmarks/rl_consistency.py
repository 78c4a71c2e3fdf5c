"""Benchmark: train-inference consistency on the K2-shaped model with a bf16 engine, and the cost of verified pushes.

Run: `python benchmarks/rl_consistency.py [--prompts 16] [--samples 4] [--tokens 48] [--repeats 5] [--quick]`
(from the repo root; ~1 min on the 2-core dev box; `--quick` is a smoke-test size).

A fresh tiny-k2 (DeepSeek-V3 layout: MLA, layers 1-3 MoE with 8 routed experts, top-2, sigmoid router) is built
in a temp dir. A bf16 vLLM engine with `record_routing` samples `--samples` responses to each of `--prompts`
prompts at temperature 1; the fp32 transformers model (what the RL trainer holds) scores the same tokens
twice, routing on its own and replaying the engine's experts (`k2post.rl.consistency_probe.probe`, the pieces
the trainer runs). Side by side:

- mismatch KL: mean per-token KL(engine || trainer) (k3 estimate), without and with replay, and max |d log p|;
- router disagreement: share of tokens whose trainer top-k differs from the engine's in any MoE layer (without
  replay: the trainer's own choice; with replay: the experts it used);
- verified push: the engine's weights pushed through the checkpoint engine (`VLLMEngine.receive_update`, receiver
  in the vLLM worker, sender in this process) with and without post-push verification (trainer-side digests of
  every tensor + engine-side digests and the written-parameter check + the comparison), interleaved, median of
  --repeats after a warm-up; verify_cost_ratio = (verified - plain) / plain.

Prints a table, then one JSON line: {"mismatch_kl_no_replay": .., "mismatch_kl_replay": ..,
"router_disagree_no_replay": .., "router_disagree_replay": .., "verify_cost_ratio": .., ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def prompts(n: int) -> list[list[int]]:
    """Deterministic token prompts of 8-12 tokens (vLLM CPU's bf16 prefill of 1-4 tokens crashed)."""
    return [[(7 * i + 3 * t) % 3000 + 20 for t in range(8 + i % 5)] for i in range(n)]


def consistency(engine, model_dir: Path, args) -> dict:
    from k2post.models.loading import load_causal_lm
    from k2post.rl.config import ISCorrectionConfig
    from k2post.rl.consistency_probe import probe
    from k2post.rollout.config import SamplingConfig

    sampling = SamplingConfig(temperature=1.0, max_tokens=args.tokens, n=args.samples, seed=7)
    gens = [g for out in engine.generate(prompts(args.prompts), sampling) for g in out]
    model = load_causal_lm(model_dir, "float32").eval()
    return probe(model, gens, ISCorrectionConfig(enabled=True))


def one_push(engine, tensors: dict, verify: bool) -> float:
    """Seconds of one push of `tensors` into the engine (sender here, receiver in the vLLM worker)."""
    from k2post_checkpoint_engine import CheckpointEngineConfig, WeightSender

    from k2post.rollout.weight_update import compare_digests, tensor_digests

    started = time.perf_counter()
    with WeightSender(CheckpointEngineConfig(bucket_nbytes=16 << 20, timeout_s=120.0)) as sender:
        for name in sorted(tensors):
            sender.register(name, tensors[name])
        sent = tensor_digests(sorted(tensors.items())) if verify else None
        result: dict = {}
        thread = threading.Thread(
            target=lambda: result.update(engine.receive_update(sender.address, timeout_s=120.0, verify_push=verify))
        )
        thread.start()
        sender.push()
        thread.join(timeout=120)
    if thread.is_alive() or "nbytes" not in result:
        raise RuntimeError("the push did not finish")
    if verify:
        compare_digests(sent, result["digests"])
    return time.perf_counter() - started


def push_costs(engine, model_dir: Path, repeats: int) -> dict:
    from safetensors.torch import load_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    one_push(engine, tensors, False)  # warm-up of both paths
    one_push(engine, tensors, True)
    plain, verified = [], []
    for _ in range(repeats):
        plain.append(one_push(engine, tensors, False))
        verified.append(one_push(engine, tensors, True))
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return {"mb": nbytes / 2**20, "plain_s": statistics.median(plain), "verified_s": statistics.median(verified)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 2 samples x 16 tokens, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.samples, args.tokens, args.repeats = 4, 2, 16, 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from k2post.models.init import init_model_dir
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    with tempfile.TemporaryDirectory(prefix="k2_consistency_") as tmp:
        model_dir = Path(init_model_dir("tiny-k2", Path(tmp) / "tiny-k2", seed=0))
        cfg = VLLMEngineConfig(dtype="bfloat16", max_model_len=256, max_num_seqs=64, record_routing=True)
        engine = VLLMEngine(model_dir, cfg)
        try:
            report = consistency(engine, model_dir, args)
            push = push_costs(engine, model_dir, args.repeats)
        finally:
            engine.close()
    print_report(report, push, args)
    return 0


def print_report(report: dict, push: dict, args) -> None:
    plain, replay = report["no_replay"], report["replay"]
    print(
        f"tiny-k2, bf16 vLLM engine vs fp32 trainer: {args.prompts} prompts x {args.samples} samples x "
        f"<= {args.tokens} tokens ({int(plain['consistency/tokens'])} tokens)\n"
    )
    print("| | no replay | routing replay |\n|---|---|---|")
    for key, label in (
        ("consistency/kl", "KL(engine || trainer) per token"),
        ("consistency/logprob_diff_max", "max |d log p|"),
        ("routing/disagree_used", "tokens routed differently"),
    ):
        print(f"| {label} | {plain[key]:.3g} | {replay[key]:.3g} |")
    ratio = (push["verified_s"] - push["plain_s"]) / push["plain_s"]
    print(f"\n| push of {push['mb']:.1f} MiB | plain | verified | cost |\n|---|---|---|---|")
    print(f"| median of {args.repeats} | {push['plain_s']:.3f} s | {push['verified_s']:.3f} s | {ratio:+.1%} |\n")
    figures = {
        "mismatch_kl_no_replay": plain["consistency/kl"],
        "mismatch_kl_replay": replay["consistency/kl"],
        "router_disagree_no_replay": plain["routing/disagree_used"],
        "router_disagree_replay": replay["routing/disagree_used"],
        "verify_cost_ratio": ratio,
        "logprob_diff_max_no_replay": plain["consistency/logprob_diff_max"],
        "logprob_diff_max_replay": replay["consistency/logprob_diff_max"],
        "kl_ratio_no_replay_over_replay": plain["consistency/kl"] / max(replay["consistency/kl"], 1e-30),
        "tokens": plain["consistency/tokens"],
        "push_mb": push["mb"],
        "push_plain_s": push["plain_s"],
        "push_verified_s": push["verified_s"],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
