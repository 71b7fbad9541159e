"""Every figure a notebook draws from its CSVs (:data:`kernels.experiments.redraw.FIGURES`)
is one a reviewer can paste: a title naming the head shape and the profile, labelled axes
(times in the suite's one unit, µs; a log axis with at least two labelled ticks),
no empty panel, no legend over data, no series hidden under another, at most
:data:`~kernels.experiments.common.MAX_FIGURE_WIDTH_IN` (11.5 in, docs/notebooks.md) wide
as saved (tight bounding box, legends included).

Drawn here from the committed GPU results (every figure has data there); the smoke run
of ``tests/notebooks/test_smoke.py`` audits the same figures on smoke data.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels.experiments.common import MAX_FIGURE_WIDTH_IN
from kernels.experiments.redraw import FIGURES, draw

ROOT = Path(__file__).resolve().parents[2]
AUDITED = ROOT / "results" / "nvidia-h200"   # its CSVs draw every figure of FIGURES
HIDDEN_PX = 1.5   # a series whose every point lies this close to another's is drawn under it
HIDDEN_DIFF = 0.25  # ... hiding a real difference when their values differ by more than this


def _numeric(labels) -> bool:
    txt = [t.get_text() for t in labels if t.get_text()]
    return all(re.fullmatch(r"[\d.,\s−\-+e$^{}\\mathdefault×⁰¹²³⁴⁵⁶⁷⁸⁹]*", t) for t in txt)


def audit_figure(fig, name: str, params: dict = None) -> list:
    """What makes ``fig`` hard to read or paste; empty when nothing. ``params`` (the run's):
    the title must name its head shape and profile (``figure_subtitle``)."""
    from kernels.experiments.common import _labelled_ticks, figure_subtitle, shows_tick_labels

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.lines import Line2D

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    width = fig.get_tightbbox(renderer).width   # inches, as savefig(bbox_inches="tight")
    if width > MAX_FIGURE_WIDTH_IN + 0.05:
        problems.append(f"{width:.1f} in wide (> {MAX_FIGURE_WIDTH_IN})")
    sup = fig._suptitle.get_text() if fig._suptitle is not None else ""
    axes = [ax for ax in fig.axes if ax.axison and ax.get_visible()
            and not hasattr(ax, "_colorbar")]   # a colour bar is labelled by its panel's title
    if not sup and not all(ax.get_title() for ax in axes):
        problems.append("no title")
    if params is not None and figure_subtitle(params) not in sup:
        problems.append(f"the title does not name the shape and profile "
                        f"({figure_subtitle(params)!r})")
    for i, ax in enumerate(axes):
        where = f"panel {i} ({ax.get_title() or 'untitled'})"
        n_data = (sum(int(np.isfinite(np.asarray(ln.get_ydata(), float)).sum())
                      for ln in ax.lines if ln.get_transform() == ax.transData)  # not axhline
                  + len(ax.patches)
                  + sum(len(c.get_offsets()) if hasattr(c, "get_offsets") else 1
                        for c in ax.collections) + len(ax.images))
        if not n_data:
            problems.append(f"{where}: empty")
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log" and shows_tick_labels(axis) \
                    and _labelled_ticks(axis) < 2:
                problems.append(f"{where}: its log {axis.axis_name} axis has fewer than two "
                                "labelled ticks")
        ylab = ax.get_ylabel()
        shared = [o for o in ax.get_shared_y_axes().get_siblings(ax) if o is not ax]
        if not ylab and not any(o.get_ylabel() for o in shared):
            problems.append(f"{where}: no y label")
        if not ax.get_xlabel() and _numeric(ax.get_xticklabels()):
            problems.append(f"{where}: no x label on a numeric axis")
        for lab in (ylab, ax.get_xlabel()):
            if re.search(r"\bms\b", lab):
                problems.append(f"{where}: {lab!r} in ms (the suite's time unit is µs)")
            if re.search(r"\btime per call\b|\btime \(", lab) and "/" not in lab \
                    and "µs" not in lab:   # a ratio of times has no unit
                problems.append(f"{where}: {lab!r} names a time without its unit (µs)")
        problems += [f"{where}: {p}" for p in _hidden_series(ax) + _hidden_references(ax)]
        leg = ax.get_legend()
        if leg is not None:
            box = leg.get_window_extent(renderer)
            for ln in ax.lines:
                if not isinstance(ln, Line2D) or ln.get_label().startswith("_"):
                    continue
                xy = np.column_stack([np.asarray(ln.get_xdata(), float),
                                      np.asarray(ln.get_ydata(), float)])
                xy = xy[np.isfinite(xy).all(axis=1)]
                if len(xy) < 2:
                    continue   # axhline-like references are drawn under the legend on purpose
                pts = ax.transData.transform(xy)
                inside = ((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1)
                          & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1))
                if inside.any():
                    problems.append(f"{where}: the legend covers points of {ln.get_label()!r}")
    return problems


def _hidden_series(ax) -> list:
    """Labelled lines of ``ax`` whose every point is drawn within :data:`HIDDEN_PX` of a
    point of another labelled line although their values differ (by more than
    :data:`HIDDEN_DIFF`, relative, somewhere): the axis hides the difference, as a linear
    axis does to values that differ by orders (a log axis or a panel of its own shows
    it). Equal values drawn on top of each other are the truth, not flagged."""
    from matplotlib.lines import Line2D

    pts = {}
    for ln in ax.lines:
        if not isinstance(ln, Line2D) or ln.get_label().startswith("_") \
                or ln.get_transform() != ax.transData:
            continue
        xy = np.column_stack([np.asarray(ln.get_xdata(), float),
                              np.asarray(ln.get_ydata(), float)])
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy):
            pts[ln.get_label()] = (xy[:, 1], ax.transData.transform(xy))
    out = []
    for a, (ya, pa) in pts.items():
        for b, (yb, pb) in pts.items():
            if a == b:
                continue
            d = np.sqrt(((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1))
            near = d.argmin(axis=1)
            if not (d.min(axis=1) < HIDDEN_PX).all():
                continue
            y1, y2 = np.abs(ya), np.abs(yb[near])
            rel = np.abs(ya - yb[near]) / np.maximum(np.maximum(y1, y2), 1e-300)
            if (rel > HIDDEN_DIFF).any():
                out.append(f"{a!r} hidden under {b!r}")
                break
    return out


def _hidden_references(ax) -> list:
    """Horizontal reference lines (``axhline``: a target, 1.0) outside the y range, or two
    of different values drawn within :data:`HIDDEN_PX` of each other (a 0.9 target beside
    1.0 on a 0-1,250 linear axis)."""
    refs = []
    for ln in ax.lines:
        y = np.asarray(ln.get_ydata(), float)
        if ln.get_transform() == ax.transData or len(y) != 2 or y[0] != y[1]:
            continue   # not an axhline
        refs.append(float(y[0]))
    lo, hi = sorted(ax.get_ylim())
    out = [f"reference line y={y:g} outside the axis ({lo:g}..{hi:g})"
           for y in refs if not lo <= y <= hi]
    px = {y: float(ax.transData.transform((0, y))[1]) for y in refs if lo <= y <= hi}
    for a in px:
        for b in px:
            if a < b and abs(px[a] - px[b]) < HIDDEN_PX:
                out.append(f"reference lines y={a:g} and y={b:g} drawn on top of each other")
    return out


CASES = [pytest.param(AUDITED / stem, id=stem) for stem in FIGURES if (AUDITED / stem).is_dir()]


@pytest.mark.parametrize("folder", CASES)
def test_committed_figures_read_well(folder):
    from kernels.experiments.redraw import _params

    figs = draw(folder)
    assert figs, f"no figure drawn from {folder}"
    params = _params(folder)
    problems = {name: p for name, fig in figs.items() if (p := audit_figure(fig, name, params))}
    assert not problems, f"{folder}: " + "; ".join(f"{n}: {', '.join(p)}" for n, p in problems.items())


def test_audit_catches_what_the_issue_found():
    """The audit itself: an untitled empty panel, a time in ms, a legend over data, too wide,
    a series hidden under another."""
    from kernels.experiments.common import new_figure

    fig, axes = new_figure(1, 2, panel=(5.0, 3.0))
    axes[0][0].plot(np.arange(10), np.arange(10), label="a line")
    axes[0][0].plot(np.arange(10), np.arange(10) * 1.001, label="its twin")   # equal: fine
    axes[0][0].plot(np.arange(10), np.full(10, 1e-3), label="tiny")
    axes[0][0].plot(np.arange(10), np.full(10, 1e-2), label="small")       # 10x tiny, same px
    axes[0][0].axhline(0.0, color="k")
    axes[0][0].axhline(0.009, color="k", ls="--")                         # a target beside it
    axes[0][0].legend(loc="center")
    axes[0][0].set_xlabel("x (tokens)")
    axes[0][0].set_ylabel("time per call (ms)")
    axes[0][1].text(0.5, 0.5, "nothing")
    p = " | ".join(audit_figure(fig, "t"))
    assert "no title" in p and "panel 1 (untitled): empty" in p and "in ms" in p
    assert "legend covers" in p and "'tiny' hidden under 'small'" in p and "under 'a line'" not in p
    assert "reference lines y=0 and y=0.009 drawn on top of each other" in p
    from matplotlib.figure import Figure

    wide = Figure(figsize=(16, 3))
    ax = wide.subplots()
    ax.plot([1, 2], [1, 2])
    ax.set_xlabel("x (tokens)")
    ax.set_ylabel("y (µs)")
    wide.suptitle("wide")
    assert any("in wide (> 11.5)" in q for q in audit_figure(wide, "w"))


def test_redraw_command_writes_the_figures(tmp_path, capsys):
    """``python -m kernels.experiments.redraw`` over a copy of a committed notebook folder."""
    import shutil

    from kernels.experiments import redraw

    src = AUDITED / "04_prefill_scaling"
    dst = tmp_path / AUDITED.name / "04_prefill_scaling"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.png"))
    assert redraw.main([str(dst.parent)]) == 0
    out = capsys.readouterr().out
    assert f"redrew {dst / 'time_vs_T.png'}" in out and (dst / "time_vs_T.png").stat().st_size > 10_000
    assert redraw.main([str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_finish_figure_names_the_shape_and_labels_a_narrow_log_axis():
    """A figure saved by a notebook gets the shape and profile on its title, and a log axis
    spanning less than a decade (one labelled tick or none) gets labelled values."""
    from kernels.experiments.common import figure_subtitle, finish_figure, new_figure

    params = dict(num_q_heads=2, num_v_heads=4, head_dim=32, profile="smoke")
    assert figure_subtitle(params) == "HQ=2 HV=4 D=32, profile smoke"
    assert figure_subtitle(dict(num_v_heads=8, head_dim=128)) == "HV=8 D=128"
    fig, axes = new_figure(1, 1)
    ax = axes[0][0]
    ax.plot([6, 200], [3100.0, 5200.0], marker="o")
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter

    ax.yaxis.set_minor_formatter(NullFormatter())   # inside one decade: no label at all
    ax.set_xlabel("total tokens T (log)")
    ax.set_ylabel("time per call (µs, log)")
    fig.suptitle("GDN prefill time vs length")
    assert any("log y axis has fewer than two labelled ticks" in q
               for q in audit_figure(fig, "narrow", params))
    finish_figure(fig, params)
    assert fig._suptitle.get_text() == "GDN prefill time vs length\nHQ=2 HV=4 D=32, profile smoke"
    assert audit_figure(fig, "narrow", params) == []
    finish_figure(fig, params)   # idempotent
    assert fig._suptitle.get_text().count("profile smoke") == 1
