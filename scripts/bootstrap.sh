#!/usr/bin/env bash
# Make a Python environment that can run the suite and print its python path
# on stdout (everything else goes to stderr). Used by `make run` / `make test` /
# `make lab`.
#   - A host whose python3 already has a CUDA torch: use that python as is and
#     install the project with every extra, the CUDA peers (`peers-gpu`:
#     FlashInfer, FlashQLA) included, under a constraint that pins the torch and
#     triton already there (never replaced). Without a package index (the offline
#     GPU host) that install fails and the project goes in with --no-deps
#     --no-build-isolation instead (papermill, fla and flashinfer come from
#     PYTHONPATH there, see docs/gpu_host.md); if that fails too the suite still
#     works from the repository root (the runner puts it on PYTHONPATH).
#     GDN_OFFLINE=1 skips the networked attempt (scripts/gpu_host.sh sets it).
#   - Otherwise: create .venv if missing and install the CPU pair
#     torch==2.13.0 + triton==3.7.1 and the project with its CPU extras (FLA is
#     the only peer), and register the venv's own `python3` Jupyter kernel
#     (--sys-prefix, so no user-wide kernelspec of another checkout is touched).
# Idempotent: a second run only re-checks (re-installs when pyproject.toml changed).
# PYTHON=/path/to/python3 picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
log() { echo "bootstrap: $*" >&2; }
CPU_SPEC='.[notebook,lab,peers,test]'
GPU_SPEC='.[notebook,lab,peers,peers-gpu,test]'

if "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if [ ! -f .bootstrap-gpu ] || [ pyproject.toml -nt .bootstrap-gpu ] || [ "$0" -nt .bootstrap-gpu ] \
      || ! "$PY" -c 'import kernels' 2>/dev/null; then
    pins=$(mktemp)
    "$PY" - >"$pins" <<'PIN'
import importlib.metadata as md
for name in ("torch", "triton"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
PIN
    log "CUDA torch found in $("$PY" -c 'import sys;print(sys.executable)'); pip install -e '$GPU_SPEC' keeping $(paste -sd' ' "$pins")"
    if [ "${GDN_OFFLINE:-0}" != 1 ] \
        && "$PY" -m pip install -q --retries 1 --timeout 30 -c "$pins" -e "$GPU_SPEC" >&2; then
      touch .bootstrap-gpu
    else
      log "could not install the extras (no package index?): pip install -e . --no-deps --no-build-isolation"
      if "$PY" -m pip install -q -e . --no-deps --no-build-isolation >&2; then
        touch .bootstrap-gpu
      else
        log "warning: editable install failed; running from the repository root instead"
      fi
    fi
    rm -f "$pins"
    for m in papermill ipykernel pytest fla flashinfer flash_qla jupyterlab; do
      "$PY" -c "import $m" 2>/dev/null || log "note: $m is not importable (offline bundle on PYTHONPATH? see docs/gpu_host.md)"
    done
  fi
  "$PY" -c 'import sys;print(sys.executable)'
  exit 0
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv >&2
fi
VPY=.venv/bin/python
stamp=.venv/.gdn-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  log "installing torch==2.13.0 triton==3.7.1 (CPU) and -e $CPU_SPEC into .venv (first time: a few minutes)"
  "$VPY" -m pip install -q --upgrade pip >&2 || true
  "$VPY" -m pip install -q torch==2.13.0 triton==3.7.1 -e "$CPU_SPEC" >&2
  "$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gdn .venv)" >/dev/null
  touch "$stamp"
fi
echo "$(pwd)/$VPY"
