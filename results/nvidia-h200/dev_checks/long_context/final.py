import os, sys, torch
from kernels.bench.timing import time_fn
from kernels.prefill import gdn_prefill, plan_fused
from kernels.spec import make_prefill_inputs, PREFILL_SHAPES
from kernels.reference import prefill_reference
from kernels.checks import check_outputs
shapes = dict(PREFILL_SHAPES)
shapes.update({"T16384": [16384], "T32768": [32768], "T65536": [65536], "T131072": [131072],
               "T262144": [262144], "T1048576": [1 << 20], "4x8192": [8192] * 4, "8x4096": [4096] * 8,
               "64x512": [512] * 64})
print("shape,T,N,seg,graph_us,cupti_cold_us,gate_ok,rel_l2", flush=True)
for name, lens in shapes.items():
    x = make_prefill_inputs(lens, device="cuda"); T = sum(lens)
    fn = lambda: gdn_prefill(**x)
    o, s = fn(); torch.cuda.synchronize()
    ok, rel = "", ""
    if T <= 131072:
        r = check_outputs((o, s), prefill_reference(**x)); ok, rel = r.ok, f"{r.rel_l2_err:.2e}"
    g = time_fn(fn, "graph", rep=10 if T > 200000 else 30, warmup=3)
    c = time_fn(fn, "cupti_cold", rep=10 if T > 200000 else 30, warmup=3)
    print(f"{name},{T},{len(lens)},{plan_fused(T, len(lens), 8, 128, 'cuda')[1]},{g.median_us:.1f},{c.median_us:.1f},{ok},{rel}", flush=True)
    del x; torch.cuda.empty_cache()
