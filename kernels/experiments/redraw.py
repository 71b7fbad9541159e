"""Redraw a notebook's figures from the CSVs of its result folder, without measuring again.

    python -m kernels.experiments.redraw results/nvidia-h200 [results/<gpu>/04_prefill_scaling ...]

For when the plotting changed and the measured numbers did not: each figure in
:data:`FIGURES` whose CSVs are in the folder is drawn by the notebook's own plot function
and written over ``<figure>.png`` (150 dpi, tight, as the notebooks save them). The
figures drawn from in-memory state rather than CSVs (02's Gantt chart and waterfall,
03's BV-sweep fit, 04's kernel breakdown) are not redrawn here: rerun the notebook.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import pandas as pd

__all__ = ["FIGURES", "draw", "redraw_folder", "main"]


def _csv(folder: Path, name: str) -> Optional[pd.DataFrame]:
    p = folder / name
    return pd.read_csv(p, dtype={"lens": str, "kernel": str, "role": str}) if p.is_file() else None


def _prov(folder: Path) -> dict:
    p = folder / "provenance.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def _params(folder: Path) -> dict:
    return _prov(folder).get("params", {})


def _gpu(folder: Path) -> str:
    return str(_prov(folder).get("experiment", {}).get("gpu", ""))


def _dx():
    from . import decode_crossover
    return decode_crossover


def _px():
    from . import prefill_overhead
    return prefill_overhead


def _nx():
    from . import ncu_counts
    return ncu_counts


def _xs():
    from . import prefill_scaling
    return prefill_scaling


def _mx():
    from . import prefill_multi_gpu
    return prefill_multi_gpu


def _ix():
    from . import in_the_model
    return in_the_model


def _run06(folder: Path):
    """What notebook 06's plot functions read from its run (GPU name, parameters)."""
    from types import SimpleNamespace
    return SimpleNamespace(gpu=_gpu(folder), params=_params(folder))


def _where(folder: Path) -> str:
    return _mx().where(_prov(folder).get("experiment", {}))


def _with(csv: str, fn: Callable) -> Callable:
    """A drawer that needs ``csv``: None (nothing to draw) when the folder lacks it."""
    def draw_(folder: Path):
        df = _csv(folder, csv)
        return None if df is None else fn(df, folder)
    return draw_


#: notebook stem -> figure name -> drawer(folder) -> matplotlib figure or None
FIGURES: Dict[str, Dict[str, Callable]] = {
    "01_decode_crossover": {
        "sweep_heatmaps": _with("sweep.csv", lambda d, f: _dx().plot_heatmaps(d, gpu=_gpu(f))),
        "time_vs_B": _with("decode_times.csv", lambda d, f: _dx().plot_time_vs_B(d)),
        "speedup": _with("decode_times.csv", lambda d, f: _dx().plot_speedup(
            d, _params(f).get("speedup_baselines", ["flashinfer"]))),
        "bw_fraction": _with("decode_times.csv", lambda d, f: _dx().plot_bw_fraction(d)),
        "serving_pooled": _with("serving_times.csv",
                                lambda d, f: _dx().plot_serving_pooled(d)),
        "serving_tokens": _with("serving_times.csv",
                                lambda d, f: _dx().plot_serving_tokens(d)),
        "serving_state_dtype": _with("serving_times.csv",
                                     lambda d, f: _dx().plot_serving_state_dtype(d)),
        "drift": _with("drift.csv", lambda d, f: _dx().plot_drift(d)),
        "replay_times": _with("replay_times.csv", lambda d, f: _dx().plot_replay_times(d)),
        "replay_spec_times": _with("replay_times.csv", lambda d, f: _dx().plot_replay_times(
            d, spec=True, accept=_params(f).get("replay_accept", []))),
        "replay_bytes": _with("replay_times.csv", lambda d, f: _dx().plot_replay_bytes(d)),
        "replay_drift": _with("replay_drift.csv", lambda d, f: _dx().plot_replay_drift(d)),
    },
    "02_prefill_launch_overhead": {
        "gate_errors": _with("gate.csv", lambda d, f: _px().plot_gate_errors(d)),
        "time_vs_T": _with("prefill_times.csv", lambda d, f: _px().plot_time_vs_T(d)),
        "busy_idle": _with("prefill_times.csv", lambda d, f: _px().plot_busy_idle(d)),
    },
    "03_ncu_instruction_counts": {
        "metrics_per_impl": _with("ncu_totals.csv", lambda d, f: _nx().plot_metric_bars(
            d, _params(f).get("metrics", []), gpu=_gpu(f))),
        "per_state_byte": _with("ncu_totals.csv",
                                lambda d, f: _nx().plot_per_state_byte(d, gpu=_gpu(f))),
    },
    "04_prefill_scaling": {
        "gate_errors": _with("gate.csv", lambda d, f: _xs().plot_gate_errors(d)),
        "time_vs_T": _with("prefill_scaling.csv", lambda d, f: _xs().plot_time_vs_T(d)),
        "split_costs": _with("split_costs.csv", lambda d, f: _xs().plot_split_costs(d)),
        "gate_dependence": _with("gate_dependence.csv",
                                 lambda d, f: _xs().plot_gate_dependence(d)),
        "roofline": _with("roofline.csv", lambda d, f: _xs().plot_roofline(d)),
        "peer_kernels": _with("peer_kernels.csv", lambda d, f: _xs().plot_peer_kernels(d)),
    },
    "05_prefill_multi_gpu": {
        "time_vs_T": _with("times.csv", lambda d, f: _mx().plot_times(d, _where(f))),
        "scaling": _with("scaling.csv", lambda d, f: _mx().plot_scaling(d, _where(f))),
        "link": _with("link.csv", lambda d, f: _mx().plot_link(d, _csv(f, "exchange.csv"),
                                                               _where(f))),
    },
    "06_in_the_model": {
        "block_prefill": _with("prefill_times.csv", lambda d, f: _ix().plot_block_times(
            _run06(f), d, "T", "block", "Decoder block prefill")),
        "layer_prefill": _with("prefill_times.csv", lambda d, f: _ix().plot_block_times(
            _run06(f), d, "T", "gdn layer", "GDN layer prefill")),
        "gdn_share": _with("gdn_share.csv", lambda d, f: _ix().plot_share(_run06(f), d)),
        "block_decode": _with("decode_times.csv", lambda d, f: _ix().plot_block_times(
            _run06(f), d, "B", "block decode step", "Decoder block decode step")),
    },
}


def draw(folder: Path) -> Dict[str, object]:
    """``{figure name: figure}`` for every figure of ``folder`` (a notebook's result folder,
    named by its stem) that its CSVs can draw."""
    folder = Path(folder)
    drawers = FIGURES.get(folder.name)
    if drawers is None:
        raise ValueError(f"{folder}: not a notebook result folder (known: {', '.join(FIGURES)})")
    from .common import finish_figure

    figs = {}
    for name, drawer in drawers.items():
        fig = drawer(folder)
        if fig is not None:
            figs[name] = finish_figure(fig, _params(folder))   # as Run.save_fig does
    return figs


def redraw_folder(folder: Path) -> List[Path]:
    """Redraw ``folder``'s figures over its PNGs; the paths written."""
    written = []
    for name, fig in draw(folder).items():
        path = Path(folder) / f"{name}.png"
        fig.savefig(path, dpi=150, bbox_inches="tight")
        written.append(path)
    return written


def _folders(paths: Sequence[str]) -> List[Path]:
    out = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise ValueError(f"{p}: no such folder")
        if p.name in FIGURES:
            out.append(p)
        else:   # a GPU's folder: its notebooks
            out += [p / stem for stem in FIGURES if (p / stem).is_dir()]
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.experiments.redraw",
                                 description="Redraw the notebooks' figures from their CSVs.")
    ap.add_argument("folders", nargs="+",
                    help="results/<gpu> or results/<gpu>/<notebook> folders")
    args = ap.parse_args(argv)
    try:
        folders = _folders(args.folders)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not folders:
        print(f"error: no notebook result folder in {', '.join(args.folders)}", file=sys.stderr)
        return 2
    for folder in folders:
        for path in redraw_folder(folder):
            print(f"redrew {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
