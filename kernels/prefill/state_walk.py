"""Stage 3: the inter-chunk state recurrence (and, fused, the outputs as it walks).

One program owns one ``(unit, value head, V tile)``; a unit is a whole
sequence, or with context parallelism one segment of ``SEG_T`` tokens of it.
The program keeps its ``[K, BV]`` fp32 state tile in registers and walks the
unit's chunks in order; per chunk (rows past the end are masked to 0)::

    v_new = u - w @ S                                   # residuals (beta included)
    S     = exp(gc_last) S + (k * exp(gc_last - gc))^T @ v_new

with ``gc_last`` the cumulative log decay at the chunk's last row. Flags pick
what else happens:

* ``STORE_H`` / ``STORE_VNEW``: store the state entering each chunk (at its
  slot, :mod:`.chunk_index`) and the residuals, for the separate output
  kernel (:mod:`.output`) -- the unfused compositions;
* ``FUSE_OUTPUT``: compute the chunk's outputs inline with
  :func:`.output.chunk_output` -- the ``fused`` variant, no ``h`` round trip;
* ``SUMMARY`` (context parallelism, phase A): walk the segment from
  ``[I | 0]`` over ``K + V`` columns, producing its affine transition
  ``S_end = M S_start + X`` (``M`` in the first ``K`` columns, ``X`` in the
  last ``V``), stored per segment slot; the last segment of a sequence is skipped;
* ``FROM_S0`` (phase C): start from the segment's true entering state,
  computed by :mod:`.context_parallel`.

The final state (k-last) is written by the program owning a sequence's last unit.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import BT, locate_block, num_slots  # noqa: E402
from .output import chunk_output  # noqa: E402

__all__ = ["state_walk_kernel", "state_walk_fwd", "state_walk", "load_state_tile",
           "WALK_DOT_PRECISION", "default_bv"]

#: ``input_precision`` of the fp32 products with the state (``w @ S``, ``k^T @ v_new``).
WALK_DOT_PRECISION = "tf32"


def default_bv(V: int, programs_per_tile: int, n_sm: int = 132) -> int:
    """State tile width: 16 when ``programs_per_tile * V / 32`` would not fill the SMs
    (more, shorter-latency programs), else 32; never more than ``V``."""
    if V <= 16:
        return V
    return 16 if programs_per_tile * (V // 32) < n_sm else 32


@triton.jit
def load_state_tile(h0, i_n, i_h, i_v, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    BV: tl.constexpr):
    """``[K, BV]`` fp32 tile (columns ``i_v*BV ...``) of the k-last state ``h0[i_n, i_h]``."""
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    return tl.load(h0 + ((i_n * H + i_h) * V + o_v[None, :]) * K + o_k[:, None])


@triton.jit(do_not_specialize=["T", "N"])
def state_walk_kernel(
    q,              # [T, HQ, K] bf16 (FUSE_OUTPUT) or None
    k,              # [T, HQ, K] bf16
    w,              # [T, H, K] WY factor (bf16 or f32)
    u,              # [T, H, V] WY factor (bf16 or f32)
    gc,             # [T, H] f32 per-chunk cumulative log decay
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    s0,             # [S, H, K, V] f32 entering state per segment slot (FROM_S0) or None
    cu_seqlens,     # [N+1] int32/int64
    o,              # [T, H, V] bf16 out (FUSE_OUTPUT) or None
    h,              # [C, H, K, V] f32 out: state entering each chunk slot (STORE_H) or None
    v_new,          # [T, H, V] f32 out: residuals (STORE_VNEW) or None
    ht,             # [N, H, V, K] f32 out: final state, k-last (not SUMMARY) or None
    summ,           # [S, H, K, K+V] f32 out: segment transitions [M | X] (SUMMARY) or None
    scale,          # output scale
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,            # value heads
    G: tl.constexpr,            # value heads per q/k head
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,           # chunk size
    BV: tl.constexpr,           # state tile width
    SEG_T: tl.constexpr,        # tokens per unit (segment); 0: a unit is a whole sequence
    USE_H0: tl.constexpr,
    FROM_S0: tl.constexpr,
    STORE_H: tl.constexpr,
    STORE_VNEW: tl.constexpr,
    FUSE_OUTPUT: tl.constexpr,
    SUMMARY: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    i_u, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    if SEG_T == 0:
        i_n = i_u
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        ubos = bos
        ueos = eos
    else:
        i_n, i_s, bos, eos = locate_block(i_u, cu_seqlens, N, SEG_T)
        ubos = bos + i_s * SEG_T
        ueos = tl.minimum(ubos + SEG_T, eos)
        # segment 0 of an empty sequence is real (it hands the initial state through)
        skip = (i_s > 0) & (ubos >= eos)
        if SUMMARY:
            skip = skip | (ueos >= eos)  # the last segment needs no transition
        if skip:
            return
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)   # columns: of S, or of [M | X] when SUMMARY

    if SUMMARY:
        b_S = tl.where(o_k[:, None] == o_v[None, :], 1.0, 0.0)   # [I | 0]
        m_u = o_v >= K
        o_u = o_v - K
    else:
        m_u = o_v < V
        o_u = o_v
        if FROM_S0:
            b_S = tl.load(s0 + ((i_u * H + i_h) * K + o_k[:, None]) * V + o_v[None, :])
        elif USE_H0:
            b_S = load_state_tile(h0, i_n, i_h, i_v, H, K, V, BV)
        else:
            b_S = tl.zeros([K, BV], dtype=tl.float32)

    n_ch = tl.cdiv(ueos - ubos, BT)
    for i_c in range(0, n_ch):
        t0 = ubos + i_c * BT
        o_t = t0 + tl.arange(0, BT)
        m_t = o_t < ueos
        b_w = tl.load(w + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None],
                      other=0.0).to(tl.float32)
        b_u = tl.load(u + (o_t[:, None] * H + i_h) * V + o_u[None, :],
                      mask=m_t[:, None] & m_u[None, :], other=0.0).to(tl.float32)
        b_v = b_u - tl.dot(b_w, b_S, input_precision=DOT_PREC)
        if STORE_H:
            slot_c = bos // BT + i_n + (t0 - bos) // BT
            tl.store(h + ((slot_c * H + i_h) * K + o_k[:, None]) * V + o_v[None, :], b_S)
        if STORE_VNEW:
            tl.store(v_new + (o_t[:, None] * H + i_h) * V + o_v[None, :], b_v,
                     mask=m_t[:, None])
        b_gc = tl.load(gc + o_t * H + i_h, mask=m_t, other=0.0)
        b_gl = tl.load(gc + (tl.minimum(t0 + BT, ueos) - 1) * H + i_h)
        b_k = tl.load(k + (o_t[:, None] * HQ + i_hk) * K + o_k[None, :], mask=m_t[:, None],
                      other=0.0)
        if FUSE_OUTPUT:
            b_q = tl.load(q + (o_t[:, None] * HQ + i_hk) * K + o_k[None, :],
                          mask=m_t[:, None], other=0.0)
            b_o = chunk_output(b_q, b_k, b_gc, b_S, b_v, scale, DOT_PREC)
            tl.store(o + (o_t[:, None] * H + i_h) * V + o_v[None, :],
                     b_o.to(o.dtype.element_ty), mask=m_t[:, None])
        b_kd = b_k.to(tl.float32) * tl.exp(b_gl - b_gc)[:, None]
        b_S = b_S * tl.exp(b_gl) + tl.dot(tl.trans(b_kd), b_v, input_precision=DOT_PREC)

    if SUMMARY:
        tl.store(summ + ((i_u * H + i_h) * K + o_k[:, None]) * (K + V) + o_v[None, :], b_S)
    else:
        p_ht = ht + ((i_n * H + i_h) * V + o_v[None, :]) * K + o_k[:, None]
        if SEG_T == 0:
            tl.store(p_ht, b_S)
        else:
            tl.store(p_ht, b_S, mask=(o_k[:, None] < K) & (ueos >= eos))


def state_walk_fwd(k, w, u, gc, cu_seqlens, *, q=None, initial_state=None, s0=None,
                   output=None, h=None, v_new=None, final_state=None, summary=None,
                   scale: float = 1.0, seg_t: int = 0, BV: int = 32,
                   num_warps: int = 4, num_stages: int = 2) -> None:
    """Launch :func:`state_walk_kernel` once; which tensors are given picks the flags.

    Grid: ``(units, HV, columns // BV)`` with units ``N`` (``seg_t == 0``) or
    ``T // seg_t + N`` segment slots; columns ``V``, or ``K + V`` when ``summary``
    is given. Writes into the given output tensors; returns nothing.
    """
    T, HQ, K = k.shape
    H, V = u.shape[1], u.shape[2]
    N = cu_seqlens.numel() - 1
    is_summary = summary is not None
    units = N if seg_t == 0 else num_slots(T, N, seg_t)
    cols = K + V if is_summary else V
    grid = (units, H, cols // BV)
    state_walk_kernel[grid](
        q, k, w, u, gc, initial_state, s0, cu_seqlens, output, h, v_new, final_state, summary,
        scale, T, N,
        H=H, G=H // HQ, K=K, V=V, BT=BT, BV=BV, SEG_T=seg_t,
        USE_H0=initial_state is not None, FROM_S0=s0 is not None, STORE_H=h is not None,
        STORE_VNEW=v_new is not None, FUSE_OUTPUT=output is not None, SUMMARY=is_summary,
        DOT_PREC=WALK_DOT_PRECISION, num_warps=num_warps, num_stages=num_stages,
    )


def state_walk(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, gc: torch.Tensor,
               cu_seqlens: torch.Tensor, initial_state: Optional[torch.Tensor] = None, *,
               BV: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk every sequence's chunks, storing chunk states and residuals (one kernel).

    Args:
        k: `[T, HQ, K]` bf16 keys.
        w: `[T, HV, K]`, u: `[T, HV, V]` WY factors (stage 2).
        gc: `[T, HV]` f32 per-chunk cumulative log decay.
        cu_seqlens: `[N+1]` int32/int64.
        initial_state: `[N, HV, V, K]` f32 k-last, or None (zeros).
        BV: state tile width (default :func:`default_bv`).
    Returns:
        ``(h [T // 64 + N, HV, K, V] f32`` state entering each chunk at its slot,
        ``v_new [T, HV, V] f32``, ``final_state [N, HV, V, K] f32)``.
    """
    T, _, K = k.shape
    H, V = u.shape[1], u.shape[2]
    N = cu_seqlens.numel() - 1
    BV = BV or default_bv(V, N * H)
    h = torch.empty(num_slots(T, N), H, K, V, dtype=torch.float32, device=k.device)
    v_new = torch.empty(T, H, V, dtype=torch.float32, device=k.device)
    ht = torch.empty(N, H, V, K, dtype=torch.float32, device=k.device)
    state_walk_fwd(k, w, u, gc, cu_seqlens, initial_state=initial_state, h=h, v_new=v_new,
                   final_state=ht, BV=BV)
    return h, v_new, ht
