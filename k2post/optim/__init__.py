"""MuonClip optimizer: Muon (Newton-Schulz, RMS matching, decoupled WD) + AdamW routing + per-head QK-Clip,
single-process and under DeepSpeed ZeRO. See docs/OPTIMIZER.md.

    from k2post.optim import OptimConfig, build_muonclip
    optimizer, qk_clip = build_muonclip(model, OptimConfig(lr=2e-4))

The names below load on first use (PEP 562): importing `k2post.optim.config` (what run configs do) does
not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "OptimConfig": "config",
    "QKClipConfig": "config",
    "MuonClip": "muon",
    "build_optimizer": "muon",
    "build_muonclip": "muonclip",
    "ParamSpecError": "param_groups",
    "build_param_groups": "param_groups",
    "describe_routing": "param_groups",
    "MaxLogitRecorder": "qk_clip",
    "QKClip": "qk_clip",
    "QKClipStats": "qk_clip",
    "apply_qk_clip": "qk_clip",
    "plan_qk_clip": "qk_clip",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
