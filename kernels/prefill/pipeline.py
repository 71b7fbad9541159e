"""Compositions of the stage kernels: each prefill variant is a function here.

A variant is a composition, not a copy: every variant launches the same
stage kernels (:mod:`.gates`, :mod:`.intra_chunk`, :mod:`.state_walk`,
:mod:`.context_parallel`) with different flags.

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
``fused``       (1) gates + cumsum + intra-chunk solve, storing ``Tb = Tm    2 kernels; 3-4 with CP;
                diag(beta)`` and ``scale * Aqk`` (the ``"tm"``               1 for T <= 128
                intermediates); (2) state walk forming ``v_new`` and the     (``single_launch_max_T``);
                outputs inline (and guarding ``cu_seqlens``);                the guard inside the last with context parallelism (2) becomes
                segment summaries, then the walk that chains them;
                from 16,384 tokens per sequence (long path) the
                transposed summaries, a combine kernel and the
                transposed walk from the entering states: 4;
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

import functools
from typing import Optional, Tuple, Union

import torch

from .. import interpret
from ..spec import resolve_scale, validate_prefill_inputs
from .chunk_index import BT, num_slots, prepare_chunk_indices
from .config import (DEFAULT_CONFIG, INTRA_WARPS, SHORT_WALK_CHUNKS, SUMMARY_STAGES,
                     SUMMARY_WARPS, WALKER_BV, PrefillConfig, intra_maxnreg_rule,
                     recurrent_rule, walk_launch_rule, walk_pipe_skip_rule, walk_tile_rule, walk_transposed_rule)
from .context_parallel import (cp_long, cp_long_segment_chunks, cp_segment_chunks, cp_split,
                               segment_combine_t_fwd, segment_split_fwd, sm_count,
                               smem_per_block)
from .gates import chunk_gates_fwd, gates_torch
from .guard import check_status_tensor
from .intra_chunk import intra_chunk_fwd
from .recurrent import recurrent_fwd
from .state_walk import state_walk_fwd
from .state_walk_t import state_walk_t_fwd

__all__ = ["prefill_unfused", "prefill_fused_gates", "prefill_no_sync", "prefill_fused",
           "prefill_recurrent", "fused_launches",
           "plan_fused", "workspace_bytes", "check_out_tensor", "LAUNCHES"]

#: Launches per call on a GPU with the default ``check_values`` (the device-side guard of
#: ``cu_seqlens``, :mod:`.guard`, is inside the last kernel) (``kernels``: GPU kernels incl.
#: torch ops; ``copies``: memcpy D2H / H2D; ``syncs``: host waits for the device).
LAUNCHES = {
    "unfused": dict(kernels=11, triton=3, torch_ops=8, copies=3, syncs=2),
    "fused_gates": dict(kernels=3, triton=3, torch_ops=0, copies=3, syncs=2),
    "no_sync": dict(kernels=3, triton=3, torch_ops=0, copies=0, syncs=0),
    "fused": dict(kernels=2, triton=2, torch_ops=0, copies=0, syncs=0),
    "fused+single": dict(kernels=1, triton=1, torch_ops=0, copies=0, syncs=0),
    "fused+cp": dict(kernels=3, triton=3, torch_ops=0, copies=0, syncs=0),
    "fused+cp_long": dict(kernels=4, triton=4, torch_ops=0, copies=0, syncs=0),
    "fused+cp_long_split": dict(kernels=5, triton=5, torch_ops=0, copies=0, syncs=0),
    "fused+recurrent": dict(kernels=1, triton=1, torch_ops=0, copies=0, syncs=0),
    "recurrent": dict(kernels=1, triton=1, torch_ops=0, copies=0, syncs=0),
}


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


def _begin(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output, output_state,
           check_values, status=None):
    """Validate, resolve the scale, allocate (or check) the outputs. Returns ``(shape,
    scale, output, output_state, checked)``; ``checked``: the values of ``cu_seqlens``
    were checked on the host (else the last kernel guards the outputs on the device)."""
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
    # empty_like where a validated input has the shape: the cheapest allocation on the host
    o = output if output is not None else torch.empty_like(v)
    ht = output_state if output_state is not None else (
        torch.empty_like(state) if state is not None
        else torch.empty(N, HV, D, D, dtype=torch.float32, device=q.device))
    return shape, resolve_scale(scale, D), o, ht, bool(check_values)


def _walk(q, k, v, tb, aqk, gc, cu_seqlens, state, o, ht, scale, BV, cfg, guard, status,
          pdl: bool):
    """The walk of the calls without context parallelism (:func:`fused_launches`, the
    compositions): :func:`.state_walk_t.state_walk_t_fwd` for the short walks that
    :func:`.config.walk_transposed_rule` picks, else :func:`.state_walk.state_walk_fwd`,
    forming the outputs inline and guarding ``cu_seqlens`` when ``guard``; ``BV`` from
    :func:`plan_fused`. Returns the bound launch."""
    T, HV, D = q.shape[0], v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    precise = cfg.storage == "precise"
    prec = dict(dot_precision=cfg.precision, out_precision=cfg.precision)
    short = T <= SHORT_WALK_CHUNKS * BT * max(N, 1)
    if walk_transposed_rule(BV, short, precise=precise):
        bvt = cfg.walk_BV or min(128, D)
        return state_walk_t_fwd(
            q, k, v, tb, aqk, gc, cu_seqlens, initial_state=state, output=o, final_state=ht,
            scale=scale, BV=bvt, num_warps=8 if bvt >= 128 else 4, num_stages=2,
            loop_stages=2, pdl=pdl, guard=guard, status=status, defer=True, **prec)
    warps, stages, loop_stages = walk_launch_rule(BV, N * HV * (D // BV), sm_count(q.device),
                                                  short, precise=precise,
                                                  smem_per_block=smem_per_block(q.device))
    return state_walk_fwd(k, tb, v, gc, cu_seqlens, p=aqk, initial_state=state, output=o,
                          final_state=ht, guard=guard, status=status, defer=True, BV=BV,
                          num_warps=warps, num_stages=stages, loop_stages=loop_stages,
                          pdl=pdl, q=q, scale=scale,
                          pipe_skip=walk_pipe_skip_rule(BV, short, precise=precise), **prec)


def _intra(cfg: PrefillConfig, single: bool = False) -> dict:
    """Keyword arguments of :func:`.intra_chunk.intra_chunk_fwd` from a config (``single``:
    the fused variant's one-launch path)."""
    return dict(storage=cfg.storage, solve=cfg.solve,
                maxnreg=intra_maxnreg_rule(cfg.solve, single), num_warps=INTRA_WARPS)


@functools.lru_cache(maxsize=64)
def _fitted(config: PrefillConfig, D: int) -> PrefillConfig:
    return config.fit(D)


def _config(config, D) -> PrefillConfig:
    if config is None:
        config = DEFAULT_CONFIG
    if not isinstance(config, PrefillConfig):
        raise TypeError(f"config must be a PrefillConfig or None, got {type(config).__name__}")
    return _fitted(config, D)   # (cached: a dataclass replace per call costs host time)


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
    ``use_indices``), the walk with the outputs inline."""
    shape, scale, o, ht, checked = _begin(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                                          scale, output, output_state, check_values, status)
    cfg = _config(config, shape.head_dim)
    idx = prepare_chunk_indices(cu_seqlens, T=q.shape[0]) if use_indices else None
    if torch_gates:
        g, beta = gates_torch(A_log, a, dt_bias, b)
        gc, _ = chunk_gates_fwd(cu_seqlens, g=g, beta=beta, chunk_indices=idx)
    else:
        gc, beta = chunk_gates_fwd(cu_seqlens, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                                   chunk_indices=idx)
    tb, _, aqk = intra_chunk_fwd(k, v, cu_seqlens, q, scale=scale, gc=gc, beta=beta,
                                 chunk_indices=idx, **_intra(cfg))
    T, HV, D = q.shape[0], shape.num_v_heads, shape.head_dim
    BV, _ = plan_fused(T, cu_seqlens.numel() - 1, HV, D, q.device, False, cfg)
    _walk(q, k, v, tb, aqk, gc, cu_seqlens, state, o, ht, scale, BV, cfg, not checked,
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


def workspace_bytes(T: int, N: int, HV: int, D: int, seg_chunks: int = 0,
                    storage: str = "compact", solve: str = "batched") -> int:
    """Bytes of intermediates one ``fused`` call allocates (outputs excluded): ``Tb`` and
    ``Aqk`` ``[T, HV, 64]`` (bf16, fp32 with ``"precise"`` storage), ``gc`` f32, the
    ``[T, HV, 64]`` f32 scratch of the ``"blocks"`` solve; with CP (``seg_chunks``) the
    segment summaries ``[S, HV, D, 2D]`` f32 and, on the long path (:func:`.context_parallel.cp_long`),
    the entering states ``[S, HV, D, D]``, the chunks' log bounds ``[T // 64 + N, HV]`` f32
    and the segments' flags ``[S, HV]`` int32; where the device chooses the split
    (:func:`.context_parallel.cp_split`), ``S`` counts half-segment slots and ``[N]`` int32
    more."""
    per_tok = 2 * BT * (4 if storage == "precise" else 2)             # Tb, Aqk
    ws = T * HV * (per_tok + 4 + (BT * 4 if solve == "blocks" else 0))
    if seg_chunks:
        split = cp_long(T, N) and cp_split(seg_chunks)
        S = num_slots(T, N, seg_chunks * BT // (2 if split else 1))
        ws += S * HV * D * 2 * D * 4                  # summaries [M | X]
        ws += (num_slots(T, N) + S) * HV * 4          # chunk bounds, negligible flags
        if cp_long(T, N):
            ws += S * HV * D * D * 4                  # entering states
        if split:
            ws += N * 4                               # segments per sequence (split)
    return ws


def plan_fused(T: int, N: int, HV: int, D: int, device, cp: Union[None, bool, int] = None,
               config: Optional[PrefillConfig] = None) -> Tuple[int, int]:
    """``(BV, seg_chunks)`` the fused variant uses; ``seg_chunks == 0`` means no CP.

    ``cp``: None applies :func:`.context_parallel.cp_segment_chunks`; False/0 turns
    CP off; True forces it (the rule's segment size, at least 2 chunks); an int
    ``n`` forces segments of ``n`` chunks.
    """
    cfg = _config(config, D)
    # tagged: True == 1 as a cache key, but cp=True and cp=1 plan differently
    cp_key = (type(cp).__name__, cp)
    return _plan(int(T), int(N), int(HV), int(D), torch.device(device), cp_key, cfg)


@functools.lru_cache(maxsize=256)
def _plan(T: int, N: int, HV: int, D: int, device, cp_key, cfg: PrefillConfig
          ) -> Tuple[int, int]:
    cp = cp_key[1]
    BV = cfg.walk_BV or 16
    long = cp_long(T, N)
    if cp is None:
        seg = cp_segment_chunks(T, N, HV, D, BV, sm_count(device))
        if seg and long:
            seg = cp_long_segment_chunks(T, N)
    elif cp is True:
        seg = (cp_long_segment_chunks(T, N) if long
               else max(cp_segment_chunks(T, N, HV, D, BV, 0, 1), 2))
    elif cp is False or cp == 0:
        seg = 0
    elif isinstance(cp, int) and cp >= 1:
        seg = int(cp)
    else:
        raise ValueError(f"cp must be None, a bool or a segment size >= 1 (chunks), got {cp!r}")
    if seg and long:
        BV = min(128, D)   # the long path's walks (state_walk_t, both warpgroups)
    elif cfg.walk_BV is None:
        units = num_slots(T, N, seg * BT) if seg else N
        BV = walk_tile_rule(units, HV, D, sm_count(device), bool(seg))
    return BV, seg


#: int32 flag buffers of the one-launch path (walker programs), per device (zero between
#: calls: each walker takes its count off its chunks' flags). Every buffer handed out stays
#: referenced here, so a CUDA graph that captured one never sees it freed.
_FLAGS: dict = {}
_FLAGS_KEPT: list = []


def _walker_flags(device, n: int):
    """A zeroed int32 buffer of at least ``n`` flags on ``device``, or None when one would
    have to be allocated while the stream is being captured (the caller then takes the
    two-launch path)."""
    key = str(device)
    buf = _FLAGS.get(key)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _FLAGS[key] = buf
        _FLAGS_KEPT.append(buf)
    return buf


def prefill_fused(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                  output=None, output_state=None, check_values=None,
                  cp: Union[None, bool, int] = None, config=None, status=None):
    """Fewest launches: (1) gates + cumsum + solve (``Tb``, ``Aqk``), (2) walk + inline
    outputs.

    With context parallelism (see :mod:`.context_parallel`), (2) becomes phase A
    (segment summaries) and phase C (walk + outputs), phase C chaining the earlier
    segments' transitions itself; from 16,384 tokens per sequence the long path
    (:func:`_cp_long`: transposed walks, a phase-B combine kernel). Unchecked
    ``cu_seqlens`` values are checked on the device by the last kernel (:mod:`.guard`).
    """
    shape, scale, o, ht, checked = _begin(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                                          scale, output, output_state, check_values, status)
    cfg = _config(config, shape.head_dim)
    fused_launches(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht,
                   shape, cp, cfg, guard=not checked, status=status,
                   recurrent=recurrent_rule(q.shape[0], cp, cfg))
    if checked and status is not None:
        status.zero_()
    return o, ht


def prefill_recurrent(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                      output=None, output_state=None, check_values=None, config=None,
                      status=None):
    """The token-recurrent kernel (:mod:`.recurrent`) at any length: one launch, unchecked
    ``cu_seqlens`` guarded on the device. ``config`` is checked but has no lever here (the
    kernel works in f32 throughout)."""
    shape, scale, o, ht, checked = _begin(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                                          scale, output, output_state, check_values, status)
    _config(config, shape.head_dim)
    recurrent_fwd(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht,
                  guard=not checked, status=status)
    if checked and status is not None:
        status.zero_()
    return o, ht


def fused_launches(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht, shape,
                   cp, cfg, guard=False, status=None, recurrent=False) -> None:
    """The ``fused`` variant's kernels on validated inputs and allocated outputs. ``guard``:
    the kernel that writes the outputs checks ``cu_seqlens`` on the device (:mod:`.guard`;
    ``status`` gets its bits; :mod:`.graph` guards in its unpack kernel instead).
    ``recurrent``: the token-recurrent kernel alone (the caller applies
    :func:`.config.recurrent_rule` to the call's real length)."""
    if recurrent:
        recurrent_fwd(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht,
                      guard=guard, status=status)
        return None
    T, HV, D = q.shape[0], shape.num_v_heads, shape.head_dim
    N = cu_seqlens.numel() - 1
    BV, seg = plan_fused(T, N, HV, D, q.device, cp, cfg)
    # one launch up to single_launch_max_T tokens: walker programs in the intra-chunk grid
    # (flags per chunk)
    walkers = None
    if (seg == 0 and T <= cfg.single_launch_max_T
            and (min(WALKER_BV, D) >= 64 or interpret.INTERPRET)):
        flags = _walker_flags(q.device, num_slots(T, N) * HV)
        if flags is not None:
            walkers = dict(initial_state=state, final_state=ht, output=o, flags=flags,
                           BV=WALKER_BV, walk_precision=cfg.precision,
                           inline_precision=cfg.precision, guard=guard, status=status)
    trigger = "start" if cfg.pdl else ""
    lb = (torch.empty(num_slots(T, N), HV, dtype=torch.float32, device=q.device) if seg
          else None)
    # every launch is bound (arguments ordered, handles fetched) before the first one:
    # on the eager path the host time between launches is what the GPU waits for
    Tb, gc, Aqk, go_intra = intra_chunk_fwd(
        k, v, cu_seqlens, q, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
        pdl_trigger=trigger, defer=True, walkers=walkers, log_bound=lb,
        **_intra(cfg, walkers is not None))
    if walkers is not None:
        go_intra()
        return None
    if seg == 0:
        go_walk = _walk(q, k, v, Tb, Aqk, gc, cu_seqlens, state, o, ht, scale, BV, cfg,
                        guard, status, cfg.pdl)
        go_intra()
        go_walk()
        return None
    seg_t = seg * BT
    if cp_long(T, N):
        return _cp_long(q, k, v, Tb, Aqk, gc, lb, cu_seqlens, state, o, ht, scale, seg_t, cfg,
                        go_intra, guard, status, split=cp is None and cp_split(seg))
    summary = torch.empty(num_slots(T, N, seg_t), HV, D, 2 * D, dtype=torch.float32,
                          device=q.device)
    negl = torch.empty(num_slots(T, N, seg_t), HV, dtype=torch.int32, device=q.device)
    go_summary = state_walk_fwd(
        k, Tb, v, gc, cu_seqlens, summary=summary, seg_t=seg_t, pdl=cfg.pdl,
        pdl_trigger=trigger, log_bound=lb, negligible=negl,
        BV=min(64, 2 * D), num_warps=SUMMARY_WARPS, num_stages=SUMMARY_STAGES,
        dot_precision=cfg.precision, defer=True)
    programs = num_slots(T, N, seg_t) * HV * (D // BV)
    warps, stages, loop_stages = walk_launch_rule(BV, programs, sm_count(q.device), False,
                                                  precise=cfg.storage == "precise",
                                                  smem_per_block=smem_per_block(q.device))
    go_walk = state_walk_fwd(k, Tb, v, gc, cu_seqlens, p=Aqk, initial_state=state,
                             summary=summary, chain=True, output=o, final_state=ht,
                             seg_t=seg_t, chain_precision=cfg.cp_chain_precision,
                             negligible=negl,
                             guard=guard, status=status, defer=True, BV=BV, num_warps=warps,
                             num_stages=stages, loop_stages=loop_stages, pdl=cfg.pdl, q=q,
                             scale=scale, dot_precision=cfg.precision,
                             out_precision=cfg.precision)
    go_intra()
    go_summary()
    go_walk()
    return None


def _cp_long(q, k, v, tb, aq, gc, lb, cu_seqlens, state, o, ht, scale, seg_t, cfg, go_intra,
             guard, status, split=False):
    """Context parallelism of long sequences with the transposed walks (:mod:`.state_walk_t`,
    :func:`.context_parallel.cp_long_segment_chunks`): phase A (each segment's
    ``[M^T ; X^T]``: two programs of ``K`` rows per segment and head, 3 pipeline stages),
    phase B (:func:`.context_parallel.segment_combine_t_fwd`: the serial pass over the
    segments, bf16 products) and phase C (outputs from each segment's entering state,
    ``BV = 128`` with 8 warps: both warpgroups share one load of ``k``, ``q``, ``Tb``,
    ``Aqk``): 4 launches, about linear in length (numbers against the chained CP:
    docs/notes/long_context.md, "Numbers behind the rules"). Phase A skips what the
    decay makes negligible (``lb``, the chunks' log transition bounds from the intra-chunk
    kernel; ``TRUNC`` in :func:`.state_walk_t.state_walk_t_kernel`) and phase B the
    reads of a negligible ``M``. ``split`` (the rule's segments from
    :data:`.context_parallel.CP_SPLIT_MIN_CHUNKS` chunks): a fifth launch before phase A
    chooses per sequence, from ``lb``, between these segments and halves of them
    (:func:`.context_parallel.segment_split_kernel`: halves where one or two heads
    remember across segments), and the three phases work on half-segment slots."""
    T, HV, D = q.shape[0], v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    seg_mult = None
    if split:
        seg_t //= 2
        seg_mult = torch.empty(N, dtype=torch.int32, device=q.device)
    S = num_slots(T, N, seg_t)
    summ = torch.empty(S, HV, 2 * D, D, dtype=torch.float32, device=q.device)
    s0 = torch.empty(S, HV, D, D, dtype=torch.float32, device=q.device)
    negl = torch.empty(S, HV, dtype=torch.int32, device=q.device)
    bv = min(128, D)
    kw = dict(scale=scale, dot_precision=cfg.precision, BV=bv,
              num_warps=8 if bv >= 128 else 4, out_precision=cfg.precision,
              seg_t=seg_t, defer=True)
    go_a = state_walk_t_fwd(q, k, v, tb, aq, gc, cu_seqlens, summary=summ, pdl=cfg.pdl,
                            num_stages=3, loop_stages=3, log_bound=lb, negligible=negl,
                            seg_mult=seg_mult, **kw)
    go_b = segment_combine_t_fwd(summ, s0, negl, cu_seqlens, state, seg_t=seg_t, T=T,
                                 BV=min(16, D), seg_mult=seg_mult, defer=True)
    go_c = state_walk_t_fwd(q, k, v, tb, aq, gc, cu_seqlens, s0=s0, output=o, final_state=ht,
                            num_stages=2, loop_stages=2, guard=guard, status=status,
                            seg_mult=seg_mult, **kw)
    go_split = (segment_split_fwd(lb, cu_seqlens, seg_mult, seg_chunks=seg_t // BT, T=T,
                                  n_sm=sm_count(q.device), defer=True) if split else None)
    go_intra()
    if go_split is not None:
        go_split()
    go_a()
    go_b()
    go_c()
    return None
