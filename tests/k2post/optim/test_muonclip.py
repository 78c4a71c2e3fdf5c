"""build_muonclip: Muon step + QK-Clip after every step, on tiny-qwen2."""

from __future__ import annotations

import pytest
import torch

from k2post.optim.config import OptimConfig, QKClipConfig
from k2post.optim.muonclip import build_muonclip
from k2post.optim.qk_clip import MaxLogitRecorder


def _tiny_qwen2():
    from k2post.models.init import build_flavor_config, build_model
    from k2post.models.tokenizer import build_tokenizer

    tok = build_tokenizer(vocab_size=512)
    return build_model(build_flavor_config("tiny-qwen2", tok), seed=0, num_real_tokens=len(tok))


def _max_logit(model, batch) -> float:
    with MaxLogitRecorder() as recorder:
        recorder.attach(model)
        with torch.no_grad():
            model(input_ids=batch)
        return max(float(v.max()) for v in recorder.per_head().values())


@pytest.mark.parametrize("enabled", [True, False])
def test_step_then_clip(enabled):
    model = _tiny_qwen2()
    batch = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    tau = 0.5 * _max_logit(model, batch)  # low enough that some heads clip
    cfg = OptimConfig(lr=1e-3, qk_clip=QKClipConfig(enabled=enabled, logit_threshold=tau))
    optimizer, qk_clip = build_muonclip(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    stats = optimizer.last_qk_clip_stats
    qk_clip.close()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if p.grad is not None)
    if enabled:
        assert stats.num_clipped > 0 and 0 < stats.frac_clipped <= 1
        assert stats.to_metrics()["qk_clip/max_logit"] > tau
    else:
        assert stats.num_clipped == 0 and stats.to_metrics().get("qk_clip/frac_clipped", 0.0) == 0.0
