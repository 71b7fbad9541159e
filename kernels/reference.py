"""Float32 PyTorch reference of the GDN decode and prefill (docs/design.md, "The computation").

Per sequence and value head ``h``, with ``S = state[h].T`` of shape ``[K, V]``::

    decay = exp(-exp(A_log[h]) * softplus(a_t[h] + dt_bias[h]))
    beta  = sigmoid(b_t[h])
    S     = decay * S
    S     = S + beta * k_t^T (v_t - k_t S)
    o_t   = scale * q_t S

This is the spec: every implementation is checked against it. It runs on any
device (a token loop, vectorised over heads); it is slow by design.
:func:`prefill_reference_chunked` computes the same in the chunked form (float32, TF32
off) for lengths where the token loop is too slow (notebook 04, up to 131,072 tokens).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .spec import resolve_scale, validate_decode_inputs, validate_prefill_inputs

__all__ = ["gates_reference", "decode_reference", "decode_steps_reference", "prefill_reference",
           "prefill_reference_chunked", "replay_decode_reference", "replay_state_reference"]


def gates_reference(A_log, a, dt_bias, b) -> Tuple[torch.Tensor, torch.Tensor]:
    """Decay and beta in float32 from the raw gate inputs.

    Args:
        A_log: `[HV]` f32.  a, b: `[..., HV]` bf16.  dt_bias: `[HV]` f32.
    Returns:
        ``(decay, beta)``, each `[..., HV]` f32; ``decay`` in (0, 1).
    """
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return torch.exp(g), torch.sigmoid(b.float())


def _run_tokens(S, q, k, v, decay, beta, scale, group, record=None):
    """Walk tokens of one sequence. S `[HV,K,V]` f32 (updated, returned), q/k `[L,HQ,D]`,
    v `[L,HV,D]`, decay/beta `[L,HV]`. Returns (o `[L,HV,D]` f32, S); with ``record``
    (a dict ``{step: None}``, steps counted from 1) also fills ``record[step] = S``
    after that token."""
    q = q.float().repeat_interleave(group, dim=1)
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float()
    outs = []
    for t in range(q.shape[0]):
        S = S * decay[t][:, None, None]
        pred = torch.einsum("hk,hkv->hv", k[t], S)
        S = S + beta[t][:, None, None] * k[t][:, :, None] * (v[t] - pred)[:, None, :]
        outs.append(scale * torch.einsum("hk,hkv->hv", q[t], S))
        if record is not None and t + 1 in record:
            record[t + 1] = S
    o = torch.stack(outs) if outs else v.new_zeros(0, *v.shape[1:])
    return o, S


def decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale: Optional[float] = None,
                     state_indices: Optional[torch.Tensor] = None, *,
                     intermediate_states: bool = False):
    """One decode call for a batch of sequences of ``T`` tokens each.

    Args:
        q, k: `[B,T,HQ,D]` bf16.  v: `[B,T,HV,D]` bf16.
        state: `[B,HV,D,D]` f32 or bf16, k-last (element (k, v) at ``state[b,h,v,k]``),
            or a pool `[P,HV,D,D]` read at ``state_indices``; untouched.
        A_log, dt_bias: `[HV]` f32.  a, b: `[B,T,HV]` bf16.
        scale: float; None or 0 means ``1/sqrt(D)``.
        state_indices: `[B]` int32/int64 pool slot per sequence (checked: below
            ``P``, no slot twice); a negative slot is padding: output zeros, no
            state read or written.
        intermediate_states: also return the state after every token.
    Returns:
        ``(output [B,T,HV,D] bf16, new_state)`` where ``new_state`` is the updated
        copy of ``state`` (same shape and dtype: computed in f32, rounded once at
        the end); with ``intermediate_states`` a third `[B,T,HV,D,D]` tensor in the
        state's dtype (zeros for padding sequences).
    """
    shape = validate_decode_inputs(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices)
    scale = resolve_scale(scale, shape.head_dim)
    B, T = q.shape[0], q.shape[1]
    hv, d = shape.num_v_heads, shape.head_dim
    decay, beta = gates_reference(A_log, a, dt_bias, b)  # [B,T,HV]
    slots = (list(range(B)) if state_indices is None
             else state_indices.to("cpu", torch.int64).tolist())
    new_state = state.clone()
    out = torch.zeros(B, T, hv, d, dtype=torch.float32, device=q.device)
    inter = (torch.zeros(B, T, hv, d, d, dtype=state.dtype, device=q.device)
             if intermediate_states else None)
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        S = state[slot].float().transpose(-1, -2)
        record = dict.fromkeys(range(1, T + 1)) if intermediate_states else None
        o, S = _run_tokens(S, q[i], k[i], v[i], decay[i], beta[i], scale, shape.group, record)
        out[i] = o
        new_state[slot] = S.transpose(-1, -2).to(state.dtype)
        if intermediate_states:
            for t in range(T):
                inter[i, t] = record[t + 1].transpose(-1, -2).to(state.dtype)
    out = out.to(torch.bfloat16)
    return (out, new_state, inter) if intermediate_states else (out, new_state)


def decode_steps_reference(q, k, v, state, A_log, a, dt_bias, b, scale: Optional[float] = None,
                           *, record_steps=()):
    """``N`` consecutive single-token decode steps in float32, nothing rounded.

    The drift yardstick: step ``t`` uses ``q[:, t]``, ``k[:, t]``, ... and the
    state left by step ``t-1``; the state stays f32 throughout (a bf16 ``state``
    input is widened once) and the outputs are not rounded to bf16.

    Args:
        q, k: `[B,N,HQ,D]` bf16.  v: `[B,N,HV,D]` bf16.  a, b: `[B,N,HV]` bf16.
        state: `[B,HV,D,D]` f32 or bf16 (untouched).  A_log, dt_bias: `[HV]` f32.
        record_steps: steps (1..N) after which to keep the state.
    Returns:
        ``(output [B,N,HV,D] f32, new_state [B,HV,D,D] f32, {step: state [B,HV,D,D] f32})``.
    """
    shape = validate_decode_inputs(q, k, v, state, A_log, a, dt_bias, b, scale)
    scale = resolve_scale(scale, shape.head_dim)
    N = q.shape[1]
    steps = sorted({int(s) for s in record_steps})
    if any(s < 1 or s > N for s in steps):
        raise ValueError(f"record_steps must lie in 1..N={N}, got {steps}")
    decay, beta = gates_reference(A_log, a, dt_bias, b)
    outs, finals = [], []
    recorded = {s: [] for s in steps}
    for i in range(q.shape[0]):
        record = dict.fromkeys(steps)
        o, S = _run_tokens(state[i].float().transpose(-1, -2), q[i], k[i], v[i], decay[i],
                           beta[i], scale, shape.group, record)
        outs.append(o)
        finals.append(S.transpose(-1, -2))
        for s in steps:
            recorded[s].append(record[s].transpose(-1, -2))
    return (torch.stack(outs), torch.stack(finals).contiguous(),
            {s: torch.stack(x).contiguous() for s, x in recorded.items()})


def _fold_rings(S, ring, rows, start, n, group: int):
    """Step ``S`` `[M, HV, K, V]` f32 (the states of ring rows ``rows`` `[M]`) through each
    row's ``n`` entries from ``start`` (`[M]` tensors on ``S``'s device):
    ``S = exp(g_i) S + k_i^T u_i``, the recurrence with the residual stored."""
    C = ring.k.shape[1]
    for i in range(int(n.max()) if len(n) else 0):
        pos = (start + i) % C
        kf = ring.k[rows, pos].float().repeat_interleave(group, dim=1)          # [M, HV, K]
        step = (torch.exp(ring.g[rows, pos])[..., None, None] * S
                + kf[..., :, None] * ring.u[rows, pos][..., None, :])
        S = torch.where((i < n)[:, None, None, None], step, S)
    return S


def _ring_rows(state, ring, state_indices, B: int):
    """(sequence indices, their ring/state rows, start, n) of the live sequences, as int64
    tensors on the state's device."""
    dev = state.device
    rows = (torch.arange(B, device=dev) if state_indices is None
            else state_indices.to(dev, torch.int64))
    seq = (rows >= 0).nonzero().flatten()
    rows = rows[seq]
    head = ring.head.to(torch.int64)[rows]
    return seq, rows, head[:, 0], head[:, 1]


def replay_state_reference(state, ring, state_indices: Optional[torch.Tensor] = None):
    """The state "now" of each sequence of a replay decode (:mod:`kernels.decode.replay`):
    its checkpoint stepped through its ring's live entries, in float32.

    Args:
        state: the checkpoints, `[B,HV,D,D]` or a pool `[P,HV,D,D]`, f32 or bf16, k-last.
        ring: a ``kernels.decode.replay.ReplayRing`` over the same rows.
        state_indices: `[B]` pool slots (negative: padding, zeros returned).
    Returns:
        `[B,HV,D,D]` f32 k-last.
    """
    hv, d = state.shape[1], state.shape[2]
    B = state.shape[0] if state_indices is None else state_indices.shape[0]
    seq, rows, start, n = _ring_rows(state, ring, state_indices, B)
    out = torch.zeros(B, hv, d, d, dtype=torch.float32, device=state.device)
    S = _fold_rings(state[rows].float().transpose(-1, -2), ring, rows, start, n,
                    hv // ring.k.shape[2])
    out[seq] = S.transpose(-1, -2)
    return out


def replay_decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale: Optional[float] = None,
                            state_indices: Optional[torch.Tensor] = None, *, ring,
                            rollback: Optional[torch.Tensor] = None):
    """One replay decode call (:func:`kernels.decode.gdn_replay_decode`) in float32,
    stepping the recurrence (vectorised over the sequences).

    Per live sequence: drop ``rollback`` ring entries; step the checkpoint through the
    ring's ``n`` entries; if ``n + T > ring.L`` that state becomes the checkpoint
    (rounded to the state's dtype) and the ring restarts; then the ``T`` tokens take the
    standard step (:func:`decode_reference`'s math) and are appended to the ring as
    ``(k, g, u = beta (v - exp(g) k S))``.

    Args: as :func:`decode_reference`, plus ``ring`` (a ``ReplayRing``) and
        ``rollback`` (`[B]`, values checked: ``0 <= rollback <= n``).
    Returns:
        ``(output [B,T,HV,D] bf16, new_state, new_ring)``: copies; the inputs are untouched.
    """
    import dataclasses

    shape = validate_decode_inputs(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices)
    scale = resolve_scale(scale, shape.head_dim)
    B, T = q.shape[0], q.shape[1]
    hv, d, group = shape.num_v_heads, shape.head_dim, shape.group
    L, C = ring.L, ring.k.shape[1]
    nmax = C - ring.max_tokens       # max(L, max_tokens)
    g_all = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())   # [B,T,HV]
    beta_all = torch.sigmoid(b.float())
    new = dataclasses.replace(ring, k=ring.k.clone(), u=ring.u.clone(), g=ring.g.clone(),
                              head=ring.head.clone(), count=ring.count.clone())
    new_state = state.clone()
    out = torch.zeros(B, T, hv, d, dtype=torch.float32, device=q.device)
    seq, rows, start, n = _ring_rows(state, ring, state_indices, B)
    back = (torch.zeros_like(n) if rollback is None
            else rollback.to(n.device, torch.int64)[seq])
    bad = (start < 0) | (start >= C) | (n < 0) | (n > nmax) | (back < 0) | (back > n)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"ring.head / rollback of sequence {int(seq[i])}: start={int(start[i])}, "
                         f"n={int(n[i])}, rollback={int(back[i])} (need 0 <= start < {C}, "
                         f"0 <= rollback <= n <= max(L, max_tokens)={nmax})")
    n = n - back
    S = _fold_rings(state[rows].float().transpose(-1, -2), ring, rows, start, n, group)
    flush = n + T > L
    new_state[rows[flush]] = S[flush].transpose(-1, -2).to(state.dtype)
    base = torch.where(flush, (start + n) % C, start)
    n = torch.where(flush, torch.zeros_like(n), n)
    qf = q[seq].float().repeat_interleave(group, dim=2)                  # [M, T, HV, D]
    kf = k[seq].float().repeat_interleave(group, dim=2)
    for t in range(T):
        S = S * torch.exp(g_all[seq, t])[..., None, None]
        u = beta_all[seq, t][..., None] * (v[seq, t].float()
                                           - torch.einsum("mhk,mhkv->mhv", kf[:, t], S))
        S = S + kf[:, t][..., :, None] * u[..., None, :]
        out[seq, t] = scale * torch.einsum("mhk,mhkv->mhv", qf[:, t], S)
        pos = (base + n + t) % C
        new.k[rows, pos], new.u[rows, pos], new.g[rows, pos] = k[seq, t], u, g_all[seq, t]
    new.head[rows, 0] = base.to(torch.int32)
    new.head[rows, 1] = (n + T).to(torch.int32)
    return out.to(torch.bfloat16), new_state, new


def prefill_reference(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                      scale: Optional[float] = None):
    """Chunk-free prefill over packed variable-length sequences.

    Args:
        q, k: `[T,HQ,D]` bf16.  v: `[T,HV,D]` bf16.
        state: `[N,HV,D,D]` f32 k-last, or None (zeros); untouched.
        A_log, dt_bias: `[HV]` f32.  a, b: `[T,HV]` bf16.
        cu_seqlens: `[N+1]` int64/int32, ``cu_seqlens[-1] == T``; empty sequences allowed.
        scale: float; None or 0 means ``1/sqrt(D)``.
    Returns:
        ``(output [T,HV,D] bf16, new_state [N,HV,D,D] f32)``.
    """
    shape = validate_prefill_inputs(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
    scale = resolve_scale(scale, shape.head_dim)
    hv, d = shape.num_v_heads, shape.head_dim
    bounds = cu_seqlens.to("cpu", torch.int64).tolist()
    N = len(bounds) - 1
    decay, beta = gates_reference(A_log, a, dt_bias, b)  # [T,HV]
    out = torch.zeros(q.shape[0], hv, d, dtype=torch.float32, device=q.device)
    new_state = torch.empty(N, hv, d, d, dtype=torch.float32, device=q.device)
    for n in range(N):
        bos, eos = bounds[n], bounds[n + 1]
        S0 = (state[n].float() if state is not None
              else torch.zeros(hv, d, d, device=q.device)).transpose(-1, -2)
        o, S = _run_tokens(S0, q[bos:eos], k[bos:eos], v[bos:eos], decay[bos:eos],
                           beta[bos:eos], scale, shape.group)
        out[bos:eos] = o
        new_state[n] = S.transpose(-1, -2)
    return out.to(torch.bfloat16), new_state


def prefill_reference_chunked(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                              scale: Optional[float] = None, chunk: int = 64):
    """:func:`prefill_reference` in the chunked (WY) form, float32: fast enough on a GPU for
    131,072 tokens (the token loop takes one small launch per token and operation).

    Per sequence, chunks of ``chunk`` tokens, value head ``h``, ``G`` the in-chunk cumulative
    log decay, ``S`` `[K, V]` entering the chunk (same math, different rounding)::

        A = strict_lower(diag(beta) K K^T * exp(G_i - G_j));  T = (I + A)^-1
        V_new = T diag(beta) (V - diag(exp(G)) K S)
        O = scale (diag(exp(G)) Q S + lower(Q K^T * exp(G_i - G_j)) V_new)
        S = exp(G_last) S + (K * exp(G_last - G))^T V_new

    Every product runs in full float32 (TF32 off for the call); the intra-chunk part is
    batched over all chunks of a sequence, the state pass is a loop over its chunks. Same
    arguments and returns as :func:`prefill_reference`; tested against it and against a
    float64 chunked form (``tests/test_reference.py``).
    """
    shape = validate_prefill_inputs(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
    scale = resolve_scale(scale, shape.head_dim)
    hv, d, grp = shape.num_v_heads, shape.head_dim, shape.group
    bounds = cu_seqlens.to("cpu", torch.int64).tolist()
    N, C = len(bounds) - 1, int(chunk)
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())   # [T, HV]
    beta = torch.sigmoid(b.float())
    out = torch.zeros(q.shape[0], hv, d, dtype=torch.float32, device=q.device)
    new_state = torch.empty(N, hv, d, d, dtype=torch.float32, device=q.device)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for n in range(N):
            bos, eos = bounds[n], bounds[n + 1]
            S = (state[n].float() if state is not None
                 else torch.zeros(hv, d, d, device=q.device)).transpose(-1, -2).contiguous()
            L = eos - bos
            if L:
                o, S = _chunked_sequence(S, q[bos:eos], k[bos:eos], v[bos:eos], g[bos:eos],
                                         beta[bos:eos], scale, grp, C)
                out[bos:eos] = o
            new_state[n] = S.transpose(-1, -2)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return out.to(torch.bfloat16), new_state


def _chunked_sequence(S, q, k, v, g, beta, scale, group, C):
    """One sequence: S `[HV, K, V]` f32; q, k `[L, HQ, D]`; v `[L, HV, D]`; g, beta `[L, HV]`.
    Returns (o `[L, HV, D]` f32, S)."""
    L, hv, d = v.shape
    nc = -(-L // C)
    pad = nc * C - L

    def chunks(x):   # [L, HV, ...] -> [HV, nc, C, ...], zero-padded
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, 0, 0, pad)) if pad else x
        return x.reshape(nc, C, *x.shape[1:]).movedim(2, 0)

    qf = chunks(q.float().repeat_interleave(group, dim=1))        # [HV, nc, C, D]
    kf = chunks(k.float().repeat_interleave(group, dim=1))
    vf = chunks(v.float())
    bt = chunks(beta[..., None])[..., 0]                           # [HV, nc, C] (pad: 0)
    G = chunks(g[..., None])[..., 0].cumsum(-1)                    # pad: g = 0
    diff = G[..., :, None] - G[..., None, :]                       # G_i - G_j
    lower = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()    # j <= i
    strict = lower.tril(-1)                                                # j < i
    decay = torch.exp(diff.masked_fill(~lower, 0.0)).masked_fill(~lower, 0.0)
    A = (bt[..., :, None] * (kf @ kf.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    eye = torch.eye(C, device=v.device).expand_as(A)
    Tm = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
    W = Tm @ (bt[..., None] * torch.exp(G)[..., None] * kf)      # [HV, nc, C, D]
    U = Tm @ (bt[..., None] * vf)
    Aqk = (qf @ kf.transpose(-1, -2)) * decay
    Qg = qf * torch.exp(G)[..., None]
    Kd = kf * torch.exp(G[..., -1:] - G)[..., None]
    gl = torch.exp(G[..., -1])                                     # [HV, nc]
    o = torch.empty_like(vf)
    for c in range(nc):
        vn = U[:, c] - W[:, c] @ S                                 # [HV, C, V]
        o[:, c] = scale * (Qg[:, c] @ S + Aqk[:, c] @ vn)
        S = gl[:, c, None, None] * S + Kd[:, c].transpose(-1, -2) @ vn
    o = o.movedim(0, 2).reshape(nc * C, hv, d)[:L]
    return o, S
