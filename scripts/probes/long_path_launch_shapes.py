"""Long-path launch-shape probe: graph us of gdn_prefill (fused) at 32k and 131k for variants of
phase A / C launch shapes and intra warps, each gated against the chunked reference.
Run (GPU host): PYTHONPATH=$PWD python3 scripts/probes/long_path_launch_shapes.py
Writes $OUT/lc3.json (dev_checks/long_path_launch_shapes_d45e49d.json). It replaces
pipeline._cp_long with a copy whose launch shapes are parameters: valid for the code of
d45e49d; nothing it tried paid (docs/notes.md, eleventh session).
"""
import json, os, sys
import torch
from kernels.spec import make_prefill_inputs
from kernels.prefill import gdn_prefill, pipeline
from kernels.prefill.pipeline import (num_slots, state_walk_t_fwd, segment_combine_t_fwd)
from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.reference import prefill_reference_chunked

def make_cp_long(a_stages=3, c_bv=128, c_warps=8, c_stages=2, c_loop=2):
    def _cp_long(q, k, v, tb, aq, gc, lb, cu_seqlens, state, o, ht, scale, seg_t, cfg, go_intra,
                 guard, status):
        T, HV, D = q.shape[0], v.shape[1], v.shape[2]
        N = cu_seqlens.numel() - 1
        S = num_slots(T, N, seg_t)
        summ = torch.empty(S, HV, 2 * D, D, dtype=torch.float32, device=q.device)
        s0 = torch.empty(S, HV, D, D, dtype=torch.float32, device=q.device)
        negl = torch.empty(S, HV, dtype=torch.int32, device=q.device)
        kw = dict(scale=scale, dot_precision=cfg.precision, out_precision=cfg.precision,
                  seg_t=seg_t, defer=True)
        go_a = state_walk_t_fwd(q, k, v, tb, aq, gc, cu_seqlens, summary=summ, pdl=cfg.pdl,
                                BV=128, num_warps=8, num_stages=a_stages, loop_stages=a_stages,
                                log_bound=lb, negligible=negl, **kw)
        go_b = segment_combine_t_fwd(summ, s0, negl, cu_seqlens, state, seg_t=seg_t, T=T,
                                     BV=min(16, D), defer=True)
        go_c = state_walk_t_fwd(q, k, v, tb, aq, gc, cu_seqlens, s0=s0, output=o, final_state=ht,
                                BV=c_bv, num_warps=c_warps, num_stages=c_stages,
                                loop_stages=c_loop, guard=guard, status=status, **kw)
        go_intra(); go_a(); go_b(); go_c()
    return _cp_long

variants = {
    "base": dict(),
    "A2": dict(a_stages=2),
    "C_bv64_w4": dict(c_bv=64, c_warps=4),
    "C_s3": dict(c_stages=3, c_loop=3),
    "C_bv64_w4_s3": dict(c_bv=64, c_warps=4, c_stages=3, c_loop=3),
    "C_loop1": dict(c_loop=1),
}
intra = {"iw4": 4, "iw8": 8}
orig = pipeline._cp_long
rows = []
for lens in ([32768], [131072]):
    x = make_prefill_inputs(lens, seed=0, device="cuda")
    ref = prefill_reference_chunked(**x)
    for iw_name, iw in intra.items():
        for name, kw in variants.items():
            if iw_name != "iw4" and name != "base":
                continue
            pipeline.INTRA_WARPS = iw
            pipeline._cp_long = make_cp_long(**kw)
            fn = lambda: gdn_prefill(**x, variant="fused")
            try:
                out = fn(); torch.cuda.synchronize()
                r = check_outputs(tuple(out), tuple(ref))
                t = time_fn(fn, "graph", rep=30, warmup=3) if r.ok else None
                row = dict(lens=lens[0], variant=f"{iw_name}+{name}", ok=bool(r.ok),
                           max_abs=float(r.max_abs_err), graph_us=None if t is None else float(t.median_us))
            except Exception as e:
                row = dict(lens=lens[0], variant=f"{iw_name}+{name}", ok=False, error=f"{type(e).__name__}: {e}"[:200])
            print(json.dumps(row), flush=True); rows.append(row)
    pipeline._cp_long = orig; pipeline.INTRA_WARPS = 4
    del x, ref; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "lc3.json"), "w"))
