"""The one-call repeat (kernels.fastcall, kernels/csrc/fastcall.cpp).

On a CPU torch the extension builds in stub mode: everything but the launch, each launch
noted (function, grid, block, shared memory, flags, each parameter's bytes). The tests check
that a plan's parameters are the Python launch list's arguments on calls with other
tensors and values, that anything the signature checks falls back (never a stale plan),
that bad inputs raise as before, and that the calls keep working when the extension
cannot be built. GPU: the plan's launches give the bits of ``GDN_FAST_LAUNCH=0``."""
from __future__ import annotations

import struct
import warnings

import pytest
import torch

from kernels import fastcall, launch
from kernels.decode import DecodeConfig, gdn_decode, ops
from kernels.spec import GDNShape, make_decode_inputs

SHAPE = GDNShape(1, 2, 16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OPTS = dict(scale=None, config=None, inplace=None, intermediate_states=False,
            check_values=None)


@pytest.fixture(scope="module")
def ext():
    if fastcall._compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    mod = fastcall.load()
    assert mod is not None, fastcall.status()["reason"]
    return mod


@pytest.fixture
def serving(ext):
    ops.clear_calls()
    with fastcall.serving_stub():
        yield ext
    ops.clear_calls()


def _inputs(B=2, seed=0, **kw):
    return make_decode_inputs(B, SHAPE, seed=seed, device=DEVICE, **kw)


def _args(inp, **opt):
    """``run``'s arguments for the decode call of ``inp``: the options, then the 12 given
    sources (kernels.decode.ops)."""
    o = dict(OPTS, **opt)
    return ((o["scale"], o["config"], o["inplace"], o["intermediate_states"],
             o["check_values"]) + tuple(inp[n] for n in ("q", "k", "v", "state", "A_log", "a",
                                                          "dt_bias", "b"))
            + (inp.get("state_indices"), o.get("status"), o.get("output"),
               o.get("output_state")))


def test_extension_builds_in_the_mode_of_this_torch(ext):
    st = fastcall.status()
    assert st["loaded"] and st["reason"] is None
    assert ext.STUB == (st["mode"] == "stub")
    assert st["mode"] == ("cuda" if torch.version.cuda and not launch.interpret.INTERPRET
                          else "stub")


def _expected_params(spec, srcs, ws=None):
    """The Python launch list's arguments of one launch, with this call's addresses in its
    slots (a source, or an offset into the workspace ``ws``), packed as Triton's launcher
    passes them (the scratch pointers last)."""
    slots = {pos: (i, off) for pos, i, off in spec.slots}
    out = []
    for pos, (ty, x) in enumerate(zip(fastcall._types(spec),
                                      list(spec.args) + list(spec.kwargs))):
        if ty == "constexpr":
            continue
        if pos in slots:
            i, off = slots[pos]
            x = (srcs[i] if i >= 0 else ws).data_ptr() + off
        elif isinstance(x, torch.Tensor):
            x = x.data_ptr()
        out.append(fastcall.pack(ty, x))
    return out + [bytes(8), bytes(8)]


#: A config object a caller passes on every call (notebook 01's ``ours-adaptive``): a plan
#: option (kernels.fastcall._immutable)
CFG_OBJ = DecodeConfig.from_name("BV16-w1-s1-t1")


@pytest.mark.skipif(not launch.interpret.INTERPRET, reason="the stub's notes (CPU)")
@pytest.mark.parametrize("case", ["dense", "pool", "intermediate", "buffers", "config"])
def test_plan_parameters_are_the_python_lists_on_other_tensors_and_values(case, serving):
    """After the signature's first call, every call is served by the plan: its noted
    parameters are the recorded list's arguments with this call's addresses (the caller's
    tensors and the fresh outputs), its outputs the normal path's bits."""
    for seed in range(3):
        kw = dict(pool_size=5) if case == "pool" else {}
        inp = _inputs(seed=seed, **kw)
        opt = {}
        if case == "pool":
            opt = dict(check_values=False)
        elif case == "intermediate":
            opt = dict(intermediate_states=True)
        elif case == "buffers":
            opt = dict(output=torch.empty_like(inp["v"]),
                       output_state=torch.empty_like(inp["state"]))
        elif case == "config":
            opt = dict(config=CFG_OBJ)
        fresh = dict(inp, state=inp["state"].clone())
        out = gdn_decode(**inp, **opt)
        with fastcall.serving_stub(False):
            calls, last = dict(ops._CALLS), ops._LAST
            ops.clear_calls()
            ref = gdn_decode(**fresh, **opt)   # a first call: the normal path
            ops._CALLS.update(calls)
            ops._LAST = last
        assert len(out) == len(ref) and all(torch.equal(x, y) for x, y in zip(out, ref))
        if seed == 0:
            continue
        assert ops._LAST is not None
        plan = ops._LAST[1]
        notes, srcs, _ = fastcall.stub_last(plan)
        # the sources the plan launched with: the caller's tensors, then the outputs returned
        given = _args(inp, **opt)[5:]
        assert all(s is g for s, g in zip(srcs[5:17], given))
        assert srcs[17] is out[0] and srcs[18] is out[1]
        if case == "pool":
            assert out[1] is inp["state"]
        if case == "buffers":
            assert out[0] is opt["output"] and out[1] is opt["output_state"]
        (spec,) = plan.lst.specs
        (note,) = notes
        assert list(note["params"]) == _expected_params(spec, srcs[5:])
        assert note["grid"] == spec.grid and note["block"] == spec.block
        assert note["pdl"] == spec.pdl and note["function"] == spec.function


def _changes(inp):
    """(name, run's arguments changed in one way a signature sees): each must fall back."""
    base = _args(inp)

    def at(i, x):
        a = list(base)
        a[i] = x
        return tuple(a)
    q, v, state, A_log = inp["q"], inp["v"], inp["state"], inp["A_log"]
    mis = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)
    odd = q.as_strided(q.shape, (q.stride(0), 7) + q.stride()[2:])   # T = 1: still contiguous
    yield "shape", at(5, torch.cat([q, q]))
    yield "dtype", at(8, state.double())
    yield "device", at(9, A_log.to("meta"))
    yield "stride", at(7, torch.stack([v, v], -1)[..., 0])
    yield "size-1-stride", at(5, odd)
    yield "type", at(9, torch.nn.Parameter(A_log.clone(), requires_grad=False))
    yield "misaligned", at(5, mis.copy_(q))
    yield "not-a-tensor", at(12, inp["b"].tolist())
    yield "none-for-tensor", at(6, None)
    yield "tensor-for-none", at(14, torch.zeros(1, dtype=torch.int32, device=q.device))
    yield "scale", at(0, 0.25)
    yield "inplace", at(2, True)
    yield "intermediate", at(3, 0)          # 0 == False, but another object
    yield "check_values", at(4, False)
    yield "config-object", at(1, CFG_OBJ)
    yield "arity", base[:-1]


@pytest.mark.parametrize("name", [c[0] for c in _changes(_inputs())])
def test_a_changed_argument_is_never_served_a_stale_plan(name, serving, monkeypatch):
    inp = _inputs()
    gdn_decode(**inp)
    _, plan = ops._LAST
    args = dict(_changes(inp))[name]
    assert fastcall.run(plan, *_args(inp)) is not None        # the recorded form: served
    assert fastcall.run(plan, *args) is None                  # the change: not
    if name in ("size-1-stride", "type", "misaligned"):       # valid: the Python path serves
        names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")
        call = dict(zip(names, args[5:13]))
        ref = gdn_decode(**dict(inp))
        with fastcall.serving_stub(False):
            assert all(torch.equal(x, y) for x, y in zip(gdn_decode(**call), ref))


def test_run_declines_while_disabled_or_hooked(serving, monkeypatch):
    """``GDN_FAST_LAUNCH=0`` (read per call) and a profiler's Triton launch hook: None."""
    inp = _inputs()
    gdn_decode(**inp)
    _, plan = ops._LAST
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    assert fastcall.run(plan, *_args(inp)) is None
    monkeypatch.delenv("GDN_FAST_LAUNCH")
    assert fastcall.run(plan, *_args(inp)) is not None
    if launch._knobs is not None:
        hook = lambda *a: None   # noqa: E731
        launch._knobs.runtime.launch_enter_hook.add(hook)
        try:
            assert fastcall.run(plan, *_args(inp)) is None
        finally:
            launch._knobs.runtime.launch_enter_hook.remove(hook)


def _bad():
    from tests.decode.test_decode_call_cache import _bad_cases
    return list(_bad_cases())


@pytest.mark.parametrize("name, change, error", _bad(), ids=[c[0] for c in _bad()])
def test_bad_inputs_still_raise_after_a_plan(name, change, error, serving):
    good = _inputs()
    gdn_decode(**good)
    gdn_decode(**good)
    assert ops._LAST is not None
    bad = dict(good)
    change(bad)
    with pytest.raises(error):
        gdn_decode(**bad)


def test_changed_signatures_alternate_correctly(serving):
    """Two signatures called in turn: each served by its own plan or the Python path, each
    computing its own shape."""
    from kernels.checks import check_outputs
    from kernels.reference import decode_reference
    for i in range(4):
        inp = _inputs(B=2 + i % 2, seed=i)
        res = check_outputs(gdn_decode(**inp), decode_reference(**inp))
        assert res.ok, res.reason
    assert {c.fast is not None for c in ops._CALLS.values()} == {True}


def test_calls_keep_the_python_path_when_the_extension_cannot_build(monkeypatch):
    """No compiler: one warning naming what is missing, no plan, right results."""
    monkeypatch.setattr(fastcall, "_MOD", None)
    monkeypatch.setattr(fastcall, "_REASON", None)
    monkeypatch.setattr(fastcall, "_compiler", lambda: None)
    monkeypatch.setenv("GDN_FASTCALL_CACHE", "/nonexistent-for-this-test")
    ops.clear_calls()
    from kernels.checks import check_outputs
    from kernels.reference import decode_reference
    with fastcall.serving_stub(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for seed in range(3):
            inp = _inputs(seed=seed)
            res = check_outputs(gdn_decode(**inp), decode_reference(**inp))
            assert res.ok, res.reason
    assert fastcall.status()["reason"].startswith("RuntimeError: no C++ compiler")
    assert sum("fastcall unavailable" in str(x.message) for x in w) == 1
    assert ops._LAST is None and all(c.fast is None for c in ops._CALLS.values())
    ops.clear_calls()


def test_pack_follows_tritons_types():
    assert fastcall.pack("*bf16", 0x1234) == struct.pack("<Q", 0x1234)
    assert fastcall.pack("i32", -3) == struct.pack("<i", -3)
    assert fastcall.pack("i64", 1 << 40) == struct.pack("<q", 1 << 40)
    assert fastcall.pack("fp32", 0.5) == struct.pack("<f", 0.5)
    with pytest.raises(ValueError):
        fastcall.pack("bf16", 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 64])
def test_gpu_replayed_fastcall_gives_the_plain_bits(B, monkeypatch, cuda_device):
    """On CUDA the plan (one C call: checks, allocation, cuLaunchKernelEx) on calls with
    other tensors gives the bits of a plain ``kernel[grid](...)`` launch, dense and pooled
    (in place); the stub's types (what Triton specialises the values as) are the compiled
    signature's."""
    from triton.runtime.jit import mangle_type

    from kernels.spec import CONTEST
    assert fastcall.load() is not None, fastcall.status()
    ops.clear_calls()
    replays, real = [], launch.LaunchList.run
    monkeypatch.setattr(launch.LaunchList, "run",
                        lambda self, *a: replays.append(1) or real(self, *a))
    runs = []
    for pooled in (False, True):
        for seed in range(3):
            inp = make_decode_inputs(B, CONTEST, seed=seed, device=cuda_device,
                                     **(dict(pool_size=2 * B) if pooled else {}))
            st = inp["state"].clone()
            runs.append((inp, st, gdn_decode(**dict(inp, state=st), check_values=False)))
    plans = [c.fast for c in ops._CALLS.values()]
    assert len(plans) == 2 and all(p is not None for p in plans)
    assert replays == []   # each repeat served by its plan, not the Python replay
    dense = next(iter(ops._CALLS.values()))
    (spec,) = dense.launches.specs
    assert spec.ck is not None
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    for inp, st, out in runs:
        s = inp["state"].clone()
        ref = gdn_decode(**dict(inp, state=s), check_values=False)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
        assert torch.equal(st, s)
    # the types a stub plan infers from the values are the compiled kernel's
    inp = make_decode_inputs(B, CONTEST, seed=0, device=cuda_device)
    o, ht = torch.empty_like(inp["v"]), torch.empty_like(inp["state"])
    vals = (inp["q"], inp["k"], inp["v"], inp["state"], ht, ht, inp["q"], inp["A_log"],
            inp["a"], inp["dt_bias"], inp["b"], o, None, dense.scale, inp["state"].shape[0])
    sig = [t for t in spec.ck.src.signature.values()][:len(vals)]
    assert sig == [mangle_type(x, True) for x in vals]


# --- prefill ---------------------------------------------------------------------------------

PREFILL = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens")


@pytest.fixture
def serving_prefill(ext):
    from kernels.prefill import plan as plan_mod
    plan_mod.clear_plan_cache()
    with fastcall.serving_stub():
        yield plan_mod
    plan_mod.clear_plan_cache()


def _prefill_inputs(lens, seed, device=DEVICE, shape=SHAPE):
    from kernels.spec import make_prefill_inputs
    inp = make_prefill_inputs(list(lens), shape, seed=seed, device=device)
    if len(lens) == 2:   # other cu_seqlens values of the signature
        T = sum(lens)
        split = (lens[0], lens[1], T // 2)[seed % 3]
        inp["cu_seqlens"] = torch.tensor([0, split, T], dtype=inp["cu_seqlens"].dtype,
                                         device=device)
    return inp


@pytest.mark.skipif(not launch.interpret.INTERPRET, reason="the stub's notes (CPU)")
@pytest.mark.parametrize("lens, kw, path, launches", [
    ((4, 2), {}, "recurrent", 1), ((64, 64), {}, "single", 1), ((70, 60), {}, "walk", 2),
    ((300,), {"cp": True}, "cp", 3)], ids=["recurrent", "single", "walk", "cp"])
def test_prefill_plan_parameters_are_the_python_lists(lens, kw, path, launches,
                                                      serving_prefill):
    """gdn_prefill (``cu_seqlens`` unchecked on the host: guarded on the device) after the
    signature's first call: served by the plan, its parameters the recorded list's with
    this call's addresses (workspace views at their offsets into the plan's workspace), its
    outputs the bits of ``prefill_fused``."""
    from kernels.prefill import gdn_prefill, pipeline
    for seed in range(3):
        inp = _prefill_inputs(lens, seed)
        out = gdn_prefill(**inp, check_values=False, **kw)
        with fastcall.serving_stub(False):
            ref = pipeline.prefill_fused(**inp, check_values=False, **kw)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
        if seed == 0:
            continue
        (c,) = serving_prefill.CALLS.values()
        assert (c.plan.path if c.plan else "recurrent") == path
        assert c.fast is not None and serving_prefill.FAST[0] is c.fast
        plan = c.fast[1]
        notes, srcs, ws = fastcall.stub_last(plan)
        assert len(notes) == launches == len(plan.lst.specs)
        assert all(s is inp[n] for s, n in zip(srcs[6:15], PREFILL))
        assert srcs[18] is out[0] and srcs[19] is out[1]
        assert (ws is None) == (c.ws_words == 0)
        if ws is not None:
            assert ws.numel() == 4 * c.ws_words
        for note, spec in zip(notes, plan.lst.specs):
            assert list(note["params"]) == _expected_params(spec, srcs[6:], ws)
            assert note["grid"] == spec.grid and note["block"] == spec.block
        if path != "recurrent":   # (workspace slots among them)
            assert any(i < 0 for spec in plan.lst.specs for _, i, _ in spec.slots)


def test_prefill_changed_cu_seqlens_or_option_falls_back(serving_prefill):
    """Another sequence count, another ``cu_seqlens`` dtype, another option (cp, scale,
    check_values): not the plan's (the Python path plans its own); a bad input raises."""
    from kernels.prefill import gdn_prefill
    from kernels.reference import prefill_reference
    from kernels.checks import check_outputs
    inp = _prefill_inputs((70, 60), 0)
    gdn_prefill(**inp, check_values=False)
    (c,) = serving_prefill.CALLS.values()
    plan = c.fast[1]
    base = ("fused", None, False, None, None, None) + tuple(inp[n] for n in PREFILL) + (
        None, None, None)
    assert fastcall.run(plan, *base) is not None
    for i, x in ((14, inp["cu_seqlens"].to(torch.int32)), (14, inp["cu_seqlens"][:2]),
                 (3, True), (1, 0.5), (2, None), (0, "recurrent")):
        args = list(base)
        args[i] = x
        assert fastcall.run(plan, *args) is None
    bad = dict(inp, v=inp["v"].float())
    with pytest.raises(TypeError):
        gdn_prefill(**bad, check_values=False)
    other = _prefill_inputs((64,), 1)
    res = check_outputs(gdn_prefill(**other, check_values=False), prefill_reference(**other))
    assert res.ok, res.reason


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[6], [100, 28], [2048], [8192]],
                         ids=["T6", "100+28", "T2048", "T8192"])
def test_gpu_replayed_fastcall_prefill_gives_the_plain_bits(lens, monkeypatch, cuda_device):
    """On CUDA gdn_prefill's plan (one C call) on calls with other tensors and values gives
    the bits of plain ``kernel[grid](...)`` launches (``GDN_FAST_LAUNCH=0``)."""
    from kernels.prefill import gdn_prefill, pipeline
    from kernels.prefill import plan as plan_mod
    from kernels.spec import CONTEST
    assert fastcall.load() is not None, fastcall.status()
    plan_mod.clear_plan_cache()
    replays, real = [], launch.LaunchList.run
    monkeypatch.setattr(launch.LaunchList, "run",
                        lambda self, *a: replays.append(1) or real(self, *a))
    outs = []
    for seed in range(3):
        inp = _prefill_inputs(lens, seed, device=cuda_device, shape=CONTEST)
        outs.append((inp, gdn_prefill(**inp)))
    (c,) = plan_mod.CALLS.values()
    assert c.fast is not None and replays == []
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    for inp, out in outs:
        plain = pipeline.prefill_fused(**inp)
        assert torch.equal(out[0], plain[0]) and torch.equal(out[1], plain[1])


def test_a_copy_without_the_source_keeps_the_python_path_quietly(monkeypatch, tmp_path):
    """A bundled copy of the package (a packed contest solution) has no kernels/csrc: no
    build is tried, no warning, the reason says so."""
    monkeypatch.setattr(fastcall, "_MOD", None)
    monkeypatch.setattr(fastcall, "_REASON", None)
    monkeypatch.setattr(fastcall, "SOURCE", tmp_path / "csrc" / "fastcall.cpp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fastcall.load() is None
    assert "without kernels/csrc" in fastcall.status()["reason"]


# --- replay decode ---------------------------------------------------------------------------

REPLAY_CFG = "BV16-w1-s1-t1"
REPLAY_GIVEN = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")


@pytest.fixture
def serving_replay(ext):
    from kernels.decode import replay
    replay.clear_calls()
    with fastcall.serving_stub():
        yield replay
    replay.clear_calls()


def _replay_case(case, seed, T=2, L=3):
    """(inputs, ring, keyword options) of a replay call: dense with rollback by default;
    ``pool`` (a pool of 4 with status), ``plain`` (no rollback), ``output`` (a given output
    buffer). Each seed gives other tensors and values (ring headers, rollback) of the same
    signature."""
    from kernels.decode import ReplayRing
    pooled = case == "pool"
    inp = make_decode_inputs(2, SHAPE, seed=seed, device=DEVICE, tokens=T,
                             **(dict(pool_size=4) if pooled else {}))
    rows = inp["state"].shape[0]
    ring = ReplayRing.empty(rows, SHAPE.num_q_heads, SHAPE.num_v_heads, SHAPE.head_dim, L,
                            device=DEVICE)
    ring.head[:, 1] = seed % 2
    kw = dict(config=REPLAY_CFG, check_values=False)
    if case != "plain":
        kw["rollback"] = torch.tensor([seed % 2, 0], dtype=torch.int32, device=DEVICE)
    if pooled:
        kw["status"] = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    if case == "output":
        kw["output"] = torch.empty_like(inp["v"])
    return inp, ring, kw


def _replay_args(inp, ring, kw):
    """``run``'s arguments for a replay call (kernels.decode.replay): the options (scale,
    config, check_values, ring.L, ring.max_tokens), then the 17 given sources."""
    return ((inp["scale"], kw.get("config"), kw.get("check_values"), ring.L, ring.max_tokens)
            + tuple(inp[n] for n in REPLAY_GIVEN)
            + (inp.get("state_indices"), kw.get("rollback"), kw.get("status"), kw.get("output"),
               ring.k, ring.u, ring.g, ring.head, ring.count))


@pytest.mark.skipif(not launch.interpret.INTERPRET, reason="the stub's notes (CPU)")
@pytest.mark.parametrize("case", ["dense", "pool", "plain", "output"])
def test_replay_plan_parameters_are_the_python_lists_on_other_tensors_and_values(
        case, serving_replay):
    """gdn_replay_decode (values unchecked on the host) after the signature's first call:
    served by the plan, its noted parameters the recorded list's arguments with this call's
    addresses (the caller's tensors, the ring's, the fresh output), its outputs, checkpoint
    and ring the bits of the normal path (a first call)."""
    from kernels.decode import gdn_replay_decode
    replay = serving_replay
    for seed in range(3):
        inp, ring, kw = _replay_case(case, seed)
        st0, ring0 = inp["state"].clone(), ring.clone()
        kw0 = dict(kw, output=torch.empty_like(inp["v"])) if "output" in kw else dict(kw)
        if "status" in kw:
            kw0["status"] = kw["status"].clone()
        out = gdn_replay_decode(**inp, ring=ring, **kw)
        with fastcall.serving_stub(False):
            calls, last = dict(replay._CALLS), replay._LAST
            replay.clear_calls()
            ref = gdn_replay_decode(**dict(inp, state=st0), ring=ring0, **kw0)   # normal path
            replay._CALLS.update(calls)
            replay._LAST = last
        assert torch.equal(out[0], ref[0]) and torch.equal(inp["state"], st0)
        assert out[1] is inp["state"]
        for name in ("k", "u", "g", "head", "count"):
            assert torch.equal(getattr(ring, name), getattr(ring0, name)), name
        if "status" in kw:
            assert torch.equal(kw["status"], kw0["status"])
        if seed == 0:
            continue
        (c,) = replay._CALLS.values()
        assert c.fast is not None and replay._LAST is c.fast
        plan = c.fast[1]
        notes, srcs, _ = fastcall.stub_last(plan)
        given = _replay_args(inp, ring, kw)[5:]
        assert len(srcs) == 5 + 17 + 1
        assert all(s is g for s, g in zip(srcs[5:22], given) if g is not None)
        assert srcs[22] is out[0]
        if case == "output":
            assert out[0] is kw["output"]
        (spec,) = plan.lst.specs
        (note,) = notes
        assert list(note["params"]) == _expected_params(spec, srcs[5:])
        assert note["grid"] == spec.grid and note["block"] == spec.block
        assert note["function"] == spec.function


def _replay_changes(inp, ring, kw):
    """(name, run's arguments changed in one way the replay signature sees): each must
    fall back. ``ring``: L=3, max_tokens=4 (capacity 8, as for L=2 or 4: the same
    tensors)."""
    base = _replay_args(inp, ring, kw)

    def at(i, x):
        a = list(base)
        a[i] = x
        return tuple(a)
    q, state, A_log = inp["q"], inp["state"], inp["A_log"]
    mis = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)
    rk = ring.k
    yield "shape", at(5, torch.cat([q, q]))
    yield "dtype", at(8, state.double())
    yield "device", at(9, A_log.to("meta"))
    yield "stride", at(17, torch.stack([rk, rk], -1)[..., 0])
    yield "type", at(9, torch.nn.Parameter(A_log.clone(), requires_grad=False))
    yield "misaligned", at(5, mis.copy_(q))
    yield "ring-misaligned", at(19, torch.empty(ring.g.numel() + 1, device=q.device)[1:]
                                .view(ring.g.shape))
    yield "not-a-tensor", at(12, inp["b"].tolist())
    yield "ring-head-dtype", at(20, ring.head.long())
    yield "ring-count-none", at(21, None)
    yield "L", at(3, 2)                        # the same ring tensors, another L
    yield "max_tokens", at(4, 5)
    yield "rollback-none", at(14, None)
    yield "rollback-dtype", at(14, kw["rollback"].long())
    yield "indices-for-none", at(13, torch.zeros(2, dtype=torch.int32, device=q.device))
    yield "status-for-none", at(15, torch.zeros(1, dtype=torch.int32, device=q.device))
    yield "output-for-none", at(16, torch.empty_like(inp["v"]))
    yield "scale", at(0, 0.25)
    yield "config", at(1, None)
    yield "check_values", at(2, None)         # on the CPU: values checked per call
    yield "check_values-true", at(2, True)
    yield "arity", base[:-1]


def _replay_change_names():
    return [n for n, _ in _replay_changes(*_replay_case("dense", 0))]


@pytest.mark.parametrize("name", _replay_change_names())
def test_replay_changed_argument_is_never_served_a_stale_plan(name, serving_replay):
    from kernels.decode import gdn_replay_decode
    inp, ring, kw = _replay_case("dense", 0)
    gdn_replay_decode(**inp, ring=ring, **kw)
    _, plan = serving_replay._LAST
    inp, ring, kw = _replay_case("dense", 1)
    args = dict(_replay_changes(inp, ring, kw))[name]
    head = ring.head.clone()
    assert fastcall.run(plan, *args) is None                 # the change: not served
    assert torch.equal(ring.head, head)                      # (nothing launched)
    assert fastcall.run(plan, *_replay_args(inp, ring, kw)) is not None   # the recorded form


def test_replay_other_L_same_tensors_takes_the_python_path(serving_replay):
    """A ring of another ``L`` with tensors of the same shapes (capacity 8 for L = 2, 3, 4):
    the plan declines; the call computes with its own L (the reference's checkpoint)."""
    from kernels.decode import ReplayRing, gdn_replay_decode
    from kernels.reference import replay_decode_reference
    inp, ring, kw = _replay_case("dense", 0)
    gdn_replay_decode(**inp, ring=ring, **kw)
    first = serving_replay._LAST
    inp, ring, kw = _replay_case("dense", 1)
    ring = ReplayRing(ring.k, ring.u, ring.g, ring.head, ring.count, L=2)
    ring.head[:, 1] = 1
    st0, ring0 = inp["state"].clone(), ring.clone()
    out, _ = gdn_replay_decode(**inp, ring=ring, **kw)
    assert len(serving_replay._CALLS) == 2 and serving_replay._LAST is not first
    want_out, want_state, want_ring = replay_decode_reference(
        **dict(inp, state=st0), ring=ring0, rollback=kw["rollback"])
    assert torch.equal(ring.head, want_ring.head)     # n + T > L = 2: written back
    assert int(ring.head[0, 1]) == 2
    from kernels.checks import check_close
    assert check_close(out, want_out, name="output").ok


def test_replay_values_checked_per_call_keep_the_python_path(serving_replay):
    """check_values (None on the CPU, or True): no plan; a corrupt header or a rollback past
    the ring raises on a repeat, before anything is written. (On CUDA ``None`` means the
    device-side checks, which a plan keeps: only ``True`` checks on the host there.)"""
    from kernels.decode import gdn_replay_decode
    for cv in ((None, True) if DEVICE == "cpu" else (True,)):
        serving_replay.clear_calls()
        for seed in range(2):
            inp, ring, kw = _replay_case("dense", seed)
            gdn_replay_decode(**inp, ring=ring, **dict(kw, check_values=cv))
        (c,) = serving_replay._CALLS.values()
        assert c.fast is None and serving_replay._LAST is None and c.launches
        inp, ring, kw = _replay_case("dense", 2)
        ring.head[1, 1] = 7
        before = inp["state"].clone()
        with pytest.raises(ValueError, match="ring.head"):
            gdn_replay_decode(**inp, ring=ring, **dict(kw, check_values=cv))
        inp, ring, kw = _replay_case("dense", 2)
        kw["rollback"] = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)   # n = 0
        with pytest.raises(ValueError, match="rollback must lie"):
            gdn_replay_decode(**inp, ring=ring, **dict(kw, check_values=cv))
        assert torch.equal(inp["state"], before)


def _replay_bad():
    from tests.decode.test_replay import BAD
    return BAD


@pytest.mark.parametrize("make, exc, match", _replay_bad())
def test_replay_bad_inputs_still_raise_after_a_plan(make, exc, match, serving_replay):
    """A plan made (values unchecked), then each bad input of test_replay: checked on the
    host (check_values=True) it raises as before; the metadata errors raise unchecked too
    (the value errors are the kernel's NaN there, tests/decode/test_replay.py)."""
    from kernels.decode import gdn_replay_decode
    from tests.decode.test_replay import _bad
    for _ in range(2):
        inp, ring, kw = _bad(lambda i, r, kw: None)()
        gdn_replay_decode(**inp, ring=ring, check_values=False)
    assert serving_replay._LAST is not None
    values_only = match in ("ring.head", "ring.count", r"rollback must lie in \[0, n\]")
    for cv in (True, False) if not values_only else (True,):
        inp, ring, kw = make()
        kw.setdefault("ring", ring)
        before = [inp["state"].clone(), ring.head.clone()]
        with pytest.raises(exc, match=match):
            gdn_replay_decode(**inp, check_values=cv, **kw)
        assert torch.equal(inp["state"], before[0]) and torch.equal(ring.head, before[1])


def test_replay_and_decode_plans_alternate(serving_replay, serving):
    """Replay and standard decode calls in turn, two replay signatures: each served by its
    own plan (the last plans are per call site), each computing its own shape."""
    from kernels.checks import check_outputs
    from kernels.decode import gdn_replay_decode
    from kernels.reference import decode_reference, replay_decode_reference
    for i in range(6):
        case = ("dense", "plain")[i % 2]
        inp, ring, kw = _replay_case(case, i, T=1)
        st0, ring0 = inp["state"].clone(), ring.clone()
        out, _ = gdn_replay_decode(**inp, ring=ring, **kw)
        want, _, want_ring = replay_decode_reference(**dict(inp, state=st0), ring=ring0,
                                                     rollback=kw.get("rollback"))
        assert torch.equal(ring.head, want_ring.head)
        from kernels.checks import check_close
        assert check_close(out, want, name="output").ok
        dec = _inputs(seed=i)
        res = check_outputs(gdn_decode(**dec), decode_reference(**dec))
        assert res.ok, res.reason
    assert len(serving_replay._CALLS) == 2
    assert all(c.fast is not None for c in serving_replay._CALLS.values())
    assert ops._LAST is not None


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 64])
def test_gpu_replayed_fastcall_replay_decode_gives_the_plain_bits(B, monkeypatch, cuda_device):
    """On CUDA the replay decode's plan (values unchecked: the CUDA default) on calls with
    other tensors, ring headers and rollbacks gives the bits (output, checkpoint, ring) of a
    plain ``kernel[grid](...)`` launch (``GDN_FAST_LAUNCH=0``), dense and pooled."""
    from kernels.decode import ReplayRing, gdn_replay_decode, replay
    from kernels.spec import CONTEST
    assert fastcall.load() is not None, fastcall.status()
    replay.clear_calls()
    replays, real = [], launch.LaunchList.run
    monkeypatch.setattr(launch.LaunchList, "run",
                        lambda self, *a: replays.append(1) or real(self, *a))
    hq, hv, d = CONTEST.num_q_heads, CONTEST.num_v_heads, CONTEST.head_dim
    runs = []
    for pooled in (False, True):
        for seed in range(3):
            inp = make_decode_inputs(B, CONTEST, seed=seed, device=cuda_device, tokens=2,
                                     **(dict(pool_size=2 * B) if pooled else {}))
            rows = inp["state"].shape[0]
            ring = ReplayRing.empty(rows, hq, hv, d, 3, device=cuda_device)
            ring.head[:, 1] = seed % 2
            back = torch.full((B,), seed % 2, dtype=torch.int32, device=cuda_device)
            start = (inp["state"].clone(), ring.clone())
            st, rg = start[0].clone(), start[1].clone()
            out, _ = gdn_replay_decode(**dict(inp, state=st), ring=rg, rollback=back)
            runs.append((inp, back, start, out, st, rg))
    plans = [c.fast for c in replay._CALLS.values()]
    assert len(plans) == 2 and all(p is not None for p in plans)
    assert replays == []   # each repeat served by its plan, not the Python replay
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    for inp, back, (st0, ring0), out, st, rg in runs:
        s, r = st0.clone(), ring0.clone()
        ref, _ = gdn_replay_decode(**dict(inp, state=s), ring=r, rollback=back)
        assert torch.equal(out, ref) and torch.equal(st, s)
        for name in ("k", "u", "g", "head", "count"):
            assert torch.equal(getattr(rg, name), getattr(r, name)), name


def test_options_are_served_as_the_recorded_object_or_an_equal_one(serving, monkeypatch):
    """A plan serves an option that is the recorded object or an equal one of its exact type
    (a config built per call, as notebook 01's host rows do, after the gate prepared the
    signature with the grid's object; a scale computed per call); another value, another
    type or a mutable option is not served (that call takes the Python path). Served or
    not, the bits are the Python path's."""
    assert fastcall._immutable(CFG_OBJ) and not fastcall._immutable([1])
    assert not fastcall._immutable(torch.zeros(1))
    inp = _inputs()
    gdn_decode(**inp, config=CFG_OBJ)
    _, plan = ops._LAST
    twin = DecodeConfig.from_name(CFG_OBJ.name)
    assert twin == CFG_OBJ and twin is not CFG_OBJ
    assert fastcall.run(plan, *_args(inp, config=CFG_OBJ)) is not None
    assert fastcall.run(plan, *_args(inp, config=twin)) is not None
    assert fastcall.run(plan, *_args(inp, config=DecodeConfig.from_name("BV8-w1-s1-t1"))) is None
    assert fastcall.run(plan, *_args(inp, config=CFG_OBJ, inplace=0)) is None   # not None
    ops.clear_calls()
    half = float("0.5")
    gdn_decode(**dict(inp, scale=half))
    _, plan = ops._LAST
    assert fastcall.run(plan, *_args(inp, scale=float("0.5"))) is not None
    assert fastcall.run(plan, *_args(inp, scale=0.25)) is None
    ops.clear_calls()
    gdn_decode(**dict(inp, scale=1.0))
    _, plan = ops._LAST
    assert fastcall.run(plan, *_args(inp, scale=1)) is None    # an int where a float was
    # the whole call: every call with a fresh equal config is served by the plan
    ops.clear_calls()
    gdn_decode(**inp, config=CFG_OBJ)
    python_path = []
    orig = ops.replay_or_launch
    monkeypatch.setattr(ops, "replay_or_launch",
                        lambda *a, **k: python_path.append(1) or orig(*a, **k))
    outs = [gdn_decode(**dict(inp, state=inp["state"].clone()),
                       config=DecodeConfig.from_name(CFG_OBJ.name)) for _ in range(3)]
    assert python_path == []
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    ref = gdn_decode(**dict(inp, state=inp["state"].clone()), config=CFG_OBJ)
    assert python_path == [1]
    for out in outs:
        assert all(torch.equal(x, y) for x, y in zip(out, ref))
