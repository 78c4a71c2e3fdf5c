"""MuonClip in one call: the Muon/AdamW optimizer with QK-Clip run after every step.

    optimizer, qk_clip = build_muonclip(model, OptimConfig())
    loss.backward(); optimizer.step()        # QK-Clip runs inside a step post-hook
    metrics = optimizer.last_qk_clip_stats.to_metrics()

Single process. Under DeepSpeed ZeRO use `k2post.optim.deepspeed_muon.deepspeed_initialize`
and `apply_qk_clip_zero` instead (docs/DEEPSPEED.md).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from k2post.optim.config import OptimConfig
from k2post.optim.muon import MuonClip, build_optimizer
from k2post.optim.qk_clip import QKClip, QKClipStats


def build_muonclip(model: nn.Module, cfg: OptimConfig) -> tuple[MuonClip, QKClip]:
    """Build the optimizer and attach QK-Clip (per `cfg.qk_clip`) as a post-step hook.

    After each `optimizer.step()` the stats of that step's clip are in
    `optimizer.last_qk_clip_stats`. Call `qk_clip.close()` to restore plain attention.
    """
    optimizer = build_optimizer(model, cfg)
    qk_clip = QKClip(model, cfg.qk_clip)
    optimizer.last_qk_clip_stats = QKClipStats(tau=cfg.qk_clip.logit_threshold)

    def _clip_after_step(opt: MuonClip, args: Any, kwargs: Any) -> None:
        opt.last_qk_clip_stats = qk_clip.after_step()

    optimizer.register_step_post_hook(_clip_after_step)
    return optimizer, qk_clip
