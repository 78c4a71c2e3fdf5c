"""Newton-Schulz orthogonalization, the core of Muon.

`orthogonalize(M)` maps a matrix M = U S V^T to roughly U S' V^T with S' ~ 1: the "zeroth
power" of M that Muon uses as its update direction. It runs the quintic iteration

    X0 = M / (||M||_F + eps)                       (so every singular value is <= 1)
    A  = X X^T
    X <- a X + (b A + c A^2) X                     (a, b, c) = NS_COEFFS

in bf16 on the wide orientation (a tall [n, m] matrix is transposed so A is the smaller
[min, min] Gram matrix). Leading dims are a batch: a fused 3-D expert weight [E, n, m] is E
matrices, each normalized and orthogonalized on its own.

Numerics follow torch.optim.Muon (2.13): cast to bf16 first, norm in bf16, `X @ X^T`, then
two fused multiply-adds (`addmm`/`baddbmm`); MuonClip's updates equal torch's bit for bit in
our tests. torch divides by `norm.clamp(min=eps)`, we by `norm + eps` (K2's formula): in bf16
the two are the same number unless ||M||_F < ~1e-5, and both map a zero matrix to zero. The
coefficients overshoot on purpose, so 5 steps leave singular values spread around 1 (about 0.7-1.2
for random matrices) instead of exactly 1.

Run its tests with `python -m pytest tests/k2post/optim/test_muon.py -q`.
"""

from __future__ import annotations

import torch
from torch import Tensor

NS_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def ns_compute_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The dtype NS runs in: `setting` (`OptimConfig.ns_dtype`), "auto" = bf16 on an accelerator, fp32 on CPU.

    CPUs without native bf16 matmul (AVX2-only x86) run bf16 GEMMs ~20x slower than fp32, and fp32 gives the
    same update on every CPU; torch.optim.Muon's numbers are `ns_dtype: bfloat16`.
    """
    if setting == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return NS_DTYPES[setting]


def _ns_iteration(X: Tensor, a: float, b: float, c: float) -> Tensor:
    """One quintic Newton-Schulz step on a wide X [..., n, m] (n <= m)."""
    if X.ndim == 2:
        gram = X @ X.mT  # [n, n]
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b*A + c*A@A
        return torch.addmm(X, poly, X, beta=a)  # a*X + poly@X, [n, m]
    gram = X @ X.mT  # [B, n, n]
    poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
    return torch.baddbmm(X, poly, X, beta=a)  # [B, n, m]


def _flatten_batch(M: Tensor) -> Tensor:
    """[..., n, m] -> [B, n, m] for >3-D inputs; 2-D and 3-D are returned as they are."""
    return M if M.ndim <= 3 else M.reshape(-1, *M.shape[-2:])


def newton_schulz_wide(
    X: Tensor,
    steps: int = 5,
    eps: float = 1e-7,
    coeffs: tuple[float, float, float] = NS_COEFFS,
) -> Tensor:
    """The NS iteration on X [n, m] or [B, n, m] that is already in the compute dtype and wide (n <= m).

    Each matrix is normalized by its own Frobenius norm. Returns a new tensor of X's dtype; X is
    not modified. Callers that batch many matrices build X in this layout directly
    (one fused copy+cast+transpose) and call this instead of `orthogonalize`.
    """
    a, b, c = coeffs
    norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)  # [(B,) 1, 1], X's dtype
    X = X / (norm + eps)  # a new tensor: the caller's storage is never touched
    for _ in range(steps):
        X = _ns_iteration(X, a, b, c)
    return X


def orthogonalize(
    M: Tensor,
    steps: int = 5,
    eps: float = 1e-7,
    coeffs: tuple[float, float, float] = NS_COEFFS,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Approximate U V^T of each matrix in M [..., n, m] with `steps` Newton-Schulz steps in `dtype`.

    Returns a new tensor of M's shape and dtype; M is not modified.
    """
    if M.ndim < 2:
        raise ValueError(f"orthogonalize needs a matrix or a batch of matrices, got shape {tuple(M.shape)}")
    X = _flatten_batch(M).to(dtype)  # [(B,) n, m]
    tall = M.size(-2) > M.size(-1)
    if tall:
        # [(B,) m, n]: the wide orientation, A = X X^T is [m, m]. A 2-D view is fine (BLAS
        # reads it transposed, as torch.optim.Muon does); batched matmuls run faster on a
        # contiguous copy.
        X = X.mT if X.ndim == 2 else X.mT.contiguous()
    X = newton_schulz_wide(X, steps, eps, coeffs)
    if tall:
        X = X.mT
    return X.reshape(M.shape).to(M.dtype)
