"""The GPU timeline of one call: what ran, when, and how long the GPU sat idle.

``record_timeline(fn)`` profiles one call of ``fn`` (after ``warmup`` untimed
calls) with torch.profiler and returns a :class:`Timeline`:

* ``.gpu`` - one row per GPU activity: ``name, kind (kernel|memcpy|memset),
  stream, start_us, end_us, dur_us, correlation``; times relative to the start
  of the first GPU activity.
* ``.cpu`` - the CUDA runtime/driver calls made during the call (launches,
  copies, synchronisations ...): ``name, api, kind (launch|memcpy|memset|sync|
  other), pid, tid, start_us, end_us, dur_us, correlation`` on the same clock (a
  launch before the first kernel has a negative start).
* ``.summary()`` - ``launches`` (host calls that enqueued GPU work, each once,
  plus one per GPU activity whose launch call is missing from the trace),
  ``kernels``, ``gpu_ops``, ``busy_us`` (length of the union of GPU intervals),
  ``span_us`` (first start to last end), ``idle_frac = 1 - busy/span``,
  ``largest_gaps_us`` (the 5 longest idle gaps), ``host_syncs``.

Timelines round-trip through Chrome-trace JSON (``export_chrome_trace`` /
``from_chrome_trace``, which also reads torch.profiler's own traces) and are
drawn side by side by :func:`plot_gantt`.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Union

import numpy as np
import pandas as pd

from .chrome_trace import (annotations, api_calls, count_launches, gpu_activities, load_events,
                           union_intervals)

__all__ = ["CALL_RANGE", "Timeline", "record_timeline", "record_trace", "plot_gantt"]

#: record_function name around the recorded call.
CALL_RANGE = "gdnbench::call"
_GPU_CAT = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
_KIND_COLOR = {"kernel": "tab:blue", "memcpy": "tab:orange", "memset": "tab:green"}


@dataclass
class Timeline:
    """GPU activities and host CUDA calls of one call (µs, origin = first GPU start)."""

    gpu: pd.DataFrame
    cpu: pd.DataFrame
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ numbers
    def intervals(self):
        """Disjoint busy intervals ``[(start, end), ...]`` of the GPU (all streams)."""
        return union_intervals(self.gpu["start_us"], self.gpu["end_us"])

    def gaps(self) -> pd.DataFrame:
        """Idle gaps between busy intervals, in time order: ``start_us, end_us,
        gap_us, before`` (activity ending at the gap's start), ``after``."""
        iv = self.intervals()
        rows = []
        for (_, e0), (s1, _) in zip(iv[:-1], iv[1:]):
            before = self.gpu[np.isclose(self.gpu["end_us"], e0)]["name"]
            after = self.gpu[np.isclose(self.gpu["start_us"], s1)]["name"]
            rows.append((e0, s1, s1 - e0, before.iloc[-1] if len(before) else "",
                         after.iloc[0] if len(after) else ""))
        return pd.DataFrame(rows, columns=["start_us", "end_us", "gap_us", "before", "after"])

    def largest_gaps(self, n: int = 5) -> pd.DataFrame:
        """The ``n`` longest idle gaps, longest first (columns as :meth:`gaps`)."""
        return self.gaps().sort_values("gap_us", ascending=False, kind="stable").head(n) \
            .reset_index(drop=True)

    def summary(self, n_gaps: int = 5) -> dict:
        """``launches, kernels, gpu_ops, busy_us, span_us, idle_frac,
        largest_gaps_us, host_syncs``."""
        iv = self.intervals()
        busy = float(sum(e - s for s, e in iv))
        span = float(iv[-1][1] - iv[0][0]) if iv else 0.0
        # host calls that enqueued work, plus one per GPU activity whose launch
        # the trace lacks (e.g. a driver-API launch the profiler did not record)
        seen = set(self.cpu["correlation"][self.cpu["correlation"] >= 0]) if len(self.cpu) else set()
        unlinked = int((~self.gpu["correlation"].isin(seen)).sum())
        launches = (count_launches(self.cpu) if len(self.cpu) else 0) + unlinked
        return dict(
            launches=int(launches),
            kernels=int((self.gpu["kind"] == "kernel").sum()),
            gpu_ops=int(len(self.gpu)),
            busy_us=busy,
            span_us=span,
            idle_frac=float(1.0 - busy / span) if span > 0 else 0.0,
            largest_gaps_us=[float(g) for g in self.largest_gaps(n_gaps)["gap_us"]],
            host_syncs=int((self.cpu["kind"] == "sync").sum()) if len(self.cpu) else 0,
        )

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_events(cls, events, annotation: Optional[str] = None, *,
                    source: str = "") -> "Timeline":
        """Build from Chrome-trace events (see :meth:`from_chrome_trace`)."""
        gpu = gpu_activities(events)
        api = api_calls(events)
        name = annotation
        if name is None and not annotations(events, CALL_RANGE).empty:
            name = CALL_RANGE
        if name is not None:
            gpu, api = _restrict(events, gpu, api, name)
        if gpu.empty:
            raise ValueError(f"no GPU activity in the trace{' ' + source if source else ''}"
                             f"{f' inside range {name!r}' if name else ''}")
        t0 = float(gpu["start_us"].min())
        for df in (gpu, api):
            for c in ("start_us", "end_us"):
                df[c] = df[c] - t0
        gpu = gpu.reset_index(drop=True)
        cpu = api.reset_index(drop=True)
        return cls(gpu=gpu, cpu=cpu, meta=dict(source=source, annotation=name, origin_us=t0))

    @classmethod
    def from_chrome_trace(cls, path: Union[str, Path], annotation: Optional[str] = None
                          ) -> "Timeline":
        """Read a Chrome trace (torch.profiler's, or :meth:`export_chrome_trace`'s).

        With ``annotation`` (default: ``gdnbench::call`` when the trace has that
        range), only the work of the last host range of that name is kept: API
        calls inside it, GPU activities they launched (by correlation id), and GPU
        activities without a recorded launch that start inside the range's window
        (up to the later of its end and its linked activities' end).
        """
        return cls.from_events(load_events(path), annotation, source=str(path))

    def export_chrome_trace(self, path: Union[str, Path]) -> Path:
        """Write a Chrome trace (open in Perfetto / chrome://tracing) that
        :meth:`from_chrome_trace` reads back to an equal timeline."""
        shift = -min([0.0] + list(self.gpu["start_us"]) + list(self.cpu["start_us"]))
        ev = []
        for r in self.gpu.itertuples(index=False):
            ev.append(dict(ph="X", cat=_GPU_CAT[r.kind], name=r.name, pid=0, tid=int(r.stream),
                           ts=float(r.start_us + shift), dur=float(r.dur_us),
                           args=dict(stream=int(r.stream), correlation=int(r.correlation))))
        for r in self.cpu.itertuples(index=False):
            ev.append(dict(ph="X", cat="cuda_runtime" if r.api == "runtime" else "cuda_driver",
                           name=r.name, pid=r.pid, tid=r.tid, ts=float(r.start_us + shift),
                           dur=float(r.dur_us), args=dict(correlation=int(r.correlation))))
        lo = min([e["ts"] for e in ev])
        hi = max([e["ts"] + e["dur"] for e in ev])
        ev.append(dict(ph="X", cat="user_annotation", name=CALL_RANGE,
                       pid=self.cpu["pid"].iloc[0] if len(self.cpu) else "0",
                       tid=self.cpu["tid"].iloc[0] if len(self.cpu) else "0",
                       ts=lo, dur=hi - lo, args={}))
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"traceEvents": ev, "displayTimeUnit": "ms",
                                 "otherData": {"writer": "kernels.bench.timeline",
                                               **{k: str(v) for k, v in self.meta.items()}}}))
        return p


def _restrict(events, gpu: pd.DataFrame, api: pd.DataFrame, name: str):
    """GPU activities and API calls belonging to the last host range ``name``."""
    ranges = annotations(events, name)
    if ranges.empty:
        raise ValueError(f"the trace has no host range named {name!r}")
    r0, r1 = float(ranges["start_us"].iloc[-1]), float(ranges["end_us"].iloc[-1])
    api = api[(api["start_us"] >= r0) & (api["start_us"] <= r1)].copy()
    corr = set(api["correlation"][api["correlation"] >= 0])
    every = set(api_calls(events)["correlation"])
    linked = gpu["correlation"].isin(corr) & (gpu["correlation"] >= 0)
    hi = max(r1, float(gpu.loc[linked, "end_us"].max()) if linked.any() else r1)
    unlinked = (~gpu["correlation"].isin(every) | (gpu["correlation"] < 0)) & \
        (gpu["start_us"] >= r0) & (gpu["start_us"] <= hi)
    return gpu[linked | unlinked].copy(), api


def record_trace(fn, path: Union[str, Path], warmup: int = 3) -> Path:
    """Profile one call of ``fn()`` inside a ``gdnbench::call`` range (after
    ``warmup`` untimed calls) and write torch.profiler's own Chrome trace to ``path``.

    Raises ``RuntimeError`` without a CUDA GPU.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if not torch.cuda.is_available():
        raise RuntimeError("recording a GPU timeline needs a CUDA GPU (torch sees none)")
    for _ in range(max(0, warmup)):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(CALL_RANGE):
            fn()
        torch.cuda.synchronize()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(p))
    return p


def record_timeline(fn, warmup: int = 3) -> Timeline:
    """Profile one call of ``fn()`` (after ``warmup`` untimed calls) on the GPU.

    Raises ``RuntimeError`` without a CUDA GPU.
    """
    with tempfile.TemporaryDirectory() as d:
        path = record_trace(fn, os.path.join(d, "trace.json"), warmup)
        events = load_events(path)
    return Timeline.from_events(events, CALL_RANGE, source="record_timeline")


def plot_gantt(timelines: Dict[str, Timeline], ax=None, title: Optional[str] = None,
               show_launches: bool = True):
    """One row per implementation: GPU activities as bars (kernel/memcpy/memset
    coloured), idle gaps as blank, host launch calls as ticks under the row.

    Args:
        timelines: ``{label: Timeline}``, drawn top to bottom.
        ax: a matplotlib Axes; a new pyplot-free Figure when None.
    Returns:
        The matplotlib Figure.
    """
    from matplotlib.patches import Patch

    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 0.9 + 0.7 * max(1, len(timelines))), layout="constrained")
        ax = fig.subplots()
    fig = ax.figure
    labels = list(timelines)
    for row, label in enumerate(labels):
        tl = timelines[label]
        y = len(labels) - 1 - row
        for kind, g in tl.gpu.groupby("kind"):
            ax.broken_barh(list(zip(g["start_us"], g["dur_us"].clip(lower=1e-3))),
                           (y - 0.25, 0.5), facecolors=_KIND_COLOR.get(kind, "gray"),
                           edgecolor="none")
        if show_launches and len(tl.cpu):
            launches = tl.cpu[tl.cpu["kind"].isin(["launch", "memcpy", "memset"])]
            ax.vlines(launches["start_us"], y - 0.42, y - 0.32, colors="black", linewidth=0.6)
            syncs = tl.cpu[tl.cpu["kind"] == "sync"]
            ax.vlines(syncs["start_us"], y - 0.42, y - 0.32, colors="red", linewidth=1.2)
        s = tl.summary()
        ax.text(0, y + 0.27, f"{s['span_us']:.0f} µs span, {s['launches']} launch"
                f"{'' if s['launches'] == 1 else 'es'}, "
                f"{100 * s['idle_frac']:.0f}% idle", va="bottom", ha="left", fontsize=8)
    ax.set_yticks(range(len(labels)), labels[::-1])
    ax.set_ylim(-0.55, len(labels) - 0.3)
    ax.set_xlabel("µs since the first GPU activity")
    handles = [Patch(color=c, label=k) for k, c in _KIND_COLOR.items()]
    if show_launches:
        from matplotlib.lines import Line2D

        handles += [Line2D([], [], color="black", lw=0.8, label="host launch"),
                    Line2D([], [], color="red", lw=1.2, label="host sync")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7,
              frameon=False)
    ax.set_title(title or "GPU timeline of one call")
    ax.margins(x=0.02)
    return fig
