"""Triton kernel of one GDN decode step (one token per sequence).

State layout is k-last: element ``(k, v)`` of head ``h`` lives at
``state[b, h, v, k]``, so each value index ``v`` owns one contiguous row of
``D`` floats and rows update independently. For row ``v`` (all in fp32)::

    decay = exp(-exp(A_log[h]) * softplus(a[h] + dt_bias[h]))   # once per program
    beta  = sigmoid(b[h])                                       # once per program
    u     = beta * (v_t[v] - decay * <row, k>)                  # delta-rule residual
    row'  = decay * row + u * k
    o[v]  = <row', q * scale>

One program owns ``V_TILES`` tiles of ``BV`` rows of one ``(sequence, value
head)``; the grid is 1-D with the tiles of a head adjacent.

A tile is held as ``[NC, BV, BK]``: each row cut into ``NC = D / BK`` chunks of
``BK`` contiguous floats. Triton spreads the fast ``BK`` axis over ``BK / 4``
lanes (16-byte vectors), then rows over the remaining lanes, and keeps the
``NC`` chunks of a row in one thread's registers; a row reduction is then
in-thread adds plus ``log2(BK / 4)`` shuffles instead of 5. ``BK = D`` gives
the plain ``[BV, D]`` layout of FLA (one row per warp instruction).
"""
from __future__ import annotations

from .. import interpret

interpret.install()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["gdn_decode_kernel"]


@triton.jit
def _update_tile(b_h, b_k, b_qs, b_v, b_decay, b_beta):
    """Update one ``[NC, BV, BK]`` tile of state rows; return ``(new tile, o [BV])``.

    ``b_k``, ``b_qs`` are ``[NC, 1, BK]``; ``b_v`` is ``[BV]``; the rest are scalars.
    """
    # sum over chunks (in-thread) first, then over the chunk width (shuffles)
    b_hk = tl.sum(tl.sum(b_h * b_k, axis=0), axis=1)     # <row, k>        [BV]
    b_u = b_beta * (b_v - b_decay * b_hk)                # residual        [BV]
    # expand as [BV] -> [BV, 1] -> [1, BV, 1]: the layout the reductions produced
    b_u = tl.expand_dims(tl.expand_dims(b_u, 1), 0)
    b_h = b_h * b_decay + b_u * b_k                      # row'            [NC, BV, BK]
    b_o = tl.sum(tl.sum(b_h * b_qs, axis=0), axis=1)     # <row', q*scale> [BV]
    return b_h, b_o


@triton.jit
def gdn_decode_kernel(
    q,            # [B, 1, HQ, D] bf16 queries
    k,            # [B, 1, HQ, D] bf16 keys
    v,            # [B, 1, HV, D] bf16 values
    h0,           # [B, HV, D(v), D(k)] f32 input state, k-last
    ht,           # [B, HV, D(v), D(k)] f32 output state (may be h0: in place)
    A_log,        # [HV] f32 log of the decay rate
    a,            # [B, 1, HV] bf16 raw decay gate input
    dt_bias,      # [HV] f32 bias added to ``a`` before softplus
    b,            # [B, 1, HV] bf16 raw beta gate input (pre-sigmoid)
    o,            # [B, 1, HV, D] bf16 output
    scale,        # f32 output scale
    HQ: tl.constexpr,           # q/k heads
    HV: tl.constexpr,           # value heads (multiple of HQ)
    D: tl.constexpr,            # head size K = V (power of two)
    BV: tl.constexpr,           # state rows per tile
    BK: tl.constexpr,           # K chunk width (divides D); a row is D // BK chunks
    V_TILES: tl.constexpr,      # tiles per program
    PREFETCH: tl.constexpr,     # load tile t+1 before updating tile t
    EVICT: tl.constexpr,        # eviction policy of the state stream ("" or "evict_first")
):
    NV: tl.constexpr = D // (BV * V_TILES)   # programs per (sequence, value head)
    NC: tl.constexpr = D // BK               # chunks per row
    i_p = tl.program_id(0)
    i_v, i_bh = i_p % NV, i_p // NV
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_hq = i_hv // (HV // HQ)

    # -- this program's rows: tiles [i_v*V_TILES, (i_v+1)*V_TILES) of BV rows -----
    o_c = tl.arange(0, NC)                   # chunk index
    o_kc = tl.arange(0, BK)                  # position in a chunk
    o_v = i_v * (V_TILES * BV) + tl.arange(0, BV)
    o_h = (i_bh.to(tl.int64) * (D * D) + o_c[:, None, None] * BK
           + o_v[None, :, None] * D + o_kc[None, None, :])               # [NC, BV, BK]
    p_h0 = h0 + o_h
    p_ht = ht + o_h
    p_v = v + i_bh * D + o_v
    p_o = o + i_bh * D + o_v
    # first tile issued before anything else: its latency covers the gate math
    b_h = tl.load(p_h0, eviction_policy=EVICT)

    # -- per-program vectors and gate scalars, loaded and computed once ----------
    # q, k loaded as [NC, BK] and expanded to [NC, 1, BK]: the compiler then keeps
    # the tile's coalesced layout and moves only these small vectors.
    o_qk = (i_b * HQ + i_hq) * D + o_c[:, None] * BK + o_kc[None, :]     # [NC, BK]
    b_qs = tl.load(q + o_qk).to(tl.float32) * scale
    b_k = tl.load(k + o_qk).to(tl.float32)
    b_qs = b_qs[:, None, :]                             # [NC, 1, BK]
    b_k = b_k[:, None, :]                               # [NC, 1, BK]

    b_x = tl.load(a + i_bh).to(tl.float32) + tl.load(dt_bias + i_hv)
    b_softplus = tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(b_x)))
    b_decay = tl.exp(-tl.exp(tl.load(A_log + i_hv)) * b_softplus)
    b_beta = tl.sigmoid(tl.load(b + i_bh).to(tl.float32))

    # -- walk the tiles ------------------------------------------------------------
    for i_t in range(V_TILES):
        if PREFETCH:  # next tile in flight while this one is updated
            b_nxt = tl.load(p_h0 + BV * D, mask=i_t + 1 < V_TILES, other=0.0,
                            eviction_policy=EVICT)
        b_v = tl.load(p_v).to(tl.float32)
        b_h, b_o = _update_tile(b_h, b_k, b_qs, b_v, b_decay, b_beta)
        tl.store(p_ht, b_h, eviction_policy=EVICT)
        tl.store(p_o, b_o.to(o.dtype.element_ty))
        if PREFETCH:
            b_h = b_nxt
        elif V_TILES > 1:  # next tile only after this one is stored
            b_h = tl.load(p_h0 + BV * D, mask=i_t + 1 < V_TILES, other=0.0,
                          eviction_policy=EVICT)
        p_h0 += BV * D
        p_ht += BV * D
        p_v += BV
        p_o += BV
