"""The install path: the engines import, and the packages that break CPU torch are gone."""

from __future__ import annotations

import importlib
import importlib.util

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
