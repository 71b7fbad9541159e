"""Correctness gate and ``graph`` timings of our kernels under the triton on the path.

    python -m kernels.bench.triton_versions [--out results/<gpu-slug>/triton_versions.csv]

Run once per triton version on the same GPU (the wheel first on ``PYTHONPATH``,
``scripts/triton_wheels.sh``); each run appends its rows, so the file compares the
versions. Cases:

* ``decode``: ``gdn_decode`` with the GPU's dispatch, every contest batch size;
* ``prefill``: ``gdn_prefill`` (``fused``, default config) at every contest prefill
  shape and one long sequence (:data:`LONG`, the long context-parallel path);
* ``prefill-accurate`` and ``prefill`` on the hard inputs of
  :mod:`kernels.stress_inputs` (:data:`STRESS`): gate only. The default config is
  expected to miss the contest tolerance there (docs/notes/prefill.md, "Accuracy on hard
  inputs"); :data:`~kernels.prefill.ACCURATE_CONFIG` to pass.

Every case is gated against the float32 reference on the same inputs (contest rule,
atol = rtol = 1e-2, both outputs); a case that fails is reported and not timed.
Contest-input cases that pass are timed with ``graph`` (warm-L2 replay,
:mod:`kernels.bench.timing`). Columns: ``triton, ptxas, torch, gpu, kernel, shape, inputs,
passed, max_abs_err, rel_l2_err, graph_us, reason, git_sha, timestamp``. At the end it
prints, per case, the ``graph_us`` of every triton version in the file and the ratio to
the first one listed.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, List, Optional, Sequence

__all__ = ["COLUMNS", "LONG", "STRESS", "cases", "ptxas_used", "run", "graph_table", "compare",
           "main"]

COLUMNS = ["triton", "ptxas", "torch", "gpu", "kernel", "shape", "inputs", "passed", "max_abs_err",
           "rel_l2_err", "graph_us", "reason", "git_sha", "timestamp"]
#: One long sequence (tokens): the long context-parallel path (from 16,384).
LONG = 32768
#: Hard prefill inputs: (label, lengths, key spread) of :mod:`kernels.stress_inputs`.
STRESS = (("8x64", [64] * 8, 0.0), ("8x64", [64] * 8, 0.02), ("300+64", [300, 64], 0.02))


def cases(device: str):
    """``(kernel, shape, inputs, call, reference, timed)``: ``call()`` returns the two
    outputs, ``reference`` the float32 reference's (computed once, on ``device``)."""
    from kernels.decode import gdn_decode
    from kernels.prefill import ACCURATE_CONFIG, gdn_prefill
    from kernels.reference import decode_reference, prefill_reference
    from kernels.spec import DECODE_BATCH_SIZES, PREFILL_SHAPES, make_decode_inputs, make_prefill_inputs
    from kernels.stress_inputs import make_prefill_stress_inputs

    def decode_args(x):
        return (x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                x["scale"])

    def prefill_args(x):
        return (x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                x["cu_seqlens"], x["scale"])

    for B in DECODE_BATCH_SIZES:
        args = decode_args(make_decode_inputs(B, device=device))
        yield ("decode", f"B={B}", "contest", lambda a=args: gdn_decode(*a),
               lambda a=args: decode_reference(*a), True)
    shapes = dict(PREFILL_SHAPES)
    shapes[f"T{LONG}"] = [LONG]
    for label, lens in shapes.items():
        args = prefill_args(make_prefill_inputs(lens, device=device))
        yield ("prefill", label, "contest", lambda a=args: gdn_prefill(*a),
               lambda a=args: prefill_reference(*a), True)
    for label, lens, spread in STRESS:
        args = prefill_args(make_prefill_stress_inputs(lens, spread=spread, device=device))
        ref = lambda a=args: prefill_reference(*a)  # noqa: E731
        for kernel, cfg in (("prefill", None), ("prefill-accurate", ACCURATE_CONFIG)):
            yield (kernel, label, f"stress spread={spread}",
                   lambda a=args, c=cfg: gdn_prefill(*a, config=c), ref, False)


def ptxas_used(arch: int) -> str:
    """``"<binary> <version>"`` of the ptxas this triton runs for ``arch`` (e.g. 90): triton
    3.7 uses the wheel's ``ptxas`` up to sm_90, 3.9 its ``ptxas-blackwell`` (CUDA 13) from
    sm_90 on; ``TRITON_PTXAS_PATH`` / ``TRITON_PTXAS_BLACKWELL_PATH`` override either."""
    import inspect

    try:
        from triton.backends.nvidia import compiler as nv

        tool = nv.get_ptxas(arch) if inspect.signature(nv.get_ptxas).parameters else nv.get_ptxas()
        return f"{Path(tool.path).name} {tool.version}"
    except Exception as e:   # an older or newer triton without this helper
        return f"unknown ({type(e).__name__})"


def run(out: Path, device: str = "cuda", rep: int = 50, warmup: int = 10,
        only: Optional[str] = None, log: Callable[[str], None] = print) -> List[dict]:
    """Gate (and time) every case of :func:`cases`; append the rows to ``out``."""
    import torch
    import triton

    from kernels.bench.provenance import git_info
    from kernels.bench.timing import time_fn
    from kernels.checks import check_outputs

    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability()
        ptxas = ptxas_used(10 * major + minor)
    else:
        ptxas = ""
    sha = git_info().get("git_sha", "unknown")
    rows = []
    for kernel, shape, inputs, call, reference, timed in cases(device):
        if only and only not in kernel:
            continue
        row = dict(triton=triton.__version__, ptxas=ptxas, torch=torch.__version__, gpu=gpu, kernel=kernel,
                   shape=shape, inputs=inputs, passed=False, max_abs_err=None,
                   rel_l2_err=None, graph_us=None, reason="", git_sha=sha,
                   timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        t0 = time.perf_counter()
        try:
            r = check_outputs(call(), reference())
            row.update(passed=r.ok, max_abs_err=r.max_abs_err, rel_l2_err=r.rel_l2_err,
                       reason=r.reason[:300])
            if r.ok and timed:
                row["graph_us"] = round(time_fn(call, "graph", rep=rep, warmup=warmup).median_us, 2)
        except Exception as e:   # a case that errors is a row, not the end of the run
            row["reason"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        err = "-" if row["max_abs_err"] is None else f"{row['max_abs_err']:.2e}"
        log(f"{kernel:<17} {shape:<9} {inputs:<19} passed={row['passed']!s:<5} max_abs={err} "
            f"graph_us={row['graph_us']} ({time.perf_counter() - t0:.1f} s) {row['reason'][:80]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with open(out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerows(rows)
    return rows


def graph_table(df):
    """``graph_us`` per ``(kernel, shape)`` (rows) and triton version (columns, in the
    order first seen) of the timed rows of a ``triton_versions.csv`` frame, the last row of
    each case; None if nothing was timed."""
    df = df[df.graph_us.notna()].drop_duplicates(["triton", "kernel", "shape", "inputs"], keep="last")
    if df.empty:
        return None
    return df.pivot_table(index=["kernel", "shape"], columns="triton", values="graph_us",
                          sort=False)


def compare(path: Path) -> str:
    """``graph_us`` per case and triton version in ``path`` (last row of each), with the
    ratio to the first version."""
    import pandas as pd

    t = graph_table(pd.read_csv(path))
    if t is None:
        return "no timed rows"
    versions = list(t.columns)
    for v in versions[1:]:
        t[f"{v} / {versions[0]}"] = (t[v] / t[versions[0]]).round(3)
    return t.to_string()


def main(argv: Optional[Sequence[str]] = None) -> int:
    from kernels.device import gpu_slug

    ap = argparse.ArgumentParser(prog="python -m kernels.bench.triton_versions",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="CSV to append to (default results/<gpu-slug>/triton_versions.csv)")
    ap.add_argument("--rep", type=int, default=50, help="graph replays per timing sample set")
    ap.add_argument("--only", help="only kernels whose name contains this (decode, prefill)")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("triton_versions: needs a CUDA GPU (graph timing, the kernels compiled for it)",
              file=sys.stderr)
        return 2
    out = Path(a.out or f"results/{gpu_slug()}/triton_versions.csv")
    rows = run(out, rep=a.rep, only=a.only)
    print(compare(out))
    bad = [r for r in rows if r["inputs"] == "contest" and not r["passed"]]
    print(f"{len(rows)} rows appended to {out}; {len(bad)} contest case(s) failed the gate")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
