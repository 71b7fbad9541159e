"""Stage 3, transposed: the walk holding the state as ``S^T``.

The same recurrence and outputs as :func:`.state_walk.state_walk_kernel` with
``FUSE_OUTPUT``, written for the
tensor cores' operand rules. Hopper's ``wgmma`` reads its right operand from
shared memory and may take its left one from registers; its row count per
warpgroup is 64. The untransposed walk multiplies loaded tiles by computed
ones (``k @ S``, ``Tb @ rhs``, ``Aqk @ v_new``, ``k^T @ v_new``), so every
computed operand is staged through shared memory behind a barrier, and with
8 warps its 64-row products are computed twice (one copy per warpgroup).
Transposed, every product is ``computed @ loaded^T`` with the state tile's
``BV`` columns as rows::

    (k S)^T     = S^T k^T                  [BV, K] x [K, BT]
    v_new^T     = (v - exp(gc) k S)^T Tb^T  [BV, BT] x [BT, BT]
    o^T         = scale exp(gc) S^T q^T + v_new^T Aqk^T
    S'^T        = exp(gc_last) S^T + (exp(gc_last - gc) v_new)^T k

so the computed operands stay in registers, the loaded tiles (``k``, ``q``,
``Tb``, ``Aqk``) are the shared-memory operands -- what the chunk loop's
software pipeline stages anyway -- and at ``BV = 128`` with 8 warps each
warpgroup owns 64 state columns while both share one load of those tiles
(half the bytes per state column of two ``BV = 64`` programs). The state is
k-last in memory (``[V, K]``, as the contest layout), so ``S^T`` tiles are
contiguous rows. Roundings: the same bf16 products as the untransposed walk
with ``"bf16"`` precisions (``S``, ``rhs``, ``v_new``, the decayed ``v_new``
rounded to bf16 for one product each); in phase C (``FROM_S0``) the last ``TAIL``
chunks of each sequence's last unit form ``rhs^T Tb^T`` and the state update in
``"bf16x2"`` (the split tail, :func:`.config.tail_split_rule`: those chunks carry the
final state's bf16 error), a second chunk loop after the first.
"""
from __future__ import annotations

from .. import interpret

interpret.install()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import BT, bound_suffix_start, bound_total, slot_of, unit_bounds  # noqa: E402
from .dots import mm  # noqa: E402
from .guard import walk_guard  # noqa: E402
from .state_walk import check_qk_norms, load_qk_rnorms  # noqa: E402
from ..launch import FastLaunch, dtypes  # noqa: E402
from .pdl import grid_wait, launch_options  # noqa: E402

__all__ = ["state_walk_t_kernel", "state_walk_t_fwd", "walk_t_flags"]


@triton.jit
def _chunk_step(q, k, v, tb, aq, gc, o, b_St, t0, ueos, i_h, i_hk, o_bt, o_qk, o_tt, o_vt,
                m_v, scale, H: tl.constexpr, HQ: tl.constexpr, K: tl.constexpr,
                BT: tl.constexpr, V: tl.constexpr, DOT_PREC: tl.constexpr,
                OUT_PREC: tl.constexpr, SUMMARY: tl.constexpr, SPLIT_TAIL: tl.constexpr,
                qkn, QK_NORM: tl.constexpr):
    """One chunk (first token ``t0``) of :func:`state_walk_t_kernel`'s walk: stores its
    outputs (not ``SUMMARY``) and returns the new ``S^T``. ``SPLIT_TAIL``: a chunk of the
    split tail (:data:`.config.TAIL_SPLIT_CHUNKS`): ``rhs^T Tb^T`` and the state update in
    ``"bf16x2"``, the update accumulating onto the decayed state, then the ``hi``, then the
    ``lo`` product (:func:`.dots.mm`; the Gluon phase C issues its ``wgmma`` in that
    order). ``QK_NORM``: the rows of ``q`` and ``k`` L2-normalised by the factors in ``qkn``
    (on the columns of ``(k S)^T``, ``(q S)^T`` and of the decayed ``v_new^T``)."""
    m_t = o_bt < (ueos - t0)
    b_gc = tl.load(gc + t0 * H + i_h + o_bt * H, mask=m_t, other=0.0)
    b_gl = tl.load(gc + (tl.minimum(t0 + BT, ueos) - 1) * H + i_h)
    b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
    b_vt = tl.load(v + (t0 * H + i_h) * V + o_vt, mask=m_t[None, :] & m_v, other=0.0)
    b_ek = tl.exp(b_gc)   # the column factor of (k S)^T (and of (q S)^T, the update below)
    b_dk = tl.exp(b_gl - b_gc)
    if QK_NORM:
        b_rq, b_rk = load_qk_rnorms(qkn, t0, o_bt, m_t, i_hk, HQ)
        b_ek = b_ek * b_rk
        b_dk = b_dk * b_rk
    # rhs^T = v^T - (k S)^T exp(gc): rows past the end are 0 (k, v masked)
    b_rt = b_vt.to(tl.float32) - mm(b_St, tl.trans(b_k), DOT_PREC) * b_ek[None, :]
    b_tb = tl.load(tb + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
    if SPLIT_TAIL:
        b_nt = mm(b_rt, tl.trans(b_tb), "bf16x2")
    else:
        b_nt = mm(b_rt, tl.trans(b_tb), DOT_PREC)          # v_new^T = rhs^T Tb^T
    if not SUMMARY:
        b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_t[:, None], other=0.0)
        b_aq = tl.load(aq + (t0 * H + i_h) * BT + o_tt, mask=m_t[:, None], other=0.0)
        b_eq = scale * tl.exp(b_gc)
        if QK_NORM:
            b_eq = b_eq * b_rq
        b_ot = (mm(b_St, tl.trans(b_q), OUT_PREC) * b_eq[None, :]
                + mm(b_nt, tl.trans(b_aq), OUT_PREC))
        tl.store(o + (t0 * H + i_h) * V + o_vt, b_ot.to(o.dtype.element_ty),
                 mask=m_t[None, :])
    # S'^T = exp(gc_last) S^T + (exp(gc_last - gc) v_new)^T k
    if SPLIT_TAIL:
        b_St = mm(b_nt * b_dk[None, :], b_k, "bf16x2", b_St * tl.exp(b_gl))
    else:
        b_St = b_St * tl.exp(b_gl) + mm(b_nt * b_dk[None, :], b_k, DOT_PREC)
    return b_St


@triton.jit(do_not_specialize=["T", "N"])
def state_walk_t_kernel(
    q,              # [T, HQ, K] bf16
    k,              # [T, HQ, K] bf16
    v,              # [T, H, V] bf16
    tb,             # [T, H, BT] bf16: Tb = Tm diag(beta) (the intra-chunk kernel's, "tm")
    aq,             # [T, H, BT] bf16: scale * Aqk
    gc,             # [T, H] f32 per-chunk cumulative log decay
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    s0,             # [S, H, V, K] f32 entering state per segment slot (FROM_S0) or None
    summ,           # [S, H, K + V, K] f32 out (SUMMARY): [M^T ; X^T] per segment slot
    cu_seqlens,     # [N+1] int32/int64
    o,              # [T, H, V] bf16 out (not SUMMARY)
    ht,             # [N, H, V, K] f32 out: final state, k-last (not SUMMARY)
    status,         # [1] int32 out: the guard's status bits (GUARD and HAS_STATUS) or None
    lb,             # [chunk slots, H] f32 log transition bound per chunk (TRUNC) or None
    negl,           # [S, H] int32 out: 1 where the segment's M is negligible (TRUNC) or None
    seg_mult,       # [N] int32: slots per unit of each sequence (SPLIT) or None
    qkn,            # [T, HQ, 2] f32 L2-norm factors (rq, rk) of q, k rows (QK_NORM) or None
    scale,          # output scale
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,            # value heads
    G: tl.constexpr,            # value heads per q/k head
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,           # chunk size
    BV: tl.constexpr,           # state columns per program (rows of S^T)
    USE_H0: tl.constexpr,
    DOT_PREC: tl.constexpr,     # products with the state and the residuals (.dots)
    OUT_PREC: tl.constexpr,     # the outputs' products
    LOG_EPS: tl.constexpr,      # TRUNC: negligible below exp(LOG_EPS) (PrefillConfig.log_eps)
    SEG_T: tl.constexpr = 0,    # tokens per segment (context parallelism); 0: whole sequences
    SUMMARY: tl.constexpr = False,   # CP phase A: the segment's transition, no outputs
    FROM_S0: tl.constexpr = False,   # CP phase C: start from the segment's entering state
    LOOP_STAGES: tl.constexpr = None,   # software-pipeline stages of the chunk loop
    PDL_WAIT: tl.constexpr = False,     # launched with PDL: wait before reading its inputs
    GUARD: tl.constexpr = False,        # outputs NaN if cu_seqlens is invalid (.guard)
    HAS_STATUS: tl.constexpr = False,   # GUARD: store the status bits into status
    TRUNC: tl.constexpr = False,        # SUMMARY: skip what the decay makes negligible
    SPLIT: tl.constexpr = False,        # units of seg_mult[n] slots (set on the device)
    SUMMARY_LAST: tl.constexpr = False,  # SUMMARY: each sequence's last segment too
    TAIL: tl.constexpr = 0,             # FROM_S0: split tail's chunks (.config.tail_split_rule)
    QK_NORM: tl.constexpr = False,      # q, k rows L2-normalised: factors from qkn
):
    """One program per ``(sequence or segment slot, value head, BV state columns)``: walks
    its chunks from ``h0`` / ``s0`` (or zeros) and writes every output row and the final
    state; with ``SUMMARY`` it walks ``[I | 0]`` instead (rows ``j < K`` of ``S^T`` start as
    the identity and see no values, rows ``K + v`` start at zero and see ``v``) and stores
    ``[M^T ; X^T]`` with ``S_end = M S_start + X``.

    With ``TRUNC`` (phase A of the long path) the chunks' log transition bounds ``lb``
    decide what the decay has made negligible, i.e. scaled by at most ``exp(LOG_EPS)`` on
    its way to the segment's end (2e-9 at -20, below the float32 rounding of the state):
    ``M`` when the bounds of all the segment's chunks sum to ``LOG_EPS`` (then it is not
    stored, ``negl = 1``, and phase B takes ``S_end = X``); the ``X`` rows walk from zero
    at the last chunk ``j`` whose bounds summed from the segment's end reach ``LOG_EPS``
    (whatever entered before ``j`` is negligible), else from the segment's start.

    ``SUMMARY_LAST`` summarises each sequence's last segment too (phase B needs no
    transition there; the ranks of :mod:`.multi_gpu` exchange the composition of all of a
    piece's segments)."""
    i_u, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if walk_guard(cu_seqlens, o, ht, status, T, N, i_u, i_h, i_v, H, V, K, GUARD, HAS_STATUS,
                  PDL_WAIT):
        return
    if SPLIT:   # seg_mult comes from the previous kernel
        grid_wait(PDL_WAIT)
    i_n, i_s, bos, eos, ubos, ueos, skip = unit_bounds(i_u, cu_seqlens, N, T, SEG_T,
                                                        SUMMARY and not SUMMARY_LAST,
                                                        seg_mult, SPLIT)
    if skip:
        grid_wait(PDL_WAIT)
        return
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)       # rows of S^T (of [M^T ; X^T] with SUMMARY)
    o_bt = tl.arange(0, BT)
    o_vk = o_v[:, None] * K + o_k[None, :]                 # [BV, K] of a k-last state
    p_state = (i_n * H + i_h).to(tl.int64) * (V * K)
    if SUMMARY:
        b_St = tl.where(o_v[:, None] == o_k[None, :], 1.0, 0.0)   # [I ; 0]
        o_vt = o_bt[None, :] * (H * V) + (o_v - K)[:, None]        # [BV, BT]: v^T (X rows)
        m_v = i_v * BV >= K                                         # the X rows see values
    else:
        o_vt = o_bt[None, :] * (H * V) + o_v[:, None]              # [BV, BT]: v^T, o^T
        m_v = i_v >= 0
        if FROM_S0:
            grid_wait(PDL_WAIT)
            b_St = tl.load(s0 + (i_u * H + i_h).to(tl.int64) * (V * K) + o_vk)
        elif USE_H0:   # an input of the call: read before the PDL wait
            b_St = tl.load(h0 + p_state + o_vk)
        else:
            b_St = tl.zeros([BV, K], dtype=tl.float32)
    o_qk = o_bt[:, None] * (HQ * K) + o_k[None, :]         # [BT, K] rows of q, k
    o_tt = o_bt[:, None] * (H * BT) + o_bt[None, :]        # [BT, BT] rows of Tb, Aqk
    grid_wait(PDL_WAIT)
    n_c = tl.cdiv(ueos - ubos, BT)
    c_start = n_c * 0
    if TRUNC:
        p_lb = lb + slot_of(i_n, i_s * (SEG_T // BT), bos, BT) * H + i_h
        if i_v * BV < K:
            # rows of M: negligible iff the bounds of all the segment's chunks sum to LOG_EPS
            small = bound_total(p_lb, n_c, H) <= LOG_EPS
            tl.store(negl + i_u * H + i_h, small.to(tl.int32))
            if small:
                return
        else:
            # rows of X: from the last chunk whose bound still counts (0 unless it fell)
            c_start = bound_suffix_start(p_lb, n_c, H, LOG_EPS)
    n_main = n_c
    if TAIL > 0:   # (FROM_S0) the unit that writes the final state splits its last chunks
        if ueos >= eos:
            n_main = tl.maximum(n_c - TAIL, c_start)
    for i_c in tl.range(c_start, n_main, num_stages=LOOP_STAGES):
        b_St = _chunk_step(q, k, v, tb, aq, gc, o, b_St, ubos + i_c * BT, ueos, i_h, i_hk,
                           o_bt, o_qk, o_tt, o_vt, m_v, scale, H, HQ, K, BT, V,
                           DOT_PREC, OUT_PREC, SUMMARY, False, qkn, QK_NORM)
    if TAIL > 0:
        for i_c in tl.range(n_main, n_c, num_stages=LOOP_STAGES):
            b_St = _chunk_step(q, k, v, tb, aq, gc, o, b_St, ubos + i_c * BT, ueos, i_h,
                               i_hk, o_bt, o_qk, o_tt, o_vt, m_v, scale, H, HQ, K, BT,
                               V, DOT_PREC, OUT_PREC, SUMMARY, True, qkn, QK_NORM)
    if SUMMARY:
        tl.store(summ + (i_u * H + i_h).to(tl.int64) * ((K + V) * K) + o_vk, b_St)
    elif ueos >= eos:   # the sequence's last segment (always, without CP)
        tl.store(ht + p_state + o_vk, b_St)


_WALK_T_LAUNCH = FastLaunch(state_walk_t_kernel)


def walk_t_flags(*, h0, summary, s0, guard: bool, status, log_bound, seg_mult,
                 summary_last: bool) -> dict:
    """The flags of :func:`state_walk_t_kernel` that follow from which optional tensors a
    launch gives (the one place they are derived): ``USE_H0`` (an initial state),
    ``SUMMARY`` (phase A: ``summary`` written), ``FROM_S0`` (phase C: entering states),
    ``GUARD`` and ``HAS_STATUS`` (the guard, and a ``status`` tensor for its bits),
    ``TRUNC`` (the chunks' ``log_bound``), ``SPLIT`` (``seg_mult``: the device's split),
    ``SUMMARY_LAST``."""
    return dict(USE_H0=h0 is not None, SUMMARY=summary is not None, FROM_S0=s0 is not None,
                GUARD=guard, HAS_STATUS=guard and status is not None,
                TRUNC=log_bound is not None, SPLIT=seg_mult is not None,
                SUMMARY_LAST=summary_last)


def state_walk_t_fwd(q, k, v, tb, aq, gc, cu_seqlens, *, initial_state=None, output=None,
                     final_state=None, scale: float = 1.0, BV: int = 128, num_warps: int = 8,
                     num_stages: int = 2, loop_stages=None, dot_precision: str = "bf16",
                     out_precision: str = "bf16", pdl: bool = False, seg_t: int = 0,
                     summary=None, s0=None, guard: bool = False, status=None,
                     log_bound=None, negligible=None, seg_mult=None, summary_last: bool = False,
                     log_eps=None, tail: int = 0, defer: bool = False, qk_norms=None):
    """Launch :func:`state_walk_t_kernel` once.

    Args:
        q, k: `[T, HQ, K]` bf16. v: `[T, HV, V]` bf16.
        tb, aq: `[T, HV, 64]` ``Tb`` and ``scale * Aqk``
            (:func:`.intra_chunk.intra_chunk_fwd`). gc: `[T, HV]` f32.
        cu_seqlens: `[N+1]` int32/int64.
        initial_state: `[N, HV, V, K]` f32 k-last, or None (zeros).
        output: `[T, HV, V]` bf16, written. final_state: `[N, HV, V, K]` f32, written.
        BV: state columns per program (rows of ``S^T``): 128 with 8 warps gives each
            warpgroup 64 rows; 64 with 4 warps is one warpgroup.
        pdl: launched with programmatic dependent launch after the intra-chunk kernel.
        seg_t: context parallelism (:mod:`.context_parallel`): one program per segment slot of
            ``seg_t`` tokens (``T // seg_t + N`` slots) instead of per sequence, with either
        summary: `[S, HV, K + V, K]` f32, written (phase A: ``[M^T ; X^T]`` per slot; no
            outputs), or
        s0: `[S, HV, V, K]` f32 entering state per slot (phase C: outputs; each sequence's
            last segment writes ``final_state``).
        tail: with ``s0``, the last ``tail`` chunks of each sequence's last unit form
            ``rhs^T Tb^T`` and the state update in ``"bf16x2"`` (:func:`.config.tail_split_rule`).
        seg_mult: `[N]` int32, with ``seg_t``: each sequence's units span that many slots
            of ``seg_t`` tokens (:func:`.context_parallel.segment_split_fwd`).
        log_bound, negligible: with ``summary``, skip what the decay makes negligible
            (``TRUNC`` in :func:`state_walk_t_kernel`): `[T // 64 + N, HV]` f32 from
            :func:`.intra_chunk.intra_chunk_fwd` and `[S, HV]` int32, written.
        log_eps: with them, the negligible threshold (a natural log,
            :attr:`.config.PrefillConfig.log_eps`).
        summary_last: with ``summary``, also each sequence's last segment (skipped by
            default: phase B does not need it; :mod:`.multi_gpu` does).
        guard: check ``cu_seqlens`` on the device and write NaN outputs if it is invalid
            (:mod:`.guard`; not with ``summary``); ``status``: `[1]` int32 for its bits.
        qk_norms: `[T, HQ, 2]` f32, the intra-chunk kernel's L2-norm factors of the rows
            of ``q`` and ``k``: they enter normalised (``QK_NORM``); None: as given.
    Returns None, or with ``defer`` the bound launch without launching it. The flags that
    follow from the tensors given: :func:`walk_t_flags`.
    """
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    check_qk_norms(qk_norms, k)
    if V % BV or K % BV or BV < 16:
        raise ValueError(f"BV must divide V={V} and K={K} and be >= 16, got {BV}")
    if (summary is not None or s0 is not None) != bool(seg_t):
        raise ValueError("seg_t goes with exactly one of summary (phase A) and s0 (phase C)")
    if (log_bound is not None or negligible is not None) and (
            summary is None or log_bound is None or negligible is None):
        raise ValueError("log_bound and negligible go together, with summary (phase A)")
    if (log_bound is not None) != (log_eps is not None):
        raise ValueError("log_eps (the negligible threshold) goes with log_bound")
    if guard and summary is not None:
        raise ValueError("guard goes with the outputs, not with summary (phase A)")
    if summary_last and summary is None:
        raise ValueError("summary_last goes with summary (phase A)")
    if not isinstance(tail, int) or tail < 0 or (tail and s0 is None):
        raise ValueError(f"tail must be an int >= 0, nonzero only with s0 (phase C), got {tail!r}")
    units = (int(T) // seg_t + N) if seg_t else N
    rows = K + V if summary is not None else V
    args = (q, k, v, tb, aq, gc, initial_state, s0, summary, cu_seqlens, output, final_state,
            status, log_bound, negligible, seg_mult, qk_norms, float(scale), T, N)
    # the launch key: what the keyword arguments follow from, and the tensors' dtypes
    key = (H, HQ, K, V, BV, num_warps, num_stages, loop_stages, dot_precision, out_precision,
           pdl, int(seg_t), guard, summary_last, log_eps, tail,
           dtypes(q, k, v, tb, aq, gc, initial_state, s0, summary, cu_seqlens, output,
                  final_state, status, log_bound, negligible, seg_mult, qk_norms))

    def kwargs():
        pdl_opts = launch_options(pdl, k.device)
        return dict(
            H=H, G=H // HQ, K=K, V=V, BT=BT, BV=BV, DOT_PREC=dot_precision,
            OUT_PREC=out_precision, LOG_EPS=log_eps, SEG_T=int(seg_t), LOOP_STAGES=loop_stages,
            TAIL=tail, PDL_WAIT=bool(pdl_opts), QK_NORM=qk_norms is not None,
            **walk_t_flags(h0=initial_state, summary=summary, s0=s0, guard=guard,
                           status=status, log_bound=log_bound, seg_mult=seg_mult,
                           summary_last=summary_last),
            **pdl_opts, num_warps=num_warps, num_stages=num_stages)

    go = _WALK_T_LAUNCH.bind_keyed(key, (units, H, rows // BV), args, kwargs)
    if defer:
        return go
    go()
