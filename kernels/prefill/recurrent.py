"""Token-recurrent prefill: one launch, each state tile read once and written once.

Per (sequence, value head) the state is walked token by token in registers, like a decode
step repeated: the rows of ``S`` are updated with the decode kernel's own step
(:func:`kernels.decode.kernel.update_tile`, gates by :func:`kernels.decode.kernel.token_gates`)
for every token of the sequence, the output of each token stored as it is formed, and the
final state stored once. No chunking: no intra-chunk solve, no intermediates, no second
launch, so a short prompt costs one launch plus ``L`` serial token steps (``L`` the
longest sequence) where the chunked path (:mod:`.pipeline`) pays for at least one 64-token
chunk and its solve. The step is ``O(D^2)`` CUDA-core work per token and head (no tensor
cores), so past a few dozen tokens the chunked path wins; :func:`.config.recurrent_rule`
picks between them (the crossover is measured in notebook 02).

Grid: one program per ``BV`` state rows of one (sequence, value head), ``N * HV * D / BV``
programs; ``BV``, the row layout ``BK`` and ``num_warps`` come from the decode dispatch
table for ``N`` sequences (:func:`kernels.decode.table.config_for_device`: the same state
tiles and programs per SM as a decode call of batch ``N``). Each program loads the inputs
of token ``t + 2`` before it updates its rows with token ``t`` (two steps, ~1 us by the
decode kernel's per-token time, cover a DRAM miss). Varlen through ``cu_seqlens`` (:func:`.chunk_index.seq_bounds`: in bounds for
any values), the initial state optional; unchecked ``cu_seqlens`` are checked by every
program before it walks (:mod:`.guard`: NaN outputs and status bits, no sync, no extra
launch). CUDA-graph capturable: no host sync, no allocation but the outputs.
"""
from __future__ import annotations

from .. import interpret

interpret.install()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..decode.kernel import token_gates, update_tile  # noqa: E402
from ..decode.table import config_for_device  # noqa: E402
from ..launch import FastLaunch  # noqa: E402
from .chunk_index import cu_status, seq_bounds  # noqa: E402
from .guard import guard_outputs  # noqa: E402

__all__ = ["recurrent_prefill_kernel", "recurrent_fwd", "recurrent_tile"]


@triton.jit
def _token_inputs(q, k, v, a, b, t, eos, i_hq, i_hv, o_qk, o_v, HQ: tl.constexpr,
                  HV: tl.constexpr, D: tl.constexpr):
    """Token ``t``'s ``q``, ``k`` (``[NC, BK]``), ``v`` (this program's ``[BV]``), ``a``,
    ``b`` as stored (bf16); zeros past ``eos`` (nothing read there)."""
    m = t < eos
    p_qk = (t * HQ + i_hq) * D + o_qk
    p_g = t * HV + i_hv
    return (tl.load(q + p_qk, mask=m, other=0.0), tl.load(k + p_qk, mask=m, other=0.0),
            tl.load(v + p_g * D + o_v, mask=m, other=0.0), tl.load(a + p_g, mask=m, other=0.0),
            tl.load(b + p_g, mask=m, other=0.0))


@triton.jit(do_not_specialize=["T", "N"])
def recurrent_prefill_kernel(
    q,              # [T, HQ, D] bf16
    k,              # [T, HQ, D] bf16
    v,              # [T, HV, D] bf16
    h0,             # [N, HV, D(v), D(k)] f32 initial state, k-last (read only if HAS_H0)
    ht,             # [N, HV, D(v), D(k)] f32 out: final state
    o,              # [T, HV, D] bf16 out
    A_log,          # [HV] f32
    a,              # [T, HV] bf16 raw decay gate input
    dt_bias,        # [HV] f32
    b,              # [T, HV] bf16 raw beta gate input
    cu_seqlens,     # [N+1] int32/int64
    status,         # [1] int32 out: the guard's bits (GUARD and HAS_STATUS) or None
    scale,          # f32 output scale
    T,              # total tokens (not specialised)
    N,              # sequences (not specialised)
    HQ: tl.constexpr,
    HV: tl.constexpr,
    D: tl.constexpr,
    BV: tl.constexpr,               # state rows per program
    BK: tl.constexpr,               # K chunk width of the row layout (divides D)
    HAS_H0: tl.constexpr,
    GUARD: tl.constexpr,            # NaN outputs if cu_seqlens is invalid (.guard)
    HAS_STATUS: tl.constexpr,       # GUARD: store the status bits into status
):
    NV: tl.constexpr = D // BV
    NC: tl.constexpr = D // BK
    i_p = tl.program_id(0)
    i_v, i_nh = i_p % NV, i_p // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_hq = i_hv // (HV // HQ)
    if GUARD:
        if guard_outputs(cu_status(cu_seqlens, N, T, 128), o, ht, status, T, N, i_p,
                         tl.num_programs(0), HV, D, D, HAS_STATUS, False) != 0:
            return
    bos, eos = seq_bounds(cu_seqlens, i_n, T)

    # rows [i_v * BV, (i_v + 1) * BV) of S^T held as [NC, BV, BK] (the decode kernel's layout)
    o_c = tl.arange(0, NC)
    o_kc = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_r = o_c[:, None, None] * BK + o_v[None, :, None] * D + o_kc[None, None, :]
    p_h = (i_n.to(tl.int64) * HV + i_hv) * (D * D) + o_r
    if HAS_H0:
        b_h = tl.load(h0 + p_h).to(tl.float32)
    else:
        b_h = tl.zeros([NC, BV, BK], dtype=tl.float32)
    b_A = -tl.exp(tl.load(A_log + i_hv))
    b_dt = tl.load(dt_bias + i_hv)
    o_qk = o_c[:, None] * BK + o_kc[None, :]                        # [NC, BK]

    # tokens t and t + 1 are in registers (or in flight) when step t starts; t + 2 is
    # loaded before it: two steps (~1 us) cover a DRAM miss
    b_q, b_k, b_v, b_a, b_b = _token_inputs(q, k, v, a, b, bos, eos, i_hq, i_hv, o_qk, o_v,
                                            HQ, HV, D)
    n_q, n_k, n_v, n_a, n_b = _token_inputs(q, k, v, a, b, bos + 1, eos, i_hq, i_hv, o_qk,
                                            o_v, HQ, HV, D)
    for t in range(bos, eos):
        f_q, f_k, f_v, f_a, f_b = _token_inputs(q, k, v, a, b, t + 2, eos, i_hq, i_hv, o_qk,
                                                o_v, HQ, HV, D)
        b_decay, b_beta = token_gates(b_a, b_b, b_A, b_dt)
        b_h, b_o = update_tile(b_h, b_k.to(tl.float32)[:, None, :],
                               (b_q.to(tl.float32) * scale)[:, None, :], b_v.to(tl.float32),
                               b_decay, b_beta)
        tl.store(o + (t * HV + i_hv) * D + o_v, b_o.to(o.dtype.element_ty))
        b_q, b_k, b_v, b_a, b_b = n_q, n_k, n_v, n_a, n_b
        n_q, n_k, n_v, n_a, n_b = f_q, f_k, f_v, f_a, f_b
    tl.store(ht + p_h, b_h)


_LAUNCH = FastLaunch(recurrent_prefill_kernel)


def recurrent_tile(N: int, D: int, device):
    """``(BV, BK, num_warps)`` of the recurrent kernel for ``N`` sequences: the decode
    dispatch table's config for batch ``N`` on ``device``, fitted to ``D``."""
    cfg = config_for_device(max(N, 1), device).fit(D)
    return cfg.BV, cfg.block_k(D), cfg.num_warps


def recurrent_fwd(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, o, ht,
                  guard: bool = False, status=None) -> None:
    """Launch :func:`recurrent_prefill_kernel` on validated inputs and allocated outputs
    (``o [T, HV, D]`` bf16, ``ht [N, HV, D, D]`` f32). ``guard``: check ``cu_seqlens`` on the
    device (:mod:`.guard`; ``status``: `[1]` int32 for its bits)."""
    T, HQ, D = q.shape
    HV = v.shape[1]
    N = cu_seqlens.numel() - 1
    BV, BK, warps = recurrent_tile(N, D, q.device)
    grid = (N * HV * (D // BV),)
    args = (q, k, v, state, ht, o, A_log, a, dt_bias, b, cu_seqlens, status, float(scale),
            T, N)
    kw = dict(HQ=HQ, HV=HV, D=D, BV=BV, BK=BK, HAS_H0=state is not None, GUARD=guard,
              HAS_STATUS=guard and status is not None, num_warps=warps, num_stages=1)
    _LAUNCH[grid](*args, **kw)
