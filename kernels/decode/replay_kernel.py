"""Triton kernel of one replay decode call: outputs from a checkpoint and a ring of residuals.

Per sequence the caller keeps a **checkpoint** ``S0`` (the state, k-last, f32 or bf16,
dense row or pool slot) and a **ring** of the ``n <= L`` tokens decoded since it: per
token its key ``k_i`` (bf16, per q/k head), its log decay ``g_i`` and its delta-rule
residual ``u_i = beta_i (v_i - exp(g_i) <row_{i-1}, k_i>)`` (f32, per value head and
state row), so that, per state row (value index ``v``)::

    row_n = exp(G_n) row_0 + sum_{i <= n} exp(G_n - G_i) u_i k_i        (G: cumulative g)

A new token ``t`` needs only ``<row_n, k_t>`` and ``<row_n, q_t>``; the kernel keeps
these two numbers per row and token (``acck``, ``accq``, ``[BV, TP]``)::

    <row_n, x> = exp(G_n) <row_0, x> + sum_i exp(G_n - G_i) u_i <k_i, x>   (x = k_t, q_t)

``<row_0, x>`` are the only ``D``-long reductions of the rows (as in the standard step);
``<k_i, x>`` does not depend on the row (``D``-long products of two vectors per ring
entry and program); the rest is ``n`` scalars per row. The ring's live entries are loaded
at once (``NP`` = a power of two >= ``max(L, max_tokens)`` slots, masked), so reading it
costs one round of loads, not ``n`` dependent ones. Then each new token is the standard
step on those numbers::

    u_t = beta_t (v_t - exp(g_t) <row, k_t>)
    o_t = exp(g_t) <row, q_t> + u_t <k_t, q_t>          (q scaled)

and ``(k_t, g_t, u_t)`` is appended to the ring; later tokens of the call take it like
a ring token. The state rows are read once and **not written**, unless the ring cannot
take the call's ``T`` tokens (``n + T > L``): then ``row_n`` (``n`` rank-1 updates of the
rows, keys and residuals read again from L1/L2 in the rows' layout) is written back as
the new checkpoint, and the ring restarts with this call's tokens. The last call's tokens are
therefore always in the ring: rolling back ``r`` of them (speculative drafts rejected)
is ``n -= r``, done at the start of the next call (``rollback``).

The ring is circular with ``C = max(L, max_tokens) + max_tokens`` entries (header
``start``, ``n <= max(L, max_tokens)`` per sequence): this call's tokens go to
positions ``start + n ... start + n + T - 1`` (mod ``C``), never onto an entry another
program of the sequence may still read. The header is rewritten by the sequence's last
program to have read it (an arrival counter per sequence, ``atomic_add`` as soon as the
header is read, reset to 0 by that program).

Order of a program's memory traffic (what its time is made of): the checkpoint rows and
this call's tokens are loaded first, the header after them (they need only the slot),
the ring once the header is back; the arrival's round trip runs beside the rows' load.
Then the rows' two reductions, the write-back if any, and the stores: one round of
loads before the rows are used, not header -> rows -> ... -> arrival in a row.

Bad input the host did not check (no sync on CUDA): a negative slot is padding (zeros
out, nothing read or written); a slot ``>= P``, a live slot named twice, a ring header
outside ``0 <= start < C``, ``0 <= n <= NMAX`` or a rollback outside ``[0, n]`` give that
sequence NaN outputs and leave its state and ring untouched. With ``HAS_STATUS`` program
0 stores the slot bits of :mod:`.kernel` (``SLOT_REPEATED``, ``SLOT_PAST_POOL``).

One program owns ``BV`` rows (``[BV, D]``, ``D`` contiguous) of one (sequence, value
head); the grid is 1-D, ``B * HV * D / BV`` programs.
"""
from __future__ import annotations

from .. import interpret

interpret.install()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .kernel import any_slot_past_pool, any_slot_repeated, slot_repeated  # noqa: E402

__all__ = ["gdn_replay_kernel"]


@triton.jit
def _col(x, cols, t):
    """Column ``t`` of ``x [BV, TP]`` as ``[BV]``."""
    return tl.sum(tl.where(cols[None, :] == t, x, 0.0), axis=1)


@triton.jit
def _elt(x, cols, t):
    """Element ``t`` of ``x [TP]`` as a scalar."""
    return tl.sum(tl.where(cols == t, x, 0.0), axis=0)


@triton.jit
def gdn_replay_kernel(
    q,            # [B, T, HQ, D] bf16
    k,            # [B, T, HQ, D] bf16
    v,            # [B, T, HV, D] bf16
    h,            # [B or P, HV, D(v), D(k)] f32/bf16 checkpoint (read; written on a flush)
    idx,          # [B] int32/int64 pool slot per sequence (read only if POOLED)
    A_log,        # [HV] f32
    a,            # [B, T, HV] bf16 raw decay gate input
    dt_bias,      # [HV] f32
    b,            # [B, T, HV] bf16 raw beta gate input
    o,            # [B, T, HV, D] bf16 output
    rk,           # [B or P, C, HQ, D] bf16 ring keys
    ru,           # [B or P, C, HV, D] f32 ring residuals
    rg,           # [B or P, C, HV] f32 ring log decays
    rhead,        # [B or P, 2] int32 ring start, length
    rcount,       # [B or P] int32 arrival counter (0 between calls)
    rback,        # [B] int32/int64 entries to drop before this call (read only if HAS_ROLLBACK)
    status,       # [1] int32 out (POOLED and HAS_STATUS)
    scale,        # f32
    P,            # rows of h (pool size)
    L,            # ring length at which the checkpoint is written back
    NMAX,         # most live entries of a valid header, max(L, max tokens per call)
    C,            # ring capacity (entries), NMAX + max tokens per call
    T: tl.constexpr, TP: tl.constexpr, HQ: tl.constexpr, HV: tl.constexpr,
    D: tl.constexpr, BV: tl.constexpr, NP: tl.constexpr, NW: tl.constexpr,
    POOLED: tl.constexpr, HAS_ROLLBACK: tl.constexpr, HAS_STATUS: tl.constexpr,
):
    NV: tl.constexpr = D // BV
    G: tl.constexpr = HV // HQ
    i_p = tl.program_id(0)
    i_v, i_bh = i_p % NV, i_p // NV
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_hq = i_hv // G

    # -- which state and ring row; the checkpoint's rows issued first -----------------------
    # The rows' load needs only the slot, not the ring header: rows and header are in
    # flight together, the ring once the header is back. A dropped sequence's rows are read
    # (a live slot: in bounds) but reach nothing: its outputs are overwritten, stores masked.
    o_v = (i_v * BV + tl.arange(0, BV)).to(tl.int64)
    o_k = tl.arange(0, D)
    cols = tl.arange(0, TP)
    if POOLED:
        i_raw = tl.load(idx + i_b).to(tl.int64)
        live = (i_raw >= 0) & (i_raw < P)
        i_s = tl.where(live, i_raw, 0)
    else:
        i_s = i_b.to(tl.int64)
        live = i_b >= 0
    p_h = h + (i_s * HV + i_hv) * (D * D) + o_v[:, None] * D + o_k[None, :]
    if POOLED:
        b_row = tl.load(p_h, mask=live, other=0.0).to(tl.float32)         # [BV, D] row_0
    else:
        b_row = tl.load(p_h).to(tl.float32)

    # -- this call's tokens: keys, scaled queries, values, raw gates (not the ring's) ----
    o_bt = i_b * T + cols
    m_t = cols < T
    b_K = tl.load(k + (o_bt[:, None] * HQ + i_hq) * D + o_k[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)                              # [TP, D]
    b_Q = tl.load(q + (o_bt[:, None] * HQ + i_hq) * D + o_k[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32) * scale
    b_V = tl.load(v + (o_bt[None, :] * HV + i_hv) * D + o_v[:, None], mask=m_t[None, :],
                  other=0.0).to(tl.float32)                              # [BV, TP]
    b_a = tl.load(a + o_bt * HV + i_hv, mask=m_t, other=0.0)            # raw gates [TP]
    b_b = tl.load(b + o_bt * HV + i_hv, mask=m_t, other=0.0)
    b_A, b_dt = tl.load(A_log + i_hv), tl.load(dt_bias + i_hv)
    if HAS_ROLLBACK:
        r = tl.load(rback + i_b).to(tl.int32)

    # a scheduling fence (no memory is shared through it): without it ptxas (sm_90) issues
    # the header's load first and waits for it before the rows' loads (the ring's address
    # math hoisted above them), i.e. header and rows one after the other again; the gate
    # math comes after it so that no wait for a load precedes the header's load either
    tl.debug_barrier()
    # the header, one copy per thread, reduced over the program: every thread's own load
    # has returned before any thread has start and n (the arrival below relies on it; a
    # scalar load would let one warp arrive while another's load is still in flight)
    o_th = tl.arange(0, 32 * NW)
    start = tl.min(tl.load(rhead + i_s * 2 + 0 * o_th, mask=live, other=0), axis=0)
    n = tl.min(tl.load(rhead + i_s * 2 + 1 + 0 * o_th, mask=live, other=0), axis=0)
    b_x = b_a.to(tl.float32) + b_dt
    b_g = -tl.exp(b_A) * tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(b_x)))   # log decay
    b_beta = tl.sigmoid(b_b.to(tl.float32))

    # -- the header: what is wrong with it ----------------------------------------------
    ring_ok = (start >= 0) & (start < C) & (n >= 0) & (n <= NMAX)
    if HAS_ROLLBACK:
        ring_ok = ring_ok & (r >= 0) & (r <= n)
        n = n - r
    readable = live & ring_ok               # the ring's entries may be read (in bounds)
    n = tl.where(readable, n, 0)
    start = tl.where(readable, start, 0)

    # -- the ring, all live entries at once (one round of loads, not n dependent ones) ----
    o_r = tl.arange(0, NP)
    m_r = o_r < n
    pos_r = ((start + o_r) % C).to(tl.int64)
    b_Kr = tl.load(rk + ((i_s * C + pos_r[:, None]) * HQ + i_hq) * D + o_k[None, :],
                   mask=m_r[:, None], other=0.0).to(tl.float32)          # [NP, D] k_i
    b_Ur = tl.load(ru + ((i_s * C + pos_r[None, :]) * HV + i_hv) * D + o_v[:, None],
                   mask=m_r[None, :], other=0.0)                         # [BV, NP] u_i
    b_gr = tl.load(rg + (i_s * C + pos_r) * HV + i_hv, mask=m_r, other=0.0)   # [NP] g_i

    # -- which sequences run; the header handed on as soon as this program has read it ----
    if POOLED:
        B = tl.num_programs(0) // (HV * NV)
        rep = slot_repeated(idx, i_b, i_raw, B, P, 128)   # while the loads are in flight
        if HAS_STATUS:
            if i_p == 0:   # SLOT_REPEATED (16) | SLOT_PAST_POOL (32)
                tl.store(status, any_slot_repeated(idx, B, P, 16) * 16
                         + any_slot_past_pool(idx, B, P, 128) * 32)
        bad = rep | (i_raw >= P) | (live & ~ring_ok)
    else:
        bad = ~ring_ok
    keep = live & ~bad
    flush = n + T > L                       # the ring cannot take this call's tokens
    # arrival: keep depends on the header's values as every thread of the program loaded
    # them (the reduction above), so a program's atomic issues only once all its header
    # loads have returned; the last to arrive rewrites the header (every other program of
    # the sequence has read it). Relaxed: that data dependency is the ordering needed (an
    # acq_rel atomic waits first for every load in flight, the rows' included); placed
    # here its round trip runs beside the rows' load, not after the outputs' stores
    arrived = tl.atomic_add(rcount + i_s, 1, mask=keep, sem="relaxed")
    last = keep & (arrived == HV * NV - 1)
    tl.store(rhead + i_s * 2, tl.where(flush, (start + n) % C, start), mask=last)
    tl.store(rhead + i_s * 2 + 1, tl.where(flush, T, n + T), mask=last)
    tl.store(rcount + i_s, 0, mask=last)

    b_Gn = tl.sum(b_gr, axis=0)                                          # G_n
    b_UW = b_Ur * tl.where(m_r, tl.exp(b_Gn - tl.cumsum(b_gr, axis=0)), 0.0)[None, :]
    b_dn = tl.exp(b_Gn)                                                  # exp(G_n)

    # <row_n, k_t>, <row_n, q_t> = exp(G_n) <row_0, x> + sum_i exp(G_n - G_i) u_i <k_i, x>:
    # the reductions of the rows' D values are those of row_0 only
    acck = tl.zeros([BV, TP], dtype=tl.float32)
    accq = tl.zeros([BV, TP], dtype=tl.float32)
    for t in tl.static_range(T):
        k_t = tl.sum(tl.where(cols[:, None] == t, b_K, 0.0), axis=0)
        q_t = tl.sum(tl.where(cols[:, None] == t, b_Q, 0.0), axis=0)
        kk = tl.sum(b_Kr * k_t[None, :], axis=1)                         # <k_i, k_t> [NP]
        kq = tl.sum(b_Kr * q_t[None, :], axis=1)                         # <k_i, q_t> [NP]
        ck = b_dn * tl.sum(b_row * k_t[None, :], axis=1) + tl.sum(b_UW * kk[None, :], axis=1)
        cq = b_dn * tl.sum(b_row * q_t[None, :], axis=1) + tl.sum(b_UW * kq[None, :], axis=1)
        acck = tl.where(cols[None, :] == t, ck[:, None], acck)
        accq = tl.where(cols[None, :] == t, cq[:, None], accq)

    if flush:   # row_n becomes the checkpoint; the ring restarts at this call's tokens
        # k_i and u_i again from L1/L2 as vectors of the rows' own layout, with scalar
        # weights: the [BV, D] rows never change layout (b_Kr's and b_UW's layouts differ)
        b_row = b_dn * b_row
        for i in tl.static_range(NP):
            pos_i = (i_s * C + (start + i) % C).to(tl.int64)
            k_i = tl.load(rk + (pos_i * HQ + i_hq) * D + o_k, mask=i < n,
                          other=0.0).to(tl.float32)                      # [D]
            u_i = tl.load(ru + (pos_i * HV + i_hv) * D + o_v, mask=i < n, other=0.0)  # [BV]
            w_i = tl.exp(b_Gn - _elt(tl.cumsum(b_gr, axis=0), o_r, i))  # exp(G_n - G_i)
            b_row += (w_i * u_i)[:, None] * k_i[None, :]                 # 0 if i >= n
        tl.store(p_h, b_row.to(h.dtype.element_ty), mask=keep)

    # -- the new tokens, in order ----------------------------------------------------------
    w_k = keep & (i_v == 0) & (i_hv % G == 0)    # one program per q/k head writes k
    w_g = keep & (i_v == 0)                       # one program per value head writes g
    for t in tl.static_range(T):
        i_bt = i_b * T + t
        pos = ((start + n + t) % C).to(tl.int64)
        dec_t = tl.exp(_elt(b_g, cols, t))
        beta_t = _elt(b_beta, cols, t)
        k_t = tl.sum(tl.where(cols[:, None] == t, b_K, 0.0), axis=0)
        kq = tl.sum(b_Q * k_t[None, :], axis=1)                          # <k_t, q_j> [TP]
        u_t = beta_t * (_col(b_V, cols, t) - dec_t * _col(acck, cols, t))
        b_o = dec_t * _col(accq, cols, t) + u_t * _elt(kq, cols, t)
        b_o = tl.where(bad, float("nan"), tl.where(keep, b_o, 0.0))
        tl.store(o + (i_bt * HV + i_hv) * D + o_v, b_o.to(o.dtype.element_ty))
        tl.store(ru + ((i_s * C + pos) * HV + i_hv) * D + o_v, u_t, mask=keep)
        tl.store(rk + ((i_s * C + pos) * HQ + i_hq) * D + o_k,
                 k_t.to(rk.dtype.element_ty), mask=w_k)     # bf16 -> f32 -> bf16: exact
        tl.store(rg + (i_s * C + pos) * HV + i_hv, _elt(b_g, cols, t), mask=w_g)
        if t + 1 < T:   # this token enters the later tokens' numbers like a ring token
            kk = tl.sum(b_K * k_t[None, :], axis=1)
            later = cols[None, :] > t
            acck = tl.where(later, dec_t * acck + u_t[:, None] * kk[None, :], acck)
            accq = tl.where(later, dec_t * accq + u_t[:, None] * kq[None, :], accq)
