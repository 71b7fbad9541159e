"""Where one prefill call's GPU time goes: per-kernel durations, each kernel's role, and
its roofline (:func:`kernels.bench.roofline.prefill_kernel_model`).

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

__all__ = ["kernel_roles", "kernel_times", "KERNEL_TIME_COLUMNS"]

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
