"""kernels.contest: flashinfer-bench solutions as implementations (read, built, adapted, in workers).

CPU (Triton interpreter host): python-language solutions from a starter-kit folder and a
JSON, destination-passing and value-returning, ``module:function``, every load error,
sys.modules and torch settings unchanged by a load, and a solution that aborts or hangs
isolated in its worker. GPU: the CUDA fixtures built through TVM-FFI and torch's
cpp_extension, run in and out of the worker, and a build failure.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kernels.checks import check_outputs
from kernels.contest.formats import SolutionError, read_solution
from kernels.contest.loader import load_solution
from kernels.contest.scope import torch_settings
from kernels.reference import decode_reference, prefill_reference
from kernels.spec import make_decode_inputs, make_prefill_inputs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "solutions"
PY = FIX / "py_decode"
DEF = "gdn_decode_qk4_v8_d128_k_last"


def _sources(folder: Path, language: str = "python") -> list:
    root = folder / "solution" / language
    return [{"path": p.relative_to(root).as_posix(), "content": p.read_text()}
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def _json(tmp_path: Path, *, name="fixture-json", definition=DEF, entry="kernel.py::run",
          dps=True, sources=None, drop=(), **spec_extra) -> Path:
    spec = {"language": "python", "target_hardware": ["cuda"], "entry_point": entry,
            "destination_passing_style": dps, **spec_extra}
    if dps is None:
        del spec["destination_passing_style"]
    sol = {"name": name, "definition": definition, "author": "tests", "spec": spec,
           "sources": _sources(PY) if sources is None else sources}
    for k in drop:
        if "." in k:
            a, b = k.split(".")
            del sol[a][b]
        else:
            del sol[k]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(sol))
    return path


@pytest.fixture(scope="module")
def decode_case():
    x = make_decode_inputs(2, seed=3)
    return x, decode_reference(**x)


def _passes(fn, x, ref):
    state = x["state"].clone()
    out = fn(**x)
    assert torch.equal(x["state"], state), "the input state was modified"
    res = check_outputs(tuple(out), tuple(ref))
    assert res.ok, res.as_dict()


# --------------------------------------------------------------------------- loading


def test_folder_destination_passing(decode_case):
    fn = load_solution(PY)
    assert (fn.name, fn.language, fn.definition, fn.op) == ("fixture-py-decode", "python",
                                                            DEF, "decode")
    assert fn.dps is True and fn.graph_capturable is True and fn.build_s is None
    _passes(fn, *decode_case)


@pytest.mark.parametrize("entry,dps,want", [("kernel.py::run_returning", False, False),
                                             ("kernel.py::run_returning", None, False),
                                             ("kernel.py::run", None, True)])
def test_json_returning_and_signature_detection(tmp_path, decode_case, entry, dps, want):
    fn = load_solution(f"solution:{_json(tmp_path, entry=entry, dps=dps)}", op="decode")
    assert fn.name == "fixture-json" and fn.dps is want
    _passes(fn, *decode_case)


def test_prefill_folder_reads_as_value_returning_without_its_library():
    """The FLA prefill fixture imports ``fla`` only when called: it loads anywhere, and its
    spec (``destination_passing_style = false``) decides the style."""
    src = read_solution(FIX / "fla_prefill")
    assert (src.name, src.op, src.language, src.dps) == ("fixture-fla-prefill", "prefill",
                                                         "python", False)
    fn = load_solution(FIX / "fla_prefill", op="prefill")
    assert fn.definition == "gdn_prefill_qk4_v8_d128_k_last" and fn.dps is False


def test_module_function(decode_case):
    fn = load_solution("kernels.reference:decode_reference")
    assert fn.op == "decode" and fn.dps is False and fn.language == "python"
    _passes(fn, *decode_case)


def test_load_leaves_sys_modules_and_torch_settings(decode_case):
    load_solution(PY)                      # first load: the loader's own imports
    modules, settings = set(sys.modules), torch_settings()
    fn = load_solution(PY)                 # the fixture sets matmul precision "high"
    assert set(sys.modules) == modules
    assert torch_settings() == settings
    _passes(fn, *decode_case)
    assert set(sys.modules) == modules and torch_settings() == settings


def test_bad_inputs_name_the_argument(decode_case):
    fn = load_solution(PY)
    x, _ = decode_case
    with pytest.raises(ValueError, match="argument 'a' must be bfloat16"):
        fn(**dict(x, a=x["a"].float()))
    with pytest.raises(ValueError, match="argument 'v'"):
        fn(**dict(x, v=x["v"][:1]))


# --------------------------------------------------------------------------- reading (the one reader)


def _kit(tmp_path: Path, config: str, files=None) -> Path:
    """A starter-kit folder: config.toml and solution/python/<files>."""
    folder = tmp_path / "kit"
    (folder / "solution" / "python").mkdir(parents=True)
    (folder / "config.toml").write_text(config)
    files = {"kernel.py": "def kernel(*a):\n    pass\n"} if files is None else files
    for name, text in files.items():
        (folder / "solution" / "python" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "solution" / "python" / name).write_text(text)
    return folder


_KIT = f"""[solution]
name = "team-x"
definition = "{DEF}"
author = "team"

[build]
language = "python"
entry_point = "kernel.py::kernel"
destination_passing_style = false
"""


def test_read_as_flashinfer_bench_solution(tmp_path):
    """fib_solution(), what make contest-eval evaluates: a JSON as read; a folder packed as
    the starter kit packs it (its own source files; '<file>::<function>'; destination-
    passing unless config.toml says otherwise; binding passed through)."""
    from kernels.contest.solution import solution, write_solution

    sol = solution("decode")
    src = read_solution(write_solution(sol, tmp_path))
    assert src.fib_solution() == sol and src.author == sol["author"]
    kit = _kit(tmp_path, _KIT, {"kernel.py": "def kernel(*a):\n    pass\n",
                                "helper.CUH": "// x\n", "notes.txt": "not a source",
                                "sub/deep.py": "x = 1\n"})
    src = read_solution(kit)
    got = src.fib_solution()
    assert (got["name"], got["author"], got["definition"]) == ("team-x", "team", DEF)
    assert got["spec"] == {"language": "python", "target_hardware": ["cuda"],
                           "entry_point": "kernel.py::kernel", "dependencies": [],
                           "destination_passing_style": False}
    assert [s["path"] for s in got["sources"]] == ["helper.CUH", "kernel.py"]
    assert sorted(src.sources) == ["helper.CUH", "kernel.py"]     # what the loader builds, too
    (kit / "config.toml").write_text(_KIT.replace("destination_passing_style = false\n", "")
                                     .replace('"kernel.py::kernel"', '"kernel"')
                                     + 'binding = "torch"\n')
    src = read_solution(kit)
    assert src.dps is None and (src.entry_file, src.entry_symbol) == ("kernel.py", "kernel")
    got = src.fib_solution()
    assert got["spec"]["destination_passing_style"] is True     # the starter kit's default
    assert (got["spec"]["entry_point"], got["spec"]["binding"]) == ("kernel.py::kernel", "torch")


@pytest.mark.parametrize("case,match", [
    ("missing", "no such solution JSON or starter-kit folder"),
    ("not-json", "not valid JSON"),
    ("not-object", "a solution JSON is an object, got list"),
    ("no-author", "missing field 'author'"),
    ("no-entry-field", "missing field 'spec.entry_point'"),
    ("bad-entry-format", "field 'spec.entry_point'.*expected '<file>::<function>'"),
    ("entry-not-in-sources", "field 'spec.entry_point'.*'main.py' is not among the sources"),
    ("wrong-op", "field 'definition'.*a prefill definition; a decode implementation"),
    ("not-gdn", "field 'definition'.*not a GDN definition"),
    ("language", "field 'spec.language'.*'rust' is not one of flashinfer-bench's"),
    ("dps-type", "field 'spec.destination_passing_style' must be true or false"),
    ("source-path", r"field 'sources\[\].path' '../x.py' must be relative"),
])
def test_json_errors_name_file_and_field(tmp_path, case, match):
    path = tmp_path / "bad.json"
    if case == "not-json":
        path.write_text("{not json")
    elif case == "not-object":
        path.write_text("[]")
    elif case == "no-author":
        path = _json(tmp_path, drop=("author",))
    elif case == "no-entry-field":
        path = _json(tmp_path, drop=("spec.entry_point",))
    elif case == "bad-entry-format":
        path = _json(tmp_path, entry="kernel.py")
    elif case == "entry-not-in-sources":
        path = _json(tmp_path, entry="main.py::run")
    elif case == "wrong-op":
        path = _json(tmp_path, definition="gdn_prefill_qk4_v8_d128_k_last")
    elif case == "not-gdn":
        path = _json(tmp_path, definition="rmsnorm_h4096")
    elif case == "language":
        path = _json(tmp_path, language="rust")
    elif case == "dps-type":
        path = _json(tmp_path, dps="yes")
    elif case == "source-path":
        path = _json(tmp_path, sources=[{"path": "../x.py", "content": "x = 1\n"}])
    with pytest.raises(SolutionError, match=match) as e:
        read_solution(path, op="decode")
    assert str(path) in str(e.value)


@pytest.mark.parametrize("case,match", [
    ("no-config", "no config.toml"),
    ("nested", r"no config.toml .*sub-folders \['gdn_decode_qk4_v8_d128_k_last'\] have one"),
    ("bad-toml", "not valid TOML"),
    ("no-language", "missing field 'build.language'"),
    ("track-name", "field 'solution.definition' is 'gated_delta_net', not a GDN definition"),
    ("no-language-folder", "field 'build.language' is 'triton' but .*solution/triton is not a "
                           "folder"),
    ("no-sources", r"solution/python: no source files \(.py, .cu"),
    ("bare-entry", "field 'build.entry_point' is 'kernel': no Python file"),
])
def test_folder_errors_name_file_and_field(tmp_path, case, match):
    config = {"bad-toml": "[solution\n",
              "no-language": _KIT.replace('language = "python"\n', ""),
              "track-name": _KIT.replace(DEF, "gated_delta_net"),
              "no-language-folder": _KIT.replace('"python"', '"triton"'),
              "bare-entry": _KIT.replace('"kernel.py::kernel"', '"kernel"')}.get(case, _KIT)
    files = {"no-sources": {"notes.txt": "x", "sub/deep.py": "def kernel():\n    pass\n"},
             "bare-entry": {"k.py": "def other():\n    pass\n"}}.get(case)
    folder = _kit(tmp_path, config, files)
    if case == "no-config":
        (folder / "config.toml").unlink()
    elif case == "nested":       # a repository holding one starter-kit folder per definition
        folder = folder.rename(tmp_path / DEF).parent
    with pytest.raises(SolutionError, match=match) as e:
        read_solution(folder)
    assert str(folder) in str(e.value)


@pytest.mark.parametrize("case,match", [
    ("missing-function", "field 'spec.entry_point'.*no function 'nope'"),
    ("language", "field 'spec.language'.*'tilelang' is not supported here"),
    ("import-error", "importing kernel.py failed: ZeroDivisionError"),
    ("dps-ambiguous", "field 'spec.destination_passing_style'.*takes neither"),
])
def test_load_errors_name_file_and_field(tmp_path, case, match):
    """Errors only loading finds (read_solution accepts these)."""
    if case == "missing-function":
        path = _json(tmp_path, entry="kernel.py::nope")
    elif case == "language":
        path = _json(tmp_path, language="tilelang")
    elif case == "import-error":
        path = _json(tmp_path, sources=[{"path": "kernel.py", "content": "x = 1 / 0\n"}])
    else:
        path = _json(tmp_path, dps=None, sources=[
            {"path": "kernel.py", "content": "def run(q, k):\n    pass\n"}])
    read_solution(path)
    with pytest.raises(SolutionError, match=match) as e:
        load_solution(path, op="decode")
    assert str(path) in str(e.value)
    if case == "import-error":   # where in the solution's code
        assert str(e.value).endswith("(at kernel.py:1 in <module>)")


def test_cuda_solution_on_a_cpu_host_says_why():
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the GPU tests build the CUDA fixtures")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        load_solution(FIX / "tvm_ffi_decode")


# --------------------------------------------------------------------------- isolation


def test_abort_and_hang_are_isolated_in_their_workers(decode_case):
    from kernels.contest.remote import remote_solutions
    from kernels.peers_worker import WorkerError

    x, ref = decode_case
    sols = remote_solutions([f"solution:{FIX / 'abort_decode'}"],
                            [str(FIX / "hang_decode"), str(PY)], op="decode",
                            taken=["fixture-py-decode"], timeout_s=120)
    assert list(sols) == ["fixture-abort", "fixture-hang", "fixture-py-decode [solution]"]
    settings = torch_settings()
    with pytest.raises(WorkerError, match="solution fixture-abort: killed by SIGABRT"):
        sols["fixture-abort"].run("B2", x, ref, device="cpu")
    sols["fixture-hang"].worker.timeout_s = 3
    with pytest.raises(WorkerError, match="solution fixture-hang: .*no answer.*within 3 s"):
        sols["fixture-hang"].run("B2", x, ref, device="cpu")
    res = sols["fixture-py-decode [solution]"].run("B2", x, ref, device="cpu",
                                                   methods=["cpu_wall"], rep=2, warmup=1)
    assert res["gate"]["status"] == "pass" and res["timings"][0]["method"] == "cpu_wall"
    assert torch_settings() == settings
    for s in sols.values():
        s.worker.close(kill=True)


def test_solutions_param_keeps_its_op_only(capsys):
    from kernels.contest.remote import remote_solutions

    assert remote_solutions([], [str(PY)], op="prefill") == {}
    assert "a decode solution, not used by this prefill notebook" in capsys.readouterr().out
    bad = remote_solutions([f"solution:{PY}"], op="prefill")
    assert not bad["py_decode"] and "a decode definition" in bad["py_decode"].reason


def test_gpu_only_conveniences_run_in_the_worker_off_cuda():
    """The Triton fixture written for the GPU (an NVTX range as decorator and as context
    manager, ``torch.cuda.current_stream()``, ``torch.cuda.synchronize()``, a
    ``device="cuda"`` default) is gated on the CPU in its worker: the worker made those
    harmless and its status says which, once."""
    from kernels.contest.remote import remote_solutions

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the shims are for CPU machines")
    x = make_prefill_inputs([5], seed=2)
    ref = prefill_reference(**x)
    sols = remote_solutions([], [str(FIX / "nvtx_prefill")], op="prefill", timeout_s=300)
    sol = sols["fixture-nvtx-prefill"]
    try:
        assert sol.version == (
            "triton, destination-passing, its device='cuda' default given the inputs' "
            "device; off CUDA: torch.cuda.nvtx as no-op, torch.cuda.synchronize as no-op, "
            "torch.cuda.current_stream as a host stand-in")
        res = sol.run("T5", x, ref, device="cpu")
        assert res["gate"]["status"] == "pass", res["gate"]
    finally:
        sol.worker.close(kill=True)


def test_an_error_inside_a_solution_names_its_file_and_line(tmp_path, decode_case):
    """Raised in the solution's own code (here a helper of the entry), the error names the
    file (from the kit's folder) and line; raised by a wrapper of the entry before its body
    (an NVTX decorator in this process, which keeps torch as it is), the entry's own line."""
    kit = tmp_path / "kit"
    (kit / "solution" / "python").mkdir(parents=True)
    (kit / "config.toml").write_text((PY / "config.toml").read_text())
    (kit / "solution" / "python" / "kernel.py").write_text(
        "import torch\n\n\ndef _helper(q):\n    raise ValueError('no ' + str(q.dtype))\n\n\n"
        "def run(q, k, v, state, A_log, a, dt_bias, b, scale, output, new_state):\n"
        "    _helper(q)\n")
    with pytest.raises(Exception, match=r"solution/python/kernel.py:5 in _helper: "
                                        r"ValueError: no torch.bfloat16") as e:
        load_solution(kit)(**decode_case[0])
    assert isinstance(e.value.__cause__, ValueError)
    if torch.cuda.is_available():
        return
    fn = load_solution(FIX / "nvtx_prefill")
    with pytest.raises(Exception, match=r"solution/triton/kernel.py:\d+ in run \(raised by "
                                        r"a wrapper of the entry\).*NVTX"):
        fn(**make_prefill_inputs([2], seed=1))


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("folder,binding,dps", [("tvm_ffi_decode", "tvm-ffi", True),
                                                ("torch_ext_decode", "torch", False)])
def test_gpu_cuda_fixtures_build_and_pass(folder, binding, dps):
    x = make_decode_inputs(8, seed=1, device="cuda")
    ref = decode_reference(**x)
    fn = load_solution(FIX / folder)
    assert (fn.language, fn.binding, fn.dps, fn.graph_capturable) == ("cuda", binding, dps, True)
    assert fn.build_s is not None and fn.build_s >= 0
    _passes(fn, x, ref)
    torch.cuda.synchronize()
    again = load_solution(FIX / folder)
    assert again.cached is True
    _passes(again, x, ref)


@pytest.mark.gpu
def test_gpu_fla_prefill_fixture_returns_and_passes():
    """The python prefill fixture (FLA's chunked kernel, value-returning) on a varlen
    batch: read from its folder as value-returning, inputs untouched, contest rule met."""
    pytest.importorskip("fla")
    x = make_prefill_inputs([100, 28], seed=2, device="cuda")
    ref = prefill_reference(**x)
    fn = load_solution(FIX / "fla_prefill")
    assert (fn.op, fn.language, fn.dps) == ("prefill", "python", False)
    _passes(fn, x, ref)


@pytest.mark.gpu
def test_gpu_cuda_fixture_in_its_worker_with_graph_timing():
    from kernels.contest.remote import remote_solutions

    x = make_decode_inputs(8, seed=1, device="cuda")
    ref = decode_reference(**x)
    sols = remote_solutions([f"solution:{FIX / 'tvm_ffi_decode'}"], op="decode")
    sol = sols["fixture-cuda-tvm-ffi"]
    assert sol, getattr(sol, "reason", "")
    res = sol.run("B8", x, ref, device="cuda", methods=["graph", "cupti_cold"], rep=5, warmup=2)
    assert res["gate"]["status"] == "pass", res["gate"]
    assert [t["method"] for t in res["timings"] if "median_us" in t] == ["graph", "cupti_cold"]
    sol.worker.close()


@pytest.mark.gpu
def test_gpu_build_failure_names_the_file(tmp_path):
    src = (FIX / "tvm_ffi_decode" / "solution" / "cuda" / "kernel.cu").read_text()
    path = _json(tmp_path, name="broken-cuda", entry="kernel.cu::run", language="cuda",
                 sources=[{"path": "kernel.cu", "content": src.replace("float o = 0.f;", "")}])
    with pytest.raises(SolutionError, match="build failed \\(tvm-ffi") as e:
        load_solution(path)
    assert str(path) in str(e.value)


# --------------------------------------------------------------------------- notebooks


def test_decode_notebook_gates_and_times_solutions(tmp_path):
    """Notebook 01's flow with a solution from ``impls`` and one from ``solutions``: the
    aborting one is an ``error`` row naming the signal, the other is gated and timed
    under its name, and the run goes on."""
    from kernels.experiments import decode_crossover as dx

    p = {q.name: q.default for q in dx.PARAMS}
    p.update(device="cpu", profile="unit", output_root=str(tmp_path), batch_sizes=[1],
             impls=["torch", f"solution:{PY}"], solutions=[str(FIX / "abort_decode")],
             methods=["cpu_wall"], sweep_BV=[], repetitions=2, warmup=0)
    run = dx.start(p)
    gate = dx.run_gate(run)
    by = gate.set_index("label")
    assert by.loc["fixture-py-decode", "status"] == "pass"
    assert by.loc["fixture-abort", "status"] == "error"
    assert "killed by SIGABRT" in by.loc["fixture-abort", "reason"]
    times = dx.run_timing(run, gate)
    assert set(times.label) == {"torch", "fixture-py-decode"}
    assert set(times[times.label == "fixture-py-decode"].impl) == {"solution"}
    assert [s["label"] for s in run.extra_provenance["solutions"]] == ["fixture-py-decode",
                                                                     "fixture-abort"]
    run.finish()
    for s in run.state["solutions"].values():   # kernels.registry records
        s.fn.worker.close(kill=True)


def test_ncu_target_and_notebook03_targets_take_solutions():
    from kernels.ncu_target import build_call
    from kernels.experiments import ncu_counts as nx

    out, state = build_call(f"solution:{PY}", "decode", B=2, device="cpu")()
    assert out.shape == (2, 1, 8, 128) and state.dtype == torch.float32
    p = {q.name: q.default for q in nx.PARAMS}
    p.update(impls=["ours"], solutions=[str(PY)], bv_sweep=[])
    t = [x for x in nx.targets(p) if x["impl"] == "solution"]
    assert [x["label"] for x in t] == ["fixture-py-decode"]
    assert t[0]["target"]["impl"] == f"solution:{PY.resolve()}"


def test_runner_solutions_option(tmp_path):
    from kernels.runner import RunnerError, _solution_paths

    [(path, src)] = _solution_paths(f"{PY}, ")
    assert path == str(PY.resolve()) and (src.name, src.op, src.shape) == (
        "fixture-py-decode", "decode", (4, 8, 128))
    with pytest.raises(RunnerError, match="--solutions: .*missing.json does not exist"):
        _solution_paths(str(tmp_path / "missing.json"))
    bad = _json(tmp_path, name="no-def", drop=("definition",))
    with pytest.raises(RunnerError, match="--solutions: .*no-def.json: missing field 'definition'"):
        _solution_paths(str(bad))


def test_runner_loads_every_entry_before_the_first_notebook(tmp_path, capsys):
    """A solution whose entry cannot be resolved stops the run before any notebook (exit 2,
    the loader's message); a loadable one gets one line, off CUDA naming the shims; with
    ``--solutions-may-fail`` the bad one is a warning."""
    from kernels import runner
    from kernels.contest.formats import read_solution

    bad = _json(tmp_path, name="fixture-no-entry", entry="kernel.py::missing")
    out = tmp_path / "out"
    argv = ["--profile", "smoke", "--notebooks", "01", "--output-root", str(out),
            "--no-progress", "--solutions", f"{PY},{bad}"]
    assert runner.main(argv) == 2
    cap = capsys.readouterr()
    assert (f"error: --solutions: {bad}: field 'spec.entry_point': kernel.py defines no "
            "function 'missing'") in cap.err
    assert "solution fixture-py-decode: kernel.py::run loads (python, destination-passing" \
        in cap.out
    assert "== 01_decode_crossover" not in cap.out
    assert not [p for p in out.rglob("*") if p.suffix in (".ipynb", ".csv")]
    sols = [(str(p), read_solution(p)) for p in (FIX / "nvtx_prefill", bad)]
    assert runner._check_solutions(sols, may_fail=True)
    cap = capsys.readouterr()
    assert "(--solutions-may-fail: the notebooks report it unavailable)" in cap.err
    line = next(ln for ln in cap.out.splitlines() if "fixture-nvtx-prefill" in ln)
    assert "device='cuda' default given the inputs' device" in line or torch.cuda.is_available()
    if not torch.cuda.is_available():   # said once for the run
        assert cap.out.count("off CUDA:") == 1
        assert "solutions' workers, off CUDA: torch.cuda.nvtx as no-op" in cap.out


def test_runner_refuses_two_shapes_of_one_op(tmp_path):
    from kernels.runner import RunnerError, _solution_paths, solution_shapes

    small = _json(tmp_path, name="small", definition="gdn_decode_qk2_v4_d32_k_last")
    sols = _solution_paths(f"{PY},{small}")
    with pytest.raises(RunnerError, match="small .* and fixture-py-decode are decode solutions "
                                          "of two shapes"):
        solution_shapes(sols)
    assert solution_shapes(sols[:1]) == {"decode": ((4, 8, 128), ["fixture-py-decode"])}


def test_our_packed_triton_solution_through_the_loader(tmp_path):
    from kernels.contest.solution import solution, write_solution

    fn = load_solution(write_solution(solution("decode"), tmp_path), op="decode")
    assert (fn.name, fn.language, fn.dps) == ("gdn-decode-ours", "triton", True)
    # a Triton solution runs where Triton does: the GPU when there is one, else the interpreter
    x = make_decode_inputs(2, seed=3, device="cuda" if torch.cuda.is_available() else "cpu")
    _passes(fn, x, decode_reference(**x))


def test_prefill_scaling_rows_of_a_solution(tmp_path):
    """Notebook 04 names a solution like every notebook: ``impl`` is ``solution``, ``label``
    its name (gate and times), at the contest's shape."""
    from kernels.experiments import prefill_scaling as xs

    p = {q.name: q.default for q in xs.PARAMS}
    p.update(device="cpu", profile="unit", output_root=str(tmp_path), shapes=["T2"],
             impls=[], solutions=[str(FIX / "py_prefill")], methods=["cpu_wall"],
             repetitions=1, warmup=0)
    run = xs.start(p)
    gate = xs.run_gate(run)
    assert gate[["label", "impl", "status"]].values.tolist() == [
        ["fixture-py-prefill", "solution", "pass"]]
    times = xs.run_times(run, gate)
    assert times[["label", "impl", "method"]].values.tolist() == [
        ["fixture-py-prefill", "solution", "cpu_wall"]]
    for fn in run.state["impls"].values():
        fn.worker.close(kill=True)
