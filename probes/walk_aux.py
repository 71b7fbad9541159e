"""Probe (temporary): the Gluon phase C reading the gate-free ``Ab`` and forming ``Tb`` and
``scale * Aqk`` itself on an aux warpgroup, one chunk ahead of the state chain
(docs/notes/long_path_probe.md, "Verdict", next step (1)).

Written before any code of the probe.

What changes against the product walk (:mod:`kernels.prefill.state_walk_gluon`)
---------------------------------------------------------------------------------
The producer loads ``k``, ``q``, ``v`` and ``Ab`` (``[T, HV, 64]`` bf16, the layout of
``Tb``) instead of ``k``, ``q``, ``v``, ``Tb``, ``Aqk``. An aux partition (one warpgroup)
waits for the stage, issues the ``Q Kᵀ`` ``wgmma`` (``[64, D] @ [D, 64]`` from shared
memory), forms ``dec = exp(min(gc_i − gc_j, 0))`` once per chunk, and stores
``Tb = where(j <= i, Ab · dec, 0)`` and ``scale · Aqk = where(j <= i, scale · (Q Kᵀ · dec), 0)``
(bf16) into one of two ``formed`` buffers, then arrives on ``formed[b]``; it waits on
``consumed[b]`` (both state warpgroups done with chunk ``i − 2``) before overwriting a buffer.
The state warpgroups' step is the product's with ``Tb`` / ``Aqk`` read from the formed
buffers (they wait on ``formed`` only after issuing ``S kᵀ`` and ``S qᵀ``). Scope: no
``qk_norm`` (the host function refuses ``qk_norms``); everything else the product walk
handles (varlen units, partial last chunks, the device split, the split tail, the guard)
is kept, because the code paths are the product's.

Prediction (H100, 131,072 tokens, one sequence, HQ = HK = 4, HV = 8, D = 128)
-----------------------------------------------------------------------------
Today: the Gluon walk 404 µs (CUPTI), byte roof 370 µs of which ``Tb`` + ``Aqk`` are
268 MB (~91 µs). At 131k the plan walks units of 4,096 tokens: 32 × 8 = 256 programs of 64
chunk steps over 132 SMs (one CTA per SM: ~160 KB shared memory), i.e. ~2 programs per SM
in sequence, ~3.2 µs per chunk step and SM. Per step a program moves ~80 KB (``q``, ``k``
32, ``v`` 16, ``Tb`` + ``Aqk`` 16, ``o`` 16); the chain alone measured 1.7 µs per step
(H200, the Gluon walk probe) and the tensor work ~1.1 µs per step: the walk is
bandwidth-bound, not chain-bound.

* Bytes: ``Ab`` (134 MB) replaces ``Tb`` + ``Aqk`` (268 MB): −134 MB, roof 370 → ~326 µs;
  per step ~72 KB instead of ~80 KB (−10 %). ``q``, ``k`` are already read.
* Compute: ``Q Kᵀ`` is 1.05 MFLOP per (chunk, value head); the walk's programs are per value
  head, so both value heads of a q/k head form it: 17.2 GFLOP at 131k (2 × the 8.6 of the
  notes, which counts it once per q/k head), +12.5 % on the state warpgroups' 8.4 MFLOP
  per step (~1.26 µs of tensor time per step at peak, still under the ~2.9 µs of bytes).
  Elementwise: one 64 × 64 ``exp`` tile per step, shared by ``Tb`` and ``Aqk``, 32 per
  thread of the aux warpgroup; two multiplies and selects per entry.
* Registers: 4 warpgroups (state 0, state 1, aux, the producer's warp padded to a
  warpgroup) share 512 registers per thread-slot (65,536 / 128): producer 24, aux ~88
  (the ``Q Kᵀ`` accumulator 32, ``Ab`` 16 bf16 / 32 f32, ``dec`` 32, column gates 16), the
  state warpgroups ~200 each against 256 / 240 today (the H200 probe's note: "a warpgroup
  of its own does not fit the register file at 240 / 240 / 24"). Expect more spills in the
  state warpgroups than today's 8–48 B (triton 3.7.1); the compile check reports them.
* Shared memory: 2 stages × (``k`` 16 + ``q`` 16 + ``v`` 16 + ``Ab`` 8 KB) = 112 KB, formed
  2 × (8 + 8) = 32 KB, ``o`` 32 KB: ~176 KB (≤ 227 KB), still one CTA per SM.
* The chain: not exposed if the aux stays a chunk ahead (it needs the stage's bytes and
  ``consumed[b]`` from the state warpgroups' step ``i − 2``; its ~1 µs of work per chunk
  fits in a 3 µs step). The state warpgroups' step gains a ``formed`` wait (expected
  free) and loses nothing else; the risk is the register cut (spills on the chain) and
  the aux's ``wgmma`` sharing the tensor pipe with the chain.

**Predicted: ~365 µs at 131k (range 345–410; 0.90 × today's walk), 0.90 × the product walk
at 32k.** If the state warpgroups spill heavily at ~200 registers (hundreds of bytes), the
chain lengthens and the walk can land at 410–450.

Rule (docs/notes/long_path_probe.md): **go** if the new walk ≤ 406 µs at 131k on the H100;
**stop** at ≥ 504 µs; in between: report. The timings here are CUDA-graph (``graph``, warm
L2) of the new walk and of the product walk in the same run on the same card; compare the
ratio against the 404 µs CUPTI baseline's card.

CPU results (after the code; rows in ``probes/walk_aux_cpu.jsonl``)
--------------------------------------------------------------------
* Compiles for sm_90a on triton 3.7.1 and 3.6.0 (131k launch: units of 4,096, the split,
  tail 8, the guard; 32k: units of 2,048): 16 warps (4 + 4 + 4 + 1 and 3 padding), launch
  128 registers, ``setmaxnreg`` default 208 (256 outside the region), state worker 208,
  aux 72, producer 24 (idle workers 80); spills 200 B (3.7.1) / 144 B (3.6.0) against the
  product walk's 48 B at 240 / 240 / 24; shared memory 180,680 B (product 164,208; limit
  232,448). The aux forms ``Tb`` before issuing ``Q Kᵀ`` (with the accumulator live beside
  the ``Tb`` tile it spilled ~27 stores at 88 registers); of the splits tried, 208 / 72
  spills least (200 / 88: 248 B, 216 / 56: 880 B). The spills sit in the state partitions
  (SASS ``STL`` / ``LDL`` after their ``USETMAXREG``): the register cut the prediction
  named as the risk.
* Emulation (interpreter, lengths 64 + 100 + 37 at HQ 1 / HV 2 / D 32, and 200 + 64 at
  2 / 4 / 128): the formed ``scale · Aqk`` equals the product's bit for bit; the formed
  ``Tb`` is within one bf16 ulp of the product's (max abs 9.8e-4 / 4.9e-4 at entries up to
  0.95) and exactly as far from a float64 truth of the gated definitions as the product's
  (1.9e-3 both).

GPU (not run here): from the repo root on the host,
``PYTHONPATH=. python -m probes.walk_aux --gpu --out walk_aux_gpu.jsonl``
(131,072 and 32,768 tokens; ``--methods graph,cupti_cold`` adds CUPTI timings).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from kernels import interpret

interpret.install()

from kernels.prefill.chunk_index import BT  # noqa: E402
from kernels.prefill import state_walk_gluon as swg  # noqa: E402
from kernels.prefill.state_walk_gluon import GLUON_D, HAVE_GLUON, STAGES, tma_ready  # noqa: E402

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                                  mbarrier, tma,
                                                                  warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # the product walk's pieces that do not change
    from kernels.prefill.state_walk_gluon import (_guard, _store_o, _unit_bounds,  # noqa: F401
                                                  _zero_k_rows)

#: Formed ``Tb`` / ``scale * Aqk`` buffers (the aux warpgroup runs one chunk ahead).
FBUF = 2
#: ``setmaxnreg`` per worker partition: state worker, aux, producer (the default state
#: partition gets the rest of 512: 4 warpgroups of 128 threads share 65,536 registers).
#: Chosen by the compile rows (triton 3.7.1, 131k launch): 200/88 spills 248 B, 208/72
#: 200 B, 216/56 880 B (the aux then spills).
REGS = {"state": 208, "aux": 72, "producer": 24}


if HAVE_GLUON:
    @gluon.jit
    def _producer_ab(k_desc, q_desc, v_desc, ab_desc, k_s, q_s, v0_s, v1_s, ab_s, ready,
                     empty, ubos, n_c, i_h, i_hk, K: gl.constexpr, V: gl.constexpr,
                     BT: gl.constexpr, STAGES: gl.constexpr):
        """The product's producer with ``Ab`` in place of ``Tb`` and no ``Aqk``."""
        NBYTES: gl.constexpr = 2 * (2 * BT * K + BT * V + BT * BT)
        for i in range(n_c):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            t0 = (ubos + i * BT).to(gl.int32)
            mbarrier.expect(bar, NBYTES)
            tma.async_copy_global_to_shared(k_desc, [t0, i_hk * K], bar, k_s.index(s))
            tma.async_copy_global_to_shared(q_desc, [t0, i_hk * K], bar, q_s.index(s))
            tma.async_copy_global_to_shared(ab_desc, [t0, i_h * BT], bar, ab_s.index(s))
            tma.async_copy_global_to_shared(v_desc, [t0, i_h * V], bar, v0_s.index(s))
            tma.async_copy_global_to_shared(v_desc, [t0, i_h * V + V // 2], bar,
                                            v1_s.index(s))

    @gluon.jit
    def _aux(gc, k_s, q_s, ab_s, tb_f, aq_f, ready, empty, formed, consumed, ubos, ueos,
             n_c, i_h, scale, H: gl.constexpr, K: gl.constexpr, BT: gl.constexpr,
             STAGES: gl.constexpr, FBUF: gl.constexpr):
        """One warpgroup: chunk ``i``'s ``Tb = Ab * dec`` and ``scale * Aqk = scale * (q k^T
        * dec)`` on and below the diagonal (zeros above; ``dec = exp(min(gc_i - gc_j, 0))``,
        the intra-chunk kernel's clamp) into formed buffer ``i % FBUF``, once the stage has
        landed (``ready``) and the state warpgroups are done with that buffer's last chunk
        (``consumed``); then ``formed`` and the stage's ``empty`` (the aux read ``q``, ``k``,
        ``Ab``). Rows ``>= n_t`` of a partial chunk (another sequence's tokens, or ``k`` rows
        being zeroed by the state warpgroups) reach only entries the state warpgroups never
        use (columns ``>= n_t`` are above the diagonal of rows ``< n_t``: selected to zero,
        so no NaN crosses)."""
        acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BT, 16])
        rows_l: gl.constexpr = gl.SliceLayout(1, acc_t)
        cols_l: gl.constexpr = gl.SliceLayout(0, acc_t)
        o_r = gl.arange(0, BT, layout=rows_l)
        o_c = gl.arange(0, BT, layout=cols_l)
        causal = o_r[:, None] >= o_c[None, :]
        zero = gl.zeros([BT, BT], gl.float32, acc_t)
        for i in range(n_c):
            s = i % STAGES
            b = i % FBUF
            t0 = ubos + i * BT
            g_r = gl.load(gc + (t0 + o_r) * H + i_h, mask=t0 + o_r < ueos, other=0.0)
            g_c = gl.load(gc + (t0 + o_c) * H + i_h, mask=t0 + o_c < ueos, other=0.0)
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            mbarrier.wait(consumed.index(b), ((i // FBUF) & 1) ^ 1)
            # Tb first, then Q K^T: no accumulator live beside the Tb tile (the aux has a
            # chunk step of slack; registers are what it lacks)
            ab = ab_s.index(s).load(acc_t)
            tb = gl.where(causal, ab.to(gl.float32)
                          * gl.exp(gl.minimum(g_r[:, None] - g_c[None, :], 0.0)), 0.0)
            tb_f.index(b).store(tb.to(gl.bfloat16))
            A = warpgroup_mma(q_s.index(s), k_s.index(s).permute((1, 0)), zero,
                              use_acc=False, is_async=True)
            A = warpgroup_mma_wait(0, deps=[A])
            dec = gl.exp(gl.minimum(g_r[:, None] - g_c[None, :], 0.0))
            aq = gl.where(causal, scale * (A * dec), 0.0)
            aq_f.index(b).store(aq.to(gl.bfloat16))
            fence_async_shared()
            mbarrier.arrive(formed.index(b))
            mbarrier.arrive(empty.index(s))

    @gluon.jit
    def _step(i, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_f, aq_f, o_s, ready, empty,
              formed, consumed, kfix, ubos, ueos, i_h, scale, W: gl.constexpr,
              H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
              STAGES: gl.constexpr, FBUF: gl.constexpr, PARTIAL: gl.constexpr,
              SPLIT_TAIL: gl.constexpr):
        """The product's :func:`kernels.prefill.state_walk_gluon._step` (no ``QK_NORM``)
        with ``Tb`` and ``scale * Aqk`` read from formed buffer ``i % FBUF`` (waited on
        after ``S k^T`` and ``S q^T`` are issued) and ``consumed`` arrived with ``empty``."""
        R: gl.constexpr = V // 2
        acc_k: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, K, 16])
        acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BT, 16])
        a_k: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_k, k_width=2)
        a_t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t, k_width=2)
        cols_t: gl.constexpr = gl.SliceLayout(0, acc_t)
        o_t = gl.arange(0, BT, layout=cols_t)
        zero_t = gl.zeros([R, BT], gl.float32, acc_t)
        s = i % STAGES
        b = i % FBUF
        t0 = ubos + i * BT
        n_t = ueos - t0
        live = o_t < n_t
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        k_i = k_s.index(s)
        if PARTIAL:
            _zero_k_rows(k_i, kfix, n_t, W, BT, K)
        Sb = gl.convert_layout(S.to(gl.bfloat16), a_t)
        X = warpgroup_mma(Sb, k_i.permute((1, 0)), zero_t, use_acc=False, is_async=True)
        OQ = warpgroup_mma(Sb, q_s.index(s).permute((1, 0)), zero_t, use_acc=False,
                           is_async=True)
        if PARTIAL and SPLIT_TAIL:
            X, OQ, Sb = warpgroup_mma_wait(0, deps=[X, OQ, Sb])
        else:
            X = warpgroup_mma_wait(1, deps=[X])
        vt = v_s.index(s).permute((1, 0)).load(acc_t)
        e_k = gl.exp(b_gc)
        Rt = vt.to(gl.float32) - X * e_k[None, :]
        if PARTIAL:
            Rt = gl.where(live[None, :], Rt, 0.0)
        mbarrier.wait(formed.index(b), (i // FBUF) & 1)   # Tb, Aqk of this chunk formed
        tb_t = tb_f.index(b).permute((1, 0))
        if SPLIT_TAIL:
            Rh = Rt.to(gl.bfloat16)
            Rb = gl.convert_layout(Rh, a_t)
            Rl = gl.convert_layout((Rt - Rh.to(gl.float32)).to(gl.bfloat16), a_t)
            N = warpgroup_mma(Rb, tb_t, zero_t, use_acc=False, is_async=True)
            N = warpgroup_mma(Rl, tb_t, N, is_async=True)
            N, OQ, Rb, Rl, Sb = warpgroup_mma_wait(0, deps=[N, OQ, Rb, Rl, Sb])
        else:
            Rb = gl.convert_layout(Rt.to(gl.bfloat16), a_t)
            N = warpgroup_mma(Rb, tb_t, zero_t, use_acc=False, is_async=True)
            N, OQ, Rb, Sb = warpgroup_mma_wait(0, deps=[N, OQ, Rb, Sb])
        if PARTIAL:
            N = gl.where(live[None, :], N, 0.0)
        d_k = gl.exp(b_gl - b_gc)
        if SPLIT_TAIL:
            Dt = N * d_k[None, :]
            Dh = Dt.to(gl.bfloat16)
            Db = gl.convert_layout(Dh, a_k)
            Dl = gl.convert_layout((Dt - Dh.to(gl.float32)).to(gl.bfloat16), a_k)
        else:
            Db = gl.convert_layout((N * d_k[None, :]).to(gl.bfloat16), a_k)
        Nb = gl.convert_layout(N.to(gl.bfloat16), a_t)
        e_q = scale * gl.exp(b_gc)
        O = warpgroup_mma(Nb, aq_f.index(b).permute((1, 0)), OQ * e_q[None, :],
                          is_async=True)
        S = warpgroup_mma(Db, k_i, S * gl.exp(b_gl), is_async=True)
        if SPLIT_TAIL:
            S = warpgroup_mma(Dl, k_i, S, is_async=True)
            O, Nb = warpgroup_mma_wait(2, deps=[O, Nb])
        else:
            O, Nb = warpgroup_mma_wait(1, deps=[O, Nb])
        if PARTIAL:
            o_ov = (i_h * V + W * R + gl.arange(0, R, layout=gl.SliceLayout(1, acc_t)))[:, None]
            p_o = o + (t0 + o_t)[None, :].to(gl.int64) * (H * V) + o_ov
            gl.store(p_o, O.to(gl.bfloat16), mask=live[None, :])
        else:
            _store_o(o_desc, o_s, O, i % 2, t0.to(gl.int32), i_h * V + W * R)
        t1 = t0 + BT
        b_gc = gl.load(gc + (t1 + o_t) * H + i_h, mask=t1 + o_t < ueos, other=0.0)
        b_gl = gl.load(gc + (gl.minimum(t1 + BT, ueos) - 1) * H + i_h, mask=t1 < ueos,
                       other=0.0)
        if SPLIT_TAIL:
            S, Db, Dl = warpgroup_mma_wait(0, deps=[S, Db, Dl])
        else:
            S, Db = warpgroup_mma_wait(0, deps=[S, Db])
        mbarrier.arrive(consumed.index(b))                 # formed buffer b is free
        mbarrier.arrive(empty.index(s))
        return S, b_gc, b_gl

    @gluon.jit
    def _state_wg(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_f, aq_f, o_s, ready, empty,
                  formed, consumed, kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last,
                  W: gl.constexpr, H: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                  BT: gl.constexpr, STAGES: gl.constexpr, FBUF: gl.constexpr,
                  TAIL: gl.constexpr):
        """The product's ``_state_wg`` (no ``QK_NORM``) over :func:`_step`."""
        R: gl.constexpr = V // 2
        acc_k: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, K, 16])
        acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BT, 16])
        cols_t: gl.constexpr = gl.SliceLayout(0, acc_t)
        o_r = W * R + gl.arange(0, R, layout=gl.SliceLayout(1, acc_k))
        o_k = gl.arange(0, K, layout=gl.SliceLayout(0, acc_k))
        p_rows = o_r[:, None] * K + o_k[None, :]
        S = gl.load(s0 + s_off + p_rows)
        o_t = gl.arange(0, BT, layout=cols_t)
        b_gc = gl.load(gc + (ubos + o_t) * H + i_h, mask=ubos + o_t < ueos, other=0.0)
        b_gl = gl.load(gc + (gl.minimum(ubos + BT, ueos) - 1) * H + i_h, mask=ubos < ueos,
                       other=0.0)
        n_full = ((ueos - ubos) // BT).to(gl.int32)
        n_main = n_full
        if TAIL > 0:
            if last:
                n_main = gl.maximum(n_c - TAIL, 0)
        for i in range(n_main):
            S, b_gc, b_gl = _step(i, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_f, aq_f,
                                  o_s, ready, empty, formed, consumed, kfix, ubos, ueos, i_h,
                                  scale, W, H, K, V, BT, STAGES, FBUF, False, False)
        if TAIL > 0:
            for i in range(n_main, n_full):
                S, b_gc, b_gl = _step(i, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_f,
                                      aq_f, o_s, ready, empty, formed, consumed, kfix, ubos,
                                      ueos, i_h, scale, W, H, K, V, BT, STAGES, FBUF, False,
                                      True)
        if n_full < n_c:
            S, b_gc, b_gl = _step(n_full, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_f,
                                  aq_f, o_s, ready, empty, formed, consumed, kfix, ubos, ueos,
                                  i_h, scale, W, H, K, V, BT, STAGES, FBUF, True, TAIL > 0)
        tma.store_wait(0)
        if last:
            gl.store(ht + ht_off + p_rows, S)

    @gluon.jit
    def _state_wg0(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_f, aq_f, o_s, ready, empty,
                   formed, consumed, kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last,
                   H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                   STAGES: gl.constexpr, FBUF: gl.constexpr, TAIL: gl.constexpr):
        _state_wg(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_f, aq_f, o_s, ready, empty, formed,
                  consumed, kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, 0, H, K,
                  V, BT, STAGES, FBUF, TAIL)

    @gluon.jit
    def _state_wg1(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_f, aq_f, o_s, ready, empty,
                   formed, consumed, kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last,
                   H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                   STAGES: gl.constexpr, FBUF: gl.constexpr, TAIL: gl.constexpr):
        _state_wg(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_f, aq_f, o_s, ready, empty, formed,
                  consumed, kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, 1, H, K,
                  V, BT, STAGES, FBUF, TAIL)

    @gluon.jit(do_not_specialize=["T", "N"])
    def walk_aux_kernel(
        k_desc, q_desc, v_desc,   # TMA: k, q [T, HQ * K], v [T, H * V] bf16
        ab_desc,                  # TMA: Ab [T, H * BT] bf16 (gate-free inverse times diag(beta))
        o_desc,                   # TMA: o [T, H * V] bf16 out (full chunks)
        o,                        # [T, H, V] bf16 out (partial chunks, the guard)
        gc,                       # [T, H] f32 per-chunk cumulative log decay
        s0,                       # [S, H, V, K] f32 entering state per segment slot
        cu_seqlens,               # [N+1] int32/int64
        ht,                       # [N, H, V, K] f32 out: final state, k-last
        status,                   # [1] int32 out (GUARD and HAS_STATUS) or None
        seg_mult,                 # [N] int32: slots per unit (SPLIT) or None
        scale, T, N,
        H: gl.constexpr, G: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
        BT: gl.constexpr, SEG_T: gl.constexpr, SPLIT: gl.constexpr, GUARD: gl.constexpr,
        HAS_STATUS: gl.constexpr, STAGES: gl.constexpr, FBUF: gl.constexpr,
        STATE_REGS: gl.constexpr, AUX_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
        TAIL: gl.constexpr,
    ):
        """The product's phase C (:func:`kernels.prefill.state_walk_gluon.state_walk_gluon_kernel`)
        reading ``Ab`` instead of ``Tb`` and ``Aqk``: ``num_warps = 4`` (state warpgroup 0)
        plus a 4-warp state worker, a 4-warp aux worker (:func:`_aux`) and a 1-warp load
        worker."""
        i_u = gl.program_id(0)
        i_h = gl.program_id(1)
        if GUARD:
            n_u = gl.num_programs(0)
            if _guard(cu_seqlens, o, ht, status, T, N, i_u + n_u * i_h, n_u * H, H, V, K,
                      HAS_STATUS) != 0:
                return
        i_n, bos, eos, ubos, ueos, skip = _unit_bounds(i_u, cu_seqlens, seg_mult, N, T,
                                                       SEG_T, SPLIT)
        if skip:
            return
        n_c = gl.cdiv(ueos - ubos, BT).to(gl.int32)
        last = ueos >= eos
        s_off = (i_u * H + i_h).to(gl.int64) * (V * K)
        ht_off = (i_n * H + i_h).to(gl.int64) * (V * K)

        k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], k_desc.layout)
        q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], q_desc.layout)
        v0_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, V // 2], v_desc.layout)
        v1_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, V // 2], v_desc.layout)
        ab_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, BT], ab_desc.layout)
        tb_f = gl.allocate_shared_memory(gl.bfloat16, [FBUF, BT, BT], ab_desc.layout)
        aq_f = gl.allocate_shared_memory(gl.bfloat16, [FBUF, BT, BT], ab_desc.layout)
        o0_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, V // 2], o_desc.layout)
        o1_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, V // 2], o_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        formed = gl.allocate_shared_memory(gl.int64, [FBUF, 1], mbarrier.MBarrierLayout())
        consumed = gl.allocate_shared_memory(gl.int64, [FBUF, 1], mbarrier.MBarrierLayout())
        kfix = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for j in gl.static_range(STAGES):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(empty.index(j), count=3)      # both state warpgroups and the aux
        for j in gl.static_range(FBUF):
            mbarrier.init(formed.index(j), count=1)     # the aux
            mbarrier.init(consumed.index(j), count=2)   # both state warpgroups
        mbarrier.init(kfix, count=2)

        gl.warp_specialize([
            (_state_wg0, (gc, s0, ht, o, o_desc, k_s, q_s, v0_s, tb_f, aq_f, o0_s, ready,
                          empty, formed, consumed, kfix, s_off, ht_off, ubos, ueos, n_c, i_h,
                          scale, last, H, K, V, BT, STAGES, FBUF, TAIL)),
            (_state_wg1, (gc, s0, ht, o, o_desc, k_s, q_s, v1_s, tb_f, aq_f, o1_s, ready,
                          empty, formed, consumed, kfix, s_off, ht_off, ubos, ueos, n_c, i_h,
                          scale, last, H, K, V, BT, STAGES, FBUF, TAIL)),
            (_aux, (gc, k_s, q_s, ab_s, tb_f, aq_f, ready, empty, formed, consumed, ubos,
                    ueos, n_c, i_h, scale, H, K, BT, STAGES, FBUF)),
            (_producer_ab, (k_desc, q_desc, v_desc, ab_desc, k_s, q_s, v0_s, v1_s, ab_s,
                            ready, empty, ubos, n_c, i_h, i_h // G, K, V, BT, STAGES)),
        ], [4, 4, 1], [STATE_REGS, AUX_REGS, PRODUCER_REGS])


def walk_aux_fwd(q, k, v, ab, gc, cu_seqlens, *, s0, output, final_state, scale: float,
                 seg_t: int, tail: int, seg_mult=None, guard: bool = False, status=None,
                 defer: bool = False, qk_norms=None, regs=None):
    """Launch :func:`walk_aux_kernel` once: :func:`kernels.prefill.state_walk_gluon.
    state_walk_gluon_fwd`'s arguments with ``ab`` (``[T, HV, 64]`` bf16, ``Ab = (I +
    tril(diag(beta) K K^T, -1))^-1 diag(beta)`` per chunk, the layout of ``Tb``) in place of
    ``tb, aq``. ``qk_norms`` must be None (the probe's scope). ``regs``: overrides of
    :data:`REGS`."""
    if qk_norms is not None:
        raise ValueError("the walk_aux probe does not do the in-kernel q/k L2 norm")
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    if K != GLUON_D or V != GLUON_D:
        raise ValueError(f"written for K = V = {GLUON_D}, got {K}, {V}")
    if ab.dtype != q.dtype or tuple(ab.shape) != (T, H, BT):
        raise ValueError(f"ab must be [T, HV, {BT}] {q.dtype}, got {tuple(ab.shape)} {ab.dtype}")
    if not tma_ready(q, k, v, ab, output):
        raise ValueError("TMA needs 16-byte aligned bases")
    r = dict(REGS, **(regs or {}))
    lk, lv, lt = swg._layouts(K, V)

    def desc(t, cols, block, layout):
        return TensorDescriptor(t, [T, cols], [cols, 1], block, layout)

    args = (desc(k, HQ * K, [BT, K], lk), desc(q, HQ * K, [BT, K], lk),
            desc(v, H * V, [BT, V // 2], lv), desc(ab, H * BT, [BT, BT], lt),
            desc(output, H * V, [BT, V // 2], lv), output, gc, s0, cu_seqlens, final_state,
            status if guard else None, seg_mult, float(scale), T, N)
    kw = dict(H=H, G=H // HQ, K=K, V=V, BT=BT, SEG_T=int(seg_t), SPLIT=seg_mult is not None,
              GUARD=bool(guard), HAS_STATUS=bool(guard) and status is not None, TAIL=tail,
              STAGES=STAGES, FBUF=FBUF, STATE_REGS=r["state"], AUX_REGS=r["aux"],
              PRODUCER_REGS=r["producer"], num_warps=4)
    grid = (int(T) // int(seg_t) + N, H)

    def go():
        walk_aux_kernel[grid](*args, **kw)

    if defer:
        return go
    go()


# --------------------------------------------------------------------------- CPU: compile

def _capture(fwd, *a, **kw):
    """The launch ``fwd(*a, **kw)`` would make (``JITFunction.run`` recorded, nothing runs)."""
    from triton.runtime.jit import JITFunction

    rec = []
    orig = JITFunction.run
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: rec.append((self, args, kwargs))
    try:
        fwd(*a, **kw)
    finally:
        JITFunction.run = orig
    return rec[0]


def compile_rows(T: int = 131072, variants=None) -> list:
    """Compile the probe kernel (and the product walk, for comparison) for sm_90a at the
    131k plan's launch (one sequence, units of 4,096 tokens, the device split, tail 8,
    the guard) and at the 32k plan's (units of 2,048, no split): registers per thread of
    the launch, spill bytes, shared memory, ``setmaxnreg`` values in the PTX."""
    import re

    import torch

    from kernels import arch_check as ac
    from kernels.gpu_limits import ARCHS

    HQ, H, D = 4, 8, 128
    bf = torch.bfloat16
    q = torch.zeros(T, HQ, D, dtype=bf)
    v = torch.zeros(T, H, D, dtype=bf)
    t64 = torch.zeros(T, H, BT, dtype=bf)
    gc = torch.zeros(T, H)
    cu = torch.tensor([0, T], dtype=torch.int32)
    seg_t, seg_mult = (4096, torch.zeros(1, dtype=torch.int32)) if T >= 65536 else (2048, None)
    common = dict(s0=torch.zeros(T // seg_t + 1, H, D, D), output=torch.zeros(T, H, D, dtype=bf),
                  final_state=torch.zeros(1, H, D, D), scale=D ** -0.5, seg_t=seg_t, tail=8,
                  seg_mult=seg_mult, guard=True)
    launches = [("product", _capture(swg.state_walk_gluon_fwd, q, q, v, t64, t64, gc, cu,
                                     **common))]
    for name, regs in (variants or {"walk_aux": None}).items():
        launches.append((name, _capture(walk_aux_fwd, q, q, v, t64, gc, cu, regs=regs,
                                        **common)))
    rows = []
    arch = ARCHS[90]
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    for name, (fn, a, kw) in launches:
        lc = ac._describe(fn, a, kw)
        names = [p.name for p in fn.params]
        const = {(names.index(n),): v for n, v in lc.constexprs.items()}
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in lc.divisible16}
        row = dict(variant=name, T=T, triton=triton.__version__,
                   regs_cfg={k: lc.constexprs.get(k) for k in
                             ("STATE_REGS", "AUX_REGS", "PRODUCER_REGS")})
        try:
            ck = triton.compile(GluonASTSource(fn, lc.signature, const, attrs),
                                target=GPUTarget("cuda", 90, 32), options=lc.options)
        except Exception as e:  # noqa: BLE001 - report
            row["error"] = f"{type(e).__name__}: {str(e).strip()[-600:]}"
            rows.append(row)
            continue
        row.update(ac._resources(ck))
        row["num_warps"] = int(ck.metadata.num_warps)
        row["shared_bytes"] = int(ck.metadata.shared)
        row["smem_fits"] = row["shared_bytes"] <= arch.smem_per_block
        ptx = ck.asm["ptx"]
        # every setmaxnreg target (the default partition's, the workers' and their idle
        # level): default 256 outside the region, its share inside it
        row["setmaxnreg"] = sorted({int(x) for x in re.findall(
            r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)})
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- Ab, emulation

def _chunks(cu_seqlens):
    """``(t0, n)`` of every chunk of every sequence (chunks start at the sequence's start)."""
    cu = [int(x) for x in cu_seqlens.tolist()]
    out = []
    for bos, eos in zip(cu[:-1], cu[1:]):
        for t0 in range(bos, eos, BT):
            out.append((t0, min(BT, eos - t0)))
    return out


def ab_torch(k, b, cu_seqlens, dtype=None):
    """``Ab = (I + tril(diag(beta) K K^T, -1))^-1 diag(beta)`` per chunk and value head
    (``beta = sigmoid(b)`` in f32 as the intra-chunk kernel computes it), ``[T, HV, 64]``
    in ``k``'s dtype; rows of a partial chunk past its end stay zero. A simple correct
    method, not a fast one: one batched triangular solve per chunk length, in ``dtype``
    (float64 on CPU, float32 on a GPU by default)."""
    import torch

    T, HQ, D = k.shape
    H = b.shape[1]
    G = H // HQ
    dtype = dtype or (torch.float64 if k.device.type == "cpu" else torch.float32)
    beta = torch.sigmoid(b.float()).to(dtype)                      # [T, H]
    ab = torch.zeros(T, H, BT, dtype=k.dtype, device=k.device)
    by_len = {}
    for t0, n in _chunks(cu_seqlens):
        by_len.setdefault(n, []).append(t0)
    for n, starts in by_len.items():
        idx = (torch.tensor(starts, device=k.device)[:, None]
               + torch.arange(n, device=k.device)[None, :])        # [C, n]
        kc = k[idx].to(dtype).repeat_interleave(G, dim=2)          # [C, n, H, D]
        bc = beta[idx]                                             # [C, n, H]
        kk = torch.einsum("cihd,cjhd->chij", kc, kc)               # [C, H, n, n]
        A = torch.tril(kk * bc.permute(0, 2, 1)[..., :, None], -1)
        eye = torch.eye(n, dtype=dtype, device=k.device).expand_as(A)
        Tm = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
        Ab = Tm * bc.permute(0, 2, 1)[..., None, :]                # columns times beta
        ab[idx, :, :n] = Ab.permute(0, 2, 1, 3).to(k.dtype)
    return ab


def form_chunk(ab_c, q_c, k_c, g_c, scale: float):
    """The aux warpgroup's math for one chunk and value head, in torch float32 (what
    :func:`_aux` computes): ``ab_c`` ``[64, 64]`` bf16, ``q_c``, ``k_c`` ``[64, D]`` bf16,
    ``g_c`` ``[64]`` f32 (0 past the sequence's end, as the masked load gives); returns
    ``(Tb, scale * Aqk)`` bf16 ``[64, 64]``."""
    import torch

    causal = torch.tril(torch.ones(BT, BT, dtype=torch.bool, device=ab_c.device))
    dec = torch.exp(torch.clamp(g_c[:, None] - g_c[None, :], max=0.0))
    tb = torch.where(causal, ab_c.float() * dec, 0.0)
    A = q_c.float() @ k_c.float().T
    aq = torch.where(causal, scale * (A * dec), 0.0)
    return tb.to(torch.bfloat16), aq.to(torch.bfloat16)


def emulate_check(lens=(64, 100, 37), hq: int = 1, hv: int = 2, d: int = 32, seed: int = 0):
    """Product ``Tb`` / ``scale * Aqk`` (the intra-chunk kernel, run by the Triton
    interpreter on CPU) against the same formed from ``Ab`` by :func:`form_chunk`, both
    against a float64 truth of the gated definitions (the intra-chunk module doc). Rows
    past a sequence's end are not compared (the product stores none). Returns a dict."""
    import torch

    from kernels.prefill.intra_chunk import intra_chunk_fwd
    from kernels.spec import GDNShape, make_prefill_inputs, resolve_scale

    x = make_prefill_inputs(list(lens), GDNShape(hq, hv, d), seed=seed)
    q, k, cu, scale = x["q"], x["k"], x["cu_seqlens"], resolve_scale(x["scale"], d)
    tb_p, gc, aq_p = intra_chunk_fwd(k, x["v"], cu, q, scale=scale, a=x["a"], b=x["b"],
                                     A_log=x["A_log"], dt_bias=x["dt_bias"])
    ab = ab_torch(k, x["b"], cu)
    beta = torch.sigmoid(x["b"].float()).double()
    G = hv // hq
    worst = dict(tb_emul_vs_product=0.0, tb_emul_vs_truth=0.0, tb_product_vs_truth=0.0,
                 aq_emul_vs_product=0.0, aq_emul_vs_truth=0.0, aq_product_vs_truth=0.0,
                 aq_ulp_violations=0)
    n_chunks = 0
    for t0, n in _chunks(cu):
        for h in range(hv):
            hk = h // G
            pad = lambda t: torch.cat([t, torch.zeros((BT - n,) + t.shape[1:], dtype=t.dtype)])  # noqa: E731
            g = pad(gc[t0:t0 + n, h])
            tb_e, aq_e = form_chunk(pad(ab[t0:t0 + n, h]), pad(q[t0:t0 + n, hk]),
                                    pad(k[t0:t0 + n, hk]), g, scale)
            # float64 truth of the gated definitions on the chunk's own n rows
            gd = g[:n].double()
            kd, qd, bd = k[t0:t0 + n, hk].double(), q[t0:t0 + n, hk].double(), beta[t0:t0 + n, h]
            decd = torch.exp(gd[:, None] - gd[None, :])
            Ag = torch.tril(bd[:, None] * (kd @ kd.T) * decd, -1)
            tb_t = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + Ag) * bd[None, :]
            aq_t = scale * torch.tril((qd @ kd.T) * decd)
            tp, ap = tb_p[t0:t0 + n, h, :n].double(), aq_p[t0:t0 + n, h, :n].double()
            te, ae = tb_e[:n, :n].double(), aq_e[:n, :n].double()
            for name, a_, b_ in (("tb_emul_vs_product", te, tp), ("tb_emul_vs_truth", te, tb_t),
                                 ("tb_product_vs_truth", tp, tb_t),
                                 ("aq_emul_vs_product", ae, ap), ("aq_emul_vs_truth", ae, aq_t),
                                 ("aq_product_vs_truth", ap, aq_t)):
                worst[name] = max(worst[name], float((a_ - b_).abs().max()))
            # Aqk: the same f32 products rounded once to bf16: within one bf16 ulp
            ulp = torch.maximum(ae.abs(), ap.abs()) * 2.0 ** -7 + 1e-30
            worst["aq_ulp_violations"] += int(((ae - ap).abs() > ulp).sum())
            # the upper triangle (and, for the product, columns past the end) are zero
            assert bool((tb_p[t0:t0 + n, h, n:] == 0).all()) and bool((aq_p[t0:t0 + n, h, n:] == 0).all())
            n_chunks += 1
    worst["tb_max_abs"] = float(tb_p.float().abs().max())
    worst["aq_max_abs"] = float(aq_p.float().abs().max())
    worst["chunk_heads"] = n_chunks
    # pass: the formed Tb is as close to the truth as the product's (bf16 storage twice:
    # Ab, then Tb; allow 2x the product's error plus one bf16 ulp of the tile's largest
    # entry), and the formed Aqk equals the product's within one bf16 ulp
    tb_tol = 2 * worst["tb_product_vs_truth"] + worst["tb_max_abs"] * 2.0 ** -8
    worst["tb_ok"] = worst["tb_emul_vs_truth"] <= tb_tol
    worst["aq_ok"] = worst["aq_ulp_violations"] == 0
    worst["ok"] = worst["tb_ok"] and worst["aq_ok"]
    worst.update(lens=list(lens), hq=hq, hv=hv, d=d)
    return worst


# --------------------------------------------------------------------------- GPU

def _formed_diffs(ab, q, k, gc, tb, aq, scale: float, G: int) -> dict:
    """One sequence of whole chunks: the aux's ``Tb``, ``scale * Aqk`` (torch, all chunks
    at once) against the product's (max abs differences): a diagnostic beside the gate."""
    import torch

    T, H, _ = ab.shape
    C = T // BT
    causal = torch.tril(torch.ones(BT, BT, dtype=torch.bool, device=ab.device))
    g = gc.view(C, BT, H).permute(0, 2, 1)                             # [C, H, 64]
    dec = torch.exp(torch.clamp(g[..., :, None] - g[..., None, :], max=0.0))
    tb_e = torch.where(causal, ab.view(C, BT, H, BT).permute(0, 2, 1, 3).float() * dec, 0.0)
    qk = q.view(C, BT, -1, q.shape[-1]).repeat_interleave(G, dim=2).permute(0, 2, 1, 3)
    kk = k.view(C, BT, -1, k.shape[-1]).repeat_interleave(G, dim=2).permute(0, 2, 1, 3)
    A = torch.matmul(qk.float(), kk.float().transpose(-1, -2))
    aq_e = torch.where(causal, scale * (A * dec), 0.0)
    tb_p = tb.view(C, BT, H, BT).permute(0, 2, 1, 3).float()
    aq_p = aq.view(C, BT, H, BT).permute(0, 2, 1, 3).float()
    return dict(tb_max_abs_diff=float((tb_e.bfloat16().float() - tb_p).abs().max()),
                aq_max_abs_diff=float((aq_e.bfloat16().float() - aq_p).abs().max()),
                tb_max_abs=float(tb_p.abs().max()), aq_max_abs=float(aq_p.abs().max()))


def gpu_run(lengths=(131072, 32768), methods=("graph",), rep: int = 20, out_path=None):
    """Contest-shaped inputs (one sequence of ``T`` tokens, the contest shape), the product
    call (``gdn_prefill``) with its phase C's arguments recorded; ``Ab`` by
    :func:`ab_torch` (float32); the new walk on the recorded ``gc``, ``s0``, split and tail
    gated against the product's ``o`` and final state (``kernels.checks.check_outputs``,
    the contest rule); then the new walk alone and the product walk alone, timed by
    ``kernels.bench.timing.time_fn`` (``methods``). One JSONL row per (variant, T,
    method), printed and appended to ``out_path``."""
    import subprocess
    from unittest import mock

    import torch
    import triton

    from kernels.bench.timing import time_fn
    from kernels.checks import check_outputs
    from kernels.prefill import gdn_prefill, pipeline
    from kernels.spec import make_prefill_inputs

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(os.path.abspath(__file__))
                                ).stdout.strip()
    except OSError:
        commit = ""
    gpu = torch.cuda.get_device_name()
    rows = []

    def emit(row):
        row.update(gpu=gpu, triton=triton.__version__, commit=commit, regs=dict(REGS))
        line = json.dumps(row)
        print(line, flush=True)
        rows.append(row)
        if out_path:
            with open(out_path, "a") as f:
                f.write(line + "\n")

    for T in lengths:
        x = make_prefill_inputs([T], device="cuda")
        rec = {}
        orig = pipeline.phase_c_fwd

        def recording(gluon, *args, **kw):
            rec.update(gluon=gluon, args=args, kw=kw)
            return orig(gluon, *args, **kw)

        with mock.patch("kernels.prefill.pipeline.phase_c_fwd", recording):
            o_ref, ht_ref = gdn_prefill(**x, check_values=False)
        torch.cuda.synchronize()
        if not rec or not rec["gluon"]:
            emit(dict(variant="setup", T=T, error="the product did not plan the Gluon phase C "
                      f"(recorded: {bool(rec)})"))
            continue
        q, k, v, tb, aq, gc, cu = rec["args"]
        kw = rec["kw"]
        G = v.shape[1] // q.shape[1]
        common = dict(s0=kw["s0"], scale=kw["scale"], seg_t=kw["seg_t"], tail=kw["tail"],
                      seg_mult=kw.get("seg_mult"), guard=kw.get("guard", False), status=None)
        # the product walk alone on the recorded intermediates: must reproduce the call
        o_p, ht_p = torch.empty_like(o_ref), torch.empty_like(ht_ref)
        go_p = swg.state_walk_gluon_fwd(q, k, v, tb, aq, gc, cu, output=o_p, final_state=ht_p,
                                        defer=True, **common)
        go_p()
        torch.cuda.synchronize()
        replay_ok = bool(torch.equal(o_p, o_ref) and torch.equal(ht_p, ht_ref))
        ab = ab_torch(k, x["b"], cu)
        diag = (_formed_diffs(ab, q, k, gc, tb, aq, kw["scale"], G)
                if T % BT == 0 and cu.numel() == 2 else {})
        o_n, ht_n = torch.empty_like(o_ref), torch.empty_like(ht_ref)
        go_n = walk_aux_fwd(q, k, v, ab, gc, cu, output=o_n, final_state=ht_n, defer=True,
                            **common)
        go_n()
        torch.cuda.synchronize()
        r = check_outputs((o_n, ht_n), (o_ref, ht_ref))
        gate = dict(ok=bool(r.ok), max_abs_err=r.max_abs_err, rel_l2_err=r.rel_l2_err,
                    reason=r.reason, finite=bool(torch.isfinite(o_n.float()).all()
                                                 and torch.isfinite(ht_n).all()),
                    o_max_abs_diff=float((o_n.float() - o_ref.float()).abs().max()),
                    ht_max_abs_diff=float((ht_n - ht_ref).abs().max()),
                    product_replay_bitwise=replay_ok, **diag)
        emit(dict(variant="gate", T=T, seg_t=kw["seg_t"], tail=kw["tail"],
                  split=kw.get("seg_mult") is not None, **gate))
        for method in methods:
            for name, go in (("product_walk", go_p), ("walk_aux", go_n)):
                try:
                    t = time_fn(go, method, rep=rep, warmup=3)
                except Exception as e:  # noqa: BLE001 - a row, not a stop
                    emit(dict(variant=name, T=T, method=method, error=f"{type(e).__name__}: {e}"))
                    continue
                emit(dict(variant=name, T=T, method=method, us=t.median_us, p20_us=t.p20_us,
                          p80_us=t.p80_us, n=t.n, gate_ok=gate["ok"] if name == "walk_aux"
                          else replay_ok))
        del x, o_ref, ht_ref, o_p, ht_p, o_n, ht_n, ab, rec
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true", help="sm_90a compile rows (CPU)")
    ap.add_argument("--emulate", action="store_true",
                    help="the formed Tb / Aqk against the product's (interpreter, CPU)")
    ap.add_argument("--gpu", action="store_true", help="gate and time on a GPU")
    ap.add_argument("--lengths", default="131072,32768")
    ap.add_argument("--methods", default="graph")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--out", default=None, help="append the JSONL rows here")
    a = ap.parse_args(argv)
    if not (a.compile or a.emulate or a.gpu):
        ap.error("choose --compile, --emulate or --gpu")
    if a.emulate and os.environ.get("TRITON_INTERPRET") != "1":
        # the interpreter is chosen when kernels is imported: a fresh process
        import subprocess
        env = dict(os.environ, TRITON_INTERPRET="1")
        rc = subprocess.run([sys.executable, "-m", "probes.walk_aux", "--emulate"]
                            + (["--out", a.out] if a.out else []), env=env).returncode
        if rc or not (a.compile or a.gpu):
            return rc
    elif a.emulate:
        ok = True
        for case in (dict(lens=(64, 100, 37), hq=1, hv=2, d=32),
                     dict(lens=(200, 64), hq=2, hv=4, d=128)):
            r = emulate_check(**case)
            ok &= r["ok"]
            print(json.dumps(dict(variant="emulate", **r)), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(dict(variant="emulate", **r)) + "\n")
        return 0 if ok else 1
    if a.compile:
        for r in compile_rows(131072) + compile_rows(32768):
            print(json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
    if a.gpu:
        gpu_run(tuple(int(x) for x in a.lengths.split(",")),
                tuple(a.methods.split(",")), a.rep, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
