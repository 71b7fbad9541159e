#!/usr/bin/env bash
# Per-instruction (SASS) stall samples of one prefill kernel, Nsight Compute (GPU host).
#
#   bash scripts/ncu_walk_source.sh OUTDIR [shape] [kernel-regex]
#
# Profiles the first launch matching the regex (default: the state walk) in one measured
# call of the fused variant at the shape (default 57x64) with the source counters and warp
# state sections, then exports the source page (SASS, one row per instruction with its
# stall-reason samples) as OUTDIR/ncu_source_<shape>.csv and the details as .txt.
set -euo pipefail
out=${1:?usage: ncu_walk_source.sh OUTDIR [shape] [kernel-regex]}
shape=${2:-57x64}
kern=${3:-state_walk}
mkdir -p "$out"
lens=$(python3 -c "from kernels.spec import PREFILL_SHAPES as P; print(','.join(map(str, P['$shape'])))")
ncu --nvtx --nvtx-include gdnbench_measured/ --target-processes all -k "regex:$kern" -c 1 \
    --section SourceCounters --section WarpStateStats --import-source yes \
    -o "$out/rep_$shape" -f \
    python3 -m kernels.bench.ncu_target --impl ours --op prefill --variant fused --lens "$lens" \
    > "$out/ncu_run_$shape.log" 2>&1
ncu -i "$out/rep_$shape.ncu-rep" --page details > "$out/ncu_source_$shape.txt" 2>&1 || true
ncu -i "$out/rep_$shape.ncu-rep" --page source --csv --print-source sass \
    > "$out/ncu_source_$shape.csv" 2>&1 || true
rm -f "$out/rep_$shape.ncu-rep"
