#!/usr/bin/env bash
# Triton for the offline GPU host (Python 3.12, x86_64, NVIDIA), as a pruned archive cut into
# parts of 36 MB, so each travels with one device call (64 MiB per call; the tracked tree is
# ~29 MB).
#   scripts/triton_wheels.sh OUTDIR [VERSION ...]      (default: 3.7.1 3.9.0)
# writes OUTDIR/triton-VERSION/part-NN and SHA256SUMS (of triton-VERSION.tar.xz, the joined parts).
#
# The wheel (~200 MB for 3.7.1, ~280 MB for 3.9.0) is unpacked and pruned of what a CUDA run never
# loads: the AMD backend (and its entry point, else triton's backend discovery fails), the CUPTI
# libraries and libproton (Proton profiler only); libtriton.so loses its debug sections
# (strip --strip-debug, code untouched). Both ptxas binaries stay: 3.7 uses `ptxas` up to sm_90
# and `ptxas-blackwell` above, 3.9 uses `ptxas-blackwell` (CUDA 13) from sm_90 on.
# What remains is tar'd with xz and cut into 36 MB parts (two or three per version).
# On the host, per version, with every part of it stashed in one folder P:
#   (cd P && cat part-* > triton-VERSION.tar.xz && sha256sum -c SHA256SUMS) &&
#   mkdir -p /root/triton-VERSION && tar xJf P/triton-VERSION.tar.xz -C /root/triton-VERSION
#   PYTHONPATH=/root/triton-VERSION:$PWD python3 -m kernels.bench.triton_versions
# torch's own triton stays installed: the folder first on PYTHONPATH wins.
set -euo pipefail
out=${1:?usage: triton_wheels.sh OUTDIR [VERSION ...]}
shift
mkdir -p "$out" && out=$(cd "$out" && pwd)
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.7.1 3.9.0)
for ver in "${versions[@]}"; do
  dir="$out/triton-$ver"
  if [ -s "$dir/SHA256SUMS" ] && ls "$dir"/part-* >/dev/null 2>&1; then
    echo "triton $ver already in $dir"; continue
  fi
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work" "triton==$ver"
  whl=$(ls "$work"/triton-*.whl)
  mkdir -p "$work/site" && python3 -m zipfile -e "$whl" "$work/site"
  t="$work/site/triton"
  rm -rf "$t/backends/amd" "$t/backends/nvidia/lib"/cupti* "$t/_C/libproton.so"
  sed -i '/^amd *= */d' "$work/site"/triton-*.dist-info/entry_points.txt
  chmod +x "$t/backends/nvidia/bin"/*    # zipfile drops the mode bits
  strip --strip-debug "$t/_C/libtriton.so"
  tar -C "$work/site" -cf - . | xz -T0 -6 > "$work/triton-$ver.tar.xz"
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$work" && sha256sum "triton-$ver.tar.xz" > "$dir/SHA256SUMS")
  split -b 36000000 -d "$work/triton-$ver.tar.xz" "$dir/part-"
  rm -rf "$work"
  echo "triton $ver: $(ls "$dir" | grep -c part-) part(s) in $dir"
done
