"""The no-sync paths' answer to invalid ``cu_seqlens``: NaN outputs and a status, no sync.

Where the values of ``cu_seqlens`` are not checked on the host (CUDA with
``check_values=None`` on ``fused``/``graph``/``no_sync``, or ``check_values=False``
anywhere) the kernels stay in bounds whatever the values (:func:`.chunk_index.seq_bounds`),
but the numbers they produce from invalid boundaries mean nothing. The call's last
launch therefore checks ``cu_seqlens`` on the device (:func:`.chunk_index.cu_status`:
``cu[0] == 0``, ``cu[N] == T``, non-decreasing, every entry in ``[0, T]``) and, if any
check fails, overwrites **all** ``T`` output rows and **all** ``N`` final states with
NaN, so no consumer or correctness gate can take them for a result:

* ``fused`` / ``no_sync`` / ``unfused`` / ``fused_gates``: :func:`guard_kernel`, one
  extra launch after the call's kernels (PDL-launched after the walk where PDL is on);
* ``graph``: the same check inside the unpack kernel that copies the outputs out (no
  extra launch).

Why a call was rejected is readable without a sync: pass ``status=`` (a `[1]` int32
tensor on the inputs' device) and the guard writes the :data:`.chunk_index.CU_START` /
``CU_END`` / ``CU_DECREASING`` / ``CU_RANGE`` bits there (0: valid); read it whenever
the stream has reached that point (:func:`describe_status` turns it into words).

Cost on a valid call: one launch of ``min(ceil(n / 4096), 264)`` programs that each
read the ``N + 1`` entries of ``cu_seqlens`` and exit (``graph``: those reads inside
the unpack kernel's programs). Everything is stream-ordered and CUDA-graph capturable.
"""
from __future__ import annotations

from typing import Optional

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import CU_DECREASING, CU_END, CU_RANGE, CU_START, cu_status  # noqa: E402
from .pdl import grid_wait, launch_options  # noqa: E402

__all__ = ["guard_fwd", "guard_kernel", "guard_tail", "check_status_tensor",
           "describe_status", "GUARD_BLOCK", "GUARD_MAX_PROGRAMS"]

GUARD_BLOCK = 4096
GUARD_MAX_PROGRAMS = 264   # 2 per SM of an H100 SXM; the fill loops past it
CU_BLOCK = 128             # entries of cu_seqlens per load in cu_status

_WORDS = ((CU_START, "cu_seqlens[0] != 0"), (CU_END, "cu_seqlens[-1] != T"),
          (CU_DECREASING, "cu_seqlens decreases"), (CU_RANGE, "a cu_seqlens entry is outside [0, T]"))


def describe_status(status) -> str:
    """Words for a status value (an int or a one-element tensor; reading a CUDA tensor
    syncs): ``"ok"`` or the failed checks joined by ``"; "``."""
    v = int(status.item() if isinstance(status, torch.Tensor) else status)
    return "ok" if v == 0 else "; ".join(w for bit, w in _WORDS if v & bit)


def check_status_tensor(status, device) -> None:
    """Metadata check of a caller's ``status`` buffer (None passes)."""
    if status is None:
        return
    if not isinstance(status, torch.Tensor):
        raise TypeError(f"status must be a torch.Tensor or None, got {type(status).__name__}")
    if status.dtype != torch.int32 or status.numel() != 1:
        raise ValueError(f"status must be a one-element int32 tensor, got {status.dtype} "
                         f"with shape {tuple(status.shape)}")
    if status.device != device:
        raise ValueError(f"status must be on {device} (like q), got {status.device}")


@triton.jit
def guard_tail(st, status, flags, n_flags, HAS_STATUS: tl.constexpr, HAS_FLAGS: tl.constexpr,
               BLOCK: tl.constexpr):
    """Program 0 stores the status bits; on invalid input the programs zero the one-launch
    path's flags (grid-stride), which walkers that walked nothing left set."""
    i_p = tl.program_id(0)
    n_p = tl.num_programs(0)
    if HAS_STATUS:
        if i_p == 0:
            tl.store(status, st)
    if HAS_FLAGS:
        if st != 0:
            for i0 in range(i_p * BLOCK, n_flags, n_p * BLOCK):
                o_i = i0 + tl.arange(0, BLOCK)
                tl.store(flags + o_i, tl.zeros([BLOCK], dtype=tl.int32), mask=o_i < n_flags)


@triton.jit(do_not_specialize=["T", "N", "n_o", "n_ht", "n_flags"])
def guard_kernel(
    cu_seqlens,     # [N+1] int32/int64, as the caller passed it
    o,              # [T, H, V] bf16 output of the call (NaN-filled if invalid)
    ht,             # [N, H, V, K] f32 final state of the call (NaN-filled if invalid)
    status,         # [1] int32 out: cu_status bits (HAS_STATUS) or None
    flags,          # one-launch path's int32 flags, zeroed if invalid (HAS_FLAGS) or None
    T, N, n_o, n_ht, n_flags,
    HAS_STATUS: tl.constexpr,
    HAS_FLAGS: tl.constexpr,
    PDL_WAIT: tl.constexpr,     # launched with PDL: wait before touching what others write
    BLOCK: tl.constexpr,
    CU_BLOCK: tl.constexpr,
):
    st = cu_status(cu_seqlens, N, T, CU_BLOCK)   # an input of the call: before the wait
    grid_wait(PDL_WAIT)
    guard_tail(st, status, flags, n_flags, HAS_STATUS, HAS_FLAGS, BLOCK)
    if st != 0:
        i_p = tl.program_id(0).to(tl.int64)
        n_p = tl.num_programs(0)
        for i0 in range(i_p * BLOCK, n_o, n_p * BLOCK):
            o_i = i0 + tl.arange(0, BLOCK)
            tl.store(o + o_i, tl.full([BLOCK], float("nan"), tl.float32).to(o.dtype.element_ty),
                     mask=o_i < n_o)
        for i0 in range(i_p * BLOCK, n_ht, n_p * BLOCK):
            o_i = i0 + tl.arange(0, BLOCK)
            tl.store(ht + o_i, tl.full([BLOCK], float("nan"), tl.float32), mask=o_i < n_ht)


def guard_fwd(cu_seqlens: torch.Tensor, o: torch.Tensor, ht: torch.Tensor, *,
              status: Optional[torch.Tensor] = None, flags: Optional[torch.Tensor] = None,
              pdl: bool = False) -> None:
    """Launch :func:`guard_kernel` once on the call's outputs (see the module docstring).

    Args:
        cu_seqlens: `[N+1]` int32/int64 as the caller passed it.
        o: `[T, HV, D]` bf16 output; ``T`` is its first dimension.
        ht: `[N, HV, D, D]` f32 final state.
        status: optional `[1]` int32: receives the status bits.
        flags: the one-launch path's flag buffer, or None.
        pdl: launch with PDL (Hopper; ignored elsewhere).
    """
    T, N = o.shape[0], cu_seqlens.numel() - 1
    n = max(o.numel(), ht.numel(), 1)
    grid = (min(triton.cdiv(n, GUARD_BLOCK), GUARD_MAX_PROGRAMS),)
    opts = launch_options(pdl, o.device)
    guard_kernel[grid](
        cu_seqlens, o, ht, status, flags, T, N, o.numel(), ht.numel(),
        flags.numel() if flags is not None else 0,
        HAS_STATUS=status is not None, HAS_FLAGS=flags is not None, PDL_WAIT=bool(opts),
        BLOCK=GUARD_BLOCK, CU_BLOCK=CU_BLOCK, **opts)
