"""The L2 norm of ``q`` and ``k`` in one launch, as new tensors: notebook 06's contest-layout
inputs (:func:`kernels.experiments.in_the_model.contest_inputs`: ``gdn_prefill`` and
``gdn_decode`` take normalised ``q``, ``k``) and its timing of such a pass.

Per row ``x`` (one token's head, ``D`` values), in float32, rounded back to the input's
dtype::

    y = x / sqrt(sum(x^2) + eps)          # eps = 1e-6, as FLA's l2norm

That is FLA's ``l2norm_fwd`` (``fla/modules/l2norm.py``); ``torch.nn.functional.normalize``
divides by ``max(||x||, eps)`` instead, the same up to rounding for every row whose norm is
not tiny. One program normalises the same ``BR`` rows of ``q`` and of ``k``: each tensor is
read once and written once, in one launch (the torch form takes several elementwise
launches, each reading and writing a full f32 or bf16 tensor).

The FLA drop-in (:mod:`kernels.model.fla_compat`, ``use_qk_l2norm_in_kernel``) does not
use it: every kernel normalises in place (the chunked prefill with row factors,
:func:`kernels.prefill.pipeline.fused_launches` ``qk_norm``; the decode and
token-recurrent kernels ``QK_NORM``).
"""
from __future__ import annotations

from typing import Tuple

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["EPS", "qk_l2norm", "qk_l2norm_kernel"]

#: FLA's ``l2norm`` epsilon (inside the square root).
EPS = 1e-6
#: Elements one program handles per tensor (``BR * D``).
_TILE = 4096


@triton.jit
def _norm_rows(x, y, rows, R, eps, D: tl.constexpr):
    """``y[rows] = x[rows] / sqrt(sum(x[rows]^2) + eps)``, f32 inside."""
    cols = tl.arange(0, D)
    off = rows.to(tl.int64)[:, None] * D + cols[None, :]
    m = (rows < R)[:, None]
    b = tl.load(x + off, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(b * b, axis=1) + eps)
    tl.store(y + off, (b * r[:, None]).to(y.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["R"])
def qk_l2norm_kernel(q, k, qo, ko, R, eps, D: tl.constexpr, BR: tl.constexpr):
    """Rows ``[pid * BR, (pid + 1) * BR)`` of ``q`` and ``k`` (``[R, D]``, contiguous)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    _norm_rows(q, qo, rows, R, eps, D)
    _norm_rows(k, ko, rows, R, eps, D)


def qk_l2norm(q: torch.Tensor, k: torch.Tensor, eps: float = EPS
              ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(q, k)`` L2-normalised over the last axis (see the module docstring), new
    tensors of the inputs' dtype and shape, in one kernel launch.

    ``q`` and ``k``: the same shape, contiguous, last axis a power of two (the head size).
    Raises ValueError naming the argument otherwise.
    """
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    for name, x in (("q", q), ("k", k)):
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    D = q.shape[-1]
    if D < 1 or D & (D - 1):
        raise ValueError(f"q's last axis must be a power of two, got {D}")
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    R = q.numel() // D
    if R:
        BR = max(1, min(triton.next_power_of_2(R), _TILE // D))
        qk_l2norm_kernel[(triton.cdiv(R, BR),)](q, k, qo, ko, R, float(eps), D=D, BR=BR,
                                                num_warps=4)
    return qo, ko
