"""Notebook 01, sections 7–8 — decode as serving engines call it, and bf16-state drift.

Engines (vLLM, SGLang) keep every request's state in one pool and pass a slot
per sequence; speculative decoding verifies several tokens per step; a bf16
state halves the bytes. Each *case* below is one way of calling decode:

- ``layout``: ``dense`` (state ``[B, HV, D, D]``, a new state returned) or
  ``pooled`` (a pool of ``2B`` slots, the batch at distinct random slots,
  updated in place);
- ``T``: tokens per sequence in one call (the state is read and written once);
- ``state_dtype``: ``float32`` or ``bfloat16``;
- ``intermediate``: the per-token states returned too (speculative rollback).

Implementations (``label``): ``ours`` (:func:`kernels.decode.gdn_decode`,
config from :func:`kernels.decode.config_for`), ``flashinfer`` (its fp32
single-token kernel, ``flashinfer_inplace``), ``flashinfer_bf16`` (its bf16-state
kernel) and ``flashinfer_mtp`` (its fp32 multi-token kernel); the FlashInfer ones
update the state in place and run on their own copy of it. Every case is gated
against :func:`kernels.reference.decode_reference` on the same inputs (with the
intermediate states when requested) and only passing ones are timed, with
``serving_method``. The floor is the state bytes the case must move (read +
write once, plus the intermediate states written) at the copy bandwidth
measured in this run.

:func:`run_drift` runs ``max(drift_steps)`` consecutive single-token steps of
ours with an fp32 and a bf16 state (in place, as an engine would) against the
float32 :func:`kernels.reference.decode_steps_reference` and reports output and
state errors after each step in ``drift_steps``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import pandas as pd

from kernels.bench.gate import PASS, UNAVAILABLE, gate_call
from kernels.bench.timing import CPU_WALL, method_available, time_each

from .common import Run, batch_axis, figure_legend, new_figure, progress, unique_in_order

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
# label -> kernels.peers name (None: ours)
SERVING_IMPLS = {"ours": None, "flashinfer": "flashinfer_inplace",
                 "flashinfer_bf16": "flashinfer_bf16_inplace",
                 "flashinfer_mtp": "flashinfer_mtp_inplace"}
SERVING_COLUMNS = ["section", "label", "impl", "layout", "T", "state_dtype", "intermediate", "B",
                   "config", "method", "median_us", "p20_us", "p80_us", "floor_us",
                   "frac_of_copy_bw", "n", "gpu"]
DRIFT_COLUMNS = ["state_dtype", "step", "what", "max_abs_err", "rel_l2_err", "gpu"]


@dataclass(frozen=True)
class Case:
    """One way of calling decode (see the module docstring)."""

    label: str
    layout: str = "dense"
    T: int = 1
    state_dtype: str = "float32"
    intermediate: bool = False

    @property
    def name(self) -> str:
        """``ours pooled T=2 bf16 +states``: the non-default fields."""
        parts = [self.label]
        if self.layout != "dense":
            parts.append(self.layout)
        if self.T != 1:
            parts.append(f"T={self.T}")
        if self.state_dtype != "float32":
            parts.append("bf16")
        if self.intermediate:
            parts.append("+states")
        return " ".join(parts)


def _dtype(name: str):
    import torch

    try:
        return getattr(torch, DTYPES[str(name)])
    except KeyError:
        raise ValueError(f"state_dtype values must be float32 or bfloat16, got {name!r}") from None


def serving_cases(params: dict) -> List[tuple]:
    """``[(section, Case)]`` for the three sections; a case may be in several."""
    dtypes = [DTYPES.get(str(d), str(d)) for d in params["state_dtype"]]
    for d in dtypes:
        _dtype(d)
    tokens = [int(t) for t in params["tokens_per_step"]]
    if any(t < 1 for t in tokens):
        raise ValueError(f"tokens_per_step must be >= 1, got {tokens}")
    fi = "flashinfer" in params["impls"]
    out = []
    for pooled in params["pooled"]:
        out.append(("pooled", Case("ours", "pooled" if pooled else "dense")))
    for T in tokens:
        for d in dtypes:
            out.append(("tokens", Case("ours", T=T, state_dtype=d)))
            if T > 1 and d == "float32":
                out.append(("tokens", Case("ours", T=T, intermediate=True)))
            if fi:
                peer = "flashinfer_mtp" if d == "float32" else "flashinfer_bf16"
                out.append(("tokens", Case(peer, T=T, state_dtype=d)))
    for d in dtypes:
        out.append(("state_dtype", Case("ours", state_dtype=d)))
        if fi:
            out.append(("state_dtype",
                        Case("flashinfer" if d == "float32" else "flashinfer_bf16",
                             state_dtype=d)))
    return out


def _case_inputs(run: Run, case: Case, B: int) -> dict:
    from kernels.spec import make_decode_inputs

    key = (B, case.layout, case.T, case.state_dtype)
    cache = run.state.setdefault("serving_inputs", {})
    if key not in cache:
        cache.clear()  # one input set alive at a time (B=512 pools are large)
        cache[key] = make_decode_inputs(
            B, run.state["shape"], seed=run.params["seed"], device=run.device, tokens=case.T,
            state_dtype=_dtype(case.state_dtype),
            pool_size=2 * B if case.layout == "pooled" else None)
    return cache[key]


def _case_fn(run: Run, case: Case, B: int):
    """``(config name, callable or None, in place?, reason it is unavailable)`` of
    ``case``: ours, or the peer's record (:mod:`kernels.registry`)."""
    from kernels.decode import config_for, gdn_decode

    peer = SERVING_IMPLS[case.label]
    if peer is None:
        cfg = config_for(B).fit(run.params["head_dim"])
        return cfg.name, functools.partial(gdn_decode, config=cfg,
                                           intermediate_states=case.intermediate), \
            case.layout == "pooled", ""
    peers = run.state.setdefault("serving_peers", {})
    if peer not in peers:
        from kernels import registry

        peers[peer] = registry.peers([peer], "decode")[0]
    return "default", peers[peer].fn, True, peers[peer].reason


def case_floor_us(case: Case, B: int, shape, bw: float) -> float:
    """State bytes the case moves (read + written once, plus the intermediate
    states written) at copy bandwidth ``bw``, in µs."""
    from kernels.spec import decode_state_bytes

    if not np.isfinite(bw) or bw <= 0:
        return float("nan")
    nbytes = decode_state_bytes(B, shape, _dtype(case.state_dtype))
    if case.intermediate:
        nbytes += nbytes // 2 * case.T
    return nbytes / bw * 1e6


def run_serving(run: Run, copy_bw: float) -> Dict[str, pd.DataFrame]:
    """Gate every case at every B, time the passing ones with ``serving_method``.

    Returns ``{"gate": serving_gate, "times": serving_times}`` (both written as CSV;
    a case's rows appear once per section it belongs to).
    """
    from kernels.reference import decode_reference

    p = run.params
    shape = run.state["shape"]
    method = p["serving_method"]
    ok, why = method_available(method, run.device)
    if not ok:
        run.skip(f"serving timing with {method}", why)
    sections = serving_cases(p)
    cases = unique_in_order(c for _, c in sections)
    gate_rows, time_rows = [], []
    for B in progress(p["batch_sizes"], f"serving: gate + timing of {len(cases)} cases per B "
                      f"({method})", "B"):
        for case in sorted(cases, key=lambda c: (c.layout, c.T, c.state_dtype)):
            inputs = _case_inputs(run, case, B)
            cname, fn, inplace, reason = _case_fn(run, case, B)
            base = dict(label=case.label, impl=case.label.split("_")[0], case=case.name,
                        layout=case.layout, T=case.T, state_dtype=case.state_dtype,
                        intermediate=case.intermediate, B=B, config=cname, gpu=run.gpu)
            if not fn:
                gate_rows.append(dict(base, status=UNAVAILABLE, ok=False, reason=reason))
                continue
            ref = decode_reference(**inputs, intermediate_states=case.intermediate)
            # in-place implementations run on their own copy of the state
            own = dict(inputs, state=inputs["state"].clone()) if inplace else inputs
            row = gate_call(fn, own, ref, run.device)
            if inplace and row["status"] == PASS:
                row["reason"] = "updates the state in place by design (its own copy)"
            gate_rows.append(dict(base, **row))
            del ref
            if row["status"] != PASS:
                print(f"SERVING GATE {row['status'].upper()}: {case.name} B={B}: {row['reason']}")
                continue
            if not ok:
                continue
            fl = case_floor_us(case, B, shape, copy_bw)
            timings = time_each(lambda: fn(**own), [method], rep=p["repetitions"],
                                warmup=p["warmup"])
            for t in run.timed_rows(timings, f"serving {case.name} B={B}", dict(
                    label=case.label, impl=base["impl"], layout=case.layout, T=case.T,
                    state_dtype=case.state_dtype, intermediate=case.intermediate, B=B,
                    config=cname, floor_us=fl, gpu=run.gpu)):
                time_rows += [dict(t, section=section) for section, c in sections if c == case]
    run.state.pop("serving_inputs", None)
    gate = pd.DataFrame(gate_rows)
    times = pd.DataFrame(time_rows, columns=SERVING_COLUMNS)
    times["frac_of_copy_bw"] = times.floor_us / times.median_us
    for label, g in gate[gate.status == UNAVAILABLE].groupby("label") if len(gate) else []:
        run.skip(f"serving {label} (all B)", str(g.reason.iloc[0]))
    run.write_csv(gate, "serving_gate")
    if len(times):
        run.write_csv(times, "serving_times")
    return dict(gate=gate, times=times)


def serving_gate_summary(gate: pd.DataFrame) -> pd.DataFrame:
    """One row per case, one column per B: the gate status."""
    if gate is None or gate.empty:
        return pd.DataFrame()
    return gate.pivot_table(index="case", columns="B", values="status", aggfunc="first",
                            sort=False)


def _case_name_of(r) -> str:
    return Case(r.label, r.layout, int(r.T), r.state_dtype, bool(r.intermediate)).name


def serving_table(times: pd.DataFrame, section: str) -> pd.DataFrame:
    """Median µs of one section: one row per B, one column per case (plus the floors)."""
    t = times[times.section == section] if len(times) else times
    if t.empty:
        return pd.DataFrame()
    t = t.assign(case=[_case_name_of(r) for r in t.itertuples()])
    out = t.pivot_table(index="B", columns="case", values="median_us", sort=False)
    return out[unique_in_order(t.case)]


# --------------------------------------------------------------------------- figures


def timing_title(times: pd.DataFrame) -> str:
    """``"<gpu>, timing: <method> (median, p20–p80)"``, noting what cpu_wall is."""
    gpu = str(times.gpu.iloc[0]) if len(times) else ""
    method = str(times.method.iloc[0]) if len(times) else ""
    note = " (cpu_wall: interpreter wall time, plumbing only)" if method == CPU_WALL else ""
    return f"{gpu}, timing: {method} (median, p20–p80){note}"


def _ratio_axis(ax, values) -> None:
    """Linear y around 1 when the ratios span less than 4x, else log2."""
    v = np.asarray(list(values), dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return
    lo, hi = min(v.min(), 1.0), max(v.max(), 1.0)
    if hi / lo > 4:
        ax.set_yscale("log", base=2)
    else:
        pad = 0.08 * (hi - lo) + 0.02
        ax.set_ylim(lo - pad, hi + pad)
    ax.axhline(1.0, color="k", lw=0.8)


def _line(ax, s: pd.DataFrame, label: str, **kw):
    s = s.sort_values("B")
    line, = ax.plot(s.B, s.median_us, marker="o", ms=3, label=label, **kw)
    ax.fill_between(s.B, s.p20_us, s.p80_us, color=line.get_color(), alpha=0.15)
    return line


def _floors(ax, t: pd.DataFrame, by: str = None) -> None:
    groups = [(None, t)] if by is None else list(t.groupby(by, sort=False))
    for key, g in groups:
        f = g.drop_duplicates("B").sort_values("B")
        if f.floor_us.notna().any():
            ax.plot(f.B, f.floor_us, "k--" if key in (None, "float32") else "k:", lw=1,
                    label="copy-bandwidth floor" + (f" ({key})" if key is not None else ""))


def _ratio_lines(ax, t: pd.DataFrame, num: dict, den: dict, label: str) -> list:
    def sel(d):
        m = np.ones(len(t), dtype=bool)
        for k, v in d.items():
            m &= (t[k] == v).to_numpy()
        return t[m].set_index("B").median_us

    r = (sel(num) / sel(den)).dropna().sort_index()
    if len(r):
        ax.plot(r.index, r.values, marker="o", ms=3, label=label)
    return list(r.values)


def plot_serving_pooled(times: pd.DataFrame):
    """Dense vs pooled state (ours, T=1, fp32): time vs B, and pooled / dense."""
    t = times[times.section == "pooled"] if len(times) else times
    if t.empty:
        return None
    fig, axes = new_figure(1, 2, panel=(5.4, 3.8))
    ax, ar = axes[0]
    for layout in unique_in_order(t.layout):
        _line(ax, t[t.layout == layout], f"ours, {layout} state")
    _floors(ax, t)
    batch_axis(ax, sorted(t.B.unique()))
    ax.set_yscale("log")
    ax.set_ylabel("time per call (µs)")
    ax.set_title("time vs B (T=1, fp32 state)", fontsize=9)
    ax.legend(fontsize=7)
    vals = _ratio_lines(ar, t, dict(layout="pooled"), dict(layout="dense"), "pooled / dense")
    batch_axis(ar, sorted(t.B.unique()))
    _ratio_axis(ar, vals)
    ar.set_ylabel("pooled time / dense time")
    ar.set_title("cost of the pool (slots at random, pool of 2B)", fontsize=9)
    if vals:
        ar.legend(fontsize=7)
    fig.suptitle(f"GDN decode: state pool vs dense state — {timing_title(t)}")
    return fig


def plot_serving_tokens(times: pd.DataFrame):
    """T tokens per call: ours' time vs B per T (with/without intermediate states),
    time(T) / time(T=1) for every implementation, and FlashInfer MTP / ours."""
    t = times[times.section == "tokens"] if len(times) else times
    if t.empty:
        return None
    peers = t.label.isin(["flashinfer_mtp", "flashinfer_bf16"]).any()
    fig, axes = new_figure(1, 3 if peers else 2, panel=(5.0, 4.6))
    ax, ar, ap = (list(axes[0]) + [None])[:3]
    Bs = sorted(t.B.unique())
    ours = t[(t.label == "ours") & (t.state_dtype == "float32")]
    colors = {}   # (T, intermediate) -> the colour of ours at that T in both panels
    for T in sorted(ours["T"].unique()):
        line = _line(ax, ours[(ours["T"] == T) & ~ours.intermediate], f"ours T={T}")
        colors[(T, False)] = colors[(T, True)] = line.get_color()
        inter = ours[(ours["T"] == T) & ours.intermediate]
        if len(inter):
            _line(ax, inter, f"ours T={T} +states", ls="--", color=line.get_color())
    _floors(ax, ours[~ours.intermediate])
    batch_axis(ax, Bs)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (µs)")
    ax.set_title("ours, fp32 state: time vs B per T\n(dashed: +intermediate states)", fontsize=9)
    _legend_below(ax)
    vals = []
    Ts = sorted(t["T"].unique())
    for (label, dtype, inter), g in t.groupby(["label", "state_dtype", "intermediate"], sort=False):
        for T in Ts:
            if T == 1:
                continue
            base = t[(t.label == label) & (t.state_dtype == dtype) & (t["T"] == 1)
                     & ~t.intermediate]
            num = g[g["T"] == T].set_index("B").median_us
            r = (num / base.set_index("B").median_us).dropna().sort_index()
            if len(r):
                name = Case(label, "dense", T, dtype, bool(inter)).name
                key = (T, bool(inter)) if label == "ours" and dtype == "float32" else name
                if key not in colors:   # a series of the right panel only: the next colour
                    colors[key] = f"C{len(set(colors.values())) % 10}"
                ar.plot(r.index, r.values, marker="o", ms=3, label=name,
                        ls="--" if inter else "-", color=colors[key])
                vals += list(r.values)
    batch_axis(ar, Bs)
    _ratio_axis(ar, vals)
    ar.set_ylabel("time(T tokens, one call) / time(T=1)")
    ar.set_title("what the extra tokens cost (state read once)", fontsize=9)
    if vals:
        _legend_below(ar)
    fig.suptitle(f"GDN decode: T tokens per sequence in one call — {timing_title(t)}"
                 + ("" if peers else "\n(no FlashInfer multi-token timings in this run: "
                    "no panel against them)"))
    if ap is None:
        return fig
    pvals = []
    for T in Ts:
        for dtype, peer in (("float32", "flashinfer_mtp"), ("bfloat16", "flashinfer_bf16")):
            pvals += _ratio_lines(ap, t, {"label": peer, "T": T, "state_dtype": dtype},
                                  {"label": "ours", "T": T, "state_dtype": dtype,
                                   "intermediate": False},
                                  f"{peer} / ours, T={T}")
    batch_axis(ap, Bs)
    _ratio_axis(ap, pvals)
    _legend_below(ap)
    ap.set_ylabel("FlashInfer time / our time (>1: ours faster)")
    ap.set_title("vs FlashInfer's multi-token kernels", fontsize=9)
    return fig


def _legend_below(ax) -> None:
    """The panel's legend under its x axis: a dozen entries covered the curves inside."""
    ax.legend(fontsize=6, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))


def plot_serving_state_dtype(times: pd.DataFrame):
    """fp32 vs bf16 state (T=1, dense): time vs B with both floors; fp32 / bf16
    for ours, and FlashInfer / ours per state dtype."""
    t = times[times.section == "state_dtype"] if len(times) else times
    if t.empty:
        return None
    fig, axes = new_figure(1, 2, panel=(5.4, 3.8))
    ax, ar = axes[0]
    for (label, dtype), g in t.groupby(["label", "state_dtype"], sort=False):
        _line(ax, g, f"{label}, {dtype} state")
    _floors(ax, t, by="state_dtype")
    Bs = sorted(t.B.unique())
    batch_axis(ax, Bs)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (µs)")
    ax.set_title("time vs B (T=1, dense state)", fontsize=9)
    ax.legend(fontsize=7)
    vals = _ratio_lines(ar, t, dict(label="ours", state_dtype="float32"),
                        dict(label="ours", state_dtype="bfloat16"), "ours: fp32 / bf16 state")
    for dtype, peer in (("float32", "flashinfer"), ("bfloat16", "flashinfer_bf16")):
        vals += _ratio_lines(ar, t, dict(label=peer, state_dtype=dtype),
                             dict(label="ours", state_dtype=dtype), f"{peer} / ours ({dtype})")
    batch_axis(ar, Bs)
    _ratio_axis(ar, vals)
    ar.set_ylabel("time ratio (>1: the denominator is faster)")
    ar.set_title("bf16 state speedup, and FlashInfer vs ours", fontsize=9)
    if vals:
        ar.legend(fontsize=7)
    fig.suptitle(f"GDN decode: fp32 vs bf16 state — {timing_title(t)}")
    return fig


# --------------------------------------------------------------------------- drift


def run_drift(run: Run) -> pd.DataFrame:
    """Output and state error of ours (fp32 and bf16 state, one token per call,
    in place) against the float32 multi-step reference after each step of
    ``drift_steps`` (``drift.csv``): ``what`` is ``output`` (that step's output)
    or ``state`` (the state after it)."""
    from kernels.checks import check_close
    from kernels.decode import gdn_decode
    from kernels.reference import decode_steps_reference
    from kernels.spec import make_decode_inputs

    p = run.params
    steps = sorted({int(s) for s in p["drift_steps"]})
    if not steps or steps[0] < 1:
        raise ValueError(f"drift_steps must be >= 1, got {p['drift_steps']}")
    N, B = steps[-1], int(p["drift_batch"])
    shape = run.state["shape"]
    base = make_decode_inputs(B, shape, seed=p["seed"], device=run.device, tokens=N)
    ref_out, _, ref_states = decode_steps_reference(**base, record_steps=steps)
    rows = []
    for dname in unique_in_order(DTYPES.get(str(d), str(d)) for d in p["state_dtype"]):
        dtype = _dtype(dname)
        state = base["state"].to(dtype, copy=True)  # the same start, rounded once for bf16
        for t in progress(range(N), f"drift: {dname} state, steps vs the f32 reference", "step"):
            step = {n: (x[:, t:t + 1].contiguous() if n in ("q", "k", "v", "a", "b") else x)
                    for n, x in base.items() if n != "state"}
            out, _ = gdn_decode(**step, state=state, inplace=True)
            if t + 1 in ref_states:
                for what, got, want in (("output", out[:, 0].float(), ref_out[:, t]),
                                        ("state", state.float(), ref_states[t + 1])):
                    r = check_close(got, want, name=what)
                    rows.append(dict(state_dtype=dname, step=t + 1, what=what,
                                     max_abs_err=r.max_abs_err, rel_l2_err=r.rel_l2_err,
                                     gpu=run.gpu))
    drift = pd.DataFrame(rows, columns=DRIFT_COLUMNS)
    run.write_csv(drift, "drift")
    return drift


def drift_table(drift: pd.DataFrame) -> pd.DataFrame:
    """Rows: state dtype × output/state; columns: max abs / rel-L2 error per step."""
    if drift is None or drift.empty:
        return pd.DataFrame()
    return drift.pivot_table(index=["state_dtype", "what"], columns="step",
                             values=["max_abs_err", "rel_l2_err"], sort=False)


def plot_drift(drift: pd.DataFrame):
    """Relative-L2 and max-abs error vs consecutive steps, output and state, per
    state dtype (log-log)."""
    if drift is None or drift.empty:
        return None
    fig, axes = new_figure(1, 2, panel=(5.2, 3.8))
    for ax, col, ylabel in ((axes[0][0], "rel_l2_err", "relative L2 error vs f32 reference"),
                            (axes[0][1], "max_abs_err", "max abs error vs f32 reference")):
        for (dtype, what), g in drift.groupby(["state_dtype", "what"], sort=False):
            g = g.sort_values("step")
            ax.plot(g.step, g[col].clip(lower=1e-12), marker="o", ms=4,
                    ls="-" if what == "output" else "--", label=f"{dtype} state: {what}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted(drift.step.unique()), [str(s) for s in sorted(drift.step.unique())])
        ax.minorticks_off()
        ax.set_xlabel("consecutive decode steps (one token per call)")
        ax.set_ylabel(ylabel)
    figure_legend(fig, axes)   # outside: in a panel it covered the state's points
    ax = axes[0][1]
    ax.axhline(1e-2, color="k", lw=0.8, ls=":")
    ax.text(0.02, 1e-2, "contest atol 1e-2", transform=ax.get_yaxis_transform(), fontsize=7,
            va="bottom")
    gpu = str(drift.gpu.iloc[0]) if len(drift) else ""
    fig.suptitle(f"GDN decode: drift of ours (fp32 vs bf16 state) against the float32 "
                 f"reference — {gpu} (errors, not timings)")
    return fig


# --------------------------------------------------------------------------- conclusion


def _at(t: pd.DataFrame, B: int, **sel) -> float:
    m = t.B == B
    for k, v in sel.items():
        m &= t[k] == v
    s = t[m].median_us
    return float(s.iloc[0]) if len(s) else float("nan")


def serving_markdown(times: pd.DataFrame, gate: pd.DataFrame, drift: pd.DataFrame) -> str:
    """The serving and drift paragraphs of the conclusion, from the tables."""
    lines = []
    if gate is not None and len(gate):
        ran = gate[gate.status != UNAVAILABLE]
        bad = ran[ran.status != PASS]
        unav = unique_in_order(gate[gate.status == UNAVAILABLE].label)
        txt = (f"**Serving gate:** {ran.case.nunique()} cases at B ∈ "
               f"{sorted(int(b) for b in gate.B.unique())}; ")
        txt += ("all passed." if bad.empty else "failing (not timed): " + "; ".join(
            f"{r.case} B={r.B} ({r.status}: {r.reason})"
            for r in bad.drop_duplicates("case").itertuples()) + ".")
        if unav:
            txt += " Not available here: " + "; ".join(
                f"{u} ({str(gate[gate.label == u].reason.iloc[0])[:160]})" for u in unav) + "."
        lines.append(txt)
    if times is not None and len(times):
        Bs = sorted(int(b) for b in times.B.unique())
        pick = unique_in_order([Bs[0], *(b for b in (64, 512) if b in Bs), Bs[-1]])
        method = str(times.method.iloc[0])
        items = []
        pt = times[times.section == "pooled"]
        for B in pick:
            d, q = _at(pt, B, layout="dense"), _at(pt, B, layout="pooled")
            if np.isfinite(d) and np.isfinite(q):
                items.append(f"pooled / dense at B={B}: {q / d:.3f} ({q:.3g} vs {d:.3g} µs)")
        tt = times[(times.section == "tokens") & (times.label == "ours")
                   & (times.state_dtype == "float32")]
        Tmax = int(tt["T"].max()) if len(tt) else 1
        for B in pick:
            one = _at(tt, B, T=1, intermediate=False)
            many = _at(tt, B, T=Tmax, intermediate=False)
            if Tmax > 1 and np.isfinite(one) and np.isfinite(many):
                items.append(f"T={Tmax} in one call / one T=1 call at B={B}: {many / one:.2f}")
        st = times[times.section == "state_dtype"]
        for B in pick:
            f32 = _at(st, B, label="ours", state_dtype="float32")
            b16 = _at(st, B, label="ours", state_dtype="bfloat16")
            fib = _at(st, B, label="flashinfer_bf16", state_dtype="bfloat16")
            if np.isfinite(f32) and np.isfinite(b16):
                items.append(f"bf16 state speedup at B={B}: {f32 / b16:.2f}×"
                             + (f"; ours / FlashInfer bf16: {b16 / fib:.2f}"
                                if np.isfinite(fib) else ""))
        if method == "cupti_cold" and len(st[st.label == "flashinfer_bf16"]):
            items.append("FlashInfer's bf16-state call is two launches with its host path "
                         "between them, and a cupti_cold span includes that gap: its GPU work "
                         "is far less than the span (docs/notes/decode.md, decode serving on the "
                         "H100); compare it with graph replay")
        if items:
            lines.append(f"**Serving ({method}):**\n" + "\n".join(f"- {i}" for i in items))
    if drift is not None and len(drift):
        last = int(drift.step.max())
        parts = []
        for (dtype, what), g in drift.groupby(["state_dtype", "what"], sort=False):
            r = g[g.step == last].iloc[0]
            parts.append(f"{dtype} {what}: rel-L2 {r.rel_l2_err:.2e}, max abs {r.max_abs_err:.2e}")
        lines.append(f"**Drift after {last} consecutive steps** (vs the float32 reference): "
                     + "; ".join(parts) + ".")
    return "\n\n".join(lines)
