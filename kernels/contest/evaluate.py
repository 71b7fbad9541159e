"""Local evaluation with flashinfer-bench itself, beside our own timings (GPU).

:func:`evaluate` builds a flashinfer-bench trace set under
``results/<gpu-slug>/contest/`` and runs its ``Benchmark`` on it:

``definitions/gdn/<def>.json``         from :mod:`.definitions` (our spec, our reference)
``workloads/gdn/<def>.jsonl``          decode B in DECODE_BATCH_SIZES, prefill PREFILL_SHAPES
``blob/workloads/gdn/<def>/*.safetensors``  their tensors (git-ignored; regenerated
                                       from the seed on every run)
``solutions/gdn/<def>/<name>.json``    ours (decode; prefill ``fused`` and ``graph``) and
                                       the FlashInfer baseline (:mod:`.solution`)
``traces/gdn/<def>.jsonl``             what flashinfer-bench wrote: status, max abs/rel
                                       error against our reference, latency
``comparison.csv`` / ``.md``           its latency beside ours (below); rows differing
                                       from our ``cupti_cold`` by more than 10 % flagged

flashinfer-bench's correctness check is the contest's (atol = rtol = 1e-2, every
element) against the definition's reference - our float32 reference. Its
latency (``fib_us``) is the mean over ``num_trials`` input sets of the mean of
``iterations`` calls, each bracketed by CUDA events right after a device
synchronise and a 256 MiB L2 flush, on freshly cloned inputs: it counts the
host's whole launch path (Python, argument checks, allocation, every launch),
because the stream is empty when the first event is recorded.

For every solution that PASSED, on the same packed callable (built by
flashinfer-bench's own builder) and the workload's inputs, we add:

``cupti_cold_us``  :func:`kernels.bench.timing.time_fn` ``cupti_cold``: first to
                   last GPU activity of one call, L2 flushed, host synchronised;
``host_call_us``   median host time of one call (``perf_counter`` from the call to
                   its return, device idle before it): the launch path that
                   ``fib_us`` includes and ``cupti_cold_us`` starts after;
``notebook_cupti_cold_us``  our committed notebook number for the same
                   implementation and shape (``01_decode_crossover/decode_times.csv``,
                   ``02_prefill_launch_overhead/prefill_times.csv``), when present.

``flag`` marks rows where ``fib_us`` and ``cupti_cold_us`` differ by more than
10 %; ``fib_minus_cupti_us`` against ``host_call_us`` says whether the host's
launch path accounts for the difference.
"""
from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .bundle import PACKAGE_DIR
from .definitions import OP_TYPE, definition, workload_inputs, workloads
from .solution import PREFILL_VARIANTS, baseline_solution, solution

__all__ = ["evaluate", "comparison_table", "notebook_cupti_cold", "FLAG_THRESHOLD",
           "solutions_for", "write_trace_set"]

FLAG_THRESHOLD = 0.10
RESULTS = PACKAGE_DIR.parent / "results"


def solutions_for(op: str, baseline: bool = True) -> List[dict]:
    """The solutions evaluated for ``op``: ours (prefill: every packed variant), then
    the FlashInfer baseline."""
    sols = ([solution("decode")] if op == "decode"
            else [solution("prefill", variant=v) for v in PREFILL_VARIANTS])
    return sols + ([baseline_solution(op)] if baseline else [])


def write_trace_set(root: Path, ops: Sequence[str], baseline: bool = True) -> Dict[str, list]:
    """Write definitions, workloads (+ safetensors blobs) and solutions of ``ops`` under
    ``root`` (replacing any earlier ones and their traces); return ``{op: workloads}``."""
    from safetensors.torch import save_file

    for sub in ("definitions", "workloads", "solutions", "traces", "blob"):
        shutil.rmtree(root / sub, ignore_errors=True)
    out = {}
    for op in ops:
        defn = definition(op)
        name = defn["name"]
        _write_json(root / "definitions" / OP_TYPE / f"{name}.json", defn)
        wls = workloads(op)
        lines = []
        for wl in wls:
            tensors = {k: v.contiguous() for k, v in workload_inputs(op, wl).items()
                       if k != "scale" and v is not None}
            path = root / wl["trace"]["workload"]["inputs"]["q"]["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(path))
            lines.append(json.dumps(wl["trace"]))
        wpath = root / "workloads" / OP_TYPE / f"{name}.jsonl"
        wpath.parent.mkdir(parents=True, exist_ok=True)
        wpath.write_text("\n".join(lines) + "\n")
        for sol in solutions_for(op, baseline):
            _write_json(root / "solutions" / OP_TYPE / name / f"{sol['name']}.json", sol)
        out[op] = wls
    return out


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _host_call_us(fn, rep: int) -> float:
    import torch

    samples = []
    for _ in range(rep):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def _own_timings(op: str, wl: dict, defn_model, sol_model, rep: int) -> dict:
    """cupti_cold and host-call µs of the packed callable on the workload's inputs."""
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

    def call():
        return runnable(*args)

    t = time_fn(call, "cupti_cold", rep=rep, warmup=5)
    return {"cupti_cold_us": t.median_us, "host_call_us": _host_call_us(call, rep)}


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
    """Rows (one per trace) -> DataFrame with the ratios and the > 10 % flag."""
    import pandas as pd

    df = pd.DataFrame(rows)
    for col in ("fib_us", "cupti_cold_us", "host_call_us", "max_abs_err"):
        df[col] = pd.to_numeric(df[col])        # None (not timed / failed) -> NaN
    df["notebook_cupti_cold_us"] = [notebook.get((r.solution, r.workload)) for r in df.itertuples()]
    df["fib_over_cupti"] = df.fib_us / df.cupti_cold_us
    df["fib_minus_cupti_us"] = df.fib_us - df.cupti_cold_us
    df["flag"] = (df.fib_over_cupti - 1).abs() > FLAG_THRESHOLD
    return df


def _markdown(df, gpu: str, cfg: dict) -> str:
    cols = ["op", "workload", "solution", "status", "fib_us", "cupti_cold_us", "host_call_us",
            "notebook_cupti_cold_us", "fib_over_cupti", "fib_minus_cupti_us", "flag",
            "max_abs_err"]
    lines = [f"# flashinfer-bench vs our cupti_cold — {gpu}", "",
             f"flashinfer-bench {cfg['version']}: warmup {cfg['warmup']}, iterations "
             f"{cfg['iterations']}, trials {cfg['trials']} (CUDA events after a sync and a "
             "256 MiB L2 flush: the host launch path counts). Ours: cupti_cold and host-call "
             f"medians of {cfg['rep']} calls of the same packed callable. Flag: |fib/cupti - 1| "
             f"> {FLAG_THRESHOLD:.0%}.", ""]
    passed = df[df.status == "PASSED"]
    if len(passed):
        lines += ["Per solution, medians over workloads (µs): the gap `fib - cupti_cold` "
                  "beside the host time of one call.", "",
                  "| solution | flagged | fib - cupti_cold | host_call |", "|---|---|---|---|"]
        for sol, g in passed.groupby("solution", sort=False):
            lines.append(f"| {sol} | {int(g.flag.sum())}/{len(g)} | "
                         f"{g.fib_minus_cupti_us.median():.1f} | {g.host_call_us.median():.1f} |")
        lines.append("")
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    shown = df[cols].copy()
    shown["flag"] = shown.flag.map({True: "**>10 %**", False: ""})
    for r in shown.itertuples(index=False):
        cells = []
        for v in r:
            if isinstance(v, float):
                cells.append("" if v != v else f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.2f}")
            else:
                cells.append("" if v is None else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def evaluate(ops: Sequence[str] = ("decode", "prefill"), *, out: Optional[str] = None,
             warmup: int = 10, iterations: int = 50, trials: int = 3, rep: int = 50,
             baseline: bool = True) -> Path:
    """Run flashinfer-bench on our solutions (and FlashInfer's) for ``ops``; write the
    trace set and the comparison table under ``out`` (default
    ``results/<gpu-slug>/contest``). Returns that folder.

    Raises ``RuntimeError`` without a CUDA GPU or without flashinfer-bench / safetensors.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("contest evaluation needs a CUDA GPU (flashinfer-bench times with "
                           "CUDA events); torch sees none")
    try:
        from flashinfer_bench import Benchmark, BenchmarkConfig, TraceSet
        from flashinfer_bench.data import Definition, Solution
    except ImportError as e:
        raise RuntimeError(f"flashinfer-bench is not importable ({e}); on the GPU host "
                           "install the .gpufib wheels (scripts/gpu_host.sh: gpu_fib)") from e
    from ..device import gpu_slug
    from ..packages import package_version

    slug = gpu_slug()
    root = Path(out) if out else RESULTS / slug / "contest"
    root.mkdir(parents=True, exist_ok=True)
    wls = write_trace_set(root, ops, baseline)
    cfg = BenchmarkConfig(warmup_runs=warmup, iterations=iterations, num_trials=trials,
                          rtol=1e-2, atol=1e-2, profile_baseline=False,
                          log_dir=str(root / "logs"), timeout_seconds=600)
    ts = TraceSet.from_path(str(root))
    bench = Benchmark(ts, cfg)
    try:
        result = bench.run_all(dump_traces=True)
    finally:
        bench.close()

    rows = []
    for op in ops:
        defn = Definition.model_validate(definition(op))
        by_uuid = {wl["trace"]["workload"]["uuid"]: wl for wl in wls[op]}
        sols = {s["name"]: Solution.model_validate(s) for s in solutions_for(op, baseline)}
        for tr in result.traces.get(defn.name, []):
            wl = by_uuid[tr.workload.uuid]
            ev = tr.evaluation
            row = dict(op=op, workload=wl["key"], solution=tr.solution, status=ev.status.value,
                       fib_us=ev.performance.latency_ms * 1e3 if ev.performance else None,
                       max_abs_err=ev.correctness.max_absolute_error if ev.correctness else None,
                       max_rel_err=ev.correctness.max_relative_error if ev.correctness else None,
                       cupti_cold_us=None, host_call_us=None)
            if ev.status.value == "PASSED":     # only a correct solution is timed by us
                row.update(_own_timings(op, wl, defn, sols[tr.solution], rep))
            rows.append(row)
            print(f"{op} {wl['key']:>8} {tr.solution:<24} {row['status']:<20} "
                  f"fib {row['fib_us'] or float('nan'):9.1f} us  cupti_cold "
                  f"{row['cupti_cold_us'] or float('nan'):9.1f} us", flush=True)
        seen = {(r["workload"], r["solution"]) for r in rows if r["op"] == op}
        for wl in wls[op]:      # flashinfer-bench skips a workload whose run raised: say so
            for name in sols:
                if (wl["key"], name) not in seen:
                    rows.append(dict(op=op, workload=wl["key"], solution=name,
                                     status="NO_TRACE (see logs/)", fib_us=None,
                                     max_abs_err=None, max_rel_err=None, cupti_cold_us=None,
                                     host_call_us=None))
    df = comparison_table(rows, notebook_cupti_cold(RESULTS / slug))
    df.to_csv(root / "comparison.csv", index=False)
    info = dict(version=package_version("flashinfer_bench", dists=("flashinfer-bench",)), warmup=warmup,
                iterations=iterations, trials=trials, rep=rep)
    (root / "comparison.md").write_text(_markdown(df, torch.cuda.get_device_name(), info))
    from ..bench.provenance import collect_provenance

    # the suite's provenance record (GPU, driver, torch/triton/peer versions, git sha) with
    # the evaluation's settings as its parameters
    _write_json(root / "run.json", collect_provenance(dict(info, ops=list(ops))))
    print(f"wrote {root}/comparison.csv, comparison.md, traces/")
    return root
