"""A/B probe for a change to the walks: ours (``gdn_prefill``, default config) at the long
lengths with each gate set of notebook 04's "What the gates cost", and at the batch and
contest shapes with the generator's gates, each gated against the chunked float32
reference of its own inputs (contest rule) before it is timed (graph replay) and split per
kernel. Run it once per tree, the other tree's ``kernels/`` first on ``PYTHONPATH``
(``git archive <sha> kernels | tar -x -C build/ab_old``), in one call so both ran on
the same GPU:

    GDN_AB_LABEL=old PYTHONPATH=build/ab_old:$PWD python3 scripts/probes/walk_ab.py
    GDN_AB_LABEL=new PYTHONPATH=$PWD python3 scripts/probes/walk_ab.py
-> $OUT/walk_ab_<label>_<sha>.jsonl (results/<gpu>/dev_checks/)
"""
import json
import os

import torch

import kernels
from kernels.bench.anatomy import kernel_times
from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.prefill import gdn_prefill
from kernels.reference import prefill_reference_chunked
from kernels.spec import make_prefill_inputs
from kernels.stress_inputs import GATE_SETS, with_gates

CASES = ([([131072], g) for g in GATE_SETS] + [([65536], g) for g in GATE_SETS[:2]]
         + [([32768], "generator"), ([16384], "generator"), ([8192], "generator"),
            ([8192] * 4, "generator"), ([4096] * 8, "generator"), ([64] * 57, "generator"),
            ([256] * 16, "generator"), ([6], "generator")])
label = os.environ.get("GDN_AB_LABEL", "dev")
sha = os.environ.get("GDN_GIT_SHA", "dev")[:7]
out = open(os.path.join(os.environ.get("OUT", "/tmp"), f"walk_ab_{label}_{sha}.jsonl"), "w")
gpu = torch.cuda.get_device_name()
print("kernels from", os.path.dirname(kernels.__file__), flush=True)

for lens, gates in CASES:
    x = with_gates(make_prefill_inputs(lens, seed=0, device="cuda", with_state=True), gates)
    ref = prefill_reference_chunked(**x)
    fn = lambda: gdn_prefill(**x)   # noqa: E731
    r = check_outputs(tuple(fn()), tuple(ref))
    name = f"{len(lens)}x{lens[0]}" if len(lens) > 1 else str(lens[0])
    row = dict(lens=name, gates=gates, label=label, ok=bool(r.ok),
               max_abs=float(r.max_abs_err), rel_l2=float(r.rel_l2_err))
    if r.ok:
        row["graph_us"] = time_fn(fn, "graph", rep=30, warmup=5).median_us
        kt = kernel_times(fn, calls=3)
        row["kernels"] = {f"{k.role}|{k.kernel[:24]}": round(k.median_us, 1)
                          for k in kt.itertuples()}
    row.update(gpu=gpu, sha=sha)
    print(json.dumps(row), flush=True)
    out.write(json.dumps(row) + "\n")
    out.flush()
    del x, ref
    torch.cuda.empty_cache()
