"""SFT entry point: fine-tune on a chat dataset (e.g. `k2post synth` output) with MuonClip under DeepSpeed.

    python -m k2post_pipelines.sft configs/sft_tool_use.yaml [key.path=value ...]
    k2post sft configs/sft_tool_use.yaml [key.path=value ...]                 # the same
    k2post sft --resume runs/sft_tool_use [key.path=value ...]                # continue a stopped/killed run
    ray job submit --working-dir . -- python -m k2post_pipelines.sft configs/sft_tool_use.yaml
    torchrun --nproc-per-node 2 -m k2post_pipelines.sft configs/sft_tool_use.yaml   # data parallel

Writes metrics.jsonl, data_report.json, checkpoints/step-N, final/ (an HF model dir vLLM
loads), summary.json and run.log (console lines plus library logs and warnings; its path is the first line) into
`run_dir` (a relative one under `ray job submit` is refused: pass an absolute path);
`k2post sft --resume RUN_DIR` continues from the newest checkpoint.
Exit status: 0 when the run finished (or stopped at train.stop_at_step), 2 on a config, data,
run-dir or resume error (one line `k2post sft: error: ...` naming the field or the row).
"""

from __future__ import annotations

import argparse
import json
import os

# Before torch / DeepSpeed are imported: no torch.compile, DeepSpeed's CPU accelerator without a GPU.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from k2post.command import add_config_arguments, command_parser, resume_config, run_command  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("sft", "supervised fine-tuning on chat data (MuonClip on DeepSpeed), e.g. synth output")
    add_config_arguments(parser, "sft", "configs/sft_tool_use.yaml", resume=True)
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the config and train; rank 0 prints the summary as one JSON line."""
    from k2post.config.registry import load_run_config

    # --resume RUN_DIR: its config.yaml; train.stop_at_step ends one invocation, a resume runs to the end
    config, overrides = resume_config(
        args.file, args.overrides, args.resume, "sft", "run_dir", ("train.stop_at_step=null",)
    )
    cfg = load_run_config(config, overrides, expected_kind="sft")  # a config error before torch loads
    from k2post.train.console import LOG_NAME, claim_library_loggers, routed_output, run_dir_where

    where, rank = run_dir_where(cfg.run_dir, os.getcwd()), int(os.environ.get("RANK", "0"))
    log_name = LOG_NAME if rank == 0 else f"run.rank{rank}.log"
    with routed_output(where / log_name, rank) as log_path:
        if rank == 0:
            print(f"sft: run_dir {where} (library logs and warnings: {log_path})", flush=True)
        from k2post.sft.trainer import run_sft

        claim_library_loggers()  # DeepSpeed adds its own stdout handler when imported
        summary = run_sft(cfg)
        if rank == 0:
            print(json.dumps(summary), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
