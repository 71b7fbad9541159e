"""Stage 3 for short sequences: the fused ``"tm"`` walk over groups of sequences.

The per-sequence walk (:mod:`.state_walk`) gives each ``(sequence, value head, V tile)``
one program. With sequences of one to a few chunks each program is a short chain of
dependent loads and products -- load the state tile, then ``k``, ``v``, ``Tb``, then ``q``
and ``Aqk``, each round waiting for memory -- and nothing overlaps those waits but the
one other program on the multiprocessor (255 registers). Here one program owns a group
of ``GS`` consecutive sequences (for one value head and V tile) and walks all their chunks
in one flat loop, which the compiler software-pipelines: the next chunk's tiles (and the
next sequence's initial state) load while the current chunk computes.

Loop bookkeeping stays in registers so that every address is a function of the loop
counter alone (a pipelined loop cannot wait for a load to know where to load next): the
group's ``GS + 1`` sequence bounds are loaded once, and chunk ``q`` of the group maps to
its sequence ``j`` and chunk ``c`` by comparisons with the running chunk counts. An empty
sequence counts as one chunk with no rows, so its final state (its initial state) is
written like any other. Per chunk, as the ``TM_FORM`` walk (``gc_last`` the chunk's last
cumulative log decay; rows past the sequence masked to 0)::

    S     = h0[n]                                   at the sequence's first chunk
    v_new = Tb (v - exp(gc) k S)
    o     = scale exp(gc) q S + Aqk v_new           (scale in the stored Aqk)
    S     = exp(gc_last) S + (k exp(gc_last - gc))^T v_new
    ht[n] = S^T                                     after the sequence's last chunk
"""
from __future__ import annotations

from typing import Optional

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import BT  # noqa: E402
from .dots import mm  # noqa: E402
from .launch import FastLaunch  # noqa: E402
from .pdl import grid_trigger, grid_wait, launch_options, pdl_supported  # noqa: E402

__all__ = ["short_walk_kernel", "short_walk_fwd", "group_size_rule"]


@triton.jit
def _pick(vec, o_g, j):
    """``vec[j]`` of a small register vector (``j`` a scalar)."""
    return tl.sum(tl.where(o_g == j, vec, 0), axis=0)


@triton.jit(do_not_specialize=["T", "N"])
def short_walk_kernel(
    p,              # [T, H, BT] scale * Aqk
    k,              # [T, HQ, K] bf16
    w,              # [T, H, BT] Tb = Tm diag(beta)
    v,              # [T, H, V] bf16 values
    gc,             # [T, H] f32 per-chunk cumulative log decay
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    cu_seqlens,     # [N+1] int32/int64
    o,              # [T, H, V] bf16 out
    ht,             # [N, H, V, K] f32 out: final state, k-last
    q,              # [T, HQ, K] bf16 queries
    scale,          # output scale (of the q S term; Aqk has it folded in)
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,            # value heads
    G: tl.constexpr,            # value heads per q/k head
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,           # chunk size
    BV: tl.constexpr,           # state tile width
    GS: tl.constexpr,           # sequences per program
    GP: tl.constexpr,           # power of two > GS (register vectors of the group)
    USE_H0: tl.constexpr,
    DOT_PREC: tl.constexpr,     # products with the state (see .dots)
    OUT_PREC: tl.constexpr,     # q S and Aqk v_new
    LOOP_STAGES: tl.constexpr,  # software-pipeline stages of the chunk loop
    PDL_WAIT: tl.constexpr = False,
    PDL_TRIGGER: tl.constexpr = "",
):
    grid_trigger(PDL_TRIGGER == "start")
    i_g, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    n0 = i_g * GS
    # the group's bounds in registers: cu[n0 + j], j = 0..GS (past N: cu[N])
    o_g = tl.arange(0, GP)
    b_cu = tl.load(cu_seqlens + tl.minimum(n0 + o_g, N)).to(tl.int64)        # [GP]
    b_len = tl.load(cu_seqlens + tl.minimum(n0 + o_g + 1, N)).to(tl.int64) - b_cu
    real_seq = (o_g < GS) & (n0 + o_g < N)
    # chunks per sequence (an empty one counts one, with no rows); running totals
    b_nch = tl.where(real_seq, tl.maximum(tl.cdiv(b_len, BT), 1), 0).to(tl.int32)
    b_end = tl.cumsum(b_nch, axis=0)                                          # [GP]
    n_q = tl.sum(b_nch, axis=0)

    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_bt = tl.arange(0, BT)
    o_qk = o_bt[:, None] * (HQ * K) + o_k[None, :]          # [BT, K] rows of k, q
    o_tv = o_bt[:, None] * (H * V) + o_v[None, :]           # [BT, BV] rows of v, o
    o_tt = o_bt[:, None] * (H * BT) + o_bt[None, :]         # [BT, BT] rows of Tb, Aqk
    o_st = o_v[None, :] * K + o_k[:, None]                  # [K, BV] of a k-last state

    grid_wait(PDL_WAIT)
    b_S = tl.zeros([K, BV], dtype=tl.float32)
    for i_q in tl.range(0, n_q, num_stages=LOOP_STAGES):
        # chunk i_q of the group: sequence j (the first whose running total exceeds i_q)
        j = tl.sum((b_end <= i_q).to(tl.int32), axis=0)
        bos = _pick(b_cu, o_g, j)
        L = _pick(b_len, o_g, j)
        i_c = i_q - (_pick(b_end, o_g, j) - _pick(b_nch, o_g, j))
        i_n = n0 + j
        t0 = bos + i_c * BT
        n_t = L - i_c * BT                                   # rows left (<= 0: none)
        m_t = o_bt < n_t
        first = i_c == 0
        last = (i_c + 1) * BT >= L
        p_st = (i_n * H + i_h).to(tl.int64) * (V * K)
        if USE_H0:
            b_h0 = tl.load(h0 + p_st + o_st, mask=(o_k[:, None] < K) & first, other=0.0)
        else:
            b_h0 = tl.zeros([K, BV], dtype=tl.float32)
        b_S = tl.where(first, b_h0, b_S)
        b_gc = tl.load(gc + t0 * H + i_h + o_bt * H, mask=m_t, other=0.0)
        b_gl = tl.load(gc + (t0 + tl.minimum(n_t, BT) - 1) * H + i_h, mask=n_t > 0, other=0.0)
        b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
        b_u = tl.load(v + (t0 * H + i_h) * V + o_tv, mask=m_t[:, None], other=0.0)
        b_tb = tl.load(w + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
        b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
        b_aq = tl.load(p + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
        b_rhs = b_u.to(tl.float32) - tl.exp(b_gc)[:, None] * mm(b_k, b_S, DOT_PREC)
        b_vn = mm(b_tb, b_rhs, DOT_PREC)
        b_o = (mm(b_q, b_S, OUT_PREC) * (scale * tl.exp(b_gc))[:, None]
               + mm(b_aq, b_vn, OUT_PREC))
        tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty), mask=m_t[:, None])
        b_vd = b_vn * tl.exp(b_gl - b_gc)[:, None]
        b_S = b_S * tl.exp(b_gl) + mm(tl.trans(b_k), b_vd, DOT_PREC)
        tl.store(ht + p_st + o_st, b_S, mask=(o_k[:, None] < K) & last)
    grid_trigger(PDL_TRIGGER == "end")


_SHORT_LAUNCH = FastLaunch(short_walk_kernel)


def group_size_rule(N: int, HV: int, V: int, BV: int, n_sm: int) -> int:
    """Sequences per program of the grouped walk: the fewest that keep the grid within one
    program per multiprocessor, ``ceil(N / floor(n_sm / (HV * V / BV)))`` (at least 1).
    57x64 on 132 SMs at width 64: 8 (128 programs); 16x256: 2 (128 programs)."""
    per_group = HV * (V // BV)
    groups = max(1, n_sm // per_group)
    return max(1, -(-N // groups))


def short_walk_fwd(k, w, v, gc, cu_seqlens, *, p, q, scale: float, output, final_state,
                   initial_state: Optional[torch.Tensor] = None, group: int = 8, BV: int = 64,
                   num_warps: int = 4, num_stages: int = 2,
                   dot_precision: str = "bf16", out_precision: str = "bf16", pdl: bool = False,
                   pdl_trigger: str = "", defer: bool = False):
    """Launch :func:`short_walk_kernel`: grid ``(ceil(N / group), HV, V // BV)``.

    ``w`` is ``Tb`` ``[T, HV, 64]``, ``p`` is ``scale * Aqk`` ``[T, HV, 64]`` (the ``"tm"``
    intermediates of :func:`.intra_chunk.intra_chunk_fwd`), ``v`` ``[T, HV, V]`` the values,
    ``q`` ``[T, HQ, K]``; writes ``output`` ``[T, HV, V]`` and ``final_state``
    ``[N, HV, V, K]`` (k-last). ``group``: sequences per program (:func:`group_size_rule`);
    ``num_stages``: pipeline stages of the chunk loop. Returns None, or with ``defer`` the
    bound launch.
    """
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    if group < 1 or BV > V or V % BV:
        raise ValueError(f"group must be >= 1 and BV divide V, got group={group}, BV={BV}")
    GP = triton.next_power_of_2(group + 1)
    grid = (triton.cdiv(N, group), H, V // BV)
    pdl_opts = launch_options(pdl, k.device)
    trigger = pdl_trigger if pdl_supported(k.device) else ""
    go = _SHORT_LAUNCH.bind(grid, (
        p, k, w, v, gc, initial_state, cu_seqlens, output, final_state, q, float(scale), T, N),
        dict(
        H=H, G=H // HQ, K=K, V=V, BT=BT, BV=BV, GS=group, GP=GP,
        USE_H0=initial_state is not None, DOT_PREC=dot_precision, OUT_PREC=out_precision,
        LOOP_STAGES=num_stages, PDL_WAIT=bool(pdl_opts), PDL_TRIGGER=trigger, **pdl_opts,
        num_warps=num_warps, num_stages=num_stages))
    if defer:
        return go
    go()
