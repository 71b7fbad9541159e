"""Chunk bookkeeping: which (sequence, chunk) a program owns, and where per-chunk data lives.

Sequences are packed along ``T`` and cut into chunks of ``BT = 64`` tokens
(the last chunk of a sequence may be short; an empty sequence has none).
Two ways to hand chunks to programs, both used by the same kernels through
the ``USE_INDICES`` flag:

* **Host version** (:func:`prepare_chunk_indices`, the seed's starting shape):
  read ``cu_seqlens`` on the host (a device-to-host copy and a sync on a GPU),
  build the ``[NC, 2]`` table of ``(sequence, chunk)`` pairs, copy it back.
  The grid has exactly ``NC`` programs.
* **Device version** (:func:`locate_block`, no sync): launch an upper bound of
  ``T // BLOCK + N`` programs; each program finds its sequence by a binary
  search over ``cu_seqlens`` in the kernel and exits early when its id falls
  in a gap. At most ``N`` programs idle.

Slot rule, shared by both versions so a buffer indexed by chunk has one
layout whichever variant filled it::

    slot(n, c) = cu_seqlens[n] // BLOCK + n + c,    0 <= c < ceil(len_n / BLOCK)

It is injective and ``slot < T // BLOCK + N`` (:func:`num_slots`): with
``bos = BLOCK * m + r`` the chunks of sequence ``n`` end before
``(bos + len) // BLOCK + n + 1``, which is where sequence ``n + 1`` starts.
``start(n) = cu_seqlens[n] // BLOCK + n`` is strictly increasing, so the
owner of slot ``p`` is the largest ``n`` with ``start(n) <= p``. The same rule
with ``BLOCK = SEG_CHUNKS * 64`` numbers the context-parallel segments.

Memory safety whatever ``cu_seqlens`` holds: every kernel reads a sequence's
bounds through :func:`seq_bounds`, which clamps them into ``[0, T]`` with
``eos >= bos``, and :func:`locate_block` searches over the clamped starts and
marks a slot whose block index would be negative as not real. So no token row
outside ``[0, T)`` and no slot outside ``[0, num_slots)`` is ever addressed. For
valid ``cu_seqlens`` (``0 = cu[0] <= ... <= cu[N] = T``) the clamps are no-ops.
Invalid values still give meaningless numbers; :func:`cu_status` tells them apart
on the device (:mod:`.guard` turns the call's outputs into NaN).
"""
from __future__ import annotations

from typing import Optional

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["BT", "num_slots", "prepare_chunk_indices", "locate_block", "chunk_of_program",
           "slot_of", "bound_total", "bound_suffix_start", "unit_bounds", "seq_bounds", "cu_status", "CU_START", "CU_END", "CU_DECREASING",
           "CU_RANGE"]

#: Bits of :func:`cu_status` (and of the status tensor a call fills, see :mod:`.guard`).
CU_START = 1        # cu_seqlens[0] != 0
CU_END = 2          # cu_seqlens[N] != T
CU_DECREASING = 4   # some cu_seqlens[i] > cu_seqlens[i + 1]
CU_RANGE = 8        # some entry outside [0, T]

#: Chunk size of the chunked prefill (tokens).
BT = 64


def num_slots(T: int, N: int, block: int = BT) -> int:
    """Upper bound on the number of blocks of ``block`` tokens over ``N`` sequences of
    total length ``T`` (``T // block + N``): the no-sync grid size and slot count."""
    return int(T) // int(block) + int(N)


def prepare_chunk_indices(cu_seqlens: torch.Tensor, block: int = BT,
                          T: Optional[int] = None) -> torch.Tensor:
    """Host-built ``(sequence, chunk)`` table (syncs: reads ``cu_seqlens`` on the host).

    Args:
        cu_seqlens: `[N+1]` int32/int64 sequence boundaries.
        block: chunk size in tokens.
        T: total tokens; if given, the bounds are clamped as :func:`seq_bounds` does
            (the table of unchecked values stays at most ``T // block + N`` rows).
    Returns:
        `[NC, 2]` int32 on ``cu_seqlens.device``: row ``i`` is ``(n, c)``, the
        ``c``-th chunk of sequence ``n``; ``NC = sum(ceil(len_n / block))``.
    """
    bounds = cu_seqlens.tolist()  # device -> host copy: the sync this variant pays for
    rows = []
    for n in range(len(bounds) - 1):
        bos, eos = bounds[n], bounds[n + 1]
        if T is not None:
            bos = min(max(bos, 0), T)
            eos = min(max(eos, bos), T)
        length = eos - bos
        rows.extend((n, c) for c in range(triton.cdiv(length, block)))
    table = torch.tensor(rows, dtype=torch.int32).reshape(-1, 2)
    return table.to(cu_seqlens.device)  # host -> device copy


@triton.jit
def seq_bounds(cu_seqlens, i_n, T):
    """Bounds ``(bos, eos)`` (int64) of sequence ``i_n``, clamped into ``[0, T]`` with
    ``eos >= bos``: no-ops for valid ``cu_seqlens``, in bounds for any values."""
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    bos = tl.minimum(tl.maximum(bos, 0), T)
    eos = tl.minimum(tl.maximum(eos, bos), T)
    return bos, eos


@triton.jit
def cu_status(cu_seqlens, N, T, BLOCK: tl.constexpr):
    """Validity bits of ``cu_seqlens`` (0: valid; else an OR of ``CU_START``, ``CU_END``,
    ``CU_DECREASING``, ``CU_RANGE``): reads all ``N + 1`` entries, ``BLOCK`` at a time."""
    st = tl.where(tl.load(cu_seqlens).to(tl.int64) != 0, 1, 0)
    st = st | tl.where(tl.load(cu_seqlens + N).to(tl.int64) != T, 2, 0)
    for i0 in range(0, N + 1, BLOCK):
        o_i = i0 + tl.arange(0, BLOCK)
        b_x = tl.load(cu_seqlens + o_i, mask=o_i <= N, other=0).to(tl.int64)
        b_y = tl.load(cu_seqlens + o_i + 1, mask=o_i < N, other=0).to(tl.int64)
        dec = tl.max(((b_y < b_x) & (o_i < N)).to(tl.int32), axis=0)
        rng = tl.max((((b_x < 0) | (b_x > T)) & (o_i <= N)).to(tl.int32), axis=0)
        st = st | (dec * 4) | (rng * 8)
    return st


@triton.jit
def locate_block(i_p, cu_seqlens, N, T, BLOCK: tl.constexpr):
    """Device-side owner of slot ``i_p``: returns ``(i_n, i_b, bos, eos)``.

    ``i_n`` is the sequence, ``i_b`` the block inside it, ``bos``/``eos`` the
    sequence bounds (int64, clamped by :func:`seq_bounds`). The slot is real iff
    ``i_b * BLOCK < eos - bos``; the caller exits otherwise. Binary search over
    ``start(n) = clamp(cu[n], 0, T) // BLOCK + n``. With invalid (decreasing)
    ``cu_seqlens`` the search can land before the owner's start: that slot gets
    ``eos = bos`` and ``i_b = 1`` (not real).
    """
    lo = 0
    hi = N
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        c_mid = tl.minimum(tl.maximum(tl.load(cu_seqlens + mid).to(tl.int64), 0), T)
        s_mid = (c_mid // BLOCK).to(tl.int32) + mid
        ok = s_mid <= i_p
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    bos, eos = seq_bounds(cu_seqlens, lo, T)
    i_b = i_p - (bos // BLOCK).to(tl.int32) - lo
    eos = tl.where(i_b < 0, bos, eos)
    i_b = tl.where(i_b < 0, 1, i_b)
    return lo, i_b, bos, eos


@triton.jit
def unit_bounds(i_u, cu_seqlens, N, T, SEG_T: tl.constexpr, SUMMARY: tl.constexpr,
                seg_mult, SPLIT: tl.constexpr):
    """Walk unit ``i_u``: ``(i_n, i_s, bos, eos, ubos, ueos, skip)`` -- the sequence, the
    segment, the sequence's bounds, the unit's token range and whether the unit has nothing
    to do. ``SEG_T == 0``: sequence ``i_u`` whole (never skipped). Else context-parallel
    segment slot ``i_u`` (:func:`locate_block` with ``BLOCK = SEG_T``), skipped when a gap
    slot (segment 0 of an empty sequence is real: it hands the initial state through) or,
    with ``SUMMARY``, a sequence's last segment (it needs no transition). With ``SPLIT``
    a unit spans ``m = seg_mult[i_n]`` slots of ``SEG_T`` tokens (1 or 2, chosen on the
    device: :func:`.context_parallel.segment_split_kernel`) and the slots between units
    skip."""
    if SEG_T == 0:
        bos, eos = seq_bounds(cu_seqlens, i_u, T)
        i_n, i_s, ubos, ueos, skip = i_u, 0, bos, eos, False
    else:
        i_n, i_s, bos, eos = locate_block(i_u, cu_seqlens, N, T, SEG_T)
        ubos = bos + i_s * SEG_T
        if SPLIT:
            m = tl.load(seg_mult + i_n)
            ueos = tl.minimum(ubos + SEG_T * m, eos)
            skip = ((i_s > 0) & (ubos >= eos)) | (i_s % m != 0)
        else:
            ueos = tl.minimum(ubos + SEG_T, eos)
            skip = (i_s > 0) & (ubos >= eos)
        if SUMMARY:
            skip = skip | (ueos >= eos)
    return i_n, i_s, bos, eos, ubos, ueos, skip


@triton.jit
def chunk_of_program(i_p, cu_seqlens, chunk_indices, N, T, BLOCK: tl.constexpr,
                     USE_INDICES: tl.constexpr):
    """``(i_n, i_c, bos, eos)`` of program ``i_p``: from the host table when
    ``USE_INDICES``, else from :func:`locate_block`. Valid iff ``i_c * BLOCK < eos - bos``."""
    if USE_INDICES:
        i_n = tl.load(chunk_indices + i_p * 2).to(tl.int32)
        i_c = tl.load(chunk_indices + i_p * 2 + 1).to(tl.int32)
        bos, eos = seq_bounds(cu_seqlens, i_n, T)
    else:
        i_n, i_c, bos, eos = locate_block(i_p, cu_seqlens, N, T, BLOCK)
    return i_n, i_c, bos, eos


@triton.jit
def slot_of(i_n, i_c, bos, BLOCK: tl.constexpr):
    """Slot of block ``i_c`` of sequence ``i_n`` starting at token ``bos`` (int64)."""
    return bos // BLOCK + i_n + i_c


@triton.jit
def bound_total(p_lb, n_c, H: tl.constexpr):
    """Sum of the log transition bounds of chunks ``0 .. n_c - 1`` at ``p_lb`` (stride ``H``,
    the ``[chunk slots, H]`` bounds of the intra-chunk kernel)."""
    o_j = tl.arange(0, 128)
    tot = tl.zeros([], dtype=tl.float32)
    for j0 in range(0, n_c, 128):
        tot += tl.sum(tl.load(p_lb + (j0 + o_j) * H, mask=j0 + o_j < n_c, other=0.0))
    return tot


@triton.jit
def bound_suffix_start(p_lb, n_c, H: tl.constexpr, LOG_EPS: tl.constexpr):
    """The last chunk ``j`` whose bounds summed from chunk ``n_c - 1`` back to ``j`` reach
    ``LOG_EPS`` (what entered before ``j`` is negligible at the end), else 0."""
    acc = tl.zeros([], dtype=tl.float32)
    j = n_c
    while (j > 0) & (acc > LOG_EPS):
        j -= 1
        acc += tl.load(p_lb + j * H)
    return j
