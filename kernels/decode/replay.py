"""Replay decode: a checkpoint state written back every ``L`` tokens, plus a ring of residuals.

The standard decode (:func:`kernels.decode.gdn_decode`) reads and writes every
sequence's whole state on every call: that read + write is its bandwidth floor.
:func:`gdn_replay_decode` keeps, per sequence, the state as of ``n <= L`` tokens ago
(the **checkpoint**, in the same tensor and layout as ``gdn_decode``'s state) and a
:class:`ReplayRing` of those ``n`` tokens' keys, log decays and delta-rule residuals
``u``; each call reads the checkpoint once, computes its tokens' outputs exactly (the
same recurrence, in f32), appends them to the ring, and writes the checkpoint back only
when the ring cannot take the call's tokens (``n + T > L``). State traffic per token
falls from read + write towards read + write / ``L``; the kernel and its algebra are in
:mod:`.replay_kernel`, the reasoning and numbers in ``docs/notes/decode.md``.

Speculative verification: a call's tokens always stay in the ring, so rejecting ``r``
of them is ``rollback[b] = r`` on the next call (the kernel drops those ring entries
first): no intermediate states are stored. :func:`kernels.reference.replay_state_reference`
folds a ring into its checkpoint (the state "now", float32), e.g. to hand it to a prefill.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple, Union

import torch
import triton

from .. import fastcall
from ..gpu_limits import device_limits
from ..launch import FastLaunch, replay_or_launch
from ..spec import check_slot_values, resolve_scale, tensor_meta
from .config import DecodeConfig
from .ops import (MAX_CALLS, RECORD_TRIES, check_buffer, check_status, resolve_config,
                  signature, validate_call)
from .replay_kernel import gdn_replay_kernel
from .table import config_for_device

__all__ = ["ReplayRing", "gdn_replay_decode", "replay_config_for", "replay_state_bytes",
           "clear_calls"]

# repeat launches go straight to the compiled kernel (kernels.launch)
_REPLAY_LAUNCH = FastLaunch(gdn_replay_kernel)

#: Fewest state rows a replay program owns once the batch fills the GPU at that width.
#: Every program of a value head re-reads its sequence's ring (``L`` keys of ``D``), so the
#: replay wants fewer, wider programs than the standard step whose table it starts from:
#: at B=512 (f32, L=4, H200) the table's BV4-w1 took 190 µs per token, BV16-w1 106-117
#: (docs/notes/decode.md, "Replay config").
REPLAY_MIN_ROWS = 16
_replay_picked: Dict[tuple, DecodeConfig] = {}


def replay_config_for(batch: int, head_dim: int, num_v_heads: int, device,
                      n_sm: Optional[int] = None) -> DecodeConfig:
    """The replay kernel's default config: the standard step's
    (:func:`kernels.decode.table.config_for_device`), widened to :data:`REPLAY_MIN_ROWS`
    rows per program (one tile, same warps) when that still gives every SM two programs
    (``batch * num_v_heads * head_dim / REPLAY_MIN_ROWS >= 2 * n_sm``). ``n_sm``: the
    device's SM count (None: asked of ``device``; 0 off CUDA, where the table stays).
    Remembered per argument (every eager call asks)."""
    key = (batch, head_dim, num_v_heads, str(device), n_sm)
    cfg = _replay_picked.get(key)
    if cfg is None:
        cfg = config_for_device(batch, device, head_dim)
        sms = n_sm if n_sm is not None else (
            device_limits(device).n_sm if torch.device(device).type == "cuda" else 0)
        rows = min(REPLAY_MIN_ROWS, head_dim)
        if (sms > 0 and cfg.BV * cfg.V_TILES < rows
                and batch * num_v_heads * (head_dim // rows) >= 2 * sms):
            cfg = replace(cfg, BV=rows, V_TILES=1)
        _replay_picked[key] = cfg
    return cfg


@dataclass(frozen=True)
class ReplayRing:
    """Per-sequence ring of the tokens decoded since each checkpoint (rows like the state:
    ``R = B`` for a dense state, ``R = P`` for a pool, addressed by the same slots).

    Attributes:
        k: `[R, C, HQ, D]` bf16 keys.
        u: `[R, C, HV, D]` f32 delta-rule residuals ``beta (v - exp(g) <row, k>)``.
        g: `[R, C, HV]` f32 log decays.
        head: `[R, 2]` int32: ``(start, n)``, the first entry and how many are live.
        count: `[R]` int32 arrival counter of the kernel (0 between calls).
        L: the checkpoint is written back when ``n + T > L`` (every ``L`` tokens at
            ``T = 1``).
        max_tokens: the most tokens one call may take.

    A ring holds ``n <= max(L, max_tokens)`` entries (after a write-back: the call's
    ``T``), and ``C = max(L, max_tokens) + max_tokens`` of them, so that a call's new
    entries never land on one still read. Build one with :meth:`empty`; the decode call
    updates it in place.
    """

    k: torch.Tensor
    u: torch.Tensor
    g: torch.Tensor
    head: torch.Tensor
    count: torch.Tensor
    L: int
    max_tokens: int = 4

    @property
    def capacity(self) -> int:
        """``C``, the entries of the ring tensors (``max(L, max_tokens) + max_tokens``)."""
        return max(self.L, self.max_tokens) + self.max_tokens

    @property
    def max_live(self) -> int:
        """The most live entries a valid header holds, ``max(L, max_tokens)``."""
        return max(self.L, self.max_tokens)

    @classmethod
    def empty(cls, rows: int, num_q_heads: int, num_v_heads: int, head_dim: int, L: int, *,
              max_tokens: int = 4, device=None) -> "ReplayRing":
        """An empty ring (``n = 0``) for ``rows`` states: the checkpoint is the state."""
        for name, val in (("rows", rows), ("L", L), ("max_tokens", max_tokens)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name} must be an int >= 1, got {val!r}")
        C = max(L, max_tokens) + max_tokens
        return cls(
            k=torch.zeros(rows, C, num_q_heads, head_dim, dtype=torch.bfloat16, device=device),
            u=torch.zeros(rows, C, num_v_heads, head_dim, dtype=torch.float32, device=device),
            g=torch.zeros(rows, C, num_v_heads, dtype=torch.float32, device=device),
            head=torch.zeros(rows, 2, dtype=torch.int32, device=device),
            count=torch.zeros(rows, dtype=torch.int32, device=device), L=L,
            max_tokens=max_tokens)

    def clone(self) -> "ReplayRing":
        return ReplayRing(self.k.clone(), self.u.clone(), self.g.clone(), self.head.clone(),
                          self.count.clone(), self.L, self.max_tokens)


def replay_state_bytes(batch: int, num_q_heads: int, num_v_heads: int, head_dim: int, *,
                       state_dtype=torch.float32, n: float, T: int = 1,
                       flush: bool = False) -> float:
    """Bytes one call moves for ``batch`` sequences with ``n`` ring entries: the
    checkpoint read (and written on a ``flush``), the ring read (keys per q/k head,
    residuals and log decays per value head) and this call's ``T`` entries written."""
    esz = torch.empty((), dtype=state_dtype).element_size()
    state = num_v_heads * head_dim * head_dim * esz
    entry = num_q_heads * head_dim * 2 + num_v_heads * (head_dim * 4 + 4)
    return batch * (state * (2 if flush else 1) + (n + T) * entry)


def _check_ring(ring, rows: int, hq: int, hv: int, d: int, T: int, q) -> None:
    if not isinstance(ring, ReplayRing):
        raise TypeError(f"ring must be a ReplayRing, got {type(ring).__name__}")
    for name in ("L", "max_tokens"):
        val = getattr(ring, name)
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"ring.{name} must be an int >= 1, got {val!r}")
    C = ring.capacity
    check_buffer("ring.k", ring.k, torch.bfloat16, (rows, C, hq, d), q)
    check_buffer("ring.u", ring.u, torch.float32, (rows, C, hv, d), q)
    check_buffer("ring.g", ring.g, torch.float32, (rows, C, hv), q)
    check_buffer("ring.head", ring.head, torch.int32, (rows, 2), q)
    check_buffer("ring.count", ring.count, torch.int32, (rows,), q)
    if T > ring.max_tokens:
        raise ValueError(f"q has T={T} tokens per sequence; this ring takes at most "
                         f"{ring.max_tokens} per call (ReplayRing.empty(..., max_tokens=...))")


def _check_rollback(rollback, B: int, q) -> None:
    if not isinstance(rollback, torch.Tensor):
        raise TypeError(f"rollback must be a torch.Tensor or None, got {type(rollback).__name__}")
    if rollback.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"rollback must have dtype torch.int32 or torch.int64, "
                        f"got {rollback.dtype}")
    check_buffer("rollback", rollback, rollback.dtype, (B,), q)


def _check_ring_values(ring: ReplayRing, rollback, state_indices) -> None:
    """The header values of the sequences' rows (and the rollback against them), on the
    host: a device-to-host copy."""
    head = ring.head.to("cpu", torch.int64)
    rows = (torch.arange(head.shape[0]) if state_indices is None
            else state_indices.to("cpu", torch.int64))
    seq = (rows >= 0).nonzero().flatten()
    rows = rows[seq]
    start, n = head[rows, 0], head[rows, 1]
    C = ring.capacity
    if bool(((start < 0) | (start >= C)).any()) or bool(((n < 0) | (n > ring.max_live)).any()):
        raise ValueError(f"ring.head must hold 0 <= start < {C} and 0 <= n <= "
                         f"max(L, max_tokens)={ring.max_live} for every sequence's row "
                         f"(a corrupt ring)")
    if bool((ring.count.to("cpu") != 0).any()):
        raise ValueError("ring.count must be all zeros between calls (a call was interrupted?)")
    if rollback is not None:
        r = rollback.to("cpu", torch.int64)[seq]
        if bool(((r < 0) | (r > n)).any()):
            i = int(((r < 0) | (r > n)).nonzero()[0])
            raise ValueError(f"rollback must lie in [0, n] (n: the ring entries of the "
                             f"sequence), got {int(r[i])} with n={int(n[i])} for sequence "
                             f"{int(seq[i])}")


def gdn_replay_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
                      A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor,
                      b: torch.Tensor, scale: Optional[float] = None,
                      state_indices: Optional[torch.Tensor] = None, *, ring: ReplayRing,
                      rollback: Optional[torch.Tensor] = None,
                      config: Union[DecodeConfig, str, None] = None,
                      output: Optional[torch.Tensor] = None,
                      check_values: Optional[bool] = None,
                      status: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet decode of ``T`` tokens per sequence from a checkpoint and a ring.

    Same inputs, shapes and options as :func:`kernels.decode.gdn_decode` (see there), and
    the same outputs: token ``t``'s output is that of the standard recurrence on the
    state after every earlier token (up to f32 rounding; a bf16 checkpoint is rounded
    once per write-back, not once per token). What differs is the state: ``state`` (dense
    `[B, HV, D, D]` or a pool with ``state_indices``, f32 or bf16) holds each sequence's
    **checkpoint** and ``ring`` the tokens since it; both are updated in place. The
    checkpoint is written back (and the ring restarted with this call's tokens) when the
    ring's ``n`` entries plus this call's ``T`` exceed ``ring.L``.

    Args:
        ring: a :class:`ReplayRing` with the state's rows (``B``, or ``P`` for a pool);
            ``ReplayRing.empty`` when the state is fresh.
        rollback: optional `[B]` int32/int64: drop each sequence's ``rollback[b]`` newest
            ring entries before this call's tokens (the drafts the last verification
            rejected; ``0 <= rollback[b] <= n``, the last call's tokens are always there).
        config: a :class:`DecodeConfig` or its name; a program owns its
            ``BV * V_TILES`` rows (at most ``D``) with ``num_warps`` warps, the other
            levers are not used. None: :func:`replay_config_for` (the standard step's
            config, widened where the batch allows).
        check_values: check slot values, the ring headers and ``rollback`` on the host
            (a device-to-host copy). None: True unless on CUDA. Unchecked, a slot
            ``>= P``, a repeated live slot, a corrupt ring header or a rollback outside
            ``[0, n]`` give that sequence NaN outputs and leave its state and ring
            untouched; a negative slot is padding (zeros, nothing touched).
        status: optional `[1]` int32, pooled only: the slot bits of ``gdn_decode``.

    Returns:
        ``(output [B, T, HV, D] bf16, state)`` (``state``: the checkpoint tensor itself).

    Raises:
        TypeError / ValueError naming the offending argument, before anything is
        written or launched.

    The checks run in full once per signature (:func:`replay_signature`); a repeat runs the
    per-call value checks where asked, the output, the launch recorded on the signature's
    first call. Where :mod:`kernels.fastcall` is available and no values are checked on the
    host per call (``check_values`` resolving False: the CUDA default), the recorded launch
    also becomes the signature's plan: a call first tries the last plan used (``_LAST``;
    one C call that checks every argument, the ring's tensors, ``ring.L`` and
    ``ring.max_tokens`` by value, allocates the output and launches), None from it
    sending the call down the path above.
    """
    global _LAST
    last = _LAST
    if last is not None and type(ring) is ReplayRing:   # the last plan: one C call, or None
        r = last[0](last[1], scale, config, check_values, ring.L, ring.max_tokens, q, k, v,
                    state, A_log, a, dt_bias, b, state_indices, rollback, status, output,
                    ring.k, ring.u, ring.g, ring.head, ring.count)
        if r is not None:
            return r
    try:
        sig = replay_signature(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices,
                               ring, rollback, config, output, check_values, status)
        c = _CALLS.get(sig)
    except (AttributeError, TypeError):   # not a tensor, an unhashable option: checks say
        sig = c = None
    if c is None:
        c = _prepare(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices, ring,
                     rollback, config, output, check_values, status)
        if sig is not None:
            if len(_CALLS) >= MAX_CALLS:
                _CALLS.clear()
            _CALLS[sig] = c
            c.tries = RECORD_TRIES
    elif c.fast is not None:   # (another signature's plan was tried first)
        r = c.fast[0](c.fast[1], scale, config, check_values, ring.L, ring.max_tokens, q, k,
                      v, state, A_log, a, dt_bias, b, state_indices, rollback, status, output,
                      ring.k, ring.u, ring.g, ring.head, ring.count)
        if r is not None:
            _LAST = c.fast
            return r
    elif c.values:
        if state_indices is not None:
            check_slot_values(state_indices, c.P)
        _check_ring_values(ring, rollback, state_indices)
    o = output if output is not None else torch.empty_like(v)   # [B, T, HV, D] bf16
    if c.grid[0] == 0:
        return o, state
    # the call's tensors in a fixed order: the recorded launch's slots (17 given, 1 made)
    srcs = (q, k, v, state, A_log, a, dt_bias, b, state_indices, rollback, status, output,
            ring.k, ring.u, ring.g, ring.head, ring.count, o)
    replay_or_launch(c, srcs, 17, lambda: _REPLAY_LAUNCH.launch_keyed(
        c.key, c.grid, (q, k, v, state, state_indices if c.pooled else q, A_log, a, dt_bias,
                        b, o, ring.k, ring.u, ring.g, ring.head, ring.count,
                        rollback if rollback is not None else q, status, c.scale, c.P,
                        ring.L, ring.max_live, ring.capacity), c.kwargs))
    if (c.launches is not None and not c.fast_tried and not c.values and sig is not None
            and type(ring) is ReplayRing and fastcall.available()):
        c.fast_tried = True
        plan = fastcall.make_plan(c.launches, (scale, config, check_values, ring.L,
                                               ring.max_tokens), srcs[:17],
                                  (("alias", 11) if output is not None else ("empty", o),),
                                  None, (17, 3))
        if plan is not None:
            c.fast = _LAST = (fastcall.runner(plan), plan)
    return o, state


def replay_signature(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices, ring,
                     rollback, config, output, check_values, status) -> tuple:
    """Everything the checks of a replay call read, as a key (the decode's
    :func:`kernels.decode.ops.signature`, the ring's type, tensors, ``L`` and
    ``max_tokens``, ``rollback``'s metadata). Raises AttributeError where an argument is
    not a tensor (or the ring not a ring: the checks then say which)."""
    return (signature(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices, config,
                      None, output, False, check_values, None, status),
            type(ring), tensor_meta(ring.k), tensor_meta(ring.u), tensor_meta(ring.g),
            tensor_meta(ring.head), tensor_meta(ring.count), type(ring.L), ring.L,
            type(ring.max_tokens), ring.max_tokens, tensor_meta(rollback))


#: What a replay call's signature fixes (:class:`_ReplayCall`); a repeat skips the checks.
_CALLS: dict = {}


class _ReplayCall:
    """A checked signature's launch (:func:`_prepare`)."""

    __slots__ = ("values", "pooled", "P", "grid", "key", "scale", "kwargs", "launches",
                 "tries", "fast", "fast_tried")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices, ring, rollback,
             config, output, check_values, status) -> _ReplayCall:
    """Every check of a replay call (the values too where ``check_values`` resolves so) and
    what its signature fixes: the config, the grid, the launch key and arguments."""
    shape, check_values = validate_call(q, k, v, state, A_log, a, dt_bias, b, scale,
                                        state_indices, check_values)
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    B, T = q.shape[0], q.shape[1]
    pooled = state_indices is not None
    _check_ring(ring, state.shape[0], hq, hv, d, T, q)
    if rollback is not None:
        _check_rollback(rollback, B, q)
    if output is not None:
        check_buffer("output", output, torch.bfloat16, (B, T, hv, d), q)
    check_status(status, pooled, q)
    cfg = (replay_config_for(B, d, hv, q.device) if config is None
           else resolve_config(config, B, d, q.device))
    if check_values:
        _check_ring_values(ring, rollback, state_indices)
    bv = min(cfg.BV * cfg.V_TILES, d)
    c = _ReplayCall()
    c.values, c.pooled, c.P = check_values, pooled, state.shape[0]
    c.grid, c.scale = (B * hv * (d // bv),), resolve_scale(scale, d)
    # the launch key: with validated inputs, what the kernel specialises on beyond addresses
    # and int values (kernels.launch.FastLaunch.launch_keyed)
    c.key = (T, hq, hv, d, bv, cfg.num_warps, ring.max_live, pooled, rollback is not None,
             status is None, state.dtype, state_indices.dtype if pooled else None,
             rollback.dtype if rollback is not None else None)
    kwargs = dict(T=T, TP=triton.next_power_of_2(T), HQ=hq, HV=hv, D=d, BV=bv,
                  NP=triton.next_power_of_2(ring.max_live), NW=cfg.num_warps, POOLED=pooled,
                  HAS_ROLLBACK=rollback is not None, HAS_STATUS=status is not None,
                  num_warps=cfg.num_warps)
    c.kwargs = lambda: kwargs
    c.launches, c.tries = None, 0
    # the one-call repeat (kernels.fastcall): (run, plan) once made from the recorded list
    c.fast, c.fast_tried = None, False
    return c


#: ``(run, plan)`` of the last plan that served a replay call (:mod:`kernels.fastcall`): a
#: repeat tries it first, before any Python key is built; the plan checks every argument.
_LAST = None


def clear_calls() -> None:
    """Forget every checked replay signature and plan (a test that changes the config
    table)."""
    global _LAST
    _CALLS.clear()
    _LAST = None
