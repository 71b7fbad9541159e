"""kernels.bench.faults on the CPU: the case list, the verdicts, the CSV, and a few cases
run through the real subprocess harness under the interpreter (small shape)."""
from __future__ import annotations

import csv

import pytest

from kernels.bench import faults


def test_case_list_covers_every_fault_and_target():
    cs = faults.cases()
    names = [c.name for c in cs]
    assert len(names) == len(set(names))
    for t in faults.TARGETS:
        got = {c.name.rsplit("-", 1)[0] for c in cs if c.target == t}
        assert {"valid", "q_float32", "k_short", "q_other_device", "k_strided", "empty",
                "huge_a", "huge_b"} <= got
        assert {f"nan_{n}" for n in faults.INPUTS} | {f"inf_{n}" for n in faults.INPUTS} <= got
    for t in faults.PREFILL_TARGETS:
        got = {c.name.rsplit("-", 1)[0] for c in cs if c.target == t}
        assert {"cu_negative", "cu_decreasing", "cu_too_short", "cu_too_long", "cu_int16",
                "cu_other_device", "cu_end_long", "cu_end_short"} <= got
    assert "recurrent" in faults.PREFILL_TARGETS
    assert [c.target for c in cs if c.name.startswith("slot_repeated")] == ["decode"]
    assert [c.target for c in cs if c.name.startswith("slot_past_pool")] == ["decode"]


@pytest.mark.parametrize("outcome,expect,ok", [
    ("error: ValueError: x", "error", True),
    ("nan_output", "error", False),
    ("nan_output", "error_or_nan", True),
    ("ok", "error_or_nan", False),                      # silent plausible output
    ("nonfinite_output: output 1.0%, state 2.0%", "flagged_or_match", True),
    ("ok", "flagged_or_match", True),
    ("wrong_output: far", "flagged_or_match", False),
    ("precision: default new_state: 2/9 elements outside; ACCURATE_CONFIG ok", "flagged_or_match", True),
    ("precision: default x; ACCURATE_CONFIG ok", "match", False),
    ("crash: exit status -11: ", "error", False),
    ("empty_output", "error_or_match", True),
    ("nonfinite_output: output 100.0%, state 0.0%", "error_or_flagged", True),
    ("error: ValueError: state_indices must not repeat", "error_or_flagged", True),
    ("ok", "error_or_flagged", False),
    ("ok", "match", True),
])
def test_judge(outcome, expect, ok):
    row = dict(outcome=outcome, expect=expect, inputs_untouched=True, context_ok=True)
    assert faults.judge(row) is ok
    assert not faults.judge(dict(row, context_ok=False))
    assert not faults.judge(dict(row, inputs_untouched=False))


def test_harness_runs_cases_in_subprocesses_and_writes_csv(tmp_path):
    names = ["valid-fused", "cu_decreasing-no_sync", "nan_k-decode", "q_float32-graph",
             "slot_repeated-decode"]
    sel = [c for c in faults.cases() if c.name in names]
    rows = faults.run_all(sel, shape_name="small", device="cpu", jobs=2, progress=None)
    by = {r["case"]: r for r in rows}
    assert by["valid-fused"]["outcome"] == "ok"
    assert by["cu_decreasing-no_sync"]["outcome"].startswith(
        "error: ValueError: cu_seqlens must be non-decreasing")     # checked on the CPU
    assert by["nan_k-decode"]["outcome"].startswith("nonfinite_output")
    assert by["q_float32-graph"]["outcome"].startswith("error: TypeError: q")
    assert by["slot_repeated-decode"]["outcome"].startswith(
        "error: ValueError: state_indices must not repeat")     # checked on the CPU
    assert all(r["passed"] and r["context_ok"] and r["inputs_untouched"] for r in rows)
    path = faults.write_csv(rows, tmp_path / "cpu" / "faults.csv")
    with open(path) as f:
        back = list(csv.DictReader(f))
    assert [r["case"] for r in back] == [c.name for c in sel]
    assert set(back[0]) == set(faults.COLUMNS)
    assert not list(path.parent.glob(".tmp-*"))


def test_crash_is_observed_as_one(tmp_path, monkeypatch):
    """A case whose subprocess dies is a crash row, not an exception of the harness."""
    monkeypatch.setattr(faults.sys, "executable", "/bin/false")
    row = faults._subprocess_row(faults.cases()[0], "small", "cpu", 60)
    assert row["outcome"].startswith("crash: exit status 1") and not row["passed"]
