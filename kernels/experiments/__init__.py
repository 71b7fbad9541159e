"""The experiments behind the notebooks: one module per notebook.

``decode_crossover`` (01), ``prefill_overhead`` (02), ``ncu_counts`` (03),
``prefill_scaling`` (04).
Each module holds the whole of its notebook's logic as importable, tested
functions — run (correctness gate → instruments) returning tidy DataFrames,
plot functions returning matplotlib figures, and ``conclusion_markdown(dfs)``
that writes the notebook's conclusion from the DataFrames — plus ``PARAMS``,
the notebook's parameters (``notebooks/build_notebooks.py`` renders the
``parameters`` cell from it, so the two never drift apart).

Importing this package on a host without a CUDA GPU sets
``TRITON_INTERPRET=1`` (unless it is already set or triton is already
imported), so ``device="auto"`` runs our Triton kernels on the CPU
interpreter without further set-up. To run on the CPU on a GPU host, export
``TRITON_INTERPRET=1`` before starting Python.
"""
import os as _os
import sys as _sys

if "TRITON_INTERPRET" not in _os.environ and "triton" not in _sys.modules:
    try:
        import torch as _torch

        _cuda = _torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is a broken install
        _cuda = False
    if not _cuda:
        _os.environ["TRITON_INTERPRET"] = "1"
