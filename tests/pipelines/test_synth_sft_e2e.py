"""End to end at smoke size: synthesize tool-use data, SFT the random tiny model on it, play held-out tasks in vLLM.

`benchmarks/synth_sft.py --smoke` in process: `k2post synth` keeps almost every task (the scripted mistakes are
rejected by the judge), the random model makes no tool call on the held-out tasks, SFT on the synthesized dialogues
halves the held-out loss, and the SFT model loads in vLLM and plays every held-out task. Whether SFT teaches
well-formed tool calls and solves held-out tasks (400 tasks, 4 epochs: well-formed 0 -> 1.00, solved 0 -> 0.45) is
the benchmark's full run (docs/BENCHMARKS.md), not a timed test.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "synth_sft", Path(__file__).resolve().parents[2] / "benchmarks" / "synth_sft.py"
)
synth_sft = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(synth_sft)

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_synth_then_sft_then_heldout_episodes_in_vllm(tmp_path, record_property):
    args = synth_sft.parse_args(["--smoke"])
    figures = synth_sft.measure(tmp_path, args)
    for name, value in figures.items():
        record_property(name, value)
    assert figures["tasks_accepted"] >= 0.8 * args.tasks and figures["heldout"] == args.heldout
    assert figures["call_rate_before"] == 0.0 and figures["well_formed_before"] == 0.0
    assert figures["eval_loss_end"] < 0.5 * figures["eval_loss_start"]
    assert all(0.0 <= figures[f"{rate}_after"] <= 1.0 for rate in ("well_formed", "solve", "call_rate"))
    assert (tmp_path / "sft" / "final" / "model.safetensors").is_file()
