"""K2-style knowledge rephrasing: documents -> chunked, style-conditioned rewrites with a fidelity check per chunk ->
HF dataset with provenance.

    python -m k2post_pipelines.rephrase configs/rephrase_demo.yaml [key.path=value ...]
    k2post rephrase configs/rephrase_demo.yaml out_dir=runs/rephrase rewrites_per_document=5
    k2post rephrase --resume runs/rephrase        # continue a cut run (its config.yaml; written shards skipped)

Outputs and format: docs/REPHRASE.md. Exit status 2 on a config or input error (one line
`k2post rephrase: error: ...` naming it, e.g. the input row without a text field).
"""

from __future__ import annotations

import argparse

from k2post.command import add_config_arguments, command_parser, resume_config, run_command


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("rephrase", "rephrase documents chunk by chunk in other styles, fidelity-checked")
    add_config_arguments(parser, "rephrase", "configs/rephrase_demo.yaml", resume=True)
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the config, rephrase, print how many rewrites were kept."""
    from rich.console import Console

    from k2post.config.registry import load_run_config
    from k2post.rephrase import config as _registers_kind  # noqa: F401  (kind: rephrase)
    from k2post.rephrase.pipeline import run_rephrase

    config, overrides = resume_config(args.file, args.overrides, args.resume, "rephrase", "out_dir")
    cfg = load_run_config(config, overrides, expected_kind="rephrase")
    stats = run_rephrase(cfg, Console(stderr=True))
    print(
        f"rephrase: {stats['rewrites_kept']} rewrites of {stats['documents']} documents kept, "
        f"{stats['rewrites_dropped']} dropped -> {cfg.out_dir}/dataset"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
