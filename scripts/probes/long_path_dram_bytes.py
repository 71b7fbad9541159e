"""One fused prefill call at 131,072 tokens, for Nsight Compute to count each long-path kernel's
DRAM bytes (are q and k read once per q/k head or once per value head?).
Run (GPU host):
    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
        -k regex:"state_walk_t_kernel|intra_chunk_kernel|segment_combine" --csv \
        python3 scripts/probes/long_path_dram_bytes.py > $OUT/long_path_dram_bytes.csv
(results/nvidia-h100-80gb-hbm3/dev_checks/long_path_dram_bytes_<sha>.csv; docs/notes.md).
"""
import sys

import torch

from kernels.prefill import gdn_prefill
from kernels.spec import make_prefill_inputs

T = int(sys.argv[1]) if len(sys.argv) > 1 else 131072
x = make_prefill_inputs([T], seed=0, device="cuda")
gdn_prefill(**x, variant="fused")
torch.cuda.synchronize()
