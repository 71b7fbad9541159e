"""Where one prefill call's GPU time goes: per-kernel durations, each kernel's role, and
its roofline (:func:`kernels.bench.roofline.prefill_kernel_model`); and a part's share of a
larger call by profiler range (:func:`profile_events`, :func:`range_share`: notebook 06's
GDN call inside a decoder block).

``kernel_times(fn, calls=5)`` records ``calls`` timelines of ``fn()``
(:func:`kernels.bench.timeline.record_timeline`: CUPTI kernel records via torch.profiler,
after warm-up, L2 warm, eager launches) and returns one row per kernel of the call (in
launch order): ``k, kernel, role, median_us, p20_us, p80_us, calls`` and the median wall
span of the calls as ``span_us``.

Roles (:func:`kernel_roles`) follow from the kernels' names and order in our ``fused``
pipeline: ``intra_chunk_kernel`` is ``intra-chunk`` (``intra-chunk + walkers`` when it is
the call's only kernel: the one-launch path); one ``state_walk*`` kernel is the ``walk``,
two are ``CP phase A`` and ``CP phase C``; ``segment_combine*`` is ``CP phase B``; any
other kernel keeps its name.
"""
from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np
import pandas as pd

__all__ = ["kernel_roles", "kernel_times", "KERNEL_TIME_COLUMNS", "profile_events",
           "range_share"]

KERNEL_TIME_COLUMNS = ["k", "kernel", "role", "median_us", "p20_us", "p80_us", "calls",
                       "span_us"]


def kernel_roles(names: Sequence[str]) -> List[str]:
    """The role of each kernel of one call of our fused prefill, given their names in
    launch order (see the module docstring)."""
    names = list(names)
    walks = [i for i, n in enumerate(names) if "state_walk" in n]
    roles = []
    for i, n in enumerate(names):
        if "intra_chunk" in n:
            roles.append("intra-chunk + walkers" if len(names) == 1 else "intra-chunk")
        elif "segment_combine" in n:
            roles.append("CP phase B")
        elif i in walks:
            roles.append("walk" if len(walks) == 1 else
                         "CP phase A" if i == walks[0] else "CP phase C")
        else:
            roles.append(n)
    return roles


def kernel_times(fn: Callable[[], object], calls: int = 5, warmup: int = 3) -> pd.DataFrame:
    """Per-kernel GPU durations of ``fn()`` over ``calls`` recorded calls (see the module
    docstring). Raises ``RuntimeError`` without a CUDA GPU, ``ValueError`` when the calls
    do not launch the same kernels."""
    from .timeline import record_timeline

    durs, names, spans = [], None, []
    for i in range(max(1, calls)):
        tl = record_timeline(fn, warmup=warmup if i == 0 else 0)
        g = tl.gpu[tl.gpu["kind"] == "kernel"].sort_values("start_us")
        these = [str(n) for n in g["name"]]
        if names is None:
            names = these
        elif these != names:
            raise ValueError(f"call {i} launched {these}, the first call {names}")
        durs.append(g["dur_us"].to_numpy(float))
        spans.append(tl.summary()["span_us"])
    d = np.vstack(durs)
    p20, med, p80 = np.quantile(d, [0.2, 0.5, 0.8], axis=0)
    roles = kernel_roles(names)
    return pd.DataFrame(dict(k=range(len(names)), kernel=names, role=roles, median_us=med,
                             p20_us=p20, p80_us=p80, calls=len(durs),
                             span_us=float(np.median(spans))), columns=KERNEL_TIME_COLUMNS)


def profile_events(fn, calls: int, cuda: bool, call_range: str) -> list:
    """Chrome-trace events of ``calls`` eager calls of ``fn()`` under torch.profiler (CPU
    activities, and CUDA with ``cuda``), each inside a ``call_range`` range, after one
    call outside the profiler and one inside it but outside the ranges."""
    import os
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from .chrome_trace import load_events

    fn()
    if cuda:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()           # outside the ranges: the profiler's first-call costs land here
        for _ in range(calls):
            with record_function(call_range):
                fn()
        if cuda:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        return load_events(path)


def range_share(events: list, calls: int, cuda: bool, call_range: str,
                part_range: str):
    """Split a call's time (each ``call_range`` range of ``events``, e.g. notebook 06's
    decoder block) into a part's (``part_range`` ranges inside it, e.g. its GDN call) and
    the rest's, per call.

    With ``cuda``: every GPU kernel launched (by CUPTI correlation id) from an API call
    inside a ``call_range`` range, summed by kernel name; a kernel is ``gdn`` when its
    launch lies inside a ``part_range`` range, ``rest`` otherwise. Without: host time
    inside the ranges (no kernel table). Returns ``(share dict, kernel rows)``; raises
    ValueError when the trace has no call range or (with ``cuda``) no kernel in one."""
    from .chrome_trace import annotations, api_calls, gpu_activities

    blocks, gdns = annotations(events, call_range), annotations(events, part_range)
    if blocks.empty:
        raise ValueError(f"the trace has no {call_range!r} range")
    if not cuda:
        inside = [any((b0 <= g0) and (g0 <= b1) for b0, b1 in zip(blocks["start_us"],
                                                               blocks["end_us"]))
                  for g0 in gdns["start_us"]]
        gdn_us = float(gdns.loc[inside, "dur_us"].sum()) / calls
        block_us = float(blocks["dur_us"].sum()) / calls
        return dict(source="host time in the ranges (no CUDA activities)", gdn_us=gdn_us,
                    rest_us=max(block_us - gdn_us, 0.0), share=gdn_us / block_us,
                    gdn_kernels=0, rest_kernels=0, calls=calls), []
    api = api_calls(events)
    api = api[api["correlation"] >= 0]

    def launched_in(ranges) -> set:
        ids = set()
        for r0, r1 in zip(ranges["start_us"], ranges["end_us"]):
            inside = (api["start_us"] >= r0) & (api["start_us"] <= r1)
            ids.update(api.loc[inside, "correlation"].tolist())
        return ids

    kern = gpu_activities(events)
    kern = kern[(kern["kind"] == "kernel") & kern["correlation"].isin(launched_in(blocks))]
    if kern.empty:
        raise ValueError("no GPU kernel launched inside the block's ranges")
    kern = kern.assign(group=np.where(kern["correlation"].isin(launched_in(gdns)), "gdn",
                                      "rest"))
    by = kern.groupby(["group", "name"], sort=False)["dur_us"].agg(["sum", "size"])
    rows = [dict(group=g, kernel=n, us_per_call=float(r["sum"]) / calls,
                 launches_per_call=float(r["size"]) / calls) for (g, n), r in by.iterrows()]
    tot = kern.groupby("group")["dur_us"].sum()
    cnt = kern.groupby("group").size()
    gdn_us, rest_us = float(tot.get("gdn", 0.0)) / calls, float(tot.get("rest", 0.0)) / calls
    return dict(source="GPU kernels (torch.profiler, eager)", gdn_us=gdn_us, rest_us=rest_us,
                share=gdn_us / (gdn_us + rest_us), gdn_kernels=int(cnt.get("gdn", 0)) // calls,
                rest_kernels=int(cnt.get("rest", 0)) // calls, calls=calls), rows
