#!/usr/bin/env bash
# Helpers for the offline GPU host (no package index). Source it, then call:
#   gpu_lite            unpack .gpulite/lite.tar.xz (papermill, ipykernel, nvtx, fla-core)
#   gpu_heavy_part N    stash .gpuheavy/part-0N in /root/parts (machine must stay warm)
#   gpu_heavy_unpack    join the parts, check SHA256SUMS, unpack (flashinfer + CuTe DSL)
#   gpu_env             PYTHONPATH, ipykernel registration, editable install of the project
# The bundle pieces are built from ../shared/gpu-host/build-bundles.sh output
# (see docs/gpu_host.md); they are git-ignored and carried with each call.
SITE=/root/gpusite
gpu_lite() {
  mkdir -p "$SITE" && [ -f "$SITE/.lite" ] || { tar xJf .gpulite/lite.tar.xz -C "$SITE" && touch "$SITE/.lite"; }
}
gpu_heavy_part() { mkdir -p /root/parts && cp ".gpuheavy/part-0$1" .gpuheavy/SHA256SUMS /root/parts/; }
gpu_heavy_unpack() {
  [ -f "$SITE/.heavy" ] && return 0
  (cd /root/parts && cat part-0* > heavy.tar.xz && sha256sum -c SHA256SUMS && tar xJf heavy.tar.xz -C "$SITE") && touch "$SITE/.heavy"
}
gpu_env() {
  export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
  export GDN_OFFLINE=1   # scripts/bootstrap.sh: no package index here, --no-deps install only
  # nbconvert's HTML templates ship as wheel data files: point Jupyter at them
  JUPYTER_PATH=$(ls -d "$SITE"/*.data/data/share/jupyter 2>/dev/null | paste -sd:)
  export JUPYTER_PATH
  python3 -m ipykernel install --user --name python3 >/dev/null 2>&1
  python3 -m pip install -q -e . --no-deps --no-build-isolation >/dev/null 2>&1 || echo "editable install failed" >&2
  # the tree arrives without .git: set GDN_GIT_SHA/GDN_GIT_DIRTY in the call (provenance)
  [ -n "${GDN_GIT_SHA:-}" ] || echo "GDN_GIT_SHA not set: provenance will say git_sha=unknown" >&2
}
