"""SFT data synthesis (K2-style agentic trajectories with rubric-checked rejection sampling).

    python -m pipelines.synth configs/synth_tool_use.yaml [key.path=value ...]
    k2post synth configs/synth_tool_use.yaml out_dir=runs/my_synth tasks_per_domain=100

Also runs as a Ray job: `ray job submit --working-dir . -- python -m pipelines.synth CONFIG`.
Outputs and format: docs/SYNTH.md. Exit status 2 on a config / spec error (one line naming it).
"""

from __future__ import annotations

import sys

from rich.console import Console

from k2post.config.loader import ConfigError
from k2post.config.registry import load_run_config


def main(argv: list[str] | None = None) -> int:
    from k2post.synth.pipeline import SynthError, run_synth

    argv = sys.argv[1:] if argv is None else argv
    console = Console(stderr=True)
    if not argv:
        console.print("usage: python -m pipelines.synth CONFIG [key.path=value ...]")
        return 2
    try:
        cfg = load_run_config(argv[0], argv[1:], expected_kind="synth")
        stats = run_synth(cfg, console)
    except (ConfigError, SynthError) as err:
        print(f"k2post synth: error: {err}", file=sys.stderr)
        return 2
    print(f"synth: {stats['tasks_accepted']}/{stats['tasks']} tasks kept -> {cfg.out_dir}/dataset")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
