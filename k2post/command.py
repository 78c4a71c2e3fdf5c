"""The one shape of a `k2post` command: its parser, and the error wrapper every command runs under.

Every command is `pipelines/<command>.py` with `main(argv: list[str] | None = None) -> int`:

    def main(argv: list[str] | None = None) -> int:
        parser = command_parser("sft", "supervised fine-tuning ...")
        add_config_arguments(parser, "sft", "configs/sft_tool_use.yaml")
        return run_command(parser, argv, handler)      # handler(args) -> exit status

`k2post <command> ...` (k2post/cli.py) and `python -m pipelines.<command> ...` both end in that
`main`, so both print the same errors: a user error (`USER_ERRORS`: ConfigError and the other
ValueErrors — SFT data / run-dir / resume errors, RL run-dir errors, env registry and golden-file
errors —, KeyError, FileNotFoundError, FileExistsError, and `UserError` subclasses such as
SynthError, the recipe's StageError and ServerStartError) is one line
`k2post <command>: error: <message>` on stderr, last, and exit status 2, never a traceback.
A usage error is argparse's own (usage line, then `k2post <command>: error: ...`), also status 2.
A handler validates its flags and config first and imports torch / vLLM / Ray / DeepSpeed after that, so a
mistake is reported in well under a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable


class UserError(Exception):
    """Base of user-facing errors that are not ValueErrors (a failed stage, a server that did not start)."""


USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, FileNotFoundError, FileExistsError, UserError)


def command_parser(command: str, description: str) -> argparse.ArgumentParser:
    """The parser of `k2post <command>` (its prog is also the error prefix)."""
    return argparse.ArgumentParser(prog=f"k2post {command}", description=description)


def add_config_arguments(parser: argparse.ArgumentParser, kind: str, example: str, resume: bool = False) -> None:
    """`CONFIG [key.path=value ...]`: a `kind: <kind>` YAML file and dotted overrides; with `resume`, also
    `--resume RUN_DIR [key.path=value ...]` (the one resume spelling of every command; see `resume_config`)."""
    parser.add_argument(
        "file", nargs="?" if resume else None, metavar="CONFIG", help=f"a `kind: {kind}` YAML config, e.g. {example}"
    )
    parser.add_argument("overrides", nargs="*", default=[], metavar="key.path=value", help="dotted overrides")
    if resume:
        parser.add_argument(
            "--resume",
            metavar="RUN_DIR",
            help="continue the run in RUN_DIR from where it stopped (its config.yaml; positionals are overrides)",
        )


def resume_config(
    file: str | None, overrides: list[str], resume: str | None, kind: str, dir_key: str, fixed: tuple[str, ...] = ()
) -> tuple[str, list[str]]:
    """(config file, overrides) of `CONFIG [overrides]` or `--resume RUN_DIR [overrides]`.

    With --resume the file is RUN_DIR/config.yaml (what the run wrote), every positional is an override, and
    `resume=true`, `<dir_key>=RUN_DIR` and `fixed` come first. A `resume=` override other than `resume=auto`
    (continue when run_dir holds a run, else start fresh) is refused: --resume is the one spelling of `true`."""
    from k2post.config.loader import ConfigError

    given = [*([file] if file is not None and resume is not None else []), *overrides]
    if any(item.split("=", 1)[0].strip() == "resume" and item.split("=", 1)[1:] != ["auto"] for item in given):
        raise ConfigError(
            f"resume=...: continue a {kind} run with `k2post {kind} --resume RUN_DIR` (or `resume=auto`: continue "
            "when run_dir holds a run) instead"
        )
    if resume is None:
        if file is None:
            raise ConfigError("give a CONFIG or --resume RUN_DIR")
        return file, overrides
    config = Path(resume) / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"--resume {resume}: no config.yaml there (not a {kind} run dir)")
    return str(config), ["resume=true", f"{dir_key}={resume}", *fixed, *given]


def error_message(err: BaseException) -> str:
    """The message of an error (a KeyError's without the quotes str() adds)."""
    if isinstance(err, KeyError) and err.args:
        return str(err.args[0])
    return str(err)


def report_error(prog: str, err: BaseException) -> int:
    """Print `<prog>: error: <first line>` as the last stderr line (further lines, e.g. a log tail, above it); 2."""
    first, *details = error_message(err).splitlines() or [""]
    for line in details:
        print(line, file=sys.stderr)
    print(f"{prog}: error: {first.rstrip(':')}", file=sys.stderr, flush=True)
    return 2


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """Parsed arguments, or the exit status argparse chose (2 after a usage error, 0 after --help)."""
    try:
        return parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 2


def run_command(
    parser: argparse.ArgumentParser, argv: list[str] | None, handler: Callable[[argparse.Namespace], int]
) -> int:
    """Parse `argv` (sys.argv[1:] when None) and return `handler(args)`; a user error is one line and status 2."""
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        return handler(args)
    except USER_ERRORS as err:
        return report_error(parser.prog, err)


def check_range(flag: str, value: int, low: int, high: int) -> None:
    """ValueError `<flag> must be in [low, high], got value` (one line, exit 2 under `run_command`) for a count
    outside its bounds: a typo such as `--entities 1000000000` is refused before it runs for hours."""
    if not low <= value <= high:
        raise ValueError(f"{flag} must be in [{low:,}, {high:,}], got {value:,}")
