"""Context parallelism (CP) for long sequences: split the serial state walk into segments.

Without it the state walk runs ``N * HV * V/BV`` programs, each walking all
``ceil(len/64)`` chunks of its sequence in order: one long sequence with
few heads leaves most SMs idle. The state transition of a segment is
affine in its entering state (per chunk, ``S' = (exp(gc_last) I - Kd^T w) S
+ Kd^T u`` with ``Kd = k * exp(gc_last - gc)``), so with segments of
``SEG_CHUNKS`` chunks, in two forms by length:

* **chained** (4,096 to 16,383 tokens per sequence on average; 3 launches): phase A
  (:func:`.state_walk.state_walk_kernel` with ``SUMMARY``, all segments in parallel) gives
  each segment's ``S_end = M_s S_start + X_s`` by walking the block ``[I | 0]`` (``K + V``
  columns) through its chunks; phase C (the walk with ``CHAIN`` and inline outputs) finds
  its entering state by chaining the earlier segments' ``[M | X]`` from the initial state,
  then walks its segment; the last segment writes the final state.

* **long** (from :data:`CP_LONG_MIN_CHUNKS` chunks, 16,384 tokens, per sequence on average;
:func:`cp_long`): phase A and C are the transposed walk (:mod:`.state_walk_t`) at ``BV = 128``
(phase A walks ``[I ; 0]`` as ``S^T``: two programs of 128 rows per segment and head, storing
``[M^T ; X^T]`` k-last), phase B is :func:`segment_combine_t_kernel` (the serial pass, each
segment's transition fetched while the previous product runs), and every sequence is cut into
about :data:`CP_LONG_SEGMENTS` segments (:func:`cp_long_segment_chunks`), which bounds the
serial pass and gives phase C ``16 * N * HV`` programs of 128 state columns. Phase A walks
only what the gates have not made negligible: the intra-chunk kernel stores a bound on each
chunk's transition norm, ``M`` is dropped where the segment's bound is below ``exp(log_eps)``
(:attr:`.config.PrefillConfig.log_eps`) and
``X`` starts at the last chunk whose bound to the segment's end still reaches it
(:func:`.state_walk_t.state_walk_t_kernel`, ``TRUNC``). The chained form re-chains every
earlier segment in every phase-C program (quadratic in the segment count), and its
32-column tiles load each chunk's ``k``, ``q``, ``Tb``, ``Aqk`` four times per head: the
long path paid from 16,384 tokens on, not at 8,192 (numbers: docs/notes/long_context.md,
"Numbers behind the rules").

Segments are numbered with the slot rule of :mod:`.chunk_index` with
``BLOCK = SEG_CHUNKS * 64`` (no host sync). Cost: phase A walks ``K + V``
columns instead of ``V`` (about 2x the walk's work) and the chain or phase B adds
``n_segments`` serial ``K x K x V`` products; latency goes from
``chunks`` serial chunk steps to about ``2 * SEG_CHUNKS + chunks / SEG_CHUNKS``.

The rule (:func:`cp_segment_chunks`, host metadata only, so no sync): use
CP when the walk would have fewer programs than the GPU has SMs
(``N * HV * V/BV < n_sm``; 32 < 132 for one contest sequence at ``BV = 32``)
and the average sequence has at least ``CP_MIN_AVG_CHUNKS`` chunks
(``ceil(T/64) / N >= 64``, i.e. 4096 tokens; shorter walks were faster without CP);
then ``SEG_CHUNKS`` is the power of two nearest ``sqrt(2 * avg_chunks)``,
clamped to ``[2, 64]`` (16 at T = 8192, N = 1: 8 segments, the fastest there). Individual
lengths are unknown without a sync, so a batch of one long and many short
sequences is judged by its average; CP is correct for any lengths.
"""
from __future__ import annotations

import functools

import math
from typing import Optional

from .. import gpu_limits, interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import seq_bounds  # noqa: E402
from .dots import mm  # noqa: E402
from ..launch import FastLaunch, dtypes  # noqa: E402

__all__ = ["smem_per_block", "CP_MIN_AVG_CHUNKS", "CP_LONG_MIN_CHUNKS", "CP_LONG_SEGMENTS", "cp_long",
           "cp_long_segment_chunks", "segment_combine_t_kernel", "segment_combine_t_fwd",
           "cp_segment_chunks", "sm_count", "CP_SPLIT_MIN_CHUNKS", "cp_split",
           "segment_split_kernel", "segment_split_fwd"]

#: Average chunks per sequence from which CP is considered.
CP_MIN_AVG_CHUNKS = 64

def sm_count(device) -> int:
    """Streaming multiprocessors of ``device``; 132 (an H100/H200) off CUDA (cached)."""
    device = torch.device(device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return _cuda_sm_count(device.index)
    return 132


def smem_per_block(device) -> int:
    """Largest shared memory (bytes) one block may use on ``device``: the driver's opt-in
    limit on CUDA, the sm_90 figure off CUDA (:func:`kernels.gpu_limits.device_limits`)."""
    return gpu_limits.device_limits(device).smem_per_block


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


#: Average chunks per sequence from which context parallelism takes the long path
#: (:func:`cp_long`): 16,384 tokens.
CP_LONG_MIN_CHUNKS = 256
#: Segments per sequence of the long path.
CP_LONG_SEGMENTS = 16


def cp_long(T: int, N: int) -> bool:
    """Whether a context-parallel call takes the long path (transposed walks and a combine
    kernel, :func:`.pipeline._cp_long`): from :data:`CP_LONG_MIN_CHUNKS` chunks per sequence
    on average (below it the chained CP is faster; numbers: docs/notes/long_context.md,
    "Numbers behind the rules")."""
    return -(-int(T) // 64) / max(int(N), 1) >= CP_LONG_MIN_CHUNKS


def cp_long_segment_chunks(T: int, N: int) -> int:
    """Chunks per segment of the long path: the power of two nearest ``avg_chunks / 16``
    (:data:`CP_LONG_SEGMENTS` segments per sequence, the fastest split at every length
    measured), at least 2."""
    avg = -(-int(T) // 64) / max(int(N), 1)
    return int(max(2 ** round(math.log2(max(avg / CP_LONG_SEGMENTS, 1))), 2))


def cp_segment_chunks(T: int, N: int, HV: int, V: int, BV: int, n_sm: int,
                      min_avg_chunks: int = CP_MIN_AVG_CHUNKS) -> int:
    """Chunks per context-parallel segment, or 0 for no CP (the rule in the module doc)."""
    n_chunks = -(-int(T) // 64)
    avg = n_chunks / max(int(N), 1)
    if N * HV * (V // BV) >= n_sm or avg < min_avg_chunks:
        return 0
    seg = 2 ** round(math.log2(math.sqrt(2 * avg)))
    return int(min(max(seg, 2), 64))


@triton.jit(do_not_specialize=["T", "N"])
def segment_combine_t_kernel(
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    summ,           # [S, H, K + V, K] f32 segment transitions [M^T ; X^T] (phase A)
    s0,             # [S, H, V, K] f32 out: state entering each segment slot, k-last
    negl,           # [S, H] int32: 1 where phase A found the segment's M negligible
    seg_mult,       # [N] int32: slots per segment of each sequence (SPLIT) or None
    cu_seqlens,     # [N+1] int32/int64
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    SEG_T: tl.constexpr,        # tokens per segment slot
    USE_H0: tl.constexpr,
    DOT_PREC: tl.constexpr,
    SPLIT: tl.constexpr = False,  # a segment spans seg_mult[n] slots
):
    """Phase B for the transposed walks: one program per ``(sequence, head, BV state rows)``
    runs ``S_start(s+1)^T = S_start(s)^T M_s^T + X_s^T`` over the sequence's segments and
    stores every segment's entering state (segment 0's is the initial state). The loads of
    ``M_s^T`` and ``X_s^T`` do not depend on the state, so the loop's pipeline fetches the
    next segment's while this one's product runs."""
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos = seq_bounds(cu_seqlens, i_n, T)
    if SPLIT:
        m = tl.load(seg_mult + i_n)
    else:
        m = 1
    n_seg = tl.maximum(tl.cdiv(eos - bos, SEG_T * m), 1)
    slot0 = bos // SEG_T + i_n
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_vk = o_v[:, None] * K + o_k[None, :]
    o_kk = o_k[:, None] * K + o_k[None, :]
    if USE_H0:
        b_St = tl.load(h0 + (i_n * H + i_h).to(tl.int64) * (V * K) + o_vk)
    else:
        b_St = tl.zeros([BV, K], dtype=tl.float32)
    for i_s in tl.range(0, n_seg - 1, num_stages=2):
        slot = slot0 + i_s * m
        p_m = summ + (slot * H + i_h) * ((K + V) * K)
        full = tl.load(negl + slot * H + i_h) == 0
        # M^T [K, K], zeros (not read) where negligible
        b_mt = tl.load(p_m + o_kk, mask=full & (o_k[:, None] >= 0), other=0.0)
        b_xt = tl.load(p_m + K * K + o_vk)                 # X^T rows [BV, K]
        tl.store(s0 + (slot * H + i_h) * (V * K) + o_vk, b_St)
        b_St = mm(b_St, b_mt, DOT_PREC) + b_xt
    tl.store(s0 + ((slot0 + (n_seg - 1) * m) * H + i_h) * (V * K) + o_vk, b_St)


def segment_combine_t_fwd(summary: torch.Tensor, s0: torch.Tensor, negligible: torch.Tensor,
                          cu_seqlens: torch.Tensor,
                          initial_state: Optional[torch.Tensor], *, seg_t: int, T: int,
                          BV: int = 16, num_warps: int = 8, seg_mult=None,
                          defer: bool = False):
    """Launch :func:`segment_combine_t_kernel` (grid ``(N, HV, V // BV)``); fills ``s0``
    (`[S, HV, V, K]`) from ``summary`` (`[S, HV, K + V, K]`) and phase A's ``negligible``
    flags (`[S, HV]` int32). bf16 products (the walks round the state to bf16 for every
    product anyway) and ``BV = 16``: half the time of tf32x3 at ``BV = 32``
    (docs/notes/long_context.md, "Numbers behind the rules"). ``seg_mult``: `[N]` int32,
    slots of ``seg_t`` tokens per segment of each sequence (:func:`segment_split_fwd`)."""
    _, H, KV, K = summary.shape
    V = KV - K
    N = cu_seqlens.numel() - 1
    args = (initial_state, summary, s0, negligible, seg_mult, cu_seqlens, T, N)
    key = (H, K, V, BV, seg_t, num_warps,   # what the keyword arguments follow from
           dtypes(initial_state, summary, s0, negligible, seg_mult, cu_seqlens))
    go = _COMBINE_T_LAUNCH.bind_keyed(key, (N, H, V // BV), args, lambda: dict(
        H=H, K=K, V=V, BV=BV, SEG_T=seg_t, USE_H0=initial_state is not None,
        DOT_PREC="bf16", SPLIT=seg_mult is not None, num_warps=num_warps))
    if defer:
        return go
    go()


_COMBINE_T_LAUNCH = FastLaunch(segment_combine_t_kernel)

#: Chunks per (coarse) segment of the long path from which the split is chosen on the device
#: (:func:`segment_split_kernel`): below it the walks are short and 32 segments do not pay.
CP_SPLIT_MIN_CHUNKS = 64


def cp_split(seg_chunks: int) -> bool:
    """Whether the long path with ``seg_chunks`` chunks per segment (the rule's,
    :func:`cp_long_segment_chunks`) lets the device halve its segments per sequence
    (:func:`segment_split_kernel`); numbers: docs/notes/long_context.md, "The split
    chosen on the device"."""
    return int(seg_chunks) >= CP_SPLIT_MIN_CHUNKS


@triton.jit(do_not_specialize=["T", "N"])
def segment_split_kernel(
    lb,             # [chunk slots, H] f32 log transition bound per chunk (intra-chunk kernel)
    cu_seqlens,     # [N+1] int32/int64
    seg_mult,       # [N] int32 out: 1 (fine segments) or 2 (twice as long)
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,            # value heads
    HP: tl.constexpr,           # H rounded up to a power of two
    SEG_C: tl.constexpr,        # chunks per fine segment
    BLK: tl.constexpr,          # chunks per load (a multiple of SEG_C)
    BUDGET: tl.constexpr,       # walks that fit one wave (the SMs)
    LOG_EPS: tl.constexpr,      # negligible below exp(LOG_EPS) (PrefillConfig.log_eps)
):
    """One program per sequence: counts its (fine segment, head) pairs, the sequence's last
    segment excepted, whose chunks' log bounds sum above ``LOG_EPS``: the segments whose
    ``M`` phase A walks in full. Fine segments (``seg_mult = 1``) when there are some and
    twice their number (the ``M`` and ``X`` walks) fits one wave of ``BUDGET``, else
    segments of two fine slots (``seg_mult = 2``, the host rule's). With one or two
    long-memory heads the fine split halves phase A's walks; with none they are short
    anyway, with many they do not fit one wave and the coarse split's shorter phase B
    wins."""
    i_n = tl.program_id(0)
    bos, eos = seq_bounds(cu_seqlens, i_n, T)
    n_c = tl.cdiv(eos - bos, 64)
    n_f = tl.cdiv(n_c, SEG_C)
    p_lb = lb + (bos // 64 + i_n) * H
    o_j = tl.arange(0, BLK)
    o_h = tl.arange(0, HP)
    NS: tl.constexpr = BLK // SEG_C
    o_s = tl.arange(0, NS)
    n_slow = tl.zeros([], dtype=tl.int32)
    for j0 in range(0, n_c, BLK):
        b_lb = tl.load(p_lb + (j0 + o_j)[:, None] * H + o_h[None, :],
                       mask=((j0 + o_j) < n_c)[:, None] & (o_h < H)[None, :], other=0.0)
        b_seg = tl.sum(tl.reshape(b_lb, (NS, SEG_C, HP)), axis=1)            # [NS, HP]
        i_f = j0 // SEG_C + o_s                                               # fine segment
        slow = (b_seg > LOG_EPS) & (i_f < n_f - 1)[:, None] & (o_h < H)[None, :]
        n_slow += tl.sum(tl.sum(slow.to(tl.int32), axis=1), axis=0)
    fine = (n_slow > 0) & (2 * n_slow <= BUDGET)
    tl.store(seg_mult + i_n, tl.where(fine, 1, 2).to(tl.int32))


def segment_split_fwd(log_bound: torch.Tensor, cu_seqlens: torch.Tensor,
                      seg_mult: torch.Tensor, *, seg_chunks: int, T: int, n_sm: int,
                      log_eps: float, defer: bool = False):
    """Launch :func:`segment_split_kernel` (one program per sequence): fills ``seg_mult``
    (`[N]` int32) from the intra-chunk kernel's ``log_bound`` (`[T // 64 + N, HV]` f32);
    ``seg_chunks``: chunks per fine segment (a power of two); ``log_eps``: the negligible
    threshold (:attr:`.config.PrefillConfig.log_eps`)."""
    H = log_bound.shape[1]
    N = cu_seqlens.numel() - 1
    key = (H, int(seg_chunks), int(n_sm), log_eps,   # what the keyword arguments follow from
           dtypes(log_bound, cu_seqlens, seg_mult))
    args = (log_bound, cu_seqlens, seg_mult, T, N)
    go = _SPLIT_LAUNCH.bind_keyed(key, (N,), args, lambda: dict(
        H=H, HP=triton.next_power_of_2(H), SEG_C=int(seg_chunks),
        BLK=max(int(seg_chunks), 2048), BUDGET=int(n_sm), LOG_EPS=log_eps, num_warps=8))
    if defer:
        return go
    go()


_SPLIT_LAUNCH = FastLaunch(segment_split_kernel)
