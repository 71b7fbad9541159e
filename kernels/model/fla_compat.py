"""Our kernels behind FLA's signature: ``chunk_gated_delta_rule`` and
``fused_recurrent_gated_delta_rule`` as ``fla.ops.gated_delta_rule`` defines them, so a
model written for FLA (transformers' Qwen3-Next, :mod:`.hf`) runs ours unchanged.

FLA's convention differs from ours (``docs/design.md``, "The computation") in what the
caller hands over; each difference and what it costs here:

* **Gates precomputed**: ``g`` `[B, T, HV]` is the log decay (f32) and ``beta`` the
  post-sigmoid write strength, where our contract passes the raw ``a``, ``b`` with
  ``A_log``, ``dt_bias``. The kernels that compute gates take them as they are
  (``GATES="log"``: the intra-chunk kernel, the token-recurrent kernel, the decode
  kernel): no extra pass.
* **L2 norm of q and k** (``use_qk_l2norm_in_kernel=True``, what transformers passes):
  in the kernels, no extra pass. The decode and token-recurrent kernels normalise the
  loaded vectors (``QK_NORM``). The chunked prefill (``fused_launches(..., qk_norm=True)``)
  applies ``r = 1 / sqrt(sum(x^2) + 1e-6)`` (f32, FLA's ``l2norm``) as row factors on the
  products ``q`` and ``k`` enter: the intra-chunk kernel computes ``rq``, ``rk`` from its
  ``q``, ``k`` tiles, scales ``K K^T`` and ``Q K^T`` by them and stores them (8 bytes per
  token and q/k head, in the call's workspace); the walks multiply them into the gate
  factors of ``k S``, ``q S`` and ``k^T v_new``. The bf16 inputs are used as given (FLA
  rounds the normalised vectors to bf16 first: a difference of rounding only). FLA runs
  its ``l2norm_fwd`` over ``q`` and over ``k`` (two launches, each reading and writing the
  tensor) before its chunked kernels.
* **State layout**: FLA's ``[N, HV, K, V]`` (``state_v_first=False``, its default) or
  ours, k-last ``[N, HV, V, K]`` (``state_v_first=True``). A final state in FLA's layout
  is returned as the transposed *view* of a k-last buffer (same shape and values, no
  copy); handed back as ``initial_state`` (a model's cache does) it is read in place.
  A contiguous ``[N, HV, K, V]`` state is read by the decode kernel as it is
  (``STATE_KV``: strided loads, still one read and one write); the prefill copies it to
  k-last first (one pass over the state, ``8 * N * HV * D^2`` bytes, negligible beside a
  prompt's ``q``, ``k``, ``v``).
* **q/k at the value heads' count**: transformers repeats ``q`` and ``k`` to ``HV`` heads
  before the call. A ``[B, T, HV, D]`` tensor whose head stride is 0 (an expanded single
  head) is read once; a materialised repeat cannot be told from ``HV`` distinct heads, so
  it is read as given: the kernels read ``q`` and ``k`` ``HV / HQ`` times the bytes of the
  model's ``HQ`` heads (2x at the contest's shape), which is what FLA reads too. Passing
  ``q``, ``k`` at ``HQ`` heads (GVA) avoids it.
* **Strided inputs**: our kernels read contiguous tensors; a strided ``q``, ``k``, ``v``,
  ``g`` or ``beta`` (transformers' ``value`` is a view into the convolution's output) is
  copied once (``.contiguous()``).

Supported: bf16 ``q``, ``k``, ``v`` with ``K == V`` a power of two >= 16, ``HV`` a multiple
of ``H``; ``g`` f32; ``beta`` bf16 or f32; ``initial_state`` f32; ``cu_seqlens`` (then
``B == 1``); ``scale`` (None: ``1/sqrt(K)``). Not supported (a ValueError naming the
option): ``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``,
``cp_context``, ``chunk_size != 64``, ``gk``/``gv``. Bad inputs raise ``TypeError`` /
``ValueError`` naming the argument before anything is allocated or launched. The outputs
are bf16 `[B, T, HV, V]` and, with ``output_final_state``, the f32 final state (else None).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ..decode.kernel import gdn_decode_kernel
from ..decode.table import config_for_device
from ..launch import FastLaunch
from ..prefill.pipeline import fused_launches
from ..prefill.plan import call_plan
from ..prefill.recurrent import recurrent_fwd

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "DECODE_MAX_T"]

#: ``fused_recurrent_gated_delta_rule`` without ``cu_seqlens`` runs the decode kernel (its
#: tokens unrolled, the per-batch config table) up to this many tokens per sequence, the
#: token-recurrent prefill kernel beyond (and for any varlen call).
DECODE_MAX_T = 8

_DECODE = FastLaunch(gdn_decode_kernel)

#: FLA options this drop-in does not implement, with the only value it accepts.
_UNSUPPORTED = {"use_gate_in_kernel": False, "use_beta_sigmoid_in_kernel": False,
                "allow_neg_eigval": False, "cp_context": None, "chunk_size": 64,
                "gk": None, "gv": None, "A_log": None, "dt_bias": None,
                "chunk_indices": None}
#: FLA options accepted and not needed (``cu_seqlens_cpu``: a host copy of ``cu_seqlens``,
#: used to check its values without a device-to-host copy).
_ACCEPTED = ("cu_seqlens_cpu",)


# ----------------------------------------------------------------------------- checks

def _options(kwargs: dict) -> Optional[torch.Tensor]:
    """Refuse the FLA options not implemented here; return ``cu_seqlens_cpu``."""
    for name, value in kwargs.items():
        if name in _UNSUPPORTED:
            ok = _UNSUPPORTED[name]
            if (value is not ok) if ok is None or isinstance(ok, bool) else value != ok:
                raise ValueError(f"{name}={value!r} is not supported by this drop-in "
                                 f"(only {ok!r}); use FLA for it")
        elif name not in _ACCEPTED:
            raise TypeError(f"unexpected keyword argument {name!r}")
    return kwargs.get("cu_seqlens_cpu")


def _tensor(name, x, dtypes, ndim, device=None):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, "
                        f"got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} (like q), got {x.device}")


def _shape(name, x, expected):
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(x.shape)}")


def _check(q, k, v, g, beta, scale, initial_state, output_final_state, state_v_first,
           cu_seqlens, use_qk_l2norm_in_kernel, cu_cpu):
    """Every argument checked (names the bad one); returns ``(B, T, H, HV, D, N,
    cu values checked)``."""
    bf, f32 = (torch.bfloat16,), (torch.float32,)
    _tensor("q", q, bf, 4)
    dev = q.device
    B, T, H, D = q.shape
    _tensor("k", k, bf, 4, dev)
    _shape("k", k, (B, T, H, D))
    _tensor("v", v, bf, 4, dev)
    HV = v.shape[2]
    if v.shape[3] != D:
        raise ValueError(f"v's head size ({v.shape[3]}) must equal q's ({D}): this drop-in "
                         f"needs K == V")
    _shape("v", v, (B, T, HV, D))
    if H < 1 or HV % H:
        raise ValueError(f"v's head count ({HV}) must be a multiple of q's ({H}) (GVA)")
    if D < 16 or D & (D - 1):
        raise ValueError(f"q's head size must be a power of two >= 16, got {D}")
    _tensor("g", g, f32, 3, dev)
    _shape("g", g, (B, T, HV))
    _tensor("beta", beta, bf + f32, 3, dev)
    _shape("beta", beta, (B, T, HV))
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)
                              or not math.isfinite(scale)):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    for name, flag in (("output_final_state", output_final_state),
                       ("state_v_first", state_v_first),
                       ("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    checked = False
    if cu_seqlens is None:
        N = B
    else:
        _tensor("cu_seqlens", cu_seqlens, (torch.int32, torch.int64), 1, dev)
        if cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must have N+1 >= 2 entries, got "
                             f"{cu_seqlens.numel()}")
        if B != 1:
            raise ValueError(f"q's batch size must be 1 with cu_seqlens (flatten the "
                             f"sequences), got {B}")
        N = cu_seqlens.numel() - 1
        host = cu_cpu if cu_cpu is not None else (cu_seqlens if dev.type != "cuda" else None)
        if host is not None:
            cu = host.detach().to("cpu", torch.int64)
            if cu.numel() != N + 1 or int(cu[0]) != 0 or int(cu[-1]) != T \
                    or bool((cu[1:] < cu[:-1]).any()):
                raise ValueError(f"cu_seqlens must go from 0 to T={T} without decreasing, "
                                 f"got {cu.tolist()[:16]}")
            checked = True
    if initial_state is not None:
        _tensor("initial_state", initial_state, f32, 4, dev)
        _shape("initial_state", initial_state, (N, HV, D, D))
    return B, T, H, HV, D, N, checked


# ----------------------------------------------------------------------------- layouts

def _heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """``q``/``k`` as the kernels read them: an expanded single head (head stride 0 over
    ``HV`` heads) as that one head, anything else contiguous as given."""
    if x.shape[2] == HV and HV > 1 and x.stride(2) == 0:
        x = x[:, :, :1]
    return x.contiguous()


def _klast(state: Optional[torch.Tensor], v_first: bool, copy: bool):
    """``(state as a k-last [N, HV, V, K] tensor, or None; whether it was [.., K, V]
    contiguous and kept so)``. ``copy``: transpose-copy a contiguous ``[.., K, V]`` state
    (else it is returned as is, for the decode kernel's ``STATE_KV``)."""
    if state is None:
        return None, False
    if v_first:
        return state.contiguous(), False
    t = state.transpose(-1, -2)        # our k-last view of FLA's [.., K, V]
    if t.is_contiguous():
        return t, False                # a final state of ours, handed back: no copy
    if copy or not state.is_contiguous():
        return t.contiguous(), False
    return state, True


def _final(ht: torch.Tensor, v_first: bool, kv: bool) -> torch.Tensor:
    """A k-last final state (or one stored ``[.., K, V]`` when ``kv``) in the caller's
    layout, without a copy."""
    if v_first or kv:
        return ht
    return ht.transpose(-1, -2)


def _seqlens(B: int, T: int, device) -> torch.Tensor:
    """``cu_seqlens`` of ``B`` sequences of ``T`` tokens (FLA's batch without varlen)."""
    return torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device)[:B + 1]


# ----------------------------------------------------------------------------- the calls

def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           g: torch.Tensor, beta: torch.Tensor, scale: Optional[float] = None,
                           initial_state: Optional[torch.Tensor] = None,
                           output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False,
                           state_v_first: bool = False,
                           cu_seqlens: Optional[torch.Tensor] = None,
                           **kwargs) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """FLA's chunked gated delta rule on our prefill (the ``fused`` variant's plan:
    :func:`kernels.prefill.plan.call_plan`, context parallelism for long sequences included).

    Args:
        q: `[B, T, H, K]` bf16 queries (``H`` may be ``HV``, see the module's notes).
        k: `[B, T, H, K]` bf16 keys.
        v: `[B, T, HV, V]` bf16 values, ``V == K``.
        g: `[B, T, HV]` f32 log decay (``<= 0``): the state is multiplied by ``exp(g)``.
        beta: `[B, T, HV]` bf16 or f32 write strength (post-sigmoid).
        scale: output scale; None: ``1/sqrt(K)``.
        initial_state: `[N, HV, K, V]` f32 (`[N, HV, V, K]` with ``state_v_first``) or None
            (zeros); left untouched.
        output_final_state: also return the final state (else None).
        use_qk_l2norm_in_kernel: L2-normalise ``q`` and ``k`` per head (in the kernels,
            see the module's notes).
        state_v_first: the states are k-last `[N, HV, V, K]` (ours) instead of FLA's
            `[N, HV, K, V]`.
        cu_seqlens: `[N+1]` int32/int64 packed sequence bounds (then ``B == 1``), or None
            (``B`` sequences of ``T`` tokens). Its values are checked on the host off CUDA
            (or from ``cu_seqlens_cpu``); on CUDA invalid values give NaN outputs and
            states (the kernels' guard, no sync).
        kwargs: FLA's other options; those this drop-in does not implement raise.

    Returns:
        ``(o [B, T, HV, V] bf16, final_state or None)``.
    """
    cu_cpu = _options(kwargs)
    B, T, H, HV, D, N, checked = _check(q, k, v, g, beta, scale, initial_state,
                                        output_final_state, state_v_first, cu_seqlens,
                                        use_qk_l2norm_in_kernel, cu_cpu)
    dev = q.device
    q, k = _heads(q, HV), _heads(k, HV)
    HQ = q.shape[2]
    h0, _ = _klast(initial_state, state_v_first, copy=True)
    cu = cu_seqlens if cu_seqlens is not None else _seqlens(B, T, dev)
    o = torch.empty(B, T, HV, D, dtype=torch.bfloat16, device=dev)
    ht = torch.empty(N, HV, D, D, dtype=torch.float32, device=dev)
    Tt = B * T
    if Tt:
        plan = call_plan(Tt, N, HV, D, dev, None, None,
                         qk_heads=HQ if use_qk_l2norm_in_kernel else 0)
        fused_launches(plan, q.view(Tt, HQ, D), k.view(Tt, HQ, D),
                       v.contiguous().view(Tt, HV, D), h0, None,
                       g.contiguous().view(Tt, HV), None, beta.contiguous().view(Tt, HV), cu,
                       D ** -0.5 if scale is None else float(scale), o.view(Tt, HV, D), ht,
                       guard=not checked, gates="log", qk_norm=use_qk_l2norm_in_kernel)
    elif output_final_state:   # no tokens: the final state is the initial one
        ht.copy_(h0) if h0 is not None else ht.zero_()
    return o, (_final(ht, state_v_first, False) if output_final_state else None)


def fused_recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     g: Optional[torch.Tensor] = None,
                                     beta: Optional[torch.Tensor] = None,
                                     scale: Optional[float] = None,
                                     initial_state: Optional[torch.Tensor] = None,
                                     output_final_state: bool = False,
                                     use_qk_l2norm_in_kernel: bool = False,
                                     state_v_first: bool = False,
                                     cu_seqlens: Optional[torch.Tensor] = None,
                                     **kwargs) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """FLA's token-recurrent gated delta rule (the decode step) on our kernels: the decode
    kernel for up to :data:`DECODE_MAX_T` tokens per sequence without ``cu_seqlens``
    (gates, L2 norm and either state layout in the kernel: one read and one write of the
    state), the token-recurrent prefill kernel otherwise (k-last state; a contiguous
    `[.., K, V]` state is copied to k-last first).

    Args: as :func:`chunk_gated_delta_rule`; ``g`` and ``beta`` are required here (FLA's
    defaults, no decay and ``beta = 1``, are not implemented). ``use_qk_l2norm_in_kernel``
    is done in the kernels (no extra pass).

    Returns:
        ``(o [B, T, HV, V] bf16, final_state or None)``; the final state is a new tensor
        (``initial_state`` is left untouched), in the input state's layout.
    """
    cu_cpu = _options(kwargs)
    if g is None:
        raise ValueError("g must be given (the log decay, [B, T, HV] f32)")
    if beta is None:
        raise ValueError("beta must be given ([B, T, HV], post-sigmoid)")
    B, T, H, HV, D, N, checked = _check(q, k, v, g, beta, scale, initial_state,
                                        output_final_state, state_v_first, cu_seqlens,
                                        use_qk_l2norm_in_kernel, cu_cpu)
    dev = q.device
    q, k = _heads(q, HV), _heads(k, HV)
    v, g, beta = v.contiguous(), g.contiguous(), beta.contiguous()
    HQ = q.shape[2]
    sc = D ** -0.5 if scale is None else float(scale)
    o = torch.empty(B, T, HV, D, dtype=torch.bfloat16, device=dev)
    if cu_seqlens is None and 1 <= T <= DECODE_MAX_T:
        h0, kv = _klast(initial_state, state_v_first, copy=False)
        if h0 is None:
            h0 = torch.zeros(N, HV, D, D, dtype=torch.float32, device=dev)
        ht = torch.empty_like(h0)
        cfg = config_for_device(B, dev, D)
        key = (T, HQ, HV, D, cfg, kv, use_qk_l2norm_in_kernel, beta.dtype)
        _DECODE.launch_keyed(key, (cfg.programs(B, HV, D),), (
            q, k, v, h0, ht, ht, q, None, g, None, beta, o, None, sc, N), lambda: dict(
            T=T, HQ=HQ, HV=HV, D=D, BV=cfg.BV, BK=cfg.block_k(D), V_TILES=cfg.V_TILES,
            PREFETCH=cfg.PREFETCH, EVICT="evict_first" if cfg.EVICT_FIRST else "",
            POOLED=False, INTERMEDIATE=False, HAS_STATUS=False, GATES="log",
            QK_NORM=use_qk_l2norm_in_kernel, STATE_KV=kv, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages))
        return o, (_final(ht, state_v_first, kv) if output_final_state else None)
    h0, _ = _klast(initial_state, state_v_first, copy=True)
    ht = torch.empty(N, HV, D, D, dtype=torch.float32, device=dev)
    Tt = B * T
    if Tt:
        cu = cu_seqlens if cu_seqlens is not None else _seqlens(B, T, dev)
        recurrent_fwd(q.view(Tt, HQ, D), k.view(Tt, HQ, D), v.view(Tt, HV, D), h0, None,
                      g.view(Tt, HV), None, beta.view(Tt, HV), cu, sc, o.view(Tt, HV, D), ht,
                      guard=not checked, gates="log", qk_norm=use_qk_l2norm_in_kernel)
    elif output_final_state:
        ht.copy_(h0) if h0 is not None else ht.zero_()
    return o, (_final(ht, state_v_first, False) if output_final_state else None)
