"""The `k2post` command.

    k2post model init --flavor tiny-qwen2 --out artifacts/models/tiny-qwen2
    k2post model flavors
    k2post config show configs/demo.yaml [key.path=value ...]
    k2post demo configs/demo.yaml [key.path=value ...]
    k2post envs list
    k2post envs test [NAME ...] [--golden PATH] [--isolated]
    k2post serve MODEL_DIR [--port 8000] [--api-key KEY] [--host 127.0.0.1]
    k2post synth configs/synth_tool_use.yaml [key.path=value ...]
    k2post sft configs/sft_tool_use.yaml [key.path=value ...]
    k2post rl configs/rl_demo.yaml [key.path=value ...] | k2post rl --resume RUN_DIR
    k2post eval MODEL_OR_RUN_DIR [--env NAME] [--env-config YAML] [--n N] [--seed S]
    k2post recipe configs/recipe_demo.yaml [key.path=value ...]   # what `make demo` runs
    k2post critic pairs MODEL_OR_RUN_DIR --env math --split test --n 64 --k 8 --out pairs.jsonl

Each subcommand registers a parser in `_SUBCOMMANDS`. Config and input errors print one line
and exit with status 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Callable

from k2post.config.loader import ConfigError, dump_yaml


def _cmd_model_init(args: argparse.Namespace) -> int:
    from k2post.models.init import init_model_dir

    path = init_model_dir(args.flavor, args.out, seed=args.seed, vocab_size=args.vocab_size, overwrite=args.overwrite)
    print(f"model written to {path}")
    return 0


def _cmd_model_flavors(args: argparse.Namespace) -> int:
    from k2post.models.flavors import FLAVORS

    for name in sorted(FLAVORS):
        print(name)
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    from k2post.config.registry import load_run_config

    cfg = load_run_config(args.file, args.overrides)
    print(dump_yaml(cfg), end="")
    return 0


def _run_pipeline(module: str, entry: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand handler that calls `pipelines.<module>.<entry>([file, *overrides])` (imported late)."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(f"pipelines.{module}"), entry)([args.file, *args.overrides])

    return run


def _add_config_command(sub: argparse._SubParsersAction, name: str, help_text: str, example: str, handler) -> None:
    """`k2post NAME CONFIG [key.path=value ...]`."""
    command = sub.add_parser(name, help=help_text)
    command.add_argument("file", help=f"a `kind: {name}` YAML config, e.g. {example}")
    command.add_argument("overrides", nargs="*", help="dotted overrides: key.path=value")
    command.set_defaults(func=handler)


def _add_synth_parser(sub: argparse._SubParsersAction) -> None:
    _add_config_command(sub, "synth", "synthesize agentic SFT data (tasks with rubrics -> trajectories -> judge)",
                        "configs/synth_tool_use.yaml", _run_pipeline("synth", "main"))


def _add_sft_parser(sub: argparse._SubParsersAction) -> None:
    _add_config_command(sub, "sft", "supervised fine-tuning on chat data (MuonClip on DeepSpeed), e.g. synth output",
                        "configs/sft_tool_use.yaml", _run_pipeline("sft", "run"))


def _cmd_rl(args: argparse.Namespace) -> int:
    from pipelines.rl import main as rl_main

    if args.resume:  # with --resume the first positional is an override, not a config file
        return rl_main(["--resume", args.resume, *([args.file] if args.file else []), *args.overrides])
    if not args.file:
        print("k2post rl: error: give a CONFIG or --resume RUN_DIR", file=sys.stderr)
        return 2
    return rl_main([args.file, *args.overrides])


def _add_rl_parser(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser("rl", help="colocated RL (K1.5 + PTX, MuonClip, vLLM rollouts) on embedded or cluster Ray")
    command.add_argument("file", nargs="?", help="a `kind: rl` YAML config, e.g. configs/rl_demo.yaml")
    command.add_argument("overrides", nargs="*", help="dotted overrides: key.path=value")
    command.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest checkpoint")
    command.set_defaults(func=_cmd_rl)


def _add_model_parser(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="build and inspect models").add_subparsers(dest="model_cmd", required=True)
    init = model.add_parser("init", help="build a tiny model + tokenizer from a named flavor, in HF format")
    init.add_argument("--flavor", required=True, help="flavor name (see `k2post model flavors`)")
    init.add_argument("--out", required=True, help="output directory (HF format)")
    init.add_argument("--seed", type=int, default=0, help="init seed (default 0)")
    init.add_argument("--vocab-size", type=int, default=4096, help="tokenizer vocab size (default 4096)")
    init.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    init.set_defaults(func=_cmd_model_init)
    model.add_parser("flavors", help="list the model flavors").set_defaults(func=_cmd_model_flavors)


def _add_config_parser(sub: argparse._SubParsersAction) -> None:
    config = sub.add_parser("config", help="inspect configs").add_subparsers(dest="config_cmd", required=True)
    show = config.add_parser("show", help="print the validated config with every default filled in")
    show.add_argument("file", help="a YAML run config (its `kind` picks the schema)")
    show.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sampling.temperature=0.7")
    show.set_defaults(func=_cmd_config_show)


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    _add_config_command(sub, "demo", "engine smoke check: tiny model chatting through vLLM, checked against transformers", "configs/demo.yaml",
                        _run_pipeline("demo", "main"))


def _add_recipe_parser(sub: argparse._SubParsersAction) -> None:
    _add_config_command(sub, "recipe", "the recipe end to end: model, synth, SFT, eval, RL, eval, report (what `make demo` runs)",
                        "configs/recipe_demo.yaml", _run_pipeline("recipe", "main"))


def _add_critic_parser(sub: argparse._SubParsersAction) -> None:
    from rubrics.pairs import add_critic_parser

    add_critic_parser(sub)


def _add_eval_parser(sub: argparse._SubParsersAction) -> None:
    from k2post.evaluation.cli import add_eval_parser

    add_eval_parser(sub)


def _add_envs_parser(sub: argparse._SubParsersAction) -> None:
    from k2post.envs.cli import add_envs_parser

    add_envs_parser(sub)


def _cmd_serve(args: argparse.Namespace) -> int:
    from k2post.llm.serve import ServerStartError, serve_config_from_args, start_server

    cfg = serve_config_from_args(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `finally` below then stops the server
    try:
        handle = start_server(cfg)
    except ServerStartError as err:
        print(f"k2post: error: {err}", file=sys.stderr)
        return 1
    print(f"serving {cfg.model_dir} at {handle.base_url} (pid {handle.pid}, log {handle.log_path}); Ctrl-C stops", flush=True)
    try:
        return handle.process.wait() if handle.process is not None else 0
    except KeyboardInterrupt:
        return 0
    finally:
        handle.stop()


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from k2post.llm.serve import add_serve_arguments

    serve = sub.add_parser("serve", help="serve a checkpoint with vLLM's OpenAI-compatible server")
    add_serve_arguments(serve)
    serve.set_defaults(func=_cmd_serve)


_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_model_parser,
    _add_config_parser,
    _add_demo_parser,
    _add_envs_parser,
    _add_serve_parser,
    _add_synth_parser,
    _add_sft_parser,
    _add_rl_parser,
    _add_eval_parser,
    _add_recipe_parser,
    _add_critic_parser,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k2post", description="Kimi K2-style post-training (SFT + RL).")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileExistsError, FileNotFoundError, KeyError, ValueError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"k2post: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
