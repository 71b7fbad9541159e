"""Compare two result sets: one review figure per notebook and a ratio table.

    python -m kernels.compare RESULTS_A RESULTS_B [--out results/compare] [--allow-unlike]

``RESULTS_A`` and ``RESULTS_B`` are result folders as the notebooks write
them (``results/nvidia-h200``, ``results/nvidia-h100-80gb-hbm3``, or the same
GPU's folder from two commits). Each set is labelled by its folder name
(with its parent's name added when both names are equal). Per notebook:

- ``01_decode_crossover/decode_times.csv`` (impl, config, B, method, median_us, ...)
- ``02_prefill_launch_overhead/prefill_times.csv`` (impl, variant, lens, T, N, method, median_us, launches)
- ``03_ncu_instruction_counts/ncu_metrics.csv`` (impl, config, B, kernel, metric, value)
- ``04_prefill_scaling/prefill_scaling.csv`` (impl, lens, T, N, method, kernel, role, median_us)

it writes ``<out>/<stem>.png`` (both sets in one figure, A solid, B dashed;
units and timing method in the titles) and ``<out>/<stem>_ratios.csv`` /
``.md``: every row present in both sets, matched on the key columns, with
``B/A`` of the value. A notebook missing from either side is skipped with a
message. ``<out>/README.md`` lists what was compared.

Two runs compare only where they measured alike: a notebook's timed numbers (its CSV keys a
``method``) on both sides must come from the same revision of the timing methods
(``timing_methods_rev`` in each ``provenance.json``,
:data:`kernels.bench.timing.TIMING_METHODS_REV`; a provenance without it is revision 0,
before the graph/event fix). A pair that differs is refused (:class:`UnlikeRuns`, exit 2)
naming the notebooks and revisions; ``--allow-unlike`` compares it anyway, and then every
figure's title, every ratio table (a ``timing_methods_rev`` column, a line above the
Markdown table) and the README mark it.

Importing this module imports neither torch nor matplotlib.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["NotebookSpec", "SPECS", "set_labels", "load_set", "ratio_table", "to_markdown",
           "plot_notebook", "timing_rev", "UnlikeRuns", "compare", "main"]


@dataclass(frozen=True)
class NotebookSpec:
    """Where a notebook's tidy CSV lies and how its rows are matched."""

    stem: str
    csv: str
    keys: Tuple[str, ...]       # columns that identify a row
    value: str                  # the compared number
    unit: str
    extra: Tuple[str, ...] = ()  # more numbers shown for both sides


SPECS = (
    NotebookSpec("01_decode_crossover", "decode_times.csv", ("impl", "config", "B", "method"),
                 "median_us", "µs", extra=("floor_us",)),
    NotebookSpec("02_prefill_launch_overhead", "prefill_times.csv",
                 ("impl", "variant", "lens", "T", "N", "method"), "median_us", "µs",
                 extra=("launches",)),
    NotebookSpec("03_ncu_instruction_counts", "ncu_metrics.csv",
                 ("impl", "config", "B", "kernel", "metric"), "value", "metric's unit"),
    NotebookSpec("04_prefill_scaling", "prefill_scaling.csv",
                 ("impl", "lens", "T", "N", "method", "kernel", "role"), "median_us", "µs"),
)


NUMERIC_KEYS = ("B", "T", "N")
# matched on too when both sets have it: the notebook's name of the implementation
# (``ours-adaptive``, ``ours-fla-like``, ``fla`` ...), finer than ``impl``
OPTIONAL_KEYS = ("label",)

# --------------------------------------------------------------------------- loading

def set_labels(a: Path, b: Path) -> Tuple[str, str]:
    """Folder names; with the parent's name in front when the names are equal."""
    a, b = Path(a).resolve(), Path(b).resolve()
    if a.name != b.name:
        return a.name, b.name
    if a.parent.name != b.parent.name:
        return f"{a.parent.name}/{a.name}", f"{b.parent.name}/{b.name}"
    return str(a), str(b)


def load_set(root: Path, spec: NotebookSpec):
    """The notebook's CSV under ``root`` as a DataFrame, or None when it is missing."""
    import pandas as pd

    path = Path(root) / spec.stem / spec.csv
    if not path.is_file():
        return None
    df = pd.read_csv(path)
    missing = [c for c in spec.keys + (spec.value,) if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {', '.join(missing)}")
    for k in spec.keys + tuple(k for k in OPTIONAL_KEYS if k in df.columns):
        # one key type on both sides, or rows would never match
        if k in NUMERIC_KEYS:
            df[k] = pd.to_numeric(df[k], errors="raise")
        else:  # NaN (e.g. no config for a peer) -> ""; "6" and 6 alike
            df[k] = df[k].map(lambda v: "" if pd.isna(v) else str(v))
    return df


def ratio_table(a, b, spec: NotebookSpec, labels: Tuple[str, str]):
    """Rows present in both sets, matched on ``spec.keys`` (repeated keys matched in
    order), with both values and ``ratio = B/A``."""
    import numpy as np
    import pandas as pd

    la, lb = labels
    cols = [c for c in (spec.value,) + spec.extra]
    keys = list(spec.keys) + [k for k in OPTIONAL_KEYS if k in a.columns and k in b.columns]

    def prep(df):
        df = df.copy()
        df["_occurrence"] = df.groupby(keys, sort=False, dropna=False).cumcount()
        return df[keys + ["_occurrence"] + [c for c in cols if c in df.columns]]

    merged = prep(a).merge(prep(b), on=keys + ["_occurrence"], how="inner",
                           suffixes=(f" [{la}]", f" [{lb}]"))
    va, vb = merged[f"{spec.value} [{la}]"], merged[f"{spec.value} [{lb}]"]
    with np.errstate(divide="ignore", invalid="ignore"):
        merged[f"ratio B/A ({lb} / {la})"] = (vb / va).where(va != 0)
    keep_occ = bool((merged["_occurrence"] > 0).any())
    if not keep_occ:
        merged = merged.drop(columns="_occurrence")
    else:
        merged = merged.rename(columns={"_occurrence": "occurrence"})
    return merged.reset_index(drop=True)


def to_markdown(df, floatfmt: str = "{:.4g}") -> str:
    """A GitHub table of ``df`` (no tabulate needed)."""
    def cell(v):
        if isinstance(v, float):
            return "" if math.isnan(v) else floatfmt.format(v)
        return str(v).replace("|", "\\|")

    head = "| " + " | ".join(cell(str(c)) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule] + rows) + "\n"


# --------------------------------------------------------------------------- figures

def _styles(labels):
    return {labels[0]: dict(ls="-", marker="o"), labels[1]: dict(ls="--", marker="x")}


def _best_per_point(df, group, x):
    """For each (group..., x): the row with the smallest median (best config)."""
    idx = df.groupby(list(group) + [x], dropna=False)["median_us"].idxmin().dropna()
    return df.loc[idx.astype(int)].sort_values(list(group) + [x])


def floor_name(method: str) -> str:
    """What a decode panel's ``floor_us`` is: one bare Triton launch for ``host`` (host
    time), the state's bytes at copy bandwidth for the GPU methods."""
    return "bare-launch floor" if method == "host" else "copy-bandwidth floor"


#: Drawn in the ratio tables but left out of the decode figure: the eager torch
#: reference is 100-1000x slower and would flatten the kernels' lines.
DECODE_PLOT_OMIT = ("torch",)


def _plot_decode(sets, labels, fig_factory):
    sets = [d[~d.impl.isin(DECODE_PLOT_OMIT)] for d in sets]
    methods = sorted(set().union(*(set(d.method) for d in sets)))
    fig, axes = fig_factory(len(methods))
    xs = sorted(set().union(*(set(d.B) for d in sets)))
    names = sorted(set().union(*(set(d["label"] if "label" in d.columns else d.impl) for d in sets)))
    color = {n: f"C{i % 10}" for i, n in enumerate(names)}
    for ax, method in zip(axes, methods):
        for df, lab in zip(sets, labels):
            name = "label" if "label" in df.columns else "impl"
            d = _best_per_point(df[df.method == method].dropna(subset=["median_us"]), [name], "B")
            for impl, g in d.groupby(name, sort=True):
                line, = ax.plot(g.B, g.median_us, label=f"{impl} [{lab}]", color=color[impl],
                                **_styles(labels)[lab])
                if {"p20_us", "p80_us"} <= set(g.columns):
                    ax.fill_between(g.B, g.p20_us, g.p80_us, color=line.get_color(), alpha=0.12)
            if "floor_us" in d.columns and d.floor_us.notna().any():
                fl = d.groupby("B")["floor_us"].min()
                ax.plot(fl.index, fl.values, color="k", lw=0.8, ls=_styles(labels)[lab]["ls"],
                        label=f"{floor_name(method)} [{lab}]")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("batch size B")
        ax.set_ylabel("median time per call (µs)")
        ax.set_title(f"decode, method={method}: median µs (p20–p80 band), best config per B"
                     f"\n(torch eager reference omitted: see the ratio table)", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def _plot_prefill(sets, labels, fig_factory):
    import pandas as pd

    methods = sorted(set().union(*(set(d.method) for d in sets)))
    fig, axes = fig_factory(len(methods))
    both = pd.concat(sets)
    order = both.drop_duplicates("lens").sort_values(["T", "N"])["lens"].astype(str).tolist()
    pos = {l: i for i, l in enumerate(order)}
    names = sorted(set().union(*(set(d.impl.astype(str) + ":" + d.variant.astype(str))
                                 for d in sets)))
    color = {n: f"C{i % 10}" for i, n in enumerate(names)}
    for ax, method in zip(axes, methods):
        for df, lab in zip(sets, labels):
            d = df[df.method == method].dropna(subset=["median_us"]).copy()
            d["impl_variant"] = d.impl.astype(str) + ":" + d.variant.astype(str)
            for name, g in d.groupby("impl_variant", sort=True):
                g = g.assign(x=g.lens.astype(str).map(pos)).sort_values("x")
                ax.plot(g.x, g.median_us, label=f"{name} [{lab}]", color=color[name],
                        **_styles(labels)[lab])
        ax.set_xticks(range(len(order)), order, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("sequence lengths (sorted by total T)")
        ax.set_ylabel("median time per call (µs)")
        ax.set_title(f"prefill, method={method}: median µs per call", fontsize=9)
        ax.legend(fontsize=6)
    return fig


def _plot_ncu(sets, labels, fig_factory):
    import pandas as pd

    from kernels.bench.ncu import DEFAULT_METRICS

    # ncu's raw page also carries ~250 device attributes and launch details:
    # draw the measured metrics (those the notebook asks for) only.
    present = set().union(*(set(d.metric) for d in sets))
    metrics = [m for m in DEFAULT_METRICS if m in present] or sorted(present)
    fig, axes = fig_factory(len(metrics))

    def totals(df, metric):
        d = df[df.metric == metric].copy()
        tot = d.groupby(["impl", "config", "B"], as_index=False)["value"].sum()
        tot["name"] = (tot.impl.astype(str) + tot.config.astype(str).map(lambda c: f":{c}" if c else "")
                       + " B=" + tot.B.astype(str))
        return tot

    for ax, metric in zip(axes, metrics):
        tots = [totals(df, metric) for df in sets]
        names = sorted(set(pd.concat(tots).name))
        pos = {n: i for i, n in enumerate(names)}
        for tot, lab in zip(tots, labels):
            tot = tot.assign(x=tot.name.map(pos)).sort_values("x")
            style = dict(_styles(labels)[lab], ls="none", ms=8)  # categorical x: markers only
            ax.plot(tot.x, tot.value, label=f"[{lab}]", **style)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=6)
        unit = ""
        if "unit" in sets[0].columns:
            u = sets[0].loc[sets[0].metric == metric, "unit"].dropna()
            unit = f" ({u.iloc[0]})" if len(u) else ""
        ax.set_title(f"ncu {metric}{unit}: sum over each call's kernels", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def _plot_scaling(sets, labels, fig_factory):
    """Notebook 04: as notebook 02's figure, one line per implementation (the call) or per
    kernel role of ours (method ``kernel``)."""
    def as_variant(d):
        role = d.role.fillna("").astype(str) if "role" in d else ""
        return d.assign(variant=role.where(role != "", "call"))

    return _plot_prefill([as_variant(d) for d in sets], labels, fig_factory)


_PLOTTERS = {"01_decode_crossover": _plot_decode, "02_prefill_launch_overhead": _plot_prefill,
             "03_ncu_instruction_counts": _plot_ncu, "04_prefill_scaling": _plot_scaling}


def plot_notebook(spec: NotebookSpec, sets, labels, unlike: str = ""):
    """The review figure of one notebook with both sets; returns the figure. ``unlike``:
    the mark of a pair measured by two revisions of the timing methods (its title's
    second line)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    def factory(n):
        n = max(n, 1)
        ncols = min(n, 3)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(max(6.5 * ncols, 9.0), 4.6 * nrows),
                                 squeeze=False)
        flat = list(axes.flat)
        for ax in flat[n:]:
            ax.set_visible(False)
        return fig, flat[:n]

    fig = _PLOTTERS[spec.stem](sets, labels, factory)
    title = f"{spec.stem}: {labels[0]} (solid) vs {labels[1]} (dashed)"
    fig.suptitle(title + (f"\n{unlike}" if unlike else ""), fontsize=11,
                 color="C3" if unlike else "black")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- driver

def run_of(root: Path, stem: str) -> str:
    """``commit (date)`` of the run behind ``root/stem`` from its ``provenance.json``: two
    runs of different commits may differ in method as well as in GPU, so the summary
    names both."""
    path = Path(root) / stem / "provenance.json"
    if not path.exists():
        return "no provenance"
    p = json.loads(path.read_text())
    return f"`{str(p.get('git_sha', '?'))[:7]}` ({str(p.get('timestamp', '?'))[:10]})"


def timing_rev(root: Path, stem: str) -> Optional[int]:
    """The ``timing_methods_rev`` of the run behind ``root/stem`` (0 when its provenance
    predates the field); None without a ``provenance.json``."""
    path = Path(root) / stem / "provenance.json"
    if not path.exists():
        return None
    return int(json.loads(path.read_text()).get("timing_methods_rev", 0))


class UnlikeRuns(ValueError):
    """Two runs whose timed numbers come from different revisions of the timing methods."""


def _unlike(a: Path, b: Path, labels) -> Dict[str, str]:
    """``{stem: mark}`` of the timed notebooks whose two runs have different revisions."""
    out = {}
    for spec in SPECS:
        if "method" not in spec.keys:
            continue    # not timed (Nsight Compute counts)
        ra, rb = timing_rev(a, spec.stem), timing_rev(b, spec.stem)
        if ra is not None and rb is not None and ra != rb:
            out[spec.stem] = (f"UNLIKE TIMING: {labels[0]} measured with timing-methods "
                              f"revision {ra}, {labels[1]} with {rb}: a method's numbers "
                              "mean different things")
    return out


def compare(a: Path, b: Path, out: Path, *, allow_unlike: bool = False,
            log=print) -> Dict[str, Optional[Path]]:
    """Compare result sets ``a`` and ``b`` into ``out``; returns {stem: png or None (skipped)}.
    Raises :class:`UnlikeRuns` before writing anything when a timed notebook's two runs
    have different timing-methods revisions, unless ``allow_unlike`` (then marked)."""
    import matplotlib.pyplot as plt

    a, b, out = Path(a), Path(b), Path(out)
    for p in (a, b):
        if not p.is_dir():
            raise FileNotFoundError(f"no result folder at {p}")
    labels = set_labels(a, b)
    unlike = _unlike(a, b, labels)
    if unlike and not allow_unlike:
        raise UnlikeRuns(
            "the runs measured with different revisions of the timing methods "
            f"(kernels/bench/timing.py TIMING_METHODS_REV; 0: before the graph/event fix): "
            + "; ".join(f"{stem}: {mark.split(': ', 1)[1]}" for stem, mark in unlike.items())
            + ". Re-run one side, or pass --allow-unlike (make compare COMPARE_ARGS=--allow-unlike) "
            "to compare them marked as unlike")
    out.mkdir(parents=True, exist_ok=True)
    done: Dict[str, Optional[Path]] = {}
    summary = [f"# {labels[1]} vs {labels[0]}", "",
               f"A = `{a}`, B = `{b}`; ratios are B/A (above 1: B is slower / larger).", ""]
    for spec in SPECS:
        da, db = load_set(a, spec), load_set(b, spec)
        absent = [lab for lab, d in zip(labels, (da, db)) if d is None]
        if absent:
            msg = (f"skip {spec.stem}: no {spec.stem}/{spec.csv} in {' and '.join(absent)}")
            log(msg)
            summary += [f"## {spec.stem}", "", msg, ""]
            done[spec.stem] = None
            continue
        table = ratio_table(da, db, spec, labels)
        mark = unlike.get(spec.stem, "")
        if mark:
            table.insert(0, "timing_methods_rev", f"{timing_rev(a, spec.stem)} vs "
                                                  f"{timing_rev(b, spec.stem)} (unlike)")
            log(f"{spec.stem}: {mark} (--allow-unlike)")
        table.to_csv(out / f"{spec.stem}_ratios.csv", index=False)
        md = (f"**{mark}.**\n\n" if mark else "") + to_markdown(table)
        (out / f"{spec.stem}_ratios.md").write_text(md)
        fig = plot_notebook(spec, (da, db), labels, unlike=mark)
        png = out / f"{spec.stem}.png"
        fig.savefig(png, dpi=120)
        plt.close(fig)
        ratio_col = table.columns[-1]
        r = table[ratio_col].dropna()
        stats = (f"{len(table)} matching rows ({len(da)} in A, {len(db)} in B); "
                 f"ratio B/A of {spec.value}: median {r.median():.3g}, "
                 f"min {r.min():.3g}, max {r.max():.3g}" if len(r) else
                 f"{len(table)} matching rows ({len(da)} in A, {len(db)} in B); no ratios")
        log(f"{spec.stem}: {stats} -> {png}")
        runs = f"Runs: A {run_of(a, spec.stem)}, B {run_of(b, spec.stem)}." + (
            f" **{mark}** (compared with --allow-unlike)." if mark else "")
        summary += [f"## {spec.stem}", "", stats, "", runs, "", f"![{spec.stem}]({png.name})", "",
                    f"Table: [{spec.stem}_ratios.md]({spec.stem}_ratios.md) "
                    f"([csv]({spec.stem}_ratios.csv))", ""]
        done[spec.stem] = png
    (out / "README.md").write_text("\n".join(summary))
    return done


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.compare",
                                description="Compare two result folders (figures + B/A ratio tables).")
    p.add_argument("results_a", type=Path, help="result folder A, e.g. results/nvidia-h200")
    p.add_argument("results_b", type=Path, help="result folder B, e.g. results/nvidia-h100-80gb-hbm3")
    p.add_argument("--out", type=Path, default=Path("results/compare"), help="where to write")
    p.add_argument("--allow-unlike", action="store_true",
                   help="compare runs measured with different timing-methods revisions "
                        "(refused otherwise), every figure and table marked")
    args = p.parse_args(argv)
    try:
        done = compare(args.results_a, args.results_b, args.out,
                       allow_unlike=args.allow_unlike)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not any(done.values()):
        print("nothing to compare: no notebook has results on both sides", file=sys.stderr)
        return 1
    print(f"wrote {args.out}/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
