"""End-to-end smoke run: build (or load) the model, chat with it through vLLM, compare with transformers.

    python -m k2post_pipelines.demo configs/demo.yaml [key.path=value ...]
    k2post demo configs/demo.yaml [key.path=value ...]            # the same (`make smoke`)

Writes `<run_dir>/generations.jsonl` and `<run_dir>/summary.json`. Exit status 0 when vLLM's greedy
output matches transformers' (or the check is off), 1 when it does not, 2 on a config error (one
line `k2post demo: error: ...`, given before torch and vLLM are imported).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from k2post.chat.template import render_ids
from k2post.chat.types import Message
from k2post.command import add_config_arguments, command_parser, run_command
from k2post.config.registry import load_run_config
from k2post.config.runs import DemoConfig

console = Console()


def _timed(label: str, timings: dict[str, float]):
    class _Timer:
        def __enter__(self):
            self.t0 = time.perf_counter()
            console.print(f"[bold]>[/bold] {label} ...")

        def __exit__(self, *exc):
            timings[label] = round(time.perf_counter() - self.t0, 3)
            console.print(f"  {label}: {timings[label]:.1f}s")

    return _Timer()


def build_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Render each user message through the K2 chat template, ending with the generation prompt."""
    return [
        render_ids(tokenizer, [Message(role="user", content=text)], add_generation_prompt=True).input_ids
        for text in prompts
    ]


def run_demo(cfg: DemoConfig) -> dict:
    """Run the demo; returns the summary that is also written to run_dir/summary.json."""
    from k2post.models.loading import ensure_model, load_causal_lm, load_tokenizer
    from k2post.rollout.hf_reference import hf_greedy
    from k2post.rollout.vllm_engine import VLLMEngine

    timings: dict[str, float] = {}
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _timed("model", timings):
        model_dir = ensure_model(cfg.model)
        tokenizer = load_tokenizer(model_dir)
    prompts_ids = build_prompts(tokenizer, cfg.prompts)
    with _timed("vllm engine start", timings):
        engine = VLLMEngine(model_dir, cfg.engine)
        engine.generate(prompts_ids[:1], cfg.sampling.model_copy(update={"max_tokens": 2, "n": 1}))  # warm-up
    with _timed("vllm generate", timings):
        vllm_out = [g[0] for g in engine.generate(prompts_ids, cfg.sampling)]
    hf_out = None
    if cfg.check_against_transformers:
        with _timed("transformers generate", timings):
            model = load_causal_lm(model_dir, cfg.model.dtype)
            hf_out = hf_greedy(model, prompts_ids, cfg.sampling.max_tokens, {tokenizer.eos_token_id})
    return _write_outputs(cfg, run_dir, model_dir, tokenizer, vllm_out, hf_out, timings)


def _write_outputs(cfg, run_dir, model_dir, tokenizer, vllm_out, hf_out, timings) -> dict:
    rows = []
    for i, (prompt, gen) in enumerate(zip(cfg.prompts, vllm_out)):
        row = {
            "prompt": prompt,
            "response": gen.text,
            "token_ids": gen.token_ids,
            "mean_logprob": sum(gen.logprobs) / max(1, len(gen.logprobs)),
            "finish_reason": gen.finish_reason,
        }
        if hf_out is not None:
            row["matches_transformers"] = _strip_stop(hf_out[i], tokenizer.eos_token_id) == _strip_stop(
                gen.token_ids, tokenizer.eos_token_id
            )
        rows.append(row)
    with open(run_dir / "generations.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    n_tokens = sum(len(g.token_ids) for g in vllm_out)
    summary = {
        "model_dir": str(model_dir),
        "prompts": len(rows),
        "generated_tokens": n_tokens,
        "vllm_tok_s": round(n_tokens / max(timings["vllm generate"], 1e-9), 1),
        "greedy_match_transformers": None if hf_out is None else all(r["matches_transformers"] for r in rows),
        "timings_s": timings,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_table(rows)
    console.print_json(json.dumps(summary))
    return summary


def _strip_stop(ids: list[int], stop_id: int) -> list[int]:
    return ids[:-1] if ids and ids[-1] == stop_id else ids


def _print_table(rows: list[dict]) -> None:
    table = Table(title="demo generations (vLLM, greedy)")
    table.add_column("prompt")
    table.add_column("response (tiny untrained model)")
    table.add_column("== transformers")
    for row in rows:
        table.add_row(row["prompt"], repr(row["response"][:60]), str(row.get("matches_transformers", "-")))
    console.print(table)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "demo", "engine smoke check: tiny model chatting through vLLM, checked against transformers"
    )
    add_config_arguments(parser, "demo", "configs/demo.yaml")
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the config and run the demo; 1 when vLLM and transformers disagree."""
    cfg = load_run_config(args.file, args.overrides, expected_kind="demo")
    summary = run_demo(cfg)
    return 0 if summary["greedy_match_transformers"] in (True, None) else 1


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
