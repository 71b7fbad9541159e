"""The contest's evaluation, run locally: flashinfer-bench at the contest's version (GPU).

:func:`evaluate` runs flashinfer-bench built from its main branch as of the final
kernel submission deadline (``scripts/contest_wheel.sh``; docs/contest.md says
why not PyPI's 0.1.2) with the contest's settings: isolated runner (one
process per solution), timeout 300 s, ``atol = rtol = 1e-2``, GDN prefill
``warmup 1, iterations 5, trials 3``, decode the defaults ``10, 50, 3``. Its
latency is FlashInfer's ``bench_gpu_time_with_cupti`` with a cold L2 and no CUDA
graph: per call, the span from the first GPU activity's start to the last one's
end; the median of ``iterations`` calls per input set, averaged over ``trials``
input sets. It refuses to run where CUPTI is unavailable (FlashInfer would fall
back to CUDA events, which count the host's launch path).

Solutions, on the same workloads: ours (decode; prefill ``fused`` and ``graph``),
the FlashInfer baseline (:mod:`.solution`) and every path in ``solutions`` (a
solution JSON or a starter-kit folder, read by :func:`.loader.read_solution`;
flashinfer-bench builds them itself). Score (the starter kit's EVALUATION.md): per workload
``baseline latency / solution latency``; a solution's score is the mean over the
workloads the baseline passed, and 0 if any of its workloads did not pass
(:func:`contest_scores`, checked against flashinfer-bench's own scoring).

One run per op, as the contest ran one command per definition, each written to
``<root>/<gpu-slug>/contest_<op>/`` only when it completes
(:class:`kernels.bench.results.ResultWriter`; a failed run leaves
``failed-contest_<op>/`` and the last good results in place):

``definitions/``, ``workloads/``, ``solutions/``  the trace set (:mod:`.definitions`);
                       ``blob/`` holds the workload tensors (git-ignored, regenerated)
``traces/``            what flashinfer-bench wrote (status, errors, latency), one folder
                       per author, its name without spaces (:func:`space_free_trace_folders`)
``scores.csv``         per solution: contest score, workloads scored/failed, win rate
``comparison.csv``     per workload: status, ``fib_us``, speedup over the baseline and,
                       for our solutions and the baseline adapter, our own
                       ``cupti_cold`` of the same callable (:mod:`kernels.bench.timing`)
                       and the committed notebook number, flagged when it differs from
                       ``fib_us`` by more than 10 %
``comparison.md``      both tables; ``run.json`` the provenance record
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .bundle import PACKAGE_DIR
from .definitions import OP_TYPE, OPS, definition, definition_name, workload_inputs, workloads
from .formats import read_solution
from .solution import AUTHOR, PREFILL_VARIANTS, baseline_solution, solution

__all__ = ["evaluate", "check_arguments", "check_environment", "contest_scores",
           "comparison_table", "notebook_cupti_cold", "solutions_for", "write_trace_set",
           "contest_params", "space_free_trace_folders", "FLAG_THRESHOLD", "FIB_COMMIT"]

#: flashinfer-bench main at the final kernel submission deadline (scripts/contest_wheel.sh)
FIB_COMMIT = "ecafa9c2c62007667838226068b21ca9ff1c9183"
FLAG_THRESHOLD = 0.10
TIMEOUT_S = 300
RESULTS = PACKAGE_DIR.parent / "results"
_CONTEST_PARAMS = {"decode": dict(warmup_runs=10, iterations=50, num_trials=3),
                   "prefill": dict(warmup_runs=1, iterations=5, num_trials=3)}


def contest_params(op: str) -> dict:
    """flashinfer-bench's warmup_runs / iterations / num_trials for ``op`` in the
    contest's evaluation (EVALUATION.md: prefill set on its command line, decode the
    defaults)."""
    return dict(_CONTEST_PARAMS[op])


# --------------------------------------------------------------------------- solutions

def solutions_for(op: str, extra: Sequence[dict] = ()) -> List[dict]:
    """The solutions evaluated for ``op``: ours (prefill: every packed variant), the
    FlashInfer baseline, then those of ``extra`` whose definition is ``op``'s.
    ``ValueError`` when two share a name (the trace set keys solutions by name)."""
    sols = ([solution("decode")] if op == "decode"
            else [solution("prefill", variant=v) for v in PREFILL_VARIANTS])
    sols.append(baseline_solution(op))
    taken = {s["name"] for s in sols}
    for s in extra:
        if s["definition"] != definition_name(op):
            continue
        if s["name"] in taken:
            raise ValueError(f"solution name {s['name']!r} is used twice (ours and the baseline "
                             "take gdn-<op>-ours*, gdn-<op>-flashinfer): rename one (field 'name')")
        taken.add(s["name"])
        sols.append(s)
    return sols


def write_trace_set(root: Path, ops: Sequence[str], extra: Sequence[dict] = ()
                    ) -> Tuple[Dict[str, list], Dict[str, List[dict]]]:
    """Write definitions, workloads (+ safetensors blobs) and solutions of ``ops``
    under ``root``; return ``({op: workloads}, {op: solutions})``."""
    from safetensors.torch import save_file

    wls, sols = {}, {}
    for op in ops:
        name = definition_name(op)
        _write_json(root / "definitions" / OP_TYPE / f"{name}.json", definition(op))
        wls[op] = workloads(op)
        lines = []
        for wl in wls[op]:
            tensors = {k: v.contiguous() for k, v in workload_inputs(op, wl).items()
                       if k != "scale" and v is not None}
            path = root / wl["trace"]["workload"]["inputs"]["q"]["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(path))
            lines.append(json.dumps(wl["trace"]))
        wpath = root / "workloads" / OP_TYPE / f"{name}.jsonl"
        wpath.parent.mkdir(parents=True, exist_ok=True)
        wpath.write_text("\n".join(lines) + "\n")
        sols[op] = solutions_for(op, extra)
        for sol in sols[op]:
            _write_json(root / "solutions" / OP_TYPE / name / f"{sol['name']}.json", sol)
    return wls, sols


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def space_free_trace_folders(traces: Path) -> None:
    """flashinfer-bench files traces under ``traces/<author>/``, and an author may hold
    spaces (a starter kit's ``author = "Jane Doe"``): such a folder's traces move to the
    name with ``-`` for each run of whitespace, appended where that name is taken (JSON
    lines). The traces and the tables keep the author as written."""
    if not traces.is_dir():
        return
    for folder in sorted(traces.iterdir()):
        name = "-".join(folder.name.split())
        if name == folder.name:
            continue
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            dest = traces / name / f.relative_to(folder)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with dest.open("a") as out:
                out.write(f.read_text())
        shutil.rmtree(folder)


# --------------------------------------------------------------------------- scores

def contest_scores(rows: Sequence[dict]) -> List[dict]:
    """Per (op, solution) the contest score of ``rows`` (one per op, workload and
    solution: ``status``, ``fib_us``), the baseline being ``gdn-<op>-flashinfer``, as
    flashinfer-bench's ``TraceSet.get_solution_score`` computes it.

    ``score``: mean over the workloads the baseline PASSED of ``baseline fib_us /
    solution fib_us``; 0 when any of the solution's traced workloads is not PASSED;
    NaN when it shares no workload with the passing baseline. Rows with status
    ``NO_TRACE`` (flashinfer-bench skipped a workload whose run raised) are left out,
    and listed in ``note``. The baseline itself gets no row.
    """
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        base = baseline_solution(op)["name"]
        ref = {r["workload"]: r["fib_us"] for r in rows
               if r["op"] == op and r["solution"] == base and r["status"] == "PASSED"}
        for sol in dict.fromkeys(r["solution"] for r in rows if r["op"] == op):
            if sol == base:
                continue
            mine = [r for r in rows if r["op"] == op and r["solution"] == sol]
            traced = [r for r in mine if r["status"] != "NO_TRACE"]
            failed = [str(r["workload"]) for r in traced if r["status"] != "PASSED"]
            common = [r for r in traced if r["workload"] in ref]
            notes = []
            if failed:
                notes.append("not passed: " + ", ".join(failed))
            if len(traced) < len(mine):
                notes.append("no trace: " + ", ".join(str(r["workload"]) for r in mine
                                                      if r["status"] == "NO_TRACE"))
            rec = dict(op=op, solution=sol, workloads=len(mine), failed=len(failed),
                       scored=0 if failed else len(common))
            if not common:
                notes.append("no workload the baseline passed")
                rec.update(score=float("nan"), win_rate=float("nan"))
            elif failed:
                rec.update(score=0.0, win_rate=0.0)
            else:
                speedups = [ref[r["workload"]] / r["fib_us"] for r in common]
                rec.update(score=sum(speedups) / len(speedups),
                           win_rate=sum(x > 1 for x in speedups) / len(speedups))
            out.append(dict(rec, note="; ".join(notes)))
    return out


def notebook_cupti_cold(results_dir: Path) -> Dict[tuple, float]:
    """``{(solution name, workload key): median_us}`` of our committed ``cupti_cold``
    notebook numbers under ``results_dir`` (``results/<gpu-slug>``) for the contest's
    workloads (notebook 01 also times B up to 512); empty if absent."""
    import pandas as pd

    out: Dict[tuple, float] = {}
    dec = results_dir / "01_decode_crossover" / "decode_times.csv"
    if dec.is_file():
        d = pd.read_csv(dec)
        d = d[d.method == "cupti_cold"]
        contest_b = {w["key"] for w in workloads("decode")}
        for label, sol in (("ours-adaptive", "gdn-decode-ours"),
                           ("flashinfer", "gdn-decode-flashinfer")):
            for r in d[d.label == label].itertuples():
                if str(int(r.B)) in contest_b:
                    out[(sol, str(int(r.B)))] = float(r.median_us)
    pre = results_dir / "02_prefill_launch_overhead" / "prefill_times.csv"
    if pre.is_file():
        from ..spec import PREFILL_SHAPES, lens_label

        key_of = {lens_label(lens): key for key, lens in PREFILL_SHAPES.items()}
        p = pd.read_csv(pre, dtype={"lens": str})
        p = p[p.method == "cupti_cold"]
        names = {("ours", v): f"gdn-prefill-ours-{v}" for v in PREFILL_VARIANTS}
        names[("flashinfer", "default")] = "gdn-prefill-flashinfer"
        for r in p.itertuples():
            sol = names.get((r.impl, r.variant))
            if sol and r.lens in key_of:
                out[(sol, key_of[r.lens])] = float(r.median_us)
    return out


def comparison_table(rows: List[dict], notebook: Dict[tuple, float]):
    """Rows (one per op, workload, solution) -> DataFrame with the speedup over the
    baseline, our ``cupti_cold`` beside ``fib_us`` and the > 10 % flag."""
    import pandas as pd

    df = pd.DataFrame(rows)
    for col in ("fib_us", "cupti_cold_us", "max_abs_err", "max_rel_err"):
        df[col] = pd.to_numeric(df[col])        # None (not timed / failed) -> NaN
    base = {(r.op, r.workload): r.fib_us for r in df.itertuples()
            if r.solution == baseline_solution(r.op)["name"] and r.status == "PASSED"}
    df["speedup"] = [base.get((r.op, r.workload), float("nan")) / r.fib_us
                     if r.status == "PASSED" else float("nan") for r in df.itertuples()]
    df["notebook_cupti_cold_us"] = [notebook.get((r.solution, r.workload)) for r in df.itertuples()]
    df["fib_over_cupti"] = df.fib_us / df.cupti_cold_us
    df["flag"] = (df.fib_over_cupti - 1).abs() > FLAG_THRESHOLD
    return df


def _cell(v) -> str:
    if isinstance(v, bool):
        return "**>10 %**" if v else ""
    if isinstance(v, float):
        return "" if v != v else f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.2f}"
    return "" if v is None else str(v)


def _table(records, cols) -> List[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in records]
    return lines


def _markdown(df, scores: List[dict], gpu: str, info: dict) -> str:
    p = info["params"]
    params = (f"warmup {p['warmup_runs']}, iterations {p['iterations']}, "
              f"trials {p['num_trials']}")
    lines = [f"# Contest evaluation: {definition_name(info['op'])} — {gpu}", "",
             f"flashinfer-bench {info['version']} (main at {FIB_COMMIT[:8]}, the contest's), "
             f"isolated runner, atol = rtol = 1e-2, {params}. `fib_us`: FlashInfer's "
             "`bench_gpu_time_with_cupti`, cold L2, no CUDA graph (first GPU activity's start "
             "to the last one's end of a call; median of the iterations, mean over the "
             "trials). Score: mean over workloads of baseline / solution latency, 0 if any "
             f"workload failed. `cupti_cold_us`: our own span of the same callable (median of "
             f"{info['rep']} calls), our solutions and the baseline only; flag: "
             f"|fib / cupti_cold - 1| > {FLAG_THRESHOLD:.0%}.", "",
             "## Contest score (baseline: FlashInfer through kernels.peers)", ""]
    lines += _table(scores, ["op", "solution", "score", "win_rate", "scored", "failed", "note"])
    cols = ["op", "workload", "solution", "status", "fib_us", "speedup", "cupti_cold_us",
            "notebook_cupti_cold_us", "fib_over_cupti", "flag", "max_abs_err"]
    lines += ["", "## Per workload", ""] + _table(df[cols].to_dict("records"), cols)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the run

_CUPTI_PROBE = """
from importlib.metadata import version
from cupti import cupti
cupti.get_timestamp()
v = version("cupti-python")
assert int(v.split(".")[0]) >= 13, f"cupti-python {v} < 13"
"""


def _check_cupti() -> None:
    """FlashInfer times with CUPTI only where cupti-python >= 13 works; else it falls
    back to CUDA events (host-inclusive), which this harness must not report. Probed in
    a child process (as flashinfer-bench's workers load it), so this process's own
    ``cupti_cold`` (torch's profiler) never shares it with a second CUPTI client."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", _CUPTI_PROBE], capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"CUPTI is unusable here ({last}): flashinfer-bench would time with "
                           "CUDA events; carry .whl/ (scripts/contest_wheel.sh, gpu_fib)")


def _own_cupti_cold(op: str, wl: dict, defn_model, sol_model, rep: int) -> float:
    """Our ``cupti_cold`` median (µs) of the solution's callable, built by
    flashinfer-bench's own builder, on the workload's inputs."""
    import torch
    from flashinfer_bench.compile import BuilderRegistry

    from ..bench.timing import time_fn

    runnable = BuilderRegistry.get_instance().build(defn_model, sol_model)
    inputs = workload_inputs(op, wl, device="cuda")
    args = [inputs[n] for n in defn_model.inputs]
    if sol_model.spec.destination_passing_style:
        shapes = defn_model.get_output_shapes(wl["trace"]["workload"]["axes"])
        args += [torch.empty(s, dtype=d, device="cuda")
                 for s, d in zip(shapes, defn_model.torch_output_dtypes)]
    return time_fn(lambda: runnable(*args), "cupti_cold", rep=rep, warmup=5).median_us


def check_arguments(ops: Sequence[str], solutions: Sequence[str] = ()) -> List[dict]:
    """Validate :func:`evaluate`'s arguments without a GPU; return the solutions of
    ``solutions`` in flashinfer-bench's format (each is evaluated with the op of its
    definition; one for an op not in ``ops`` is left out). ``ValueError`` naming the
    argument (or file and field) for an unknown or empty op list, a solution
    :func:`.loader.read_solution` refuses, a definition other than the contest's two, or
    a name used twice."""
    bad = [op for op in ops if op not in OPS]
    if bad or not ops:
        raise ValueError(f"ops must list {' and/or '.join(OPS)}, got {list(ops)!r}")
    extra = []
    for path in solutions:
        src = read_solution(path)
        if src.definition != definition_name(src.op):
            raise src.err(f"{src.definition!r} is not one of the contest's definitions "
                          f"({', '.join(definition_name(op) for op in OPS)})", "definition")
        extra.append(src.fib_solution())
    for op in ops:
        solutions_for(op, extra)
    return extra


def check_environment() -> str:
    """``RuntimeError`` saying what is missing unless this host has a CUDA GPU, the
    contest's flashinfer-bench build and a working CUPTI; returns that build's version."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("contest evaluation needs a CUDA GPU; torch sees none")
    try:
        import flashinfer_bench  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"flashinfer-bench is not importable ({e}); on the GPU host carry "
                           ".whl/ and the FlashInfer bundle (docs/contest.md)") from e
    from ..packages import package_version

    fib_version = package_version("flashinfer_bench", dists=("flashinfer-bench",))
    if f"+g{FIB_COMMIT[:8]}" not in fib_version:
        raise RuntimeError(f"flashinfer-bench {fib_version} is not the contest's build (main at "
                           f"{FIB_COMMIT[:8]}): build it with scripts/contest_wheel.sh")
    _check_cupti()
    return fib_version


def evaluate(ops: Sequence[str] = OPS, *, solutions: Sequence[str] = (),
             root: Optional[str] = None, rep: int = 50) -> List[Path]:
    """Run the contest's flashinfer-bench on ours, the baseline and ``solutions``
    (paths, :func:`check_arguments`) for each of ``ops`` in turn (as the contest ran one
    command per definition); write ``<root>/<gpu-slug>/contest_<op>/`` (``root``
    defaults to the repository's ``results/``) and return those folders.

    ``ValueError`` for a bad op or solution path (before anything runs);
    ``RuntimeError`` without a CUDA GPU, the contest's flashinfer-bench build or CUPTI.
    """
    extra = check_arguments(ops, solutions)
    evaluated = {definition_name(op) for op in ops}
    for path, sol in zip(solutions, extra):
        if sol["definition"] not in evaluated:
            print(f"contest: {path} ({sol['definition']}) left out: its op is not in {list(ops)}")
    fib_version = check_environment()
    from ..packages import package_version

    log = logging.getLogger("flashinfer_bench")     # its per-solution progress lines
    if not log.handlers:
        log.addHandler(logging.StreamHandler(sys.stdout))
    log.setLevel(logging.INFO)
    info = dict(version=fib_version, fib_commit=FIB_COMMIT, timeout_s=TIMEOUT_S, rep=rep,
                cupti_python=package_version("cupti", dists=("cupti-python",)),
                solutions=[os.fspath(p) for p in solutions])
    return [_evaluate_op(op, extra, Path(root) if root else RESULTS, info) for op in ops]


def _evaluate_op(op: str, extra: Sequence[dict], results_root: Path, info: dict) -> Path:
    import pandas as pd
    import torch
    from flashinfer_bench import Benchmark, BenchmarkConfig, TraceSet
    from flashinfer_bench.data import Definition, Solution

    from ..bench.provenance import collect_provenance
    from ..bench.results import ResultWriter
    from ..device import gpu_slug

    slug = gpu_slug()
    info = dict(info, op=op, params=contest_params(op))
    with ResultWriter(f"contest_{op}", root=results_root, gpu=slug) as out:
        wls, sols = write_trace_set(out.dir, [op], extra)
        wls, sols = wls[op], sols[op]
        cfg = BenchmarkConfig(use_isolated_runner=True, timeout_seconds=TIMEOUT_S, rtol=1e-2,
                              atol=1e-2, profile_baseline=False,  # not the contest's score
                              **info["params"])
        print(f"contest {op}: {len(sols)} solutions x {len(wls)} workloads "
              f"({info['params']})", flush=True)
        bench = Benchmark(TraceSet.from_path(str(out.dir)), cfg)
        try:
            result = bench.run_all(dump_traces=True)
        finally:
            bench.close()
        space_free_trace_folders(out.dir / "traces")

        defn = Definition.model_validate(definition(op))
        by_uuid = {wl["trace"]["workload"]["uuid"]: wl for wl in wls}
        models = {s["name"]: Solution.model_validate(s) for s in sols}
        rows, seen = [], set()
        for tr in result.traces.get(defn.name, []):
            wl, ev = by_uuid[tr.workload.uuid], tr.evaluation
            seen.add((wl["key"], tr.solution))
            row = dict(op=op, workload=wl["key"], solution=tr.solution,
                       author=models[tr.solution].author, status=ev.status.value,
                       fib_us=ev.performance.latency_ms * 1e3 if ev.performance else None,
                       max_abs_err=ev.correctness.max_absolute_error if ev.correctness else None,
                       max_rel_err=ev.correctness.max_relative_error if ev.correctness else None,
                       cupti_cold_us=None)
            # our own span, for code we wrote only (a third party's runs in
            # flashinfer-bench's isolated workers, never in this process)
            if ev.status.value == "PASSED" and row["author"] == AUTHOR:
                row["cupti_cold_us"] = _own_cupti_cold(op, wl, defn, models[tr.solution],
                                                       info["rep"])
            rows.append(row)
            print(f"{op} {wl['key']:>8} {tr.solution:<28} {row['status']:<20} fib "
                  f"{row['fib_us'] or float('nan'):9.1f} us  cupti_cold "
                  f"{row['cupti_cold_us'] or float('nan'):9.1f} us", flush=True)
        for wl in wls:          # a workload whose run raised has no trace: say so
            for name in models:
                if (wl["key"], name) not in seen:
                    rows.append(dict(op=op, workload=wl["key"], solution=name,
                                     author=models[name].author, status="NO_TRACE",
                                     fib_us=None, max_abs_err=None, max_rel_err=None,
                                     cupti_cold_us=None))
        df = comparison_table(rows, notebook_cupti_cold(results_root / slug))
        scores = contest_scores(rows)
        out.write_csv(df, "comparison.csv")
        out.write_csv(pd.DataFrame(scores), "scores.csv")
        out.path("comparison.md").write_text(
            _markdown(df, scores, torch.cuda.get_device_name(), info))
        out.write_json(collect_provenance(info), "run.json")
        for s in scores:
            print(f"score {op:<8} {s['solution']:<28} {s['score']:.3f} {s['note']}", flush=True)
    print(f"wrote {out.committed}/scores.csv, comparison.csv, comparison.md, traces/")
    return out.committed
