"""Packaging: one list of runtime dependencies, a torch-free ``import kernels``,
an installable project (what the offline GPU host does), and set-up scripts
that agree with each other."""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml (the notebook extra) is needed to read environment.yml")

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="Python 3.10 needs tomli to read pyproject.toml")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ENV = yaml.safe_load((ROOT / "environment.yml").read_text())
# torch/triton: unpinned in pyproject (the GPU host keeps its CUDA build), pinned for CPU
PINNED_FOR_CPU = {"torch": "2.13.0", "triton": "3.7.1"}


def _norm(req: str) -> str:
    """PEP 503 name of a requirement string: ``'Foo_Bar[x]>=1' -> 'foo-bar'``."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_entries():
    conda, pip = [], []
    for dep in ENV["dependencies"]:
        if isinstance(dep, dict):
            pip.extend(dep.get("pip", []))
        else:
            conda.append(dep)
    return conda, pip


def test_environment_yml_lists_the_pyproject_runtime_dependencies():
    conda, pip = _env_entries()
    tooling = {"python", "pip"}
    env_names = {_norm(d) for d in conda if _norm(d) not in tooling}
    env_names |= {_norm(d) for d in pip if not d.startswith("-")}
    project = {_norm(d) for d in PYPROJECT["project"]["dependencies"]}
    assert env_names == project, (
        f"only in environment.yml: {sorted(env_names - project)}; "
        f"only in pyproject.toml: {sorted(project - env_names)}")


# extras for a CUDA machine only: the CPU environments (environment.yml, the CPU
# bootstrap) leave them out, the bootstrap's CUDA branch adds them
GPU_EXTRAS = {"peers-gpu"}


def _bootstrap_extras(line_marker: str) -> set:
    boot = (ROOT / "scripts" / "bootstrap.sh").read_text()
    m = re.search(line_marker + r"=\"?'?\.\[([^\]]*)\]", boot)
    assert m, f"scripts/bootstrap.sh sets no {line_marker}"
    return set(m.group(1).split(","))


def test_environment_yml_installs_the_project_with_every_extra():
    _, pip = _env_entries()
    editable = [d for d in pip if d.startswith("-e")]
    assert len(editable) == 1, pip
    extras = set(re.search(r"\[(.*)\]", editable[0]).group(1).split(","))
    assert extras == set(PYPROJECT["project"]["optional-dependencies"]) - GPU_EXTRAS


def test_bootstrap_installs_every_extra_cpu_without_the_gpu_peers():
    every = set(PYPROJECT["project"]["optional-dependencies"])
    assert _bootstrap_extras("CPU_SPEC") == every - GPU_EXTRAS
    assert _bootstrap_extras("GPU_SPEC") == every


def test_gpu_peers_are_pinned_to_linux_x86_64_wheels():
    deps = PYPROJECT["project"]["optional-dependencies"]["peers-gpu"]
    assert {_norm(d) for d in deps} == {"flashinfer-python", "flash-qla"}
    for d in deps:
        assert "==" in d and "sys_platform == 'linux'" in d and "platform_machine == 'x86_64'" in d


def test_cpu_pins_agree_everywhere():
    """environment.yml and scripts/bootstrap.sh pin the same CPU torch/triton;
    pyproject leaves them unpinned so the GPU host keeps its own build."""
    _, pip = _env_entries()
    env_pins = dict(re.match(r"([\w-]+)==(\S+)", d).groups() for d in pip if "==" in d)
    assert {n: env_pins.get(n) for n in PINNED_FOR_CPU} == PINNED_FOR_CPU
    boot = (ROOT / "scripts" / "bootstrap.sh").read_text()
    for name, version in PINNED_FOR_CPU.items():
        assert f"{name}=={version}" in boot
    for dep in PYPROJECT["project"]["dependencies"]:
        if _norm(dep) in PINNED_FOR_CPU:
            assert "==" not in dep, f"pyproject must not pin {dep} (the GPU host has its own)"
    python = [d for d in _env_entries()[0] if _norm(d) == "python"]
    assert python and "3.11" in python[0]


def test_extras_cover_what_the_suite_imports():
    extras = {k: {_norm(d) for d in v} for k, v in PYPROJECT["project"]["optional-dependencies"].items()}
    assert {"papermill", "ipykernel", "nbformat", "nbconvert", "pyyaml"} <= extras["notebook"]
    assert "fla-core" in extras["peers"]
    assert {"pytest", "pytest-timeout", "selenium"} <= extras["test"]
    assert "jupyterlab" in extras["lab"]


def test_import_kernels_does_not_import_torch():
    code = ("import sys, kernels, kernels.runner, kernels.compare; "
            "bad = sorted(m for m in ('torch', 'triton') if m in sys.modules); "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"importing kernels pulled in: {res.stdout} {res.stderr[-2000:]}"


def test_console_scripts_resolve():
    import importlib

    for name, target in PYPROJECT["project"]["scripts"].items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_package_data_globs_match_files():
    data = PYPROJECT["tool"]["setuptools"]["package-data"]["kernels"]
    assert "profiles/*.yaml" in data
    for pattern in ("profiles/*.yaml",):
        assert list((ROOT / "kernels").glob(pattern)), pattern


def test_builds_without_network_or_build_isolation(tmp_path):
    """What ``pip install -e . --no-deps --no-build-isolation`` on the GPU host relies on:
    the project builds with the interpreter's own setuptools and ships its data files."""
    pytest.importorskip("setuptools", reason="this interpreter has no setuptools to build with")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("kernels/__init__.py", "kernels/spec.py", "kernels/runner.py", "kernels/compare.py",
              "kernels/profiles/smoke.yaml", "kernels/profiles/full.yaml"):
        assert f in names, f
    assert not any(n.startswith(("tests/", "notebooks/", "results/")) for n in names)


@pytest.mark.parametrize("path", [pytest.param(p, id=p) for p in
                                  ("scripts/bootstrap.sh", ".ci/run")])
def test_scripts_are_executable_bash(path):
    f = ROOT / path
    assert f.stat().st_mode & 0o111, f"{path} is not executable"
    res = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make run" in readme
