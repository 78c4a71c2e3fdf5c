"""The install path: the engines import, the packages that break CPU torch are gone, and k2post's own packages
install under import names that cannot collide with a user's folders (`k2post_environments`, ...)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "module", ["vllm", "ray", "deepspeed", "transformers", "torch", "math_verify", "reasoning_gym"]
)
def test_engine_imports(module):
    importlib.import_module(module)


@pytest.mark.parametrize("module", ["torchvision", "torchaudio", "torchcodec"])
def test_breaking_packages_removed(module):
    assert importlib.util.find_spec(module) is None, f"{module} is installed: `make test` should uninstall it"


def test_torch_is_the_pinned_build():
    import torch

    assert torch.__version__.startswith("2.13.0")


# ---------------------------------------------------------------- import names and packaging

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {  # fixed top-level folder -> its import name (pyproject [tool.setuptools.package-dir])
    "k2post": "k2post",
    "environments": "k2post_environments",
    "rubrics": "k2post_rubrics",
    "checkpoint_engine": "k2post_checkpoint_engine",
    "pipelines": "k2post_pipelines",
}
OLD_IMPORT = re.compile(r"^\s*(from|import) (environments|rubrics|checkpoint_engine|pipelines)\b", re.M)


def _source_packages() -> set[str]:
    """Import names of every folder that holds Python modules."""
    names = set()
    for folder, name in FOLDERS.items():
        for init in (REPO / folder).rglob("*.py"):
            rel = init.parent.relative_to(REPO / folder)
            if "__pycache__" not in rel.parts:
                names.add(".".join([name, *rel.parts]))
    return names


def test_every_package_folder_is_listed_and_mapped_in_pyproject():
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setuptools_cfg["packages"]) == _source_packages()
    assert setuptools_cfg["package-dir"] == {name: folder for folder, name in FOLDERS.items() if folder != name}
    folder_of = {name: folder for folder, name in FOLDERS.items()}
    for name in _source_packages():  # a folder of modules without __init__.py is left out of a wheel
        top, *rest = name.split(".")
        assert (REPO / folder_of[top] / "/".join(rest) / "__init__.py").exists(), f"{name} has no __init__.py"


def test_no_module_imports_the_folders_by_their_old_names():
    offenders = [
        str(path.relative_to(REPO))
        for top in (*FOLDERS, "tests", "benchmarks")
        for path in (REPO / top).rglob("*.py")
        if OLD_IMPORT.search(path.read_text())
    ]
    assert offenders == []


def test_a_users_own_environments_and_checkpoint_engine_folders_do_not_shadow_k2post(tmp_path):
    for folder in ("environments", "checkpoint_engine", "rubrics", "pipelines"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("MINE = True\n")
    code = (
        "import environments, checkpoint_engine; assert environments.MINE and checkpoint_engine.MINE\n"
        "from k2post.envs.registry import make_environment\n"
        "task = next(iter(make_environment('math', {'difficulty': 1}).tasks('train', seed=0, n=1)))\n"
        "from k2post_checkpoint_engine import WeightSender\n"
        "print('ok', task.env)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok math", done.stderr[-2000:]


@pytest.mark.slow
def test_the_wheel_holds_every_package_and_the_gym_data(tmp_path):
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ and a stale egg-info there
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        str(src),
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp_path),
    ]
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    wheel = zipfile.ZipFile(next(tmp_path.glob("k2post-*.whl")))
    names = wheel.namelist()
    packages = {"/".join(n.split("/")[:-1]).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages == _source_packages()
    assert any(n.startswith("k2post_environments/data/") and n.endswith(".jsonl") for n in names)
    assert any(n.startswith("k2post_environments/golden/") for n in names)
    assert any(n.startswith("k2post_rubrics/data/") for n in names)
    entry_points = wheel.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "math = k2post_environments.math_env:MathEnv" in entry_points
