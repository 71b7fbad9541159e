"""The contest bridge (kernels.contest): packing, the packed code run alone under the
Triton interpreter against our reference, definition/workload builders vs the spec,
and - where flashinfer-bench is importable - its own models and builder."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.checks import check_outputs
from kernels.contest import bundle, definitions as defs
from kernels.contest.solution import (PREFILL_VARIANTS, baseline_solution, entry_params,
                                      solution, unpack, write_solution)
from kernels.reference import decode_reference, prefill_reference
from kernels.spec import (CONTEST, DECODE_BATCH_SIZES, PREFILL_SHAPES, GDNShape,
                          make_decode_inputs, make_prefill_inputs, validate_decode_inputs,
                          validate_prefill_inputs)

REPO = Path(__file__).resolve().parents[2]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # as tests/decode/test_decode.py
HAS_FIB = importlib.util.find_spec("flashinfer_bench") is not None
NO_FIB = "flashinfer-bench is not importable (GPU-host wheels in .whl: scripts/contest_wheel.sh; not a CI dependency)"


# --------------------------------------------------------------------------- bundle

def test_closure_follows_function_level_imports():
    mods = bundle.module_closure(["kernels.decode"])
    # decode/table.py imports ..device inside a function
    assert {"kernels.decode.ops", "kernels.decode.kernel", "kernels.decode.table",
            "kernels.spec", "kernels.interpret", "kernels.device", "kernels"} <= set(mods)
    assert not any(m.startswith(("kernels.prefill", "kernels.bench")) or m == "kernels.reference"
                   for m in mods)


def test_absolute_imports_are_rewritten_relative():
    src = ("import os\nfrom kernels.spec import resolve_scale\n"
           "def f():\n    from kernels.bench.timing import time_fn as g\n"
           "    import kernels.bench.timing as tm\n    return g, tm\n")
    out = bundle._rewrite_absolute(src, "kernels.decode.ops")
    assert "from ..spec import resolve_scale" in out
    assert "    from ..bench.timing import time_fn as g" in out
    assert "    from ..bench import timing as tm" in out
    assert "kernels" not in out
    ast.parse(out)
    with pytest.raises(ValueError, match="import kernels"):
        bundle._rewrite_absolute("import kernels.spec\n", "kernels.decode.ops")


def test_check_imports_refuses_other_packages():
    bundle.check_imports({"gdn/x.py": "import torch, triton, math\nfrom . import y\n"})
    bundle.check_imports({"gdn/interpret.py": "def f():\n    import numpy\n"})
    with pytest.raises(ValueError, match="gdn/x.py, line 2: imports 'fla'"):
        bundle.check_imports({"gdn/x.py": "import torch\nfrom fla.ops import chunk\n"})
    with pytest.raises(ValueError, match="imports 'numpy'"):
        bundle.check_imports({"gdn/decode/ops.py": "import numpy as np\n"})


def test_flatten_refuses_duplicate_names_and_keeps_one_future():
    flat = bundle.flatten_modules(["kernels.spec", "kernels.reference"])
    assert flat.count("from __future__ import annotations") == 1
    assert "from .spec" not in flat
    ns = {}
    exec(compile(flat, "<flat>", "exec"), ns)
    assert callable(ns["decode_reference"]) and callable(ns["validate_prefill_inputs"])
    with pytest.raises(ValueError, match="defined by both"):
        bundle.flatten_modules(["kernels.spec", "kernels.spec"])


# --------------------------------------------------------------------------- definitions

@pytest.mark.parametrize("op", defs.OPS)
def test_definition_matches_the_public_names_and_our_spec(op):
    d = defs.definition(op)
    assert d["name"] == f"gdn_{op}_qk4_v8_d128_k_last"
    fn = decode_reference if op == "decode" else prefill_reference
    # inputs in our calling convention's order (the decode reference's serving extras after
    # scale are not the contest's), then the two outputs
    params = list(inspect.signature(fn).parameters)
    assert list(d["inputs"]) == params[:params.index("scale") + 1]
    assert list(d["outputs"]) == ["output", "new_state"]
    const = {n: a["value"] for n, a in d["axes"].items() if a["type"] == "const"}
    assert const["num_q_heads"] == const["num_k_heads"] == CONTEST.num_q_heads
    assert const["num_v_heads"] == CONTEST.num_v_heads and const["head_size"] == CONTEST.head_dim
    for spec in list(d["inputs"].values()) + list(d["outputs"].values()):
        assert spec["shape"] is None or all(s in d["axes"] for s in spec["shape"])


@pytest.mark.parametrize("op, axes, lens", [
    ("decode", {"batch_size": 3}, None),
    ("prefill", {"total_seq_len": 9, "num_seqs": 2, "len_cu_seqlens": 3}, [4, 5]),
])
def test_definition_shapes_and_dtypes_are_the_spec_generators(op, axes, lens):
    d = defs.definition(op)
    x = (make_decode_inputs(axes["batch_size"]) if op == "decode" else make_prefill_inputs(lens))
    shapes = defs.input_shapes(d, axes)
    for name, spec in d["inputs"].items():
        if shapes[name] is None:
            assert name == "scale" and spec["dtype"] == "float32"
            continue
        assert tuple(x[name].shape) == shapes[name], name
        assert str(x[name].dtype) == f"torch.{spec['dtype']}", name
    # tensors built from the definition's shapes pass our validation; outputs match the reference
    inputs = {n: x[n] for n in d["inputs"]}
    (validate_decode_inputs if op == "decode" else validate_prefill_inputs)(**inputs)
    ref = (decode_reference if op == "decode" else prefill_reference)(**inputs)
    outs = defs.output_shapes(d, axes)
    for (name, spec), t in zip(d["outputs"].items(), ref):
        assert tuple(t.shape) == outs[name] and str(t.dtype) == f"torch.{spec['dtype']}"


def test_workloads_cover_the_contest_axes():
    dec = defs.workloads("decode")
    assert [w["trace"]["workload"]["axes"]["batch_size"] for w in dec] == list(DECODE_BATCH_SIZES)
    pre = defs.workloads("prefill")
    assert [w["key"] for w in pre] == list(PREFILL_SHAPES)
    Ts = [w["trace"]["workload"]["axes"]["total_seq_len"] for w in pre]
    Ns = [w["trace"]["workload"]["axes"]["num_seqs"] for w in pre]
    assert min(Ts) == 6 and max(Ts) == 8192 and min(Ns) == 1 and max(Ns) == 57
    assert len({w["trace"]["workload"]["uuid"] for w in dec + pre}) == len(dec + pre)
    for w in dec + pre:
        wl = w["trace"]["workload"]
        assert wl["inputs"]["scale"] == {"type": "scalar", "value": 1 / math.sqrt(128)}
        paths = {i["path"] for n, i in wl["inputs"].items() if n != "scale"}
        assert paths == {defs.blob_path(w["trace"]["definition"], wl["uuid"])}
    for w in pre:
        ax = w["trace"]["workload"]["axes"]
        assert ax["len_cu_seqlens"] == ax["num_seqs"] + 1 == len(w["lens"]) + 1
        assert ax["total_seq_len"] == sum(w["lens"])


def test_workload_inputs_are_seeded_spec_inputs():
    w = defs.workloads("prefill", prefill_shapes={"x": [3, 4]})[0]
    x = defs.workload_inputs("prefill", w)
    y = make_prefill_inputs([3, 4], seed=w["seed"])
    assert torch.equal(x["q"], y["q"]) and torch.equal(x["cu_seqlens"], y["cu_seqlens"])
    assert x["scale"] == w["trace"]["workload"]["inputs"]["scale"]["value"]


# --------------------------------------------------------------------------- packing

@pytest.mark.parametrize("op, variant", [("decode", None), ("prefill", "fused"),
                                         ("prefill", "graph")])
def test_solution_metadata_and_entry_signature(op, variant):
    sol = solution(op, variant=variant)
    assert sol["definition"] == defs.definition_name(op)
    assert sol["spec"]["language"] == "triton" and sol["spec"]["destination_passing_style"]
    assert sol["spec"]["entry_point"] == "main.py::run"
    paths = [s["path"] for s in sol["sources"]]
    assert len(paths) == len(set(paths)) and "main.py" in paths
    main = ast.parse(next(s["content"] for s in sol["sources"] if s["path"] == "main.py"))
    run = next(n for n in main.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    ins, outs = entry_params(op)
    assert [a.arg for a in run.args.args] == ins + outs
    if op == "decode":   # the per-GPU dispatch tables travel with the code
        tables = sorted(p.name for p in (REPO / "kernels" / "decode_configs").glob("*.json"))
        assert sorted(Path(p).name for p in paths if p.startswith("gdn/decode_configs/")) == tables
    else:
        assert f"variant={variant!r}" in ast.unparse(run)
    bundle.check_imports({s["path"]: s["content"] for s in sol["sources"]})


def test_solution_refuses_bad_arguments():
    with pytest.raises(ValueError, match="op must be one of"):
        solution("mixed")
    with pytest.raises(ValueError, match="prefill only"):
        solution("decode", variant="fused")
    with pytest.raises(ValueError, match="variant must be one of"):
        solution("prefill", variant="unfused")


def test_pack_cli_writes_solution_json(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "kernels.contest", "pack", "--op", "prefill",
                        "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr
    sol = json.loads((tmp_path / "gdn-prefill-ours-fused.json").read_text())
    assert sol["name"] == "gdn-prefill-ours-fused" and sol["author"]
    bad = subprocess.run([sys.executable, "-m", "kernels.contest", "pack", "--op", "decode",
                          "--variant", "graph", "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "prefill only" in bad.stderr


_RUNNER = """
import importlib, sys


class Blocked:
    \"\"\"Our package (installed editable in the venv) and the peers cannot be imported.\"\"\"
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("kernels", "fla", "flashinfer"):
            raise ImportError(f"{name} is blocked: the packed solution must not need it")


sys.meta_path.insert(0, Blocked())
import os
import torch

# compiled on a GPU host (TRITON_INTERPRET=0, as tests/conftest.py decides), else the interpreter
dev = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"
mod = importlib.import_module(sys.argv[1])
args, outs = torch.load(sys.argv[2])
args = [a.to(dev) if isinstance(a, torch.Tensor) else a for a in args]
outs = [o.to(dev) for o in outs]
mod.run(*args, *outs)
torch.save([o.cpu() for o in outs], sys.argv[3])
"""


def _run_packed(tmp_path, sol, args, outs):
    """Unpack ``sol`` into a clean folder and call its entry in a fresh interpreter that
    cannot import ``kernels`` (clean PYTHONPATH, cwd outside the repository, imports of
    kernels/FLA/FlashInfer blocked): under the Triton interpreter on the CPU, compiled
    on a GPU host."""
    sol = json.loads(write_solution(sol, tmp_path / "packed").read_text())
    module = unpack(sol, tmp_path / "build")
    (tmp_path / "runner.py").write_text(_RUNNER)
    torch.save((args, outs), tmp_path / "in.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TRITON_INTERPRET=os.environ["TRITON_INTERPRET"], PYTHONPATH=str(tmp_path / "build"))
    r = subprocess.run([sys.executable, "-P", str(tmp_path / "runner.py"), module,
                        str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(tmp_path / "out.pt")


@pytest.mark.parametrize("B, shape", [(1, CONTEST), (3, GDNShape(2, 4, 32))])
def test_packed_decode_runs_alone(tmp_path, B, shape):
    x = make_decode_inputs(B, shape, seed=B, scale=0.0 if B == 3 else None)
    x["scale"] = 1 / math.sqrt(shape.head_dim) if x["scale"] is None else x["scale"]
    ins, _ = entry_params("decode")
    args = [x[n] for n in ins]
    state0 = x["state"].clone()
    outs = [torch.full_like(x["v"], float("nan")), torch.full_like(x["state"], float("nan"))]
    got = _run_packed(tmp_path, solution("decode"), args, outs)
    res = check_outputs(got, decode_reference(**x))
    assert res.ok, res.reason
    assert torch.equal(x["state"], state0)


@pytest.mark.parametrize("lens, shape, variant", [
    ([6], CONTEST, "fused"),
    ([5, 0, 70], GDNShape(1, 2, 32), "fused"),
    ([100, 28], GDNShape(2, 4, 16), "graph"),
])
def test_packed_prefill_runs_alone(tmp_path, lens, shape, variant):
    x = make_prefill_inputs(lens, shape, seed=len(lens))
    x["scale"] = 1 / math.sqrt(shape.head_dim)
    ins, _ = entry_params("prefill")
    args = [x[n] for n in ins]
    T, N = sum(lens), len(lens)
    outs = [torch.full((T, shape.num_v_heads, shape.head_dim), float("nan"), dtype=torch.bfloat16),
            torch.full((N, shape.num_v_heads, shape.head_dim, shape.head_dim), float("nan"))]
    got = _run_packed(tmp_path, solution("prefill", variant=variant), args, outs)
    res = check_outputs(got, prefill_reference(**x))
    assert res.ok, res.reason


def test_gdn_decode_output_state_is_written_and_checked():
    from kernels.decode import gdn_decode

    x = make_decode_inputs(2, GDNShape(1, 2, 16), seed=4, device=DEVICE)
    out = torch.empty_like(x["v"])
    st = torch.full_like(x["state"], float("nan"))
    o, s = gdn_decode(**x, output=out, output_state=st)
    assert o is out and s is st
    assert check_outputs((o, s), decode_reference(**x)).ok
    with pytest.raises(ValueError, match="output_state must have shape"):
        gdn_decode(**x, output_state=st[:1])
    with pytest.raises(TypeError, match="output_state must have dtype"):
        gdn_decode(**x, output_state=st.double())
    with pytest.raises(ValueError, match="output_state must be None when the state is updated in place"):
        gdn_decode(**x, inplace=True, output_state=st)


# --------------------------------------------------------------------------- flashinfer-bench

@pytest.mark.skipif(not HAS_FIB, reason=NO_FIB)
@pytest.mark.parametrize("op", defs.OPS)
def test_flashinfer_bench_accepts_our_definition_workloads_and_solutions(op):
    from flashinfer_bench.data import Definition, Solution, Trace

    d = Definition.model_validate(defs.definition(op))
    for w in defs.workloads(op):
        t = Trace.model_validate(w["trace"])
        assert t.is_workload_trace()
        assert set(t.workload.axes) == set(d.var_axes)
    sols = [solution(op)] + ([solution(op, variant="graph")] if op == "prefill" else [])
    for s in sols + [baseline_solution(op)]:
        assert Solution.model_validate(s).definition == d.name


@pytest.mark.skipif(not HAS_FIB, reason=NO_FIB)
@pytest.mark.parametrize("op, wl", [
    ("decode", defs.workloads("decode", batch_sizes=(2,))[0]),
    ("prefill", defs.workloads("prefill", prefill_shapes={"x": [5, 3]})[0]),
])
def test_flashinfer_bench_builds_and_runs_ours_against_our_reference(op, wl):
    """Its own builder and reference runner (on the CPU: the interpreter): the check its
    evaluator makes, minus the CUDA timing."""
    from flashinfer_bench.compile import BuilderRegistry
    from flashinfer_bench.data import Definition, Solution

    reg = BuilderRegistry.get_instance()
    d = Definition.model_validate(defs.definition(op))
    ref = reg.build_reference(d)
    ours = reg.build(d, Solution.model_validate(solution(op)))
    x = defs.workload_inputs(op, wl, device=DEVICE)
    args = [x[n] for n in d.inputs]
    outs = [torch.empty(s, dtype=t, device=DEVICE) for s, t in
            zip(d.get_output_shapes(wl["trace"]["workload"]["axes"]), d.torch_output_dtypes)]
    ours(*args, *outs)
    res = check_outputs(outs, ref(*args))
    assert res.ok, res.reason


def test_evaluate_refuses_without_gpu_or_flashinfer_bench():
    from kernels.contest.evaluate import evaluate

    if torch.cuda.is_available() and HAS_FIB:
        pytest.skip("GPU with flashinfer-bench: the refusal does not apply")
    with pytest.raises(RuntimeError, match="CUDA GPU|flashinfer-bench"):
        evaluate(["decode"], root="/nonexistent/never-written")
    assert not Path("/nonexistent/never-written").exists()


def test_evaluate_cli_says_what_the_host_lacks(capsys):
    from kernels.contest.__main__ import main

    if torch.cuda.is_available() and HAS_FIB:
        pytest.skip("GPU with flashinfer-bench: the refusal does not apply")
    assert main(["evaluate", "--ops", "decode", "--root", "/nonexistent/never-written"]) == 1
    assert "contest evaluate: " in capsys.readouterr().err
    assert not Path("/nonexistent/never-written").exists()


def test_evaluate_refuses_without_cupti():
    """Without cupti-python FlashInfer's timing falls back to CUDA events: refused."""
    from kernels.contest.evaluate import _check_cupti

    if importlib.util.find_spec("cupti") is not None:
        pytest.skip("cupti-python is importable here")
    with pytest.raises(RuntimeError, match="CUPTI is unusable here .*No module named 'cupti'"):
        _check_cupti()


# --------------------------------------------------------------------------- the contest's score

def _row(op, wl, sol, status="PASSED", us=None):
    return dict(op=op, workload=wl, solution=sol, status=status, fib_us=us)


def test_contest_score_is_the_mean_speedup_over_the_baseline():
    from kernels.contest.evaluate import contest_scores

    base = "gdn-decode-flashinfer"
    rows = [_row("decode", "1", base, us=10.0), _row("decode", "4", base, us=20.0),
            _row("decode", "1", "a", us=5.0), _row("decode", "4", "a", us=40.0),
            _row("decode", "1", "b", us=10.0), _row("decode", "4", "b", "INCORRECT_NUMERICAL"),
            _row("decode", "1", "c", us=2.0), _row("decode", "4", "c", "NO_TRACE")]
    got = {s["solution"]: s for s in contest_scores(rows)}
    assert set(got) == {"a", "b", "c"}                      # the baseline is not scored
    assert got["a"]["score"] == pytest.approx((10 / 5 + 20 / 40) / 2)
    assert got["a"]["win_rate"] == 0.5 and got["a"]["scored"] == 2 and got["a"]["failed"] == 0
    # any workload not passed zeroes the score
    assert got["b"]["score"] == 0.0 and got["b"]["failed"] == 1
    assert got["b"]["note"] == "not passed: 4"
    # a workload with no trace (its run raised in flashinfer-bench) is left out, and said
    assert got["c"]["score"] == 5.0 and got["c"]["scored"] == 1 and got["c"]["failed"] == 0
    assert got["c"]["note"] == "no trace: 4"


def test_contest_score_skips_workloads_the_baseline_failed():
    from kernels.contest.evaluate import contest_scores

    base = "gdn-prefill-flashinfer"
    rows = [_row("prefill", "x", base, us=30.0), _row("prefill", "y", base, "RUNTIME_ERROR"),
            _row("prefill", "x", "ours", us=10.0), _row("prefill", "y", "ours", us=1.0),
            _row("decode", "1", "gdn-decode-flashinfer", "RUNTIME_ERROR"),
            _row("decode", "1", "ours-d", us=1.0)]
    got = {(s["op"], s["solution"]): s for s in contest_scores(rows)}
    assert got[("prefill", "ours")]["score"] == pytest.approx(3.0)
    assert got[("prefill", "ours")]["scored"] == 1
    d = got[("decode", "ours-d")]
    assert math.isnan(d["score"]) and d["note"] == "no workload the baseline passed"


@pytest.mark.skipif(not HAS_FIB, reason=NO_FIB)
def test_contest_score_matches_flashinfer_bench_get_solution_score():
    """The pinned flashinfer-bench's own scoring (what the contest's
    compute_track_scores.py calls) on the same statuses and latencies."""
    from flashinfer_bench.data import (Correctness, Definition, Environment, Evaluation,
                                       EvaluationStatus, Performance, Solution, Trace, TraceSet)

    from kernels.contest.evaluate import contest_scores

    d = Definition.model_validate(defs.definition("decode"))
    wls = defs.workloads("decode", batch_sizes=(1, 4, 8))
    base = "gdn-decode-flashinfer"
    cases = {base: ("fi", [10.0, 20.0, None]),            # the baseline failed B=8
             "a": ("A", [5.0, 40.0, 1.0]), "b": ("B", [10.0, None, 3.0]),
             "c": ("C", [2.0, "skip", None])}                # B=4 raised: no trace
    sols, traces, rows = [], [], []
    for name, (author, lat) in cases.items():
        sols.append(Solution.model_validate(dict(solution("decode"), name=name, author=author)))
        for wl, us in zip(wls, lat):
            if us == "skip":
                rows.append(_row("decode", wl["key"], name, "NO_TRACE"))
                continue
            status = EvaluationStatus.PASSED if us else EvaluationStatus.INCORRECT_NUMERICAL
            ev = Evaluation(status=status, environment=Environment(hardware="gpu"),
                            timestamp="t", correctness=Correctness(),
                            performance=Performance(latency_ms=us / 1e3) if us else None)
            tr = Trace.model_validate(dict(wl["trace"], solution=name, evaluation=ev))
            traces.append(tr)
            rows.append(_row("decode", wl["key"], name, status.value, us))
    ts = TraceSet(definitions={d.name: d}, solutions={d.name: sols}, traces={d.name: traces})
    ours = {s["solution"]: s["score"] for s in contest_scores(rows)}
    for name in ("a", "b", "c"):
        assert ours[name] == pytest.approx(ts.get_solution_score(name, "fi").avg_speedup)
    assert ours["a"] == pytest.approx((10 / 5 + 20 / 40) / 2) and ours["b"] == ours["c"] == 0.0


def test_comparison_table_speedup_and_flag():
    pytest.importorskip("pandas")
    from kernels.contest.evaluate import comparison_table

    rows = [dict(op="decode", workload="1", solution="gdn-decode-flashinfer", status="PASSED",
                 fib_us=6.0, cupti_cold_us=6.1, max_abs_err=0.0, max_rel_err=0.0),
            dict(op="decode", workload="1", solution="gdn-decode-ours", status="PASSED",
                 fib_us=3.0, cupti_cold_us=2.0, max_abs_err=0.0, max_rel_err=0.0),
            dict(op="decode", workload="1", solution="x", status="INCORRECT_NUMERICAL",
                 fib_us=None, cupti_cold_us=None, max_abs_err=0.5, max_rel_err=1.0)]
    df = comparison_table(rows, {("gdn-decode-ours", "1"): 2.5})
    assert df.speedup.tolist()[:2] == [1.0, 2.0] and math.isnan(df.speedup[2])
    assert df.flag.tolist() == [False, True, False]   # a failed row is reported, not flagged
    assert df.notebook_cupti_cold_us.tolist()[1] == 2.5


def test_contest_params_are_the_evaluation_commands():
    from kernels.contest.evaluate import contest_params

    assert contest_params("prefill") == dict(warmup_runs=1, iterations=5, num_trials=3)
    assert contest_params("decode") == dict(warmup_runs=10, iterations=50, num_trials=3)


def test_wheel_script_pins_the_commit_evaluate_requires():
    from kernels.contest.evaluate import FIB_COMMIT

    text = (REPO / "scripts" / "contest_wheel.sh").read_text()
    assert f"\nFIB_COMMIT={FIB_COMMIT}\n" in text


# --------------------------------------------------------------------------- arguments

def test_check_arguments(tmp_path):
    """The contest's own rules on top of kernels.contest.formats.read_solution (whose
    errors tests/contest/test_solutions.py checks): its two definitions only, unique names."""
    from kernels.contest.evaluate import check_arguments, solutions_for

    with pytest.raises(ValueError, match="ops must list decode and/or prefill"):
        check_arguments(["mixed"])
    with pytest.raises(ValueError, match="ops must list"):
        check_arguments([])
    dup = write_solution(solution("prefill"), tmp_path)          # gdn-prefill-ours-fused
    with pytest.raises(ValueError, match="'gdn-prefill-ours-fused' is used twice"):
        check_arguments(["prefill"], [dup])
    shape = tmp_path / "shape" / "s.json"                        # GDN, not the contest's shape
    shape.parent.mkdir()
    shape.write_text(json.dumps(dict(solution("decode"), name="x",
                                     definition="gdn_decode_qk16_v32_d128_k_last")))
    with pytest.raises(ValueError, match="field 'definition': 'gdn_decode_qk16_v32_d128_k_last' "
                                         "is not one of the contest's") as e:
        check_arguments(["decode"], [shape])
    assert str(shape) in str(e.value)
    mine = dict(solution("decode"), name="mine")
    other = write_solution(mine, tmp_path)
    assert check_arguments(["decode"], [other]) == [mine]     # flashinfer-bench's dict, as read
    # read (and so checked) whatever the ops; evaluated with its own op only
    assert [s["name"] for s in solutions_for("prefill", check_arguments(["prefill"], [other]))
            ] == ["gdn-prefill-ours-fused", "gdn-prefill-ours-graph", "gdn-prefill-flashinfer"]


@pytest.mark.parametrize("args, match", [
    (["--ops", "mixed"], "ops must list"),
    (["--solutions", "nope/missing.json"], "no such solution JSON or starter-kit folder"),
    (["--rep", "0"], "--rep must be >= 1"),
])
def test_evaluate_cli_refuses_bad_arguments_before_any_run(capsys, args, match):
    from kernels.contest.__main__ import main

    with pytest.raises(SystemExit) as ex:
        main(["evaluate", *args])
    assert ex.value.code == 2 and match in capsys.readouterr().err


def test_trace_folders_take_space_free_names(tmp_path):
    """flashinfer-bench's traces/<author>/ for an author with spaces: renamed, and merged
    (appended) where the space-free name is already taken."""
    from kernels.contest.evaluate import space_free_trace_folders

    traces = tmp_path / "traces"
    for author, line in [("Jane  Doe", "a"), ("Jane-Doe", "b"), ("gdn-kernel-suite tests", "c"),
                         ("gdn-kernel-suite", "d")]:
        f = traces / author / "gdn" / "defn.jsonl"
        f.parent.mkdir(parents=True)
        f.write_text(line + "\n")
    space_free_trace_folders(traces)
    got = {str(p.relative_to(traces)): p.read_text() for p in traces.rglob("*.jsonl")}
    assert got == {"Jane-Doe/gdn/defn.jsonl": "b\na\n",
                   "gdn-kernel-suite-tests/gdn/defn.jsonl": "c\n",
                   "gdn-kernel-suite/gdn/defn.jsonl": "d\n"}
    assert not any(" " in p.name for p in traces.rglob("*"))
    space_free_trace_folders(tmp_path / "absent")   # no traces folder: nothing to do


def test_notebook_cupti_cold_reads_committed_results():
    pytest.importorskip("pandas")
    from kernels.contest.evaluate import notebook_cupti_cold

    found = [p for p in (REPO / "results").iterdir()
             if (p / "01_decode_crossover" / "decode_times.csv").is_file()
             and (p / "02_prefill_launch_overhead" / "prefill_times.csv").is_file()]
    if not found:
        pytest.skip("no committed GPU results")
    import pandas as pd

    for folder in found:   # every committed run: ours always, FlashInfer where it ran
        has_fi = (pd.read_csv(folder / "01_decode_crossover" / "decode_times.csv").label
                  == "flashinfer").any()
        nb = notebook_cupti_cold(folder)
        keys = {(s, w["key"]) for op in defs.OPS for w in defs.workloads(op)
                for s in ([f"gdn-{op}-ours"] if op == "decode"
                          else [f"gdn-prefill-ours-{v}" for v in PREFILL_VARIANTS])
                + ([f"gdn-{op}-flashinfer"] if has_fi else [])}
        assert set(nb) == keys and all(v > 0 for v in nb.values()), folder.name


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FIB, reason=NO_FIB)
def test_evaluate_decode_on_gpu(tmp_path):
    """The contest's flashinfer-bench end to end on decode: ours, the baseline and our
    packed JSON under another name, read from a path (CUPTI spans, scores)."""
    from kernels.device import gpu_slug
    from kernels.contest.evaluate import evaluate

    mine = write_solution(dict(solution("decode"), name="ours-from-path", author="path"),
                          tmp_path / "sols")
    [root] = evaluate(["decode"], solutions=[mine], root=str(tmp_path), rep=5)
    import pandas as pd

    assert root == tmp_path / gpu_slug() / "contest_decode"
    df = pd.read_csv(root / "comparison.csv")
    assert sorted(df.solution.unique()) == ["gdn-decode-flashinfer", "gdn-decode-ours",
                                            "ours-from-path"]
    assert (df.status == "PASSED").all(), df[["workload", "solution", "status"]]
    assert len(df) == 3 * len(DECODE_BATCH_SIZES) and (df.fib_us > 0).all()
    ours = df[df.solution == "gdn-decode-ours"]
    assert (ours.cupti_cold_us > 0).all()
    assert df[df.solution == "ours-from-path"].cupti_cold_us.isna().all()   # not our author
    scores = pd.read_csv(root / "scores.csv").set_index("solution")
    assert set(scores.index) == {"gdn-decode-ours", "ours-from-path"}
    assert (scores.score > 0).all() and (scores.failed == 0).all()
    traces = list((root / "traces").rglob("*.jsonl"))
    assert sum(len(t.read_text().strip().splitlines()) for t in traces) == len(df)
    assert (root / "comparison.md").read_text().startswith("# Contest evaluation")
