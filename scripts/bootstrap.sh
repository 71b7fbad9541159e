#!/usr/bin/env bash
# Make a Python environment that can run the suite and print its python path
# on stdout (everything else goes to stderr). Used by `make run` / `make test`.
#   - A host whose python3 already has a CUDA torch (the GPU host): use that
#     python as is and install the project with --no-deps --no-build-isolation
#     (never replace its torch/triton; papermill, fla and flashinfer come from
#     PYTHONPATH there, see docs/gpu_host.md). If that install fails the suite
#     still works from the repository root (the runner puts it on PYTHONPATH).
#   - Otherwise: create .venv if missing and install the CPU pair
#     torch==2.13.0 + triton==3.7.1 and the project with all its extras, and
#     register the venv's own `python3` Jupyter kernel (--sys-prefix, so no
#     user-wide kernelspec of another checkout is touched).
# Idempotent: a second run only re-checks (re-installs when pyproject.toml changed).
# PYTHON=/path/to/python3 picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
log() { echo "bootstrap: $*" >&2; }

if "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if [ ! -f .bootstrap-gpu ] || [ pyproject.toml -nt .bootstrap-gpu ] || ! "$PY" -c 'import kernels' 2>/dev/null; then
    log "CUDA torch found in $("$PY" -c 'import sys;print(sys.executable)'); pip install -e . --no-deps --no-build-isolation"
    if "$PY" -m pip install -q -e . --no-deps --no-build-isolation >&2; then
      touch .bootstrap-gpu
    else
      log "warning: editable install failed; running from the repository root instead"
    fi
    for m in papermill ipykernel pytest fla flashinfer; do
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
  log "installing torch==2.13.0 triton==3.7.1 (CPU) and -e .[notebook,peers,test] into .venv (first time: a few minutes)"
  "$VPY" -m pip install -q --upgrade pip >&2 || true
  "$VPY" -m pip install -q torch==2.13.0 triton==3.7.1 -e '.[notebook,peers,test]' >&2
  "$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gdn .venv)" >/dev/null
  touch "$stamp"
fi
echo "$(pwd)/$VPY"
