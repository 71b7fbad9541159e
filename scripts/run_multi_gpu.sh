#!/usr/bin/env bash
# Notebook 05's full profile on a host with two (or more) GPUs, in one device call that
# carries .gpulite (docs/gpu_host.md, "Two GPUs (notebook 05)"):
#   export GDN_GIT_SHA=<sha> GDN_GIT_DIRTY=False; bash scripts/run_multi_gpu.sh /root/out [runner args]
# Results: <out>/<W>x-<gpu-slug>/05_prefill_multi_gpu/ and the executed notebook, tarred to
# $OUT/res.tar (with topo.txt and the runner's log) whether or not the run finished.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root=${1:-/root/out}
shift || true
mkdir -p "$root"
# shellcheck source=scripts/gpu_host.sh
source scripts/gpu_host.sh
gpu_lite && gpu_env
# FlashQLA's one-GPU rows: its site where its parts were stashed on this (warm) machine
# (docs/gpu_host.md, "FlashQLA"); else those rows report unavailable with the reason
if [ -d /root/qlaparts ]; then gpu_qla_unpack; else echo "no /root/qlaparts: FlashQLA rows unavailable"; fi
nvidia-smi topo -m > "$root/topo.txt" 2>&1
nvidia-smi --query-gpu=index,name,memory.total --format=csv >> "$root/topo.txt" 2>&1
timeout 540 python3 -m kernels.runner --profile full --notebooks 05 --output-root "$root" \
  --no-progress "$@" > "$root/runner.log" 2>&1
rc=$?
tail -n 40 "$root/runner.log"
(cd "$root" && tar cf "${OUT:-/tmp}/res.tar" .)
exit $rc
