"""`ray job submit` against the private head of the `ray_head` fixture (tests/pipelines/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def submit(
    address: str, env: dict, job_id: str, *command: str, timeout: float, runtime_env_json: str | None = None
) -> subprocess.CompletedProcess:
    """`ray job submit --working-dir REPO [--runtime-env-json JSON] -- COMMAND` (waits for the job; its output comes
    back in stdout). `runtime_env_json` adds to the working dir, e.g. '{"py_modules": ["/abs/path/my_pkg"]}'."""
    argv = [str(VENV_BIN / "ray"), "job", "submit", "--address", address, "--submission-id", job_id]
    argv += ["--working-dir", str(REPO)]
    if runtime_env_json is not None:
        argv += ["--runtime-env-json", runtime_env_json]
    return subprocess.run(
        [*argv, "--", *command],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_status(address: str, env: dict, job_id: str) -> str:
    """The job's status as the job server reports it (JobSubmissionClient, in a child with the head's env)."""
    code = (
        "import sys; from ray.job_submission import JobSubmissionClient; "
        "print(JobSubmissionClient(sys.argv[1]).get_job_status(sys.argv[2]).value)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, address, job_id], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]
