"""Memory roofline of GDN: bytes an implementation must move, and how fast it could.

Decode is memory bound: each step reads and writes the whole fp32 state
(``2 x B*HV*D*D*4`` bytes, 64 MiB at B=64) and little else. The floor of a
call is ``bytes / bandwidth`` where the bandwidth is *measured* on this device
by a large device-to-device copy (bytes read + bytes written per second) -
the rate a well-written streaming kernel reaches, not the datasheet peak.

``copy_bandwidth()`` is measured once per process and device (cached).

Prefill, per kernel of our pipeline (:func:`prefill_kernel_model`): the compulsory bytes of
that kernel's own inputs and outputs, each moved once (intermediates such as ``Tb``,
``Aqk`` and the CP segment summaries included, since the pipeline hands them from one
kernel to the next), and the tensor-core FLOPs of its products. Its two floors are
``bytes / copy bandwidth`` and ``flops / tensor rate``, the rate measured like the
bandwidth (:func:`tensor_rate`: a large bf16 GEMM, dense), not the datasheet peak.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Sequence

from ..spec import CONTEST, GDNShape, decode_state_bytes

__all__ = ["copy_bandwidth", "decode_bytes", "decode_state_bytes", "prefill_bytes",
           "floor_us", "achieved_fraction", "tensor_rate", "prefill_kernel_model",
           "KERNEL_ROLES"]

_BF16, _F32, _I64 = 2, 4, 8


def decode_bytes(B: int, shape: GDNShape = CONTEST) -> int:
    """Minimum bytes one decode step moves: state read + write, q, k `[B,1,HQ,D]`,
    v and output `[B,1,HV,D]` bf16, a, b `[B,1,HV]` bf16, A_log and dt_bias `[HV]` f32."""
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    return (decode_state_bytes(B, shape)
            + 2 * B * hq * d * _BF16          # q, k
            + 2 * B * hv * d * _BF16          # v, output
            + 2 * B * hv * _BF16              # a, b
            + 2 * hv * _F32)                  # A_log, dt_bias


def prefill_bytes(lens: Sequence[int], shape: GDNShape = CONTEST, with_state: bool = True) -> int:
    """Minimum bytes of one prefill over sequences of lengths ``lens``: q, k
    `[T,HQ,D]`, v and output `[T,HV,D]` bf16, a, b `[T,HV]` bf16, cu_seqlens
    `[N+1]` i64, gate params, the final state `[N,HV,D,D]` f32 written, and the
    initial state read when ``with_state``."""
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    T, N = int(sum(lens)), len(lens)
    state = N * hv * d * d * _F32
    return (2 * T * hq * d * _BF16 + 2 * T * hv * d * _BF16 + 2 * T * hv * _BF16
            + (N + 1) * _I64 + 2 * hv * _F32 + state + (state if with_state else 0))


def floor_us(nbytes: float, bw: float) -> float:
    """Time (µs) to move ``nbytes`` at ``bw`` bytes/s."""
    if bw <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bw}")
    return float(nbytes) / float(bw) * 1e6


def achieved_fraction(nbytes: float, time_us: float, bw: float) -> float:
    """``(nbytes / time) / bw``: 1.0 means the call ran at copy bandwidth."""
    if time_us <= 0 or bw <= 0:
        return float("nan")
    return float(nbytes) / (float(time_us) * 1e-6) / float(bw)


def copy_bandwidth(device="cuda", nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written), the median of
    ``reps`` copies of an ``nbytes`` buffer; cached per (device, nbytes, reps).

    On a CUDA device each copy is timed with events; on ``"cpu"`` with the host
    clock (smoke runs only).
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _copy_bandwidth(str(dev), int(nbytes), int(reps))


@functools.lru_cache(maxsize=None)
def _copy_bandwidth(device: str, nbytes: int, reps: int) -> float:
    import torch

    n = max(1, nbytes // 4)
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    moved = 2 * n * 4
    times = []
    if device.startswith("cuda"):
        dst.copy_(src)  # warm-up
        torch.cuda.synchronize()
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e-3)
    else:
        dst.copy_(src)
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    del src, dst
    return moved / statistics.median(times)


def tensor_rate(device="cuda", n: int = 8192, reps: int = 10) -> float:
    """Dense bf16 GEMM rate in FLOP/s (``2 n^3`` per product), the median of ``reps``
    products of two ``n x n`` matrices; cached per (device, n, reps). On ``"cpu"`` a
    ``min(n, 512)`` float32 product timed with the host clock (smoke runs only)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _tensor_rate(str(dev), int(n), int(reps))


@functools.lru_cache(maxsize=None)
def _tensor_rate(device: str, n: int, reps: int) -> float:
    import torch

    if device.startswith("cuda"):
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        a @ b
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            a @ b
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e-3)
    else:
        n = min(n, 512)
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / statistics.median(times)


#: Kernel roles of our fused prefill (:func:`kernels.bench.anatomy.kernel_roles`).
KERNEL_ROLES = ("intra-chunk", "intra-chunk + walkers", "walk", "CP phase A", "CP phase B",
                "CP phase C")


def prefill_kernel_model(role: str, lens: Sequence[int], shape: GDNShape = CONTEST,
                         seg_chunks: int = 0, long_cp: bool = False, chunk: int = 64,
                         with_state: bool = True) -> dict:
    """``{"bytes", "flops"}`` of one kernel role of the ``fused`` prefill over ``lens``.

    ``chunk``-token chunks; ``nch`` = chunk-heads (sum over sequences of their chunks, times
    HV); ``S`` = CP segments of ``seg_chunks`` chunks (per sequence, rounded up). Bytes
    (bf16 2, f32 4), each tensor once:

    * intra-chunk: reads ``q``, ``k`` `[T,HQ,D]`, ``a``, ``b``; writes ``Tb``, ``Aqk``
      `[T,HV,64]` bf16 and ``gc`` `[T,HV]` f32. FLOPs: ``K K^T``, ``Q K^T`` (``2 C^2 D`` each)
      and the solve (``~2 C^3 / 3``) per chunk-head.
    * walk: reads ``q``, ``k``, ``v``, ``Tb``, ``Aqk``, ``gc``, the initial state; writes the
      outputs and the final state. FLOPs per chunk-head: ``k S``, ``q S``, ``k^T v_new``
      (``2 C D^2`` each), ``Tb @``, ``Aqk @`` (``2 C^2 D`` each).
    * intra-chunk + walkers (one launch): the two above, less the handed-over ``Tb``/``Aqk``.
    * CP phase A: reads ``k``, ``v``, ``Tb``, ``gc``; writes the segment summaries
      ``[M | X]`` (``D x 2D`` f32 per segment-head); the walk's products over ``2D`` columns.
    * CP phase B (long path): reads the summaries and the initial states, writes the
      entering states (``D x D`` f32 per segment-head); one ``2 D^3`` product per transition.
    * CP phase C: the walk, reading the entering states (long path) or the summaries it
      chains (chained path: every segment re-chains the earlier ones, ``2 D^3`` each).

    On the long path (``long_cp``) the intra-chunk kernel also writes one f32 bound per
    chunk-head; phase A's work depends on the gates (it walks only what the decay leaves,
    :mod:`kernels.prefill.state_walk_t`), so its floor counts what it must write at least:
    the ``X`` summaries.
    """
    hq, hv, d = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    lens = [int(n) for n in lens]
    T, N, C = sum(lens), len(lens), int(chunk)
    nch = hv * sum(-(-n // C) for n in lens)
    segs = [max(-(-n // (seg_chunks * C)), 1) if (seg_chunks and n) else 0 for n in lens]
    S = sum(segs)
    state = N * hv * d * d * _F32
    qk, vv, ab = 2 * T * hq * d * _BF16, T * hv * d * _BF16, 2 * T * hv * _BF16
    tb_aq, gc = 2 * T * hv * C * _BF16, T * hv * _F32
    intra = dict(bytes=qk + ab + tb_aq + gc,
                 flops=nch * (4 * C * C * d + 2 * C ** 3 / 3))
    walk = dict(bytes=qk + vv + tb_aq + gc + (state if with_state else 0) + state + vv,
                flops=nch * 2 * (3 * C * d * d + 2 * C * C * d))
    summ = S * hv * d * 2 * d * _F32
    if long_cp:
        intra = dict(bytes=intra["bytes"] + nch * _F32, flops=intra["flops"])
    if role == "intra-chunk":
        return intra
    if role == "walk":
        return walk
    if role == "intra-chunk + walkers":
        return dict(bytes=intra["bytes"] + walk["bytes"] - 2 * tb_aq - qk - gc,
                    flops=intra["flops"] + walk["flops"])
    if role == "CP phase A" and long_cp:
        return dict(bytes=summ // 2 + nch * _F32, flops=0)
    if role == "CP phase A":
        return dict(bytes=qk // 2 + vv + tb_aq // 2 + gc + summ,
                    flops=nch * 2 * (2 * C * d * 2 * d + C * C * 2 * d))
    if role == "CP phase B":
        return dict(bytes=summ + (state if with_state else 0) + S * hv * d * d * _F32,
                    flops=(S - N) * hv * 2 * d ** 3)
    if role == "CP phase C":
        if long_cp:
            return dict(bytes=walk["bytes"] - (state if with_state else 0)
                        + S * hv * d * d * _F32, flops=walk["flops"])
        chain = sum(s * (s - 1) // 2 for s in segs)
        return dict(bytes=walk["bytes"] + summ, flops=walk["flops"] + chain * hv * 2 * d ** 3)
    raise ValueError(f"unknown kernel role {role!r}; known: {', '.join(KERNEL_ROLES)}")
