"""Driver for Nsight Compute's warp-stall view of the long path's walks at 131,072 tokens:
one warm-up call (compiles), then one call between ``cudaProfilerStart`` / ``Stop``, so
``ncu --profile-from-start off -k regex:state_walk_t_kernel`` sees phase A and phase C of one
call. Gates: argv[1], one of notebook 04's gate sets (default "every head long memory").
Where in the chunk step do the warps wait (the dependent products, the loads, the
layout conversions)? Run it under ncu on the GPU host:

    ncu --clock-control none --profile-from-start off -k regex:state_walk_t_kernel \
        --section WarpStateStats --section SourceCounters --section SpeedOfLight \
        -o /root/walk python3 scripts/probes/walk_stalls.py "every head long memory"
    ncu -i /root/walk.ncu-rep --page source --csv --print-source sass > walk_sass.csv
"""
import sys

import torch

from kernels.prefill import gdn_prefill
from kernels.spec import make_prefill_inputs
from kernels.stress_inputs import with_gates

gates = sys.argv[1] if len(sys.argv) > 1 else "every head long memory"
x = with_gates(make_prefill_inputs([131072], seed=0, device="cuda", with_state=True), gates)
gdn_prefill(**x)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
gdn_prefill(**x)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
