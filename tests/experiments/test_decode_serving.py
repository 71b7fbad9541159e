"""Notebook 01's serving and drift sections and its speedup figure, on synthetic
tables and with fake GPU instruments (CPU)."""
from __future__ import annotations

import pandas as pd
import pytest

from kernels.bench import timing
from kernels.bench.timing import Timing
from kernels.experiments import decode_crossover as dx
from kernels.experiments import decode_serving as sv


def _params(**over):
    p = {q.name: q.default for q in dx.PARAMS}
    p.update(device="cpu", profile="unit", **over)
    return p


def test_serving_cases_cover_the_three_sections():
    cases = sv.serving_cases(_params())
    by = {}
    for section, c in cases:
        by.setdefault(section, []).append(c)
    assert [c.layout for c in by["pooled"]] == ["dense", "pooled"]
    tok = by["tokens"]
    assert {c.T for c in tok} == {1, 2, 3, 4}
    assert sv.Case("ours", T=4, intermediate=True) in tok
    assert sv.Case("flashinfer_mtp", T=2) in tok
    assert sv.Case("flashinfer_bf16", T=3, state_dtype="bfloat16") in tok
    assert {c.label for c in by["state_dtype"]} == {"ours", "flashinfer", "flashinfer_bf16"}
    no_fi = sv.serving_cases(_params(impls=["ours-adaptive"], state_dtype=["bf16"]))
    assert {c.label for _, c in no_fi} == {"ours"}
    assert {c.state_dtype for s, c in no_fi if s == "state_dtype"} == {"bfloat16"}
    with pytest.raises(ValueError, match="state_dtype"):
        sv.serving_cases(_params(state_dtype=["float16"]))
    with pytest.raises(ValueError, match="tokens_per_step"):
        sv.serving_cases(_params(tokens_per_step=[0]))


def test_case_names_and_floors():
    from kernels.spec import CONTEST

    assert sv.Case("ours", "pooled", 2, "bfloat16", True).name == "ours pooled T=2 bf16 +states"
    bw = 1e12
    f32 = sv.case_floor_us(sv.Case("ours"), 64, CONTEST, bw)
    assert sv.case_floor_us(sv.Case("ours", state_dtype="bfloat16"), 64, CONTEST, bw) == \
        pytest.approx(f32 / 2)
    # T=4 with intermediate states: the state read + written once, and written 4 more times
    assert sv.case_floor_us(sv.Case("ours", T=4, intermediate=True), 64, CONTEST, bw) == \
        pytest.approx(f32 * 3)
    assert sv.case_floor_us(sv.Case("ours", T=4), 64, CONTEST, bw) == pytest.approx(f32)


def _serving_times(gpu="NVIDIA H200", method="cupti_cold"):
    rows = []

    def add(section, label, B, us, layout="dense", T=1, dtype="float32", inter=False):
        rows.append(dict(section=section, label=label, impl=label.split("_")[0], layout=layout,
                         T=T, state_dtype=dtype, intermediate=inter, B=B, config="c",
                         method=method, median_us=us, p20_us=us * 0.95, p80_us=us * 1.05,
                         floor_us=B * 0.25, frac_of_copy_bw=B * 0.25 / us, n=50, gpu=gpu))
    for B in (1, 64, 512):
        base = 2 + B * 0.3
        add("pooled", "ours", B, base)
        add("pooled", "ours", B, base * 1.02, layout="pooled")
        for T in (1, 2, 4):
            add("tokens", "ours", B, base * (1 + 0.05 * (T - 1)), T=T)
            if T > 1:
                add("tokens", "ours", B, base * (1 + 0.5 * T), T=T, inter=True)
                add("tokens", "flashinfer_mtp", B, base * 1.3, T=T)
        add("state_dtype", "ours", B, base)
        add("state_dtype", "ours", B, base / 1.9, dtype="bfloat16")
        add("state_dtype", "flashinfer_bf16", B, base / 1.7, dtype="bfloat16")
    return pd.DataFrame(rows, columns=sv.SERVING_COLUMNS)


def _drift():
    rows = []
    for dtype, f in (("float32", 1e-6), ("bfloat16", 3e-3)):
        for step in (1, 100, 1000):
            for what in ("output", "state"):
                rows.append(dict(state_dtype=dtype, step=step, what=what,
                                 max_abs_err=f * step ** 0.5, rel_l2_err=f * step ** 0.3,
                                 gpu="NVIDIA H200"))
    return pd.DataFrame(rows, columns=sv.DRIFT_COLUMNS)


def test_serving_tables_and_figures(tmp_path):
    times = _serving_times()
    tab = sv.serving_table(times, "pooled")
    assert list(tab.columns) == ["ours", "ours pooled"] and list(tab.index) == [1, 64, 512]
    for name, fig in dict(pooled=sv.plot_serving_pooled(times),
                          tokens=sv.plot_serving_tokens(times),
                          dtype=sv.plot_serving_state_dtype(times),
                          drift=sv.plot_drift(_drift())).items():
        assert fig is not None, name
        assert "NVIDIA H200" in fig.get_suptitle(), name
        if name != "drift":
            assert "cupti_cold" in fig.get_suptitle(), name
        fig.savefig(tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    # pooled / dense within 2 %: a linear axis around 1, not a log axis
    ratio_ax = sv.plot_serving_pooled(times).axes[1]
    assert ratio_ax.get_yscale() == "linear"
    lo, hi = ratio_ax.get_ylim()
    assert lo < 1.0 < 1.02 < hi < 1.2
    empty = pd.DataFrame(columns=sv.SERVING_COLUMNS)
    assert sv.plot_serving_pooled(empty) is None and sv.plot_drift(pd.DataFrame()) is None
    dt = sv.drift_table(_drift())
    assert dt.loc[("bfloat16", "state"), ("max_abs_err", 1000)] == pytest.approx(3e-3 * 1000 ** 0.5)


def test_serving_conclusion_from_data():
    gate = pd.DataFrame([
        dict(label="ours", case="ours", B=1, status="pass", reason=""),
        dict(label="flashinfer_mtp", case="flashinfer_mtp T=2", B=1, status="unavailable",
             reason="flashinfer-python is not installed"),
        dict(label="ours", case="ours T=2 bf16", B=1, status="fail", reason="output: 3/8 bad"),
    ])
    md = sv.serving_markdown(_serving_times(), gate, _drift())
    assert "pooled / dense at B=64: 1.020" in md
    assert "T=4 in one call / one T=1 call at B=512: 1.15" in md
    assert "bf16 state speedup at B=512: 1.90×; ours / FlashInfer bf16: 0.89" in md
    caveat = "FlashInfer's bf16-state call is two launches"
    assert (caveat in md) is (str(_serving_times().method.iloc[0]) == "cupti_cold")
    graph = sv.serving_markdown(_serving_times().assign(method="graph"), gate, _drift())
    assert caveat not in graph
    assert "failing (not timed): ours T=2 bf16 B=1" in md
    assert "Not available here: flashinfer_mtp (flashinfer-python is not installed)" in md
    assert "Drift after 1000 consecutive steps" in md and "bfloat16 state: rel-L2" in md
    full = dx.conclusion_markdown(dict(times=pd.DataFrame(columns=dx.TIMES_COLUMNS),
                                       serving_times=_serving_times(), drift=_drift()))
    assert full.startswith("### Conclusion") and "No timings" in full and "Drift after" in full


def _decode_times(labels=("ours-adaptive", "fla", "flashinfer", "torch")):
    rows = []
    for B in (1, 4, 8, 16, 32, 48, 64, 128, 256, 512):
        fi = 2.0 + B * 0.3
        us = {"flashinfer": fi, "fla": fi * (1.3 if B < 32 else 0.9),
              "ours-adaptive": fi * (0.8 if B < 32 else 1.1), "torch": fi * 1024}
        for label in labels:
            rows.append(dict(impl=dx.impl_of(label), config="c", B=B, method="cupti_cold",
                             median_us=us[label], p20_us=us[label], p80_us=us[label],
                             floor_us=1.0, n=50, frac_of_copy_bw=0.5, gpu="NVIDIA H100",
                             label=label))
    return pd.DataFrame(rows, columns=dx.TIMES_COLUMNS)


def test_speedup_plot_shows_the_compared_impls_on_a_linear_axis():
    fig = dx.plot_speedup(_decode_times(), ["flashinfer", "fla"])
    ax = fig.axes[0]
    labels = [l.get_label() for l in ax.get_lines() if not l.get_label().startswith("_")]
    assert "torch" not in labels and {"ours-adaptive", "fla"} <= set(labels)
    assert ax.get_yscale() == "linear"   # ratios 0.8-1.3: linear around 1
    lo, hi = ax.get_ylim()
    assert 0.7 < lo < 0.8 and 1.3 < hi < 1.5
    boxes = [t.get_text() for t in ax.texts if t.get_text().startswith("crossovers:")]
    assert len(boxes) == 1                 # every crossover in one box: nothing to overlap
    assert boxes[0].count("B≈") == 2 and "left out: torch" in boxes[0]
    assert "NVIDIA H100" in fig.get_suptitle() and "cupti_cold" in fig.get_suptitle()
    # torch as the baseline (smoke profile): its panel still plots the others, on log2
    fig = dx.plot_speedup(_decode_times(), ["torch"])
    assert fig.axes[0].get_yscale() == "log"


def test_serving_flow_with_fake_peers(tmp_path, monkeypatch):
    """run_serving: gates every case, times only passing ones, FlashInfer-like peers
    run in place on their own copy; a peer that refuses T > 1 is an error, not timed."""
    from kernels.reference import decode_reference

    seen = []

    def fake_peer(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        if q.shape[1] > 2:
            raise RuntimeError("T > 2 not supported")
        out, new = decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale)
        seen.append(id(state))
        state.copy_(new)
        return out, state

    monkeypatch.setattr(sv, "_case_fn", lambda run, case, B: (
        ("default", fake_peer, True, "") if case.label != "ours" else
        _real_case_fn(run, case, B)))
    calls = []

    def fake_time(fn, method, *, rep, warmup):
        fn()
        calls.append(method)
        return Timing(method, 10.0, 9.0, 11.0, rep)

    monkeypatch.setattr(timing, "time_fn", fake_time)
    monkeypatch.setattr(sv, "method_available", lambda m, d: (True, ""))
    params = _params(output_root=str(tmp_path), num_q_heads=1, num_v_heads=2, head_dim=16,
                     batch_sizes=[1, 2], impls=["ours-adaptive", "flashinfer"],
                     tokens_per_step=[1, 3], state_dtype=["float32", "bfloat16"],
                     pooled=[False, True], serving_method="cupti_cold", repetitions=2, warmup=0)
    run = dx.start(params)
    res = sv.run_serving(run, copy_bw=1e9)
    gate, times = res["gate"], res["times"]
    assert (gate[gate.label == "ours"].status == "pass").all()
    refused = gate[(gate.label != "ours") & (gate["T"] == 3)]
    assert len(refused) and (refused.status == "error").all()
    assert not ((times.label != "ours") & (times["T"] == 3)).any()
    passed = set(map(tuple, gate[gate.status == "pass"][["case", "B"]].values))
    timed = {(sv._case_name_of(r), r.B) for r in times.itertuples()}
    assert timed <= passed
    assert set(times.section) == {"pooled", "tokens", "state_dtype"}
    assert (times.floor_us > 0).all()
    final = run.finish()
    assert (final / "serving_times.csv").exists() and (final / "serving_gate.csv").exists()


_real_case_fn = sv._case_fn


def test_drift_runs_and_reports_every_step(tmp_path):
    params = _params(output_root=str(tmp_path), num_q_heads=1, num_v_heads=2, head_dim=16,
                     drift_steps=[1, 3], drift_batch=2, state_dtype=["float32", "bfloat16"])
    run = dx.start(params)
    drift = sv.run_drift(run)
    assert set(drift.step) == {1, 3} and set(drift.state_dtype) == {"float32", "bfloat16"}
    s = drift.set_index(["state_dtype", "what", "step"])
    # fp32 state: exact to rounding; bf16: one rounding of the state per step
    assert s.loc[("float32", "state", 3), "rel_l2_err"] < 1e-5
    assert 1e-4 < s.loc[("bfloat16", "state", 1), "rel_l2_err"] < 1e-2
    run.finish()
