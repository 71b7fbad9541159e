"""Stage 2: the intra-chunk system, its solve, and the WY factors ``w`` / ``u``.

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

The solve works on 16 x 16 blocks (``BC``). Diagonal blocks are inverted
with a product of Neumann factors, exact for a strictly lower 16 x 16 ``A``
(``A^16 = 0``)::

    (I + A)^-1 = (I - A)(I + A^2)(I + A^4)(I + A^8)

and off-diagonal blocks follow from ``Tm_ij = -Tm_ii sum_{j<=m<i} A_im Tm_mj``.
Everything is ``tl.dot``: ``k k^T`` in bf16 with fp32 accumulation, the solve
in fp32 (``ieee``), ``w`` / ``u`` in ``DOT_PREC`` (tf32 by default).

With ``RAW_GATES`` the kernel also computes ``g``, ``beta`` and the
per-chunk cumulative sum from ``a``, ``b``, ``A_log``, ``dt_bias`` (stage 1
fused in) and writes ``gc`` for the later stages: this is the first of the
``fused`` variant's kernels.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import BT, chunk_of_program, num_slots, prepare_chunk_indices  # noqa: E402
from .gates import log_decay  # noqa: E402

__all__ = ["intra_chunk_kernel", "intra_chunk_fwd", "intra_chunk", "BC", "WU_DOT_PRECISION",
           "W_DTYPE", "U_DTYPE"]

#: Sub-block size of the solve.
BC = 16
#: ``input_precision`` of the ``Tm @ (...)`` products forming ``w`` / ``u``.
WU_DOT_PRECISION = "tf32"
#: Storage dtypes of ``w`` and ``u``. ``u`` feeds the residuals (and so the state)
#: directly: bf16 there costs ~4e-3 abs state error on long-memory heads (CPU, T=1000,
#: D=128), fp32 ~2e-3 with ``w`` in bf16 (``w`` is scaled by ``exp(gc)`` and multiplies
#: the state, so its rounding matters less).
W_DTYPE = torch.bfloat16
U_DTYPE = torch.float32


@triton.jit
def _mm(x, y):
    """fp32 product of two small blocks (the solve), full fp32 precision."""
    return tl.dot(x, y, input_precision="ieee")


@triton.jit
def _sub_gates(a, b, gc, beta, b_A_log, b_dt, o_t, m_t, i_h, b_carry,
               H: tl.constexpr, RAW_GATES: tl.constexpr):
    """Gates of one ``BC``-row sub-block: ``(gc, beta, carry)``.

    RAW: compute ``g`` and ``beta`` from raw inputs, continue the chunk's
    cumulative sum from ``b_carry`` and write ``gc``; else load ``gc``, ``beta``.
    Rows past the sequence end get ``g = 0`` and ``beta = 0``.
    """
    o = o_t * H + i_h
    if RAW_GATES:
        b_a = tl.load(a + o, mask=m_t, other=0.0)
        b_g = tl.where(m_t, log_decay(b_a, b_A_log, b_dt), 0.0)
        b_gc = tl.cumsum(b_g, axis=0) + b_carry
        b_beta = tl.sigmoid(tl.load(b + o, mask=m_t, other=0.0).to(tl.float32))
        b_beta = tl.where(m_t, b_beta, 0.0)
        tl.store(gc + o, b_gc, mask=m_t)
        b_carry = b_carry + tl.sum(b_g, axis=0)
    else:
        b_gc = tl.load(gc + o, mask=m_t, other=0.0)
        b_beta = tl.load(beta + o, mask=m_t, other=0.0)
    return b_gc, b_beta, b_carry


@triton.jit
def _kkt(b_ki, b_kj, b_gci, b_gcj, b_betai, BC: tl.constexpr, DIAG: tl.constexpr):
    """Block ``(i, j)`` of ``A``: ``beta_i (k_i . k_j) exp(gc_i - gc_j)``, strictly
    lower when ``DIAG``. The exponent is clamped at 0 (it is <= 0 on every kept entry;
    the clamp only guards rows past the sequence end from overflowing)."""
    b_A = tl.dot(b_ki, tl.trans(b_kj))
    b_A = b_A * b_betai[:, None] * tl.exp(tl.minimum(b_gci[:, None] - b_gcj[None, :], 0.0))
    if DIAG:
        o_c = tl.arange(0, BC)
        b_A = tl.where(o_c[:, None] > o_c[None, :], b_A, 0.0)
    return b_A


@triton.jit
def _inv_unit_lower(b_A, BC: tl.constexpr):
    """``(I + A)^-1`` of a strictly lower ``[16, 16]`` block: ``(I-A)(I+A^2)(I+A^4)(I+A^8)``."""
    o_c = tl.arange(0, BC)
    b_I = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)
    b_T = b_I - b_A
    b_P = b_A
    for _ in tl.static_range(3):
        b_P = _mm(b_P, b_P)
        b_T = _mm(b_T, b_I + b_P)
    return b_T


@triton.jit(do_not_specialize=["T", "N"])
def intra_chunk_kernel(
    k,              # [T, HQ, K] bf16 keys
    v,              # [T, H, V] bf16 values
    a,              # [T, H] bf16 raw decay input (RAW_GATES) or None
    b,              # [T, H] bf16 raw beta input (RAW_GATES) or None
    A_log,          # [H] f32 (RAW_GATES) or None
    dt_bias,        # [H] f32 (RAW_GATES) or None
    gc,             # [T, H] f32 per-chunk cumulative log decay: written (RAW_GATES) or read
    beta,           # [T, H] f32 sigmoid(b), read (not RAW_GATES) or None
    w,              # [T, H, K] out (bf16 or f32)
    u,              # [T, H, V] out (bf16 or f32)
    cu_seqlens,     # [N+1] int32/int64
    chunk_indices,  # [NC, 2] int32 (USE_INDICES) or None
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    H: tl.constexpr,            # value heads
    G: tl.constexpr,            # value heads per q/k head
    K: tl.constexpr,            # key head size
    V: tl.constexpr,            # value head size
    BT: tl.constexpr,           # chunk size (64)
    BC: tl.constexpr,           # sub-block size (16)
    RAW_GATES: tl.constexpr,    # stage 1 fused in
    USE_INDICES: tl.constexpr,  # chunk from the host table (else device lookup)
    DOT_PREC: tl.constexpr,     # input_precision of the w/u products
):
    tl.static_assert(BT == 4 * BC)
    i_p, i_h = tl.program_id(0), tl.program_id(1)
    i_n, i_c, bos, eos = chunk_of_program(i_p, cu_seqlens, chunk_indices, N, BT, USE_INDICES)
    if i_c * BT >= eos - bos:
        return
    HQ: tl.constexpr = H // G
    i_hk = i_h // G
    t0 = bos + i_c * BT
    if RAW_GATES:
        b_A_log = tl.load(A_log + i_h)
        b_dt = tl.load(dt_bias + i_h)
    else:
        b_A_log = 0.0
        b_dt = 0.0

    o_c = tl.arange(0, BC)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    o_t0 = t0 + o_c
    o_t1 = o_t0 + BC
    o_t2 = o_t0 + 2 * BC
    o_t3 = o_t0 + 3 * BC
    m_t0 = o_t0 < eos
    m_t1 = o_t1 < eos
    m_t2 = o_t2 < eos
    m_t3 = o_t3 < eos

    # gates of the four sub-blocks (cumulative sum carried across them)
    b_carry = tl.zeros([], dtype=tl.float32)
    b_gc0, b_be0, b_carry = _sub_gates(a, b, gc, beta, b_A_log, b_dt, o_t0, m_t0, i_h, b_carry,
                                       H, RAW_GATES)
    b_gc1, b_be1, b_carry = _sub_gates(a, b, gc, beta, b_A_log, b_dt, o_t1, m_t1, i_h, b_carry,
                                       H, RAW_GATES)
    b_gc2, b_be2, b_carry = _sub_gates(a, b, gc, beta, b_A_log, b_dt, o_t2, m_t2, i_h, b_carry,
                                       H, RAW_GATES)
    b_gc3, b_be3, b_carry = _sub_gates(a, b, gc, beta, b_A_log, b_dt, o_t3, m_t3, i_h, b_carry,
                                       H, RAW_GATES)

    # keys of the four sub-blocks, [BC, K] bf16 (rows past eos are 0)
    p_k = k + i_hk * K + o_k[None, :]
    b_k0 = tl.load(p_k + o_t0[:, None] * (HQ * K), mask=m_t0[:, None], other=0.0)
    b_k1 = tl.load(p_k + o_t1[:, None] * (HQ * K), mask=m_t1[:, None], other=0.0)
    b_k2 = tl.load(p_k + o_t2[:, None] * (HQ * K), mask=m_t2[:, None], other=0.0)
    b_k3 = tl.load(p_k + o_t3[:, None] * (HQ * K), mask=m_t3[:, None], other=0.0)

    # A in blocks (i >= j)
    b_A00 = _kkt(b_k0, b_k0, b_gc0, b_gc0, b_be0, BC, True)
    b_A11 = _kkt(b_k1, b_k1, b_gc1, b_gc1, b_be1, BC, True)
    b_A22 = _kkt(b_k2, b_k2, b_gc2, b_gc2, b_be2, BC, True)
    b_A33 = _kkt(b_k3, b_k3, b_gc3, b_gc3, b_be3, BC, True)
    b_A10 = _kkt(b_k1, b_k0, b_gc1, b_gc0, b_be1, BC, False)
    b_A20 = _kkt(b_k2, b_k0, b_gc2, b_gc0, b_be2, BC, False)
    b_A21 = _kkt(b_k2, b_k1, b_gc2, b_gc1, b_be2, BC, False)
    b_A30 = _kkt(b_k3, b_k0, b_gc3, b_gc0, b_be3, BC, False)
    b_A31 = _kkt(b_k3, b_k1, b_gc3, b_gc1, b_be3, BC, False)
    b_A32 = _kkt(b_k3, b_k2, b_gc3, b_gc2, b_be3, BC, False)

    # Tm = (I + A)^-1 in blocks
    b_T00 = _inv_unit_lower(b_A00, BC)
    b_T11 = _inv_unit_lower(b_A11, BC)
    b_T22 = _inv_unit_lower(b_A22, BC)
    b_T33 = _inv_unit_lower(b_A33, BC)
    b_T10 = -_mm(_mm(b_T11, b_A10), b_T00)
    b_T21 = -_mm(_mm(b_T22, b_A21), b_T11)
    b_T32 = -_mm(_mm(b_T33, b_A32), b_T22)
    b_T20 = -_mm(b_T22, _mm(b_A20, b_T00) + _mm(b_A21, b_T10))
    b_T31 = -_mm(b_T33, _mm(b_A31, b_T11) + _mm(b_A32, b_T21))
    b_T30 = -_mm(b_T33, _mm(b_A30, b_T00) + _mm(b_A31, b_T10) + _mm(b_A32, b_T20))

    # w = Tm @ (beta exp(gc) k)
    b_x0 = b_k0.to(tl.float32) * (b_be0 * tl.exp(b_gc0))[:, None]
    b_x1 = b_k1.to(tl.float32) * (b_be1 * tl.exp(b_gc1))[:, None]
    b_x2 = b_k2.to(tl.float32) * (b_be2 * tl.exp(b_gc2))[:, None]
    b_x3 = b_k3.to(tl.float32) * (b_be3 * tl.exp(b_gc3))[:, None]
    p_w = w + i_h * K + o_k[None, :]
    b_w = tl.dot(b_T00, b_x0, input_precision=DOT_PREC)
    tl.store(p_w + o_t0[:, None] * (H * K), b_w.to(w.dtype.element_ty), mask=m_t0[:, None])
    b_w = tl.dot(b_T10, b_x0, input_precision=DOT_PREC)
    b_w += tl.dot(b_T11, b_x1, input_precision=DOT_PREC)
    tl.store(p_w + o_t1[:, None] * (H * K), b_w.to(w.dtype.element_ty), mask=m_t1[:, None])
    b_w = tl.dot(b_T20, b_x0, input_precision=DOT_PREC)
    b_w += tl.dot(b_T21, b_x1, input_precision=DOT_PREC)
    b_w += tl.dot(b_T22, b_x2, input_precision=DOT_PREC)
    tl.store(p_w + o_t2[:, None] * (H * K), b_w.to(w.dtype.element_ty), mask=m_t2[:, None])
    b_w = tl.dot(b_T30, b_x0, input_precision=DOT_PREC)
    b_w += tl.dot(b_T31, b_x1, input_precision=DOT_PREC)
    b_w += tl.dot(b_T32, b_x2, input_precision=DOT_PREC)
    b_w += tl.dot(b_T33, b_x3, input_precision=DOT_PREC)
    tl.store(p_w + o_t3[:, None] * (H * K), b_w.to(w.dtype.element_ty), mask=m_t3[:, None])

    # u = Tm @ (beta v)
    p_v = v + i_h * V + o_v[None, :]
    b_y0 = tl.load(p_v + o_t0[:, None] * (H * V), mask=m_t0[:, None], other=0.0).to(tl.float32)
    b_y1 = tl.load(p_v + o_t1[:, None] * (H * V), mask=m_t1[:, None], other=0.0).to(tl.float32)
    b_y2 = tl.load(p_v + o_t2[:, None] * (H * V), mask=m_t2[:, None], other=0.0).to(tl.float32)
    b_y3 = tl.load(p_v + o_t3[:, None] * (H * V), mask=m_t3[:, None], other=0.0).to(tl.float32)
    b_y0 = b_y0 * b_be0[:, None]
    b_y1 = b_y1 * b_be1[:, None]
    b_y2 = b_y2 * b_be2[:, None]
    b_y3 = b_y3 * b_be3[:, None]
    p_u = u + i_h * V + o_v[None, :]
    b_u = tl.dot(b_T00, b_y0, input_precision=DOT_PREC)
    tl.store(p_u + o_t0[:, None] * (H * V), b_u.to(u.dtype.element_ty), mask=m_t0[:, None])
    b_u = tl.dot(b_T10, b_y0, input_precision=DOT_PREC)
    b_u += tl.dot(b_T11, b_y1, input_precision=DOT_PREC)
    tl.store(p_u + o_t1[:, None] * (H * V), b_u.to(u.dtype.element_ty), mask=m_t1[:, None])
    b_u = tl.dot(b_T20, b_y0, input_precision=DOT_PREC)
    b_u += tl.dot(b_T21, b_y1, input_precision=DOT_PREC)
    b_u += tl.dot(b_T22, b_y2, input_precision=DOT_PREC)
    tl.store(p_u + o_t2[:, None] * (H * V), b_u.to(u.dtype.element_ty), mask=m_t2[:, None])
    b_u = tl.dot(b_T30, b_y0, input_precision=DOT_PREC)
    b_u += tl.dot(b_T31, b_y1, input_precision=DOT_PREC)
    b_u += tl.dot(b_T32, b_y2, input_precision=DOT_PREC)
    b_u += tl.dot(b_T33, b_y3, input_precision=DOT_PREC)
    tl.store(p_u + o_t3[:, None] * (H * V), b_u.to(u.dtype.element_ty), mask=m_t3[:, None])


def intra_chunk_fwd(k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, *,
                    gc: Optional[torch.Tensor] = None, beta: Optional[torch.Tensor] = None,
                    a=None, b=None, A_log=None, dt_bias=None,
                    chunk_indices: Optional[torch.Tensor] = None,
                    wu_dtype: Optional[torch.dtype] = None, num_warps: int = 4
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allocate ``w``, ``u`` (and ``gc`` in raw mode), launch :func:`intra_chunk_kernel` once.

    Raw-gates mode when ``gc`` is None (then ``a``, ``b``, ``A_log``,
    ``dt_bias`` are required). Returns ``(w, u, gc)``.
    """
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    raw = gc is None
    if raw:
        gc = torch.empty(T, H, dtype=torch.float32, device=k.device)
    w = torch.empty(T, H, K, dtype=wu_dtype or W_DTYPE, device=k.device)
    u = torch.empty(T, H, V, dtype=wu_dtype or U_DTYPE, device=k.device)
    use_indices = chunk_indices is not None
    grid = (chunk_indices.shape[0] if use_indices else num_slots(T, N), H)
    if grid[0] > 0:
        intra_chunk_kernel[grid](
            k, v, a, b, A_log, dt_bias, gc, beta, w, u, cu_seqlens, chunk_indices, T, N,
            H=H, G=H // HQ, K=K, V=V, BT=BT, BC=BC, RAW_GATES=raw, USE_INDICES=use_indices,
            DOT_PREC=WU_DOT_PRECISION, num_warps=num_warps,
        )
    return w, u, gc


def intra_chunk(k: torch.Tensor, v: torch.Tensor, gc: torch.Tensor, beta: torch.Tensor,
                cu_seqlens: torch.Tensor, *, use_indices: bool = False,
                wu_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """WY factors of every chunk from keys, values and precomputed gates.

    Args:
        k: `[T, HQ, K]` bf16 keys.
        v: `[T, HV, V]` bf16 values.
        gc: `[T, HV]` f32 per-chunk cumulative log decay (stage 1).
        beta: `[T, HV]` f32.
        cu_seqlens: `[N+1]` int32/int64.
        use_indices: host-built chunk table (syncs) instead of the device lookup.
        wu_dtype: storage dtype of ``w`` and ``u`` (default :data:`W_DTYPE`, :data:`U_DTYPE`).
    Returns:
        ``(w [T, HV, K], u [T, HV, V])``.
    """
    idx = prepare_chunk_indices(cu_seqlens) if use_indices else None
    w, u, _ = intra_chunk_fwd(k, v, cu_seqlens, gc=gc, beta=beta, chunk_indices=idx,
                              wu_dtype=wu_dtype)
    return w, u
