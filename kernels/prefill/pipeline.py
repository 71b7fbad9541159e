"""Compositions of the stage kernels: each prefill variant is a function here.

A variant is a composition, not a copy: every variant launches the same
stage kernels (:mod:`.gates`, :mod:`.intra_chunk`, :mod:`.state_walk`,
:mod:`.context_parallel`) with different flags. Which path a ``fused`` or ``graph`` call
takes, with which tiles, segments and launch arguments, is decided once per key by
:func:`.plan.prefill_plan`; :func:`fused_launches` runs that :class:`.plan.Plan` (its
intermediates are views of one allocation), the other compositions take its walk.

==============  ===========================================================  =====================
variant         stages                                                       GPU launches per call
==============  ===========================================================  =====================
``unfused``     gates as 8 torch ops; host-built chunk table (sync); cumsum  11 kernels + 3 copies
                kernel; intra-chunk (``Tb``, ``Aqk``); state walk forming    (2 D2H syncs, 1 H2D)
                ``v_new`` and the outputs inline
``fused_gates`` one gates+cumsum kernel from raw inputs; host-built chunk    3 kernels + 3 copies
                table (sync); intra-chunk; state walk + outputs              (2 D2H syncs, 1 H2D)
``no_sync``     as ``fused_gates`` with the device-side chunk lookup: no     3 kernels, no copies
                host sync; ``cu_seqlens`` checked on the device (the walk)
``fused``       (1) gates + cumsum + intra-chunk solve, storing ``Tb = Tm    2 kernels; 3-5 with CP;
                diag(beta)`` and ``scale * Aqk`` (the ``"tm"``               1 for T <= 128;
                intermediates); (2) state walk forming ``v_new`` and the     the guard inside the
                outputs inline (and guarding ``cu_seqlens``); with           last (per path:
                context parallelism (2) becomes                              :data:`.plan.LAUNCHES`)
                segment summaries, then the walk that chains them;
                from 16,384 tokens per sequence (long path) the
                transposed summaries, a combine kernel and the
                transposed walk from the entering states: 4 (5 with
                the split chosen on the device);
                walks start by dependent launch (:mod:`.pdl`), repeat
                launches skip Triton's binding and every launch is bound
                before the first (:mod:`.launch`); for T <= 128, (1) also
                has walker programs that walk each sequence chunk by chunk
                as the chunk programs flag their chunks, and (2) is not
                launched
``graph``       ``fused`` captured in a CUDA graph per shape bucket          see :mod:`.graph`
``recurrent``   the token-recurrent kernel (:mod:`.recurrent`): gates, the   1 kernel
                state walked token by token in registers, outputs and
                the guard in one launch; ``fused`` and ``graph`` take it
                for calls of up to ``recurrent_max_T`` tokens
                (:func:`.config.recurrent_rule`)
==============  ===========================================================  =====================

Validation (:func:`kernels.spec.validate_prefill_inputs`) runs before
anything is allocated or launched. Metadata checks always; the value checks
of ``cu_seqlens`` (start 0, non-decreasing, end ``T``) cost a device-to-host
copy, so the host-sync variants always do them, while ``no_sync``, ``fused``
and ``graph`` do them only when the tensors are not on CUDA (``check_values=None``,
the default; pass True/False to force). Unchecked values cannot make a kernel
read or write out of bounds (:func:`.chunk_index.seq_bounds`), and the call's
kernel that writes the outputs checks them on the device (:mod:`.guard`): if invalid,
every row of ``output`` and every final state become NaN, and the optional ``status``
tensor says why (no sync, no extra launch).
"""
from __future__ import annotations

from typing import Union

import torch

from .. import fastcall
from ..launch import keep_buffer, not_recordable, replay_or_launch
from ..spec import check_cu_seqlens_values, resolve_scale, tensor_meta, validate_prefill_inputs
from .chunk_index import num_slots, prepare_chunk_indices
from .context_parallel import segment_combine_t_fwd, segment_split_fwd
from .gates import chunk_gates_fwd, gates_torch
from .guard import check_status_tensor
from .intra_chunk import intra_chunk_fwd
from .plan import FAST, Plan, call_plan, fitted_config, intra_kwargs
from .recurrent import recurrent_fwd
from .state_walk import state_walk_fwd
from .state_walk_gluon import state_walk_gluon_fwd, tma_ready
from .state_walk_t import state_walk_t_fwd

__all__ = ["prefill_unfused", "prefill_fused_gates", "prefill_no_sync", "prefill_fused",
           "prefill_recurrent", "fused_launches", "check_out_tensor",
           "workspace_views", "phase_c_fwd", "PreparedCall", "call_signature",
           "prepare_call", "run_call"]


def check_out_tensor(name: str, t, shape, dtype, device) -> None:
    """Check a caller-provided output buffer (metadata only)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (like q), got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {t.stride()})")


def _check_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                output_state, check_values, status):
    """Every check of a call before anything is launched: the inputs (their values too
    where ``check_values`` resolves so: by default off CUDA), ``status``, the given
    outputs. Returns ``(shape, check_values, T, HV, D, N)``."""
    if check_values is None:
        check_values = q.device.type != "cuda" if isinstance(q, torch.Tensor) else True
    shape = validate_prefill_inputs(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                                    check_values=check_values)
    check_status_tensor(status, q.device)
    T, HV, D = q.shape[0], shape.num_v_heads, shape.head_dim
    N = cu_seqlens.numel() - 1
    if output is not None:
        check_out_tensor("output", output, (T, HV, D), torch.bfloat16, q.device)
    if output_state is not None:
        check_out_tensor("output_state", output_state, (N, HV, D, D), torch.float32, q.device)
    return shape, bool(check_values), T, HV, D, N


def begin_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output, output_state,
               check_values, status=None):
    """Validate, resolve the scale, allocate (or check) the outputs. Returns ``(shape,
    scale, output, output_state, checked)``; ``checked``: the values of ``cu_seqlens``
    were checked on the host (else the last kernel guards the outputs on the device)."""
    shape, check_values, T, HV, D, N = _check_call(
        q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output, output_state,
        check_values, status)
    # empty_like where a validated input has the shape: the cheapest allocation on the host
    o = output if output is not None else torch.empty_like(v)
    ht = output_state if output_state is not None else (
        torch.empty_like(state) if state is not None
        else torch.empty(N, HV, D, D, dtype=torch.float32, device=q.device))
    return shape, resolve_scale(scale, D), o, ht, bool(check_values)


def _walk(walk, q, k, v, tb, aqk, gc, cu_seqlens, state, o, ht, scale, guard, status,
          qk_norms=None, **override):
    """The walk without context parallelism, as planned (:attr:`.plan.Plan.walk`:
    :func:`.state_walk_t.state_walk_t_fwd` or :func:`.state_walk.state_walk_fwd`), forming
    the outputs inline and guarding ``cu_seqlens`` when ``guard``; ``override``: keyword
    arguments over the plan's (the compositions launch without PDL); ``qk_norms``: the
    intra-chunk kernel's L2-norm factors (None: no norm). Returns the bound launch."""
    transposed, kw = walk
    if override:
        kw = dict(kw, **override)
    if transposed:
        return state_walk_t_fwd(q, k, v, tb, aqk, gc, cu_seqlens, initial_state=state,
                                output=o, final_state=ht, scale=scale, guard=guard,
                                status=status, defer=True, qk_norms=qk_norms, **kw)
    return state_walk_fwd(k, tb, v, gc, cu_seqlens, p=aqk, initial_state=state, output=o,
                          final_state=ht, guard=guard, status=status, defer=True, q=q,
                          scale=scale, qk_norms=qk_norms, **kw)


def _shape_plan(q, shape, cu_seqlens, cp, config) -> Plan:
    """The call's :class:`.plan.Plan` (remembered per key: the hot path's one lookup)."""
    return call_plan(q.shape[0], cu_seqlens.numel() - 1, shape.num_v_heads, shape.head_dim,
                     q.device, cp, config)


def prefill_unfused(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                    output=None, output_state=None, check_values=True, config=None,
                    status=None):
    """The seed's starting shape: torch gates, host-sync chunk table, 3 Triton kernels."""
    return _staged(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                   output_state, check_values, True, True, config, status)


def _staged(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output, output_state,
            check_values, torch_gates, use_indices, config, status):
    """The compositions before ``fused``: gates (``torch_gates``: 8 torch ops and a cumsum
    kernel, else one kernel), the intra-chunk kernel (host-built chunk table when
    ``use_indices``), the walk of the plan without CP, with the outputs inline."""
    shape, scale, o, ht, checked = begin_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                                          scale, output, output_state, check_values, status)
    plan = _shape_plan(q, shape, cu_seqlens, False, config)
    idx = prepare_chunk_indices(cu_seqlens, T=q.shape[0]) if use_indices else None
    if torch_gates:
        g, beta = gates_torch(A_log, a, dt_bias, b)
        gc, _ = chunk_gates_fwd(cu_seqlens, g=g, beta=beta, chunk_indices=idx)
    else:
        gc, beta = chunk_gates_fwd(cu_seqlens, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                                   chunk_indices=idx)
    tb, _, aqk = intra_chunk_fwd(k, v, cu_seqlens, q, scale=scale, gc=gc, beta=beta,
                                 chunk_indices=idx, **intra_kwargs(plan.config))
    _walk(plan.walk, q, k, v, tb, aqk, gc, cu_seqlens, state, o, ht, scale, not checked,
          status, pdl=False)()
    if checked and status is not None:
        status.zero_()
    return o, ht


def prefill_fused_gates(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                        output=None, output_state=None, check_values=True, config=None,
                        status=None):
    """One gates+cumsum kernel from raw inputs; still a host-sync chunk table."""
    return _staged(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                   output_state, check_values, False, True, config, status)


def prefill_no_sync(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                    output=None, output_state=None, check_values=None, config=None,
                    status=None):
    """As ``fused_gates`` with the device-side chunk lookup: no host sync."""
    return _staged(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                   output_state, check_values, False, False, config, status)


#: int32 flag buffers of the one-launch path (walker programs), per device (a tensor's
#: ``device``, with its index; zero between calls: each walker takes its count off its
#: chunks' flags). Every buffer handed out stays
#: referenced here, so a CUDA graph that captured one never sees it freed.
_FLAGS: dict = {}
_FLAGS_KEPT: list = []


def _walker_flags(device, n: int):
    """A zeroed int32 buffer of at least ``n`` flags on ``device``, or None when one would
    have to be allocated while the stream is being captured (the caller then takes the
    two-launch path)."""
    buf = _FLAGS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = keep_buffer(torch.zeros(max(n, 4096), dtype=torch.int32, device=device))
        _FLAGS[device] = buf
        _FLAGS_KEPT.append(buf)
    return buf


def prefill_fused(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                  output=None, output_state=None, check_values=None,
                  cp: Union[None, bool, int] = None, config=None, status=None):
    """Fewest launches: the call's :class:`.plan.Plan` run by :func:`fused_launches` (the
    token-recurrent kernel, one launch, or (1) gates + cumsum + solve (``Tb``, ``Aqk``)
    and (2) walk + inline outputs).

    With context parallelism (see :mod:`.context_parallel`), (2) becomes phase A
    (segment summaries) and phase C (walk + outputs), phase C chaining the earlier
    segments' transitions itself; from 16,384 tokens per sequence the long path
    (:func:`_cp_long`: transposed walks, a phase-B combine kernel). Unchecked
    ``cu_seqlens`` values are checked on the device by the last kernel (:mod:`.guard`).
    """
    return run_call(prepare_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                                 output, output_state, check_values, status, cp, config),
                    q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, output, output_state,
                    status)


def prefill_recurrent(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                      output=None, output_state=None, check_values=None, config=None,
                      status=None):
    """The token-recurrent kernel (:mod:`.recurrent`) at any length: one launch, unchecked
    ``cu_seqlens`` guarded on the device. ``config`` is checked but has no lever here (the
    kernel works in f32 throughout)."""
    return run_call(prepare_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                                 output, output_state, check_values, status, None, config,
                                 recurrent=True),
                    q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, output, output_state,
                    status)


#: Calls of a remembered signature that may try to record its launches
#: (:class:`kernels.launch.Recorder`; a call whose launches cannot be recorded, e.g. one
#: tensor given twice or one not 16-byte aligned, leaves the next call to try).
RECORD_TRIES = 3


class PreparedCall:
    """What a checked call of ``fused`` or ``recurrent`` fixes for every call of its
    signature (:func:`call_signature`): the plan (None: the recurrent variant), the scale,
    whether ``cu_seqlens``' values are checked on the host per call (else guarded on the
    device), the final state's shape, the workspace's size in float32 words (0: none), the
    launches as recorded on a call (:class:`kernels.launch.LaunchList`, None until then)
    and how many more calls may try to record them."""

    __slots__ = ("plan", "scale", "checked", "T", "state_shape", "ws_words", "launches",
                 "tries", "fast", "fast_tried")


def call_signature(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                   output_state, check_values, status, cp, config, variant) -> tuple:
    """Everything the checks and the plan of a call read, as a key: per tensor its type,
    shape, dtype, device and contiguity (the kernels take contiguous tensors: other strides
    are a contiguity of False), each option with its type (``cp=True`` and ``cp=1`` plan
    differently). Raises AttributeError where an argument is not a tensor."""
    return (type(q), q.shape, q.dtype, q.device, q.is_contiguous(),
            type(k), k.shape, k.dtype, k.device, k.is_contiguous(),
            type(v), v.shape, v.dtype, v.device, v.is_contiguous(),
            type(A_log), A_log.shape, A_log.dtype, A_log.device, A_log.is_contiguous(),
            type(a), a.shape, a.dtype, a.device, a.is_contiguous(),
            type(dt_bias), dt_bias.shape, dt_bias.dtype, dt_bias.device,
            dt_bias.is_contiguous(),
            type(b), b.shape, b.dtype, b.device, b.is_contiguous(),
            type(cu_seqlens), cu_seqlens.shape, cu_seqlens.dtype, cu_seqlens.device,
            cu_seqlens.is_contiguous(), tensor_meta(state), type(scale), scale, tensor_meta(output),
            tensor_meta(output_state), type(check_values), check_values, tensor_meta(status),
            type(cp), cp, type(config), config, variant)


def prepare_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                 output_state, check_values, status, cp, config,
                 recurrent: bool = False, record: bool = False) -> PreparedCall:
    """Every check of a ``fused`` (``recurrent``: ``recurrent``) call, the values of
    ``cu_seqlens`` too where ``check_values`` resolves so, and its plan. ``record``: the
    call is remembered for its signature, so :func:`run_call` records its launches."""
    shape, check_values, T, HV, D, N = _check_call(
        q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output, output_state,
        check_values, status)
    c = PreparedCall()
    if recurrent:
        fitted_config(config, D)
        c.plan = None
    else:
        c.plan = _shape_plan(q, shape, cu_seqlens, cp, config)
    c.scale, c.checked, c.T = resolve_scale(scale, D), bool(check_values), T
    c.state_shape = (N, HV, D, D)
    c.ws_words = (c.plan.nbytes // 4 if c.plan is not None and c.plan.path != "recurrent"
                  else 0)
    c.launches, c.tries = None, RECORD_TRIES if record else 0
    c.fast, c.fast_tried = None, False   # (run, plan) once made (kernels.fastcall)
    return c


def run_call(c: PreparedCall, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, output,
             output_state, status, opts=None):
    """What changes per call of a prepared signature: the host check of ``cu_seqlens``'
    values (where the call checks them on the host), the outputs (fresh unless given), the
    workspace (one allocation), the launches with this call's tensors: as recorded on the
    signature's first call (:class:`kernels.launch.LaunchList`) where that list stands for
    this call, else the normal path it was recorded from. ``opts``: the call's options as
    :func:`kernels.prefill.gdn_prefill` got them (its plan's option checks); given, the
    signature's plan (:mod:`kernels.fastcall`: one C call) serves the call where it can, and
    is made from the recorded list where there is none yet (not where ``cu_seqlens`` is
    checked on the host per call)."""
    if c.fast is not None and opts is not None:
        r = c.fast[0](c.fast[1], *opts, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                      status, output, output_state)
        if r is not None:
            FAST[0] = c.fast
            return r
    if c.checked:
        check_cu_seqlens_values(cu_seqlens, c.T)
    # empty_like where a validated input has the shape: the cheapest allocation on the host
    o = output if output is not None else torch.empty_like(v)
    ht = output_state if output_state is not None else (
        torch.empty_like(state) if state is not None
        else torch.empty(c.state_shape, dtype=torch.float32, device=q.device))
    ws = (torch.empty(c.ws_words, dtype=torch.float32, device=q.device) if c.ws_words
          else None)
    # the call's tensors in a fixed order: the recorded launches' slots (12 given, 2 made)
    srcs = (q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, status, output, output_state,
            o, ht)
    replay_or_launch(c, srcs, 12, lambda: _launch_call(
        c, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, o, ht, ws, status), ws)
    if c.checked and status is not None:
        status.zero_()
    if (opts is not None and c.launches is not None and not c.fast_tried and not c.checked
            and fastcall.available()):
        c.fast_tried = True
        plan = fastcall.make_plan(
            c.launches, opts, srcs[:12],
            (("alias", 10) if output is not None else ("empty", o),
             ("alias", 11) if output_state is not None else ("empty", ht)), ws, (12, 13))
        if plan is not None:
            c.fast = FAST[0] = (fastcall.runner(plan), plan)
    return o, ht


def _launch_call(c: PreparedCall, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, o, ht,
                 ws, status) -> None:
    """A prepared call's launches by the normal path (what a recording notes)."""
    if c.plan is None:
        recurrent_fwd(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, c.scale, o, ht,
                      guard=not c.checked, status=status)
    else:
        fused_launches(c.plan, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, c.scale, o,
                       ht, guard=not c.checked, status=status, workspace=ws)


def workspace_views(plan: Plan, device, buf=None, names=None) -> dict:
    """The plan's intermediates as views of one allocation (:func:`.plan.workspace_layout`),
    by name: a float32 buffer (``buf``, else a fresh one of ``plan.nbytes``), viewed once
    per other dtype, cut by ``as_strided``; ``names``: only those views (None: all).
    ``plan``: anything with a plan's ``nbytes`` and ``views`` (also :mod:`.multi_gpu`'s
    rank plans)."""
    if buf is None:
        buf = torch.empty(plan.nbytes // 4, dtype=torch.float32, device=device)
    base, out = {torch.float32: buf}, {}
    for name, dtype, shape, strides, offset in plan.views:
        if names is not None and name not in names:
            continue
        whole = base.get(dtype)
        if whole is None:
            whole = base[dtype] = buf.view(dtype)
        out[name] = whole.as_strided(shape, strides, offset)
    return out


def fused_launches(plan: Plan, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o,
                   ht, guard=False, status=None, gates="raw", workspace=None,
                   qk_norm: bool = False) -> None:
    """Run ``plan`` (:class:`.plan.Plan`) on validated inputs and allocated outputs: the
    ``fused`` variant's kernels. ``guard``: the kernel that writes the outputs checks
    ``cu_seqlens`` on the device (:mod:`.guard`; ``status`` gets its bits; :mod:`.graph`
    guards in its unpack kernel instead). ``gates="log"``: ``a``, ``b`` hold the log decay
    and the post-sigmoid beta (FLA's convention, :mod:`kernels.model.fla_compat`), passed to
    the kernels that compute the gates. Every launch is bound (arguments ordered, handles
    fetched) before the first one: on the eager path the host time between launches is what
    the GPU waits for. ``workspace``: the float32 buffer the intermediates are cut from
    (None: a fresh one). ``qk_norm``: L2-normalise the rows of ``q`` and ``k`` in the
    kernels (FLA's ``use_qk_l2norm_in_kernel``): the intra-chunk kernel applies the factors
    ``1 / sqrt(sum(x^2) + 1e-6)`` to ``K K^T`` and ``Q K^T`` and stores them in the
    workspace's ``qk_norm`` view, which every walk reads (8 bytes per row, no pass over
    ``q`` and ``k``); the plan must be made for it (``qk_heads``, :func:`.plan.call_plan`)."""
    if plan.path == "recurrent":
        recurrent_fwd(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht,
                      guard=guard, status=status, gates=gates, qk_norm=qk_norm)
        return None
    if plan.qk_heads != (q.shape[1] if qk_norm else 0):
        raise ValueError(f"qk_norm={qk_norm} needs a plan made with qk_heads="
                         f"{q.shape[1] if qk_norm else 0}, got {plan.qk_heads}")
    ws = workspace_views(plan, q.device, workspace)
    qkn = ws.get("qk_norm")
    tb, gc, aqk = ws["Tb"], ws["gc"], ws["Aqk"]
    walkers, intra = None, plan.intra
    if plan.path == "single":
        flags = _walker_flags(q.device, num_slots(plan.T, plan.N) * plan.HV)
        if flags is not None:   # (else the walk: no flags can be allocated in a capture)
            walkers = dict(plan.walkers, initial_state=state, final_state=ht, output=o,
                           flags=flags, guard=guard, status=status)
            intra = plan.intra_single
    lb = ws.get("log_bound")
    go_intra = intra_chunk_fwd(
        k, v, cu_seqlens, q, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
        defer=True, walkers=walkers, log_bound=lb, out=(tb, gc, aqk, ws.get("scratch")),
        gates=gates, qk_norms=qkn, **intra)[3]
    if walkers is not None:
        go_intra()
        return None
    if not plan.seg_chunks:
        go_walk = _walk(plan.walk, q, k, v, tb, aqk, gc, cu_seqlens, state, o, ht, scale,
                        guard, status, qkn)
        go_intra()
        go_walk()
        return None
    if plan.phase_b is not None:
        return _cp_long(plan, ws, q, k, v, cu_seqlens, state, o, ht, scale, go_intra, guard,
                        status)
    summary, negl = ws["summary"], ws["negligible"]
    go_summary = state_walk_fwd(k, tb, v, gc, cu_seqlens, summary=summary, log_bound=lb,
                                negligible=negl, defer=True, qk_norms=qkn, **plan.phase_a)
    go_walk = state_walk_fwd(k, tb, v, gc, cu_seqlens, p=aqk, initial_state=state,
                             summary=summary, output=o, final_state=ht, negligible=negl,
                             guard=guard, status=status, defer=True, q=q, scale=scale,
                             qk_norms=qkn, **plan.phase_c)
    go_intra()
    go_summary()
    go_walk()
    return None


def _cp_long(plan: Plan, ws: dict, q, k, v, cu_seqlens, state, o, ht, scale, go_intra,
             guard, status):
    """Context parallelism of long sequences with the transposed walks (:mod:`.state_walk_t`,
    :func:`.context_parallel.cp_long_segment_chunks`): phase A (each segment's
    ``[M^T ; X^T]``: two programs of ``K`` rows per segment and head, 3 pipeline stages),
    phase B (:func:`.context_parallel.segment_combine_t_fwd`: the serial pass over the
    segments, bf16 products) and phase C (outputs from each segment's entering state,
    ``BV = 128`` with 8 warps: both warpgroups share one load of ``k``, ``q``, ``Tb``,
    ``Aqk``; on sm_90 the warp-specialized Gluon walk, :attr:`.plan.Plan.phase_c_gluon`):
    4 launches, about linear in length (numbers against the chained CP:
    docs/notes/long_context.md, "Numbers behind the rules"). Phase A skips what the
    decay makes negligible (``log_bound``, the chunks' log transition bounds from the
    intra-chunk kernel; ``TRUNC`` in :func:`.state_walk_t.state_walk_t_kernel`) and phase B
    the reads of a negligible ``M``. With the split (``cp_long_split``: the rule's segments
    from :data:`.context_parallel.CP_SPLIT_MIN_CHUNKS` chunks) a fifth launch before phase
    A chooses per sequence, from the bounds, between these segments and halves of them
    (:func:`.context_parallel.segment_split_kernel`: halves where one or two heads
    remember across segments), and the three phases work on half-segment slots."""
    tb, gc, aq, lb = ws["Tb"], ws["gc"], ws["Aqk"], ws["log_bound"]
    summ, s0, negl, seg_mult = ws["summary"], ws["s0"], ws["negligible"], ws.get("seg_mult")
    qkn = ws.get("qk_norm")
    go_a = state_walk_t_fwd(q, k, v, tb, aq, gc, cu_seqlens, summary=summ, log_bound=lb,
                            negligible=negl, seg_mult=seg_mult, scale=scale, defer=True,
                            qk_norms=qkn, **plan.phase_a)
    go_b = segment_combine_t_fwd(summ, s0, negl, cu_seqlens, state, seg_mult=seg_mult,
                                 defer=True, **plan.phase_b)
    go_c = phase_c_fwd(plan.phase_c_gluon, q, k, v, tb, aq, gc, cu_seqlens, s0=s0, output=o,
                       final_state=ht, guard=guard, status=status, seg_mult=seg_mult,
                       scale=scale, defer=True, qk_norms=qkn, **plan.phase_c)
    go_split = (segment_split_fwd(lb, cu_seqlens, seg_mult, defer=True, **plan.split_args)
                if seg_mult is not None else None)
    go_intra()
    if go_split is not None:
        go_split()
    go_a()
    go_b()
    go_c()
    return None


def phase_c_fwd(gluon: bool, q, k, v, tb, aq, gc, cu_seqlens, *, s0, output, final_state,
                scale: float, seg_t: int, tail: int, seg_mult=None, guard: bool = False,
                status=None, defer: bool = False, qk_norms=None, **triton_kw):
    """Phase C of the long path as planned: the Gluon walk where the plan picked it
    (``gluon``: :func:`.config.walk_gluon_rule`) and TMA can address the tensors
    (:func:`.state_walk_gluon.tma_ready`), else :func:`.state_walk_t.state_walk_t_fwd` with
    ``triton_kw`` (the plan's ``phase_c``: tile, warps, stages, precisions); ``tail`` (the
    split tail, :func:`.config.tail_split_rule`) goes to either, and so do ``qk_norms``
    (the L2-norm factors of ``q``, ``k`` rows, or None). The one place both launch
    sites (:func:`_cp_long`, :mod:`.multi_gpu`) go through."""
    if gluon and tma_ready(q, k, v, tb, aq, output):
        not_recordable()   # (its launch builds TMA descriptors from the addresses)
        return state_walk_gluon_fwd(q, k, v, tb, aq, gc, cu_seqlens, s0=s0, output=output,
                                    final_state=final_state, scale=scale, seg_t=seg_t,
                                    tail=tail, seg_mult=seg_mult, guard=guard, status=status,
                                    defer=defer, qk_norms=qk_norms)
    return state_walk_t_fwd(q, k, v, tb, aq, gc, cu_seqlens, s0=s0, output=output,
                            final_state=final_state, scale=scale, seg_t=seg_t, tail=tail,
                            seg_mult=seg_mult, guard=guard, status=status, defer=defer,
                            qk_norms=qk_norms, **triton_kw)
