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
* ``FUSE_OUTPUT``: compute the chunk's outputs inline as ``o = P @ S + ob``
  from the two output terms the intra-chunk kernel prepared (``q`` and the
  causal ``q k^T`` product are folded into them) -- the ``fused`` variant, no
  ``h`` round trip, and only one extra product on the walk;
* ``SUMMARY`` (context parallelism, phase A): walk the segment from
  ``[I | 0]`` over ``K + V`` columns, producing its affine transition
  ``S_end = M S_start + X`` (``M`` in the first ``K`` columns, ``X`` in the
  last ``V``), stored per segment slot; the last segment of a sequence is skipped;
* ``FROM_FIRST`` (the ``fused`` variant without CP): the intra-chunk kernel
  already walked each sequence's first chunk (:func:`fused_chunk_step`) and left
  the state after it in ``ht``: one-chunk sequences exit, longer ones start at
  chunk 1 from ``ht``;
* ``FROM_S0`` (phase C): start from the segment's true entering state,
  computed by :mod:`.context_parallel`'s combine kernel;
* ``CHAIN`` (phase C without that kernel): each program computes its
  segment's entering state itself, ``S <- M_j S + X_j`` over the sequence's
  earlier segments ``j`` (their ``[M | X]`` in ``summ``), from the initial
  state: redundant across segments but parallel, and one launch fewer.

* ``TM_FORM`` (the ``"tm"`` intermediates, the ``fused`` default): the intra-chunk
  kernel stored only ``Tb = Tm diag(beta)`` and ``scale * Aqk`` (``[T, H, 64]``); per
  chunk ``v_new = Tb (v - exp(gc) k S)`` and ``o = scale exp(gc) q S + Aqk v_new``
  (``w = Tb (exp(gc) k)`` and ``u = Tb v``, so this is the same algebra; the chain
  gets one ``[64, 64] x [64, BV]`` product more, the intra-chunk kernel loses four
  ``[64, 64] x [64, D]`` products and three quarters of the bytes it writes).

The final state (k-last) is written by the program owning a sequence's last unit.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import BT, locate_block, num_slots, seq_bounds  # noqa: E402
from .dots import mm, mm_pair  # noqa: E402
from .launch import FastLaunch  # noqa: E402
from .pdl import grid_trigger, grid_wait, launch_options, pdl_supported  # noqa: E402

__all__ = ["state_walk_kernel", "state_walk_fwd", "state_walk", "load_state_tile",
           "store_state_tile", "fused_chunk_step", "fused_chunk_step_tm",
           "WALK_DOT_PRECISION", "OUTPUT_INLINE_PRECISION", "default_bv"]

#: Precision (:mod:`.dots`) of the products with the state (``w @ S``, ``k^T @ v_new``).
WALK_DOT_PRECISION = "bf16x2"
#: Precision of the inline output product ``P @ S`` of the fused walk. With "bf16" the
#: output's relative L2 error against the reference grows from ~5e-3 to ~6.5e-3 (CPU,
#: D=128, T=300; the bf16 rounding of the output alone gives ~4e-3).
OUTPUT_INLINE_PRECISION = "bf16x2"


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
    p_h0 = h0 + (i_n * H + i_h).to(tl.int64) * (V * K)
    return tl.load(p_h0 + o_v[None, :] * K + o_k[:, None])


@triton.jit
def store_state_tile(ht, b_S, i_n, i_h, i_v, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BV: tl.constexpr):
    """Write the ``[K, BV]`` tile ``b_S`` into the k-last state ``ht[i_n, i_h]``."""
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    p_ht = ht + (i_n * H + i_h).to(tl.int64) * (V * K)
    tl.store(p_ht + o_v[None, :] * K + o_k[:, None], b_S)


@triton.jit
def fused_chunk_step(b_S, w, u, k, p, ob, gc, o, T, t0, n_t, i_h, i_hk, i_v,
                     H: tl.constexpr, HQ: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BV: tl.constexpr, W_SPLIT: tl.constexpr,
                     DOT_PREC: tl.constexpr, OUT_PREC: tl.constexpr):
    """One chunk of the fused walk for the ``[K, BV]`` state tile ``b_S`` (columns
    ``i_v * BV ...``): writes the chunk's outputs ``o = P @ S + ob`` and returns the
    state after the chunk. ``t0``: first token (int64), ``n_t``: rows of the chunk
    (``<= BT``). The same arithmetic as one iteration of :func:`state_walk_kernel`
    with ``FUSE_OUTPUT``; used by the intra-chunk kernel for a sequence's first chunk."""
    o_bt = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t = o_bt < n_t
    o_wk = o_bt[:, None] * (H * K) + o_k[None, :]
    o_tv = o_bt[:, None] * (H * V) + o_v[None, :]
    b_w = tl.load(w + (t0 * H + i_h) * K + o_wk, mask=m_t[:, None], other=0.0)
    b_u = tl.load(u + (t0 * H + i_h) * V + o_tv, mask=m_t[:, None], other=0.0).to(tl.float32)
    if W_SPLIT:
        p_wl = w + T.to(tl.int64) * (H * K) + (t0 * H + i_h) * K
        b_wl = tl.load(p_wl + o_wk, mask=m_t[:, None], other=0.0)
        b_v = b_u - mm_pair(b_w, b_wl, b_S)
    else:
        b_v = b_u - mm(b_w, b_S, DOT_PREC)
    b_gc = tl.load(gc + t0 * H + i_h + o_bt * H, mask=m_t, other=0.0)
    b_gl = tl.load(gc + (t0 + n_t - 1) * H + i_h)
    b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_bt[:, None] * (HQ * K) + o_k[None, :],
                  mask=m_t[:, None], other=0.0)
    b_p = tl.load(p + (t0 * H + i_h) * K + o_wk, mask=m_t[:, None], other=0.0)
    b_ob = tl.load(ob + (t0 * H + i_h) * V + o_tv, mask=m_t[:, None], other=0.0)
    b_o = mm(b_p, b_S, OUT_PREC) + b_ob.to(tl.float32)
    tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty), mask=m_t[:, None])
    b_vd = b_v * tl.exp(b_gl - b_gc)[:, None]
    return b_S * tl.exp(b_gl) + mm(tl.trans(b_k), b_vd, DOT_PREC)


@triton.jit
def fused_chunk_step_tm(b_S, w, v, k, q, p, gc, o, t0, n_t, i_h, i_hk, i_v, scale,
                        H: tl.constexpr, HQ: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BT: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
                        OUT_PREC: tl.constexpr):
    """One chunk of the fused walk with the ``"tm"`` intermediates for the ``[K, BV]`` state
    tile ``b_S`` (``w`` holds ``Tb``, ``p`` holds ``scale * Aqk``, ``[T, H, BT]``): writes
    the chunk's outputs and returns the state after it. The same arithmetic as one
    iteration of :func:`state_walk_kernel` with ``TM_FORM``; used by the intra-chunk kernel
    to walk a chunk it has just solved (the one-launch path for ``T <= 128``)."""
    o_bt = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t = o_bt < n_t
    o_qk = o_bt[:, None] * (HQ * K) + o_k[None, :]
    o_tv = o_bt[:, None] * (H * V) + o_v[None, :]
    o_tt = o_bt[:, None] * (H * BT) + o_bt[None, :]
    b_gc = tl.load(gc + t0 * H + i_h + o_bt * H, mask=m_t, other=0.0)
    b_gl = tl.load(gc + (t0 + n_t - 1) * H + i_h)
    b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
    b_u = tl.load(v + (t0 * H + i_h) * V + o_tv, mask=m_t[:, None], other=0.0).to(tl.float32)
    b_rhs = b_u - tl.exp(b_gc)[:, None] * mm(b_k, b_S, DOT_PREC)
    b_tb = tl.load(w + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
    b_v = mm(b_tb, b_rhs, DOT_PREC)
    b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
    b_aq = tl.load(p + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
    b_o = mm(b_q, b_S, OUT_PREC) * (scale * tl.exp(b_gc))[:, None] + mm(b_aq, b_v, OUT_PREC)
    tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty), mask=m_t[:, None])
    b_vd = b_v * tl.exp(b_gl - b_gc)[:, None]
    return b_S * tl.exp(b_gl) + mm(tl.trans(b_k), b_vd, DOT_PREC)


@triton.jit
def _load_unpipelined(ptrs, m_t, live):
    """``tl.load(ptrs, mask=m_t[:, None], other=0)`` inside a branch on ``live`` (always true
    where it is used): the software pipeliner leaves loads in branches alone, so this one gets
    no stage buffers in shared memory."""
    b = tl.zeros(ptrs.shape, dtype=ptrs.dtype.element_ty)
    if live:
        b = tl.load(ptrs, mask=m_t[:, None], other=0.0)
    return b


@triton.jit(do_not_specialize=["T", "N"])
def state_walk_kernel(
    p,              # [T, H, K] output term P, scale folded in (FUSE_OUTPUT) or None
    ob,             # [T, H, V] output term ob, scale folded in (FUSE_OUTPUT) or None
    k,              # [T, HQ, K] bf16
    w,              # [T, H, K] WY factor (bf16 or f32), or [2, T, H, K] bf16 (hi, lo) (W_SPLIT)
    u,              # [T, H, V] WY factor (bf16 or f32)
    gc,             # [T, H] f32 per-chunk cumulative log decay
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    s0,             # [S, H, K, V] f32 entering state per segment slot (FROM_S0) or None
    cu_seqlens,     # [N+1] int32/int64
    o,              # [T, H, V] bf16 out (FUSE_OUTPUT) or None
    h,              # [C, H, K, V] f32 out: state entering each chunk slot (STORE_H) or None
    v_new,          # [T, H, V] f32 out: residuals (STORE_VNEW) or None
    ht,             # [N, H, V, K] f32 out: final state, k-last (not SUMMARY) or None
    summ,           # [S, H, K, K+V] f32 segment transitions [M | X]: out (SUMMARY), in (CHAIN)
    q,              # [T, HQ, K] bf16 queries (TM_FORM and FUSE_OUTPUT) or None
    scale,          # output scale (TM_FORM and FUSE_OUTPUT)
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
    CHAIN: tl.constexpr,        # entering state from the earlier segments' [M | X] (summ)
    STORE_H: tl.constexpr,
    STORE_VNEW: tl.constexpr,
    FUSE_OUTPUT: tl.constexpr,
    SUMMARY: tl.constexpr,
    FROM_FIRST: tl.constexpr,   # the intra-chunk kernel did chunk 0: start at chunk 1 from ht
    WP_STACK: tl.constexpr,     # w is [T, H, 2, K] with P beside it: one product for both
    W_SPLIT: tl.constexpr,      # w is a bf16 (hi, lo) pair
    DOT_PREC: tl.constexpr,     # products with the state (see .dots)
    OUT_PREC: tl.constexpr,     # P @ S of the inline outputs (see .dots)
    CHAIN_PREC: tl.constexpr,   # M @ S of CHAIN
    LOOP_STAGES: tl.constexpr = None,   # software-pipeline stages of the chunk loop
                                        # (None: the launch's num_stages)
    PDL_WAIT: tl.constexpr = False,     # launched with PDL: wait before reading its inputs
    PDL_TRIGGER: tl.constexpr = "",     # "start" / "end": where a PDL-launched next kernel
                                        # may be placed (.pdl); "": never
    TM_FORM: tl.constexpr = False,      # the "tm" intermediates: w is Tb [T, H, BT], u is
                                        # the values v, p is scale * Aqk [T, H, BT], ob unused
    ACC_FUSE: tl.constexpr = False,     # bf16 products: the state update and the output
                                        # accumulate onto the decayed state / the q S term
                                        # (the products' accumulators; no separate adds)
    EARLY_LOADS: tl.constexpr = False,  # TM_FORM: load Tb, q, Aqk with k at the top of each
                                        # chunk (their latencies overlap; more live registers)
    PIPE_SKIP: tl.constexpr = "",       # TM_FORM + FUSE_OUTPUT: "q" / "aq": that load is kept
                                        # out of the chunk loop's pipeline (its stage buffers
                                        # cost shared memory; the load's latency is exposed)
):
    # PDL (see .pdl): only h0 is read before grid_wait; every program waits before it
    # exits, so this kernel's completion implies the earlier kernels' completion
    grid_trigger(PDL_TRIGGER == "start")
    i_u, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    if SEG_T == 0:
        i_n = i_u
        bos, eos = seq_bounds(cu_seqlens, i_n, T)
        ubos = bos
        ueos = eos
        if FROM_FIRST:
            # one-chunk sequences are complete (outputs and ht written); an empty one
            # still hands its initial state through below
            if (eos - bos > 0) & (eos - bos <= BT):
                grid_wait(PDL_WAIT)
                return
            if eos - bos > 0:
                ubos = bos + BT
    else:
        i_n, i_s, bos, eos = locate_block(i_u, cu_seqlens, N, T, SEG_T)
        ubos = bos + i_s * SEG_T
        ueos = tl.minimum(ubos + SEG_T, eos)
        # segment 0 of an empty sequence is real (it hands the initial state through)
        skip = (i_s > 0) & (ubos >= eos)
        if SUMMARY:
            skip = skip | (ueos >= eos)  # the last segment needs no transition
        if skip:
            grid_wait(PDL_WAIT)
            return
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)   # columns: of S, or of [M | X] when SUMMARY
    o_bt = tl.arange(0, BT)
    # Addressing: int64 scalar base pointers per chunk + loop-invariant int32 tile
    # offsets (int64 offset tensors would cost two registers per element).
    o_kv = o_k[:, None] * V + o_v[None, :]                 # [K, BV] in a [K, V] state
    tl.static_assert(not WP_STACK or not W_SPLIT)
    WS: tl.constexpr = 2 if WP_STACK else 1                # w's (token, head) stride / K
    o_wk = o_bt[:, None] * (H * K * WS) + o_k[None, :]     # [BT, K] rows of w
    o_qk = o_bt[:, None] * (HQ * K) + o_k[None, :]         # [BT, K] rows of k
    o_wp = (o_bt[:, None, None] * (H * 2 * K) + tl.arange(0, 2)[None, :, None] * K
            + o_k[None, None, :])                          # [BT, 2, K] rows of [w; P]
    o_tt = o_bt[:, None] * (H * BT) + o_bt[None, :]        # [BT, BT] rows of Tb, Aqk (TM_FORM)

    if SUMMARY:
        b_S = tl.where(o_k[:, None] == o_v[None, :], 1.0, 0.0)   # [I | 0]
        m_u = o_v >= K
        o_tv = o_bt[:, None] * (H * V) + (o_v - K)[None, :]      # [BT, BV] rows of u (X part)
    else:
        m_u = o_v < V
        o_tv = o_bt[:, None] * (H * V) + o_v[None, :]            # [BT, BV] rows of u, o, v_new
        if FROM_S0:
            grid_wait(PDL_WAIT)
            b_S = tl.load(s0 + (i_u * H + i_h).to(tl.int64) * (K * V) + o_kv)
        elif CHAIN:
            # S_start(j+1) = M_j S_start(j) + X_j over the sequence's earlier segments
            if USE_H0:
                b_S = load_state_tile(h0, i_n, i_h, i_v, H, K, V, BV)
            else:
                b_S = tl.zeros([K, BV], dtype=tl.float32)
            grid_wait(PDL_WAIT)
            slot0 = (bos // SEG_T).to(tl.int32) + i_n
            for j in range(0, i_s):
                p_m = summ + ((slot0 + j) * H + i_h).to(tl.int64) * (K * (K + V))
                b_M = tl.load(p_m + o_k[:, None] * (K + V) + o_k[None, :])
                b_X = tl.load(p_m + o_k[:, None] * (K + V) + K + o_v[None, :])
                b_S = mm(b_M, b_S, CHAIN_PREC) + b_X
        elif USE_H0:
            b_S = load_state_tile(h0, i_n, i_h, i_v, H, K, V, BV)
        else:
            b_S = tl.zeros([K, BV], dtype=tl.float32)
        if FROM_FIRST:
            grid_wait(PDL_WAIT)
            if ubos > bos:   # the state after chunk 0, left in ht by the intra-chunk kernel
                b_S = load_state_tile(ht, i_n, i_h, i_v, H, K, V, BV)

    grid_wait(PDL_WAIT)   # (a no-op when already waited above)
    n_ch = tl.cdiv(ueos - ubos, BT)
    for i_c in tl.range(0, n_ch, num_stages=LOOP_STAGES):
        t0 = ubos + i_c * BT                       # first token of the chunk (int64)
        m_t = o_bt < (ueos - t0)
        b_u = tl.load(u + (t0 * H + i_h) * V + o_tv, mask=m_t[:, None] & m_u[None, :],
                      other=0.0).to(tl.float32)
        if TM_FORM:
            # v_new = Tb (v - exp(gc) k S): u holds the values, w holds Tb = Tm diag(beta)
            b_gc = tl.load(gc + t0 * H + i_h + o_bt * H, mask=m_t, other=0.0)
            b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
            if EARLY_LOADS:   # every load of the chunk issued before its first product
                b_tb = tl.load(w + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
                if FUSE_OUTPUT:
                    b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
                    b_aq = tl.load(p + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
            b_rhs = b_u - tl.exp(b_gc)[:, None] * mm(b_k, b_S, DOT_PREC)
            if not EARLY_LOADS:
                b_tb = tl.load(w + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
            b_v = mm(b_tb, b_rhs, DOT_PREC)
        elif WP_STACK and FUSE_OUTPUT:
            # [w; P] @ S as one bf16 product: rows (t, 0) = w_t, (t, 1) = P_t
            b_wp = tl.load(w + (t0 * H + i_h) * (2 * K) + o_wp, mask=m_t[:, None, None],
                           other=0.0)
            b_r = tl.dot(tl.reshape(b_wp, (2 * BT, K)), b_S.to(b_wp.dtype))
            b_wS, b_pS = tl.split(tl.permute(tl.reshape(b_r, (BT, 2, BV)), (0, 2, 1)))
            b_v = b_u - b_wS
        elif W_SPLIT:   # w stored as a bf16 (hi, lo) pair
            b_w = tl.load(w + (t0 * H + i_h) * K + o_wk, mask=m_t[:, None], other=0.0)
            p_wl = w + T.to(tl.int64) * (H * K) + (t0 * H + i_h) * K
            b_wl = tl.load(p_wl + o_wk, mask=m_t[:, None], other=0.0)
            b_v = b_u - mm_pair(b_w, b_wl, b_S)
        else:
            b_w = tl.load(w + (t0 * H + i_h) * (K * WS) + o_wk, mask=m_t[:, None], other=0.0)
            b_v = b_u - mm(b_w, b_S, DOT_PREC)
        if STORE_H:
            slot_c = bos // BT + i_n + (t0 - bos) // BT
            tl.store(h + (slot_c * H + i_h) * (K * V) + o_kv, b_S)
        if STORE_VNEW:
            tl.store(v_new + (t0 * H + i_h) * V + o_tv, b_v, mask=m_t[:, None])
        if not TM_FORM:
            b_gc = tl.load(gc + t0 * H + i_h + o_bt * H, mask=m_t, other=0.0)
            b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
        b_gl = tl.load(gc + (tl.minimum(t0 + BT, ueos) - 1) * H + i_h)
        if FUSE_OUTPUT and TM_FORM:   # o = scale exp(gc) q S + Aqk v_new (scale in Aqk)
            if not EARLY_LOADS:
                if PIPE_SKIP != "q":
                    b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
                else:
                    b_q = _load_unpipelined(q + (t0 * HQ + i_hk) * K + o_qk, m_t, t0 < ueos)
                if PIPE_SKIP != "aq":
                    b_aq = tl.load(p + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
                else:
                    b_aq = _load_unpipelined(p + (t0 * H + i_h) * BT + o_tt, m_t, t0 < ueos)
            if ACC_FUSE and OUT_PREC == "bf16":   # Aqk v_new accumulated onto the q S term
                b_o = tl.dot(b_aq.to(tl.bfloat16), b_v.to(tl.bfloat16),
                             acc=mm(b_q, b_S, OUT_PREC) * (scale * tl.exp(b_gc))[:, None])
            else:
                b_o = (mm(b_q, b_S, OUT_PREC) * (scale * tl.exp(b_gc))[:, None]
                       + mm(b_aq, b_v, OUT_PREC))
            tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty),
                     mask=m_t[:, None])
        elif FUSE_OUTPUT:   # o = P @ S + ob (see .intra_chunk)
            b_ob = tl.load(ob + (t0 * H + i_h) * V + o_tv, mask=m_t[:, None], other=0.0)
            if WP_STACK:
                b_o = b_pS + b_ob.to(tl.float32)
            else:
                b_p = tl.load(p + (t0 * H + i_h) * K + o_wk, mask=m_t[:, None], other=0.0)
                b_o = mm(b_p, b_S, OUT_PREC) + b_ob.to(tl.float32)
            tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty),
                     mask=m_t[:, None])
        # S = exp(gc_last) S + k^T (exp(gc_last - gc) v_new): the decay goes on the
        # small [BT, BV] residual tile, k stays bf16
        b_vd = b_v * tl.exp(b_gl - b_gc)[:, None]
        if ACC_FUSE and DOT_PREC == "bf16":   # the decayed state is the product's accumulator
            b_S = tl.dot(tl.trans(b_k), b_vd.to(tl.bfloat16), acc=b_S * tl.exp(b_gl))
        else:
            b_S = b_S * tl.exp(b_gl) + mm(tl.trans(b_k), b_vd, DOT_PREC)

    if SUMMARY:
        p_summ = summ + (i_u * H + i_h).to(tl.int64) * (K * (K + V))
        tl.store(p_summ + o_k[:, None] * (K + V) + o_v[None, :], b_S)
    else:
        p_ht = ht + (i_n * H + i_h).to(tl.int64) * (V * K) + o_v[None, :] * K + o_k[:, None]
        if SEG_T == 0:
            tl.store(p_ht, b_S)
        else:
            tl.store(p_ht, b_S, mask=(o_k[:, None] < K) & (ueos >= eos))
    grid_trigger(PDL_TRIGGER == "end")


_WALK_LAUNCH = FastLaunch(state_walk_kernel)


def state_walk_fwd(k, w, u, gc, cu_seqlens, *, p=None, ob=None, initial_state=None, s0=None,
                   output=None, h=None, v_new=None, final_state=None, summary=None,
                   seg_t: int = 0, BV: int = 32,
                   num_warps: int = 4, num_stages: int = 2,
                   dot_precision: str = WALK_DOT_PRECISION,
                   out_precision: str = OUTPUT_INLINE_PRECISION, chain: bool = False,
                   chain_precision: str = "tf32x3", maxnreg: Optional[int] = None,
                   from_first: bool = False, wp_stack: bool = False, pdl: bool = False,
                   pdl_trigger: str = "", loop_stages: Optional[int] = None,
                   defer: bool = False, q=None, scale: float = 1.0, tm_form: bool = False,
                   early_loads: bool = False, acc_fuse: bool = False, pipe_skip: str = ""):
    """Launch :func:`state_walk_kernel` once; which tensors are given picks the flags.

    Grid: ``(units, HV, columns // BV)`` with units ``N`` (``seg_t == 0``) or
    ``T // seg_t + N`` segment slots; columns ``V``, or ``K + V`` when ``summary``
    is given (``chain``: ``summary`` is read, phase C without the combine kernel;
    ``from_first``: the intra-chunk kernel already did each sequence's first chunk;
    ``wp_stack``: ``w`` is the ``[T, HV, 2, K]`` pair of ``w`` and ``P``, ``p`` unused).
    ``dot_precision``: products with the state; ``out_precision``: the inline
    ``P @ S`` (:mod:`.dots`). ``pdl``: launch with programmatic dependent launch (the
    kernel before it must trigger, :mod:`.pdl`); ``pdl_trigger`` (``"start"``,
    ``"end"`` or ``""``): where each program lets a PDL-launched next kernel be placed.
    ``loop_stages``: pipeline stages of the chunk loop alone (None: ``num_stages``).
    ``tm_form``: the ``"tm"`` intermediates (:func:`.intra_chunk.intra_chunk_fwd` with
    ``tm_out``): ``w`` is ``Tb = Tm diag(beta)`` ``[T, HV, 64]``, ``u`` is the values ``v``
    ``[T, HV, V]``, ``p`` is ``scale * Aqk`` ``[T, HV, 64]`` and, with ``output``, ``q``
    ``[T, HQ, K]`` and ``scale`` are needed (``ob`` unused): per chunk
    ``v_new = Tb (v - exp(gc) k S)``, ``o = scale exp(gc) q S + Aqk v_new``;
    ``early_loads`` (with ``tm_form``): every load of a chunk before its first product.
    ``pipe_skip`` (with ``tm_form`` and an output): ``"q"`` or ``"aq"`` (``scale * Aqk``) is
    loaded outside the chunk loop's software pipeline: its stage buffers are the difference
    between one and two programs per SM at width 64 with a 2-stage loop (131 KB of shared
    memory with every load pipelined; 99 KB without ``q``'s, 115 KB without ``Aqk``'s).
    ``acc_fuse`` (bf16 products): the state update and the outputs accumulate in the
    products' accumulators (``S <- dot(k^T, v_new, acc=exp(g) S)``) instead of adding after.
    Writes into the given output tensors; returns None, or with ``defer`` the bound
    launch (a zero-argument callable, :meth:`.launch.FastLaunch.bind`) without launching.
    """
    T, HQ, K = k.shape
    H, V = u.shape[1], u.shape[2]
    N = cu_seqlens.numel() - 1
    if tm_form and (wp_stack or w.dim() != 3 or w.shape[2] != BT or
                    (output is not None and (q is None or p is None))):
        raise ValueError("tm_form needs w as Tb [T, HV, 64], no wp_stack, and with an output "
                         "p (scale * Aqk, [T, HV, 64]) and q")
    if wp_stack and output is not None and (dot_precision, out_precision) != ("bf16", "bf16"):
        raise ValueError("wp_stack multiplies w and P by the state in one bf16 product: "
                         "dot_precision and out_precision must be 'bf16'")
    is_summary = summary is not None and not chain
    units = N if seg_t == 0 else num_slots(T, N, seg_t)
    cols = K + V if is_summary else V
    grid = (units, H, cols // BV)
    pdl_opts = launch_options(pdl, k.device)
    trigger = pdl_trigger if pdl_supported(k.device) else ""
    go = _WALK_LAUNCH.bind(grid, (
        p, ob, k, w, u, gc, initial_state, s0, cu_seqlens, output, h, v_new, final_state,
        summary, q if tm_form else None, float(scale) if tm_form else 1.0, T, N), dict(
        H=H, G=H // HQ, K=K, V=V, BT=BT, BV=BV, SEG_T=seg_t,
        USE_H0=initial_state is not None, FROM_S0=s0 is not None, CHAIN=chain,
        STORE_H=h is not None,
        STORE_VNEW=v_new is not None, FUSE_OUTPUT=output is not None, SUMMARY=is_summary,
        FROM_FIRST=from_first, WP_STACK=wp_stack, TM_FORM=tm_form,
        EARLY_LOADS=early_loads and tm_form, ACC_FUSE=acc_fuse,
        PIPE_SKIP=pipe_skip if tm_form and output is not None else "",
        W_SPLIT=w.dim() == 4 and not wp_stack,
        DOT_PREC=dot_precision, OUT_PREC=out_precision, CHAIN_PREC=chain_precision,
        LOOP_STAGES=loop_stages, PDL_WAIT=bool(pdl_opts), PDL_TRIGGER=trigger, **pdl_opts,
        num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {})))
    if defer:
        return go
    go()


def state_walk(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, gc: torch.Tensor,
               cu_seqlens: torch.Tensor, initial_state: Optional[torch.Tensor] = None, *,
               BV: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk every sequence's chunks, storing chunk states and residuals (one kernel).

    Args:
        k: `[T, HQ, K]` bf16 keys.
        w: `[T, HV, K]` (or a `[2, T, HV, K]` bf16 hi/lo pair), u: `[T, HV, V]` WY
            factors (stage 2).
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
