"""Notebook 06's pieces that do not need a model run (kernels/experiments/in_the_model.py):
the GDN share's attribution of kernels to the GDN call by record_function range (synthetic
traces), the contest-layout inputs built from a captured call, the share figure and the
conclusion's drop-in line. The whole notebook runs in tests/notebooks/test_smoke.py."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from kernels.bench.anatomy import range_share
from kernels.experiments import in_the_model as xp


def _range(name, ts, dur):
    return dict(ph="X", cat="user_annotation", name=name, ts=ts, dur=dur, pid=1, tid=1)


def _launch(ts, corr):
    return dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=ts, dur=1, pid=1,
                tid=1, args=dict(correlation=corr))


def _kernel(name, ts, dur, corr):
    return dict(ph="X", cat="kernel", name=name, ts=ts, dur=dur, pid=0, tid=7,
                args=dict(correlation=corr, stream=7, device=0))


def _trace():
    """Two block calls; the GDN range inside each launches two kernels; one launch before
    the first block (a warm-up call outside the ranges) and its kernel are not counted."""
    ev = [_launch(-50, 90), _kernel("warm", -40, 1000, 90)]
    for c, t0 in enumerate((0, 1000)):
        base = 10 * c
        ev += [_range(xp.BLOCK_RANGE, t0, 500), _range(xp.GDN_RANGE, t0 + 100, 100),
               _launch(t0 + 10, base + 1), _launch(t0 + 120, base + 2),
               _launch(t0 + 150, base + 3), _launch(t0 + 300, base + 4),
               _kernel("rms_norm", t0 + 20, 5, base + 1),
               _kernel("intra_chunk_kernel", t0 + 130, 40, base + 2),
               _kernel("state_walk", t0 + 200, 20, base + 3),
               _kernel("moe_gemm", t0 + 310, 100, base + 4)]
    return ev


def test_kernels_attributed_to_the_gdn_call_by_range():
    share, rows = range_share(_trace(), calls=2, cuda=True, call_range=xp.BLOCK_RANGE,
                              part_range=xp.GDN_RANGE)
    assert share["gdn_us"] == pytest.approx(60.0)
    assert share["rest_us"] == pytest.approx(105.0)
    assert share["share"] == pytest.approx(60.0 / 165.0)
    assert (share["gdn_kernels"], share["rest_kernels"]) == (2, 2)
    by = {r["kernel"]: r for r in rows}
    assert set(by) == {"rms_norm", "intra_chunk_kernel", "state_walk", "moe_gemm"}
    assert by["intra_chunk_kernel"]["group"] == "gdn" and by["moe_gemm"]["group"] == "rest"
    assert by["moe_gemm"]["us_per_call"] == pytest.approx(100.0)
    assert by["state_walk"]["launches_per_call"] == pytest.approx(1.0)


def test_host_time_share_without_cuda_counts_only_ranges_inside_blocks():
    ev = _trace() + [_range(xp.GDN_RANGE, -30, 1000)]     # a GDN range outside the blocks
    share, rows = range_share(ev, calls=2, cuda=False, call_range=xp.BLOCK_RANGE,
                              part_range=xp.GDN_RANGE)
    assert rows == []
    assert share["gdn_us"] == pytest.approx(100.0) and share["rest_us"] == pytest.approx(400.0)
    assert "host time" in share["source"]


def test_attribution_without_block_range_or_kernels_raises():
    with pytest.raises(ValueError, match="no 'gdn06::block' range"):
        range_share([_range(xp.GDN_RANGE, 0, 10)], calls=1, cuda=True,
                    call_range=xp.BLOCK_RANGE, part_range=xp.GDN_RANGE)
    with pytest.raises(ValueError, match="no GPU kernel"):
        range_share([_range(xp.BLOCK_RANGE, 0, 10)], calls=1, cuda=True,
                    call_range=xp.BLOCK_RANGE, part_range=xp.GDN_RANGE)


def _run(HQ=2, HV=4):
    gen = torch.Generator().manual_seed(0)
    layer = SimpleNamespace(num_k_heads=HQ, A_log=torch.rand(HV, generator=gen).bfloat16(),
                            dt_bias=torch.rand(HV, generator=gen).bfloat16())
    return SimpleNamespace(state=dict(layer=layer)), gen


def test_contest_inputs_undo_the_repeat_and_normalise():
    """Prefill: q/k back at the key heads (repeat_interleave undone), L2-normalised,
    packed; gates' raw inputs and f32 A_log/dt_bias; no state."""
    run, gen = _run()
    T, D = 5, 16
    q = torch.randn(1, T, 2, D, generator=gen).bfloat16()
    k = torch.randn(1, T, 2, D, generator=gen).bfloat16()
    v = torch.randn(1, T, 4, D, generator=gen).bfloat16()
    b, a = (torch.randn(1, T, 4, generator=gen).bfloat16() for _ in range(2))
    seen = dict(args=(q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v),
                kwargs=dict(initial_state=None, use_qk_l2norm_in_kernel=True), ba=(b, a))
    ci = xp.contest_inputs(run, seen)
    assert ci["q"].shape == (T, 2, D) and ci["v"].shape == (T, 4, D)
    torch.testing.assert_close(ci["q"].float(), torch.nn.functional.normalize(
        q[0].float(), dim=-1), atol=4e-3, rtol=8e-3)
    assert torch.equal(ci["a"], a[0]) and torch.equal(ci["b"], b[0])
    assert ci["A_log"].dtype == torch.float32 and ci["state"] is None
    assert ci["cu_seqlens"].tolist() == [0, T]


def test_contest_inputs_decode_state_k_last():
    run, gen = _run()
    B, D = 3, 16
    q = torch.randn(B, 1, 4, D, generator=gen).bfloat16()
    h0 = torch.randn(B, 4, D, D, generator=gen)                 # FLA's [K, V]
    seen = dict(args=(q, q, q), kwargs=dict(initial_state=h0),
                ba=(q[..., 0], q[..., 1]))
    ci = xp.contest_inputs(run, seen)
    assert ci["q"].shape == (B, 1, 2, D) and "cu_seqlens" not in ci
    assert ci["state"].is_contiguous() and torch.equal(ci["state"], h0.transpose(-1, -2))


def test_share_figure_and_conclusion_line():
    run = SimpleNamespace(gpu="test-gpu", params=dict(num_k_heads=4, num_v_heads=8,
                                                      head_dim=128, num_experts=512,
                                                      num_experts_per_tok=10,
                                                      experts_implementation="grouped_mm"))
    share = pd.DataFrame([dict(impl=i, part=pt, T=t, B=b, source="GPU kernels", gdn_us=g,
                               rest_us=r, share=g / (g + r), gdn_kernels=1, rest_kernels=2,
                               calls=3)
                          for i, pt, t, b, g, r in (("ours", "prefill", 512, 1, 10.0, 90.0),
                                                    ("fla", "prefill", 512, 1, 20.0, 90.0),
                                                    ("ours", "decode step", 1, 4, 5.0, 15.0))],
                         columns=xp.SHARE_COLUMNS)
    fig = xp.plot_share(run, share)
    assert len(fig.axes) == 2 and "GDN call's share" in fig._suptitle.get_text()
    assert "MoE 512x10 (grouped_mm)" in fig._suptitle.get_text()   # the experts named
    assert len(fig.axes[0].patches) == 4             # 2 bars x (GDN, rest)
    compare = pd.DataFrame([dict(part="prefill", T=512, B=1, method="graph", dropin_us=150.0,
                                 dropin_contest_layout_us=106.0, contest_us=100.0, ratio=1.06,
                                 ratio_captured=1.5),
                            dict(part="decode step", T=1, B=4, method="graph", dropin_us=11.0,
                                 dropin_contest_layout_us=10.0, contest_us=10.0, ratio=1.0,
                                 ratio_captured=1.1)],
                           columns=xp.COMPARE_COLUMNS)
    empty = pd.DataFrame(columns=xp.TIMES_COLUMNS)
    text = xp.conclusion_markdown(dict(
        gate=pd.DataFrame(columns=xp.GATE_COLUMNS), prefill=empty, decode=empty, share=share,
        dropin_gate=pd.DataFrame(columns=xp.COMPARE_GATE_COLUMNS), compare=compare))
    assert "1.00x to 1.06x" in text and "1 of 2 points over the 1.05x target" in text
    assert "with the model's own layout" in text and "1.10x to 1.50x" in text
    assert "ours, prefill T=512: 10 %" in text


def test_experts_implementation_is_checked_with_the_parameters():
    ns = {p.name: p.default for p in xp.PARAMS}
    assert xp.collect_params(ns)["experts_implementation"] == "grouped_mm"
    with pytest.raises(ValueError, match="experts_implementation must be one of"):
        xp.collect_params(dict(ns, experts_implementation="grouped"))
