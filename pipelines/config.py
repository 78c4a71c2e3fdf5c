"""`k2post config show CONFIG [key.path=value ...]`: print the validated config with every default filled in.

    k2post config show configs/demo.yaml sampling.max_tokens=64
    python -m k2post_pipelines.config show configs/demo.yaml

The file's `kind` picks the schema. Exit status 2 (one line `k2post config: error: FILE: field: problem`)
for a config error.
"""

from __future__ import annotations

import argparse

from k2post.command import command_parser, run_command


def _show(args: argparse.Namespace) -> int:
    from k2post.config.loader import dump_yaml
    from k2post.config.registry import load_run_config

    print(dump_yaml(load_run_config(args.file, args.overrides)), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("config", "inspect configs")
    sub = parser.add_subparsers(dest="config_cmd", required=True)
    show = sub.add_parser("show", help="print the validated config with every default filled in")
    show.add_argument("file", metavar="CONFIG", help="a YAML run config (its `kind` picks the schema)")
    show.add_argument("overrides", nargs="*", default=[], metavar="key.path=value", help="dotted overrides")
    show.set_defaults(func=_show)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, lambda args: args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
