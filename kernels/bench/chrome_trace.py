"""Read torch.profiler (kineto) Chrome-trace JSON into tidy DataFrames.

One job: turn the ``traceEvents`` list that ``prof.export_chrome_trace(path)``
writes into three tables that :mod:`timing` and :mod:`timeline` share.
Complete events (``"ph": "X"``) carry ``ts`` and ``dur`` in µs; categories
used here (compared case-insensitively):

==================  ==============================================================
``kernel``          a GPU kernel; ``args.stream``, ``args.correlation``
``gpu_memcpy``      a GPU copy (``Memcpy DtoD (Device -> Device)`` ...)
``gpu_memset``      a GPU memset
``cuda_runtime``    a CUDA runtime API call on a host thread (``cudaLaunchKernel``,
                    ``cudaMemcpyAsync``, ``cudaStreamSynchronize``, ...); ``args.correlation``
                    matches the GPU activity it enqueued
``cuda_driver``     a driver API call (``cuLaunchKernel``, ``cuLaunchKernelEx`` - how
                    Triton launches); same correlation rule
``user_annotation`` a ``record_function`` range on the host
``gpu_user_annotation``  kineto's projection of a host range onto the GPU rows
==================  ==============================================================

All times stay absolute (µs on the trace's clock); callers pick an origin.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterable, List, Optional, Union

import numpy as np
import pandas as pd

__all__ = [
    "GPU_KINDS", "load_events", "gpu_activities", "api_calls", "annotations",
    "classify_api", "count_launches", "union_intervals",
]

#: trace category -> our ``kind`` for GPU activities.
GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
             "gpu_memset": "memset", "memset": "memset"}
_API_CATS = {"cuda_runtime": "runtime", "runtime": "runtime", "cuda_driver": "driver",
             "driver": "driver"}

GPU_COLUMNS = ["name", "kind", "stream", "device", "start_us", "end_us", "dur_us", "correlation"]
API_COLUMNS = ["name", "api", "kind", "pid", "tid", "start_us", "end_us", "dur_us", "correlation"]
ANN_COLUMNS = ["name", "start_us", "end_us", "dur_us", "pid", "tid"]


def load_events(source: Union[str, Path, dict, list]) -> List[dict]:
    """The trace's event list from a path (``.json`` or ``.json.gz``), a loaded
    dict (``{"traceEvents": [...]}``) or the list itself."""
    if isinstance(source, (str, Path)):
        p = Path(source)
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as f:
            source = json.load(f)
    if isinstance(source, dict):
        source = source.get("traceEvents", [])
    if not isinstance(source, list):
        raise ValueError(f"not a Chrome trace: expected a list of events, got {type(source).__name__}")
    return [e for e in source if isinstance(e, dict)]


def _num(x, default=np.nan) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def _corr(args: dict):
    c = args.get("correlation", args.get("correlationId"))
    try:
        return int(c)
    except (TypeError, ValueError):
        return -1


def _complete(events: Iterable[dict]):
    for e in events:
        if e.get("ph", "X") == "X" and "ts" in e:
            yield e


def gpu_activities(events: Iterable[dict]) -> pd.DataFrame:
    """GPU kernels, copies and memsets, sorted by start.

    Columns: ``name, kind (kernel|memcpy|memset), stream, device, start_us,
    end_us, dur_us, correlation`` (-1 when the trace has none).
    """
    rows = []
    for e in _complete(events):
        kind = GPU_KINDS.get(str(e.get("cat", "")).lower())
        if kind is None:
            continue
        args = e.get("args") or {}
        ts, dur = _num(e.get("ts")), max(_num(e.get("dur"), 0.0), 0.0)
        stream = args.get("stream", e.get("tid", -1))
        rows.append((str(e.get("name", "")), kind, int(_num(stream, -1)),
                     int(_num(args.get("device", e.get("pid", 0)), 0)), ts, ts + dur, dur,
                     _corr(args)))
    df = pd.DataFrame(rows, columns=GPU_COLUMNS)
    return df.sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)


def classify_api(name: str) -> str:
    """``launch`` (kernel/graph launch), ``memcpy``, ``memset``, ``sync`` or ``other``."""
    n = name.lower()
    if "synchronize" in n or n in ("cudamemcpy", "cudamemset"):
        return "sync"  # the blocking copy/set variants also wait for the device
    if "launchkernel" in n or "launchcooperativekernel" in n or "graphlaunch" in n:
        return "launch"
    if "memcpy" in n:
        return "memcpy"
    if "memset" in n:
        return "memset"
    return "other"


def api_calls(events: Iterable[dict]) -> pd.DataFrame:
    """CUDA runtime and driver API calls on host threads, sorted by start.

    Columns: ``name, api (runtime|driver), kind`` (see :func:`classify_api`),
    ``pid, tid, start_us, end_us, dur_us, correlation``.
    """
    rows = []
    for e in _complete(events):
        api = _API_CATS.get(str(e.get("cat", "")).lower())
        if api is None:
            continue
        args = e.get("args") or {}
        name = str(e.get("name", ""))
        ts, dur = _num(e.get("ts")), max(_num(e.get("dur"), 0.0), 0.0)
        rows.append((name, api, classify_api(name), str(e.get("pid", "")), str(e.get("tid", "")),
                     ts, ts + dur, dur, _corr(args)))
    df = pd.DataFrame(rows, columns=API_COLUMNS)
    return df.sort_values(["start_us", "end_us"], kind="stable").reset_index(drop=True)


def annotations(events: Iterable[dict], name: Optional[str] = None, *,
                gpu: bool = False) -> pd.DataFrame:
    """``record_function`` ranges (``user_annotation``; with ``gpu=True`` kineto's
    ``gpu_user_annotation`` projections), optionally only those called ``name``.

    Columns: ``name, start_us, end_us, dur_us, pid, tid``, sorted by start.
    """
    cat = "gpu_user_annotation" if gpu else "user_annotation"
    rows = []
    for e in _complete(events):
        if str(e.get("cat", "")).lower() != cat:
            continue
        if name is not None and e.get("name") != name:
            continue
        ts, dur = _num(e.get("ts")), max(_num(e.get("dur"), 0.0), 0.0)
        rows.append((str(e.get("name", "")), ts, ts + dur, dur, str(e.get("pid", "")),
                     str(e.get("tid", ""))))
    df = pd.DataFrame(rows, columns=ANN_COLUMNS)
    return df.sort_values("start_us", kind="stable").reset_index(drop=True)


def count_launches(api: pd.DataFrame) -> int:
    """Host calls that enqueue GPU work (kernel/graph launches, async copies and
    memsets), each counted once.

    A driver call made inside a runtime call of the same thread (``cuLaunchKernel``
    inside ``cudaLaunchKernel``), or sharing its correlation id, is the same launch.
    """
    work = api[api["kind"].isin(["launch", "memcpy", "memset"])]
    if work.empty:
        return 0
    runtime = work[work["api"] == "runtime"]
    n = len(runtime)
    corr = set(runtime["correlation"][runtime["correlation"] >= 0])
    for _, d in work[work["api"] == "driver"].iterrows():
        if d["correlation"] >= 0 and d["correlation"] in corr:
            continue
        same = runtime[(runtime["pid"] == d["pid"]) & (runtime["tid"] == d["tid"])]
        if ((same["start_us"] <= d["start_us"]) & (same["end_us"] >= d["end_us"])).any():
            continue
        n += 1
    return n


def union_intervals(starts, ends) -> List[tuple]:
    """Merge ``[start, end]`` intervals; returns sorted, disjoint ``(start, end)`` pairs."""
    pairs = sorted(zip(map(float, starts), map(float, ends)))
    out: List[list] = []
    for s, e in pairs:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(p) for p in out]
