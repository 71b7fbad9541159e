"""Committed notebooks carry no outputs, and follow the parameters convention:
exactly one cell tagged ``parameters``, each parameter ``name: type = value  # help``."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PARAM_LINE = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*:\s*(?P<type>[^=]+?)\s*=\s*(?P<value>.+?)\s+#\s*(?P<help>\S.*)$")

if NOTEBOOKS:
    CASES = [pytest.param(p, id=p.stem) for p in NOTEBOOKS]
else:
    CASES = [pytest.param(None, marks=pytest.mark.skip(reason="no notebooks/*.ipynb committed yet"),
                          id="no-notebooks")]


def _cells(path):
    return json.loads(path.read_text())["cells"]


@pytest.mark.parametrize("path", CASES)
def test_committed_without_outputs(path):
    dirty = []
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code":
            continue
        if cell.get("outputs"):
            dirty.append(f"cell {i}: outputs")
        if cell.get("execution_count") is not None:
            dirty.append(f"cell {i}: execution_count={cell['execution_count']}")
        if "papermill" in cell.get("metadata", {}) or "execution" in cell.get("metadata", {}):
            dirty.append(f"cell {i}: execution metadata")
    meta = json.loads(path.read_text()).get("metadata", {})
    if "papermill" in meta:
        dirty.append("notebook metadata: papermill (an executed copy was committed)")
    assert not dirty, f"{path.name} committed with outputs; clear them: " + "; ".join(dirty)


@pytest.mark.parametrize("path", CASES)
def test_one_parameters_cell_in_the_convention(path):
    tagged = [c for c in _cells(path) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters', want 1"
    src = tagged[0]["source"]
    lines = (src if isinstance(src, str) else "".join(src)).splitlines()
    params, bad = [], []
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = PARAM_LINE.match(line)
        (params.append(m["name"]) if m else bad.append(line))
    assert not bad, f"{path.name}: parameter lines not 'name: type = value  # help': {bad}"
    for required in ("device", "output_root", "profile"):
        assert required in params, f"{path.name}: parameters cell lacks {required!r}"
