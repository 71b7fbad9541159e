"""Memory roofline of GDN: bytes an implementation must move, and how fast it could.

Decode is memory bound: each step reads and writes the whole fp32 state
(``2 x B*HV*D*D*4`` bytes, 64 MiB at B=64) and little else. The floor of a
call is ``bytes / bandwidth`` where the bandwidth is *measured* on this device
by a large device-to-device copy (bytes read + bytes written per second) -
the rate a well-written streaming kernel reaches, not the datasheet peak.

``copy_bandwidth()`` is measured once per process and device (cached).
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Sequence

from ..spec import CONTEST, GDNShape, decode_state_bytes

__all__ = ["copy_bandwidth", "decode_bytes", "decode_state_bytes", "prefill_bytes",
           "floor_us", "achieved_fraction"]

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
