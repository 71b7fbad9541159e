"""Triton chunked prefill of Gated DeltaNet (chunk size 64, WY/UT form).

One module per stage, each readable and testable alone:

- :mod:`.chunk_index`       chunk bookkeeping: host-built table (sync) or device lookup
- :mod:`.gates`             stage 1: ``g``, ``beta``, per-chunk cumulative ``g``
- :mod:`.intra_chunk`       stage 2: ``A = beta K K^T exp(gc_i - gc_j)``, its solve, then
                            ``Tb = Tm diag(beta)`` and ``scale * Aqk``
- :mod:`.state_walk`        stage 3: inter-chunk state recurrence + the outputs inline
- :mod:`.state_walk_t`      the same walk on ``S^T`` (short walks, the long CP path)
- :mod:`.context_parallel`  segment summaries + combine for long sequences with few heads
- :mod:`.recurrent`         the token-recurrent kernel of short calls (one launch)
- :mod:`.plan`              one :class:`.plan.Plan` per call: the path, tiles, segments,
                            split, launches and launch arguments, chosen in one place
- :mod:`.pipeline`          the variants as compositions of the stages (``fused`` runs a plan)
- :mod:`.graph`             the ``graph`` variant (CUDA graph per shape bucket)
- :mod:`.config`            :class:`PrefillConfig` (9 levers) and the launch rules

Public API: :func:`gdn_prefill`, :data:`VARIANTS`, :func:`make_prefill_impl`,
:func:`launch_count_hint`, :func:`prefill_plan`, :func:`.config.recurrent_rule`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Tuple, Union

import torch

from .chunk_index import BT
from .config import ACCURATE_CONFIG, DEFAULT_CONFIG, PrefillConfig, recurrent_rule
from .graph import clear_graph_cache, graph_cache_info, prefill_graph
from .guard import describe_status
from .pipeline import (call_signature, prefill_fused, prefill_fused_gates,
                       prefill_no_sync, prefill_recurrent, prefill_unfused, prepare_call,
                       run_call)
from .plan import CALLS, FAST, LAUNCHES, MAX_CALLS, Plan, prefill_plan

__all__ = ["gdn_prefill", "VARIANTS", "make_prefill_impl", "launch_count_hint", "BT",
           "prefill_plan", "Plan", "graph_cache_info", "clear_graph_cache",
           "PrefillConfig", "DEFAULT_CONFIG", "ACCURATE_CONFIG", "describe_status",
           "recurrent_rule"]

VARIANTS = ("unfused", "fused_gates", "no_sync", "graph", "fused", "recurrent")

_IMPLS = {
    "unfused": prefill_unfused,
    "fused_gates": prefill_fused_gates,
    "no_sync": prefill_no_sync,
    "graph": prefill_graph,
    "fused": prefill_fused,
    "recurrent": prefill_recurrent,
}
_CP_VARIANTS = ("fused", "graph")
#: The variants whose calls are checked and planned once per signature
#: (:func:`.pipeline.call_signature`): a repeat looks its :class:`.pipeline.PreparedCall` up
#: and runs only what changes per call (:func:`.pipeline.run_call`). At most
#: :data:`.plan.MAX_CALLS` signatures (in :data:`.plan.CALLS`, forgotten with the plans).
_PREPARED = ("fused", "recurrent")


def gdn_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                state: Optional[torch.Tensor], A_log: torch.Tensor, a: torch.Tensor,
                dt_bias: torch.Tensor, b: torch.Tensor, cu_seqlens: torch.Tensor,
                scale: Optional[float] = None, *, variant: str = "fused",
                output: Optional[torch.Tensor] = None,
                output_state: Optional[torch.Tensor] = None,
                check_values: Optional[bool] = None,
                cp: Union[None, bool, int] = None,
                config: Optional[PrefillConfig] = None,
                BV: Optional[int] = None,
                status: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet chunked prefill over packed variable-length sequences.

    Per sequence and value head ``h`` (float32), with ``S = state[h].T`` `[K, V]`::

        decay = exp(-exp(A_log[h]) * softplus(a_t[h] + dt_bias[h]));  beta = sigmoid(b_t[h])
        S = decay * S;  S = S + beta * k_t^T (v_t - k_t S);  o_t = scale * q_t S

    Value head ``h`` uses q/k head ``h // (HV // HQ)``.

    Args:
        q: `[T, HQ, D]` bf16 queries (normalised by the caller).
        k: `[T, HQ, D]` bf16 keys (normalised by the caller).
        v: `[T, HV, D]` bf16 values; ``HV`` a multiple of ``HQ``.
        state: `[N, HV, D, D]` f32 initial state, k-last (element ``(k, v)`` at
            ``state[n, h, v, k]``), or None for zeros. Left untouched.
        A_log: `[HV]` f32.
        a: `[T, HV]` bf16 raw decay gate input.
        dt_bias: `[HV]` f32.
        b: `[T, HV]` bf16 raw beta gate input.
        cu_seqlens: `[N+1]` int64 or int32, ``0 = cu[0] <= ... <= cu[N] = T``;
            empty sequences allowed.
        scale: output scale; None or 0 means ``1/sqrt(D)``.
        variant: one of :data:`VARIANTS` (see :mod:`.pipeline` for what each launches);
            ``fused`` and ``graph`` take the token-recurrent kernel (:mod:`.recurrent`)
            for calls of up to ``config.recurrent_max_T`` tokens, ``recurrent`` at any
            length.
        output: optional preallocated `[T, HV, D]` bf16 output.
        output_state: optional preallocated `[N, HV, D, D]` f32 final state.
        check_values: check the values of ``cu_seqlens`` on the host (a device-to-host
            copy and a sync on CUDA; a ValueError naming ``cu_seqlens`` if invalid).
            None: always for ``unfused``/``fused_gates`` (they sync anyway), only off
            CUDA for ``no_sync``/``fused``/``graph``. Unchecked values are checked on the
            device instead (:mod:`.guard`, no sync): if invalid (``cu[0] != 0``,
            ``cu[N] != T``, decreasing, or an entry outside ``[0, T]``) the kernels stay
            in bounds and every row of ``output`` and every final state is NaN. Cost:
            ``fused``: none beyond each program of the last kernel reading ``cu_seqlens``
            (``N + 1`` entries) once; ``graph``: the same in its unpack kernel;
            ``no_sync``: one extra launch.
        cp: context parallelism (``fused``/``graph`` only): None applies the rule
            of :mod:`.context_parallel`, False turns it off, True forces it (the rule's
            segments, with the split chosen on the device where the rule takes it), an
            int forces segments of that many chunks, which the device does not split
            (:mod:`.plan`; its note and :func:`launch_count_hint` say so).
        config: a :class:`PrefillConfig`; None: the defaults (bf16 intermediates and
            products, like FLA and FlashInfer). ``ACCURATE_CONFIG`` for long-memory,
            high-beta inputs (see :mod:`kernels.stress_inputs`).
        BV: shorthand for the state-walk tile width (``walk_BV`` of ``config``), a
            power of two in ``[16, D]``.
        status: optional `[1]` int32 tensor on the inputs' device; the call writes the
            validity bits of ``cu_seqlens`` into it without a sync (0: valid; else
            :data:`.chunk_index.CU_START` 1, ``CU_END`` 2, ``CU_DECREASING`` 4,
            ``CU_RANGE`` 8 OR-ed; :func:`.guard.describe_status` words them). Read it
            whenever convenient (reading a CUDA tensor syncs).

    Returns:
        ``(output [T, HV, D] bf16, new_state [N, HV, D, D] f32)``.

    Raises:
        TypeError / ValueError naming the offending argument, before anything is
        allocated or launched; ValueError for an unknown ``variant``.

    ``fused`` and ``recurrent`` calls are checked and planned in full once per signature
    (every tensor's type, shape, dtype, device, contiguity and every option:
    :func:`.pipeline.call_signature`); a repeat runs only what changes per call
    (:func:`.pipeline.run_call`: ``cu_seqlens``' values where they are checked on the host,
    fresh outputs, the launches). Where :mod:`kernels.fastcall` is available, a repeat is
    one C call (checks against the signature's plan, outputs, launches); anything its plan
    does not match takes the path above.
    """
    last = FAST[0]
    if last is not None:   # the last plan (kernels.fastcall): one C call, or None
        r = last[0](last[1], variant, scale, check_values, cp, config, BV, q, k, v, state,
                    A_log, a, dt_bias, b, cu_seqlens, status, output, output_state)
        if r is not None:
            return r
    opts = (variant, scale, check_values, cp, config, BV)
    try:
        sig = (call_signature(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                              output_state, check_values, status, cp, config, variant),
               type(BV), BV)
        c = CALLS.get(sig)
    except (AttributeError, TypeError):   # not a tensor, an unhashable option: checks say
        sig = c = None
    if c is not None:
        return run_call(c, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, output,
                        output_state, status, opts)
    fn = _impl(variant)
    config = _resolve(config, BV, q)
    if variant not in _CP_VARIANTS and cp not in (None, False):
        raise ValueError(f"cp is only supported by the variants {_CP_VARIANTS}, got "
                         f"variant={variant!r}")
    if variant in _PREPARED:
        c = prepare_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output,
                         output_state, check_values, status, cp, config,
                         recurrent=variant == "recurrent", record=sig is not None)
        if sig is not None:
            if len(CALLS) >= MAX_CALLS:
                CALLS.clear()
            CALLS[sig] = c
        return run_call(c, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, output,
                        output_state, status, opts if sig is not None else None)
    kwargs = dict(output=output, output_state=output_state, config=config, status=status)
    if check_values is not None:
        kwargs["check_values"] = check_values
    if variant in _CP_VARIANTS:
        kwargs["cp"] = cp
    return fn(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, **kwargs)


def _impl(variant):
    if variant not in _IMPLS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return _IMPLS[variant]


def _resolve(config, BV, q):
    if config is not None and not isinstance(config, PrefillConfig):
        raise TypeError(f"config must be a PrefillConfig or None, got {type(config).__name__}")
    if BV is None:
        return config
    D = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() == 3 else None
    if not isinstance(BV, int) or BV < 16 or BV & (BV - 1) or (D is not None and BV > D):
        raise ValueError(f"BV must be a power of two in [16, D], got {BV}")
    return replace(config or DEFAULT_CONFIG, walk_BV=BV)


def make_prefill_impl(variant: str = "fused", **options):
    """A callable with the calling convention ``fn(q, k, v, state, A_log, a, dt_bias, b,
    cu_seqlens, scale=None) -> (output, new_state)`` running ``variant``.

    ``options`` are passed to :func:`gdn_prefill` (e.g. ``cp=False``).
    """
    _impl(variant)

    def impl(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
        return gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                           variant=variant, **options)

    impl.__name__ = f"gdn_prefill_{variant}"
    impl.variant = variant
    return impl


def launch_count_hint(variant: str, T: Optional[int] = None, N: Optional[int] = None,
                      HV: int = 8, D: int = 128, device="cuda", cp=None) -> dict:
    """What one call of ``variant`` launches on a GPU (excluding allocation), read from
    :data:`.plan.LAUNCHES` and, for ``fused`` and ``graph`` with ``T`` and ``N``, the call's
    :class:`.plan.Plan` (the default config).

    Returns a dict: ``kernels`` (GPU kernels, torch elementwise ops included),
    ``triton`` (our Triton kernels), ``torch_ops``, ``copies`` (memcpy D2H/H2D),
    ``syncs`` (host waits on the device), ``graph_launches``, ``cp`` (whether the
    fused walk uses context parallelism for this ``T``/``N``; needs both) and ``note``
    (with the plan's own note where a forced ``cp`` turned the device's split off, and
    where the long path's phase C is the Gluon walk).
    """
    _impl(variant)
    plan = None
    if variant in _CP_VARIANTS and T is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            dev = torch.device("cpu")   # the rules then assume 132 SMs
        plan = prefill_plan(T, 1 if N is None else N, HV, D, dev, cp,
                            graph=variant == "graph")
        if N is None and plan.path != "recurrent":
            plan = None   # (the recurrent choice needs T only; the rest needs N too)
    if plan is None:
        fused_key, use_cp, plan_note = "fused", None, ""
    else:
        fused_key, plan_note = plan.launch_key, plan.note
        use_cp = False if plan.path == "recurrent" else bool(plan.seg_chunks)
    gluon_note = ("; phase C: the Gluon walk (sm_90)" if plan is not None and plan.phase_c_gluon
                  else "")
    if variant == "graph":
        inner = LAUNCHES[fused_key]["kernels"]
        return dict(kernels=2, triton=2, torch_ops=0, copies=0, syncs=0, graph_launches=1,
                    cp=use_cp, note=f"pack kernel + 1 graph replay ({inner} kernels "
                                    "inside) + unpack kernel (checks cu_seqlens); first call "
                                    "per bucket also captures"
                                    + (f"; {plan_note}" if plan_note else "") + gluon_note)
    key = fused_key if variant == "fused" else variant
    out = dict(LAUNCHES[key], graph_launches=0, cp=use_cp)
    if plan_note and variant == "fused":
        out["note"] += f"; {plan_note}"
    out["note"] += gluon_note if variant == "fused" else ""
    return out
