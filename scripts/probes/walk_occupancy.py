"""Probe: do two long-path walks per SM pay?  Phase A (``[M^T ; X^T]``, 8 warps, 240 registers)
and phase C (8 warps, 255 registers) run one program per SM; the register file, not shared
memory, keeps a second one out. With ``maxnreg = 128`` two fit (sm_90 compile: phase A spills
408 B per thread, phase C 880 B). Question: with every head long-memory, phase A is 256
programs in two waves (595 us at 131k on the H200): is it latency per step (a second program
per SM overlaps: faster) or a per-SM throughput limit (no gain, or the spills make it slower)?

Variants (each wraps ``pipeline.state_walk_t_fwd`` to add ``maxnreg`` to phase A's
``summary=`` or phase C's ``s0=`` launch; ``seg32``: 32 segments instead of the rule's 16),
at 131,072 tokens (and 32,768) for the three gate sets of notebook 04's "What the gates
cost", each gated against the chunked float32 reference of its own gates (contest rule)
before it is timed (graph replay) and split per kernel.

    PYTHONPATH=$PWD python3 scripts/probes/walk_occupancy.py [T ...]
-> $OUT/walk_occupancy_<sha>.jsonl (results/<gpu>/dev_checks/)
"""
import functools
import json
import os
import sys

import torch

from kernels.bench.anatomy import kernel_times
from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.prefill import gdn_prefill, pipeline
from kernels.reference import prefill_reference_chunked
from kernels.spec import make_prefill_inputs
from kernels.stress_inputs import GATE_SETS, with_gates

ORIG = pipeline.state_walk_t_fwd


def walk_with(a_reg=None, c_reg=None):
    """``state_walk_t_fwd`` with ``maxnreg`` added to phase A's and / or phase C's launch."""
    if a_reg is None and c_reg is None:
        return ORIG

    def bound(*args, **kw):
        reg = a_reg if kw.get("summary") is not None else c_reg if kw.get("s0") is not None else None
        if reg is None:
            return ORIG(*args, **kw)
        from kernels.prefill import state_walk_t as swt
        real_bind = swt._WALK_T_LAUNCH.bind

        def bind(grid, args_, kwargs):
            return real_bind(grid, args_, dict(kwargs, maxnreg=reg))
        swt._WALK_T_LAUNCH.bind = bind
        try:
            return ORIG(*args, **kw)
        finally:
            swt._WALK_T_LAUNCH.bind = real_bind
    return functools.wraps(ORIG)(bound)


VARIANTS = {
    "base": dict(),
    "A128": dict(a_reg=128),
    "C128": dict(c_reg=128),
    "AC128": dict(a_reg=128, c_reg=128),
    "seg32": dict(seg=32),
    "AC128+seg32": dict(a_reg=128, c_reg=128, seg=32),
}

Ts = [int(a) for a in sys.argv[1:]] or [131072, 32768]
sha = os.environ.get("GDN_GIT_SHA", "dev")[:7]
out = open(os.path.join(os.environ.get("OUT", "/tmp"), f"walk_occupancy_{sha}.jsonl"), "w")
DEVICE = os.environ.get("GDN_PROBE_DEVICE", "cuda")   # "cpu": an interpreter smoke run
gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"


def emit(row):
    row.update(gpu=gpu, sha=sha)
    print(json.dumps(row), flush=True)
    out.write(json.dumps(row) + "\n")
    out.flush()


for T in Ts:
    base = make_prefill_inputs([T], seed=0, device=DEVICE, with_state=True)
    for gates in GATE_SETS:
        x = with_gates(base, gates)
        ref = prefill_reference_chunked(**x)
        for name, v in VARIANTS.items():
            if T != 131072 and name not in ("base", "AC128"):
                continue
            pipeline.state_walk_t_fwd = walk_with(v.get("a_reg"), v.get("c_reg"))
            cp = (T // 64) // v["seg"] if "seg" in v else None
            fn = (lambda c=cp: gdn_prefill(**x, cp=c))
            row = dict(T=T, gates=gates, variant=name)
            try:
                r = check_outputs(tuple(fn()), tuple(ref))
                row.update(ok=bool(r.ok), max_abs=float(r.max_abs_err), rel_l2=float(r.rel_l2_err))
                if r.ok and DEVICE == "cuda":
                    row["graph_us"] = time_fn(fn, "graph", rep=30, warmup=5).median_us
                    kt = kernel_times(fn, calls=3)
                    row["kernels"] = {f"{k.role}|{k.kernel[:24]}": round(k.median_us, 1)
                                      for k in kt.itertuples()}
            except Exception as e:   # noqa: BLE001 -- report, go on
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
            emit(row)
            pipeline.state_walk_t_fwd = ORIG
            torch.cuda.empty_cache()
        del x, ref
    del base
    torch.cuda.empty_cache()
