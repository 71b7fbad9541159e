"""The compute-sanitizer check (:mod:`kernels.bench.sanitize`) on the CPU: the parser on
hand-written logs in the tool's format (tests/fixtures/sanitize/), the cases' paths under
the sm_90 rules, the command lines, and that the control kernels compile for sm_90a with
the hand-over the module doc describes (no GPU; the runs themselves are the GPU host's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from kernels.bench import sanitize as S

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "sanitize"


def _log(name):
    return (FIX / name).read_text()


def test_parse_racecheck_analysis_and_hazard_records():
    p = S.parse_log(_log("racecheck_hazards.log"))
    assert p["race"] == (2, 1, 1) and p["done"]
    st = p["kernels"]["ctrl_kernel"]
    # the analysis records count (4096 + 4 hazards, 2 reports); the per-byte records of the
    # same kernel are not added on top
    assert (st.reports, st.hazards) == (2, 4100)
    assert st.kinds == {"RAW": 4096, "WAW": 4}
    assert any("sanitize.py:131" in s and "sanitize.py:146" in s for s in st.samples)


def test_parse_racecheck_hazard_records_only():
    p = S.parse_log(_log("racecheck_bytes_only.log"))
    st = p["kernels"]["state_walk_gluon_kernel"]
    assert (st.reports, st.hazards) == (3, 3)
    assert st.kinds == {"WAR": 2, "WAW": 1}
    assert st.samples[0].startswith("WAR Read state_walk_gluon.py:275 -> Write")


@pytest.mark.parametrize("name", ["memcheck_clean.log", "synccheck_clean.log"])
def test_parse_clean(name):
    p = S.parse_log(_log(name))
    assert p["errors"] == 0 and p["race"] is None and p["kernels"] == {} and p["done"]


def test_parse_memcheck_and_synccheck_errors():
    p = S.parse_log(_log("memcheck_error.log"))
    assert p["errors"] == 2 and not p["done"]
    assert p["kernels"]["state_walk_t_kernel"].errors == 1
    assert p["kernels"]["intra_chunk_kernel"].errors == 1
    assert "state_walk_t.py:212" in p["kernels"]["state_walk_t_kernel"].samples[0]
    q = S.parse_log(_log("synccheck_error.log"))
    assert q["errors"] == 1 and q["kernels"]["ctrl_kernel"].errors == 1


def test_summarize_rows_and_status():
    rows = S.summarize("racecheck", "ctrl_no_wait", _log("racecheck_hazards.log"), 0, 12.3,
                       "x.log")
    assert [r["kernel"] for r in rows] == ["*", "ctrl_kernel"]
    assert rows[0]["status"] == "ok" and rows[0]["reports"] == 2 and rows[0]["hazards"] == 4100
    assert rows[1]["hazard_kinds"] == "RAW:4096;WAW:4"
    assert set(rows[0]) == set(S.CSV_FIELDS)
    assert S.summarize("memcheck", "decode", "", "timeout", 5, "y")[0]["status"] == "timeout"
    assert S.summarize("memcheck", "decode", "boom\n", 1, 5, "y")[0]["status"] == "no_summary"
    failed = S.summarize("memcheck", "x", _log("memcheck_error.log"), 1, 5, "y")[0]
    assert failed["status"] == "case_failed" and failed["errors"] == 2


def test_cases():
    kinds = {c.kind for c in S.CASES.values()}
    assert kinds == {"decode", "prefill", "control"}
    assert {c.mode for c in S.CASES.values() if c.kind == "control"} == set(S.CONTROL_MODES)
    paths = {(c.path, c.gluon) for c in S.CASES.values() if c.kind == "prefill"}
    assert {("recurrent", None), ("single", None), ("walk", None), ("cp", None),
            ("cp_long", False), ("cp_long", True), ("cp_long_split", True)} <= paths
    issue = {c.lens for c in S.CASES.values() if c.name.startswith("gluon_issue")}
    assert issue == {(40000,), (20000, 23333)}


def test_cases_select_their_paths_on_sm90():
    """Each prefill case's lengths take its path (and phase C) under the H100's rules (132
    SMs, sm_90, compiled kernels): what ``run`` checks again on the GPU."""
    from kernels import arch_check, interpret
    from kernels.gpu_limits import ARCHS
    from kernels.prefill import plan as plan_mod

    with arch_check._emulating(ARCHS[90], lambda *a: None), \
            mock.patch.object(interpret, "INTERPRET", False), \
            mock.patch.object(plan_mod, "HAVE_GLUON", True):
        for c in S.CASES.values():
            if c.kind == "prefill":
                S._check_plan(c, S.case_plan(c))
        plan_mod.clear_plan_cache()


def test_build_command():
    cmd = S.build_command("racecheck", "gluon_full", "/cs", python="/py")
    assert cmd == ["/cs", "--tool", "racecheck", "--print-limit", "10000",
                   "--racecheck-report", "all", "/py", "-m", "kernels.bench.sanitize", "run",
                   "gluon_full"]
    cmd = S.build_command("memcheck", "decode", "/cs", python="/py", extra=["--padding", "32"])
    assert cmd[:4] == ["/cs", "--tool", "memcheck", "--print-limit"]
    assert "--racecheck-report" not in cmd and cmd[5:7] == ["--padding", "32"]
    with pytest.raises(ValueError):
        S.build_command("nope", "decode")
    with pytest.raises(ValueError):
        S.build_command("memcheck", "nope")


def test_check_driver_with_a_fake_sanitizer(tmp_path):
    """``check`` end to end with a stand-in for compute-sanitizer that prints a fixture."""
    fake = tmp_path / "fake-sanitizer"
    fake.write_text("#!/bin/sh\ncat " + str(FIX / "racecheck_hazards.log") + "\n")
    fake.chmod(0o755)
    lines = []
    rows = S.check(tmp_path / "out", ["racecheck"], ["ctrl_no_wait"], timeout=60,
                   sanitizer=str(fake), progress=lines.append)
    assert rows[0]["status"] == "ok" and rows[1]["hazards"] == 4100
    assert (tmp_path / "out" / "racecheck__ctrl_no_wait.log").exists()
    assert (tmp_path / "out" / "sanitize.csv").read_text().startswith(",".join(S.CSV_FIELDS))
    assert lines[0].startswith("[1/1] racecheck ctrl_no_wait")


def test_check_driver_runs_jobs_at_once_in_job_order(tmp_path):
    """With ``jobs_at_once`` the runs overlap, and the CSV keeps the (tool, case) order."""
    fake = tmp_path / "fake-sanitizer"
    fake.write_text("#!/bin/sh\ncat " + str(FIX / "memcheck_clean.log") + "\n")
    fake.chmod(0o755)
    cases = ["ctrl_no_wait", "ctrl_tutorial", "decode"]
    rows = S.check(tmp_path / "out", ["memcheck", "synccheck"], cases, timeout=60,
                   sanitizer=str(fake), progress=lambda s: None, jobs_at_once=4)
    runs = [(r["tool"], r["case"]) for r in rows if r["kernel"] == "*"]
    assert runs == [(t, c) for t in ("memcheck", "synccheck") for c in cases]
    assert all(r["status"] == "ok" for r in rows)
    assert len(list((tmp_path / "out").glob("*.log"))) == 6


_COMPILE = r"""
import json, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from kernels.bench import sanitize as S
out = {}
for mode, m in S.CONTROL_MODES.items():
    src = GluonASTSource(S.ctrl_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "MODE": "constexpr",
                                         "N": "constexpr"}, {(2,): m, (3,): S.CTRL_N},
                         {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = ck.asm["ptx"]
    out[mode] = dict(warps=ck.metadata.num_warps, arrive=S.arrive_has_partition_barrier(ptx),
                     waits=ptx.count("mbarrier.try_wait"), stores=ptx.count("st.shared"))
print(json.dumps(out))
"""


def test_control_kernels_compile_for_sm90():
    """Every control kernel compiles for sm_90a (8 warps: the default partition and the
    worker); every ``mbarrier.arrive`` follows a partition barrier in the PTX (Triton's
    lowering, the finding behind ``ctrl_thread_barrier``); ``ctrl_no_wait`` has no wait;
    ``ctrl_args_only`` shares only the partitions' arguments (no arrive)."""
    pytest.importorskip("triton.backends.nvidia", reason="triton without its NVIDIA backend")
    if not S.HAVE_GLUON:
        pytest.skip("this Triton has no triton.experimental.gluon")
    env = dict(os.environ, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    res = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(got) == set(S.CONTROL_MODES)
    assert all(g["warps"] == 8 for g in got.values())
    for mode in ("tutorial", "thread_barrier", "no_wait", "prologue_reduce"):
        assert got[mode]["arrive"] == [True], (mode, got[mode])
    assert got["tutorial"]["waits"] >= 1 and got["no_wait"]["waits"] == 0
    assert got["args_only"]["arrive"] == []
