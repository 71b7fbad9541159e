"""``kernels.bench.triton_versions``: the cases it gates, the CSV it appends, the
comparison it prints; the run itself on a GPU (marker ``gpu``)."""
from __future__ import annotations

import csv

import pytest

from kernels.bench import triton_versions as tv


def test_cases_cover_both_kernels_contest_shapes_hard_inputs_and_a_long_sequence(monkeypatch):
    from kernels.spec import DECODE_BATCH_SIZES, PREFILL_SHAPES

    monkeypatch.setattr(tv, "LONG", 256)   # the long case's inputs, small on the CPU
    got = [(k, s, i, timed) for k, s, i, _, _, timed in tv.cases("cpu")]
    assert [(s, timed) for k, s, i, timed in got if k == "decode"] == \
        [(f"B={b}", True) for b in DECODE_BATCH_SIZES]
    contest = [s for k, s, i, t in got if k == "prefill" and i == "contest"]
    assert contest == list(PREFILL_SHAPES) + ["T256"]
    stress = [(k, s, i, t) for k, s, i, t in got if i.startswith("stress")]
    assert {k for k, *_ in stress} == {"prefill", "prefill-accurate"}
    assert len(stress) == 2 * len(tv.STRESS) and not any(t for *_, t in stress)


def test_long_case_takes_the_long_context_parallel_path():
    from kernels.prefill.context_parallel import cp_long

    assert cp_long(tv.LONG, 1)


def test_compare_pivots_versions(tmp_path):
    p = tmp_path / "t.csv"
    rows = [dict(triton="3.6.0", kernel="decode", shape="B=1", inputs="contest", graph_us=10.0),
            dict(triton="3.7.1", kernel="decode", shape="B=1", inputs="contest", graph_us=11.0),
            dict(triton="3.7.1", kernel="prefill", shape="8x64", inputs="stress", graph_us="")]
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=tv.COLUMNS)
        w.writeheader()
        w.writerows(rows)
    text = tv.compare(p)
    assert "3.7.1 / 3.6.0" in text and "1.1" in text and "8x64" not in text


def test_main_needs_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert tv.main(["--out", "/nonexistent/x.csv"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_decode_rows_pass_and_are_timed_on_the_gpu(tmp_path):
    out = tmp_path / "tv.csv"
    rows = tv.run(out, rep=5, warmup=2, only="decode", log=lambda s: None)
    assert rows and all(r["passed"] and r["graph_us"] > 0 for r in rows)
    with open(out) as f:
        assert next(csv.reader(f)) == tv.COLUMNS


def test_run_appends_gated_rows_and_reports_failures_untimed(tmp_path, monkeypatch):
    import torch

    a = torch.ones(3)

    def fake_cases(device):
        yield ("decode", "B=1", "contest", lambda: (a, a), lambda: (a, a), False)
        yield ("prefill", "T6", "contest", lambda: (a + 1, a), lambda: (a, a), True)
        yield ("prefill", "T7", "contest", lambda: 1 / 0, lambda: (a, a), True)

    monkeypatch.setattr(tv, "cases", fake_cases)
    out = tmp_path / "tv.csv"
    for _ in range(2):   # a second run appends under the same header
        rows = tv.run(out, device="cpu", log=lambda s: None)
    assert [r["passed"] for r in rows] == [True, False, False]
    assert rows[1]["max_abs_err"] == 1.0 and rows[1]["graph_us"] is None   # failed: not timed
    assert rows[2]["reason"].startswith("ZeroDivisionError")
    with open(out) as f:
        got = list(csv.DictReader(f))
    assert len(got) == 6 and list(got[0]) == tv.COLUMNS


def test_ptxas_used_names_the_binary_triton_picks_for_the_arch():
    import triton

    got90, got100 = tv.ptxas_used(90), tv.ptxas_used(100)
    if got90.startswith("unknown"):
        pytest.skip(f"triton {triton.__version__} has no get_ptxas helper: {got90}")
    assert got100.startswith("ptxas-blackwell ")
    major_minor = tuple(int(x) for x in triton.__version__.split(".")[:2])
    # 3.9 compiles sm_90 with ptxas-blackwell (CUDA 13), 3.6 and 3.7 with ptxas
    if major_minor >= (3, 9):
        assert got90.startswith("ptxas-blackwell ")
    elif major_minor <= (3, 7):
        assert got90.startswith("ptxas ")
