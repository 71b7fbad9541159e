"""Context parallelism (CP) for long sequences: split the serial state walk into segments.

Without it the state walk runs ``N * HV * V/BV`` programs, each walking all
``ceil(len/64)`` chunks of its sequence in order: one long sequence with
few heads leaves most SMs idle. The state transition of a segment is
affine in its entering state (per chunk, ``S' = (exp(gc_last) I - Kd^T w) S
+ Kd^T u`` with ``Kd = k * exp(gc_last - gc)``), so with segments of
``SEG_CHUNKS`` chunks:

* **phase A** (:func:`.state_walk.state_walk_kernel` with ``SUMMARY``, all
  segments in parallel): each segment's ``S_end = M_s S_start + X_s`` by
  walking the block ``[I | 0]`` (``K + V`` columns) through its chunks;
* **phase B** (:func:`segment_combine_kernel`, one program per ``(sequence,
  head, V tile)``): the short serial pass ``S_start(s+1) = M_s S_start(s) + X_s``
  from the initial state; ``M_s @ S`` is done in ``BK``-row blocks of ``S``
  read back from the buffer just written (``tl.debug_barrier`` between);
* **phase C** (the state walk with ``FROM_S0`` and ``FUSE_OUTPUT``, all
  segments in parallel): outputs from each segment's true entering state;
  the last segment writes the final state.

Segments are numbered with the slot rule of :mod:`.chunk_index` with
``BLOCK = SEG_CHUNKS * 64`` (no host sync). Cost: phase A walks ``K + V``
columns instead of ``V`` (about 2x the walk's work) and phase B adds
``n_segments`` serial ``K x K x V`` products; latency goes from
``chunks`` serial chunk steps to about ``2 * SEG_CHUNKS + chunks / SEG_CHUNKS``.

The rule (:func:`cp_segment_chunks`, host metadata only, so no sync): use
CP when the walk would have fewer programs than the GPU has SMs
(``N * HV * V/BV < n_sm``; 32 < 132 for one contest sequence at ``BV = 32``)
and the average sequence has at least ``CP_MIN_AVG_CHUNKS`` chunks
(``ceil(T/64) / N >= 64``, i.e. 4096 tokens; ``PrefillConfig.cp_min_avg_chunks``;
at T = 2048 the walk without CP measured faster on an H200);
then ``SEG_CHUNKS`` is the power of two nearest ``sqrt(2 * avg_chunks)``,
clamped to ``[2, 64]`` (16 at T = 8192, N = 1: 8 segments; measured on an H200,
16 beat 8 and 4, docs/notes.md). Individual
lengths are unknown without a sync, so a batch of one long and many short
sequences is judged by its average; CP is correct for any lengths.
"""
from __future__ import annotations

import functools

import math
from typing import Optional

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import seq_bounds  # noqa: E402
from .state_walk import load_state_tile  # noqa: E402

__all__ = ["CP_MIN_AVG_CHUNKS", "cp_segment_chunks", "segment_combine_kernel", "segment_combine",
           "segment_combine_fwd", "COMBINE_DOT_PRECISION", "sm_count"]

#: Average chunks per sequence from which CP is considered.
CP_MIN_AVG_CHUNKS = 64
#: ``input_precision`` of ``M_s @ S`` in the phase-B combine kernel (3 tf32 passes: ~fp32
#: accuracy); the inline chain of phase C takes ``PrefillConfig.cp_chain_precision``.
COMBINE_DOT_PRECISION = "tf32x3"


def sm_count(device) -> int:
    """Streaming multiprocessors of ``device``; 132 (an H100/H200) off CUDA (cached)."""
    device = torch.device(device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return _cuda_sm_count(device.index)
    return 132


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


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
def segment_combine_kernel(
    h0,             # [N, H, V, K] f32 initial state, k-last (USE_H0) or None
    summ,           # [S, H, K, K+V] f32 segment transitions [M | X] (phase A)
    s0,             # [S, H, K, V] f32 out: state entering each segment slot
    cu_seqlens,     # [N+1] int32/int64
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,           # row block of S in M @ S
    SEG_T: tl.constexpr,        # tokens per segment
    USE_H0: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos = seq_bounds(cu_seqlens, i_n, T)
    n_seg = tl.maximum(tl.cdiv(eos - bos, SEG_T), 1)
    slot0 = bos // SEG_T + i_n
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_b = tl.arange(0, BK)
    if USE_H0:
        b_S = load_state_tile(h0, i_n, i_h, i_v, H, K, V, BV)
    else:
        b_S = tl.zeros([K, BV], dtype=tl.float32)
    for i_s in range(0, n_seg - 1):
        slot = slot0 + i_s
        p_s0 = s0 + (slot * H + i_h) * K * V
        p_m = summ + (slot * H + i_h) * K * (K + V)
        tl.store(p_s0 + o_k[:, None] * V + o_v[None, :], b_S)
        tl.debug_barrier()   # the row blocks below are read by other threads
        b_S = tl.load(p_m + o_k[:, None] * (K + V) + K + o_v[None, :])        # X_s
        for i_b in tl.static_range(0, K // BK):
            b_m = tl.load(p_m + o_k[:, None] * (K + V) + i_b * BK + o_b[None, :])  # M_s[:, blk]
            b_s = tl.load(p_s0 + (i_b * BK + o_b[:, None]) * V + o_v[None, :])    # S[blk, :]
            b_S += tl.dot(b_m, b_s, input_precision=DOT_PREC)
    slot = slot0 + n_seg - 1
    tl.store(s0 + ((slot * H + i_h) * K + o_k[:, None]) * V + o_v[None, :], b_S)


def segment_combine_fwd(summary: torch.Tensor, s0: torch.Tensor, cu_seqlens: torch.Tensor,
                        initial_state: Optional[torch.Tensor], *, seg_t: int, T: int,
                        BV: int, BK: int = 32, num_warps: int = 4) -> None:
    """Launch :func:`segment_combine_kernel` once (grid ``(N, HV, V // BV)``); fills ``s0``."""
    _, H, K, KV = summary.shape
    V = KV - K
    N = cu_seqlens.numel() - 1
    segment_combine_kernel[(N, H, V // BV)](
        initial_state, summary, s0, cu_seqlens, T, N,
        H=H, K=K, V=V, BV=BV, BK=min(BK, K), SEG_T=seg_t, USE_H0=initial_state is not None,
        DOT_PREC=COMBINE_DOT_PRECISION, num_warps=num_warps,
    )


def segment_combine(summary: torch.Tensor, cu_seqlens: torch.Tensor,
                    initial_state: Optional[torch.Tensor], seg_chunks: int, *,
                    BV: int = 32) -> torch.Tensor:
    """Phase B alone: the state entering every segment, from the segment transitions.

    Args:
        summary: `[T // (64 seg_chunks) + N, HV, K, K + V]` f32 per segment slot
            ``[M | X]`` (phase A; the last segment of each sequence is not read).
        cu_seqlens: `[N+1]` int32/int64.
        initial_state: `[N, HV, V, K]` f32 k-last, or None (zeros).
        seg_chunks: chunks per segment.
        BV: state tile width (a power of two dividing ``V``, >= 16).
    Returns:
        `[T // (64 seg_chunks) + N, HV, K, V]` f32 entering state per segment slot
        (gap slots unwritten).
    """
    S, H, K, KV = summary.shape
    s0 = torch.empty(S, H, K, KV - K, dtype=torch.float32, device=summary.device)
    # the largest T with this slot count (the bounds' clamp; slots stay < S)
    T = (S - (cu_seqlens.numel() - 1) + 1) * 64 * seg_chunks - 1
    segment_combine_fwd(summary, s0, cu_seqlens, initial_state, seg_t=64 * seg_chunks, T=T,
                        BV=min(BV, KV - K))
    return s0
