"""Benchmark: vLLM rollout engine vs transformers `generate`, and weight push vs engine rebuild.

Run: `python benchmarks/rollout.py [--flavor tiny-qwen2] [--sizes 64x64,128x128] [--repeats 3] [--quick | --smoke]`
(from the repo root; `--quick` = 8 prompts x 16 tokens, 1 repeat; `--smoke` = 2 prompts x 4 tokens, 1 repeat: the
test suite's check that every step runs, its figures mean nothing).

Same model, same prompts (chat-rendered, 9-30 tokens), greedy, exactly N new tokens each (vLLM
`ignore_eos`, transformers `min_new_tokens`), per size PROMPTSxTOKENS:
- vLLM: `VLLMEngine.generate` on all prompts in one call, per-token log-probs on (what a rollout
  records); "ids" = `detokenize=False` (the agentic rollout's setting: it decodes turns itself),
  "+ text" = vLLM also builds the response strings;
- transformers: `model.generate` on all prompts as one left-padded batch (its fastest mode here).
The three alternate, `--repeats` times each after a warm-up; tokens/s = prompts x tokens / median s.
Then the weight update, on the same model:
- push: `engine.load_weights(every tensor)` in place (weight loaders + CPU repack + prefix-cache
  reset), median of 5 after a warm-up;
- rebuild: the fallback, `weight_update: rebuild` (stage the tensors, write a safetensors checkpoint
  to /dev/shm, rebuild the engine from it), median of `--repeats`.
Prints markdown tables, then exactly one JSON line (headline = the first size):
{"vllm_tok_s": .., "hf_tok_s": .., "speedup": .., "push_ms": .., "rebuild_ms": .., "by_size": {..}, ...}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._timing import wall_times  # noqa: E402


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """n distinct short user turns rendered with the K2 template (generation prompt appended)."""
    from k2post.chat.template import render_ids
    from k2post.chat.types import Message

    topics = ["add", "sort", "explain", "translate", "summarize", "list", "count", "name"]
    texts = [
        f"Please {topics[i % len(topics)]} item {i}: {' '.join(str(j) for j in range(i % 7 + 1))}" for i in range(n)
    ]
    return [
        render_ids(tokenizer, [Message(role="user", content=t)], add_generation_prompt=True).input_ids for t in texts
    ]


@torch.no_grad()
def hf_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int) -> int:
    """One left-padded batch through transformers' generate; returns the new tokens made."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=pad,
    )
    return int((out.shape[1] - width) * out.shape[0])


def vllm_generate(engine, prompts: list[list[int]], new_tokens: int, detokenize: bool = True) -> int:
    """All prompts in one call, with per-token log-probs (what a rollout records)."""
    from k2post.rollout.config import SamplingConfig

    greedy = SamplingConfig(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, detokenize=detokenize)
    outs = engine.generate(prompts, greedy)
    return sum(len(o[0].token_ids) for o in outs)


def measure_generation(engine, model, tokenizer, prompts, new_tokens: int, repeats: int) -> dict[str, float]:
    """Alternate vLLM (engine text on / off) and transformers runs; median seconds of each."""
    expected = len(prompts) * new_tokens
    assert vllm_generate(engine, prompts, new_tokens) == expected  # warm-up + check
    assert hf_generate(model, tokenizer, prompts, new_tokens) == expected
    runs = {
        "vllm_s": lambda: vllm_generate(engine, prompts, new_tokens),
        "vllm_ids_s": lambda: vllm_generate(engine, prompts, new_tokens, detokenize=False),
        "hf_s": lambda: hf_generate(model, tokenizer, prompts, new_tokens),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name] += wall_times(fn, 1, warmup=0)
    return {name: statistics.median(values) for name, values in times.items()}


def generation_figures(gen: dict[str, float], n_prompts: int, new_tokens: int) -> dict[str, float]:
    tokens = n_prompts * new_tokens
    return {
        "vllm_tok_s": round(tokens / gen["vllm_ids_s"], 1),
        "vllm_text_tok_s": round(tokens / gen["vllm_s"], 1),
        "hf_tok_s": round(tokens / gen["hf_s"], 1),
        "speedup": round(gen["hf_s"] / gen["vllm_ids_s"], 2),
        "speedup_with_text": round(gen["hf_s"] / gen["vllm_s"], 2),
    }


def measure_push(engine, named) -> float:
    """Median ms of an in-place push of every tensor (after one warm-up)."""
    return statistics.median(wall_times(lambda: engine.load_weights(named), 5, warmup=1)) * 1e3


def measure_rebuild(model_dir: Path, engine_cfg, named, repeats: int) -> float:
    """Median ms of the rebuild fallback: stage + write to /dev/shm + rebuild the engine."""
    from k2post.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(model_dir, engine_cfg.model_copy(update={"weight_update": "rebuild"}))
    try:
        return statistics.median(wall_times(lambda: engine.load_weights(named), repeats, warmup=0)) * 1e3
    finally:
        engine.close()


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """'64x64,128x128' -> [(64, 64), (128, 128)] (prompts x new tokens)."""
    try:
        return [(int(a), int(b)) for a, b in (part.lower().split("x") for part in text.split(","))]
    except ValueError:
        raise SystemExit(f"--sizes: expected PROMPTSxTOKENS[,PROMPTSxTOKENS...], got {text!r}") from None


def run(args: argparse.Namespace) -> dict:
    from safetensors.torch import load_file

    from k2post.models.init import init_model_dir
    from k2post.models.loading import load_causal_lm, load_tokenizer
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    work = Path(tempfile.mkdtemp(prefix="k2post-bench-rollout-"))
    model_dir = init_model_dir(args.flavor, work / args.flavor, seed=0)
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    named = sorted(load_file(str(model_dir / "model.safetensors")).items())
    sizes = parse_sizes(args.sizes)
    cfg = VLLMEngineConfig(dtype="float32", max_model_len=512, max_num_seqs=max(n for n, _ in sizes))
    engine = VLLMEngine(model_dir, cfg)
    by_size = {}
    for n_prompts, new_tokens in sizes:
        gen = measure_generation(engine, model, tokenizer, chat_prompts(tokenizer, n_prompts), new_tokens, args.repeats)
        by_size[f"{n_prompts}x{new_tokens}"] = generation_figures(gen, n_prompts, new_tokens)
    push_ms, mode = measure_push(engine, named), engine.weight_update_mode
    engine.close()
    rebuild_ms = measure_rebuild(model_dir, cfg, named, args.repeats)
    headline = next(iter(by_size.values()))
    return {
        "flavor": args.flavor,
        "size": next(iter(by_size)),
        **headline,
        "push_ms": round(push_ms, 2),
        "rebuild_ms": round(rebuild_ms, 1),
        "push_mode": mode,
        "rebuild_over_push": round(rebuild_ms / push_ms, 1),
        "weights_mb": round(sum(t.numel() * t.element_size() for _, t in named) / 1e6, 2),
        "by_size": by_size,
    }


def print_table(r: dict) -> None:
    print(f"\n{r['flavor']}, greedy, fp32, per-token log-probs on, {r['weights_mb']} MB of weights\n")
    print(
        "| prompts x new tokens | vLLM tok/s (ids) | vLLM tok/s (+ text) | transformers tok/s | speedup (ids) "
        "| speedup (+ text) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for size, f in r["by_size"].items():
        print(
            f"| {size} | {f['vllm_tok_s']:.0f} | {f['vllm_text_tok_s']:.0f} | {f['hf_tok_s']:.0f} "
            f"| **{f['speedup']}x** | {f['speedup_with_text']}x |"
        )
    print("\n| weight update | ms |")
    print("| --- | --- |")
    print(f"| push in place ({r['push_mode']}) | {r['push_ms']:.1f} |")
    print(f"| rebuild from /dev/shm (fallback) | {r['rebuild_ms']:.0f} ({r['rebuild_over_push']}x the push) |\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="tiny-qwen2", help="model flavor to build (tiny-qwen2, tiny-k2)")
    parser.add_argument("--sizes", default="64x64,128x128", help="PROMPTSxTOKENS list; the first is the JSON headline")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each method")
    parser.add_argument("--quick", action="store_true", help="8 prompts x 16 tokens, 1 repeat (a short run)")
    parser.add_argument("--smoke", action="store_true", help="2 prompts x 4 tokens, 1 repeat (the test suite's run)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.repeats = "2x4", 1
    elif args.quick:
        args.sizes, args.repeats = "8x16", 1
    started = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print_table(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
