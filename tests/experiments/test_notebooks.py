"""The committed notebooks: generated, thin, without outputs, parameters documented.

Fast static checks (no kernel runs); executing them is ``tests/notebooks/test_smoke.py``.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
STEMS = {
    "01_decode_crossover": "decode_crossover",
    "02_prefill_launch_overhead": "prefill_overhead",
    "03_ncu_instruction_counts": "ncu_counts",
    "04_prefill_scaling": "prefill_scaling",
    "05_prefill_multi_gpu": "prefill_multi_gpu",
}


def _load(stem):
    return nbformat.read(NB_DIR / f"{stem}.ipynb", as_version=4)


def test_committed_notebooks_match_generator():
    r = subprocess.run([sys.executable, str(NB_DIR / "build_notebooks.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_is_thin_and_clean(stem):
    nb = _load(stem)
    nbformat.validate(nb)
    cells = nb.cells
    assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# ")
    params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    for c in cells:
        if c.cell_type == "code" and c not in params:
            assert c.outputs == [] and c.execution_count is None
            # no kernel code, timing loops or analysis: only calls into the module
            for bad in ("@triton.jit", "perf_counter", "for ", "while ", "import torch",
                        "import triton"):
                assert bad not in c.source, (stem, bad, c.source)
    src = "\n".join(c.source for c in cells if c.cell_type == "code")
    assert f"from kernels.experiments import {STEMS[stem]} as xp" in src
    assert "xp.conclusion_markdown(" in src and "display(Markdown(" in src
    assert cells[-1].source.strip() == "run.finish()"


@pytest.mark.parametrize("stem", STEMS)
def test_papermill_documents_every_parameter(stem):
    from papermill.inspection import inspect_notebook

    found = inspect_notebook(str(NB_DIR / f"{stem}.ipynb"))
    mod = importlib.import_module(f"kernels.experiments.{STEMS[stem]}")
    assert list(found) == [p.name for p in mod.PARAMS]
    for p in mod.PARAMS:
        assert found[p.name]["inferred_type_name"] == p.type
        assert found[p.name]["help"] == p.help
    assert found["device"]["default"] == '"auto"'
    assert found["output_root"]["default"] == '"auto"'
    assert found["profile"]["default"] == '"auto"'


@pytest.mark.parametrize("profile", ["smoke", "full"])
def test_profiles_only_set_known_parameters(profile):
    yaml = pytest.importorskip("yaml")
    path = ROOT / "kernels" / "profiles" / f"{profile}.yaml"
    if not path.exists():
        pytest.skip(f"{path} not there yet")
    doc = yaml.safe_load(path.read_text()) or {}
    for stem, module in STEMS.items():
        mod = importlib.import_module(f"kernels.experiments.{module}")
        names = {p.name for p in mod.PARAMS}
        assert {"device", "output_root", "profile"} <= names
        vals = doc.get(stem) or {}
        unknown = set(vals) - names
        assert not unknown, f"{profile}.yaml sets unknown parameters of {stem}: {unknown}"
        types = {p.name: p.type for p in mod.PARAMS}
        for name, value in vals.items():
            want = {"int": int, "str": str, "bool": bool, "list": list, "float": (int, float)}
            assert isinstance(value, want[types[name]]), (stem, name, value)
