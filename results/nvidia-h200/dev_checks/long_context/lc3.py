import os, csv, torch
from kernels.bench.timeline import record_timeline
from kernels.bench.timing import time_fn
from kernels.prefill import gdn_prefill
from kernels.spec import make_prefill_inputs
from kernels.reference import prefill_reference
from kernels.checks import check_outputs
out = os.environ.get("OUT", "/tmp"); rows = []
def run(name, lens, cp, env={}, gate=False):
    for e in list(os.environ):
        if e.startswith("GDN_CPT"): os.environ.pop(e)
    os.environ.update({k: str(v) for k, v in env.items()})
    x = make_prefill_inputs(lens, device="cuda"); T = sum(lens)
    fn = lambda: gdn_prefill(**x, variant="fused", cp=cp)
    try:
        o, s = fn(); torch.cuda.synchronize()
        msg = ""
        if gate:
            r = check_outputs((o, s), prefill_reference(**x)); msg = f" gate={r.ok} {r.max_abs_err:.2e} {r.rel_l2_err:.2e}"
        tl = record_timeline(fn)
        ks = " | ".join(f"{r.name[:14]} {r.dur_us:.1f}" for r in tl.gpu.itertuples())
        g = time_fn(fn, "graph", rep=10 if T >= 500000 else 20, warmup=3)
        print(f"{name:34s} T={T:7d} N={len(lens)} cp={cp} graph={g.median_us:8.1f} :: {ks}{msg}", flush=True)
    except Exception as e:
        print(f"{name} T={T} cp={cp} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del x; torch.cuda.empty_cache()
T = 131072
for env in ({"GDN_CPT_BPREC": "bf16"}, {"GDN_CPT_BPREC": "bf16", "GDN_CPT_BVB": 16},
            {"GDN_CPT_BPREC": "bf16", "GDN_CPT_BVB": 16, "GDN_CPT_BW": 4},
            {"GDN_CPT_BPREC": "bf16", "GDN_CPT_BVB": 64, "GDN_CPT_BW": 8},
            {"GDN_CPT_BPREC": "bf16x2", "GDN_CPT_BVB": 16},
            {"GDN_CPT_BVB": 16, "GDN_CPT_BW": 4}):
    run("env=" + ",".join(f"{k[8:]}{v}" for k, v in env.items()), [T], 64, env)
best = {"GDN_CPT_BPREC": "bf16", "GDN_CPT_BVB": 16, "GDN_CPT_ASTAGES": 3}
run("best", [T], 64, best, gate=True)
for lens, segs in (([8192], (8, 16)), ([16384], (8, 16, 32)), ([32768], (16, 32, 64)), ([65536], (32, 64, 128)), ([131072], (64, 128)), ([1048576], (512, 1024)),
                   ([8192]*4, (16, 32)), ([4096]*8, (16, 32)), ([2048], (4, 8))):
    for sg in segs:
        run(f"best seg={sg}", lens, sg, best)
run("best gate", [1000, 20000, 3, 11000], 8, best, gate=True)
