"""Token-recurrent prefill: one launch, each state tile read once and written once.

Per (sequence, value head) the state is walked token by token in registers, like a decode
step repeated: the rows of ``S`` are updated with the decode kernel's own step
(:func:`kernels.decode.kernel.update_tile`, gates by :func:`kernels.decode.kernel.token_gates`)
for every token of the sequence, the output of each token stored as it is formed, and the
final state stored once. No chunking: no intra-chunk solve, no intermediates, no second
launch, so a short prompt costs one launch plus ``L`` serial token steps (``L`` the
longest sequence) where the chunked path (:mod:`.pipeline`) pays for at least one 64-token
chunk and its solve. The step is ``O(D^2)`` CUDA-core work per token and head (no tensor
cores), so past a few dozen tokens the chunked path wins; :func:`.config.recurrent_rule`
picks between them (the crossover is measured in notebook 02).

Grid: one program per ``BV`` state rows of one (sequence, value head), ``N * HV * D / BV``
programs of :data:`RECURRENT_TILE`: eight warps share each tile, so a token's row reductions
are short; the per-token chain is latency, not bytes, and the decode table's tiles (tuned for
one token's bytes) were up to 2x slower per token (docs/notes/recurrent_prefill.md). Each
program loads the inputs of token ``t + 2`` before it updates its rows with token ``t``.
Varlen through ``cu_seqlens`` (:func:`.chunk_index.seq_bounds`: in bounds for
any values), the initial state optional; unchecked ``cu_seqlens`` are checked by every
program before it walks (:mod:`.guard`: NaN outputs and status bits, no sync, no extra
launch). CUDA-graph capturable: no host sync, no allocation but the outputs.
"""
from __future__ import annotations

import functools

from .. import interpret

interpret.install()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..decode.kernel import l2_normalize, token_gates, update_tile  # noqa: E402
from ..decode.config import DecodeConfig  # noqa: E402
from ..launch import FastLaunch  # noqa: E402
from .chunk_index import cu_status, seq_bounds  # noqa: E402
from .guard import guard_outputs  # noqa: E402

__all__ = ["recurrent_prefill_kernel", "recurrent_fwd", "recurrent_tile", "RECURRENT_TILE"]

#: State tile of the recurrent kernel, whatever ``N`` (the path takes short calls only, so
#: ``N`` is small): chosen by a probe of five tiles on an H200 (docs/notes/recurrent_prefill.md).
RECURRENT_TILE = DecodeConfig.from_name("BV8-w8-s1-t1")


#: Tokens whose inputs one program loads together, before it walks them: the walk waits
#: for memory once per block, not once per token (docs/notes/recurrent_prefill.md). The
#: kernel's block is written out for 8 tokens: changing this means rewriting that loop.
TOKEN_BLOCK = tl.constexpr(8)


@triton.jit
def _token_loads(q, k, v, a, b, t, eos, i_hq, i_hv, o_qk, o_v, HQ: tl.constexpr,
                 HV: tl.constexpr, D: tl.constexpr):
    """Token ``t``'s ``q``, ``k`` (``[NC, BK]``), ``v`` (this program's ``[BV]``), ``a``,
    ``b`` as stored (bf16); zeros past ``eos`` (nothing read there)."""
    m = t < eos
    p_qk = (t * HQ + i_hq) * D + o_qk
    p_g = t * HV + i_hv
    return (tl.load(q + p_qk, mask=m, other=0.0), tl.load(k + p_qk, mask=m, other=0.0),
            tl.load(v + p_g * D + o_v, mask=m, other=0.0), tl.load(a + p_g, mask=m, other=0.0),
            tl.load(b + p_g, mask=m, other=0.0))


@triton.jit
def _token_step(b_h, b_q, b_k, b_v, b_decay, b_beta, scale, QK_NORM: tl.constexpr):
    """The state's step for one token from its loaded inputs and gates:
    ``(new rows, o [BV])``; ``QK_NORM``: ``q`` and ``k`` L2-normalised first."""
    b_k = b_k.to(tl.float32)
    b_q = b_q.to(tl.float32)
    if QK_NORM:
        b_k = l2_normalize(b_k)
        b_q = l2_normalize(b_q)
    return update_tile(b_h, b_k[:, None, :], (b_q * scale)[:, None, :], b_v.to(tl.float32),
                       b_decay, b_beta)


@triton.jit(do_not_specialize=["T", "N"])
def recurrent_prefill_kernel(
    q,              # [T, HQ, D] bf16
    k,              # [T, HQ, D] bf16
    v,              # [T, HV, D] bf16
    h0,             # [N, HV, D(v), D(k)] f32 initial state, k-last (read only if HAS_H0)
    ht,             # [N, HV, D(v), D(k)] f32 out: final state
    o,              # [T, HV, D] bf16 out
    A_log,          # [HV] f32
    a,              # [T, HV] bf16 raw decay gate input
    dt_bias,        # [HV] f32
    b,              # [T, HV] bf16 raw beta gate input
    cu_seqlens,     # [N+1] int32/int64
    status,         # [1] int32 out: the guard's bits (GUARD and HAS_STATUS) or None
    scale,          # f32 output scale
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    HQ: tl.constexpr,
    HV: tl.constexpr,
    D: tl.constexpr,
    BV: tl.constexpr,               # state rows per program
    BK: tl.constexpr,               # K chunk width of the row layout (divides D)
    HAS_H0: tl.constexpr,
    GUARD: tl.constexpr,            # NaN outputs if cu_seqlens is invalid (.guard)
    HAS_STATUS: tl.constexpr,       # GUARD: store the status bits into status
    GATES: tl.constexpr = "raw",    # "raw": a, b raw; "log": a = g (log decay), b = beta
    QK_NORM: tl.constexpr = False,  # L2-normalise q and k per head in the kernel
):
    NV: tl.constexpr = D // BV
    NC: tl.constexpr = D // BK
    i_p = tl.program_id(0)
    i_v, i_nh = i_p % NV, i_p // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_hq = i_hv // (HV // HQ)
    bos, eos = seq_bounds(cu_seqlens, i_n, T)    # in bounds for any cu_seqlens

    # rows [i_v * BV, (i_v + 1) * BV) of S^T held as [NC, BV, BK] (the decode kernel's layout)
    o_c = tl.arange(0, NC)
    o_kc = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_r = o_c[:, None, None] * BK + o_v[None, :, None] * D + o_kc[None, None, :]
    p_h = (i_n.to(tl.int64) * HV + i_hv) * (D * D) + o_r
    if HAS_H0:
        b_h = tl.load(h0 + p_h).to(tl.float32)
    else:
        b_h = tl.zeros([NC, BV, BK], dtype=tl.float32)
    if GATES == "raw":
        b_A = -tl.exp(tl.load(A_log + i_hv))
        b_dt = tl.load(dt_bias + i_hv)
    else:   # "log": the gates come precomputed in a, b (A_log, dt_bias may be None)
        b_A = 0.0
        b_dt = 0.0
    o_qk = o_c[:, None] * BK + o_kc[None, :]                        # [NC, BK]
    if GUARD:   # after the state's load was issued (in bounds whatever cu_seqlens holds)
        if guard_outputs(cu_status(cu_seqlens, N, T, 128), o, ht, status, T, N, i_p,
                         tl.num_programs(0), HV, D, D, HAS_STATUS, False) != 0:
            return

    # a block of TOKEN_BLOCK tokens: every load and everything that does not depend on the
    # state first (one wait for memory), then the state's serial steps, then one store of
    # the block's outputs. Written out token by token: Triton holds no list of tensors, and
    # every load must come before the first step (a loop would put them back in between)
    o_tb = tl.arange(0, TOKEN_BLOCK)
    for t0 in range(bos, eos, TOKEN_BLOCK):
        q0, k0, v0, a0, b0 = _token_loads(q, k, v, a, b, t0, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        q1, k1, v1, a1, b1 = _token_loads(q, k, v, a, b, t0 + 1, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        q2, k2, v2, a2, b2 = _token_loads(q, k, v, a, b, t0 + 2, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        q3, k3, v3, a3, b3 = _token_loads(q, k, v, a, b, t0 + 3, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        q4, k4, v4, a4, b4 = _token_loads(q, k, v, a, b, t0 + 4, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        q5, k5, v5, a5, b5 = _token_loads(q, k, v, a, b, t0 + 5, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        q6, k6, v6, a6, b6 = _token_loads(q, k, v, a, b, t0 + 6, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        q7, k7, v7, a7, b7 = _token_loads(q, k, v, a, b, t0 + 7, eos, i_hq, i_hv, o_qk, o_v,
                                          HQ, HV, D)
        # the gates of every token of the block, off the state's serial path
        d0, e0 = token_gates(a0, b0, b_A, b_dt, GATES)   # decay, beta
        d1, e1 = token_gates(a1, b1, b_A, b_dt, GATES)   # decay, beta
        d2, e2 = token_gates(a2, b2, b_A, b_dt, GATES)   # decay, beta
        d3, e3 = token_gates(a3, b3, b_A, b_dt, GATES)   # decay, beta
        d4, e4 = token_gates(a4, b4, b_A, b_dt, GATES)   # decay, beta
        d5, e5 = token_gates(a5, b5, b_A, b_dt, GATES)   # decay, beta
        d6, e6 = token_gates(a6, b6, b_A, b_dt, GATES)   # decay, beta
        d7, e7 = token_gates(a7, b7, b_A, b_dt, GATES)   # decay, beta
        # token t0 is always in the sequence; the others past eos keep zeros (not stored)
        b_h, o0 = _token_step(b_h, q0, k0, v0, d0, e0, scale, QK_NORM)
        o1 = tl.zeros_like(o0)
        o2 = tl.zeros_like(o0)
        o3 = tl.zeros_like(o0)
        o4 = tl.zeros_like(o0)
        o5 = tl.zeros_like(o0)
        o6 = tl.zeros_like(o0)
        o7 = tl.zeros_like(o0)
        if t0 + 1 < eos:
            b_h, o1 = _token_step(b_h, q1, k1, v1, d1, e1, scale, QK_NORM)
        if t0 + 2 < eos:
            b_h, o2 = _token_step(b_h, q2, k2, v2, d2, e2, scale, QK_NORM)
        if t0 + 3 < eos:
            b_h, o3 = _token_step(b_h, q3, k3, v3, d3, e3, scale, QK_NORM)
        if t0 + 4 < eos:
            b_h, o4 = _token_step(b_h, q4, k4, v4, d4, e4, scale, QK_NORM)
        if t0 + 5 < eos:
            b_h, o5 = _token_step(b_h, q5, k5, v5, d5, e5, scale, QK_NORM)
        if t0 + 6 < eos:
            b_h, o6 = _token_step(b_h, q6, k6, v6, d6, e6, scale, QK_NORM)
        if t0 + 7 < eos:
            b_h, o7 = _token_step(b_h, q7, k7, v7, d7, e7, scale, QK_NORM)
        # the block's outputs [BV, TOKEN_BLOCK], stored once
        c = o_tb[None, :]
        b_ob = tl.where(c == 0, o0[:, None], tl.where(c == 1, o1[:, None], tl.where(
            c == 2, o2[:, None], tl.where(c == 3, o3[:, None], tl.where(
                c == 4, o4[:, None], tl.where(c == 5, o5[:, None], tl.where(
                    c == 6, o6[:, None], o7[:, None])))))))
        p_o = ((t0 + o_tb)[None, :] * HV + i_hv) * D + o_v[:, None]
        tl.store(o + p_o, b_ob.to(o.dtype.element_ty), mask=(t0 + c < eos))
    tl.store(ht + p_h, b_h)


_LAUNCH = FastLaunch(recurrent_prefill_kernel)


def recurrent_tile(N: int, D: int, device):
    """``(BV, BK, num_warps)`` of the recurrent kernel: :data:`RECURRENT_TILE` fitted to
    ``D`` (``N`` and ``device`` do not change it)."""
    return _tile_of(D)


@functools.lru_cache(maxsize=None)
def _tile_of(D: int):
    cfg = RECURRENT_TILE.fit(D)
    return cfg.BV, cfg.block_k(D), cfg.num_warps


def recurrent_fwd(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht,
                  guard: bool = False, status=None, gates: str = "raw",
                  qk_norm: bool = False) -> None:
    """Launch :func:`recurrent_prefill_kernel` on validated inputs and allocated outputs
    (``o [T, HV, D]`` bf16, ``ht [N, HV, D, D]`` f32). ``guard``: check ``cu_seqlens`` on the
    device (:mod:`.guard`; ``status``: `[1]` int32 for its bits). ``gates="log"``: ``a`` is
    the log decay ``g`` (f32) and ``b`` the post-sigmoid ``beta``; ``qk_norm``: L2-normalise
    ``q`` and ``k`` in the kernel (both for :mod:`kernels.model.fla_compat`)."""
    T, HQ, D = q.shape
    HV = v.shape[1]
    N = cu_seqlens.numel() - 1
    BV, BK, warps = recurrent_tile(N, D, q.device)
    grid = (N * HV * (D // BV),)
    args = (q, k, v, state, ht, o, A_log, a, dt_bias, b, cu_seqlens, status, float(scale),
            T, N)
    has_status = guard and status is not None
    # with validated inputs, what the kernel specialises on beyond addresses and int values
    key = (HQ, HV, D, state is None, status is None, guard, cu_seqlens.dtype, gates, qk_norm,
           a.dtype, b.dtype, A_log is None)
    _LAUNCH.launch_keyed(key, grid, args, lambda: dict(
        HQ=HQ, HV=HV, D=D, BV=BV, BK=BK, HAS_H0=state is not None, GUARD=guard,
        HAS_STATUS=has_status, GATES=gates, QK_NORM=qk_norm, num_warps=warps, num_stages=1))
