"""Per-kernel GPU durations of one prefill call (fused variant) per shape, on a GPU.

    python scripts/prefill_kernel_times.py T64 57x64 T8192
"""
import sys

from kernels.bench.timeline import record_timeline
from kernels.prefill import gdn_prefill
from kernels.spec import PREFILL_SHAPES, make_prefill_inputs

for name in sys.argv[1:] or ["T64", "57x64", "4x1024", "T8192"]:
    x = make_prefill_inputs(PREFILL_SHAPES[name], device="cuda")
    tl = record_timeline(lambda: gdn_prefill(**x, variant="fused"))
    g = tl.gpu
    print(name, " | ".join(f"{r.name[:28]} {r.dur_us:.1f}us" for r in g.itertuples()),
          f"| span {tl.summary()['span_us']:.1f}us")
