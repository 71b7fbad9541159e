"""Notebook 01's replay section (CPU): parameters, the bytes model, the gate-then-time flow
with a fake timer, the drift run, and the figures and conclusion from synthetic tables."""
from __future__ import annotations

import pandas as pd
import pytest

from kernels.bench import timing
from kernels.bench.timing import Timing
from kernels.experiments import decode_crossover as dx
from kernels.experiments import decode_replay as rp

TINY = dict(num_q_heads=1, num_v_heads=2, head_dim=16)


def _params(**over):
    p = {q.name: q.default for q in dx.PARAMS}
    p.update(device="cpu", profile="unit", **over)
    return p


@pytest.mark.parametrize("over, match", [
    (dict(replay_L=[0]), "replay_L"),
    (dict(replay_accept=[5]), "replay_accept"),
    (dict(replay_calls=12), "replay_calls"),          # not a multiple of L = 8, 16
    (dict(replay_state_dtype=["float16"]), "replay_state_dtype"),
])
def test_bad_replay_params_raise_naming_them(over, match):
    with pytest.raises(ValueError, match=match):
        rp.check_params(_params(**over))


def test_bytes_per_token_model():
    import torch

    from kernels.spec import CONTEST, decode_state_bytes
    f32, acc, K = torch.float32, [1, 3, 2, 2], 16
    full = decode_state_bytes(64, CONTEST, f32)
    assert rp.bytes_per_token("standard", 64, CONTEST, f32, 0, acc, K) == full
    # T=4 with intermediate states: read + write + 4 states written, per accepted token (2)
    assert rp.bytes_per_token("standard_spec", 64, CONTEST, f32, 0, acc, K) == \
        pytest.approx(full * 3 / 2)
    one = [rp.bytes_per_token("replay", 64, CONTEST, f32, L, acc, K) / full
           for L in (1, 2, 4, 8, 16)]
    # L = 1 writes every call (plus the ring): no saving; then read + write / L + the ring
    assert 1.0 < one[0] < 1.02
    for L, r in zip((2, 4, 8, 16), one[1:]):
        assert (1 + 1 / L) / 2 < r < (1 + 1 / L) / 2 + 0.05, (L, r)
    assert one[3] < one[2] < one[1]
    bf = rp.bytes_per_token("replay", 64, CONTEST, torch.bfloat16, 8, acc, K)
    assert bf < one[3] * full * 0.6       # half the state bytes, the same ring
    spec = rp.bytes_per_token("replay_spec", 64, CONTEST, f32, 8, acc, K) / full
    assert spec < 0.6 * 3 / 2             # well under the standard T=4 +states contract


def test_replay_flow_gates_then_times(tmp_path, monkeypatch):
    """run_replay: every kind gated against the float32 reference (all pass), then timed
    per generated token; a kind whose gate fails is reported and not timed."""
    real_gate = rp._gate

    def gate(case, data):
        if case.kind == "replay" and case.L == 1:
            return dict(status="fail", reason="injected", max_abs_err=1.0, rel_l2_err=1.0)
        return real_gate(case, data)

    def fake_time(fn, method, *, rep, warmup):
        fn()
        return Timing(method, 40.0, 36.0, 44.0, rep)

    monkeypatch.setattr(rp, "_gate", gate)
    monkeypatch.setattr(timing, "time_fn", fake_time)
    monkeypatch.setattr(rp, "method_available", lambda m, d: (True, ""))
    params = _params(output_root=str(tmp_path), replay_L=[1, 2], replay_batch_sizes=[2],
                     replay_state_dtype=["bfloat16"], replay_accept=[1, 3],
                     replay_calls=2, replay_method="graph", replay_repetitions=1, warmup=0,
                     replay_config="BV16-w1-s1-t1", **TINY)
    run = dx.start(params)
    res = rp.run_replay(run, copy_bw=1e9)
    gate_df, times = res["gate"], res["times"]
    assert len(gate_df) == 6                      # standard, 2 L, spec, 2 L (bf16 state)
    failed = gate_df[gate_df.status != "pass"]
    assert list(failed.label.unique()) == ["replay L=1"] and set(failed.reason) == {"injected"}
    assert not (times.label == "replay L=1").any()
    assert set(times.label) == {"standard", "replay L=2", "standard T=4 +states",
                                "replay T=4 L=1", "replay T=4 L=2"}
    t = times.set_index(["label", "state_dtype"])
    assert t.loc[("standard", "bfloat16"), "us_per_token"] == pytest.approx(20.0)  # 2 calls
    assert t.loc[("replay T=4 L=2", "bfloat16"), "us_per_token"] == pytest.approx(10.0)  # 4
    assert (times.floor_us > 0).all() and (times.frac_of_floor > 0).all()
    assert "Replay gate" in rp.replay_markdown(times, gate_df, None)
    final = run.finish()
    assert (final / "replay_times.csv").exists() and (final / "replay_gate.csv").exists()


def test_replay_drift_reports_outputs_and_the_state_written_back(tmp_path):
    params = _params(output_root=str(tmp_path), drift_steps=[1, 5], drift_batch=2,
                     replay_L=[2], replay_calls=4, replay_accept=[2],
                     replay_state_dtype=["float32"], replay_config="BV16-w1-s1-t1", **TINY)
    run = dx.start(params)
    drift = rp.run_replay_drift(run)
    assert set(drift.label) == {"standard", "replay L=2"} and set(drift.step) == {1, 5}
    d = drift.set_index(["label", "what", "step"]).max_abs_err
    for label in ("standard", "replay L=2"):       # fp32: the bf16 outputs' rounding only
        assert d[(label, "output", 5)] < 2e-3 and d[(label, "state written back", 5)] < 1e-5
    assert d[("replay L=2", "output", 5)] < 1.5 * d[("standard", "output", 5)]
    tab = rp.replay_drift_table(drift)
    assert set(tab.columns) == {"output", "state written back"}
    run.finish()


def _times(gpu="NVIDIA H200", method="graph"):
    rows = []
    for dname, scale in (("float32", 1.0), ("bfloat16", 0.55)):
        for B in (1, 64, 512):
            std = (2 + B * 0.25) * scale
            cases = [("standard", 0, 1, std), ("standard_spec", 0, 4, std * 1.8)]
            cases += [("replay", L, 1, std * (0.55 + 0.5 / L)) for L in (1, 4, 8)]
            cases += [("replay_spec", L, 4, std * (0.8 + 0.5 / L)) for L in (4, 8)]
            for kind, L, T, us in cases:
                floor = us * 0.8
                rows.append(dict(kind=kind, label=rp._label(kind, L), L=L, T=T, B=B,
                                 state_dtype=dname, config="c", method=method,
                                 us_per_token=us, p20_us=us * 0.95, p80_us=us * 1.05,
                                 bytes_per_token=floor * 4e3, floor_us=floor,
                                 frac_of_floor=0.8, tokens_per_sample=16, n=30, gpu=gpu))
    return pd.DataFrame(rows, columns=rp.TIME_COLUMNS)


def _drift():
    rows = []
    for label, L, f in (("standard", 0, 1e-5), ("replay L=8", 8, 5e-6)):
        for step in (1, 100, 1000):
            for what in ("output", "state written back"):
                rows.append(dict(label=label, L=L, state_dtype="float32", step=step, what=what,
                                 max_abs_err=f * step ** 0.5, rel_l2_err=f, gpu="NVIDIA H200"))
    return pd.DataFrame(rows, columns=rp.DRIFT_COLUMNS)


def test_replay_figures_tables_and_conclusion(tmp_path):
    from test_figures import audit_figure
    times, drift = _times(), _drift()
    for name, fig in dict(t1=rp.plot_replay_times(times),
                          spec=rp.plot_replay_times(times, spec=True, accept=[1, 3, 2, 2]),
                          nbytes=rp.plot_replay_bytes(times),
                          drift=rp.plot_replay_drift(drift)).items():
        assert fig is not None, name
        assert not audit_figure(fig, name), audit_figure(fig, name)
        assert "NVIDIA H200" in fig.get_suptitle(), name
        assert fig.get_size_inches()[0] <= 11.5, name
        if name != "drift":
            assert "graph" in fig.get_suptitle(), name
        fig.savefig(tmp_path / f"{name}.png")
    assert rp.plot_replay_times(times.iloc[:0]) is None and rp.plot_replay_drift(None) is None
    tab = rp.replay_table(times)
    assert "replay L=8" in tab.columns and ("float32", 64) in tab.index
    md = dx.conclusion_markdown(dict(times=pd.DataFrame(columns=dx.TIMES_COLUMNS),
                                     replay_times=times, replay_drift=drift))
    # fp32 B=64: best replay L=8, (0.55 + 0.0625) = 0.6125 x the standard: met (<= 0.65)
    assert "float32, B=64, T=1: best replay L=8" in md and "(0.61×; target ≤ 0.65× → met" in md
    assert "float32, B=1, T=1: best replay L=8" in md and "target ≤ 1.0× → met" in md
    # spec: best L=8, 0.8625 / 1.8 = 0.48 of the standard T=4 +states call: met (<= 0.6)
    assert "float32, B=512, T=4 spec: best replay T=4 L=8" in md and "(0.48×" in md
    assert "Replay drift after 1000 steps" in md and "standard 3.16e-04, replay 1.58e-04" in md
    cpu = rp.replay_markdown(times.assign(method="cpu_wall"), None, None)
    assert "no verdict" in cpu and "→ met" not in cpu and "own floor" not in cpu
