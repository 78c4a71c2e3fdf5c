"""RL entry point: colocated K1.5 RL on Ray (trainer ranks + vLLM rollout actors, checkpoint-engine pushes).

    python -m pipelines.rl configs/rl_demo.yaml [key.path=value ...]
    python -m pipelines.rl --resume RUN_DIR [key.path=value ...]     # continue a run bit for bit (to the end,
                                                                      # unless train.stop_at_iteration is given again)
    k2post rl configs/rl_demo.yaml                                     # same, through the CLI
    ray job submit --working-dir . -- python -m pipelines.rl configs/rl_demo.yaml

Without a cluster it starts an embedded Ray; under `ray job submit` it joins the job's cluster.
Writes config.yaml, metrics.jsonl, tb/ (TensorBoard), plots/*.png, checkpoints/iter-N, final/
(an HF model dir) and summary.json into run_dir (docs/RL.md). Exit status 0 when the run
finished or stopped at train.stop_at_iteration; 2 on a config error (before any actor starts).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from k2post.config.loader import ConfigError  # noqa: E402
from k2post.config.registry import load_run_config  # noqa: E402

USAGE = "usage: python -m pipelines.rl CONFIG [key.path=value ...] | --resume RUN_DIR [key.path=value ...]"


def load_config(argv: list[str]):
    """CONFIG [overrides] or --resume RUN_DIR [overrides] (the run dir's config.yaml with resume=true)."""
    if argv[0] == "--resume":
        if len(argv) < 2:
            raise ConfigError(USAGE)
        config = Path(argv[1]) / "config.yaml"
        if not config.is_file():
            raise ConfigError(f"--resume {argv[1]}: no config.yaml there (not an RL run dir)")
        # stop_at_iteration ends one invocation: a resume runs to the end unless it is given again
        fixed = ["resume=true", f"run_dir={argv[1]}", "train.stop_at_iteration=null"]
        return load_run_config(config, [*fixed, *argv[2:]], expected_kind="rl")
    return load_run_config(argv[0], argv[1:], expected_kind="rl")


def run(argv: list[str]) -> int:
    """Validate the config (before Ray starts), run, print the summary as one JSON line."""
    from k2post.rl.controller import RLRun

    cfg = load_config(argv)
    summary = RLRun(cfg).run()
    print(json.dumps(summary), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    from k2post.rl.controller import RLRunDirError

    try:
        return run(argv)
    except (ConfigError, RLRunDirError) as err:
        print(f"rl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
