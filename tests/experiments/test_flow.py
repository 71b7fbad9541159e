"""The GPU-only halves of the experiments, driven on the CPU with stand-ins.

Timing methods, timelines and peers that need a GPU are replaced by fakes
(``monkeypatch``) so the bookkeeping around them runs here: which
implementations get timed (only gate passes), FlashInfer timed in place on
its own copy of the inputs, one row per method, timelines -> launches / idle
fraction columns, Chrome traces and the Gantt chart of the chosen shape. The
real instruments run in the GPU smoke/full profiles.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kernels.bench import timing
from kernels.bench.timing import Timing
from kernels.experiments import common
from kernels.experiments import decode_crossover as dx
from kernels.experiments import prefill_overhead as px

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TRACE = ROOT / "tests" / "fixtures" / "synthetic_trace_prefill.json"


def _fake_time(calls):
    def time_fn(fn, method, *, rep, warmup):
        fn()
        calls.append(method)
        us = 10.0 + len(calls)
        return Timing(method, us, us * 0.9, us * 1.1, rep)
    return time_fn


def _params(mod, **over):
    p = {q.name: q.default for q in mod.PARAMS}
    p.update(device="cpu", profile="unit", **over)
    return p


def test_decode_flow_with_fake_gpu_methods(tmp_path, monkeypatch):
    from kernels.reference import decode_reference

    state_seen = {}

    def fi_copy(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        return decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale)

    def fi_inplace(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        out, new = decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale)
        state_seen.setdefault("ids", set()).add(id(state))
        state.copy_(new)  # like FlashInfer: the input state is overwritten
        return out, state

    def broken(*args, **kw):
        raise RuntimeError("boom")

    from kernels import peers

    fakes = {"flashinfer": fi_copy, "flashinfer_inplace": fi_inplace, "torch": broken}
    monkeypatch.setattr(peers, "peer_impls", lambda op, names: {n: fakes[n] for n in names})
    calls = []
    monkeypatch.setattr(timing, "time_fn", _fake_time(calls))
    monkeypatch.setattr(common, "method_available",
                        lambda m, d: (True, "") if m in ("cupti_cold", "graph") else (False, "no"))
    params = _params(dx, output_root=str(tmp_path), num_q_heads=1, num_v_heads=2, head_dim=16,
                     batch_sizes=[1, 2], impls=["ours-fla-like", "flashinfer", "torch"],
                     methods=["cupti_cold", "graph", "event"], sweep_BV=[8], sweep_num_warps=[1],
                     sweep_V_TILES=[1], sweep_BK=[16], sweep_PREFETCH=[False],
                     repetitions=2, warmup=0)
    run = dx.start(params)
    gate = dx.run_gate(run)
    fi = gate[gate.label == "flashinfer"]
    assert set(fi.config) == {"default", "inplace"} and (fi.status == "pass").all()
    assert not fi[fi.config == "inplace"].input_untouched.any()   # restored after the check
    assert (gate[gate.label == "torch"].status == "error").all()
    state_seen.clear()  # the gate ran it on the shared inputs (and restored them)
    times = dx.run_timing(run, gate)
    # torch failed its gate: never timed; event is not available: no rows, a printed skip
    assert set(times.label) == {"ours-fla-like", "flashinfer"}
    assert set(times.method) == {"cupti_cold", "graph"}
    assert len(times) == 2 * 2 * 2
    assert set(times[times.label == "flashinfer"].config) == {"inplace"}
    # timed on its own copy: it never touched the run's shared inputs
    shared = {id(run.state["inputs"][B]["state"]) for B in (1, 2)}
    assert state_seen["ids"].isdisjoint(shared)
    assert any("timing with event" in s["what"] for s in run.skipped)
    cx = dx.crossover_table(times, ["flashinfer"])
    assert set(cx.method) == {"cupti_cold", "graph"}
    final = run.finish()
    assert (final / "decode_times.csv").exists() and (final / "gate.csv").exists()


def test_prefill_flow_with_fake_timelines(tmp_path, monkeypatch):
    from kernels.bench import timeline as tl_mod

    fake_tl = tl_mod.Timeline.from_chrome_trace(FIXTURE_TRACE)
    monkeypatch.setattr(px, "_timelines_available", lambda run: (True, ""))
    monkeypatch.setattr(tl_mod, "record_timeline", lambda fn, warmup=3: (fn(), fake_tl)[1])
    calls = []
    monkeypatch.setattr(timing, "time_fn", _fake_time(calls))
    monkeypatch.setattr(common, "method_available", lambda m, d: (True, ""))
    params = _params(px, output_root=str(tmp_path), num_q_heads=1, num_v_heads=2, head_dim=16,
                     shapes=["T6", [3, 2]], impls=["ours"], variants=["unfused", "fused"],
                     methods=["cupti_cold", "graph"], gantt_shape="T6",
                     waterfall_shapes=["T6", "T8192"], repetitions=2, warmup=0)
    run = px.start(params)
    gate = px.run_gate(run)
    assert (gate.status == "pass").all()
    times = px.run_measurements(run, gate)
    assert len(times) == 2 * 2 * 2  # variants x shapes x methods
    want = tl_mod.Timeline.from_chrome_trace(FIXTURE_TRACE).summary()
    assert (times.launches == want["launches"]).all()
    assert times.idle_frac.iloc[0] == pytest.approx(want["idle_frac"])
    assert sorted(p.name for p in run.dir.glob("trace_*.json")) == [
        "trace_6_ours-fused.json", "trace_6_ours-unfused.json"]
    wf = px.waterfalls(run, times)
    assert len(wf) == 1 and list(wf[0].variant) == ["unfused", "fused"]  # T8192 not measured
    assert any("waterfall lens=8192" in s["what"] for s in run.skipped)
    for name, fig in dict(gantt=px.plot_gantt_shape(run), waterfall=px.plot_waterfall(wf),
                          tvt=px.plot_time_vs_T(times), busy=px.plot_busy_idle(times)).items():
        assert fig is not None, name
        run.save_fig(fig, name)
    md = px.conclusion_markdown(dict(gate=gate, times=times, waterfall=wf, gantt_lens="6"))
    assert "ours-unfused: 59% idle, 8 launches" in md
    final = run.finish()
    assert (final / "prefill_times.csv").exists()
    df = pd.read_csv(final / "prefill_times.csv")
    for c in ("impl", "variant", "lens", "T", "N", "method", "median_us", "launches"):
        assert c in df.columns


def test_prefill_crossover_flow_with_fake_timing(tmp_path, monkeypatch):
    """The recurrent-vs-chunked section: every point gated (ours three ways and FLA's fused
    recurrent kernel, which runs under the interpreter), passing points timed, the CSVs,
    the crossover table and the figure."""
    calls = []
    monkeypatch.setattr(timing, "time_fn", _fake_time(calls))
    monkeypatch.setattr(common, "method_available", lambda m, d: (True, ""))
    params = _params(px, output_root=str(tmp_path), num_q_heads=1, num_v_heads=2, head_dim=16,
                     crossover_lengths=[1, 3], crossover_batch=2, repetitions=2, warmup=0)
    run = px.start(params)
    times = px.run_crossover(run)
    fla = times[times.impl == "fla_recurrent"]
    assert len(fla) == 4 and (fla.status.isin(["pass", "unavailable"])).all()
    ours = times[times.impl == "ours"]
    assert list(ours.label.unique()) == ["ours-recurrent", "ours-chunked", "ours-fused"]
    assert (ours.status == "pass").all() and ours.median_us.notna().all()
    assert list(times.lens.unique()) == ["1", "3", "0+1", "1+2"]
    assert len(calls) == int(times.median_us.notna().sum())
    table = px.crossovers(run, times)
    assert list(table.series) == ["B=1", "mixed N=2"]
    fig = px.plot_crossover(times, table)
    assert fig is not None
    run.save_fig(fig, "recurrent_crossover")
    final = run.finish()
    for name in ("recurrent_gate.csv", "recurrent_times.csv", "recurrent_crossover.csv"):
        assert (final / name).exists(), name
    assert "median_us" not in pd.read_csv(final / "recurrent_gate.csv").columns


def test_ncu_flow_with_fake_ncu(tmp_path, monkeypatch):
    from kernels.bench import ncu as ncu_mod
    from kernels.experiments import ncu_counts as nx

    seen = []

    def fake_run_ncu(target, metrics, out_csv=None):
        seen.append(target)
        inst = {"fla": 13.2e6, "flashinfer_inplace": 6e6}.get(target["impl"])
        if inst is None:  # ours: 5 M + 0.5 M per V-tile per head
            inst = 5e6 + 0.5e6 * nx.n_vtiles(target["config"])
        sb = nx.state_bytes(target["B"]) / 2
        Path(out_csv).write_text("raw ncu output would be here\n")
        rows = [(0, "k", nx.INST, inst, "inst"), (0, "k", nx.DRAM_READ, sb, "byte"),
                (0, "k", nx.DRAM_WRITE, sb, "byte")]
        return pd.DataFrame(rows, columns=["launch", "kernel", "metric", "value", "unit"])

    monkeypatch.setattr(nx, "ncu_ready", lambda run: (True, ""))
    monkeypatch.setattr(ncu_mod, "run_ncu", fake_run_ncu)
    params = _params(nx, output_root=str(tmp_path), ours_config="BV32-w4-s1-t1",
                     bv_sweep=[8, 16, 32, 128])
    run = nx.start(params)
    metrics = nx.run_profiles(run)
    assert {t["impl"] for t in seen} == {"fla", "flashinfer_inplace", "ours"}
    assert len(list((run.dir / "raw").glob("ncu_*.csv"))) == 3 + 4
    totals = nx.summarize(run, metrics)
    fit = nx.bv_fit(run, totals)
    assert fit["b"] == pytest.approx(0.5e6) and fit["r2"] == pytest.approx(1.0)
    md = nx.conclusion_markdown(dict(totals=totals, fit=fit))
    assert "FLA / FlashInfer = 2.20×" in md and "ours / FlashInfer = 1.17×" in md
    assert "fixture" not in md.lower()
    final = run.finish()
    df = pd.read_csv(final / "ncu_metrics.csv")
    assert list(df.columns[:6]) == ["impl", "config", "B", "kernel", "metric", "value"]
    assert (final / "bv_sweep_fit.csv").exists()


def test_decode_host_rows_come_before_the_sweeps_profiler(tmp_path, monkeypatch):
    """Notebook 01 takes every implementation's ``host`` time (and the bare-launch floor)
    in ``run_host``, right after the gate and before the sweep's first ``cupti_cold``
    session (the host ran slower after one); ``run_timing`` keeps those rows and times only
    the GPU methods, one row per (implementation, B, method)."""
    calls = []
    monkeypatch.setattr(timing, "time_fn", _fake_time(calls))
    monkeypatch.setattr(common, "method_available", lambda m, d: (True, ""))
    monkeypatch.setattr(dx, "method_available", lambda m, d: (True, ""))   # (the sweep's)

    def floor(self):   # (measured once per run, as Run's)
        if "floor" not in calls:
            calls.append("floor")
        return 9.0

    monkeypatch.setattr(common.Run, "host_floor_us", floor)
    params = _params(dx, output_root=str(tmp_path), num_q_heads=1, num_v_heads=2, head_dim=32,
                     batch_sizes=[1, 2], impls=["ours-adaptive", "ours-fla-like"],
                     methods=["cupti_cold", "host"], sweep_method="cupti_cold",
                     sweep_BV=[8], sweep_num_warps=[1], sweep_V_TILES=[1], sweep_BK=[16, 32],
                     sweep_PREFETCH=[False], repetitions=2, warmup=0)
    run = dx.start(params)   # (the grid holds the installed table's config, which
    gate = dx.run_gate(run)  # ours-adaptive's host row runs: the sweep has not chosen yet)
    assert (gate.status == "pass").all()
    host = dx.run_host(run, gate)
    assert calls[0] == "floor" and calls[1:] == ["host"] * 4
    sweep = dx.run_sweep(run, gate)
    dx.write_dispatch_table(run, dx.best_configs(sweep))
    n_before = len(calls)
    times = dx.run_timing(run, gate)
    assert "cupti_cold" in calls[5:n_before] and "host" not in calls[n_before:]
    assert sorted(times.groupby(["label", "B"]).method.apply(sorted).tolist()) == \
        [["cupti_cold", "host"]] * 4
    assert (times[times.method == "host"].floor_us == 9.0).all()
    assert times[times.method == "host"].median_us.tolist() == host.median_us.tolist()
