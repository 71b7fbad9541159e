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
