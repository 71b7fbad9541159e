"""One plan per prefill call: the path, the tile, the segments, the split, the launches.

:func:`prefill_plan` applies every rule of the chunked prefill once, from host metadata
only (the call's ``T``, ``N``, heads, head size, device, ``cp`` and config), and returns a
:class:`Plan`; the ``fused`` and ``graph`` variants run it (:func:`.pipeline.fused_launches`),
the compositions of notebook 02 take its walk, and :func:`kernels.prefill.launch_count_hint`
and notebook 04's plan table (``plan.csv``) only read it. Plans are remembered per key
(:func:`call_plan`: every eager call asks), so a repeat call finds its launch arguments
built.

The path (the one place it is chosen):

==================  ===========================================================  ========
path                when                                                         launches
==================  ===========================================================  ========
``recurrent``       ``T <= recurrent_max_T`` and CP not forced                    1
                    (:func:`.config.recurrent_rule`)
``single``          no CP, ``T <= single_launch_max_T``, head size >= 64          1
                    (walker programs in the intra-chunk grid)
``walk``            no CP otherwise: intra-chunk kernel, then the walk            2
``cp``              CP (:func:`.context_parallel.cp_segment_chunks`, or ``cp``    3
                    forced) below :data:`.context_parallel.CP_LONG_MIN_CHUNKS`
                    chunks per sequence: phase A, then phase C chaining
``cp_long``         CP from that length (:func:`.context_parallel.cp_long`):      4
                    phase A, combine, phase C, all transposed
``cp_long_split``   ``cp_long`` with segments of at least                         5
                    :data:`.context_parallel.CP_SPLIT_MIN_CHUNKS` chunks: a split
                    kernel halves them per sequence on the device
==================  ===========================================================  ========

On the long paths phase C is the warp-specialized Gluon walk (:mod:`.state_walk_gluon`)
where :func:`.config.walk_gluon_rule` picks it (sm_90, ``D = 128``, the default
precisions), else the Triton walk (:mod:`.state_walk_t`); :attr:`Plan.phase_c_gluon`
records the choice.

``cp``: None applies the rule; False/0 turns CP off; True forces CP with the rule's
segments (at least 2 chunks), the device split included where the rule's segments take it;
an int ``n`` forces segments of ``n`` chunks, which the device then does not split: where
the rule's segments would have been split, :attr:`Plan.note` says so (and so does
``launch_count_hint``).

The negligible threshold (``log_eps``, a :class:`.config.PrefillConfig` field) goes to
every kernel that drops what the gates' decay has made negligible, as ``LOG_EPS``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Union

import torch

from .. import gpu_limits, interpret
from .chunk_index import BT, num_slots
from .config import (DEFAULT_CONFIG, INTRA_WARPS, SHORT_WALK_CHUNKS, SUMMARY_STAGES,
                     SUMMARY_WARPS, WALKER_BV, PrefillConfig, intra_maxnreg_rule,
                     recurrent_rule, tail_split_rule, walk_gluon_rule, walk_launch_rule,
                     walk_pipe_skip_rule, walk_tile_rule, walk_transposed_rule)
from .context_parallel import (cp_long, cp_long_segment_chunks, cp_segment_chunks, cp_split,
                               sm_count, smem_per_block)
from .intra_chunk import STORAGE
from .state_walk_gluon import HAVE_GLUON

__all__ = ["Plan", "prefill_plan", "call_plan", "plan_key", "MAX_PLANS", "LAUNCHES",
           "PATH_LABELS", "launch_key", "bucket_of", "intra_kwargs", "workspace_layout",
           "layout_views", "long_path_args",
           "WORKSPACE_ALIGN", "fitted_config", "clear_plan_cache", "CALLS", "MAX_CALLS",
           "device_cc", "phase_c_gluon"]

#: Launches per call on a GPU with the default ``check_values`` (the device-side guard of
#: ``cu_seqlens``, :mod:`.guard`, is inside the last kernel) (``kernels``: GPU kernels incl.
#: torch ops; ``copies``: memcpy D2H / H2D; ``syncs``: host waits for the device; ``note``:
#: what they are). Keys: the variants, and ``fused+<path>`` for the paths of
#: :func:`prefill_plan` (``fused``: the walk; :func:`launch_key`).
LAUNCHES = {
    "unfused": dict(kernels=11, triton=3, torch_ops=8, copies=3, syncs=2, note=(
        "8 torch gate ops + cumsum, intra, walk with inline outputs; cu_seqlens read on "
        "host twice (validation, chunk table) and the table copied back")),
    "fused_gates": dict(kernels=3, triton=3, torch_ops=0, copies=3, syncs=2, note=(
        "gates+cumsum, intra, walk with inline outputs; host-built chunk table as unfused")),
    "no_sync": dict(kernels=3, triton=3, torch_ops=0, copies=0, syncs=0, note=(
        "gates+cumsum, intra, walk with inline outputs (+ guard); device-side chunk lookup")),
    "fused": dict(kernels=2, triton=2, torch_ops=0, copies=0, syncs=0, note=(
        "intra (+gates, cumsum) and walk with inline outputs (+ guard)")),
    "fused+single": dict(kernels=1, triton=1, torch_ops=0, copies=0, syncs=0, note=(
        "one kernel: intra (+gates, cumsum) with walker programs (+ guard)")),
    "fused+cp": dict(kernels=3, triton=3, torch_ops=0, copies=0, syncs=0, note=(
        "intra (+gates, cumsum) and walk with inline outputs; CP: segment summaries, then "
        "the walk chaining them (+ guard)")),
    "fused+cp_long": dict(kernels=4, triton=4, torch_ops=0, copies=0, syncs=0, note=(
        "intra (+gates, cumsum); long CP: transposed segment summaries, combine, transposed "
        "walk from the entering states (+ guard)")),
    "fused+cp_long_split": dict(kernels=5, triton=5, torch_ops=0, copies=0, syncs=0, note=(
        "intra (+gates, cumsum); the split chosen on the device from the gates; long CP: "
        "transposed segment summaries, combine, transposed walk from the entering states "
        "(+ guard)")),
    "fused+recurrent": dict(kernels=1, triton=1, torch_ops=0, copies=0, syncs=0, note=(
        "one kernel: the token-recurrent kernel (gates, state walked token by token, "
        "outputs, guard) for T <= recurrent_max_T")),
    "recurrent": dict(kernels=1, triton=1, torch_ops=0, copies=0, syncs=0, note=(
        "one kernel: the token-recurrent kernel (gates, state walked token by token, "
        "outputs, guard)")),
}


def launch_key(path: str) -> str:
    """The key of :data:`LAUNCHES` of a ``fused`` call taking ``path``."""
    return "fused" if path == "walk" else "fused+" + path


#: Each path in words (notebook 04's ``plan.csv``).
PATH_LABELS = {"recurrent": "recurrent", "single": "one launch", "walk": "walk",
               "cp": "chained CP", "cp_long": "long CP",
               "cp_long_split": "long CP, split on the device"}

#: Byte alignment of each view of a call's workspace (:func:`workspace_layout`): the CUDA
#: caching allocator's, so a view starts where a tensor of its own would.
WORKSPACE_ALIGN = 512


@dataclass(frozen=True, eq=False)
class Plan:
    """What one chunked prefill call does, made once per key by :func:`prefill_plan`.

    Attributes:
        path: one of :data:`PATH_LABELS` (see the module doc).
        T, N, HV, D: the shape planned (the graph variant's: its bucket's).
        BV: the walk's tile width (the chunked rule's, also reported for ``recurrent``).
        seg_chunks: chunks per CP segment (0: no CP); with the split, the coarse segment.
        split: the device halves the segments per sequence (``cp_long_split``).
        launches: GPU kernels per call (:data:`LAUNCHES`).
        log_eps: the negligible threshold handed to the kernels as ``LOG_EPS``.
        note: a rule that changed what the call would otherwise do ("" if none).
        config: the config (``walk_BV`` fitted to ``D``).
        intra: keyword arguments of :func:`.intra_chunk.intra_chunk_fwd` without walkers;
            intra_single: with them (``single``).
        walk: ``(transposed, kwargs)`` of the walk without CP (also the one-launch path's
            fallback while a capture cannot allocate its flags), else None.
        walkers: the one-launch path's walker options (``single``), else None.
        phase_a, phase_c: keyword arguments of the CP phases (``cp``: of
            :func:`.state_walk.state_walk_fwd`; long paths: of
            :func:`.state_walk_t.state_walk_t_fwd`, phase C launched through
            :func:`.pipeline.phase_c_fwd`), phase_b of
            :func:`.context_parallel.segment_combine_t_fwd` (the long path's three:
            :func:`long_path_args`), split_args of
            :func:`.context_parallel.segment_split_fwd` (``cp_long_split``; the phases then
            work on half-segment slots).
        layout, nbytes: the workspace's views ``(name, dtype, shape, offset, bytes)`` and
            the bytes of its one allocation (:func:`workspace_layout`); views: the same as
            ``(name, dtype, shape, strides, element offset)``, what a call cuts them with.
        qk_heads: the q/k heads of a call that L2-normalises ``q`` and ``k`` in the kernels
            (FLA's ``use_qk_l2norm_in_kernel``; the workspace then has the ``qk_norm``
            factors, :func:`workspace_layout`), 0 for a call that does not.
    """

    path: str
    T: int
    N: int
    HV: int
    D: int
    BV: int
    seg_chunks: int
    split: bool
    launches: int
    log_eps: float
    note: str
    config: PrefillConfig
    intra: dict
    intra_single: Optional[dict] = None
    walk: Optional[tuple] = None
    walkers: Optional[dict] = None
    phase_a: Optional[dict] = None
    phase_b: Optional[dict] = None
    phase_c: Optional[dict] = None
    split_args: Optional[dict] = None
    layout: tuple = ()
    nbytes: int = 0
    views: tuple = ()
    phase_c_gluon: bool = False
    qk_heads: int = 0

    @property
    def label(self) -> str:
        """The path in words (:data:`PATH_LABELS`)."""
        return PATH_LABELS[self.path]

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the intermediates the call holds (outputs excluded; without the
        alignment between the views, which :attr:`nbytes` has)."""
        return sum(v[4] for v in self.layout)

    @property
    def launch_key(self) -> str:
        """This path's key of :data:`LAUNCHES`."""
        return launch_key(self.path)


def device_cc(device) -> Optional[int]:
    """The compute capability of a CUDA ``device`` as ``10 * major + minor``; None off
    CUDA."""
    device = torch.device(device)
    return gpu_limits.device_limits(device).cc if device.type == "cuda" else None


def phase_c_gluon(device, D: int, config: PrefillConfig) -> bool:
    """:func:`.config.walk_gluon_rule` for a call on ``device`` with head size ``D``: whether
    the long path's phase C is the Gluon walk (also :mod:`.multi_gpu`'s rank plans)."""
    return walk_gluon_rule(device_cc(device), interpret.INTERPRET, HAVE_GLUON, D, config)


def bucket_of(T: int, N: int):
    """``(T_pad, N_pad)`` of the graph variant's bucket for ``T`` tokens and ``N``
    sequences: ``max(64, next power of two >= T)`` and the next power of two ``>= N``."""
    return max(64, _next_pow2(T)), _next_pow2(N)


def _next_pow2(x: int) -> int:
    x = int(x)
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def intra_kwargs(cfg: PrefillConfig, single: bool = False) -> dict:
    """Keyword arguments of :func:`.intra_chunk.intra_chunk_fwd` from a config (``single``:
    the one-launch path)."""
    return dict(storage=cfg.storage, solve=cfg.solve,
                maxnreg=intra_maxnreg_rule(cfg.solve, single), num_warps=INTRA_WARPS)


@functools.lru_cache(maxsize=64)
def _fitted(config: PrefillConfig, D: int) -> PrefillConfig:
    return config.fit(D)


def fitted_config(config, D: int) -> PrefillConfig:
    """``config`` (None: the defaults) checked and fitted to the head size ``D`` (cached: a
    dataclass ``replace`` per call costs host time)."""
    if config is None:
        config = DEFAULT_CONFIG
    if not isinstance(config, PrefillConfig):
        raise TypeError(f"config must be a PrefillConfig or None, got {type(config).__name__}")
    return _fitted(config, D)


def plan_key(cp):
    """``cp`` as part of a plan's key (True == 1 as a key, but ``cp=True`` and ``cp=1`` plan
    differently); a ValueError naming ``cp`` if it is none of None, a bool, an int >= 0."""
    if cp is not None and not isinstance(cp, int) or isinstance(cp, int) and cp < 0:
        raise ValueError(f"cp must be None, a bool or a segment size >= 1 (chunks), got {cp!r}")
    return (type(cp).__name__, cp)


def prefill_plan(T: int, N: int, HV: int, D: int, device="cuda",
                 cp: Union[None, bool, int] = None, config: Optional[PrefillConfig] = None,
                 graph: bool = False) -> Plan:
    """The :class:`Plan` of a ``fused`` call of ``T`` tokens in ``N`` sequences with ``HV``
    value heads of size ``D`` on ``device`` (``"cuda"``: the current GPU).

    ``graph``: the ``graph`` variant's plan: the recurrent rule on the call's ``T``, the
    chunked path planned for its bucket (:func:`bucket_of`), whose kernels the graph
    replays."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return call_plan(int(T), int(N), int(HV), int(D), device, cp, config, bool(graph))


#: Plans by the key of :func:`call_plan` (at most :data:`MAX_PLANS`; then forgotten at once).
_PLANS: dict = {}
MAX_PLANS = 4096


def call_plan(T: int, N: int, HV: int, D: int, device: torch.device, cp, config,
              graph: bool = False, qk_heads: int = 0) -> Plan:
    """:func:`prefill_plan` for a call: ints, the inputs' ``device`` (with its index), the
    caller's ``cp`` and ``config``; remembered on exactly these (one dict lookup per
    call, as :func:`kernels.decode.table.config_for_device`), built on a miss (``cp`` and
    ``config`` checked then). ``qk_heads`` (:attr:`Plan.qk_heads`) is part of the key: a
    call with the L2 norm in the kernels never shares a plan with one without."""
    key = (T, N, HV, D, device, cp.__class__, cp, config, graph, qk_heads)
    try:
        plan = _PLANS.get(key)
    except TypeError:   # an unhashable cp or config: plan_key / fitted_config say why
        plan = None
    if plan is None:
        plan = _plan(T, N, HV, D, device, plan_key(cp), fitted_config(config, D), graph,
                     qk_heads)
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


#: Checked call signatures of :func:`kernels.prefill.gdn_prefill` and their
#: :class:`.pipeline.PreparedCall` (each holds its plan; at most :data:`MAX_CALLS`, then
#: forgotten at once), forgotten with the plans.
CALLS: dict = {}
MAX_CALLS = 1024
#: ``[(run, plan)]``: the plan (:mod:`kernels.fastcall`) that served the last ``gdn_prefill``
#: call, tried first by the next one; ``[None]`` until then.
FAST: list = [None]


def clear_plan_cache() -> None:
    """Forget every plan and every prepared call holding one (the rules' module constants
    changed, e.g. in a test)."""
    _PLANS.clear()
    CALLS.clear()
    FAST[0] = None


def _plan(T: int, N: int, HV: int, D: int, device, cp_key, cfg: PrefillConfig,
          graph: bool = False, qk_heads: int = 0) -> Plan:
    """Apply the rules (:func:`prefill_plan` on checked arguments: :func:`plan_key`, the
    fitted config)."""
    cp = cp_key[1]
    T_call = T
    if graph:
        T, N = bucket_of(T, N)
    n_sm = sm_count(device)
    BV = cfg.walk_BV or 16
    long = cp_long(T, N)
    if cp is None:
        seg = cp_segment_chunks(T, N, HV, D, BV, n_sm)
        if seg and long:
            seg = cp_long_segment_chunks(T, N)
    elif cp is True:
        seg = cp_long_segment_chunks(T, N) if long else max(
            cp_segment_chunks(T, N, HV, D, BV, 0, 1), 2)
    else:
        seg = int(cp)   # (False and 0: no CP)
    long = bool(seg) and long
    if not long and cfg.walk_BV is None:   # (the long path's tile: long_path_args)
        units = num_slots(T, N, seg * BT) if seg else N
        BV = walk_tile_rule(units, HV, D, n_sm, bool(seg))
    split = long and (cp is None or cp is True) and cp_split(seg)
    note = ""
    if long and cp is not None and cp is not True and cp_split(cp_long_segment_chunks(T, N)):
        note = (f"cp={cp} fixes the segments at {seg} chunks: the device does not split "
                "them as the rule's would be (cp=None or True lets it)")
    walkers_ok = min(WALKER_BV, D) >= 64 or interpret.INTERPRET
    if recurrent_rule(T_call, cp, cfg):
        path = "recurrent"
    elif seg:
        path = "cp_long_split" if split else "cp_long" if long else "cp"
    elif T <= cfg.single_launch_max_T and walkers_ok:
        path = "single"
    else:
        path = "walk"
    prec = dict(dot_precision=cfg.precision, out_precision=cfg.precision)
    trigger = "start" if cfg.pdl else ""
    kw = dict(path=path, T=T, N=N, HV=HV, D=D, BV=BV, seg_chunks=seg, split=split,
              launches=LAUNCHES[launch_key(path)]["kernels"],
              log_eps=cfg.log_eps, note=note, config=cfg, qk_heads=qk_heads,
              intra=dict(intra_kwargs(cfg), pdl_trigger=trigger))
    if not seg:
        kw["walk"] = _walk_args(T, N, HV, D, BV, device, n_sm, cfg, prec)
        if path == "single":
            kw["intra_single"] = dict(intra_kwargs(cfg, True), pdl_trigger=trigger)
            kw["walkers"] = dict(BV=WALKER_BV, walk_precision=cfg.precision,
                                 inline_precision=cfg.precision)
    elif long:
        seg_t = seg * BT // (2 if split else 1)
        args = long_path_args(T, D, seg_t, cfg, pdl=cfg.pdl)
        kw.update(args, BV=args["phase_c"]["BV"], phase_c_gluon=phase_c_gluon(device, D, cfg))
        if split:
            kw["split_args"] = dict(seg_chunks=seg_t // BT, T=T, n_sm=n_sm,
                                    log_eps=cfg.log_eps)
    else:
        seg_t = seg * BT
        warps, stages, loop_stages = walk_launch_rule(
            BV, num_slots(T, N, seg_t) * HV * (D // BV), n_sm, False,
            precise=cfg.storage == "precise", smem_per_block=smem_per_block(device))
        kw.update(phase_a=dict(seg_t=seg_t, pdl=cfg.pdl, pdl_trigger=trigger,
                               BV=min(64, 2 * D), num_warps=SUMMARY_WARPS,
                               num_stages=SUMMARY_STAGES, dot_precision=cfg.precision,
                               log_eps=cfg.log_eps),
                  phase_c=dict(seg_t=seg_t, chain=True, chain_precision=cfg.cp_chain_precision,
                               BV=BV, num_warps=warps, num_stages=stages,
                               loop_stages=loop_stages, pdl=cfg.pdl, log_eps=cfg.log_eps,
                               **prec))
    if path != "recurrent":
        layout = workspace_layout(T, N, HV, D, seg, long, split, cfg.storage, cfg.solve,
                                  qk_heads=qk_heads)
        nbytes, views = layout_views(layout)
        kw.update(layout=layout, nbytes=nbytes, views=views)
    return Plan(**kw)


def long_path_args(T: int, D: int, seg_t: int, cfg: PrefillConfig, *, pdl: bool) -> dict:
    """Keyword arguments of the long path's three phases over ``T`` tokens cut into slots of
    ``seg_t`` tokens, head size ``D``: ``phase_a`` and ``phase_c`` of
    :func:`.state_walk_t.state_walk_t_fwd` (the segments' transitions; the walk from the
    entering states, launched through :func:`.state_walk_gluon.phase_c_fwd`), ``phase_b`` of
    :func:`.context_parallel.segment_combine_t_fwd`. ``pdl``: phase A starts with
    programmatic dependent launch after the intra-chunk kernel.

    The one builder of these numbers (tile, warps, stages, precisions, the negligible
    threshold, the split tail): a one-GPU plan (:func:`prefill_plan`: the call's ``T``, its
    segments, halved by the device's split) and a rank's (:func:`.multi_gpu.rank_plan`: the
    rank's slice, its segments, no PDL, plus the rank's own flags) both take them here, so
    a rank walks its slice as one GPU walks the call."""
    bv = min(128, D)   # both warpgroups of the transposed walk
    base = dict(BV=bv, num_warps=8 if bv >= 128 else 4, seg_t=seg_t,
                dot_precision=cfg.precision, out_precision=cfg.precision)
    return dict(phase_a=dict(base, pdl=pdl, num_stages=3, loop_stages=3, log_eps=cfg.log_eps),
                phase_b=dict(seg_t=seg_t, T=T, BV=min(16, D)),
                phase_c=dict(base, num_stages=2, loop_stages=2, tail=tail_split_rule(cfg)))


def _walk_args(T, N, HV, D, BV, device, n_sm, cfg, prec) -> tuple:
    """``(transposed, kwargs)`` of the walk without CP: :func:`.state_walk_t.state_walk_t_fwd`
    for the short walks :func:`.config.walk_transposed_rule` picks, else
    :func:`.state_walk.state_walk_fwd` with :func:`.config.walk_launch_rule`'s warps and
    stages."""
    precise = cfg.storage == "precise"
    short = T <= SHORT_WALK_CHUNKS * BT * max(N, 1)
    if walk_transposed_rule(BV, short, precise=precise):
        bvt = cfg.walk_BV or min(128, D)
        return True, dict(BV=bvt, num_warps=8 if bvt >= 128 else 4, num_stages=2,
                          loop_stages=2, pdl=cfg.pdl, **prec)
    warps, stages, loop_stages = walk_launch_rule(BV, N * HV * (D // BV), n_sm, short,
                                                  precise=precise,
                                                  smem_per_block=smem_per_block(device))
    return False, dict(BV=BV, num_warps=warps, num_stages=stages, loop_stages=loop_stages,
                       pdl=cfg.pdl, pipe_skip=walk_pipe_skip_rule(BV, short, precise=precise),
                       **prec)


def workspace_layout(T: int, N: int, HV: int, D: int, seg_chunks: int = 0,
                     long: bool = False, split: bool = False, storage: str = "compact",
                     solve: str = "batched", extra: tuple = (), qk_heads: int = 0) -> tuple:
    """The intermediates of one ``fused`` call (outputs excluded) as views of one buffer:
    ``(name, dtype, shape, byte offset, bytes)``, each at a multiple of
    :data:`WORKSPACE_ALIGN`.

    ``gc`` ``[T, HV]`` f32; ``Tb`` and ``Aqk`` ``[T, HV, 64]`` (bf16, fp32 with
    ``"precise"`` storage); the ``"blocks"`` solve's ``[T, HV, 64]`` f32 scratch; with CP
    (``seg_chunks``) the chunks' log bounds ``[T // 64 + N, HV]`` f32, the segment summaries
    ``[S, HV, D, 2D]`` f32 (``[S, HV, 2D, D]`` on the long path, ``long``), the segments'
    flags ``[S, HV]`` int32, on the long path the entering states ``[S, HV, D, D]`` and,
    where the device chooses the split (``split``: ``S`` counts half-segment slots), the
    segments per sequence ``[N]`` int32; with ``qk_heads`` (the L2 norm of ``q`` and ``k``
    in the kernels) their rows' factors ``qk_norm`` ``[T, qk_heads, 2]`` f32 (written by the
    intra-chunk kernel, read by the walks); then ``extra``, more views ``(name, dtype,
    shape)`` (:mod:`.multi_gpu`'s rank buffers)."""
    views = [("gc", torch.float32, (T, HV)), ("Tb", STORAGE[storage], (T, HV, BT)),
             ("Aqk", STORAGE[storage], (T, HV, BT))]
    if solve == "blocks":
        views.append(("scratch", torch.float32, (T, HV, BT)))
    if seg_chunks:
        S = num_slots(T, N, seg_chunks * BT // (2 if split else 1))
        views += [("log_bound", torch.float32, (num_slots(T, N), HV)),
                  ("summary", torch.float32, (S, HV, 2 * D, D) if long else (S, HV, D, 2 * D)),
                  ("negligible", torch.int32, (S, HV))]
        if long:
            views.append(("s0", torch.float32, (S, HV, D, D)))
        if split:
            views.append(("seg_mult", torch.int32, (N,)))
    if qk_heads:
        views.append(("qk_norm", torch.float32, (T, qk_heads, 2)))
    views += list(extra)
    out, off = [], 0
    for name, dtype, shape in views:
        n = _nbytes(dtype, shape)
        out.append((name, dtype, shape, off, n))
        off += -(-n // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return tuple(out)


def layout_views(layout) -> tuple:
    """``(nbytes, views)`` of a :func:`workspace_layout`: the one allocation's bytes and each
    view as ``(name, dtype, shape, strides, element offset)`` (what a call cuts the buffer
    with: :func:`.pipeline.fused_launches`, :mod:`.multi_gpu`)."""
    return _aligned_end(layout), tuple((name, dt, shape, _strides(shape), off // dt.itemsize)
                                       for name, dt, shape, off, _ in layout)


def _nbytes(dtype, shape) -> int:
    n = dtype.itemsize
    for s in shape:
        n *= int(s)
    return n


def _aligned_end(layout) -> int:
    """The layout's bytes, rounded up to :data:`WORKSPACE_ALIGN` (so that the buffer can be
    allocated as float32 and viewed as any of the views' dtypes)."""
    end = layout[-1][3] + layout[-1][4] if layout else 0
    return -(-end // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def _strides(shape) -> tuple:
    out, n = [], 1
    for s in reversed(shape):
        out.append(n)
        n *= int(s)
    return tuple(reversed(out))
