"""Context parallelism across the ranks of a ``torch.distributed`` group: one packed prefill
whose tokens are split into contiguous slices, one per rank (one GPU each).

The long path (:func:`.pipeline._cp_long`) already cuts every sequence into segments whose
state maps are affine, ``S_end = M S_start + X``; here the ranks are one more level of
segments. Every rank holds the tokens ``[bounds[r], bounds[r + 1])`` of the call
(``cu_seqlens`` stays global, so a sequence may start, end or lie inside a rank, or straddle
several) and runs, on its slice alone, with ``cu_local = clamp(cu_seqlens - bounds[r], 0,
T_r)`` (the same ``N`` sequences; those outside the slice are empty there):

1. the intra-chunk kernel and phase A (each segment's ``[M^T ; X^T]``,
   :func:`.state_walk_t.state_walk_t_fwd`, the last segment of each piece included);
2. :func:`rank_chain_kernel`, before the exchange: phase B (each segment's entering state)
   from the sequences' initial states, except the rank's **first piece** where it continues
   a sequence from an earlier rank: that chain starts from zero, and the same launch keeps
   the piece's prefix maps ``Q_j`` (the product of its segments' ``M^T`` before segment
   ``j``); and the map of the rank's **last piece** (the sequence holding its last token)
   through all its segments, ``[M_r^T ; F_r^T]``: ``M_r = 0`` and ``F_r`` its exact end
   state when the piece starts on this rank, else ``M_r`` and ``F_r`` the end state from a
   zero entering state;
3. one all-gather of those maps (``HV * 2D * D`` float32 per rank: 1 MiB at ``HV = 8``,
   ``D = 128``);
4. on rank ``r > 0``, :func:`rank_fix_kernel`: the fold ``S = S M_r'^T + F_r'^T`` over the
   earlier ranks ``r' < r`` (the state entering this rank's first piece; a zero ``M`` resets
   the chain where a piece starts, so the fold needs no flags) and ``S_j^T += S^T Q_j`` for
   each of the first piece's segments, all segments at once; then phase C (outputs, final
   states, the device guard).

So nothing sequential waits for the exchange but the walk itself (phase B's chain used to
run after it; plan and prediction: docs/notes/long_context.md, "The rank's fixed extras").
Only the ``[M ; F]`` of one piece per rank crosses the link, whatever the lengths; the
alternative, a scan over ranks (rank ``r`` waits for ``r - 1``'s end state, sends its own:
``W - 1`` serial hops of half the bytes), has the same bytes at two ranks and a serial
chain beyond; notebook 05 measures the collective against the link's bandwidth.

The host path: everything that follows from host ints (the segments, every launch's
arguments, the workspace's views) is a :class:`RankPlan`, remembered per key
(:func:`rank_plan`); the call's intermediates, the rank's indices, the exchange's buffers and
the prefix maps are views of one allocation; everything derived from ``cu_seqlens`` (the
clamped boundaries, the pieces' sequences, the final states to drop, the guard's verdict) is
one launch of :func:`rank_index_kernel`; every launch is bound before the first. So a
rank's call is its Triton launches and, with more than one rank, the all-gather and one
``masked_fill_`` of the final states; no host sync beyond the collective (numbers: docs/notes/long_context.md,
"the host path of a rank's call").

Final states: row ``n`` of the returned state is sequence ``n``'s on the rank that holds its
last token (an empty sequence: the rank holding the token at its position, the last rank at
``T``), zero on the others, so a sum all-reduce over the group assembles all of them.

Bad input: metadata and the partition are checked on the host before anything is launched
(a ``TypeError``/``ValueError`` naming the argument); the values of ``cu_seqlens`` on the
host where it is not on CUDA (``check_values=None``), else on the device: an invalid global
``cu_seqlens`` makes ``cu_local`` fail the walk's guard (:mod:`.guard`), so every output row
and final state of every rank is NaN.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .. import fastcall, interpret

interpret.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..spec import resolve_scale, validate_prefill_inputs  # noqa: E402
from .chunk_index import BT, cu_status, seq_bounds  # noqa: E402
from .plan import long_path_args  # noqa: E402
from .context_parallel import cp_long_segment_chunks  # noqa: E402
from .dots import mm  # noqa: E402
from .intra_chunk import intra_chunk_fwd  # noqa: E402
from ..launch import FastLaunch, recording  # noqa: E402
from .pipeline import (RECORD_TRIES, call_signature, phase_c_fwd,  # noqa: E402
                       workspace_views)
from .plan import (MAX_PLANS, fitted_config, intra_kwargs, layout_views,  # noqa: E402
                   phase_c_gluon, workspace_layout)
from .state_walk_t import state_walk_t_fwd  # noqa: E402

__all__ = ["prefill_multi_gpu", "even_bounds", "exchange_bytes", "rank_chain_kernel",
           "rank_index_kernel", "rank_fix_kernel", "RankPlan", "rank_plan",
           "clear_rank_plans", "end_rank_process"]


def end_rank_process() -> None:
    """End a spawned rank process now, once its process group is destroyed and its results
    are written: flush stdout/stderr and ``os._exit(0)``, skipping the interpreter's
    teardown. Under load (a CI run of notebook 05's smoke beside other gloo jobs on two
    cores) a rank that returned normally was seen to die in that teardown with "terminate
    called without an active exception" (SIGABRT), which fails the whole call although its
    work was done."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def even_bounds(T: int, world_size: int, align: int = BT) -> list:
    """Token bounds ``[0, b_1, ..., T]`` of ``world_size`` contiguous slices of nearly equal
    length, cut at multiples of ``align`` (whole chunks) where ``T`` allows; every slice
    non-empty (needs ``T >= world_size``)."""
    T, W = int(T), int(world_size)
    if W < 1 or T < W:
        raise ValueError(f"need 1 <= world_size <= T, got world_size={W}, T={T}")
    cuts = [min(max(round(T * r / W / align) * align, r), T - (W - r)) for r in range(W + 1)]
    cuts[0], cuts[-1] = 0, T
    for r in range(1, W):   # strictly increasing (small T: align below the slice length)
        cuts[r] = max(cuts[r], cuts[r - 1] + 1)
    return cuts


def exchange_bytes(HV: int, D: int, world_size: int) -> int:
    """Bytes each rank receives in the exchange (the all-gather of ``[M ; F]``, float32,
    ``HV * 2D * D`` per rank, its own included)."""
    return int(world_size) * int(HV) * 2 * int(D) * int(D) * 4


@triton.jit(do_not_specialize=["T", "N"])
def rank_chain_kernel(
    h0,             # [N, H, V, K] f32 initial states, k-last (USE_H0) or None
    summ,           # [S, H, K + V, K] f32 segment transitions [M^T ; X^T] (phase A)
    negl,           # [S, H] int32: 1 where phase A found the segment's M negligible
    meta,           # [4] int64 (rank_index_kernel; PIECES) or None
    cu_local,       # [N+1] int64 the rank's clamped boundaries
    s0,             # [S, H, V, K] f32 out: the state entering each segment slot, k-last
    pref,           # [P, H, K, K] f32 out (PREFIX): the first piece's prefix maps Q_j
    mine,           # [H, K + V, K] f32 out (PIECES): [M_r^T ; F_r^T]
    T,              # the rank's tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,           # rows per program (divides K and V)
    SEG_T: tl.constexpr,        # tokens per segment slot
    USE_H0: tl.constexpr,
    PIECES: tl.constexpr,       # more than one rank: meta, mine and the map's programs
    PREFIX: tl.constexpr,       # rank > 0: the first piece may continue (pref)
    DOT_PREC: tl.constexpr,     # the maps' products (Q, M_r)
):
    """Phase B of a rank, before the exchange, and the rank's map in the same launch.

    Programs ``(n < N, head, BV state rows)`` run phase B's chain ``S_{j+1}^T = S_j^T M_j^T
    + X_j^T`` over sequence ``n``'s segments from its initial state, storing each segment's
    entering state; where the rank's first piece continues a sequence from an earlier rank
    that chain starts from zero (``Z_j``) and :func:`rank_fix_kernel` adds ``S_enter^T Q_j``
    after the exchange. The last piece's chain goes on through its last segment: its end
    state is ``F_r`` (exact where the piece starts here, else from zero). Programs ``(N,
    head, BV rows of Q)`` (PIECES) run ``Q_{j+1} = Q_j M_j^T`` from ``Q_0 = I`` over the first
    piece's segments where it continues, storing every ``Q_j`` (PREFIX), and write ``M_r``:
    ``Q`` through all its segments where the first piece is also the last, else zero (the
    last piece starts here). So ``S_end^T = S_start^T M_r^T + F_r^T`` for the last piece,
    and phase B's chain no longer waits for the exchange."""
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_k = tl.arange(0, K)
    o_kk = o_k[:, None] * K + o_k[None, :]
    o_r = i_v * BV + tl.arange(0, BV)           # this program's rows (of S^T or of Q)
    if i_n < N:
        bos, eos = seq_bounds(cu_local, i_n, T)
        n_c = tl.cdiv(eos - bos, SEG_T)
        slot0 = bos // SEG_T + i_n
        o_vk = o_r[:, None] * K + o_k[None, :]
        if USE_H0:
            b_St = tl.load(h0 + (i_n * H + i_h).to(tl.int64) * (V * K) + o_vk)
        else:
            b_St = tl.zeros([BV, K], dtype=tl.float32)
        if PIECES:   # the continuing first piece: from zero
            cont = (tl.load(meta + 2) == i_n) & (tl.load(meta + 3) != 0)
            b_St = tl.where(cont, 0.0, b_St)
        for i_s in tl.range(0, n_c - 1, num_stages=2):
            slot = slot0 + i_s
            p_m = summ + (slot * H + i_h) * ((K + V) * K)
            full = tl.load(negl + slot * H + i_h) == 0
            b_mt = tl.load(p_m + o_kk, mask=full & (o_k[:, None] >= 0), other=0.0)
            b_xt = tl.load(p_m + K * K + o_vk)
            tl.store(s0 + (slot * H + i_h) * (V * K) + o_vk, b_St)
            b_St = mm(b_St, b_mt, "bf16") + b_xt
        slot = slot0 + tl.maximum(n_c - 1, 0)
        tl.store(s0 + (slot * H + i_h) * (V * K) + o_vk, b_St)
        if PIECES:
            if tl.load(meta) == i_n:   # the last piece: on through its last segment
                if n_c > 0:
                    p_m = summ + (slot * H + i_h) * ((K + V) * K)
                    full = tl.load(negl + slot * H + i_h) == 0
                    b_mt = tl.load(p_m + o_kk, mask=full & (o_k[:, None] >= 0), other=0.0)
                    b_St = mm(b_St, b_mt, DOT_PREC) + tl.load(p_m + K * K + o_vk)
                tl.store(mine + (i_h * (K + V) + K + o_r[:, None]) * K + o_k[None, :], b_St)
    else:
        cont = tl.load(meta + 3) != 0
        i_f = tl.load(meta + 2)
        bos, eos = seq_bounds(cu_local, i_f, T)
        n_c = tl.where(cont, tl.cdiv(eos - bos, SEG_T), 0)
        slot0 = bos // SEG_T + i_f
        o_rk = o_r[:, None] * K + o_k[None, :]
        b_q = tl.where(o_r[:, None] == o_k[None, :], 1.0, 0.0)
        if PREFIX:
            if cont:
                tl.store(pref + i_h * (K * K) + o_rk, b_q)   # Q_0 (also an empty piece's)
        for i_s in range(0, n_c):
            slot = slot0 + i_s
            full = tl.load(negl + slot * H + i_h) == 0
            b_mt = tl.load(summ + (slot * H + i_h) * ((K + V) * K) + o_kk,
                           mask=full & (o_k[:, None] >= 0), other=0.0)
            b_q = mm(b_q, b_mt, DOT_PREC)
            if PREFIX:
                if i_s + 1 < n_c:
                    tl.store(pref + ((i_s + 1) * H + i_h) * (K * K) + o_rk, b_q)
        take = cont & (tl.load(meta + 1) == 0)      # the first piece is also the last
        tl.store(mine + (i_h * (K + V) + o_r[:, None]) * K + o_k[None, :],
                 tl.where(take, b_q, 0.0))


@triton.jit(do_not_specialize=["t0", "t1", "T", "T_r", "N"])
def rank_index_kernel(
    cu,             # [N+1] int32/int64 the global boundaries
    cu_local,       # [N+1] int64 out: clamp(cu - t0, 0, T_r); [0] = -1 if GUARD finds cu invalid
    meta,           # [4] int64 out (PIECES): last piece's sequence, 1 if it starts here,
                    # first piece's sequence, 1 if it continues from an earlier rank
    drop,           # [N] bool out (PIECES): the sequence's final state is not this rank's
    t0, t1, T, T_r, N,
    GUARD: tl.constexpr,        # cu_seqlens unchecked on the host: the device guard's input
    PIECES: tl.constexpr,       # more than one rank: meta and drop
    BLOCK: tl.constexpr,
):
    """One program: every index a rank's call derives from ``cu_seqlens``, in one launch
    (no host sync): the clamped boundaries, which sequences hold the rank's first and last
    tokens (entries of ``cu`` at or below them, counted) and whether the pieces start or
    continue here, and the sequences whose final state another rank holds (a sequence's
    final state belongs to the rank of its last token; an empty one's, to the rank of the
    token at its position, the last rank at ``T``). An invalid ``cu`` (``GUARD``): ``cu_local[0] =
    -1``, which fails the walk's guard (:mod:`.guard`: every output NaN), and no final state
    is dropped (they are NaN)."""
    bad = 0
    if GUARD:
        bad = tl.where(cu_status(cu, N, T, BLOCK) != 0, 1, 0)
    n_first = 0
    n_last = 0
    for i0 in range(0, N + 1, BLOCK):
        o_i = i0 + tl.arange(0, BLOCK)
        m = o_i <= N
        c = tl.load(cu + o_i, mask=m, other=0).to(tl.int64)
        loc = tl.minimum(tl.maximum(c - t0, 0), T_r)
        if GUARD:
            loc = tl.where(o_i == 0, -bad, loc)
        tl.store(cu_local + o_i, loc, mask=m)
        if PIECES:
            n_first += tl.sum(((c <= t0) & m).to(tl.int32), axis=0)
            n_last += tl.sum(((c <= t1 - 1) & m).to(tl.int32), axis=0)
            c1 = tl.load(cu + o_i + 1, mask=o_i < N, other=0).to(tl.int64)
            key = tl.where(c1 > c, c1 - 1, tl.minimum(c, T - 1))
            here = (key >= t0) & (key < t1)
            if GUARD:
                here = here | (bad != 0)
            tl.store(drop + o_i, ~here, mask=o_i < N)
    if PIECES:
        n_first = tl.minimum(tl.maximum(n_first - 1, 0), N - 1)
        n_last = tl.minimum(tl.maximum(n_last - 1, 0), N - 1)
        start_first = tl.load(cu + n_first).to(tl.int64)
        start_last = tl.load(cu + n_last).to(tl.int64)
        tl.store(meta, n_last.to(tl.int64))
        tl.store(meta + 1, (start_last >= t0).to(tl.int64))
        tl.store(meta + 2, n_first.to(tl.int64))
        tl.store(meta + 3, (start_first < t0).to(tl.int64))


@triton.jit(do_not_specialize=["T"])
def rank_fix_kernel(
    s0,             # [S, H, V, K] f32 in/out: the segments' entering states (phase B's)
    pref,           # [P, H, K, K] f32 the first piece's prefix maps Q_j (rank_chain_kernel)
    zs,             # [W * H, K + V, K] f32 every rank's [M_r^T ; F_r^T] (the all-gather)
    meta,           # [4] int64 (rank_index_kernel): [2] the first piece's sequence,
                    # [3] 1 if it continues from an earlier rank
    cu_local,       # [N+1] int64 the rank's clamped boundaries
    T,              # the rank's tokens (not specialised)
    RANK: tl.constexpr,         # this rank (> 0): the fold runs over ranks 0 .. RANK - 1
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,           # state rows per program
    SEG_T: tl.constexpr,        # tokens per segment slot
    DOT_PREC: tl.constexpr,
):
    """One program per ``(segment j of the first piece, head, BV state rows)``, after the
    exchange, where the rank's first piece continues a sequence: the state entering the rank,
    the fold ``S^T = S^T M_r^T + F_r^T`` over the earlier ranks from zero (a zero ``M``
    resets it where a piece starts), then ``S_j^T += S^T Q_j``: the segment's entering state
    from the true one (phase B ran from zero, :func:`rank_chain_kernel`)."""
    j, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_f = tl.load(meta + 2)
    bos, eos = seq_bounds(cu_local, i_f, T)
    n_s = tl.maximum(tl.cdiv(eos - bos, SEG_T), 1)
    if (tl.load(meta + 3) != 0) & (j < n_s):
        o_k = tl.arange(0, K)
        o_v = i_v * BV + tl.arange(0, BV)
        o_vk = o_v[:, None] * K + o_k[None, :]
        o_kk = o_k[:, None] * K + o_k[None, :]
        b_s = tl.zeros([BV, K], dtype=tl.float32)
        for r in tl.static_range(RANK):
            p_r = zs + (r * H + i_h) * ((K + V) * K)
            b_s = mm(b_s, tl.load(p_r + o_kk), DOT_PREC) + tl.load(p_r + K * K + o_vk)
        b_q = tl.load(pref + (j * H + i_h) * (K * K) + o_kk)
        p_s = s0 + ((bos // SEG_T + i_f + j) * H + i_h) * (V * K) + o_vk
        tl.store(p_s, tl.load(p_s) + mm(b_s, b_q, DOT_PREC))


#: torch's all-gather into one tensor (``all_gather_single`` from torch 2.12; the older name
#: before it, which 2.12 deprecates).
all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


_CHAIN_LAUNCH = FastLaunch(rank_chain_kernel)
_INDEX_LAUNCH = FastLaunch(rank_index_kernel)
_FIX_LAUNCH = FastLaunch(rank_fix_kernel)


def _check_bounds(bounds, world: int, rank: int, T_r: int) -> Tuple[int, int, int]:
    """``(t0, t1, T)`` of this rank from the partition ``bounds`` (host ints)."""
    if isinstance(bounds, torch.Tensor) or not isinstance(bounds, (list, tuple)):
        raise TypeError(f"bounds must be a list or tuple of ints (host), got "
                        f"{type(bounds).__name__}")
    if len(bounds) != world + 1 or not all(isinstance(x, int) for x in bounds):
        raise ValueError(f"bounds must hold world_size + 1 = {world + 1} ints, got {bounds!r}")
    if bounds[0] != 0 or any(y <= x for x, y in zip(bounds, bounds[1:])):
        raise ValueError(f"bounds must start at 0 and increase strictly (every rank holds "
                         f"tokens), got {list(bounds)}")
    t0, t1 = bounds[rank], bounds[rank + 1]
    if T_r != t1 - t0:
        raise ValueError(f"q must hold rank {rank}'s bounds[{rank + 1}] - bounds[{rank}] = "
                         f"{t1 - t0} tokens, got {T_r}")
    return t0, t1, bounds[-1]


@dataclass(frozen=True, eq=False)
class RankPlan:
    """What one rank's call does, from host ints only (:func:`rank_plan`, remembered per
    key): the long path's segments on the rank's slice and every launch's arguments but
    the tensors and the scale, and the one workspace allocation (the call's intermediates,
    the rank's indices, the exchange's buffers, the entering states; the views of
    :func:`.plan.workspace_layout` plus the rank's own, cut by :func:`.pipeline.workspace_views`).

    Attributes:
        rank, world, t0, t1, T, N, HV, D: the call's partition and shape (``T``: all ranks').
        seg_t: tokens per segment of the rank's long path.
        intra: keyword arguments of :func:`.intra_chunk.intra_chunk_fwd`; phase_a, phase_c
            of :func:`.state_walk_t.state_walk_t_fwd` (:func:`.plan.long_path_args`, the one
            GPU's builder, plus phase A's ``summary_last`` and phase C's ``guard``).
        phase_c_gluon: phase C is the Gluon walk (:func:`.plan.phase_c_gluon`; launched
            through :func:`.pipeline.phase_c_fwd`).
        index, chain, fix: ``(grid, keyword arguments)`` of :func:`rank_index_kernel`,
            :func:`rank_chain_kernel` (phase B and the rank's map, before the exchange),
            :func:`rank_fix_kernel` (None on rank 0 and with one rank).
        nbytes, views: the workspace (:func:`.plan.layout_views`).
    """

    rank: int
    world: int
    t0: int
    t1: int
    T: int
    N: int
    HV: int
    D: int
    seg_t: int
    intra: dict
    phase_a: dict
    phase_c: dict
    phase_c_gluon: bool
    index: tuple
    chain: tuple
    fix: Optional[tuple]
    nbytes: int
    views: tuple


#: Rank plans by key (:func:`rank_plan`; at most :data:`.plan.MAX_PLANS`, then forgotten).
_RANK_PLANS: dict = {}


def rank_plan(T_r: int, N: int, HV: int, D: int, rank: int, world: int, t0: int, T: int,
              config, use_h0: bool, guard: bool, device=None) -> RankPlan:
    """The :class:`RankPlan` of rank ``rank`` of ``world`` holding tokens ``[t0, t0 + T_r)``
    of a call of ``T`` tokens in ``N`` sequences (``use_h0``: initial states given;
    ``guard``: ``cu_seqlens`` unchecked on the host) on ``device`` (the rank's inputs'; it
    decides phase C's kernel, :func:`.plan.phase_c_gluon`; None: off CUDA), remembered on
    exactly these."""
    key = (T_r, N, HV, D, rank, world, t0, T, config, use_h0, guard, device)
    try:
        plan = _RANK_PLANS.get(key)
    except TypeError:   # an unhashable config: fitted_config says why
        plan = None
    if plan is None:
        plan = _rank_plan(*key[:8], fitted_config(config, D), use_h0, guard, device)
        if len(_RANK_PLANS) >= MAX_PLANS:
            _RANK_PLANS.clear()
        _RANK_PLANS[key] = plan
    return plan


def _rank_plan(T_r, N, HV, D, rank, world, t0, T, cfg, use_h0, guard, device) -> RankPlan:
    """:func:`rank_plan` on a fitted config: the long path's segments on the rank's slice
    (the rule's for its tokens and its share of the sequences), the phases' arguments from
    :func:`.plan.long_path_args` (phases A and C without PDL) with the rank's own flags, the
    rank's kernels' grids and arguments, and the workspace with the rank's buffers."""
    f32 = torch.float32
    seg = cp_long_segment_chunks(T_r, -(-N // world))
    seg_t = seg * BT
    args = long_path_args(T_r, D, seg_t, cfg, pdl=False)
    extra = [("cu_local", torch.int64, (N + 1,))]
    pieces = world > 1
    if pieces:
        extra += [("meta", torch.int64, (4,)), ("drop", torch.bool, (N, 1, 1, 1)),
                  ("mine", f32, (HV, 2 * D, D)), ("zs", f32, (world * HV, 2 * D, D))]
    n_pref = max(-(-T_r // seg_t), 1)   # the first piece's segments, at most
    if rank > 0:
        extra += [("pref", f32, (n_pref, HV, D, D))]
    layout = workspace_layout(T_r, N, HV, D, seg, True, False, cfg.storage, cfg.solve,
                              extra=tuple(extra))
    nbytes, views = layout_views(layout)
    bz = min(16, D)
    return RankPlan(
        rank=rank, world=world, t0=t0, t1=t0 + T_r, T=T, N=N, HV=HV, D=D, seg_t=seg_t,
        intra=intra_kwargs(cfg),
        phase_a=dict(args["phase_a"], summary_last=pieces),
        phase_c=dict(args["phase_c"], guard=guard),
        phase_c_gluon=phase_c_gluon(device or "cpu", D, cfg),
        index=((1,), dict(GUARD=guard, PIECES=pieces, BLOCK=1024)),
        chain=((N + int(pieces), HV, D // bz),
               dict(H=HV, K=D, V=D, BV=bz, SEG_T=seg_t, USE_H0=use_h0, PIECES=pieces,
                    PREFIX=rank > 0, DOT_PREC=cfg.cp_chain_precision, num_warps=8)),
        fix=((n_pref, HV, D // bz), dict(RANK=rank, H=HV, K=D, V=D, BV=bz, SEG_T=seg_t,
                                         DOT_PREC=cfg.cp_chain_precision, num_warps=4))
        if rank > 0 else None,
        nbytes=nbytes, views=views)


def clear_rank_plans() -> None:
    """Forget every rank plan (the rules' constants changed)."""
    _RANK_PLANS.clear()


def prefill_multi_gpu(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                      bounds: Sequence[int], group=None, check_values: Optional[bool] = None,
                      config=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of one packed prefill split across the ranks of ``group`` (the
    module doc: phases A, the exchange, B and C).

    Args:
        q, k: `[T_r, HQ, D]`, v: `[T_r, HV, D]`, a, b: `[T_r, HV]` bf16: this rank's tokens,
            ``bounds[r] <= t < bounds[r + 1]`` of the packed call.
        state: `[N, HV, D, D]` f32 initial states of all ``N`` sequences (k-last), the same
            on every rank, or None (zeros).
        A_log, dt_bias: `[HV]` f32. scale: None or 0 means ``1/sqrt(D)``.
        cu_seqlens: `[N+1]` int32/int64, the global boundaries (``cu[N] = bounds[-1]``),
            the same on every rank.
        bounds: host ints ``0 = bounds[0] < ... < bounds[W] = T``, the same on every rank.
        group: the process group (None: the default one); one rank per device.
        check_values: check the values of ``cu_seqlens`` on the host (None: only where it is
            not on CUDA); unchecked, an invalid one makes every output NaN (module doc).
        config: a :class:`.config.PrefillConfig` (its storage, solve and precisions).

    Returns:
        ``(output [T_r, HV, D] bf16, final_state [N, HV, D, D] f32)``: the final states of
        the sequences that end on this rank, zeros elsewhere.

    Checked once per signature; a repeat replays the two halves recorded on its first call.
    Where :mod:`kernels.fastcall` is available and ``cu_seqlens``' values are not checked on
    the host per call, each half is also a plan (:class:`_Fast`): a repeat first tries the
    last ones used (the bounds, group, world and rank compared in Python; the first plan
    checks every tensor and option, allocates the outputs and the workspace, launches; the
    exchange; the second plan on the same tensors), None sending it down the path above.
    """
    if group is None and not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (no default group)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    last = _LAST
    if last is not None:   # the last plans (kernels.fastcall): two C calls, or None
        r = _run_fast(last, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, bounds,
                      group, world, rank, check_values, config)
        if r is not None:
            return r
    try:
        bkey = (type(bounds), tuple([(type(x), x) for x in bounds]))
        sig = (call_signature(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, None,
                              None, check_values, None, None, config, "multi_gpu"),
               *bkey, group, world, rank)
        c = _CALLS.get(sig)
    except (AttributeError, TypeError):   # not a tensor, unhashable: the checks say which
        sig = c = None
    if c is not None and c.fast is not None and c.fast is not last:
        r = _run_fast(c.fast, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, bounds,
                      group, world, rank, check_values, config)
        if r is not None:
            return r
    if c is None:
        c = _prepare(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, bounds, world,
                     rank, check_values, config)
        if sig is not None:
            if len(_CALLS) >= MAX_PLANS:
                _CALLS.clear()
            _CALLS[sig] = c
            c.tries = RECORD_TRIES
    elif c.checked:
        _check_cu_values(cu_seqlens, c.plan.T)
    p, dev = c.plan, q.device
    buf = torch.empty(p.nbytes // 4, dtype=torch.float32, device=dev)
    o = torch.empty(p.t1 - p.t0, p.HV, p.D, dtype=torch.bfloat16, device=dev)
    ht = torch.empty(p.N, p.HV, p.D, p.D, dtype=torch.float32, device=dev)
    # the call's tensors in a fixed order: the recorded launches' slots (9 given, 2 made)
    srcs = (q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, o, ht)
    args = (p, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, c.scale, o, ht)
    if c.lists is None:
        if not c.tries:
            _run(None, args, workspace_views(p, dev, buf), group)
            return o, ht
        c.tries -= 1
        recs = []
        _run(recs, args, workspace_views(p, dev, buf), group)
        built = [r.build(srcs, 9, buf) if ok else None for r, ok in recs]
        # (the second half alone may not be recordable: the Gluon walk's launch builds TMA
        # descriptors per call; that half is then bound per call)
        c.lists = None if built[0] is None else tuple(built)
        if (c.lists is not None and sig is not None and not c.checked
                and fastcall.available()):
            _make_fast(c, bkey[1], group, world, rank, (scale, check_values, config), srcs,
                       buf)
        return o, ht
    before, after = c.lists
    ws = None
    if not before.run(srcs, buf):
        ws = workspace_views(p, dev, buf)
        for go in _bind_before(*args, ws):
            go()
    if p.world > 1:
        _exchange(ws or workspace_views(p, dev, buf, c.between), group)
    if after is None or not after.run(srcs, buf):
        ws = ws or workspace_views(p, dev, buf)
        for go in _bind_after(*args, ws):
            go()
    if p.world > 1:
        ht.masked_fill_((ws or workspace_views(p, dev, buf, ("drop",)))["drop"], 0.0)
    return o, ht


#: What a rank call's signature fixes (:class:`_RankCall`; at most :data:`.plan.MAX_PLANS`).
_CALLS: dict = {}


class _RankCall:
    """A checked rank call's signature (:func:`_prepare`): its :class:`RankPlan`, the scale,
    whether ``cu_seqlens``' values are checked on the host per call, the names of the
    views the exchange and the fold use (cut alone between the recorded halves), and the
    launches as recorded on a call, ``(before the exchange, after it)``
    (:class:`kernels.launch.LaunchList`; None until then; the second alone None where it
    cannot be recorded: the Gluon walk, bound per call) with the tries left."""

    __slots__ = ("plan", "scale", "checked", "between", "lists", "tries", "fast")


#: The last :class:`_Fast` that served a rank call: a repeat tries it first.
_LAST = None


class _Fast:
    """A rank call's two plans (:mod:`kernels.fastcall`), before and after the exchange,
    with what the plans cannot check themselves: the bounds (as in the signature), the
    group by identity, the world size and rank. The first plan checks the call's tensors
    and options, allocates the output, the final states and the workspace, launches the
    first half and returns the three; the second takes them as given (None where that half
    is not recorded, the Gluon walk: it is bound per call in Python)."""

    __slots__ = ("call", "bounds", "group", "world", "rank", "run1", "plan1", "run2", "plan2")


def _make_fast(c, bounds, group, world, rank, opts, srcs, buf) -> None:
    """The signature's two plans from its recorded halves and this call's tensors."""
    before, after = c.lists
    o, ht = srcs[9], srcs[10]
    p1 = fastcall.make_plan(before, opts, srcs[:9], (("empty", o), ("empty", ht),
                                                     ("empty", buf)), None, (9, 10, 11),
                            ws_source=11)
    p2 = (fastcall.make_plan(after, opts, srcs + (buf,), (), None, (), ws_source=11)
          if after is not None else None)
    if p1 is None or (p2 is None and after is not None):
        return
    f = _Fast()
    f.call, f.bounds, f.group, f.world, f.rank = c, bounds, group, world, rank
    f.run1, f.plan1 = fastcall.runner(p1), p1
    f.run2, f.plan2 = (fastcall.runner(p2), p2) if p2 is not None else (None, None)
    c.fast = f
    global _LAST
    _LAST = f


def _run_fast(f, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, bounds, group,
              world, rank, check_values, config):
    """A rank call by its plans: ``(o, ht)``, or None having launched nothing (the Python
    path then takes the call). The exchange between the plans is the Python one."""
    if group is not f.group or world != f.world or rank != f.rank:
        return None
    try:
        if tuple([(type(x), x) for x in bounds]) != f.bounds:
            return None
    except TypeError:
        return None
    r = f.run1(f.plan1, scale, check_values, config, q, k, v, state, A_log, a, dt_bias, b,
               cu_seqlens)
    if r is None:
        return None
    global _LAST
    _LAST = f
    o, ht, buf = r
    c = f.call
    p, dev = c.plan, q.device
    ws = None
    if p.world > 1:
        ws = workspace_views(p, dev, buf, c.between)
        _exchange(ws, group)
    if f.plan2 is None or f.run2(f.plan2, scale, check_values, config, q, k, v, state, A_log,
                                 a, dt_bias, b, cu_seqlens, o, ht, buf) is None:
        # (no second plan: that half bound per call; None: not expected, the first checked all)
        srcs = (q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, o, ht)
        if c.lists[1] is None or not c.lists[1].run(srcs, buf):
            ws = workspace_views(p, dev, buf)
            for go in _bind_after(p, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                                  c.scale, o, ht, ws):
                go()
    if p.world > 1:
        ht.masked_fill_(ws["drop"], 0.0)
    return o, ht


def _check_cu_values(cu_seqlens, T: int) -> None:
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) != T:
        raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at "
                         f"bounds[-1] = {T}, got {cu.tolist()[:16]}")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, bounds, world, rank,
             check_values, config) -> _RankCall:
    """Every check of a rank call (the values of ``cu_seqlens`` where ``check_values``
    resolves so) and its plan."""
    shape = validate_prefill_inputs(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                                    check_values=False)
    t0, t1, T = _check_bounds(bounds, world, rank, q.shape[0])
    if check_values is None:
        check_values = q.device.type != "cuda"
    if check_values:
        _check_cu_values(cu_seqlens, T)
    HV, D, T_r, N = shape.num_v_heads, shape.head_dim, t1 - t0, cu_seqlens.numel() - 1
    c = _RankCall()
    c.plan = rank_plan(T_r, N, HV, D, rank, world, t0, T, config, state is not None,
                       not check_values, q.device)
    c.scale, c.checked = resolve_scale(scale, D), bool(check_values)
    c.between = frozenset(("mine", "zs", "drop"))
    c.lists, c.tries, c.fast = None, 0, None
    return c


def _bind_before(p, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht, ws):
    """The launches before the exchange, bound: the rank's indices, the intra-chunk kernel,
    phase A, phase B with the rank's map (:func:`rank_chain_kernel`)."""
    cu_local, meta, summ, negl = ws["cu_local"], ws.get("meta"), ws["summary"], ws["negligible"]
    tb, gc, aq, lb = ws["Tb"], ws["gc"], ws["Aqk"], ws["log_bound"]
    T_r = p.t1 - p.t0
    return [_INDEX_LAUNCH.bind(p.index[0], (cu_seqlens, cu_local, meta, ws.get("drop"), p.t0,
                                            p.t1, p.T, T_r, p.N), p.index[1]),
            intra_chunk_fwd(k, v, cu_local, q, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                            scale=scale, log_bound=lb, out=(tb, gc, aq, ws.get("scratch")),
                            defer=True, **p.intra)[3],
            state_walk_t_fwd(q, k, v, tb, aq, gc, cu_local, summary=summ, log_bound=lb,
                             negligible=negl, scale=scale, defer=True, **p.phase_a),
            _CHAIN_LAUNCH.bind(p.chain[0], (state, summ, negl, meta, cu_local, ws["s0"],
                                            ws.get("pref"), ws.get("mine"), T_r, p.N),
                               p.chain[1])]


def _bind_after(p, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht, ws):
    """The launches after the exchange, bound: the first piece's entering states from the
    earlier ranks' maps (rank > 0), phase C."""
    cu_local, s0 = ws["cu_local"], ws["s0"]
    gos = []
    if p.fix is not None:
        gos.append(_FIX_LAUNCH.bind(p.fix[0], (s0, ws["pref"], ws["zs"], ws["meta"], cu_local,
                                               p.t1 - p.t0), p.fix[1]))
    gos.append(phase_c_fwd(p.phase_c_gluon, q, k, v, ws["Tb"], ws["Aqk"], ws["gc"], cu_local,
                           s0=s0, output=o, final_state=ht, scale=scale, defer=True,
                           **p.phase_c))
    return gos


def _exchange(ws, group) -> None:
    """The all-gather of every rank's map (the fold over the earlier ranks runs in
    :func:`rank_fix_kernel`, after it)."""
    all_gather_into(ws["zs"], ws["mine"], group=group)   # (concatenated: gloo and nccl)


def _run(recs, args, ws, group) -> None:
    """A rank call by its normal path: every launch bound before the first (the host time
    between launches is what the device waits for), the launches before the exchange, the
    exchange, the launches after it, the final states of sequences ending elsewhere zeroed.
    ``recs``: a list that gets ``(recording, recordable)`` of each half (None: no
    recording; a half is not recordable where a bind said so, :func:`.launch.not_recordable`)."""
    p, ht = args[0], args[-1]
    halves = []
    for bind in (_bind_before, _bind_after):
        with (recording() if recs is not None else nullcontext()) as b:
            halves.append((bind(*args, ws), b is None or b.ok))
    for gos, ok in halves:
        with (recording() if recs is not None else nullcontext()) as rec:
            for go in gos:
                go()
        if recs is not None:
            recs.append((rec, ok))
        if gos is halves[0][0] and p.world > 1:
            _exchange(ws, group)
    if p.world > 1:
        ht.masked_fill_(ws["drop"], 0.0)
