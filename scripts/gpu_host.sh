#!/usr/bin/env bash
# Helpers for the offline GPU host (no package index). Source it, then call:
#   gpu_lite            unpack .gpulite/lite.tar.xz (papermill, ipykernel, nvtx, fla-core)
#   gpu_heavy_part N    stash .gpuheavy/part-0N in /root/parts (machine must stay warm)
#   gpu_heavy_unpack    join the parts, check SHA256SUMS, unpack (flashinfer + CuTe DSL)
#   gpu_fib             check and unpack the .whl/ wheels (the contest's flashinfer-bench and
#                       the deps the host lacks: scripts/contest_wheel.sh) into the same site
#                       folder (for `make contest-eval`; docs/contest.md)
#   gpu_env             PYTHONPATH, ipykernel registration, editable install of the project
#   gpu_qla_part N      stash .gpuqla/part-0N in /root/qlaparts (machine must stay warm)
#   gpu_qla_unpack      join, check SHA256SUMS, pip-install the wheels into /root/qlasite and
#                       export GDN_QLA_SITE (FlashQLA's own site: kernels/peers_worker.py)
#   gpu_step NAME DIR CMD...
#                       (inside a driver started with setsid) run CMD, log to
#                       /root/steps/NAME.log, then tar DIR to /root/steps/NAME.tar and mark
#                       NAME done (rc in NAME.rc), whatever CMD's status
#   gpu_collect [SECONDS]
#                       wait (default 540 s) until some step is done and not yet collected,
#                       or the driver wrote /root/steps/ALL; copy every such step's tar and
#                       log to $OUT, print their status and the running step's log tail
# The bundle pieces are built from ../shared/gpu-host/build-bundles.sh output
# (see docs/gpu_host.md); they are git-ignored and carried with each call.
SITE=/root/gpusite
QLA_SITE=/root/qlasite
gpu_lite() {
  mkdir -p "$SITE" && [ -f "$SITE/.lite" ] || { tar xJf .gpulite/lite.tar.xz -C "$SITE" && touch "$SITE/.lite"; }
}
gpu_heavy_part() { mkdir -p /root/parts && cp ".gpuheavy/part-0$1" .gpuheavy/SHA256SUMS /root/parts/; }
gpu_heavy_unpack() {
  mkdir -p "$SITE"
  [ -f "$SITE/.heavy" ] && return 0
  (cd /root/parts && cat part-0* > heavy.tar.xz && sha256sum -c SHA256SUMS && tar xJf heavy.tar.xz -C "$SITE") && touch "$SITE/.heavy"
}
gpu_fib() {
  # wheels are zip archives: extracting one into a --target style folder installs it
  ls .whl/flashinfer_bench-*.whl >/dev/null || { echo "gpu_fib: no wheels in .whl/ (carry it)" >&2; return 1; }
  (cd .whl && sha256sum -c --quiet SHA256SUMS) || { echo "gpu_fib: .whl/SHA256SUMS mismatch" >&2; return 1; }
  local mark="$SITE/.fib-$(cd .whl && sha256sum SHA256SUMS | cut -c1-12)"
  mkdir -p "$SITE" && [ -f "$mark" ] && return 0
  for w in .whl/*.whl; do python3 -m zipfile -e "$w" "$SITE" || return 1; done
  touch "$mark"
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
gpu_qla_part() { mkdir -p /root/qlaparts && cp ".gpuqla/part-0$1" .gpuqla/SHA256SUMS /root/qlaparts/; }
gpu_qla_unpack() {
  if [ ! -f "$QLA_SITE/.qla" ]; then
    (cd /root/qlaparts && cat part-0* > qla-wheels.tar && sha256sum -c SHA256SUMS && rm -rf w \
      && mkdir w && tar xf qla-wheels.tar -C w \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target "$QLA_SITE" w/*.whl) \
      && touch "$QLA_SITE/.qla" || { echo "FlashQLA site not installed" >&2; return 1; }
  fi
  export GDN_QLA_SITE=$QLA_SITE
}

# A run longer than a call goes in a driver script started with setsid (the machine keeps
# it running between calls, and goes back 30 s after a call ends): each of its steps is
# tarred as it finishes, and each later call collects what finished, so a machine lost
# between calls loses only the step in flight (docs/gpu_host.md, "Runs longer than a call").
STEPS=/root/steps
gpu_step() {
  local name=$1 dir=$2; shift 2
  mkdir -p "$STEPS"
  echo "$(date -u +%T) start" > "$STEPS/$name.log"
  "$@" >> "$STEPS/$name.log" 2>&1
  echo $? > "$STEPS/$name.rc"
  echo "$(date -u +%T) end, rc $(cat "$STEPS/$name.rc")" >> "$STEPS/$name.log"
  [ -e "$dir" ] && tar cf "$STEPS/$name.tar" --exclude='*.ncu-rep' -C "$(dirname "$dir")" "$(basename "$dir")"
  touch "$STEPS/$name.done"
}
gpu_collect() {
  local limit=${1:-540} waited=0 d n
  mkdir -p "$STEPS" "${OUT:?}"
  while :; do
    for d in "$STEPS"/*.done; do
      [ -e "$d" ] && [ ! -e "${d%.done}.got" ] && break 2
    done
    [ -e "$STEPS/ALL" ] && break
    [ "$waited" -ge "$limit" ] && break
    sleep 5; waited=$((waited + 5))
  done
  for d in "$STEPS"/*.done; do
    [ -e "$d" ] || continue
    n=${d%.done}
    [ -e "$n.got" ] && continue
    cp "$n.log" "$OUT/" 2>/dev/null; [ -e "$n.tar" ] && cp "$n.tar" "$OUT/"
    echo "collected $(basename "$n"): rc $(cat "$n.rc")"; touch "$n.got"
  done
  [ -e "$STEPS/ALL" ] && echo "driver finished" || \
    for n in "$STEPS"/*.log; do [ -e "${n%.log}.done" ] || { echo "running: $(basename "${n%.log}")"; tail -n 5 "$n"; }; done
}
