#!/usr/bin/env bash
# Re-cut the offline bundle from ../shared/gpu-host/build-bundles.sh into
#   .gpulite/lite.tar.xz      papermill, ipykernel, nvtx, fla-core (+ deps)
#   .gpuheavy/part-0{0..3}   FlashInfer + CuTe DSL + tvm-ffi + cuda-python, with SHA256SUMS
# Usage: scripts/split_gpu_bundle.sh [BUNDLE_DIR=~/.cache/gpu-bundle]
#        scripts/split_gpu_bundle.sh qla [QLA_BUNDLE_DIR=~/.cache/qla-bundle]
#   qla: .gpuqla/part-0{0..5} (~13 MiB each: one part and the tracked tree, ~40 MB, fit a
#   call's 64 MiB) + SHA256SUMS of qla-wheels.tar, from
#   ../shared/gpu-host/build-qla-bundle.sh (FlashQLA, tilelang: their own site on the host,
#   kernels/peers_worker.py; scripts/gpu_host.sh gpu_qla_part / gpu_qla_unpack)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = qla ]; then
  src=${2:-$HOME/.cache/qla-bundle}
  [ -s "$src/SHA256SUMS" ] || bash ../shared/gpu-host/build-qla-bundle.sh "$src"
  mkdir -p .gpuqla && rm -f .gpuqla/part-*
  tmp=$(mktemp); cat "$src"/part-* > "$tmp"; split -n 6 -d "$tmp" .gpuqla/part-; rm -f "$tmp"
  cp "$src/SHA256SUMS" .gpuqla/SHA256SUMS
  ls -l .gpuqla
  exit 0
fi
src=${1:-$HOME/.cache/gpu-bundle}
[ -s "$src/SHA256SUMS" ] || bash ../shared/gpu-host/build-bundles.sh "$src"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat "$src"/part-* | tar xJ -C "$tmp"
# nbconvert (HTML export of executed notebooks) is not in the shared bundle: add it.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d "$tmp/.nbc" nbconvert
for w in nbconvert beautifulsoup4 bleach defusedxml jupyterlab_pygments mistune pandocfilters \
         tinycss2 soupsieve webencodings; do unzip -q -o "$tmp"/.nbc/${w}-*.whl -d "$tmp"; done
rm -rf "$tmp/.nbc"
heavy=$(cd "$tmp" && ls -d flashinfer* nvidia_cutlass_dsl* cudnn nvidia_cudnn_frontend* nccl nccl4py* \
        tvm_ffi apache_tvm_ffi* cuda cuda_python* cuda_tile* cutile_cache 2>/dev/null)
mkdir -p .gpulite .gpuheavy
(cd "$tmp" && ls -A | grep -vxF "$heavy" > ../lite.list && XZ_OPT="-9 -T2" tar cJf "$OLDPWD/.gpulite/lite.tar.xz" -T ../lite.list)
(cd "$tmp" && XZ_OPT="-9 -T2" tar cJf ../heavy.tar.xz $heavy)
rm -f .gpuheavy/part-*
split -n 4 -d "$tmp/../heavy.tar.xz" .gpuheavy/part-
(cd "$tmp/.." && sha256sum heavy.tar.xz) > .gpuheavy/SHA256SUMS
rm -f "$tmp/../heavy.tar.xz" "$tmp/../lite.list"
ls -l .gpulite .gpuheavy
