#!/usr/bin/env bash
# Make a Python environment that can run the suite, and print its python path.
#   - A host whose python3 already has a CUDA torch (the GPU host): use that
#     python as is and install the project with --no-deps (never replace its
#     torch/triton; papermill, fla and flashinfer come from PYTHONPATH there).
#   - Otherwise: create .venv if missing and install the CPU pair
#     torch==2.13.0 + triton==3.7.1 and the project with its extras.
# Idempotent: a second run only re-checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if ! "$PY" -c 'import kernels' 2>/dev/null || [ ! -f .bootstrap-gpu ]; then
    "$PY" -m pip install -q -e . --no-deps --no-build-isolation >&2
    touch .bootstrap-gpu
  fi
  command -v "$PY"
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv >&2
fi
VPY=.venv/bin/python
stamp=.venv/.gdn-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VPY" -m pip install -q --upgrade pip >&2 || true
  "$VPY" -m pip install -q torch==2.13.0 triton==3.7.1 >&2
  "$VPY" -m pip install -q -e '.[notebook,peers,test]' >&2
  "$VPY" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
  touch "$stamp"
fi
echo "$(pwd)/$VPY"
