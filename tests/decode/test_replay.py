"""Replay decode (CPU: Triton interpreter): a checkpoint written back every ``L`` tokens and a
ring of residuals. Every output is checked against the standard recurrence (the float32
references ``decode_steps_reference`` / ``decode_reference``) and each call's checkpoint and
ring against ``replay_decode_reference``; rollback, pools with padding, a bf16 checkpoint,
and bad input (errors naming the argument; NaN-marked sequences where the check needs a sync).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.checks import check_close
from kernels.decode import ReplayRing, gdn_replay_decode
from kernels.reference import (decode_reference, decode_steps_reference, replay_decode_reference,
                               replay_state_reference)
from kernels.spec import GDNShape, make_decode_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = GDNShape(1, 2, 16)     # HQ=1, HV=2, D=16: one 16-row program per (sequence, head)
CFG = "BV16-w1-s1-t1"
TOKENS = ("q", "k", "v", "a", "b")


def _inputs(B, T=1, seed=0, **kw):
    return make_decode_inputs(B, SMALL, seed=seed, device=DEVICE, tokens=T, **kw)


def _ring(rows, L, **kw):
    return ReplayRing.empty(rows, SMALL.num_q_heads, SMALL.num_v_heads, SMALL.head_dim, L,
                            device=DEVICE, **kw)


def _tokens(inp, t0, t1):
    """Tokens ``t0 .. t1-1`` of a multi-token input set (the rest of the call's arguments)."""
    out = {n: inp[n][:, t0:t1].contiguous() for n in TOKENS}
    return dict(out, A_log=inp["A_log"], dt_bias=inp["dt_bias"])


def _same_ring(got: ReplayRing, want: ReplayRing, rows):
    """Headers equal; the live entries of ``rows`` equal (k, g) or close (u)."""
    assert torch.equal(got.head, want.head), (got.head.tolist(), want.head.tolist())
    assert torch.equal(got.count, torch.zeros_like(got.count))
    C = got.capacity
    for r in rows:
        start, n = want.head[r].tolist()
        pos = [(start + i) % C for i in range(n)]
        assert torch.equal(got.k[r, pos], want.k[r, pos])
        assert torch.allclose(got.g[r, pos], want.g[r, pos], rtol=1e-6, atol=1e-6)
        assert check_close(got.u[r, pos], want.u[r, pos], name="ring.u").ok


@pytest.mark.parametrize("L", [1, 2, 4, 8])
def test_single_tokens_match_the_standard_recurrence(L):
    """``L + 3`` one-token calls (one write-back at least): every output within the contest
    rule of the multi-step float32 reference; each call's checkpoint and ring equal the
    replay reference's; the checkpoint is the reference state ``n`` tokens back."""
    B, N = 2, L + 3
    inp = _inputs(B, N, seed=L)
    ref_out, ref_final, ref_states = decode_steps_reference(**inp, record_steps=range(1, N + 1))
    state, ring = inp["state"].clone(), _ring(B, L)
    for t in range(N):
        step = _tokens(inp, t, t + 1)
        want_out, want_state, want_ring = replay_decode_reference(**step, state=state,
                                                                  ring=ring)
        out, got = gdn_replay_decode(**step, state=state, ring=ring, config=CFG)
        assert got is state
        assert check_close(out[:, 0].float(), ref_out[:, t], name="output").ok, t
        assert check_close(out, want_out, name="output").ok
        assert check_close(state, want_state, name="checkpoint").ok
        _same_ring(ring, want_ring, range(B))
        n = int(ring.head[0, 1])
        assert int(ring.head[1, 1]) == n == (t % L) + 1
        behind = t + 1 - n     # tokens folded into the checkpoint
        want = ref_states[behind] if behind else inp["state"]
        assert check_close(state, want, name="checkpoint").ok
    assert check_close(replay_state_reference(state, ring), ref_final, name="state now").ok


@pytest.mark.parametrize("T, L, accepted", [
    (4, 4, [2, 4, 1, 3, 2]),        # half the drafts on average; rollback every call
    (3, 5, [3, 1, 2, 3]),
    (2, 1, [1, 2, 1]),              # L < T: a write-back on every call
])
def test_speculative_calls_with_rollback(T, L, accepted):
    """Verify ``T`` tokens per call, keep ``accepted[c]`` of them (the next call rolls the
    rest back): every output equals the standard decode's from the state after the
    accepted tokens (``decode_reference`` with intermediate states); the final state is
    the reference's after the accepted tokens."""
    B, calls = 2, len(accepted)
    inp = _inputs(B, T * calls, seed=11)
    state, ring = inp["state"].clone(), _ring(B, L)
    ref = inp["state"].clone()
    back = None
    for c, acc in enumerate(accepted):
        step = _tokens(inp, c * T, (c + 1) * T)
        want_out, _, inter = decode_reference(**step, state=ref, intermediate_states=True)
        out, _ = gdn_replay_decode(**step, state=state, ring=ring, rollback=back, config=CFG)
        assert check_close(out, want_out, name="output").ok, c
        ref = inter[:, acc - 1].contiguous()
        back = torch.full((B,), T - acc, dtype=torch.int32, device=DEVICE)
    n = ring.head[:, 1].clone()
    ring.head[:, 1] -= back      # the last rollback, as the next call would do it
    assert check_close(replay_state_reference(state, ring), ref, name="state now").ok
    assert bool((n >= T).all()), "the last call's tokens must stay in the ring"


def test_pool_with_padding_and_a_bf16_checkpoint():
    """A bf16 pool, slots at random with padding: outputs, checkpoints and rings equal the
    replay reference's at every call (with a rollback); padding outputs are zeros; slots no
    sequence names (and padding's) keep their state and ring bit for bit."""
    B, P, L, T = 3, 5, 2, 2
    inp = _inputs(B, 3 * T, seed=5, pool_size=P, state_dtype=torch.bfloat16)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEVICE)
    pool, ring = inp.pop("state"), _ring(P, L)
    inp.pop("state_indices")
    before_pool, before_ring = pool.clone(), ring.clone()
    back = None
    for c in range(3):
        step = _tokens(inp, c * T, (c + 1) * T)
        want_out, want_pool, want_ring = replay_decode_reference(
            **step, state=pool, state_indices=idx, ring=ring, rollback=back)
        out, got = gdn_replay_decode(**step, state=pool, state_indices=idx, ring=ring,
                                     rollback=back, config=CFG)
        assert got is pool and pool.dtype == torch.bfloat16
        assert check_close(out, want_out, name="output").ok
        assert torch.count_nonzero(out[1]) == 0, "padding: zeros"
        assert check_close(pool, want_pool, name="checkpoint").ok
        _same_ring(ring, want_ring, (3, 0))
        back = torch.tensor([1, 5, 0], dtype=torch.int32, device=DEVICE)  # padding's: ignored
    for s in (1, 2, 4):
        assert torch.equal(pool[s], before_pool[s]) and torch.equal(ring.head[s],
                                                                   before_ring.head[s])
        assert torch.equal(ring.u[s], before_ring.u[s]) and torch.equal(ring.k[s],
                                                                       before_ring.k[s])


def test_unchecked_bad_values_give_nan_and_touch_nothing():
    """check_values=False (the CUDA default): a slot >= P, a repeated slot, a corrupt ring
    header and a rollback past the ring give those sequences NaN outputs and leave their
    state and ring as they were; status holds the slot bits; the rest run as usual."""
    from kernels.decode.kernel import SLOT_PAST_POOL, SLOT_REPEATED
    B, P, L = 6, 6, 4
    inp = _inputs(B, 1, seed=7, pool_size=P)
    pool, ring = inp.pop("state"), _ring(P, L)
    inp.pop("state_indices")
    ring.head[4] = torch.tensor([0, 9], dtype=torch.int32)      # corrupt: n > max(L, 4)
    ring.head[5] = torch.tensor([1, 1], dtype=torch.int32)
    idx = torch.tensor([0, 9, 2, 2, 4, 5], dtype=torch.int32, device=DEVICE)
    back = torch.tensor([0, 0, 0, 0, 0, 2], dtype=torch.int32, device=DEVICE)  # 2 > n = 1
    before_pool, before_ring = pool.clone(), ring.clone()
    status = torch.full((1,), -1, dtype=torch.int32, device=DEVICE)
    out, _ = gdn_replay_decode(**inp, state=pool, state_indices=idx, ring=ring, rollback=back,
                               check_values=False, status=status, config=CFG)
    assert int(status) == SLOT_REPEATED | SLOT_PAST_POOL
    for i in (1, 2, 3, 4, 5):
        assert bool(out[i].isnan().all()), i
    assert bool(out[0].isfinite().all())
    for s in range(1, P):
        assert torch.equal(pool[s], before_pool[s]), s
        assert torch.equal(ring.head[s], before_ring.head[s]), s
        assert torch.equal(ring.u[s], before_ring.u[s]), s
    ok_idx = torch.tensor([0, -1, -1, -1, -1, -1], dtype=torch.int32, device=DEVICE)
    want_out, _, want_ring = replay_decode_reference(**inp, state=before_pool,
                                                     state_indices=ok_idx, ring=before_ring)
    assert check_close(out[0], want_out[0], name="output").ok
    assert torch.equal(ring.head[0], want_ring.head[0])


def _bad(change):
    """(inputs, ring, kwargs) for a dense call of B=2, T=1 with ``change`` applied."""
    def make():
        inp, ring, kw = _inputs(2, 1, seed=3), _ring(2, 2), {}
        ring.head[:, 1] = 1
        change(inp, ring, kw)
        return inp, ring, kw
    return make


def _ring_with(**fields):
    def change(inp, ring, kw):
        kw["ring"] = dataclasses.replace(ring, **fields)
    return change


BAD = [
    pytest.param(_bad(lambda i, r, kw: kw.update(ring=r.head)), TypeError,
                 "ring must be a ReplayRing", id="ring-not-a-ring"),
    pytest.param(_bad(lambda i, r, kw: _ring_with(u=r.u.to(torch.bfloat16))(i, r, kw)),
                 TypeError, "ring.u", id="ring-u-dtype"),
    pytest.param(_bad(lambda i, r, kw: _ring_with(k=r.k[:1].clone())(i, r, kw)), ValueError,
                 "ring.k", id="ring-rows"),
    pytest.param(_bad(lambda i, r, kw: _ring_with(g=r.g[:, :, :1].clone())(i, r, kw)),
                 ValueError, "ring.g", id="ring-g-heads"),
    pytest.param(_bad(lambda i, r, kw: _ring_with(L=9)(i, r, kw)), ValueError, "ring.k",
                 id="ring-L-not-its-tensors"),
    pytest.param(_bad(lambda i, r, kw: _ring_with(L=0)(i, r, kw)), ValueError, "ring.L",
                 id="ring-L-zero"),
    pytest.param(_bad(lambda i, r, kw: i.update({n: i[n].repeat(1, 5, *([1] * (i[n].dim() - 2)))
                                                  for n in TOKENS})),
                 ValueError, "at most 4 per call", id="T-past-max-tokens"),
    pytest.param(_bad(lambda i, r, kw: kw.update(rollback=torch.ones(3, dtype=torch.int32))),
                 ValueError, "rollback", id="rollback-shape"),
    pytest.param(_bad(lambda i, r, kw: kw.update(rollback=torch.ones(2))), TypeError, "rollback",
                 id="rollback-float"),
    pytest.param(_bad(lambda i, r, kw: kw.update(rollback=torch.tensor([0, 2], dtype=torch.int32,
                                                                       device=DEVICE))),
                 ValueError, r"rollback must lie in \[0, n\]", id="rollback-past-ring"),
    pytest.param(_bad(lambda i, r, kw: r.head.__setitem__((1, 1), 5)), ValueError, "ring.head",
                 id="corrupt-header"),
    pytest.param(_bad(lambda i, r, kw: r.count.__setitem__(0, 1)), ValueError, "ring.count",
                 id="counter-not-reset"),
    pytest.param(_bad(lambda i, r, kw: kw.update(status=torch.zeros(1, dtype=torch.int32))),
                 ValueError, "status", id="status-dense"),
    pytest.param(_bad(lambda i, r, kw: i.update(q=i["q"].float())), TypeError, "q", id="q-float"),
]


@pytest.mark.parametrize("make, exc, match", BAD)
def test_bad_inputs_raise_naming_the_argument_before_writing(make, exc, match):
    inp, ring, kw = make()
    kw.setdefault("ring", ring)
    before = [inp["state"].clone(), ring.clone()]
    with pytest.raises(exc, match=match):
        gdn_replay_decode(**inp, check_values=True, **kw)
    assert torch.equal(inp["state"], before[0])
    assert torch.equal(ring.head, before[1].head) and torch.equal(ring.u, before[1].u)


def test_replay_config_widens_the_table_config_only_where_the_batch_fills_the_gpu():
    """The replay's default config is the standard step's, widened to REPLAY_MIN_ROWS rows
    per program (same warps, one tile) once that still gives every SM two programs; off
    CUDA (no SM count), at small batches and where the table is already as wide it stays."""
    from kernels.decode.replay import REPLAY_MIN_ROWS, replay_config_for
    from kernels.decode.table import config_for_device

    d, hv = 128, 8
    # the table replay_config_for reads for "cpu": the built-in one, on a GPU host too
    std1 = config_for_device(1, "cpu", d)          # BV8
    assert std1.BV * std1.V_TILES < REPLAY_MIN_ROWS
    # B=1: 1 * 8 * 128/16 = 64 programs at 16 rows, fewer than two per SM of 132
    assert replay_config_for(1, d, hv, "cpu", n_sm=132) == std1
    wide = replay_config_for(1, d, hv, "cpu", n_sm=32)          # 64 >= 2 * 32: widened
    assert (wide.BV, wide.V_TILES, wide.num_warps) == (REPLAY_MIN_ROWS, 1, std1.num_warps)
    assert replay_config_for(1, d, hv, "cpu") == std1            # no SM count: the table's
    std64 = config_for_device(64, "cpu", d)
    assert std64.BV * std64.V_TILES >= REPLAY_MIN_ROWS
    assert replay_config_for(64, d, hv, "cpu", n_sm=1) == std64  # already as wide


@pytest.mark.parametrize("make, exc, match", BAD)
def test_bad_inputs_raise_after_a_good_call_of_the_signature(make, exc, match):
    """A signature checked once (kernels.decode.replay: repeats skip the metadata checks):
    every bad input is still rejected, the values (ring headers, rollback) checked per call."""
    from kernels.decode import replay
    replay.clear_calls()
    good = _bad(lambda i, r, kw: None)
    for _ in range(2):   # the first records, the second replays
        inp, ring, kw = good()
        gdn_replay_decode(**inp, ring=ring, check_values=True)
    test_bad_inputs_raise_naming_the_argument_before_writing(make, exc, match)
    assert len(replay._CALLS) == 1 and next(iter(replay._CALLS.values())).launches


@pytest.mark.parametrize("pooled", [False, True], ids=["dense", "pool"])
def test_recorded_replay_launch_equals_the_normal_path_bit_for_bit(pooled):
    """The launch recorded on a signature's first call, replayed with other tensors (state,
    ring, rollback) of the signature, gives the bits of the normal path (a first call)."""
    from kernels.decode import replay
    replay.clear_calls()
    for seed in range(3):
        inp = _inputs(2, 2, seed=seed, **({"pool_size": 4} if pooled else {}))
        ring = _ring(inp["state"].shape[0], 3)
        ring.head[:, 1] = seed % 2
        back = torch.tensor([seed % 2, 0], dtype=torch.int32, device=DEVICE)
        runs = []
        for fresh in (False, True):
            calls = dict(replay._CALLS)
            if fresh:
                replay.clear_calls()
            st, rg = inp["state"].clone(), ring.clone()
            out, _ = gdn_replay_decode(**dict(inp, state=st), ring=rg, rollback=back,
                                       config=CFG)
            runs.append((out, st, rg.k, rg.u, rg.g, rg.head))
            replay._CALLS.update(calls)
        assert all(torch.equal(x, y) for x, y in zip(*runs))
    (c,) = replay._CALLS.values()
    assert len(c.launches) == 1


def test_table_slug_of_a_cpu_device_string_is_none_on_a_gpu_host_too(monkeypatch):
    """``"cpu"`` given as a string reads the built-in table even where CUDA is available
    (a string has no ``.type``: it was once taken for a CUDA device, so a GPU host's
    ``config_for_device(B, "cpu")`` read that GPU's table)."""
    import torch
    from kernels.decode import table

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert table._current_slug("cpu") is None
    assert table._current_slug(torch.device("cpu")) is None
