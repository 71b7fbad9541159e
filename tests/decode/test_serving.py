"""Decode as serving engines call it (CPU: Triton interpreter): a state pool read
and updated in place at per-sequence slots (padding, out-of-range, repeated slots),
several tokens per sequence in one launch with the per-token states for rollback,
and a bf16 state; each against the float32 reference.
"""
from __future__ import annotations

import pytest
import torch

from kernels.checks import check_close, check_outputs
from kernels.decode import gdn_decode
from kernels.reference import decode_reference, decode_steps_reference
from kernels.spec import GDNShape, decode_state_bytes, make_decode_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = GDNShape(2, 4, 32)
TOKENS = ("q", "k", "v", "a", "b")


def _inputs(B, T=1, seed=0, shape=SMALL, **kw):
    return make_decode_inputs(B, shape, seed=seed, device=DEVICE, tokens=T, **kw)


# ----------------------------------------------------------------------------- pool

POOL_CASES = [
    # B, P, T, state dtype, slots (None: the inputs' distinct random slots), config
    pytest.param(3, 8, 1, torch.float32, [5, -1, 2], "BV8-w1-s1-t1", id="B3-P8-pad-middle"),
    pytest.param(4, 4, 2, torch.float32, [3, 0, -7, 1], "BV8-w1-s1-t2-pf", id="B4-P4-T2-pad-t2-pf"),
    pytest.param(2, 6, 3, torch.bfloat16, [-1, 4], "BV16-w2-s1-t1-k16", id="B2-P6-T3-bf16"),
    pytest.param(5, 9, 1, torch.float32, None, None, id="B5-P9-random-slots-default-config"),
    pytest.param(2, 2, 1, torch.int64, [1, 0], "BV32-w2-s1-t1", id="B2-P2-int64-slots-BV32"),
]


@pytest.mark.parametrize("B, P, T, dtype, slots, config", POOL_CASES)
def test_pool_updates_its_slots_in_place(B, P, T, dtype, slots, config):
    state_dtype = torch.float32 if dtype == torch.int64 else dtype
    inp = _inputs(B, T, seed=B + P, pool_size=P, state_dtype=state_dtype)
    if slots is not None:
        inp["state_indices"] = torch.tensor(
            slots, dtype=torch.int64 if dtype == torch.int64 else torch.int32, device=DEVICE)
    pool = inp["state"]
    before = pool.clone()
    ref_out, ref_pool = decode_reference(**inp)

    out, new_pool = gdn_decode(**inp, config=config)

    assert new_pool is pool, "the pool itself is returned (updated in place)"
    res = check_outputs((out, new_pool), (ref_out, ref_pool))
    assert res.ok, res.reason
    live = {int(s) for s in inp["state_indices"].tolist() if s >= 0}
    for s in range(P):
        if s not in live:
            assert torch.equal(pool[s], before[s]), f"slot {s} is not in state_indices but changed"
    for i, s in enumerate(inp["state_indices"].tolist()):
        if s < 0:
            assert torch.count_nonzero(out[i]) == 0, "padding sequence: output must be zeros"
        else:
            assert not torch.equal(pool[s], before[s]), f"slot {s} was not updated"


def test_pool_equals_dense_on_gathered_states():
    """Pooled at slots == dense on the gathered rows, bit for bit, outputs and states."""
    inp = _inputs(3, 2, seed=11, pool_size=6)
    idx = inp["state_indices"].long()
    dense = {n: t for n, t in inp.items() if n != "state_indices"}
    dense["state"] = inp["state"][idx].clone()
    d_out, d_state = gdn_decode(**dense, config="BV8-w1-s1-t1")
    p_out, pool = gdn_decode(**inp, config="BV8-w1-s1-t1")
    assert torch.equal(d_out, p_out)
    assert torch.equal(d_state, pool[idx])


def test_unchecked_slots_past_the_pool_give_nan_and_touch_nothing():
    """check_values=False (the GPU default): a slot >= P is a caller's bug, not padding.

    Its sequence's outputs are NaN and status holds SLOT_PAST_POOL; a negative slot stays
    padding (zeros). The pool is a view into a larger buffer with guard rows on both
    sides; slots past the pool (P, P+1, a huge one) must leave the guard rows
    bit-identical.
    """
    from kernels.decode.kernel import SLOT_PAST_POOL
    from kernels.prefill import describe_status
    B, P, hv, d = 5, 3, SMALL.num_v_heads, SMALL.head_dim
    inp = _inputs(B, 2, seed=3, pool_size=B)
    buf = torch.randn(P + 4, hv, d, d, device=DEVICE)
    buf[2:2 + P] = inp["state"][:P]
    guard = buf.clone()
    pool = buf[2:2 + P]
    inp["state"] = pool.clone()   # what the reference reads
    idx = torch.tensor([P, 1, 2 ** 31 - 1, P + 1, -2], dtype=torch.int32, device=DEVICE)
    status = torch.full((1,), -1, dtype=torch.int32, device=DEVICE)
    out, _, inter = gdn_decode(**{**inp, "state": pool, "state_indices": idx},
                               check_values=False, config="BV8-w1-s1-t1", status=status,
                               intermediate_states=True)
    assert int(status) == SLOT_PAST_POOL and ">= the pool size" in describe_status(status)
    ref_idx = torch.tensor([-1, 1, -1, -1, -1], dtype=torch.int32, device=DEVICE)
    ref_out, ref_pool = decode_reference(**{**inp, "state_indices": ref_idx})
    assert check_outputs((out[1:2], pool), (ref_out[1:2], ref_pool)).ok
    for i in (0, 2, 3):
        assert bool(out[i].isnan().all()) and bool(inter[i].isnan().all())
    assert torch.count_nonzero(out[4]) == 0, "a negative slot is padding: zeros"
    assert torch.equal(buf[:2], guard[:2]) and torch.equal(buf[2 + P:], guard[2 + P:]), \
        "memory outside the pool was written"
    assert torch.equal(buf[2], guard[2]) and torch.equal(buf[4], guard[4]), \
        "slots 0 and 2 (not addressed by a valid index) changed"


def _slots(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


BAD_POOL = [
    pytest.param(lambda i: {**i, "state_indices": i["state_indices"].float()}, {}, TypeError,
                 "state_indices", id="float-slots"),
    pytest.param(lambda i: {**i, "state_indices": i["state_indices"].to(torch.int16)}, {},
                 TypeError, "state_indices", id="int16-slots"),
    pytest.param(lambda i: {**i, "state_indices": i["state_indices"][:2]}, {}, ValueError,
                 "state_indices", id="slots-shape"),
    pytest.param(lambda i: {**i, "state_indices": i["state_indices"].tolist()}, {}, TypeError,
                 "state_indices", id="slots-list"),
    pytest.param(lambda i: {**i, "state_indices": i["state_indices"].to("meta")}, {}, ValueError,
                 "state_indices", id="slots-device"),
    # the host's value checks (the CPU default; on CUDA only when asked: they sync)
    pytest.param(lambda i: {**i, "state_indices": _slots([1, 4, 1])}, {"check_values": True},
                 ValueError, "state_indices must not repeat", id="repeated-slot"),
    pytest.param(lambda i: {**i, "state_indices": _slots([0, 5, -1])}, {"check_values": True},
                 ValueError, "state_indices must be < the pool size", id="slot-out-of-range"),
    pytest.param(lambda i: {**i, "state": i["state"][:, :2]}, {}, ValueError, "state",
                 id="pool-heads"),
    pytest.param(lambda i: i, {"inplace": False}, ValueError, "inplace", id="pool-not-inplace"),
]


@pytest.mark.parametrize("mutate, kwargs, exc, match", BAD_POOL)
def test_bad_pool_inputs_raise_before_writing(mutate, kwargs, exc, match):
    inp = mutate(_inputs(3, seed=1, pool_size=5))
    before = inp["state"].clone()
    with pytest.raises(exc, match=match):
        gdn_decode(**inp, **kwargs)
    assert torch.equal(inp["state"], before), "pool written before the error"


def test_repeated_padding_slots_are_allowed():
    inp = _inputs(3, seed=2, pool_size=4)
    inp["state_indices"] = torch.tensor([-1, 2, -1], dtype=torch.int32, device=DEVICE)
    ref = decode_reference(**inp)
    assert check_outputs(gdn_decode(**inp), ref).ok


@pytest.mark.parametrize("config", ["BV8-w1-s1-t1", "BV8-w1-s1-t2-pf"])
def test_unchecked_repeated_slots_give_nan_and_leave_the_slot(config):
    """check_values=False (the GPU default): a live slot named twice is caught in the
    kernel. Those sequences' outputs and intermediate states are NaN and their slot keeps
    its state; the other sequences (a distinct slot, padding) run as usual; status holds
    SLOT_REPEATED, then 0 on a call without repeats."""
    from kernels.decode.kernel import SLOT_REPEATED
    from kernels.prefill import describe_status
    B, P, T = 5, 6, 2
    inp = _inputs(B, T, seed=4, pool_size=P, shape=GDNShape(1, 1, 16))
    pool = inp["state"]
    before = pool.clone()
    idx = [4, 1, 4, -1, -3]         # sequences 0 and 2 share slot 4
    inp["state_indices"] = torch.tensor(idx, dtype=torch.int32, device=DEVICE)
    status = torch.full((1,), -1, dtype=torch.int32, device=DEVICE)
    out, _, inter = gdn_decode(**inp, check_values=False, config=config, status=status,
                               intermediate_states=True)
    assert int(status) == SLOT_REPEATED and "pool slot" in describe_status(status)
    for i in (0, 2):
        assert bool(out[i].isnan().all()) and bool(inter[i].isnan().all())
    assert torch.equal(pool[4], before[4]), "a repeated slot was written"
    ref_idx = torch.tensor([-1, 1, -1, -1, -1], dtype=torch.int32, device=DEVICE)
    ref_out, ref_pool, ref_inter = decode_reference(
        **{**inp, "state": before.clone(), "state_indices": ref_idx}, intermediate_states=True)
    keep = [1, 3, 4]
    assert check_outputs((out[keep], pool), (ref_out[keep], ref_pool)).ok
    assert check_close(inter[keep], ref_inter[keep], name="intermediate_states").ok
    for s in (0, 2, 3, 4, 5):
        assert torch.equal(pool[s], before[s]), f"slot {s} changed"
    inp["state_indices"] = torch.tensor([0, 1, 2, -1, -1], dtype=torch.int32, device=DEVICE)
    out, _ = gdn_decode(**inp, check_values=False, config=config, status=status)
    assert int(status) == 0 and bool(out.isfinite().all())


def test_repeated_slot_check_spans_blocks():
    """A batch larger than one block of the check (128 slots, 64 for the status): the
    repeat of the first slot by the last sequence is found."""
    from kernels.decode.kernel import SLOT_REPEATED
    B = 130
    inp = _inputs(B, 1, seed=6, pool_size=B, shape=GDNShape(1, 1, 16))
    idx = list(range(B))
    idx[-1] = 0
    inp["state_indices"] = torch.tensor(idx, dtype=torch.int32, device=DEVICE)
    pool, before = inp["state"], inp["state"].clone()
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out, _ = gdn_decode(**inp, check_values=False, config="BV16-w1-s1-t1-k16", status=status)
    assert int(status) == SLOT_REPEATED
    nan_rows = out.flatten(1).isnan().all(1)
    assert nan_rows.tolist() == [True] + [False] * (B - 2) + [True]
    assert torch.equal(pool[0], before[0]) and not torch.equal(pool[1], before[1])


def test_status_needs_a_pool():
    inp = _inputs(2, seed=1)
    with pytest.raises(ValueError, match="status"):
        gdn_decode(**inp, status=torch.zeros(1, dtype=torch.int32, device=DEVICE))
    inp = _inputs(2, seed=1, pool_size=3)
    with pytest.raises(TypeError, match="status"):
        gdn_decode(**inp, status=torch.zeros(1, dtype=torch.int64, device=DEVICE))


# ----------------------------------------------------------------------------- T tokens


@pytest.mark.parametrize("T", [1, 2, 3, 4])
@pytest.mark.parametrize("config", ["BV8-w1-s1-t1", "BV8-w1-s1-t2-pf", "BV16-w2-s1-t2-k16"])
def test_multi_token_matches_reference(T, config):
    inp = _inputs(3, T, seed=20 + T)
    state0 = inp["state"].clone()
    ref_out, ref_state, ref_inter = decode_reference(**inp, intermediate_states=True)
    out, state, inter = gdn_decode(**inp, config=config, intermediate_states=True)
    assert out.shape == (3, T, SMALL.num_v_heads, SMALL.head_dim)
    assert inter.shape == (3, T, SMALL.num_v_heads, SMALL.head_dim, SMALL.head_dim)
    assert check_outputs((out, state), (ref_out, ref_state)).ok
    assert check_close(inter, ref_inter, name="intermediate_states").ok
    assert torch.equal(inter[:, -1], state), "the last intermediate state is the new state"
    assert torch.equal(inp["state"], state0), "dense input state modified"


@pytest.mark.parametrize("T", [2, 3, 4])
def test_rollback_to_any_accepted_token(T):
    """Speculative decoding: after verifying T tokens, keep the state after the
    first j accepted ones. intermediate_states[:, j-1] must equal running only
    those j tokens, and one T-token launch must equal T one-token launches."""
    inp = _inputs(2, T, seed=30 + T)
    out, _, inter = gdn_decode(**inp, intermediate_states=True, config="BV8-w1-s1-t1")
    for j in range(1, T + 1):
        prefix = {n: (t[:, :j].contiguous() if n in TOKENS else t) for n, t in inp.items()}
        o_j, s_j = gdn_decode(**prefix, config="BV8-w1-s1-t1")
        assert torch.allclose(inter[:, j - 1], s_j, atol=1e-6, rtol=1e-5), f"accepted {j}"
        assert torch.equal(out[:, :j], o_j)
    state = inp["state"].clone()
    for t in range(T):
        step = {n: (v[:, t:t + 1].contiguous() if n in TOKENS else v) for n, v in inp.items()}
        o_t, _ = gdn_decode(**{**step, "state": state}, inplace=True, config="BV8-w1-s1-t1")
        assert (o_t.float() - out[:, t:t + 1].float()).abs().max() <= 1e-2
    assert torch.allclose(state, inter[:, -1], atol=1e-6, rtol=1e-5)


def test_multi_token_pooled_with_padding_and_intermediates():
    inp = _inputs(3, 4, seed=40, pool_size=5)
    inp["state_indices"] = torch.tensor([4, -1, 0], dtype=torch.int64, device=DEVICE)
    ref = decode_reference(**inp, intermediate_states=True)
    out, pool, inter = gdn_decode(**inp, intermediate_states=True, config="BV8-w1-s1-t2")
    assert check_outputs((out, pool), ref[:2]).ok
    assert check_close(inter, ref[2], name="intermediate_states").ok
    assert torch.count_nonzero(inter[1]) == 0 and torch.count_nonzero(out[1]) == 0


def test_bad_multi_token_inputs():
    inp = _inputs(2, 3, seed=1)
    with pytest.raises(ValueError, match="^k"):
        gdn_decode(**{**inp, "k": inp["k"][:, :2].contiguous()})
    with pytest.raises(ValueError, match="^a"):
        gdn_decode(**{**inp, "a": inp["a"][:, :1].contiguous()})
    with pytest.raises(ValueError, match="^output"):
        gdn_decode(**inp, output=torch.empty(2, 1, 4, 32, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(TypeError, match="^intermediate_states"):
        gdn_decode(**inp, intermediate_states="yes")


# ----------------------------------------------------------------------------- bf16 state


@pytest.mark.parametrize("T, inplace, config", [
    (1, False, "BV8-w1-s1-t1"), (1, True, "BV32-w2-s1-t1-k16"), (2, False, "BV8-w1-s1-t4-pf"),
    (4, True, "BV16-w1-s1-t2")])
def test_bf16_state_matches_reference(T, inplace, config):
    inp = _inputs(3, T, seed=50 + T, state_dtype=torch.bfloat16)
    state0 = inp["state"].clone()
    ref_out, ref_state = decode_reference(**inp)
    f32_ref = decode_steps_reference(**inp)[1]
    out, state = gdn_decode(**inp, inplace=inplace, config=config)
    assert state.dtype == torch.bfloat16 and ref_state.dtype == torch.bfloat16
    res = check_outputs((out, state), (ref_out, ref_state))
    assert res.ok, res.reason
    # updated in f32 and rounded once: within one bf16 rounding of the f32 result
    assert ((state.float() - f32_ref).abs() <= 2 ** -8 * f32_ref.abs() + 1e-6).all()
    assert (state is inp["state"]) == inplace
    if not inplace:
        assert torch.equal(inp["state"], state0)


def test_bf16_state_halves_the_bytes():
    assert decode_state_bytes(4, SMALL, torch.bfloat16) * 2 == decode_state_bytes(4, SMALL)


def test_contest_shape_bf16_pooled_multi_token():
    """D=128, HV=8: bf16 pool, T=2, intermediates, one padding slot."""
    shape = GDNShape(4, 8, 128)
    inp = make_decode_inputs(2, shape, seed=7, device=DEVICE, tokens=2,
                             state_dtype=torch.bfloat16, pool_size=3)
    inp["state_indices"] = torch.tensor([2, -1], dtype=torch.int32, device=DEVICE)
    ref = decode_reference(**inp, intermediate_states=True)
    out, pool, inter = gdn_decode(**inp, intermediate_states=True, config="BV32-w4-s1-t1-k32")
    assert check_outputs((out, pool), ref[:2]).ok
    assert check_close(inter, ref[2]).ok


# ----------------------------------------------------------------------------- drift reference


def test_steps_reference_is_consecutive_decode_steps():
    """decode_steps_reference over N steps == N single decode_reference steps (f32).

    Equal up to float32 rounding order, not bit for bit: the single steps hand the state on
    in the k-last layout and the step loop keeps it transposed, and a CPU's matmul kernels
    may sum the same products in another order for another layout (bit-equal on the
    machines before 2026-11-26, not on an AVX2 one)."""
    def close(x, y, rtol):
        torch.testing.assert_close(x, y, rtol=rtol, atol=1e-6)

    inp = _inputs(2, 5, seed=60)
    out, final, recorded = decode_steps_reference(**inp, record_steps=(1, 3, 5))
    assert out.dtype == torch.float32 and out.shape == (2, 5, SMALL.num_v_heads, SMALL.head_dim)
    state = inp["state"]
    for t in range(5):
        step = {n: (v[:, t:t + 1].contiguous() if n in TOKENS else v) for n, v in inp.items()}
        o, state = decode_reference(**{**step, "state": state})
        # o is rounded to bf16 once: the f32 output may sit on the other side of a rounding
        close(o[:, 0].float(), out[:, t], rtol=2.0 ** -8)
        if t + 1 in recorded:
            close(recorded[t + 1], state, rtol=1e-5)
    close(final, state, rtol=1e-5)
    # and not trivially: the state after 5 steps is far from the one it started at
    assert (final - inp["state"]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="record_steps"):
        decode_steps_reference(**inp, record_steps=(6,))


# ----------------------------------------------------------------------------- GPU

GPU_SERVING_CONFIGS = ["BV8-w1-s1-t1", "BV32-w4-s1-t1-k32", "BV32-w4-s1-t2-k32-pf",
                       "BV64-w8-s1-t2-k32-pf-ef", None]


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 33, 512])
@pytest.mark.parametrize("T, state_dtype, pooled, inter", [
    (1, torch.float32, True, False), (4, torch.float32, False, True),
    (2, torch.bfloat16, True, True), (1, torch.bfloat16, False, False)])
def test_serving_contest_shape_on_gpu(B, T, state_dtype, pooled, inter, cuda_device):
    """Pool (with a padding and an out-of-range slot, unchecked), T tokens, bf16
    state, intermediates: compiled for the GPU at the contest shape, every config."""
    shape = GDNShape(4, 8, 128)
    inp = make_decode_inputs(B, shape, seed=B + T, device=cuda_device, tokens=T,
                             state_dtype=state_dtype, pool_size=2 * B if pooled else None)
    if pooled and B > 1:
        inp["state_indices"][0] = -1
    ref = decode_reference(**inp, intermediate_states=inter)
    for name in GPU_SERVING_CONFIGS:
        own = dict(inp, state=inp["state"].clone())
        res = gdn_decode(**own, config=name, intermediate_states=inter)
        torch.cuda.synchronize()
        assert check_outputs(tuple(res), tuple(ref)).ok, name
    if pooled:
        P = 2 * B
        buf = torch.zeros(P + 2, 8, 128, 128, dtype=state_dtype, device=cuda_device)
        pool = buf[:P]
        pool.copy_(inp["state"])
        bad = inp["state_indices"].clone()
        bad[-1] = P  # past the pool, unchecked: NaN outputs, nothing read or written
        out, _ = gdn_decode(**{**inp, "state": pool, "state_indices": bad})[:2]
        torch.cuda.synchronize()
        assert torch.count_nonzero(buf[P:]) == 0, "memory past the pool was written"
        assert torch.isnan(out[-1]).all(), "a slot past the pool must not pass for a result"
