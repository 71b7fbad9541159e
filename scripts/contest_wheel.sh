#!/usr/bin/env bash
# The contest's flashinfer-bench, built from source, plus the wheels the offline GPU host
# lacks to run it, into the git-ignored .whl/ (docs/contest.md says why this one).
#
#   FIB_COMMIT  flashinfer-ai/flashinfer-bench main as of the final kernel submission
#               deadline (2026-04-24 23:59 AoE = 2026-04-25 11:59 UTC): the last commit
#               before it, "feat: add dataset validation CLI (#386)", 2026-04-24 14:36 UTC.
#               Its bench/timing.py times with flashinfer.testing.bench_gpu_time_with_cupti
#               (cold L2, no CUDA graph); PyPI has only 0.1.2 (CUDA events after a sync).
#   cupti-python 13.0.1  what that timing needs for CUPTI (without it FlashInfer falls back
#               to CUDA events: kernels.contest.evaluate refuses to run then); 13.0 matches
#               the host's CUDA 13.0 driver and nvidia-cuda-cupti.
#   pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions,
#   docstring-parser   flashinfer-bench's requirements that the host image lacks (it has
#               torch, safetensors, pyyaml, filelock, numpy, cuda-bindings, nvidia-cuda-cupti;
#               flashinfer-python and apache-tvm-ffi come with the FlashInfer bundle).
#
# Usage: scripts/contest_wheel.sh [SRC]
#   SRC  a git clone of flashinfer-bench holding FIB_COMMIT (default: cloned from GitHub
#        into a temporary folder). Needs pip with a package index (build requirements and
#        the dependency wheels). Replaces .whl/ (one version of each package).
set -euo pipefail
FIB_COMMIT=ecafa9c2c62007667838226068b21ca9ff1c9183
cd "$(dirname "$0")/.."
out=$PWD/.whl
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
src=${1:-}
if [ -z "$src" ]; then
  git clone -q https://github.com/flashinfer-ai/flashinfer-bench "$work/repo"; src=$work/repo
fi
sha=$(git -C "$src" rev-parse --verify "$FIB_COMMIT^{commit}") || {
  echo "contest_wheel.sh: $src does not hold commit $FIB_COMMIT" >&2; exit 1; }
# setuptools-scm's version for that commit (v0.1.2 + N commits -> 0.1.3.devN), with the
# commit as local part so provenance names it; the export below has no .git to read it from.
desc=$(git -C "$src" describe --tags --long "$sha")           # v0.1.2-92-gecafa9c2
base=${desc%%-*}; base=${base#v}; rest=${desc#*-}; n=${rest%%-*}
IFS=. read -r maj min pat <<<"$base"
version="$maj.$min.$((pat + 1)).dev$n+g${sha:0:8}"
mkdir -p "$work/src"
git -C "$src" archive "$sha" | tar x -C "$work/src"
rm -rf "$out"; mkdir -p "$out"
SETUPTOOLS_SCM_PRETEND_VERSION=$version python3 -m pip wheel -q --no-deps -w "$out" "$work/src"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out" \
  cupti-python==13.0.1 pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 \
  typing-inspection==0.4.2 typing-extensions==4.15.0 docstring-parser==0.17.0
(cd "$out" && sha256sum ./*.whl > SHA256SUMS)
echo "flashinfer-bench $version ($sha) and its host dependencies in $out:"
ls -l "$out"; du -sh "$out"
