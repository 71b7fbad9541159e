"""kernels.spec: shapes, seeded inputs, and input validation.

Every bad input must raise ``TypeError`` (not a tensor / wrong dtype) or
``ValueError`` (everything else) with a message that starts with the name of
the offending argument, and must leave every input unchanged. The validators
are also reached through the references, which must reject the same inputs.
"""
from __future__ import annotations

import copy
import functools
import math

import numpy as np

import pytest
import torch

from kernels import spec
from kernels.reference import decode_reference, prefill_reference
from kernels.spec import (CONTEST, DECODE_BATCH_SIZES, PREFILL_SHAPES, GDNShape,
                          decode_state_bytes, lens_label, make_decode_inputs, make_prefill_inputs,
                          parse_shape, resolve_scale, validate_decode_inputs,
                          validate_prefill_inputs)

SMALL = GDNShape(2, 4, 16)  # GVA group 2, cheap


# --------------------------------------------------------------------------- helpers

def _snapshot(inputs: dict) -> dict:
    return {n: (t.clone() if isinstance(t, torch.Tensor) else copy.deepcopy(t))
            for n, t in inputs.items()}


def _assert_unchanged(inputs: dict, before: dict):
    """Every input has the same metadata and (off the meta device) the same values."""
    for name, old in before.items():
        new = inputs[name]
        if isinstance(old, torch.Tensor):
            assert isinstance(new, torch.Tensor), name
            assert (new.shape, new.dtype, new.device) == (old.shape, old.dtype, old.device), name
            if old.device.type != "meta":
                assert torch.equal(new, old), f"{name} was modified"
        elif isinstance(old, np.ndarray):
            assert np.array_equal(new, old), name
        elif isinstance(old, float) and math.isnan(old):
            assert math.isnan(new), name
        else:
            assert new == old, name


def _noncontig(x: torch.Tensor) -> torch.Tensor:
    """Same shape, values and dtype as ``x`` but not contiguous."""
    y = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)[..., ::2]
    y.copy_(x)
    assert not y.is_contiguous() and y.shape == x.shape
    return y


def _set(**changes):
    """A mutation that replaces some inputs (values may be callables of the inputs)."""
    def apply(inp):
        for n, v in changes.items():
            inp[n] = v(inp) if callable(v) else v
    return apply


# --------------------------------------------------------------------------- bad decode inputs

BAD_DECODE = [
    pytest.param(_set(q=lambda i: i["q"].float()), TypeError, "q", id="q-float32"),
    pytest.param(_set(q=lambda i: i["q"].float().numpy()), TypeError, "q",
                 id="q-numpy"),
    pytest.param(_set(k=lambda i: i["k"].half()), TypeError, "k", id="k-float16"),
    pytest.param(_set(v=lambda i: i["v"].float()), TypeError, "v", id="v-float32"),
    pytest.param(_set(state=lambda i: i["state"].half()), TypeError, "state",
                 id="state-fp16"),
    pytest.param(_set(A_log=lambda i: i["A_log"].double()), TypeError, "A_log",
                 id="A_log-float64"),
    pytest.param(_set(dt_bias=lambda i: i["dt_bias"].bfloat16()), TypeError, "dt_bias",
                 id="dt_bias-bf16"),
    pytest.param(_set(a=lambda i: i["a"].float()), TypeError, "a", id="a-float32"),
    pytest.param(_set(b=lambda i: i["b"].float()), TypeError, "b", id="b-float32"),
    pytest.param(_set(scale="0.1"), TypeError, "scale", id="scale-str"),
    pytest.param(_set(q=lambda i: i["q"][:, 0]), ValueError, "q", id="q-3d"),
    pytest.param(_set(q=lambda i: i["q"][:, :0]), ValueError, "q", id="q-zero-tokens"),
    pytest.param(_set(q=lambda i: i["q"].repeat(1, 2, 1, 1)), ValueError, "k",
                 id="q-two-tokens-k-one"),
    pytest.param(_set(k=lambda i: i["k"][:1]), ValueError, "k", id="k-batch"),
    pytest.param(_set(k=lambda i: i["k"][:, :, :1]), ValueError, "k", id="k-heads"),
    pytest.param(_set(v=lambda i: i["v"][..., :8]), ValueError, "v", id="v-head-size"),
    pytest.param(_set(v=lambda i: i["v"][:, :, :3]), ValueError, "v", id="HV3-HQ2-not-divide"),
    pytest.param(_set(q=lambda i: i["q"][..., :12], k=lambda i: i["k"][..., :12],
                      v=lambda i: i["v"][..., :12]), ValueError, "q", id="D12-not-pow2"),
    pytest.param(_set(state=lambda i: i["state"][:1]), ValueError, "state", id="state-batch"),
    pytest.param(_set(state=lambda i: i["state"][:, :, :8]), ValueError, "state",
                 id="state-shape"),
    pytest.param(_set(A_log=lambda i: i["A_log"][:2]), ValueError, "A_log", id="A_log-shape"),
    pytest.param(_set(dt_bias=lambda i: i["dt_bias"][None]), ValueError, "dt_bias",
                 id="dt_bias-2d"),
    pytest.param(_set(a=lambda i: i["a"][:, 0]), ValueError, "a", id="a-2d"),
    pytest.param(_set(b=lambda i: i["b"][..., :2]), ValueError, "b", id="b-heads"),
    pytest.param(_set(k=lambda i: _noncontig(i["k"])), ValueError, "k", id="k-noncontiguous"),
    pytest.param(_set(state=lambda i: i["state"].transpose(-1, -2)), ValueError, "state",
                 id="state-k-first-view"),
    pytest.param(_set(state=lambda i: i["state"].to("meta")), ValueError, "state",
                 id="state-meta-device"),
    pytest.param(_set(A_log=lambda i: i["A_log"].to("meta")), ValueError, "A_log",
                 id="A_log-meta-device"),
    pytest.param(_set(scale=-1.0), ValueError, "scale", id="scale-negative"),
    pytest.param(_set(scale=float("nan")), ValueError, "scale", id="scale-nan"),
]


@pytest.mark.parametrize("entry", ["validate", "unchecked", "reference"])
@pytest.mark.parametrize("mutate,exc,arg", BAD_DECODE)
def test_decode_rejects_bad_input(mutate, exc, arg, entry):
    """``unchecked``: without the value checks (the GPU's default) validation takes the
    one-expression check first; a bad input must fail it and get the same named error."""
    inputs = make_decode_inputs(2, SMALL, seed=1)
    mutate(inputs)
    before = _snapshot(inputs)
    fn = {"validate": validate_decode_inputs, "reference": decode_reference,
          "unchecked": functools.partial(validate_decode_inputs, check_values=False)}[entry]
    with pytest.raises(exc, match=rf"^{arg}\b"):
        fn(**inputs)
    _assert_unchanged(inputs, before)


# --------------------------------------------------------------------------- bad prefill inputs

BAD_PREFILL = [
    pytest.param(_set(q=lambda i: i["q"].float()), TypeError, "q", id="q-float32"),
    pytest.param(_set(k=lambda i: i["k"].float()), TypeError, "k", id="k-float32"),
    pytest.param(_set(v=lambda i: i["v"].half()), TypeError, "v", id="v-float16"),
    pytest.param(_set(state=lambda i: i["state"].double()), TypeError, "state",
                 id="state-float64"),
    pytest.param(_set(a=lambda i: i["a"].float()), TypeError, "a", id="a-float32"),
    pytest.param(_set(b=lambda i: i["b"].float()), TypeError, "b", id="b-float32"),
    pytest.param(_set(A_log=lambda i: i["A_log"].half()), TypeError, "A_log", id="A_log-float16"),
    pytest.param(_set(cu_seqlens=[0, 3, 7]), TypeError, "cu_seqlens", id="cu-list"),
    pytest.param(_set(cu_seqlens=lambda i: i["cu_seqlens"].float()), TypeError, "cu_seqlens",
                 id="cu-float32"),
    pytest.param(_set(cu_seqlens=lambda i: i["cu_seqlens"].to(torch.int16)), TypeError,
                 "cu_seqlens", id="cu-int16"),
    pytest.param(_set(q=lambda i: i["q"][None]), ValueError, "q", id="q-4d"),
    pytest.param(_set(k=lambda i: i["k"][:-1]), ValueError, "k", id="k-T"),
    pytest.param(_set(v=lambda i: i["v"][:, :3]), ValueError, "v", id="HV3-HQ2-not-divide"),
    pytest.param(_set(v=lambda i: i["v"][:, :, :8]), ValueError, "v", id="v-head-size"),
    pytest.param(_set(a=lambda i: i["a"][:-1]), ValueError, "a", id="a-T"),
    pytest.param(_set(b=lambda i: i["b"][:, None]), ValueError, "b", id="b-3d"),
    pytest.param(_set(state=lambda i: i["state"][:1]), ValueError, "state", id="state-N"),
    pytest.param(_set(state=lambda i: i["state"].transpose(-1, -2)), ValueError, "state",
                 id="state-k-first-view"),
    pytest.param(_set(v=lambda i: _noncontig(i["v"])), ValueError, "v", id="v-noncontiguous"),
    pytest.param(_set(q=lambda i: i["q"].to("meta")), ValueError, "v", id="q-meta-device"),
    pytest.param(_set(b=lambda i: i["b"].to("meta")), ValueError, "b", id="b-meta-device"),
    pytest.param(_set(cu_seqlens=lambda i: i["cu_seqlens"].to("meta")), ValueError, "cu_seqlens",
                 id="cu-meta-device"),
    pytest.param(_set(cu_seqlens=lambda i: i["cu_seqlens"][None]), ValueError, "cu_seqlens",
                 id="cu-2d"),
    pytest.param(_set(cu_seqlens=lambda i: i["cu_seqlens"][:1]), ValueError, "cu_seqlens",
                 id="cu-one-entry"),
    pytest.param(_set(cu_seqlens=lambda i: _noncontig(i["cu_seqlens"])), ValueError,
                 "cu_seqlens", id="cu-noncontiguous"),
    pytest.param(_set(cu_seqlens=torch.tensor([1, 3, 7])), ValueError, "cu_seqlens",
                 id="cu-starts-at-1"),
    pytest.param(_set(cu_seqlens=torch.tensor([0, 8, 7])), ValueError, "cu_seqlens",
                 id="cu-decreasing"),
    pytest.param(_set(cu_seqlens=torch.tensor([0, 3, 6])), ValueError, "cu_seqlens",
                 id="cu-last-lt-T"),
    pytest.param(_set(cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32)), ValueError,
                 "cu_seqlens", id="cu-last-gt-T-int32"),
    pytest.param(_set(scale=float("inf")), ValueError, "scale", id="scale-inf"),
    pytest.param(_set(scale=[0.1]), TypeError, "scale", id="scale-list"),
]


@pytest.mark.parametrize("entry", ["validate", "unchecked", "reference"])
@pytest.mark.parametrize("mutate,exc,arg", BAD_PREFILL)
def test_prefill_rejects_bad_input(mutate, exc, arg, entry):
    inputs = make_prefill_inputs([3, 4], SMALL, seed=2)
    mutate(inputs)
    before = _snapshot(inputs)
    if entry == "unchecked":
        ok = spec._prefill_ok(**{n: inputs[n] for n in _PREFILL_ARGS})
        try:
            validate_prefill_inputs(**inputs, check_values=False)
        except exc as e:   # a metadata fault: the one-expression check must have failed
            assert ok is None and str(e).startswith(arg)
        else:              # a value of cu_seqlens: left to the device-side guard
            assert arg == "cu_seqlens" and ok is not None
        _assert_unchanged(inputs, before)
        return
    fn = validate_prefill_inputs if entry == "validate" else prefill_reference
    with pytest.raises(exc, match=rf"^{arg}\b"):
        fn(**inputs)
    _assert_unchanged(inputs, before)


_PREFILL_ARGS = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens", "scale")


def test_prefill_value_checks_can_be_skipped():
    """``check_values=False`` skips only the cu_seqlens value checks (no host sync)."""
    inputs = make_prefill_inputs([3, 4], SMALL)
    inputs["cu_seqlens"] = torch.tensor([0, 8, 7])
    assert validate_prefill_inputs(**inputs, check_values=False) == SMALL
    with pytest.raises(ValueError, match="^cu_seqlens"):
        validate_prefill_inputs(**inputs)


# --------------------------------------------------------------------------- good inputs

@pytest.mark.parametrize("B", [pytest.param(b, id=f"B{b}") for b in DECODE_BATCH_SIZES])
def test_decode_inputs_contest(B):
    inp = make_decode_inputs(B, seed=B)
    assert validate_decode_inputs(**inp) == CONTEST
    assert inp["q"].shape == (B, 1, 4, 128) and inp["q"].dtype == torch.bfloat16
    assert inp["v"].shape == (B, 1, 8, 128)
    assert inp["state"].shape == (B, 8, 128, 128) and inp["state"].dtype == torch.float32
    assert inp["a"].shape == inp["b"].shape == (B, 1, 8)
    assert inp["A_log"].shape == inp["dt_bias"].shape == (8,)
    for n in ("q", "k"):  # unit norm per head (realistic: Qwen3-Next normalises them)
        norms = inp[n].float().norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-2, rtol=0)


PREFILL_CASES = [
    pytest.param([6], torch.int64, True, id="T6"),
    pytest.param([70, 0, 5], torch.int32, True, id="lens[70,0,5]-int32"),
    pytest.param([0], torch.int64, False, id="lens[0]-nostate"),
    pytest.param([1] * 5, torch.int64, True, id="5xT1"),
]


@pytest.mark.parametrize("lens,cu_dtype,with_state", PREFILL_CASES)
def test_prefill_inputs(lens, cu_dtype, with_state):
    inp = make_prefill_inputs(lens, seed=3, cu_dtype=cu_dtype, with_state=with_state)
    assert validate_prefill_inputs(**inp) == CONTEST
    T, N = sum(lens), len(lens)
    assert inp["q"].shape == (T, 4, 128) and inp["v"].shape == (T, 8, 128)
    assert inp["a"].shape == inp["b"].shape == (T, 8)
    assert inp["cu_seqlens"].dtype == cu_dtype
    assert inp["cu_seqlens"].tolist() == [0] + [sum(lens[:i + 1]) for i in range(N)]
    if with_state:
        assert inp["state"].shape == (N, 8, 128, 128)
    else:
        assert inp["state"] is None


def test_inputs_are_seeded():
    a, b, c = (make_prefill_inputs([5, 3], SMALL, seed=s) for s in (7, 7, 8))
    for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b"):
        assert torch.equal(a[n], b[n]), n
    assert not torch.equal(a["v"], c["v"])
    d1, d2 = make_decode_inputs(3, SMALL, seed=4), make_decode_inputs(3, SMALL, seed=4)
    assert all(torch.equal(d1[n], d2[n]) for n in d1 if isinstance(d1[n], torch.Tensor))


def test_gate_parameters_realistic():
    """A = exp(A_log) in [1, 16], softplus(dt_bias) in [1e-3, 1e-1]: decay in (0, 1)."""
    inp = make_decode_inputs(4, seed=5)
    A = inp["A_log"].exp()
    assert bool(((A >= 1) & (A <= 16)).all())
    dt = torch.nn.functional.softplus(inp["dt_bias"])
    assert bool(((dt >= 1e-3 * 0.999) & (dt <= 1e-1 * 1.001)).all())


@pytest.mark.parametrize("lens", [pytest.param([], id="empty-list"),
                                  pytest.param([3, -1], id="negative")])
def test_make_prefill_inputs_rejects_bad_lens(lens):
    with pytest.raises(ValueError, match="lens"):
        make_prefill_inputs(lens)


def test_make_decode_inputs_rejects_zero_batch():
    with pytest.raises(ValueError, match="batch"):
        make_decode_inputs(0)


# --------------------------------------------------------------------------- small helpers

@pytest.mark.parametrize("scale,expected", [
    pytest.param(None, 1 / math.sqrt(128), id="None"),
    pytest.param(0, 1 / math.sqrt(128), id="0"),
    pytest.param(0.0, 1 / math.sqrt(128), id="0.0"),
    pytest.param(0.25, 0.25, id="0.25"),
])
def test_resolve_scale(scale, expected):
    assert resolve_scale(scale, 128) == pytest.approx(expected)


@pytest.mark.parametrize("hq,hv,d", [
    pytest.param(0, 8, 128, id="HQ0"),
    pytest.param(4, 6, 128, id="HV6-HQ4"),
    pytest.param(4, 8, 96, id="D96"),
    pytest.param(4, 8, 8, id="D8"),
])
def test_gdnshape_rejects(hq, hv, d):
    with pytest.raises(ValueError):
        GDNShape(hq, hv, d)


def test_contest_constants():
    assert CONTEST == GDNShape(4, 8, 128) and CONTEST.group == 2
    assert DECODE_BATCH_SIZES == (1, 4, 8, 16, 32, 48, 64)
    assert all(isinstance(v, list) and all(n >= 0 for n in v) for v in PREFILL_SHAPES.values())
    assert decode_state_bytes(1) == 2 * 8 * 128 * 128 * 4
    assert decode_state_bytes(64) == 64 * decode_state_bytes(1)
    assert set(spec.__all__) <= set(dir(spec))


@pytest.mark.parametrize("lens, label", [
    ([6], "6"), ([1024] * 4, "4x1024"), ([100, 28], "100+28"), ([64] * 57, "57x64"),
])
def test_lens_label_roundtrip(lens, label):
    assert lens_label(lens) == label
    assert parse_shape(label) == (label, lens)


def test_parse_shape_names_and_errors():
    assert parse_shape("T6") == ("6", [6])
    assert parse_shape("4x1024") == ("4x1024", [1024] * 4)
    assert parse_shape([3, 5]) == ("3+5", [3, 5])
    with pytest.raises(ValueError, match="not a prefill shape"):
        parse_shape("nonsense")


def test_valid_inputs_take_the_one_expression_check():
    """Valid calls (dense and pooled decode, prefill with and without a state) pass the
    flat check, so the GPU's unchecked path never runs the argument-by-argument one."""
    d = make_decode_inputs(3, SMALL)
    args = {n: d[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale")}
    assert spec._decode_ok(**args, state_indices=None) == SMALL
    pool = make_decode_inputs(3, SMALL, pool_size=5)
    args = {n: pool[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale")}
    assert spec._decode_ok(**args, state_indices=pool["state_indices"]) == SMALL
    for with_state in (True, False):
        p = make_prefill_inputs([3, 0, 4], SMALL, with_state=with_state)
        assert spec._prefill_ok(**{n: p[n] for n in _PREFILL_ARGS}) == SMALL
