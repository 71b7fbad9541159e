"""Stage 2: the intra-chunk system, its solve, and what the state walk needs from it.

Inside one chunk (local rows ``i, j`` in ``[0, 64)``, value head ``h``, its
q/k head ``h // G``), with ``gc`` the per-chunk cumulative log decay::

    A_ij = beta_i * (k_i . k_j) * exp(gc_i - gc_j)      for i > j, else 0
    Tm   = (I + A)^-1                                    # unit lower triangular
    w    = Tm @ (beta * exp(gc) * k)                     # [64, K]
    u    = Tm @ (beta * v)                               # [64, V]

so that, with ``S0`` the state entering the chunk (``[K, V]``), the
delta-rule residuals of the chunk are ``v_new = u - w @ S0`` (``beta``
included): the serial token recurrence becomes two matrix products (the UT /
WY form). Derivation: unrolling ``S_t = d_t S_{t-1} + beta_t k_t^T (v_t -
k_t d_t S_{t-1})`` gives ``(I + A) v_new = beta v - beta exp(gc) k S0``.

Per ``(chunk, value head)`` program:

1. ``A = beta K K^T * exp(gc_i - gc_j)`` (strictly lower) as one bf16 product;
2. the solve, by ``SOLVE``:

   * ``"batched"`` (the default): the 16 x 16 block formulas in registers,
     :func:`solve_bands` -- the four blocks of each block diagonal multiplied as one
     ``[4, 16, 16]`` batch, the diagonal inverses through their 8 x 8 blocks in bf16x2,
     the off-diagonal blocks in one tf32 pass; no scratch, no barriers;
   * ``"blocks"``: ``A`` through a per-token scratch ``[T, HV, 64]``, the Neumann
     product ``(I-D)(I+D^2)(I+D^4)(I+D^8)`` on each diagonal block, the off-diagonal
     blocks by ``Tm_ij = -Tm_ii sum_{j<=m<i} A_im Tm_mj``, all fp32 ``ieee`` products
     (the accurate preset's solve);
3. store ``Tb = Tm diag(beta)`` and, computed before the solve, ``scale * Aqk`` with
   ``Aqk = (q k^T * exp(gc_i - gc_j))`` for ``j <= i`` (the ``"tm"`` intermediates); the
   walk forms ``v_new = Tb (v - exp(gc) k S0)`` and ``o = scale exp(gc) q S0 + Aqk v_new``
   itself (:mod:`.state_walk`): ``w = Tb exp(gc) k`` and ``u = Tb v`` are never stored.

With ``RAW_GATES`` the kernel also computes ``g``, ``beta`` and the
per-chunk cumulative sum from ``a``, ``b``, ``A_log``, ``dt_bias`` (stage 1
fused in; with ``GATES="log"`` from the precomputed ``g`` and ``beta`` FLA's convention
passes, read from ``a`` and ``b``) and writes ``gc`` for the later stages. With ``WALKERS`` (the one-launch
path) the grid has extra programs that walk the sequences (:func:`_walker`). With
``QK_NORM`` (FLA's ``use_qk_l2norm_in_kernel``) the rows of ``q`` and ``k`` enter
L2-normalised as f32 factors ``rq = 1/|q_t|``, ``rk = 1/|k_t|`` on the products' rows and
columns (``diag(rk) K K^T diag(rk)``, ``diag(rq) Q K^T diag(rk)``), stored to ``qkn`` for
the walks, which multiply them into their gate factors (:mod:`.state_walk`).
"""
from __future__ import annotations

from typing import Optional

from .. import gpu_limits, interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import BT, chunk_of_program, cu_status, num_slots, seq_bounds, slot_of  # noqa: E402
from .dots import mm  # noqa: E402
from .gates import log_decay  # noqa: E402
from .guard import guard_outputs  # noqa: E402
from ..launch import FastLaunch, dtypes  # noqa: E402
from .pdl import grid_trigger, pdl_supported  # noqa: E402
from .state_walk import (check_qk_norms, fused_chunk_step_tm, l2_rnorm,  # noqa: E402
                         load_state_tile, store_state_tile)

__all__ = ["intra_chunk_kernel", "intra_chunk_fwd", "BC", "solve_bands", "SOLVE", "SOLVES",
           "SOLVE_PRECISION", "OFFDIAG_PRECISION", "STORAGE"]

#: Sub-block size of the solve.
BC = 16
#: Default solve: about twice as fast as ``"blocks"`` (docs/notes/prefill.md, "Numbers behind
#: the rules").
SOLVE = "batched"
SOLVES = ("batched", "blocks")
#: Precision of the diagonal inverses by solve. ``"batched"``: Neumann on 8 x 8 blocks,
#: whose powers stay within 35 x the entries, so bf16 hi + lo products suffice (faster than
#: tf32x3 16 x 16 Neumann products at the same hard-input errors). ``"blocks"``: fp32 FMA
#: products. One-pass tf32 / bf16 Neumann products reached errors of 1e14 on correlated keys
#: (:mod:`kernels.stress_inputs`). Numbers: docs/notes/prefill.md, "Numbers behind the rules".
SOLVE_PRECISION = {"batched": "bf16x2", "blocks": "ieee"}
#: Precision of the off-diagonal block products: their operands are bounded by the inverse
#: itself, so one tf32 pass does (hard-input errors close to tf32x3's and the peers';
#: docs/notes/prefill.md, "Numbers behind the rules").
OFFDIAG_PRECISION = {"batched": "tf32", "blocks": "ieee"}
#: dtype of ``Tb`` and ``scale * Aqk`` by ``PrefillConfig.storage``: "compact" bf16 (like
#: FLA's intermediates, half the bytes), "precise" fp32 (the accurate preset's).
STORAGE = {"precise": torch.float32, "compact": torch.bfloat16}


@triton.jit
def _mm(x, y, PREC: tl.constexpr):
    """fp32 product of two small blocks of the solve (``PREC``: ``"ieee"`` FMA products, or
    a tensor-core precision of :mod:`.dots`)."""
    if PREC == "ieee":
        return tl.dot(x, y, input_precision="ieee")
    else:
        return mm(x, y, PREC)


@triton.jit
def _blk(p_At, I: tl.constexpr, J: tl.constexpr, n_t, H: tl.constexpr, BT: tl.constexpr,
         BC: tl.constexpr):
    """Block ``(I, J)`` (``[BC, BC]``) of the chunk's scratch matrix; rows past the end 0."""
    o_c = tl.arange(0, BC)
    return tl.load(p_At + (I * BC + o_c)[:, None] * (H * BT) + J * BC + o_c[None, :],
                   mask=(I * BC + o_c)[:, None] < n_t, other=0.0)


@triton.jit
def _put(p_At, b_X, I: tl.constexpr, J: tl.constexpr, n_t, H: tl.constexpr, BT: tl.constexpr,
         BC: tl.constexpr):
    """Write block ``(I, J)`` of the chunk's scratch matrix (rows past the end skipped)."""
    o_c = tl.arange(0, BC)
    tl.store(p_At + (I * BC + o_c)[:, None] * (H * BT) + J * BC + o_c[None, :], b_X,
             mask=(I * BC + o_c)[:, None] < n_t)


@triton.jit
def _inv_unit_lower(b_A, BC: tl.constexpr, PREC: tl.constexpr):
    """``(I + A)^-1`` of a strictly lower ``[16, 16]`` block: ``(I-A)(I+A^2)(I+A^4)(I+A^8)``
    (exact: ``A^16 = 0``)."""
    o_c = tl.arange(0, BC)
    b_I = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)
    b_T = b_I - b_A
    b_P = b_A
    for _ in tl.static_range(3):
        b_P = _mm(b_P, b_P, PREC)
        b_T = _mm(b_T, b_I + b_P, PREC)
    return b_T


@triton.jit
def _band(X4, D: tl.constexpr):
    """Blocks ``(I, I - D)`` of the block view ``X4`` (``[NB, BC, NB, BC]``: block row,
    row, block column, column) as ``[NB, BC, BC]`` indexed by ``I`` (zeros for ``I < D``)."""
    NB: tl.constexpr = X4.shape[0]
    o_b = tl.arange(0, NB)
    m = (o_b[:, None, None, None] - D) == o_b[None, None, :, None]
    return tl.sum(tl.where(m, X4, 0.0), axis=2)


@triton.jit
def _shift(X3, D: tl.constexpr):
    """``[NB, BC, BC]`` whose entry ``I`` is ``X3[I - D]`` (zeros for ``I < D``)."""
    NB: tl.constexpr = X3.shape[0]
    o_b = tl.arange(0, NB)
    m = (o_b[:, None, None, None] - D) == o_b[None, :, None, None]
    return tl.sum(tl.where(m, X3[None, :, :, :], 0.0), axis=1)


@triton.jit
def solve_bands(b_A, BC: tl.constexpr, PREC: tl.constexpr, OFF_PREC: tl.constexpr):
    """The block diagonals ``(T_0, T_1, T_2, T_3)`` (``[4, BC, BC]`` each, entry ``I`` is
    block ``(I, I - D)``) of ``(I + A)^-1`` for a strictly lower ``[4 BC, 4 BC]`` tile.

    With ``A_D[I]`` block ``(I, I - D)`` of ``A``, by block forward substitution, one block
    diagonal at a time, each product a batch of four ``[BC, BC]`` products::

        T_0 = (I + A_0)^-1
        T_D[I] = -T_0[I] sum_{m=1..D} A_m[I] T_{D-m}[I - m]

    ``T_0`` through the 8 x 8 diagonal blocks ``D8`` of ``A_0`` (``D8^8 = 0``) and its
    lower-left block ``L8``: ``I + A_0 = (I + D8)(I + N)`` with ``N = (I + D8)^-1 L8``,
    ``N^2 = 0``, so ``(I + A_0)^-1 = (I - N)(I + D8)^-1``: the Neumann powers stay within
    ``C(7, 3) = 35 x`` the entries (``C(15, 7) = 6435 x`` for 16 x 16). ``PREC`` /
    ``OFF_PREC``: precision of ``T_0`` / of the further products (:mod:`.dots`, or ``"ieee"``).
    """
    BT_: tl.constexpr = b_A.shape[0]
    NB: tl.constexpr = BT_ // BC
    tl.static_assert(NB == 4)
    A4 = tl.reshape(b_A, (NB, BC, NB, BC))
    o_c = tl.arange(0, BC)
    b_I = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)[None, :, :]
    A0 = _band(A4, 0)
    m8 = (o_c[:, None] // 8) == (o_c[None, :] // 8)
    D8 = tl.where(m8[None, :, :], A0, 0.0)
    P2 = _mm(D8, D8, PREC)
    P4 = _mm(P2, P2, PREC)
    Ti8 = _mm(_mm(b_I - D8, b_I + P2, PREC), b_I + P4, PREC)
    T0 = _mm(b_I - _mm(Ti8, A0 - D8, PREC), Ti8, PREC)
    A1 = _band(A4, 1)
    A2 = _band(A4, 2)
    A3 = _band(A4, 3)
    T1 = -_mm(T0, _mm(A1, _shift(T0, 1), OFF_PREC), OFF_PREC)
    T2 = -_mm(T0, _mm(A2, _shift(T0, 2), OFF_PREC) + _mm(A1, _shift(T1, 1), OFF_PREC),
              OFF_PREC)
    T3 = -_mm(T0, _mm(A3, _shift(T0, 3), OFF_PREC) + _mm(A2, _shift(T1, 2), OFF_PREC)
              + _mm(A1, _shift(T2, 1), OFF_PREC), OFF_PREC)
    return T0, T1, T2, T3


@triton.jit
def _store_band(p_w, X3, b_beta, D: tl.constexpr, n_t, H: tl.constexpr, BC: tl.constexpr):
    """Store block diagonal ``D`` (``X3 [4, BC, BC]``, entry ``I`` = block ``(I, I - D)``;
    ``D < 0``: zeros) of the chunk's ``[BT, BT]`` tile at ``p_w`` (row stride ``H * BT``),
    columns scaled by ``b_beta`` (``[BT]``); blocks outside the tile and rows past the end
    are skipped."""
    NB: tl.constexpr = 4
    o_b = tl.arange(0, NB)
    o_c = tl.arange(0, BC)
    rows = o_b[:, None, None] * BC + o_c[None, :, None]
    cols = (o_b[:, None, None] - D) * BC + o_c[None, None, :]
    if D >= 0:
        # beta of column block I - D, per band entry I: [NB, 1, BC]
        b3 = tl.reshape(b_beta, (NB, BC))
        m = (o_b[:, None, None] - D) == o_b[None, :, None]
        b_bc = tl.sum(tl.where(m, b3[None, :, :], 0.0), axis=1)
        val = X3 * b_bc[:, None, :]
    else:
        val = tl.zeros([NB, BC, BC], dtype=tl.float32)
    m_st = (o_b[:, None, None] >= D) & (o_b[:, None, None] - D < NB) & (rows < n_t)
    tl.store(p_w + rows * (H * NB * BC) + cols, val.to(p_w.dtype.element_ty), mask=m_st)


@triton.jit
def _walker(j, i_h, w, v, k, q, p, gc, o, h0, ht, flags, cu_seqlens, scale, T, N,
            H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
            BT: tl.constexpr, BVW: tl.constexpr, USE_H0: tl.constexpr,
            WALK_PREC: tl.constexpr, INLINE_PREC: tl.constexpr, QK_NORM: tl.constexpr):
    """``WALKERS``: walker ``j`` of head ``i_h`` owns ``BVW`` state columns of one sequence and
    walks its chunks as the walk kernel would (:func:`.state_walk.fused_chunk_step_tm`), each
    chunk once the program of that chunk slot has stored ``Tb``, ``Aqk`` and ``gc`` and
    set its flag (release; the walker acquires it and takes one off, so the flags are back
    to zero when the call ends). The chunk programs never wait and have lower program ids
    in the same head's row of the grid, so they are placed first: no deadlock. A decreasing
    ``cu_seqlens`` (slots of different sequences may overlap, so a walker could wait for a
    flag another walker took) never gets here: every walker goes to
    :func:`.guard.guard_outputs` instead and no chunk program sets a flag (with ``GUARD``,
    any invalid ``cu_seqlens`` does)."""
    NTW: tl.constexpr = V // BVW
    HQ: tl.constexpr = H // G
    i_n = j // NTW
    i_v = j % NTW
    i_hk = i_h // G
    bos, eos = seq_bounds(cu_seqlens, i_n, T)
    if USE_H0:
        b_S = load_state_tile(h0, i_n, i_h, i_v, H, K, V, BVW)
    else:
        b_S = tl.zeros([K, BVW], dtype=tl.float32)
    slot0 = (bos // BT).to(tl.int32) + i_n
    for c in tl.range(0, tl.cdiv(eos - bos, BT), num_stages=1):
        p_f = flags + (slot0 + c) * H + i_h
        while tl.atomic_add(p_f, 0, sem="acquire", scope="gpu") == 0:
            pass
        tl.atomic_add(p_f, -1, sem="relaxed", scope="gpu")
        tl.debug_barrier()
        t0 = bos + c * BT
        b_S = fused_chunk_step_tm(b_S, w, v, k, q, p, gc, o, t0, tl.minimum(eos - t0, BT),
                                  i_h, i_hk, i_v, scale, H, HQ, K, V, BT, BVW, WALK_PREC,
                                  INLINE_PREC, QK_NORM)
    store_state_tile(ht, b_S, i_n, i_h, i_v, H, K, V, BVW)


@triton.jit(do_not_specialize=["T", "N"])
def intra_chunk_kernel(
    q,              # [T, HQ, K] bf16 queries
    k,              # [T, HQ, K] bf16 keys
    v,              # [T, H, V] bf16 values
    a,              # [T, H] bf16 raw decay input (RAW_GATES) or None
    b,              # [T, H] bf16 raw beta input (RAW_GATES) or None
    A_log,          # [H] f32 (RAW_GATES) or None
    dt_bias,        # [H] f32 (RAW_GATES) or None
    gc,             # [T, H] f32 per-chunk cumulative log decay: written (RAW_GATES) or read
    beta,           # [T, H] f32 sigmoid(b), read (not RAW_GATES) or None
    w,              # [T, H, BT] out: Tb = Tm diag(beta)
    p,              # [T, H, BT] out: scale * Aqk
    At,             # [T, H, BT] f32 scratch: A, then Tm ("blocks" solve) or None
    h0,             # [N, H, V, K] f32 initial state, k-last (WALKERS and USE_H0) or None
    ht,             # [N, H, V, K] f32 out: final state (WALKERS) or None
    o,              # [T, H, V] bf16 out: outputs (WALKERS) or None
    flags,          # [>= slots * H] int32, zero between calls (WALKERS) or None
    status,         # [1] int32 out: the guard's status bits (WALKERS and HAS_STATUS) or None
    lb,             # [slots, H] f32 out: log bound of each chunk's transition (STORE_LB) or None
    qkn,            # [T, HQ, 2] f32 out: L2-norm factors (rq, rk) of q, k rows (QK_NORM) or None
    cu_seqlens,     # [N+1] int32/int64
    chunk_indices,  # [NC, 2] int32 (USE_INDICES) or None
    scale,          # output scale
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,            # value heads
    G: tl.constexpr,            # value heads per q/k head
    K: tl.constexpr,            # key head size
    V: tl.constexpr,            # value head size
    BT: tl.constexpr,           # chunk size (64)
    BC: tl.constexpr,           # sub-block size of the solve (16)
    RAW_GATES: tl.constexpr,    # stage 1 fused in
    USE_INDICES: tl.constexpr,  # chunk from the host table (else device lookup)
    SOLVE: tl.constexpr,        # "batched" (registers, solve_bands) or "blocks" (scratch)
    SOLVE_PREC: tl.constexpr,   # precision of the diagonal inverses' products
    OFFDIAG_PREC: tl.constexpr,  # precision of the off-diagonal block products
    PDL_TRIGGER: tl.constexpr = False,  # a PDL-launched next kernel may be placed at once
    WALKERS: tl.constexpr = False,      # one launch: programs past the chunk slots
                                        # walk (sequence, head, BVW columns) chunk by chunk,
                                        # each chunk once its program has flagged it (flags)
    BVW: tl.constexpr = 64,             # state tile width of the walker programs
    USE_H0: tl.constexpr = False,       # WALKERS from h0 (else zeros)
    WALK_PREC: tl.constexpr = "bf16",   # WALKERS: products with the state
    INLINE_PREC: tl.constexpr = "bf16",  # WALKERS: the output products
    GUARD: tl.constexpr = False,        # WALKERS: NaN outputs for any invalid cu_seqlens
                                        # (else only for a decreasing one, see _walker)
    HAS_STATUS: tl.constexpr = False,   # GUARD: store the guard's status bits (.guard)
    STORE_LB: tl.constexpr = False,     # store the chunk's log transition bound into lb
    LB_DIAG: tl.constexpr = True,       # STORE_LB: |k_t|^2 from A's diagonal (else from k)
    GATES: tl.constexpr = "raw",        # RAW_GATES: "raw" a, b (with A_log, dt_bias), or
                                        # "log": a = g (log decay), b = beta (FLA's inputs)
    QK_NORM: tl.constexpr = False,      # q, k rows L2-normalised (factors; stored into qkn)
):
    tl.static_assert(BT == 4 * BC)
    grid_trigger(PDL_TRIGGER)
    # one grid axis, heads fastest: the value heads that share a q/k head run side by side
    # and read its q, k tiles once from DRAM (the second read hits L2)
    i_p, i_h = tl.program_id(0) // H, tl.program_id(0) % H
    if WALKERS:
        # the guard (.guard): an invalid cu_seqlens -> no flags, NaN outputs from the walkers
        st = cu_status(cu_seqlens, N, T, 128)
        if not GUARD:
            st = st & 4   # CU_DECREASING (a literal: triton 3.6 refuses globals in a kernel)
        n_slots = (T // BT + N).to(tl.int32)
        if i_p >= n_slots:
            n_w = tl.num_programs(0) // H - n_slots
            if guard_outputs(st, o, ht, status, T, N, i_p - n_slots + n_w * i_h, n_w * H, H, V,
                             K, HAS_STATUS, False) != 0:
                return
            _walker(i_p - n_slots, i_h, w, v, k, q, p, gc, o, h0, ht, flags, cu_seqlens, scale,
                    T, N, H, G, K, V, BT, BVW, USE_H0, WALK_PREC, INLINE_PREC, QK_NORM)
            return
    i_n, i_c, bos, eos = chunk_of_program(i_p, cu_seqlens, chunk_indices, N, T, BT, USE_INDICES)
    if i_c * BT >= eos - bos:
        return
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    t0 = bos + i_c * BT                 # first token of the chunk (int64)
    n_t = eos - t0                      # rows of the chunk that are real (>= 1)
    o_r = tl.arange(0, BT)
    m_r = o_r < n_t
    o_k = tl.arange(0, K)
    # scalar base pointers at the chunk's first token; int32 tile offsets
    o_hr = o_r * H                                      # [BT] rows of [T, H] tensors
    o_qk = o_r[:, None] * (HQ * K) + o_k[None, :]       # [BT, K] rows of q, k
    o_at = o_r[:, None] * (H * BT) + o_r[None, :]       # [BT, BT] rows of the scratch, Tb, Aqk

    # gates: g, beta and the chunk's cumulative sum (rows past the end: g = 0, beta = 0)
    if RAW_GATES:
        b_a = tl.load(a + t0 * H + i_h + o_hr, mask=m_r, other=0.0)
        b_b = tl.load(b + t0 * H + i_h + o_hr, mask=m_r, other=0.0).to(tl.float32)
        if GATES == "log":   # a = g (log decay), b = beta: FLA's convention
            b_g = b_a.to(tl.float32)
            b_beta = b_b
        else:
            b_g = tl.where(m_r, log_decay(b_a, tl.load(A_log + i_h), tl.load(dt_bias + i_h)),
                           0.0)
            b_beta = tl.where(m_r, tl.sigmoid(b_b), 0.0)
        b_gc = tl.cumsum(b_g, axis=0)
        tl.store(gc + t0 * H + i_h + o_hr, b_gc, mask=m_r)
    else:
        b_gc = tl.load(gc + t0 * H + i_h + o_hr, mask=m_r, other=0.0)
        b_beta = tl.load(beta + t0 * H + i_h + o_hr, mask=m_r, other=0.0)
    # exponent clamped at 0: <= 0 on every kept entry; guards rows past the end
    b_decay = tl.exp(tl.minimum(b_gc[:, None] - b_gc[None, :], 0.0))

    # 1. A = beta K K^T exp(gc_i - gc_j), strictly lower
    b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_qk, mask=m_r[:, None], other=0.0)
    if QK_NORM:
        # k_t / |k_t| (q_t / |q_t| below) as factors on the products' rows and columns:
        # K^ K^T = diag(rk) K K^T diag(rk), Q^ K^T = diag(rq) Q K^T diag(rk); the factors
        # go to qkn for the walks (one program of the G value heads sharing the q/k head
        # stores them)
        b_rk = l2_rnorm(b_k)
        b_decay = b_decay * b_rk[None, :]
        b_beta_k = b_beta * b_rk
    else:
        b_beta_k = b_beta
    b_A = tl.dot(b_k, tl.trans(b_k)) * b_beta_k[:, None] * b_decay
    if STORE_LB:
        # log of a bound on the norm of the chunk's state transition, the product of
        # exp(g_t) (I - beta_t k_t k_t^T) over its tokens: each factor's norm is at most
        # exp(g_t) max(1, beta_t |k_t|^2 - 1) (rows past the end add 0). beta_t |k_t|^2 is
        # the diagonal of A before the mask: faster than reducing k itself, which sm_100
        # needs (triton 3.7's tensor-memory layout pass fails on a reduction of the product
        # there); docs/notes/long_context.md, "Numbers behind the rules"
        if LB_DIAG:
            b_bkn = tl.sum(tl.where(o_r[:, None] == o_r[None, :], b_A, 0.0), axis=1)
        else:
            b_kf = b_k.to(tl.float32)
            b_bkn = b_beta * tl.sum(b_kf * b_kf, axis=1)
            if QK_NORM:
                b_bkn = b_bkn * b_rk * b_rk
        b_lk = tl.log(tl.maximum(b_bkn - 1.0, 1.0))
        b_gl = tl.sum(tl.where(o_r == tl.minimum(n_t, BT) - 1, b_gc, 0.0), axis=0)
        tl.store(lb + slot_of(i_n, i_c, bos, BT) * H + i_h, b_gl + tl.sum(b_lk, axis=0))
    b_A = tl.where(o_r[:, None] > o_r[None, :], b_A, 0.0)
    # the causal q k^T term now, while k is loaded, and stored at once (k, q and the
    # decays die before the solve: fewer live registers through it)
    b_q = tl.load(q + (t0 * HQ + i_hk) * K + o_qk, mask=m_r[:, None], other=0.0)
    if QK_NORM:
        b_rq = l2_rnorm(b_q)
        b_Aqk = tl.dot(b_q, tl.trans(b_k)) * b_rq[:, None] * b_decay
        if i_h % G == 0:
            p_n = qkn + (t0 * HQ + i_hk) * 2 + o_r * (2 * HQ)
            tl.store(p_n, b_rq, mask=m_r)
            tl.store(p_n + 1, b_rk, mask=m_r)
    else:
        b_Aqk = tl.dot(b_q, tl.trans(b_k)) * b_decay
    b_Aqk = tl.where(o_r[:, None] >= o_r[None, :], b_Aqk, 0.0)
    tl.store(p + (t0 * H + i_h) * BT + o_at, (scale * b_Aqk).to(p.dtype.element_ty),
             mask=m_r[:, None])
    if SOLVE == "batched":
        # 2. Tm = (I + A)^-1 by block diagonals, batched 16 x 16 products in registers
        # Tb stored band by band (no [BT, BT] assembly), upper bands as zeros
        T0, T1, T2, T3 = solve_bands(b_A, BC, SOLVE_PREC, OFFDIAG_PREC)
        p_w = w + (t0 * H + i_h) * BT
        _store_band(p_w, T0, b_beta, 0, n_t, H, BC)
        _store_band(p_w, T1, b_beta, 1, n_t, H, BC)
        _store_band(p_w, T2, b_beta, 2, n_t, H, BC)
        _store_band(p_w, T3, b_beta, 3, n_t, H, BC)
        _store_band(p_w, T0, b_beta, -1, n_t, H, BC)
        _store_band(p_w, T0, b_beta, -2, n_t, H, BC)
        _store_band(p_w, T0, b_beta, -3, n_t, H, BC)
    else:
        # 2. Tm = (I + A)^-1 in 16 x 16 blocks through the scratch
        p_At = At + (t0 * H + i_h) * BT
        tl.store(p_At + o_at, b_A, mask=m_r[:, None])
        tl.debug_barrier()   # the blocks below are read by other threads
        b_A10 = _blk(p_At, 1, 0, n_t, H, BT, BC)
        b_A20 = _blk(p_At, 2, 0, n_t, H, BT, BC)
        b_A21 = _blk(p_At, 2, 1, n_t, H, BT, BC)
        b_A30 = _blk(p_At, 3, 0, n_t, H, BT, BC)
        b_A31 = _blk(p_At, 3, 1, n_t, H, BT, BC)
        b_A32 = _blk(p_At, 3, 2, n_t, H, BT, BC)
        b_T00 = _inv_unit_lower(_blk(p_At, 0, 0, n_t, H, BT, BC), BC, SOLVE_PREC)
        b_T11 = _inv_unit_lower(_blk(p_At, 1, 1, n_t, H, BT, BC), BC, SOLVE_PREC)
        b_T22 = _inv_unit_lower(_blk(p_At, 2, 2, n_t, H, BT, BC), BC, SOLVE_PREC)
        b_T33 = _inv_unit_lower(_blk(p_At, 3, 3, n_t, H, BT, BC), BC, SOLVE_PREC)
        SP: tl.constexpr = OFFDIAG_PREC
        b_T10 = -_mm(_mm(b_T11, b_A10, SP), b_T00, SP)
        b_T21 = -_mm(_mm(b_T22, b_A21, SP), b_T11, SP)
        b_T32 = -_mm(_mm(b_T33, b_A32, SP), b_T22, SP)
        b_T20 = -_mm(b_T22, _mm(b_A20, b_T00, SP) + _mm(b_A21, b_T10, SP), SP)
        b_T31 = -_mm(b_T33, _mm(b_A31, b_T11, SP) + _mm(b_A32, b_T21, SP), SP)
        b_T30 = -_mm(b_T33, _mm(b_A30, b_T00, SP) + _mm(b_A31, b_T10, SP)
                     + _mm(b_A32, b_T20, SP), SP)
        tl.debug_barrier()   # all reads of A done before Tm overwrites it
        _put(p_At, b_T00, 0, 0, n_t, H, BT, BC)
        _put(p_At, b_T10, 1, 0, n_t, H, BT, BC)
        _put(p_At, b_T11, 1, 1, n_t, H, BT, BC)
        _put(p_At, b_T20, 2, 0, n_t, H, BT, BC)
        _put(p_At, b_T21, 2, 1, n_t, H, BT, BC)
        _put(p_At, b_T22, 2, 2, n_t, H, BT, BC)
        _put(p_At, b_T30, 3, 0, n_t, H, BT, BC)
        _put(p_At, b_T31, 3, 1, n_t, H, BT, BC)
        _put(p_At, b_T32, 3, 2, n_t, H, BT, BC)
        _put(p_At, b_T33, 3, 3, n_t, H, BT, BC)
        tl.debug_barrier()
        # blocks above the diagonal of the scratch still hold A's zeros
        b_T = tl.load(p_At + o_at, mask=m_r[:, None], other=0.0)
        tl.store(w + (t0 * H + i_h) * BT + o_at,
                 (b_T * b_beta[None, :]).to(w.dtype.element_ty), mask=m_r[:, None])
    if WALKERS:   # this chunk's Tb, Aqk, gc are stored: release it to its walker programs
        tl.debug_barrier()   # every thread's stores before the flag
        if st == 0:
            tl.atomic_xchg(flags + i_p * H + i_h, V // BVW, sem="release", scope="gpu")


_INTRA_LAUNCH = FastLaunch(intra_chunk_kernel)


def intra_chunk_fwd(k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, q: torch.Tensor,
                    *, scale: float = 1.0, gc: Optional[torch.Tensor] = None,
                    beta: Optional[torch.Tensor] = None, a=None, b=None, A_log=None,
                    dt_bias=None, chunk_indices: Optional[torch.Tensor] = None,
                    storage: str = "compact", solve: str = SOLVE, num_warps: int = 4,
                    maxnreg: Optional[int] = None, pdl_trigger: str = "",
                    defer: bool = False, walkers: Optional[dict] = None,
                    log_bound: Optional[torch.Tensor] = None, out: Optional[tuple] = None,
                    gates: str = "raw", qk_norms: Optional[torch.Tensor] = None):
    """Allocate the outputs, launch :func:`intra_chunk_kernel` once; returns ``(Tb, gc,
    Aqk)``: ``Tb = Tm diag(beta)`` and ``scale * Aqk`` (``[T, HV, 64]`` each, dtype
    :data:`STORAGE` ``[storage]``) and ``gc`` ``[T, HV]`` f32.

    Raw-gates mode when ``gc`` is None (then ``a``, ``b``, ``A_log``, ``dt_bias``
    are required; ``gc`` is written). ``solve``: ``"batched"`` or ``"blocks"`` (a ``[T,
    HV, 64]`` f32 scratch). ``chunk_indices``: the host-built chunk table (else the
    device lookup). ``maxnreg``: register cap per thread.
    ``pdl_trigger``: ``"start"`` lets a PDL-launched next kernel be placed at the start
    of each program (:mod:`.pdl`), ``""`` never.
    ``walkers``: ``dict(initial_state=, final_state=, output=, flags=, BV=,
    walk_precision=, inline_precision=, guard=, status=)`` -- the grid gets ``N * V / BV``
    more programs per head that walk the sequences (:func:`_walker`), each chunk as soon as
    its program has flagged it: the whole call in one launch. ``flags``: int32, at least
    ``(T // 64 + N) * HV`` elements, zero between calls (each walker takes its count off
    again). With ``guard`` the walkers carry the guard (:mod:`.guard`): an invalid
    ``cu_seqlens`` gives NaN outputs and final states (its bits into ``status``, a `[1]`
    int32, if given) and leaves the flags at zero. ``defer``: allocate and bind but do not
    launch; the launch is the last element of the returned tuple (a zero-argument
    callable, :meth:`kernels.launch.FastLaunch.bind_keyed`).
    ``log_bound``: `[T // 64 + N, HV]` f32, written: per chunk slot, the log of a bound on
    the norm of the chunk's state transition (``gc`` at its last token plus
    ``sum_t log max(1, beta_t |k_t|^2 - 1)``), which the long path's phase A reads to skip
    what the decay has made negligible (:mod:`.context_parallel`).
    ``out``: ``(Tb, gc, Aqk, scratch)`` to write instead of allocating them (views of a
    call's one workspace, :func:`.plan.workspace_layout`; ``scratch`` None unless the
    ``"blocks"`` solve; ``gc`` ignored when given as an input).
    ``gates`` (raw-gates mode): ``"raw"``, or ``"log"``: ``a`` holds the log decay ``g``
    `[T, HV]` f32 and ``b`` the post-sigmoid ``beta`` (FLA's inputs,
    :mod:`kernels.model.fla_compat`); ``A_log``, ``dt_bias`` are then not read.
    ``qk_norms``: `[T, HQ, 2]` f32, written: the rows of ``q`` and ``k`` enter
    L2-normalised (``x / sqrt(sum(x^2) + 1e-6)``, FLA's ``use_qk_l2norm_in_kernel``) as
    f32 factors on the products ``K K^T`` and ``Q K^T`` (and in the walker programs), and
    the factors ``(1/|q_t|, 1/|k_t|)`` are stored there for the walks (their
    ``qk_norms``); None: the rows as given.
    """
    if gates not in ("raw", "log"):
        raise ValueError(f"gates must be 'raw' or 'log', got {gates!r}")
    if solve not in SOLVES:
        raise ValueError(f"solve must be one of {', '.join(SOLVES)}, got {solve!r}")
    if pdl_trigger not in ("start", ""):
        raise ValueError(f"pdl_trigger must be 'start' or '', got {pdl_trigger!r}")
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    check_qk_norms(qk_norms, k)
    raw = gc is None
    dev = k.device
    if out is not None:
        w, gc_out, P, At = out
        gc = gc_out if raw else gc
    else:
        if raw:
            gc = torch.empty(T, H, dtype=torch.float32, device=dev)
        w = torch.empty(T, H, BT, dtype=STORAGE[storage], device=dev)
        P = torch.empty(T, H, BT, dtype=STORAGE[storage], device=dev)
        At = (torch.empty(T, H, BT, dtype=torch.float32, device=dev) if solve == "blocks"
              else None)
    use_indices = chunk_indices is not None
    grid = (chunk_indices.shape[0] if use_indices else num_slots(T, N), H)
    wk = dict(walkers or {})
    if wk and (use_indices or wk.get("flags") is None
               or wk["flags"].numel() < num_slots(T, N) * H):
        raise ValueError("walkers need the device chunk lookup and "
                         "walkers['flags'] (int32 zeros, >= (T // 64 + N) * HV)")
    h0 = ht_ = o_ = flags = status = wkey = None
    if wk:
        h0, ht_, o_ = wk.get("initial_state"), wk["final_state"], wk["output"]
        flags, status = wk["flags"], wk.get("status")
        # the walkers' tile, precisions and guard
        wkey = (min(wk.get("BV", 64), V), wk.get("walk_precision", "bf16"),
                wk.get("inline_precision", "bf16"), bool(wk.get("guard")))
        grid = (grid[0] + N * (V // wkey[0]), H)
    grid = (grid[0] * H,)
    if grid[0] == 0:
        go = _nothing
    else:
        args = (q, k, v, a, b, A_log, dt_bias, gc, beta, w, P, At, h0, ht_, o_, flags, status,
                log_bound, qk_norms, cu_seqlens, chunk_indices, float(scale), T, N)
        # the launch key: what the keyword arguments follow from, and the tensors' dtypes
        key = (H, HQ, K, V, raw, gates, solve, num_warps, maxnreg, pdl_trigger, wkey,
               dtypes(q, k, v, a, b, A_log, dt_bias, gc, beta, w, P, At, h0, ht_, o_, flags,
                      status, log_bound, qk_norms, cu_seqlens, chunk_indices))

        def kwargs():
            walk_opts = {} if wkey is None else dict(
                WALKERS=True, BVW=wkey[0], USE_H0=h0 is not None, WALK_PREC=wkey[1],
                INLINE_PREC=wkey[2], GUARD=wkey[3], HAS_STATUS=wkey[3] and status is not None)
            return dict(
                RAW_GATES=raw, GATES=gates, STORE_LB=log_bound is not None,
                QK_NORM=qk_norms is not None,
                LB_DIAG=(log_bound is not None
                         and gpu_limits.device_limits(dev).cc // 10 != 10),
                H=H, G=H // HQ, K=K, V=V, BT=BT, BC=BC, USE_INDICES=use_indices, SOLVE=solve,
                SOLVE_PREC=SOLVE_PRECISION[solve], OFFDIAG_PREC=OFFDIAG_PRECISION[solve],
                num_warps=num_warps, PDL_TRIGGER=pdl_trigger == "start" and pdl_supported(dev),
                **walk_opts, **({"maxnreg": maxnreg} if maxnreg else {}))

        go = _INTRA_LAUNCH.bind_keyed(key, grid, args, kwargs)
    out = (w, gc, P)
    if defer:
        return out + (go,)
    go()
    return out


def _nothing():
    pass
