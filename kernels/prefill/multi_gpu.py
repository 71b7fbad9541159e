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
2. :func:`piece_compose_kernel`: the map of the rank's **last piece** (the sequence holding
   its last token) through all its segments, ``[M_r^T ; F_r^T]``: ``M_r = 0`` and ``F_r``
   its exact end state when the piece starts on this rank (from the sequence's initial
   state), else ``M_r`` and ``F_r`` the end state from a zero entering state;
3. one all-gather of those maps (``HV * 2D * D`` float32 per rank: 1 MiB at ``HV = 8``,
   ``D = 128``) and, on the device, the fold ``S = S M_r'^T + F_r'^T`` over the earlier
   ranks ``r' < r``: the state entering this rank's first piece (a zero ``M`` resets the
   chain where a piece starts, so the fold needs no flags);
4. phase B (:func:`.context_parallel.segment_combine_t_fwd`) with that state as the first
   piece's initial state, and phase C (outputs, final states, the device guard).

Only the ``[M ; F]`` of one piece per rank crosses the link, whatever the lengths; the
alternative, a scan over ranks (rank ``r`` waits for ``r - 1``'s end state, sends its own:
``W - 1`` serial hops of half the bytes), has the same bytes at two ranks and a serial
chain beyond; notebook 05 measures the collective against the link's bandwidth.

The host path: everything that follows from host ints (the segments, every launch's
arguments, the workspace's views) is a :class:`RankPlan`, remembered per key
(:func:`rank_plan`); the call's intermediates, the rank's indices, the exchange's buffers and
the entering states are views of one allocation; everything derived from ``cu_seqlens`` (the
clamped boundaries, the pieces' sequences, the final states to drop, the guard's verdict) is
one launch of :func:`rank_index_kernel`, and the entering states one copy
(:func:`enter_state_kernel`); every launch is bound before the first. So a rank's call is
its Triton launches and, with more than one rank, the all-gather, on rank ``r > 0`` ``r``
``baddbmm`` of the fold (cuBLAS, as before: the same bits), and one ``masked_fill_`` of the
final states; no host sync beyond the collective (numbers: docs/notes/long_context.md,
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
from .context_parallel import cp_long_segment_chunks, segment_combine_t_fwd  # noqa: E402
from .dots import mm  # noqa: E402
from .intra_chunk import intra_chunk_fwd  # noqa: E402
from ..launch import FastLaunch, recording  # noqa: E402
from .pipeline import (RECORD_TRIES, call_signature, phase_c_fwd,  # noqa: E402
                       workspace_views)
from .plan import (MAX_PLANS, fitted_config, intra_kwargs, layout_views,  # noqa: E402
                   phase_c_gluon, workspace_layout)
from .state_walk_t import state_walk_t_fwd  # noqa: E402

__all__ = ["prefill_multi_gpu", "even_bounds", "exchange_bytes", "piece_compose_kernel",
           "rank_index_kernel", "enter_state_kernel", "RankPlan", "rank_plan",
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


@triton.jit(do_not_specialize=["T"])
def piece_compose_kernel(
    summ,           # [S, H, K + V, K] f32 segment transitions [M^T ; X^T] (phase A)
    negl,           # [S, H] int32: 1 where phase A found the segment's M negligible
    h0,             # [N, H, V, K] f32 initial states, k-last (USE_H0) or None
    meta,           # [2] int64: the last piece's sequence, 1 if the piece starts here
    cu_local,       # [N+1] int64 the rank's clamped boundaries
    out,            # [H, K + V, K] f32 out: [M_r^T ; F_r^T]
    T,              # the rank's tokens (not specialised)
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,           # rows per program (divides K)
    SEG_T: tl.constexpr,        # tokens per segment slot
    USE_H0: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """One program per ``(head, BV rows of [M^T ; F^T])``: folds ``Z = Z M_s^T + [0 ; X_s^T]``
    over the segments of the rank's last piece from ``Z = [I ; 0]`` (the piece continues a
    sequence from an earlier rank) or ``[0 ; h0^T]`` (it starts here), so ``Z`` ends as the
    piece's map ``S_end^T = S_start^T M_r^T + F_r^T``."""
    i_h, i_r = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(meta)
    start = tl.load(meta + 1)                  # 1: the piece starts on this rank
    bos, eos = seq_bounds(cu_local, i_n, T)
    n_seg = tl.cdiv(eos - bos, SEG_T)
    slot0 = bos // SEG_T + i_n
    o_k = tl.arange(0, K)
    o_r = i_r * BV + tl.arange(0, BV)          # rows of Z^T: M rows < K, F rows >= K
    o_kk = o_k[:, None] * K + o_k[None, :]
    is_x = i_r * BV >= K
    if is_x:
        b_z = tl.zeros([BV, K], dtype=tl.float32)
        if USE_H0:
            b_z = tl.load(h0 + (i_n * H + i_h) * (V * K) + (o_r - K)[:, None] * K + o_k[None, :],
                          mask=(start != 0) & (o_k[None, :] >= 0), other=0.0)
    else:
        b_z = tl.where((o_r[:, None] == o_k[None, :]) & (start == 0), 1.0, 0.0)
    for i_s in range(0, n_seg):
        p_s = summ + ((slot0 + i_s) * H + i_h) * ((K + V) * K)
        full = tl.load(negl + (slot0 + i_s) * H + i_h) == 0
        b_mt = tl.load(p_s + o_kk, mask=full & (o_k[:, None] >= 0), other=0.0)
        b_z = mm(b_z, b_mt, DOT_PREC)
        if is_x:
            b_z += tl.load(p_s + o_r[:, None] * K + o_k[None, :])
    tl.store(out + (i_h * (K + V) + o_r[:, None]) * K + o_k[None, :], b_z)


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


@triton.jit
def enter_state_kernel(
    h0,             # [N, H, V, K] f32 initial states, k-last, or None (zeros)
    s_t,            # [H, V, K] f32 the state entering the rank's first piece (the fold)
    meta,           # [4] int64 (rank_index_kernel): [2] the first piece's sequence,
                    # [3] 1 if it continues from an earlier rank
    out,            # [N, H, V, K] f32 out: the initial states phase B starts from
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BR: tl.constexpr,           # rows per step
    USE_H0: tl.constexpr,
):
    """One program per ``(sequence, head)``: copies its initial state (or zeros), or
    ``s_t`` for the first piece's sequence where that piece continues a sequence from an
    earlier rank (a copy: the bits of the fold and of ``h0`` pass unchanged)."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    take = (tl.load(meta + 2) == i_n) & (tl.load(meta + 3) != 0)
    o_k = tl.arange(0, K)
    base = (i_n.to(tl.int64) * H + i_h) * (V * K)
    for r0 in range(0, V, BR):
        o_rk = (r0 + tl.arange(0, BR))[:, None] * K + o_k[None, :]
        b = tl.load(s_t + i_h * (V * K) + o_rk)
        if USE_H0:
            b = tl.where(take, b, tl.load(h0 + base + o_rk))
        else:
            b = tl.where(take, b, 0.0)
        tl.store(out + base + o_rk, b)


#: torch's all-gather into one tensor (``all_gather_single`` from torch 2.12; the older name
#: before it, which 2.12 deprecates).
all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


_COMPOSE_LAUNCH = FastLaunch(piece_compose_kernel)
_INDEX_LAUNCH = FastLaunch(rank_index_kernel)
_ENTER_LAUNCH = FastLaunch(enter_state_kernel)


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
            of :func:`.state_walk_t.state_walk_t_fwd`; phase_b of
            :func:`.context_parallel.segment_combine_t_fwd` (:func:`.plan.long_path_args`,
            the one GPU's builder, plus phase A's ``summary_last`` and phase C's ``guard``).
        phase_c_gluon: phase C is the Gluon walk (:func:`.plan.phase_c_gluon`; launched
            through :func:`.pipeline.phase_c_fwd`).
        index, compose, enter: ``(grid, keyword arguments)`` of :func:`rank_index_kernel`,
            :func:`piece_compose_kernel`, :func:`enter_state_kernel` (the latter two None
            where unused: one rank; rank 0).
        folds: ``(F, M, out)`` view names of each earlier rank's step of the fold
            (``out``: where that step's ``baddbmm`` writes).
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
    phase_b: dict
    phase_c: dict
    phase_c_gluon: bool
    index: tuple
    compose: Optional[tuple]
    enter: Optional[tuple]
    folds: tuple
    nbytes: int
    views: tuple


#: Rank plans by key (:func:`rank_plan`; at most :data:`.plan.MAX_PLANS`, then forgotten).
_RANK_PLANS: dict = {}
#: Zero states ``[HV, D, D]`` f32 per (device, HV, D): the fold's start (never written).
_ZEROS: dict = {}


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
    if rank > 0:
        extra += [("h0", f32, (N, HV, D, D))]
        extra += [(f"fold{i}", f32, (HV, D, D)) for i in range(min(rank, 2))]
    layout = workspace_layout(T_r, N, HV, D, seg, True, False, cfg.storage, cfg.solve,
                              extra=tuple(extra))
    nbytes, views = layout_views(layout)
    folds = []
    if rank > 0:   # [M_r ; F_r] of each earlier rank: views into the all-gather's output
        zs = next(v[4] for v in views if v[0] == "zs")
        step = (2 * D * D, D, 1)
        for r in range(rank):
            at = zs + r * HV * 2 * D * D
            views += ((f"F{r}", f32, (HV, D, D), step, at + D * D),
                      (f"M{r}", f32, (HV, D, D), step, at))
            folds.append((f"F{r}", f"M{r}", f"fold{r % 2}"))
    bz = min(16, D)
    return RankPlan(
        rank=rank, world=world, t0=t0, t1=t0 + T_r, T=T, N=N, HV=HV, D=D, seg_t=seg_t,
        intra=intra_kwargs(cfg),
        phase_a=dict(args["phase_a"], summary_last=pieces), phase_b=args["phase_b"],
        phase_c=dict(args["phase_c"], guard=guard),
        phase_c_gluon=phase_c_gluon(device or "cpu", D, cfg),
        index=((1,), dict(GUARD=guard, PIECES=pieces, BLOCK=1024)),
        compose=((HV, 2 * D // bz), dict(H=HV, K=D, V=D, BV=bz, SEG_T=seg_t, USE_H0=use_h0,
                                         DOT_PREC=cfg.cp_chain_precision, num_warps=4))
        if pieces else None,
        enter=((N, HV), dict(H=HV, K=D, V=D, BR=min(16, D), USE_H0=use_h0, num_warps=4))
        if rank > 0 else None,
        folds=tuple(folds), nbytes=nbytes, views=views)


def clear_rank_plans() -> None:
    """Forget every rank plan and cached zero state (the rules' constants changed)."""
    _RANK_PLANS.clear()
    _ZEROS.clear()


def _zeros(device, HV: int, D: int) -> torch.Tensor:
    key = (device, HV, D)
    z = _ZEROS.get(key)
    if z is None:
        z = _ZEROS[key] = torch.zeros(HV, D, D, dtype=torch.float32, device=device)
    return z


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
        with recording() as binds:   # (the binds, so that their launches are noted)
            recs = []
            _run(recs, args, workspace_views(p, dev, buf), group)
        built = [r.build(srcs, 9, buf) if binds.ok else None for r in recs]
        c.lists = None if None in built else tuple(built)
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
    if p.compose is not None:
        _exchange(p, ws or workspace_views(p, dev, buf, c.between), group, dev)
    if not after.run(srcs, buf):
        ws = ws or workspace_views(p, dev, buf)
        for go in _bind_after(*args, ws):
            go()
    if p.compose is not None:
        ht.masked_fill_((ws or workspace_views(p, dev, buf, ("drop",)))["drop"], 0.0)
    return o, ht


#: What a rank call's signature fixes (:class:`_RankCall`; at most :data:`.plan.MAX_PLANS`).
_CALLS: dict = {}


class _RankCall:
    """A checked rank call's signature (:func:`_prepare`): its :class:`RankPlan`, the scale,
    whether ``cu_seqlens``' values are checked on the host per call, the names of the
    views the exchange and the fold use (cut alone between the recorded halves), and the
    launches as recorded on a call, ``(before the exchange, after it)``
    (:class:`kernels.launch.LaunchList`; None until then) with the tries left."""

    __slots__ = ("plan", "scale", "checked", "between", "lists", "tries", "fast")


#: The last :class:`_Fast` that served a rank call: a repeat tries it first.
_LAST = None


class _Fast:
    """A rank call's two plans (:mod:`kernels.fastcall`), before and after the exchange,
    with what the plans cannot check themselves: the bounds (as in the signature), the
    group by identity, the world size and rank. The first plan checks the call's tensors
    and options, allocates the output, the final states and the workspace, launches the
    first half and returns the three; the second takes them as given."""

    __slots__ = ("call", "bounds", "group", "world", "rank", "run1", "plan1", "run2", "plan2")


def _make_fast(c, bounds, group, world, rank, opts, srcs, buf) -> None:
    """The signature's two plans from its recorded halves and this call's tensors."""
    before, after = c.lists
    o, ht = srcs[9], srcs[10]
    p1 = fastcall.make_plan(before, opts, srcs[:9], (("empty", o), ("empty", ht),
                                                     ("empty", buf)), None, (9, 10, 11),
                            ws_source=11)
    p2 = fastcall.make_plan(after, opts, srcs + (buf,), (), None, (), ws_source=11)
    if p1 is None or p2 is None:
        return
    f = _Fast()
    f.call, f.bounds, f.group, f.world, f.rank = c, bounds, group, world, rank
    f.run1, f.plan1, f.run2, f.plan2 = fastcall.runner(p1), p1, fastcall.runner(p2), p2
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
    if p.compose is not None:
        ws = workspace_views(p, dev, buf, c.between)
        _exchange(p, ws, group, dev)
    if f.run2(f.plan2, scale, check_values, config, q, k, v, state, A_log, a, dt_bias, b,
              cu_seqlens, o, ht, buf) is None:   # (not expected: the first plan checked all)
        srcs = (q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, o, ht)
        if not c.lists[1].run(srcs, buf):
            ws = workspace_views(p, dev, buf)
            for go in _bind_after(p, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                                  c.scale, o, ht, ws):
                go()
    if p.compose is not None:
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
    c.between = frozenset(("mine", "zs", "drop") + tuple(x for f in c.plan.folds for x in f))
    c.lists, c.tries, c.fast = None, 0, None
    return c


def _bind_before(p, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht, ws):
    """The launches before the exchange, bound: the rank's indices, the intra-chunk kernel,
    phase A, the last piece's map (with more than one rank)."""
    cu_local, meta, summ, negl = ws["cu_local"], ws.get("meta"), ws["summary"], ws["negligible"]
    tb, gc, aq, lb = ws["Tb"], ws["gc"], ws["Aqk"], ws["log_bound"]
    T_r = p.t1 - p.t0
    gos = [_INDEX_LAUNCH.bind(p.index[0], (cu_seqlens, cu_local, meta, ws.get("drop"), p.t0,
                                           p.t1, p.T, T_r, p.N), p.index[1]),
           intra_chunk_fwd(k, v, cu_local, q, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                           scale=scale, log_bound=lb, out=(tb, gc, aq, ws.get("scratch")),
                           defer=True, **p.intra)[3],
           state_walk_t_fwd(q, k, v, tb, aq, gc, cu_local, summary=summ, log_bound=lb,
                            negligible=negl, scale=scale, defer=True, **p.phase_a)]
    if p.compose is not None:
        gos.append(_COMPOSE_LAUNCH.bind(p.compose[0], (summ, negl, state, meta, cu_local,
                                                       ws["mine"], T_r), p.compose[1]))
    return gos


def _bind_after(p, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht, ws):
    """The launches after the exchange, bound: the entering states (rank > 0), phase B,
    phase C."""
    cu_local, summ, negl, s0 = ws["cu_local"], ws["summary"], ws["negligible"], ws["s0"]
    h0 = ws["h0"] if p.enter is not None else state
    gos = []
    if p.enter is not None:
        gos.append(_ENTER_LAUNCH.bind(p.enter[0], (state, ws[p.folds[-1][2]], ws["meta"], h0),
                                      p.enter[1]))
    gos.append(segment_combine_t_fwd(summ, s0, negl, cu_local, h0, defer=True, **p.phase_b))
    gos.append(phase_c_fwd(p.phase_c_gluon, q, k, v, ws["Tb"], ws["Aqk"], ws["gc"], cu_local,
                           s0=s0, output=o, final_state=ht, scale=scale, defer=True,
                           **p.phase_c))
    return gos


def _exchange(p, ws, group, dev) -> None:
    """The all-gather of the last pieces' maps and, on rank ``r > 0``, the fold over the
    earlier ranks into the state entering this rank (the entering-state launch reads it)."""
    all_gather_into(ws["zs"], ws["mine"], group=group)   # (concatenated: gloo and nccl)
    if p.enter is not None:
        s_t = _zeros(dev, p.HV, p.D)
        for f, m, out in p.folds:   # S^T = S^T M_r^T + F_r^T over the earlier ranks
            s_t = torch.baddbmm(ws[f], s_t, ws[m], out=ws[out])


def _run(recs, args, ws, group) -> None:
    """A rank call by its normal path: every launch bound before the first (the host time
    between launches is what the device waits for), the launches before the exchange, the
    exchange, the launches after it, the final states of sequences ending elsewhere zeroed.
    ``recs``: a list that gets the recordings of the two halves (None: no recording)."""
    p, ht = args[0], args[-1]
    before, after = _bind_before(*args, ws), _bind_after(*args, ws)
    for gos in (before, after):
        with (recording() if recs is not None else nullcontext()) as rec:
            for go in gos:
                go()
        if recs is not None:
            recs.append(rec)
        if gos is before and p.compose is not None:
            _exchange(p, ws, group, args[1].device)
    if p.compose is not None:
        ht.masked_fill_(ws["drop"], 0.0)
