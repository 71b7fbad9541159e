"""Notebook 04 — prefill scaling and anatomy: how does each prefill's time grow with the
length, and where does our pipeline's time go?

1. :func:`run_gate` — every implementation × shape against the float32 reference
   (:func:`kernels.reference.prefill_reference_chunked`, the chunked form, so that 131,072
   tokens take seconds; it is checked against the token loop
   :func:`kernels.reference.prefill_reference` at every shape up to
   ``reference_check_max_T`` tokens, ``reference_check.csv``) → ``gate.csv``.
2. :func:`run_times` — every passing implementation × shape × method →
   ``prefill_scaling.csv`` (``impl, lens, T, N, method, median_us, p20_us, p80_us``).
   FlashQLA and FLA with its FlashQLA backend run in :mod:`kernels.peers_worker` (their own
   site, ``GDN_QLA_SITE``), gated and timed there with the same instruments.
3. :func:`run_anatomy` — for ``anatomy_shapes``: the GPU duration of each kernel of our call
   by role (:func:`kernels.bench.anatomy.kernel_times`; rows appended to
   ``prefill_scaling.csv`` with ``method = "kernel"``), each kernel's two roofline floors
   (:func:`kernels.bench.roofline.prefill_kernel_model`: compulsory bytes / measured copy
   bandwidth, tensor FLOPs / measured bf16 GEMM rate) → ``roofline.csv``; how the call is
   split (:func:`plan_table`: path, tile width, segments) → ``plan.csv``; registers, shared
   memory and programs per SM of every launch compiled for sm_90
   (:mod:`kernels.bench.sm90`) → ``resources.csv``. For ``peer_anatomy_shapes``: the
   same per-kernel durations of every implementation that passes its gate there (ours in
   this process, FLA and FlashInfer too, FlashQLA in the peer worker with ``kernel_calls``)
   → ``peer_kernels.csv`` (:func:`run_peer_anatomy`); a peer's ``role`` is its kernel's
   short name (:func:`short_kernel_name`), ours' the role of :func:`kernel_roles`.
   :func:`run_gate_dependence` — the long path skips what the gates' decay has made
   negligible, so its time depends on the gates: ours and ``gate_impls`` at ``gate_shapes``
   with the generator's gates and with long-memory heads (:func:`with_gates`), gated and
   timed, ours with its per-kernel times → ``gate_dependence.csv``.
4. :func:`run_stress` — accuracy on hard inputs (``stress.csv``; the question the deleted
   probe ``prefill_solve_stress.py`` answered). :func:`run_ncu_sections` — Nsight Compute
   sections of one kernel of one call
   (``ncu_shape``, ``ncu_kernel``) → ``ncu_sections.csv``.
5. Figures and :func:`conclusion_markdown`, computed from the tables.

GPU-only steps print why they are skipped on the CPU (the smoke profile runs the gate,
``cpu_wall`` timings of the interpreter, the plan and the sm_90 compile).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from kernels import registry
from kernels.bench.gate import PASS, UNAVAILABLE, gate_call, short_reason
from kernels.bench.timing import method_available, time_each, time_fn
from kernels.peers import default_peers
from kernels.registry import Impl
from kernels.report import TARGET_RATIO, ratio_table
from kernels.spec import parse_shape
from kernels.stress_inputs import GATE_SETS, with_gates

from .common import (COMMON_PARAMS, Param, Run, collect_params as _collect, fmt_us, fmt_x,
                     new_figure, plural, progress, start_run, unique_in_order)
from .prefill_overhead import gate_summary, plot_gate_errors  # noqa: F401

STEM = "04_prefill_scaling"
#: Issue 18's growth target: from 131,072 tokens on, ours grows no faster than the token
#: count, with 5 % slack (<= 8.4x for 8x).
GROWTH_FROM_T = 131072
GROWTH_SLACK = 1.05
NCU_SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
                "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "SchedulerStats"]

PARAMS = COMMON_PARAMS + (
    Param("shapes", "list",
          ["8192", "16384", "32768", "65536", "131072", "4x8192", "8x4096",
           "T6", "T64", "100+28", "T512", "T2048", "4x1024", "16x256", "57x64"],
          "shapes: '131072' (one sequence), '4x8192', '100+28', names of kernels.spec.PREFILL_SHAPES"),
    Param("impls", "list", ["ours", *default_peers("prefill", STEM)],
          "ours (gdn_prefill, fused) and peers: fla (triton), fla_flashqla, flashqla, flashinfer; "
          "solution:<path> (a flashinfer-bench solution JSON or starter-kit folder, docs/solutions.md)"),
    Param("solutions", "list", [],
          "more solution paths (the make variable SOLUTIONS); those with a prefill definition are added"),
    Param("methods", "list", ["graph"], "timing methods (graph replay, warm L2; cupti_cold; cpu_wall)"),
    Param("repetitions", "int", 30, "timed calls per point"),
    Param("warmup", "int", 5, "untimed calls before timing (FlashQLA compiles each shape on first use)"),
    Param("seed", "int", 0, "seed of the inputs"),
    Param("with_state", "bool", True, "pass an initial state (else None, i.e. zeros)"),
    Param("reference_check_max_T", "int", 8192,
          "check the chunked reference against the token loop at shapes up to this many tokens"),
    Param("anatomy_shapes", "list", ["57x64", "8192", "4x8192", "131072"],
          "shapes whose per-kernel times, rooflines and sm_90 resources are measured"),
    Param("kernel_calls", "int", 7, "recorded calls per anatomy shape (median per kernel)"),
    Param("peer_anatomy_shapes", "list", ["32768", "131072", "1048576"],
          "shapes whose per-kernel times are recorded for every implementation (ours and "
          "the peers: peer_kernels.csv)"),
    Param("stress_shapes", "list", ["8192", "57x64"],
          "shapes of the accuracy check on hard inputs (kernels.stress_inputs)"),
    Param("stress_spreads", "list", [0.0, 0.02, 0.1, 1.0],
          "key spreads of the hard inputs (0: identical keys in a sequence)"),
    Param("ncu_shape", "str", "131072", "shape of the Nsight Compute profile ('' to skip)"),
    Param("ncu_kernel", "str", "state_walk",
          "regex: the first launch of our call matching it is profiled"),
    Param("ncu_sections", "list", NCU_SECTIONS, "Nsight Compute sections"),
    Param("split_shapes", "list", ["131072"],
          "shapes whose context-parallel split is varied (what each split costs)"),
    Param("split_segments", "list", [4, 8, 16, 32, 64],
          "segments per sequence tried at each split shape (the rule's choice is added)"),
    Param("gate_shapes", "list", ["32768", "131072"],
          "shapes timed with long-memory gates beside the generator's (gate dependence)"),
    Param("gate_sets", "list", ["generator", "one long-memory head", "every head long memory"],
          "gate sets of the gate-dependence section (kernels.experiments.prefill_scaling.with_gates)"),
    Param("gate_impls", "list", ["ours", "flashqla"],
          "implementations of the gate-dependence section (a subset of impls)"),
    Param("num_q_heads", "int", 4, "HQ query/key heads (HK equals it)"),
    Param("num_v_heads", "int", 8, "HV value heads"),
    Param("head_dim", "int", 128, "head size D (K and V equal it)"),
)

TIMES_COLUMNS = ["impl", "lens", "T", "N", "method", "median_us", "p20_us", "p80_us", "n",
                 "kernel", "role", "gpu", "label"]


def collect_params(namespace: dict) -> dict:
    """This notebook's parameters from ``namespace`` (the notebook's ``globals()``)."""
    return _collect(namespace, PARAMS, STEM)


def label_of(name: str) -> str:
    """Table / legend name of an implementation (``fla`` -> ``fla (triton)``)."""
    from kernels.peers import prefill_label

    return "ours" if name == "ours" else prefill_label(name)


def impl_of(run: Run, name: str) -> str:
    """The ``impl`` column of an implementation: ``ours``, the peer's label, or
    ``solution`` (its name is the ``label``), as in every notebook's CSVs."""
    return "solution" if name in run.state["solution_labels"] else label_of(name)


# --------------------------------------------------------------------------- set-up


def start(params: dict) -> Run:
    """Open the run, resolve shapes and implementations (peers needing FlashQLA's site go
    to the peer worker)."""
    from kernels.spec import GDNShape

    run = start_run(STEM, params)
    shape = GDNShape(params["num_q_heads"], params["num_v_heads"], params["head_dim"])
    impls = resolve_impls(params)
    # name -> the callable, the worker's handle (.run), or the unavailable record (.reason)
    run.state.update(shape=shape, shapes=[parse_shape(s) for s in params["shapes"]],
                     impls={(r.label if r.kind == "solution" else r.name): (r.fn if r else r)
                            for r in impls}, inputs={}, refs={})
    run.state["solution_labels"] = [r.label for r in impls if r.kind == "solution"]
    for name, fn in run.state["impls"].items():
        if not fn:
            run.skip(f"{label_of(name)} (all shapes)", fn.reason)
    run.record_solutions(impls)
    remote = [r.fn for r in impls if r and r.kind == "worker"]
    if remote:
        run.extra_provenance["peer_worker"] = remote[0].worker.status([])["_python"]
    print(f"shape: HQ={shape.num_q_heads} HV={shape.num_v_heads} D={shape.head_dim}; "
          f"implementations: {[label_of(n) for n, f in run.state['impls'].items() if f]}")
    return run


def resolve_impls(params: dict) -> List[Impl]:
    """The implementations of ``impls`` (:mod:`kernels.registry`) in their order, ``ours``
    the fused pipeline; then the solutions (``solution:<path>`` entries and ``solutions``)."""
    def ours_of(entry):
        if entry != "ours":
            return None
        from kernels.prefill import make_prefill_impl

        return [registry.ours("ours", lambda: make_prefill_impl("fused"), op="prefill",
                              variant="fused")]

    return registry.resolve(params, "prefill", ours_of=ours_of, known_ours="ours")


def _inputs(run: Run, label: str, lens):
    from kernels.reference import prefill_reference_chunked
    from kernels.spec import make_prefill_inputs

    if label not in run.state["inputs"]:
        run.state["inputs"].clear()   # one shape on the device at a time (131k tokens: ~1 GB)
        run.state["refs"].clear()
        x = make_prefill_inputs(lens, run.state["shape"], seed=run.params["seed"],
                                device=run.device, with_state=run.params["with_state"])
        run.state["inputs"][label] = x
        run.state["refs"][label] = prefill_reference_chunked(**x)
    return run.state["inputs"][label], run.state["refs"][label]


def _gate_one(run: Run, fn, label: str, inputs, ref, method: Optional[str] = None):
    """Gate ``fn`` (in this process, or in the peer worker for a remote peer). Without
    ``method`` the gate row; with it ``(gate row, timings)``, timed only if it passes."""
    p = run.params
    if getattr(fn, "remote", False):
        res = fn.run(label, inputs, ref, device=run.device, methods=[method] if method else [],
                     rep=p["repetitions"], warmup=p["warmup"])
        g, timings = res["gate"], res["timings"]
    else:
        g, timings = gate_call(fn, inputs, ref, run.device), []
        if method is not None and g["status"] == PASS:
            timings = time_each(lambda: fn(**inputs), [method], rep=p["repetitions"],
                                warmup=p["warmup"])
    return g if method is None else (g, timings)


def _first_method(run: Run) -> Optional[str]:
    """The first timing method of ``methods`` available here (None if none is)."""
    return next((m for m in run.params["methods"] if method_available(m, run.device)[0]), None)


# --------------------------------------------------------------------------- 1. gate


def run_gate(run: Run) -> pd.DataFrame:
    """Every implementation × shape against the chunked float32 reference (``gate.csv``);
    the reference itself against the token loop up to ``reference_check_max_T``
    (``reference_check.csv``, kept in ``run.state["reference_check"]``)."""
    from kernels.checks import check_outputs
    from kernels.reference import prefill_reference

    rows, checks = [], []
    for lab, lens in progress(run.state["shapes"], f"gate: "
                              f"{plural(len(run.state['impls']), 'implementation')} per shape "
                              f"vs the f32 reference", "shape"):
        inputs, ref = _inputs(run, lab, lens)
        if sum(lens) <= run.params["reference_check_max_T"]:
            loop = prefill_reference(**inputs)
            r = check_outputs(tuple(ref), tuple(loop))
            checks.append(dict(lens=lab, T=sum(lens), ok=r.ok, max_abs_err=r.max_abs_err,
                               rel_l2_err=r.rel_l2_err, gpu=run.gpu))
        for name, fn in run.state["impls"].items():
            base = dict(label=label_of(name), impl=impl_of(run, name), lens=lab, T=sum(lens),
                        N=len(lens), gpu=run.gpu)
            if not fn:
                rows.append(dict(base, status=UNAVAILABLE, ok=False, reason=fn.reason))
                continue
            try:
                rows.append(dict(base, **_gate_one(run, fn, lab, inputs, ref)))
            except Exception as e:  # a worker that dies is reported like a failing call
                rows.append(dict(base, status="error", ok=False, reason=short_reason(e)))
    gate = pd.DataFrame(rows)
    for _, r in gate[gate.status.isin(["fail", "error"])].iterrows():
        print(f"GATE {r.status.upper()}: {r.label} lens={r.lens}: {r.reason}")
    run.write_csv(gate, "gate")
    check = pd.DataFrame(checks, columns=["lens", "T", "ok", "max_abs_err", "rel_l2_err", "gpu"])
    run.state["reference_check"] = check
    if len(check):
        run.write_csv(check, "reference_check")
    return gate


# --------------------------------------------------------------------------- 2. times


def run_times(run: Run, gate: pd.DataFrame) -> pd.DataFrame:
    """Every passing implementation × shape × method (``prefill_scaling.csv``, written
    again with the per-kernel rows by :func:`run_anatomy`)."""
    p = run.params
    methods = run.usable_methods(p["methods"])
    passed = set(gate[gate.status == PASS].label)
    n_timed = len([n for n in run.state["impls"] if label_of(n) in passed])
    rows = []
    for lab, lens in progress(run.state["shapes"], f"timing ({', '.join(methods)}) of "
                              f"{plural(n_timed, 'implementation')} per shape", "shape"):
        inputs, ref = _inputs(run, lab, lens)
        for name, fn in run.state["impls"].items():
            g = gate[(gate.label == label_of(name)) & (gate.lens == lab)]
            if g.empty or g.status.iloc[0] != PASS:
                if not g.empty and g.status.iloc[0] != UNAVAILABLE:
                    run.skip(f"{label_of(name)} lens={lab}", f"gate {g.status.iloc[0]}")
                continue
            if getattr(fn, "remote", False):
                res = run.worker_result(fn, lab, inputs, ref, f"{label_of(name)} lens={lab}",
                                        methods=methods, rep=p["repetitions"], warmup=p["warmup"])
                if not res:
                    continue
                timings = res["timings"]
            else:
                timings = time_each(lambda f=fn: f(**inputs), methods, rep=p["repetitions"],
                                    warmup=p["warmup"])
            rows += run.timed_rows(timings, f"{label_of(name)} lens={lab}", dict(
                impl=impl_of(run, name), lens=lab, T=sum(lens), N=len(lens), kernel="", role="",
                gpu=run.gpu, label=label_of(name)))
    times = pd.DataFrame(rows, columns=TIMES_COLUMNS)
    run.state["times"] = times
    if len(times):
        run.write_csv(times, "prefill_scaling")
    return times


# --------------------------------------------------------------------------- 3. anatomy

SPLIT_COLUMNS = ["lens", "T", "N", "segments", "seg_chunks", "path", "default", "status",
                 "max_abs_err", "method", "median_us", "p20_us", "p80_us", "gpu"]


def run_split_costs(run: Run) -> pd.DataFrame:
    """What each context-parallel split costs: ours (``fused``) at each ``split_shapes`` shape
    with about ``split_segments`` segments per sequence (``gdn_prefill(cp=chunks per
    segment)``) and with the rule's own split (``default``), each gated against the chunked
    float32 reference and timed with the first available method of ``methods``
    (``split_costs.csv``)."""
    from kernels.prefill import gdn_prefill, prefill_plan

    p, sh = run.params, run.state["shape"]
    method = _first_method(run)
    if method is None:
        run.skip("split costs", "no timing method of `methods` is available here")
    shapes = dict(run.state["shapes"])
    rows = []
    for lab in progress(p["split_shapes"], f"split costs: gate + {method} per CP split", "shape"):
        lens = shapes.get(lab) or parse_shape(lab)[1]
        T, N = sum(lens), len(lens)
        chunks = -(-T // 64) / max(N, 1)
        seg0 = prefill_plan(T, N, sh.num_v_heads, sh.head_dim, run.device).seg_chunks
        segs = {max(int(round(chunks / n)), 1): False for n in p["split_segments"]}
        if seg0:
            segs[seg0] = True
        inputs, ref = _inputs(run, lab, lens)
        for seg, default in sorted(segs.items(), reverse=True):
            # the rule's own row runs the rule (cp=None: its split chosen on the device too)
            cp = None if default else seg
            call = (lambda c=cp, **x: gdn_prefill(**x, variant="fused", cp=c))
            g = gate_call(call, inputs, ref, run.device)
            fn = (lambda f=call, x=inputs: f(**x))
            row = dict(lens=lab, T=T, N=N, segments=int(-(-chunks // seg)), seg_chunks=seg,
                       path=prefill_plan(T, N, sh.num_v_heads, sh.head_dim, run.device,
                                         cp=cp).label, default=default,
                       status=g["status"], max_abs_err=g["max_abs_err"], method=method,
                       median_us=float("nan"), p20_us=float("nan"), p80_us=float("nan"),
                       gpu=run.gpu)
            if g["status"] == PASS and method is not None:
                t = time_fn(fn, method, rep=p["repetitions"], warmup=p["warmup"])
                row.update(median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us)
            elif g["status"] != PASS:
                print(f"SPLIT GATE {g['status'].upper()}: {lab} seg_chunks={seg}: {g['reason']}")
            rows.append(row)
    df = pd.DataFrame(rows, columns=SPLIT_COLUMNS)
    if len(df):
        run.write_csv(df, "split_costs")
    return df


def plot_split_costs(df: pd.DataFrame):
    """Time vs segments per sequence, one line per shape; the rule's choice ringed."""
    if df is None or df.empty or df.median_us.isna().all():
        return None
    fig, axes = new_figure(1, 1, panel=(6.2, 4.0))
    ax = axes[0][0]
    for lab, g in df.dropna(subset=["median_us"]).groupby("lens", sort=False):
        g = g.sort_values("segments")
        line, = ax.plot(g.segments, g.median_us, marker="o", ms=4, label=f"{lab} tokens")
        d = g[g.default]
        if len(d):
            ax.scatter(d.segments, d.median_us, s=120, facecolors="none",
                       edgecolors=line.get_color(), label=f"{lab}: the rule's split")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("segments per sequence (log2)")
    _us_axis(ax)
    ax.legend(fontsize=7)
    fig.suptitle("What each context-parallel split costs (ours, fused) — "
                 + _title(str(df.gpu.iloc[0]), str(df.method.iloc[0])))
    return fig



GATE_COLUMNS = ["lens", "T", "N", "gates", "impl", "status", "max_abs_err", "method",
                "median_us", "p20_us", "p80_us", "kernel", "role", "gpu"]


def run_gate_dependence(run: Run) -> pd.DataFrame:
    """Ours and ``gate_impls`` at ``gate_shapes`` for each of ``gate_sets``: gated against
    the chunked float32 reference of those gates, timed with the first available method
    of ``methods``; ours also per kernel (``method = "kernel"`` rows, GPU only)
    (``gate_dependence.csv``). The long path's phase A walks what the decay has not made
    negligible, so its time follows the slowest head's memory; the contest generator's
    seed-0 gates forget fast."""
    from kernels.reference import prefill_reference_chunked

    p = run.params
    method = _first_method(run)
    if method is None:
        run.skip("gate dependence", "no timing method of `methods` is available here")
    impls = {}
    for name in p["gate_impls"]:
        fn = run.state["impls"].get(name)
        if fn is None:
            run.skip(f"gate dependence: {name}", "not among the implementations (impls)")
        elif fn:
            impls[name] = fn
    shapes = dict(run.state["shapes"])
    rows = []
    for lab in progress(p["gate_shapes"], f"gate dependence: "
                        f"{plural(len(p['gate_sets']), 'gate set')} × "
                        f"{plural(len(impls), 'implementation')} per shape ({method})", "shape"):
        lens = shapes.get(lab) or parse_shape(lab)[1]
        base_inputs, _ = _inputs(run, lab, lens)
        for gates in p["gate_sets"]:
            x = with_gates(base_inputs, gates)
            ref = prefill_reference_chunked(**x)
            for name, fn in impls.items():
                row = dict(lens=lab, T=sum(lens), N=len(lens), gates=gates, impl=label_of(name),
                           method=method, median_us=float("nan"), p20_us=float("nan"),
                           p80_us=float("nan"), kernel="", role="", gpu=run.gpu)
                key = f"gates-{lab}-{GATE_SETS.index(gates)}"
                try:
                    g, timings = (_gate_one(run, fn, key, x, ref, method) if method else
                                  (_gate_one(run, fn, key, x, ref), []))
                except Exception as e:
                    g, timings = dict(status="error", reason=short_reason(e)), []
                row.update(status=g.get("status"), max_abs_err=g.get("max_abs_err"))
                if g.get("status") != PASS:
                    print(f"GATE-DEPENDENCE {str(g.get('status')).upper()}: {label_of(name)} "
                          f"{lab} {gates}: {g.get('reason', '')}")
                for t in timings:
                    if "error" in t:
                        run.skip(f"gate dependence: {label_of(name)} {lab} {gates}", t["error"])
                    else:
                        row.update(method=t["method"], median_us=t["median_us"],
                                   p20_us=t["p20_us"], p80_us=t["p80_us"])
                rows.append(row)
                if name == "ours" and g.get("status") == PASS and run.on_gpu:
                    rows.extend(_kernel_rows(run, fn, x, row))
            del x, ref
    df = pd.DataFrame(rows, columns=GATE_COLUMNS)
    if len(df):
        run.write_csv(df, "gate_dependence")
    return df


def _kernel_rows(run: Run, fn, x, row: dict) -> list:
    from kernels.bench.anatomy import kernel_times

    try:
        kt = kernel_times(lambda: fn(**x), calls=max(1, run.params["kernel_calls"] // 2))
    except Exception as e:
        run.skip(f"gate dependence kernels {row['lens']} {row['gates']}", short_reason(e))
        return []
    return [dict(row, method="kernel", kernel=r.kernel, role=r.role, median_us=r.median_us,
                 p20_us=r.p20_us, p80_us=r.p80_us) for r in kt.itertuples()]


def gate_dependence_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape and implementation (rows), the time with each gate set (columns), from the
    timed rows of :func:`run_gate_dependence`; ours' phase A as its own row."""
    if df is None or df.empty:
        return pd.DataFrame()
    t = df[df.method != "kernel"]
    k = df[(df.method == "kernel") & (df.role == "CP phase A")].assign(impl="ours: CP phase A")
    both = pd.concat([t, k], ignore_index=True)
    if both.median_us.isna().all():
        return pd.DataFrame()
    tab = both.pivot_table(index=["lens", "impl"], columns="gates", values="median_us",
                           sort=False, dropna=False)
    return tab[[g for g in GATE_SETS if g in tab.columns]]


def _untimed(df: pd.DataFrame, lens: str, impl: str, gates: str) -> str:
    """Why a cell of :func:`gate_dependence_table` has no time: the gate's status."""
    r = df[(df.lens.astype(str) == str(lens)) & (df.impl == impl) & (df.gates == gates)
           & (df.method != "kernel")]
    st = str(r.status.iloc[0]) if len(r) else "not run"
    return "not timed" if st == PASS else f"not timed (gate {st})"


def plot_gate_dependence(df: pd.DataFrame):
    """Grouped bars: one panel per shape, one group per gate set, one bar per implementation
    (ours' phase A hatched inside its bar)."""
    tab = gate_dependence_table(df)
    if tab.empty:
        return None
    shapes = unique_in_order(tab.index.get_level_values(0))
    fig, axes = new_figure(1, len(shapes), panel=(6.0, 4.0))
    t = df[df.method != "kernel"]
    for ax, lab in zip(axes[0], shapes):
        sub = tab.loc[lab]
        impls = [i for i in sub.index if not i.startswith("ours: ")]
        gates = list(sub.columns)
        w = 0.8 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            xs = np.arange(len(gates)) + (j - (len(impls) - 1) / 2) * w
            vals = sub.loc[impl].to_numpy(float)
            ax.bar(xs, np.nan_to_num(vals), w, label=impl)
            for x0, v, g in zip(xs, vals, gates):
                if not np.isfinite(v):   # above the axis, clear of the tick and its label
                    ax.text(x0, 0.04, _untimed(df, lab, impl, g), rotation=90, ha="center",
                            va="bottom", fontsize=7, transform=ax.get_xaxis_transform(),
                            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="0.7", lw=0.5))
            if impl == "ours" and "ours: CP phase A" in sub.index:
                # black hatch: an edge in the bar's own colour vanished inside it
                ax.bar(xs, sub.loc["ours: CP phase A"].to_numpy(float), w * 0.6,
                       color="none", edgecolor="black", hatch="//",
                       label="ours: CP phase A (kernel)")
        ax.set_xticks(np.arange(len(gates)))
        ax.set_xticklabels(gates, fontsize=8)
        _us_axis(ax)
        ax.set_title(f"{lab} tokens", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Time vs gates (long-memory heads: A = 1, dt = 1e-3) — "
                 + _title(str(df.gpu.iloc[0]), str(t.method.iloc[0])))
    return fig


def plan_table(run: Run) -> pd.DataFrame:
    """How our ``fused`` call splits each shape, read from its plan
    (:func:`kernels.prefill.prefill_plan`, host rules, no launch): ``path`` (recurrent, one
    launch, walk, chained CP, long CP, long CP with the split chosen on the device:
    ``seg_chunks`` or half of it), walk tile width ``BV``, ``seg_chunks`` (chunks per CP
    segment), ``segments`` (per call), ``launches``, ``phase_c`` (the long paths' phase C
    kernel: ``gluon`` on sm_90 where :func:`kernels.prefill.config.walk_gluon_rule` picks it,
    else ``triton``; empty on the other paths)."""
    from kernels.prefill import prefill_plan

    sh = run.state["shape"]
    rows = []
    for lab, lens in run.state["shapes"]:
        T, N = sum(lens), len(lens)
        plan = prefill_plan(T, N, sh.num_v_heads, sh.head_dim, run.device)
        seg = plan.seg_chunks
        segs = sum(max(-(-n // (seg * 64)), 1) for n in lens if n) if seg else 0
        rows.append(dict(lens=lab, T=T, N=N, path=plan.label, BV=plan.BV, seg_chunks=seg,
                         segments=segs, launches=plan.launches,
                         phase_c=("gluon" if plan.phase_c_gluon else "triton")
                         if plan.phase_b is not None else ""))
    df = pd.DataFrame(rows)
    run.write_csv(df, "plan")
    return df


def run_anatomy(run: Run, times: pd.DataFrame) -> Dict[str, pd.DataFrame]:
    """Per-kernel times (GPU), rooflines (GPU) and sm_90 resources (any host) of our call
    at ``anatomy_shapes``. Returns ``{"kernels", "roofline", "resources"}``."""
    from kernels.bench import anatomy, roofline, sm90
    from kernels.prefill import prefill_plan
    from kernels.prefill.context_parallel import sm_count

    p, sh = run.params, run.state["shape"]
    ours = run.state["impls"].get("ours")
    out = dict(kernels=pd.DataFrame(), roofline=pd.DataFrame(), resources=pd.DataFrame())
    if not ours:
        run.skip("anatomy", "ours is not among the implementations")
        return out
    shapes = [parse_shape(s) for s in p["anatomy_shapes"]]
    kern, roof, res = [], [], []
    bw = rate = None
    if run.on_gpu:
        bw, rate = roofline.copy_bandwidth(run.device), roofline.tensor_rate(run.device)
        run.extra_provenance.update(copy_bandwidth_Bps=bw, tensor_rate_flops=rate)
    else:
        run.skip("per-kernel times and rooflines", f"need a CUDA GPU (device is {run.device})")
    for lab, lens in progress(shapes, "anatomy: launches, compiled kernels, per-kernel times",
                              "shape"):
        inputs, ref = _inputs(run, lab, lens)
        T, N = sum(lens), len(lens)
        call = (lambda: ours(**inputs))
        try:
            launches = sm90.record_launches(call)
            r = sm90.compile_resources(launches, n_sm=sm_count(run.device))
            res.append(r.assign(lens=lab, T=T, N=N))
        except Exception as e:
            run.skip(f"sm_90 resources lens={lab}", short_reason(e))
        if not run.on_gpu:
            continue
        try:
            kt = anatomy.kernel_times(call, calls=p["kernel_calls"])
        except Exception as e:
            run.skip(f"per-kernel times lens={lab}", short_reason(e))
            continue
        kern.append(kt.assign(lens=lab, T=T, N=N, gpu=run.gpu))
        plan = prefill_plan(T, N, sh.num_v_heads, sh.head_dim, run.device)
        seg, long = plan.seg_chunks, plan.path.startswith("cp_long")
        for k in kt.itertuples():
            try:
                m = roofline.prefill_kernel_model(k.role, lens, sh, seg, long,
                                                  with_state=p["with_state"])
            except ValueError:
                continue
            fb, ff = m["bytes"] / bw * 1e6, m["flops"] / rate * 1e6
            roof.append(dict(lens=lab, T=T, N=N, k=k.k, kernel=k.kernel, role=k.role,
                             measured_us=k.median_us, bytes=m["bytes"], flops=m["flops"],
                             bytes_floor_us=fb, flops_floor_us=ff,
                             roof_ratio=k.median_us / max(fb, ff), gpu=run.gpu))
    if kern:
        kdf = pd.concat(kern, ignore_index=True)
        out["kernels"] = kdf
        rows = kdf.assign(
            impl="ours", method="kernel", n=kdf.calls, gpu=run.gpu, label="ours")[TIMES_COLUMNS]
        allt = pd.concat([times, rows], ignore_index=True) if len(times) else rows
        run.write_csv(allt, "prefill_scaling")
    if roof:
        out["roofline"] = pd.DataFrame(roof)
        run.write_csv(out["roofline"], "roofline")
    if res:
        out["resources"] = pd.concat(res, ignore_index=True)
        run.write_csv(out["resources"], "resources")
    out["peer_kernels"] = run_peer_anatomy(run)
    return out


PEER_KERNEL_COLUMNS = ["impl", "label", "lens", "T", "N", "k", "kernel", "role", "median_us",
                       "p20_us", "p80_us", "calls", "span_us", "gpu"]


def short_kernel_name(name: str) -> str:
    """A peer kernel's name without ``void``, ``(anonymous namespace)::``, its argument list
    and its template arguments
    (``void flashinfer::gdn::prefill<128, true>(Params)`` -> ``flashinfer::gdn::prefill``);
    a generic wrapper (``cutlass::device_kernel<flash::FwdKernel<...>>``) is named by its
    first template argument (``flash::FwdKernel``); a CuTe DSL kernel, whose name is its
    module path and arguments run together
    (``kernel_cutlass_kernel_..._sm90CPDeltaRulePrefillSm90_object_at__...``), by its class
    (``CPDeltaRulePrefillSm90``)."""
    import re

    cute = re.match(r"kernel_cutlass_kernel_\w*?([A-Z][A-Za-z0-9]*)_object_at_", str(name))
    if cute:
        return cute.group(1)
    s = re.sub(r"^void\s+", "", str(name).strip()).replace("(anonymous namespace)::", "")
    s = s.split("(")[0]
    outer, _, args = s.partition("<")
    outer = outer.strip() or s
    if outer.split("::")[-1] in ("device_kernel", "kernel", "Kernel"):
        return re.split(r"[<,>]", args)[0].strip() or outer
    return outer


def run_peer_anatomy(run: Run) -> pd.DataFrame:
    """Per-kernel GPU durations (:func:`kernels.bench.anatomy.kernel_times`, median of
    ``kernel_calls`` calls) of every implementation at ``peer_anatomy_shapes``, each gated
    there first (in this process, or in the peer worker for FlashQLA, which records them
    with the same function) → ``peer_kernels.csv``. GPU only; an unavailable
    implementation, a failing gate or a failed recording is skipped with its reason."""
    p = run.params
    empty = pd.DataFrame(columns=PEER_KERNEL_COLUMNS)
    shapes = [parse_shape(s) for s in p["peer_anatomy_shapes"]]
    if not shapes:
        return empty
    if not run.on_gpu:
        run.skip("per-kernel times of every implementation (peer_kernels.csv)",
                 f"need a CUDA GPU (device is {run.device})")
        return empty
    impls = {}
    for name, fn in run.state["impls"].items():
        if fn:
            impls[name] = fn
        else:
            run.skip(f"per-kernel times: {label_of(name)}",
                     f"unavailable: {getattr(fn, 'reason', '')}")
    rows = []
    for lab, lens in progress(shapes, f"per-kernel times of "
                              f"{plural(len(impls), 'implementation')} per shape", "shape"):
        inputs, ref = _inputs(run, lab, lens)
        for name, fn in impls.items():
            kt = _impl_kernel_times(run, fn, lab, inputs, ref,
                                    f"per-kernel times: {label_of(name)} lens={lab}")
            if kt is None or kt.empty:
                continue
            if name != "ours":   # a peer's kernels keep their own (short) names
                kt = kt.assign(role=[short_kernel_name(k) for k in kt.kernel])
            rows.append(kt.assign(impl=impl_of(run, name), label=label_of(name), lens=lab,
                                  T=sum(lens), N=len(lens), gpu=run.gpu))
    if not rows:
        return empty
    df = pd.concat(rows, ignore_index=True)[PEER_KERNEL_COLUMNS]
    run.write_csv(df, "peer_kernels")
    return df


def _impl_kernel_times(run: Run, fn, lab: str, inputs, ref, what: str):
    """:func:`kernels.bench.anatomy.kernel_times` of ``fn`` after its gate passes (in the
    worker for a remote implementation); None, with ``what`` skipped, otherwise."""
    from kernels.bench import anatomy

    calls = run.params["kernel_calls"]
    if getattr(fn, "remote", False):
        res = run.worker_result(fn, lab, inputs, ref, what, kernel_calls=calls)
        if res is None:
            return None
        if res.get("kernel_error") or not res.get("kernel_rows"):
            run.skip(what, res.get("kernel_error") or "the worker returned no kernels")
            return None
        return pd.DataFrame(res["kernel_rows"])
    try:
        g = gate_call(fn, inputs, ref, run.device)
        if g["status"] != PASS:
            run.skip(what, f"gate {g['status']}: {g.get('reason', '')}")
            return None
        return anatomy.kernel_times(lambda: fn(**inputs), calls=calls)
    except Exception as e:
        run.skip(what, short_reason(e))
        return None


def run_stress(run: Run) -> pd.DataFrame:
    """Accuracy on hard inputs (:func:`kernels.stress_inputs.make_prefill_stress_inputs`:
    correlated keys, beta ~ 0.98, decay > 0.99 per token) at ``stress_shapes`` x
    ``stress_spreads``: every implementation, plus ours with ``ACCURATE_CONFIG``, against
    the chunked float32 reference (``stress.csv``). Not a timing gate: the contest inputs
    are; this says which implementation stays within the tolerance where keys correlate."""
    from kernels.prefill import ACCURATE_CONFIG, make_prefill_impl
    from kernels.reference import prefill_reference_chunked
    from kernels.stress_inputs import make_prefill_stress_inputs

    impls = {n: f for n, f in run.state["impls"].items() if f}   # unavailable: skipped at start
    if "ours" in impls:
        impls["ours (ACCURATE_CONFIG)"] = make_prefill_impl("fused", config=ACCURATE_CONFIG)
    rows = []
    for spec in progress(run.params["stress_shapes"], f"hard inputs: "
                         f"{plural(len(impls), 'implementation')} × "
                         f"{plural(len(run.params['stress_spreads']), 'spread')} per shape",
                         "shape"):
        lab, lens = parse_shape(spec)
        for spread in run.params["stress_spreads"]:
            x = make_prefill_stress_inputs(lens, run.state["shape"], spread=float(spread),
                                           seed=run.params["seed"], device=run.device)
            ref = prefill_reference_chunked(**x)
            key = f"stress-{lab}-{spread}"
            for name, fn in impls.items():
                label = name if name.startswith("ours") else label_of(name)
                try:
                    g = _gate_one(run, fn, key, x, ref)
                except Exception as e:
                    g = dict(status="error", ok=False, reason=short_reason(e))
                rows.append(dict(label=label, lens=lab, spread=float(spread),
                                 status=g.get("status"), max_abs_err=g.get("max_abs_err"),
                                 rel_l2_err=g.get("rel_l2_err"), reason=g.get("reason", ""),
                                 gpu=run.gpu))
    df = pd.DataFrame(rows)
    if len(df):
        run.write_csv(df, "stress")
    return df


def stress_table(df: pd.DataFrame) -> pd.DataFrame:
    """Max abs error per implementation (rows) and (shape, spread) (columns)."""
    if df is None or df.empty:
        return pd.DataFrame()
    return df.pivot_table(index="label", columns=["lens", "spread"], values="max_abs_err",
                          sort=False)


def run_ncu_sections(run: Run) -> pd.DataFrame:
    """Nsight Compute sections of the first launch matching ``ncu_kernel`` in one call of
    ours at ``ncu_shape`` (``ncu_sections.csv``); empty with the reason printed when ncu or
    a GPU is missing."""
    from kernels.bench.ncu import ncu_available, run_ncu

    p = run.params
    if not p["ncu_shape"]:
        run.skip("Nsight Compute sections", "ncu_shape is empty")
        return pd.DataFrame()
    ok, why = ncu_available()
    if not ok:
        run.skip("Nsight Compute sections", why)
        return pd.DataFrame()
    lab, lens = parse_shape(p["ncu_shape"])
    try:
        df = run_ncu(dict(impl="ours", op="prefill", lens=lens, variant="fused",
                          seed=p["seed"]), sections=p["ncu_sections"], kernel=p["ncu_kernel"],
                     out_csv=run.path("ncu_sections_raw.csv"))
    except Exception as e:
        run.skip(f"Nsight Compute sections lens={lab}", short_reason(e))
        return pd.DataFrame()
    df = df.assign(lens=lab, gpu=run.gpu)
    run.write_csv(df, "ncu_sections")
    return df


def ncu_summary(df: pd.DataFrame) -> pd.DataFrame:
    """The profiled kernel's metrics, one row per (section, metric): ``kernel, section,
    metric, value, unit`` (rows without a value dropped)."""
    if df is None or df.empty:
        return pd.DataFrame()
    cols = [c for c in ("kernel", "section", "metric", "value", "unit") if c in df]
    out = df[df.value.notna()][cols]
    return out.sort_values([c for c in ("section", "metric") if c in out], kind="stable") \
        .reset_index(drop=True)


# --------------------------------------------------------------------------- 4. figures


def _title(gpu: str, method: str) -> str:
    return f"{gpu} — {method}"


def ratio_display(times: pd.DataFrame) -> pd.DataFrame:
    """:func:`ratio_table` as the notebook shows it: every time column named with its unit."""
    r = ratio_table(times)
    labels = set(times.label) if "label" in times else set()
    return r.rename(columns={**{c: f"{c} (µs)" for c in r.columns if c in labels},
                             "fastest peer us": "fastest peer (µs)"})


def _plain_log_formatter():
    """Log-axis tick labels as plain numbers (``2,000,000``); minor ones only where
    matplotlib would label them (a span of about a decade or less)."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:,.0f}" if x >= 1 else f"{x:g}"

    return Plain(labelOnlyBase=False)


def _us_axis(ax) -> None:
    """The notebook's one time unit, µs, on a linear y axis (thousands separated: the CPU
    interpreter's calls take seconds)."""
    from matplotlib.ticker import StrMethodFormatter

    ax.set_ylabel("time per call (µs)")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))


def plot_time_vs_T(times: pd.DataFrame):
    """Time vs total tokens (log-log), one line per implementation over the single
    sequences (markers: batches), and ours / fastest peer per shape (1 and the 0.9 target
    marked; a log axis when the ratios reach past 4×, where a linear one would squeeze
    both lines onto its floor)."""
    t = times[times.kernel.fillna("") == ""] if len(times) else times
    if t is None or t.empty:
        return None
    method = t.method.iloc[0]
    t = t[t.method == method]
    r = ratio_table(t, method)
    peers = "ours / fastest peer" in r
    fig, axes = new_figure(1, 2 if peers else 1, panel=(5.6, 4.0))
    ax = axes[0][0]
    for i, label in enumerate(unique_in_order(t.label)):
        s = t[t.label == label].sort_values("T")
        one = s[s.N == 1]
        line, = ax.plot(one["T"], one.median_us, marker="o", ms=3, label=label,
                        ls=("-", "--", "-.", ":")[i % 4])   # equal peers stay distinguishable
        many = s[s.N > 1]
        ax.scatter(many["T"], many.median_us, marker="s", s=22, facecolors="none",
                   edgecolors=line.get_color())
    if (t.N > 1).any():
        ax.scatter([], [], marker="s", s=22, facecolors="none", edgecolors="0.3",
                   label="a batch (N > 1 sequences)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(0.08)   # the last batch's square inside the frame, not on it
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(_plain_log_formatter())   # "2×10⁶" beside a batch marker read as the batch's value
    ax.set_xlabel("total tokens T (log)")
    ax.set_ylabel("time per call (µs, log)")
    ax.set_title("one sequence (lines), batches (squares)", fontsize=9)
    ax.legend(fontsize=7)
    if peers:
        ax = axes[0][1]
        r = r.sort_values(["N", "T"]).reset_index(drop=True)
        x = np.arange(len(r))
        ax.bar(x, r["ours / fastest peer"], color=np.where(r["target met"], "tab:green",
                                                               "tab:red"))
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(TARGET_RATIO, color="k", ls="--", lw=0.8, label=f"target {TARGET_RATIO}")
        ax.set_xticks(x, r.lens, rotation=45, ha="right", fontsize=7)
        ax.set_xlabel("shape (sequence lengths)")
        ax.set_ylabel("ours / fastest peer (time ratio)")
        v = r["ours / fastest peer"].to_numpy(float)
        v = v[np.isfinite(v) & (v > 0)]
        lo, hi = min([TARGET_RATIO, *v]), max([1.2, *v])
        if hi / lo > 4:
            ax.set_yscale("log")
            ax.set_ylim(lo / 1.5, hi * 1.5)
        else:
            ax.set_ylim(0, hi * 1.1)
        ax.set_title("below 1: ours faster", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"GDN prefill time vs length — {_title(str(t.gpu.iloc[0]), method)}"
                 + ("" if peers else "\n(no peer timed here: no ours / fastest-peer panel)"))
    return fig


_ROLE_COLORS = {"intra-chunk": "tab:blue", "intra-chunk + walkers": "tab:cyan",
                "walk": "tab:orange", "CP phase A": "tab:purple", "CP phase B": "tab:gray",
                "CP phase C": "tab:red"}


def plot_kernel_breakdown(kernels: pd.DataFrame):
    """Per anatomy shape: each kernel role's share of our call's summed kernel time (stacked
    to 1, linear), with the kernel time and the call's wall span in µs above each bar."""
    if kernels is None or kernels.empty:
        return None
    shapes = unique_in_order(kernels.lens)
    fig, axes = new_figure(1, 1, panel=(max(5.0, 1.3 * len(shapes) + 3.0), 4.0))
    ax = axes[0][0]
    totals = np.array([kernels[kernels.lens == s].median_us.sum() for s in shapes])
    bottom = np.zeros(len(shapes))
    for role in unique_in_order(kernels.role):
        vals = np.array([kernels[(kernels.lens == s) & (kernels.role == role)].median_us.sum()
                         for s in shapes]) / totals
        ax.bar(range(len(shapes)), vals, bottom=bottom, label=role, width=0.6,
               color=_ROLE_COLORS.get(role))
        bottom += vals
    for i, s in enumerate(shapes):
        span = float(kernels[kernels.lens == s].span_us.iloc[0])
        ax.text(i, 1.01, f"kernels {fmt_us(totals[i])}\nspan {fmt_us(span)}", ha="center",
                va="bottom", fontsize=7)
    ax.set_ylim(0, 1.18)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("share of the call's kernel time")
    ax.set_xlabel("shape")
    fig.legend(fontsize=7, loc="outside right center")
    gpu = str(kernels.gpu.iloc[0]) if "gpu" in kernels and len(kernels) else ""
    fig.suptitle(f"Where our prefill's time goes — {gpu}\nkernel durations (CUPTI via "
                 f"torch.profiler), eager calls, warm L2", fontsize=10)
    return fig


#: a peer's PyTorch elementwise kernels (its input conversion: gates, ``beta``, casts) are
#: drawn as one segment under this name
TORCH_OPS = "PyTorch elementwise ops"


def peer_kernel_segments(df: pd.DataFrame) -> pd.DataFrame:
    """``peer_kernels.csv`` as drawn: each peer kernel named by :func:`short_kernel_name`
    (applied again, so CSVs of older runs draw the same), PyTorch's ``at::native``
    kernels as :data:`TORCH_OPS`, and consecutive kernels of one name in one call summed
    into one segment (columns ``lens``, ``T``, ``label``, ``role``, ``median_us``)."""
    d = df.sort_values(["lens", "label", "k"], kind="stable").copy()
    role = [short_kernel_name(r) for r in d.role.astype(str)]
    d["role"] = [TORCH_OPS if r.startswith("at::native::") else r for r in role]
    run = (d.role != d.role.shift()) | (d.label != d.label.shift()) | (d.lens != d.lens.shift())
    d["seg"] = run.cumsum()
    out = d.groupby("seg", sort=True).agg(lens=("lens", "first"), T=("T", "first"),
                                          label=("label", "first"), role=("role", "first"),
                                          median_us=("median_us", "sum"))
    return out.reset_index(drop=True)


def plot_peer_kernels(df: pd.DataFrame):
    """Per shape of ``peer_anatomy_shapes`` (one panel each): one horizontal bar per
    implementation, stacked from its kernels' median durations in launch order
    (:func:`peer_kernel_segments`; colour: ours' role, a peer kernel's short name, every
    name its own colour), the summed kernel time written at its end."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgb

    from .common import figure_legend

    if df is None or df.empty:
        return None
    shapes = unique_in_order(df.lens.astype(str))
    impls = unique_in_order(df.label)
    seg = peer_kernel_segments(df)
    roles = unique_in_order(seg.role)
    taken = {to_rgb(c) for c in _ROLE_COLORS.values()} | {to_rgb("0.75")}
    palette = [c for cmap in ("tab20", "tab20b", "tab20c")
               for c in colormaps[cmap].colors
               if to_rgb(c) not in taken and max(c) - min(c) > 0.05]  # greys: ours, torch
    free = iter(palette)
    colour = {r: _ROLE_COLORS.get(r) or ("0.75" if r == TORCH_OPS else next(free, "0.5"))
              for r in roles}
    fig, axes = new_figure(len(shapes), 1, panel=(9.0, 0.45 * len(impls) + 1.3))
    for ax, lab in zip(axes[:, 0], shapes):
        sub = seg[seg.lens.astype(str) == lab]
        names = [i for i in impls if (sub.label == i).any()]
        ys = np.arange(len(names))[::-1]
        top = 0.0
        for y, impl in zip(ys, names):
            left = 0.0
            for r in sub[sub.label == impl].itertuples():
                ax.barh(y, r.median_us, left=left, height=0.6, color=colour[r.role],
                        edgecolor="white", linewidth=0.5, label=r.role)
                left += r.median_us
            ax.text(left, y, f"  {fmt_us(left)}", va="center", ha="left", fontsize=7)
            top = max(top, left)
        ax.set_xlim(0, top * 1.18 if top > 0 else 1)
        ax.set_yticks(ys, names, fontsize=8)
        ax.set_ylabel("implementation")
        ax.set_xlabel("summed kernel time per call (µs)")
        T = int(sub["T"].iloc[0])
        ax.set_title(f"{lab} ({T:,} tokens)", fontsize=9)
    figure_legend(fig, axes)
    calls = int(df.calls.max())
    gpu = str(df.gpu.iloc[0]) if "gpu" in df and len(df) else ""
    fig.suptitle(f"Each implementation's call by kernel — {gpu}\nCUPTI kernel durations "
                 f"(torch.profiler), median of {plural(calls, 'call')}, eager, warm L2",
                 fontsize=10)
    return fig


def plot_roofline(roof: pd.DataFrame):
    """Per kernel role and shape: measured time against its byte floor and FLOP floor."""
    if roof is None or roof.empty:
        return None
    shapes = unique_in_order(roof.lens)
    fig, axes = new_figure(1, len(shapes), panel=(max(4.6, 10.0 / len(shapes)), 3.8),
                           sharey=True)
    for ax, s in zip(axes.flat, shapes):
        r = roof[roof.lens == s].reset_index(drop=True)
        x = np.arange(len(r))
        ax.bar(x, r.measured_us, color=[_ROLE_COLORS.get(x_, "0.6") for x_ in r.role],
               label="measured (colour: role)")
        ax.scatter(x, r.bytes_floor_us, marker="v", color="k", zorder=3,
                   label="bytes / copy bandwidth")
        ax.scatter(x, r.flops_floor_us, marker="^", color="tab:olive", zorder=3,
                   label="FLOPs / bf16 GEMM rate")
        ax.set_xticks(x, r.role, rotation=35, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"lens={s}", fontsize=9)
    axes[0][0].set_ylabel("µs (log)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="outside right center")
    fig.suptitle(f"Roofline per kernel of our prefill — {roof.gpu.iloc[0]}\nkernel durations "
                 f"(CUPTI, eager, warm L2) vs bytes / copy bandwidth and FLOPs / bf16 GEMM rate "
                 f"(both measured)", fontsize=10)
    return fig


# --------------------------------------------------------------------------- 5. conclusion


def conclusion_markdown(dfs: Dict[str, pd.DataFrame]) -> str:
    """The conclusion from ``gate``, ``times``, optional ``roofline``, ``plan``, ``split``,
    ``gates`` (gate dependence), ``reference_check`` — computed, never typed."""
    gate, times = dfs.get("gate"), dfs.get("times")
    gpu = str(gate.gpu.iloc[0]) if gate is not None and len(gate) else ""
    lines = [f"### Conclusion — {gpu}"]
    chk = dfs.get("reference_check")
    if chk is not None and len(chk):
        lines.append(f"**Reference:** the chunked float32 reference matches the token loop at "
                     f"{int(chk.ok.sum())} of {plural(len(chk), 'shape')} up to T={int(chk['T'].max())} "
                     f"(largest max abs difference {chk.max_abs_err.max():.2e}).")
    if gate is not None and len(gate):
        ran = gate[gate.status != UNAVAILABLE]
        bad = ran[ran.status != PASS]
        unav = unique_in_order(gate[gate.status == UNAVAILABLE].label)
        txt = (f"**Gate:** {plural(ran.label.nunique(), 'implementation')} × "
               f"{plural(gate.lens.nunique(), 'shape')}; "
               + ("all passed (atol = rtol = 1e-2)." if bad.empty else "failing (not timed): "
                  + "; ".join(f"{r.label} at {r.lens} ({r.status})" for r in bad.itertuples())
                  + "."))
        if unav:
            txt += f" Not available here: {', '.join(unav)}."
        lines.append(txt)
    st = dfs.get("stress")
    if st is not None and len(st):
        items = [f"{lab} {int((g.status == PASS).sum())}/{len(g)}"
                 for lab, g in st.groupby("label", sort=False)]
        lines.append("**Hard inputs** (correlated keys, beta ≈ 0.98, long memory; within the "
                     "contest tolerance / cases): " + ", ".join(items) + ".")
    if times is None or times.empty:
        lines.append("**No timings** in this run.")
        return "\n\n".join(lines)
    r = ratio_table(times)
    method = r.method.iloc[0] if len(r) else ""
    if "ours / fastest peer" in r and r["ours / fastest peer"].notna().any():
        rr = r[r["ours / fastest peer"].notna()]
        met = int(rr["target met"].sum())
        worst = rr.loc[rr["ours / fastest peer"].idxmax()]
        lines.append(f"**Target** (ours ≤ {TARGET_RATIO} × the fastest peer, {method}): met at "
                     f"{met} of {plural(len(rr), 'shape')}; worst {worst.lens}: ours "
                     f"{fmt_us(worst.ours)} against {worst['fastest peer']} "
                     f"{fmt_us(worst['fastest peer us'])} ({fmt_x(worst['ours / fastest peer'])}).")
    one = times[(times.kernel.fillna("") == "") & (times.N == 1) & (times.method == method)]
    growth = []
    for label in unique_in_order(one.label):
        s = one[one.label == label].sort_values("T")
        if len(s) >= 2 and s["T"].iloc[-1] > s["T"].iloc[0]:
            f = (s.median_us.iloc[-1] / s.median_us.iloc[0]) / (s["T"].iloc[-1] / s["T"].iloc[0])
            growth.append(f"{label} {fmt_x(s.median_us.iloc[-1] / s.median_us.iloc[0])} for "
                          f"{s['T'].iloc[-1] / s['T'].iloc[0]:.0f}× the tokens "
                          f"({fmt_x(f)} of linear)")
    if growth:
        lines.append(f"**Growth** from the shortest to the longest single sequence ({method}): "
                     + "; ".join(growth) + ".")
    s = one[(one.label == "ours") & (one["T"] >= GROWTH_FROM_T)].sort_values("T")
    if len(s) >= 2 and s["T"].iloc[-1] > s["T"].iloc[0]:
        x, n = s.median_us.iloc[-1] / s.median_us.iloc[0], s["T"].iloc[-1] / s["T"].iloc[0]
        lines.append(f"**Growth target** (ours from {int(s['T'].iloc[0]):,} to "
                     f"{int(s['T'].iloc[-1]):,} tokens no faster than the tokens, "
                     f"≤ {GROWTH_SLACK:g} × linear): {fmt_x(x)} for {n:.0f}× the tokens → "
                     f"{'met' if x <= GROWTH_SLACK * n else 'missed'}.")
    split = dfs.get("split")
    if split is not None and len(split) and split.median_us.notna().any():
        items = []
        for lab, g in split.dropna(subset=["median_us"]).groupby("lens", sort=False):
            best, d = g.loc[g.median_us.idxmin()], g[g.default]
            items.append(f"{lab}: fastest at {plural(int(best.segments), 'segment')} "
                         f"({fmt_us(best.median_us)})" + (
                             f", the rule's {plural(int(d.segments.iloc[0]), 'segment')} "
                             f"{fmt_us(d.median_us.iloc[0])} "
                             f"({fmt_x(d.median_us.iloc[0] / best.median_us)} of the fastest)"
                             if len(d) and d.median_us.notna().iloc[0] else ""))
        lines.append(f"**Split cost** ({split.method.iloc[0]}): " + "; ".join(items) + ".")
    tab = gate_dependence_table(dfs.get("gates"))
    if not tab.empty:
        items = []
        for lab in unique_in_order(tab.index.get_level_values(0)):
            sub = tab.loc[lab]
            items.append(f"{lab}: " + "; ".join(
                f"{impl} " + " / ".join(
                    fmt_us(v) if np.isfinite(v) else _untimed(dfs["gates"], lab, impl, g)
                    for v, g in zip(sub.loc[impl].to_numpy(float), sub.columns))
                for impl in sub.index))
        lines.append(f"**Gate dependence** ({' / '.join(tab.columns)}): "
                     + "; ".join(items) + ".")
    roof = dfs.get("roofline")
    if roof is not None and len(roof):
        items = []
        for s in unique_in_order(roof.lens):
            x = roof[roof.lens == s]
            top = x.loc[x.measured_us.idxmax()]
            items.append(f"{s}: {top.role} {fmt_us(top.measured_us)} of "
                         f"{fmt_us(x.measured_us.sum())} (its roof "
                         f"{fmt_us(max(top.bytes_floor_us, top.flops_floor_us))}, "
                         f"{fmt_x(top.roof_ratio)} above it)")
        lines.append("**Largest kernel per shape** (kernel durations, eager): "
                     + "; ".join(items) + ".")
    return "\n\n".join(lines)
