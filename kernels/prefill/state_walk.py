"""Stage 3: the inter-chunk state recurrence (and, fused, the outputs as it walks).

One program owns one ``(unit, value head, V tile)``; a unit is a whole
sequence, or with context parallelism one segment of ``SEG_T`` tokens of it.
The program keeps its ``[K, BV]`` fp32 state tile in registers and walks the
unit's chunks in order. The intra-chunk kernel stored ``Tb = Tm diag(beta)`` and
``scale * Aqk`` (``[T, H, 64]``, the ``"tm"`` intermediates); per chunk (rows past the
end are masked to 0)::

    v_new = Tb (v - exp(gc) k S)                        # residuals (beta included)
    o     = scale exp(gc) q S + Aqk v_new               # outputs (FUSE_OUTPUT)
    S     = exp(gc_last) S + (k * exp(gc_last - gc))^T @ v_new

with ``gc_last`` the cumulative log decay at the chunk's last row (``w = Tb exp(gc) k``
and ``u = Tb v`` of the WY form are never stored: the intra-chunk kernel writes a quarter
of their bytes). Flags pick what else happens:

* ``FUSE_OUTPUT``: compute the chunk's outputs inline (every walk but phase A);
* ``SUMMARY`` (context parallelism, phase A): walk the segment from
  ``[I | 0]`` over ``K + V`` columns, producing its affine transition
  ``S_end = M S_start + X`` (``M`` in the first ``K`` columns, ``X`` in the
  last ``V``), stored per segment slot; the last segment of a sequence is skipped;
* ``CHAIN`` (phase C): each program computes its
  segment's entering state itself, ``S <- M_j S + X_j`` over the sequence's
  earlier segments ``j`` (their ``[M | X]`` in ``summ``), from the initial
  state: redundant across segments but parallel, and one launch fewer.

The final state (k-last) is written by the program owning a sequence's last unit.
"""
from __future__ import annotations

from typing import Optional

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import (BT, bound_suffix_start, bound_total, num_slots, slot_of,  # noqa: E402
                          unit_bounds)
from .dots import mm  # noqa: E402
from .guard import walk_guard  # noqa: E402
from ..launch import FastLaunch, dtypes  # noqa: E402
from .pdl import grid_trigger, grid_wait, launch_options, pdl_supported  # noqa: E402

__all__ = ["state_walk_kernel", "state_walk_fwd", "walk_flags", "load_state_tile",
           "store_state_tile", "fused_chunk_step_tm", "l2_rnorm", "load_qk_rnorms",
           "check_qk_norms"]


@triton.jit
def l2_rnorm(x):
    """``1 / sqrt(sum(x^2) + 1e-6)`` per row of a ``[BT, K]`` tile, in f32 (FLA's
    ``l2norm``; ``use_qk_l2norm_in_kernel``): the factor that L2-normalises the row."""
    xf = x.to(tl.float32)
    return 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) + 1e-6)


@triton.jit
def load_qk_rnorms(qkn, t0, o_bt, m_t, i_hk, HQ: tl.constexpr):
    """``(rq, rk)`` ``[BT]`` f32 of the chunk's rows from ``t0`` (``QK_NORM``: the
    intra-chunk kernel's ``[T, HQ, 2]`` buffer of :func:`l2_rnorm` factors; rows past the
    end 0)."""
    p_n = qkn + (t0 * HQ + i_hk) * 2 + o_bt * (2 * HQ)
    return (tl.load(p_n, mask=m_t, other=0.0), tl.load(p_n + 1, mask=m_t, other=0.0))


def check_qk_norms(qk_norms, k) -> None:
    """A ``qk_norms`` buffer (or None) must be f32 ``[T, HQ, 2]`` for ``k`` ``[T, HQ, K]``."""
    if qk_norms is not None and (qk_norms.dtype != torch.float32 or tuple(
            qk_norms.shape) != (k.shape[0], k.shape[1], 2) or not qk_norms.is_contiguous()):
        raise ValueError(f"qk_norms must be a contiguous float32 [T, HQ, 2] = "
                         f"{(k.shape[0], k.shape[1], 2)}, got {qk_norms.dtype} "
                         f"{tuple(qk_norms.shape)}")


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
                        OUT_PREC: tl.constexpr, QK_NORM: tl.constexpr = False):
    """One chunk of the fused walk with the ``"tm"`` intermediates for the ``[K, BV]`` state
    tile ``b_S`` (``w`` holds ``Tb``, ``p`` holds ``scale * Aqk``, ``[T, H, BT]``): writes
    the chunk's outputs and returns the state after it. The same arithmetic as one
    iteration of :func:`state_walk_kernel`; used by the intra-chunk
    kernel's walker programs (the one-launch path). ``QK_NORM``: the rows of ``q`` and
    ``k`` L2-normalised, as factors (:func:`l2_rnorm` of the loaded tiles: a walker may
    run before the program that stores the norms buffer)."""
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
    # the row factors of k S, q S and k^T v_new (times the norms' with QK_NORM)
    b_ek = tl.exp(b_gc)
    b_eq = scale * tl.exp(b_gc)
    b_dk = tl.exp(b_gl - b_gc)
    if QK_NORM:
        b_rk = l2_rnorm(b_k)
        b_ek = b_ek * b_rk
        b_dk = b_dk * b_rk
    b_rhs = b_u - b_ek[:, None] * mm(b_k, b_S, DOT_PREC)
    b_tb = tl.load(w + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
    b_v = mm(b_tb, b_rhs, DOT_PREC)
    b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
    if QK_NORM:
        b_eq = b_eq * l2_rnorm(b_q)
    b_aq = tl.load(p + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
    b_o = mm(b_q, b_S, OUT_PREC) * b_eq[:, None] + mm(b_aq, b_v, OUT_PREC)
    tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty), mask=m_t[:, None])
    b_vd = b_v * b_dk[:, None]
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
    w,              # [T, H, BT] Tb = Tm diag(beta)
    u,              # [T, H, V] bf16 values
    gc,             # [T, H] f32 per-chunk cumulative log decay
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    cu_seqlens,     # [N+1] int32/int64
    o,              # [T, H, V] bf16 out (FUSE_OUTPUT) or None
    ht,             # [N, H, V, K] f32 out: final state, k-last (not SUMMARY) or None
    summ,           # [S, H, K, K+V] f32 segment transitions [M | X]: out (SUMMARY), in (CHAIN)
    q,              # [T, HQ, K] bf16 queries (FUSE_OUTPUT) or None
    scale,          # output scale (FUSE_OUTPUT)
    status,         # [1] int32 out: the guard's status bits (GUARD and HAS_STATUS) or None
    lb,             # [chunk slots, H] f32 log transition bound per chunk (TRUNC, SUMMARY)
    negl,           # [S, H] int32: 1 where a segment's M is negligible (TRUNC): out
                    # (SUMMARY), in (CHAIN)
    qkn,            # [T, HQ, 2] f32 L2-norm factors (rq, rk) of q, k rows (QK_NORM) or None
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
    FUSE_OUTPUT: tl.constexpr,
    SUMMARY: tl.constexpr,
    DOT_PREC: tl.constexpr,     # products with the state (see .dots)
    OUT_PREC: tl.constexpr,     # the inline output products (see .dots)
    CHAIN_PREC: tl.constexpr,   # M @ S of CHAIN
    LOG_EPS: tl.constexpr,      # TRUNC: negligible below exp(LOG_EPS) (PrefillConfig.log_eps)
    LOOP_STAGES: tl.constexpr = None,   # software-pipeline stages of the chunk loop
                                        # (None: the launch's num_stages)
    PDL_WAIT: tl.constexpr = False,     # launched with PDL: wait before reading its inputs
    PDL_TRIGGER: tl.constexpr = False,  # a PDL-launched next kernel may be placed at once
    PIPE_SKIP_Q: tl.constexpr = False,  # FUSE_OUTPUT: q is loaded outside the chunk
                                        # loop's pipeline (its stage buffers cost shared
                                        # memory; the load's latency is exposed)
    GUARD: tl.constexpr = False,        # FUSE_OUTPUT: outputs NaN if cu_seqlens is invalid
    HAS_STATUS: tl.constexpr = False,   # GUARD: store the status bits into status (.guard)
    TRUNC: tl.constexpr = False,        # skip what the decay makes negligible (see below)
    QK_NORM: tl.constexpr = False,      # q, k rows L2-normalised: factors from qkn
):
    # PDL (see .pdl): only h0 is read before grid_wait; every program waits before it
    # exits, so this kernel's completion implies the earlier kernels' completion
    grid_trigger(PDL_TRIGGER)
    i_u, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if walk_guard(cu_seqlens, o, ht, status, T, N, i_u, i_h, i_v, H, V, K, GUARD, HAS_STATUS,
                  PDL_WAIT):
        return
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    i_n, i_s, bos, eos, ubos, ueos, skip = unit_bounds(i_u, cu_seqlens, N, T, SEG_T, SUMMARY,
                                                        None, False)
    if skip:
        grid_wait(PDL_WAIT)
        return
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)   # columns: of S, or of [M | X] when SUMMARY
    o_bt = tl.arange(0, BT)
    # Addressing: int64 scalar base pointers per chunk + loop-invariant int32 tile
    # offsets (int64 offset tensors would cost two registers per element).
    o_qk = o_bt[:, None] * (HQ * K) + o_k[None, :]         # [BT, K] rows of k, q
    o_tt = o_bt[:, None] * (H * BT) + o_bt[None, :]        # [BT, BT] rows of Tb, Aqk

    if SUMMARY:
        b_S = tl.where(o_k[:, None] == o_v[None, :], 1.0, 0.0)   # [I | 0]
        m_u = o_v >= K
        o_tv = o_bt[:, None] * (H * V) + (o_v - K)[None, :]      # [BT, BV] rows of u (X part)
    else:
        m_u = o_v < V
        o_tv = o_bt[:, None] * (H * V) + o_v[None, :]            # [BT, BV] rows of u, o
        if CHAIN:
            # S_start(j+1) = M_j S_start(j) + X_j over the sequence's earlier segments
            if USE_H0:
                b_S = load_state_tile(h0, i_n, i_h, i_v, H, K, V, BV)
            else:
                b_S = tl.zeros([K, BV], dtype=tl.float32)
            grid_wait(PDL_WAIT)
            slot0 = (bos // SEG_T).to(tl.int32) + i_n
            j0 = i_s * 0
            if TRUNC:   # start at the last earlier segment whose M is negligible
                for j in range(0, i_s):
                    j0 = tl.where(tl.load(negl + (slot0 + j) * H + i_h) != 0, j, j0)
            for j in range(j0, i_s):
                p_m = summ + ((slot0 + j) * H + i_h).to(tl.int64) * (K * (K + V))
                full = j >= 0
                if TRUNC:   # a negligible M was not stored: zeros, so S = X_j
                    full = tl.load(negl + (slot0 + j) * H + i_h) == 0
                b_M = tl.load(p_m + o_k[:, None] * (K + V) + o_k[None, :],
                              mask=full & (o_k[:, None] >= 0), other=0.0)
                b_X = tl.load(p_m + o_k[:, None] * (K + V) + K + o_v[None, :])
                b_S = mm(b_M, b_S, CHAIN_PREC) + b_X
        elif USE_H0:
            b_S = load_state_tile(h0, i_n, i_h, i_v, H, K, V, BV)
        else:
            b_S = tl.zeros([K, BV], dtype=tl.float32)

    grid_wait(PDL_WAIT)   # (a no-op when already waited above)
    n_ch = tl.cdiv(ueos - ubos, BT)
    c_start = n_ch * 0
    if TRUNC and SUMMARY:   # as the long path's phase A (.state_walk_t, TRUNC)
        p_lb = lb + slot_of(i_n, i_s * (SEG_T // BT), bos, BT) * H + i_h
        if BV > K:          # a tile with columns of M and of X: walked whole, M kept
            if i_v == 0:
                tl.store(negl + i_u * H + i_h, 0)
        elif i_v * BV < K:  # columns of M: negligible iff the segment's bounds sum to LOG_EPS
            small = bound_total(p_lb, n_ch, H) <= LOG_EPS
            tl.store(negl + i_u * H + i_h, small.to(tl.int32))
            if small:
                return
        else:               # columns of X: from the last chunk whose bound still counts
            c_start = bound_suffix_start(p_lb, n_ch, H, LOG_EPS)
    for i_c in tl.range(c_start, n_ch, num_stages=LOOP_STAGES):
        t0 = ubos + i_c * BT                       # first token of the chunk (int64)
        m_t = o_bt < (ueos - t0)
        b_u = tl.load(u + (t0 * H + i_h) * V + o_tv, mask=m_t[:, None] & m_u[None, :],
                      other=0.0).to(tl.float32)
        # v_new = Tb (v - exp(gc) k S): u holds the values, w holds Tb = Tm diag(beta)
        b_gc = tl.load(gc + t0 * H + i_h + o_bt * H, mask=m_t, other=0.0)
        b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
        b_ek = tl.exp(b_gc)   # the row factor of k S (and of q S, k^T v_new below)
        if QK_NORM:   # k_t / |k_t|, q_t / |q_t|: the norms' factors on the same rows
            b_rq, b_rk = load_qk_rnorms(qkn, t0, o_bt, m_t, i_hk, HQ)
            b_ek = b_ek * b_rk
        b_rhs = b_u - b_ek[:, None] * mm(b_k, b_S, DOT_PREC)
        b_tb = tl.load(w + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
        b_v = mm(b_tb, b_rhs, DOT_PREC)
        b_gl = tl.load(gc + (tl.minimum(t0 + BT, ueos) - 1) * H + i_h)
        if FUSE_OUTPUT:   # o = scale exp(gc) q S + Aqk v_new (scale in Aqk)
            if PIPE_SKIP_Q:
                b_q = _load_unpipelined(q + (t0 * HQ + i_hk) * K + o_qk, m_t, t0 < ueos)
            else:
                b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
            b_aq = tl.load(p + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
            b_eq = scale * tl.exp(b_gc)
            if QK_NORM:
                b_eq = b_eq * b_rq
            b_o = (mm(b_q, b_S, OUT_PREC) * b_eq[:, None]
                   + mm(b_aq, b_v, OUT_PREC))
            tl.store(o + (t0 * H + i_h) * V + o_tv, b_o.to(o.dtype.element_ty),
                     mask=m_t[:, None])
        # S = exp(gc_last) S + k^T (exp(gc_last - gc) v_new): the decay goes on the
        # small [BT, BV] residual tile, k stays bf16
        b_dk = tl.exp(b_gl - b_gc)
        if QK_NORM:
            b_dk = b_dk * b_rk
        b_vd = b_v * b_dk[:, None]
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


def walk_flags(*, h0, output, summary, chain: bool, guard: bool, status, negligible,
               pipe_skip: str) -> dict:
    """The flags of :func:`state_walk_kernel` that follow from which optional tensors a
    launch gives (the one place they are derived): ``USE_H0`` (an initial state),
    ``FUSE_OUTPUT`` (an output), ``CHAIN`` (phase C, reading ``summary``), ``SUMMARY``
    (phase A: ``summary`` written), ``PIPE_SKIP_Q`` (``pipe_skip == "q"`` with an output),
    ``GUARD`` and ``HAS_STATUS`` (the guard, and a ``status`` tensor for its bits),
    ``TRUNC`` (the ``negligible`` flags: written by phase A, read by phase C)."""
    return dict(USE_H0=h0 is not None, CHAIN=chain, FUSE_OUTPUT=output is not None,
                SUMMARY=summary is not None and not chain,
                PIPE_SKIP_Q=pipe_skip == "q" and output is not None, GUARD=guard,
                HAS_STATUS=guard and status is not None, TRUNC=negligible is not None)


def state_walk_fwd(k, tb, v, gc, cu_seqlens, *, p=None, initial_state=None, output=None,
                   final_state=None, summary=None, seg_t: int = 0, BV: int = 32,
                   num_warps: int = 4, num_stages: int = 2, dot_precision: str = "bf16",
                   out_precision: str = "bf16", chain: bool = False,
                   chain_precision: str = "tf32x3", pdl: bool = False, pdl_trigger: str = "",
                   loop_stages: Optional[int] = None, defer: bool = False, q=None,
                   scale: float = 1.0, pipe_skip: str = "", guard: bool = False, status=None,
                   log_bound=None, negligible=None, log_eps: Optional[float] = None,
                   qk_norms=None):
    """Launch :func:`state_walk_kernel` once; which tensors are given picks the flags.

    ``tb`` is ``Tb = Tm diag(beta)`` ``[T, HV, 64]`` (:func:`.intra_chunk.intra_chunk_fwd`),
    ``v`` the values ``[T, HV, V]``. Grid: ``(units, HV, columns // BV)`` with units ``N``
    (``seg_t == 0``) or ``T // seg_t + N`` segment slots; columns ``V``, or ``K + V`` when
    ``summary`` is given (phase A; with ``chain`` it is read instead: phase C). With
    ``output`` (inline outputs) ``p`` is ``scale * Aqk`` ``[T, HV, 64]`` and ``q`` ``[T, HQ,
    K]`` and ``scale`` are needed. ``dot_precision``: products with the state;
    ``out_precision``: the output products (:mod:`.dots`). ``pdl``: launch with
    programmatic dependent launch (the kernel before it must trigger, :mod:`.pdl`);
    ``pdl_trigger`` (``"start"`` or ``""``): whether each program lets a PDL-launched next
    kernel be placed at once. ``loop_stages``: pipeline stages of the chunk loop alone
    (None: ``num_stages``). ``pipe_skip="q"`` (with an output): ``q`` is loaded outside
    the chunk loop's software pipeline: its stage buffers are the difference between one
    and two programs per SM at width 64 with a 2-stage loop (131 KB of shared memory with
    every load pipelined, 99 KB without ``q``'s). ``guard`` (with ``output``): check
    ``cu_seqlens`` on the device and write NaN outputs if it is invalid (:mod:`.guard`),
    its bits into ``status`` (`[1]` int32) if given. Writes into the given output
    tensors; returns None, or with ``defer`` the bound launch (a zero-argument callable,
    :meth:`kernels.launch.FastLaunch.bind_keyed`) without launching. ``negligible``
    (`[S, HV]` int32) with ``log_bound`` (the intra-chunk kernel's, phase A: written) or
    ``chain`` (phase C: read): skip what the gates' decay has made negligible (``TRUNC``) below
    ``exp(log_eps)`` (:attr:`.config.PrefillConfig.log_eps`, required with it). The flags
    that follow from the tensors given: :func:`walk_flags`. ``qk_norms``: `[T, HQ, 2]` f32
    (the intra-chunk kernel's ``qk_norms``): the rows of ``q`` and ``k`` enter
    L2-normalised (``QK_NORM``), else as given.
    """
    T, HQ, K = k.shape
    check_qk_norms(qk_norms, k)
    H, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    if tb.dim() != 3 or tb.shape[2] != BT:
        raise ValueError("tb must be Tb [T, HV, 64]")
    if output is not None and (q is None or p is None):
        raise ValueError("inline outputs need p (scale * Aqk, [T, HV, 64]) and q")
    if guard and output is None:
        raise ValueError("guard goes with the inline outputs (output)")
    if pipe_skip not in ("", "q") or pdl_trigger not in ("", "start"):
        raise ValueError(f"pipe_skip must be '' or 'q' and pdl_trigger '' or 'start', got "
                         f"{pipe_skip!r}, {pdl_trigger!r}")
    is_summary = summary is not None and not chain
    if negligible is not None and not ((is_summary and log_bound is not None) or chain):
        raise ValueError("negligible goes with log_bound in phase A or with chain (phase C)")
    if (negligible is not None) != (log_eps is not None):
        raise ValueError("log_eps (the negligible threshold) goes with negligible")
    units = N if seg_t == 0 else num_slots(T, N, seg_t)
    cols = K + V if is_summary else V
    grid = (units, H, cols // BV)
    args = (p, k, tb, v, gc, initial_state, cu_seqlens, output, final_state, summary, q,
            float(scale), status, log_bound, negligible, qk_norms, T, N)
    # the launch key: what the keyword arguments follow from, and the tensors' dtypes
    key = (H, HQ, K, V, seg_t, BV, num_warps, num_stages, dot_precision, out_precision,
           chain, chain_precision, pdl, pdl_trigger, loop_stages, pipe_skip, guard, log_eps,
           dtypes(p, k, tb, v, gc, initial_state, cu_seqlens, output, final_state, summary,
                  q, status, log_bound, negligible, qk_norms))

    def kwargs():
        pdl_opts = launch_options(pdl, k.device)
        return dict(
            H=H, G=H // HQ, K=K, V=V, BT=BT, BV=BV, SEG_T=seg_t,
            DOT_PREC=dot_precision, OUT_PREC=out_precision, CHAIN_PREC=chain_precision,
            LOG_EPS=log_eps, LOOP_STAGES=loop_stages, PDL_WAIT=bool(pdl_opts),
            PDL_TRIGGER=pdl_trigger == "start" and pdl_supported(k.device),
            **walk_flags(h0=initial_state, output=output, summary=summary, chain=chain,
                         guard=guard, status=status, negligible=negligible,
                         pipe_skip=pipe_skip),
            QK_NORM=qk_norms is not None,
            **pdl_opts, num_warps=num_warps, num_stages=num_stages)

    go = _WALK_LAUNCH.bind_keyed(key, grid, args, kwargs)
    if defer:
        return go
    go()
