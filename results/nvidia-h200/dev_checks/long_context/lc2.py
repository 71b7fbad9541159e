import os, csv, torch
from kernels.bench.timeline import record_timeline
from kernels.bench.timing import time_fn
from kernels.prefill import gdn_prefill
from kernels.spec import make_prefill_inputs
from kernels.reference import prefill_reference
from kernels.checks import check_outputs
out = os.environ.get("OUT", "/tmp"); rows = []
ENV = ("GDN_CPT_BVA", "GDN_CPT_BVC", "GDN_CPT_STAGES", "GDN_CPT_LOOP", "GDN_CPT_BVB")
def run(name, lens, cp, env={}, gate=False):
    for e in ENV: os.environ.pop(e, None)
    os.environ.update({k: str(v) for k, v in env.items()})
    x = make_prefill_inputs(lens, device="cuda"); T = sum(lens)
    fn = lambda: gdn_prefill(**x, variant="fused", cp=cp)
    try:
        o, s = fn(); torch.cuda.synchronize()
        msg = ""
        if gate:
            ref = prefill_reference(**x)
            r = check_outputs((o, s), ref)
            msg = f" gate={r}"
        tl = record_timeline(fn)
        ks = " | ".join(f"{r.name[:18]} {r.dur_us:.1f}" for r in tl.gpu.itertuples())
        g = time_fn(fn, "graph", rep=10 if T >= 500000 else 20, warmup=3)
        print(f"{name:26s} T={T:8d} N={len(lens)} cp={cp} graph={g.median_us:9.1f}us :: {ks}{msg}", flush=True)
        rows.append(dict(name=name, T=T, N=len(lens), cp=cp, graph_us=g.median_us, kernels=ks))
    except Exception as e:
        print(f"{name} T={T} cp={cp} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del x; torch.cuda.empty_cache()

run("gate", [32768], 16, gate=True)
run("gate", [1000, 20000, 3, 11000], 8, gate=True)
for T in [16384, 32768, 65536, 131072]:
    ch = T // 64
    for nseg in (16, 32, 64):
        run(f"nseg={nseg}", [T], max(ch // nseg, 1))
T = 131072
for env in ({"GDN_CPT_BVC": 64}, {"GDN_CPT_BVA": 64, "GDN_CPT_BVC": 64}, {"GDN_CPT_STAGES": 3}, {"GDN_CPT_LOOP": 3, "GDN_CPT_STAGES": 3}, {"GDN_CPT_LOOP": 1}, {"GDN_CPT_BVB": 16}):
    run("env=" + ",".join(f"{k[8:]}{v}" for k, v in env.items()), [T], 64, env)
for nseg in (16, 32, 64):
    run(f"nseg={nseg}", [1048576], 16384 // nseg)
for lens, segs in (([8192]*4, (8, 16, 32)), ([4096]*8, (4, 8, 16)), ([8192], (4, 8, 16))):
    for sg in segs:
        run(f"seg={sg}", lens, sg)
with open(os.path.join(out, "lc2.csv"), "w") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
