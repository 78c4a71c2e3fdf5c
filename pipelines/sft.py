"""SFT entry point: fine-tune on a chat dataset (e.g. `k2post synth` output) with MuonClip under DeepSpeed.

    python -m pipelines.sft configs/sft_tool_use.yaml [key.path=value ...]
    ray job submit --working-dir . -- python -m pipelines.sft configs/sft_tool_use.yaml
    torchrun --nproc-per-node 2 -m pipelines.sft configs/sft_tool_use.yaml   # data parallel

Writes metrics.jsonl, data_report.json, checkpoints/step-N, final/ (an HF model dir vLLM
loads) and summary.json into `run_dir`; `resume=true` continues from the newest checkpoint.
Exit status: 0 when the run finished (or stopped at train.stop_at_step), 2 on a config or
data error (one line naming the field or the row).
"""

from __future__ import annotations

import json
import os
import sys

# Before torch / DeepSpeed are imported: no torch.compile, DeepSpeed's CPU accelerator without a GPU.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from k2post.config.loader import ConfigError  # noqa: E402
from k2post.config.registry import load_run_config  # noqa: E402


def run(argv: list[str]) -> int:
    """Load the config (CONFIG [key.path=value ...]) and train; errors propagate (the `k2post` CLI prints them)."""
    from k2post.sft.trainer import run_sft

    cfg = load_run_config(argv[0], argv[1:], expected_kind="sft")
    summary = run_sft(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(summary), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m pipelines.sft CONFIG [key.path=value ...]", file=sys.stderr)
        return 2
    from k2post.sft.checkpoint import ResumeError
    from k2post.sft.data import SFTDataError
    from k2post.sft.trainer import RunDirError

    try:
        return run(argv)
    except (ConfigError, SFTDataError, ResumeError, RunDirError) as err:
        print(f"sft: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
