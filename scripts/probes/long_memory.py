"""Ours at long lengths with slow-decay ("long-memory") heads, per gate set and split: graph
us of the whole call, per-kernel us, each gated against the chunked float32 reference of
its own gates (the gate sets of notebook 04's "What the gates cost":
``kernels.stress_inputs.with_gates``). Also times the long path with 32
segments (``gdn_prefill(cp=chunks // 32)``) beside the rule's 16, to see where the split that
suits fast-forgetting gates stops suiting long memory (the device-side split of
docs/notes/long_context.md, "Seventeenth session", predicts from these).

    PYTHONPATH=$PWD python3 scripts/probes/long_memory.py [T ...]   # default 131072
-> $OUT/long_memory_<sha>.jsonl (results/<gpu>/dev_checks/)
"""
import json
import os
import sys

import torch

from kernels.bench.anatomy import kernel_times
from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.prefill import gdn_prefill
from kernels.reference import prefill_reference_chunked
from kernels.spec import make_prefill_inputs
from kernels.stress_inputs import GATE_SETS, with_gates

Ts = [int(a) for a in sys.argv[1:]] or [131072]
sha = os.environ.get("GDN_GIT_SHA", "dev")[:7]
out = open(os.path.join(os.environ.get("OUT", "/tmp"), f"long_memory_{sha}.jsonl"), "w")
gpu = torch.cuda.get_device_name()


def emit(row):
    row.update(gpu=gpu, sha=sha)
    print(json.dumps(row), flush=True)
    out.write(json.dumps(row) + "\n")
    out.flush()


for T in Ts:
    base = make_prefill_inputs([T], seed=0, device="cuda", with_state=True)
    chunks = T // 64
    for gates in GATE_SETS:
        x = with_gates(base, gates)
        ref = prefill_reference_chunked(**x)
        for cp in (None, chunks // 32):   # the rule's split (16 segments) and 32
            fn = (lambda c=cp: gdn_prefill(**x, cp=c))
            r = check_outputs(tuple(fn()), tuple(ref))
            row = dict(T=T, gates=gates, cp=cp, ok=bool(r.ok), max_abs=float(r.max_abs_err),
                       rel_l2=float(r.rel_l2_err))
            if r.ok:
                row["graph_us"] = time_fn(fn, "graph", rep=30, warmup=5).median_us
                if cp is None:
                    kt = kernel_times(fn, calls=3)
                    row["kernels"] = {f"{k.role}|{k.kernel[:40]}": round(k.median_us, 1)
                                      for k in kt.itertuples()}
            emit(row)
            torch.cuda.empty_cache()
        del x, ref
    del base
    torch.cuda.empty_cache()
