"""Each prefill stage alone against a float64 PyTorch formulation of the same stage.

The float64 formulations below restate the math of each module's docstring
with explicit per-chunk loops (and ``torch.linalg`` for the solve), so a
stage can be read and checked without the others. Small shapes: the kernels
run on the Triton interpreter on CPU.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.prefill import chunk_index, context_parallel, gates, intra_chunk  # noqa: E402
from kernels.prefill import state_walk  # noqa: E402
from kernels.spec import GDNShape, make_prefill_inputs, resolve_scale  # noqa: E402

BT = chunk_index.BT
DEV = "cuda" if torch.cuda.is_available() else "cpu"

CASES = [
    pytest.param([100, 0, 28], GDNShape(1, 2, 16), torch.int64, id="D16-lens[100,0,28]-int64"),
    pytest.param([130, 1], GDNShape(2, 4, 32), torch.int32, id="D32-lens[130,1]-int32"),
    pytest.param([64, 5, 0], GDNShape(2, 2, 16), torch.int32, id="D16-G1-lens[64,5,0]-int32"),
]


# --------------------------------------------------------------------------- float64 stages

def chunks(cu, block=BT):
    """(n, c, start, end) of every block of every sequence."""
    bounds = cu.tolist()
    for n in range(len(bounds) - 1):
        for c, s in enumerate(range(bounds[n], bounds[n + 1], block)):
            yield n, c, s, min(s + block, bounds[n + 1])


def ref_gates(x):
    g = -torch.exp(x["A_log"].double()) * F.softplus(x["a"].double() + x["dt_bias"].double())
    beta = torch.sigmoid(x["b"].double())
    gc = torch.empty_like(g)
    for _, _, s, e in chunks(x["cu_seqlens"]):
        gc[s:e] = g[s:e].cumsum(0)
    return g, beta, gc


def expand(t, group):
    return t.double().repeat_interleave(group, dim=1)


def ref_wy(k, v, gc, beta, cu):
    """w = (I + A)^-1 (beta exp(gc) k), u = (I + A)^-1 (beta v) per chunk and head."""
    w = torch.zeros(k.shape[0], v.shape[1], k.shape[2], dtype=torch.float64)
    u = torch.zeros(v.shape, dtype=torch.float64)
    for _, _, s, e in chunks(cu):
        for h in range(v.shape[1]):
            kk, g, bb = k[s:e, h], gc[s:e, h], beta[s:e, h]
            A = torch.tril(bb[:, None] * (kk @ kk.T) * torch.exp(g[:, None] - g[None, :]), -1)
            Ti = torch.eye(e - s, dtype=torch.float64) + A
            w[s:e, h] = torch.linalg.solve_triangular(
                Ti, kk * (bb * torch.exp(g))[:, None], upper=False)
            u[s:e, h] = torch.linalg.solve_triangular(Ti, v[s:e, h].double() * bb[:, None],
                                                      upper=False)
    return w, u


def ref_walk(k, w, u, gc, h0, cu):
    """Chunk states (at their slots), residuals and final states (k-last)."""
    T, H, K = w.shape
    V = u.shape[2]
    N = cu.numel() - 1
    h = torch.full((chunk_index.num_slots(T, N), H, K, V), float("nan"), dtype=torch.float64)
    v_new = torch.zeros(T, H, V, dtype=torch.float64)
    S = (h0.double().transpose(-1, -2).clone() if h0 is not None
         else torch.zeros(N, H, K, V, dtype=torch.float64))
    bounds = cu.tolist()
    for n, c, s, e in chunks(cu):
        slot = bounds[n] // BT + n + c
        for hh in range(H):
            h[slot, hh] = S[n, hh]
            vn = u[s:e, hh] - w[s:e, hh] @ S[n, hh]
            v_new[s:e, hh] = vn
            gl = gc[e - 1, hh]
            kd = k[s:e, hh] * torch.exp(gl - gc[s:e, hh])[:, None]
            S[n, hh] = torch.exp(gl) * S[n, hh] + kd.T @ vn
    return h, v_new, S.transpose(-1, -2)


def ref_output(q, k, gc, h, v_new, cu, scale):
    o = torch.zeros(v_new.shape, dtype=torch.float64)
    bounds = cu.tolist()
    for n, c, s, e in chunks(cu):
        slot = bounds[n] // BT + n + c
        for hh in range(v_new.shape[1]):
            qq, kk, g = q[s:e, hh], k[s:e, hh], gc[s:e, hh]
            A = torch.tril((qq @ kk.T) * torch.exp(g[:, None] - g[None, :]))
            o[s:e, hh] = scale * (torch.exp(g)[:, None] * (qq @ h[slot, hh]) + A @ v_new[s:e, hh])
    return o


def assert_close(actual, expected, tol, name):
    err = (actual.double().cpu() - expected).abs().max().item() if expected.numel() else 0.0
    assert err <= tol, f"{name}: max abs error {err:.3e} > {tol:.1e}"


def make(lens, shape, cu_dtype, with_state=True):
    return make_prefill_inputs(lens, shape, seed=3, cu_dtype=cu_dtype, with_state=with_state,
                               device=DEV)


# --------------------------------------------------------------------------- chunk index

@pytest.mark.parametrize("lens", [
    pytest.param([100, 0, 28, 64, 1], id="lens[100,0,28,64,1]"),
    pytest.param([0, 0], id="lens[0,0]"),
    pytest.param([64, 128, 63, 65], id="lens[64,128,63,65]"),
])
@pytest.mark.parametrize("block", [64, 128], ids=["BT64", "SEG128"])
def test_chunk_index_host_table_and_slots(lens, block):
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV)
    table = chunk_index.prepare_chunk_indices(cu, block).cpu().tolist()
    expect = [[n, c] for n, c, _, _ in chunks(cu.cpu(), block)]
    assert table == expect
    T, N = sum(lens), len(lens)
    slots = [cu[n].item() // block + n + c for n, c in expect]
    assert len(set(slots)) == len(slots), "slot rule must be injective"
    assert all(0 <= s < chunk_index.num_slots(T, N, block) for s in slots)


def test_chunk_index_device_lookup_matches_table():
    """The no-sync grid: every real (sequence, chunk) found once, gap programs exit."""
    lens = [100, 0, 28, 64, 1, 0, 200]
    x = make(lens, GDNShape(1, 1, 16), torch.int32)
    cu = x["cu_seqlens"]
    g = torch.randn(sum(lens), 1, device=DEV)
    by_table = gates.chunk_cumsum(g, cu, chunk_indices=chunk_index.prepare_chunk_indices(cu))
    by_lookup = gates.chunk_cumsum(g, cu)
    torch.testing.assert_close(by_lookup, by_table, rtol=0, atol=0)


# --------------------------------------------------------------------------- stages

def ref_tm(k, q, gc, beta, cu, scale):
    """The "tm" intermediates: ``Tb = (I + A)^-1 diag(beta)`` and ``scale * Aqk`` per chunk
    and head, ``[T, HV, 64]`` (columns past the chunk's end 0)."""
    T, H = gc.shape
    Tb = torch.zeros(T, H, BT, dtype=torch.float64)
    Aqk = torch.zeros(T, H, BT, dtype=torch.float64)
    for _, _, s, e in chunks(cu):
        for h in range(H):
            kk, qq, g, bb = k[s:e, h], q[s:e, h], gc[s:e, h], beta[s:e, h]
            dec = torch.exp(g[:, None] - g[None, :])
            A = torch.tril(bb[:, None] * (kk @ kk.T) * dec, -1)
            Tm = torch.linalg.inv(torch.eye(e - s, dtype=torch.float64) + A)
            Tb[s:e, h, :e - s] = Tm * bb[None, :]
            Aqk[s:e, h, :e - s] = scale * torch.tril((qq @ kk.T) * dec)
    return Tb, Aqk


@pytest.mark.parametrize("lens, shape, cu_dtype", CASES)
def test_gates_stage(lens, shape, cu_dtype):
    x = make(lens, shape, cu_dtype)
    g, beta, gc = ref_gates({n: t.cpu() for n, t in x.items() if torch.is_tensor(t)})
    gc_k, beta_k = gates.chunk_gates(x["A_log"], x["a"], x["dt_bias"], x["b"], x["cu_seqlens"])
    assert_close(beta_k, beta, 1e-6, "beta")
    assert_close(gc_k, gc, 1e-4 * max(1.0, gc.abs().max().item()), "gc (fused gates)")
    g_t, beta_t = gates.gates_torch(x["A_log"], x["a"], x["dt_bias"], x["b"])
    assert_close(beta_t, beta, 1e-6, "beta (torch)")
    gc_t = gates.chunk_cumsum(g_t, x["cu_seqlens"])
    assert_close(gc_t, gc, 1e-4 * max(1.0, gc.abs().max().item()), "gc (cumsum)")


@pytest.mark.parametrize("solve", ["batched", "blocks"])
@pytest.mark.parametrize("storage", ["precise", "compact"])
@pytest.mark.parametrize("lens, shape, cu_dtype", CASES + [
    pytest.param([64, 70], GDNShape(1, 2, 128), torch.int64, id="D128-lens[64,70]-int64")])
def test_intra_chunk_tm_intermediates(lens, shape, cu_dtype, solve, storage):
    """``Tb`` and ``scale * Aqk`` by both solves (the batched one stores ``Tb`` band by
    band), with the raw gates fused in ("compact") or from precomputed gates and the
    host-built chunk table ("precise"); fp32 storage: only the kernel's arithmetic differs
    from float64."""
    x = make(lens, shape, cu_dtype)
    cpu = {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in x.items()}
    _, beta, gc = ref_gates(cpu)
    scale = resolve_scale(None, shape.head_dim)
    Tb_ref, Aqk_ref = ref_tm(expand(cpu["k"], shape.group), expand(cpu["q"], shape.group), gc,
                             beta, cpu["cu_seqlens"], scale)
    if storage == "compact":
        gates_in = dict(a=x["a"], b=x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"])
    else:
        gates_in = dict(gc=gc.float().to(DEV), beta=beta.float().to(DEV),
                        chunk_indices=chunk_index.prepare_chunk_indices(x["cu_seqlens"]))
    Tb, gc2, Aqk = intra_chunk.intra_chunk_fwd(
        x["k"], x["v"], x["cu_seqlens"], x["q"], scale=scale, solve=solve, storage=storage,
        **gates_in)
    assert Tb.shape == Tb_ref.shape == Aqk.shape
    assert Tb.dtype == Aqk.dtype == intra_chunk.STORAGE[storage]
    tol = 2e-4 if storage == "precise" else 1e-2   # bf16: 8 bits of mantissa
    real = torch.zeros(Tb_ref.shape, dtype=torch.bool)   # entries inside a chunk
    for _, _, s, e in chunks(cpu["cu_seqlens"]):
        real[s:e, :, :e - s] = True
    Tb_c = torch.where(real, Tb.double().cpu(), 0.0)    # columns past the end: not read
    assert_close(Tb_c, Tb_ref, tol * max(1.0, Tb_ref.abs().max().item()), "Tb")
    assert_close(torch.where(real, Aqk.double().cpu(), 0.0), Aqk_ref,
                 tol * max(1.0, Aqk_ref.abs().max().item()), "scale * Aqk")
    assert_close(gc2, gc, 1e-4 * max(1.0, gc.abs().max().item()), "gc")


@pytest.mark.parametrize("lens, shape, cu_dtype", CASES)
@pytest.mark.parametrize("with_state", [True, False], ids=["state", "nostate"])
def test_state_walk_stage(lens, shape, cu_dtype, with_state):
    """The walk from float64 ``Tb``, ``scale * Aqk`` (stored fp32) with fp32 products:
    outputs and final states against the float64 WY walk and output formula."""
    x = make(lens, shape, cu_dtype, with_state)
    cpu = {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in x.items()}
    _, beta, gc = ref_gates(cpu)
    k, q = expand(cpu["k"], shape.group), expand(cpu["q"], shape.group)
    scale = resolve_scale(None, shape.head_dim)
    w, u = ref_wy(k, cpu["v"], gc, beta, cpu["cu_seqlens"])
    h_ref, vn_ref, ht_ref = ref_walk(k, w, u, gc, cpu["state"], cpu["cu_seqlens"])
    o_ref = ref_output(q, k, gc, torch.nan_to_num(h_ref), vn_ref, cpu["cu_seqlens"], scale)
    Tb, Aqk = ref_tm(k, q, gc, beta, cpu["cu_seqlens"], scale)
    T, H, D = sum(lens), shape.num_v_heads, shape.head_dim
    o = torch.full((T, H, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    ht = torch.full((len(lens), H, D, D), float("nan"), device=DEV)
    state_walk.state_walk_fwd(x["k"], Tb.float().to(DEV), x["v"], gc.float().to(DEV),
                              x["cu_seqlens"], p=Aqk.float().to(DEV), q=x["q"], scale=scale,
                              initial_state=x["state"], output=o, final_state=ht, BV=16,
                              dot_precision="ieee", out_precision="ieee")
    assert_close(ht, ht_ref, 1e-4, "final state")
    assert_close(o, o_ref, 1e-2 * max(1.0, o_ref.abs().max().item()), "o (bf16)")


@pytest.mark.parametrize("seg_chunks", [1, 2], ids=["SEG1", "SEG2"])
def test_context_parallel_summary_and_combine(seg_chunks):
    """Phase A gives each segment's affine map; chained, the true entering states."""
    lens, shape = [300, 0, 129, 1], GDNShape(1, 2, 16)
    x = make(lens, shape, torch.int64)
    cpu = {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in x.items()}
    _, beta, gc = ref_gates(cpu)
    k = expand(cpu["k"], shape.group)
    w, u = ref_wy(k, cpu["v"], gc, beta, cpu["cu_seqlens"])
    cu = cpu["cu_seqlens"]
    T, N, H, D = sum(lens), len(lens), shape.num_v_heads, shape.head_dim
    seg_t = seg_chunks * BT
    S = chunk_index.num_slots(T, N, seg_t)
    summ = torch.full((S, H, D, 2 * D), float("nan"), device=DEV)
    Tb, _ = ref_tm(k, expand(cpu["q"], shape.group), gc, beta, cu, 1.0)
    state_walk.state_walk_fwd(x["k"], Tb.float().to(DEV), x["v"], gc.float().to(DEV),
                              x["cu_seqlens"], summary=summ, seg_t=seg_t, BV=16,
                              dot_precision="ieee")
    # phase B in float64 from the summaries: S_start(s+1) = M_s S_start(s) + X_s
    s0 = torch.full((S, H, D, D), float("nan"), dtype=torch.float64)
    sm = summ.double().cpu()
    for n in range(N):
        b0, b1 = int(cu[n]), int(cu[n + 1])
        slot0, n_seg = b0 // seg_t + n, max(-(-(b1 - b0) // seg_t), 1)
        s0[slot0] = cpu["state"][n].double().transpose(-1, -2)
        for i in range(n_seg - 1):
            s0[slot0 + i + 1] = sm[slot0 + i, :, :, :D] @ s0[slot0 + i] + sm[slot0 + i, :, :, D:]
    # float64: walk each segment from [I | 0] and from the true state
    h_ref, _, _ = ref_walk(k, w, u, gc, cpu["state"], cu)   # states at chunk slots
    bounds = cu.tolist()
    for n, s, start, end in chunks(cu, seg_t):
        slot = bounds[n] // seg_t + n + s
        chunk_slot = bounds[n] // BT + n + (start - bounds[n]) // BT
        assert_close(s0[slot], h_ref[chunk_slot], 1e-4, f"entering state seq {n} seg {s}")
        if end < bounds[n + 1]:  # not the last segment: check the transition
            S_in = torch.randn(H, D, D, dtype=torch.float64)
            cu_one = torch.tensor([0, end - start])
            _, _, S_out = ref_walk(k[start:end], w[start:end], u[start:end], gc[start:end],
                                   S_in.transpose(-1, -2)[None], cu_one)
            M, X = summ[slot, :, :, :D].double().cpu(), summ[slot, :, :, D:].double().cpu()
            assert_close(M @ S_in + X, S_out[0].transpose(-1, -2), 1e-4,
                         f"transition seq {n} seg {s}")
    # empty sequence: segment 0 hands the initial state through
    assert_close(s0[bounds[1] // seg_t + 1], cpu["state"][1].double().transpose(-1, -2), 0,
                 "empty sequence")
