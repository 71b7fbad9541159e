"""One-call GPU development check: correctness gate + quick timings, ours vs peers.

Used by the lead to tune between full notebook runs (the device lease is short).
Writes CSVs to OUTDIR and prints a compact table last.

    python scripts/gpu_dev_check.py OUTDIR [--decode] [--prefill] [--grid small|big]

Decode: every config of the grid is gated at each B, timed with `event`
(cheap), then the 4 best per B and the peers are re-timed with `cupti_cold`.
Prefill: every variant and peer is gated and timed with `graph` and `cupti_cold`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from kernels.bench.timing import MethodUnavailable, time_fn
from kernels.checks import check_outputs
from kernels.decode import config_grid, gdn_decode
from kernels.peers import decode_impls, prefill_impls
from kernels.reference import decode_reference, prefill_reference
from kernels.spec import DECODE_BATCH_SIZES, PREFILL_SHAPES, make_decode_inputs, make_prefill_inputs


def _gate(fn, inputs, ref):
    try:
        out = fn(**inputs)
        torch.cuda.synchronize()
    except Exception as e:  # reported, not timed
        return False, f"{type(e).__name__}: {e}"[:200]
    res = check_outputs(out, ref)
    return res.ok, f"max_abs={res.max_abs_err:.2e} rel_l2={res.rel_l2_err:.2e} {res.reason}"[:200]


def _time(fn, method, rep):
    try:
        t = time_fn(fn, method, rep=rep, warmup=5)
        return t.median_us
    except MethodUnavailable as e:
        print("  unavailable:", e, file=sys.stderr)
        return float("nan")


def decode_check(out: Path, grid: str, rep: int):
    if grid == "mid":
        configs = config_grid(BVs=(4, 8, 16, 32, 64), warps=(1, 2, 4, 8), v_tiles=(1, 2),
                              BKs=(16, 32, 128), prefetch=(False,), evict_first=(False, True))
    elif grid == "big":
        configs = config_grid(BVs=(4, 8, 16, 32, 64), warps=(1, 2, 4, 8), v_tiles=(1, 2, 4, 8),
                              BKs=(16, 32, 64, 128), prefetch=(False, True))
    else:
        configs = config_grid(BVs=(8, 16, 32), warps=(1, 2, 4), v_tiles=(1, 2, 4), BKs=(32, 128),
                              prefetch=(False, True))
    peers = {n: f for n, f in decode_impls(("fla", "flashinfer_inplace", "flashinfer")).items() if f}
    print(f"decode: {len(configs)} configs, peers {list(peers)}", flush=True)
    rows = []
    for B in DECODE_BATCH_SIZES:
        inp = make_decode_inputs(B, seed=B, device="cuda")
        ref = decode_reference(**inp)
        t0 = time.time()
        for cfg in configs:
            fn = lambda c=cfg: gdn_decode(**inp, config=c)
            ok, msg = _gate(lambda **kw: fn(), inp, ref)
            ev = _time(fn, "event", rep) if ok else float("nan")
            rows.append(dict(impl="ours", config=cfg.name, B=B, ok=ok, msg=msg, event_us=ev))
        df = pd.DataFrame([r for r in rows if r["B"] == B and r["ok"]])
        best = df.nsmallest(4, "event_us")
        for i, r in best.iterrows():
            from kernels.decode import DecodeConfig
            c = DecodeConfig.from_name(r["config"])
            rows.append(dict(impl="ours-best", config=c.name, B=B, ok=True, msg="",
                             event_us=r["event_us"],
                             cupti_us=_time(lambda c=c: gdn_decode(**inp, config=c), "cupti_cold", rep),
                             graph_us=_time(lambda c=c: gdn_decode(**inp, config=c), "graph", rep)))
        for name, f in peers.items():
            fn = lambda f=f: f(**inp)
            ok, msg = _gate(f, inp, ref) if name != "flashinfer_inplace" else (True, "inplace")
            rows.append(dict(impl=name, config="", B=B, ok=ok, msg=msg,
                             event_us=_time(fn, "event", rep),
                             cupti_us=_time(fn, "cupti_cold", rep),
                             graph_us=_time(fn, "graph", rep)))
        print(f"  B={B}: {time.time() - t0:.1f}s", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "dev_decode.csv", index=False)
    bad = df[~df.ok]
    if len(bad):
        print("DECODE GATE FAILURES:\n", bad[["impl", "config", "B", "msg"]].head(20).to_string())
    summ = df[df.impl != "ours"].pivot_table(index="B", columns="impl", values="cupti_us", aggfunc="min")
    print("decode cupti_cold median us (ours-best = best of top-4 by event):\n", summ.round(2).to_string())
    top = df[df.impl == "ours-best"].sort_values(["B", "cupti_us"]).groupby("B").head(2)
    print(top[["B", "config", "event_us", "cupti_us", "graph_us"]].round(2).to_string())


def prefill_check(out: Path, rep: int):
    from kernels.prefill import VARIANTS, make_prefill_impl
    impls = {f"ours-{v}": make_prefill_impl(v) for v in VARIANTS}
    impls.update({n: f for n, f in prefill_impls(("fla", "flashinfer")).items() if f})
    rows = []
    for label, lens in PREFILL_SHAPES.items():
        inp = make_prefill_inputs(lens, seed=len(lens), device="cuda")
        t0 = time.time()
        ref = prefill_reference(**inp)
        for name, f in impls.items():
            ok, msg = _gate(f, inp, ref)
            fn = lambda f=f: f(**inp)
            row = dict(impl=name, lens=label, T=sum(lens), ok=ok, msg=msg)
            if ok:
                row["graph_us"] = _time(fn, "graph", rep)
                row["cupti_us"] = _time(fn, "cupti_cold", min(rep, 30))
            rows.append(row)
        print(f"  {label}: {time.time() - t0:.1f}s", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "dev_prefill.csv", index=False)
    bad = df[~df.ok]
    if len(bad):
        print("PREFILL GATE FAILURES:\n", bad[["impl", "lens", "msg"]].to_string())
    for col in ("graph_us", "cupti_us"):
        if col in df:
            print(f"prefill {col}:\n", df.pivot_table(index="lens", columns="impl", values=col,
                                                      sort=False).round(1).to_string())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("outdir")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--prefill", action="store_true")
    ap.add_argument("--grid", default="small", choices=("small", "mid", "big"))
    ap.add_argument("--rep", type=int, default=50)
    a = ap.parse_args(argv)
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if a.prefill:
        prefill_check(out, a.rep)
    if a.decode:
        decode_check(out, a.grid, a.rep)


if __name__ == "__main__":
    main()
