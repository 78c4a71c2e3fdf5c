"""`k2post model`: build a tiny model + tokenizer from a named flavor, list the flavors.

    k2post model init --flavor tiny-qwen2 --out artifacts/models/tiny-qwen2 [--seed 0] [--chat-format instruct|thinking]
    k2post model flavors
    k2post model prepare path/to/hf_model --out artifacts/models/mine [--chat-format thinking] [--overwrite]
    k2post model export runs/rl/final --int4 out/int4 [--group-size 32] [--modules '*.mlp.experts']
    k2post model stats MODEL_DIR | CONFIG_JSON | --preset kimi-k2 [--context 4096] [--kv-dtype bf16] [--json]
    python -m k2post_pipelines.model flavors               # the same without the console script

`prepare` adds K2's special tokens and chat template to any HF causal-LM dir, resizes its embeddings (new
rows: the mean of the old) and prints what it changed (k2post/models/prepare.py). `export --int4` writes the
compressed-tensors pack-quantized INT4 checkpoint K2 Thinking ships (k2post/quant/export.py, docs/QAT.md).
`stats` counts total / active params, FLOPs and KV-cache bytes per token of a model built on the meta device
(k2post/models/stats.py, docs/MODELS.md "Model stats").
Exit status 2 (one line `k2post model: error: ...`) for an unknown flavor or preset, a dir that is not an HF
model, a config of an unknown architecture or with absurd values (k2post/models/config_check.py), missing or
damaged weights, weights that do not fit in memory, a source without a tokenizer (prepare), an existing output dir,
an output dir equal to, inside or containing the source (k2post/models/outdir.py), a flag out of its range, or an
OSError of a path (permission denied, no space left). prepare and export write into a temporary dir beside the
output and rename it into place when complete, so a failure leaves the old output (and always the source) as it was.
"""

from __future__ import annotations

import argparse

from k2post.command import check_range, command_parser, run_command

CHAT_FORMAT_ARG = {
    "choices": ("instruct", "thinking"),
    "default": "instruct",
    "help": "K2 chat template the tokenizer gets: instruct (K2-Instruct, no think blocks; default) or thinking "
    "(K2-Thinking: <think> blocks, generation prompt ends with <think>)",
}


def _init(args: argparse.Namespace) -> int:
    from k2post.models.flavors import FLAVORS, unknown_flavor_message

    if args.flavor not in FLAVORS:  # before torch is imported: a typo is one line in well under a second
        raise KeyError(unknown_flavor_message(args.flavor))
    check_range("--vocab-size", args.vocab_size, 1, 1 << 20)
    check_range("--seed", args.seed, -(1 << 63), (1 << 63) - 1)  # what torch.manual_seed takes
    from pathlib import Path

    from k2post.models.outdir import check_new_dir

    check_new_dir(Path(args.out), args.overwrite, "--out")
    from k2post.models.init import init_model_dir

    path = init_model_dir(
        args.flavor,
        args.out,
        seed=args.seed,
        vocab_size=args.vocab_size,
        overwrite=args.overwrite,
        chat_format=args.chat_format,
    )
    print(f"model written to {path}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from k2post.models.prepare import check_dirs, prepare_model_dir

    check_dirs(Path(args.source), Path(args.out), args.overwrite)  # a mistake is one line before torch loads
    report = prepare_model_dir(args.source, args.out, overwrite=args.overwrite, chat_format=args.chat_format)
    print(report.summary())
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    check_range("--group-size", args.group_size, 1, 1 << 16)
    from k2post.models.outdir import check_out_dir
    from k2post.models.weights import check_model_source

    check_model_source(Path(args.source), "MODEL_DIR")  # a mistake is one line before torch loads
    check_out_dir(Path(args.source), Path(args.int4), args.overwrite, "--int4")
    from k2post.quant.export import export_int4
    from k2post.quant.qat import QATConfig

    cfg = QATConfig(enabled=True, group_size=args.group_size, modules=args.modules or QATConfig().modules)
    print(export_int4(args.source, args.int4, cfg, overwrite=args.overwrite).summary())
    return 0


def _stats(args: argparse.Namespace) -> int:
    import json

    from k2post.models import stats

    if (args.source is None) == (args.preset is None):
        raise ValueError("give one of MODEL_DIR, CONFIG_JSON or --preset NAME")
    if args.preset is not None and args.preset not in stats.known_presets():  # before torch is imported
        raise KeyError(f"unknown preset {args.preset!r}; known presets: {', '.join(stats.known_presets())}")
    if args.kv_dtype not in stats.KV_DTYPE_BYTES:
        raise ValueError(f"--kv-dtype {args.kv_dtype!r}: one of {', '.join(stats.KV_DTYPE_BYTES)}")
    check_range("--context", args.context, 1, stats.MAX_CONTEXT)
    config = stats.preset_config(args.preset) if args.preset else stats.load_config(args.source)
    result = stats.model_stats(config, context=args.context, kv_dtype=args.kv_dtype)
    name = args.preset or args.source
    print(json.dumps({"model": name, **result}) if args.json else stats.render(result, name), end="\n" * args.json)
    return 0


def _flavors(args: argparse.Namespace) -> int:
    from k2post.models.flavors import FLAVORS

    for name in sorted(FLAVORS):
        print(name)
    return 0


def run_subcommand(args: argparse.Namespace) -> int:
    """`args.func(args)`, with an OSError of the system (errno set: permission denied, a read-only or full disk, a
    path that cannot be created) turned into one line `<path>: <reason>`, as every other user error is."""
    try:
        return args.func(args)
    except OSError as err:
        if err.errno is None:  # ours (FileNotFoundError / FileExistsError with a message): already one line
            raise
        where = f"{err.filename}: " if err.filename else ""
        raise ValueError(f"{where}{err.strerror or err}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("model", "build and inspect models")
    sub = parser.add_subparsers(dest="model_cmd", required=True)
    init = sub.add_parser("init", help="build a tiny model + tokenizer from a named flavor, in HF format")
    init.add_argument("--flavor", required=True, help="flavor name (see `k2post model flavors`)")
    init.add_argument("--out", required=True, help="output directory (HF format)")
    init.add_argument("--seed", type=int, default=0, help="init seed (default 0)")
    init.add_argument("--vocab-size", type=int, default=4096, help="tokenizer vocab size (default 4096)")
    init.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    init.add_argument("--chat-format", **CHAT_FORMAT_ARG)
    init.set_defaults(func=_init)
    sub.add_parser("flavors", help="list the model flavors").set_defaults(func=_flavors)
    prepare = sub.add_parser("prepare", help="add K2's special tokens + chat template to any HF causal-LM dir")
    prepare.add_argument("source", metavar="HF_DIR", help="an HF causal-LM directory (config.json, weights, tokenizer)")
    prepare.add_argument("--out", required=True, help="output directory (the source is left as it is)")
    prepare.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    prepare.add_argument("--chat-format", **CHAT_FORMAT_ARG)
    prepare.set_defaults(func=_prepare)
    export = sub.add_parser("export", help="write an INT4 (compressed-tensors pack-quantized) checkpoint")
    export.add_argument("source", metavar="MODEL_DIR", help="an HF model dir (e.g. a QAT run's final/)")
    export.add_argument("--int4", required=True, metavar="OUT", help="output directory of the INT4 checkpoint")
    export.add_argument("--group-size", type=int, default=32, help="weights per scale along the input dim (32)")
    export.add_argument(
        "--modules", nargs="+", help="fnmatch patterns of the modules to quantize (default: '*.mlp.experts')"
    )
    export.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    export.set_defaults(func=_export)
    stats = sub.add_parser("stats", help="total / active params, FLOPs and KV-cache bytes per token (meta device)")
    stats.add_argument("source", nargs="?", metavar="MODEL_DIR|CONFIG_JSON", help="an HF model dir or a config.json")
    stats.add_argument("--preset", metavar="NAME", help="kimi-k2, deepseek-v3 or a flavor (see `model flavors`)")
    stats.add_argument("--context", type=int, default=4096, help="context length of the attention FLOPs (4096)")
    stats.add_argument("--kv-dtype", default="bf16", help="KV-cache dtype: bf16 (default), fp16, fp32, fp8")
    stats.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    stats.set_defaults(func=_stats)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run_subcommand)


if __name__ == "__main__":
    raise SystemExit(main())
