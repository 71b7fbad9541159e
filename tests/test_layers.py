"""Imports run downward only (docs/architecture.md, "Data flow and choices"): every import
between two parts of ``kernels/``, function-level ones included, goes to a lower layer.
Read from the sources (nothing imported), so it costs milliseconds."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Each part of kernels/ (a module or a sub-package) and its layer, lowest first.
LAYERS = {
    "spec": 0, "device": 0, "packages": 0, "interpret": 0, "gpu_limits": 0,
    "reference": 1, "checks": 1, "stress_inputs": 1, "launch": 1,
    "fastcall": 1.5,                                # the compiled repeat of a recorded launch list
    "decode": 2, "prefill": 3,                      # our kernels (prefill reuses decode's)
    "peers": 3,                                     # theirs
    "bench": 4,                                     # the instruments
    "model": 4,                                     # ours behind FLA's signature, in transformers
    "peers_worker": 5, "report": 5, "compare": 5,
    "arch_check": 5,                                # the compile check (the drop-in's launches too)
    "contest": 6,                                   # solutions, the contest's build
    "registry": 7, "runner": 7, "ncu_target": 7,    # compose ours, peers and solutions
    "experiments": 8, "lab": 8,                     # the notebooks' modules
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path, root: Path = ROOT):
    """``(line, imported module)`` of every import in ``path`` (a file under ``root``)."""
    rel = path.relative_to(root).with_suffix("").parts
    package = list(rel if rel[-1] == "__init__" else rel[:-1])
    if package and package[-1] == "__init__":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module == "kernels" or not node.module:   # from kernels import registry
                yield from ((node.lineno, f"{module}.{a.name}") for a in node.names)
            else:
                yield node.lineno, module


def test_every_part_has_a_layer():
    parts = {p.stem for p in (ROOT / "kernels").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert parts == set(LAYERS), f"give these a layer (or drop them): {parts ^ set(LAYERS)}"


@pytest.mark.parametrize("part", sorted(LAYERS))
def test_imports_run_downward(part):
    base = ROOT / "kernels" / part
    files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    upward = []
    for f in files:
        for line, module in _imports(f):
            other = _part(module)
            if module.startswith("kernels.") and other in LAYERS and other != part \
                    and LAYERS[other] >= LAYERS[part]:
                upward.append(f"{f.relative_to(ROOT)}:{line} imports {module} "
                              f"(layer {LAYERS[other]} >= {LAYERS[part]})")
    assert not upward, "\n".join(upward)


def test_the_check_sees_function_level_and_relative_imports(tmp_path):
    """The reader itself: relative imports inside a function are found and resolved."""
    pkg = tmp_path / "kernels" / "bench"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("def f():\n    from ..registry import resolve\n"
                              "    from .. import experiments\n    import kernels.runner\n")
    found = [m for _, m in _imports(pkg / "x.py", tmp_path)]
    assert found == ["kernels.registry", "kernels.experiments", "kernels.runner"]
