"""A prefill call's signature is checked and planned once (kernels.prefill.pipeline
.call_signature): a repeat skips the checks and the plan, yet every bad input is still
rejected, ``cu_seqlens``' values are still checked per call (on the host where the call
checks them there, else by the device guard), and a changed shape, dtype, device, stride or
option never reuses a stale plan."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from kernels.checks import check_outputs
from kernels.prefill import gdn_prefill, pipeline
from kernels.prefill import plan as plan_mod
from kernels.reference import prefill_reference
from kernels.spec import GDNShape, make_prefill_inputs

SHAPE = GDNShape(1, 2, 16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # as tests/decode/test_decode.py


@pytest.fixture(autouse=True)
def _fresh():
    plan_mod.clear_plan_cache()
    yield
    plan_mod.clear_plan_cache()


def _inputs(lens=(4, 2), seed=0, **kw):
    return make_prefill_inputs(list(lens), SHAPE, seed=seed, device=DEVICE, **kw)


def _cu(values, dtype=torch.int64):
    """``cu_seqlens`` of these values on the tests' device."""
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _matches(inp, out):
    res = check_outputs(out, prefill_reference(**inp))
    assert res.ok, res.reason


@pytest.mark.parametrize("lens", [(4, 2), (70, 60)], ids=["recurrent", "one-launch"])
def test_repeat_skips_checks_and_plan_and_computes_each_call(lens):
    """Same signature, other values (``cu_seqlens`` too, same count): fresh outputs, right
    results; the checks and the plan ran once."""
    T = sum(lens)
    with mock.patch.object(pipeline, "validate_prefill_inputs",
                           wraps=pipeline.validate_prefill_inputs) as checks, \
            mock.patch.object(pipeline, "_shape_plan", wraps=pipeline._shape_plan) as plans:
        outs = []
        for seed, split in ((0, lens[0]), (1, lens[1]), (2, T // 2)):
            inp = _inputs(lens, seed=seed)
            inp["cu_seqlens"] = _cu([0, split, T], inp["cu_seqlens"].dtype)
            outs.append(gdn_prefill(**inp))
            _matches(inp, outs[-1])
    assert (checks.call_count, plans.call_count) == (1, 1)
    assert outs[0][0].data_ptr() != outs[1][0].data_ptr()


def _bad_cases():
    yield "q-dtype", lambda x: x.update(q=x["q"].float()), TypeError
    yield "k-shape", lambda x: x.update(k=x["k"][:, :, :8].contiguous()), ValueError
    yield "v-strided", lambda x: x.update(v=torch.stack([x["v"], x["v"]], -1)[..., 0]), \
        ValueError
    yield "state-dtype", lambda x: x.update(state=x["state"].double()), TypeError
    yield "A_log-device", lambda x: x.update(A_log=x["A_log"].to("meta")), ValueError
    yield "a-shape", lambda x: x.update(a=x["a"][:1]), ValueError
    yield "cu-dtype", lambda x: x.update(cu_seqlens=x["cu_seqlens"].float()), TypeError
    yield "cu-start", lambda x: x.update(cu_seqlens=_cu([1, 4, 6])), ValueError
    yield "cu-decreasing", lambda x: x.update(cu_seqlens=_cu([0, 5, 4])), ValueError
    yield "cu-end", lambda x: x.update(cu_seqlens=_cu([0, 4, 5])), ValueError
    yield "scale-nan", lambda x: x.update(scale=float("nan")), ValueError
    yield "output-dtype", lambda x: x.update(output=torch.empty(6, 2, 16, device=DEVICE)), TypeError
    yield "cp-recurrent", lambda x: x.update(variant="recurrent", cp=True), ValueError


@pytest.mark.parametrize("name, change, error", list(_bad_cases()),
                         ids=[c[0] for c in _bad_cases()])
def test_bad_inputs_are_rejected_after_a_good_signature(name, change, error):
    good = _inputs()
    good["cu_seqlens"] = good["cu_seqlens"].to(torch.int64)
    # check_values=True: the host checks of cu_seqlens' values (on by default only off CUDA)
    gdn_prefill(**good, check_values=True)
    gdn_prefill(**good, variant="recurrent", check_values=True)
    bad = dict(good)
    change(bad)
    with pytest.raises(error):
        gdn_prefill(**bad, check_values=True)


def test_unchecked_values_stay_guarded_on_the_device():
    """``check_values=False`` (the CUDA default): a repeat with bad ``cu_seqlens`` values is
    not checked on the host, and the device guard still turns every output to NaN."""
    good = _inputs()
    _matches(good, gdn_prefill(**good, check_values=False))
    bad = dict(good, cu_seqlens=_cu([0, 5, 4], good["cu_seqlens"].dtype))
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with mock.patch.object(pipeline, "validate_prefill_inputs",
                           wraps=pipeline.validate_prefill_inputs) as checks:
        o, ht = gdn_prefill(**bad, check_values=False, status=status)
        o2, _ = gdn_prefill(**bad, check_values=False)
    assert checks.call_count == 1   # the status tensor is a new signature; the repeat isn't
    assert torch.isnan(o.float()).all() and torch.isnan(ht).all()
    assert torch.isnan(o2.float()).all() and int(status) != 0


@pytest.mark.parametrize("change", [
    lambda x: x.update(cu_seqlens=x["cu_seqlens"].to(torch.int32)),
    lambda x: x.update(state=None),
    lambda x: x.update(scale=0.5),
], ids=["cu-int32", "no-state", "scale"])
def test_changed_signature_is_planned_for_itself(change):
    inp = _inputs()
    _matches(inp, gdn_prefill(**inp))
    other = dict(inp)
    change(other)
    _matches(other, gdn_prefill(**other))
    assert len(plan_mod.CALLS) == 2


@pytest.mark.parametrize("lens, kw, path, launches", [
    ((4, 2), {}, "recurrent", 1), ((70, 60), {}, "walk", 2), ((300,), {"cp": True}, "cp", 3)],
    ids=["recurrent", "walk", "cp"])
def test_recorded_launches_equal_the_normal_path_bit_for_bit(lens, kw, path, launches):
    """The launches recorded on a signature's first call, replayed on calls with other
    tensors and ``cu_seqlens`` values of the signature (a fresh workspace each), give the
    bits of the normal path (``prefill_fused``, which never records)."""
    T = sum(lens)
    for seed in range(3):
        inp = _inputs(lens, seed=seed)
        if len(lens) == 2:
            split = (lens[0], lens[1], T // 2)[seed]
            inp["cu_seqlens"] = _cu([0, split, T], inp["cu_seqlens"].dtype)
        out = gdn_prefill(**inp, **kw)
        ref = pipeline.prefill_fused(**inp, **kw)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    (c,) = plan_mod.CALLS.values()
    assert (c.plan.path if c.plan else "recurrent") == path
    assert len(c.launches) == launches and c.tries == pipeline.RECORD_TRIES - 1


def test_a_call_launching_outside_the_list_is_never_replayed(monkeypatch):
    """A launch marked unrecordable on the way (the Gluon walk's TMA descriptors): no list,
    every call takes the normal path and computes its results."""
    from kernels import launch
    real = pipeline.fused_launches

    def marked(*a, **k):
        launch.not_recordable()
        return real(*a, **k)
    monkeypatch.setattr(pipeline, "fused_launches", marked)
    for seed in range(2):
        inp = _inputs((70, 60), seed=seed)
        _matches(inp, gdn_prefill(**inp))
    (c,) = plan_mod.CALLS.values()
    assert c.launches is None


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[6], [100, 28], [2048], [8192], [16384]],
                         ids=["T6", "100+28", "T2048", "T8192", "T16384"])
def test_gpu_replayed_launches_give_the_plain_bits(lens, monkeypatch, cuda_device):
    """On CUDA the recorded list replays Triton's C launches with this call's addresses:
    calls with other tensors and values of the signature give the bits of plain
    ``kernel[grid](...)`` launches (``GDN_FAST_LAUNCH=0``), on every path; every path but
    the Gluon walk is recorded."""
    from kernels.spec import CONTEST
    outs = []
    for seed in range(3):
        inp = make_prefill_inputs(lens, CONTEST, seed=seed, device=cuda_device)
        outs.append((inp, gdn_prefill(**inp)))
    (c,) = plan_mod.CALLS.values()
    if c.plan is None or not c.plan.phase_c_gluon:   # (the Gluon walk is not recorded)
        assert c.launches is not None
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    for inp, out in outs:
        plain = pipeline.prefill_fused(**inp)
        assert torch.equal(out[0], plain[0]) and torch.equal(out[1], plain[1])
