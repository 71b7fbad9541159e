"""JupyterLab on the repository's notebooks, saving the committed ones without outputs.

    python -m kernels.lab [JUPYTERLAB ARGS...]      # what `make lab` runs

Serves ``notebooks/`` with this environment's ``python3`` kernel. A save — by hand or
JupyterLab's autosave — of a suite notebook (``notebooks/NN_name.ipynb``) goes through
:func:`strip_outputs`, so the file on disk keeps its committed form (no outputs,
execution counts or kernel-filled metadata) and Run All leaves ``git status`` clean;
the page keeps showing the outputs. What a run produces lands where ``run.finish()``
puts it (``results/smoke/<gpu>/<notebook>/`` on the CPU); a copy of the notebook with
its outputs is ``make run``'s job (``results/<...>/<notebook>.ipynb``), or save it under
another name (only the suite's ``NN_name.ipynb`` files are stripped).
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Optional, Sequence

HOOK = "kernels.lab.strip_outputs"
_SUITE = re.compile(r"^\d\d_[A-Za-z0-9_]+\.ipynb$")


def strip_outputs(model: dict, path: str, contents_manager=None, **_) -> None:
    """Jupyter server ``pre_save_hook``: clear outputs, execution counts and run-time
    metadata of a suite notebook (a top-level ``NN_name.ipynb``) before it is written.
    The kernel's entries in the notebook metadata (``kernelspec``: this environment's
    display name; ``language_info``: its Python version) stay as they are on disk."""
    if model.get("type") != "notebook" or not _SUITE.match(path.strip("/")):
        return
    nb = model["content"]
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {})
        for key in ("execution", "collapsed", "scrolled", "papermill"):
            meta.pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    meta = nb.setdefault("metadata", {})
    for key in ("papermill", "widgets"):
        meta.pop(key, None)
    on_disk = {}
    root = getattr(contents_manager, "root_dir", None)
    if root and os.path.isfile(os.path.join(root, path.strip("/"))):
        with open(os.path.join(root, path.strip("/")), encoding="utf-8") as f:
            on_disk = json.load(f).get("metadata", {})
    for key in ("kernelspec", "language_info"):
        if key in on_disk:
            meta[key] = on_disk[key]


def lab_args(notebook_dir: str) -> list:
    """The JupyterLab arguments `make lab` and the browser test share."""
    args = [f"--ServerApp.root_dir={notebook_dir}", f"--ContentsManager.pre_save_hook={HOOK}"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    from jupyterlab.labapp import LabApp

    from kernels.runner import NOTEBOOK_DIR, prepare_environment

    prepare_environment()   # the kernels see what make run's see: this checkout, TRITON_INTERPRET
    argv = list(sys.argv[1:] if argv is None else argv)
    LabApp.launch_instance(argv=lab_args(str(NOTEBOOK_DIR)) + argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
