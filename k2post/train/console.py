"""Where a run's output goes: the run dir (refusing one a Ray job would lose) and the run's log file.

    where = run_dir_where(cfg.run_dir, os.getcwd())          # absolute; a relative one inside a Ray job: refused
    with routed_output(where / LOG_NAME) as log_path:          # console: k2post's own lines; the rest: log_path
        ...

The console keeps k2post's own progress and errors. Everything else — Python logging of vLLM, Ray, DeepSpeed,
torch and the other libraries, Python warnings, and the stdout/stderr of Ray's worker processes — goes to
run_dir/run.log, which also gets a copy of every console line. A relative run_dir under `ray job submit` would
land in Ray's temporary working dir, which `ray stop` deletes while the job reports SUCCEEDED: it is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import IO, Any, Iterator

LOG_NAME = "run.log"
RAY_JOB_DIR_MARKER = "runtime_resources/working_dir_files"  # Ray unpacks a job's --working-dir under this
OWN_LOGGERS = ("k2post", "pipelines", "k2post_pipelines", "checkpoint_engine", "environments", "rubrics", "__main__")
LIBRARY_LOGGERS = (
    "vllm",
    "ray",
    "DeepSpeed",
    "deepspeed",
    "torch",
    "transformers",
    "datasets",
    "peft",
    "accelerate",
    "httpx",
    "urllib3",
    "filelock",
)
_ROUTED: list[IO[str]] = []  # the log stream of the routing now active in this process (at most one)


def in_ray_job_dir(cwd: str) -> bool:
    """Whether `cwd` is a Ray job's unpacked --working-dir (deleted with the Ray session)."""
    return RAY_JOB_DIR_MARKER in Path(cwd).as_posix()


def run_dir_where(run_dir: str, cwd: str, field: str = "run_dir") -> Path:
    """The absolute run dir; a relative one inside a Ray job's working dir is refused with one line."""
    path = Path(run_dir)
    if path.is_absolute():
        return path
    if in_ray_job_dir(cwd):
        raise ValueError(
            f"{field}={run_dir!r} is relative to this Ray job's temporary working dir, which `ray stop` deletes: "
            f"pass an absolute path, e.g. `{field}=$PWD/{run_dir}` after the config"
        )
    return Path(cwd) / path


def on_console(name: str, level: int) -> bool:
    """Whether a log record of logger `name` at `level` is shown on the console (else only in the log file)."""
    return level >= logging.ERROR or name.split(".")[0] in OWN_LOGGERS


class _ConsoleFormatter(logging.Formatter):
    """k2post's info lines as they are; warnings and errors with their level and logger."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        return text if record.levelno < logging.WARNING else f"{record.levelname} {record.name}: {text}"


class _Tee:
    """A text stream writing to the console and to the log file."""

    def __init__(self, console: IO[str], log: IO[str]) -> None:
        self.console, self.log = console, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.console.write(text)

    def flush(self) -> None:
        self.log.flush()
        self.console.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


def claim_library_loggers() -> None:
    """Make the libraries' loggers (DeepSpeed and Ray add their own stdout handlers) propagate to the root's."""
    if not _ROUTED:
        return
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def _worker_lines(data: dict[str, Any]) -> None:
    """One batch of a Ray worker's stdout/stderr lines into the log file, prefixed like Ray's console lines (to
    the console, as Ray prints them, once no routing is active)."""
    if not _ROUTED:
        from ray._private.worker import print_to_stdstream

        print_to_stdstream(data, ignore_prefix=False)
        return
    who = data.get("actor_name") or data.get("task_name") or "worker"
    for line in data.get("lines", []):
        _ROUTED[-1].write(f"({who} pid={data.get('pid')}) {line}\n")


def send_ray_output_to_log() -> bool:
    """After `ray.init(log_to_driver=True)`: Ray workers' stdout/stderr lines go to the log file, not the console.
    Ray has no public switch for this (its dispatcher is private); False (Ray prints them) when it moved."""
    if not _ROUTED:
        return False
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", _worker_lines)
    return True


def _root_handlers(stream: IO[str], rank: int) -> list[logging.Handler]:
    """Everything at INFO and above to the file; k2post's lines and every error to the console (rank 0)."""
    to_file = logging.StreamHandler(stream)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_console = logging.StreamHandler(sys.stderr)
    to_console.setFormatter(_ConsoleFormatter())
    to_console.addFilter(lambda r: on_console(r.name, r.levelno) and (rank == 0 or r.levelno >= logging.ERROR))
    return [to_file, to_console]


@contextlib.contextmanager
def routed_output(log_path: Path, rank: int = 0) -> Iterator[Path]:
    """Route this process's output as the module docstring says while the block runs; restored after."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    root, stdout = logging.getLogger(), sys.stdout
    saved = (root.level, list(root.handlers))
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM (here and in embedded Ray's workers) adds no handler
    with open(log_path, "a", buffering=1, encoding="utf-8") as stream:
        _ROUTED.append(stream)
        root.handlers, sys.stdout = _root_handlers(stream, rank), _Tee(stdout, stream)
        root.setLevel(logging.INFO)
        claim_library_loggers()
        logging.captureWarnings(True)
        try:
            yield log_path
        finally:
            logging.captureWarnings(False)
            sys.stdout = stdout
            root.setLevel(saved[0])
            root.handlers = saved[1]
            _ROUTED.pop()
