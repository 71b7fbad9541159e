"""A decode call's signature is checked once (kernels.decode.ops.signature): a repeat skips
the checks' host work, yet every bad input is still rejected, per-call values (pool slots
on the host path) are still checked, and a changed shape, dtype, device, stride or option
never reuses a stale entry."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from kernels.checks import check_outputs
from kernels.decode import gdn_decode
from kernels.decode import ops
from kernels.reference import decode_reference
from kernels.spec import GDNShape, make_decode_inputs

SHAPE = GDNShape(1, 2, 16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # as tests/decode/test_decode.py
NAMES = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")


@pytest.fixture(autouse=True)
def _fresh():
    ops.clear_calls()
    yield
    ops.clear_calls()


def _inputs(B=2, seed=0, **kw):
    return make_decode_inputs(B, SHAPE, seed=seed, device=DEVICE, **kw)


def _matches(inp, out, **kw):
    ref = decode_reference(**inp, **kw)
    res = check_outputs(out, ref)
    assert res.ok, res.reason


def test_repeat_skips_the_checks_and_computes_each_call():
    with mock.patch.object(ops, "validate_call", wraps=ops.validate_call) as checks, \
            mock.patch.object(ops, "resolve_config", wraps=ops.resolve_config) as config:
        for seed in range(3):   # same signature, other values: fresh outputs, right results
            inp = _inputs(seed=seed)
            out = gdn_decode(**inp)
            _matches(inp, out)
    assert (checks.call_count, config.call_count) == (1, 1)
    assert len(ops._CALLS) == 1


def _bad_cases():
    """(name, change to valid inputs, error): what the checks catch, a metadata change each."""
    yield "q-dtype", lambda x: x.update(q=x["q"].float()), TypeError
    yield "k-shape", lambda x: x.update(k=x["k"][:, :, :, :8].contiguous()), ValueError
    yield "v-strided", lambda x: x.update(v=torch.stack([x["v"], x["v"]], -1)[..., 0]), \
        ValueError
    yield "state-dtype", lambda x: x.update(state=x["state"].double()), TypeError
    yield "A_log-device", lambda x: x.update(A_log=x["A_log"].to("meta")), ValueError
    yield "a-shape", lambda x: x.update(a=x["a"][:1]), ValueError
    yield "b-not-tensor", lambda x: x.update(b=x["b"].tolist()), TypeError
    yield "dt_bias-noncontig", lambda x: x.update(
        dt_bias=torch.zeros(4, device=DEVICE)[::2]), ValueError
    yield "scale-nan", lambda x: x.update(scale=float("nan")), ValueError
    yield "scale-negative", lambda x: x.update(scale=-1.0), ValueError


@pytest.mark.parametrize("name, change, error", list(_bad_cases()),
                         ids=[c[0] for c in _bad_cases()])
def test_bad_inputs_are_rejected_after_a_good_signature(name, change, error):
    good = _inputs()
    gdn_decode(**good)   # the signature is now checked and remembered
    bad = dict(good)
    change(bad)
    with pytest.raises(error):
        gdn_decode(**bad)


@pytest.mark.parametrize("option, value, error", [
    ("inplace", 1, TypeError),                     # 1 == True, but only a bool is accepted
    ("intermediate_states", 1, TypeError),
    ("config", "no-such-config", ValueError),
    ("output", torch.empty(2, 1, 2, 16, device=DEVICE), TypeError),   # f32, not bf16
    ("status", torch.zeros(1, dtype=torch.int32, device=DEVICE), ValueError),   # status without a pool
])
def test_bad_options_are_rejected_after_a_good_signature(option, value, error):
    good = _inputs()
    gdn_decode(**good, **({"inplace": True} if option == "inplace" else {}),
               **({"intermediate_states": True} if option == "intermediate_states" else {}))
    with pytest.raises(error):
        gdn_decode(**good, **{option: value})


def test_pool_slot_values_are_checked_on_every_host_call():
    inp = _inputs(pool_size=5)
    ref = decode_reference(**inp)
    # check_values=True: the host checks of slot values (on by default only off CUDA)
    out, pool = gdn_decode(**dict(inp, state=inp["state"].clone()), check_values=True)
    assert check_outputs((out, pool), ref).ok
    for bad, msg in ((torch.tensor([1, 7], dtype=torch.int32, device=DEVICE), "pool size"),
                     (torch.tensor([3, 3], dtype=torch.int32, device=DEVICE), "repeat")):
        with pytest.raises(ValueError, match=msg):
            gdn_decode(**dict(inp, state_indices=bad), check_values=True)


def test_changed_signature_gets_its_own_entry():
    """Other batch, state dtype, option: each a new entry, each computing its own shape."""
    cases = [dict(B=2), dict(B=3), dict(B=2, state_dtype=torch.bfloat16)]
    for kw in cases:
        inp = _inputs(**kw)
        _matches(inp, gdn_decode(**inp))
    inp = _inputs()
    out = gdn_decode(**inp, intermediate_states=True)
    assert len(out) == 3 and out[2].shape == (2, 1, 2, 16, 16)
    _matches(inp, out, intermediate_states=True)
    assert len(ops._CALLS) == 4


def test_caller_buffers_and_fresh_outputs():
    """Outputs are allocated per call (never a cached tensor the caller may hold); a caller's
    ``output`` is written and returned."""
    inp = _inputs()
    o1, s1 = gdn_decode(**inp)
    o2, s2 = gdn_decode(**inp)
    assert o1.data_ptr() != o2.data_ptr() and s1.data_ptr() != s2.data_ptr()
    buf = torch.empty(2, 1, 2, 16, dtype=torch.bfloat16, device=DEVICE)
    o3, _ = gdn_decode(**inp, output=buf)
    assert o3 is buf and torch.equal(o3, o1)


def _counting_runs(monkeypatch):
    """The replays of recorded launch lists, counted (those that launched): by the Python
    list, or by the signature's plan where kernels.fastcall serves the call (CUDA)."""
    from kernels import fastcall, launch
    runs, real = [], launch.LaunchList.run

    def run(self, *a, **kw):
        ok = real(self, *a, **kw)
        runs.append(ok)
        return ok
    monkeypatch.setattr(launch.LaunchList, "run", run)
    real_runner = fastcall.runner

    def runner(plan):
        go = real_runner(plan)

        def counted(*a):
            r = go(*a)
            runs.append(r is not None)
            return r
        return counted
    monkeypatch.setattr(fastcall, "runner", runner)
    return runs


@pytest.mark.parametrize("kw", [dict(), dict(pool_size=5), dict(intermediate=True)],
                         ids=["dense", "pool-in-place", "intermediate"])
def test_recorded_launch_equals_the_normal_path_bit_for_bit(kw, monkeypatch):
    """The launch recorded on a signature's first call, replayed on calls with other
    tensors and values of the signature, gives the bits of the normal (keyed) path."""
    runs = _counting_runs(monkeypatch)
    opt = dict(intermediate_states=True) if kw.pop("intermediate", False) else {}
    for seed in range(3):
        inp = _inputs(seed=seed, **kw)
        fresh = dict(inp, state=inp["state"].clone())
        out = gdn_decode(**inp, **opt)              # replayed after the first call
        calls = dict(ops._CALLS)
        ops.clear_calls()
        ref = gdn_decode(**fresh, **opt)            # a first call: the normal path
        ops._CALLS.update(calls)
        assert len(out) == len(ref)
        for x, y in zip(out, ref):
            assert torch.equal(x, y)
    (c,) = ops._CALLS.values()
    assert len(c.launches) == 1 and runs.count(True) == 2


def test_a_tensor_given_twice_is_not_recorded_but_computed(monkeypatch):
    """``k`` passed as ``q`` too: its slot would be ambiguous on the next call, so no list
    is recorded; the calls still compute their results (the keyed path)."""
    inp = _inputs()
    inp["k"] = inp["q"]
    for _ in range(2):
        _matches(inp, gdn_decode(**inp))
    (c,) = ops._CALLS.values()
    assert c.launches is None and c.tries == ops.RECORD_TRIES - 2


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 64])
def test_gpu_replayed_launch_gives_the_plain_bits(B, monkeypatch, cuda_device):
    """On CUDA the recorded launch (Triton's C launch with this call's addresses) on calls
    with other tensors gives the bits of a plain ``kernel[grid](...)`` launch, dense and
    pooled (in place)."""
    from kernels.spec import CONTEST
    runs = []
    for seed in range(3):
        inp = make_decode_inputs(B, CONTEST, seed=seed, device=cuda_device, pool_size=2 * B)
        pool = inp["state"].clone()
        runs.append((inp, pool, gdn_decode(**dict(inp, state=pool), check_values=False)))
    assert all(c.launches is not None for c in ops._CALLS.values())
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    for inp, pool, out in runs:
        p = inp["state"].clone()
        ref = gdn_decode(**dict(inp, state=p), check_values=False)
        assert torch.equal(out[0], ref[0]) and torch.equal(pool, p)
