"""Timeline: parsing torch.profiler Chrome traces, summaries, round trip, Gantt plot.

Runs on every ``tests/fixtures/*trace*.json``: the synthetic one written by
``tests/fixtures/make_synthetic_fixtures.py`` and the real recordings of
``python -m kernels.bench.record_fixtures tests/fixtures`` (GPU host). Each
carries a ``gdnbench_fixture`` dict of expected summary values.
"""
import json
from pathlib import Path

import pytest

from kernels.bench.timeline import Timeline, plot_gantt, record_timeline

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRACES = sorted(FIXTURES.glob("*trace*.json"))
SYNTHETIC = FIXTURES / "synthetic_trace_prefill.json"


def _expect(path):
    return json.loads(path.read_text()).get("gdnbench_fixture", {})


@pytest.fixture(params=TRACES, ids=[p.stem for p in TRACES])
def trace(request):
    return request.param


def test_fixtures_present():
    assert SYNTHETIC in TRACES


def test_summary_invariants(trace):
    tl = Timeline.from_chrome_trace(trace)
    s = tl.summary()
    assert set(s) >= {"launches", "busy_us", "span_us", "idle_frac", "largest_gaps_us",
                      "host_syncs"}
    assert tl.gpu["start_us"].min() == 0.0
    assert set(tl.gpu["kind"]) <= {"kernel", "memcpy", "memset"}
    assert (tl.gpu["end_us"] >= tl.gpu["start_us"]).all()
    assert 0 < s["busy_us"] <= s["span_us"] + 1e-9
    assert 0.0 <= s["idle_frac"] < 1.0
    assert s["largest_gaps_us"] == sorted(s["largest_gaps_us"], reverse=True)
    assert s["span_us"] == pytest.approx(s["busy_us"] + sum(tl.gaps()["gap_us"]))


def test_summary_matches_recorded_expectation(trace):
    s = Timeline.from_chrome_trace(trace).summary()
    for key, want in _expect(trace).items():
        if key not in s:
            continue
        if isinstance(want, list):
            assert s[key] == pytest.approx(want), key
        elif isinstance(want, float):
            assert s[key] == pytest.approx(want), key
        else:
            assert s[key] == want, key


def test_chrome_round_trip(trace, tmp_path):
    tl = Timeline.from_chrome_trace(trace)
    back = Timeline.from_chrome_trace(tl.export_chrome_trace(tmp_path / "t.json"))
    a, b = tl.summary(), back.summary()
    assert b.pop("largest_gaps_us") == pytest.approx(a.pop("largest_gaps_us"), abs=1e-3)
    assert b == pytest.approx(a, rel=1e-4, abs=1e-3)   # the export keeps ns resolution
    assert list(back.gpu["name"]) == list(tl.gpu["name"])
    assert len(back.cpu) == len(tl.cpu)


# --------------------------------------------------------------------------- synthetic details

def test_synthetic_keeps_only_the_annotated_call():
    tl = Timeline.from_chrome_trace(SYNTHETIC)
    names = list(tl.gpu["name"])
    assert "warmup_kernel" not in names and "after_kernel" not in names
    assert "unlinked_kernel" in names            # no launch recorded, inside the window
    assert names[0] == _expect(SYNTHETIC)["first_kernel"]
    assert tl.cpu["start_us"].min() < 0          # the first launch precedes the first kernel


@pytest.mark.parametrize("n, gaps", [
    pytest.param(1, [86.0], id="top1"),
    pytest.param(3, [86.0, 20.0, 15.0], id="top3"),
])
def test_largest_gaps_name_their_neighbours(n, gaps):
    df = Timeline.from_chrome_trace(SYNTHETIC).largest_gaps(n)
    assert list(df["gap_us"]) == pytest.approx(gaps)
    assert df.loc[0, "before"] == "Memcpy DtoH (Device -> Pinned)"
    assert df.loc[0, "after"] == "chunk_fwd_kernel_o"


@pytest.mark.parametrize("annotation, n_gpu", [
    pytest.param(None, 8, id="default-call-range"),
    pytest.param("gdnbench::call", 8, id="explicit"),
])
def test_annotation_selects_range(annotation, n_gpu):
    assert len(Timeline.from_chrome_trace(SYNTHETIC, annotation).gpu) == n_gpu


def test_unknown_annotation_is_an_error():
    with pytest.raises(ValueError, match="no host range"):
        Timeline.from_chrome_trace(SYNTHETIC, "nope")


def test_plot_gantt_draws_one_row_per_timeline():
    tl = Timeline.from_chrome_trace(SYNTHETIC)
    fig = plot_gantt({"ours": tl, "fla": tl}, title="T=64")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fla", "ours"]
    assert ax.get_title() == "T=64"
    assert "µs" in ax.get_xlabel()


def test_record_timeline_without_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU: covered by test_record_timeline_two_kernels")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        record_timeline(lambda: None)


@pytest.mark.gpu
def test_record_timeline_two_kernels():
    import torch

    x = torch.randn(1 << 20, device="cuda")
    tl = record_timeline(lambda: (x * 2).add_(1))
    s = tl.summary()
    assert s["kernels"] == 2 and s["launches"] == 2 and s["host_syncs"] == 0
