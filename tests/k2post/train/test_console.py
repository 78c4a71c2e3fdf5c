"""k2post/train/console.py: where a run's outputs go (a run dir a Ray job would lose is refused) and what the
console shows (k2post's lines and every error) against what only the run's log file holds (library logging,
Python warnings, Ray worker lines)."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import pytest

from k2post.train.console import in_ray_job_dir, on_console, routed_output, run_dir_where

JOB_CWD = "/tmp/ray/session_2026/runtime_resources/working_dir_files/_ray_pkg_abc123"


@pytest.mark.parametrize(
    "run_dir, cwd, expected",
    [
        ("runs/rl", "/home/me/k2post", "/home/me/k2post/runs/rl"),
        ("/data/runs/rl", "/home/me/k2post", "/data/runs/rl"),
        ("/data/runs/rl", JOB_CWD, "/data/runs/rl"),
        ("runs/rl", JOB_CWD, None),  # refused: `ray stop` deletes the job's working dir
        ("./runs/sft", JOB_CWD + "/sub", None),
    ],
)
def test_run_dir_is_absolute_and_a_relative_one_inside_a_ray_job_is_refused(run_dir, cwd, expected):
    if expected is None:
        with pytest.raises(ValueError, match=r"temporary working dir.*pass an absolute path.*run_dir=\$PWD/") as err:
            run_dir_where(run_dir, cwd)
        assert "\n" not in str(err.value)
    else:
        assert run_dir_where(run_dir, cwd) == Path(expected)


@pytest.mark.parametrize("cwd, inside", [(JOB_CWD, True), ("/home/me/k2post", False), ("/runtime_resources", False)])
def test_a_ray_job_working_dir_is_recognised(cwd, inside):
    assert in_ray_job_dir(cwd) is inside


@pytest.mark.parametrize(
    "name, level, shown",
    [
        ("k2post.rl.controller", logging.INFO, True),
        ("pipelines.rl", logging.WARNING, True),
        ("vllm.engine", logging.WARNING, False),
        ("ray", logging.INFO, False),
        ("DeepSpeed", logging.WARNING, False),
        ("py.warnings", logging.WARNING, False),
        ("torch.distributed", logging.ERROR, True),  # every error stays on the console
        ("k2postx", logging.INFO, False),
    ],
)
def test_the_console_keeps_k2posts_lines_and_every_error(name, level, shown):
    assert on_console(name, level) is shown


def test_routed_output_sends_library_lines_and_warnings_to_the_log_file_only(tmp_path, capsys):
    deepspeed_like = logging.getLogger("DeepSpeed")  # DeepSpeed's own logger prints to stdout and does not propagate
    own_handler = logging.StreamHandler(sys.stdout)
    deepspeed_like.addHandler(own_handler)
    deepspeed_like.propagate = False
    try:
        with routed_output(tmp_path / "run" / "run.log") as log_path:
            print("rl: iteration 1/2 reward 0.500")
            logging.getLogger("k2post.rl.controller").info("rl: resuming from checkpoints/iter-1")
            logging.getLogger("vllm.engine").warning("the vllm warning")
            deepspeed_like.warning("the deepspeed warning")
            logging.getLogger("ray").info("Started a local Ray instance.")
            warnings.warn("the python warning", UserWarning)
            logging.getLogger("torch").error("a library error")
    finally:
        deepspeed_like.propagate = True
    console = capsys.readouterr()
    shown = console.out + console.err
    assert "iteration 1/2" in shown and "resuming from checkpoints/iter-1" in shown and "a library error" in shown
    for line in ("the vllm warning", "the deepspeed warning", "Started a local Ray", "the python warning"):
        assert line not in shown
    logged = log_path.read_text()
    for line in ("iteration 1/2", "resuming", "the vllm warning", "the deepspeed warning", "Started a local Ray"):
        assert line in logged
    assert "the python warning" in logged and "a library error" in logged
    assert sys.stdout is not None and logging.getLogger().handlers is not None
    print("after the block")  # routing is undone: the file gets nothing more
    assert "after the block" not in log_path.read_text()
