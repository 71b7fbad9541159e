"""Launcher and public entry point of the GDN decode kernel.

``gdn_decode_fwd`` checks (metadata only, before anything is allocated or
launched; in full once per signature of the call, :func:`signature`), allocates the
outputs and launches :func:`gdn_decode_kernel` once (a repeat launch directly,
:class:`kernels.launch.FastLaunch`; where :mod:`kernels.fastcall` is available, a repeat is
one C call to the signature's plan);
``gdn_decode`` is the public function with the documented signature.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .. import fastcall
from ..launch import FastLaunch, replay_or_launch
from ..spec import check_slot_values, resolve_scale, tensor_meta, validate_decode_inputs
from .config import DecodeConfig
from .kernel import gdn_decode_kernel
from .table import config_for_device

__all__ = ["gdn_decode_fwd", "gdn_decode", "signature", "clear_calls", "MAX_CALLS"]

# repeat launches go straight to the compiled kernel (kernels.launch): Triton's
# kernel[grid](...) binds and specialises 14 arguments and 11 constexprs on every call
_DECODE_LAUNCH = FastLaunch(gdn_decode_kernel)


def check_buffer(name, x, dtype, shape, q) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if x.device != q.device:
        raise ValueError(f"{name} must be on {q.device} (like q), got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {x.stride()})")


def validate_call(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices, check_values):
    """The decode inputs checked (slot values too when ``check_values``; None: only off
    CUDA, where it costs no sync): ``(GDNShape, check_values as a bool)``."""
    if check_values is None:
        check_values = not (isinstance(q, torch.Tensor) and q.device.type == "cuda")
    check_values = bool(check_values)
    return validate_decode_inputs(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices,
                                  check_values=check_values), check_values


def check_status(status, pooled: bool, q) -> None:
    if status is not None:
        if not pooled:
            raise ValueError("status goes with state_indices (it reports bad pool slots)")
        check_buffer("status", status, torch.int32, (1,), q)


def resolve_config(config, batch: int, head_dim: int, device) -> DecodeConfig:
    if config is None:
        return config_for_device(batch, device, head_dim)
    if isinstance(config, str):
        config = DecodeConfig.from_name(config)
    elif not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, a config name or None, "
                        f"got {type(config).__name__}")
    config.check(head_dim)
    return config


def resolve_inplace(inplace, pooled: bool) -> bool:
    if inplace is None:
        return pooled
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool or None, got {type(inplace).__name__}")
    if pooled and not inplace:
        raise ValueError("inplace=False is not possible with state_indices: a state pool is "
                         "always updated in place (pass inplace=None or True)")
    return inplace


#: What a call's signature fixes (:func:`signature` -> :class:`_Call`): a repeat skips the
#: checks and the resolution of the options. At most :data:`MAX_CALLS`, then forgotten.
_CALLS: dict = {}
MAX_CALLS = 1024
#: Calls of a signature that may try to record its launch (:class:`kernels.launch.Recorder`).
RECORD_TRIES = 3


def signature(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices, config, inplace,
              output, intermediate_states, check_values, output_state, status) -> tuple:
    """Everything the checks of a call read, as a key: per tensor its type, shape, dtype,
    device and contiguity (what the metadata checks read; the kernel takes contiguous
    tensors, so other strides are a contiguity of False), each option with its type (``1``
    and ``True`` are checked differently). Raises AttributeError where an argument is not a
    tensor (the checks then say which)."""
    return (type(q), q.shape, q.dtype, q.device, q.is_contiguous(),
            type(k), k.shape, k.dtype, k.device, k.is_contiguous(),
            type(v), v.shape, v.dtype, v.device, v.is_contiguous(),
            type(state), state.shape, state.dtype, state.device, state.is_contiguous(),
            type(A_log), A_log.shape, A_log.dtype, A_log.device, A_log.is_contiguous(),
            type(a), a.shape, a.dtype, a.device, a.is_contiguous(),
            type(dt_bias), dt_bias.shape, dt_bias.dtype, dt_bias.device,
            dt_bias.is_contiguous(),
            type(b), b.shape, b.dtype, b.device, b.is_contiguous(),
            type(scale), scale, tensor_meta(state_indices), type(config), config, type(inplace),
            inplace, tensor_meta(output), type(intermediate_states), intermediate_states,
            type(check_values), check_values, tensor_meta(output_state), tensor_meta(status))


class _Call:
    """A checked signature's launch: what it allocates and launches with (see
    :func:`_prepare`)."""

    __slots__ = ("inplace", "intermediate", "pooled", "slot_values", "P", "hi_shape", "grid",
                 "key", "scale", "kwargs", "launches", "tries", "fast", "fast_tried")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, scale, config, inplace, output,
             state_indices, intermediate_states, check_values, output_state, status) -> _Call:
    """Every check of a call (the slot values too where ``check_values`` resolves so), and
    what its signature fixes: the config, the grid, the launch key and arguments."""
    shape, check_values = validate_call(q, k, v, state, A_log, a, dt_bias, b, scale,
                                        state_indices, check_values)
    HQ, HV, D = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    B, T = q.shape[0], q.shape[1]
    pooled = state_indices is not None
    inplace = resolve_inplace(inplace, pooled)
    if not isinstance(intermediate_states, bool):
        raise TypeError(f"intermediate_states must be a bool, got "
                        f"{type(intermediate_states).__name__}")
    if output is not None:
        check_buffer("output", output, torch.bfloat16, (B, T, HV, D), q)
    if output_state is not None:
        if inplace:
            raise ValueError("output_state must be None when the state is updated in place "
                             "(inplace=True or state_indices)")
        check_buffer("output_state", output_state, state.dtype, tuple(state.shape), q)
    check_status(status, pooled, q)
    cfg = resolve_config(config, B, D, q.device)
    c = _Call()
    c.inplace, c.intermediate, c.pooled = inplace, intermediate_states, pooled
    c.slot_values = pooled and check_values
    c.P, c.hi_shape, c.grid = state.shape[0], (B, T, HV, D, D), (cfg.programs(B, HV, D),)
    c.scale = resolve_scale(scale, D)
    # the call site's launch key: with validated inputs, what the kernel specialises on
    # beyond addresses and int values (kernels.launch.FastLaunch.launch_keyed)
    c.key = (T, HQ, HV, D, cfg, pooled, intermediate_states, status is None, state.dtype,
             state_indices.dtype if pooled else None)
    kwargs = dict(T=T, HQ=HQ, HV=HV, D=D, BV=cfg.BV, BK=cfg.block_k(D), V_TILES=cfg.V_TILES,
                  PREFETCH=cfg.PREFETCH, EVICT="evict_first" if cfg.EVICT_FIRST else "",
                  POOLED=pooled, INTERMEDIATE=intermediate_states,
                  HAS_STATUS=status is not None, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages)
    c.kwargs = lambda: kwargs
    # the launch as recorded on a call of the signature (kernels.launch.LaunchList; None
    # until then); a call whose launch cannot be recorded (a tensor given twice, one not
    # 16-byte aligned) tries again, at most RECORD_TRIES times (set where it is remembered)
    c.launches, c.tries = None, 0
    # the one-call repeat (kernels.fastcall): (run, plan) once made from the recorded list
    c.fast, c.fast_tried = None, False
    return c


#: ``(run, plan)`` of the last plan that served a call (:mod:`kernels.fastcall`): a repeat
#: tries it first, before any Python key is built; the plan checks every argument.
_LAST = None


def _make_fast(c: _Call, opts, srcs, output, output_state, o, ht, hi) -> None:
    """The signature's plan from its recorded list and this call's tensors (once)."""
    c.fast_tried = True
    outs = (("alias", 10) if output is not None else ("empty", o),
            ("alias", 3) if c.inplace else ("alias", 11) if output_state is not None
            else ("empty", ht),
            ("empty", hi) if c.intermediate else ("alias", 13))
    plan = fastcall.make_plan(c.launches, opts, srcs[:12], outs, None,
                              (12, 13, 14) if c.intermediate else (12, 13))
    if plan is not None:
        c.fast = (fastcall.runner(plan), plan)


def gdn_decode_fwd(q, k, v, state, A_log, a, dt_bias, b, scale, config, inplace, output,
                   state_indices, intermediate_states, check_values, output_state=None,
                   status=None):
    """Check, allocate, launch. Returns ``(output, new_state[, intermediate_states])``;
    see :func:`gdn_decode`.

    The checks run in full once per :func:`signature`; a repeat looks its :class:`_Call` up
    and does only what changes per call: the slot values' host check where asked for, the
    allocations, the launch with this call's tensors (their addresses) as recorded on the
    signature's first call (:class:`kernels.launch.LaunchList`; where it cannot stand for
    this call, the keyed launch it was recorded from).

    Where :mod:`kernels.fastcall` is available the recorded launch also becomes the
    signature's plan (not where slot values are checked on the host per call): every call
    first tries the last plan used (``_LAST``), one C call that checks every argument
    against it (type, sizes, strides, dtype, device; options: the recorded object or an
    equal one), allocates the outputs and launches; None from it (anything different) sends
    the call down the path above, which uses its own signature's plan where it has one."""
    global _LAST
    last = _LAST
    if last is not None:   # the last plan: one C call checks, allocates, launches
        r = last[0](last[1], scale, config, inplace, intermediate_states, check_values, q, k,
                    v, state, A_log, a, dt_bias, b, state_indices, status, output,
                    output_state)
        if r is not None:
            return r
    try:
        sig = signature(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices, config,
                        inplace, output, intermediate_states, check_values, output_state,
                        status)
        c = _CALLS.get(sig)
    except (AttributeError, TypeError):   # not a tensor, an unhashable option: checks say
        sig = c = None
    if c is None:
        c = _prepare(q, k, v, state, A_log, a, dt_bias, b, scale, config, inplace, output,
                     state_indices, intermediate_states, check_values, output_state, status)
        if sig is not None:
            if len(_CALLS) >= MAX_CALLS:
                _CALLS.clear()
            _CALLS[sig] = c
            c.tries = RECORD_TRIES   # recorded only where the signature is remembered
    elif c.fast is not None:   # (another signature's plan was tried first)
        r = c.fast[0](c.fast[1], scale, config, inplace, intermediate_states, check_values,
                      q, k, v, state, A_log, a, dt_bias, b, state_indices, status, output,
                      output_state)
        if r is not None:
            _LAST = c.fast
            return r
    elif c.slot_values:
        check_slot_values(state_indices, c.P)
    # empty_like: the cheapest allocation on the host (v is [B, T, HV, D] bf16, contiguous)
    o = output if output is not None else torch.empty_like(v)
    ht = state if c.inplace else (output_state if output_state is not None
                                  else torch.empty_like(state))
    hi = state.new_empty(c.hi_shape) if c.intermediate else ht
    # the call's tensors in a fixed order: the slots of the recorded launch (the first 12
    # given by the caller, then the outputs)
    srcs = (q, k, v, state, A_log, a, dt_bias, b, state_indices, status, output, output_state,
            o, ht, hi)
    replay_or_launch(c, srcs, 12, lambda: _DECODE_LAUNCH.launch_keyed(
        c.key, c.grid, (q, k, v, state, ht, hi, state_indices if c.pooled else q, A_log, a,
                        dt_bias, b, o, status, c.scale, c.P), c.kwargs))
    if (c.launches is not None and not c.fast_tried and not c.slot_values
            and sig is not None and fastcall.available()):
        _make_fast(c, (scale, config, inplace, intermediate_states, check_values), srcs,
                   output, output_state, o, ht, hi)
        if c.fast is not None:
            _LAST = c.fast
    return (o, ht, hi) if c.intermediate else (o, ht)


def clear_calls() -> None:
    """Forget every checked signature and plan (a test that changes the config table)."""
    global _LAST
    _CALLS.clear()
    _LAST = None


def gdn_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
               A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
               scale: Optional[float] = None, state_indices: Optional[torch.Tensor] = None, *,
               config: Union[DecodeConfig, str, None] = None, inplace: Optional[bool] = None,
               output: Optional[torch.Tensor] = None, intermediate_states: bool = False,
               check_values: Optional[bool] = None,
               output_state: Optional[torch.Tensor] = None,
               status: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
    """Gated DeltaNet decode of ``T >= 1`` tokens per sequence, one kernel launch.

    Each state tile is read once, updated for the ``T`` tokens in order in f32
    registers and written once (``T = 1``: the contest's decode step; ``T = 2..4``:
    speculative-decoding verification, multi-token prediction). Gates are computed
    in the kernel from their raw inputs: ``decay = exp(-exp(A_log) *
    softplus(a + dt_bias))``, ``beta = sigmoid(b)``. Value head ``h`` uses q/k
    head ``h // (HV // HQ)``.

    Args:
        q: `[B, T, HQ, D]` bf16 queries (normalised by the caller).
        k: `[B, T, HQ, D]` bf16 keys (normalised by the caller).
        v: `[B, T, HV, D]` bf16 values; ``HV`` a multiple of ``HQ``.
        state: f32 or bf16, k-last (element ``(k, v)`` of head ``h`` at
            ``state[s, h, v, k]``): dense `[B, HV, D, D]` (row ``b`` per sequence),
            or with ``state_indices`` a pool `[P, HV, D, D]`. A bf16 state is read
            and written in bf16 (half the bytes) and updated in f32.
        A_log: `[HV]` f32.
        a: `[B, T, HV]` bf16 raw decay gate input.
        dt_bias: `[HV]` f32.
        b: `[B, T, HV]` bf16 raw beta gate input.
        scale: output scale; None or 0 means ``1/sqrt(D)``.
        state_indices: `[B]` int32/int64, the pool slot of each sequence; the pool
            is read and updated in place at those slots only. A negative slot is
            padding: its state is neither read nor written and its output (and
            intermediate states) are zeros. Slot values are checked when
            ``check_values`` (below ``P``, none repeated: a ValueError); unchecked,
            they are caught in the kernel (no sync): a slot ``>= P`` (a caller's
            bug, not padding) and a live slot named by two or more sequences give
            those sequences NaN outputs (and intermediate states) and no state is
            read or written for them (memory outside the pool is never touched);
            the other sequences run as usual.
        config: a :class:`DecodeConfig` (or its name); None picks
            :func:`kernels.decode.config_for` of the batch size on this GPU.
        inplace: write the new state into ``state`` and return it. None (default):
            False for a dense state, True for a pool (which is always updated in
            place; False with ``state_indices`` raises).
        output: optional preallocated `[B, T, HV, D]` bf16 output.
        intermediate_states: also return the state after every token,
            `[B, T, HV, D, D]` in the state's dtype (indexed by sequence, not by
            slot), for rolling back to the last accepted token.
        check_values: check the slot values of ``state_indices`` on the host (a
            device-to-host copy). None (default): True unless the tensors are on
            CUDA.
        output_state: optional preallocated buffer for the new state, shaped and typed
            like ``state`` (dense only, not with ``inplace``); the contest's
            destination-passing entry point (:mod:`kernels.contest`) writes into the
            evaluator's buffers.
        status: optional `[1]` int32 tensor on the inputs' device, with
            ``state_indices`` only: the call stores
            :data:`kernels.decode.kernel.SLOT_REPEATED` (16) there if a live slot is
            repeated, plus :data:`~kernels.decode.kernel.SLOT_PAST_POOL` (32) if a slot
            is ``>= P``, else 0, without a sync (read it whenever convenient).

    Returns:
        ``(output [B, T, HV, D] bf16, new_state)``, ``new_state`` shaped and typed
        like ``state`` (the pool itself when pooled); with ``intermediate_states``
        a third element, the `[B, T, HV, D, D]` intermediate states.

    Raises:
        TypeError / ValueError naming the offending argument, before anything
        is allocated or written.
    """
    return gdn_decode_fwd(q, k, v, state, A_log, a, dt_bias, b, scale, config, inplace, output,
                          state_indices, intermediate_states, check_values, output_state,
                          status)
