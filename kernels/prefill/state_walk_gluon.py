"""The long path's phase C on sm_90 as a warp-specialized Gluon kernel.

Phase C (:func:`.state_walk_t.state_walk_t_kernel` with ``FROM_S0``, ``BV = 128``) walks
each segment slot's chunks from its entering state ``s0`` and writes the outputs ``o`` and,
on a sequence's last unit, the final state. Its chunk step is a chain of three dependent
products on the state (``S^T k^T``, ``R Tb^T``, the state update) plus the outputs' work
(``q`` and ``Aqk`` loads, two output products, the ``o`` store); in the Triton kernel all
of it runs in one instruction stream, with a CTA-wide barrier per step. Here the outputs'
work hides behind the chain (the Gluon walk probe's variant ``s2``, in git history at
``5d1c0a5``; numbers: docs/notes/long_context.md, "Gluon walk probe"):

* a producer partition (1 warp, few registers) loads each chunk's ``k``, ``q`` ``[64, K]``,
  ``v`` (two ``[64, 64]`` halves), ``Tb``, ``Aqk`` ``[64, 64]`` by TMA into one of
  :data:`STAGES` shared-memory stages, behind the stage's ``empty`` mbarrier (both state
  partitions released it); the stage's ``ready`` mbarrier counts the bytes;
* two state partitions of 4 warps each (one warpgroup: the default partition and a worker)
  own rows ``64 W .. 64 W + 63`` of ``S^T`` in registers and run every product as an
  asynchronous ``wgmma`` (``S``, ``R``, ``N`` from registers), waiting only where the chain
  needs a result; the chunk's ``o`` tile leaves through shared memory and a TMA store while
  the state update runs. The two warpgroups' rows are independent, so their chains
  interleave on the tensor cores with no barrier between them.

The step is the Triton walk's with ``"bf16"`` precisions (operands ``S``, ``R``, ``N`` and
the decayed ``N`` rounded to bf16, f32 accumulation, the same products in the same order):
the outputs and states are the Triton phase C's. So is the split tail: on a sequence's last
unit the last ``TAIL`` chunks (:func:`.config.tail_split_rule`) split ``R`` and the decayed
``N`` into bf16 ``hi + lo`` and issue two ``wgmma`` for ``R Tb^T`` and for the state update
(``hi`` then ``lo`` into the same accumulator, as :func:`.dots.mm` orders ``"bf16x2"``), a
second loop after the main one (whose body is unchanged); the final state's bf16 error
comes from those last chunks (docs/notes/long_context.md, "Long memory at 32k: which
rounding").

Sequences, units and the guard are phase C's: program ``(slot, head)`` finds its sequence
and unit as :func:`.chunk_index.unit_bounds` does (the binary search over the clamped
``cu_seqlens``, the device split ``seg_mult``; slots between units and gap slots return; an
empty sequence's slot 0 hands its entering state to the final state), and with ``GUARD``
first checks ``cu_seqlens`` on the device and, if invalid, NaN-fills its grid-stride share
of ``o`` and ``ht`` and stores the status bits, as :func:`.guard.walk_guard` does.

A unit's last chunk may be partial (a sequence ending mid-chunk): TMA loads a whole
``[64, .]`` box, so rows ``n_t ..`` of the tiles hold the next sequence's tokens (zeros
past ``T``). They never reach the state or a stored output, for any values they hold:

* ``R`` columns and ``N`` columns ``>= n_t`` are set to zero in registers (a select, not a
  product: what the Triton walk's masked loads give, zeros);
* so every product that sums over the chunk's tokens (``R Tb^T``, ``N Aqk^T``, the state
  update) sees zeros in those terms' register operand; the shared-memory operand's rows of
  the next sequence would still enter ``0 * x`` terms, which are not zero for ``x = inf``
  or NaN, so before the products the two state warpgroups zero rows ``>= n_t`` of the
  ``k`` tile (each its 32 rows, then a count-2 mbarrier: both halves are zero before either
  issues a product). The ``Tb`` and ``Aqk`` entries those zero columns meet are the
  sequence's own rows (``Tb[i, j]``, ``Aqk[i, j]`` for ``i < n_t``), as in the Triton walk;
  rows of ``q``, ``Tb``, ``Aqk`` ``>= n_t`` only reach columns ``>= n_t`` of ``X``, ``N`` (set
  to zero) and of ``o``'s tile (not stored);
* ``o``: TMA stores clip only at the tensor's bounds, so a partial chunk's tile is stored
  from registers with a masked store of its rows ``< n_t`` (the full chunks keep the TMA
  store: their 64 rows are the unit's own).

So for any ``cu_seqlens`` nothing outside ``[0, T)`` is addressed (the bounds are clamped
as :func:`.chunk_index.seq_bounds` does; TMA fills rows past ``T`` with zeros) and no
program writes a row of ``o`` outside its unit.

Requirements (:func:`.config.walk_gluon_rule` picks this kernel only where they hold):
compute capability 9.0 (``wgmma``, TMA, ``setmaxnreg``: sm_90a), a Triton with
``triton.experimental.gluon`` (the Triton 3.6 API), ``K = V = 128``, bf16 ``Tb`` / ``Aqk``
and bf16 products (the default config); at launch, 16-byte aligned base addresses of the
TMA tensors (:func:`tma_ready`; every torch allocation is), else the Triton phase C.
"""
from __future__ import annotations

from .. import interpret

interpret.install()

from .chunk_index import BT  # noqa: E402

try:   # the Triton 3.6 Gluon API (Hopper); absent on older Tritons
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                                  mbarrier, tma,
                                                                  warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except ImportError:   # pragma: no cover - a Triton without Gluon: the Triton phase C
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "GLUON_D", "STAGES", "state_walk_gluon_fwd",
           "tma_ready"]
if HAVE_GLUON:
    __all__.append("state_walk_gluon_kernel")

#: The head size the kernel is written for (two warpgroups of 64 rows of ``S^T``).
GLUON_D = 128
#: Load stages in shared memory (64 KB each at ``D = 128``).
STAGES = 2
#: Registers per thread of the producer warp's warpgroup and of the state worker
#: (``setmaxnreg``; the default partition gets the rest).
PRODUCER_REGS = 24
STATE_REGS = 240


if HAVE_GLUON:
    @gluon.jit
    def _seq_bounds(cu_seqlens, i_n, T):
        """:func:`.chunk_index.seq_bounds`: sequence ``i_n``'s bounds (int64) clamped into
        ``[0, T]`` with ``eos >= bos``."""
        bos = gl.load(cu_seqlens + i_n).to(gl.int64)
        eos = gl.load(cu_seqlens + i_n + 1).to(gl.int64)
        bos = gl.minimum(gl.maximum(bos, 0), T)
        eos = gl.minimum(gl.maximum(eos, bos), T)
        return bos, eos

    @gluon.jit
    def _unit_bounds(i_u, cu_seqlens, seg_mult, N, T, SEG_T: gl.constexpr,
                     SPLIT: gl.constexpr):
        """:func:`.chunk_index.unit_bounds` of phase C (``locate_block`` with ``BLOCK =
        SEG_T``): ``(i_n, bos, eos, ubos, ueos, skip)``."""
        lo = 0
        hi = N
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            c_mid = gl.minimum(gl.maximum(gl.load(cu_seqlens + mid).to(gl.int64), 0), T)
            if (c_mid // SEG_T).to(gl.int32) + mid <= i_u:
                lo = mid
            else:
                hi = mid
        bos, eos = _seq_bounds(cu_seqlens, lo, T)
        i_s = i_u - (bos // SEG_T).to(gl.int32) - lo
        if i_s < 0:   # (decreasing cu_seqlens) not a real slot
            eos = bos
            i_s = 1
        ubos = bos + i_s * SEG_T
        if SPLIT:
            m = gl.load(seg_mult + lo)
            ueos = gl.minimum(ubos + SEG_T * m, eos)
            skip = ((i_s > 0) & (ubos >= eos)) | (i_s % m != 0)
        else:
            ueos = gl.minimum(ubos + SEG_T, eos)
            skip = (i_s > 0) & (ubos >= eos)
        return lo, bos, eos, ubos, ueos, skip

    @gluon.jit
    def _guard(cu_seqlens, o, ht, status, T, N, i_p, n_p, H: gl.constexpr,
               V: gl.constexpr, K: gl.constexpr, HAS_STATUS: gl.constexpr):
        """:func:`.guard.walk_guard` (:func:`.chunk_index.cu_status`, then
        :func:`.guard.guard_outputs`) for program ``i_p`` of ``n_p``: returns the status
        bits; if not 0, this program's grid-stride share of ``o`` and ``ht`` is NaN."""
        L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        st = (gl.load(cu_seqlens).to(gl.int64) != 0).to(gl.int32)
        st = st | ((gl.load(cu_seqlens + N).to(gl.int64) != T).to(gl.int32) * 2)
        for j0 in range(0, N + 1, 128):
            o_i = j0 + gl.arange(0, 128, layout=L)
            b_x = gl.load(cu_seqlens + o_i, mask=o_i <= N, other=0).to(gl.int64)
            b_y = gl.load(cu_seqlens + o_i + 1, mask=o_i < N, other=0).to(gl.int64)
            dec = gl.max(((b_y < b_x) & (o_i < N)).to(gl.int32), axis=0)
            rng = gl.max((((b_x < 0) | (b_x > T)) & (o_i <= N)).to(gl.int32), axis=0)
            st = st | (dec * 4) | (rng * 8)
        if HAS_STATUS:
            if i_p == 0:
                gl.store(status, st)
        if st != 0:
            F: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
            n_o = T.to(gl.int64) * (H * V)
            n_ht = N.to(gl.int64) * (H * V * K)
            for i0 in range(i_p.to(gl.int64) * 1024, n_o, n_p * 1024):
                o_o = i0 + gl.arange(0, 1024, layout=F)
                gl.store(o + o_o, gl.full([1024], float("nan"), gl.bfloat16, F),
                         mask=o_o < n_o)
            for i1 in range(i_p.to(gl.int64) * 1024, n_ht, n_p * 1024):
                o_s = i1 + gl.arange(0, 1024, layout=F)
                gl.store(ht + o_s, gl.full([1024], float("nan"), gl.float32, F),
                         mask=o_s < n_ht)
        return st

    @gluon.jit
    def _producer(k_desc, q_desc, v_desc, tb_desc, aq_desc, k_s, q_s, v0_s, v1_s, tb_s,
                  aq_s, ready, empty, ubos, n_c, i_h, i_hk, K: gl.constexpr,
                  V: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr):
        """One warp: chunk ``i``'s tiles into stage ``i % STAGES`` once both state
        warpgroups released it (``empty``); ``ready`` completes when the bytes have landed
        (TMA counts a whole box, rows past ``T`` zero-filled included)."""
        NBYTES: gl.constexpr = 2 * (2 * BT * K + BT * V + 2 * BT * BT)
        for i in range(n_c):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            t0 = (ubos + i * BT).to(gl.int32)
            mbarrier.expect(bar, NBYTES)
            tma.async_copy_global_to_shared(k_desc, [t0, i_hk * K], bar, k_s.index(s))
            tma.async_copy_global_to_shared(v_desc, [t0, i_h * V], bar, v0_s.index(s))
            tma.async_copy_global_to_shared(v_desc, [t0, i_h * V + V // 2], bar,
                                            v1_s.index(s))
            tma.async_copy_global_to_shared(tb_desc, [t0, i_h * BT], bar, tb_s.index(s))
            tma.async_copy_global_to_shared(q_desc, [t0, i_hk * K], bar, q_s.index(s))
            tma.async_copy_global_to_shared(aq_desc, [t0, i_h * BT], bar, aq_s.index(s))

    @gluon.jit
    def _zero_k_rows(k_i, kfix, n_t, W: gl.constexpr, BT: gl.constexpr,
                     K: gl.constexpr):
        """A partial chunk (``n_t < BT`` tokens): warpgroup ``W`` zeroes rows ``>= n_t`` of
        its half (rows ``BT/2 W ..``) of the shared ``k`` tile, then waits on ``kfix``
        until the other warpgroup has zeroed its half (the module doc says why)."""
        HB: gl.constexpr = BT // 2
        Z: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        half = k_i.slice(W * HB, HB)
        x = half.load(Z)
        rows = W * HB + gl.arange(0, HB, layout=gl.SliceLayout(1, Z))
        half.store(gl.where((rows < n_t)[:, None], x, gl.zeros_like(x)))
        fence_async_shared()
        mbarrier.arrive(kfix)
        mbarrier.wait(kfix, 0)   # one partial chunk per unit at most: phase 0

    @gluon.jit
    def _store_o(o_desc, o_s, O, j, t0, col):
        """The ``[64 rows of S^T, BT]`` tile ``O`` (f32) as bf16 ``o`` rows ``t0 ..``
        columns ``col ..``: through shared-memory buffer ``j`` (the store issued two chunks
        ago from it must have read it), then a TMA store."""
        buf = o_s.index(j)
        tma.store_wait(1)
        buf.store(gl.permute(O.to(gl.bfloat16), (1, 0)))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [t0, col], buf)

    @gluon.jit
    def _step(i, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty,
              kfix, ubos, ueos, i_h, scale, W: gl.constexpr, H: gl.constexpr,
              K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr,
              PARTIAL: gl.constexpr, SPLIT_TAIL: gl.constexpr, qkn, i_hk,
              HQ: gl.constexpr, QK_NORM: gl.constexpr):
        """Chunk ``i`` of the unit for rows ``64 W ..`` of ``S^T``: returns the new ``S``
        and the next chunk's ``gc`` (all, last row). ``PARTIAL``: the unit's last chunk
        holds fewer than ``BT`` tokens (the module doc's three measures); the full chunks'
        step carries none of them (peeled: the loop body stays the probe's).
        ``SPLIT_TAIL``: a chunk of the split tail (the module doc): ``R`` and the decayed
        ``N`` as bf16 ``hi + lo``, two ``wgmma`` each (``hi`` first, ``lo`` accumulated
        into its result: the Triton walk's ``"bf16x2"`` order, :func:`.dots.mm`).
        ``QK_NORM``: the rows of ``q`` and ``k`` L2-normalised, their factors (``qkn``, the
        intra-chunk kernel's) on the token columns of ``X``, ``OQ`` and the decayed ``N``,
        as the Triton walk applies them."""
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
        t0 = ubos + i * BT
        n_t = ueos - t0
        live = o_t < n_t
        if QK_NORM:   # the token columns' factors with 1 / |q_t|, 1 / |k_t| (qkn), at once
            # (b_gc dies here: fewer live registers than holding the norms to their uses)
            p_n = qkn + (t0 + o_t) * (2 * HQ) + 2 * i_hk
            b_rk = gl.load(p_n + 1, mask=live, other=0.0)
            e_k = gl.exp(b_gc) * b_rk
            d_k = gl.exp(b_gl - b_gc) * b_rk
            e_q = scale * gl.exp(b_gc) * gl.load(p_n, mask=live, other=0.0)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        k_i = k_s.index(s)
        if PARTIAL:
            _zero_k_rows(k_i, kfix, n_t, W, BT, K)
        Sb = gl.convert_layout(S.to(gl.bfloat16), a_t)
        X = warpgroup_mma(Sb, k_i.permute((1, 0)), zero_t, use_acc=False, is_async=True)
        OQ = warpgroup_mma(Sb, q_s.index(s).permute((1, 0)), zero_t, use_acc=False,
                           is_async=True)
        if PARTIAL and SPLIT_TAIL:   # (spills with S^T q^T in flight beside R's halves)
            X, OQ, Sb = warpgroup_mma_wait(0, deps=[X, OQ, Sb])
        else:
            X = warpgroup_mma_wait(1, deps=[X])            # S^T q^T stays in flight
        vt = v_s.index(s).permute((1, 0)).load(acc_t)     # v^T [R, BT]
        if not QK_NORM:
            e_k = gl.exp(b_gc)
        Rt = vt.to(gl.float32) - X * e_k[None, :]
        if PARTIAL:
            Rt = gl.where(live[None, :], Rt, 0.0)
        tb_t = tb_s.index(s).permute((1, 0))
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
        if not QK_NORM:
            d_k = gl.exp(b_gl - b_gc)
        if SPLIT_TAIL:
            Dt = N * d_k[None, :]
            Dh = Dt.to(gl.bfloat16)
            Db = gl.convert_layout(Dh, a_k)
            Dl = gl.convert_layout((Dt - Dh.to(gl.float32)).to(gl.bfloat16), a_k)
        else:
            Db = gl.convert_layout((N * d_k[None, :]).to(gl.bfloat16), a_k)
        Nb = gl.convert_layout(N.to(gl.bfloat16), a_t)
        if not QK_NORM:
            e_q = scale * gl.exp(b_gc)
        O = warpgroup_mma(Nb, aq_s.index(s).permute((1, 0)),
                          OQ * e_q[None, :], is_async=True)
        S = warpgroup_mma(Db, k_i, S * gl.exp(b_gl), is_async=True)
        if SPLIT_TAIL:
            S = warpgroup_mma(Dl, k_i, S, is_async=True)
            O, Nb = warpgroup_mma_wait(2, deps=[O, Nb])    # the update stays in flight
        else:
            O, Nb = warpgroup_mma_wait(1, deps=[O, Nb])
        # the chunk's outputs leave while the state update runs
        if PARTIAL:   # rows t0 + n_t .. belong to the next sequence: a masked store
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
        mbarrier.arrive(empty.index(s))                   # the stage's last reader is done
        return S, b_gc, b_gl

    @gluon.jit
    def _state_wg(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty,
                  kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, W: gl.constexpr,
                  H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                  STAGES: gl.constexpr, TAIL: gl.constexpr, qkn, i_hk, HQ: gl.constexpr,
                  QK_NORM: gl.constexpr):
        """Rows ``64 W ..`` of ``S^T`` over the unit's chunks (the module doc): the full
        chunks, the split tail's full chunks (``last`` units: their last ``TAIL`` chunks),
        then a partial last one if the unit ends mid-chunk (:func:`_step`; only a ``last``
        unit ends mid-chunk, so that step is a tail step wherever ``TAIL > 0``).
        Products asynchronous, waits only where the chain needs a result; everything is
        retired at the end of each step: an accumulator in flight across the loop's back
        edge makes ptxas serialise every ``wgmma`` of the loop (warning C7514)."""
        R: gl.constexpr = V // 2
        acc_k: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, K, 16])
        acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BT, 16])
        cols_t: gl.constexpr = gl.SliceLayout(0, acc_t)
        o_r = W * R + gl.arange(0, R, layout=gl.SliceLayout(1, acc_k))
        o_k = gl.arange(0, K, layout=gl.SliceLayout(0, acc_k))
        p_rows = o_r[:, None] * K + o_k[None, :]
        S = gl.load(s0 + s_off + p_rows)                      # [R, K] f32, rows of S^T
        o_t = gl.arange(0, BT, layout=cols_t)
        # each chunk's gc (and its last row) is loaded during the previous chunk's update
        b_gc = gl.load(gc + (ubos + o_t) * H + i_h, mask=ubos + o_t < ueos, other=0.0)
        b_gl = gl.load(gc + (gl.minimum(ubos + BT, ueos) - 1) * H + i_h, mask=ubos < ueos,
                       other=0.0)
        n_full = ((ueos - ubos) // BT).to(gl.int32)
        n_main = n_full
        if TAIL > 0:
            if last:
                n_main = gl.maximum(n_c - TAIL, 0)
        for i in range(n_main):
            S, b_gc, b_gl = _step(i, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_s, aq_s,
                                  o_s, ready, empty, kfix, ubos, ueos, i_h, scale, W, H, K,
                                  V, BT, STAGES, False, False, qkn, i_hk, HQ, QK_NORM)
        if TAIL > 0:
            for i in range(n_main, n_full):
                S, b_gc, b_gl = _step(i, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_s,
                                      aq_s, o_s, ready, empty, kfix, ubos, ueos, i_h, scale,
                                      W, H, K, V, BT, STAGES, False, True, qkn, i_hk, HQ,
                                      QK_NORM)
        if n_full < n_c:
            S, b_gc, b_gl = _step(n_full, S, b_gc, b_gl, gc, o, o_desc, k_s, q_s, v_s, tb_s,
                                  aq_s, o_s, ready, empty, kfix, ubos, ueos, i_h, scale, W,
                                  H, K, V, BT, STAGES, True, TAIL > 0, qkn, i_hk, HQ,
                                  QK_NORM)
        tma.store_wait(0)
        if last:
            gl.store(ht + ht_off + p_rows, S)

    @gluon.jit
    def _state_wg0(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty,
                   kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, H: gl.constexpr,
                   K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                   STAGES: gl.constexpr, TAIL: gl.constexpr, qkn, i_hk, HQ: gl.constexpr,
                   QK_NORM: gl.constexpr):
        _state_wg(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty, kfix,
                  s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, 0, H, K, V, BT, STAGES,
                  TAIL, qkn, i_hk, HQ, QK_NORM)

    @gluon.jit
    def _state_wg1(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty,
                   kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, H: gl.constexpr,
                   K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                   STAGES: gl.constexpr, TAIL: gl.constexpr, qkn, i_hk, HQ: gl.constexpr,
                   QK_NORM: gl.constexpr):
        _state_wg(gc, s0, ht, o, o_desc, k_s, q_s, v_s, tb_s, aq_s, o_s, ready, empty, kfix,
                  s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, 1, H, K, V, BT, STAGES,
                  TAIL, qkn, i_hk, HQ, QK_NORM)

    @gluon.jit(do_not_specialize=["T", "N"])
    def state_walk_gluon_kernel(
        k_desc, q_desc, v_desc,   # TMA: k, q [T, HQ * K], v [T, H * V] bf16
        tb_desc, aq_desc,         # TMA: Tb, scale * Aqk [T, H * BT] bf16
        o_desc,                   # TMA: o [T, H * V] bf16 out (full chunks)
        o,                        # [T, H, V] bf16 out (partial chunks, the guard)
        gc,                       # [T, H] f32 per-chunk cumulative log decay
        s0,                       # [S, H, V, K] f32 entering state per segment slot
        cu_seqlens,               # [N+1] int32/int64
        ht,                       # [N, H, V, K] f32 out: final state, k-last
        status,                   # [1] int32 out (GUARD and HAS_STATUS) or None
        seg_mult,                 # [N] int32: slots per unit (SPLIT) or None
        qkn,                      # [T, HQ, 2] f32 L2-norm factors of q, k rows (QK_NORM) or None
        scale, T, N,
        H: gl.constexpr, G: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
        BT: gl.constexpr, SEG_T: gl.constexpr, SPLIT: gl.constexpr, GUARD: gl.constexpr,
        HAS_STATUS: gl.constexpr, STAGES: gl.constexpr, STATE_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, TAIL: gl.constexpr, QK_NORM: gl.constexpr = False,
    ):
        """Phase C: program ``(slot, value head)`` walks its unit from ``s0[slot, head]``
        (module doc); ``num_warps = 4`` (the first state warpgroup) plus a 4-warp state
        worker and a 1-warp load worker."""
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
        n_c = gl.cdiv(ueos - ubos, BT).to(gl.int32)   # (at most SEG_T / BT * 2)
        last = ueos >= eos
        HQ: gl.constexpr = H // G
        s_off = (i_u * H + i_h).to(gl.int64) * (V * K)
        ht_off = (i_n * H + i_h).to(gl.int64) * (V * K)

        k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], k_desc.layout)
        q_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], q_desc.layout)
        v0_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, V // 2], v_desc.layout)
        v1_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, V // 2], v_desc.layout)
        tb_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, BT], tb_desc.layout)
        aq_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, BT], aq_desc.layout)
        o0_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, V // 2], o_desc.layout)
        o1_s = gl.allocate_shared_memory(gl.bfloat16, [2, BT, V // 2], o_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kfix = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for j in gl.static_range(STAGES):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(empty.index(j), count=2)      # one arrival per state warpgroup
        mbarrier.init(kfix, count=2)

        gl.warp_specialize([
            (_state_wg0, (gc, s0, ht, o, o_desc, k_s, q_s, v0_s, tb_s, aq_s, o0_s, ready,
                          empty, kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, H,
                          K, V, BT, STAGES, TAIL, qkn, i_h // G, HQ, QK_NORM)),
            (_state_wg1, (gc, s0, ht, o, o_desc, k_s, q_s, v1_s, tb_s, aq_s, o1_s, ready,
                          empty, kfix, s_off, ht_off, ubos, ueos, n_c, i_h, scale, last, H,
                          K, V, BT, STAGES, TAIL, qkn, i_h // G, HQ, QK_NORM)),
            (_producer, (k_desc, q_desc, v_desc, tb_desc, aq_desc, k_s, q_s, v0_s, v1_s,
                         tb_s, aq_s, ready, empty, ubos, n_c, i_h, i_h // G, K, V, BT,
                         STAGES)),
        ], [4, 1], [STATE_REGS, PRODUCER_REGS])

    def _layouts(K: int, V: int):
        """Shared-memory layouts of the TMA tiles: ``k`` / ``q`` ``[64, K]``, ``v`` and
        ``o`` halves ``[64, V / 2]``, ``Tb`` / ``Aqk`` ``[64, 64]``."""
        return (gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16),
                gl.NVMMASharedLayout.get_default_for([BT, V // 2], gl.bfloat16),
                gl.NVMMASharedLayout.get_default_for([BT, BT], gl.bfloat16))


def tma_ready(*tensors) -> bool:
    """Whether TMA can address each tensor: a 16-byte aligned base (torch's allocations
    always are; a view at an odd offset may not be)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def state_walk_gluon_fwd(q, k, v, tb, aq, gc, cu_seqlens, *, s0, output, final_state,
                         scale: float, seg_t: int, tail: int, seg_mult=None,
                         guard: bool = False, status=None, defer: bool = False,
                         qk_norms=None):
    """Launch :func:`state_walk_gluon_kernel` once: phase C of the long path, as
    :func:`.state_walk_t.state_walk_t_fwd` with ``s0`` (and its ``seg_mult``, ``guard``,
    ``status``) launches it.

    Args:
        q, k: `[T, HQ, 128]` bf16. v: `[T, HV, 128]` bf16. tb, aq: `[T, HV, 64]` bf16
            (``Tb``, ``scale * Aqk``). gc: `[T, HV]` f32. cu_seqlens: `[N+1]` int32/int64.
        s0: `[S, HV, 128, 128]` f32, the entering state per slot of ``seg_t`` tokens
            (``S = T // seg_t + N``). seg_mult: `[N]` int32 (the device split) or None.
        output: `[T, HV, 128]` bf16, written. final_state: `[N, HV, 128, 128]` f32, written.
        tail: the split tail's chunks (:func:`.config.tail_split_rule`), as the Triton
            walk's ``tail``.
        guard, status: as the Triton walk's (:mod:`.guard`).
        qk_norms: `[T, HQ, 2]` f32 (the intra-chunk kernel's): ``q``, ``k`` rows enter
            L2-normalised (``QK_NORM``), as the Triton walk's ``qk_norms``.
    Returns None, or with ``defer`` the bound launch without launching it.
    """
    T, HQ, K = k.shape
    H, V = v.shape[1], v.shape[2]
    N = cu_seqlens.numel() - 1
    if K != GLUON_D or V != GLUON_D:
        raise ValueError(f"the Gluon phase C is written for K = V = {GLUON_D}, got {K}, {V}")
    if tb.dtype != q.dtype or aq.dtype != q.dtype:
        raise ValueError(f"the Gluon phase C reads bf16 Tb and Aqk, got {tb.dtype}, {aq.dtype}")
    if not isinstance(tail, int) or tail < 0:
        raise ValueError(f"tail must be an int >= 0, got {tail!r}")
    lk, lv, lt = _layouts(K, V)

    def desc(t, cols, block, layout):
        return TensorDescriptor(t, [T, cols], [cols, 1], block, layout)

    args = (desc(k, HQ * K, [BT, K], lk), desc(q, HQ * K, [BT, K], lk),
            desc(v, H * V, [BT, V // 2], lv), desc(tb, H * BT, [BT, BT], lt),
            desc(aq, H * BT, [BT, BT], lt), desc(output, H * V, [BT, V // 2], lv),
            output, gc, s0, cu_seqlens, final_state, status if guard else None, seg_mult,
            qk_norms, float(scale), T, N)
    kw = dict(H=H, G=H // HQ, K=K, V=V, BT=BT, SEG_T=int(seg_t), SPLIT=seg_mult is not None,
              GUARD=bool(guard), HAS_STATUS=bool(guard) and status is not None,
              TAIL=tail, QK_NORM=qk_norms is not None, STAGES=STAGES,
              STATE_REGS=STATE_REGS, PRODUCER_REGS=PRODUCER_REGS,
              num_warps=4)
    grid = (int(T) // int(seg_t) + N, H)

    def go():
        state_walk_gluon_kernel[grid](*args, **kw)

    if defer:
        return go
    go()
