"""Does the no-sync grid's gap programs cost the intra-chunk kernel time? (GPU instrument)

    python scripts/intra_gap_check.py [shape ...]

Times the fused variant's intra-chunk kernel (default config: ``"tm"``, batched solve, band
stores, 128-register cap) per shape on the device-lookup grid (``T // 64 + N`` slots per head,
the gap slots' programs exit after the lookup) and on the host-built table's exact grid (one
program per real chunk), torch.profiler kernel durations, median of 7 calls.
"""
import statistics
import sys

import torch

from kernels.bench.timeline import record_timeline
from kernels.prefill.chunk_index import prepare_chunk_indices
from kernels.prefill.intra_chunk import intra_chunk_fwd
from kernels.spec import PREFILL_SHAPES, make_prefill_inputs

for name in sys.argv[1:] or ["57x64", "16x256", "T8192"]:
    x = make_prefill_inputs(PREFILL_SHAPES[name], device="cuda")
    base = dict(a=x["a"], b=x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"], scale=0.088,
                storage="compact", tm_out=True, band_store=True, solve="batched",
                solve_diag="neumann8", maxnreg=128, num_warps=4)
    idx = prepare_chunk_indices(x["cu_seqlens"])
    out = []
    for label, kw in (("device_lookup", {}), ("host_table", dict(chunk_indices=idx))):
        fn = lambda: intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], **base, **kw)  # noqa: E731
        fn()
        ds = [float(record_timeline(fn).gpu["dur_us"].sum()) for _ in range(7)]
        out.append(f"{label}={statistics.median(ds):.1f}")
    print(name, " ".join(out), flush=True)
