"""Chained-path truncation probe: graph us of gdn_prefill (fused, default) at the shapes the
chained CP path serves and neighbours, gated against the float32 chunked reference.
Run (GPU host, from the repository root) once per tree, tag as the first argument:
    git archive 17ec1db kernels | tar -x -C /tmp/main   # here (main before the merge)
    git archive 299627a kernels | tar -x -C /tmp/lcc    # here (branch lc-chained, merged as 8af862f)
    PYTHONPATH=/tmp/main:$PWD python3 scripts/probes/lc_chained.py main   # carry both folders
    PYTHONPATH=/tmp/lcc:$PWD python3 scripts/probes/lc_chained.py lcc
Writes $OUT/lcc_<tag>.json (results/nvidia-h100-80gb-hbm3/dev_checks/lc_chained_probe_*.json).
"""
import json, os, sys
import torch
import kernels
from kernels.spec import make_prefill_inputs
from kernels.prefill import gdn_prefill
from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.reference import prefill_reference_chunked
tag = sys.argv[1]
print(tag, kernels.__file__, flush=True)
shapes = [[64] * 57, [8192], [4096] * 8, [8192] * 4, [12288], [4096], [16384]]
rows = []
for rnd in range(2):
    for lens in shapes:
        x = make_prefill_inputs(lens, seed=0, device="cuda")
        fn = lambda: gdn_prefill(**x, variant="fused")
        out = fn(); torch.cuda.synchronize()
        gate = None
        if rnd == 0:
            ref = prefill_reference_chunked(**x)
            r = check_outputs(tuple(out), tuple(ref))
            gate = dict(ok=bool(r.ok), max_abs=float(r.max_abs_err), rel_l2=float(r.rel_l2_err))
        t = time_fn(fn, "graph", rep=50, warmup=5)
        row = dict(tag=tag, rnd=rnd, lens=f"{len(lens)}x{lens[0]}", graph_us=float(t.median_us), gate=gate)
        print(json.dumps(row), flush=True)
        rows.append(row)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"lcc_{tag}.json"), "w"))
