"""kernels.runner: profiles, selection, and papermill runs of throwaway notebooks.

The notebooks here are generated in ``tmp_path``: a toy that writes a marker
file into ``output_root`` and raises when its ``fail`` parameter is true.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook extra is not installed")
pytest.importorskip("papermill", reason="the notebook extra is not installed")
yaml = pytest.importorskip("yaml", reason="the notebook extra is not installed")

from kernels import runner  # noqa: E402
from kernels.runner import RunnerError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KNOWN_STEMS = ("01_decode_crossover", "02_prefill_launch_overhead", "03_ncu_instruction_counts",
               "04_prefill_scaling", "05_prefill_multi_gpu", "06_in_the_model")

PARAMS_CELL = '''device: str = "auto"  # auto | cuda | cpu
output_root: str = "results"  # results root
profile: str = "smoke"  # profile name
n: int = 1  # a number the notebook writes out
fail: bool = False  # raise in the third cell
'''
WORK_CELL = '''from pathlib import Path
Path(output_root).mkdir(parents=True, exist_ok=True)
(Path(output_root) / f"marker-{STEM}.json").write_text(
    __import__("json").dumps(dict(n=n, device=device, profile=profile)))
'''
FAIL_CELL = '''if fail:
    raise ValueError("boom from the toy notebook")
print("done")
'''


def make_notebook(path: Path, *, parameters_cells: int = 1) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [nbformat.v4.new_markdown_cell(f"# {path.stem}")]
    for _ in range(parameters_cells):
        c = nbformat.v4.new_code_cell(PARAMS_CELL)
        c.metadata["tags"] = ["parameters"]
        cells.append(c)
    cells += [nbformat.v4.new_code_cell(f"STEM = {path.stem!r}\n" + WORK_CELL),
              nbformat.v4.new_code_cell(FAIL_CELL)]
    nb.cells = cells
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def toy(tmp_path):
    """A notebook folder with 01_toy and 02_other, a profile, and the results root."""
    nbdir = tmp_path / "notebooks"
    make_notebook(nbdir / "01_toy.ipynb")
    make_notebook(nbdir / "02_other.ipynb")
    (nbdir / "scratch.ipynb").write_text("{}")  # not NN_name: ignored
    out = tmp_path / "results"
    prof = tmp_path / "toy.yaml"
    prof.write_text(yaml.safe_dump({
        "defaults": {"output_root": str(out), "n": 5, "not_declared_anywhere": 1},
        "01_toy": {"n": 7},
        "02_other": {},
    }))
    return dict(nbdir=nbdir, out=out, profile=prof, slug=runner.current_gpu_slug())


def _run(toy, *extra):
    return runner.main(["--profile", str(toy["profile"]), "--notebook-dir", str(toy["nbdir"]),
                        "--no-progress", *extra])


def _marker(toy, stem):
    return json.loads((toy["out"] / f"marker-{stem}.json").read_text())


# --------------------------------------------------------------------------- runs

def test_success_layout(toy):
    assert _run(toy, "--notebooks", "01") == 0
    d = toy["out"] / toy["slug"]
    assert (d / "01_toy.ipynb").is_file()
    assert not list(d.glob("*.html"))  # no HTML export: `make html` renders it on demand
    assert not (d / "02_other.ipynb").exists()
    assert not list(d.glob("failed-*"))
    # parameters: notebook dict beats defaults; device/output_root/profile always set
    assert _marker(toy, "01_toy") == {"n": 7, "device": "auto", "profile": str(toy["profile"])}
    nb = nbformat.read(str(d / "01_toy.ipynb"), as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1
    assert nb.metadata.papermill.parameters["output_root"] == str(toy["out"].resolve())
    assert "not_declared_anywhere" not in nb.metadata.papermill.parameters
    assert any("done" in "".join(o.get("text", "")) for o in nb.cells[-1].outputs)


def test_link_figures_replaces_embedded_copies_of_saved_pngs(tmp_path):
    import base64

    folder = tmp_path / "01_toy"
    folder.mkdir()
    saved, other = b"\x89PNG saved", b"\x89PNG drawn inline only"
    (folder / "fig.png").write_bytes(saved)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("show()", outputs=[
        nbformat.v4.new_output("display_data", {"image/png": base64.b64encode(png).decode()},
                               metadata={"image/png": {"width": 640}})
        for png in (saved, other)])]
    ipynb = tmp_path / "01_toy.ipynb"
    nbformat.write(nb, str(ipynb))
    assert runner.link_figures(ipynb, folder) == 1
    linked, kept = nbformat.read(str(ipynb), as_version=4).cells[0].outputs
    assert linked["data"]["text/html"] == '<img src="01_toy/fig.png" width="640" alt="fig.png"/>'
    assert "image/png" not in linked["data"]
    assert base64.b64decode(kept["data"]["image/png"]) == other   # not a saved file: kept
    assert runner.link_figures(ipynb, tmp_path / "absent") == 0


def test_failure_names_cell_and_keeps_last_good(toy, capsys):
    assert _run(toy, "--notebooks", "01") == 0
    d = toy["out"] / toy["slug"]
    good = (d / "01_toy.ipynb").read_bytes()
    capsys.readouterr()

    assert _run(toy, "--notebooks", "01", "-p", "fail=true") == 1
    err = capsys.readouterr().err
    assert "FAILED 01_toy" in err and "ValueError" in err and "boom from the toy notebook" in err
    assert "cell 4" in err  # markdown, injected parameters, parameters, work, fail -> index 4
    assert (d / "01_toy.ipynb").read_bytes() == good  # last good results intact
    failed = nbformat.read(str(d / "failed-01_toy.ipynb"), as_version=4)
    assert any(o.get("ename") == "ValueError" for c in failed.cells if c.cell_type == "code"
               for o in c.get("outputs", []))

    assert _run(toy, "--notebooks", "01") == 0  # a later success clears the stale failure
    assert not (d / "failed-01_toy.ipynb").exists()


def test_keeps_going_after_a_failure_unless_fail_fast(toy, capsys):
    toy["profile"].write_text(yaml.safe_dump({
        "defaults": {"output_root": str(toy["out"])}, "01_toy": {"fail": True}}))
    assert _run(toy) == 1
    d = toy["out"] / toy["slug"]
    assert (d / "failed-01_toy.ipynb").exists() and (d / "02_other.ipynb").exists()
    assert "failed: 01_toy" in capsys.readouterr().out
    (d / "02_other.ipynb").unlink()
    assert _run(toy, "--fail-fast") == 1
    assert not (d / "02_other.ipynb").exists()


def test_cli_exit_code_and_message(toy):
    """The real command line, in a subprocess, on a failing notebook."""
    res = subprocess.run(
        [sys.executable, "-m", "kernels.runner", "--profile", str(toy["profile"]),
         "--notebook-dir", str(toy["nbdir"]), "--notebooks", "02", "--no-progress",
         "-p", "fail=true"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAILED 02_other: cell 4" in res.stderr and "ValueError" in res.stderr


def test_list_runs_nothing(toy, capsys):
    assert _run(toy, "--list") == 0
    out = capsys.readouterr().out
    assert "01_toy" in out and "02_other" in out and "* n: int = 7" in out
    assert "* output_root" in out and "fail: bool = False" in out
    assert not toy["out"].exists()


# --------------------------------------------------------------------------- usage errors

@pytest.mark.parametrize("args,needle", [
    pytest.param(["--notebooks", "07"], "'07' matches 0 notebooks", id="unknown-notebook"),
    pytest.param(["--profile", "nonesuch"], "unknown profile 'nonesuch'", id="unknown-profile"),
    pytest.param(["-p", "nonesuch=1"], "does not declare a parameter 'nonesuch'", id="unknown-p"),
    pytest.param(["-p", "novalue"], "NAME=VALUE", id="malformed-p"),
])
def test_usage_errors_exit_2(toy, capsys, args, needle):
    argv = ["--notebook-dir", str(toy["nbdir"]), "--no-progress"]
    if "--profile" not in args:
        argv += ["--profile", str(toy["profile"])]
    assert runner.main(argv + args) == 2
    assert needle in capsys.readouterr().err


def test_profile_key_the_notebook_does_not_declare(toy, capsys):
    toy["profile"].write_text(yaml.safe_dump({"defaults": {"output_root": "x"},
                                              "01_toy": {"nn": 3}}))
    assert _run(toy, "--list") == 2
    err = capsys.readouterr().err
    assert "01_toy sets nn" in err and "device, output_root, profile, n, fail" in err


def test_two_parameters_cells_rejected(tmp_path):
    path = make_notebook(tmp_path / "01_twice.ipynb", parameters_cells=2)
    with pytest.raises(RunnerError, match="2 cells tagged 'parameters'"):
        runner.notebook_parameters(path)


@pytest.mark.parametrize("selection,expected", [
    pytest.param("all", ["01_a", "02_b", "03_c"], id="all"),
    pytest.param("01,03", ["01_a", "03_c"], id="01,03"),
    pytest.param("3, 1", ["01_a", "03_c"], id="unpadded-sorted"),
    pytest.param("02_b.ipynb", ["02_b"], id="file-name"),
])
def test_select_notebooks(selection, expected):
    available = {s: Path(f"{s}.ipynb") for s in ("01_a", "02_b", "03_c")}
    assert list(runner.select_notebooks(available, selection)) == expected


@pytest.mark.parametrize("has_gpu,expected", [pytest.param(True, "full", id="gpu"),
                                              pytest.param(False, "smoke", id="cpu")])
def test_auto_profile(has_gpu, expected):
    assert runner.resolve_profile("auto", has_gpu=has_gpu) == expected
    assert runner.resolve_profile("smoke", has_gpu=True) == "smoke"


def test_build_parameters_precedence():
    declared = {n: {} for n in ("device", "output_root", "profile", "seed", "reps")}
    profile = {"name": "p", "defaults": {"seed": 1, "reps": 2, "other": 3, "device": "cuda"},
               "notebooks": {"01_x": {"reps": 4}}}
    params = runner.build_parameters("01_x", declared, profile, device="cpu",
                                     output_root=Path("/r"), overrides={"seed": 9})
    assert params == {"seed": 9, "reps": 4, "device": "cpu", "output_root": "/r", "profile": "p"}


# --------------------------------------------------------------------------- the real profiles

@pytest.mark.parametrize("name,root", [pytest.param("smoke", "results/smoke", id="smoke"),
                                       pytest.param("full", "results", id="full")])
def test_shipped_profiles(name, root):
    prof = runner.load_profile(name)
    assert prof["defaults"]["output_root"] == root
    assert set(prof["notebooks"]) == set(KNOWN_STEMS)
    if root == "results/smoke":
        assert "results/smoke/" in (ROOT / ".gitignore").read_text()


def _declared_by_experiments():
    """{stem: parameter names} from kernels.experiments modules that define STEM and PARAMS."""
    out = {}
    for mod in ("decode_crossover", "prefill_overhead", "ncu_counts"):
        try:
            m = importlib.import_module(f"kernels.experiments.{mod}")
        except ImportError:
            continue
        if hasattr(m, "STEM") and hasattr(m, "PARAMS"):
            out[m.STEM] = {p.name for p in m.PARAMS}
    return out


@pytest.mark.parametrize("name", ["smoke", "full"])
def test_shipped_profiles_match_the_notebooks(name):
    prof = runner.load_profile(name)
    declared = {}
    nbdir = ROOT / "notebooks"
    for stem, path in (runner.discover_notebooks(nbdir) if nbdir.is_dir() else {}).items():
        declared[stem] = set(runner.notebook_parameters(path))
    for stem, names in _declared_by_experiments().items():
        declared.setdefault(stem, names)
    if not declared:
        pytest.skip("neither notebooks/ nor kernels.experiments declare parameters yet")
    for stem, params in prof["notebooks"].items():
        if stem in declared:
            unknown = set(params) - declared[stem]
            assert not unknown, f"{name}.yaml: {stem} sets undeclared {sorted(unknown)}"
    for stem, names in declared.items():
        assert stem in prof["notebooks"], f"{name}.yaml has no entry for {stem}"
        assert {"device", "output_root", "profile"} <= names, stem
    # the contest-shape variant: notebooks that take solutions and a shape, known names only
    assert set(prof["solution_shape"]) == {"decode", "prefill"}
    for op, stems in prof["solution_shape"].items():
        for stem, params in stems.items():
            if stem in declared:
                assert {"solutions", *runner.SHAPE_PARAMS} <= declared[stem], stem
                unknown = set(params) - declared[stem]
                assert not unknown, f"{name}.yaml: solution_shape.{op}.{stem} sets {unknown}"


def test_solutions_of_another_shape_switch_the_notebook(capsys):
    """``--solutions`` with the contest's d128 definitions: the smoke profile's notebooks of
    that op move to the definition's shape with its ``solution_shape`` values (shown by
    ``--list``, nothing run); ``-p`` on the shape keeps the profile's."""
    fix = ROOT / "tests" / "fixtures" / "solutions"
    argv = ["--profile", "smoke", "--notebooks", "01,03", "--list",
            "--solutions", f"{fix / 'py_decode.json'},{fix / 'py_prefill'}"]
    assert runner.main(argv) == 0
    out = capsys.readouterr().out
    assert ("01_decode_crossover: at the shape of fixture-py-decode-json (HQ=4 HV=8 D=128), "
            "with the values of profile smoke's solution_shape.decode") in out
    nb01 = out[out.index("\n01_decode_crossover  ("):out.index("\n03_ncu_instruction_counts  (")]
    for line in ("* head_dim: int = 128", "* num_v_heads: int = 8", "* batch_sizes: list = [1]"):
        assert line in nb01
    assert "03_ncu_instruction_counts: at the shape" not in out   # no shape to move
    assert runner.main(argv + ["-p", "head_dim=32"]) == 0
    out = capsys.readouterr().out
    assert "at the shape of" not in out and "* head_dim: int = 32" in out


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_run_says_the_runners_exit_status(tmp_path):
    """``make run`` prints what the runner's status meant (GNU make itself exits 2 whenever
    a command fails, and names the command's status: "Error 1" / "Error 2"): 2 for a
    missing solution path (the real runner, refused before any notebook), 1 from a stand-in
    Python that exits as the runner does when a solution never passed the gate."""
    def make_run(python, *extra):
        return subprocess.run(["make", "-s", "run", f"SUITE_PYTHON={python}", *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    res = make_run(sys.executable, "NOTEBOOKS=01", f"SOLUTIONS={tmp_path / 'missing.json'}")
    assert res.returncode == 2, res.stderr
    assert "missing.json does not exist" in res.stderr
    assert "make run: the runner exited 2: bad arguments" in res.stderr
    assert "run] Error 2" in res.stderr
    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    res = make_run(stub)
    assert res.returncode == 2, res.stderr
    assert ("make run: the runner exited 1: a notebook failed or a requested solution never "
            "passed the gate") in res.stderr
    assert "run] Error 1" in res.stderr
