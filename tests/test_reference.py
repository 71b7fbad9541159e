"""kernels.reference against formulations written independently here.

1. A float64 *chunked* form (the WY / UT-transform matrix form of the gated
   delta rule with chunk 16), written from the math of docs/design.md ("The computation") and not
   from the token loop in ``kernels/reference.py``.
2. Decode reference == prefill reference on length-1 sequences.
3. FLA's own naive recurrent (and chunk) references when fla imports here.
"""
from __future__ import annotations

import math

import pytest
import torch

from kernels.checks import check_outputs
from kernels.reference import decode_reference, gates_reference, prefill_reference
from kernels.spec import CONTEST, GDNShape, make_decode_inputs, make_prefill_inputs

SMALL = GDNShape(2, 4, 16)
TINY_GVA4 = GDNShape(1, 4, 32)


# --------------------------------------------------------------------------- float64 chunked form

def _chunk_wy(S, q, k, v, logdec, beta, scale, C=16):
    """One sequence, one value head, float64, chunks of ``C`` tokens.

    With ``G`` the in-chunk cumulative log decay and ``S`` the ``[K,V]`` state
    entering the chunk, the pseudo-values ``U`` solve the unit lower-triangular
    system ``(I + A) U = diag(beta) (V - diag(exp G) K S)`` with
    ``A[i,j] = beta_i exp(G_i - G_j) k_i.k_j`` for ``j < i``; then
    ``O = scale (diag(exp G) Q S + (M * Q K^T) U)`` with ``M[i,j] = exp(G_i - G_j)``
    for ``j <= i``, and ``S' = exp(G_last) S + K^T diag(exp(G_last - G)) U``.
    """
    L = q.shape[0]
    out = torch.zeros(L, v.shape[1], dtype=torch.float64)
    for s in range(0, L, C):
        e = min(s + C, L)
        Q, K, V, g, bt = q[s:e], k[s:e], v[s:e], logdec[s:e], beta[s:e]
        n = e - s
        G = torch.cumsum(g, 0)
        diff = G[:, None] - G[None, :]
        lower_strict = torch.ones(n, n, dtype=torch.bool).tril(-1)
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        decay_strict = torch.where(lower_strict, diff, -math.inf).exp()
        decay_incl = torch.where(lower, diff, -math.inf).exp()
        A = bt[:, None] * decay_strict * (K @ K.T)
        rhs = bt[:, None] * (V - G.exp()[:, None] * (K @ S))
        U = torch.linalg.solve_triangular(torch.eye(n, dtype=torch.float64) + A, rhs,
                                          upper=False, unitriangular=True)
        out[s:e] = scale * (G.exp()[:, None] * (Q @ S) + (decay_incl * (Q @ K.T)) @ U)
        S = G[-1].exp() * S + K.T @ ((G[-1] - G).exp()[:, None] * U)
    return out, S


def chunked_reference_f64(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
    """Prefill in float64 via :func:`_chunk_wy`; returns float64 ``(out [T,HV,D], state [N,HV,D,D])``."""
    T, hq, d = q.shape
    hv = v.shape[1]
    group = hv // hq
    scale = 1 / math.sqrt(d) if not scale else scale
    f = torch.float64
    logdec = -A_log.to(f).exp() * torch.nn.functional.softplus(a.to(f) + dt_bias.to(f))
    beta = torch.sigmoid(b.to(f))
    bounds = [int(x) for x in cu_seqlens]
    N = len(bounds) - 1
    out = torch.zeros(T, hv, d, dtype=f)
    new_state = torch.zeros(N, hv, d, d, dtype=f)
    for n in range(N):
        bos, eos = bounds[n], bounds[n + 1]
        for h in range(hv):
            hk = h // group  # grouped value attention
            S0 = state[n, h].to(f).T if state is not None else torch.zeros(d, d, dtype=f)
            o, S = _chunk_wy(S0, q[bos:eos, hk].to(f), k[bos:eos, hk].to(f), v[bos:eos, h].to(f),
                             logdec[bos:eos, h], beta[bos:eos, h], scale)
            out[bos:eos, h] = o
            new_state[n, h] = S.T
    return out, new_state


def _assert_matches_f64(out, st, out64, st64):
    """bf16 output within one bf16 rounding (+ f32 noise) of float64; f32 state tight."""
    assert out.dtype == torch.bfloat16 and st.dtype == torch.float32
    err = (out.double() - out64).abs()
    bound = 2.0 ** -8 * out64.abs() + 1e-4 * max(1.0, float(out64.abs().max()))
    assert bool((err <= bound).all()), f"output off by up to {float((err - bound).max()):.3g}"
    torch.testing.assert_close(st.double(), st64, rtol=1e-4, atol=1e-5)


PREFILL_CASES = [
    pytest.param([1], CONTEST, torch.int64, True, None, id="T1"),
    pytest.param([70], CONTEST, torch.int64, True, None, id="T70-contest"),
    pytest.param([70, 0, 5], CONTEST, torch.int32, True, None, id="lens[70,0,5]-int32"),
    pytest.param([0, 3], SMALL, torch.int64, True, 0.0, id="lens[0,3]-scale0"),
    pytest.param([17, 33, 1], SMALL, torch.int64, False, None, id="lens[17,33,1]-nostate"),
    pytest.param([130], SMALL, torch.int32, True, 0.5, id="T130-int32-scale0.5"),
    pytest.param([5, 9], TINY_GVA4, torch.int64, True, None, id="lens[5,9]-HQ1-HV4"),
]


@pytest.mark.parametrize("lens,shape,cu_dtype,with_state,scale", PREFILL_CASES)
def test_prefill_reference_matches_chunked_f64(lens, shape, cu_dtype, with_state, scale):
    inp = make_prefill_inputs(lens, shape, seed=sum(lens) + 1, cu_dtype=cu_dtype,
                              with_state=with_state, scale=scale)
    before = {n: t.clone() for n, t in inp.items() if isinstance(t, torch.Tensor)}
    out, st = prefill_reference(**inp)
    T, N = sum(lens), len(lens)
    assert out.shape == (T, shape.num_v_heads, shape.head_dim)
    assert st.shape == (N, shape.num_v_heads, shape.head_dim, shape.head_dim)
    out64, st64 = chunked_reference_f64(**inp)
    _assert_matches_f64(out, st, out64, st64)
    for n, t in before.items():  # inputs untouched
        assert torch.equal(inp[n], t), n


def test_empty_sequence_keeps_its_state():
    inp = make_prefill_inputs([4, 0, 2], SMALL, seed=9)
    _, st = prefill_reference(**inp)
    assert torch.equal(st[1], inp["state"][1])
    inp["state"] = None
    _, st = prefill_reference(**inp)
    assert torch.equal(st[1], torch.zeros_like(st[1]))


def test_scale_none_equals_zero_equals_inverse_sqrt_d():
    inp = make_prefill_inputs([6], SMALL, seed=4)
    outs = [prefill_reference(**{**inp, "scale": s})[0] for s in (None, 0, 0.0, 1 / 4)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_state_none_equals_zero_state():
    inp = make_prefill_inputs([5, 7], SMALL, seed=6, with_state=False)
    a = prefill_reference(**inp)
    b = prefill_reference(**{**inp, "state": torch.zeros(2, 4, 16, 16)})
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_int32_and_int64_cu_seqlens_agree():
    i64 = make_prefill_inputs([9, 0, 4], SMALL, seed=8)
    i32 = {**i64, "cu_seqlens": i64["cu_seqlens"].to(torch.int32)}
    a, b = prefill_reference(**i64), prefill_reference(**i32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --------------------------------------------------------------------------- decode

DECODE_CASES = [
    pytest.param(1, CONTEST, None, id="B1-contest"),
    pytest.param(4, CONTEST, 0.0, id="B4-contest-scale0"),
    pytest.param(5, SMALL, 0.3, id="B5-small-scale0.3"),
]


def _decode_as_prefill(inp):
    B = inp["q"].shape[0]
    out = {n: (t[:, 0] if n in ("q", "k", "v", "a", "b") else t) for n, t in inp.items()}
    out["cu_seqlens"] = torch.arange(B + 1, dtype=torch.int64)
    return out


@pytest.mark.parametrize("B,shape,scale", DECODE_CASES)
def test_decode_reference_matches_chunked_f64(B, shape, scale):
    inp = make_decode_inputs(B, shape, seed=B, scale=scale)
    state0 = inp["state"].clone()
    out, st = decode_reference(**inp)
    assert out.shape == (B, 1, shape.num_v_heads, shape.head_dim) and out.dtype == torch.bfloat16
    assert torch.equal(inp["state"], state0)
    out64, st64 = chunked_reference_f64(**_decode_as_prefill(inp))
    _assert_matches_f64(out[:, 0], st, out64, st64)


@pytest.mark.parametrize("B,shape,scale", DECODE_CASES)
def test_decode_equals_prefill_on_length_one(B, shape, scale):
    inp = make_decode_inputs(B, shape, seed=10 + B, scale=scale)
    d_out, d_st = decode_reference(**inp)
    p_out, p_st = prefill_reference(**_decode_as_prefill(inp))
    assert torch.equal(d_out[:, 0], p_out)
    assert torch.equal(d_st, p_st)


def test_gates_reference():
    A_log = torch.tensor([0.0, math.log(4.0)])
    dt_bias = torch.tensor([0.0, 1.0])
    a = torch.tensor([[0.0, -1.0]], dtype=torch.bfloat16)
    b = torch.tensor([[0.0, 2.0]], dtype=torch.bfloat16)
    decay, beta = gates_reference(A_log, a, dt_bias, b)
    sp = torch.nn.functional.softplus(torch.tensor([0.0, 0.0]))
    torch.testing.assert_close(decay, torch.exp(-torch.tensor([1.0, 4.0]) * sp)[None])
    torch.testing.assert_close(beta, torch.sigmoid(torch.tensor([[0.0, 2.0]])))
    assert decay.dtype == beta.dtype == torch.float32


# --------------------------------------------------------------------------- FLA naive references

def _fla_naive():
    try:
        from fla.ops.gated_delta_rule.naive import (naive_chunk_gated_delta_rule,
                                                    naive_recurrent_gated_delta_rule)
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        pytest.skip(f"fla's naive gated delta rule does not import here: {type(e).__name__}: {e}")
    return naive_recurrent_gated_delta_rule, naive_chunk_gated_delta_rule


def _fla_prefill(fn, inp, **kw):
    """Run FLA's naive reference per sequence: heads expanded for GVA, state k-first."""
    q, k, v = inp["q"], inp["k"], inp["v"]
    group = v.shape[1] // q.shape[1]
    decay, beta = gates_reference(inp["A_log"], inp["a"], inp["dt_bias"], inp["b"])
    g = decay.log()
    bounds = inp["cu_seqlens"].tolist()
    outs, states = [], []
    for n in range(len(bounds) - 1):
        s, e = bounds[n], bounds[n + 1]
        h0 = inp["state"][n].transpose(-1, -2)[None] if inp["state"] is not None else None
        if e == s:
            outs.append(v.new_zeros(0, *v.shape[1:], dtype=torch.float32))
            states.append(h0[0] if h0 is not None else torch.zeros(v.shape[1], *v.shape[2:],
                                                                   v.shape[2]))
            continue
        o, h = fn(q=q[None, s:e].repeat_interleave(group, 2), k=k[None, s:e].repeat_interleave(group, 2),
                  v=v[None, s:e], beta=beta[None, s:e], g=g[None, s:e], scale=inp["scale"] or None,
                  initial_state=h0, output_final_state=True, **kw)
        outs.append(o[0].float())
        states.append(h[0])
    return torch.cat(outs).to(torch.bfloat16), torch.stack(states).transpose(-1, -2).contiguous()


@pytest.mark.parametrize("which", ["recurrent", "chunk"])
@pytest.mark.parametrize("lens,with_state", [
    pytest.param([1], True, id="T1"),
    pytest.param([70, 0, 5], True, id="lens[70,0,5]"),
    pytest.param([33], False, id="T33-nostate"),
])
def test_prefill_reference_matches_fla_naive(which, lens, with_state):
    recurrent, chunk = _fla_naive()
    inp = make_prefill_inputs(lens, CONTEST, seed=len(lens) + 20, with_state=with_state)
    ref = prefill_reference(**inp)
    fn = recurrent if which == "recurrent" else chunk
    kw = {} if which == "recurrent" else {"chunk_size": 64}
    got = _fla_prefill(fn, inp, **kw)
    res = check_outputs(got, ref)
    assert res.ok, res.reason
    assert res.rel_l2_err < 1e-4, res.as_dict()


@pytest.mark.parametrize("lens,shape,cu_dtype,with_state,scale", PREFILL_CASES)
def test_chunked_reference_matches_the_token_loop(lens, shape, cu_dtype, with_state, scale):
    from kernels.reference import prefill_reference_chunked

    inp = make_prefill_inputs(lens, shape, seed=sum(lens) + 1, cu_dtype=cu_dtype,
                              with_state=with_state, scale=scale)
    before = {n: t.clone() for n, t in inp.items() if isinstance(t, torch.Tensor)}
    out, st = prefill_reference_chunked(**inp)
    out64, st64 = chunked_reference_f64(**inp)
    _assert_matches_f64(out, st, out64, st64)
    ref_out, ref_st = prefill_reference(**inp)
    assert torch.allclose(st, ref_st, atol=1e-4, rtol=1e-4)
    assert (out.float() - ref_out.float()).abs().max() <= 2 * 2.0 ** -8 * max(
        1.0, float(ref_out.float().abs().max()))   # bf16 outputs: at most a rounding apart
    for n, t in before.items():
        assert torch.equal(inp[n], t), n


def test_chunked_reference_chunk_size_does_not_matter():
    from kernels.reference import prefill_reference_chunked

    inp = make_prefill_inputs([70, 0, 5], SMALL, seed=3)
    o64, s64 = prefill_reference_chunked(**inp, chunk=64)
    o16, s16 = prefill_reference_chunked(**inp, chunk=16)
    assert torch.allclose(s64, s16, atol=1e-5, rtol=1e-5)
