"""Time a zero-argument callable on the GPU four ways, side by side; or one call across the
ranks of a process group.

``time_fn(fn, method, rep=100, warmup=10, flush_l2=True) -> Timing`` returns
the median and the 20th/80th percentiles (µs) over ``rep`` samples.
``fn`` runs ``warmup`` times first (Triton compilation, autotuning, FlashInfer's
first-call JIT); none of that is in the numbers. :func:`time_ranks` times a call that
every rank of a ``torch.distributed`` group makes together (``head_start_events``).

Every method, with what its numbers are, is a row of :data:`TIMING_METHODS`, the one table
of them: the ``method`` column of every times CSV names one, figure titles and the results
page take its ``meaning`` from there, and ``METHODS``, ``GPU_METHODS`` and ``ALL_METHODS``
are read from it (docs/architecture.md, "Adding a timing method").

Of :func:`time_fn`'s, three methods measure **GPU time** and one measures **host time**;
none mixes the two except where the call itself makes the GPU wait for the host (the gaps
between a call's launches under ``cupti_cold``, which is what the contest measures).

Methods (``TIMING_METHODS``)
----------------------------
``cupti_cold`` - the contest's: GPU span of one call on a cold L2, launched from an idle
    host. Per iteration, outside the measured window: write a buffer of
    ``max(2 x L2, 256 MiB)`` (evicting ``fn``'s data from L2) and synchronise the device.
    Then one call of ``fn`` runs inside a ``record_function`` range under
    ``torch.profiler`` (kineto, i.e. CUPTI activity records). The sample is the span from
    the *start of the first GPU activity* (kernel, memcpy or memset) that call enqueued to
    the *end of the last one*. The host work before the first launch is not in it; every
    gap *between* the call's GPU activities is (a host that needs 30 µs to launch the
    second kernel leaves the GPU idle for them: that is the launch overhead notebook 02
    studies). All iterations are profiled in one session; GPU activities are assigned to
    iterations through their CUPTI correlation ids (the launching API call lies inside
    the iteration's range), with a time window as the fallback for activities whose
    launch the trace does not show.

``graph`` - GPU time per call on a *warm* L2 with the launch cost amortised: as a
    serving engine replays a captured step. ``fn`` is captured ``k`` times back to back
    into one CUDA graph (after warm-up on a side stream), ``k`` chosen so that one replay
    holds at least ``GRAPH_TARGET_US`` of GPU work or ``k = GRAPH_MAX_CALLS``
    (:func:`graph_calls`, from a measured first replay). Each sample is one replay
    between two events, started behind a ``GRAPH_HEAD_START_US`` spin kernel (the host
    has launched the replay before the stream reaches the start event), divided by
    ``k``. No flush (``flush_l2`` is ignored). A call that mutates its inputs (a decode
    state updated in place) is replayed on the state it left: the same kernels, the same
    bytes. A callable that cannot be captured (it synchronises with the host -
    ``.item()``, ``.tolist()``, ``torch.cuda.synchronize()`` - or allocates pinned
    memory, ...) raises :class:`MethodUnavailable`, which the caller reports instead of
    a number. Before this method captured ``k`` calls, one short call per replay
    measured the host's graph-launch cost (5-9 µs on the H200's host) instead of the
    kernel: ``docs/notes/instruments.md``.

``event`` - GPU time of one call on a *cold* L2, launch path hidden. Per iteration: the
    L2 flush (the same buffer write), a spin kernel (:mod:`kernels.bench.spin`) of three
    times the call's host time plus ``EVENT_HEAD_START_US``, then a window ``start event,
    EVENT_INNER_US spin, fn(), end event``; interleaved, a baseline window without
    ``fn()`` behind the same head start. The sample is the window minus the baselines'
    median: the time ``fn`` adds
    to the stream. While the head-start spin runs the host enqueues the whole call, so
    the stream runs the call's kernels back to back (host gaps excluded), and the
    difference removes the events' own latency (a fixed ~3 µs on the H200 otherwise).
    What remains beside the call's GPU time is the stream's dependency gap before its
    first kernel (~1 µs on the H200: the calibration test measures it with CUPTI), which
    ``cupti_cold`` leaves out and ``graph`` mostly hides. No host synchronisation between
    iterations. A host synchronisation inside ``fn``
    defeats the head start: the host time after it is then in the sample.

``host`` - host µs per eager call: the launch path (Python, argument checks, allocation,
    binding, the driver's launch) that a serving engine pays per call when it does not
    replay a graph. Each sample is ``HOST_CALLS_PER_SAMPLE`` calls back to back on the
    host clock with no synchronisation inside (the GPU runs behind; the queue does not
    fill at these counts), divided by that count; the device is synchronised between
    samples, outside the window. A call that synchronises inside pays its GPU time here
    too (that is host time it costs). Not a GPU time: compare it with
    :func:`bare_launch_fn`, one launch of an empty Triton kernel, the floor of any
    Triton call on that host.

So for one call: ``graph`` <= ``event`` (warm vs cold L2) <= ``cupti_cold`` (plus the
host-bound gaps between launches); ``host`` is the other axis, what the CPU pays.

``head_start_events`` (:func:`time_ranks`) - GPU time of one eager call that every rank of
    a process group makes (notebook 05: a prefill split across the GPUs of one host, its
    collective included). Each sample: the ranks meet at a barrier, then each enqueues a
    head-start spin (``HEAD_START_FACTOR`` times the slowest rank's fastest untimed call,
    plus ``HEAD_START_PAD_US``, at most ``HEAD_START_MAX_US``) and records CUDA events
    around one eager call behind it, so the host has enqueued the whole call, collective
    included, before its stream reaches the start event: the events see the GPU's work and
    the waits inside the collective for the other ranks, not the Python launch path. The
    sample is the slowest rank's. Beside it, ``host_us``: the host µs of the same eager
    calls (no synchronisation inside; the slowest rank's median), where it exceeds the GPU
    time an eager caller waits on the host instead. No L2 flush. On the CPU (gloo) the
    samples are ``cpu_wall``.

``cpu_wall`` (not in ``METHODS``) is host ``time.perf_counter`` around each
call with a device synchronise: for CPU smoke runs only, it says nothing about
kernel performance.
"""
from __future__ import annotations

import functools
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .chrome_trace import annotations, api_calls, gpu_activities, load_events
from .gate import short_reason

__all__ = [
    "Method", "TIMING_METHODS", "TIMING_METHODS_REV", "method_meaning", "METHODS", "GPU_METHODS", "CPU_WALL",
    "ALL_METHODS", "RANKS_METHOD", "Timing", "MethodUnavailable",
    "method_available", "time_fn", "time_each", "time_ranks", "graph_calls", "host_samples",
    "bare_launch_fn", "GRAPH_TARGET_US", "GRAPH_MAX_CALLS", "HOST_CALLS_PER_SAMPLE",
    "HEAD_START_FACTOR", "HEAD_START_PAD_US", "HEAD_START_MAX_US",
    "flush_buffer", "split_iterations", "iteration_spans", "record_cupti_session",
    "ITER_RANGE", "FLUSH_RANGE",
]


#: Revision of what the methods measure, written into every ``provenance.json`` as
#: ``timing_methods_rev`` (:func:`kernels.bench.provenance.collect_provenance`) so that
#: ``kernels.compare`` refuses a pair of runs that measured a method differently. Bump it
#: when a method's meaning changes (what its number includes), not when it gets faster.
#: 0 (a provenance without the field): before the graph/event fix, when ``graph`` replayed
#: one short call per replay (the host's graph-launch cost, 5-9 µs on the H200's host) and
#: ``event`` put the launch path and the events' own latency in its samples.
#: 1: the methods as this module's docstring describes them.
TIMING_METHODS_REV = 1


@dataclass(frozen=True)
class Method:
    """One timing method (the module doc says how it measures).

    ``name``: the ``method`` column of every times CSV. ``meaning``: what its numbers are,
    in a few words (figure titles, the results page). ``gpu_time``: its numbers are GPU
    time (else host time). ``cuda``: it needs a CUDA GPU. ``ranks``: it times one call
    across the ranks of a process group (:func:`time_ranks`), not one call in this process
    (:func:`time_fn`)."""

    name: str
    meaning: str
    gpu_time: bool
    cuda: bool = True
    ranks: bool = False


#: Every timing method, the one table of them; the tuples below are read from it.
TIMING_METHODS = (
    Method("cupti_cold", "GPU span, cold L2, idle host (contest)", gpu_time=True),
    Method("graph", "GPU time, warm L2, graph replay", gpu_time=True),
    Method("event", "GPU time, cold L2, launch hidden", gpu_time=True),
    Method("host", "HOST time per eager call", gpu_time=False),
    Method("head_start_events", "GPU time across ranks, launch hidden, slowest rank",
           gpu_time=True, ranks=True),
    Method("cpu_wall", "interpreter wall time", gpu_time=False, cuda=False),
)
_BY_NAME = {m.name: m for m in TIMING_METHODS}
#: :func:`time_fn`'s methods on a CUDA GPU, in the table's order.
METHODS = tuple(m.name for m in TIMING_METHODS if m.cuda and not m.ranks)
#: the methods of :func:`time_fn` whose numbers are GPU time (``host`` is host time).
GPU_METHODS = tuple(m.name for m in TIMING_METHODS if m.gpu_time and not m.ranks)
CPU_WALL = "cpu_wall"
#: every method :func:`time_fn` takes (``cpu_wall`` too).
ALL_METHODS = tuple(m.name for m in TIMING_METHODS if not m.ranks)
#: :func:`time_ranks`' method on CUDA GPUs (``cpu_wall`` on the CPU).
RANKS_METHOD = next(m.name for m in TIMING_METHODS if m.ranks)


def method_meaning(method: str) -> str:
    """What ``method``'s numbers are (:data:`TIMING_METHODS`); "" for a name that is none of
    them (a CSV's other rows, e.g. notebook 04's per-kernel ``kernel`` rows)."""
    m = _BY_NAME.get(method)
    return m.meaning if m else ""


#: record_function names that delimit the profiled iterations of ``cupti_cold``.
ITER_RANGE = "gdnbench::iter"
FLUSH_RANGE = "gdnbench::flush"
#: untimed iterations at the start of a profiler session (CUPTI buffer set-up).
_PROFILER_WARMUP = 2


class MethodUnavailable(RuntimeError):
    """A timing method cannot measure this callable here; ``.method``, ``.reason``."""

    def __init__(self, method: str, reason: str):
        super().__init__(f"timing method {method!r} unavailable: {reason}")
        self.method = method
        self.reason = reason


@dataclass(frozen=True)
class Timing:
    """Summary of one measurement (µs); ``samples_us`` holds the raw samples."""

    method: str
    median_us: float
    p20_us: float
    p80_us: float
    n: int
    samples_us: Tuple[float, ...] = field(default=(), repr=False, compare=False)

    def as_dict(self) -> dict:
        return dict(method=self.method, median_us=self.median_us, p20_us=self.p20_us,
                    p80_us=self.p80_us, n=self.n)


def _summarize(method: str, samples_us: Sequence[float]) -> Timing:
    xs = np.asarray(samples_us, dtype=np.float64)
    if xs.size == 0:
        raise RuntimeError(f"{method}: no samples")
    p20, med, p80 = np.quantile(xs, [0.2, 0.5, 0.8])
    return Timing(method, float(med), float(p20), float(p80), int(xs.size),
                  tuple(float(x) for x in xs))


# --------------------------------------------------------------------------- L2 flush


@functools.lru_cache(maxsize=None)
def _flush_buffer_for(device_index: int):
    import torch

    props = torch.cuda.get_device_properties(device_index)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    nbytes = max(2 * l2, 256 << 20)
    return torch.empty(nbytes // 4, dtype=torch.int32, device=f"cuda:{device_index}")


def flush_buffer():
    """The per-device buffer whose ``zero_()`` evicts L2: ``max(2 x L2, 256 MiB)``."""
    import torch

    return _flush_buffer_for(torch.cuda.current_device())


# --------------------------------------------------------------------------- cupti_cold


def split_iterations(events, iter_range: str = ITER_RANGE,
                     flush_range: str = FLUSH_RANGE) -> List[pd.DataFrame]:
    """GPU activities of each ``iter_range`` range of a profiler trace, in order.

    An activity belongs to iteration *i* when the API call that launched it (same
    correlation id) lies inside the *i*-th ``iter_range`` host range. Activities
    whose launch the trace lacks fall back to time: the first range whose window
    ``[range start, next flush range start)`` contains the activity's start.
    Activities launched elsewhere (the flush, synchronisations) are dropped.
    """
    if not isinstance(events, list):
        events = load_events(events)
    iters = annotations(events, iter_range)
    flushes = annotations(events, flush_range)
    gpu = gpu_activities(events)
    api = api_calls(events)
    out = [gpu.iloc[0:0] for _ in range(len(iters))]
    if iters.empty or gpu.empty:
        return out
    starts = iters["start_us"].to_numpy()
    ends = iters["end_us"].to_numpy()
    # correlation -> iteration index, for calls inside an iteration range
    corr_iter = {}
    known = set(api["correlation"][api["correlation"] >= 0])
    for c, t in zip(api["correlation"], api["start_us"]):
        if c < 0:
            continue
        i = int(np.searchsorted(starts, t, side="right")) - 1
        if i >= 0 and t <= ends[i]:
            corr_iter[int(c)] = i
    # fallback windows: [iteration start, next flush start after it)
    fl = np.sort(flushes["start_us"].to_numpy()) if not flushes.empty else np.array([])
    win_end = []
    for i, s in enumerate(starts):
        nxt = fl[fl > s]
        lim = nxt[0] if nxt.size else np.inf
        if i + 1 < len(starts):
            lim = min(lim, starts[i + 1])
        win_end.append(lim)
    win_end = np.asarray(win_end)
    idx = []
    for c, t in zip(gpu["correlation"], gpu["start_us"]):
        if c >= 0 and int(c) in corr_iter:
            idx.append(corr_iter[int(c)])
        elif c >= 0 and int(c) in known:
            idx.append(-1)  # launched outside every iteration (flush, sync, ...)
        else:
            i = int(np.searchsorted(starts, t, side="right")) - 1
            idx.append(i if i >= 0 and t < win_end[i] else -1)
    gpu = gpu.assign(iteration=idx)
    return [gpu[gpu["iteration"] == i].drop(columns="iteration").reset_index(drop=True)
            for i in range(len(iters))]


def iteration_spans(events, **kw) -> List[float]:
    """Per iteration: last GPU activity end - first GPU activity start (µs);
    NaN for an iteration without GPU activity."""
    spans = []
    for g in split_iterations(events, **kw):
        spans.append(float(g["end_us"].max() - g["start_us"].min()) if len(g) else float("nan"))
    return spans


def record_cupti_session(fn, n: int, flush_l2: bool = True, path=None) -> list:
    """Profile ``n`` iterations (flush + sync in a ``gdnbench::flush`` range, one
    call of ``fn`` in a ``gdnbench::iter`` range, sync) in one torch.profiler
    session; return the trace's events (and keep the Chrome trace at ``path``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    buf = flush_buffer() if flush_l2 else None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            with record_function(FLUSH_RANGE):
                if buf is not None:
                    buf.zero_()
                torch.cuda.synchronize()
            with record_function(ITER_RANGE):
                fn()
            torch.cuda.synchronize()
    if path is not None:
        prof.export_chrome_trace(str(path))
        return load_events(path)
    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "trace.json")
        prof.export_chrome_trace(tmp)
        return load_events(tmp)


def _time_cupti_cold(fn, rep, flush_l2):
    n = rep + _PROFILER_WARMUP
    events = record_cupti_session(fn, n, flush_l2)
    spans = iteration_spans(events)
    if len(spans) != n:
        raise RuntimeError(f"cupti_cold: the trace holds {len(spans)} iteration ranges, "
                           f"expected {n} (record_function ranges missing?)")
    spans = spans[_PROFILER_WARMUP:]
    empty = int(np.isnan(spans).sum())
    if empty == len(spans):
        raise RuntimeError("cupti_cold: no GPU activity recorded for the callable "
                           "(does it run on the GPU? is CUPTI usable here?)")
    if empty:
        raise RuntimeError(f"cupti_cold: {empty} of {len(spans)} iterations have no GPU "
                           f"activity assigned; refusing to report a median")
    return _summarize("cupti_cold", spans)


# --------------------------------------------------------------------------- event / graph / host

#: ``event``: the spin before each timed call lasts three times the call's host time plus
#: this (it must also cover the inner spin's and the events' launches: with twice + 20 µs,
#: ours at B=4 in notebook 01 on the H200 leaked host time into the median, 24.6 µs);
#: the spin inside each window (and its baseline) lasts EVENT_INNER_US.
EVENT_HEAD_START_US = 100.0
EVENT_INNER_US = 5.0
#: ``graph``: GPU work one replay should hold, and the most calls captured into one graph.
GRAPH_TARGET_US = 200.0
GRAPH_MAX_CALLS = 100
#: ``graph``: the spin before each replay (covers the host's graph launch, 5-9 µs seen).
GRAPH_HEAD_START_US = 50.0
#: ``host``: eager calls per sample.
HOST_CALLS_PER_SAMPLE = 10


def _host_estimate_us(fn, calls: int = 5) -> float:
    """Host µs of one call (fastest of ``calls``, no synchronisation): sizes the spin."""
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e6)
    return best


def _time_event(fn, rep, flush_l2):
    """``event``: per iteration (flush, head-start spin) a timed window ``start event,
    EVENT_INNER_US spin, fn(), end event``, and interleaved with it a baseline window
    without ``fn()``; each sample is a window minus the baselines' median. The inner spin
    keeps ``fn``'s first launch queued behind a running kernel, and the difference removes
    the events' own latency, which is the same in both windows."""
    import torch

    from .spin import spin

    head_us = 3.0 * _host_estimate_us(fn) + EVENT_HEAD_START_US
    buf = flush_buffer() if flush_l2 else None
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    timed = [(ev(), ev()) for _ in range(rep)]
    base = [(ev(), ev()) for _ in range(rep)]
    torch.cuda.synchronize()
    for (s, e), (bs, be) in zip(timed, base):
        if buf is not None:
            buf.zero_()
        spin(head_us)
        s.record()
        spin(EVENT_INNER_US)
        fn()
        e.record()
        spin(head_us)
        bs.record()
        spin(EVENT_INNER_US)
        be.record()
    torch.cuda.synchronize()
    b = float(np.median([x.elapsed_time(y) * 1e3 for x, y in base]))
    return _summarize("event", [s.elapsed_time(e) * 1e3 - b for s, e in timed])


def _capture(fn, warmup: int, calls: int = 1):
    """Capture ``calls`` back-to-back calls of ``fn`` into one CUDA graph (warm-up on a
    side stream first)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as e:  # capture refused: a host sync, a non-capturable op, ...
        try:
            torch.cuda.synchronize()
        except Exception:  # pragma: no cover - the reason below is what matters
            pass
        msg = f"{type(e).__name__}: {e}".replace("\n", " ")
        raise MethodUnavailable(
            "graph", "the callable cannot be captured in a CUDA graph (it probably "
            f"synchronises with the host or launches outside the stream): {msg[:300]}") from e
    return graph


def graph_calls(per_call_us: float, target_us: float = GRAPH_TARGET_US,
                max_calls: int = GRAPH_MAX_CALLS) -> int:
    """Calls to capture into one graph so that a replay holds ``target_us`` of GPU work,
    given ``per_call_us`` (measured on a graph of fewer calls: an over-estimate while the
    host's launch cost dominates, which the next round corrects); 1 to ``max_calls``."""
    if not per_call_us > 0 or not math.isfinite(per_call_us):
        return max_calls
    return int(max(1, min(max_calls, math.ceil(target_us / per_call_us))))


def _replay_samples(graph, n: int) -> List[float]:
    """µs per replay, ``n`` samples, each one replay behind a head-start spin."""
    import torch

    from .spin import spin

    start = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    for i in range(n):
        spin(GRAPH_HEAD_START_US)
        start[i].record()
        graph.replay()
        end[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(start, end)]


def _time_graph(fn, rep, warmup):
    """``graph``: grow the captured call count until one replay holds ``GRAPH_TARGET_US``
    (at most three captures), then ``rep`` replays, each divided by the count."""
    k = 1
    graph = _capture(fn, warmup, k)
    graph.replay()  # the first replay uploads the graph
    for _ in range(3):
        per_replay = float(np.median(_replay_samples(graph, 3)))
        nk = graph_calls(per_replay / k)
        if per_replay >= GRAPH_TARGET_US or nk <= k:
            break
        del graph
        k = nk
        graph = _capture(fn, 0, k)
        graph.replay()
    try:
        return _summarize("graph", [x / k for x in _replay_samples(graph, rep)])
    finally:
        del graph


def host_samples(fn, rep: int, calls: int = HOST_CALLS_PER_SAMPLE, *,
                 clock=time.perf_counter, sync=lambda: None) -> List[float]:
    """``rep`` samples of host µs per call: ``calls`` back-to-back calls of ``fn`` on
    ``clock`` (seconds) divided by ``calls``; ``sync()`` between samples, outside the
    window."""
    out = []
    for _ in range(rep):
        sync()
        t0 = clock()
        for _ in range(calls):
            fn()
        out.append((clock() - t0) * 1e6 / calls)
    sync()
    return out


def _time_host(fn, rep):
    import torch

    return _summarize("host", host_samples(fn, rep, sync=torch.cuda.synchronize))


@functools.lru_cache(maxsize=1)
def empty_kernel():
    import triton

    @triton.jit
    def gdn_empty_kernel():
        pass

    return gdn_empty_kernel


def bare_launch_fn():
    """A callable that launches an empty Triton kernel (one program, no arguments) with
    ``kernel[grid]()``: ``host`` of it is the host's floor for any Triton call."""
    k = empty_kernel()
    return lambda: k[(1,)]()


def _time_cpu_wall(fn, rep):
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() \
        else (lambda: None)
    xs = []
    for _ in range(rep):
        t0 = time.perf_counter()
        fn()
        sync()
        xs.append((time.perf_counter() - t0) * 1e6)
    return _summarize(CPU_WALL, xs)


# --------------------------------------------------------------------------- entry point


def method_available(method: str, device: str) -> Tuple[bool, str]:
    """Whether ``method`` can time work on ``device``; the reason when not."""
    m = _BY_NAME.get(method)
    if m is None:
        return False, f"unknown timing method {method!r} (known: {', '.join(_BY_NAME)})"
    if m.cuda and not str(device).startswith("cuda"):   # host too: on the CPU the
        #                     interpreter runs the kernels inside the call (cpu_wall)
        return False, f"method {method!r} needs a CUDA GPU (device is {device})"
    return True, ""


def time_fn(fn: Callable[[], object], method: str, *, rep: int = 100, warmup: int = 10,
            flush_l2: bool = True) -> Timing:
    """Time ``fn()`` with ``method`` (one of ``METHODS`` or ``"cpu_wall"``).

    Args:
        fn: zero-argument callable; its return value is ignored.
        method: ``"cupti_cold"``, ``"graph"``, ``"event"``, ``"host"`` (see the module
            docstring) or ``"cpu_wall"`` (host clock; CPU smoke runs only).
        rep: samples (``host``: of ``HOST_CALLS_PER_SAMPLE`` calls each; ``graph``: of
            one replay). warmup: untimed calls before them.
        flush_l2: evict L2 before each measured call (outside the window).
    Returns:
        :class:`Timing` with ``median_us, p20_us, p80_us, n``.
    Raises:
        MethodUnavailable: no GPU for a GPU method, or (``graph``) the callable
            cannot be captured. ``ValueError`` for an unknown method.
    """
    if method not in ALL_METHODS:
        if method in _BY_NAME:
            raise ValueError(f"timing method {method!r} times a call across ranks: time_ranks")
        raise ValueError(f"unknown timing method {method!r}; known: {', '.join(ALL_METHODS)}")
    if rep < 1:
        raise ValueError(f"rep must be >= 1, got {rep}")
    import torch

    if method == CPU_WALL:
        for _ in range(max(0, warmup)):
            fn()
        return _time_cpu_wall(fn, rep)
    if not torch.cuda.is_available():
        raise MethodUnavailable(method, "needs a CUDA GPU (torch sees none)")
    if method == "graph":  # warm-up happens on the capture stream
        return _time_graph(fn, rep, warmup)
    for _ in range(max(0, warmup)):
        fn()
    torch.cuda.synchronize()
    if method == "event":
        return _time_event(fn, rep, flush_l2)
    if method == "host":
        return _time_host(fn, rep)
    return _time_cupti_cold(fn, rep, flush_l2)


def time_each(fn: Callable[[], object], methods: Sequence[str], *, rep: int,
              warmup: int) -> List[dict]:
    """``fn`` timed with each of ``methods``: a row each, :meth:`Timing.as_dict`, or
    ``{method, error}`` where timing raised (reported, not fatal)."""
    rows = []
    for method in methods:
        try:
            rows.append(time_fn(fn, method, rep=rep, warmup=warmup).as_dict())
        except Exception as e:
            rows.append(dict(method=method, error=short_reason(e)))
    return rows


# --------------------------------------------------------------------------- across ranks

#: ``head_start_events``: the spin before each timed call lasts this many times the call's
#: host time (the slowest rank's fastest untimed call) plus HEAD_START_PAD_US, at most
#: HEAD_START_MAX_US (a call that synchronises inside cannot be got ahead of anyway).
HEAD_START_FACTOR, HEAD_START_PAD_US, HEAD_START_MAX_US = 2.0, 50.0, 50000.0


def time_ranks(fn: Callable[[], object], device, *, rep: int, warmup: int,
               group=None) -> dict:
    """One call that every rank of ``group`` makes together, timed with
    ``head_start_events`` on CUDA GPUs and ``cpu_wall`` on the CPU (the module doc): every
    rank calls this with its ``fn`` and its ``device``, and gets the same row.

    Args:
        fn: zero-argument callable (this rank's part of the call, collectives included).
        device: this rank's device (``cuda:<i>`` or ``cpu``).
        rep: timed calls, each between barriers of ``group``; warmup: untimed calls first.
        group: the ``torch.distributed`` process group (None: the default one).
    Returns:
        :meth:`Timing.as_dict` over the slowest rank's time per call, plus ``host_us``
        (the slowest rank's median host µs per call).
    """
    if rep < 1:
        raise ValueError(f"rep must be >= 1, got {rep}")
    import torch
    import torch.distributed as dist

    device = torch.device(device)
    cuda = device.type == "cuda"

    def slowest(values):   # each value's largest over the ranks
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.tolist()

    host = []
    for _ in range(warmup):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    head = 0.0
    if cuda:
        from .spin import spin

        fastest = slowest([min(host) if host else 0.0])[0]
        head = min(HEAD_START_FACTOR * fastest + HEAD_START_PAD_US, HEAD_START_MAX_US)
    us, host = [], []
    for _ in range(rep):
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            spin(head)
            a.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e6)
            b.record()
            b.synchronize()
            us.append(a.elapsed_time(b) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            us.append((time.perf_counter() - t0) * 1e6)
            host.append(us[-1])
    row = _summarize(RANKS_METHOD if cuda else CPU_WALL, slowest(us)).as_dict()
    return dict(row, host_us=slowest([float(np.median(host))])[0])
