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
* ``FUSE_OUTPUT`` (with ``TM_FORM``, the ``fused`` variant): compute the chunk's
  outputs inline, no ``h`` round trip;
* ``SUMMARY`` (context parallelism, phase A): walk the segment from
  ``[I | 0]`` over ``K + V`` columns, producing its affine transition
  ``S_end = M S_start + X`` (``M`` in the first ``K`` columns, ``X`` in the
  last ``V``), stored per segment slot; the last segment of a sequence is skipped;
* ``CHAIN`` (phase C): each program computes its
  segment's entering state itself, ``S <- M_j S + X_j`` over the sequence's
  earlier segments ``j`` (their ``[M | X]`` in ``summ``), from the initial
  state: redundant across segments but parallel, and one launch fewer;
* ``TM_FORM`` (the ``"tm"`` intermediates of the ``fused`` variant): the intra-chunk
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

from .chunk_index import BT, cu_status, num_slots, segment_bounds, seq_bounds  # noqa: E402
from .dots import mm, mm_pair  # noqa: E402
from .guard import guard_outputs  # noqa: E402
from .launch import FastLaunch  # noqa: E402
from .pdl import grid_trigger, grid_wait, launch_options, pdl_supported  # noqa: E402

__all__ = ["state_walk_kernel", "state_walk_fwd", "state_walk", "load_state_tile",
           "store_state_tile", "fused_chunk_step_tm",
           "WALK_DOT_PRECISION", "OUTPUT_INLINE_PRECISION", "default_bv"]

#: Precision (:mod:`.dots`) of the products with the state (``w @ S``, ``k^T @ v_new``).
WALK_DOT_PRECISION = "bf16x2"
#: Precision of the inline output products of the fused walk.
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
def fused_chunk_step_tm(b_S, w, v, k, q, p, gc, o, t0, n_t, i_h, i_hk, i_v, scale,
                        H: tl.constexpr, HQ: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BT: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
                        OUT_PREC: tl.constexpr):
    """One chunk of the fused walk with the ``"tm"`` intermediates for the ``[K, BV]`` state
    tile ``b_S`` (``w`` holds ``Tb``, ``p`` holds ``scale * Aqk``, ``[T, H, BT]``): writes
    the chunk's outputs and returns the state after it. The same arithmetic as one
    iteration of :func:`state_walk_kernel` with ``TM_FORM``; used by the intra-chunk
    kernel's walker programs (the one-launch path)."""
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
    p,              # [T, H, BT] scale * Aqk (FUSE_OUTPUT) or None
    k,              # [T, HQ, K] bf16
    w,              # [T, H, K] WY factor (bf16 or f32), [2, T, H, K] bf16 (hi, lo)
                    # (W_SPLIT), or Tb [T, H, BT] (TM_FORM)
    u,              # [T, H, V] WY factor (bf16 or f32), or the values v (TM_FORM)
    gc,             # [T, H] f32 per-chunk cumulative log decay
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    cu_seqlens,     # [N+1] int32/int64
    o,              # [T, H, V] bf16 out (FUSE_OUTPUT) or None
    h,              # [C, H, K, V] f32 out: state entering each chunk slot (STORE_H) or None
    v_new,          # [T, H, V] f32 out: residuals (STORE_VNEW) or None
    ht,             # [N, H, V, K] f32 out: final state, k-last (not SUMMARY) or None
    summ,           # [S, H, K, K+V] f32 segment transitions [M | X]: out (SUMMARY), in (CHAIN)
    q,              # [T, HQ, K] bf16 queries (TM_FORM and FUSE_OUTPUT) or None
    scale,          # output scale (TM_FORM and FUSE_OUTPUT)
    status,         # [1] int32 out: the guard's status bits (GUARD and HAS_STATUS) or None
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
    CHAIN: tl.constexpr,        # entering state from the earlier segments' [M | X] (summ)
    STORE_H: tl.constexpr,
    STORE_VNEW: tl.constexpr,
    FUSE_OUTPUT: tl.constexpr,
    SUMMARY: tl.constexpr,
    W_SPLIT: tl.constexpr,      # w is a bf16 (hi, lo) pair
    DOT_PREC: tl.constexpr,     # products with the state (see .dots)
    OUT_PREC: tl.constexpr,     # the inline output products (see .dots)
    CHAIN_PREC: tl.constexpr,   # M @ S of CHAIN
    LOOP_STAGES: tl.constexpr = None,   # software-pipeline stages of the chunk loop
                                        # (None: the launch's num_stages)
    PDL_WAIT: tl.constexpr = False,     # launched with PDL: wait before reading its inputs
    PDL_TRIGGER: tl.constexpr = False,  # a PDL-launched next kernel may be placed at once
    TM_FORM: tl.constexpr = False,      # the "tm" intermediates: w is Tb [T, H, BT], u is
                                        # the values v, p is scale * Aqk [T, H, BT]
    PIPE_SKIP_Q: tl.constexpr = False,  # TM_FORM + FUSE_OUTPUT: q is loaded outside the chunk
                                        # loop's pipeline (its stage buffers cost shared
                                        # memory; the load's latency is exposed)
    GUARD: tl.constexpr = False,        # FUSE_OUTPUT: outputs NaN if cu_seqlens is invalid
    HAS_STATUS: tl.constexpr = False,   # GUARD: store the status bits into status (.guard)
):
    # PDL (see .pdl): only h0 is read before grid_wait; every program waits before it
    # exits, so this kernel's completion implies the earlier kernels' completion
    grid_trigger(PDL_TRIGGER)
    i_u, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if GUARD:
        n_u = tl.num_programs(0)
        if guard_outputs(cu_status(cu_seqlens, N, T, 128), o, ht, status, T, N,
                         i_u + n_u * (i_h + H * i_v), n_u * H * tl.num_programs(2), H, V, K,
                         HAS_STATUS, PDL_WAIT) != 0:
            return
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    if SEG_T == 0:
        i_n = i_u
        bos, eos = seq_bounds(cu_seqlens, i_n, T)
        ubos = bos
        ueos = eos
    else:
        i_n, i_s, bos, eos, ubos, ueos, skip = segment_bounds(i_u, cu_seqlens, N, T, SEG_T,
                                                              SUMMARY)
        if skip:
            grid_wait(PDL_WAIT)
            return
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)   # columns: of S, or of [M | X] when SUMMARY
    o_bt = tl.arange(0, BT)
    # Addressing: int64 scalar base pointers per chunk + loop-invariant int32 tile
    # offsets (int64 offset tensors would cost two registers per element).
    o_kv = o_k[:, None] * V + o_v[None, :]                 # [K, BV] in a [K, V] state
    tl.static_assert(TM_FORM or not FUSE_OUTPUT)
    o_wk = o_bt[:, None] * (H * K) + o_k[None, :]          # [BT, K] rows of w
    o_qk = o_bt[:, None] * (HQ * K) + o_k[None, :]         # [BT, K] rows of k, q
    o_tt = o_bt[:, None] * (H * BT) + o_bt[None, :]        # [BT, BT] rows of Tb, Aqk (TM_FORM)

    if SUMMARY:
        b_S = tl.where(o_k[:, None] == o_v[None, :], 1.0, 0.0)   # [I | 0]
        m_u = o_v >= K
        o_tv = o_bt[:, None] * (H * V) + (o_v - K)[None, :]      # [BT, BV] rows of u (X part)
    else:
        m_u = o_v < V
        o_tv = o_bt[:, None] * (H * V) + o_v[None, :]            # [BT, BV] rows of u, o, v_new
        if CHAIN:
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
            b_rhs = b_u - tl.exp(b_gc)[:, None] * mm(b_k, b_S, DOT_PREC)
            b_tb = tl.load(w + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
            b_v = mm(b_tb, b_rhs, DOT_PREC)
        elif W_SPLIT:   # w stored as a bf16 (hi, lo) pair
            b_w = tl.load(w + (t0 * H + i_h) * K + o_wk, mask=m_t[:, None], other=0.0)
            p_wl = w + T.to(tl.int64) * (H * K) + (t0 * H + i_h) * K
            b_wl = tl.load(p_wl + o_wk, mask=m_t[:, None], other=0.0)
            b_v = b_u - mm_pair(b_w, b_wl, b_S)
        else:
            b_w = tl.load(w + (t0 * H + i_h) * K + o_wk, mask=m_t[:, None], other=0.0)
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
        if FUSE_OUTPUT:   # o = scale exp(gc) q S + Aqk v_new (scale in Aqk)
            if PIPE_SKIP_Q:
                b_q = _load_unpipelined(q + (t0 * HQ + i_hk) * K + o_qk, m_t, t0 < ueos)
            else:
                b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
            b_aq = tl.load(p + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
            b_o = (mm(b_q, b_S, OUT_PREC) * (scale * tl.exp(b_gc))[:, None]
                   + mm(b_aq, b_v, OUT_PREC))
            tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty),
                     mask=m_t[:, None])
        # S = exp(gc_last) S + k^T (exp(gc_last - gc) v_new): the decay goes on the
        # small [BT, BV] residual tile, k stays bf16
        b_vd = b_v * tl.exp(b_gl - b_gc)[:, None]
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


_WALK_LAUNCH = FastLaunch(state_walk_kernel)


def state_walk_fwd(k, w, u, gc, cu_seqlens, *, p=None, initial_state=None,
                   output=None, h=None, v_new=None, final_state=None, summary=None,
                   seg_t: int = 0, BV: int = 32, num_warps: int = 4, num_stages: int = 2,
                   dot_precision: str = WALK_DOT_PRECISION,
                   out_precision: str = OUTPUT_INLINE_PRECISION, chain: bool = False,
                   chain_precision: str = "tf32x3", pdl: bool = False, pdl_trigger: str = "",
                   loop_stages: Optional[int] = None, defer: bool = False, q=None,
                   scale: float = 1.0, tm_form: bool = False, pipe_skip: str = "",
                   guard: bool = False, status=None):
    """Launch :func:`state_walk_kernel` once; which tensors are given picks the flags.

    Grid: ``(units, HV, columns // BV)`` with units ``N`` (``seg_t == 0``) or
    ``T // seg_t + N`` segment slots; columns ``V``, or ``K + V`` when ``summary``
    is given (``chain``: ``summary`` is read, phase C without the combine kernel).
    ``tm_form``: the ``"tm"`` intermediates (:func:`.intra_chunk.intra_chunk_fwd` with
    ``tm_out``): ``w`` is ``Tb = Tm diag(beta)`` ``[T, HV, 64]``, ``u`` is the values ``v``
    ``[T, HV, V]``; with ``output`` (inline outputs, ``tm_form`` only) ``p`` is ``scale *
    Aqk`` ``[T, HV, 64]`` and ``q`` ``[T, HQ, K]`` and ``scale`` are needed: per chunk
    ``v_new = Tb (v - exp(gc) k S)``, ``o = scale exp(gc) q S + Aqk v_new``.
    ``dot_precision``: products with the state; ``out_precision``: the output products
    (:mod:`.dots`). ``pdl``: launch with programmatic dependent launch (the kernel before
    it must trigger, :mod:`.pdl`); ``pdl_trigger`` (``"start"`` or ``""``): whether each
    program lets a PDL-launched next kernel be placed at once. ``loop_stages``: pipeline
    stages of the chunk loop alone (None: ``num_stages``). ``pipe_skip="q"`` (with an
    output): ``q`` is loaded outside the chunk loop's software pipeline: its stage buffers
    are the difference between one and two programs per SM at width 64 with a 2-stage
    loop (131 KB of shared memory with every load pipelined, 99 KB without ``q``'s).
    ``guard`` (with ``output``): check ``cu_seqlens`` on the device and write NaN outputs if
    it is invalid (:mod:`.guard`), its bits into ``status`` (`[1]` int32) if given.
    Writes into the given output tensors; returns None, or with ``defer`` the bound
    launch (a zero-argument callable, :meth:`.launch.FastLaunch.bind`) without launching.
    """
    T, HQ, K = k.shape
    H, V = u.shape[1], u.shape[2]
    N = cu_seqlens.numel() - 1
    if tm_form and (w.dim() != 3 or w.shape[2] != BT):
        raise ValueError("tm_form needs w as Tb [T, HV, 64]")
    if output is not None and (not tm_form or q is None or p is None):
        raise ValueError("inline outputs need tm_form, p (scale * Aqk, [T, HV, 64]) and q")
    if guard and output is None:
        raise ValueError("guard goes with the inline outputs (output)")
    if pipe_skip not in ("", "q") or pdl_trigger not in ("", "start"):
        raise ValueError(f"pipe_skip must be '' or 'q' and pdl_trigger '' or 'start', got "
                         f"{pipe_skip!r}, {pdl_trigger!r}")
    is_summary = summary is not None and not chain
    units = N if seg_t == 0 else num_slots(T, N, seg_t)
    cols = K + V if is_summary else V
    grid = (units, H, cols // BV)
    pdl_opts = launch_options(pdl, k.device)
    go = _WALK_LAUNCH.bind(grid, (
        p, k, w, u, gc, initial_state, cu_seqlens, output, h, v_new, final_state,
        summary, q if tm_form else None, float(scale) if tm_form else 1.0, status, T, N), dict(
        H=H, G=H // HQ, K=K, V=V, BT=BT, BV=BV, SEG_T=seg_t,
        USE_H0=initial_state is not None, CHAIN=chain,
        STORE_H=h is not None, STORE_VNEW=v_new is not None, FUSE_OUTPUT=output is not None,
        SUMMARY=is_summary, TM_FORM=tm_form, PIPE_SKIP_Q=pipe_skip == "q" and output is not None,
        W_SPLIT=w.dim() == 4, DOT_PREC=dot_precision, OUT_PREC=out_precision,
        CHAIN_PREC=chain_precision, LOOP_STAGES=loop_stages, PDL_WAIT=bool(pdl_opts),
        PDL_TRIGGER=pdl_trigger == "start" and pdl_supported(k.device), GUARD=guard,
        HAS_STATUS=guard and status is not None, **pdl_opts,
        num_warps=num_warps, num_stages=num_stages))
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
