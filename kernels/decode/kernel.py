"""Triton kernel of one GDN decode call (``T`` tokens per sequence, state read once).

State layout is k-last: element ``(k, v)`` of head ``h`` lives at
``state[b, h, v, k]``, so each value index ``v`` owns one contiguous row of
``D`` values and rows update independently. The state is f32 or bf16 in
memory; it is widened to f32 on load, updated in f32 for every token, and
rounded once on the final store. For row ``v`` and each token (all in fp32)::

    decay = exp(-exp(A_log[h]) * softplus(a_t[h] + dt_bias[h]))  # per program and token
    beta  = sigmoid(b_t[h])                                       # per program and token
    u     = beta * (v_t[v] - decay * <row, k_t>)                # delta-rule residual
    row'  = decay * row + u * k_t
    o_t[v] = <row', q_t * scale>

One program owns ``V_TILES`` tiles of ``BV`` rows of one ``(sequence, value
head)``; the grid is 1-D with the tiles of a head adjacent. A tile is loaded
once, walks the ``T`` tokens in registers (optionally storing the state after
each token, ``INTERMEDIATE``) and is stored once.

Options for FLA's calling convention (:mod:`kernels.model.fla_compat`): ``GATES="log"``
reads the precomputed log decay ``g`` from ``a`` and ``beta`` from ``b``; ``QK_NORM``
L2-normalises ``q`` and ``k`` per head after loading them (no extra pass over them);
``STATE_KV`` reads and writes the state in FLA's ``[.., K, V]`` layout (element ``(k, v)``
at ``k * D + v``): the same tiles, each thread's loads strided by ``D`` instead of
contiguous (slower per byte than k-last, still one read and one write of the state).

With ``POOLED`` the state is a pool ``[P, HV, D, D]`` and sequence ``b`` uses
slot ``idx[b]``. A slot outside ``[0, P)`` is never read or written: its loads and
stores are masked off and its pointers are formed from slot 0. A negative slot is
padding (the engines' convention): its outputs (and intermediate states) are zeros. A
slot ``>= P`` is a caller's bug, not padding: its outputs (and intermediate states)
are NaN. A live slot named by two or more sequences (they would race on it) is
caught without a sync: each program compares its slot with the batch's ``B``
entries of ``idx`` (:func:`slot_repeated`, while its first tile load is in flight);
every such sequence writes NaN outputs (and intermediate states) and leaves its
slot as it was, the others run as usual. With ``HAS_STATUS`` program 0 stores
:data:`SLOT_REPEATED` and/or :data:`SLOT_PAST_POOL` (or 0) into ``status``
(:func:`any_slot_repeated`, :func:`any_slot_past_pool`).

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

__all__ = ["gdn_decode_kernel", "update_tile", "token_gates", "l2_normalize", "SLOT_REPEATED",
           "SLOT_PAST_POOL"]

#: Status bit of a pooled call in which two sequences name one live slot (after the
#: prefill's ``cu_seqlens`` bits 1...8, :mod:`kernels.prefill.guard`, which words it too).
SLOT_REPEATED = 16
#: Status bit of a pooled call in which a sequence names a slot ``>= P`` (past the pool).
SLOT_PAST_POOL = 32


@triton.jit
def update_tile(b_h, b_k, b_qs, b_v, b_decay, b_beta):
    """Update one ``[NC, BV, BK]`` tile of state rows; return ``(new tile, o [BV])``.

    ``b_k``, ``b_qs`` are ``[NC, 1, BK]``; ``b_v`` is ``[BV]``; the rest are scalars.
    (Also the token step of the recurrent prefill, :mod:`kernels.prefill.recurrent`.)
    """
    # sum over chunks (in-thread) first, then over the chunk width (shuffles). Both row
    # reductions read the old row, so they run side by side: <row', q> = decay <row, q> +
    # u <k, q> leaves one reduction, not two in a row, on the path of each token
    b_hk = tl.sum(tl.sum(b_h * b_k, axis=0), axis=1)     # <row, k>        [BV]
    b_hq = tl.sum(tl.sum(b_h * b_qs, axis=0), axis=1)    # <row, q*scale>  [BV]
    b_kq = tl.sum(tl.sum(b_k * b_qs, axis=0), axis=1)    # <k, q*scale>    [1] (no state)
    b_u = b_beta * (b_v - b_decay * b_hk)                # residual        [BV]
    b_o = b_decay * b_hq + b_u * b_kq                    # <row', q*scale> [BV]
    # expand as [BV] -> [BV, 1] -> [1, BV, 1]: the layout the reductions produced
    b_u = tl.expand_dims(tl.expand_dims(b_u, 1), 0)
    b_h = b_h * b_decay + b_u * b_k                      # row'            [NC, BV, BK]
    return b_h, b_o


@triton.jit
def token_gates(b_a, b_b, b_A, b_dt, GATES: tl.constexpr):
    """``(decay, beta)`` of one token in f32. ``GATES == "raw"``: from the raw gate inputs
    ``a``, ``b`` (scalars) with ``b_A = -exp(A_log)`` and ``b_dt = dt_bias`` of the head;
    ``"log"``: ``a`` is the log decay ``g`` and ``b`` the post-sigmoid ``beta`` (FLA's
    convention, :mod:`kernels.model.fla_compat`; ``b_A``, ``b_dt`` unused)."""
    if GATES == "log":
        return tl.exp(b_a.to(tl.float32)), b_b.to(tl.float32)
    else:
        b_x = b_a.to(tl.float32) + b_dt
        b_softplus = tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(b_x)))
        return tl.exp(b_A * b_softplus), tl.sigmoid(b_b.to(tl.float32))


@triton.jit
def l2_normalize(x):
    """``x / sqrt(sum(x^2) + 1e-6)`` over a whole ``[NC, BK]`` head vector, in f32 (FLA's
    ``use_qk_l2norm_in_kernel``)."""
    return x / tl.sqrt(tl.sum(tl.sum(x * x, axis=1), axis=0) + 1e-6)


@triton.jit
def slot_repeated(idx, i_b, i_s, B, P, BLOCK: tl.constexpr):
    """Whether pool slot ``i_s`` (the raw ``idx[i_b]``) is live (in ``[0, P)``) and named by
    another of the ``B`` sequences too: ``B`` loads of ``idx``, ``BLOCK`` at a time."""
    n = 0
    for j0 in range(0, B, BLOCK):
        o_j = j0 + tl.arange(0, BLOCK)
        s_j = tl.load(idx + o_j, mask=o_j < B, other=-1).to(tl.int64)
        n += tl.sum(((s_j == i_s) & (o_j != i_b) & (o_j < B)).to(tl.int32), axis=0)
    return (i_s >= 0) & (i_s < P) & (n > 0)


@triton.jit
def any_slot_repeated(idx, B, P, BLOCK: tl.constexpr):
    """1 if any live slot of ``idx[:B]`` is named twice, else 0: pairs of ``BLOCK``-entry
    blocks (``(B / BLOCK)^2 / 2`` compares of ``BLOCK^2``)."""
    rep = 0
    for i0 in range(0, B, BLOCK):
        o_i = i0 + tl.arange(0, BLOCK)
        s_i = tl.load(idx + o_i, mask=o_i < B, other=-1).to(tl.int64)
        live = (s_i >= 0) & (s_i < P) & (o_i < B)
        for j0 in range(i0, B, BLOCK):
            o_j = j0 + tl.arange(0, BLOCK)
            s_j = tl.load(idx + o_j, mask=o_j < B, other=-1).to(tl.int64)
            eq = ((s_i[:, None] == s_j[None, :]) & live[:, None]
                  & (o_i[:, None] < o_j[None, :]) & (o_j[None, :] < B))
            rep = tl.maximum(rep, tl.max(tl.max(eq.to(tl.int32), axis=1), axis=0))
    return rep


@triton.jit
def any_slot_past_pool(idx, B, P, BLOCK: tl.constexpr):
    """1 if any entry of ``idx[:B]`` is ``>= P`` (past the pool), else 0."""
    bad = 0
    for j0 in range(0, B, BLOCK):
        o_j = j0 + tl.arange(0, BLOCK)
        s_j = tl.load(idx + o_j, mask=o_j < B, other=-1).to(tl.int64)
        bad = tl.maximum(bad, tl.max((s_j >= P).to(tl.int32), axis=0))
    return bad


@triton.jit
def gdn_decode_kernel(
    q,            # [B, T, HQ, D] bf16 queries
    k,            # [B, T, HQ, D] bf16 keys
    v,            # [B, T, HV, D] bf16 values
    h0,           # [B or P, HV, D(v), D(k)] f32/bf16 input state (or pool), k-last
    ht,           # like h0: output state (may be h0: in place; always h0 when POOLED)
    hi,           # [B, T, HV, D(v), D(k)] intermediate states (read only if INTERMEDIATE)
    idx,          # [B] int32/int64 pool slot per sequence (read only if POOLED)
    A_log,        # [HV] f32 log of the decay rate
    a,            # [B, T, HV] bf16 raw decay gate input
    dt_bias,      # [HV] f32 bias added to ``a`` before softplus
    b,            # [B, T, HV] bf16 raw beta gate input (pre-sigmoid)
    o,            # [B, T, HV, D] bf16 output
    status,       # [1] int32 out: SLOT_REPEATED | SLOT_PAST_POOL or 0 (POOLED and HAS_STATUS)
    scale,        # f32 output scale
    P,            # pool size (slots >= P: NaN outputs, nothing read or written)
    T: tl.constexpr,            # tokens per sequence (>= 1; unrolled)
    HQ: tl.constexpr,           # q/k heads
    HV: tl.constexpr,           # value heads (multiple of HQ)
    D: tl.constexpr,            # head size K = V (power of two)
    BV: tl.constexpr,           # state rows per tile
    BK: tl.constexpr,           # K chunk width (divides D); a row is D // BK chunks
    V_TILES: tl.constexpr,      # tiles per program
    PREFETCH: tl.constexpr,     # load tile t+1 before updating tile t
    EVICT: tl.constexpr,        # eviction policy of the state stream ("" or "evict_first")
    POOLED: tl.constexpr,       # state is a pool read/written at idx[b]
    INTERMEDIATE: tl.constexpr,  # store the state after every token into hi
    HAS_STATUS: tl.constexpr = False,  # POOLED: program 0 stores the call's status bits
    GATES: tl.constexpr = "raw",       # "raw": a, b raw; "log": a = g (log decay), b = beta
    QK_NORM: tl.constexpr = False,     # L2-normalise q and k per head in the kernel
    STATE_KV: tl.constexpr = False,    # state stored [.., K, V] (FLA's layout), else k-last
):
    NV: tl.constexpr = D // (BV * V_TILES)   # programs per (sequence, value head)
    NC: tl.constexpr = D // BK               # chunks per row
    i_p = tl.program_id(0)
    i_v, i_bh = i_p % NV, i_p // NV
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_hq = i_hv // (HV // HQ)

    # -- the state this program updates: row i_b of a dense state, or slot idx[i_b] --
    if POOLED:
        i_raw = tl.load(idx + i_b).to(tl.int64)
        valid = (i_raw >= 0) & (i_raw < P)   # padding and slots past the pool: untouched
        i_s = tl.where(valid, i_raw, 0)
    else:
        i_s = i_b.to(tl.int64)

    # -- this program's rows: tiles [i_v*V_TILES, (i_v+1)*V_TILES) of BV rows -----
    o_c = tl.arange(0, NC)                   # chunk index
    o_kc = tl.arange(0, BK)                  # position in a chunk
    o_v = i_v * (V_TILES * BV) + tl.arange(0, BV)
    if STATE_KV:   # element (k, v) at k * D + v: same tile, columns strided by D
        o_r = (o_c[:, None, None] * BK + o_kc[None, None, :]) * D + o_v[None, :, None]
        TILE: tl.constexpr = BV                  # offset of the next tile of rows
    else:
        o_r = (o_c[:, None, None] * BK + o_v[None, :, None] * D + o_kc[None, None, :])
        TILE: tl.constexpr = BV * D
    p_h0 = h0 + (i_s * HV + i_hv) * (D * D) + o_r
    p_ht = ht + (i_s * HV + i_hv) * (D * D) + o_r
    # first tile issued before anything else: its latency covers the gate math
    if POOLED:
        b_h = tl.load(p_h0, mask=valid, other=0.0, eviction_policy=EVICT).to(tl.float32)
    else:
        b_h = tl.load(p_h0, eviction_policy=EVICT).to(tl.float32)
    if POOLED:
        # a slot named by two sequences would race: both sequences write NaN outputs and
        # leave the slot as it was (checked while the first tile is in flight)
        B = tl.num_programs(0) // (HV * NV)
        rep = slot_repeated(idx, i_b, i_raw, B, P, 128)
        keep = valid & (rep == 0)
        nan_out = rep | (i_raw >= P)   # a repeated slot or one past the pool: NaN outputs
        if HAS_STATUS:
            if i_p == 0:   # SLOT_REPEATED (16) | SLOT_PAST_POOL (32)
                tl.store(status, any_slot_repeated(idx, B, P, 16) * 16
                         + any_slot_past_pool(idx, B, P, 128) * 32)

    if GATES == "raw":
        b_A = -tl.exp(tl.load(A_log + i_hv))
        b_dt = tl.load(dt_bias + i_hv)
    else:   # "log": the gates come precomputed in a, b (A_log, dt_bias may be None)
        b_A = 0.0
        b_dt = 0.0
    o_qk = o_c[:, None] * BK + o_kc[None, :]                              # [NC, BK]

    # -- walk the tiles; each tile takes the T tokens in order -----------------------
    for i_j in range(V_TILES):
        if PREFETCH:  # next tile in flight while this one is updated
            if POOLED:
                b_nxt = tl.load(p_h0 + TILE, mask=valid & (i_j + 1 < V_TILES), other=0.0,
                                eviction_policy=EVICT)
            else:
                b_nxt = tl.load(p_h0 + TILE, mask=i_j + 1 < V_TILES, other=0.0,
                                eviction_policy=EVICT)
        for i_t in tl.static_range(T):   # unrolled: the tokens' loads issue ahead of the updates
            i_bt = i_b * T + i_t
            # q, k loaded as [NC, BK] and expanded to [NC, 1, BK]: the compiler then
            # keeps the tile's coalesced layout and moves only these small vectors.
            b_qs = tl.load(q + (i_bt * HQ + i_hq) * D + o_qk).to(tl.float32)
            b_k = tl.load(k + (i_bt * HQ + i_hq) * D + o_qk).to(tl.float32)
            if QK_NORM:
                b_qs = l2_normalize(b_qs)
                b_k = l2_normalize(b_k)
            b_qs = b_qs * scale
            b_decay, b_beta = token_gates(tl.load(a + i_bt * HV + i_hv),
                                          tl.load(b + i_bt * HV + i_hv), b_A, b_dt, GATES)
            b_v = tl.load(v + (i_bt * HV + i_hv) * D + o_v).to(tl.float32)
            b_h, b_o = update_tile(b_h, b_k[:, None, :], b_qs[:, None, :], b_v, b_decay,
                                   b_beta)
            if POOLED:  # padding: zeros out (whatever its inputs hold); repeated or past: NaN
                b_o = tl.where(nan_out, float("nan"), tl.where(valid, b_o, 0.0))
            tl.store(o + (i_bt * HV + i_hv) * D + o_v, b_o.to(o.dtype.element_ty))
            if INTERMEDIATE:
                b_hi = b_h
                if POOLED:
                    b_hi = tl.where(nan_out, float("nan"), tl.where(valid, b_h, 0.0))
                tl.store(hi + (i_bt * HV + i_hv).to(tl.int64) * (D * D) + o_r,
                         b_hi.to(hi.dtype.element_ty))
        if POOLED:
            tl.store(p_ht, b_h.to(ht.dtype.element_ty), mask=keep, eviction_policy=EVICT)
        else:
            tl.store(p_ht, b_h.to(ht.dtype.element_ty), eviction_policy=EVICT)
        if PREFETCH:
            b_h = b_nxt.to(tl.float32)
        elif V_TILES > 1:  # next tile only after this one is stored
            if POOLED:
                b_h = tl.load(p_h0 + TILE, mask=valid & (i_j + 1 < V_TILES), other=0.0,
                              eviction_policy=EVICT).to(tl.float32)
            else:
                b_h = tl.load(p_h0 + TILE, mask=i_j + 1 < V_TILES, other=0.0,
                              eviction_policy=EVICT).to(tl.float32)
        p_h0 += TILE
        p_ht += TILE
        o_v += BV
        o_r += TILE
