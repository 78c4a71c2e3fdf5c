"""Every YAML in configs/ parses into its run config."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2post.config.registry import load_run_config

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
ALL_YAML = sorted(CONFIG_DIR.glob("**/*.yaml"))


def test_configs_exist():
    assert ALL_YAML, f"no YAML found in {CONFIG_DIR}"


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: p.name)
def test_every_config_loads(path):
    cfg = load_run_config(path)
    assert cfg.kind == path.stem.split("_")[0], "name configs <kind>_<name>.yaml (or <kind>.yaml)"
