"""The no-sync paths' answer to invalid ``cu_seqlens``: NaN outputs and a status, no sync.

Where the values of ``cu_seqlens`` are not checked on the host (CUDA with
``check_values=None``, or ``check_values=False`` anywhere) the kernels stay in bounds
whatever the values (:func:`.chunk_index.seq_bounds`), but the numbers they produce from
invalid boundaries mean nothing. So the kernel that writes the call's outputs checks
``cu_seqlens`` on the device (:func:`.chunk_index.cu_status`: ``cu[0] == 0``,
``cu[N] == T``, non-decreasing, every entry in ``[0, T]``) and, if any check fails,
writes NaN into **all** ``T`` output rows and **all** ``N`` final states instead of
results (:func:`guard_outputs`), so no consumer or correctness gate can take them for one:

* ``fused`` (every path: one launch, the walks, both context-parallel paths) and the
  compositions before it: inside the last kernel -- its programs each read
  ``cu_seqlens`` (``N + 1`` entries) before walking; no extra launch. On the one-launch
  path the chunk programs read it too and release no chunk to the walkers if it is
  invalid (no flag is left set);
* ``graph``: inside the unpack kernel that copies the outputs out;
* ``recurrent`` (and ``fused`` / ``graph`` calls that take the token-recurrent kernel):
  inside that one kernel, each program reading ``cu_seqlens`` before it walks.

Why a call was rejected is readable without a sync: pass ``status=`` (a `[1]` int32
tensor on the inputs' device) and the guard writes the :data:`.chunk_index.CU_START` /
``CU_END`` / ``CU_DECREASING`` / ``CU_RANGE`` bits there (0: valid); read it whenever
the stream has reached that point (:func:`describe_status` turns it into words).

Cost on a valid call: each program of the last kernel reads the ``N + 1`` entries of
``cu_seqlens`` once. Everything is stream-ordered and CUDA-graph capturable.
"""
from __future__ import annotations

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..decode.kernel import SLOT_PAST_POOL, SLOT_REPEATED  # noqa: E402
from .chunk_index import CU_DECREASING, CU_END, CU_RANGE, CU_START, cu_status  # noqa: E402
from .pdl import grid_wait  # noqa: E402

__all__ = ["guard_outputs", "walk_guard", "check_status_tensor", "describe_status"]

_WORDS = ((CU_START, "cu_seqlens[0] != 0"), (CU_END, "cu_seqlens[-1] != T"),
          (CU_DECREASING, "cu_seqlens decreases"), (CU_RANGE, "a cu_seqlens entry is outside [0, T]"),
          (SLOT_REPEATED, "a pool slot is named by two or more sequences (decode)"),
          (SLOT_PAST_POOL, "a pool slot is >= the pool size P (decode)"))


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
def guard_outputs(st, o, ht, status, T, N, i_p, n_p, H: tl.constexpr, V: tl.constexpr,
                  K: tl.constexpr, HAS_STATUS: tl.constexpr, PDL_WAIT: tl.constexpr):
    """The guard inside the call's last kernel: ``st`` is :func:`.chunk_index.cu_status` of
    the call's ``cu_seqlens``; program ``i_p`` of the ``n_p`` that share the outputs stores
    ``st`` into ``status`` (``i_p == 0``) and, if ``st != 0``, NaN-fills its grid-stride
    share of ``o`` (``[T, H, V]``) and ``ht`` (``[N, H, V, K]``). Every program computes the
    same ``st``, so either all write results or all write NaN. Returns ``st``: the caller
    returns when it is not 0, without writing anything else."""
    if HAS_STATUS:
        if i_p == 0:
            tl.store(status, st)
    if st != 0:
        grid_wait(PDL_WAIT)   # the earlier kernels are done before the outputs are touched
        n_o = T.to(tl.int64) * (H * V)
        n_ht = N.to(tl.int64) * (H * V * K)
        for i0 in range(i_p.to(tl.int64) * 1024, n_o, n_p * 1024):
            o_i = i0 + tl.arange(0, 1024)
            tl.store(o + o_i, tl.full([1024], float("nan"), tl.float32).to(o.dtype.element_ty),
                     mask=o_i < n_o)
        for i0 in range(i_p.to(tl.int64) * 1024, n_ht, n_p * 1024):
            o_i = i0 + tl.arange(0, 1024)
            tl.store(ht + o_i, tl.full([1024], float("nan"), tl.float32), mask=o_i < n_ht)
    return st


@triton.jit
def walk_guard(cu_seqlens, o, ht, status, T, N, i_u, i_h, i_v, H: tl.constexpr,
               V: tl.constexpr, K: tl.constexpr, GUARD: tl.constexpr, HAS_STATUS: tl.constexpr,
               PDL_WAIT: tl.constexpr):
    """With ``GUARD``, :func:`guard_outputs` for program ``(i_u, i_h, i_v)`` of a state walk's
    grid (units, value heads, state tiles): whether it wrote NaN (its caller returns then)."""
    stop = False
    if GUARD:
        n_u = tl.num_programs(0)
        stop = guard_outputs(cu_status(cu_seqlens, N, T, 128), o, ht, status, T, N,
                             i_u + n_u * (i_h + H * i_v), n_u * H * tl.num_programs(2), H, V, K,
                             HAS_STATUS, PDL_WAIT) != 0
    return stop
