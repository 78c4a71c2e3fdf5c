"""MuonClip optimizer: Muon (Newton-Schulz, RMS matching, decoupled WD) + AdamW routing + per-head QK-Clip,
single-process and under DeepSpeed ZeRO. See docs/OPTIMIZER.md.

    from k2post.optim import OptimConfig, build_muonclip
    optimizer, qk_clip = build_muonclip(model, OptimConfig(lr=2e-4))
"""

from k2post.optim.config import OptimConfig, QKClipConfig
from k2post.optim.muon import MuonClip, build_optimizer
from k2post.optim.muonclip import build_muonclip
from k2post.optim.param_groups import ParamSpecError, build_param_groups, describe_routing
from k2post.optim.qk_clip import MaxLogitRecorder, QKClip, QKClipStats, apply_qk_clip, plan_qk_clip

__all__ = [
    "MaxLogitRecorder",
    "MuonClip",
    "OptimConfig",
    "ParamSpecError",
    "QKClip",
    "QKClipConfig",
    "QKClipStats",
    "apply_qk_clip",
    "build_muonclip",
    "build_optimizer",
    "build_param_groups",
    "describe_routing",
    "plan_qk_clip",
]
