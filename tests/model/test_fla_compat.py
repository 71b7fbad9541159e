"""The FLA-signature drop-in (kernels/model/fla_compat.py) on the GPU where there is one,
else on the CPU (Triton interpreter; small shapes): against our reference (kernels/reference.py) and against FLA's semantics as
transformers' torch functions write them (the same signature, the L2 norm, the [K, V]
state), both calls, both state layouts, varlen, q/k at the value heads' count; bad inputs
raise naming the argument and leave the inputs untouched."""
from __future__ import annotations

import pytest
import torch

from kernels.checks import check_outputs
from kernels.model.fla_compat import (chunk_gated_delta_rule,
                                      fused_recurrent_gated_delta_rule)
from kernels.reference import gates_reference, prefill_reference
from kernels.spec import GDNShape, make_prefill_inputs

SHAPE = GDNShape(2, 4, 16)   # HQ, HV, D: small for the interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # as tests/decode/test_decode.py


def _torch_fns():
    """transformers' torch functions (FLA's semantics), not the FLA kernels its decorator
    binds where FLA is installed."""
    m = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    return (m.torch_chunk_gated_delta_rule.__wrapped__,
            m.torch_recurrent_gated_delta_rule.__wrapped__)


def _fla_inputs(B, T, H=2, HV=4, D=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=gen).bfloat16()
    k = torch.randn(B, T, H, D, generator=gen).bfloat16()
    v = torch.randn(B, T, HV, D, generator=gen).bfloat16()
    g = -torch.rand(B, T, HV, generator=gen) * 0.5
    beta = torch.rand(B, T, HV, generator=gen).bfloat16()
    h0 = torch.randn(B, HV, D, D, generator=gen) * 0.1      # FLA's [N, HV, K, V]
    return tuple(x.to(DEVICE) for x in (q, k, v, g, beta, h0))


def test_chunk_varlen_matches_our_reference():
    """Raw gates turned into FLA's (g = log decay, beta) give our reference's outputs;
    the k-last state (state_v_first) in and out."""
    inp = make_prefill_inputs([5, 70], SHAPE, seed=1, with_state=True, device=DEVICE)
    decay, beta = gates_reference(inp["A_log"], inp["a"], inp["dt_bias"], inp["b"])
    o, ht = chunk_gated_delta_rule(
        inp["q"][None], inp["k"][None], inp["v"][None], decay.log()[None], beta[None],
        initial_state=inp["state"], output_final_state=True, state_v_first=True,
        cu_seqlens=inp["cu_seqlens"])
    ref = prefill_reference(**inp)
    res = check_outputs((o[0], ht), ref)
    assert res.ok, res.reason


def test_chunk_matches_transformers_torch_path():
    """B = 2 without cu_seqlens, q/k repeated to the value heads (as transformers passes
    them), L2 norm in the call, FLA's [K, V] state: transformers' torch function's
    outputs; the final state comes back as a view a second call reads in place."""
    torch_chunk, _ = _torch_fns()
    q, k, v, g, beta, h0 = _fla_inputs(2, 70)
    qr, kr = q.repeat_interleave(2, 2), k.repeat_interleave(2, 2)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, ht = chunk_gated_delta_rule(qr, kr, v, g, beta, initial_state=h0, **kw)
    ro, rh = torch_chunk(qr, kr, v, g, beta, initial_state=h0, **kw)
    res = check_outputs((o, ht), (ro, rh))
    assert res.ok, res.reason
    assert ht.shape == h0.shape and ht.transpose(-1, -2).is_contiguous()
    # GVA (q/k at their own head count) gives the same outputs as the repeated heads
    o2, _ = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, **kw)
    assert torch.equal(o2, o)


@pytest.mark.parametrize("layout", ["kv", "kv_view", "v_first"])
def test_recurrent_decode_matches_transformers_torch_path(layout):
    """Two tokens per sequence through the decode kernel (gates, L2 norm and the state's
    layout in the kernel) against transformers' torch recurrent function."""
    _, torch_rec = _torch_fns()
    q, k, v, g, beta, h0 = _fla_inputs(3, 2, seed=2)
    q, k = q.repeat_interleave(2, 2), k.repeat_interleave(2, 2)
    ro, rh = torch_rec(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                       use_qk_l2norm_in_kernel=True)
    state = {"kv": h0, "kv_view": h0.transpose(-1, -2).contiguous().transpose(-1, -2),
             "v_first": h0.transpose(-1, -2).contiguous()}[layout]
    before = state.clone()
    o, ht = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                             output_final_state=True,
                                             use_qk_l2norm_in_kernel=True,
                                             state_v_first=layout == "v_first")
    if layout == "v_first":
        ht = ht.transpose(-1, -2)
    res = check_outputs((o, ht), (ro, rh))
    assert res.ok, res.reason
    assert torch.equal(state, before)                      # input state untouched


def test_recurrent_varlen_and_no_state():
    """With cu_seqlens the token-recurrent prefill kernel runs (L2 norm in it); no initial
    state means zeros; output_final_state=False gives None."""
    _, torch_rec = _torch_fns()
    q, k, v, g, beta, _ = _fla_inputs(1, 9, seed=3)
    cu = torch.tensor([0, 4, 9], device=DEVICE)
    o, ht = fused_recurrent_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu,
                                             output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
    qr, kr = q.repeat_interleave(2, 2), k.repeat_interleave(2, 2)
    for n, (s, e) in enumerate([(0, 4), (4, 9)]):
        ro, rh = torch_rec(qr[:, s:e], kr[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e],
                           output_final_state=True, use_qk_l2norm_in_kernel=True)
        res = check_outputs((o[:, s:e], ht[n:n + 1]), (ro, rh))
        assert res.ok, res.reason
    assert fused_recurrent_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)[1] is None


def test_expanded_single_head_is_read_once():
    """q/k of one head expanded to the value heads (head stride 0) run as that one head."""
    q, k, v, g, beta, h0 = _fla_inputs(1, 3, H=1, seed=4)
    qe, ke = q.expand(1, 3, 4, 16), k.expand(1, 3, 4, 16)
    assert qe.stride(2) == 0
    o1, s1 = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                              output_final_state=True)
    o2, s2 = fused_recurrent_gated_delta_rule(qe, ke, v, g, beta, initial_state=h0,
                                              output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


@pytest.mark.parametrize("fn", [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule])
@pytest.mark.parametrize("change, exc, name", [
    (dict(q=lambda x: x.float()), TypeError, "q"),
    (dict(g=lambda x: x.bfloat16()), TypeError, "g"),
    (dict(beta=lambda x: x[:, :, :2]), ValueError, "beta"),
    (dict(initial_state=lambda x: x[:1]), ValueError, "initial_state"),
    (dict(use_gate_in_kernel=True), ValueError, "use_gate_in_kernel"),
    (dict(cu_seqlens=torch.tensor([0, 1, 2])), ValueError, "cu_seqlens"),
    (dict(bogus=1), TypeError, "bogus"),
])
def test_bad_inputs_name_the_argument(fn, change, exc, name):
    q, k, v, g, beta, h0 = _fla_inputs(2, 2, seed=5)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)
    for key, val in change.items():
        args[key] = val(args[key]) if callable(val) else val
    before = h0.clone()
    with pytest.raises(exc, match=name):
        fn(**args)
    assert torch.equal(h0, before)


# ----------------------------------------------------------------------------- L2 norm
# use_qk_l2norm_in_kernel in the chunked prefill: the norms are factors inside the kernels
# (the intra-chunk kernel computes and stores them, every walk reads them); each path the
# plan can take, against the float32 reference on f32-normalised q and k.

def _l2n(x):
    x = x.float()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _norm_reference(q, k, v, g, beta, h0, lens):
    """FLA-layout float32 reference (``[1, T, ..]``, ``h0`` ``[N, HV, K, V]`` or None) of
    the call with ``q``, ``k`` L2-normalised in float32."""
    from kernels.reference import _run_tokens
    H, HV, D = q.shape[2], v.shape[2], q.shape[3]
    qn, kn = _l2n(q[0]), _l2n(k[0])
    o = torch.zeros(q.shape[1], HV, D)
    hs, t = [], 0
    for n, L in enumerate(lens):
        S0 = h0[n].float().cpu() if h0 is not None else torch.zeros(HV, D, D)
        on, S = _run_tokens(S0, qn[t:t + L].cpu(), kn[t:t + L].cpu(), v[0, t:t + L].cpu(),
                            g[0, t:t + L].exp().cpu(), beta[0, t:t + L].float().cpu(),
                            D ** -0.5, HV // H)
        o[t:t + L] = on
        hs.append(S)
        t += L
    return o.bfloat16()[None], torch.stack(hs)


def _norm_inputs(lens, H, HV, D, seed):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    # rows of very different norms (what the L2 norm is for): 0.05 .. 20
    rs = lambda: torch.exp(torch.empty(1, T, H, 1).uniform_(-3, 3, generator=gen))  # noqa: E731
    q = (torch.randn(1, T, H, D, generator=gen) * rs()).bfloat16()
    k = (torch.randn(1, T, H, D, generator=gen) * rs()).bfloat16()
    v = torch.randn(1, T, HV, D, generator=gen).bfloat16()
    g = -torch.rand(1, T, HV, generator=gen) * 0.3
    beta = torch.rand(1, T, HV, generator=gen).bfloat16()
    h0 = torch.randn(len(lens), HV, D, D, generator=gen) * 0.1
    return q, k, v, g, beta, h0


def _rules(**patches):
    from contextlib import ExitStack
    from unittest import mock

    from kernels.prefill import plan as plan_mod
    stack = ExitStack()
    if patches:
        stack.enter_context(mock.patch.multiple(plan_mod, **patches))
    stack.callback(plan_mod.clear_plan_cache)
    plan_mod.clear_plan_cache()
    return stack


@pytest.mark.parametrize("lens, H, HV, D, state, rules, path", [
    pytest.param([7, 13], 2, 4, 16, True, {}, "recurrent", id="recurrent"),
    pytest.param([50, 30], 2, 4, 64, True, {}, "single", id="single-gva"),  # walkers: D >= 64 on a GPU
    pytest.param([90, 3, 0, 77], 4, 4, 16, False, {}, "walk", id="walk-hq=hv-nostate"),
    pytest.param([150, 41], 1, 2, 32, True, dict(walk_transposed_rule=lambda *a, **k: True),
                 "walk", id="walk-transposed"),
    pytest.param([150, 41], 1, 2, 32, True, dict(walk_transposed_rule=lambda *a, **k: False),
                 "walk", id="walk-untransposed"),
    pytest.param([140, 5, 100], 2, 4, 16, True, dict(cp_segment_chunks=lambda *a: 1),
                 "cp", id="cp"),
    pytest.param([200, 70, 1], 2, 4, 16, True,
                 dict(cp_segment_chunks=lambda *a: 1, cp_long=lambda T, N: True,
                      cp_long_segment_chunks=lambda T, N: 1, cp_split=lambda s: False),
                 "cp_long", id="cp-long"),
    pytest.param([260, 77], 2, 2, 16, True,
                 dict(cp_segment_chunks=lambda *a: 2, cp_long=lambda T, N: True,
                      cp_long_segment_chunks=lambda T, N: 2, cp_split=lambda s: True),
                 "cp_long_split", id="cp-long-split-hq=hv"),
])
def test_chunk_l2norm_in_kernel(lens, H, HV, D, state, rules, path):
    """``use_qk_l2norm_in_kernel=True`` on q/k rows of norms 0.05 to 20: every path of the
    plan (the recurrent kernel, one launch with walkers, the walk either way, chained CP,
    the long path with and without the device split), varlen with partial last chunks and
    an empty sequence, with and without an initial state, GVA and HQ == HV: the float32
    reference on normalised q/k under the contest rule, no separate norm launch, and the
    same call without the norm on pre-normalised inputs close to it."""
    from unittest import mock

    from kernels.prefill import plan as plan_mod
    from kernels.prefill import qk_norm
    q, k, v, g, beta, h0 = (x.to(DEVICE) for x in _norm_inputs(lens, H, HV, D, seed=11))
    h0 = h0 if state else None
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=DEVICE)
    ref = _norm_reference(q, k, v, g, beta, h0, lens)
    qc, kc = q.clone(), k.clone()
    with _rules(**rules), mock.patch.object(qk_norm, "qk_l2norm_kernel") as sep:
        o, ht = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                       output_final_state=True, cu_seqlens=cu,
                                       use_qk_l2norm_in_kernel=True)
        # the call's plan (remembered on its key, the norm's q/k heads included)
        plan = plan_mod.call_plan(sum(lens), len(lens), HV, D, q.device, None, None,
                                  qk_heads=H)
        # without the norm the same inputs give other outputs (the option reaches the kernels)
        o_raw, _ = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)
    assert sep.call_count == 0                              # no separate norm launch
    assert plan.path == path and plan.qk_heads == H
    assert torch.equal(q, qc) and torch.equal(k, kc)        # inputs untouched
    res = check_outputs((o, ht), ref)
    assert res.ok, f"{res.reason} (max abs {res.max_abs_err:.3e})"
    assert not check_outputs((o_raw,), (ref[0],)).ok
