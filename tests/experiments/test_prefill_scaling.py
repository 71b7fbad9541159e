"""Notebook 04's analysis on synthetic tables: ratios against the fastest peer, the target,
growth with length, the figures and the conclusion (the smoke run covers the flow)."""
import numpy as np
import pandas as pd
import pytest

from kernels.experiments import prefill_scaling as xs
from kernels.report import ratio_table
from kernels.stress_inputs import GATE_SETS


def _times():
    rows = []
    for impl, f in (("ours", 1.0), ("flashqla", 0.5), ("fla (triton)", 2.0)):
        for lens, T, N, base in (("8192", 8192, 1, 100.0), ("131072", 131072, 1, 1400.0),
                                 ("4x8192", 32768, 4, 280.0)):
            t = base * (f if lens == "131072" else 1.2 if impl == "flashqla" else f)
            rows.append(dict(impl=impl, lens=lens, T=T, N=N, method="graph", median_us=t,
                             p20_us=t, p80_us=t, n=10, kernel="", role="", gpu="G", label=impl))
    rows.append(dict(impl="ours", lens="8192", T=8192, N=1, method="kernel", median_us=40.0,
                     p20_us=40.0, p80_us=40.0, n=3, kernel="intra_chunk_kernel",
                     role="intra-chunk", gpu="G", label="ours"))
    return pd.DataFrame(rows)


def test_ratio_table_uses_the_fastest_peer_and_ignores_kernel_rows():
    r = ratio_table(_times()).set_index("lens")
    assert r.loc["131072", "fastest peer"] == "flashqla"
    assert r.loc["131072", "ours / fastest peer"] == pytest.approx(1400 / 700)
    assert not r.loc["131072", "target met"]
    assert r.loc["8192", "ours / fastest peer"] == pytest.approx(100 / 120)
    assert bool(r.loc["8192", "target met"])
    assert (r.method == "graph").all() and len(r) == 3


def test_conclusion_is_computed_from_the_tables():
    gate = pd.DataFrame([dict(label=i, lens=l, status="pass", gpu="G")
                         for i in ("ours", "flashqla") for l in ("8192", "131072")])
    roof = pd.DataFrame([dict(lens="8192", role="walk", measured_us=60.0, bytes_floor_us=20.0,
                              flops_floor_us=10.0, roof_ratio=3.0)])
    stress = pd.DataFrame([dict(label="ours", status="fail"), dict(label="ours", status="pass")])
    text = xs.conclusion_markdown(dict(gate=gate, times=_times(), roofline=roof, stress=stress))
    assert "met at 2 of 3 shapes" in text and "worst 131072" in text and "2.00×" in text
    assert "ours 14.00× for 16× the tokens" in text
    assert "8192: walk 60.0 µs" in text and "3.00× above it" in text
    assert "ours 1/2" in text
    assert "Growth target" not in text            # no length beyond 131,072 here
    t = _times()
    long = t[(t.lens == "131072")].assign(lens="1048576", T=1 << 20)
    long["median_us"] = long.median_us * np.where(long.impl == "ours", 8.0, 9.0)
    text = xs.conclusion_markdown(dict(gate=gate, times=pd.concat([t, long]), roofline=roof,
                                       stress=stress))
    assert "**Growth target** (ours from 131,072 to 1,048,576 tokens" in text
    assert "8.00× for 8× the tokens → met" in text


def test_figures():
    t = _times()
    assert xs.plot_time_vs_T(t) is not None and xs.plot_time_vs_T(t.iloc[0:0]) is None
    k = pd.DataFrame(dict(k=[0, 1], kernel=["intra_chunk_kernel", "state_walk_kernel"],
                          role=["intra-chunk", "walk"], median_us=[10.0, 30.0],
                          span_us=[50.0, 50.0], lens=["8192"] * 2, gpu="G"))
    assert xs.plot_kernel_breakdown(k) is not None
    roof = k.assign(measured_us=k.median_us, bytes_floor_us=5.0, flops_floor_us=2.0)
    assert xs.plot_roofline(roof) is not None
    assert xs.plot_kernel_breakdown(pd.DataFrame()) is None and xs.plot_roofline(None) is None


def test_labels_never_say_bare_fla():
    assert xs.label_of("fla") == "fla (triton)" and xs.label_of("ours") == "ours"
    with pytest.raises(ValueError, match="unknown impls"):
        xs.resolve_impls(dict(impls=["ours", "nope"]))


def test_ncu_summary_drops_rows_without_values():
    df = pd.DataFrame(dict(launch=0, kernel="k", metric=["Duration", "x"],
                           value=[1.0, np.nan], unit=["ns", ""], section="SOL"))
    assert list(xs.ncu_summary(df).metric) == ["Duration"]
    assert xs.ncu_summary(pd.DataFrame()).empty


def test_split_costs_conclusion_and_figure():
    split = pd.DataFrame([dict(lens="131072", T=131072, N=1, segments=n, seg_chunks=2048 // n,
                               path="long CP", default=(n == 16), status="pass",
                               max_abs_err=1e-3, method="graph", median_us=us, p20_us=us,
                               p80_us=us, gpu="G")
                          for n, us in ((8, 1100.0), (16, 934.0), (32, 1000.0))])
    gate = pd.DataFrame([dict(label="ours", lens="131072", status="pass", gpu="G")])
    text = xs.conclusion_markdown(dict(gate=gate, times=_times(), split=split))
    assert "**Split cost** (graph): 131072: fastest at 16 segments (934 µs)" in text
    assert "the rule's 16 segments" in text and "1.00× of the fastest" in text
    assert xs.plot_split_costs(split) is not None
    assert xs.plot_split_costs(split.assign(median_us=float("nan"))) is None


def test_gate_dependence_table_conclusion_and_figure():
    rows = []
    for gates, ours, qla, pa in (("generator", 940.0, 750.0, 75.0),
                                 ("one long-memory head", 1150.0, 752.0, 290.0),
                                 ("every head long memory", 1420.0, 751.0, 560.0)):
        base = dict(lens="131072", T=131072, N=1, gates=gates, status="pass", max_abs_err=1e-3,
                    p20_us=0.0, p80_us=0.0, gpu="G")
        rows += [dict(base, impl="ours", method="graph", median_us=ours, kernel="", role=""),
                 dict(base, impl="flashqla", method="graph", median_us=qla, kernel="", role=""),
                 dict(base, impl="ours", method="kernel", median_us=pa,
                      kernel="state_walk_t_kernel", role="CP phase A"),
                 dict(base, impl="ours", method="kernel", median_us=480.0,
                      kernel="state_walk_t_kernel", role="CP phase C")]
    df = pd.DataFrame(rows)
    tab = xs.gate_dependence_table(df)
    assert list(tab.columns) == list(GATE_SETS)
    assert tab.loc[("131072", "ours"), "one long-memory head"] == 1150.0
    assert tab.loc[("131072", "ours: CP phase A"), "every head long memory"] == 560.0
    gate = pd.DataFrame([dict(label="ours", lens="131072", status="pass", gpu="G")])
    text = xs.conclusion_markdown(dict(gate=gate, times=_times(), gates=df))
    assert ("**Gate dependence** (generator / one long-memory head / every head long memory): "
            "131072: ours 940 µs / 1150 µs / 1420 µs; flashqla 750 µs / 752 µs / 751 µs; "
            "ours: CP phase A 75.0 µs / 290 µs / 560 µs.") in text
    assert xs.plot_gate_dependence(df) is not None
    assert xs.plot_gate_dependence(df.iloc[0:0]) is None
    assert xs.gate_dependence_table(df.assign(median_us=float("nan"))).empty


def test_gate_dependence_names_an_untimed_cell():
    base = dict(lens="200", T=200, N=1, impl="ours", method="cpu_wall", p20_us=0.0, p80_us=0.0,
                kernel="", role="", gpu="G", max_abs_err=1e-3)
    df = pd.DataFrame([dict(base, gates="generator", status="pass", median_us=10.0),
                       dict(base, gates="every head long memory", status="fail",
                            median_us=float("nan"))])
    text = xs.conclusion_markdown(dict(gate=pd.DataFrame([dict(label="ours", lens="200",
                                                               status="pass", gpu="G")]),
                                       times=_times(), gates=df))
    assert "200: ours 10.0 µs / not timed (gate fail)." in text
    assert xs.plot_gate_dependence(df) is not None


def test_ratio_panel_shows_the_target_when_ours_is_orders_slower():
    """On the CPU interpreter ours is ~1,000x a python solution: the ours / fastest peer
    panel goes logarithmic, so the 1 and 0.9 lines stay apart and visible."""
    from test_figures import audit_figure

    t = _times()
    t.loc[t.label == "ours", "median_us"] *= 1000
    fig = xs.plot_time_vs_T(t)
    assert fig.axes[1].get_yscale() == "log"
    assert audit_figure(fig, "time_vs_T") == []
    assert xs.plot_time_vs_T(_times()).axes[1].get_yscale() == "linear"


def _peer_kernels():
    """Made-up per-kernel rows of ours and two peers at three shapes (peer_kernels.csv)."""
    kernels = {"ours": [("intra_chunk_kernel", "intra-chunk"), ("state_walk_a", "CP phase A"),
                        ("segment_combine", "CP phase B"), ("state_walk_c", "CP phase C")],
               "flashqla": [("main_kernel", "main_kernel"), ("main_kernel_1", "main_kernel_1")],
               "flashinfer": [("void flashinfer::gdn::prefill<128, true>(P)",
                               "flashinfer::gdn::prefill")]}
    rows = []
    for lens, scale in (("32768", 1.0), ("131072", 4.0), ("1048576", 32.0)):
        for impl, ks in kernels.items():
            for k, (kernel, role) in enumerate(ks):
                t = scale * (20.0 + 10 * k) * (0.8 if impl == "flashqla" else 1.0)
                rows.append(dict(impl=impl, label=impl, lens=lens, T=int(lens), N=1, k=k,
                                 kernel=kernel, role=role, median_us=t, p20_us=t * 0.95,
                                 p80_us=t * 1.05, calls=7, span_us=t * len(ks) * 1.1,
                                 gpu="NVIDIA H100"))
    return pd.DataFrame(rows, columns=xs.PEER_KERNEL_COLUMNS)


def test_peer_kernel_figure_passes_the_audit():
    from kernels.experiments.common import finish_figure
    from tests.experiments.test_figures import audit_figure

    df = _peer_kernels()
    params = dict(num_q_heads=4, num_v_heads=8, head_dim=128, profile="full")
    fig = finish_figure(xs.plot_peer_kernels(df), params)
    assert audit_figure(fig, "peer_kernels", params) == []
    sup = fig._suptitle.get_text()
    assert "NVIDIA H100" in sup and "median of 7 calls" in sup and "HV=8 D=128" in sup
    assert len(fig.axes) == 3 and "µs" in fig.axes[0].get_xlabel()
    texts = [t.get_text().strip() for t in fig.axes[0].texts]
    assert "140 µs" in texts   # ours at 32768: 20 + 30 + 40 + 50
    assert xs.plot_peer_kernels(df.iloc[0:0]) is None


def test_short_kernel_name():
    assert xs.short_kernel_name("void flashinfer::gdn::prefill<128, true>(P)") == \
        "flashinfer::gdn::prefill"
    assert xs.short_kernel_name("cutlass::device_kernel<flash::Fwd<a, b<c>>, 3>(x)") == \
        "flash::Fwd"
    assert xs.short_kernel_name("chunk_fwd_kernel_o") == "chunk_fwd_kernel_o"
    cute = ("kernel_cutlass_kernel_flashinfergdn_kernelsdelta_rule_dsldelta_rule_cp_sm90"
            "CPDeltaRulePrefillSm90_object_at__tensorptrf32gmemalign16o1_CopyAtom_0")
    assert xs.short_kernel_name(cute) == "CPDeltaRulePrefillSm90"


def test_peer_kernel_segments_merge_torch_ops():
    """A peer's consecutive PyTorch elementwise kernels are one segment; other kernels keep
    their order and durations; nothing is dropped."""
    rows = [("p", 0, "void at::native::vectorized_elementwise_kernel<4, X>(int)", 1.0),
            ("p", 1, "void at::native::elementwise_kernel<128, 2, Y>(int)", 2.0),
            ("p", 2, "solve_kernel", 10.0),
            ("p", 3, "void at::native::vectorized_elementwise_kernel<8, F>(int)", 4.0),
            ("p", 4, "walk_kernel", 20.0),
            ("q", 0, "walk_kernel", 5.0)]
    df = pd.DataFrame([dict(lens="64", T=64, label=l, k=k, role=r, kernel=r, median_us=u)
                       for l, k, r, u in rows])
    seg = xs.peer_kernel_segments(df)
    p = seg[seg.label == "p"]
    assert p.role.tolist() == [xs.TORCH_OPS, "solve_kernel", xs.TORCH_OPS, "walk_kernel"]
    assert p.median_us.tolist() == [3.0, 10.0, 4.0, 20.0]
    assert seg.median_us.sum() == df.median_us.sum()


class _FakeRun:
    """What run_peer_anatomy reads of a Run, on the CPU, pretending to be on a GPU."""

    def __init__(self, impls, on_gpu=True):
        from kernels.spec import GDNShape

        self.params = dict(peer_anatomy_shapes=["5+3"], kernel_calls=3, seed=1,
                           with_state=True)
        self.state = dict(impls=impls, inputs={}, refs={}, shape=GDNShape(2, 4, 16),
                          solution_labels=set())
        self.on_gpu, self.device, self.gpu = on_gpu, "cpu", "fake GPU"
        self.skipped, self.csvs = [], {}

    def skip(self, what, reason):
        self.skipped.append(dict(what=what, reason=reason))

    def write_csv(self, df, name):
        self.csvs[name] = df

    def worker_result(self, *a, **kw):
        from kernels.experiments.common import Run

        return Run.worker_result(self, *a, **kw)


def test_run_peer_anatomy_gates_then_records_every_implementation(monkeypatch):
    from kernels import peers_worker
    from kernels.bench import anatomy
    from kernels.peers import Unavailable
    from kernels.reference import prefill_reference
    from tests import fake_worker_peers as fake

    monkeypatch.setattr(anatomy, "kernel_times", fake._fake_kernel_times)
    with peers_worker.PeerWorker("tests.fake_worker_peers:fake_peers_with_kernel_times",
                                 site="", timeout_s=120) as w:
        run = _FakeRun(dict(ours=prefill_reference, flashqla=peers_worker.RemotePeer(w, "good", True),
                            fla=fake._bad, flashinfer=Unavailable("flashinfer", "not installed"),
                            fla_flashqla=peers_worker.RemotePeer(w, "bad", True)))
        df = xs.run_peer_anatomy(run)
    assert list(df.columns) == xs.PEER_KERNEL_COLUMNS
    assert set(df.impl) == {"ours", "flashqla"} and len(df) == 4
    assert (df.lens == "5+3").all() and (df["T"] == 8).all() and (df.N == 2).all()
    fq = df[df.impl == "flashqla"]
    assert list(fq.role) == ["chunk_fwd", "state_walk"]   # a peer's role: its short name
    assert list(fq.median_us) == [10.0, 20.0] and (fq.calls == 3).all()
    assert "peer_kernels" in run.csvs
    why = {s["what"]: s["reason"] for s in run.skipped}
    assert "not installed" in why["per-kernel times: flashinfer"]
    assert why["per-kernel times: fla (triton) lens=5+3"].startswith("gate fail")
    assert "gate fail" in why["per-kernel times: fla (flashqla backend) lens=5+3"]


def test_run_peer_anatomy_on_the_cpu_skips_with_the_reason():
    run = _FakeRun(dict(ours=lambda **x: None), on_gpu=False)
    assert xs.run_peer_anatomy(run).empty
    assert "need a CUDA GPU" in run.skipped[0]["reason"]
    run.params["peer_anatomy_shapes"] = []
    assert xs.run_peer_anatomy(run).empty and len(run.skipped) == 1
