"""Contest-shape solutions through ``make run`` on the CPU: notebooks 01 and 02 in the smoke
profile with the d128 python fixtures (a decode JSON, a prefill starter-kit folder), the
Triton prefill fixture written for the GPU only (NVTX ranges, synchronize, a CUDA device
default: its worker makes them harmless off CUDA) and a solution that aborts. (One whose entry
cannot load stops the run before any notebook: tests/contest/test_solutions.py.)

One module-scoped run of ``python -m kernels.runner --profile smoke --notebooks 01,02
--solutions ...``: the runner switches both notebooks to the definitions' shape (HQ=4,
HV=8, D=128) with the profile's ``solution_shape`` lengths, the good solutions pass the
gate and the decode one is timed, the run's log says once which GPU-only calls the Triton
fixture's worker made harmless, the summary names the aborting one with its reason and its
worker's stderr, and the exit status is 1 because a requested solution never passed (0 with
``--solutions-may-fail``). Marked ``slow``: 160 s on 2 shared CPU cores (about 100 s of
CPU time, most of it our kernels at D=128 on the interpreter).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("papermill", reason="the notebook extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "solutions"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def solution_run(tmp_path_factory):
    from tests.results_guard import smoke_results_state

    tmp = tmp_path_factory.mktemp("solutions-run")
    users = smoke_results_state()
    sols = [FIX / "py_decode.json", FIX / "py_prefill", FIX / "nvtx_prefill", FIX / "abort_decode"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.runner", "--profile", "smoke", "--notebooks", "01,02",
         "--output-root", str(tmp / "out"), "--no-progress",
         "--solutions", ",".join(str(s) for s in sols)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    assert smoke_results_state() == users, "the test run wrote into results/smoke/"
    print(f"runner with 4 solutions, notebooks 01 and 02: {seconds:.0f} s")
    slug = [p for p in (tmp / "out").iterdir() if p.is_dir()]
    assert len(slug) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, slug[0], sols


def test_contest_shape_solutions_pass_in_the_smoke_profile(solution_run):
    proc, out, _ = solution_run
    log = proc.stdout + proc.stderr
    for stem in ("01_decode_crossover", "02_prefill_launch_overhead"):
        assert f"{stem}: at the shape of" in proc.stdout and "(HQ=4 HV=8 D=128)" in proc.stdout
        assert (out / f"{stem}.ipynb").is_file(), log[-4000:]
        prov = json.loads((out / stem / "provenance.json").read_text())
        params = prov["params"]
        assert (params["num_q_heads"], params["num_v_heads"], params["head_dim"]) == (4, 8, 128)
    gate = pd.read_csv(out / "01_decode_crossover" / "gate.csv")
    assert set(gate[gate.label == "fixture-py-decode-json"].status) == {"pass"}
    assert set(gate[gate.label.str.startswith("ours")].status) == {"pass"}
    times = pd.read_csv(out / "01_decode_crossover" / "decode_times.csv")
    mine = times[times.label == "fixture-py-decode-json"]
    assert set(mine.impl) == {"solution"} and (mine.median_us > 0).all() and len(mine)
    gate2 = pd.read_csv(out / "02_prefill_launch_overhead" / "gate.csv")
    assert set(gate2[gate2.label == "fixture-py-prefill"].status) == {"pass"}
    assert set(gate2[gate2.label == "fixture-nvtx-prefill"].status) == {"pass"}, log[-4000:]
    if "off CUDA" in proc.stdout:   # said once, before the first notebook
        assert proc.stdout.count("off CUDA:") == 1
        assert proc.stdout.index("off CUDA:") < proc.stdout.index("== 01_decode_crossover")
    assert set(gate2[gate2.impl == "ours"].status) == {"pass"}


def test_summary_names_what_failed_and_the_exit_status_says_so(solution_run):
    from kernels import runner
    from kernels.contest.formats import read_solution

    proc, out, sols = solution_run
    summary = proc.stdout[proc.stdout.index("== summary"):]
    assert proc.returncode == 1, summary
    assert "2/2 notebooks ok" in summary
    abort = next(ln for ln in summary.splitlines() if ln.strip().startswith("fixture-abort:"))
    assert "error everywhere" in abort and "killed by SIGABRT" in abort
    assert "its stderr: Fatal Python error: Aborted" in abort   # the worker's last lines
    assert "solution fixture-py-decode-json: passed in 01_decode_crossover" in summary
    assert "solution fixture-py-prefill: passed in 02_prefill_launch_overhead" in summary
    assert "solution fixture-abort: never passed in 01_decode_crossover" in summary
    assert "solution fixture-nvtx-prefill: passed in 02_prefill_launch_overhead" in summary
    assert "1 of 4 requested solutions never passed the gate: fixture-abort" in summary
    # the same outcomes with --solutions-may-fail: exit status 0, the lines still there
    results = [runner.RunResult(s, True, 0.0) for s in ("01_decode_crossover",
                                                        "02_prefill_launch_overhead")]
    requested = [(str(p.resolve()), read_solution(p)) for p in sols]
    assert runner.summarize(results, 2, out, requested, solutions_may_fail=True) == 0
    assert runner.summarize(results, 2, out, requested) == 1
