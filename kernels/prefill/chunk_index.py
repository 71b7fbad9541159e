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
"""
from __future__ import annotations

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["BT", "num_slots", "prepare_chunk_indices", "locate_block", "chunk_of_program",
           "slot_of"]

#: Chunk size of the chunked prefill (tokens).
BT = 64


def num_slots(T: int, N: int, block: int = BT) -> int:
    """Upper bound on the number of blocks of ``block`` tokens over ``N`` sequences of
    total length ``T`` (``T // block + N``): the no-sync grid size and slot count."""
    return int(T) // int(block) + int(N)


def prepare_chunk_indices(cu_seqlens: torch.Tensor, block: int = BT) -> torch.Tensor:
    """Host-built ``(sequence, chunk)`` table (syncs: reads ``cu_seqlens`` on the host).

    Args:
        cu_seqlens: `[N+1]` int32/int64 sequence boundaries.
        block: chunk size in tokens.
    Returns:
        `[NC, 2]` int32 on ``cu_seqlens.device``: row ``i`` is ``(n, c)``, the
        ``c``-th chunk of sequence ``n``; ``NC = sum(ceil(len_n / block))``.
    """
    bounds = cu_seqlens.tolist()  # device -> host copy: the sync this variant pays for
    rows = []
    for n in range(len(bounds) - 1):
        length = bounds[n + 1] - bounds[n]
        rows.extend((n, c) for c in range(triton.cdiv(length, block)))
    table = torch.tensor(rows, dtype=torch.int32).reshape(-1, 2)
    return table.to(cu_seqlens.device)  # host -> device copy


@triton.jit
def locate_block(i_p, cu_seqlens, N, BLOCK: tl.constexpr):
    """Device-side owner of slot ``i_p``: returns ``(i_n, i_b, bos, eos)``.

    ``i_n`` is the sequence, ``i_b`` the block inside it, ``bos``/``eos`` the
    sequence bounds (int64). The slot is real iff ``i_b * BLOCK < eos - bos``;
    the caller exits otherwise. Binary search over ``start(n) = cu[n] // BLOCK + n``.
    """
    lo = 0
    hi = N
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        s_mid = tl.load(cu_seqlens + mid).to(tl.int32) // BLOCK + mid
        ok = s_mid <= i_p
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    bos = tl.load(cu_seqlens + lo).to(tl.int64)
    eos = tl.load(cu_seqlens + lo + 1).to(tl.int64)
    i_b = i_p - (bos // BLOCK).to(tl.int32) - lo
    return lo, i_b, bos, eos


@triton.jit
def chunk_of_program(i_p, cu_seqlens, chunk_indices, N, BLOCK: tl.constexpr,
                     USE_INDICES: tl.constexpr):
    """``(i_n, i_c, bos, eos)`` of program ``i_p``: from the host table when
    ``USE_INDICES``, else from :func:`locate_block`. Valid iff ``i_c * BLOCK < eos - bos``."""
    if USE_INDICES:
        i_n = tl.load(chunk_indices + i_p * 2).to(tl.int32)
        i_c = tl.load(chunk_indices + i_p * 2 + 1).to(tl.int32)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        i_n, i_c, bos, eos = locate_block(i_p, cu_seqlens, N, BLOCK)
    return i_n, i_c, bos, eos


@triton.jit
def slot_of(i_n, i_c, bos, BLOCK: tl.constexpr):
    """Slot of block ``i_c`` of sequence ``i_n`` starting at token ``bos`` (int64)."""
    return bos // BLOCK + i_n + i_c
