"""The `k2post` command: a table of commands, each `pipelines/<module>.py:main`.

    k2post --help                                   # the table
    k2post <command> --help                         # that command's flags
    k2post sft configs/sft_tool_use.yaml train.max_steps=10
    python -m k2post.cli <command> ...              # the same without the console script

`k2post <command> ARGS` imports `pipelines.<module>` only then (so `k2post --help` stays light) and
returns `main(ARGS)`. Each command owns its parser (prog `k2post <command>`) and runs under the error
wrapper in `k2post/command.py`: a config or input error is one line `k2post <command>: error: ...`
and exit status 2.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import NamedTuple


class Command(NamedTuple):
    """A row of the table: the module under `pipelines/` that runs it, and its one-line help."""

    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "model": Command("model", "build and inspect models: `model init --flavor F --out DIR`, `flavors`, `stats`"),
    "config": Command("config", "`config show CONFIG [overrides]`: the validated config with every default"),
    "demo": Command("demo", "engine smoke check: tiny model chatting through vLLM, checked against transformers"),
    "envs": Command("envs", "`envs list`, `envs test [NAME ...]`: environments, golden reward tests, hack suite"),
    "serve": Command("serve", "serve a checkpoint with vLLM's OpenAI-compatible server"),
    "synth": Command("synth", "synthesize agentic SFT data (tasks with rubrics -> trajectories -> judge)"),
    "rephrase": Command("rephrase", "rephrase documents chunk by chunk in other styles, fidelity-checked (K2)"),
    "sft": Command("sft", "supervised fine-tuning on chat data (MuonClip on DeepSpeed), e.g. synth output"),
    "rl": Command("rl", "colocated RL (K1.5 + PTX, MuonClip, vLLM rollouts); `rl --resume RUN_DIR` continues"),
    "eval": Command("eval", "held-out accuracy per environment of a model or run dir (vLLM, isolated scoring)"),
    "recipe": Command("recipe", "model, synth, SFT, eval, RL, eval, report end to end (what `make demo` runs)"),
    "judge": Command("judge", "`judge train CONFIG`, `judge eval DIR`: the sentence-level faithfulness judge"),
    "critic": Command("critic", "`critic pairs MODEL ...`: on-policy (correct, wrong) answer pairs of a model"),
}


def usage() -> str:
    """`k2post --help`: the table of commands."""
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {cmd.help}" for name, cmd in COMMANDS.items())
    return (
        "usage: k2post <command> [args ...]\n\nKimi K2-style post-training (SFT + RL).\n\n"
        f"commands (each is pipelines/<command>.py; `k2post <command> --help` for its flags):\n{rows}\n"
    )


def unknown_command(name: str) -> int:
    """One-line error for a name not in the table (with the closest command, if any); 2."""
    close = difflib.get_close_matches(name, list(COMMANDS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (one of: {', '.join(COMMANDS)})"
    print(f"k2post: error: unknown command {name!r}{hint}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Dispatch `k2post <command> ARGS` to `pipelines.<module>.main(ARGS)`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        return unknown_command(name)
    return importlib.import_module(f"k2post_pipelines.{COMMANDS[name].module}").main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
