"""Notebook 02 — why does a chunked prefill spend most of its wall time idle?

The seed measured, for one 6-token sequence, that a FLA-style chunked
prefill is ~93 % GPU idle with ~51 launches per call and launch gaps between
them; fusing the gate computation saved 31 % (RTX 3090); on a B200 (CUPTI)
it was 8.3× slower than FlashInfer's prefill (1536 µs vs 185 µs); CUDA
graphs and fewer launches were the next steps. Our prefill exposes each
step as a variant (:data:`kernels.prefill.VARIANTS`: ``unfused →
fused_gates → no_sync → graph → fused``). This module measures them and the
peers:

1. :func:`run_gate` — every variant/peer × shape against
   :func:`kernels.reference.prefill_reference` (``gate.csv``).
2. :func:`run_measurements` — per passing variant and shape: one recorded
   timeline (launches, GPU busy, wall span, idle fraction —
   :func:`kernels.bench.timeline.record_timeline`) and the timing methods
   (``cupti_cold`` span, ``graph`` replay; ``host`` µs per eager call, taken for
   every shape in a pass before the first timeline, after which the host runs slower)
   → ``prefill_times.csv``; Chrome
   traces of the Gantt shape's call beside the CSVs. Needs a CUDA GPU: on
   the CPU it prints why and writes nothing (no placeholder rows).
3. Figures: :func:`plot_gantt_shape`, :func:`plot_waterfall`
   (:func:`waterfall_table`), :func:`plot_time_vs_T`, :func:`plot_busy_idle`,
   and on any device :func:`plot_gate_errors`.
4. :func:`run_crossover` — short calls: ours token-recurrent (variant ``recurrent``), ours
   chunked (``fused`` with ``recurrent_max_T=0``), ours as dispatched (``fused``) and
   FLA's fused recurrent kernel over ``crossover_lengths`` at one sequence and a mixed
   batch, each point gated first (``recurrent_times.csv``); :func:`crossover_table` (the
   measured crossover, ``recurrent_crossover.csv``: what
   :data:`kernels.prefill.config.RECURRENT_MAX_T` is set from) and :func:`plot_crossover`.
5. :func:`conclusion_markdown` from the tables.

Shapes are specs of :func:`kernels.spec.parse_shape`; the ``lens`` column holds their
compact form (:func:`kernels.spec.lens_label`).
"""
from __future__ import annotations

import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from kernels import registry
from kernels.bench.gate import ERROR, FAIL, PASS, UNAVAILABLE, gate_call, short_reason
from kernels.bench.timing import time_each
from kernels.peers import default_peers
from kernels.registry import Impl
from kernels.spec import lens_label, parse_shape

from .common import (COMMON_PARAMS, Param, Run, collect_params as _collect, fmt_us, fmt_x,
                     host_table, method_title, new_figure, plural, progress, start_run,
                     unique_in_order)

STEM = "02_prefill_launch_overhead"
#: The steps of the waterfall, in order; the token-recurrent variant joins the table after them.
WATERFALL_VARIANTS = ("unfused", "fused_gates", "no_sync", "graph", "fused")
DEFAULT_VARIANTS = WATERFALL_VARIANTS + ("recurrent",)
SEED_IDLE_FRAC = 0.93   # seed: 93 % of prefill wall time GPU idle (T=6; GPU not stated)
SEED_LAUNCHES = 51      # seed: kernel launches per forward pass
SEED_GAP_VS_FI = 8.3    # seed, B200 CUPTI: fla-chunk 1536 µs vs fi-baseline 185 µs

PARAMS = COMMON_PARAMS + (
    Param("shapes", "list",
          ["T6", "T64", "100+28", "T512", "T2048", "T8192", "4x1024", "16x256", "57x64"],
          "prefill shapes: names of kernels.spec.PREFILL_SHAPES, '100+28', '4x1024' or lists of lengths"),
    Param("impls", "list", ["ours", *default_peers("prefill", STEM)],
          "implementations: ours, fla (triton), fla_recurrent (FLA's fused recurrent kernel), "
          "fla_flashqla (FLA's FlashQLA backend), flashqla, flashinfer (the FlashQLA ones run "
          "in kernels.peers_worker, GDN_QLA_SITE), "
          "solution:<path> (a flashinfer-bench solution JSON or starter-kit folder, docs/solutions.md)"),
    Param("solutions", "list", [],
          "more solution paths (the make variable SOLUTIONS); those with a prefill definition are added"),
    Param("variants", "list", list(DEFAULT_VARIANTS), "our pipeline variants (kernels.prefill.VARIANTS)"),
    Param("methods", "list", ["cupti_cold", "graph", "host"],
          "timing methods (GPU time: cupti_cold span, graph replay, event; host: host µs per "
          "eager call, against one bare Triton launch)"),
    Param("repetitions", "int", 50, "timed calls per point"),
    Param("warmup", "int", 5, "untimed calls before timing"),
    Param("seed", "int", 0, "seed of the inputs"),
    Param("with_state", "bool", True, "pass an initial state (else None, i.e. zeros)"),
    Param("gantt_shape", "str", "T6", "shape whose single call is drawn as a Gantt chart and traced"),
    Param("waterfall_shapes", "list", ["T6", "T8192"], "shapes of the unfused → fused waterfall"),
    Param("num_q_heads", "int", 4, "HQ query/key heads (HK equals it)"),
    Param("num_v_heads", "int", 8, "HV value heads"),
    Param("head_dim", "int", 128, "head size D (K and V equal it)"),
    Param("crossover_lengths", "list", [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128],
          "total tokens T of the recurrent-vs-chunked section (one sequence, and the mixed batch)"),
    Param("crossover_batch", "int", 4,
          "sequences of the mixed batch: T split by halves (T/2, T/4, ..., the rest last)"),
    Param("crossover_peers", "list", ["fla_recurrent"], "peers timed beside ours in that section"),
    Param("crossover_method", "str", "cupti_cold", "timing method of that section"),
)

CROSSOVER_COLUMNS = ["series", "lens", "T", "N", "longest", "label", "impl", "variant",
                     "status", "max_abs_err", "method", "median_us", "p20_us", "p80_us", "n",
                     "gpu"]
#: Our three rows of the crossover section: (label, variant, options of make_prefill_impl).
CROSSOVER_OURS = (("ours-recurrent", "recurrent", {}),
                  ("ours-chunked", "fused", {"recurrent_max_T": 0}),
                  ("ours-fused", "fused", {}))

TIMES_COLUMNS = ["impl", "variant", "lens", "T", "N", "method", "median_us", "launches",
                 "p20_us", "p80_us", "n", "busy_us", "span_us", "idle_frac", "largest_gap_us",
                 "gpu", "label", "floor_us"]


def collect_params(namespace: dict) -> dict:
    """This notebook's parameters from ``namespace`` (the notebook's ``globals()``)."""
    return _collect(namespace, PARAMS, STEM)


def start(params: dict) -> Run:
    """Open the run and resolve shapes and implementations."""
    from kernels.spec import GDNShape

    run = start_run(STEM, params)
    shape = GDNShape(params["num_q_heads"], params["num_v_heads"], params["head_dim"])
    shapes = [parse_shape(s) for s in params["shapes"]]
    run.state.update(shape=shape, shapes=shapes, inputs={}, refs={}, timelines={})
    print(f"shape: HQ={shape.num_q_heads} HV={shape.num_v_heads} D={shape.head_dim}; "
          f"sequences: {[l for l, _ in shapes]}")
    return run


def _inputs(run: Run, label: str, lens):
    from kernels.reference import prefill_reference
    from kernels.spec import make_prefill_inputs

    if label not in run.state["inputs"]:
        inputs = make_prefill_inputs(lens, run.state["shape"], seed=run.params["seed"],
                                     device=run.device, with_state=run.params["with_state"])
        run.state["inputs"][label] = inputs
        run.state["refs"][label] = prefill_reference(**inputs)
    return run.state["inputs"][label], run.state["refs"][label]


def resolve_impls(params: dict) -> List[Impl]:
    """The implementations (:mod:`kernels.registry`) in plotting order: ours (one per
    variant of ``variants``), the peers, the solutions."""
    def ours_of(entry):
        if entry != "ours":
            return None
        from kernels.prefill import VARIANTS, make_prefill_impl

        bad = [v for v in params["variants"] if v not in VARIANTS]
        if bad:
            raise ValueError(f"unknown variant {bad[0]!r}; known: {', '.join(VARIANTS)}")
        return [registry.ours(f"ours-{v}", lambda v=v: make_prefill_impl(v), op="prefill",
                              variant=v) for v in params["variants"]]

    return registry.resolve(params, "prefill", ours_of=ours_of, known_ours="ours")


# --------------------------------------------------------------------------- 1. gate


def run_gate(run: Run) -> pd.DataFrame:
    """Every variant/peer × shape against the float32 reference (``gate.csv``).

    The reference is a token loop: long shapes take seconds on a GPU and far
    longer on the CPU, so CPU profiles use tiny shapes.
    """
    impls = run.state["impls"] = {r.label: r for r in resolve_impls(run.params)}
    run.record_solutions(impls.values())
    rows = []
    for lab, lens in progress(run.state["shapes"], f"gate: {plural(len(impls), 'implementation')} per shape",
                              "shape"):
        inputs, ref = _inputs(run, lab, lens)
        for label, rec in impls.items():
            base = dict(label=label, impl=rec.impl, variant=rec.variant, lens=lab, T=sum(lens),
                        N=len(lens), gpu=run.gpu)
            if not rec:
                rows.append(dict(base, status=UNAVAILABLE, ok=False, reason=rec.reason))
                continue
            try:
                rows.append(dict(base, **registry.gate(rec, lab, inputs, ref, run.device)))
            except Exception as e:  # a peer worker that dies is reported like a failing call
                rows.append(dict(base, status=ERROR, ok=False, reason=short_reason(e)))
    gate = pd.DataFrame(rows)
    for label, g in gate[gate.status == UNAVAILABLE].groupby("label", sort=False):
        run.skip(f"{label} (all shapes)", str(g.reason.iloc[0]))
    for _, r in gate[gate.status.isin([FAIL, ERROR])].iterrows():
        print(f"GATE {r.status.upper()}: {r.label} lens={r.lens}: {r.reason}")
    run.write_csv(gate, "gate")
    return gate


def gate_summary(gate: pd.DataFrame) -> pd.DataFrame:
    """Status per implementation (rows) and shape (columns)."""
    out = gate.pivot_table(index="label", columns="lens", values="status", aggfunc="first",
                           sort=False)
    return out.loc[unique_in_order(gate.label), unique_in_order(gate.lens)]


def plot_gate_errors(gate: pd.DataFrame):
    """Max abs and relative-L2 error per implementation and shape (log scale),
    the contest tolerance marked."""
    if gate is None or not gate.status.isin([PASS, FAIL]).any():
        return None
    g = gate[gate.status.isin([PASS, FAIL])]
    fig, axes = new_figure(1, 2, panel=(6.0, 3.6))
    labels = unique_in_order(g.label)
    shapes = unique_in_order(g.lens)
    w = 0.8 / max(1, len(labels))
    for ax, col, title in ((axes[0][0], "max_abs_err", "max |x - ref|"),
                           (axes[0][1], "rel_l2_err", "relative L2 error")):
        for i, label in enumerate(labels):
            s = g[g.label == label].set_index("lens").reindex(shapes)
            vals = s[col].astype(float).clip(lower=1e-12)
            ax.bar(np.arange(len(shapes)) + i * w, vals, w, label=label)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(shapes)) + w * (len(labels) - 1) / 2, shapes, rotation=30)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("shape (sequence lengths)")
        ax.set_ylabel("error (log)")
        if col == "max_abs_err":
            ax.axhline(1e-2, color="k", ls="--", lw=0.8, label="atol 1e-2")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="outside right center")
    gpu = str(gate.gpu.iloc[0]) if len(gate) else ""
    fig.suptitle(f"Prefill correctness gate vs float32 reference — {gpu}")
    return fig


# --------------------------------------------------------------------------- 2. measurements


def _timelines_available(run: Run) -> Tuple[bool, str]:
    if not run.on_gpu:
        return False, f"timelines and GPU timings need a CUDA GPU (device is {run.device})"
    try:
        from kernels.bench.timeline import record_timeline  # noqa: F401
    except Exception as e:
        return False, f"kernels.bench.timeline unavailable: {short_reason(e)}"
    return True, ""


def run_measurements(run: Run, gate: pd.DataFrame) -> pd.DataFrame:
    """Timeline + timing methods of every passing implementation × shape.

    Returns the ``prefill_times`` frame (written as ``prefill_times.csv`` only
    when it has rows). On the CPU nothing is measured: the reason is printed
    and an empty frame returned.
    """
    p = run.params
    ok, why = _timelines_available(run)
    if not ok:
        run.skip("timelines and timings (all shapes)", why)
        return pd.DataFrame(columns=TIMES_COLUMNS)
    from kernels.bench.timeline import record_timeline

    methods = run.usable_methods(p["methods"])
    gantt_label = parse_shape(p["gantt_shape"])[0] if p["gantt_shape"] else None
    impls = run.state["impls"]
    n_timed = len(set(impls) & set(gate[gate.status == PASS].label))
    passed = lambda label, lab: ((gate.label == label) & (gate.lens == lab)  # noqa: E731
                                 & (gate.status == PASS)).any()
    # host time first, for every shape, before this process's first profiler session (the
    # timelines, cupti_cold: the host ran slower after one: docs/notes/instruments.md);
    # a worker's peer is timed in its own process, which takes host first itself
    host = {}
    if "host" in methods:
        run.host_floor_us()
        for lab, lens in progress(run.state["shapes"], f"host time of "
                                  f"{plural(n_timed, 'implementation')} per shape", "shape"):
            inputs, _ = _inputs(run, lab, lens)
            for label, rec in impls.items():
                if rec.where != "worker" and passed(label, lab):
                    host[label, lab] = time_each(lambda f=rec.fn: f(**inputs), ["host"],
                                                 rep=p["repetitions"], warmup=p["warmup"])
    rows = []
    for lab, lens in progress(run.state["shapes"], f"timelines + timing ({', '.join(methods)}) "
                              f"of {plural(n_timed, 'implementation')} per shape", "shape"):
        inputs, _ = _inputs(run, lab, lens)
        for label, rec in impls.items():
            impl, variant, fn = rec.impl, rec.variant, rec.fn
            g = gate[(gate.label == label) & (gate.lens == lab)]
            if g.empty or g.status.iloc[0] != PASS:
                if not g.empty and g.status.iloc[0] != UNAVAILABLE:
                    run.skip(f"{label} lens={lab}", f"gate {g.status.iloc[0]}")
                continue
            if rec.where == "worker":
                rows += _measure_remote(run, fn, label, impl, variant, lab, lens, inputs,
                                        methods, gantt_label)
                continue
            call = (lambda f=fn: f(**inputs))
            summ = {}
            try:
                tl = record_timeline(call)
                summ = dict(tl.summary())
                if lab == gantt_label:
                    run.state["timelines"][label] = tl
                    path = run.path(f"trace_{lab}_{re.sub(r'[^A-Za-z0-9_.+-]', '_', label)}.json")
                    tl.export_chrome_trace(path)
            except Exception as e:
                run.skip(f"timeline {label} lens={lab}", short_reason(e))
            timings = time_each(call, [m for m in methods if m != "host"],
                                rep=p["repetitions"], warmup=p["warmup"])
            timings += host.get((label, lab), [])
            rows += run.timed_rows(timings, f"{label} lens={lab}",
                                   _base_row(run, impl, variant, lab, lens, label, summ))
    times = pd.DataFrame(rows, columns=TIMES_COLUMNS)
    if "host" in methods:   # the host rows' floor: one bare Triton launch on this machine
        times["floor_us"] = np.where(times.method == "host", run.host_floor_us(), np.nan)
    if len(times):
        run.write_csv(times, "prefill_times")
    else:
        print("no timings in this run: prefill_times.csv not written")
    return times


def _base_row(run, impl, variant, lab, lens, label, summ) -> dict:
    return dict(impl=impl, variant=variant, lens=lab, T=sum(lens), N=len(lens),
                launches=summ.get("launches", np.nan), busy_us=summ.get("busy_us", np.nan),
                span_us=summ.get("span_us", np.nan), idle_frac=summ.get("idle_frac", np.nan),
                largest_gap_us=max(summ.get("largest_gaps_us") or [np.nan]),
                gpu=run.gpu, label=label)


def _measure_remote(run, fn, label, impl, variant, lab, lens, inputs, methods, gantt_label):
    """Timeline + timings of a peer that runs in :mod:`kernels.peers_worker` (gated again
    there on the same inputs)."""
    from kernels.bench.timeline import Timeline

    p = run.params
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", label)
    trace = str(run.path(f"trace_{lab}_{safe}.json")) if lab == gantt_label else None
    res = run.worker_result(fn, lab, inputs, run.state["refs"][lab], f"{label} lens={lab}",
                            methods=methods, rep=p["repetitions"], warmup=p["warmup"],
                            timeline=True, trace=trace)
    if not res:
        return []
    if res.get("timeline_error"):
        run.skip(f"timeline {label} lens={lab}", res["timeline_error"])
    if trace and res.get("timeline"):
        run.state["timelines"][label] = Timeline.from_chrome_trace(trace)
    return run.timed_rows(res["timings"], f"{label} lens={lab}",
                          _base_row(run, impl, variant, lab, lens, label, res.get("timeline") or {}))


def overhead_table(times: pd.DataFrame, lens: Optional[str] = None,
                   method: str = "cupti_cold") -> pd.DataFrame:
    """Per implementation at one shape: launches, busy, span, idle fraction, time."""
    t = times[times.method == method] if method in set(times.method) else times
    if lens is not None:
        t = t[t.lens == lens]
    cols = ["label", "lens", "launches", "busy_us", "span_us", "idle_frac", "largest_gap_us",
            "median_us"]
    return t[cols].drop_duplicates(["label", "lens"]).reset_index(drop=True)


def host_bound_table(times: pd.DataFrame, label: str = "ours-fused") -> pd.DataFrame:
    """Per shape, whether ``label``'s eager call is host-bound: its host µs per call
    (``host``), its GPU time (``graph``: launch gaps do not count), one bare Triton launch
    measured in the same run (``floor_us``), host over that floor, and ``host_bound`` (host
    above GPU time: back-to-back eager calls leave the GPU idle between them). Empty without
    ``host`` and ``graph`` rows for ``label``."""
    cols = ["lens", "T", "host_us", "graph_us", "floor_us", "host_x_bare", "host_bound"]
    t = times[times.label == label] if len(times) else times
    if not len(t) or not {"host", "graph"} <= set(t.method):
        return pd.DataFrame(columns=cols)
    host = t[t.method == "host"].set_index("lens")
    gpu = t[t.method == "graph"].set_index("lens").median_us
    out = pd.DataFrame({"T": host["T"], "host_us": host.median_us, "graph_us": gpu,
                        "floor_us": host.floor_us}).dropna(subset=["host_us", "graph_us"])
    out["host_x_bare"] = out.host_us / out.floor_us
    out["host_bound"] = out.host_us > out.graph_us
    return out.rename_axis("lens").reset_index()[cols]


# --------------------------------------------------------------------------- 3. analysis & figures


def waterfall_table(times: pd.DataFrame, lens: str, method: str = "cupti_cold",
                    order: Sequence[str] = WATERFALL_VARIANTS) -> pd.DataFrame:
    """What each step of our pipeline saved at one shape.

    Rows in ``order`` (variants not measured are left out): ``median_us`` of
    the variant, ``saved_us`` = previous step's time − this one's (negative:
    the step cost time), ``saved_frac`` = ``saved_us`` / the first step's time,
    ``launches``.
    """
    t = times[(times.impl == "ours") & (times.lens == lens) & (times.method == method)]
    t = t.set_index("variant")
    rows, prev, first = [], None, None
    for v in order:
        if v not in t.index:
            continue
        r = t.loc[v]
        cur = float(r.median_us)
        first = cur if first is None else first
        saved = float("nan") if prev is None else prev - cur
        rows.append(dict(lens=lens, method=method, step=len(rows), variant=v, median_us=cur,
                         saved_us=saved, saved_frac=saved / first if prev is not None else float("nan"),
                         launches=r.get("launches", np.nan)))
        prev = cur
    return pd.DataFrame(rows, columns=["lens", "method", "step", "variant", "median_us",
                                       "saved_us", "saved_frac", "launches"])


def waterfalls(run: Run, times: pd.DataFrame) -> List[pd.DataFrame]:
    """:func:`waterfall_table` of every ``waterfall_shapes`` entry that was
    measured (``waterfall.csv``); the contest method when it ran."""
    if times.empty:
        return []
    method = "cupti_cold" if "cupti_cold" in set(times.method) else times.method.iloc[0]
    out = []
    for spec in run.params["waterfall_shapes"]:
        lab = parse_shape(spec)[0]
        w = waterfall_table(times, lab, method)
        if w.empty:
            run.skip(f"waterfall lens={lab}", "no timings of our variants at this shape")
        else:
            out.append(w)
    if out:
        run.write_csv(pd.concat(out, ignore_index=True), "waterfall")
    return out


def plot_waterfall(tables: Sequence[pd.DataFrame], gpu: str = ""):
    """One panel per waterfall table: the first variant's time, each step's
    change (green: saved, red: cost), the last variant's time."""
    tables = [w for w in tables if len(w)]
    if not tables:
        return None
    fig, axes = new_figure(1, len(tables), panel=(5.6, 3.8))
    for ax, w in zip(axes.flat, tables):
        xs, names = [], []
        t0 = float(w.median_us.iloc[0])
        ax.bar(0, t0, color="0.55")
        ax.text(0, t0, fmt_us(t0), ha="center", va="bottom", fontsize=7)
        names.append(w.variant.iloc[0])
        for i in range(1, len(w)):
            prev, cur = float(w.median_us.iloc[i - 1]), float(w.median_us.iloc[i])
            lo, hi = min(prev, cur), max(prev, cur)
            ax.bar(i, hi - lo, bottom=lo, color="tab:green" if cur <= prev else "tab:red")
            ax.text(i, hi, f"{'−' if cur <= prev else '+'}{fmt_us(abs(prev - cur))}",
                    ha="center", va="bottom", fontsize=7)
            names.append("→" + w.variant.iloc[i])
        n = len(w)
        tl = float(w.median_us.iloc[-1])
        ax.bar(n, tl, color="tab:blue")
        ax.text(n, tl, fmt_us(tl), ha="center", va="bottom", fontsize=7)
        names.append(f"{w.variant.iloc[-1]} (total)")
        ax.set_xticks(range(n + 1), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("time per call (µs)")
        ax.set_title(f"lens={w.lens.iloc[0]} ({w.method.iloc[0]})", fontsize=9)
    fig.suptitle(f"Prefill: what each step of the pipeline saves — {gpu or 'GPU not given'} "
                 f"— {tables[0].method.iloc[0]}")
    return fig


def plot_time_vs_T(times: pd.DataFrame):
    """Time vs total tokens T (log-log), one line per implementation over the single
    sequences (one colour per implementation in every panel), each multi-sequence shape
    as a marker of its own (legend), one panel per method, two panels a row."""
    if times is None or times.empty:
        return None
    from matplotlib.lines import Line2D

    methods = unique_in_order(times.method)
    labels = unique_in_order(times.label)
    if len(labels) <= 10:
        colors = {lab: f"C{i}" for i, lab in enumerate(labels)}
    else:   # one colour each beyond the default cycle's ten
        from matplotlib import colormaps
        colors = {lab: colormaps["tab20"](i % 20) for i, lab in enumerate(labels)}
    batches = unique_in_order(times[times.N > 1].sort_values("T").lens)
    markers = dict(zip(batches, "xP^vsD*<>p"))
    ncols = min(2, max(1, len(methods)))         # two panels a row: the legend fits beside
    nrows = -(-max(1, len(methods)) // ncols)
    fig, axes = new_figure(nrows, ncols, panel=(4.8, 3.6))
    for ax in list(axes.flat)[len(methods):]:
        ax.remove()
    gpu = str(times.gpu.iloc[0]) if len(times) else ""
    for ax, method in zip(axes.flat, methods):
        t = times[times.method == method]
        for label in unique_in_order(t.label):
            s = t[t.label == label].sort_values(["T", "N"])
            one = s[s.N == 1]
            ax.plot(one["T"], one.median_us, marker="o", ms=3, color=colors[label])
            for r in s[s.N > 1].itertuples():
                ax.scatter([r.T], [r.median_us], marker=markers.get(r.lens, "x"),
                           color=colors[label], s=22)
        if method == "host" and "floor_us" in t and t.floor_us.notna().any():
            ax.axhline(float(t.floor_us.dropna().iloc[0]), color="k", ls=":", lw=1)
            ax.text(0.02, 0.02, "dotted: one bare Triton launch", transform=ax.transAxes,
                    fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("total tokens T (log)")
        ax.set_ylabel("µs per call (log)")
        ax.set_title(f"{method_title(method)} — {gpu}", fontsize=9)
    handles = [Line2D([], [], color=colors[lab], marker="o", ms=3, label=lab) for lab in labels]
    handles += [Line2D([], [], color="k", marker=markers[b], ls="", label=b) for b in batches]
    fig.legend(handles=handles, fontsize=7, loc="outside right center")
    fig.suptitle("GDN prefill: time vs total length (lines: one sequence; markers: batches)")
    return fig


def plot_busy_idle(times: pd.DataFrame, shapes: Optional[Sequence[str]] = None):
    """Per shape: GPU busy and idle time of one call per implementation, stacked
    (from the recorded timeline: idle = wall span − busy)."""
    if times is None or times.empty or not times.busy_us.notna().any():
        return None
    t = times.drop_duplicates(["label", "lens"])
    shapes = list(shapes) if shapes else unique_in_order(t.lens)
    ncols = min(3, max(1, len(shapes)))
    nrows = max(1, math.ceil(len(shapes) / ncols))
    fig, axes = new_figure(nrows, ncols, panel=(4.6, 3.4))
    for ax in axes.flat[len(shapes):]:
        ax.set_axis_off()
    for ax, lens in zip(axes.flat, shapes):
        s = t[t.lens == lens]
        labels = list(s.label)
        busy = s.busy_us.to_numpy(float)
        idle = (s.span_us - s.busy_us).to_numpy(float)
        x = np.arange(len(labels))
        ax.bar(x, busy, color="tab:blue", label="GPU busy")
        ax.bar(x, idle, bottom=busy, color="0.8", hatch="//", label="GPU idle")
        for i, f in enumerate(s.idle_frac.to_numpy(float)):
            if np.isfinite(f):
                ax.text(i, busy[i] + idle[i], f"{f:.0%}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, labels, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("µs (one call)")
        ax.set_title(f"lens={lens}", fontsize=9)
        ax.margins(y=0.12)   # room for the % labels
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="outside right center")
    gpu = str(t.gpu.iloc[0]) if "gpu" in t and len(t) else ""
    fig.suptitle(f"Prefill: GPU busy vs idle within one call's wall span (% idle on top) — "
                 f"{gpu} — one eager call recorded with torch.profiler (CUPTI)")
    return fig


def plot_gantt_shape(run: Run):
    """Gantt chart of the recorded call of ``gantt_shape`` per implementation
    (:func:`kernels.bench.timeline.plot_gantt`); None when nothing was recorded."""
    tls = run.state.get("timelines") or {}
    if not tls:
        print("no timelines recorded: no Gantt chart")
        return None
    from kernels.bench.timeline import plot_gantt

    fig, axes = new_figure(1, 1, panel=(11.0, 0.5 * len(tls) + 1.8))
    lab = parse_shape(run.params["gantt_shape"])[0]
    res = plot_gantt(tls, ax=axes[0][0], title=f"Prefill lens={lab}: one eager call per "
                     f"implementation — {run.gpu} — torch.profiler (CUPTI) records")
    fig = getattr(res, "figure", None) or (res if hasattr(res, "savefig") else fig)
    return fig


# --------------------------------------------------------------------------- recurrent or chunked


def mixed_lens(T: int, n: int) -> List[int]:
    """``T`` tokens over ``n`` sequences by halves: ``T//2, T//4, ...``, the rest last
    (``mixed_lens(6, 4) == [3, 1, 0, 2]``; empty sequences allowed)."""
    lens = [int(T) >> (i + 1) for i in range(n - 1)]
    return lens + [int(T) - sum(lens)]


def crossover_points(params: dict) -> List[Tuple[str, str, List[int]]]:
    """``(series, lens label, lens)`` of the recurrent-vs-chunked section: one sequence of
    every ``crossover_lengths`` entry, then (``crossover_batch > 1``) the mixed batch of the
    same totals. No lengths, no section (the smoke profile's contest-shape variant: each
    chunked call at D=128 takes seconds on the interpreter)."""
    Ts, n = params["crossover_lengths"], params["crossover_batch"]
    if any(not isinstance(T, int) or T < 1 for T in Ts):
        raise ValueError(f"crossover_lengths must be ints >= 1, got {Ts}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"crossover_batch must be an int >= 1, got {n}")
    out = [("B=1", lens_label([T]), [T]) for T in Ts]
    if n > 1:
        out += [(f"mixed N={n}", lens_label(mixed_lens(T, n)), mixed_lens(T, n)) for T in Ts]
    return out


def _crossover_impls(run: Run) -> List[Impl]:
    """Ours recurrent, chunked and as dispatched (:data:`CROSSOVER_OURS`), then
    ``crossover_peers`` (peers of this process only)."""
    from kernels.prefill import PrefillConfig, make_prefill_impl

    out = [registry.ours(lab, lambda v=v, o=o: make_prefill_impl(
        v, **({"config": PrefillConfig(**o)} if o else {})), op="prefill", variant=v)
        for lab, v, o in CROSSOVER_OURS]
    try:
        return out + registry.peers(run.params["crossover_peers"], "prefill", in_process=True)
    except ValueError as e:
        raise ValueError(f"crossover_peers: {e}") from None


def run_crossover(run: Run) -> pd.DataFrame:
    """Ours token-recurrent, ours chunked, ours as dispatched and ``crossover_peers`` at every
    point of :func:`crossover_points`: each gated against the float32 reference on the
    point's inputs, then (passing, and ``crossover_method`` available here) timed.

    Writes ``recurrent_gate.csv`` (every point) and ``recurrent_times.csv`` (the timed ones,
    only when there are any); returns the frame of every row (timings NaN where untimed)."""
    p = run.params
    points = crossover_points(p)
    if not points:
        run.skip("recurrent-vs-chunked section", "crossover_lengths is empty")
        return pd.DataFrame(columns=CROSSOVER_COLUMNS)
    impls = _crossover_impls(run)
    method = p["crossover_method"]
    timed = bool(run.usable_methods([method]))
    rows = []
    for series, lab, lens in progress(points, f"recurrent vs chunked: gate + timing ({method}) "
                                      f"of {plural(len(impls), 'implementation')} per point", "point"):
        inputs, ref = _inputs(run, lab, lens)
        for rec in impls:
            label, fn = rec.label, rec.fn
            row = dict(series=series, lens=lab, T=sum(lens), N=len(lens), longest=max(lens),
                       label=label, impl=rec.impl, variant=rec.variant, method=method,
                       gpu=run.gpu)
            if not rec:
                rows.append(dict(row, status=UNAVAILABLE))
                continue
            g = gate_call(fn, inputs, ref, run.device)
            row.update(status=g["status"], max_abs_err=g["max_abs_err"])
            if g["status"] != PASS:
                print(f"GATE {g['status'].upper()}: {label} lens={lab}: {g['reason']}")
            elif timed:
                timings = time_each(lambda f=fn: f(**inputs), [method], rep=p["repetitions"],
                                    warmup=p["warmup"])
                for t in run.timed_rows(timings, f"{label} lens={lab}", {}):
                    row.update(t)   # one method: one row, or none (skipped: timing raised)
            rows.append(row)
    df = pd.DataFrame(rows, columns=CROSSOVER_COLUMNS)
    for label, g in df[df.status == UNAVAILABLE].groupby("label", sort=False):
        run.skip(f"{label} (recurrent-vs-chunked section)",
                 next(r.reason for r in impls if r.label == label))
    run.write_csv(df.drop(columns=["method", "median_us", "p20_us", "p80_us", "n"]),
                  "recurrent_gate")
    if df.median_us.notna().any():
        run.write_csv(df[df.median_us.notna()], "recurrent_times")
    return df


def crossover_table(times: pd.DataFrame) -> pd.DataFrame:
    """Per series and method: ``crossover_T``, the largest measured ``T`` up to which
    ``ours-recurrent`` is faster than ``ours-chunked`` at every measured ``T`` (NaN: slower
    already at the first), ``first_chunked_T`` the next measured ``T`` (NaN: recurrent
    faster everywhere), both times at each, and ``rule_max_T``, the shipped
    :data:`kernels.prefill.config.RECURRENT_MAX_T`."""
    from kernels.prefill.config import RECURRENT_MAX_T

    cols = ["series", "method", "crossover_T", "recurrent_us", "chunked_us", "first_chunked_T",
            "recurrent_us_next", "chunked_us_next", "rule_max_T", "gpu"]
    t = times[times.median_us.notna()] if "median_us" in times else times.iloc[:0]
    rows = []
    for (series, method), g in t.groupby(["series", "method"], sort=False):
        rec = g[g.label == "ours-recurrent"].set_index("T").median_us
        chk = g[g.label == "ours-chunked"].set_index("T").median_us
        Ts = sorted(set(rec.index) & set(chk.index))
        if not Ts:
            continue
        win = loss = None
        for T in Ts:
            if rec[T] < chk[T]:
                win = T
            else:
                loss = T
                break
        nan = float("nan")
        rows.append(dict(series=series, method=method,
                         crossover_T=nan if win is None else win,
                         recurrent_us=nan if win is None else float(rec[win]),
                         chunked_us=nan if win is None else float(chk[win]),
                         first_chunked_T=nan if loss is None else loss,
                         recurrent_us_next=nan if loss is None else float(rec[loss]),
                         chunked_us_next=nan if loss is None else float(chk[loss]),
                         rule_max_T=RECURRENT_MAX_T, gpu=str(g.gpu.iloc[0])))
    return pd.DataFrame(rows, columns=cols)


def crossovers(run: Run, times: pd.DataFrame) -> pd.DataFrame:
    """:func:`crossover_table` of the section's timings, written as
    ``recurrent_crossover.csv`` when anything was timed."""
    table = crossover_table(times)
    if len(table):
        run.write_csv(table, "recurrent_crossover")
    else:
        run.skip("recurrent_crossover.csv", "no timings of ours-recurrent and ours-chunked")
    return table


def plot_crossover(times: pd.DataFrame, table: Optional[pd.DataFrame] = None):
    """Time per call vs total tokens, one panel per series (one sequence, the mixed batch),
    one line per implementation; the shipped rule's limit dashed, the measured crossover
    ringed."""
    if times is None or "median_us" not in times or not times.median_us.notna().any():
        return None
    from kernels.prefill.config import RECURRENT_MAX_T

    t = times[times.median_us.notna()]
    series = unique_in_order(t.series)
    labels = unique_in_order(t.label)
    fig, axes = new_figure(1, len(series), panel=(5.4, 3.8))
    for ax, ser in zip(axes.flat, series):
        s = t[t.series == ser]
        for i, lab in enumerate(labels):
            g = s[s.label == lab].sort_values("T")
            if len(g):
                ax.plot(g["T"], g.median_us, marker="o", ms=3, color=f"C{i % 10}", label=lab,
                        ls="--" if lab == "ours-fused" else "-")
        ax.axvline(RECURRENT_MAX_T, color="k", ls=":", lw=0.8,
                   label=f"RECURRENT_MAX_T = {RECURRENT_MAX_T}")
        if table is not None and len(table):
            r = table[table.series == ser]
            if len(r) and np.isfinite(r.crossover_T.iloc[0]):
                ax.scatter([r.crossover_T.iloc[0]], [r.recurrent_us.iloc[0]], s=90,
                           facecolors="none", edgecolors="k", label="measured crossover")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("total tokens T (log2)")
        ax.set_ylabel("time per call (µs)")
        ax.set_title(ser, fontsize=9)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="outside right center")
    fig.suptitle(f"Short prefill: token-recurrent vs chunked — {t.gpu.iloc[0]} — "
                 f"{t.method.iloc[0]}")
    return fig


# --------------------------------------------------------------------------- 4. conclusion


def _pct(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.0%}"


def _crossover_lines(dfs) -> List[str]:
    """The recurrent-vs-chunked paragraph: the measured crossover per series against the
    shipped rule, and ours as dispatched against the section's peers at each series' first
    point above ``T = 4`` (T = 6 with the default lengths)."""
    table, times = dfs.get("crossover"), dfs.get("crossover_times")
    if table is None or not len(table):
        return []
    from kernels.prefill.config import RECURRENT_MAX_T

    parts = []
    for r in table.itertuples():
        if np.isfinite(r.crossover_T):
            txt = (f"{r.series}: recurrent faster up to T={int(r.crossover_T)} "
                   f"({fmt_us(r.recurrent_us)} vs chunked {fmt_us(r.chunked_us)})")
        else:
            txt = f"{r.series}: chunked faster from the first point"
        if np.isfinite(r.first_chunked_T):
            txt += (f", chunked from T={int(r.first_chunked_T)} ({fmt_us(r.chunked_us_next)} vs "
                    f"{fmt_us(r.recurrent_us_next)})")
        parts.append(txt)
    wins = table.crossover_T.dropna()
    lines = [f"**Recurrent or chunked** ({table.method.iloc[0]}): " + "; ".join(parts) + ". "
             f"The shipped rule sends calls of up to RECURRENT_MAX_T = {RECURRENT_MAX_T} "
             "tokens to the token-recurrent kernel"
             + (f"; these measurements support up to {int(wins.min())} (the smallest crossover "
                "over the series)." if len(wins) == len(table) else ".")]
    if times is not None and "median_us" in times:
        t = times[times.median_us.notna()]
        for ser in unique_in_order(t.series):
            s = t[(t.series == ser) & (t["T"] > 4)]
            if s.empty:
                continue
            s = s[s["T"] == s["T"].min()].set_index("label").median_us
            if "ours-fused" in s and len(s) > 1:
                others = [f"{lab} {fmt_us(us)}" for lab, us in s.items() if lab != "ours-fused"]
                lines.append(f"{ser}, T={int(t[(t.series == ser) & (t['T'] > 4)]['T'].min())}: "
                             f"ours-fused {fmt_us(s['ours-fused'])}; " + ", ".join(others) + ".")
    return lines


def conclusion_markdown(dfs: Dict[str, pd.DataFrame]) -> str:
    """The notebook's conclusion from ``dfs``: ``gate`` and ``times``
    (``prefill_times``; may be empty), optional ``gantt_lens`` / ``waterfall``
    (a list of :func:`waterfall_table` frames) and ``crossover`` / ``crossover_times``
    (:func:`crossover_table`, :func:`run_crossover`) — computed, never typed."""
    gate = dfs.get("gate")
    times = dfs.get("times")
    times = times if times is not None else pd.DataFrame(columns=TIMES_COLUMNS)
    cross = dfs.get("crossover")
    gpu = (str(times.gpu.iloc[0]) if len(times) else
           str(gate.gpu.iloc[0]) if gate is not None and len(gate) else
           str(cross.gpu.iloc[0]) if cross is not None and len(cross) else "")
    lines = [f"### Conclusion — {gpu}"]
    if gate is not None and len(gate):
        ran = gate[gate.status != UNAVAILABLE]
        bad = ran[ran.status != PASS]
        unav = unique_in_order(gate[gate.status == UNAVAILABLE].label)
        txt = (f"**Gate:** {plural(ran.label.nunique(), 'implementation')} × "
               f"{plural(gate.lens.nunique(), 'shape')} "
               f"({', '.join(unique_in_order(gate.lens))}) against the float32 reference; ")
        if bad.empty:
            txt += "all passed (atol = rtol = 1e-2)."
        else:
            txt += "failing (not measured): " + "; ".join(
                f"{r.label} at {r.lens} ({r.status}: {r.reason})" for r in bad.itertuples()) + "."
        if unav:
            txt += f" Not available here: {', '.join(unav)}."
        lines.append(txt)
    if times.empty:
        lines.append("**No timelines or timings** in this run (they need a CUDA GPU); the "
                     "launch-overhead questions stay open until the GPU profile runs.")
        return "\n\n".join(lines + _crossover_lines(dfs))
    method = "cupti_cold" if "cupti_cold" in set(times.method) else times.method.iloc[0]
    lens0 = dfs.get("gantt_lens") or times.sort_values("T").lens.iloc[0]
    ov = overhead_table(times, lens0, method)
    if len(ov):
        items = [f"{r.label}: {_pct(r.idle_frac)} idle, {r.launches:.0f} launches, "
                 f"busy {fmt_us(r.busy_us)} of a {fmt_us(r.span_us)} span"
                 + (f" (largest gap {fmt_us(r.largest_gap_us)})"
                    if np.isfinite(r.largest_gap_us) else "")
                 + f"; {method} {fmt_us(r.median_us)}" for r in ov.itertuples()]
        lines.append(f"**One call at lens={lens0}:**\n" + "\n".join(f"- {i}" for i in items))
        unf = ov[ov.label == "ours-unfused"]
        if len(unf):
            f = float(unf.idle_frac.iloc[0])
            lines.append(f"Seed check: the seed found a FLA-style chunked prefill ~"
                         f"{SEED_IDLE_FRAC:.0%} idle with ~{SEED_LAUNCHES} launches at T=6; our "
                         f"unfused pipeline here is {_pct(f)} idle with "
                         f"{unf.launches.iloc[0]:.0f} launches.")
        fi = ov[ov.label == "flashinfer"]
        if len(fi):
            ratios = [f"{r.label} {fmt_x(r.median_us / float(fi.median_us.iloc[0]))}"
                      for r in ov.itertuples() if r.label != "flashinfer"]
            lines.append(f"Time relative to FlashInfer at lens={lens0} ({method}; seed on B200: "
                         f"FLA-chunk {SEED_GAP_VS_FI:g}× FlashInfer): " + ", ".join(ratios) + ".")
    for w in dfs.get("waterfall") or []:
        if len(w) < 2:
            continue
        steps = [f"{r.variant} {'saved' if r.saved_us >= 0 else 'cost'} "
                 f"{fmt_us(abs(r.saved_us))} ({abs(r.saved_frac):.0%} of {w.variant.iloc[0]})"
                 for r in w.iloc[1:].itertuples()]
        total = w.median_us.iloc[0] / w.median_us.iloc[-1]
        lines.append(f"**Steps at lens={w.lens.iloc[0]}** ({w.method.iloc[0]}): "
                     + "; ".join(steps) + f" → {w.variant.iloc[-1]} is {fmt_x(total)} "
                     f"faster than {w.variant.iloc[0]}.")
    h = host_table(times)
    if len(h):
        floor = float(h.floor_us.iloc[0])
        parts = [f"{r.label} {fmt_us(r.median_us)} ({r.x_floor:.1f}×)" for r in h.itertuples()]
        lines.append(f"**Host time per eager call** (`host`, median over shapes, lowest first; "
                     f"× one bare Triton launch, {fmt_us(floor)} here): " + "; ".join(parts)
                     + ". While a call's host time exceeds its GPU time, the GPU idles between "
                     "its launches unless a graph replays it.")
    hb = host_bound_table(times)
    if len(hb):
        bound = [r.lens for r in hb.itertuples() if r.host_bound]
        lines.append("**Host-bound eager calls** (ours-fused: host µs per call above its `graph` "
                     "GPU time): " + (", ".join(bound) if bound else "none") + " of "
                     + plural(len(hb), "shape") + "; host / one bare launch "
                     f"{hb.host_x_bare.min():.2f}–{hb.host_x_bare.max():.2f}×.")
    t = times[times.method == method]
    big = t[t["T"] == t["T"].max()]
    if len(big):
        b = big.loc[big.median_us.idxmin()]
        lines.append(f"**Longest shape** (lens={b.lens}, T={int(b['T'])}): fastest is {b.label} "
                     f"at {fmt_us(b.median_us)} ({method}).")
    return "\n\n".join(lines + _crossover_lines(dfs))
