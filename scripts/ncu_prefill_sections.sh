#!/usr/bin/env bash
# Nsight Compute sections of the fused prefill's kernels, one call per shape (GPU host).
#
#   bash scripts/ncu_prefill_sections.sh OUTDIR [shape ...]
#
# Shapes are names of kernels.spec.PREFILL_SHAPES (default: 57x64 16x256 T8192). Per shape
# writes OUTDIR/ncu_<shape>.txt: ncu's details page (speed of light, occupancy, launch
# statistics, warp states, memory workload) for every kernel of one measured call
# (kernels.bench.ncu_target; ncu's defaults: caches flushed, base clocks).
set -euo pipefail
out=${1:?usage: ncu_prefill_sections.sh OUTDIR [shape ...]}; shift
mkdir -p "$out"
shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(57x64 16x256 T8192)
for s in "${shapes[@]}"; do
  lens=$(python3 -c "from kernels.spec import PREFILL_SHAPES as P; print(','.join(map(str, P['$s'])))")
  ncu --nvtx --nvtx-include gdnbench_measured/ --target-processes all \
      --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      --section ComputeWorkloadAnalysis \
      python3 -m kernels.bench.ncu_target --impl ours --op prefill --variant fused \
      --lens "$lens" > "$out/ncu_$s.txt" 2>&1 || echo "ncu failed for $s (see $out/ncu_$s.txt)"
done
