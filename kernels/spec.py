"""The contest's GDN shapes, seeded realistic inputs, and input validation.

Prefill shapes are named by :func:`parse_shape` specs (``"T6"``, ``"100+28"``,
``"4x1024"``), and results by their compact :func:`lens_label`.

Shapes (Qwen3-Next at tensor-parallel 4): ``HQ = HK = 4`` query/key heads,
``HV = 8`` value heads, head size ``D = K = V = 128``. Value head ``h`` reads
q/k head ``h // (HV // HQ)`` (grouped value attention, GVA).

Decode inputs (``T`` tokens per sequence: 1 for the contest, 2..4 for
multi-token / speculative decoding)::

    q, k     [B, T, HQ, D] bf16      v        [B, T, HV, D] bf16
    state    [B, HV, D, D] f32 or bf16 (k-last: element (k, v) at state[b, h, v, k]),
             or a pool [P, HV, D, D] with state_indices [B] int32/int64 (slot per
             sequence; a negative slot is padding)
    A_log    [HV] f32                a, b     [B, T, HV] bf16
    dt_bias  [HV] f32                scale    float (0 or None -> 1/sqrt(D))

Prefill inputs (packed variable-length sequences)::

    q, k     [T, HQ, D] bf16         v        [T, HV, D] bf16
    state    [N, HV, D, D] f32 or None (zeros)
    a, b     [T, HV] bf16            cu_seqlens [N+1] int64 or int32

Validation raises ``TypeError`` (wrong dtype / not a tensor) or ``ValueError``
(everything else) with a message naming the argument and what was expected.
It never mutates its inputs and launches nothing on the device.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

__all__ = [
    "GDNShape",
    "tensor_meta",
    "CONTEST",
    "DECODE_BATCH_SIZES",
    "PREFILL_SHAPES",
    "lens_label",
    "parse_shape",
    "resolve_scale",
    "make_decode_inputs",
    "make_prefill_inputs",
    "validate_decode_inputs",
    "validate_prefill_inputs",
    "check_slot_values",
    "check_cu_seqlens_values",
    "decode_state_bytes",
    "STATE_DTYPES",
]


@dataclass(frozen=True)
class GDNShape:
    """Head counts and head size of one GDN layer.

    Args:
        num_q_heads: ``HQ`` (= ``HK``), query/key heads.
        num_v_heads: ``HV``, value heads; a multiple of ``HQ``.
        head_dim: ``D`` (= K = V), a power of two >= 16.
    """

    num_q_heads: int = 4
    num_v_heads: int = 8
    head_dim: int = 128

    def __post_init__(self):
        if self.num_q_heads < 1:
            raise ValueError(f"num_q_heads must be >= 1, got {self.num_q_heads}")
        if self.num_v_heads < 1 or self.num_v_heads % self.num_q_heads:
            raise ValueError(
                f"num_v_heads must be a positive multiple of num_q_heads={self.num_q_heads}, "
                f"got {self.num_v_heads}")
        d = self.head_dim
        if d < 16 or d & (d - 1):
            raise ValueError(f"head_dim must be a power of two >= 16, got {d}")

    @property
    def group(self) -> int:
        """Value heads per q/k head (``HV // HQ``)."""
        return self.num_v_heads // self.num_q_heads


CONTEST = GDNShape(4, 8, 128)
DECODE_BATCH_SIZES = (1, 4, 8, 16, 32, 48, 64)
# The prefill shapes the notebooks and issues name (lists of sequence lengths).
PREFILL_SHAPES = {
    "T6": [6], "T64": [64], "100+28": [100, 28], "T512": [512], "T2048": [2048],
    "T8192": [8192], "4x1024": [1024] * 4, "16x256": [256] * 16, "57x64": [64] * 57,
}


def lens_label(lens: Sequence[int]) -> str:
    """Compact name of a list of lengths: ``[6]``→``"6"``, ``[1024]*4``→``"4x1024"``,
    ``[100, 28]``→``"100+28"``."""
    lens = [int(n) for n in lens]
    if len(lens) > 1 and len(set(lens)) == 1:
        return f"{len(lens)}x{lens[0]}"
    return "+".join(str(n) for n in lens)


def parse_shape(spec) -> Tuple[str, List[int]]:
    """``(lens_label, lens)`` of a prefill shape spec: a name of :data:`PREFILL_SHAPES`
    (``"T6"``), a compact string (``"100+28"``, ``"4x1024"``), an int or a list of lengths."""
    if isinstance(spec, (list, tuple)):
        lens = [int(n) for n in spec]
    elif isinstance(spec, int):
        lens = [spec]
    elif spec in PREFILL_SHAPES:
        lens = list(PREFILL_SHAPES[spec])
    else:
        s = str(spec).strip().lstrip("T")
        if re.fullmatch(r"\d+x\d+", s):
            n, l = s.split("x")
            lens = [int(l)] * int(n)
        elif re.fullmatch(r"\d+(\+\d+)*", s):
            lens = [int(x) for x in s.split("+")]
        else:
            raise ValueError(f"not a prefill shape: {spec!r} (a name of PREFILL_SHAPES, "
                             f"'100+28', '4x1024' or a list of lengths)")
    if not lens or any(n < 0 for n in lens):
        raise ValueError(f"prefill shape {spec!r}: lengths must be >= 0, got {lens}")
    return lens_label(lens), lens


def resolve_scale(scale: Optional[float], head_dim: int) -> float:
    """``scale`` or, when it is None or 0, ``1/sqrt(head_dim)``."""
    if scale is None or scale == 0:
        return 1.0 / math.sqrt(head_dim)
    return float(scale)


STATE_DTYPES = (torch.float32, torch.bfloat16)


def decode_state_bytes(batch: int, shape: GDNShape = CONTEST,
                       state_dtype: torch.dtype = torch.float32) -> int:
    """Bytes of state one decode call must read and write (once each, whatever
    the tokens per sequence): ``2 * B*HV*D*D * element size`` (4 for fp32, 2 for bf16)."""
    elem = torch.empty((), dtype=state_dtype).element_size()
    return 2 * batch * shape.num_v_heads * shape.head_dim * shape.head_dim * elem


# --------------------------------------------------------------------------- inputs

def _unit_norm(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def _gate_params(hv: int, gen: torch.Generator):
    """Qwen3-Next-like gate parameters: A in [1, 16], dt in [1e-3, 1e-1]."""
    A = torch.empty(hv).uniform_(1.0, 16.0, generator=gen)
    A_log = A.log()
    dt = torch.exp(torch.empty(hv).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    return A_log.float(), dt_bias.float()


def make_decode_inputs(batch: int, shape: GDNShape = CONTEST, *, seed: int = 0,
                       device="cpu", state_scale: float = 0.1,
                       scale: Optional[float] = None, tokens: int = 1,
                       state_dtype: torch.dtype = torch.float32,
                       pool_size: Optional[int] = None) -> dict:
    """Seeded realistic decode inputs (a dict keyed by argument name).

    Returns ``q, k [B,T,HQ,D] bf16`` (unit norm per head), ``v [B,T,HV,D] bf16``,
    ``state [B,HV,D,D]`` in ``state_dtype`` (f32 or bf16), ``A_log, dt_bias [HV] f32``,
    ``a, b [B,T,HV] bf16``, ``scale``; ``T = tokens``. With ``pool_size = P`` the
    state is a pool ``[P,HV,D,D]`` and ``state_indices [B] int32`` holds distinct
    random slots (``P >= B``).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype must be torch.float32 or torch.bfloat16, got {state_dtype}")
    if pool_size is not None and pool_size < batch:
        raise ValueError(f"pool_size must be >= batch={batch}, got {pool_size}")
    gen = torch.Generator().manual_seed(seed)
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    bf = torch.bfloat16
    T = tokens
    q = _unit_norm(torch.randn(batch, T, hq, d, generator=gen)).to(bf)
    k = _unit_norm(torch.randn(batch, T, hq, d, generator=gen)).to(bf)
    v = torch.randn(batch, T, hv, d, generator=gen).to(bf)
    rows = batch if pool_size is None else pool_size
    state = torch.randn(rows, hv, d, d, generator=gen) * state_scale
    A_log, dt_bias = _gate_params(hv, gen)
    a = torch.randn(batch, T, hv, generator=gen).to(bf)
    b = torch.randn(batch, T, hv, generator=gen).to(bf)
    out = dict(q=q, k=k, v=v, state=state.to(state_dtype), A_log=A_log, a=a, dt_bias=dt_bias,
               b=b)
    if pool_size is not None:
        out["state_indices"] = torch.randperm(pool_size, generator=gen)[:batch].to(torch.int32)
    out = {n: t.to(device) for n, t in out.items()}
    out["scale"] = scale
    return out


def make_prefill_inputs(lens: Sequence[int], shape: GDNShape = CONTEST, *, seed: int = 0,
                        device="cpu", with_state: bool = True, state_scale: float = 0.1,
                        cu_dtype: torch.dtype = torch.int64,
                        scale: Optional[float] = None) -> dict:
    """Seeded realistic prefill inputs for sequences of lengths ``lens``.

    Returns ``q, k [T,HQ,D] bf16`` (unit norm per head), ``v [T,HV,D] bf16``,
    ``state [N,HV,D,D] f32`` (or None when ``with_state`` is False),
    ``A_log, dt_bias [HV] f32``, ``a, b [T,HV] bf16``, ``cu_seqlens [N+1]``, ``scale``.
    """
    lens = [int(n) for n in lens]
    if not lens or any(n < 0 for n in lens):
        raise ValueError(f"lens must be a non-empty list of lengths >= 0, got {lens}")
    gen = torch.Generator().manual_seed(seed)
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    T, N = sum(lens), len(lens)
    bf = torch.bfloat16
    q = _unit_norm(torch.randn(T, hq, d, generator=gen)).to(bf)
    k = _unit_norm(torch.randn(T, hq, d, generator=gen)).to(bf)
    v = torch.randn(T, hv, d, generator=gen).to(bf)
    A_log, dt_bias = _gate_params(hv, gen)
    a = torch.randn(T, hv, generator=gen).to(bf)
    b = torch.randn(T, hv, generator=gen).to(bf)
    state = (torch.randn(N, hv, d, d, generator=gen) * state_scale).float() if with_state else None
    cu = torch.tensor([0] + list(_cumsum(lens)), dtype=cu_dtype)
    out = dict(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
               cu_seqlens=cu)
    out = {n: (t.to(device) if t is not None else None) for n, t in out.items()}
    out["scale"] = scale
    return out


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


# --------------------------------------------------------------------------- validation

def _tensor(name, x, dtype, ndim, device=None):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dtype is not None and x.dtype not in (dtype if isinstance(dtype, tuple) else (dtype,)):
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} (like q), got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {x.stride()})")


def _expect_shape(name, x, expected):
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(x.shape)}")


def _common_gates(A_log, dt_bias, hv, dev):
    _tensor("A_log", A_log, torch.float32, 1, dev)
    _expect_shape("A_log", A_log, (hv,))
    _tensor("dt_bias", dt_bias, torch.float32, 1, dev)
    _expect_shape("dt_bias", dt_bias, (hv,))


def _check_scale(scale):
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if scale is not None and (not math.isfinite(scale) or scale < 0):
        raise ValueError(f"scale must be finite and >= 0 (0 means 1/sqrt(D)), got {scale}")


# The checks below, one argument at a time, name what is wrong. A valid call pays them as one
# flat expression instead (``_decode_ok`` / ``_prefill_ok``: the same conditions, no call per
# argument); only a call that fails it runs the named checks, which then raise.
_T, _BF, _F32 = torch.Tensor, torch.bfloat16, torch.float32
_INDEX_DTYPES = (torch.int32, torch.int64)


@functools.lru_cache(maxsize=None)
def _shape_of(hq: int, hv: int, d: int) -> GDNShape:
    return GDNShape(hq, hv, d)


def _heads_ok(hq, hv, d) -> bool:
    return hq >= 1 and hv >= 1 and hv % hq == 0 and d >= 16 and not d & (d - 1)


def _scale_ok(scale) -> bool:
    return scale is None or (type(scale) in (int, float) and math.isfinite(scale) and scale >= 0)


def _decode_ok(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices):
    """Every metadata condition of :func:`validate_decode_inputs` (not the slot values):
    the shape when all hold, else None."""
    if not (type(q) is _T and type(k) is _T and type(v) is _T and type(state) is _T
            and type(A_log) is _T and type(a) is _T and type(dt_bias) is _T and type(b) is _T):
        return None
    qs, vs, ss = q.shape, v.shape, state.shape
    if len(qs) != 4 or len(vs) != 4 or len(ss) != 4:
        return None
    B, T, hq, d = qs
    hv = vs[2]
    if T < 1 or not _heads_ok(hq, hv, d):
        return None
    if not (q.dtype is _BF and k.dtype is _BF and v.dtype is _BF and a.dtype is _BF
            and b.dtype is _BF and A_log.dtype is _F32 and dt_bias.dtype is _F32
            and (state.dtype is _F32 or state.dtype is _BF)):
        return None
    if not (k.shape == qs and vs == (B, T, hv, d) and a.shape == (B, T, hv)
            and b.shape == (B, T, hv) and A_log.shape == (hv,) and dt_bias.shape == (hv,)):
        return None
    dev = q.device
    if state_indices is None:
        if ss != (B, hv, d, d):
            return None
    elif not (type(state_indices) is _T and ss[0] >= 1 and ss[1:] == (hv, d, d)
              and state_indices.dtype in _INDEX_DTYPES and state_indices.shape == (B,)
              and state_indices.device == dev and state_indices.is_contiguous()):
        return None
    if not (k.device == dev and v.device == dev and state.device == dev and a.device == dev
            and b.device == dev and A_log.device == dev and dt_bias.device == dev):
        return None
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
            and state.is_contiguous() and a.is_contiguous() and b.is_contiguous()
            and A_log.is_contiguous() and dt_bias.is_contiguous() and _scale_ok(scale)):
        return None
    return _shape_of(hq, hv, d)


def _prefill_ok(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    """Every metadata condition of :func:`validate_prefill_inputs` (not the values of
    ``cu_seqlens``): the shape when all hold, else None."""
    if not (type(q) is _T and type(k) is _T and type(v) is _T and type(A_log) is _T
            and type(a) is _T and type(dt_bias) is _T and type(b) is _T
            and type(cu_seqlens) is _T and (state is None or type(state) is _T)):
        return None
    qs, vs, cs = q.shape, v.shape, cu_seqlens.shape
    if len(qs) != 3 or len(vs) != 3 or len(cs) != 1 or cs[0] < 2:
        return None
    T, hq, d = qs
    hv = vs[1]
    if not _heads_ok(hq, hv, d):
        return None
    if not (q.dtype is _BF and k.dtype is _BF and v.dtype is _BF and a.dtype is _BF
            and b.dtype is _BF and A_log.dtype is _F32 and dt_bias.dtype is _F32
            and cu_seqlens.dtype in _INDEX_DTYPES):
        return None
    if not (k.shape == qs and vs == (T, hv, d) and a.shape == (T, hv) and b.shape == (T, hv)
            and A_log.shape == (hv,) and dt_bias.shape == (hv,)):
        return None
    dev = q.device
    if not (k.device == dev and v.device == dev and a.device == dev and b.device == dev
            and A_log.device == dev and dt_bias.device == dev and cu_seqlens.device == dev):
        return None
    if state is not None and not (state.dtype is _F32 and state.device == dev
                                  and state.shape == (cs[0] - 1, hv, d, d)
                                  and state.is_contiguous()):
        return None
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
            and a.is_contiguous() and b.is_contiguous() and A_log.is_contiguous()
            and dt_bias.is_contiguous() and cu_seqlens.is_contiguous() and _scale_ok(scale)):
        return None
    return _shape_of(hq, hv, d)


def validate_decode_inputs(q, k, v, state, A_log, a, dt_bias, b, scale=None,
                           state_indices=None, *, check_values: bool = True) -> GDNShape:
    """Check decode inputs against the contract; return their :class:`GDNShape`.

    ``T = q.shape[1] >= 1`` tokens per sequence; ``state`` is f32 or bf16, dense
    ``[B,HV,D,D]`` or, with ``state_indices`` (``[B]`` int32/int64), a pool
    ``[P,HV,D,D]``. With ``check_values`` the slot values are checked too: every
    non-negative slot below ``P`` and none repeated (negative = padding); on a
    GPU tensor that costs one device-to-host copy, so fast paths pass False.

    Raises ``TypeError``/``ValueError`` naming the argument. Reads only metadata
    (and the slot values when ``check_values``).
    """
    if not check_values:
        shape = _decode_ok(q, k, v, state, A_log, a, dt_bias, b, scale, state_indices)
        if shape is not None:
            return shape
    bf = torch.bfloat16
    _tensor("q", q, bf, 4)
    dev = q.device
    B, T = q.shape[0], q.shape[1]
    if T < 1:
        raise ValueError(f"q must have at least one token per sequence (shape [B,T,HQ,D], "
                         f"T >= 1), got {tuple(q.shape)}")
    _tensor("v", v, bf, 4, dev)
    shape = _heads_from_shapes(tuple(q.shape[2:]), tuple(v.shape[2:]))
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    _tensor("k", k, bf, 4, dev)
    _expect_shape("k", k, (B, T, hq, d))
    _expect_shape("v", v, (B, T, hv, d))
    _tensor("state", state, STATE_DTYPES, 4, dev)
    if state_indices is None:
        _expect_shape("state", state, (B, hv, d, d))
    else:
        if tuple(state.shape[1:]) != (hv, d, d) or state.shape[0] < 1:
            raise ValueError(f"state must be a pool of shape (P, {hv}, {d}, {d}) with P >= 1 "
                             f"(state_indices given), got {tuple(state.shape)}")
        _check_state_indices(state_indices, B, state.shape[0], dev, check_values)
    _common_gates(A_log, dt_bias, hv, dev)
    _tensor("a", a, bf, 3, dev)
    _expect_shape("a", a, (B, T, hv))
    _tensor("b", b, bf, 3, dev)
    _expect_shape("b", b, (B, T, hv))
    _check_scale(scale)
    return shape


def _check_state_indices(idx, B: int, P: int, dev, check_values: bool) -> None:
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"state_indices must be a torch.Tensor or None, got {type(idx).__name__}")
    if idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"state_indices must have dtype torch.int32 or torch.int64, got {idx.dtype}")
    if tuple(idx.shape) != (B,):
        raise ValueError(f"state_indices must have shape ({B},) (one slot per sequence), "
                         f"got {tuple(idx.shape)}")
    if idx.device != dev:
        raise ValueError(f"state_indices must be on {dev} (like q), got {idx.device}")
    if not idx.is_contiguous():
        raise ValueError(f"state_indices must be contiguous (got strides {idx.stride()})")
    if check_values:
        check_slot_values(idx, P)


def check_slot_values(idx, P: int) -> None:
    """The values of checked ``state_indices`` metadata: every live (non-negative) slot below
    the pool size ``P``, none repeated (a device-to-host copy on CUDA). Per call: a cached
    signature (:mod:`kernels.decode.ops`) skips the metadata checks, never these."""
    slots = idx.detach().to("cpu", torch.int64)
    live = slots[slots >= 0]
    if bool((live >= P).any()):
        raise ValueError(f"state_indices must be < the pool size P={P} (negative = padding), "
                         f"got {int(live.max())}")
    if live.unique().numel() != live.numel():
        u, c = live.unique(return_counts=True)
        raise ValueError(f"state_indices must not repeat a slot (two sequences cannot update "
                         f"one state), got slot(s) {u[c > 1].tolist()[:8]} more than once")


def _heads_from_shapes(q_tail, v_tail) -> GDNShape:
    hq, d = q_tail
    hv, dv = v_tail
    if dv != d:
        raise ValueError(f"v's head size ({dv}) must equal q's head size ({d})")
    if hq < 1 or hv < 1 or hv % hq:
        raise ValueError(
            f"v's head count ({hv}) must be a multiple of q's head count ({hq}) (GVA)")
    if d < 16 or d & (d - 1):
        raise ValueError(f"q's head size must be a power of two >= 16, got {d}")
    return GDNShape(hq, hv, d)


def validate_prefill_inputs(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None,
                            *, check_values: bool = True) -> GDNShape:
    """Check prefill inputs against the contract; return their :class:`GDNShape`.

    With ``check_values`` the values of ``cu_seqlens`` are checked too (starts at
    0, non-decreasing, ends at T); on a GPU tensor that costs one device-to-host
    copy, so fast paths may pass False and rely on the metadata checks alone.
    """
    if not check_values:
        shape = _prefill_ok(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
        if shape is not None:
            return shape
    bf = torch.bfloat16
    _tensor("q", q, bf, 3)
    dev = q.device
    T = q.shape[0]
    _tensor("v", v, bf, 3, dev)
    shape = _heads_from_shapes(tuple(q.shape[1:]), tuple(v.shape[1:]))
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    _tensor("k", k, bf, 3, dev)
    _expect_shape("k", k, (T, hq, d))
    _expect_shape("v", v, (T, hv, d))
    _common_gates(A_log, dt_bias, hv, dev)
    _tensor("a", a, bf, 2, dev)
    _expect_shape("a", a, (T, hv))
    _tensor("b", b, bf, 2, dev)
    _expect_shape("b", b, (T, hv))
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"cu_seqlens must be int64 or int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with N+1 >= 2 entries, got shape "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != dev:
        raise ValueError(f"cu_seqlens must be on {dev} (like q), got {cu_seqlens.device}")
    if not cu_seqlens.is_contiguous():
        raise ValueError("cu_seqlens must be contiguous")
    N = cu_seqlens.numel() - 1
    if state is not None:
        _tensor("state", state, torch.float32, 4, dev)
        _expect_shape("state", state, (N, hv, d, d))
    _check_scale(scale)
    if check_values:
        check_cu_seqlens_values(cu_seqlens, T)
    return shape


def check_cu_seqlens_values(cu_seqlens, T: int) -> None:
    """The values of ``cu_seqlens`` with checked metadata: starts at 0, non-decreasing, ends
    at ``T`` (a device-to-host copy on CUDA). Per call: a cached signature
    (:func:`kernels.prefill.gdn_prefill`) skips the metadata checks, never these."""
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu[0])}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu.tolist()[:16]}")
    if int(cu[-1]) != T:
        raise ValueError(f"cu_seqlens[-1] must equal T={T} (q.shape[0]), got {int(cu[-1])}")


def tensor_meta(x):
    """What the metadata checks of a call read of one argument, as part of a call's signature
    key (``decode.ops.signature``, ``prefill.pipeline.call_signature``, the replay's): its
    type, shape, dtype, device and contiguity; None for None."""
    return None if x is None else (type(x), x.shape, x.dtype, x.device, x.is_contiguous())
