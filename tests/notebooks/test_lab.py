"""kernels.lab's save hook without a browser: a suite notebook saved from JupyterLab with
outputs is written in its committed form; other files are saved as they are."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import nbformat

from kernels.lab import lab_args, strip_outputs

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "04_prefill_scaling.ipynb"


def _as_jupyterlab_saves_it() -> dict:
    """The committed notebook after Run All, as JupyterLab sends it to the server."""
    nb = json.loads(NOTEBOOK.read_text())
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = i + 1
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "hi\n"}]
        cell["metadata"]["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
        cell["metadata"]["scrolled"] = True
    nb["metadata"]["kernelspec"]["display_name"] = "Python 3 (some .venv)"
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11.7",
                                       "mimetype": "text/x-python"}
    return {"type": "notebook", "content": nb}


def test_a_suite_notebook_is_saved_as_committed():
    model = _as_jupyterlab_saves_it()
    strip_outputs(model, NOTEBOOK.name, contents_manager=SimpleNamespace(root_dir=str(NOTEBOOK.parent)))
    nb = nbformat.from_dict(model["content"])
    assert nbformat.writes(nb) + "\n" == NOTEBOOK.read_text()


def test_other_files_keep_their_outputs():
    for path in ("my_copy.ipynb", "sub/04_prefill_scaling.ipynb"):
        model = _as_jupyterlab_saves_it()
        before = copy.deepcopy(model)
        strip_outputs(model, path, contents_manager=SimpleNamespace(root_dir=str(NOTEBOOK.parent)))
        assert model == before, path
    text = {"type": "file", "content": "x"}
    strip_outputs(text, "01_x.ipynb")
    assert text == {"type": "file", "content": "x"}


def test_make_lab_serves_notebooks_with_the_hook():
    args = lab_args("/repo/notebooks")
    assert "--ServerApp.root_dir=/repo/notebooks" in args
    assert "--ContentsManager.pre_save_hook=kernels.lab.strip_outputs" in args
