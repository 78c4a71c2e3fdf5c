"""Shared test setup: offline HF, GPU-test skipping, a session-wide tiny model directory."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (marker `gpu`)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    """A tiny-qwen2 model + tokenizer built once per test session with `init_model_dir`."""
    from k2post.models.init import init_model_dir

    return init_model_dir("tiny-qwen2", tmp_path_factory.mktemp("models") / "tiny-qwen2", seed=0)


@pytest.fixture(scope="session")
def tiny_k2_dir(tmp_path_factory):
    """A tiny-k2 (DeepSeek-V3 architecture) model + tokenizer built once per test session."""
    from k2post.models.init import init_model_dir

    return init_model_dir("tiny-k2", tmp_path_factory.mktemp("models") / "tiny-k2", seed=0)


_LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _launcher_env_is_restored():
    """A test that runs a trainer rank in-process must not leave MASTER_PORT & co. behind: a later
    subprocess would inherit a port this process still listens on (EADDRINUSE). Fails that test."""
    before = {key: os.environ.get(key) for key in _LAUNCHER_KEYS}
    yield
    after = {key: os.environ.get(key) for key in _LAUNCHER_KEYS}
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    assert after == before, f"launcher variables leaked by this test: {after} (before: {before})"
