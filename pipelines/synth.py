"""SFT data synthesis (K2-style agentic trajectories with rubric-checked rejection sampling).

    python -m k2post_pipelines.synth configs/synth_tool_use.yaml [key.path=value ...]
    k2post synth configs/synth_tool_use.yaml out_dir=runs/my_synth tasks_per_domain=100
    k2post synth --resume runs/my_synth            # continue a cut run (its config.yaml; decided tasks skipped)

Also runs as a Ray job: `ray job submit --working-dir . -- python -m k2post_pipelines.synth CONFIG`.
Outputs and format: docs/SYNTH.md. Exit status 2 on a config / spec error (one line
`k2post synth: error: ...` naming it).
"""

from __future__ import annotations

import argparse

from k2post.command import add_config_arguments, command_parser, resume_config, run_command


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("synth", "synthesize agentic SFT data (tasks with rubrics -> trajectories -> judge)")
    add_config_arguments(parser, "synth", "configs/synth_tool_use.yaml", resume=True)
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the config, synthesize, print how many tasks were kept."""
    from rich.console import Console

    from k2post.config.registry import load_run_config
    from k2post.synth.pipeline import run_synth

    config, overrides = resume_config(args.file, args.overrides, args.resume, "synth", "out_dir")
    cfg = load_run_config(config, overrides, expected_kind="synth")
    stats = run_synth(cfg, Console(stderr=True))
    print(f"synth: {stats['tasks_accepted']}/{stats['tasks']} tasks kept -> {cfg.out_dir}/dataset")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
