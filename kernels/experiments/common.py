"""What the experiments share: parameters, the run's result folder, and figure helpers.

A notebook does::

    run = xp.start(xp.collect_params(globals()))   # device, result folder, provenance
    ...                                             # gate -> measure -> plot, all in xp
    run.finish()                                    # move the folder into place

:class:`Run` wraps :class:`kernels.bench.results.ResultWriter` across
notebook cells: ``start`` enters it, ``finish`` exits it, so a notebook that
fails half-way leaves the last good results in place (the half-written
temporary folder is what the writer leaves behind on failure).

The instruments a run uses (the gate, timing methods) are in :mod:`kernels.bench`.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np
import pandas as pd

from kernels.bench.gate import PASS, short_reason
from kernels.bench.timing import method_available, method_meaning

__all__ = [
    "Param", "COMMON_PARAMS", "render_param", "collect_params", "resolve_auto",
    "Run", "start_run",
    "new_figure", "figure_subtitle", "finish_figure", "fmt_us", "fmt_x", "gpu_name_of", "unique_in_order",
    "progress", "figure_legend", "plural", "MAX_FIGURE_WIDTH_IN",
]

# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Param:
    """One notebook parameter: rendered as ``name: type = value  # help``."""

    name: str
    type: str
    default: Any
    help: str


COMMON_PARAMS = (
    Param("device", "str", "auto", "auto | cuda | cpu (cpu runs Triton on the interpreter, TRITON_INTERPRET set to 1)"),
    Param("output_root", "str", "auto",
          "results go to <output_root>/<gpu-slug>/<notebook>/; auto: the repository's results/ "
          "(full profile) or results/smoke (smoke profile)"),
    Param("profile", "str", "auto",
          "auto: full on a CUDA GPU and smoke otherwise, its values (kernels/profiles/*.yaml) "
          "filling every parameter left at its default; the runner passes a name and every "
          "value. Recorded in provenance"),
)


def _render_value(v) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_render_value(x) for x in v) + "]"
    return repr(v)


def render_param(p: Param) -> str:
    """The parameters-cell line of ``p``: ``name: type = value  # help``."""
    return f"{p.name}: {p.type} = {_render_value(p.default)}  # {p.help}"


_CASTS = {"int": int, "float": float, "str": str, "bool": bool, "list": list}


def collect_params(namespace: dict, params: Sequence[Param], stem: str) -> dict:
    """The values of ``params`` in ``namespace`` (notebook ``stem``'s ``globals()``).

    Checks each value against the declared type (ints are accepted for
    floats) and raises ``ValueError`` naming a missing or mistyped parameter,
    then resolves ``profile="auto"`` / ``output_root="auto"`` by :func:`resolve_auto`.
    ``stem`` is required so no notebook's collector can skip that resolution.
    """
    out = {}
    for p in params:
        if p.name not in namespace:
            raise ValueError(f"parameter {p.name!r} is not defined (expected {p.type})")
        v = namespace[p.name]
        want = _CASTS.get(p.type)
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if want is list and isinstance(v, tuple):
            v = list(v)
        if want is not None and not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise ValueError(f"parameter {p.name!r} must be {p.type}, got {type(v).__name__}: {v!r}")
        out[p.name] = v
    return resolve_auto(out, params, stem)


def resolve_auto(values: dict, params: Sequence[Param], stem: str,
                 has_gpu: Optional[bool] = None) -> dict:
    """What a notebook run by hand (JupyterLab, ``jupyter execute``) uses for ``"auto"``.

    ``profile="auto"``: the profile ``make run`` would pick — ``full`` when ``device``
    is or resolves to CUDA, ``smoke`` otherwise — whose values (its ``defaults`` and
    its dict for ``stem``) replace every parameter still at its declared default; a
    value edited in the parameters cell is kept. ``profile`` becomes that name.
    ``output_root="auto"``: ``$GDN_OUTPUT_ROOT`` when set (``kernels.runner.OUTPUT_ROOT_ENV``: the
    tests point it at a temporary folder, so a notebook they run by hand never writes into
    the ``results/`` of a user's ``make run``), else that profile's ``output_root`` under
    the repository root (``results/`` or ``results/smoke/``), whatever the kernel's working
    directory.
    Any other value is used as given: the runner passes a profile name and every
    value explicitly. ``has_gpu`` replaces the device check (tests).
    """
    from kernels.runner import OUTPUT_ROOT_ENV, REPO_ROOT, load_profile, resolve_profile

    out = dict(values)
    if out.get("profile") != "auto" and out.get("output_root") != "auto":
        return out
    if has_gpu is None:
        dev = str(out.get("device", "auto")).strip().lower()
        if dev == "auto":
            from kernels.device import has_gpu as _has_gpu

            has_gpu = _has_gpu()
        else:
            has_gpu = dev.startswith("cuda")
    name = resolve_profile(out.get("profile", "auto"), has_gpu=has_gpu)
    try:
        prof = load_profile(name)
    except Exception as e:
        if out.get("output_root") == "auto":
            raise ValueError(f"output_root='auto' needs a known profile, and profile={name!r} "
                             f"is not one ({e}); set output_root to a path") from e
        prof = None
    if out.get("profile") == "auto":
        declared = {p.name: p.default for p in params}
        fill = dict(prof["defaults"])
        fill.update(prof["notebooks"].get(stem, {}))
        for k, v in fill.items():
            if k in declared and k not in ("device", "output_root", "profile") \
                    and out.get(k) == declared[k]:
                out[k] = v
        out["profile"] = name
    if out.get("output_root") == "auto" and os.environ.get(OUTPUT_ROOT_ENV):
        out["output_root"] = str(Path(os.environ[OUTPUT_ROOT_ENV]).expanduser().resolve())
    if out.get("output_root") == "auto":
        if not ((REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "notebooks").is_dir()):
            raise ValueError(f"output_root='auto' means the repository's results/, but kernels is "
                             f"not imported from a checkout ({REPO_ROOT}); set output_root to a path")
        rel = prof["defaults"].get("output_root")
        if not rel:
            raise ValueError(f"output_root='auto': profile {name!r} sets no output_root; "
                             f"set output_root to a path")
        out["output_root"] = str((REPO_ROOT / rel).resolve())
    return out


# --------------------------------------------------------------------------- the run


def gpu_name_of(device: str) -> str:
    """The device's name as the CSVs and titles print it."""
    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu (Triton interpreter)"


@dataclass
class Run:
    """One execution of a notebook: its parameters, device and result folder."""

    stem: str
    params: dict
    device: str
    gpu: str
    writer: Any
    dir: Path
    skipped: List[dict] = field(default_factory=list)
    state: dict = field(default_factory=dict)  # the experiment's cached inputs/references
    extra_provenance: dict = field(default_factory=dict)
    finished: Optional[Path] = None

    @property
    def on_gpu(self) -> bool:
        return str(self.device).startswith("cuda")

    # -- writing
    def write_csv(self, df: pd.DataFrame, name: str) -> Path:
        """Write ``df`` as ``<name>.csv`` in the result folder."""
        name = name if name.endswith(".csv") else name + ".csv"
        res = self.writer.write_csv(df, name)
        return Path(res) if res is not None else self.dir / name

    def save_fig(self, fig, name: str) -> Path:
        """Save ``fig`` as ``<name>.png`` in the result folder; returns the figure's path."""
        name = name if name.endswith(".png") else name + ".png"
        finish_figure(fig, self.params)
        res = self.writer.save_fig(fig, name)
        return Path(res) if res is not None else self.dir / name

    def write_json(self, obj, name: str) -> Path:
        name = name if name.endswith(".json") else name + ".json"
        res = self.writer.write_json(obj, name)
        return Path(res) if res is not None else self.dir / name

    def show(self, fig, name: str) -> None:
        """Save ``fig`` as ``<name>.png`` and display that PNG once (whatever the
        matplotlib backend: the runner uses Agg). ``fig`` None (nothing to draw)
        prints that instead."""
        if fig is None:
            print(f"{name}: no figure (no data for it in this run)")
            return None
        path = self.save_fig(fig, name)
        try:
            from IPython.display import Image, display
            from PIL import Image as PILImage

            with PILImage.open(path) as im:   # 100 px per inch of figure inline (files: 150 dpi)
                width = round(im.size[0] * 100 / (im.info.get("dpi") or (150, 150))[0])
            display(Image(filename=str(path), width=width))
        except ImportError:  # pragma: no cover - outside IPython
            pass
        return None

    def write_text(self, text: str, name: str) -> Path:
        p = self.dir / name
        p.write_text(text)
        return p

    def path(self, name: str) -> Path:
        """A path inside the result folder (for files an instrument writes itself)."""
        return self.dir / name

    def with_profile_note(self, conclusion: str) -> str:
        """``conclusion`` with, under its heading, what a ``smoke`` run's numbers are worth
        (tiny shapes, few repetitions: they exercise the steps, they measure nothing)."""
        if self.params.get("profile") != "smoke":
            return conclusion
        head, _, rest = conclusion.partition("\n")
        note = ("**Smoke profile — not a measurement.** Tiny shapes, few repetitions, on "
                f"{self.gpu}: this run checks that every step runs and writes its tables and "
                "figures. Its times, ratios, targets, crossovers and pass counts (hard inputs "
                "included) say nothing about the kernels; the `full` profile on a GPU "
                "measures them.")
        return f"{head}\n\n{note}\n{rest}"

    # -- bookkeeping
    def skip(self, what: str, reason: str) -> None:
        """Record and print that ``what`` was not done, and why."""
        print(f"SKIPPED {what}: {reason}")
        self.skipped.append({"what": what, "reason": reason})

    def usable_methods(self, methods: Sequence[str]) -> List[str]:
        """The timing ``methods`` that can run on this device; each other one is skipped."""
        usable = []
        for m in methods:
            ok, why = method_available(m, self.device)
            if ok:
                usable.append(m)
            else:
                self.skip(f"timing with {m}", why)
        return usable

    def host_floor_us(self) -> float:
        """Host µs of one launch of an empty Triton kernel on this machine (the ``host``
        method on :func:`kernels.bench.timing.bare_launch_fn`, once per run, in the
        provenance): the floor of any Triton call's host time. NaN where it cannot run."""
        if "host_floor_us" not in self.state:
            from kernels.bench.timing import bare_launch_fn, time_fn

            try:
                us = time_fn(bare_launch_fn(), "host", rep=50, warmup=10).median_us
                print(f"host floor: one bare Triton launch takes {us:.1f} µs of host time")
            except Exception as e:
                self.skip("host floor (bare Triton launch)", short_reason(e))
                us = float("nan")
            self.state["host_floor_us"] = self.extra_provenance["bare_launch_host_us"] = us
        return self.state["host_floor_us"]

    def timed_rows(self, timings: Iterable[dict], what: str, base: dict) -> List[dict]:
        """``base`` with each timing of :func:`kernels.bench.timing.time_each` (here or in
        the peer worker); a method that raised is skipped as ``"<what> <method>"``."""
        rows = []
        for t in timings:
            if "error" in t:
                self.skip(f"{what} {t['method']}", t["error"])
            else:
                rows.append(dict(base, **t))
        return rows

    def record_solutions(self, impls) -> None:
        """Put the solutions among ``impls`` (:mod:`kernels.registry` records) in the
        provenance: origin, language and build, or why one was unavailable (the runner's
        summary matches them to ``--solutions`` by origin)."""
        rows = [dict(r.info) for r in impls if r.kind == "solution"]
        if rows:
            self.extra_provenance["solutions"] = rows

    def worker_result(self, fn, key: str, inputs: dict, reference, what: str,
                      **kw) -> Optional[dict]:
        """``fn.run(...)`` of an implementation in a worker process (a peer or a solution,
        gated again there on the same inputs); ``None``, with ``what`` skipped, when the
        worker fails or that gate does not pass."""
        try:
            res = fn.run(key, inputs, reference, device=self.device, **kw)
        except Exception as e:
            self.skip(what, short_reason(e))
            return None
        if res["gate"].get("status") != PASS:
            self.skip(what, f"gate {res['gate'].get('status')} in the timing run: "
                      f"{res['gate'].get('reason', '')}")
            return None
        return res

    def finish(self) -> Path:
        """Write provenance (+ skipped.csv) and move the folder into place."""
        if self.finished is not None:
            return self.finished
        from kernels.bench.provenance import collect_provenance

        prov = collect_provenance(dict(self.params))
        prov["experiment"] = {"notebook": self.stem, "device": self.device, "gpu": self.gpu,
                              "skipped": self.skipped, **self.extra_provenance}
        self.write_json(_jsonable(prov), "provenance.json")
        if self.skipped:
            self.write_csv(pd.DataFrame(self.skipped), "skipped")
        commit = getattr(self.writer, "commit", None)
        if commit is not None:
            final = commit()
        else:  # a plain context manager
            self.writer.__exit__(None, None, None)
            final = getattr(self.writer, "final_dir", None)
        self.finished = Path(final) if final is not None else self.dir
        print(f"results written to {self.finished}")
        return self.finished


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return _jsonable(float(obj))
    return str(obj)


def start_run(stem: str, params: dict, slug: Optional[str] = None) -> Run:
    """Resolve the device, open the result folder and print where results go. ``slug``: the
    folder under ``output_root`` (default: this host's GPU slug; notebook 05 names its GPU
    count, ``2x-<gpu-slug>``)."""
    import torch  # noqa: F401  (resolve_device may need it)
    from kernels.device import resolve_device
    from kernels.bench.results import ResultWriter

    device = str(resolve_device(params.get("device", "auto")))
    gpu = gpu_name_of(device)
    writer = ResultWriter(stem, root=params.get("output_root", "results"), gpu=slug)
    opened = writer.open() if hasattr(writer, "open") else writer.__enter__()
    w = opened if opened is not None else writer
    run = Run(stem=stem, params=dict(params), device=device, gpu=gpu, writer=w,
              dir=Path(w.dir))
    print(f"{stem}: device={device} ({gpu}), profile={params.get('profile')}")
    final = getattr(w, "final_dir", None)
    print(f"writing into {run.dir}; run.finish() moves it to {final or 'its place'}")
    return run


# --------------------------------------------------------------------------- figures & text


#: widest figure (inches, as saved, legends and titles included): shown at 100 px per inch by
#: :meth:`Run.show`, a figure stays within 1,400 px in JupyterLab
MAX_FIGURE_WIDTH_IN = 11.5


def _figure_class():
    from matplotlib.figure import Figure

    class SuiteFigure(Figure):
        """A figure whose suptitle wraps at the figure's width (a title naming the GPU,
        the methods and the interpreter's notes would otherwise widen the saved PNG past
        :data:`MAX_FIGURE_WIDTH_IN`)."""

        def suptitle(self, t, **kwargs):
            kwargs.setdefault("wrap", True)
            return super().suptitle(t, **kwargs)

    return SuiteFigure


def new_figure(nrows: int = 1, ncols: int = 1, *, panel=(5.0, 3.6), squeeze=False, **kw):
    """A pyplot-free :class:`~matplotlib.figure.Figure` and its axes grid, panels
    narrowed so the row fits :data:`MAX_FIGURE_WIDTH_IN`; its suptitle wraps at the
    figure's width (constrained layout keeps :func:`figure_legend` inside it), so the saved
    PNG stays within that width.

    Pyplot-free so a notebook shows each figure exactly once (``display(fig)``)
    and no figure stays alive in pyplot's registry.
    """
    width = min(panel[0] * ncols, MAX_FIGURE_WIDTH_IN)
    fig = _figure_class()(figsize=(width, panel[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=squeeze, **kw)
    return fig, axes


#: The notebook parameters of the head shape, as a figure's subtitle names them.
_SHAPE_NAMES = (("HQ", "num_q_heads"), ("HV", "num_v_heads"), ("D", "head_dim"))


def figure_subtitle(params: dict) -> str:
    """The line every saved figure carries (:func:`finish_figure`): the head shape and the
    profile its numbers come from, e.g. ``"HQ=2 HV=4 D=32, profile smoke"`` (a notebook
    that declares only some of the shape names those). Empty when ``params`` names none."""
    shape = " ".join(f"{k}={params[n]}" for k, n in _SHAPE_NAMES if params.get(n) is not None)
    prof = params.get("profile")
    return ", ".join(x for x in (shape, f"profile {prof}" if prof else "") if x)


def shows_tick_labels(axis) -> bool:
    """Whether ``axis`` draws tick labels at all (a panel sharing its sibling's y axis does
    not: the sibling's labels read for both)."""
    kw = axis.get_tick_params(which="major")
    sides = ("labelleft", "labelright") if axis.axis_name == "y" else ("labelbottom", "labeltop")
    return any(kw.get(k, True) for k in sides)


def _labelled_ticks(axis) -> int:
    """How many tick labels (major or minor) with text ``axis`` shows inside its view."""
    lo, hi = sorted(axis.get_view_interval())
    k = 0 if axis.axis_name == "x" else 1
    return sum(1 for t in axis.get_ticklabels(which="both")
               if t.get_text().strip() and lo <= t.get_position()[k] <= hi)


def _readable_log_axis(axis) -> None:
    """Put at least two labelled ticks on a log ``axis`` that shows fewer (a range inside
    one decade shows one or none): the 1-2-5 values inside the view, else three values
    spread over it, in plain numbers."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    lo, hi = sorted(axis.get_view_interval())
    if not (lo > 0 and hi > lo):
        return
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    ticks = [m * 10.0 ** e for e in decades for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
    if len(ticks) < 2:
        ticks = [float(f"{v:.2g}") for v in np.geomspace(lo, hi, 4)[1:-1]]
        ticks = [lo * 1.02, *ticks, hi / 1.02] if len(set(ticks)) < 2 else ticks
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"))
    axis.set_minor_formatter(NullFormatter())


def finish_figure(fig, params: dict):
    """What every saved figure gets (:meth:`Run.save_fig`, and
    :mod:`kernels.experiments.redraw` from a result folder's provenance): its suptitle ends
    with :func:`figure_subtitle` (the head shape and the profile: a smoke figure at the
    smoke shape is not read as the contest's), and every log axis shows at least two
    labelled ticks (:func:`_readable_log_axis`). Returns ``fig``."""
    line = figure_subtitle(params or {})
    st = fig._suptitle
    text = st.get_text() if st is not None else ""
    if line and line not in text:
        if st is not None:
            st.set_text(f"{text}\n{line}" if text else line)
        else:
            fig.suptitle(line, fontsize=9)
    fig.draw_without_rendering()   # the tick labels as they will be drawn
    for ax in fig.axes:
        if not (ax.axison and ax.get_visible()):
            continue
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log" and shows_tick_labels(axis) \
                    and _labelled_ticks(axis) < 2:
                _readable_log_axis(axis)
    return fig


def figure_legend(fig, axes) -> None:
    """One legend for the whole figure, outside the panels on the right (so it covers
    no data): each label once, from whichever panel drew it."""
    seen = {}
    for ax in getattr(axes, "flat", axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside right center", fontsize=7)


def plural(n, word: str, many: Optional[str] = None) -> str:
    """``n`` and ``word`` in agreement: ``plural(1, "segment") == "1 segment"``,
    ``plural(3, "segment") == "3 segments"`` (``many``: an irregular plural)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def fmt_us(x: float) -> str:
    """A time in µs with 3 significant digits."""
    if x is None or not np.isfinite(x):
        return "n/a"
    if x >= 100:
        return f"{x:.0f} µs"
    if x >= 10:
        return f"{x:.1f} µs"
    return f"{x:.2f} µs"


def fmt_x(x: float) -> str:
    """A ratio like ``1.23×``."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:.2f}×"


def unique_in_order(xs: Iterable) -> list:
    seen, out = set(), []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def progress(items: Iterable, what: str, unit: str = "step"):
    """``items`` with a tqdm bar on stderr saying ``what`` is measured, so a long
    measuring cell (or ``make run --log-output``) shows where it is and how far."""
    import sys

    from tqdm import tqdm

    items = list(items)
    return tqdm(items, desc=what, unit=unit, file=sys.stderr, mininterval=1.0, ncols=100)


def batch_axis(ax, Bs, min_gap: float = 0.9) -> None:
    """Log2 x over batch sizes: a tick at every B, labelled where it is at least ``min_gap``
    octaves from the last labelled one (32, 48 and 64 would overlap), and the axis label."""
    ax.set_xscale("log", base=2)
    labels, last = [], None
    for b in Bs:
        keep = last is None or math.log2(b) - math.log2(last) >= min_gap
        labels.append(str(int(b)) if keep else "")
        last = b if keep else last
    ax.set_xticks(list(Bs), labels)
    ax.minorticks_off()
    ax.set_xlabel("batch size B")


def method_title(method: str) -> str:
    """``"<method>: <what it measures>"`` (titles of the per-method figures; the meaning is
    :data:`kernels.bench.timing.TIMING_METHODS`')."""
    return f"{method}: {method_meaning(method)}".rstrip(": ")


def host_table(times: pd.DataFrame) -> pd.DataFrame:
    """The ``host`` rows of a times frame (``floor_us``: one bare Triton launch): per
    implementation (``label``) the median host µs per call over the points, the floor and
    the ratio, lowest first."""
    cols = ["label", "median_us", "floor_us", "x_floor"]
    if times is None or not len(times) or "floor_us" not in times:
        return pd.DataFrame(columns=cols)
    h = times[times.method == "host"]
    if h.empty:
        return pd.DataFrame(columns=cols)
    out = h.groupby("label", sort=False).agg(median_us=("median_us", "median"),
                                             floor_us=("floor_us", "first")).reset_index()
    out["x_floor"] = out.median_us / out.floor_us
    return out.sort_values("median_us").reset_index(drop=True)
