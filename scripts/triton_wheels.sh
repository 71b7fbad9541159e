#!/usr/bin/env bash
# Triton wheels for the offline GPU host (Python 3.12, x86_64), cut into parts of 28 MiB
# (29.4 MB; the tracked tree is ~29 MB) so each travels with one device call (64 MiB per call, working tree included).
#   scripts/triton_wheels.sh OUTDIR [VERSION ...]      (default: 3.7.1 3.9.0)
# writes OUTDIR/triton-VERSION/part-NN and SHA256SUMS (of the whole wheel, by its name).
# On the host, per version, with every part of it stashed in one folder P:
#   (cd P && cat part-* > "$(cut -d' ' -f3 SHA256SUMS)" && sha256sum -c SHA256SUMS)
#   python3 -m pip install -q --no-deps --no-index --target /root/triton-VERSION P/*.whl
#   PYTHONPATH=/root/triton-VERSION:$PWD python3 -m kernels.bench.triton_versions
# torch's own triton stays installed: the folder first on PYTHONPATH wins.
set -euo pipefail
out=${1:?usage: triton_wheels.sh OUTDIR [VERSION ...]}
shift
mkdir -p "$out" && out=$(cd "$out" && pwd)   # absolute: the checksum is written from the download folder
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
  mkdir -p "$dir"
  (cd "$work" && sha256sum "$(basename "$whl")" > "$dir/SHA256SUMS")
  split -b 28M -d "$whl" "$dir/part-"
  rm -rf "$work"
  echo "triton $ver: $(basename "$whl") -> $(ls "$dir" | grep -c part-) part(s) in $dir"
done
