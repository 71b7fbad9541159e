"""Time a zero-argument callable on the GPU three ways, side by side.

``time_fn(fn, method, rep=100, warmup=10, flush_l2=True) -> Timing`` returns
the median and the 20th/80th percentiles (µs) over ``rep`` measured calls.
``fn`` runs ``warmup`` times first (Triton compilation, autotuning, FlashInfer's
first-call JIT); none of that is in the numbers.

Methods (``METHODS``)
---------------------
``cupti_cold`` - the contest's. Per iteration, outside the measured window:
    write a buffer of ``max(2 x L2, 256 MiB)`` (evicting ``fn``'s data from L2)
    and synchronise the device. Then one call of ``fn`` runs inside a
    ``record_function`` range under ``torch.profiler`` (kineto, i.e. CUPTI
    activity records). The sample is the span from the *start of the first GPU
    activity* (kernel, memcpy or memset) that call enqueued to the *end of the
    last one*. All iterations are profiled in one session; GPU activities are
    assigned to iterations through their CUPTI correlation ids (the launching
    API call lies inside the iteration's range), with a time window as the
    fallback for activities whose launch the trace does not show. Median over
    iterations.

``event`` - ``triton.testing.do_bench``-style. Per iteration: the L2 flush
    (the same buffer write) is enqueued, then a CUDA event, ``fn()``, a second
    event, with no host synchronisation between iterations. The sample is the
    GPU-side time between the two events on the current stream.

``graph`` - ``fn`` is captured once into a CUDA graph (after warm-up on a side
    stream); each sample brackets ``GRAPH_REPLAYS_PER_SAMPLE`` back-to-back
    replays with events and divides by their count. L2 is *warm* (no flush:
    ``flush_l2`` is ignored), as when a serving engine replays one graph per
    step. Per-call µs of GPU work with the host launch cost removed. A callable that cannot be captured (it
    synchronises with the host - ``.item()``, ``.tolist()``, ``torch.cuda.
    synchronize()`` - or allocates pinned memory, ...) raises
    :class:`MethodUnavailable`, which the caller reports instead of a number.

What ``cupti_cold`` and ``event`` see differently
-------------------------------------------------
For a single kernel both measure essentially the kernel's duration on a cold
L2 (``event`` adds the event-record overhead, well under a µs; the GPU test
checks agreement within 10%). For a call that enqueues several kernels:

* ``cupti_cold`` starts its clock when the first kernel *starts executing*, so
  the host work before the first launch (Python, argument checks, allocation,
  gate computation on the CPU) and the first launch's own latency are not
  counted. Every gap *between* GPU activities counts: if the host needs
  30 µs to launch the next kernel while the GPU is idle, those 30 µs are in
  the span. The host is synchronised before each call, so the GPU is idle and
  nothing is queued ahead - the span shows the full host-bound gaps. (Kineto's
  per-operator instrumentation and CUPTI's API callbacks make each launch a
  little slower than without the profiler, so gaps are slightly inflated, as
  they are in the contest's CUPTI harness.) Work after the last GPU activity
  (a host-side copy of results, Python return) is not counted either.
* ``event`` starts its clock when the *stream* reaches the first event, i.e.
  as soon as the preceding flush finishes on the GPU - and it stops when the
  stream reaches the second event, after the last GPU work of ``fn``. Host
  time matters only where the stream runs dry: because iterations are not
  synchronised, the host usually enqueues ``fn``'s first launches while the
  ~100 µs flush still runs, so launch latency is *hidden* up to the flush's
  duration; once the queue drains, the stream waits for each further launch
  and that wait counts. A host synchronisation inside ``fn`` drains the queue
  and exposes all host time after it. The time between the first event and
  the first kernel's start (queue latency) counts in ``event`` but not in
  ``cupti_cold``.
* ``graph`` removes per-kernel host launch cost entirely; what remains is GPU
  execution plus the device-side gaps between graph nodes.

So for multi-kernel calls, expect ``graph <= event <= cupti_cold`` in the
host-bound regime; the differences are the launch overhead that the
prefill notebook studies.

``cpu_wall`` (not in ``METHODS``) is host ``time.perf_counter`` around each
call with a device synchronise: for CPU smoke runs only, it says nothing about
kernel performance.
"""
from __future__ import annotations

import functools
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
    "METHODS", "CPU_WALL", "ALL_METHODS", "Timing", "MethodUnavailable", "method_available",
    "time_fn", "time_each",
    "flush_buffer", "split_iterations", "iteration_spans", "record_cupti_session",
    "ITER_RANGE", "FLUSH_RANGE",
]

METHODS = ("cupti_cold", "graph", "event")
CPU_WALL = "cpu_wall"
ALL_METHODS = METHODS + (CPU_WALL,)

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


# --------------------------------------------------------------------------- event / graph


def _event_loop(step: Callable[[], None], rep: int, flush_l2: bool) -> List[float]:
    """Time ``rep`` calls of ``step`` between CUDA events, flush before each."""
    import torch

    buf = flush_buffer() if flush_l2 else None
    start = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    torch.cuda.synchronize()
    for i in range(rep):
        if buf is not None:
            buf.zero_()
        start[i].record()
        step()
        end[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(start, end)]


def _time_event(fn, rep, flush_l2):
    return _summarize("event", _event_loop(fn, rep, flush_l2))


def _capture(fn, warmup: int):
    """Capture one call of ``fn`` into a CUDA graph (warm-up on a side stream first)."""
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


GRAPH_REPLAYS_PER_SAMPLE = 8


def _time_graph(fn, rep, warmup, flush_l2):
    """Warm-L2 replay throughput: each sample is ``GRAPH_REPLAYS_PER_SAMPLE``
    back-to-back replays between two events, divided by their count. No flush
    (``flush_l2`` is ignored): this is the serving setting, where the state of
    the previous step is often still in L2 and launches are pipelined."""
    import torch

    graph = _capture(fn, warmup)
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    k = GRAPH_REPLAYS_PER_SAMPLE

    def replays():
        for _ in range(k):
            graph.replay()

    try:
        return _summarize("graph", [t / k for t in _event_loop(replays, rep, False)])
    finally:
        del graph


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
    if method == CPU_WALL:
        return True, ""
    if method in METHODS:
        if not str(device).startswith("cuda"):
            return False, f"method {method!r} needs a CUDA GPU (device is {device})"
        return True, ""
    return False, f"unknown timing method {method!r} (known: {', '.join(ALL_METHODS)})"


def time_fn(fn: Callable[[], object], method: str, *, rep: int = 100, warmup: int = 10,
            flush_l2: bool = True) -> Timing:
    """Time ``fn()`` with ``method`` (one of ``METHODS`` or ``"cpu_wall"``).

    Args:
        fn: zero-argument callable; its return value is ignored.
        method: ``"cupti_cold"``, ``"graph"``, ``"event"`` (see the module
            docstring) or ``"cpu_wall"`` (host clock; CPU smoke runs only).
        rep: measured calls. warmup: untimed calls before them.
        flush_l2: evict L2 before each measured call (outside the window).
    Returns:
        :class:`Timing` with ``median_us, p20_us, p80_us, n``.
    Raises:
        MethodUnavailable: no GPU for a GPU method, or (``graph``) the callable
            cannot be captured. ``ValueError`` for an unknown method.
    """
    if method not in ALL_METHODS:
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
        return _time_graph(fn, rep, warmup, flush_l2)
    for _ in range(max(0, warmup)):
        fn()
    torch.cuda.synchronize()
    if method == "event":
        return _time_event(fn, rep, flush_l2)
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
