"""Stage timing of the intra-chunk kernel on a GPU (instrument, results invalid).

    python scripts/intra_stage_times.py [shape ...]

For each shape: GPU time of the fused variant's first kernel (raw gates, output
terms) ending after step 1 (``A``), after step 2 (the solve), without the output
terms, complete, and with the ``"tm"`` intermediates (stops after the solve,
stores ``Tb`` and ``scale * Aqk``); torch.profiler kernel durations, median of 5 calls.
"""
import statistics
import sys

import torch

from kernels.bench.timeline import record_timeline
from kernels.prefill.intra_chunk import intra_chunk_fwd
from kernels.spec import PREFILL_SHAPES, make_prefill_inputs

for name in sys.argv[1:] or ["T64", "57x64", "T8192"]:
    x = make_prefill_inputs(PREFILL_SHAPES[name], device="cuda")
    base = dict(a=x["a"], b=x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"], storage="compact",
                num_warps=4, col_blocks=2)
    cases = {
        "stop1_A": dict(stop_after=1, q=x["q"]),
        "stop2_solve": dict(stop_after=2, q=x["q"]),
        "w_u_only": dict(),
        "full": dict(q=x["q"], scale=0.088),
        "full_tile": dict(q=x["q"], scale=0.088, solve="tile"),
        "full_bf16": dict(q=x["q"], scale=0.088, wu_precision="bf16", out_precision="bf16"),
        "tm": dict(q=x["q"], scale=0.088, tm_out=True),
    }
    out = []
    for label, kw in cases.items():
        fn = lambda: intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], **base, **kw)  # noqa: E731
        ds = []
        for _ in range(5):
            tl = record_timeline(fn)
            ds.append(float(tl.gpu["dur_us"].sum()))
        out.append(f"{label}={statistics.median(ds):.1f}")
    print(name, " ".join(out), flush=True)
    torch.cuda.empty_cache()
