"""Stage 4: outputs of a chunk from its entering state and its residuals.

For the rows ``i`` of one chunk, with ``S0`` the state entering the chunk
(``[K, V]``), ``v_new`` its delta-rule residuals (stage 3) and ``gc`` the
per-chunk cumulative log decay::

    o_i = scale * ( exp(gc_i) q_i S0 + sum_{j <= i} (q_i . k_j) exp(gc_i - gc_j) v_new_j )

:func:`chunk_output` is the block computation; :func:`chunk_output_kernel`
runs it per ``(chunk, value head, V tile)`` reading the chunk states the
state walk stored (the unfused compositions). The ``fused`` variant instead
folds ``q`` and the causal term into two per-token terms in the intra-chunk
kernel (``o = P @ S0 + ob``, see :mod:`.intra_chunk`) and the walk applies them.
"""
from __future__ import annotations

from typing import Optional

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import (BT, chunk_of_program, num_slots, prepare_chunk_indices,  # noqa: E402
                          slot_of)
from .dots import mm  # noqa: E402

__all__ = ["chunk_output", "chunk_output_kernel", "chunk_output_fwd", "chunk_output_stage",
           "OUTPUT_DOT_PRECISION"]

#: Precision of ``q @ S0`` and ``A_qk @ v_new`` in the output kernel (see :func:`chunk_output`).
OUTPUT_DOT_PRECISION = "bf16x2"


@triton.jit
def chunk_output(b_q, b_k, b_gc, b_S, b_v, scale, DOT_PREC: tl.constexpr):
    """``[BT, BV]`` outputs of one chunk.

    Args (blocks): ``b_q``, ``b_k`` `[BT, K]` bf16 (rows past the end are 0),
    ``b_gc`` `[BT]` f32, ``b_S`` `[K, BV]` f32 entering state, ``b_v`` `[BT, BV]` f32
    residuals (0 past the end). ``DOT_PREC``: precision of the products with the
    state and the residuals (:mod:`.dots`).
    """
    BT_: tl.constexpr = b_q.shape[0]
    o_i = tl.arange(0, BT_)
    b_A = tl.dot(b_q, tl.trans(b_k))                                 # q k^T, bf16 -> f32
    b_A = b_A * tl.exp(tl.minimum(b_gc[:, None] - b_gc[None, :], 0.0))
    b_A = tl.where(o_i[:, None] >= o_i[None, :], b_A, 0.0)           # causal, diagonal kept
    b_o = mm(b_q, b_S, DOT_PREC) * tl.exp(b_gc)[:, None]
    b_o += mm(b_A, b_v, DOT_PREC)
    return b_o * scale


@triton.jit(do_not_specialize=["T", "N"])
def chunk_output_kernel(
    q,              # [T, HQ, K] bf16
    k,              # [T, HQ, K] bf16
    gc,             # [T, H] f32 per-chunk cumulative log decay
    h,              # [C, H, K, V] f32 state entering each chunk (slot-indexed)
    v_new,          # [T, H, V] f32 residuals
    o,              # [T, H, V] bf16 out
    cu_seqlens,     # [N+1] int32/int64
    chunk_indices,  # [NC, 2] int32 (USE_INDICES) or None
    scale,          # output scale
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,
    G: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    USE_INDICES: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    i_p, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, i_c, bos, eos = chunk_of_program(i_p, cu_seqlens, chunk_indices, N, T, BT, USE_INDICES)
    if i_c * BT >= eos - bos:
        return
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    slot = slot_of(i_n, i_c, bos, BT)
    o_t = bos + i_c * BT + tl.arange(0, BT)
    m_t = o_t < eos
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_qk = (o_t[:, None] * HQ + i_hk) * K + o_k[None, :]
    b_q = tl.load(q + p_qk, mask=m_t[:, None], other=0.0)
    b_k = tl.load(k + p_qk, mask=m_t[:, None], other=0.0)
    b_gc = tl.load(gc + o_t * H + i_h, mask=m_t, other=0.0)
    b_S = tl.load(h + ((slot * H + i_h) * K + o_k[:, None]) * V + o_v[None, :])
    p_v = (o_t[:, None] * H + i_h) * V + o_v[None, :]
    b_v = tl.load(v_new + p_v, mask=m_t[:, None], other=0.0)
    b_o = chunk_output(b_q, b_k, b_gc, b_S, b_v, scale, DOT_PREC)
    tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_t[:, None])


def chunk_output_fwd(q, k, gc, h, v_new, cu_seqlens, scale: float, *,
                     output: Optional[torch.Tensor] = None,
                     chunk_indices: Optional[torch.Tensor] = None, BV: Optional[int] = None,
                     num_warps: int = 4) -> torch.Tensor:
    """Allocate (unless ``output`` is given) and launch :func:`chunk_output_kernel` once."""
    T, HQ, K = q.shape
    H, V = v_new.shape[1], v_new.shape[2]
    N = cu_seqlens.numel() - 1
    BV = BV or min(V, 64)
    o = output if output is not None else torch.empty(T, H, V, dtype=torch.bfloat16,
                                                      device=q.device)
    use_indices = chunk_indices is not None
    grid = (chunk_indices.shape[0] if use_indices else num_slots(T, N), H, V // BV)
    if grid[0] > 0:
        chunk_output_kernel[grid](
            q, k, gc, h, v_new, o, cu_seqlens, chunk_indices, scale, T, N,
            H=H, G=H // HQ, K=K, V=V, BT=BT, BV=BV, USE_INDICES=use_indices,
            DOT_PREC=OUTPUT_DOT_PRECISION, num_warps=num_warps,
        )
    return o


def chunk_output_stage(q: torch.Tensor, k: torch.Tensor, gc: torch.Tensor, h: torch.Tensor,
                       v_new: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, *,
                       use_indices: bool = False) -> torch.Tensor:
    """Outputs of every chunk from the stored chunk states and residuals.

    Args:
        q, k: `[T, HQ, K]` bf16.
        gc: `[T, HV]` f32 per-chunk cumulative log decay.
        h: `[T // 64 + N, HV, K, V]` f32 state entering each chunk, at its slot
            (:mod:`.chunk_index`).
        v_new: `[T, HV, V]` f32 residuals.
        cu_seqlens: `[N+1]` int32/int64.
        scale: output scale (already resolved).
        use_indices: host-built chunk table (syncs) instead of the device lookup.
    Returns:
        `[T, HV, V]` bf16.
    """
    idx = prepare_chunk_indices(cu_seqlens) if use_indices else None
    return chunk_output_fwd(q, k, gc, h, v_new, cu_seqlens, scale, chunk_indices=idx)
