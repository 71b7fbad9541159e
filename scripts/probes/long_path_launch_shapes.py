"""Long-path launch-shape probe: graph us of gdn_prefill (fused) at 32k and 131k for variants of
phase A / C launch shapes and intra warps, each gated against the chunked reference.
Run (GPU host): PYTHONPATH=$PWD python3 scripts/probes/long_path_launch_shapes.py
Writes $OUT/lc3.json (dev_checks/long_path_launch_shapes_d45e49d.json). It wraps
pipeline.state_walk_t_fwd to replace phase A's / phase C's launch shape (the committed
numbers came from an equivalent copy of _cp_long at d45e49d); nothing it tried paid
(docs/notes.md, eleventh session).
"""
import functools
import json
import os

import torch

from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.prefill import gdn_prefill, pipeline
from kernels.reference import prefill_reference_chunked
from kernels.spec import make_prefill_inputs

ORIG_WALK_T = pipeline.state_walk_t_fwd


def make_walk_t(a_stages=3, c_bv=128, c_warps=8, c_stages=2, c_loop=2):
    """state_walk_t_fwd with phase A's (``summary=``) or phase C's (``s0=``) launch shape
    replaced."""
    @functools.wraps(ORIG_WALK_T)
    def walk_t(*args, **kw):
        if kw.get("summary") is not None:
            kw.update(num_stages=a_stages, loop_stages=a_stages)
        elif kw.get("s0") is not None:
            kw.update(BV=c_bv, num_warps=c_warps, num_stages=c_stages, loop_stages=c_loop)
        return ORIG_WALK_T(*args, **kw)
    return walk_t


variants = {
    "base": dict(),
    "A2": dict(a_stages=2),
    "C_bv64_w4": dict(c_bv=64, c_warps=4),
    "C_s3": dict(c_stages=3, c_loop=3),
    "C_bv64_w4_s3": dict(c_bv=64, c_warps=4, c_stages=3, c_loop=3),
    "C_loop1": dict(c_loop=1),
}
intra = {"iw4": 4, "iw8": 8}
rows = []
for lens in ([32768], [131072]):
    x = make_prefill_inputs(lens, seed=0, device="cuda")
    ref = prefill_reference_chunked(**x)
    for iw_name, iw in intra.items():
        for name, kw in variants.items():
            if iw_name != "iw4" and name != "base":
                continue
            pipeline.INTRA_WARPS = iw
            pipeline.state_walk_t_fwd = make_walk_t(**kw)
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
    pipeline.state_walk_t_fwd = ORIG_WALK_T; pipeline.INTRA_WARPS = 4
    del x, ref; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "lc3.json"), "w"))
