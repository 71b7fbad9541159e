"""Stage 1: gates. Log-decay ``g``, ``beta`` and the per-chunk cumulative sum of ``g``.

Per token ``t`` and value head ``h`` (float32)::

    g_t    = -exp(A_log[h]) * softplus(a_t[h] + dt_bias[h])     # log of the decay, <= 0
    beta_t = sigmoid(b_t[h])
    gc_t   = sum of g over the tokens of t's chunk up to and including t

The cumulative sum restarts at every chunk of ``BT = 64`` tokens, so every
exponential the later stages take (``exp(gc_i - gc_j)`` with ``j <= i``,
``exp(gc_i)``, ``exp(gc_last - gc_i)``) has a non-positive argument.

Two shapes of this stage:

* :func:`gates_torch` + :func:`chunk_cumsum` (``unfused``): the gates as
  separate PyTorch elementwise ops (8 launches), then a cumsum kernel;
* :func:`chunk_gates` with ``raw=True`` (``fused_gates``, ``no_sync``): one
  kernel from the raw ``a``, ``b``, ``A_log``, ``dt_bias``.

The ``fused`` variant does not launch this stage: the intra-chunk kernel
calls :func:`log_decay` / :func:`softplus` itself.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .. import interpret

interpret.install()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import BT, chunk_of_program, num_slots, prepare_chunk_indices  # noqa: E402

__all__ = ["softplus", "log_decay", "chunk_gates_kernel", "chunk_gates_fwd", "chunk_gates",
           "chunk_cumsum", "gates_torch"]


@triton.jit
def softplus(x):
    """``log(1 + exp(x))`` without overflow: ``max(x, 0) + log(1 + exp(-|x|))``."""
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def log_decay(b_a, b_A_log, b_dt_bias):
    """``g = -exp(A_log) * softplus(a + dt_bias)`` in float32 (broadcasting)."""
    return -tl.exp(b_A_log) * softplus(b_a.to(tl.float32) + b_dt_bias)


@triton.jit(do_not_specialize=["T", "N"])
def chunk_gates_kernel(
    a,              # [T, H] bf16 raw decay input (RAW) -- or g [T, H] f32 log decay (not RAW)
    b,              # [T, H] bf16 raw beta input (RAW only)
    A_log,          # [H] f32 (RAW only)
    dt_bias,        # [H] f32 (RAW only)
    gc,             # [T, H] f32 out: per-chunk cumulative log decay
    beta,           # [T, H] f32 out: sigmoid(b) (RAW only)
    cu_seqlens,     # [N+1] int32/int64
    chunk_indices,  # [NC, 2] int32 (USE_INDICES) or None
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,            # value heads
    BH: tl.constexpr,           # next power of two >= H
    BT: tl.constexpr,           # chunk size
    RAW: tl.constexpr,          # compute g and beta from raw inputs
    USE_INDICES: tl.constexpr,  # chunk from the host table (else device lookup)
):
    i_p = tl.program_id(0)
    i_n, i_c, bos, eos = chunk_of_program(i_p, cu_seqlens, chunk_indices, N, T, BT, USE_INDICES)
    if i_c * BT >= eos - bos:
        return
    o_t = bos + i_c * BT + tl.arange(0, BT)
    o_h = tl.arange(0, BH)
    m_t = o_t < eos
    m_h = o_h < H
    m = m_t[:, None] & m_h[None, :]
    o_th = o_t[:, None] * H + o_h[None, :]
    if RAW:
        b_A_log = tl.load(A_log + o_h, mask=m_h, other=0.0)
        b_dt = tl.load(dt_bias + o_h, mask=m_h, other=0.0)
        b_a = tl.load(a + o_th, mask=m, other=0.0)
        b_g = tl.where(m, log_decay(b_a, b_A_log[None, :], b_dt[None, :]), 0.0)
        b_b = tl.load(b + o_th, mask=m, other=0.0).to(tl.float32)
        tl.store(beta + o_th, tl.sigmoid(b_b), mask=m)
    else:
        b_g = tl.load(a + o_th, mask=m, other=0.0).to(tl.float32)
    tl.store(gc + o_th, tl.cumsum(b_g, axis=0), mask=m)


def chunk_gates_fwd(cu_seqlens: torch.Tensor, *, a=None, b=None, A_log=None, dt_bias=None,
                    g=None, beta=None, chunk_indices: Optional[torch.Tensor] = None
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Launch :func:`chunk_gates_kernel` once. Raw mode when ``g`` is None.

    Returns ``(gc [T, H] f32, beta [T, H] f32)``; in cumsum-only mode ``beta``
    is passed through.
    """
    raw = g is None
    src = a if raw else g
    T, H = src.shape
    N = cu_seqlens.numel() - 1
    gc = torch.empty(T, H, dtype=torch.float32, device=src.device)
    if raw:
        beta = torch.empty_like(gc)
    use_indices = chunk_indices is not None
    grid = (chunk_indices.shape[0] if use_indices else num_slots(T, N),)
    if grid[0] > 0:
        chunk_gates_kernel[grid](
            src, b, A_log, dt_bias, gc, beta, cu_seqlens, chunk_indices, T, N,
            H=H, BH=triton.next_power_of_2(H), BT=BT, RAW=raw, USE_INDICES=use_indices,
            num_warps=1,
        )
    return gc, beta


def chunk_gates(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
                cu_seqlens: torch.Tensor, *, use_indices: bool = False
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gates and per-chunk cumulative log decay from the raw inputs, one kernel.

    Args:
        A_log: `[HV]` f32.
        a: `[T, HV]` bf16 raw decay input.
        dt_bias: `[HV]` f32.
        b: `[T, HV]` bf16 raw beta input.
        cu_seqlens: `[N+1]` int32/int64 sequence boundaries.
        use_indices: build the chunk table on the host (syncs) instead of the
            device lookup.
    Returns:
        ``(gc [T, HV] f32, beta [T, HV] f32)``.
    """
    idx = prepare_chunk_indices(cu_seqlens) if use_indices else None
    return chunk_gates_fwd(cu_seqlens, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                           chunk_indices=idx)


def chunk_cumsum(g: torch.Tensor, cu_seqlens: torch.Tensor, *,
                 chunk_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-chunk inclusive cumulative sum of ``g``, one kernel.

    Args:
        g: `[T, HV]` f32 log decay.
        cu_seqlens: `[N+1]` int32/int64.
        chunk_indices: optional `[NC, 2]` host-built table (else device lookup).
    Returns:
        `[T, HV]` f32.
    """
    gc, _ = chunk_gates_fwd(cu_seqlens, g=g, beta=None, chunk_indices=chunk_indices)
    return gc


def gates_torch(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor,
                b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gates as separate PyTorch ops (the seed's shape: 8 elementwise launches).

    Args:
        A_log: `[HV]` f32.  a, b: `[T, HV]` bf16.  dt_bias: `[HV]` f32.
    Returns:
        ``(g [T, HV] f32 log decay, beta [T, HV] f32)``.
    """
    x = a.float()                    # 1
    x = x + dt_bias                  # 2
    x = F.softplus(x)                # 3
    A = A_log.exp()                  # 4
    A = -A                           # 5
    g = A * x                        # 6
    beta = b.float()                 # 7
    beta = beta.sigmoid()            # 8
    return g, beta
