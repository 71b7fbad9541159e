"""Probe (issue 54, second design): a light solve kernel that stores only the gate-free inverse.

Per 64-token chunk and value head ``h`` (q/k head ``h // G``) the kernel stores::

    Ab = (I + tril(diag(beta) K K^T, -1))^-1 diag(beta)        # [64, 64], bf16

into ``[T, HV, 64]`` (the product's ``Tb`` layout). With ``D = diag(exp(gc))`` the product's
gated inverse is ``D A D^-1``, so its ``Tb`` is ``Ab * exp(gc_i - gc_j)`` on and below the
diagonal (exact): the walk can apply the gates and form ``Q K^T`` itself, and this kernel
reads only ``k`` and ``b`` (``beta = sigmoid(b)``) and writes ``Ab``. Prediction and rule:
``docs/notes/long_path_probe.md``. This file is deleted once it is measured.

The solve is the product's (:func:`kernels.prefill.intra_chunk.solve_bands`, its
precisions, its band stores), imported. Variants (:data:`VARIANTS`) change what one program
owns, its warps and its register cap: ``vh`` one program per (chunk, value head); ``qk`` one
per (chunk, q/k head), ``K K^T`` once for its ``G`` value heads, one solve after the other;
``joint`` the same with both value heads' solves as one chain of ``[8, 16, 16]`` batched
products (the product's formulas, the block shift kept inside each head); ``copy`` the ``vh``
kernel without the solve (``Ab := (I + A) diag(beta)``'s blocks: the bytes and ``K K^T``
alone, so ``vh - copy`` is the solve's cost); ``noupper`` skips the zero blocks above the
diagonal; ``_rNN`` caps the registers (more programs per SM, some spills). There is no loop
in the kernel, so ``num_stages`` changes nothing and is not a variant.

Modes (run from the repository root)::

    TRITON_INTERPRET=1 python probes/light_solve.py --check     # CPU: every variant gated
    TRITON_INTERPRET=1 python probes/light_solve.py --compile   # CPU: sm_90 registers, spills
    python probes/light_solve.py --gpu --out FILE.jsonl         # GPU: gate, then time

``--check`` runs the interpreter at small shapes (lengths 64, 100, 37; HQ/HV 1/2 and 2/4;
D 32 and 128) and gates every variant as ``--gpu`` does. ``--gpu`` builds contest-shaped
inputs (:func:`kernels.spec.make_prefill_inputs`) at 32,768 and 131,072 tokens (one
sequence) and 4 x 8,192, gates every variant against the product's intra-chunk kernel,
times the ones that pass and the product's kernel (``graph``: warm L2, many calls per
replay) and prints variant, T, µs, GB/s, the ratio to the product's kernel.

Second round (the note's next step): the light kernel at its bytes
-----------------------------------------------------------------

**Prediction (written before any code of this round).** Measured first round (H100,
131,072 tokens, ``graph``): ``vh_w4_noupper`` 209.8 µs, ``vh_w4`` 211.3, ``copy_w4`` 139.1
(270.5 MB at 1.94 TB/s, 65 % of the card's 2.99 TB/s), product intra 355.7. Byte floor of
the full-``Ab`` store at 2.99 TB/s: 90.5 µs (270.5 MB); without the upper zero blocks
(220 MB): 73.6 µs. The first round's timings scale with programs per SM, not warps
(``vh_w4`` 4 per SM 211 µs, ``vh_w8`` 2 per SM 416, ``vh_w2`` 4 per SM 238): each program
runs its tiles' chains one after the other, 124 tiles per SM / 4 programs = 31 tiles per
program in 211 µs, ~6.8 µs per tile, of which the ``k`` load (DRAM latency under load,
~1-1.5 µs) is exposed once per tile. The new variants keep one tile per program's solve at
a time but issue the next tile's ``k`` load before the current tile's solve (multi-tile
and persistent programs), so at best they hide that load:
``t ~ 31 x (6.8 - 1.0..1.5) ~ 165-180 µs`` if the chain stays latency-bound; they reach
the byte side (~110 µs) only if the copy pattern, not the chain, was the limit.

| at 131,072, H100 | predicted µs (range) |
|---|---|
| ``stream`` (persistent, prefetch: load ``k``, store a ``[64, 64]`` tile per value head, no ``K K^T``: the access pattern alone) | ~100 (90-115) |
| ``copy`` persistent / multi-tile with prefetch (``K K^T`` and the band stores, no solve) | ~115 (100-140) |
| best light solve, persistent or multi-tile with prefetch | **~165 (135-195)** |
| ``noupper`` against full ``Ab`` | 2-5 µs less (the stores are not the limit) |
| ``evict_first`` on the sibling's ``k`` | within 2 % (the sibling reads its tile while the first is in flight) |

Expected verdict: in between (report), with a real chance of a stop; a go (<= 130) would
need the chain to stop being the limit, which this round does not change.

**Go / stop rule** (H100, 131,072 tokens, the best new solve variant that passes the gate;
the old variants are timed in the same run as the reference):

- **Go** (walk side next: ``Q K^T`` and the gate factors on an aux warpgroup of the walk)
  if the light solve takes **<= 130 µs**.
- **Stop the light-solve line** if no multi-tile / persistent solve variant is below
  **~185 µs** (< 10 % better than 209.8: the copy pattern was not the limit).
- **In between**: report (the walk may grow by at most ``218 - S`` µs; the note's rule).
- If the card or clocks differ from the first round (the old ``vh_w4_noupper`` in this run
  not within 5 % of 209.8), the rule is applied as ratios to it: go <= 0.62x, stop >= 0.88x.
- Reading the copy rows: a new ``copy`` / ``stream`` near the bytes (<= ~115 µs) with the
  solve >= 185 means the solve chain is the limit (stop stands); a new ``copy`` that does not
  improve on ``copy_w4`` (>= ~130) means this round did not reach the bytes, and a stop
  says nothing about the design beyond this access pattern (reported as such).

**Built** (:data:`ROUND2`, :func:`light_stream_kernel`; the per-head work is the first
round's, so ``--check`` also requires every round-2 solve / copy variant's ``Ab`` to equal
``vh_w4`` / ``copy_w4``'s bitwise). A first build held the next tile's ``k`` in registers
(``prefetch=True``) and hoisted the band stores' offsets out of the unit loop: 231 registers.
The index vectors now carry an opaque per-iteration zero (``j * ZERO``, :func:`_one_head_z`,
:func:`_store_band_z`): the loop without prefetch compiles to 130 (vs 122 for ``vh_w4``).
The register prefetch still costs ~90 (``ps_w4`` 218, 2 programs per SM), so the main
variants prefetch into L2 instead (``prefetch="l2"``: ``prefetch.global.L2::evict_last``,
one per 128-byte line of the next tile, no registers held; the interpreter skips the
instruction, it changes no value). sm_90, triton 3.7.1 (``--compile``), registers / spill
bytes / programs per SM: ``ps_w4`` 218/0/2, ``ps_w4_r168`` 161/0/3, ``ps_w4_pair``
255/8/2, ``mt8_w4`` 220/0/2, ``ps_copy_w4`` 193/0/2, ``ps_w4_nopf`` 130/0/3, ``ps_w4_l2``
130/0/3, ``_noupper`` 134/0/3, ``_evict`` 147/0/3, ``_pair`` 201/0/2, ``_r128`` 128/0/4,
``mt8_w4_l2_r128`` 128/0/4, ``mt2_w4_l2`` 141/0/3, ``mt8_w4_l2`` 136/0/3, ``_noupper``
145/0/3, ``ps_copy_w4_l2`` 112/0/4, ``mt8_copy_w4_l2`` 96/0/5, ``ps_stream_w4_l2`` 114/0/4,
``_noupper`` 145/0/3. Persistent grids: SMs x ``per_sm`` for the gate's launch, then the
programs per SM the GPU's own compile fits (recorded per timed row: ``n_regs``,
``n_spills``, ``programs_per_sm_fit``, ``programs``).

GPU run (from the repository root; 131k first)::

    PYTHONPATH=. python -m probes.light_solve --gpu --shapes "131072;32768" \
        --out $OUT/light_solve2.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __name__ == "__main__":   # run as a script: the repository root on the path, and the
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import interpret  # noqa: E402

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.prefill.chunk_index import BT, chunk_of_program, num_slots  # noqa: E402
from kernels.prefill.intra_chunk import (BC, OFFDIAG_PRECISION, SOLVE_PRECISION,  # noqa: E402
                                         _band, _mm, _store_band, solve_bands)

#: name -> (what a program owns, num_warps, solve, store the upper zero blocks, register cap
#: or None). Owns: ``"vh"`` a (chunk, value head); ``"qk"`` a (chunk, q/k head), its value
#: heads' solves one after the other; ``"joint"`` the same, its two value heads' solves as
#: one chain of ``[8, 16, 16]`` batched products (:func:`_solve_two`)
VARIANTS = {
    "vh_w4": ("vh", 4, True, True, None),
    "vh_w4_r96": ("vh", 4, True, True, 96),
    "vh_w4_r80": ("vh", 4, True, True, 80),
    "vh_w4_r64": ("vh", 4, True, True, 64),
    "vh_w2": ("vh", 2, True, True, None),
    "vh_w8": ("vh", 8, True, True, None),
    "vh_w4_noupper": ("vh", 4, True, False, None),
    "qk_w4": ("qk", 4, True, True, None),
    "qk_w4_r128": ("qk", 4, True, True, 128),
    "qk_w8": ("qk", 8, True, True, None),
    "joint_w8": ("joint", 8, True, True, None),
    "joint_w8_r80": ("joint", 8, True, True, 80),
    "joint_w4": ("joint", 4, True, True, None),
    "copy_w4": ("vh", 4, False, True, None),
}
#: Round 2 (:func:`light_stream_kernel`): name -> (``"stream"``, num_warps, solve, store the
#: upper zero blocks, register cap, options). Options: ``mode`` ``"solve"`` / ``"copy"``
#: (``K K^T`` and the band stores, no solve, as ``copy_w4``) / ``"stream"`` (load ``k``,
#: store one ``[64, 64]`` tile per value head: the access pattern alone, see
#: :func:`stream_reference`); ``sched`` ``"persist"`` (grid = SMs x ``per_sm`` programs, each
#: strides over the units) or ``"tiles"`` (``tiles`` consecutive units per program);
#: ``prefetch`` (the next unit's ``k`` loaded into registers before the current unit's
#: work); ``pair`` (a unit is a (chunk, q/k head): ``k`` and ``K K^T`` once, its value
#: heads' solves in sequence; else a unit is a (chunk, value head), heads fastest, so the
#: two value heads of a q/k head are consecutive units and the second reads ``k`` from
#: L1/L2); ``evict`` (``k`` loads of the last value head of a q/k head ``evict_first``, the
#: others ``evict_last``); ``stages`` (``num_stages`` of the unit loop: Triton's pipeliner,
#: for the variants without the explicit prefetch).
ROUND2 = {
    # prefetch into registers (the next tile's k held through this tile's work)
    "ps_w4": dict(mode="solve", sched="persist", per_sm=2, prefetch=True),
    "ps_w4_r168": dict(mode="solve", sched="persist", per_sm=3, prefetch=True, maxnreg=168),
    "ps_w4_pair": dict(mode="solve", sched="persist", per_sm=2, prefetch=True, pair=True),
    "mt8_w4": dict(mode="solve", sched="tiles", tiles=8, prefetch=True),
    "ps_copy_w4": dict(mode="copy", sched="persist", per_sm=2, prefetch=True),
    # no prefetch: the loop alone (Triton's pipeliner asked for 2 stages)
    "ps_w4_nopf": dict(mode="solve", sched="persist", per_sm=3, prefetch=False, stages=2),
    # prefetch into L2 (prefetch.global.L2, no registers held)
    "ps_w4_l2": dict(mode="solve", sched="persist", per_sm=4, prefetch="l2"),
    "ps_w4_l2_noupper": dict(mode="solve", sched="persist", per_sm=4, prefetch="l2",
                             upper=False),
    "ps_w4_l2_evict": dict(mode="solve", sched="persist", per_sm=4, prefetch="l2", evict=True),
    "ps_w4_l2_pair": dict(mode="solve", sched="persist", per_sm=4, prefetch="l2", pair=True),
    "ps_w4_l2_r128": dict(mode="solve", sched="persist", per_sm=4, prefetch="l2", maxnreg=128),
    "mt8_w4_l2_r128": dict(mode="solve", sched="tiles", tiles=8, prefetch="l2", maxnreg=128),
    "mt2_w4_l2": dict(mode="solve", sched="tiles", tiles=2, prefetch="l2"),
    "mt8_w4_l2": dict(mode="solve", sched="tiles", tiles=8, prefetch="l2"),
    "mt8_w4_l2_noupper": dict(mode="solve", sched="tiles", tiles=8, prefetch="l2",
                              upper=False),
    "ps_copy_w4_l2": dict(mode="copy", sched="persist", per_sm=8, prefetch="l2"),
    "mt8_copy_w4_l2": dict(mode="copy", sched="tiles", tiles=8, prefetch="l2"),
    "ps_stream_w4_l2": dict(mode="stream", sched="persist", per_sm=8, prefetch="l2"),
    "ps_stream_w4_l2_noupper": dict(mode="stream", sched="persist", per_sm=8, prefetch="l2",
                                    upper=False),
}
for _n, _o in ROUND2.items():
    VARIANTS[_n] = ("stream", _o.get("warps", 4), _o["mode"] == "solve", _o.get("upper", True),
                    _o.get("maxnreg"), _o)
#: the GPU run's default variants: the first round's best and its copy (the same run's
#: reference) and the round-2 variants that fit 3 or more programs per SM (sm_90 compile,
#: triton 3.7), plus ``ps_w4_r168`` for the register prefetch (``ps_w4``, ``ps_w4_pair``,
#: ``mt8_w4``, ``ps_copy_w4``: 193-255 registers, 2 programs per SM; ``ps_w4_l2_pair`` 201)
GPU_VARIANTS = ["vh_w4_noupper", "vh_w4", "copy_w4"] + [
    v for v in ROUND2 if v not in ("ps_w4", "ps_w4_pair", "mt8_w4", "ps_copy_w4",
                                   "ps_w4_l2_pair")]
#: The gate: ``Ab`` turned into ``Tb`` may be at most this many times further from the
#: float64 solve than the product's ``Tb`` is, plus ``GATE_ATOL`` (one more bf16 rounding).
GATE_FACTOR, GATE_ATOL = 2.0, 1e-3


@triton.jit
def _one_head(b, out, b_kk, t0, n_t, i_h, H: tl.constexpr, BT: tl.constexpr,
              BC: tl.constexpr, SOLVE: tl.constexpr, UPPER: tl.constexpr,
              PREC: tl.constexpr, OFF_PREC: tl.constexpr):
    """``Ab`` of value head ``i_h`` from the chunk's ``K K^T`` (``b_kk``, f32): ``beta``
    from ``b``, the strictly lower system, the product's solve and band stores."""
    o_r = tl.arange(0, BT)
    m_r = o_r < n_t
    b_beta = tl.sigmoid(tl.load(b + t0 * H + i_h + o_r * H, mask=m_r, other=0.0)
                        .to(tl.float32))
    b_beta = tl.where(m_r, b_beta, 0.0)
    b_A = tl.where(o_r[:, None] > o_r[None, :], b_kk * b_beta[:, None], 0.0)
    p_w = out + (t0 * H + i_h) * BT
    if SOLVE:
        T0, T1, T2, T3 = solve_bands(b_A, BC, PREC, OFF_PREC)
    else:   # the bands of A itself (diagonal blocks: I + A_0): the same stores, no solve
        A4 = tl.reshape(b_A, (4, BC, 4, BC))
        o_b = tl.arange(0, 4)
        o_c = tl.arange(0, BC)
        eye = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)[None, :, :]
        T0 = eye + tl.sum(tl.where((o_b[:, None, None, None] == o_b[None, None, :, None]),
                                   A4, 0.0), axis=2)
        T1 = tl.sum(tl.where((o_b[:, None, None, None] - 1 == o_b[None, None, :, None]),
                             A4, 0.0), axis=2)
        T2 = tl.sum(tl.where((o_b[:, None, None, None] - 2 == o_b[None, None, :, None]),
                             A4, 0.0), axis=2)
        T3 = tl.sum(tl.where((o_b[:, None, None, None] - 3 == o_b[None, None, :, None]),
                             A4, 0.0), axis=2)
    _store_band(p_w, T0, b_beta, 0, n_t, H, BC)
    _store_band(p_w, T1, b_beta, 1, n_t, H, BC)
    _store_band(p_w, T2, b_beta, 2, n_t, H, BC)
    _store_band(p_w, T3, b_beta, 3, n_t, H, BC)
    if UPPER:
        _store_band(p_w, T0, b_beta, -1, n_t, H, BC)
        _store_band(p_w, T0, b_beta, -2, n_t, H, BC)
        _store_band(p_w, T0, b_beta, -3, n_t, H, BC)


@triton.jit
def _shift_in_head(X, D: tl.constexpr):
    """``[8, BC, BC]`` (two heads' block bands, entry ``4 h + I``) whose entry ``4 h + I`` is
    ``X[4 h + I - D]``, zeros for ``I < D`` (the shift of ``solve_bands`` within each head)."""
    NB: tl.constexpr = X.shape[0]
    o_b = tl.arange(0, NB)
    m = (((o_b[:, None, None, None] - D) == o_b[None, :, None, None])
         & ((o_b[:, None, None, None] % 4) >= D))
    return tl.sum(tl.where(m, X[None, :, :, :], 0.0), axis=1)


@triton.jit
def _two(x0, x1):
    """Two heads' ``[4, BC, BC]`` bands as one ``[8, BC, BC]`` batch (entry ``4 h + I``)."""
    x = tl.permute(tl.join(x0, x1), (3, 0, 1, 2))
    return tl.reshape(x, (2 * x0.shape[0], x0.shape[1], x0.shape[2]))


@triton.jit
def _halves(x):
    """The inverse of :func:`_two`."""
    x = tl.permute(tl.reshape(x, (2, x.shape[0] // 2, x.shape[1], x.shape[2])), (1, 2, 3, 0))
    return tl.split(x)


@triton.jit
def _solve_two(A0, A1, A2, A3, BC: tl.constexpr, PREC: tl.constexpr,
               OFF_PREC: tl.constexpr):
    """``solve_bands`` for two heads at once: the bands ``A_D`` of both heads' systems as
    ``[8, BC, BC]`` batches, the same formulas and precisions, every product one batched
    ``[8, 16, 16]`` product (one dependent chain for both heads)."""
    o_c = tl.arange(0, BC)
    b_I = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)[None, :, :]
    m8 = (o_c[:, None] // 8) == (o_c[None, :] // 8)
    D8 = tl.where(m8[None, :, :], A0, 0.0)
    P2 = _mm(D8, D8, PREC)
    P4 = _mm(P2, P2, PREC)
    Ti8 = _mm(_mm(b_I - D8, b_I + P2, PREC), b_I + P4, PREC)
    T0 = _mm(b_I - _mm(Ti8, A0 - D8, PREC), Ti8, PREC)
    T1 = -_mm(T0, _mm(A1, _shift_in_head(T0, 1), OFF_PREC), OFF_PREC)
    T2 = -_mm(T0, _mm(A2, _shift_in_head(T0, 2), OFF_PREC)
              + _mm(A1, _shift_in_head(T1, 1), OFF_PREC), OFF_PREC)
    T3 = -_mm(T0, _mm(A3, _shift_in_head(T0, 3), OFF_PREC)
              + _mm(A2, _shift_in_head(T1, 2), OFF_PREC)
              + _mm(A1, _shift_in_head(T2, 1), OFF_PREC), OFF_PREC)
    return T0, T1, T2, T3


@triton.jit
def _joint_heads(b, out, b_kk, t0, n_t, i_hk, H: tl.constexpr, BT: tl.constexpr,
                 BC: tl.constexpr, UPPER: tl.constexpr, PREC: tl.constexpr,
                 OFF_PREC: tl.constexpr):
    """``Ab`` of value heads ``2 i_hk`` and ``2 i_hk + 1`` by :func:`_solve_two`."""
    o_r = tl.arange(0, BT)
    m_r = o_r < n_t
    low = o_r[:, None] > o_r[None, :]
    i_h0 = 2 * i_hk
    be0 = tl.where(m_r, tl.sigmoid(tl.load(b + t0 * H + i_h0 + o_r * H, mask=m_r, other=0.0)
                                   .to(tl.float32)), 0.0)
    be1 = tl.where(m_r, tl.sigmoid(tl.load(b + t0 * H + i_h0 + 1 + o_r * H, mask=m_r,
                                           other=0.0).to(tl.float32)), 0.0)
    X0 = tl.reshape(tl.where(low, b_kk * be0[:, None], 0.0), (4, BC, 4, BC))
    X1 = tl.reshape(tl.where(low, b_kk * be1[:, None], 0.0), (4, BC, 4, BC))
    T0, T1, T2, T3 = _solve_two(_two(_band(X0, 0), _band(X1, 0)),
                                _two(_band(X0, 1), _band(X1, 1)),
                                _two(_band(X0, 2), _band(X1, 2)),
                                _two(_band(X0, 3), _band(X1, 3)), BC, PREC, OFF_PREC)
    p0 = out + (t0 * H + i_h0) * BT
    p1 = p0 + BT
    u0, u1 = _halves(T0)
    _store_band(p0, u0, be0, 0, n_t, H, BC)
    _store_band(p1, u1, be1, 0, n_t, H, BC)
    u0, u1 = _halves(T1)
    _store_band(p0, u0, be0, 1, n_t, H, BC)
    _store_band(p1, u1, be1, 1, n_t, H, BC)
    u0, u1 = _halves(T2)
    _store_band(p0, u0, be0, 2, n_t, H, BC)
    _store_band(p1, u1, be1, 2, n_t, H, BC)
    u0, u1 = _halves(T3)
    _store_band(p0, u0, be0, 3, n_t, H, BC)
    _store_band(p1, u1, be1, 3, n_t, H, BC)
    if UPPER:
        for D in tl.static_range(1, 4):
            _store_band(p0, u0, be0, -D, n_t, H, BC)
            _store_band(p1, u1, be1, -D, n_t, H, BC)


@triton.jit(do_not_specialize=["T", "N"])
def light_solve_kernel(
    k,              # [T, HQ, K] bf16 keys
    b,              # [T, H] bf16 raw beta input (beta = sigmoid(b))
    out,            # [T, H, BT] bf16 out: Ab = A diag(beta), A the gate-free inverse
    cu_seqlens,     # [N+1] int32/int64
    T,              # total tokens
    N,              # sequences
    H: tl.constexpr,        # value heads
    G: tl.constexpr,        # value heads per q/k head
    K: tl.constexpr,        # key head size
    BT: tl.constexpr,       # chunk (64)
    BC: tl.constexpr,       # sub-block of the solve (16)
    OWNS: tl.constexpr,     # "vh": a (chunk, value head); "qk": a (chunk, q/k head), its
                            # G value heads one after the other; "joint": as one chain
    SOLVE: tl.constexpr,    # False: store A's bands (the bytes without the solve)
    UPPER: tl.constexpr,    # store the zero blocks above the diagonal
    PREC: tl.constexpr,     # precision of the diagonal inverses (the product's)
    OFF_PREC: tl.constexpr,  # precision of the off-diagonal products (the product's)
):
    HQ: tl.constexpr = H // G
    if OWNS == "vh":   # heads of the grid fastest
        i_p, i_h = tl.program_id(0) // H, tl.program_id(0) % H
        i_hk = i_h // G
    else:
        i_p, i_hk = tl.program_id(0) // HQ, tl.program_id(0) % HQ
        i_h = i_hk * G
    # device lookup (USE_INDICES False: the table argument is not read)
    i_n, i_c, bos, eos = chunk_of_program(i_p, cu_seqlens, cu_seqlens, N, T, BT, False)
    if i_c * BT >= eos - bos:
        return
    t0 = bos + i_c * BT
    n_t = eos - t0
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    b_k = tl.load(k + (t0 * HQ + i_hk) * K + o_r[:, None] * (HQ * K) + o_k[None, :],
                  mask=(o_r < n_t)[:, None], other=0.0)
    b_kk = tl.dot(b_k, tl.trans(b_k))
    if OWNS == "joint":
        tl.static_assert(G == 2)
        _joint_heads(b, out, b_kk, t0, n_t, i_hk, H, BT, BC, UPPER, PREC, OFF_PREC)
    elif OWNS == "qk":
        for g in tl.static_range(G):
            _one_head(b, out, b_kk, t0, n_t, i_h + g, H, BT, BC, SOLVE, UPPER, PREC, OFF_PREC)
    else:
        _one_head(b, out, b_kk, t0, n_t, i_h, H, BT, BC, SOLVE, UPPER, PREC, OFF_PREC)


@triton.jit
def _store_band_z(p_w, X3, b_beta, D: tl.constexpr, n_t, H: tl.constexpr, BC: tl.constexpr,
                  zero):
    """:func:`kernels.prefill.intra_chunk._store_band` with ``zero`` (0, opaque and
    different each loop iteration) added to its index vectors: without it the compiler
    hoists the seven bands' offsets and masks out of the unit loop and keeps them in
    registers across it (231 registers instead of 122: ``--compile``)."""
    NB: tl.constexpr = 4
    o_b = tl.arange(0, NB) + zero
    o_c = tl.arange(0, BC) + zero
    rows = o_b[:, None, None] * BC + o_c[None, :, None]
    cols = (o_b[:, None, None] - D) * BC + o_c[None, None, :]
    if D >= 0:
        b3 = tl.reshape(b_beta, (NB, BC))
        m = (o_b[:, None, None] - D) == o_b[None, :, None]
        b_bc = tl.sum(tl.where(m, b3[None, :, :], 0.0), axis=1)
        val = X3 * b_bc[:, None, :]
    else:
        val = tl.zeros([NB, BC, BC], dtype=tl.float32)
    m_st = (o_b[:, None, None] >= D) & (o_b[:, None, None] - D < NB) & (rows < n_t)
    tl.store(p_w + rows * (H * NB * BC) + cols, val.to(p_w.dtype.element_ty), mask=m_st)


@triton.jit
def _one_head_z(b, out, b_kk, t0, n_t, i_h, zero, H: tl.constexpr, BT: tl.constexpr,
                BC: tl.constexpr, SOLVE: tl.constexpr, UPPER: tl.constexpr,
                PREC: tl.constexpr, OFF_PREC: tl.constexpr):
    """:func:`_one_head` with ``zero`` in its index vectors (see :func:`_store_band_z`)."""
    o_r = tl.arange(0, BT) + zero
    m_r = o_r < n_t
    b_beta = tl.sigmoid(tl.load(b + t0 * H + i_h + o_r * H, mask=m_r, other=0.0)
                        .to(tl.float32))
    b_beta = tl.where(m_r, b_beta, 0.0)
    b_A = tl.where(o_r[:, None] > o_r[None, :], b_kk * b_beta[:, None], 0.0)
    p_w = out + (t0 * H + i_h) * BT
    if SOLVE:
        T0, T1, T2, T3 = solve_bands(b_A, BC, PREC, OFF_PREC)
    else:   # the bands of A itself (diagonal blocks: I + A_0): the same stores, no solve
        A4 = tl.reshape(b_A, (4, BC, 4, BC))
        o_b = tl.arange(0, 4) + zero
        o_c = tl.arange(0, BC) + zero
        eye = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)[None, :, :]
        T0 = eye + tl.sum(tl.where((o_b[:, None, None, None] == o_b[None, None, :, None]),
                                   A4, 0.0), axis=2)
        T1 = tl.sum(tl.where((o_b[:, None, None, None] - 1 == o_b[None, None, :, None]),
                             A4, 0.0), axis=2)
        T2 = tl.sum(tl.where((o_b[:, None, None, None] - 2 == o_b[None, None, :, None]),
                             A4, 0.0), axis=2)
        T3 = tl.sum(tl.where((o_b[:, None, None, None] - 3 == o_b[None, None, :, None]),
                             A4, 0.0), axis=2)
    _store_band_z(p_w, T0, b_beta, 0, n_t, H, BC, zero)
    _store_band_z(p_w, T1, b_beta, 1, n_t, H, BC, zero)
    _store_band_z(p_w, T2, b_beta, 2, n_t, H, BC, zero)
    _store_band_z(p_w, T3, b_beta, 3, n_t, H, BC, zero)
    if UPPER:
        _store_band_z(p_w, T0, b_beta, -1, n_t, H, BC, zero)
        _store_band_z(p_w, T0, b_beta, -2, n_t, H, BC, zero)
        _store_band_z(p_w, T0, b_beta, -3, n_t, H, BC, zero)


@triton.jit
def _unit_of(i_u, cu_seqlens, N, T, HU: tl.constexpr, BT: tl.constexpr):
    """Unit ``i_u`` (chunk slot ``i_u // HU``, head index ``i_u % HU``, heads fastest):
    ``(t0, n_t, i_x)``, the chunk's first token, its tokens (``<= 0``: a gap slot, every mask
    off) and the head index."""
    i_n, i_c, bos, eos = chunk_of_program(i_u // HU, cu_seqlens, cu_seqlens, N, T, BT, False)
    t0 = bos + i_c * BT
    return t0, eos - t0, i_u % HU


@triton.jit
def _load_k(k, t0, n_t, i_hk, ok, HQ: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
            LAST: tl.constexpr = False, EVICT: tl.constexpr = False):
    """The chunk's ``[BT, K]`` keys of q/k head ``i_hk`` (rows past the end, or all rows when
    not ``ok``, 0). ``EVICT``: ``evict_first`` when ``LAST`` (the last reader of the tile),
    else ``evict_last``."""
    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    p = k + (t0 * HQ + i_hk) * K + o_r[:, None] * (HQ * K) + o_k[None, :]
    m = ((o_r < n_t) & ok)[:, None]
    if EVICT:
        if LAST:
            x = tl.load(p, mask=m, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(p, mask=m, other=0.0, eviction_policy="evict_last")
    else:
        x = tl.load(p, mask=m, other=0.0)
    return x


@triton.jit
def _load_k_unit(k, t0, n_t, i_x, ok, HQ: tl.constexpr, G: tl.constexpr, K: tl.constexpr,
                 BT: tl.constexpr, PAIR: tl.constexpr, EVICT: tl.constexpr):
    """``k`` of unit ``(t0, n_t, i_x)``: q/k head ``i_x`` (``PAIR``) or ``i_x // G``; with
    ``EVICT`` (value-head units) the last value head of the q/k head loads ``evict_first``."""
    if PAIR:
        x = _load_k(k, t0, n_t, i_x, ok, HQ, K, BT)
    elif EVICT:
        if i_x % G == G - 1:
            x = _load_k(k, t0, n_t, i_x // G, ok, HQ, K, BT, True, True)
        else:
            x = _load_k(k, t0, n_t, i_x // G, ok, HQ, K, BT, False, True)
    else:
        x = _load_k(k, t0, n_t, i_x // G, ok, HQ, K, BT)
    return x


@triton.jit
def _prefetch_l2(k, t0, n_t, i_hk, ok, HQ: tl.constexpr, K: tl.constexpr, BT: tl.constexpr):
    """``prefetch.global.L2`` of the chunk's ``[BT, K]`` keys of q/k head ``i_hk``: one
    instruction per 128-byte line, no registers held (invalid rows prefetch ``k``'s first
    line instead)."""
    LINES: tl.constexpr = K * 2 // 128          # 128-byte lines per bf16 row
    o_r = tl.arange(0, BT)
    o_l = tl.arange(0, LINES)
    off = (t0 * HQ + i_hk) * K + o_r[:, None] * (HQ * K) + o_l[None, :] * 64
    off = tl.where(((o_r < n_t) & ok)[:, None], off, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                              [k + off], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _stream_head(b, out, b_k, t0, n_t, i_h, zero, H: tl.constexpr, K: tl.constexpr,
                 BT: tl.constexpr, BC: tl.constexpr, UPPER: tl.constexpr):
    """``stream``: ``out[t0 + r, i_h, c] = (k[r, 2c] + k[r, 2c + 1]) beta_r`` (every byte of
    the ``k`` tile used, one ``[BT, BT]`` store; without ``UPPER`` only the blocks on and
    below the diagonal, as ``noupper``)."""
    tl.static_assert(K == 2 * BT)
    o_r = tl.arange(0, BT) + zero
    m_r = o_r < n_t
    b_beta = tl.sigmoid(tl.load(b + t0 * H + i_h + o_r * H, mask=m_r, other=0.0)
                        .to(tl.float32))
    x0, x1 = tl.split(tl.reshape(b_k, (BT, BT, 2)))
    val = (x0.to(tl.float32) + x1.to(tl.float32)) * b_beta[:, None]
    m = m_r[:, None]
    if not UPPER:
        m = m & ((o_r[:, None] // BC) >= (o_r[None, :] // BC))
    tl.store(out + (t0 * H + i_h) * BT + o_r[:, None] * (H * BT) + o_r[None, :],
             val.to(out.dtype.element_ty), mask=m)


@triton.jit
def _unit_work(b, out, b_k, t0, n_t, i_x, zero, H: tl.constexpr, G: tl.constexpr,
               K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, MODE: tl.constexpr,
               PAIR: tl.constexpr, UPPER: tl.constexpr, PREC: tl.constexpr,
               OFF_PREC: tl.constexpr):
    """Everything a unit stores, from its ``k`` tile ``b_k``."""
    if MODE == "stream":
        if PAIR:
            for g in tl.static_range(G):
                _stream_head(b, out, b_k, t0, n_t, i_x * G + g, zero, H, K, BT, BC, UPPER)
        else:
            _stream_head(b, out, b_k, t0, n_t, i_x, zero, H, K, BT, BC, UPPER)
    else:
        b_kk = tl.dot(b_k, tl.trans(b_k))
        if PAIR:
            for g in tl.static_range(G):
                _one_head_z(b, out, b_kk, t0, n_t, i_x * G + g, zero, H, BT, BC,
                            MODE == "solve", UPPER, PREC, OFF_PREC)
        else:
            _one_head_z(b, out, b_kk, t0, n_t, i_x, zero, H, BT, BC, MODE == "solve", UPPER,
                        PREC, OFF_PREC)


@triton.jit(do_not_specialize=["T", "N", "n_units", "NPROG", "ZERO"])
def light_stream_kernel(
    k,              # [T, HQ, K] bf16 keys
    b,              # [T, H] bf16 raw beta input (beta = sigmoid(b))
    out,            # [T, H, BT] bf16 out: Ab (or copy / stream's tile)
    cu_seqlens,     # [N+1] int32/int64
    T,              # total tokens
    N,              # sequences
    n_units,        # chunk slots x units per slot
    NPROG,          # programs of the grid (the persistent stride)
    ZERO,           # 0 (opaque: ``j * ZERO`` keeps the per-unit index vectors in the loop)
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    MODE: tl.constexpr,      # "solve" / "copy" / "stream"
    PAIR: tl.constexpr,      # a unit is (chunk, q/k head), else (chunk, value head)
    PERSIST: tl.constexpr,   # stride NPROG over the units, else TILES consecutive units
    TILES: tl.constexpr,
    PREFETCH: tl.constexpr,  # next unit's k into registers before this unit's work
    STAGES: tl.constexpr,    # num_stages of the unit loop (without PREFETCH)
    EVICT: tl.constexpr,
    UPPER: tl.constexpr, PREC: tl.constexpr, OFF_PREC: tl.constexpr,
    L2PF: tl.constexpr = True,   # PREFETCH "l2": issue the prefetch (False: the interpreter,
                                 # which runs no inline assembly; it changes no value)
):
    """Round 2: programs that own several units (:data:`ROUND2`)."""
    HQ: tl.constexpr = H // G
    HU: tl.constexpr = HQ if PAIR else H
    pid = tl.program_id(0)
    if PERSIST:
        start = pid
        step = NPROG
        count = tl.cdiv(n_units - pid, NPROG)
    else:
        start = pid * TILES
        step = 1
        count = tl.minimum(n_units - start, TILES)
    if PREFETCH == "l2":
        for j in range(count):
            t0, n_t, i_x = _unit_of(start + j * step, cu_seqlens, N, T, HU, BT)
            b_k = _load_k_unit(k, t0, n_t, i_x, True, HQ, G, K, BT, PAIR, EVICT)
            # the next unit's keys into L2 (no registers held) during this unit's work
            if L2PF:
                t0_n, n_t_n, i_x_n = _unit_of(start + (j + 1) * step, cu_seqlens, N, T, HU,
                                              BT)
                _prefetch_l2(k, t0_n, n_t_n, i_x_n if PAIR else i_x_n // G, j + 1 < count, HQ,
                             K, BT)
            _unit_work(b, out, b_k, t0, n_t, i_x, j * ZERO, H, G, K, BT, BC, MODE, PAIR, UPPER,
                       PREC, OFF_PREC)
    elif PREFETCH:
        t0, n_t, i_x = _unit_of(start, cu_seqlens, N, T, HU, BT)
        b_k = _load_k_unit(k, t0, n_t, i_x, count > 0, HQ, G, K, BT, PAIR, EVICT)
        for j in range(count):
            # the next unit's keys first: in flight during this unit's work
            t0_n, n_t_n, i_x_n = _unit_of(start + (j + 1) * step, cu_seqlens, N, T, HU, BT)
            b_k_n = _load_k_unit(k, t0_n, n_t_n, i_x_n, j + 1 < count, HQ, G, K, BT, PAIR,
                                 EVICT)
            _unit_work(b, out, b_k, t0, n_t, i_x, j * ZERO, H, G, K, BT, BC, MODE, PAIR, UPPER, PREC,
                       OFF_PREC)
            b_k = b_k_n
            t0 = t0_n
            n_t = n_t_n
            i_x = i_x_n
    else:
        for j in tl.range(0, count, num_stages=STAGES):
            t0, n_t, i_x = _unit_of(start + j * step, cu_seqlens, N, T, HU, BT)
            b_k = _load_k_unit(k, t0, n_t, i_x, True, HQ, G, K, BT, PAIR, EVICT)
            _unit_work(b, out, b_k, t0, n_t, i_x, j * ZERO, H, G, K, BT, BC, MODE, PAIR, UPPER, PREC,
                       OFF_PREC)


#: SMs assumed for the persistent grid off the GPU (the interpreter: a few programs, so
#: every program strides over several units)
CPU_SMS = 2


def _light_stream(k, b, cu_seqlens, variant, out):
    o = VARIANTS[variant][5]
    T, HQ, K = k.shape
    H = b.shape[1]
    N = cu_seqlens.numel() - 1
    pair = o.get("pair", False)
    n_units = num_slots(T, N) * (HQ if pair else H)
    if o["sched"] == "persist":
        sms = (torch.cuda.get_device_properties(k.device).multi_processor_count
               if k.device.type == "cuda" else CPU_SMS)
        nprog = max(1, min(n_units, sms * _PER_SM.get(variant, o["per_sm"])))
        tiles = 1
    else:
        tiles = o["tiles"]
        nprog = triton.cdiv(n_units, tiles)
    if n_units == 0:
        return out
    compiled = light_stream_kernel[(nprog,)](
        k, b, out, cu_seqlens, T, N, n_units, nprog, 0, H=H, G=H // HQ, K=K, BT=BT, BC=BC,
        MODE=o["mode"], PAIR=pair, PERSIST=o["sched"] == "persist", TILES=tiles,
        PREFETCH=o.get("prefetch", False), STAGES=o.get("stages", 1),
        EVICT=o.get("evict", False), UPPER=o.get("upper", True),
        L2PF=os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
        PREC=SOLVE_PRECISION["batched"], OFF_PREC=OFFDIAG_PRECISION["batched"],
        num_warps=o.get("warps", 4), **({"maxnreg": o["maxnreg"]} if o.get("maxnreg") else {}))
    regs = getattr(compiled, "n_regs", None)
    fit = None
    try:   # on the GPU: the programs per SM this compile fits, for the next launch
        from kernels.bench.sm90 import programs_per_sm

        fit = programs_per_sm(regs, compiled.metadata.shared, o.get("warps", 4)) if regs else None
    except Exception:   # another triton's metadata: keep the option's per_sm
        fit = None
    if fit:
        if o["sched"] == "persist":
            _PER_SM[variant] = max(1, fit)
    LAST_LAUNCH[variant] = dict(programs=nprog, n_regs=regs,
                                n_spills=getattr(compiled, "n_spills", None),
                                programs_per_sm_fit=fit)
    return out


#: per variant: the last launch's programs and (on the GPU) the compiled registers / spills
#: and the programs per SM they fit
LAST_LAUNCH = {}
#: persistent variants: programs per SM measured from the GPU's compile (the first launch,
#: the gate's, uses the option ``per_sm``; every later one, the timed ones, this)
_PER_SM = {}


def light_solve(k: torch.Tensor, b: torch.Tensor, cu_seqlens: torch.Tensor, variant: str,
                out: torch.Tensor = None) -> torch.Tensor:
    """``Ab`` ``[T, HV, 64]`` bf16 of every chunk and value head by ``variant`` (a key of
    :data:`VARIANTS`); ``out`` to write into (else allocated; ``noupper`` leaves its upper
    blocks as they were: zeros when allocated here)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    owns, warps, solve, upper, maxnreg = VARIANTS[variant][:5]
    T, HQ, K = k.shape
    H = b.shape[1]
    N = cu_seqlens.numel() - 1
    if out is None:
        out = torch.zeros(T, H, BT, dtype=torch.bfloat16, device=k.device)
    if owns == "stream":
        return _light_stream(k, b, cu_seqlens, variant, out)
    if owns == "joint" and H != 2 * HQ:
        raise ValueError(f"variant {variant!r} needs 2 value heads per q/k head, got HV={H}, "
                         f"HQ={HQ}")
    grid = (num_slots(T, N) * (H if owns == "vh" else HQ),)
    if grid[0]:
        light_solve_kernel[grid](
            k, b, out, cu_seqlens, T, N, H=H, G=H // HQ, K=K, BT=BT, BC=BC, OWNS=owns,
            SOLVE=solve, UPPER=upper, PREC=SOLVE_PRECISION["batched"],
            OFF_PREC=OFFDIAG_PRECISION["batched"], num_warps=warps,
            **({"maxnreg": maxnreg} if maxnreg else {}))
    return out


# --------------------------------------------------------------------------- gate


def _chunk_tokens(cu_seqlens: torch.Tensor, T: int):
    """``(idx [T, 64] int64, valid [T, 64] bool)``: for token ``t`` (row ``i`` of its chunk)
    the token of column ``j`` of its chunk, and whether ``j <= i`` (on or below the
    diagonal)."""
    dev = cu_seqlens.device
    t = torch.arange(T, device=dev)
    seq = torch.searchsorted(cu_seqlens.to(torch.int64), t, right=True) - 1
    bos = cu_seqlens.to(torch.int64)[seq]
    t0 = bos + (t - bos) // BT * BT
    j = torch.arange(BT, device=dev)
    idx = t0[:, None] + j[None, :]
    valid = idx <= t[:, None]
    return idx.clamp(max=T - 1), valid


def gated_from_light(ab: torch.Tensor, gc: torch.Tensor, cu_seqlens: torch.Tensor
                     ) -> torch.Tensor:
    """The product's ``Tb`` from ``Ab``: ``Ab_ij exp(gc_i - gc_j)`` on and below the
    diagonal, 0 above (f32)."""
    T = ab.shape[0]
    idx, valid = _chunk_tokens(cu_seqlens, T)
    gcol = gc[idx]                                   # [T, 64, HV]: gc of column j
    dec = torch.exp(torch.clamp(gc[:, None, :] - gcol, max=0.0)).transpose(1, 2)
    return torch.where(valid[:, None, :], ab.float() * dec, 0.0)


def reference_tb(k, gc, beta, cu_seqlens, chunk_batch: int = 256) -> torch.Tensor:
    """float64 ``Tb = (I + A)^-1 diag(beta)``, ``A = tril(beta K K^T exp(gc_i - gc_j),
    -1)``, by a triangular solve per chunk and value head (``[T, HV, 64]`` f64)."""
    T, HQ, K = k.shape
    HV = gc.shape[1]
    G = HV // HQ
    cu = cu_seqlens.to(torch.int64).tolist()
    starts = [(s, min(s + BT, e)) for a, e in zip(cu[:-1], cu[1:]) for s in range(a, e, BT)]
    out = torch.zeros(T, HV, BT, dtype=torch.float64, device=k.device)
    eye = torch.eye(BT, dtype=torch.float64, device=k.device)
    o = torch.arange(BT, device=k.device)
    for c0 in range(0, len(starts), chunk_batch):
        part = starts[c0:c0 + chunk_batch]
        rows = torch.tensor([[min(s + i, e - 1) for i in range(BT)] for s, e in part],
                            device=k.device)
        real = torch.tensor([[s + i < e for i in range(BT)] for s, e in part],
                            device=k.device)
        kc = k[rows].double().repeat_interleave(G, dim=2) * real[:, :, None, None]
        gcc = gc[rows].double() * real[:, :, None]           # [C, 64, HV]
        bc = beta[rows].double() * real[:, :, None]
        kk = torch.einsum("cihd,cjhd->chij", kc, kc)
        dec = torch.exp(torch.clamp(gcc.transpose(1, 2)[:, :, :, None]
                                    - gcc.transpose(1, 2)[:, :, None, :], max=0.0))
        A = torch.where(o[:, None] > o[None, :], kk * dec * bc.transpose(1, 2)[:, :, :, None],
                        0.0)
        tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A).contiguous(),
                                           upper=False, unitriangular=True)
        tb = tm * bc.transpose(1, 2)[:, :, None, :]          # [C, HV, 64, 64]
        for ci, (s, e) in enumerate(part):
            out[s:e] = tb[ci, :, :e - s, :].transpose(0, 1)
    return out


def product_intra(inp: dict, plan_intra: dict = None, log_bound: bool = False):
    """The product's intra-chunk kernel on ``inp`` (raw gates, as the long path launches it):
    ``(Tb, gc, launch)`` with ``launch`` a zero-argument callable of the same launch."""
    from kernels.prefill.intra_chunk import intra_chunk_fwd

    k, q, v, cu = inp["k"], inp["q"], inp["v"], inp["cu_seqlens"]
    T, HV = inp["b"].shape
    lb = (torch.empty(num_slots(T, cu.numel() - 1), HV, dtype=torch.float32, device=k.device)
          if log_bound else None)
    tb, gc, _, go = intra_chunk_fwd(k, v, cu, q, a=inp["a"], b=inp["b"], A_log=inp["A_log"],
                                    dt_bias=inp["dt_bias"], scale=inp["scale"] or 1.0,
                                    defer=True, log_bound=lb, **(plan_intra or {}))
    go()
    return tb, gc, go


def copy_reference(k, beta, cu_seqlens) -> torch.Tensor:
    """What the ``copy`` variants store (f32): ``(I + tril(beta K K^T, -1)) diag(beta)`` on
    the blocks on and below the diagonal, 0 above them."""
    T, HQ, _ = k.shape
    HV = beta.shape[1]
    idx, _ = _chunk_tokens(cu_seqlens, T)       # (4,096 tokens at a time below: memory)
    t = torch.arange(T, device=k.device)
    row = t - idx[:, 0]                                         # i of each token
    col = torch.arange(BT, device=k.device)
    # column j is a token of the chunk iff t0 + j < the sequence's end: rows of the same
    # chunk have consecutive tokens, so that is t0 + j <= the chunk's last token
    last = torch.zeros(T, dtype=torch.int64, device=k.device)
    last.scatter_reduce_(0, idx[:, 0], t, reduce="amax")
    inside = (idx[:, :1] + col[None, :]) <= last[idx[:, 0]][:, None]
    kf = k.float()
    kk = torch.cat([torch.einsum("thd,tjhd->thj", kf[s:s + 4096], kf[idx[s:s + 4096]])
                    for s in range(0, T, 4096)]).repeat_interleave(HV // HQ, dim=1)
    strict = (col[None, :] < row[:, None]) & inside
    a = (torch.where(strict[:, None, :], kk * beta[:, :, None], 0.0)
         + (col[None, :] == row[:, None]).float()[:, None, :])
    blocks = (row[:, None] // BC >= col[None, :] // BC) & inside
    bcol = beta[idx].transpose(1, 2)                            # beta of column j
    return torch.where(blocks[:, None, :], a * bcol, 0.0)


def stream_reference(k, beta, cu_seqlens, upper: bool = True) -> torch.Tensor:
    """What the ``stream`` variants store (f32): ``(k[t, 2c] + k[t, 2c + 1]) beta_t`` of value
    head ``h`` (q/k head ``h // G``); without ``upper`` 0 above the diagonal blocks."""
    T, HQ, K = k.shape
    HV = beta.shape[1]
    kf = k.float()
    x = (kf[..., 0::2] + kf[..., 1::2]).repeat_interleave(HV // HQ, dim=1)   # [T, HV, 64]
    x = x * beta[:, :, None]
    if not upper:
        row = torch.arange(T, device=k.device) - _chunk_tokens(cu_seqlens, T)[0][:, 0]
        low = (row[:, None] // BC >= torch.arange(BT, device=k.device)[None, :] // BC)
        x = torch.where(low[:, None, :], x, 0.0)
    return x


def _errors(x: torch.Tensor, ref: torch.Tensor) -> tuple:
    """``(max |x - ref|, max |x - ref| / (|ref| + 0.01))``: the second sees a relative error
    in the small entries (most of the off-diagonal ones) that the first, set by bf16's step
    at the largest entry, does not."""
    d = (x.double() - ref).abs()
    return d.max().item(), (d / (ref.abs() + 0.01)).max().item()


def gate_row(name, ab, gc, cu, ref, tb_prod) -> dict:
    """The gate of one solve variant's ``Ab``: its ``Tb`` against the float64 ``ref``, both
    errors (:func:`_errors`) within :data:`GATE_FACTOR` x the product's ``Tb``'s, plus
    :data:`GATE_ATOL`."""
    finite = bool(torch.isfinite(ab).all())
    tb = gated_from_light(ab, gc, cu)
    e_abs, e_rel = _errors(tb, ref) if finite else (float("inf"), float("inf"))
    p_abs, p_rel = _errors(tb_prod, ref)
    return dict(kind="gate", variant=name, max_abs_ab=ab.float().abs().max().item(),
                err_vs_f64=e_abs, rel_err_vs_f64=e_rel, prod_err_vs_f64=p_abs,
                prod_rel_err_vs_f64=p_rel,
                max_abs_vs_prod=(tb - tb_prod.float()).abs().max().item(),
                ok=finite and e_abs <= GATE_FACTOR * p_abs + GATE_ATOL
                and e_rel <= GATE_FACTOR * p_rel + GATE_ATOL)


def gate(inp: dict, variants, tb_prod, gc) -> list:
    """Each variant's ``Ab``: a solve variant by :func:`gate_row`; a copy variant against
    :func:`copy_reference` within one bf16 step (2^-7 relative + 1e-3)."""
    k, b, cu = inp["k"], inp["b"], inp["cu_seqlens"]
    beta = torch.sigmoid(b.float())
    ref = reference_tb(k, gc, beta, cu)
    rows = []
    for name in variants:
        try:
            ab = light_solve(k, b, cu, name)
        except Exception as e:   # a compile or launch error: reported, the others go on
            rows.append(dict(kind="gate", variant=name, ok=False,
                             error=f"{type(e).__name__}: {e}"[:300]))
            continue
        if VARIANTS[name][2]:
            rows.append(gate_row(name, ab, gc, cu, ref, tb_prod))
            continue
        if len(VARIANTS[name]) > 5 and VARIANTS[name][5]["mode"] == "stream":
            cref = stream_reference(k, beta, cu, VARIANTS[name][3])
        else:
            cref = copy_reference(k, beta, cu)
        excess = ((ab.float() - cref).abs() - (2.0 ** -7 * cref.abs() + 1e-3)).max().item()
        rows.append(dict(kind="gate", variant=name, max_abs_ab=ab.float().abs().max().item(),
                         err_vs_copy_ref=(ab.float() - cref).abs().max().item(),
                         ok=bool(torch.isfinite(ab).all()) and excess <= 0))
    return rows


def _print_gate(rows, label):
    for r in rows:
        if "error" in r:
            print(f"{label:>16} {r['variant']:>14}  ERROR {r['error']}", flush=True)
            continue
        if "err_vs_f64" in r:
            what = (f"err vs f64 {r['err_vs_f64']:.3g} / rel {r['rel_err_vs_f64']:.3g} (product "
                    f"{r['prod_err_vs_f64']:.3g} / {r['prod_rel_err_vs_f64']:.3g})  vs product"
                    f" Tb {r['max_abs_vs_prod']:.3g}")
        else:
            what = f"copy: err vs its reference {r['err_vs_copy_ref']:.3g}"
        print(f"{label:>16} {r['variant']:>14}  {what}  max|Ab| {r['max_abs_ab']:.3g}  "
              f"{'ok' if r['ok'] else 'FAIL'}", flush=True)


# --------------------------------------------------------------------------- modes


def _needs_k2bt(name) -> bool:
    """``stream`` variants need ``K = 2 BT`` (128)."""
    return len(VARIANTS[name]) > 5 and VARIANTS[name][5]["mode"] == "stream"


def check_cpu(variants=None) -> int:
    """Interpreter gate at small shapes; exit status 1 if any variant fails. Round-2
    variants also against the first round's (the same per-head code): a solve variant's
    ``Ab`` equal to ``vh_w4``'s (``noupper``: on the blocks it writes; nothing else
    written), a copy variant's to ``copy_w4``'s."""
    from kernels.spec import GDNShape, make_prefill_inputs

    variants = list(VARIANTS) if variants is None else list(variants)
    bad = 0
    for hq, hv, d in ((1, 2, 32), (2, 4, 128)):
        inp = make_prefill_inputs([64, 100, 37], GDNShape(hq, hv, d), seed=1)
        tb, gc, _ = product_intra(inp)
        vs = [v for v in variants if d == 2 * BT or not _needs_k2bt(v)]
        rows = gate(inp, vs, tb, gc)
        _print_gate(rows, f"HQ{hq} HV{hv} D{d}")
        bad += sum(not r["ok"] for r in rows)
        k, b, cu = inp["k"], inp["b"], inp["cu_seqlens"]
        T = k.shape[0]
        row = torch.arange(T) - _chunk_tokens(cu, T)[0][:, 0]          # i of each token
        low = (row[:, None] // BC >= torch.arange(BT)[None, :] // BC)[:, None, :]
        low = low.expand(T, hv, BT)
        for v in vs:
            if len(VARIANTS[v]) < 6 or VARIANTS[v][5]["mode"] == "stream":
                continue
            ref = light_solve(k, b, cu, "vh_w4" if VARIANTS[v][2] else "copy_w4")
            junk = torch.full((T, hv, BT), 7.0, dtype=torch.bfloat16)
            got = light_solve(k, b, cu, v, out=junk)
            if VARIANTS[v][3]:
                same = torch.equal(got, ref)
            else:
                same = torch.equal(got[low], ref[low]) and bool((got[~low] == 7).all())
            print(f"{'':>16} {v:>14}  equals the first round's (bitwise, written blocks "
                  f"only): {same}  programs {LAST_LAUNCH[v]['programs']}", flush=True)
            bad += not same
        if "vh_w4" not in variants:
            continue
        # negative control: 1 % off in one off-diagonal block must fail the gate
        k, b, cu = inp["k"], inp["b"], inp["cu_seqlens"]
        ab = light_solve(k, b, cu, "vh_w4")
        ab[16:32, :, :16] *= 1.01
        ref = reference_tb(k, gc, torch.sigmoid(b.float()), cu)
        neg = gate_row("vh_w4 x1.01", ab, gc, cu, ref, tb)
        _print_gate([neg], "control")
        bad += neg["ok"]
        # noupper writes the blocks on and below the diagonal (those of vh_w4) and no other
        k, b, cu = inp["k"], inp["b"], inp["cu_seqlens"]
        T = k.shape[0]
        row = torch.arange(T) - _chunk_tokens(cu, T)[0][:, 0]          # i of each token
        written = (row[:, None] // BC >= torch.arange(BT)[None, :] // BC)[:, None, :]
        written = written.expand(T, hv, BT)
        junk = torch.full((T, hv, BT), 7.0, dtype=torch.bfloat16)
        part = light_solve(k, b, cu, "vh_w4_noupper", out=junk)
        full = light_solve(k, b, cu, "vh_w4")
        same = torch.equal(part[written], full[written]) and bool((part[~written] == 7).all())
        print(f"{'':>16} noupper writes exactly the blocks on and below the diagonal: {same}",
              flush=True)
        bad += not same
    bad += sum(not r["ok"] for r in hard_gates([200], variants, "cpu"))
    return 1 if bad else 0


def compile_sm90(variants=None) -> int:
    """Record each variant's launch at the contest shape on the interpreter and compile it
    for sm_90 (:mod:`kernels.bench.sm90`): registers, stack (spills), shared memory and
    programs per SM. Exit status 1 if any fails to compile."""
    from kernels.bench.sm90 import compile_resources, record_launches
    from kernels.spec import make_prefill_inputs

    inp = make_prefill_inputs([70])
    launches = []
    for name in (list(VARIANTS) if variants is None else variants):
        ln = record_launches(lambda: light_solve(inp["k"], inp["b"], inp["cu_seqlens"], name))
        launches += [dict(x, name_variant=name) for x in ln]
    df = compile_resources([{k: v for k, v in x.items() if k != "name_variant"}
                            for x in launches])
    df.insert(0, "variant", [x["name_variant"] for x in launches])
    print(df.drop(columns=["grid", "programs", "waves"]).to_string(index=False), flush=True)
    return 1 if (df["error"].astype(str) != "").any() else 0


#: token lengths the GPU mode gates and times
GPU_SHAPES = ([32768], [131072], [8192] * 4)
#: hard inputs (:func:`kernels.stress_inputs.make_prefill_stress_inputs`), gated only: nearly
#: parallel keys with slow decay (per token > 0.999: the solve's hard case, gated or not) and
#: with fast decay (``a = 4``: per token 0.001 to 0.82 by head, a chunk's log decay down to
#: about -435 at seed 2): the gated system is easy there, the gate-free one as hard as with
#: slow decay, its entries scaled back by factors that underflow f32 far below the diagonal
HARD = {"hard slow decay": {}, "hard fast decay": {"decay_logit": 4.0}}
#: their lengths in the GPU mode (one sequence ending mid-chunk)
HARD_LENS = [4133]


def hard_gates(lens, variants, device, label_width: int = 16) -> list:
    """The :data:`HARD` inputs at ``lens``, every solve variant gated (reported)."""
    from kernels.stress_inputs import make_prefill_stress_inputs

    rows = []
    for name, kw in HARD.items():
        inp = make_prefill_stress_inputs(lens, seed=2, device=device, with_state=False, **kw)
        tb, gc, _ = product_intra(inp)
        g = gate(inp, [v for v in variants if VARIANTS[v][2]], tb, gc)
        _print_gate(g, name)
        rows += [dict(r, lens="+".join(map(str, lens)), inputs=name) for r in g]
    return rows


def run_gpu(out_path: str, variants, rep: int = 50, device: str = "cuda", shapes=GPU_SHAPES,
            method: str = "graph") -> int:
    """Gate every variant against the product's intra kernel, time the ones that pass and
    the product's kernel (``method``), print the table, write ``out_path`` (jsonl).
    ``device``, ``shapes``, ``method``: a CPU smoke run of this function (interpreter,
    small shapes, ``"cpu_wall"``) before the GPU call."""
    from kernels.bench.roofline import copy_bandwidth
    from kernels.bench.timing import time_fn
    from kernels.prefill.plan import prefill_plan
    from kernels.spec import CONTEST, lens_label, make_prefill_inputs

    dev = torch.device(device)
    t_start = time.time()
    bw = copy_bandwidth(dev)
    meta = dict(gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                triton=triton.__version__, torch=torch.__version__,
                sha=os.environ.get("GDN_GIT_SHA", ""), copy_GBps=bw / 1e9)
    sink = open(out_path, "w")
    n_rows = 0

    def emit(new_rows):   # each row written at once: a run cut short keeps what it measured
        nonlocal n_rows
        for r in new_rows:
            sink.write(json.dumps(dict(r, **meta)) + "\n")
            n_rows += 1
        sink.flush()

    print(f"{meta['gpu']}  copy bandwidth {bw / 1e9:.0f} GB/s  triton {triton.__version__}",
          flush=True)
    emit(hard_gates(HARD_LENS, variants, dev))
    for lens in shapes:
        inp = make_prefill_inputs(lens, CONTEST, seed=0, device=dev, with_state=False)
        label = lens_label(lens)
        T, HV = inp["b"].shape
        N = len(lens)
        plan = prefill_plan(T, N, HV, CONTEST.head_dim, dev)
        tb, gc, go_prod = product_intra(inp, plan.intra, log_bound=bool(plan.seg_chunks))
        g_rows = gate(inp, variants, tb, gc)
        _print_gate(g_rows, label)
        emit([dict(r, T=T, lens=label) for r in g_rows])
        del tb
        # a fresh launch per call: ``go_prod`` holds the stream it was bound on, so a graph
        # capture of it records nothing (the first H100 run timed 0.0 µs at 131k)
        prod = time_fn(lambda: product_intra(inp, plan.intra,
                                             log_bound=bool(plan.seg_chunks)),
                       method, rep=rep, warmup=3).median_us
        emit([dict(kind="time", variant="product_intra", T=T, lens=label, us=prod)])
        k, b, cu = inp["k"], inp["b"], inp["cu_seqlens"]
        nbytes = {v: k.numel() * 2 + b.numel() * 2
                  + T * HV * BT * 2 * (1.0 if VARIANTS[v][3] else 10 / 16) for v in variants}
        print(f"{'variant':>16} {'T':>8} {'µs':>9} {'GB/s':>7} {'/ product':>9}", flush=True)
        print(f"{'product_intra':>16} {label:>8} {prod:9.1f} {'':>7} {1.0:9.3f}", flush=True)
        for r in g_rows:
            v = r["variant"]
            if not r["ok"]:
                print(f"{v:>16} {label:>8}   gate failed: not timed", flush=True)
                continue
            buf = torch.zeros(T, HV, BT, dtype=torch.bfloat16, device=dev)
            us = time_fn(lambda: light_solve(k, b, cu, v, out=buf), method, rep=rep,
                         warmup=3).median_us
            gbps = nbytes[v] / us / 1e3
            emit([dict(kind="time", variant=v, T=T, lens=label, us=us, bytes=nbytes[v],
                       GBps=gbps, roof_frac=gbps * 1e9 / bw, ratio_to_product=us / prod,
                       **LAST_LAUNCH.get(v, {}))])
            print(f"{v:>16} {label:>8} {us:9.1f} {gbps:7.0f} {us / prod:9.3f}", flush=True)
        del inp, gc
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    sink.close()
    print(f"wrote {out_path} ({n_rows} rows) in {time.time() - t_start:.0f} s", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="CPU interpreter gate")
    mode.add_argument("--compile", action="store_true", help="sm_90 compile (CPU)")
    mode.add_argument("--gpu", action="store_true", help="gate and time on the GPU")
    ap.add_argument("--out", default="light_solve.jsonl", help="jsonl of --gpu")
    ap.add_argument("--variants", default=None,
                    help="comma-separated subset of " + ", ".join(VARIANTS) + " (default: "
                    "all for --check / --compile, GPU_VARIANTS for --gpu)")
    ap.add_argument("--shapes", default=None,
                    help="--gpu: token lengths, ';' between shapes, '+' within one (default "
                    "32768;131072;8192+8192+8192+8192)")
    args = ap.parse_args(argv)
    if args.variants is None:
        variants = list(GPU_VARIANTS if args.gpu else VARIANTS)
    else:
        variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if args.check:
        return check_cpu(variants)
    if args.compile:
        return compile_sm90(variants)
    shapes = GPU_SHAPES if args.shapes is None else tuple(
        [int(x) for x in sh.split("+")] for sh in args.shapes.split(";") if sh)
    return run_gpu(args.out, variants, shapes=shapes)


if __name__ == "__main__":
    # through the package name, so that the kernel's module is importable by name
    # (the sm_90 compile imports it in a subprocess)
    from probes import light_solve as _mod

    sys.exit(_mod.main())
