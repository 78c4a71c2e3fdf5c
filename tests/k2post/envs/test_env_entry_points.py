"""Third-party environments via the `k2post.environments` entry point (the example package)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_PKG = ROOT / "tests" / "fixtures" / "example_env_pkg"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example package pip-installed (no deps, no build isolation) into a --target dir."""
    src = tmp_path_factory.mktemp("src") / "example_env_pkg"
    shutil.copytree(EXAMPLE_PKG, src)  # build in a copy: no build/ or egg-info in the repo
    target = tmp_path_factory.mktemp("site")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "--target",
        str(target),
        str(src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return target


def _k2post(*args: str, path: list[Path]) -> subprocess.CompletedProcess:
    """Run `k2post ARGS` from the repo root with PYTHONPATH = path (where the packages are)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "k2post.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )


def test_list_shows_the_entry_point_env(installed):
    proc = _k2post("envs", "list", path=[installed])
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "echo_upper" in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells == ["echo_upper", "toy", "single", "[0, 1]", "0", "entry point (k2post-example-env)"]


@pytest.mark.parametrize("extra", [[], ["--isolated"]])
def test_golden_of_the_entry_point_env_passes(installed, extra):
    golden = installed / "k2post_example_env" / "golden" / "echo_upper.jsonl"
    proc = _k2post("envs", "test", "echo_upper", "--golden", str(golden), *extra, path=[installed])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") == 5 and "OK: 5 cases in 1 environment(s), 5 passed, 0 failed" in proc.stdout


def test_own_golden_path_is_found_without_flag(installed):
    proc = _k2post("envs", "test", "echo_upper", path=[installed])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "k2post_example_env/golden/echo_upper.jsonl" in proc.stdout.replace("\n", "")


def _fake_dist(root: Path, dist: str, ep_name: str) -> Path:
    """A minimal installed distribution whose entry point `ep_name` is another class of that name."""
    root.mkdir()
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[k2post.environments]\n{ep_name} = dupe_env:Clone\n")
    (root / "dupe_env.py").write_text(
        "from k2post.envs import Environment\n\n"
        f"class Clone(Environment):\n    name = {ep_name!r}\n    task_type = 'toy'\n"
        "    def tasks(self, split='train', seed=0, n=None):\n        return iter(())\n"
        "    def score(self, task, response):\n        raise NotImplementedError\n"
    )
    return root


def test_duplicate_entry_point_name_is_a_clear_error(installed, tmp_path):
    dupe = _fake_dist(tmp_path / "dupe", "dupe-pkg", "echo_upper")
    proc = _k2post("envs", "list", path=[installed, dupe])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("k2post envs: error: entry point 'echo_upper' (")
    assert "environment name 'echo_upper' is already registered by " in proc.stderr
    assert "dupe-pkg" in proc.stderr or "k2post-example-env" in proc.stderr


def test_entry_point_clashing_with_a_builtin_is_a_clear_error(tmp_path):
    from k2post.envs import registered_environments

    builtin = next(n for n, c in registered_environments().items() if c.__module__.startswith("k2post_environments."))
    dupe = _fake_dist(tmp_path / "dupe", "clash-pkg", builtin)
    proc = _k2post("envs", "list", path=[dupe])
    assert proc.returncode == 2, proc.stdout
    assert (
        f"entry point {builtin!r} (dupe_env:Clone, from clash-pkg): environment name {builtin!r} "
        "is already registered by k2post_environments." in proc.stderr
    )
