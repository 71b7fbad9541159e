"""Unit tests of the experiment modules on synthetic DataFrames (fast, no kernels).

The measurement halves (gate, timing, ncu) are exercised end to end by
``tests/notebooks/test_smoke.py``; here the analysis: crossover interpolation,
waterfalls, the V-tile model fit, the conclusions computed from data, the
figures, and the notebooks' parameter cells.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernels.experiments import decode_crossover as dx
from kernels.experiments import ncu_counts as nx
from kernels.experiments import prefill_overhead as px
from kernels.experiments.common import Param, collect_params, render_param

# --------------------------------------------------------------------------- decode: crossover


@pytest.mark.parametrize("Bs, sp, expected", [
    pytest.param([1, 4, 16, 64], [1.3, 1.1, 0.9, 0.7], [(8.0, "faster→slower")], id="mid-log-8"),
    pytest.param([64, 16, 4, 1], [0.7, 0.9, 1.1, 1.3], [(8.0, "faster→slower")], id="unsorted"),
    pytest.param([1, 2], [0.5, 2.0], [(2 ** (1 / 3), "slower→faster")], id="slower-to-faster"),
    pytest.param([1, 4, 16], [1.2, 1.1, 1.05], [], id="always-faster"),
    pytest.param([1, 4, 16], [0.8, 0.9, 0.95], [], id="always-slower"),
    pytest.param([1, 4, 16], [1.2, 1.0, 0.8], [(4.0, "faster→slower")], id="exactly-one-at-point"),
    pytest.param([1, 4, 16, 64], [1.2, 0.8, 1.2, 0.8],
                 [(2.0, "faster→slower"), (8.0, "slower→faster"), (32.0, "faster→slower")],
                 id="three-crossings"),
    pytest.param([1, 4, 8, 16], [1.2, float("nan"), 1.1, 0.9],
                 [(math.sqrt(8 * 16), "faster→slower")], id="nan-skipped"),
])
def test_crossover_points(Bs, sp, expected):
    got = dx.crossover_points(Bs, sp)
    assert len(got) == len(expected)
    for (b, d), (eb, ed) in zip(got, expected):
        assert b == pytest.approx(eb, rel=1e-9)
        assert d == ed


def _decode_times(fla_cross=8.0, with_fi=True, method="cupti_cold", gpu="NVIDIA H200"):
    """Synthetic decode_times: flashinfer linear in B, fla crossing it at ``fla_cross``."""
    Bs = [1, 4, 8, 16, 32, 48, 64]
    rows = []

    def add(label, config, t):
        for B, us in zip(Bs, t):
            rows.append(dict(impl=dx.impl_of(label), config=config, B=B, method=method,
                             median_us=us, p20_us=us * 0.95, p80_us=us * 1.05, floor_us=B * 0.2,
                             n=100, frac_of_copy_bw=B * 0.2 / us, gpu=gpu, label=label))
    fi = [4.0 + 0.15 * B for B in Bs]
    # fla = fi * s(B) with speedup fi/fla = 1.3 - 0.3*log2(B/cross)... crossing exactly at fla_cross
    fla = [f / (1.0 - 0.1 * math.log2(B / fla_cross)) for f, B in zip(fi, Bs)]
    ours = [f / 1.2 for f in fi]  # ours faster than flashinfer everywhere
    if with_fi:
        add("flashinfer", "default", fi)
    add("fla", "default", fla)
    add("ours-adaptive", "BV8-w1-s1-t1", ours)
    add("ours-fla-like", "BV8-w1-s1-t1", [x * 1.01 for x in fla])
    return pd.DataFrame(rows, columns=dx.TIMES_COLUMNS)


def test_crossover_table_finds_synthetic_crossover():
    times = _decode_times(fla_cross=8.0)
    cx = dx.crossover_table(times, ["flashinfer", "fla"])
    r = cx[(cx.baseline == "flashinfer") & (cx.challenger == "fla")].iloc[0]
    assert r.crossover_B == pytest.approx(8.0, rel=1e-6)
    assert r.direction == "faster→slower"
    r = cx[(cx.baseline == "flashinfer") & (cx.challenger == "ours-adaptive")].iloc[0]
    assert math.isnan(r.crossover_B) and r.summary == "faster at every B"
    assert set(cx.baseline) == {"flashinfer", "fla"}
    # a baseline that was not measured gives no rows, not an error
    assert dx.crossover_table(times, ["nope"]).empty


def test_speedups_definition():
    times = _decode_times()
    sp = dx.speedups(times, "flashinfer")
    r = sp[(sp.label == "ours-adaptive") & (sp.B == 1)].iloc[0]
    assert r.speedup == pytest.approx(1.2)


def test_conclusion_reports_crossover_and_seed_check():
    times = _decode_times(fla_cross=9.0)
    gate = pd.DataFrame([dict(label=l, impl=dx.impl_of(l), B=b, config="x", status="pass",
                              reason="", gpu="NVIDIA H200")
                         for l in times.label.unique() for b in times.B.unique()])
    md = dx.conclusion_markdown(dict(times=times, gate=gate))
    assert "NVIDIA H200" in md
    assert "fla vs flashinfer: crossover B≈9" in md
    assert "holds" in md and "does not hold" in md  # fla holds, ours-adaptive (no crossing) not
    assert "all passed" in md
    assert "B=1:" in md and "B=64:" in md
    # numbers come from the data: move the crossover far away and the verdict flips
    md2 = dx.conclusion_markdown(dict(times=_decode_times(fla_cross=40.0), gate=gate))
    assert "crosses at B≈40" in md2
    assert "fla vs flashinfer crosses at B≈40 (faster→slower) → does not hold" in md2


def test_conclusion_without_flashinfer_or_times():
    times = _decode_times(with_fi=False, method="cpu_wall", gpu="cpu (Triton interpreter)")
    md = dx.conclusion_markdown(dict(times=times))
    assert "cannot check" in md
    assert "plumbing" in md
    md = dx.conclusion_markdown(dict(times=pd.DataFrame(columns=dx.TIMES_COLUMNS)))
    assert "No timings" in md


def test_conclusion_lists_gate_failures():
    times = _decode_times()
    gate = pd.DataFrame([
        dict(label="fla", impl="fla", B=1, config="default", status="pass", reason="", gpu="g"),
        dict(label="torch", impl="torch", B=4, config="default", status="fail",
             reason="output: 3/8 elements outside", gpu="g"),
        dict(label="flashinfer", impl="flashinfer", B=1, config="default", status="unavailable",
             reason="not installed", gpu="g"),
    ])
    md = dx.conclusion_markdown(dict(times=times, gate=gate))
    assert "failing (not timed): torch" in md
    assert "Not available here: flashinfer" in md
    # one of a kind is singular: "2 implementations ran", "torch (1 failing point"
    assert "**Gate:** 2 implementations ran" in md and "torch (1 failing point, " in md


def test_plural():
    from kernels.experiments.common import plural

    assert [plural(n, "segment") for n in (0, 1, 2)] == ["0 segments", "1 segment", "2 segments"]
    assert plural(1, "gate set") == "1 gate set" and plural(3, "index", "indices") == "3 indices"


def _sweep():
    rows = []
    for B in (1, 64):
        for bv in (8, 16, 32):
            for w in (1, 2, 4):
                t = (10 + abs(bv - (8 if B == 1 else 32)) * 0.1 + abs(w - (1 if B == 1 else 4))) * (1 + B / 64)
                rows.append(dict(B=B, config=f"BV{bv}-w{w}-s1-t1", BV=bv, num_warps=w, num_stages=1,
                                 V_TILES=1, method="cupti_cold", median_us=t, p20_us=t, p80_us=t,
                                 n=30, gpu="g"))
    return pd.DataFrame(rows)


def test_best_configs_and_gain():
    best = dx.best_configs(_sweep()).set_index("B")
    assert best.loc[1, "config"] == "BV8-w1-s1-t1"
    assert best.loc[64, "config"] == "BV32-w4-s1-t1"
    assert best.loc[1, "gain_vs_fla_like"] == pytest.approx(1.0)
    assert best.loc[64, "gain_vs_fla_like"] > 1.0
    assert dx.best_configs(_sweep().iloc[0:0]).empty


def test_gate_summary_counts_configs():
    gate = pd.DataFrame([
        dict(label="ours-adaptive", B=1, config="a", status="pass"),
        dict(label="ours-adaptive", B=1, config="b", status="fail"),
        dict(label="fla", B=1, config="default", status="pass"),
    ])
    s = dx.gate_summary(gate)
    assert s.loc["ours-adaptive", 1] == "pass 1/2"
    assert s.loc["fla", 1] == "pass"


def test_decode_figures(tmp_path):
    times = pd.concat([_decode_times(), _decode_times(method="graph")], ignore_index=True)
    for name, fig in dict(time=dx.plot_time_vs_B(times),
                          speed=dx.plot_speedup(times, ["flashinfer", "fla"]),
                          bw=dx.plot_bw_fraction(times),
                          heat=dx.plot_heatmaps(_sweep(), gpu="g")).items():
        assert fig is not None
        fig.savefig(tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    # titles name the method and the GPU
    fig = dx.plot_time_vs_B(times)
    titles = [ax.get_title() for ax in fig.axes]
    assert any("cupti_cold" in t for t in titles) and any("graph" in t for t in titles)
    assert "NVIDIA H200" in fig.get_suptitle()
    cpu = dx.plot_time_vs_B(_decode_times(method="cpu_wall"))
    assert "plumbing only" in cpu.get_suptitle()
    empty = pd.DataFrame(columns=dx.TIMES_COLUMNS)
    assert dx.plot_time_vs_B(empty) is None and dx.plot_speedup(empty, ["fla"]) is None


# --------------------------------------------------------------------------- prefill


def _prefill_times(method="cupti_cold"):
    steps = dict(unfused=1000.0, fused_gates=700.0, no_sync=500.0, graph=200.0, fused=150.0)
    launches = dict(unfused=51, fused_gates=44, no_sync=44, graph=1, fused=6)
    rows = []
    for lens, T, scale in (("6", 6, 1.0), ("8192", 8192, 3.0)):
        for v, t in steps.items():
            busy = 60.0 * scale
            rows.append(dict(impl="ours", variant=v, lens=lens, T=T, N=1, method=method,
                             median_us=t * scale, launches=launches[v], p20_us=t, p80_us=t, n=10,
                             busy_us=busy, span_us=max(t * scale, busy),
                             idle_frac=1 - busy / max(t * scale, busy), gpu="NVIDIA H100",
                             label=f"ours-{v}"))
        rows.append(dict(impl="flashinfer", variant="default", lens=lens, T=T, N=1, method=method,
                         median_us=100.0 * scale, launches=2, p20_us=1, p80_us=1, n=10,
                         busy_us=80.0 * scale, span_us=100.0 * scale, idle_frac=0.2,
                         gpu="NVIDIA H100", label="flashinfer"))
    return pd.DataFrame(rows, columns=px.TIMES_COLUMNS)


def test_waterfall_table_steps():
    w = px.waterfall_table(_prefill_times(), "6")
    assert list(w.variant) == list(px.WATERFALL_VARIANTS)
    assert px.DEFAULT_VARIANTS == px.WATERFALL_VARIANTS + ("recurrent",)
    assert np.isnan(w.saved_us.iloc[0])
    assert list(w.saved_us.iloc[1:]) == [300.0, 200.0, 300.0, 50.0]
    assert list(w.saved_frac.iloc[1:]) == pytest.approx([0.3, 0.2, 0.3, 0.05])
    # a missing variant is left out; the next step is measured against the previous one
    t = _prefill_times()
    t = t[t.variant != "no_sync"]
    w = px.waterfall_table(t, "6")
    assert list(w.variant) == ["unfused", "fused_gates", "graph", "fused"]
    assert w.saved_us.iloc[2] == 500.0
    # a step that costs time has a negative saving
    t = _prefill_times()
    t.loc[(t.variant == "fused") & (t.lens == "6"), "median_us"] = 250.0
    assert px.waterfall_table(t, "6").saved_us.iloc[-1] == -50.0
    assert px.waterfall_table(_prefill_times(), "nope").empty


def test_crossover_points_and_mixed_lens():
    assert px.mixed_lens(6, 4) == [3, 1, 0, 2] and px.mixed_lens(128, 4) == [64, 32, 16, 16]
    assert px.mixed_lens(1, 3) == [0, 0, 1] and px.mixed_lens(5, 1) == [5]
    pts = px.crossover_points(dict(crossover_lengths=[1, 6], crossover_batch=4))
    assert pts == [("B=1", "1", [1]), ("B=1", "6", [6]), ("mixed N=4", "0+0+0+1", [0, 0, 0, 1]),
                   ("mixed N=4", "3+1+0+2", [3, 1, 0, 2])]
    assert len(px.crossover_points(dict(crossover_lengths=[2], crossover_batch=1))) == 1
    assert px.crossover_points(dict(crossover_lengths=[], crossover_batch=4)) == []  # no section
    with pytest.raises(ValueError, match="crossover_lengths"):
        px.crossover_points(dict(crossover_lengths=[0, 4], crossover_batch=2))
    with pytest.raises(ValueError, match="crossover_batch"):
        px.crossover_points(dict(crossover_lengths=[4], crossover_batch=0))


def _crossover_times(rec, chk, Ts=(1, 2, 4, 8, 16, 32), series="B=1"):
    rows = []
    for lab, us in (("ours-recurrent", rec), ("ours-chunked", chk),
                    ("ours-fused", [min(a, b) for a, b in zip(rec, chk)]),
                    ("fla (fused recurrent)", [u * 1.2 for u in rec])):
        for T, u in zip(Ts, us):
            rows.append(dict(series=series, lens=str(T), T=T, N=1, longest=T, label=lab,
                             impl="ours" if lab.startswith("ours") else "fla_recurrent",
                             variant="", status="pass", max_abs_err=1e-3, method="cupti_cold",
                             median_us=u, p20_us=u, p80_us=u, n=10, gpu="NVIDIA H200"))
    return pd.DataFrame(rows, columns=px.CROSSOVER_COLUMNS)


def test_crossover_table_and_figure():
    from kernels.prefill.config import RECURRENT_MAX_T
    one = _crossover_times([3, 3.5, 4.5, 6, 9, 15], [10, 10, 10, 10.5, 10.5, 11])
    mixed = _crossover_times([3, 4, 12, 8, 9, 20], [10, 10, 10, 10, 10, 11], series="mixed N=4")
    times = pd.concat([one, mixed], ignore_index=True)
    t = px.crossover_table(times)
    assert list(t.series) == ["B=1", "mixed N=4"]
    assert list(t.crossover_T) == [16, 2]     # the first loss ends the run (T=4 mixed)
    assert list(t.first_chunked_T) == [32, 4]
    assert t.recurrent_us.iloc[0] == 9 and t.chunked_us.iloc[0] == 10.5
    assert (t.rule_max_T == RECURRENT_MAX_T).all()
    always = px.crossover_table(_crossover_times([1] * 6, [2] * 6))
    assert always.crossover_T.iloc[0] == 32 and np.isnan(always.first_chunked_T.iloc[0])
    never = px.crossover_table(_crossover_times([3] * 6, [2] * 6))
    assert np.isnan(never.crossover_T.iloc[0]) and never.first_chunked_T.iloc[0] == 1
    untimed = times.assign(median_us=np.nan)
    assert px.crossover_table(untimed).empty and px.plot_crossover(untimed) is None
    fig = px.plot_crossover(times, t)
    assert fig is not None and "NVIDIA H200" in fig._suptitle.get_text()
    assert "cupti_cold" in fig._suptitle.get_text()
    md = px.conclusion_markdown(dict(gate=None, times=None, crossover=t, crossover_times=times))
    assert md.startswith("### Conclusion — NVIDIA H200")
    assert "B=1: recurrent faster up to T=16 (9.00 µs vs chunked 10.5 µs)" in md
    assert "chunked from T=32" in md and "support up to 2" in md
    assert "B=1, T=8: ours-fused 6.00 µs; ours-recurrent 6.00 µs" in md


def test_prefill_conclusion_from_data():
    times = _prefill_times()
    wf = [px.waterfall_table(times, "6"), px.waterfall_table(times, "8192")]
    gate = pd.DataFrame([dict(label=l, lens="6", status="pass", reason="", gpu="NVIDIA H100")
                         for l in times.label.unique()])
    md = px.conclusion_markdown(dict(gate=gate, times=times, waterfall=wf, gantt_lens="6"))
    assert "NVIDIA H100" in md
    assert "ours-unfused: 94% idle, 51 launches" in md
    assert "fused_gates saved 300 µs (30% of unfused)" in md
    assert "fused is 6.67× faster than unfused" in md
    assert "ours-unfused 10.00×" in md  # vs flashinfer at T=6
    assert "fastest is flashinfer" in md
    md = px.conclusion_markdown(dict(gate=gate, times=pd.DataFrame(columns=px.TIMES_COLUMNS)))
    assert "No timelines or timings" in md and "all passed" in md


def test_prefill_figures(tmp_path):
    times = pd.concat([_prefill_times(), _prefill_times("graph")], ignore_index=True)
    wf = [px.waterfall_table(times, "6"), px.waterfall_table(times, "8192")]
    gate = pd.DataFrame([dict(label="ours-fused", lens="6", status="pass", max_abs_err=1e-3,
                              rel_l2_err=1e-4, gpu="g"),
                         dict(label="fla", lens="6", status="unavailable", max_abs_err=np.nan,
                              rel_l2_err=np.nan, gpu="g")])
    figs = dict(wf=px.plot_waterfall(wf), tvt=px.plot_time_vs_T(times),
                busy=px.plot_busy_idle(times), gate=px.plot_gate_errors(gate))
    for name, fig in figs.items():
        assert fig is not None, name
        fig.savefig(tmp_path / f"{name}.png")
    empty = pd.DataFrame(columns=px.TIMES_COLUMNS)
    assert px.plot_waterfall([]) is None
    assert px.plot_time_vs_T(empty) is None and px.plot_busy_idle(empty) is None


# --------------------------------------------------------------------------- ncu


@pytest.mark.parametrize("config, n", [("BV8-w1-s1-t1", 16), ("BV32-w4-s1-t2", 2),
                                       ("BV128-w4-s1-t1", 1)])
def test_n_vtiles(config, n):
    assert nx.n_vtiles(config, 128) == n


def test_fit_vtile_model_recovers_line():
    cfgs = [f"BV{bv}-w4-s1-t1" for bv in (8, 16, 32, 64, 128)]
    inst = [5e6 + 0.5e6 * (128 // bv) for bv in (8, 16, 32, 64, 128)]
    fit = nx.fit_vtile_model(pd.DataFrame(dict(config=cfgs, inst=inst)))
    assert fit["a"] == pytest.approx(5e6) and fit["b"] == pytest.approx(0.5e6)
    assert fit["r2"] == pytest.approx(1.0)
    assert list(fit["table"].n_vtiles) == [1, 2, 4, 8, 16]
    assert np.allclose(fit["table"].residual_frac, 0, atol=1e-9)
    with pytest.raises(ValueError, match="two or more"):
        nx.fit_vtile_model(pd.DataFrame(dict(config=cfgs[:1], inst=inst[:1])))


def _ncu_metrics():
    rows = []

    def add(label, impl, config, kernel, inst, rd, wr):
        for m, v in ((nx.INST, inst), (nx.DRAM_READ, rd), (nx.DRAM_WRITE, wr),
                     ("launch__registers_per_thread", 40)):
            rows.append(dict(impl=impl, config=config, B=64, kernel=kernel, metric=m, value=v,
                             unit="", label=label, source="ncu"))
    sb = nx.state_bytes(64) / 2
    add("fla", "fla", "default", "fused_recurrent_fwd", 13.2e6, sb, sb)
    add("flashinfer", "flashinfer", "default", "gdn_decode_a", 4e6, sb * 0.5, sb * 0.5)
    add("flashinfer", "flashinfer", "default", "gdn_decode_b", 2e6, sb * 0.5, sb * 0.5)
    add("ours", "ours", "BV32-w4-s1-t1", "gdn_decode_kernel", 7.2e6, sb * 1.05, sb)
    for bv in (8, 32, 128):
        add(f"ours-sweep-BV{bv}-w4-s1-t1", "ours", f"BV{bv}-w4-s1-t1", "gdn_decode_kernel",
            5e6 + 0.5e6 * (128 // bv), sb, sb)
    return pd.DataFrame(rows, columns=nx.METRIC_COLUMNS)


def test_impl_totals_and_per_state_byte():
    t = nx.per_state_byte(nx.impl_totals(_ncu_metrics())).set_index("label")
    assert t.loc["flashinfer", nx.INST] == pytest.approx(6e6)      # summed over two kernels
    assert t.loc["flashinfer", "kernels"] == 2
    assert t.loc["flashinfer", "launch__registers_per_thread"] == 40  # not summed
    assert t.loc["flashinfer", "dram_per_state_byte"] == pytest.approx(1.0)
    assert t.loc["fla", "inst_per_state_byte"] == pytest.approx(13.2e6 / nx.state_bytes(64))


def test_ncu_conclusion_from_data():
    t = nx.per_state_byte(nx.impl_totals(_ncu_metrics()))
    fit = nx.fit_vtile_model(nx.bv_sweep_frame(t))
    md = nx.conclusion_markdown(dict(totals=t, fit=fit))
    assert "FLA / FlashInfer = 2.20×" in md and "reproduced" in md
    assert "ours / FlashInfer = 1.20×" in md
    assert "every profiled kernel reads the state from DRAM about once" in md
    assert "not from DRAM traffic" in md
    # writes still in L2 at the kernel's end (seen on H200): said so, not called a saving
    low = t.copy()
    low.loc[low.label == "fla", "dram_write_per_state"] = 0.25
    assert "fla wrote less than the state to DRAM" in nx.conclusion_markdown(dict(totals=low))
    high = t.copy()
    high.loc[high.label == "fla", "dram_read_per_state"] = 2.0
    assert "fla reads 2.00× the state: extra DRAM traffic" in nx.conclusion_markdown(dict(totals=high))
    assert "R² = 1.000" in md and "explains the sweep" in md
    assert "fixture" not in md.lower()
    fixture = t.assign(source="fixture:ncu_fla.csv")
    assert "not from a measurement" in nx.conclusion_markdown(dict(totals=fixture))
    assert "No Nsight Compute data" in nx.conclusion_markdown(dict(totals=pd.DataFrame()))


def test_ncu_figures(tmp_path):
    t = nx.per_state_byte(nx.impl_totals(_ncu_metrics()))
    fit = nx.fit_vtile_model(nx.bv_sweep_frame(t))
    for name, fig in dict(bars=nx.plot_metric_bars(t, [nx.INST, nx.DRAM_READ]),
                          psb=nx.plot_per_state_byte(t), bv=nx.plot_bv_sweep(fit, B=64)).items():
        assert fig is not None
        fig.savefig(tmp_path / f"{name}.png")
    assert nx.plot_bv_sweep(None) is None


@pytest.mark.parametrize("name, kernels, expected", [
    ("ncu_decode_fla_B64_nvidia-h200.csv", (), dict(label="fla", impl="fla", config="default", B=64)),
    ("ncu_decode_flashinfer_inplace_B64_nvidia-h200.csv", (),
     dict(label="flashinfer", impl="flashinfer", config="inplace", B=64)),
    ("ncu_decode_flashinfer_B32_x.csv", (),
     dict(label="flashinfer+copy", impl="flashinfer", config="default", B=32)),
    ("ncu_decode_ours_B64_nvidia-h100-80gb-hbm3.csv", (),
     dict(label="ours", impl="ours", config="table", B=64)),
    ("ncu_fla.csv", (), dict(label="fla", impl="fla", config="default", B=64)),
    ("ncu_ours-BV32-w4-s1-t1_B32.csv", (), dict(label="ours", impl="ours", config="BV32-w4-s1-t1", B=32)),
    ("ncu_ours-sweep-BV8-w4-s1-t1.csv", (),
     dict(label="ours-sweep-BV8-w4-s1-t1", impl="ours", config="BV8-w4-s1-t1", B=64)),
    ("ncu_synthetic_raw_decode.csv", ("fused_recurrent_gated_delta_rule_fwd_kernel", "fill"),
     dict(label="fla", impl="fla", config="default", B=64)),
])
def test_fixture_target_from_name(name, kernels, expected):
    assert nx.fixture_target(name, 64, kernels) == expected


def test_tidy_accepts_ncu_column_names():
    raw = pd.DataFrame({"Kernel Name": ["k"], "Metric Name": [nx.INST], "Metric Unit": ["inst"],
                        "Metric Value": ["1,234,567"]})
    t = nx.tidy(raw, impl="fla", config="default", B=64, label="fla", source="ncu")
    assert list(t.columns) == nx.METRIC_COLUMNS
    assert t.value.iloc[0] == 1234567


# --------------------------------------------------------------------------- parameters


def test_render_and_collect_params():
    ps = (Param("n", "int", 3, "count"), Param("xs", "list", ["a", 1], "things"),
          Param("f", "float", 0.5, "a float"), Param("on", "bool", False, "flag"))
    assert render_param(ps[1]) == 'xs: list = ["a", 1]  # things'
    assert render_param(ps[3]) == "on: bool = False  # flag"
    got = collect_params(dict(n=4, xs=("b",), f=1, on=True, other=0), ps, "99_unit")
    assert got == dict(n=4, xs=["b"], f=1.0, on=True)
    with pytest.raises(ValueError, match="'n' must be int"):
        collect_params(dict(n="4", xs=[], f=1.0, on=True), ps, "99_unit")
    with pytest.raises(ValueError, match="'n' must be int"):
        collect_params(dict(n=True, xs=[], f=1.0, on=True), ps, "99_unit")
    with pytest.raises(ValueError, match="'on' is not defined"):
        collect_params(dict(n=1, xs=[], f=1.0), ps, "99_unit")


@pytest.mark.parametrize("mod", [dx, px, nx], ids=["01", "02", "03"])
def test_params_have_required_and_no_equals_in_help(mod):
    names = [p.name for p in mod.PARAMS]
    assert names[:3] == ["device", "output_root", "profile"]
    assert len(names) == len(set(names))
    for p in mod.PARAMS:
        # papermill's inspector skips a parameter line holding more than one '='
        assert "=" not in p.help, p
        assert collect_params({p.name: p.default}, (p,), mod.STEM)  # defaults have their declared type


def test_ncu_default_metrics_match_instrument():
    from kernels.bench.ncu import DEFAULT_METRICS

    default = next(p.default for p in nx.PARAMS if p.name == "metrics")
    assert list(default) == list(DEFAULT_METRICS)
    assert {nx.INST, nx.DRAM_READ, nx.DRAM_WRITE} <= set(default)


def test_ncu_targets():
    params = {p.name: p.default for p in nx.PARAMS}
    params.update(ours_config="BV16-w2-s1-t1", bv_sweep=[8, 64])
    ts = {t["label"]: t for t in nx.targets(params)}
    assert ts["flashinfer"]["target"]["impl"] == "flashinfer_inplace"
    assert ts["ours"]["target"]["config"] == "BV16-w2-s1-t1"
    assert ts["ours-sweep-BV64-w4-s1-t1"]["config"] == "BV64-w4-s1-t1"
    assert all(t["target"]["B"] == 64 for t in ts.values())


def test_run_writes_and_moves_into_place(tmp_path, capsys):
    from kernels.experiments.common import start_run

    params = dict(device="cpu", output_root=str(tmp_path), profile="smoke", x=1)
    run = start_run("99_unit", params)
    run.write_csv(pd.DataFrame(dict(a=[1])), "table")
    run.show(dx.plot_heatmaps(_sweep(), gpu="g"), "heat")
    run.show(None, "nothing")
    run.skip("a step", "a reason")
    assert not any(p.name == "99_unit" for p in tmp_path.rglob("99_unit"))  # not yet in place
    final = run.finish()
    assert final.name == "99_unit" and final.is_dir()
    names = {p.name for p in final.iterdir()}
    assert {"table.csv", "heat.png", "provenance.json", "skipped.csv"} <= names
    import json
    prov = json.loads((final / "provenance.json").read_text())
    assert prov["params"]["x"] == 1 and prov["experiment"]["skipped"][0]["reason"] == "a reason"
    out = capsys.readouterr().out
    assert "SKIPPED a step: a reason" in out and "nothing: no figure" in out


# --------------------------------------------------------------------------- "auto" (hand runs)


def _defaults(mod):
    return {p.name: p.default for p in mod.PARAMS}


@pytest.mark.parametrize("has_gpu,profile,root", [(False, "smoke", "results/smoke"),
                                                  (True, "full", "results")])
def test_auto_takes_the_profile_make_run_would(has_gpu, profile, root, monkeypatch):
    """A notebook run by hand with the defaults gets what ``make run`` passes: the
    device's profile, its values, and the repository's results folder (absolute, so
    the kernel's working directory ``notebooks/`` does not matter)."""
    from kernels.experiments.common import resolve_auto
    from kernels.runner import OUTPUT_ROOT_ENV, REPO_ROOT, load_profile

    monkeypatch.delenv(OUTPUT_ROOT_ENV)   # tests/conftest.py's: a user's run has none

    got = resolve_auto(_defaults(dx), dx.PARAMS, dx.STEM, has_gpu=has_gpu)
    prof = load_profile(profile)
    want = dict(prof["defaults"], **prof["notebooks"][dx.STEM])
    assert got["profile"] == profile
    assert got["output_root"] == str(REPO_ROOT / root)
    assert got["device"] == "auto"
    for k, v in want.items():
        if k != "output_root":
            assert got[k] == v, k
    untouched = set(_defaults(dx)) - set(want) - {"profile", "output_root"}
    assert untouched and all(got[k] == _defaults(dx)[k] for k in untouched)


def test_auto_keeps_values_edited_in_the_cell_and_explicit_names(monkeypatch):
    from kernels.experiments.common import resolve_auto
    from kernels.runner import OUTPUT_ROOT_ENV, REPO_ROOT

    monkeypatch.delenv(OUTPUT_ROOT_ENV)

    edited = dict(_defaults(dx), batch_sizes=[2, 3], head_dim=64)
    got = resolve_auto(edited, dx.PARAMS, dx.STEM, has_gpu=False)
    assert got["batch_sizes"] == [2, 3] and got["head_dim"] == 64
    assert got["num_q_heads"] == 2  # still at its default: the smoke value
    # the runner's way: a profile name and every value; only output_root resolved here
    named = dict(_defaults(dx), profile="smoke", output_root="/somewhere")
    assert resolve_auto(named, dx.PARAMS, dx.STEM, has_gpu=False) == named
    rooted = dict(_defaults(dx), profile="full")
    got = resolve_auto(rooted, dx.PARAMS, dx.STEM, has_gpu=False)
    assert got["output_root"] == str(REPO_ROOT / "results") and got["batch_sizes"] == rooted["batch_sizes"]
    # device decides when it is explicit
    assert resolve_auto(dict(_defaults(dx), device="cpu"), dx.PARAMS, dx.STEM)["profile"] == "smoke"
    assert resolve_auto(dict(_defaults(dx), device="cuda"), dx.PARAMS, dx.STEM)["profile"] == "full"


def test_auto_output_root_follows_the_environment(tmp_path, monkeypatch):
    """``GDN_OUTPUT_ROOT`` redirects ``output_root="auto"`` (the tests set it for the whole
    session); an explicit root stays as given."""
    from kernels.experiments.common import resolve_auto
    from kernels.runner import OUTPUT_ROOT_ENV

    monkeypatch.setenv(OUTPUT_ROOT_ENV, str(tmp_path / "elsewhere"))
    got = resolve_auto(_defaults(dx), dx.PARAMS, dx.STEM, has_gpu=False)
    assert got["output_root"] == str(tmp_path / "elsewhere") and got["profile"] == "smoke"
    named = dict(_defaults(dx), output_root="/somewhere")
    assert resolve_auto(named, dx.PARAMS, dx.STEM, has_gpu=False)["output_root"] == "/somewhere"


def test_auto_output_root_needs_a_known_profile():
    from kernels.experiments.common import resolve_auto

    with pytest.raises(ValueError, match="output_root"):
        resolve_auto(dict(_defaults(px), profile="no-such-profile"), px.PARAMS, px.STEM,
                     has_gpu=False)


def _notebook_module(path):
    """The experiment module a committed notebook imports as ``xp``, and its
    parameters cell run as the notebook runs it (JupyterLab: nothing injected)."""
    import importlib
    import json
    import re

    cells = json.loads(path.read_text())["cells"]
    src = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
           for c in cells if c["cell_type"] == "code"]
    names = {m for s in src for m in re.findall(r"from kernels\.experiments import (\w+) as xp", s)}
    assert len(names) == 1, f"{path.name}: imports {sorted(names)} as xp (want one module)"
    params_cell = next("".join(c["source"]) for c in cells
                       if "parameters" in c.get("metadata", {}).get("tags", []))
    namespace = {}
    exec(params_cell, namespace)  # noqa: S102 - our committed parameters cell
    return importlib.import_module(f"kernels.experiments.{names.pop()}"), namespace


@pytest.mark.parametrize("has_gpu,profile,root", [(False, "smoke", "results/smoke"),
                                                  (True, "full", "results")])
@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[2].glob("notebooks/*.ipynb")),
                         ids=lambda p: p.stem)
def test_every_notebook_resolves_auto_as_make_run_would(path, has_gpu, profile, root, monkeypatch):
    """Each committed notebook, run by hand with its parameters cell as committed,
    resolves ``"auto"`` through the shared collector: its module's ``STEM`` is the
    notebook's, the device's profile values (its dict for that stem included) fill the
    defaults, and results go to the repository's results folder."""
    import kernels.device as device
    from kernels.runner import OUTPUT_ROOT_ENV, REPO_ROOT, load_profile

    monkeypatch.setattr(device, "has_gpu", lambda: has_gpu)
    monkeypatch.delenv(OUTPUT_ROOT_ENV)
    mod, namespace = _notebook_module(path)
    assert mod.STEM == path.stem
    assert namespace["profile"] == "auto" and namespace["output_root"] == "auto"
    got = mod.collect_params(namespace)
    prof = load_profile(profile)
    assert got["profile"] == profile
    assert got["output_root"] == str(REPO_ROOT / root)
    declared = {p.name for p in mod.PARAMS}
    for k, v in dict(prof["defaults"], **prof["notebooks"].get(path.stem, {})).items():
        if k in declared and k not in ("device", "output_root", "profile"):
            assert got[k] == v, k


def test_host_bound_table_flags_the_shapes_whose_host_time_exceeds_their_gpu_time():
    """Notebook 02's host-bound table: per shape ours-fused's host µs, its ``graph`` time and
    the bare-launch floor of the same run; host-bound exactly where host > GPU time; other
    implementations' rows are not mixed in, and the conclusion names the bound shapes."""
    rows = []
    for lens, T, host, graph in (("6", 6, 12.0, 3.7), ("8192", 8192, 19.0, 91.0)):
        rows += [dict(label="ours-fused", lens=lens, T=T, N=1, method="host", median_us=host,
                      floor_us=13.5, gpu="GPU X"),
                 dict(label="ours-fused", lens=lens, T=T, N=1, method="graph", median_us=graph,
                      floor_us=np.nan, gpu="GPU X"),
                 dict(label="fla (triton)", lens=lens, T=T, N=1, method="host", median_us=900.0,
                      floor_us=13.5, gpu="GPU X")]
    t = pd.DataFrame(rows)
    hb = px.host_bound_table(t)
    assert list(hb.lens) == ["6", "8192"]
    assert list(hb.host_bound) == [True, False]
    assert hb.host_x_bare.tolist() == pytest.approx([12.0 / 13.5, 19.0 / 13.5])
    assert px.host_bound_table(t[t.method == "host"]).empty   # no GPU time: no verdict
    full = t.reindex(columns=list(dict.fromkeys(px.TIMES_COLUMNS + list(t.columns))))
    line = [x for x in px.conclusion_markdown({"times": full}).split("\n\n")
            if x.startswith("**Host-bound")]
    assert line and "6 of 2 shapes" in line[0] and "0.89–1.41×" in line[0], line


def test_prefill_host_times_come_before_the_first_timeline(monkeypatch):
    """Notebook 02 takes every shape's ``host`` time (and the bare-launch floor) before its
    first profiler session (a timeline, cupti_cold), then the other methods per shape; each
    shape keeps one row per method."""
    from types import SimpleNamespace

    import kernels.bench.timeline as tlm

    order = []

    class _Timeline:
        def summary(self):
            return {}

    def fake_time_each(call, methods, rep, warmup):
        order.extend(methods)
        return [dict(method=m, median_us=1.0) for m in methods]

    class _Run:
        params = dict(methods=["cupti_cold", "graph", "host"], gantt_shape="", repetitions=1,
                      warmup=0)
        gpu = "fake"
        state = dict(impls={"ours": SimpleNamespace(impl="ours", variant="fused",
                                                    fn=lambda **x: None, where="here")},
                     shapes=[("6", [6]), ("64", [64])], timelines={})

        def usable_methods(self, methods):
            return list(methods)

        def host_floor_us(self):   # (measured once per run, as Run's)
            if "floor" not in order:
                order.append("floor")
            return 9.0

        def skip(self, what, why):
            raise AssertionError(f"{what}: {why}")

        def timed_rows(self, timings, what, base):
            return [dict(base, **t) for t in timings]

        def write_csv(self, df, name):
            pass

    monkeypatch.setattr(px, "_timelines_available", lambda run: (True, ""))
    monkeypatch.setattr(px, "_inputs", lambda run, lab, lens: ({}, None))
    monkeypatch.setattr(px, "time_each", fake_time_each)
    monkeypatch.setattr(tlm, "record_timeline", lambda call: order.append("timeline") or _Timeline())
    gate = pd.DataFrame(dict(label=["ours", "ours"], lens=["6", "64"], status=["pass", "pass"]))
    times = px.run_measurements(_Run(), gate)
    assert order == ["floor", "host", "host", "timeline", "cupti_cold", "graph", "timeline",
                     "cupti_cold", "graph"]
    assert sorted(times.groupby("lens").method.apply(sorted).tolist()) == \
        [["cupti_cold", "graph", "host"]] * 2
    assert (times[times.method == "host"].floor_us == 9.0).all()
