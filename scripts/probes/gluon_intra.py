"""Probe: the intra-chunk kernel's front (loads, ``K K^T`` and ``Q K^T``, gates, ``Aqk``,
``gc``) as a persistent warp-specialized Gluon kernel, and the batched solve alone in
Triton form on its ``A``. Question: does the non-solve work run at its byte rate once it is
pipelined by TMA and done once per q/k head, and what is the solve's own cost? Design,
prediction and decision rule: docs/notes/long_context.md, "Gluon intra-chunk probe:
prediction". The variants ``front``, ``front_a`` test the design's first claim (the front
at its bytes); ``fused`` tests the second (the solve done on chip, hidden behind the front):
docs/notes/long_context.md, "Gluon intra-chunk probe, fused solve: prediction".

What the intra-chunk kernel (:func:`kernels.prefill.intra_chunk.intra_chunk_kernel`, raw
gates) computes per chunk of ``BT = 64`` tokens ``t0 ..`` and value head ``h`` (q/k head
``h // G``)::

    g    = -exp(A_log[h]) softplus(a + dt_bias[h]),  gc = cumsum(g),  beta = sigmoid(b)
    A    = beta_i (k_i . k_j) exp(min(gc_i - gc_j, 0))        for i > j, else 0
    Aqk  = scale (q_i . k_j) exp(min(gc_i - gc_j, 0))         for i >= j, else 0 (stored bf16)
    Tb   = (I + A)^-1 diag(beta)                                (stored bf16)

``K K^T`` and ``Q K^T`` do not depend on the value head, so the Gluon front does them once
per *item* (chunk, q/k head) for the ``G`` value heads that share it.

``gluon_front_kernel`` (Triton 3.6 Gluon API, sm_90a): one persistent CTA per SM, items
``pid, pid + n_prog, ..`` (chunk-major, q/k heads fastest):

* producer partition (1 warp): item ``i``'s ``k``, ``q`` tiles (``[64, 128]`` bf16, TMA)
  into stage ``i % STAGES`` behind the stage's ``empty`` mbarrier; ``ready`` counts the
  bytes (rows past ``T`` zero-filled);
* two front partitions (4 warps each: the default partition and a worker) take alternate
  items (one's epilogue overlaps the other's products): the ``a``, ``b`` loads first, then
  ``K K^T`` and ``Q K^T`` as asynchronous ``wgmma`` (both operands in shared memory) with
  the gates computed while they run (the cumulative sum by ``associative_scan``), the stage
  released, then per value head ``scale Aqk`` (registers -> shared memory -> TMA store,
  two buffers), ``gc`` and, with ``A_OUT``, ``A`` in f32 (the ``"blocks"`` solve's
  ``[T, HV, 64]`` scratch layout) for :func:`solve_kernel`; with ``TB_OUT`` (``fused``),
  after both heads' ``Aqk``, per value head ``A`` and its solve in the same warpgroup
  (``_solve_tb``: the product's ``solve_bands`` ported, ``[4, 16, 16]`` block batches in
  ``mma`` v2 with warp ``I`` on block ``I``, the product's precisions and accumulation
  order), ``Tb`` through shared memory and a TMA store like ``Aqk``; ``fused2``,
  ``fused_copy2``: the same with the block view's block-column axis in registers
  (``_BAND4_ROWS``; ``_BAND4`` sums it across warps through a 16-way bank-conflicted
  scratch: docs/notes/long_context.md, "Why fused_copy is slow").

``solve_kernel`` (Triton): per (chunk, value head), ``A`` and ``b`` in, the product's
:func:`~kernels.prefill.intra_chunk.solve_bands` and ``_store_band`` (imported), ``Tb``
out; with ``COPY`` the same loads and stores with ``Tb`` := ``A``'s bands (no solve), so
``solve_t - copy_t`` is the solve's own cost. Not in the probe: ``lb`` (the product's
log transition bound: 8 bytes per chunk and head), varlen (one sequence), the guard.

Modes (the GPU host has torch 2.11 + triton 3.6)::

    python3 scripts/probes/gluon_intra.py --compile [--json F]    # CPU: sm_90a compile, report
    PYTHONPATH=$PWD TRITON_INTERPRET=1 python3 scripts/probes/gluon_intra.py --emulate
                                         # CPU: the front's torch emulation + solve_kernel
                                         # (interpreter) and the fused solve's torch
                                         # emulation against the Triton intra kernel
    PYTHONPATH=$PWD python3 scripts/probes/gluon_intra.py --check --time --out $OUT

``--check`` (GPU): for each length (131,072, 32,768 and 4,133 tokens -- the last ends
mid-chunk: TMA's zero fill and clipped stores --, one sequence,
``make_prefill_inputs([T], seed=0)``) the Triton intra kernel runs as the long path
launches it (raw gates, ``"compact"`` storage, ``log_bound``), then each implementation
into NaN-filled outputs, gated against it (:func:`gate_front`, :func:`gate_tb`; tolerances
in their docstrings). ``--time`` (only what passed): each kernel alone,
:func:`kernels.bench.anatomy.kernel_times` (CUPTI, warm L2) median of 5 and ``cupti_cold``.
One JSON line per gate and timing on stdout and in ``$OUT/gluon_intra_<sha>.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,  # noqa: E402
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

from kernels.prefill.intra_chunk import (BC, OFFDIAG_PRECISION, SOLVE_PRECISION,  # noqa: E402
                                         _band, _store_band, solve_bands)

BT = 64             # chunk size (the pipeline's)
STAGES = 4          # k, q load stages (32 KB each); even: front warpgroup W owns stages = W mod 2
                    # (a variant may take fewer: VARIANTS)
PRODUCER_REGS = 24  # registers per thread of the producer's warpgroup (setmaxnreg)
FRONT_REGS = 240    # of the worker front warpgroup; the default one gets the rest (240)


@gluon.jit
def _producer(k_desc, q_desc, k_s, q_s, ready, empty, pid, n_prog, n_items,
              HQ: gl.constexpr, K: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr):
    """One warp: this program's ``i``-th item's ``k``, ``q`` tiles into stage
    ``i % STAGES`` once its front warpgroup released it (``empty``)."""
    NBYTES: gl.constexpr = 2 * 2 * BT * K
    i = 0
    for it in range(pid, n_items, n_prog):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        t0 = (it // HQ) * BT
        col = (it % HQ) * K
        mbarrier.expect(bar, NBYTES)
        tma.async_copy_global_to_shared(k_desc, [t0, col], bar, k_s.index(s))
        tma.async_copy_global_to_shared(q_desc, [t0, col], bar, q_s.index(s))
        i += 1


@gluon.jit
def _add(x, y):
    return x + y


# -- the fused variant's solve: the product's solve_bands in Gluon ---------------------------
# Batches [4, 16, 16] (entry I = block (I, I - D) of a block diagonal D) in the layout Triton
# gives the product's batched products: mma v2, warp I owns entry I. Every product, sum and
# precision as in :func:`kernels.prefill.intra_chunk.solve_bands` as Triton compiles it
# (its combine pass folds ``x + dot(..)`` into the dot's accumulator; done here by hand).
#: mma v2 for ``[4, 16, 16]`` batches, warp ``I`` on entry ``I`` (Triton's choice for them)
_MMA3 = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                               instr_shape=[1, 16, 8]))
#: ``[4, 16, 4, 16]`` block view of a ``[64, 64]`` tile (bands out, ``Tb`` in), as measured
#: first: a warp bit on the block-column axis, so a band's sum over it crosses warps, through
#: a reduction scratch whose 16 column lanes are 512 B apart (one bank: 16-way conflicts)
_BAND4 = gl.constexpr(gl.BlockedLayout([1, 1, 1, 1], [1, 1, 2, 16], [1, 2, 2, 1], [3, 2, 1, 0]))
#: the same view with warp ``I`` on block row ``I`` (the rows it holds in the ``wgmma``
#: accumulator and the entry it owns in the mma v2 batch) and the block-column axis in
#: registers: a band's sum is register adds, no scratch (``BAND_ROWS``)
_BAND4_ROWS = gl.constexpr(gl.BlockedLayout([1, 1, 4, 1], [1, 2, 1, 16], [4, 1, 1, 1],
                                            [3, 2, 1, 0]))
#: ``[4, 4, 16, 16]`` of the band shift (entry, source entry, row, column)
_SHIFT4 = gl.constexpr(gl.BlockedLayout([1, 1, 1, 1], [1, 1, 2, 16], [1, 1, 4, 1], [3, 2, 1, 0]))


@gluon.jit
def _ix3(n: gl.constexpr, axis: gl.constexpr, L: gl.constexpr):
    """``arange(n)`` along ``axis`` of the rank-3 layout ``L``, expanded to rank 3."""
    if axis == 0:
        r = gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))[:, None, None]
    elif axis == 1:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))[None, :, None]
    else:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))[None, None, :]
    return r


@gluon.jit
def _ix4(n: gl.constexpr, axis: gl.constexpr, L: gl.constexpr):
    """``arange(n)`` along ``axis`` of the rank-4 layout ``L``, expanded to rank 4."""
    if axis == 0:
        r = gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L))))
        r = r[:, None, None, None]
    elif axis == 1:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, L))))
        r = r[None, :, None, None]
    elif axis == 2:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L))))
        r = r[None, None, :, None]
    else:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L))))
        r = r[None, None, None, :]
    return r


@gluon.jit
def _split(x):
    """``(hi, lo)`` bf16 with ``hi + lo`` = ``x`` to ~16 bits (as
    :func:`kernels.prefill.dots._split`)."""
    hi = x.to(gl.bfloat16)
    return hi, (x - hi.to(gl.float32)).to(gl.bfloat16)


@gluon.jit
def _mm3(x, y, acc, PREC: gl.constexpr):
    """``acc + x @ y`` per batch entry (``[4, 16, 16]`` f32, the mma v2 layout):
    ``"bf16x2"`` hi hi + hi lo + lo hi (the product's order), or one ``"tf32"`` pass."""
    M: gl.constexpr = _MMA3
    if PREC == "bf16x2":
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=M, k_width=2)
        b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=M, k_width=2)
        # split after the conversion (the split is elementwise): one conversion per operand
        x_hi, x_lo = _split(gl.convert_layout(x, a_op))
        y_hi, y_lo = _split(gl.convert_layout(y, b_op))
        acc = mma_v2(x_hi, y_hi, acc)
        acc = mma_v2(x_hi, y_lo, acc)
        acc = mma_v2(x_lo, y_hi, acc)
    else:
        gl.static_assert(PREC == "tf32")
        a_op32: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=M, k_width=1)
        b_op32: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=M, k_width=1)
        acc = mma_v2(gl.convert_layout(x, a_op32), gl.convert_layout(y, b_op32), acc,
                     input_precision="tf32")
    return acc


@gluon.jit
def _band4(A4, D: gl.constexpr, B4: gl.constexpr):
    """Blocks ``(I, I - D)`` of ``A4`` (``[4, 16, 4, 16]`` in the band layout ``B4``) as
    ``[4, 16, 16]`` in the mma v2 layout, zeros for ``I < D``."""
    M: gl.constexpr = _MMA3
    m = (_ix4(4, 0, B4) - D) == _ix4(4, 2, B4)
    return gl.convert_layout(gl.sum(gl.where(m, A4, 0.0), axis=2), M)


@gluon.jit
def _shift3(X3, D: gl.constexpr):
    """``[4, 16, 16]`` whose entry ``I`` is ``X3[I - D]`` (zeros for ``I < D``), the mma v2
    layout in and out."""
    M: gl.constexpr = _MMA3
    P4: gl.constexpr = _SHIFT4
    x4 = gl.convert_layout(X3, gl.SliceLayout(0, P4))[None, :, :, :]
    m = (_ix4(4, 0, P4) - D) == _ix4(4, 1, P4)
    return gl.convert_layout(gl.sum(gl.where(m, x4, 0.0), axis=1), M)


@gluon.jit
def _solve_tb(A, beta, BT: gl.constexpr, PREC: gl.constexpr, OFF_PREC: gl.constexpr,
              BAND_ROWS: gl.constexpr):
    """``Tb = (I + A)^-1 diag(beta)`` of a strictly lower ``[64, 64]`` f32 ``A`` (any
    layout; ``beta`` ``[64]`` f32, any 1-D layout) as a ``[64, 64]`` f32 tensor, by the
    product's batched block formulas (:func:`kernels.prefill.intra_chunk.solve_bands`), the
    blocks above the diagonal zero (``_store_band`` of bands ``-1 .. -3``). ``PREC``
    ``"copy"``: no solve, ``A diag(beta)`` through the same bands and assembly (the
    ``fused_copy`` timing baseline). ``BAND_ROWS``: the block view in ``_BAND4_ROWS``, else
    in ``_BAND4``."""
    gl.static_assert(BT == 64)
    M: gl.constexpr = _MMA3
    B4: gl.constexpr = _BAND4_ROWS if BAND_ROWS else _BAND4
    A4 = gl.convert_layout(gl.reshape(A, [4, 16, 4, 16]), B4)
    zero = gl.zeros([4, 16, 16], gl.float32, M)
    r = _ix3(16, 1, M)
    c = _ix3(16, 2, M)
    eye = gl.where(r == c, 1.0, 0.0)                           # [1, 16, 16]
    A0 = _band4(A4, 0, B4)
    A1 = _band4(A4, 1, B4)
    A2 = _band4(A4, 2, B4)
    A3 = _band4(A4, 3, B4)
    if PREC == "copy":
        T0 = A0
        T1 = A1
        T2 = A2
        T3 = A3
    else:
        D8 = gl.where((r // 8) == (c // 8), A0, 0.0)
        P2 = _mm3(D8, D8, zero, PREC)
        P4 = _mm3(P2, P2, zero, PREC)
        Ti8 = _mm3(_mm3(eye - D8, eye + P2, zero, PREC), eye + P4, zero, PREC)
        T0 = _mm3(eye - _mm3(Ti8, A0 - D8, zero, PREC), Ti8, zero, PREC)
        T1 = -_mm3(T0, _mm3(A1, _shift3(T0, 1), zero, OFF_PREC), zero, OFF_PREC)
        S2 = _mm3(A1, _shift3(T1, 1), _mm3(A2, _shift3(T0, 2), zero, OFF_PREC), OFF_PREC)
        T2 = -_mm3(T0, S2, zero, OFF_PREC)
        S3 = _mm3(A3, _shift3(T0, 3), zero, OFF_PREC)
        S3 = _mm3(A2, _shift3(T1, 2), S3, OFF_PREC)
        S3 = _mm3(A1, _shift3(T2, 1), S3, OFF_PREC)
        T3 = -_mm3(T0, S3, zero, OFF_PREC)
    # assemble Tm [4, 16, 4, 16] (block row, row, block column, column), columns * beta
    I4 = _ix4(4, 0, B4)
    J4 = _ix4(4, 2, B4)
    L3: gl.constexpr = gl.SliceLayout(2, B4)
    Tm = gl.where(J4 == I4, gl.convert_layout(T0, L3)[:, :, None, :], 0.0)
    Tm = gl.where(J4 == I4 - 1, gl.convert_layout(T1, L3)[:, :, None, :], Tm)
    Tm = gl.where(J4 == I4 - 2, gl.convert_layout(T2, L3)[:, :, None, :], Tm)
    Tm = gl.where(J4 == I4 - 3, gl.convert_layout(T3, L3)[:, :, None, :], Tm)
    b4 = gl.convert_layout(gl.reshape(beta, [4, 16]), gl.SliceLayout(0, gl.SliceLayout(1, B4)))
    return gl.reshape(Tm * b4[None, None, :, :], [BT, BT])


@gluon.jit
def _gates(b_a, b_b, m_g, A_log, dt_bias, h):
    """Value head ``h``'s ``(gc, beta)`` of a chunk from its ``a``, ``b`` (rows past ``T``:
    ``g = 0``, ``beta = 0``), as the Triton kernel computes them."""
    x = b_a.to(gl.float32) + gl.load(dt_bias + h)
    sp = gl.maximum(x, 0.0) + gl.log(1.0 + gl.exp(-gl.abs(x)))   # gates.softplus
    b_g = gl.where(m_g, -gl.exp(gl.load(A_log + h)) * sp, 0.0)
    g_c = gl.associative_scan(b_g, 0, _add)
    return g_c, gl.where(m_g, 1.0 / (1.0 + gl.exp(-b_b.to(gl.float32))), 0.0)


@gluon.jit
def _front(a, b, A_log, dt_bias, gc, A_out, aq_desc, tb_desc, k_s, q_s, aq_s, ready, empty,
           pid, n_prog, n_items, scale, T, W: gl.constexpr, H: gl.constexpr, G: gl.constexpr,
           K: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr, A_OUT: gl.constexpr,
           TB_OUT: gl.constexpr, SOLVE_PREC: gl.constexpr, OFF_PREC: gl.constexpr,
           BAND_ROWS: gl.constexpr):
    """Front warpgroup ``W``: this program's items ``i = W, W + 2, ..`` (module doc).
    ``aq_s``: its staging tiles, ``scale Aqk`` of head ``v`` in ``v``, with ``TB_OUT``
    ``Tb`` in ``2 + v``."""
    HQ: gl.constexpr = H // G
    # TMA stores per item, issued in one order every item: a buffer's previous store is
    # done once at most N_ST - 1 stores are pending
    N_ST: gl.constexpr = 2 * G if TB_OUT else G
    acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BT, 16])
    rows: gl.constexpr = gl.SliceLayout(1, acc)
    cols: gl.constexpr = gl.SliceLayout(0, acc)
    # the gates in a plain 1-D layout (the scan does not take a slice of the wgmma layout)
    gate: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    o_i = gl.arange(0, BT, layout=rows)
    o_j = gl.arange(0, BT, layout=cols)
    o_g = gl.arange(0, BT, layout=gate)
    zero = gl.zeros([BT, BT], gl.float32, acc)
    n_my = gl.cdiv(n_items - pid, n_prog)
    for i in range(W, n_my, 2):
        it = pid + i * n_prog
        s = i % STAGES
        t0 = (it // HQ) * BT
        i_hk = it % HQ
        m_i = t0 + o_i < T
        m_g = t0 + o_g < T
        # the gates' loads before the wait: their latency overlaps the tiles' and products'
        p_g = (t0 + o_g) * H + i_hk * G
        b_a0 = gl.load(a + p_g, mask=m_g, other=0.0)
        b_b0 = gl.load(b + p_g, mask=m_g, other=0.0)
        b_a1 = gl.load(a + p_g + 1, mask=m_g & (G > 1), other=0.0)
        b_b1 = gl.load(b + p_g + 1, mask=m_g & (G > 1), other=0.0)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        k_i = k_s.index(s)
        S = warpgroup_mma(k_i, k_i.permute((1, 0)), zero, use_acc=False, is_async=True)
        P = warpgroup_mma(q_s.index(s), k_i.permute((1, 0)), zero, use_acc=False,
                          is_async=True)
        for v in gl.static_range(G):
            h = i_hk * G + v
            if v == 0:
                b_a = b_a0
                b_b = b_b0
            else:
                b_a = b_a1
                b_b = b_b1
            if v == 0:
                S, P = warpgroup_mma_wait(0, deps=[S, P])
                mbarrier.arrive(empty.index(s))        # both products have read the stage
            g_c, beta_g = _gates(b_a, b_b, m_g, A_log, dt_bias, h)
            gl.store(gc + (t0 + o_g) * H + h, g_c, mask=m_g)
            b_beta = gl.convert_layout(beta_g, rows)
            b_gc = gl.convert_layout(g_c, rows)
            gc_j = gl.convert_layout(g_c, cols)
            decay = gl.exp(gl.minimum(b_gc[:, None] - gc_j[None, :], 0.0))
            # scale * Aqk: bf16 through shared memory buffer v, TMA store (clips at T)
            aqk = gl.where(o_i[:, None] >= o_j[None, :], P * decay, 0.0)
            buf = aq_s.index(v)
            tma.store_wait(N_ST - 1)    # the store issued from buffer v one item ago is done
            buf.store((scale * aqk).to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(aq_desc, [t0, h * BT], buf)
            if A_OUT:
                A = gl.where(o_i[:, None] > o_j[None, :], S * b_beta[:, None] * decay, 0.0)
                p_A = A_out + ((t0 + o_i[:, None]) * H + h) * BT + o_j[None, :]
                gl.store(p_A, A, mask=m_i[:, None])
        if TB_OUT:
            # the solve on chip, after both heads' Aqk (Q K^T is dead by then: fewer live
            # registers through the solve); the gates again (a few ops on 64 values) rather
            # than kept; Tb through staging tile 2 + v, TMA store
            for v in gl.static_range(G):
                h = i_hk * G + v
                if v == 0:
                    g_c, beta_g = _gates(b_a0, b_b0, m_g, A_log, dt_bias, h)
                else:
                    g_c, beta_g = _gates(b_a1, b_b1, m_g, A_log, dt_bias, h)
                b_gc = gl.convert_layout(g_c, rows)
                gc_j = gl.convert_layout(g_c, cols)
                decay = gl.exp(gl.minimum(b_gc[:, None] - gc_j[None, :], 0.0))
                b_beta = gl.convert_layout(beta_g, rows)
                A = gl.where(o_i[:, None] > o_j[None, :], S * b_beta[:, None] * decay, 0.0)
                tb = _solve_tb(A, beta_g, BT, SOLVE_PREC, OFF_PREC, BAND_ROWS)
                tbuf = aq_s.index(2 + v)
                tma.store_wait(N_ST - 1)
                tbuf.store(tb.to(gl.bfloat16))
                fence_async_shared()
                tma.async_copy_shared_to_global(tb_desc, [t0, h * BT], tbuf)
    tma.store_wait(0)


@gluon.jit
def _front0(a, b, A_log, dt_bias, gc, A_out, aq_desc, tb_desc, k_s, q_s, aq_s, ready, empty,
            pid, n_prog, n_items, scale, T, H: gl.constexpr, G: gl.constexpr, K: gl.constexpr,
            BT: gl.constexpr, STAGES: gl.constexpr, A_OUT: gl.constexpr, TB_OUT: gl.constexpr,
            SOLVE_PREC: gl.constexpr, OFF_PREC: gl.constexpr, BAND_ROWS: gl.constexpr):
    _front(a, b, A_log, dt_bias, gc, A_out, aq_desc, tb_desc, k_s, q_s, aq_s, ready, empty,
           pid, n_prog, n_items, scale, T, 0, H, G, K, BT, STAGES, A_OUT, TB_OUT, SOLVE_PREC,
           OFF_PREC, BAND_ROWS)


@gluon.jit
def _front1(a, b, A_log, dt_bias, gc, A_out, aq_desc, tb_desc, k_s, q_s, aq_s, ready, empty,
            pid, n_prog, n_items, scale, T, H: gl.constexpr, G: gl.constexpr, K: gl.constexpr,
            BT: gl.constexpr, STAGES: gl.constexpr, A_OUT: gl.constexpr, TB_OUT: gl.constexpr,
            SOLVE_PREC: gl.constexpr, OFF_PREC: gl.constexpr, BAND_ROWS: gl.constexpr):
    _front(a, b, A_log, dt_bias, gc, A_out, aq_desc, tb_desc, k_s, q_s, aq_s, ready, empty,
           pid, n_prog, n_items, scale, T, 1, H, G, K, BT, STAGES, A_OUT, TB_OUT, SOLVE_PREC,
           OFF_PREC, BAND_ROWS)


@gluon.jit(do_not_specialize=["T"])
def gluon_front_kernel(k_desc, q_desc, aq_desc, tb_desc, a, b, A_log, dt_bias, gc, A_out, scale,
                       T, H: gl.constexpr, G: gl.constexpr, K: gl.constexpr, BT: gl.constexpr,
                       STAGES: gl.constexpr, A_OUT: gl.constexpr, TB_OUT: gl.constexpr,
                       SOLVE_PREC: gl.constexpr, OFF_PREC: gl.constexpr, BAND_ROWS: gl.constexpr,
                       FRONT_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """The intra kernel's front for one sequence of ``T`` tokens (module doc): ``k_desc``,
    ``q_desc`` TMA over ``[T, HQ * K]`` bf16 (box ``[64, K]``), ``aq_desc`` over ``scale *
    Aqk`` ``[T, H * 64]`` bf16 (box ``[64, 64]``); ``a``, ``b`` ``[T, H]`` bf16; ``gc``
    ``[T, H]`` f32 out; ``A_out`` ``[T, H, 64]`` f32 out (``A_OUT``) or None; ``tb_desc``
    over ``Tb`` ``[T, H * 64]`` bf16 (``TB_OUT``: the solve fused in, with the product's
    precisions ``SOLVE_PREC``, ``OFF_PREC``, the block view ``_BAND4_ROWS`` if
    ``BAND_ROWS`` else ``_BAND4``) or None. ``G <= 2``.
    ``num_warps = 4`` (the first front warpgroup) plus a 4-warp front worker and a 1-warp
    load worker; one program per SM."""
    gl.static_assert(G <= 2)
    gl.static_assert(STAGES % 2 == 0)   # front warpgroup W owns the stages = W mod 2
    gl.static_assert(not (A_OUT and TB_OUT))
    HQ: gl.constexpr = H // G
    NBUF: gl.constexpr = 4 if TB_OUT else 2     # staging tiles per front warpgroup
    pid = gl.program_id(0)
    n_prog = gl.num_programs(0)
    n_items = gl.cdiv(T, BT) * HQ
    k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], k_desc.layout)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], q_desc.layout)
    aq0_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BT, BT], aq_desc.layout)
    aq1_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BT, BT], aq_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=1)      # the one front warpgroup of the stage
    gl.warp_specialize([
        (_front0, (a, b, A_log, dt_bias, gc, A_out, aq_desc, tb_desc, k_s, q_s, aq0_s, ready,
                   empty, pid, n_prog, n_items, scale, T, H, G, K, BT, STAGES, A_OUT, TB_OUT,
                   SOLVE_PREC, OFF_PREC, BAND_ROWS)),
        (_front1, (a, b, A_log, dt_bias, gc, A_out, aq_desc, tb_desc, k_s, q_s, aq1_s, ready,
                   empty, pid, n_prog, n_items, scale, T, H, G, K, BT, STAGES, A_OUT, TB_OUT,
                   SOLVE_PREC, OFF_PREC, BAND_ROWS)),
        (_producer, (k_desc, q_desc, k_s, q_s, ready, empty, pid, n_prog, n_items, HQ, K, BT,
                     STAGES)),
    ], [4, 1], [FRONT_REGS, PRODUCER_REGS])


def _layouts(K: int):
    """Shared-memory layouts of the TMA tiles: ``k``/``q`` ``[64, K]``, ``Aqk`` ``[64, 64]``."""
    return (gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([BT, BT], gl.bfloat16))


def _constexprs(H, G, K, extra, stages, band_rows=False):
    return dict(H=H, G=G, K=K, BT=BT, STAGES=stages, A_OUT=extra == "A",
                TB_OUT=extra in ("Tb", "Tb_copy"),
                SOLVE_PREC="copy" if extra == "Tb_copy" else SOLVE_PRECISION["batched"],
                OFF_PREC=OFFDIAG_PRECISION["batched"], BAND_ROWS=band_rows,
                FRONT_REGS=FRONT_REGS, PRODUCER_REGS=PRODUCER_REGS)


def compile_sm90(T=131072, H=8, HQ=4, D=128, extra=None, stages=STAGES, band_rows=False,
                 cc=90):
    """Compile ``gluon_front_kernel`` for ``sm_<cc>`` without a GPU (or torch), as
    ``scripts/probes/gluon_walk.py`` does. Returns ``(compiled, report)`` (registers,
    spills, shared memory, ptxas ``wgmma`` warnings). ``extra``: the variant's further
    output, ``stages`` its load stages and ``band_rows`` its block view (:data:`VARIANTS`)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    class _Dtype:
        is_floating_point = True

        def __init__(self, name):
            self.name = name

        def __str__(self):
            return "torch." + self.name

    class _Tensor:   # what the specialiser reads of a torch tensor
        def __init__(self, shape, dtype):
            self.shape, self.dtype = list(shape), _Dtype(dtype)

        def data_ptr(self):
            return 1 << 20

        def stride(self):
            st, acc = [], 1
            for d in reversed(self.shape):
                st.append(acc)
                acc *= d
            return tuple(reversed(st))

    K = D
    lk, lt = _layouts(K)

    def desc(shape, block, layout):
        t = _Tensor(shape, "bfloat16")
        return TensorDescriptor(t, t.shape, list(t.stride()), block, layout)

    args = dict(k_desc=desc([T, HQ * K], [BT, K], lk), q_desc=desc([T, HQ * K], [BT, K], lk),
                aq_desc=desc([T, H * BT], [BT, BT], lt),
                tb_desc=(desc([T, H * BT], [BT, BT], lt) if extra in ("Tb", "Tb_copy")
                         else None),
                a=_Tensor([T, H], "bfloat16"), b=_Tensor([T, H], "bfloat16"),
                A_log=_Tensor([H], "float32"), dt_bias=_Tensor([H], "float32"),
                gc=_Tensor([T, H], "float32"),
                A_out=_Tensor([T, H, BT], "float32") if extra == "A" else None)
    fn = gluon_front_kernel
    names = [p.name for p in fn.params]
    const = _constexprs(H, H // HQ, K, extra, stages, band_rows)
    const.update({n: None for n, x in args.items() if x is None})   # specialised away
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in const:
            sig[n] = "constexpr"
        elif n == "scale":
            sig[n] = "fp32"
        elif n == "T":
            sig[n] = "i32"
        else:
            sig[n] = mangle_type(args[n])
            if sig[n].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    consts = {(names.index(n),): v for n, v in const.items()}
    src = GluonASTSource(fn, sig, consts, attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=dict(num_warps=4))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    arch = "sm_90a" if cc == 90 else f"sm_{cc}"
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(ck.asm["ptx"])
        res = subprocess.run([ptxas, f"-arch={arch}", "-v", os.path.join(d, "k.ptx"), "-o",
                              os.path.join(d, "k.cubin")], capture_output=True, text=True)
    log = res.stdout + res.stderr
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                  log)
    report = dict(triton=triton.__version__, arch=arch, T=T, extra=extra, stages=stages,
                  band_rows=band_rows,
                  num_warps=ck.metadata.num_warps,
                  launch_regs=int(re.search(r"\.maxnreg (\d+)", ck.asm["ptx"]).group(1)),
                  setmaxnreg=[int(x) for x in re.findall(
                      r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ck.asm["ptx"])],
                  stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                  spill_load_bytes=int(m.group(3)), shared_bytes=int(ck.metadata.shared),
                  wgmma_instructions=ck.asm["ptx"].count("wgmma.mma_async"),
                  ptxas_warnings=sorted(set(re.findall(r"\((C7\d+)\)", log))))
    return ck, report


#: The Gluon variants: ``(extra, stages, band_rows)``, the output beyond ``scale Aqk`` and
#: ``gc`` (none, ``A`` f32 for :func:`solve_kernel`, ``Tb`` bf16: the solve fused in, or
#: ``Tb_copy``: the same kernel with ``A diag(beta)`` in place of ``Tb``, no solve, so
#: ``fused - fused_copy`` is what the solve adds), the ``k``, ``q`` load stages and the
#: solve's block view (``_BAND4_ROWS`` if true, else ``_BAND4``). ``fused_s2``: one stage per
#: front warpgroup (its next item's tiles load during its solve), 32 KB of shared memory less
#: than ``fused``'s ~224 KB of the 227 KB allowed. ``fused2``, ``fused_copy2``: ``fused``,
#: ``fused_copy`` with the bands cut in registers (docs/notes/long_context.md, "Why
#: fused_copy is slow").
VARIANTS = {"front": (None, 4, False), "front_a": ("A", 4, False), "fused": ("Tb", 4, False),
            "fused_s2": ("Tb", 2, False), "fused_copy": ("Tb_copy", 4, False),
            "fused2": ("Tb", 4, True), "fused_copy2": ("Tb_copy", 4, True)}


def gluon_front(x: dict, aq, gc, A_out=None, tb=None, stages=STAGES, tb_copy=False,
                band_rows=False, n_prog=None):
    """Launch ``gluon_front_kernel`` on inputs ``x`` (one sequence), writing ``aq`` ``[T, HV,
    64]`` bf16 (``scale * Aqk``), ``gc`` ``[T, HV]`` f32 and, if given, ``A_out`` ``[T,
    HV, 64]`` f32 or ``tb`` ``[T, HV, 64]`` bf16 (``Tb``, the solve fused in; not both).
    ``stages``: ``k``, ``q`` load stages (even); ``tb_copy``: ``tb`` := ``A diag(beta)`` (no
    solve: a timing baseline); ``band_rows``: the solve's block view ``_BAND4_ROWS`` (else
    ``_BAND4``); ``n_prog``: programs (default: one per SM)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    q, k = x["q"], x["k"]
    T, HQ, K = k.shape
    H = x["v"].shape[1]
    if x["cu_seqlens"].numel() != 2:
        raise ValueError("the probe runs one sequence (cu_seqlens of 2 entries)")
    if H // HQ > 2:
        raise ValueError(f"the probe's front handles G <= 2 value heads per q/k head, got {H // HQ}")
    if A_out is not None and tb is not None:
        raise ValueError("A_out and tb: one variant writes one of them")
    lk, lt = _layouts(K)

    def desc(t, cols, block, layout):
        t2 = t.view(T, cols)
        return TensorDescriptor(t2, list(t2.shape), list(t2.stride()), block, layout)

    n_prog = n_prog or torch.cuda.get_device_properties(k.device).multi_processor_count
    gluon_front_kernel[(n_prog,)](
        desc(k, HQ * K, [BT, K], lk), desc(q, HQ * K, [BT, K], lk), desc(aq, H * BT, [BT, BT], lt),
        None if tb is None else desc(tb, H * BT, [BT, BT], lt),
        x["a"], x["b"], x["A_log"], x["dt_bias"], gc, A_out, _scale(x), T, num_warps=4,
        **_constexprs(H, H // HQ, K, "A" if A_out is not None else None if tb is None
                      else "Tb_copy" if tb_copy else "Tb", stages, band_rows))


def _scale(x: dict) -> float:
    s = x.get("scale")
    return float(s) if s else x["q"].shape[-1] ** -0.5


@triton.jit
def solve_kernel(A, b, w, T, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                 COPY: tl.constexpr, SOLVE_PREC: tl.constexpr, OFF_PREC: tl.constexpr):
    """Program ``(chunk, value head)`` (heads fastest): ``A`` ``[T, H, BT]`` f32 and ``b``
    in, ``Tb = (I + A)^-1 diag(sigmoid(b))`` out into ``w`` ``[T, H, BT]``, by the
    product's batched solve; ``COPY``: ``A``'s bands instead of the solve's."""
    i_c = tl.program_id(0) // H
    i_h = tl.program_id(0) % H
    t0 = i_c * BT
    n_t = T - t0
    o_r = tl.arange(0, BT)
    m_r = o_r < n_t
    p_A = A + (t0 * H + i_h) * BT + o_r[:, None] * (H * BT) + o_r[None, :]
    b_A = tl.load(p_A, mask=m_r[:, None], other=0.0)
    b_beta = tl.sigmoid(tl.load(b + (t0 + o_r) * H + i_h, mask=m_r, other=0.0).to(tl.float32))
    b_beta = tl.where(m_r, b_beta, 0.0)
    if COPY:
        A4 = tl.reshape(b_A, (4, BC, 4, BC))
        T0 = _band(A4, 0)
        T1 = _band(A4, 1)
        T2 = _band(A4, 2)
        T3 = _band(A4, 3)
    else:
        T0, T1, T2, T3 = solve_bands(b_A, BC, SOLVE_PREC, OFF_PREC)
    p_w = w + (t0 * H + i_h) * BT
    _store_band(p_w, T0, b_beta, 0, n_t, H, BC)
    _store_band(p_w, T1, b_beta, 1, n_t, H, BC)
    _store_band(p_w, T2, b_beta, 2, n_t, H, BC)
    _store_band(p_w, T3, b_beta, 3, n_t, H, BC)
    _store_band(p_w, T0, b_beta, -1, n_t, H, BC)
    _store_band(p_w, T0, b_beta, -2, n_t, H, BC)
    _store_band(p_w, T0, b_beta, -3, n_t, H, BC)


def triton_solve(A, b, w, copy: bool = False):
    """Launch :func:`solve_kernel`: ``Tb`` of ``A`` ``[T, HV, 64]`` f32 and ``b`` into ``w``
    (the batched solve's precisions, 4 warps as the intra kernel)."""
    T, H = A.shape[0], A.shape[1]
    solve_kernel[(triton.cdiv(T, BT) * H,)](A, b, w, T, H=H, BT=BT, BC=BC, COPY=copy,
                                           SOLVE_PREC=SOLVE_PRECISION["batched"],
                                           OFF_PREC=OFFDIAG_PRECISION["batched"], num_warps=4)


def triton_intra(x: dict, lb=None):
    """The Triton intra kernel as the long path launches it (raw gates, ``"compact"``,
    ``log_bound`` when given): ``(Tb, gc, scale Aqk)``."""
    from kernels.prefill.intra_chunk import intra_chunk_fwd

    return intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], x["q"], scale=_scale(x),
                           a=x["a"], b=x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           storage="compact", log_bound=lb)


def front_reference(x: dict, gc):
    """torch, f32: the front's ``A`` and ``scale * Aqk`` (before bf16) from the inputs and
    a given ``gc`` (so a gate of ``A`` / ``Aqk`` does not also carry ``gc``'s error):
    ``(A, aqk)``, ``[T, HV, 64]`` each, chunk rows past ``T`` absent."""
    import torch

    q, k, b = x["q"].float(), x["k"].float(), x["b"].float()
    T, HQ, K = k.shape
    H = x["v"].shape[1]
    G = H // HQ
    n_c = -(-T // BT)
    pad = n_c * BT - T

    def chunks(t):   # [T, ...] -> [n_c, BT, ...], zero rows past T
        t = torch.nn.functional.pad(t, (0, 0) * (t.dim() - 1) + (0, pad))
        return t.view(n_c, BT, *t.shape[1:])

    kc, qc = chunks(k), chunks(q)                             # [n_c, BT, HQ, K]
    gcc = chunks(gc.float())                                  # [n_c, BT, H]
    beta = chunks(torch.sigmoid(b))
    kk = torch.einsum("cihd,cjhd->chij", kc, kc).repeat_interleave(G, 1)    # [n_c, H, i, j]
    qk = torch.einsum("cihd,cjhd->chij", qc, kc).repeat_interleave(G, 1)
    g = gcc.permute(0, 2, 1)                                  # [n_c, H, BT]
    decay = torch.exp(torch.clamp(g[..., :, None] - g[..., None, :], max=0.0))
    o = torch.arange(BT, device=k.device)
    A = torch.where(o[:, None] > o[None, :], kk * beta.permute(0, 2, 1)[..., :, None] * decay,
                    0.0)
    aqk = torch.where(o[:, None] >= o[None, :], _scale(x) * qk * decay, 0.0)
    back = lambda t: t.permute(0, 2, 1, 3).reshape(n_c * BT, H, BT)[:T].contiguous()   # noqa: E731
    return back(A), back(aqk)


def gate_front(x: dict, ref_gc, ref_aq, gc, aq, A=None) -> dict:
    """The front's outputs against the Triton intra kernel's (``ref_*``) on the same inputs:
    ``gc`` within 1e-5 abs (the scan sums in another order); ``aq`` (bf16 ``scale Aqk``)
    within one bf16 rounding of f32 values that differ in their accumulation order:
    ``|aq - ref| <= 2^-7 |ref| + 1e-6`` everywhere; with ``A`` (f32), within ``1e-5 + 1e-5
    |A|`` of the torch f32 ``A`` formed from the same inputs and the Triton ``gc``. NaN
    anywhere (an unwritten entry) fails."""
    import torch

    d_gc = (gc - ref_gc).abs().nan_to_num(float("inf"))
    d_aq = (aq.float() - ref_aq.float()).abs().nan_to_num(float("inf"))
    ok_aq = bool((d_aq <= 2 ** -7 * ref_aq.float().abs() + 1e-6).all())
    row = dict(gc_max_abs=d_gc.max().item(), aq_max_abs=d_aq.max().item(),
               aq_bitwise=bool(torch.equal(aq, ref_aq)),
               aq_equal_frac=float((aq == ref_aq).float().mean()))
    ok = row["gc_max_abs"] <= 1e-5 and ok_aq
    if A is not None:
        A_ref, _ = front_reference(x, ref_gc)
        d_A = (A - A_ref).abs().nan_to_num(float("inf"))
        row["A_max_abs"] = d_A.max().item()
        ok = ok and bool((d_A <= 1e-5 + 1e-5 * A_ref.abs()).all())
    return dict(row, ok=ok)


def gate_tb(A, b, tb, ref_tb) -> dict:
    """``Tb`` (from :func:`solve_kernel` on ``A``, or the fused variant's, whose ``A`` is
    torch's f32 one from the same inputs) against the Triton intra kernel's: within
    2e-2 abs (the two ``A`` differ in their last bits and the solve's entries reach ~10;
    bf16 ``Tb`` itself rounds at 2^-8 relative), and against the float64 inverse of the
    same ``A``: no further from it than the Triton ``Tb`` is (plus 1e-3), so the first
    bound cannot pass a wrong solve alone."""
    import torch

    T, H = A.shape[0], A.shape[1]
    n_c = -(-T // BT)
    pad = n_c * BT - T

    def exact(Af):   # float64 (I + A)^-1 diag(beta) per chunk and head
        Ac = torch.nn.functional.pad(Af.double(), (0, 0, 0, 0, 0, pad))
        Ac = Ac.view(n_c, BT, H, BT).permute(0, 2, 1, 3)
        eye = torch.eye(BT, dtype=torch.float64, device=A.device)
        Tm = torch.linalg.solve_triangular(eye + Ac, eye.expand_as(Ac), upper=False)
        beta = torch.nn.functional.pad(torch.sigmoid(b.double()), (0, 0, 0, pad))
        Tb = Tm * beta.view(n_c, BT, H).permute(0, 2, 1)[:, :, None, :]
        return Tb.permute(0, 2, 1, 3).reshape(n_c * BT, H, BT)[:T]

    ex = exact(A)
    d = (tb.float() - ref_tb.float()).abs().nan_to_num(float("inf"))
    d_ex = (tb.double() - ex).abs().nan_to_num(float("inf")).max().item()
    d_ref_ex = (ref_tb.double() - ex).abs().max().item()
    row = dict(tb_max_abs=d.max().item(), tb_vs_exact=d_ex, triton_tb_vs_exact=d_ref_ex,
               tb_scale=ref_tb.float().abs().max().item(),
               tb_bitwise=bool(torch.equal(tb, ref_tb)),
               tb_equal_frac=float((tb == ref_tb).float().mean()))
    return dict(row, ok=row["tb_max_abs"] <= 2e-2 and d_ex <= d_ref_ex + 1e-3)


def fused_emulation(A, b):
    """torch, step for step the fused variant's solve (``_solve_tb``): ``A`` ``[T, HV, 64]``
    f32 (strictly lower per chunk) and ``b`` in, ``Tb`` ``[T, HV, 64]`` f32 out (the
    caller rounds it to bf16). The same block views (``[4, 16, 4, 16]`` of a chunk's tile,
    entry ``I`` of band ``D`` = block ``(I, I - D)``), shifts, hi / lo splits, accumulation
    order (the folded sums) and assembly with ``beta`` on the columns; the products in f32
    where the GPU's ``mma`` rounds to tf32 and accumulates in its own order. A check of the
    scheme's indexing against the Triton solve on the CPU, not of the Gluon code itself."""
    import torch

    T, H = A.shape[0], A.shape[1]
    n_c = -(-T // BT)
    pad = n_c * BT - T
    Ac = torch.nn.functional.pad(A.float(), (0, 0, 0, 0, 0, pad))
    Ac = Ac.view(n_c, BT, H, BT).permute(0, 2, 1, 3)              # [n_c, H, 64, 64]
    beta = torch.nn.functional.pad(torch.sigmoid(b.float()), (0, 0, 0, pad))
    beta = beta.view(n_c, BT, H).permute(0, 2, 1)                 # [n_c, H, 64]
    A4 = Ac.reshape(n_c, H, 4, 16, 4, 16)
    o4 = torch.arange(4)

    def band(D):    # [n_c, H, 4, 16, 16]: entry I = block (I, I - D), zeros for I < D
        m = ((o4[:, None] - D) == o4[None, :]).float()              # [I, J]
        return torch.einsum("ij,chirjs->chirs", m, A4)

    def shift(X, D):   # entry I = X[I - D], zeros for I < D
        m = ((o4[:, None] - D) == o4[None, :]).float()
        return torch.einsum("im,chmrs->chirs", m, X)

    def split(x):
        hi = x.to(torch.bfloat16).float()
        return hi, (x - hi).to(torch.bfloat16).float()

    def mm(x, y, acc, prec):
        if prec == "bf16x2":
            xh, xl = split(x)
            yh, yl = split(y)
            return ((acc + xh @ yh) + xh @ yl) + xl @ yh
        return acc + x @ y

    P, O = SOLVE_PRECISION["batched"], OFFDIAG_PRECISION["batched"]
    z = torch.zeros(n_c, H, 4, 16, 16)
    o16 = torch.arange(16)
    eye = (o16[:, None] == o16[None, :]).float()
    A0 = band(0)
    D8 = torch.where((o16[:, None] // 8) == (o16[None, :] // 8), A0, 0.0)
    P2 = mm(D8, D8, z, P)
    P4 = mm(P2, P2, z, P)
    Ti8 = mm(mm(eye - D8, eye + P2, z, P), eye + P4, z, P)
    T0 = mm(eye - mm(Ti8, A0 - D8, z, P), Ti8, z, P)
    A1, A2, A3 = band(1), band(2), band(3)
    T1 = -mm(T0, mm(A1, shift(T0, 1), z, O), z, O)
    T2 = -mm(T0, mm(A1, shift(T1, 1), mm(A2, shift(T0, 2), z, O), O), z, O)
    S3 = mm(A1, shift(T2, 1), mm(A2, shift(T1, 2), mm(A3, shift(T0, 3), z, O), O), O)
    T3 = -mm(T0, S3, z, O)
    Tm = torch.zeros(n_c, H, 4, 16, 4, 16)
    for D, TD in enumerate((T0, T1, T2, T3)):
        m = ((o4[:, None] - D) == o4[None, :])[:, None, :, None]    # [I, 1, J, 1]
        Tm = torch.where(m, TD[:, :, :, :, None, :], Tm)
    Tb = (Tm * beta.view(n_c, H, 1, 1, 4, 16)).reshape(n_c, H, BT, BT)
    return Tb.permute(0, 2, 1, 3).reshape(n_c * BT, H, BT)[:T]


def gate_copy(A, b, tb, rel=2 ** -7, atol=1e-6) -> dict:
    """The no-solve ``Tb`` (``fused_copy``, ``copy_t``) against ``A diag(beta)`` from ``A``
    ``[T, HV, 64]`` f32 (strictly lower per chunk): ``<= rel |want| + atol``, by default one
    bf16 step (``A`` another f32 computation of the same values, e.g. torch's for the Gluon
    kernel's); ``2^-8``, ``1e-7`` (one bf16 rounding) when ``A`` is the kernel's own. NaN
    fails."""
    import torch

    T, H = A.shape[0], A.shape[1]
    n_c = -(-T // BT)
    bp = torch.nn.functional.pad(torch.sigmoid(b.float()), (0, 0, 0, n_c * BT - T))
    bcol = bp.view(n_c, BT, H).permute(0, 2, 1)[torch.arange(T, device=A.device) // BT]
    want = A * bcol
    d = (tb.float() - want).abs().nan_to_num(float("inf"))
    return dict(copy_max_abs=d.max().item(),
                ok=bool((d <= rel * want.abs() + atol).all()))


def run_emulate(lengths) -> int:
    """``--emulate`` (CPU, interpreter): the front's torch emulation (:func:`front_reference`
    with the Triton ``gc``) and :func:`solve_kernel` on its ``A`` against the Triton intra
    kernel at a small shape, and the fused variant's solve in torch (:func:`fused_emulation`)
    on the same ``A``; checks the gates, the solve kernel and the fused solve's scheme, not
    the Gluon code (which runs only on the GPU). One JSON line per length; returns 1 if a
    gate fails."""
    import torch

    from kernels.spec import make_prefill_inputs

    status = 0
    for T in lengths:
        x = make_prefill_inputs([T], seed=0)
        H = x["v"].shape[1]
        ref_tb, ref_gc, ref_aq = triton_intra(x)
        A, aqk = front_reference(x, ref_gc)
        row = dict(T=T, **gate_front(x, ref_gc, ref_aq, ref_gc.clone(), aqk.to(torch.bfloat16),
                                     A))
        for copy in (False, True):
            tb = torch.full((T, H, BT), float("nan"), dtype=torch.bfloat16)
            triton_solve(A, x["b"], tb, copy=copy)
            if copy:   # A's bands with columns scaled by beta: A diag(beta) (A is strictly lower)
                row["copy_ok"] = gate_copy(A, x["b"], tb, 2 ** -8, 1e-7)["ok"]
            else:
                g = gate_tb(A, x["b"], tb, ref_tb)
                row.update({f"solve_{k}": v for k, v in g.items()})
        tb = fused_emulation(A, x["b"]).to(torch.bfloat16)
        row.update({f"fused_{k}": v for k, v in gate_tb(A, x["b"], tb, ref_tb).items()})
        ok = row["ok"] and row["solve_ok"] and row["copy_ok"] and row["fused_ok"]
        status |= 0 if ok else 1
        print(json.dumps(dict(row, all_ok=ok)), flush=True)
    return status


def _finish_or_exit(what: str, timeout_s: float, emit) -> None:
    """Wait for the GPU up to ``timeout_s``; a kernel still running then is taken for a
    deadlock (a barrier phase wrong): report and leave the process."""
    import time

    import torch

    ev = torch.cuda.Event()
    ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > timeout_s:
            emit(dict(kind="hang", what=what, waited_s=timeout_s))
            os._exit(3)
        time.sleep(0.01)


def run_gpu(lengths, time_it: bool, out_dir: str, variants) -> int:
    """The GPU modes (module docstring): every implementation gated, only those that pass
    timed. Returns 1 if a gate failed or a launch raised."""
    import torch
    from kernels.bench.anatomy import kernel_times
    from kernels.bench.timing import time_fn

    sha = os.environ.get("GDN_GIT_SHA", "dev")[:7]
    gpu = torch.cuda.get_device_name()
    out = open(os.path.join(out_dir, f"gluon_intra_{sha}.jsonl"), "w")

    def emit(row):
        row = dict(row, gpu=gpu, sha=sha, triton=triton.__version__, torch=torch.__version__)
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()

    from kernels.spec import make_prefill_inputs

    status = 0
    for T in lengths:
        x = make_prefill_inputs([T], seed=0, device="cuda", with_state=False)
        H = x["v"].shape[1]
        info = dict(T=T, n_sm=torch.cuda.get_device_properties(0).multi_processor_count)
        lb = torch.empty(T // BT + 1, H, dtype=torch.float32, device="cuda")
        ref_tb, ref_gc, ref_aq = triton_intra(x, lb)
        torch.cuda.synchronize()
        impls = {"triton_intra": lambda: triton_intra(x, lb)}
        A_front = None
        for var in variants:
            extra, stages, rows = VARIANTS[var]
            gc = torch.full_like(ref_gc, float("nan"))
            aq = torch.full_like(ref_aq, float("nan"))
            A = torch.full((T, H, BT), float("nan"), device="cuda") if extra == "A" else None
            tb = (torch.full_like(ref_tb, float("nan")) if extra in ("Tb", "Tb_copy")
                  else None)
            # every per-variant value bound as a default: the timing loop below calls fn
            # after this loop has moved on (a free `extra` made the first H200 run time
            # every fused variant as the last one's `Tb_copy`)
            fn = (lambda gc=gc, aq=aq, A=A, tb=tb, st=stages, cp=extra == "Tb_copy",   # noqa: E731
                  ro=rows: gluon_front(x, aq, gc, A, tb, st, cp, ro))
            name = f"gluon_{var}"
            try:
                fn()
                _finish_or_exit(name, 30.0, emit)
            except Exception as e:   # noqa: BLE001 -- report, go on with the others
                emit(dict(info, kind="error", impl=name, error=f"{type(e).__name__}: {e}"[:400]))
                status = 1
                continue
            r = gate_front(x, ref_gc, ref_aq, gc, aq, A)
            if extra == "Tb":   # Tb against the Triton one and the inverse of torch's f32 A
                r_tb = gate_tb(front_reference(x, ref_gc)[0], x["b"], tb, ref_tb)
                r = {**r, **r_tb, "ok": r["ok"] and r_tb["ok"]}
            elif extra == "Tb_copy":
                r_tb = gate_copy(front_reference(x, ref_gc)[0], x["b"], tb)
                r = {**r, **r_tb, "ok": r["ok"] and r_tb["ok"]}
            emit(dict(info, kind="gate", impl=name, **r))
            status |= 0 if r["ok"] else 1
            if r["ok"]:
                impls[name] = fn
                if extra == "A":
                    A_front = A
        if A_front is not None:   # the solve in Triton form on the Gluon front's A
            for copy in (False, True):
                tb = torch.full_like(ref_tb, float("nan"))
                name = "copy_t" if copy else "solve_t"
                fn = (lambda tb=tb, c=copy:                                  # noqa: E731
                      triton_solve(A_front, x["b"], tb, copy=c))
                fn()
                torch.cuda.synchronize()
                if copy:   # no solve (a timing baseline): A diag(beta) of the same A
                    r = gate_copy(A_front, x["b"], tb, 2 ** -8, 1e-7)
                else:
                    r = gate_tb(A_front, x["b"], tb, ref_tb)
                emit(dict(info, kind="gate", impl=name, **r))
                status |= 0 if r["ok"] else 1
                if r["ok"]:
                    impls[name] = fn
        if time_it:
            for name, fn in impls.items():
                kt = kernel_times(fn, calls=5)
                cold = time_fn(fn, "cupti_cold", rep=20, warmup=3)
                emit(dict(info, kind="time", impl=name, kernel_us=float(kt["median_us"][0]),
                          p20_us=float(kt["p20_us"][0]), p80_us=float(kt["p80_us"][0]),
                          cupti_cold_us=cold.median_us, method="kernel_times (CUPTI, warm "
                          "L2, eager) median of 5; cupti_cold median of 20"))
        del x, impls, A_front
        torch.cuda.empty_cache()
    out.close()
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true",
                    help="compile for sm_90a without a GPU and report")
    ap.add_argument("--json", default=None, help="--compile: write the reports here")
    ap.add_argument("--emulate", action="store_true",
                    help="CPU: the front's emulation and the Triton solve kernel (interpreter) "
                         "against the Triton intra kernel")
    ap.add_argument("--check", action="store_true", help="gate the kernels (GPU)")
    ap.add_argument("--time", action="store_true",
                    help="gate, then time the kernels that passed (GPU)")
    ap.add_argument("--lengths", default=None,
                    help="tokens, comma-separated (default 131072,32768,4133; --emulate 200)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"Gluon variants to run, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    if any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: pick from {', '.join(VARIANTS)}")
    if a.compile:
        rows = []
        for var in variants:
            try:
                extra, stages, band_rows = VARIANTS[var]
                rows.append(dict(variant=var, **compile_sm90(extra=extra, stages=stages,
                                                             band_rows=band_rows)[1]))
            except Exception as e:   # noqa: BLE001 -- report every configuration
                rows.append(dict(variant=var, error=f"{type(e).__name__}: {e}"[:600]))
            print(json.dumps(rows[-1]), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        return int(any("error" in r or r["spill_store_bytes"] or r["ptxas_warnings"]
                       for r in rows))
    if a.emulate:
        return run_emulate([int(t) for t in (a.lengths or "200").split(",")])
    if not (a.check or a.time):
        ap.error("pick --compile, --emulate, or --check and/or --time (GPU)")
    return run_gpu([int(t) for t in (a.lengths or "131072,32768,4133").split(",")], a.time, a.out,
                   variants)


if __name__ == "__main__":
    sys.exit(main())
