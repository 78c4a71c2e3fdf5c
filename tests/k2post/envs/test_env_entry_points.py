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
    """The example package pip-installed (no build isolation, no index: it needs nothing) into a --target dir."""
    src = tmp_path_factory.mktemp("src") / "example_env_pkg"
    shutil.copytree(EXAMPLE_PKG, src)  # build in a copy: no build/ or egg-info in the repo
    target = tmp_path_factory.mktemp("site")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
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
    proc = _k2post("envs", "test", "echo_upper", "--golden", str(golden), "--no-hacks", *extra, path=[installed])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") == 5 and "OK: 5 cases in 1 environment(s), 5 passed, 0 failed" in proc.stdout


def test_own_golden_path_is_found_without_flag(installed):
    proc = _k2post("envs", "test", "echo_upper", path=[installed])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "k2post_example_env/golden/echo_upper.jsonl" in proc.stdout.replace("\n", "")
    assert "echo_upper  adversarial suite (test, 3 tasks): PASS" in proc.stdout  # its honest() and hacks()


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


def _disabled_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "environment plugin disabled" in line]


def test_duplicate_entry_point_name_disables_the_second_with_one_warning(installed, tmp_path):
    dupe = _fake_dist(tmp_path / "dupe", "dupe-pkg", "echo_upper")
    proc = _k2post("envs", "list", path=[installed, dupe])
    assert proc.returncode == 0 and "echo_upper" in proc.stdout, proc.stderr
    (warning,) = _disabled_lines(proc.stderr)
    assert warning.startswith("k2post: warning: environment plugin disabled: entry point 'echo_upper' (")
    assert "environment name 'echo_upper' is already registered by " in warning


def test_entry_point_clashing_with_a_builtin_is_disabled_and_the_builtin_kept(tmp_path):
    from k2post.envs import registered_environments

    builtin = next(n for n, c in registered_environments().items() if c.__module__.startswith("k2post_environments."))
    dupe = _fake_dist(tmp_path / "dupe", "clash-pkg", builtin)
    proc = _k2post("envs", "test", builtin, "--no-hacks", path=[dupe])
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the built-in's golden cases pass
    (warning,) = _disabled_lines(proc.stderr)
    assert (
        f"entry point {builtin!r} (dupe_env:Clone, from clash-pkg): environment name {builtin!r} "
        "is already registered by k2post_environments." in warning
    )


def test_a_broken_plugin_disables_itself_and_blocks_nothing(tmp_path):
    broken = _fake_dist(tmp_path / "broken", "broken-pkg", "broken_env")
    (broken / "dupe_env.py").write_text("raise ImportError('needs a library that is not installed')\n")
    proc = _k2post("envs", "test", "math", "--no-hacks", path=[broken])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (warning,) = _disabled_lines(proc.stderr)
    assert "entry point 'broken_env' (dupe_env:Clone, from broken-pkg) failed to load: ImportError: needs a" in warning
    proc = _k2post("envs", "test", "broken_env", path=[broken])
    assert proc.returncode == 2 and "environment 'broken_env' is disabled: entry point 'broken_env'" in proc.stderr


def test_the_example_installs_with_plain_pip_in_a_fresh_venv_next_to_k2post(tmp_path):
    """A fresh venv (k2post importable through a .pth, as if installed there) takes the example's wheel with a
    plain `pip install` (dependencies resolved, none missing), and `k2post envs list` there shows it."""
    import site

    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE_PKG, src)
    assert subprocess.run([*build, str(src)], capture_output=True, timeout=300).returncode == 0
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site_dir = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    host = "".join(f"import site; site.addsitedir({path!r})\n" for path in site.getsitepackages())
    (site_dir / "k2post_host.pth").write_text(host)  # k2post's site dir (its .pth files too) as if installed here
    wheel = next(wheels.glob("k2post_example_env-*.whl"))
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [python, "-m", "k2post.cli", "envs", "list"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0 and "echo_upper" in done.stdout and "k2post-example-env" in done.stdout, done.stderr
