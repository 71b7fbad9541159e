"""Long-context probe: per-kernel times and graph time of the fused prefill vs variants."""
import sys, time, os, csv
import torch
from kernels.bench.timeline import record_timeline
from kernels.bench.timing import time_fn
from kernels.prefill import gdn_prefill, plan_fused, PrefillConfig
from kernels.spec import make_prefill_inputs
out = os.environ.get("OUT", "/tmp")
rows = []
def run(name, lens, cfg=None, cp=None):
    x = make_prefill_inputs(lens, device="cuda")
    T = sum(lens); N = len(lens)
    fn = lambda: gdn_prefill(**x, variant="fused", config=cfg, cp=cp)
    try:
        BV, seg = plan_fused(T, N, 8, 128, "cuda", cp, cfg)
        o, s = fn(); torch.cuda.synchronize()
        tl = record_timeline(fn)
        ks = " | ".join(f"{r.name[:22]} {r.dur_us:.1f}" for r in tl.gpu.itertuples())
        g = time_fn(fn, "graph", rep=10 if T >= 500000 else 30, warmup=3)
        fin = bool(torch.isfinite(o.float()).all())
        print(f"{name:22s} T={T:8d} N={N:3d} BV={BV} seg={seg} graph={g.median_us:9.1f}us finite={fin} :: {ks}", flush=True)
        rows.append(dict(name=name, T=T, N=N, BV=BV, seg=seg, graph_us=g.median_us, kernels=ks))
    except Exception as e:
        print(f"{name} T={T} FAILED {type(e).__name__}: {e}", flush=True)
    del x; torch.cuda.empty_cache()

L = [8192, 16384, 32768, 65536, 131072]
for n in L + [262144, 1048576]:
    run("default", [n])
for n in [32768, 131072, 1048576]:
    run("combine=kernel", [n], PrefillConfig(cp_combine="kernel"))
for n in [131072]:
    for seg in (16, 32, 128, 256):
        run(f"seg={seg}", [n], cp=seg)
        run(f"seg={seg},kernel", [n], PrefillConfig(cp_combine="kernel"), cp=seg)
    run("walkBV=64", [n], PrefillConfig(walk_BV=64))
    run("walkBV=16", [n], PrefillConfig(walk_BV=16))
    run("nocp", [n], cp=False)
for lens in ([8192]*4, [4096]*8, [512]*64):
    run("default", lens)
with open(os.path.join(out, "lc.csv"), "w") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
