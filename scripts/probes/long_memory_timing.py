"""Does the long path's time depend on the gates? Phase A skips what the decay has made
negligible (prefill v11), so its time follows the slowest-decaying head: with the contest
generator's seed-0 gates its longest walk at 131,072 tokens is 22 chunks of a 128-chunk
segment (docs/notes.md, "Phase A at 131k"). Gates in the generator's own "Qwen3-Next-like"
range can decay far slower (A = 1, dt = 1e-3: about -0.1 per 64-token chunk, so a segment's
transition stays far above exp(-20)), and then phase A walks whole segments again.

Times gdn_prefill (graph, warm L2, median) and its kernels (eager, CUPTI) at 32k and 131k
for three gate sets on the same q, k, v: the generator's (seed 0), one head (0) with long
memory, every head with long memory; each gated against the chunked float32 reference.
Run (GPU host, no bundles): PYTHONPATH=$PWD python3 scripts/probes/long_memory_timing.py
-> $OUT/long_memory_timing.json (results/<gpu>/dev_checks/long_memory_timing_<sha>.json)
"""
import json
import math
import os

import torch

from kernels.prefill import gdn_prefill
from kernels.reference import prefill_reference_chunked
from kernels.spec import make_prefill_inputs

LONG_A_LOG = 0.0                                       # A = 1
LONG_DT_BIAS = 1e-3 + math.log(-math.expm1(-1e-3))     # softplus^-1(1e-3)


def gate_sets(x):
    """(name, inputs) for the three gate sets, sharing every other tensor."""
    one, every = dict(x), dict(x)
    one["A_log"], one["dt_bias"] = x["A_log"].clone(), x["dt_bias"].clone()
    one["A_log"][0], one["dt_bias"][0] = LONG_A_LOG, LONG_DT_BIAS
    every["A_log"] = torch.full_like(x["A_log"], LONG_A_LOG)
    every["dt_bias"] = torch.full_like(x["dt_bias"], LONG_DT_BIAS)
    return [("generator", x), ("one long-memory head", one), ("every head long memory", every)]


def main():
    from kernels.bench.anatomy import kernel_times
    from kernels.bench.timing import time_fn
    from kernels.checks import check_outputs

    rows = []
    for lens in ([32768], [131072]):
        x = make_prefill_inputs(lens, seed=0, device="cuda")
        for name, inp in gate_sets(x):
            ref = prefill_reference_chunked(**inp)
            fn = lambda: gdn_prefill(**inp)
            r = check_outputs(tuple(fn()), tuple(ref))
            row = dict(lens=lens[0], gates=name, ok=bool(r.ok), max_abs=float(r.max_abs_err),
                       rel_l2=float(r.rel_l2_err))
            if r.ok:
                row["graph_us"] = float(time_fn(fn, "graph", rep=30, warmup=3).median_us)
                kt = kernel_times(fn, calls=3)
                row["kernels"] = kt[["kernel", "role", "median_us"]].to_dict("records")
            print(json.dumps(row), flush=True)
            rows.append(row)
            del ref
        del x
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "long_memory_timing.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
