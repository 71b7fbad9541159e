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

No host sync beyond the collective: which sequence a rank's first and last tokens belong to
is found on the device (entries of ``cu_seqlens`` at or below them, counted). Final states: row ``n`` of the returned state is
sequence ``n``'s on the rank that holds its last token (an empty sequence: the rank holding
the token at its position, the last rank at ``T``), zero on the others, so a sum
all-reduce over the group assembles all of them.

Bad input: metadata and the partition are checked on the host before anything is launched
(a ``TypeError``/``ValueError`` naming the argument); the values of ``cu_seqlens`` on the
host where it is not on CUDA (``check_values=None``), else on the device: an invalid global
``cu_seqlens`` makes ``cu_local`` fail the walk's guard (:mod:`.guard`), so every output row
and final state of every rank is NaN.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from .. import interpret

interpret.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..spec import resolve_scale, validate_prefill_inputs  # noqa: E402
from .chunk_index import BT, num_slots, seq_bounds  # noqa: E402
from .context_parallel import cp_long_segment_chunks, segment_combine_t_fwd  # noqa: E402
from .dots import mm  # noqa: E402
from .intra_chunk import intra_chunk_fwd  # noqa: E402
from ..launch import FastLaunch  # noqa: E402
from .plan import fitted_config, intra_kwargs  # noqa: E402
from .state_walk_t import state_walk_t_fwd  # noqa: E402

__all__ = ["prefill_multi_gpu", "even_bounds", "exchange_bytes", "piece_compose_kernel"]


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


#: torch's all-gather into one tensor (``all_gather_single`` from torch 2.12; the older name
#: before it, which 2.12 deprecates).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


_COMPOSE_LAUNCH = FastLaunch(piece_compose_kernel)


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
    """
    if group is None and not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (no default group)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    shape = validate_prefill_inputs(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                                    check_values=False)
    t0, t1, T = _check_bounds(bounds, world, rank, q.shape[0])
    if check_values is None:
        check_values = q.device.type != "cuda"
    if check_values:
        cu = cu_seqlens.detach().to("cpu", torch.int64)
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) != T:
            raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at "
                             f"bounds[-1] = {T}, got {cu.tolist()[:16]}")
    cfg = fitted_config(config, shape.head_dim)
    scale = resolve_scale(scale, shape.head_dim)
    HV, D, T_r, N = shape.num_v_heads, shape.head_dim, t1 - t0, cu_seqlens.numel() - 1
    dev = q.device

    # the rank's boundaries, on the device; an invalid global cu_seqlens fails the guard
    cu = cu_seqlens.to(torch.int64)
    cu_local = (cu - t0).clamp_(0, T_r)
    guard = not check_values
    if guard:
        bad = ((cu[0] != 0) | (cu[-1] != T) | (cu[1:] < cu[:-1]).any()
               | ((cu < 0) | (cu > T)).any())
        cu_local[0] = -bad.to(torch.int64)   # cu_local[0] != 0: the walk's guard NaN-fills

    seg_t = cp_long_segment_chunks(T_r, -(-N // world)) * BT
    S = num_slots(T_r, N, seg_t)
    bv = min(128, D)
    kw = dict(scale=scale, dot_precision=cfg.precision, BV=bv, num_warps=8 if bv >= 128 else 4,
              out_precision=cfg.precision, seg_t=seg_t)
    lb = torch.empty(num_slots(T_r, N), HV, dtype=torch.float32, device=dev)
    tb, gc, aq = intra_chunk_fwd(k, v, cu_local, q, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                                 scale=scale, log_bound=lb, **intra_kwargs(cfg))
    summ = torch.empty(S, HV, 2 * D, D, dtype=torch.float32, device=dev)
    negl = torch.empty(S, HV, dtype=torch.int32, device=dev)
    state_walk_t_fwd(q, k, v, tb, aq, gc, cu_local, summary=summ, num_stages=3, loop_stages=3,
                     log_bound=lb, negligible=negl, log_eps=cfg.log_eps,
                     summary_last=world > 1, **kw)

    h0 = state
    if world > 1:
        # the sequences holding this rank's first and last token (global == local index)
        seqs = (torch.stack([(cu <= t0).sum(), (cu <= t1 - 1).sum()]) - 1).clamp_(0, N - 1)
        starts = cu.index_select(0, seqs)
        n_first = seqs[:1]
        meta = torch.stack([seqs[1], (starts[1] >= t0).to(torch.int64)])
        mine = torch.empty(HV, 2 * D, D, dtype=torch.float32, device=dev)
        bz = min(16, D)
        _COMPOSE_LAUNCH.bind((HV, 2 * D // bz), (summ, negl, state, meta, cu_local, mine, T_r),
                             dict(H=HV, K=D, V=D, BV=bz, SEG_T=seg_t, USE_H0=state is not None,
                                  DOT_PREC=cfg.cp_chain_precision, num_warps=4))()
        zs = torch.empty(world * HV, 2 * D, D, dtype=torch.float32, device=dev)
        _all_gather(zs, mine, group=group)   # (concatenated: gloo and nccl)
        zs = zs.view(world, HV, 2 * D, D)
        if rank > 0:
            s_t = torch.zeros(HV, D, D, dtype=torch.float32, device=dev)
            for r in range(rank):   # S^T = S^T M_r^T + F_r^T
                s_t = torch.baddbmm(zs[r, :, D:], s_t, zs[r, :, :D])
            base = state if state is not None else torch.zeros(N, HV, D, D, device=dev)
            cont = (starts[0] < t0).reshape(1, 1, 1)
            enter = torch.where(cont, s_t, base.index_select(0, n_first)[0])
            h0 = base.index_copy(0, n_first, enter[None])

    s0 = torch.empty(S, HV, D, D, dtype=torch.float32, device=dev)
    o = torch.empty(T_r, HV, D, dtype=torch.bfloat16, device=dev)
    ht = torch.empty(N, HV, D, D, dtype=torch.float32, device=dev)
    segment_combine_t_fwd(summ, s0, negl, cu_local, h0, seg_t=seg_t, T=T_r, BV=min(16, D))
    state_walk_t_fwd(q, k, v, tb, aq, gc, cu_local, s0=s0, output=o, final_state=ht,
                     num_stages=2, loop_stages=2, guard=guard, **kw)
    if world > 1:
        # keep the sequences ending here: the last token's rank (an empty one: its position's)
        key = torch.where(cu[1:] > cu[:-1], cu[1:] - 1, cu[:-1].clamp(max=T - 1))
        ends_here = (key >= t0) & (key < t1)
        if guard:
            ends_here = ends_here | bad
        ht.masked_fill_(~ends_here.reshape(N, 1, 1, 1), 0.0)
    return o, ht
