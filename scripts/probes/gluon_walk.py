"""Probe: the long path's phase C as a warp-specialized Gluon kernel (a producer warp
loading by TMA ahead of two state warpgroups), against the Triton phase C on the same
inputs. Question: can the outputs' work (``q``, ``Aqk`` loads, two output products, the
``o`` store) hide behind the state chain? Prediction and decision rule:
docs/notes/long_context.md, "Gluon walk probe: prediction".

What phase C does (:func:`kernels.prefill.state_walk_t.state_walk_t_kernel` with
``FROM_S0``, one program per (segment slot, value head), the state held transposed,
``S^T`` ``[V, K]`` f32, rows split over two warpgroups of 64). Per chunk of ``BT = 64``
tokens ``t0 .. t0+63`` of head ``h`` (q/k head ``h // G``), with ``gc`` the chunk's
cumulative log decay ``[BT]`` and ``gl`` its last row's value::

    X    = S^T k^T                                  [64, K] x [K, BT]     (chain)
    R    = v^T - X diag(exp(gc))                    [64, BT]
    N    = R Tb^T                                   [64, BT] x [BT, BT]   (chain)
    o^T  = (S^T q^T) diag(scale exp(gc)) + N Aqk^T  two products          (outputs; scale is
                                                                           in the stored Aqk)
    S^T <- exp(gl) S^T + (N diag(exp(gl - gc))) k   [64, BT] x [BT, K]    (chain)

with every product's operands rounded to bf16 (``S``, ``R``, ``N``, the decayed ``N``) and
f32 accumulation, as the Triton walk's ``"bf16"`` precisions. ``Tb``, ``scale * Aqk``,
``gc`` are the intra-chunk kernel's (``[T, HV, 64]`` bf16, ``[T, HV]`` f32); the entering
state ``s0`` ``[slots, HV, V, K]`` comes from phase B; each chunk writes its rows of
``o`` ``[T, HV, V]`` bf16, and the sequence's last unit the final state ``ht``
``[1, HV, V, K]``.

The Gluon kernel (``gluon_walk_kernel``, Triton 3.6 API; one program per (slot, head),
one sequence):

* producer partition (1 warp): per chunk, into stage ``i % STAGES`` behind the stage's
  ``empty`` barrier, TMA loads of ``k``, ``q`` (``[64, K]``), ``v`` (two ``[64, 64]``
  halves, one per warpgroup), ``Tb``, ``Aqk`` (``[64, 64]``); the stage's ``ready``
  barrier counts the bytes;
* two state partitions (4 warps each: the default partition and a worker), warpgroup
  ``W`` owning rows ``64 W .. 64 W + 63`` of ``S^T`` in registers; per chunk, with
  asynchronous ``wgmma`` (``S``, ``R``, ``N`` from registers): ``X`` and ``S^T q^T``
  issued together, wait for ``X``; ``N``; then ``N Aqk^T`` and the state update issued
  together, wait for the output product, store the ``o`` tile (registers -> shared
  memory -> TMA, double-buffered) and load the next chunk's ``gc`` while the state update
  runs; wait for it, release the stage. Everything is retired at the end of the step: an
  accumulator in flight across the loop's back edge makes ptxas serialise every ``wgmma``
  of the loop (warning C7514). The two warpgroups are independent (no row of ``S^T``
  feeds another), so their chains interleave on the SM's tensor cores without an
  explicit ping-pong barrier.

Variants (:data:`VARIANTS`): 2 or 3 load stages; the chain alone (no ``q``, ``Aqk``,
output products, ``o``) for the Gluon chain's own step time; ``Aqk`` formed on chip
(``onchip_s2``, 2 stages): the producer loads no ``Aqk``; each state warpgroup issues
``q k^T`` for half of the next chunk's keys behind its state update, retires it with the
update, applies the causal mask, decay and scale as the intra-chunk kernel does and stores
its half of ``Aqk^T`` to shared memory (:func:`_form_aqk`; the first chunk's before the
loop); the output product waits for both halves on a count-2 mbarrier. The probe walks one
sequence with ``D = 128`` (the contest's) and no ``cu_seqlens`` guard.

Modes (torch only outside ``--compile``; the GPU host has torch 2.11 + triton 3.6)::

    python3 scripts/probes/gluon_walk.py --compile [--json F]   # CPU: sm_90a compile, report
    PYTHONPATH=$PWD TRITON_INTERPRET=1 python3 scripts/probes/gluon_walk.py --emulate \
        --lengths 700                                           # CPU: emulation vs Triton
    PYTHONPATH=$PWD python3 scripts/probes/gluon_walk.py --check --time --out $OUT

``--check``: for each length (131,072 and 32,768 tokens, one sequence, the generator's
inputs, ``kernels.spec.make_prefill_inputs(seed=0)``) one ``gdn_prefill`` call records
phase C's launch (its inputs: ``Tb``, ``Aqk``, ``gc``, ``s0``, the split), then each Gluon
variant runs on the same inputs into NaN-filled outputs; gates: the call's and each
variant's ``o`` and final state against the chunked float32 reference of the whole call
(contest rule, :func:`kernels.checks.check_outputs`; the state alone for the chain-only
variant), and the max abs difference to the Triton phase C's. ``--time`` (gates first;
only what passed is timed): the phase C kernels alone, CUPTI kernel durations
(:func:`kernels.bench.anatomy.kernel_times`, warm L2, the method of the notes' per-kernel
numbers) and ``cupti_cold`` (:func:`kernels.bench.timing.time_fn`), plus the whole call's
per-kernel times. One JSON line per measurement on stdout and in
``$OUT/gluon_walk_<sha>.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

BT = 64             # chunk size (the pipeline's)
STAGES = 2          # default load stages in shared memory (64 KB each)
PRODUCER_REGS = 24  # registers per thread of the producer's warpgroup (setmaxnreg)
STATE_REGS = 240    # of the worker state warpgroup; the default one gets the rest (240)


@gluon.jit
def _producer(k_desc, q_desc, v_desc, tb_desc, aq_desc, k_s, q_s, v0_s, v1_s, tb_s, aq_s,
              ready, empty, ubos, n_c, i_h, i_hk, K: gl.constexpr, V: gl.constexpr,
              BT: gl.constexpr, STAGES: gl.constexpr, OUTPUTS: gl.constexpr,
              AQK_ONCHIP: gl.constexpr):
    """One warp: chunk ``i``'s tiles into stage ``i % STAGES`` once both state
    warpgroups released it (``empty``); ``ready`` completes when the bytes have landed
    (``q`` only with ``OUTPUTS``, ``Aqk`` only with ``OUTPUTS`` and not ``AQK_ONCHIP``)."""
    AQ_LOAD: gl.constexpr = OUTPUTS and not AQK_ONCHIP
    NBYTES: gl.constexpr = 2 * (BT * K + BT * V + BT * BT + (BT * K if OUTPUTS else 0)
                                + (BT * BT if AQ_LOAD else 0))
    for i in range(n_c):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        t0 = (ubos + i * BT).to(gl.int32)
        mbarrier.expect(bar, NBYTES)
        tma.async_copy_global_to_shared(k_desc, [t0, i_hk * K], bar, k_s.index(s))
        tma.async_copy_global_to_shared(v_desc, [t0, i_h * V], bar, v0_s.index(s))
        tma.async_copy_global_to_shared(v_desc, [t0, i_h * V + V // 2], bar, v1_s.index(s))
        tma.async_copy_global_to_shared(tb_desc, [t0, i_h * BT], bar, tb_s.index(s))
        if OUTPUTS:
            tma.async_copy_global_to_shared(q_desc, [t0, i_hk * K], bar, q_s.index(s))
        if AQ_LOAD:
            tma.async_copy_global_to_shared(aq_desc, [t0, i_h * BT], bar, aq_s.index(s))


@gluon.jit
def _store_o(o_desc, o_s, O, j, t0, col):
    """The ``[64 rows of S^T, BT]`` tile ``O`` (f32) as bf16 ``o`` rows ``t0 ..`` columns
    ``col ..``: through shared-memory buffer ``j`` (the store issued two chunks ago from it
    must have read it), then a TMA store."""
    buf = o_s.index(j)
    tma.store_wait(1)
    buf.store(gl.permute(O.to(gl.bfloat16), (1, 0)))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [t0, col], buf)


@gluon.jit
def _issue_qk(q_s, k_s, ready, c, zero_h, W: gl.constexpr, BT: gl.constexpr,
              STAGES: gl.constexpr):
    """``AQK_ONCHIP``: once chunk ``c``'s tiles have landed, issue (asynchronous) ``q k^T``
    for warpgroup ``W``'s keys ``BT/2 W ..``: ``[BT queries, BT/2 keys]``."""
    HB: gl.constexpr = BT // 2
    s = c % STAGES
    mbarrier.wait(ready.index(s), (c // STAGES) & 1)
    return warpgroup_mma(q_s.index(s), k_s.index(s).slice(W * HB, HB).permute((1, 0)), zero_h,
                         use_acc=False, is_async=True)


@gluon.jit
def _form_aqk(gc, QK, aqt, bar, t0, ueos, i_h, scale, W: gl.constexpr, H: gl.constexpr,
              BT: gl.constexpr, L: gl.constexpr):
    """``AQK_ONCHIP``: warpgroup ``W``'s half of the chunk's ``scale * Aqk`` from its
    ``q k^T`` half ``QK`` (``[BT queries, BT/2 keys]``, keys ``BT/2 W ..``, layout ``L``),
    as the intra-chunk kernel stores it: ``bf16(scale * (q_i . k_j) exp(min(gc_i - gc_j,
    0)))`` for ``j <= i``, else 0 (``gc`` 0 past the unit's end, where TMA gave zero
    ``q``, ``k`` rows); stored transposed into rows ``BT/2 W ..`` of the shared ``Aqk^T``
    tile ``aqt`` (the output product's B operand), then ``bar`` is arrived on (it completes
    with both warpgroups' halves)."""
    HB: gl.constexpr = BT // 2
    o_i = gl.arange(0, BT, layout=gl.SliceLayout(1, L))
    o_j = W * HB + gl.arange(0, HB, layout=gl.SliceLayout(0, L))
    g_i = gl.load(gc + (t0 + o_i) * H + i_h, mask=t0 + o_i < ueos, other=0.0)
    g_j = gl.load(gc + (t0 + o_j) * H + i_h, mask=t0 + o_j < ueos, other=0.0)
    A = QK * gl.exp(gl.minimum(g_i[:, None] - g_j[None, :], 0.0))
    A = gl.where(o_i[:, None] >= o_j[None, :], A, 0.0)
    aqt.slice(W * HB, HB).store(gl.permute((scale * A).to(gl.bfloat16), (1, 0)))
    fence_async_shared()
    mbarrier.arrive(bar)


@gluon.jit
def _state_wg(gc, s0, ht, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty, aq_ready,
              s_off, ubos, ueos, n_c, i_h, scale, last, W: gl.constexpr, H: gl.constexpr,
              K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr,
              OUTPUTS: gl.constexpr, AQK_ONCHIP: gl.constexpr):
    """Rows ``64 W ..`` of ``S^T`` over the unit's chunks (see the module docstring):
    products asynchronous, waits only where the chain needs a result. Without
    ``OUTPUTS`` the chain alone (no ``q``, ``Aqk``, output products or ``o``). With
    ``AQK_ONCHIP`` the warpgroup forms its half of the chunk's ``scale * Aqk`` (keys
    ``BT/2 W ..``, :func:`_form_aqk`) while ``R Tb^T`` runs, and the output product waits
    for both halves (``aq_ready``) instead of a loaded tile."""
    R: gl.constexpr = V // 2
    HB: gl.constexpr = BT // 2
    acc_k: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, K, 16])
    acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BT, 16])
    acc_h: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, HB, 16])
    a_k: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_k, k_width=2)
    a_t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t, k_width=2)
    cols_t: gl.constexpr = gl.SliceLayout(0, acc_t)

    o_r = W * R + gl.arange(0, R, layout=gl.SliceLayout(1, acc_k))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, acc_k))
    p_rows = o_r[:, None] * K + o_k[None, :]
    S = gl.load(s0 + s_off + p_rows)                      # [R, K] f32, S^T rows
    o_t = gl.arange(0, BT, layout=cols_t)
    zero_t = gl.zeros([R, BT], gl.float32, acc_t)
    zero_h = gl.zeros([BT, HB], gl.float32, acc_h)
    # each chunk's gc (and its last row) is loaded during the previous chunk's state update
    b_gc = gl.load(gc + (ubos + o_t) * H + i_h, mask=ubos + o_t < ueos, other=0.0)
    b_gl = gl.load(gc + (gl.minimum(ubos + BT, ueos) - 1) * H + i_h)
    if AQK_ONCHIP:   # the first chunk's half of Aqk (each later one during the step before)
        QK = warpgroup_mma_wait(0, deps=[_issue_qk(q_s, k_s, ready, 0, zero_h, W, BT, STAGES)])
        _form_aqk(gc, QK, aq_s.index(0), aq_ready.index(0), ubos, ueos, i_h, scale, W, H, BT,
                  acc_h)
    for i in range(n_c):
        s = i % STAGES
        t0 = ubos + i * BT
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        k_i = k_s.index(s)
        Sb = gl.convert_layout(S.to(gl.bfloat16), a_t)
        X = warpgroup_mma(Sb, k_i.permute((1, 0)), zero_t, use_acc=False, is_async=True)
        if OUTPUTS:
            OQ = warpgroup_mma(Sb, q_s.index(s).permute((1, 0)), zero_t, use_acc=False,
                               is_async=True)
            X = warpgroup_mma_wait(1, deps=[X])            # S^T q^T stays in flight
        else:
            X = warpgroup_mma_wait(0, deps=[X])
        vt = v_s.index(s).permute((1, 0)).load(acc_t)     # v^T [R, BT]
        Rb = gl.convert_layout((vt.to(gl.float32) - X * gl.exp(b_gc)[None, :])
                               .to(gl.bfloat16), a_t)
        N = warpgroup_mma(Rb, tb_s.index(s).permute((1, 0)), zero_t, use_acc=False,
                          is_async=True)
        if OUTPUTS:
            N, OQ, Rb, Sb = warpgroup_mma_wait(0, deps=[N, OQ, Rb, Sb])
            Db = gl.convert_layout((N * gl.exp(b_gl - b_gc)[None, :]).to(gl.bfloat16), a_k)
            Nb = gl.convert_layout(N.to(gl.bfloat16), a_t)
            if AQK_ONCHIP:
                # both halves (formed during the previous step, or before the loop)
                mbarrier.wait(aq_ready.index(s), (i // STAGES) & 1)
                aq_b = aq_s.index(s)                         # Aqk^T [keys, queries]
            else:
                aq_b = aq_s.index(s).permute((1, 0))         # loaded as Aqk [queries, keys]
            O = warpgroup_mma(Nb, aq_b, OQ * (scale * gl.exp(b_gc))[None, :], is_async=True)
            S = warpgroup_mma(Db, k_i, S * gl.exp(b_gl), is_async=True)
            O, Nb = warpgroup_mma_wait(1, deps=[O, Nb])
            # the chunk's outputs leave while the state update runs
            _store_o(o_desc, o_s, O, i % 2, t0.to(gl.int32), i_h * V + W * R)
            if AQK_ONCHIP:
                # the next chunk's q k^T half behind the state update (the last chunk: its
                # own again, not stored); retired with it below
                c = gl.minimum(i + 1, n_c - 1)
                QK = _issue_qk(q_s, k_s, ready, c, zero_h, W, BT, STAGES)
        else:
            N, Rb, Sb = warpgroup_mma_wait(0, deps=[N, Rb, Sb])
            Db = gl.convert_layout((N * gl.exp(b_gl - b_gc)[None, :]).to(gl.bfloat16), a_k)
            S = warpgroup_mma(Db, k_i, S * gl.exp(b_gl), is_async=True)
        t1 = t0 + BT
        b_gc = gl.load(gc + (t1 + o_t) * H + i_h, mask=t1 + o_t < ueos, other=0.0)
        b_gl = gl.load(gc + (gl.minimum(t1 + BT, ueos) - 1) * H + i_h, mask=t1 < ueos)
        # retired here: an accumulator in flight across the loop's back edge makes ptxas
        # serialise every wgmma of the loop (C7514)
        if AQK_ONCHIP:
            S, Db, QK = warpgroup_mma_wait(0, deps=[S, Db, QK])
            if i + 1 < n_c:
                _form_aqk(gc, QK, aq_s.index(c % STAGES), aq_ready.index(c % STAGES), t1,
                          ueos, i_h, scale, W, H, BT, acc_h)
        else:
            S, Db = warpgroup_mma_wait(0, deps=[S, Db])
        mbarrier.arrive(empty.index(s))                   # the stage's last reader is done
    tma.store_wait(0)
    if last:
        gl.store(ht + i_h * (V * K) + p_rows, S)


@gluon.jit
def _state_wg0(gc, s0, ht, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty, aq_ready,
               s_off, ubos, ueos, n_c, i_h, scale, last, H: gl.constexpr, K: gl.constexpr,
               V: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr,
               OUTPUTS: gl.constexpr, AQK_ONCHIP: gl.constexpr):
    _state_wg(gc, s0, ht, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty, aq_ready,
              s_off, ubos, ueos, n_c, i_h, scale, last, 0, H, K, V, BT, STAGES, OUTPUTS,
              AQK_ONCHIP)


@gluon.jit
def _state_wg1(gc, s0, ht, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty, aq_ready,
               s_off, ubos, ueos, n_c, i_h, scale, last, H: gl.constexpr, K: gl.constexpr,
               V: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr,
               OUTPUTS: gl.constexpr, AQK_ONCHIP: gl.constexpr):
    _state_wg(gc, s0, ht, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty, aq_ready,
              s_off, ubos, ueos, n_c, i_h, scale, last, 1, H, K, V, BT, STAGES, OUTPUTS,
              AQK_ONCHIP)


@gluon.jit
def gluon_walk_kernel(k_desc, q_desc, v_desc, tb_desc, aq_desc, o_desc, gc, s0, ht, seg_mult,
                      scale, T, H: gl.constexpr, G: gl.constexpr, K: gl.constexpr,
                      V: gl.constexpr, BT: gl.constexpr, SEG_T: gl.constexpr,
                      SPLIT: gl.constexpr, STAGES: gl.constexpr, OUTPUTS: gl.constexpr,
                      AQK_ONCHIP: gl.constexpr, STATE_REGS: gl.constexpr,
                      PRODUCER_REGS: gl.constexpr):
    """Phase C of one sequence of ``T`` tokens: program ``(slot, head)`` walks the unit of
    ``SEG_T`` tokens (``SEG_T * seg_mult[0]`` with ``SPLIT``; the slots between units and
    past the end return) from ``s0[slot, head]``; ``num_warps = 4`` (the first state
    warpgroup) plus a 4-warp state worker and a 1-warp load worker. With ``AQK_ONCHIP``
    ``aq_desc`` is None: ``Aqk`` is formed on chip (:func:`_form_aqk`)."""
    i_s = gl.program_id(0)
    i_h = gl.program_id(1)
    m = 1
    if SPLIT:
        m = gl.load(seg_mult)
    ubos = i_s * SEG_T
    ueos = gl.minimum(ubos + SEG_T * m, T)
    if ((i_s > 0) & (ubos >= T)) | (i_s % m != 0):
        return
    n_c = gl.cdiv(ueos - ubos, BT)
    last = ueos >= T
    s_off = (i_s * H + i_h).to(gl.int64) * (V * K)

    k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], k_desc.layout)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], q_desc.layout)
    v0_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, V // 2], v_desc.layout)
    v1_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, V // 2], v_desc.layout)
    tb_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, BT], tb_desc.layout)
    # Aqk (loaded) or Aqk^T (formed on chip): Tb's shape, dtype and so its TMA layout
    aq_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, BT], tb_desc.layout)
    o0_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, V // 2], o_desc.layout)
    o1_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, V // 2], o_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    aq_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=2)      # one arrival per state warpgroup
        mbarrier.init(aq_ready.index(j), count=2)   # AQK_ONCHIP: one per half of Aqk

    gl.warp_specialize([
        (_state_wg0, (gc, s0, ht, o_desc, k_s, q_s, v0_s, tb_s, aq_s, o0_s, ready, empty,
                      aq_ready, s_off, ubos, ueos, n_c, i_h, scale, last, H, K, V, BT, STAGES,
                      OUTPUTS, AQK_ONCHIP)),
        (_state_wg1, (gc, s0, ht, o_desc, k_s, q_s, v1_s, tb_s, aq_s, o1_s, ready, empty,
                      aq_ready, s_off, ubos, ueos, n_c, i_h, scale, last, H, K, V, BT, STAGES,
                      OUTPUTS, AQK_ONCHIP)),
        (_producer, (k_desc, q_desc, v_desc, tb_desc, aq_desc, k_s, q_s, v0_s, v1_s, tb_s,
                     aq_s, ready, empty, ubos, n_c, i_h, i_h // G, K, V, BT, STAGES,
                     OUTPUTS, AQK_ONCHIP)),
    ], [4, 1], [STATE_REGS, PRODUCER_REGS])


def _layouts(K: int, V: int):
    """Shared-memory layouts of the TMA tiles: ``k``/``q`` ``[64, K]``, the others
    ``[64, 64]`` (``v`` and ``o`` per warpgroup half)."""
    return (gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([BT, V // 2], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([BT, BT], gl.bfloat16))


def _constexprs(H, G, K, V, seg_t, split, stages, outputs, onchip):
    return dict(H=H, G=G, K=K, V=V, BT=BT, SEG_T=seg_t, SPLIT=split, STAGES=stages,
                OUTPUTS=outputs, AQK_ONCHIP=onchip,
                STATE_REGS=STATE_REGS, PRODUCER_REGS=PRODUCER_REGS)


def compile_sm90(T=131072, H=8, HQ=4, D=128, seg_t=4096, split=True, stages=STAGES,
                 outputs=True, onchip=False, cc=90):
    """Compile ``gluon_walk_kernel`` for ``sm_<cc>`` without a GPU (or torch): the
    signature the launch would specialise on, from stand-in tensors. Returns
    ``(compiled, report)`` (registers, spills and shared memory from the cubin)."""
    import re
    import subprocess
    import tempfile

    import triton
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

    K = V = D
    lk, lv, lt = _layouts(K, V)

    def desc(shape, block, layout):
        t = _Tensor(shape, "bfloat16")
        return TensorDescriptor(t, t.shape, list(t.stride()), block, layout)

    args = dict(k_desc=desc([T, HQ * K], [BT, K], lk), q_desc=desc([T, HQ * K], [BT, K], lk),
                v_desc=desc([T, H * V], [BT, V // 2], lv), tb_desc=desc([T, H * BT], [BT, BT], lt),
                aq_desc=None if onchip else desc([T, H * BT], [BT, BT], lt),
                o_desc=desc([T, H * V], [BT, V // 2], lv),
                gc=_Tensor([T, H], "float32"), s0=_Tensor([1, H, V, K], "float32"),
                ht=_Tensor([1, H, V, K], "float32"), seg_mult=_Tensor([1], "int32"))
    fn = gluon_walk_kernel
    names = [p.name for p in fn.params]
    const = _constexprs(H, H // HQ, K, V, seg_t, split, stages, outputs, onchip)
    const.update({n: None for n, a in args.items() if a is None})   # specialised away
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
    # ptxas again on Triton's PTX, verbose: spills per thread and the wgmma warnings
    # (C7514: wgmmas serialised; C7517: a wait injected) that say the overlap was lost
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
    report = dict(triton=triton.__version__, arch=arch, T=T, seg_t=seg_t, split=split,
                  stages=stages, outputs=outputs, onchip=onchip, num_warps=ck.metadata.num_warps,
                  launch_regs=int(re.search(r"\.maxnreg (\d+)", ck.asm["ptx"]).group(1)),
                  setmaxnreg=[int(x) for x in re.findall(
                      r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ck.asm["ptx"])],
                  stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                  spill_load_bytes=int(m.group(3)), shared_bytes=int(ck.metadata.shared),
                  wgmma_instructions=ck.asm["ptx"].count("wgmma.mma_async"),
                  ptxas_warnings=sorted(set(re.findall(r"\((C7\d+)\)", log))))
    return ck, report


#: The Gluon variants the GPU run gates and times: (load stages, outputs, Aqk formed on
#: chip). ``chain_s2`` walks the state alone (no ``q``, ``Aqk``, output products, ``o``):
#: the Gluon chain's own step time, against the Triton chain's ~2.5 us per step.
#: ``onchip_s2`` never reads the stored ``Aqk``: each state warpgroup forms half of it from
#: the ``q``, ``k`` tiles and ``gc`` (:func:`_form_aqk`).
VARIANTS = {"s2": (2, True, False), "s3": (3, True, False), "chain_s2": (2, False, False),
            "onchip_s2": (2, True, True)}


def gluon_phase_c(rec: dict, o, ht, stages: int = STAGES, outputs: bool = True,
                  onchip: bool = False):
    """Launch ``gluon_walk_kernel`` on a recorded phase C (:func:`record_phase_c`), writing
    ``o`` ``[T, HV, V]`` bf16 (with ``outputs``) and ``ht`` ``[1, HV, V, K]`` f32; with
    ``onchip`` the recorded ``Aqk`` is not passed (the kernel forms it)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    q, k, v, tb, aq, gc = rec["q"], rec["k"], rec["v"], rec["tb"], rec["aq"], rec["gc"]
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    if rec["cu_seqlens"].numel() != 2:
        raise ValueError("the probe walks one sequence (cu_seqlens of 2 entries)")
    if K != 128 or V != 128:
        raise ValueError(f"the probe is written for D = 128, got K={K}, V={V}")
    lk, lv, lt = _layouts(K, V)

    def desc(t, cols, block, layout):
        t2 = t.view(T, cols)
        return TensorDescriptor(t2, list(t2.shape), list(t2.stride()), block, layout)

    seg_mult = rec["seg_mult"]
    s0 = rec["s0"]
    slots = s0.shape[0]
    gluon_walk_kernel[(slots, H)](
        desc(k, HQ * K, [BT, K], lk), desc(q, HQ * K, [BT, K], lk),
        desc(v, H * V, [BT, V // 2], lv), desc(tb, H * BT, [BT, BT], lt),
        None if onchip else desc(aq, H * BT, [BT, BT], lt), desc(o, H * V, [BT, V // 2], lv),
        gc, s0, ht, seg_mult if seg_mult is not None else s0, float(rec["scale"]), T,
        num_warps=4, **_constexprs(H, H // HQ, K, V, rec["seg_t"], seg_mult is not None,
                                   stages, outputs, onchip))


def record_phase_c(x: dict) -> dict:
    """One ``gdn_prefill`` call on inputs ``x`` with phase C's launch recorded: its inputs
    (``q, k, v, tb, aq, gc, cu_seqlens, s0, seg_mult, seg_t, scale``), ``go`` (the bound
    Triton launch, to rerun it alone) and the call's outputs ``o``, ``ht``. Raises if the
    call did not take the long path. The call is forced to the Triton phase C
    (``PrefillConfig(gluon_walk=False)``; on sm_90 the product's is the Gluon one), whose
    launch :func:`kernels.prefill.state_walk_gluon.phase_c_fwd` makes."""
    from kernels.prefill import PrefillConfig, gdn_prefill, state_walk_gluon

    orig = state_walk_gluon.state_walk_t_fwd
    rec = {}

    def recording(q, k, v, tb, aq, gc, cu_seqlens, **kw):
        go = orig(q, k, v, tb, aq, gc, cu_seqlens, **kw)
        if kw.get("s0") is not None:
            rec.update(q=q, k=k, v=v, tb=tb, aq=aq, gc=gc, cu_seqlens=cu_seqlens,
                       s0=kw["s0"], seg_mult=kw.get("seg_mult"), seg_t=kw["seg_t"],
                       scale=kw["scale"], go=go)
        return go

    state_walk_gluon.state_walk_t_fwd = recording
    try:
        o, ht = gdn_prefill(**x, config=PrefillConfig(gluon_walk=False))
    finally:
        state_walk_gluon.state_walk_t_fwd = orig
    if "go" not in rec:
        raise RuntimeError("the call took no long-path phase C (too short?)")
    rec.update(o=o, ht=ht)
    return rec


def emulate_phase_c(rec: dict, onchip: bool = False):
    """torch emulation of ``gluon_walk_kernel``'s per-program algorithm on a recorded phase
    C (same units, split, TMA zero fill past ``T``, bf16 roundings, f32 products): returns
    ``(o, ht, aqk_max_abs)``, ``o`` NaN where the kernel writes nothing. With ``onchip``
    ``Aqk`` is formed from the ``q``, ``k`` tiles and ``gc`` as :func:`_form_aqk` does, and
    ``aqk_max_abs`` is its largest difference to the recorded (intra-chunk) ``Aqk``."""
    import math

    import torch

    q, k, v, tb, aq, gc, s0 = (rec[n] for n in ("q", "k", "v", "tb", "aq", "gc", "s0"))
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    o = torch.full((T, H, V), float("nan"))
    ht = torch.full((1, H, V, K), float("nan"))
    m = int(rec["seg_mult"][0]) if rec["seg_mult"] is not None else 1
    scale, seg_t, aq_err = rec["scale"], rec["seg_t"], 0.0

    def bf(t):
        return t.to(torch.bfloat16).float()

    for i_s in range(s0.shape[0]):
        ubos = i_s * seg_t
        ueos = min(ubos + seg_t * m, T)
        if (i_s > 0 and ubos >= T) or i_s % m != 0:
            continue
        for h in range(H):
            hk = h // (H // HQ)
            S = s0[i_s, h].float().cpu()                  # S^T [V, K]
            for i in range(math.ceil((ueos - ubos) / BT)):
                t0 = ubos + i * BT
                rows = torch.arange(t0, t0 + BT)
                ok = rows < T                              # TMA zero fill past T

                def tile(t, col0, ncol):
                    z = torch.zeros(BT, ncol)
                    z[ok] = t.reshape(T, -1)[rows[ok], col0:col0 + ncol].float().cpu()
                    return z

                kk, qq, vv = tile(k, hk * K, K), tile(q, hk * K, K), tile(v, h * V, V)
                TB, AQ = tile(tb, h * BT, BT), tile(aq, h * BT, BT)
                g = torch.zeros(BT)
                g[rows < ueos] = gc[rows[rows < ueos], h].float().cpu()
                g_l = float(gc[min(t0 + BT, ueos) - 1, h])
                if onchip:
                    A = (qq @ kk.T) * torch.exp(torch.clamp(g[:, None] - g[None, :], max=0.0))
                    A = bf(scale * torch.tril(A))
                    aq_err = max(aq_err, (A - AQ)[ok].abs().max().item())
                    AQ = A
                Sb = bf(S)
                X, OQ = Sb @ kk.T, Sb @ qq.T
                N = bf(vv.T - X * g.exp()[None, :]) @ TB.T
                Db = bf(N * torch.exp(g_l - g)[None, :])
                O = bf(N) @ AQ.T + OQ * (scale * g.exp())[None, :]
                S = S * math.exp(g_l) + Db @ kk
                o[rows[ok], h] = bf(O.T[ok])
            if ueos >= T:
                ht[0, h] = S
    return o, ht, aq_err


def run_emulate(lengths) -> int:
    """``--emulate`` (CPU, the Triton kernels under the interpreter): a long path forced at
    a small shape (``GDNShape(2, 4, 128)``, one sequence, segments of 2 chunks, with and
    without the device split) and each ``Aqk`` mode's emulation (:func:`emulate_phase_c`)
    against the recorded Triton phase C; one JSON line per case. Returns 1 if one differs
    by more than the bf16 roundings allow (``o`` 1e-2, state 1e-3)."""
    from unittest import mock

    from kernels.prefill import plan as plan_mod
    from kernels.spec import GDNShape, make_prefill_inputs

    status = 0
    for T in lengths:
        for split in (False, True):
            x = make_prefill_inputs([T], GDNShape(2, 4, 128), seed=0, with_state=True)
            rules = dict(cp_long=lambda T, N: True, cp_segment_chunks=lambda *a: 2,
                         cp_split=lambda seg: split)
            with mock.patch.multiple(plan_mod, **rules):
                plan_mod.clear_plan_cache()
                try:
                    rec = record_phase_c(x)
                finally:
                    plan_mod.clear_plan_cache()
            for onchip in (False, True):
                o, ht, aq_err = emulate_phase_c(rec, onchip)
                row = dict(T=T, split=split, seg_t=rec["seg_t"], slots=rec["s0"].shape[0],
                           seg_mult=(rec["seg_mult"].tolist() if rec["seg_mult"] is not None
                                     else None), aqk="onchip" if onchip else "loaded",
                           o_max_abs=(o - rec["o"].float()).abs().nan_to_num(float("inf"))
                           .max().item(),
                           state_max_abs=(ht - rec["ht"]).abs().max().item(),
                           o_scale=rec["o"].float().abs().max().item())
                if onchip:
                    row["aqk_vs_intra_max_abs"] = aq_err
                ok = row["o_max_abs"] <= 1e-2 and row["state_max_abs"] <= 1e-3
                status |= 0 if ok else 1
                print(json.dumps(dict(row, ok=ok)), flush=True)
    return status


def _finish_or_exit(what: str, timeout_s: float, emit) -> None:
    """Wait for the GPU up to ``timeout_s``; a kernel still running then is taken for a
    deadlock (a barrier phase wrong): report and leave the process (nothing else frees the
    GPU from a hung kernel)."""
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


def _against_triton(rec: dict, o, ht, outputs: bool) -> dict:
    """Max abs differences to the Triton phase C's outputs, split where a wrong partition
    or step would show: per warpgroup (state rows / ``o`` columns ``< 64`` and ``>= 64``),
    each unit's first chunk against the later ones (the entering state against the update),
    and the ``o`` entries left unwritten (NaN)."""
    import torch

    V = ht.shape[2]
    d_h = (ht - rec["ht"]).abs()
    row = dict(vs_triton_state_max_abs=[d_h[:, :, :V // 2].max().item(),
                                        d_h[:, :, V // 2:].max().item()])
    if outputs:
        unit = rec["seg_t"] * (int(rec["seg_mult"][0]) if rec["seg_mult"] is not None else 1)
        d_o = (o.float() - rec["o"].float()).abs()
        first = (torch.arange(o.shape[0], device=o.device) % unit) < BT
        d_o = d_o.nan_to_num(float("inf"))   # an unwritten entry counts as wrong
        row.update(vs_triton_o_max_abs=[d_o[:, :, :V // 2].max().item(),
                                        d_o[:, :, V // 2:].max().item()],
                   vs_triton_o_first_chunks=d_o[first].max().item(),
                   vs_triton_o_later_chunks=(d_o[~first].max().item() if (~first).any()
                                             else None),
                   o_nan=int(o.isnan().sum().item()))
    return row


def run_gpu(lengths, time_it: bool, out_dir: str, variants) -> int:
    """The GPU modes (module docstring): every implementation gated, only those that pass
    timed (``time_it``). Returns the exit status: 1 if a gate failed or a launch raised."""
    import torch
    import triton

    from kernels.bench.anatomy import kernel_times
    from kernels.bench.timing import time_fn
    from kernels.checks import check_close, check_outputs
    from kernels.prefill import gdn_prefill
    from kernels.reference import prefill_reference_chunked
    from kernels.spec import make_prefill_inputs

    sha = os.environ.get("GDN_GIT_SHA", "dev")[:7]
    gpu = torch.cuda.get_device_name()
    out = open(os.path.join(out_dir, f"gluon_walk_{sha}.jsonl"), "w")

    def emit(row):
        row = dict(row, gpu=gpu, sha=sha, triton=triton.__version__, torch=torch.__version__)
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()

    status = 0
    for T in lengths:
        x = make_prefill_inputs([T], seed=0, device="cuda", with_state=True)
        rec = record_phase_c(x)
        torch.cuda.synchronize()
        info = dict(T=T, seg_t=rec["seg_t"], slots=rec["s0"].shape[0],
                    seg_mult=int(rec["seg_mult"][0]) if rec["seg_mult"] is not None else None)
        ref = prefill_reference_chunked(**x)
        impls = {}
        r = check_outputs((rec["o"], rec["ht"]), tuple(ref))
        emit(dict(info, kind="gate", impl="triton", ok=bool(r.ok), gated="o, state",
                  max_abs=float(r.max_abs_err), rel_l2=float(r.rel_l2_err)))
        status |= 0 if r.ok else 1
        if r.ok:
            impls["triton"] = rec["go"]
        for var in variants:
            st, outputs, onchip = VARIANTS[var]
            o = torch.full_like(rec["o"], float("nan"))
            ht = torch.full_like(rec["ht"], float("nan"))
            fn = (lambda o=o, ht=ht, st=st, w=outputs, a=onchip:          # noqa: E731
                  gluon_phase_c(rec, o, ht, st, w, a))
            name = f"gluon_{var}"
            try:
                fn()
                _finish_or_exit(name, 30.0, emit)
            except Exception as e:   # noqa: BLE001 -- report, go on with the others
                emit(dict(info, kind="error", impl=name, error=f"{type(e).__name__}: {e}"[:400]))
                status = 1
                continue
            # without outputs only the final state can be gated
            r = (check_outputs((o, ht), tuple(ref)) if outputs
                 else check_close(ht, ref[1], name="new_state"))
            emit(dict(info, kind="gate", impl=name, ok=bool(r.ok),
                      gated="o, state" if outputs else "state", max_abs=float(r.max_abs_err),
                      rel_l2=float(r.rel_l2_err), **_against_triton(rec, o, ht, outputs)))
            status |= 0 if r.ok else 1
            if r.ok:
                impls[name] = fn
        if time_it:
            for name, fn in impls.items():
                kt = kernel_times(fn, calls=5)
                cold = time_fn(fn, "cupti_cold", rep=20, warmup=3)
                emit(dict(info, kind="time", impl=name, phase_c_us=float(kt["median_us"][0]),
                          p20_us=float(kt["p20_us"][0]), p80_us=float(kt["p80_us"][0]),
                          cupti_cold_us=cold.median_us, method="kernel_times (CUPTI, warm "
                          "L2, eager) median of 5; cupti_cold median of 20"))
            kt = kernel_times(lambda: gdn_prefill(**x), calls=3)
            emit(dict(info, kind="time", impl="the call, per kernel",
                      kernels={f"{k.role}|{k.kernel[:24]}": round(k.median_us, 1)
                               for k in kt.itertuples()}))
        del x, rec, ref, impls
        torch.cuda.empty_cache()
    out.close()
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true",
                    help="compile for sm_90a without a GPU and report (no torch needed)")
    ap.add_argument("--json", default=None, help="--compile: write the reports here")
    ap.add_argument("--emulate", action="store_true",
                    help="CPU: the torch emulation against the Triton phase C (interpreter)")
    ap.add_argument("--check", action="store_true", help="gate the kernels (GPU)")
    ap.add_argument("--time", action="store_true",
                    help="gate, then time the phase C kernels that passed (GPU)")
    ap.add_argument("--lengths", default="131072,32768")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"Gluon variants to run, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    if any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: pick from {', '.join(VARIANTS)}")
    if a.compile:
        rows = []
        for T, seg_t, split in ((131072, 4096, True), (32768, 2048, False)):
            for var in variants:
                st, outputs, onchip = VARIANTS[var]
                try:
                    rows.append(dict(variant=var, **compile_sm90(
                        T=T, seg_t=seg_t, split=split, stages=st, outputs=outputs,
                        onchip=onchip)[1]))
                except Exception as e:   # noqa: BLE001 -- report every configuration
                    rows.append(dict(T=T, variant=var, error=f"{type(e).__name__}: {e}"[:400]))
                print(json.dumps(rows[-1]), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        return int(any("error" in r or r["spill_store_bytes"] or r["ptxas_warnings"]
                       for r in rows))
    if a.emulate:
        return run_emulate([int(t) for t in a.lengths.split(",")])
    if not (a.check or a.time):
        ap.error("pick --compile, --emulate, or --check and/or --time (GPU)")
    return run_gpu([int(t) for t in a.lengths.split(",")], a.time, a.out, variants)


if __name__ == "__main__":
    sys.exit(main())
