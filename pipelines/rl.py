"""RL entry point: colocated K1.5 RL on Ray (trainer ranks + vLLM rollout actors, checkpoint-engine pushes).

    python -m k2post_pipelines.rl configs/rl_demo.yaml [key.path=value ...]
    python -m k2post_pipelines.rl --resume RUN_DIR [key.path=value ...]     # continue a run bit for bit (to the end,
                                                                      # unless train.stop_at_iteration is given again)
    k2post rl configs/rl_demo.yaml                                     # same, through the CLI
    ray job submit --working-dir . -- python -m k2post_pipelines.rl configs/rl_demo.yaml

Without a cluster it starts an embedded Ray; under `ray job submit` it joins the job's cluster.
Writes config.yaml, metrics.jsonl, tb/ (TensorBoard), plots/*.png, checkpoints/iter-N, final/
(an HF model dir), summary.json and run.log (the console's lines plus the library logs, warnings and Ray
worker output kept off the console; its path is the first line) into run_dir (docs/RL.md). A relative run_dir
under `ray job submit` is refused (Ray deletes the job's working dir): pass an absolute one. Exit status 0 when the run
finished or stopped at train.stop_at_iteration; 2 on a config or run-dir error (one line
`k2post rl: error: ...`, before any actor starts).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from k2post.command import add_config_arguments, command_parser, resume_config, run_command  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "rl", "colocated RL (K1.5 + PTX, MuonClip, vLLM rollouts) on embedded or cluster Ray; --resume continues"
    )
    add_config_arguments(parser, "rl", "configs/rl_demo.yaml", resume=True)
    return parser


def load_config(file: str | None, overrides: list[str], resume: str | None = None):
    """The RLConfig of CONFIG [overrides], or of --resume RUN_DIR [overrides] (its config.yaml, resume=true).
    stop_at_iteration ends one invocation: a resume runs to the end unless it is given again."""
    from k2post.config.registry import load_run_config

    fixed = ("train.stop_at_iteration=null",)
    config, overrides = resume_config(file, overrides, resume, "rl", "run_dir", fixed)
    return load_run_config(config, overrides, expected_kind="rl")


def run(args: argparse.Namespace) -> int:
    """Validate the config (before Ray starts), run, print the summary as one JSON line."""
    cfg = load_config(args.file, args.overrides, args.resume)  # a mistake is one line before torch is imported
    from k2post.train.console import LOG_NAME, routed_output, run_dir_where

    where = run_dir_where(cfg.run_dir, os.getcwd())  # a relative run_dir inside a Ray job: refused
    with routed_output(where / LOG_NAME) as log_path:
        print(f"rl: run_dir {where} (library logs and warnings: {log_path})", flush=True)
        from k2post.rl.controller import RLRun

        summary = RLRun(cfg).run()
        print(json.dumps(summary), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
