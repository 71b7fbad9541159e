"""Notebook 03 — what Nsight Compute says about instructions and DRAM bytes.

The seed's NCU run at B=64 (B200): FLA's recurrent decode kernel executed
2.2× the instructions of FlashInfer's (13.4 M vs 6 M) because BV=8 cuts each
head into 16 V-tiles and every tile's program reloads q, k and the gates.
This module measures, at one batch size:

1. :func:`run_profiles` — ``kernels.bench.ncu.run_ncu`` per target
   (FLA, FlashInfer, our chosen config, our BV sweep) → the tidy
   ``ncu_metrics.csv`` (``impl, config, B, kernel, metric, value`` + ``label,
   unit, source``) and each target's raw ncu CSV. Without ncu or a GPU it
   falls back to the committed fixtures ``tests/fixtures/ncu_*.csv`` (parsed
   with the same parser, labelled ``source = fixture:<file>``) and says so.
2. :func:`impl_totals` / :func:`per_state_byte` — per target, metrics summed
   over its kernels; executed instructions and DRAM bytes per state byte.
3. :func:`fit_vtile_model` — our BV sweep against the model "redundant
   q/k/gate work grows with the number of V-tiles":
   ``inst = a + b · n_vtiles`` with ``n_vtiles = D / (BV · V_TILES)``
   programs per (sequence, head); :func:`plot_bv_sweep` draws prediction
   beside measurement.
4. :func:`conclusion_markdown` — instruction ratios FLA/FlashInfer and
   ours/FlashInfer, and what the DRAM bytes say about bandwidth.
"""
from __future__ import annotations

import glob
import math
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from kernels.bench.gate import short_reason
from kernels.peers import default_peers

from .common import (COMMON_PARAMS, Param, Run, collect_params as _collect, fmt_x, new_figure,
                     progress, start_run, unique_in_order)

STEM = "03_ncu_instruction_counts"
INST = "smsp__inst_executed.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
SEED_INST = {"fla": 13.4e6, "flashinfer": 6.0e6}  # seed, B200, B=64
SEED_RATIO = 2.2
REPO = Path(__file__).resolve().parents[2]

PARAMS = COMMON_PARAMS + (
    Param("B", "int", 64, "decode batch size profiled"),
    Param("impls", "list", [*default_peers("decode", STEM), "ours"],
          "targets: fla, flashinfer, ours (our chosen config), solution:<path> (a flashinfer-bench "
          "solution, profiled in ncu's own process; docs/solutions.md)"),
    Param("solutions", "list", [],
          "more solution paths (the make variable SOLUTIONS); those with a decode definition are profiled"),
    Param("ours_config", "str", "auto", "our config: a name like BV32-w4-s1-t1, or auto for config_for(B)"),
    Param("bv_sweep", "list", [8, 16, 32, 64, 128], "BV values of our sweep (one V-tile per program)"),
    Param("bv_sweep_num_warps", "int", 4, "num_warps of every BV sweep config"),
    Param("metrics", "list", ["gpu__time_duration.sum", INST, DRAM_READ, DRAM_WRITE,
                              "lts__t_sector_hit_rate.pct", "launch__grid_size",
                              "launch__block_size", "launch__waves_per_multiprocessor",
                              "launch__registers_per_thread"],
          "ncu metrics (kernels.bench.ncu.DEFAULT_METRICS; the analysis needs the instruction and DRAM ones)"),
    Param("fixture_glob", "str", "tests/fixtures/ncu_*.csv",
          "raw ncu CSVs parsed instead when ncu or a GPU is missing (relative to the repo)"),
    Param("seed", "int", 0, "seed of the inputs"),
    Param("head_dim", "int", 128, "D of the profiled contest shape (for n_vtiles)"),
    Param("num_v_heads", "int", 8, "HV of the profiled contest shape (for state bytes)"),
)

METRIC_COLUMNS = ["impl", "config", "B", "kernel", "metric", "value", "unit", "label", "source"]


def collect_params(namespace: dict) -> dict:
    """This notebook's parameters from ``namespace`` (the notebook's ``globals()``)."""
    return _collect(namespace, PARAMS, STEM)


def start(params: dict) -> Run:
    return start_run(STEM, params)


# --------------------------------------------------------------------------- targets


def sweep_config_name(bv: int, num_warps: int) -> str:
    return f"BV{int(bv)}-w{int(num_warps)}-s1-t1"


def targets(params: dict) -> List[dict]:
    """The profiled targets: ``label, impl, config`` and the ``target`` dict
    for :func:`kernels.bench.ncu.run_ncu`."""
    from kernels.contest.formats import SOLUTION_PREFIX, SolutionError, read_solution
    from kernels.registry import is_solution, solution_entries

    B = params["B"]
    out = []
    explicit, added = solution_entries(params)
    sols = explicit + [SOLUTION_PREFIX + e for e in added]
    for impl in [e for e in params["impls"] if not is_solution(e)] + sols:
        if is_solution(impl):
            try:
                src = read_solution(impl)
            except SolutionError as e:
                print(f"ncu target {impl}: {e}")
                continue
            if src.op != "decode":
                print(f"ncu target {impl}: a {src.op} solution; this notebook profiles decode")
                continue
            path = SOLUTION_PREFIX + str(Path(impl[len(SOLUTION_PREFIX):]).resolve())
            out.append(dict(label=src.name, impl="solution", config="default",
                            target=dict(impl=path, op="decode", B=B, seed=params["seed"])))
        elif impl == "ours":
            cfg = params["ours_config"]
            if cfg in ("auto", "", None):
                from kernels.decode import config_for

                cfg = config_for(B).name
            out.append(dict(label="ours", impl="ours", config=cfg,
                            target=dict(impl="ours", op="decode", B=B, config=cfg,
                                        seed=params["seed"])))
        elif impl == "flashinfer":  # the kernel alone, without the adapter's state copy
            out.append(dict(label=impl, impl=impl, config="inplace",
                            target=dict(impl="flashinfer_inplace", op="decode", B=B,
                                        seed=params["seed"])))
        else:
            out.append(dict(label=impl, impl=impl, config="default",
                            target=dict(impl=impl, op="decode", B=B, seed=params["seed"])))
    for bv in params["bv_sweep"]:
        cfg = sweep_config_name(bv, params["bv_sweep_num_warps"])
        out.append(dict(label=f"ours-sweep-{cfg}", impl="ours", config=cfg,
                        target=dict(impl="ours", op="decode", B=B, config=cfg,
                                    seed=params["seed"])))
    return out


# --------------------------------------------------------------------------- profiling


def _col(df: pd.DataFrame, *names) -> Optional[str]:
    low = {c.lower().replace(" ", "_"): c for c in df.columns}
    for n in names:
        if n in low:
            return low[n]
    return None


def tidy(raw: pd.DataFrame, *, impl: str, config: str, B: int, label: str,
         source: str) -> pd.DataFrame:
    """:func:`kernels.bench.ncu.parse_ncu_csv` output → the tidy metric rows."""
    k = _col(raw, "kernel", "kernel_name", "name")
    m = _col(raw, "metric", "metric_name")
    v = _col(raw, "value", "metric_value")
    u = _col(raw, "unit", "metric_unit")
    if not (k and m and v):
        raise ValueError(f"unexpected ncu frame columns {list(raw.columns)}")
    vals = pd.to_numeric(raw[v].astype(str).str.replace(",", ""), errors="coerce")
    out = pd.DataFrame(dict(impl=impl, config=config, B=int(B), kernel=raw[k].astype(str),
                            metric=raw[m].astype(str), value=vals,
                            unit=raw[u].astype(str) if u else "", label=label, source=source))
    return out[METRIC_COLUMNS]


def ncu_ready(run: Run) -> Tuple[bool, str]:
    if not run.on_gpu:
        return False, f"Nsight Compute needs a CUDA GPU (device is {run.device})"
    try:
        from kernels.bench.ncu import ncu_available
    except Exception as e:
        return False, f"kernels.bench.ncu unavailable: {short_reason(e)}"
    ok, why = ncu_available()
    return bool(ok), why


def run_profiles(run: Run) -> pd.DataFrame:
    """Profile every target with ncu (or parse the fixtures; see the module
    docstring) → ``ncu_metrics.csv``; raw CSVs under ``raw/``."""
    p = run.params
    ok, why = ncu_ready(run)
    if not ok:
        run.skip("ncu profiling", why)
        return load_fixtures(run)
    from kernels.bench.ncu import run_ncu

    raw_dir = run.path("raw")
    raw_dir.mkdir(exist_ok=True)
    frames = []
    for t in progress(targets(p), "Nsight Compute: counters per target", "target"):
        out_csv = raw_dir / f"ncu_{re.sub(r'[^A-Za-z0-9_.+-]', '_', t['label'])}.csv"
        try:
            raw = run_ncu(t["target"], metrics=list(p["metrics"]), out_csv=out_csv)
        except Exception as e:
            run.skip(f"ncu {t['label']}", short_reason(e))
            continue
        if raw is None or len(raw) == 0:
            run.skip(f"ncu {t['label']}", "ncu reported no kernels for this target")
            continue
        frames.append(tidy(raw, impl=t["impl"], config=t["config"], B=p["B"], label=t["label"],
                           source="ncu"))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=METRIC_COLUMNS)
    _write(run, df)
    return df


_RECORDED_RE = re.compile(r"^ncu_decode_(?P<impl>[a-z_]+?)_B(?P<B>\d+)(?:_(?P<slug>.+))?\.csv$")
_OWN_RE = re.compile(r"^ncu_(?P<label>fla|flashinfer|torch|ours(?:-.+?)?)(?:_B(?P<B>\d+))?\.csv$")
# kernel-name fragments -> the implementation that launches them
_KERNEL_IMPL = (("fused_recurrent_gated_delta_rule", "fla"), ("gdn_decode_kernel", "ours"),
                ("gdn_decode", "flashinfer"), ("flashinfer", "flashinfer"))


def _from_label(label: str, B: int) -> dict:
    if label.startswith("ours"):
        rest = label.split("-", 1)[1] if "-" in label else "table"
        if rest.startswith("sweep-"):
            return dict(label=label, impl="ours", config=rest[len("sweep-"):], B=B)
        return dict(label="ours", impl="ours", config=rest, B=B)
    if label == "flashinfer_inplace":
        return dict(label="flashinfer", impl="flashinfer", config="inplace", B=B)
    if label == "flashinfer":  # the adapter that copies the state first
        return dict(label="flashinfer+copy", impl="flashinfer", config="default", B=B)
    return dict(label=label, impl=label, config="default", B=B)


def fixture_target(path, default_B: int, kernels: Sequence[str] = ()) -> dict:
    """``label, impl, config, B`` of a raw ncu CSV from its file name.

    Names understood: ``ncu_decode_<impl>_B<B>_<gpu-slug>.csv``
    (:mod:`kernels.bench.record_fixtures`: impl ``ours`` (config from the GPU's
    table), ``fla``, ``flashinfer_inplace``, ``flashinfer``) and this module's
    own ``ncu_<label>[_B<B>].csv`` (``fla``, ``flashinfer``, ``ours-<config>``,
    ``ours-sweep-<config>``). Any other name: the implementation is recognised
    from the profiled ``kernels``' names, ``B`` is ``default_B``.
    """
    name = Path(path).name
    m = _RECORDED_RE.match(name)
    if m:
        return _from_label(m.group("impl"), int(m.group("B")))
    m = _OWN_RE.match(name)
    if m:
        return _from_label(m.group("label"), int(m.group("B")) if m.group("B") else default_B)
    for frag, impl in _KERNEL_IMPL:
        if any(frag in str(k) for k in kernels):
            return _from_label(impl, default_B)
    return dict(label=Path(path).stem, impl="unknown", config="default", B=default_B)


def load_fixtures(run: Run) -> pd.DataFrame:
    """Parse the fixture CSVs with :func:`kernels.bench.ncu.parse_ncu_csv`.

    One file per target (label and B): when several files map to the same
    one, a GPU recording (``ncu_decode_<impl>_B<B>_<gpu>.csv``) wins over a
    synthetic file, and the others are reported as skipped.
    """
    from kernels.bench.ncu import parse_ncu_csv

    pat = run.params["fixture_glob"]
    files = sorted(glob.glob(pat if Path(pat).is_absolute() else str(REPO / pat)))
    if not files:
        run.skip("ncu fixtures", f"no files match {pat}")
        return pd.DataFrame(columns=METRIC_COLUMNS)
    parsed = []
    for f in files:
        raw = parse_ncu_csv(Path(f).read_text())
        t = fixture_target(Path(f), run.params["B"], list(raw.get("kernel", [])))
        recorded = bool(_RECORDED_RE.match(Path(f).name))
        parsed.append((not recorded, Path(f), raw, t))
    chosen = {}
    for rank, f, raw, t in sorted(parsed, key=lambda x: (x[0], x[1].name)):
        key = (t["label"], t["B"])
        if key in chosen:
            run.skip(f"fixture {f.name}", f"{t['label']} at B={t['B']} already comes from "
                                         f"{chosen[key][0].name}")
            continue
        chosen[key] = (f, raw, t)
    print(f"NOT A MEASUREMENT: parsing {len(chosen)} committed fixture file(s) instead; "
          f"the numbers below are the fixture's, not this machine's:")
    frames = []
    (run.path("raw")).mkdir(exist_ok=True)
    for f, raw, t in chosen.values():
        print(f"  {f.name}: {t['label']} ({t['config']}), B={t['B']}, "
              f"{raw['kernel'].nunique() if 'kernel' in raw else 0} kernel(s)")
        frames.append(tidy(raw, impl=t["impl"], config=t["config"], B=t["B"], label=t["label"],
                           source=f"fixture:{f.name}"))
        (run.path("raw") / f.name).write_text(f.read_text())
    df = pd.concat(frames, ignore_index=True)
    run.extra_provenance["ncu_source"] = "fixtures: " + ", ".join(f.name for f, _, _ in
                                                                    chosen.values())
    _write(run, df)
    return df


def _write(run: Run, df: pd.DataFrame) -> None:
    if len(df):
        run.write_csv(df, "ncu_metrics")
    else:
        print("no ncu metrics: ncu_metrics.csv not written")


# --------------------------------------------------------------------------- analysis


def _aggregate(metric: str, values: pd.Series) -> float:
    """Sum counts/bytes/durations over a target's kernels; max for per-launch
    attributes (registers, grid size, percentages)."""
    if metric.endswith(".sum") or "bytes" in metric or "inst" in metric:
        return float(values.sum())
    return float(values.max())


def impl_totals(df: pd.DataFrame) -> pd.DataFrame:
    """One row per target (``label``), one column per metric, plus ``kernels``
    (the number of kernel launches profiled)."""
    if df.empty:
        return pd.DataFrame()
    rows = []
    for (label, impl, config, B), g in df.groupby(["label", "impl", "config", "B"], sort=False):
        r = dict(label=label, impl=impl, config=config, B=B,
                 kernels=int(g.groupby("metric").size().max()),
                 kernel="; ".join(unique_in_order(g.kernel))[:120],
                 source=str(g.source.iloc[0]) if "source" in g else "")
        for metric, gm in g.groupby("metric", sort=False):
            r[metric] = _aggregate(metric, gm.value)
        rows.append(r)
    return pd.DataFrame(rows)


def state_bytes(B: int, num_v_heads: int = 8, head_dim: int = 128) -> int:
    """fp32 state bytes read + written by one decode step."""
    return 2 * int(B) * num_v_heads * head_dim * head_dim * 4


def per_state_byte(totals: pd.DataFrame, num_v_heads: int = 8, head_dim: int = 128) -> pd.DataFrame:
    """Executed instructions and DRAM bytes per state byte.

    ``state_bytes`` counts the state read + written (:func:`state_bytes`);
    ``dram_per_state_byte`` = DRAM (read + write) / that, and separately
    ``dram_read_per_state`` / ``dram_write_per_state`` against one copy of
    the state. ncu counts DRAM traffic during the kernel: written lines still
    in L2 when it ends are not counted, so the write ratio can be below 1.
    """
    t = totals.copy()
    sb = t.B.map(lambda b: state_bytes(b, num_v_heads, head_dim))
    t["state_bytes"] = sb
    t["inst_per_state_byte"] = t[INST] / sb if INST in t else np.nan
    if DRAM_READ in t and DRAM_WRITE in t:
        t["dram_bytes"] = t[DRAM_READ] + t[DRAM_WRITE]
        t["dram_per_state_byte"] = t.dram_bytes / sb
        t["dram_read_per_state"] = t[DRAM_READ] / (sb / 2)
        t["dram_write_per_state"] = t[DRAM_WRITE] / (sb / 2)
    else:
        for c in ("dram_bytes", "dram_per_state_byte", "dram_read_per_state",
                  "dram_write_per_state"):
            t[c] = np.nan
    return t


def n_vtiles(config: str, head_dim: int = 128) -> int:
    """Programs per (sequence, head) of a config name: ``D / (BV · V_TILES)``."""
    m = re.match(r"BV(\d+)-w\d+-s\d+-t(\d+)", str(config))
    if not m:
        raise ValueError(f"not a decode config name: {config!r}")
    return max(1, head_dim // (int(m.group(1)) * int(m.group(2))))


def fit_vtile_model(sweep: pd.DataFrame, head_dim: int = 128) -> dict:
    """Least-squares fit ``inst = a + b · n_vtiles`` over the BV sweep.

    ``sweep`` needs columns ``config`` and ``inst`` (a row per config).
    Returns ``a, b, r2, n_points`` and ``table`` (config, BV, n_vtiles,
    measured, predicted, residual_frac). Needs two distinct ``n_vtiles``.
    """
    s = sweep.copy()
    s["n_vtiles"] = [n_vtiles(c, head_dim) for c in s.config]
    s["BV"] = [int(re.match(r"BV(\d+)", c).group(1)) for c in s.config]
    s = s.sort_values("n_vtiles")
    x, y = s.n_vtiles.to_numpy(float), s.inst.to_numpy(float)
    if len(np.unique(x)) < 2:
        raise ValueError("the V-tile model needs measurements at two or more n_vtiles")
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    s["measured"] = y
    s["predicted"] = pred
    s["residual_frac"] = (y - pred) / y
    return dict(a=float(a), b=float(b), r2=r2, n_points=len(s),
                table=s[["config", "BV", "n_vtiles", "measured", "predicted", "residual_frac"]]
                .reset_index(drop=True))


def bv_sweep_frame(totals: pd.DataFrame) -> pd.DataFrame:
    """The BV-sweep targets' instruction counts (``config, inst``)."""
    s = totals[totals.label.astype(str).str.startswith("ours-sweep-")]
    if s.empty or INST not in s:
        return pd.DataFrame(columns=["config", "inst"])
    return s[["config", INST]].rename(columns={INST: "inst"}).reset_index(drop=True)


def summarize(run: Run, metrics: pd.DataFrame) -> pd.DataFrame:
    """:func:`impl_totals` + :func:`per_state_byte` of the run (``ncu_totals.csv``)."""
    totals = impl_totals(metrics)
    if totals.empty:
        return totals
    psb = per_state_byte(totals, run.params["num_v_heads"], run.params["head_dim"])
    run.write_csv(psb, "ncu_totals")
    return psb


def bv_fit(run: Run, totals: pd.DataFrame) -> Optional[dict]:
    """:func:`fit_vtile_model` of the run's BV sweep (``bv_sweep_fit.csv``);
    None with a printed reason when the sweep has fewer than two points."""
    sweep = bv_sweep_frame(totals) if len(totals) else pd.DataFrame(columns=["config", "inst"])
    try:
        fit = fit_vtile_model(sweep, run.params["head_dim"])
    except ValueError as e:
        run.skip("V-tile model fit", f"{e} (got {len(sweep)} sweep point(s))")
        return None
    run.write_csv(fit["table"].assign(a=fit["a"], b=fit["b"], r2=fit["r2"]), "bv_sweep_fit")
    return fit


# --------------------------------------------------------------------------- figures


def _main_targets(totals: pd.DataFrame) -> pd.DataFrame:
    return totals[~totals.label.astype(str).str.startswith("ours-sweep-")]


def _source_note(totals: pd.DataFrame) -> str:
    src = set(totals.get("source", pd.Series(dtype=str)).astype(str))
    return " — FIXTURE DATA, not a measurement" if any(s.startswith("fixture") for s in src) else ""


def _where(totals: pd.DataFrame, gpu: str) -> str:
    """``<GPU> — Nsight Compute (base clocks, caches flushed)``; for fixture data the GPU
    slug of the fixture files instead of this run's device."""
    src = [s for s in totals.get("source", pd.Series(dtype=str)).astype(str)
           if s.startswith("fixture:")]
    if src:
        slugs = sorted({s.rsplit("_", 1)[-1].removesuffix(".csv") for s in src})
        gpu = "fixtures of " + ", ".join(slugs)
    return f"{gpu} — Nsight Compute (one call, base clocks, caches flushed)"


#: y-axis unit of each default metric (ncu base units).
_UNITS = {"gpu__time_duration.sum": "ns", "smsp__inst_executed.sum": "warp instructions",
          "dram__bytes_read.sum": "bytes", "dram__bytes_write.sum": "bytes",
          "lts__t_sector_hit_rate.pct": "%", "launch__grid_size": "programs",
          "launch__block_size": "threads per program",
          "launch__waves_per_multiprocessor": "waves",
          "launch__registers_per_thread": "registers per thread"}


def plot_metric_bars(totals: pd.DataFrame, metrics: Sequence[str], gpu: str = ""):
    """One panel per metric: its value per target (summed over kernels), in ncu's base
    unit."""
    if totals is None or totals.empty:
        return None
    t = _main_targets(totals)
    metrics = [m for m in metrics if m in t]
    ncols = min(3, max(1, len(metrics)))
    nrows = max(1, math.ceil(len(metrics) / ncols))
    fig, axes = new_figure(nrows, ncols, panel=(4.2, 3.2))
    for ax in axes.flat[len(metrics):]:
        ax.set_axis_off()
    for ax, m in zip(axes.flat, metrics):
        labels = [f"{r.label}\n{r.config}" if r.impl == "ours" else r.label for r in t.itertuples()]
        ax.bar(range(len(t)), t[m].to_numpy(float), color=[f"C{i}" for i in range(len(t))])
        ax.set_xticks(range(len(t)), labels, fontsize=7)
        ax.set_title(m, fontsize=8)
        ax.set_ylabel(_UNITS.get(m, "value"), fontsize=8)
    B = int(t.B.iloc[0]) if len(t) else 0
    fig.suptitle(f"Decode metrics per implementation, B={B}\n{_where(totals, gpu)}"
                 f"{_source_note(totals)}")
    return fig


def plot_per_state_byte(psb: pd.DataFrame, gpu: str = ""):
    """Instructions and DRAM bytes per state byte, per target."""
    if psb is None or psb.empty:
        return None
    t = _main_targets(psb)
    fig, axes = new_figure(1, 2, panel=(4.6, 3.4))
    for ax, col, title in ((axes[0][0], "inst_per_state_byte", "executed warp instructions / state byte"),
                           (axes[0][1], "dram_per_state_byte", "DRAM bytes (r+w) / state bytes (r+w)")):
        labels = [f"{r.label}\n{r.config}" if r.impl == "ours" else r.label for r in t.itertuples()]
        ax.bar(range(len(t)), t[col].to_numpy(float), color=[f"C{i}" for i in range(len(t))])
        ax.set_xticks(range(len(t)), labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("warp instructions per byte" if col.startswith("inst") else
                      "ratio (1 = each state byte once)", fontsize=8)
        if col == "dram_per_state_byte":
            ax.axhline(1.0, color="k", ls="--", lw=0.8)
            rd = t["dram_read_per_state"].to_numpy(float) / 2  # the read half of the bar
            ax.bar(range(len(t)), rd, fill=False, hatch="//", edgecolor="k", lw=0,
                   label="of which reads")
            ax.legend(fontsize=7)
    fig.suptitle(f"Work and traffic per byte of state — {_where(psb, gpu)}" + _source_note(psb))
    return fig


def plot_bv_sweep(fit: dict, *, B: int = 0, note: str = "", gpu: str = ""):
    """Measured instructions vs BV beside the fitted V-tile model."""
    if not fit:
        return None
    tab = fit["table"]
    fig, axes = new_figure(1, 1, panel=(5.4, 3.8))
    ax = axes[0][0]
    ax.plot(tab.n_vtiles, tab.measured, "o", label="measured")
    xs = np.linspace(tab.n_vtiles.min(), tab.n_vtiles.max(), 50)
    ax.plot(xs, fit["a"] + fit["b"] * xs, "--",
            label=f"model a + b·n: a={fit['a']:.3g}, b={fit['b']:.3g}, R²={fit['r2']:.3f}")
    for r in tab.itertuples():
        ax.annotate(f"BV={r.BV}", (r.n_vtiles, r.measured), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(tab.n_vtiles), [str(int(n)) for n in tab.n_vtiles])
    ax.minorticks_off()
    ax.set_xlabel("V-tiles per head = D / BV")
    ax.set_ylabel(f"executed instructions ({INST})")
    ax.margins(x=0.1, y=0.1)   # room for the BV labels at the ends
    ax.set_title(f"Our BV sweep, B={B} — {gpu or 'GPU not given'}, Nsight Compute{note}",
                 fontsize=9)
    ax.legend(fontsize=7)
    return fig


# --------------------------------------------------------------------------- conclusion


def _ratio(t: pd.DataFrame, num: str, den: str, col: str) -> float:
    a = t[t.label == num]
    b = t[t.label == den]
    if a.empty or b.empty or col not in t:
        return float("nan")
    return float(a[col].iloc[0]) / float(b[col].iloc[0])


def _dram_verdict(main: pd.DataFrame) -> str:
    """What DRAM reads and writes per copy of the state say (see :func:`per_state_byte`)."""
    m = main[main.dram_read_per_state.notna()]
    parts = [f"{r.label}: read {r.dram_read_per_state:.2f}, write {r.dram_write_per_state:.2f}"
             for r in m.itertuples()]
    rd, wr = m.dram_read_per_state, m.dram_write_per_state
    notes = []
    if (rd.between(0.9, 1.15)).all():
        notes.append("every profiled kernel reads the state from DRAM about once" if len(m) > 1
                     else f"{m.label.iloc[0]} reads the state from DRAM about once")
    for r in m[rd > 1.15].itertuples():
        notes.append(f"{r.label} reads {r.dram_read_per_state:.2f}× the state: extra DRAM "
                     f"traffic that costs bandwidth")
    for r in m[rd < 0.9].itertuples():
        notes.append(f"{r.label} reads only {r.dram_read_per_state:.2f}× the state from DRAM "
                     f"(part of it was still in L2 from earlier work)")
    low = m[wr < 0.9]
    if len(low):
        notes.append(", ".join(low.label) + " wrote less than the state to DRAM during the kernel:"
                     " the rest was still in L2 (write-back) when it ended, not avoided traffic")
    for r in m[wr > 1.15].itertuples():
        notes.append(f"{r.label} writes {r.dram_write_per_state:.2f}× the state: extra traffic")
    if len(m) > 1 and (rd.between(0.9, 1.15)).all():
        notes.append("so the time differences between them come from instructions and "
                     "latency, not from DRAM traffic")
    return ("**DRAM bytes per copy of the state** (1.00 = each byte once): " + "; ".join(parts)
            + ".\n" + "\n".join(f"- {n}" for n in notes))


def conclusion_markdown(dfs: Dict[str, object]) -> str:
    """Conclusion from ``dfs``: ``totals`` (:func:`per_state_byte` frame) and
    optionally ``fit`` (the dict of :func:`fit_vtile_model`)."""
    t = dfs.get("totals")
    lines = ["### Conclusion"]
    if t is None or len(t) == 0:
        lines.append("**No Nsight Compute data** in this run (no ncu/GPU and no fixture).")
        return "\n\n".join(lines)
    note = _source_note(t)
    if note:
        lines.append("**These numbers come from the committed fixture files, not from a "
                     "measurement on this machine** — they exercise the analysis; rerun on a GPU "
                     "with ncu for real counts.")
    B = int(t.B.iloc[0])
    main = _main_targets(t)
    if INST in t:
        parts = [f"{r.label}{' (' + r.config + ')' if r.impl == 'ours' else ''}: "
                 f"{r[INST] / 1e6:.2f} M" for _, r in main.iterrows()]
        lines.append(f"**Executed instructions at B={B}:** " + ", ".join(parts) + ".")
        r_fla = _ratio(main, "fla", "flashinfer", INST)
        r_ours = _ratio(main, "ours", "flashinfer", INST)
        items = []
        if np.isfinite(r_fla):
            items.append(f"FLA / FlashInfer = {fmt_x(r_fla)} (seed on B200: {SEED_RATIO:g}×, "
                         f"{SEED_INST['fla'] / 1e6:.1f} M vs {SEED_INST['flashinfer'] / 1e6:.0f} M) → "
                         + ("reproduced (within ±25 %)" if abs(r_fla / SEED_RATIO - 1) <= 0.25
                            else "not reproduced (outside ±25 %)"))
        if np.isfinite(r_ours):
            items.append(f"ours / FlashInfer = {fmt_x(r_ours)}")
        r_of = _ratio(main, "ours", "fla", INST)
        if np.isfinite(r_of):
            items.append(f"ours / FLA = {fmt_x(r_of)}")
        if "flashinfer" not in set(main.label):
            items.append("FlashInfer was not profiled: no ratio against it")
        if items:
            lines.append("**Instruction ratios:**\n" + "\n".join(f"- {i}" for i in items))
    if "dram_read_per_state" in t and main.dram_read_per_state.notna().any():
        lines.append(_dram_verdict(main))
    fit = dfs.get("fit")
    if not fit:
        lines.append("**V-tile model:** not fitted — this data has fewer than two BV-sweep "
                     "points of our kernel.")
    if isinstance(fit, dict) and fit:
        tab = fit["table"]
        lines.append(
            f"**V-tile model** (inst = a + b·n_vtiles over BV ∈ {list(tab.BV)}): a = "
            f"{fit['a'] / 1e6:.2f} M, b = {fit['b'] / 1e6:.3f} M per additional V-tile per head "
            f"(summed over the batch's heads; R² = {fit['r2']:.3f}); worst residual {tab.residual_frac.abs().max():.1%}. "
            + ("The model explains the sweep: redundant q/k/gate work grows linearly with the "
               "number of V-tiles." if fit["r2"] >= 0.95 else
               "The model explains the sweep only partly (R² < 0.95): something besides the "
               "redundant q/k/gate work changes with BV."))
    return "\n\n".join(lines)
