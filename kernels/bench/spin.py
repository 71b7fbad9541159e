"""A GPU kernel of known duration: one program spins on the global nanosecond timer.

``spin(us)`` enqueues it on the current stream and returns at once. Two users:

* the ``event`` timing method enqueues a spin before its start event, so the host has
  enqueued the whole timed call before the stream reaches it (the call's launch path is
  hidden: the events see GPU time);
* the GPU calibration test (``tests/bench/test_timing.py``) times spins of 1 to 100 µs
  with every GPU method and checks they recover the duration.

The spin reads ``%globaltimer`` (ns) until ``us`` have passed since its first read, so its
duration does not depend on the SM clock. CUDA only (inline PTX; not under the
interpreter).
"""
from __future__ import annotations

import functools

__all__ = ["spin"]


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import globaltimer

    @triton.jit
    def gdn_spin_kernel(ns):
        t0 = globaltimer()
        t = t0
        while t - t0 < ns:
            t = globaltimer()

    return gdn_spin_kernel


def spin(us: float) -> None:
    """Enqueue one single-program kernel that runs for ``us`` µs (>= 0) on the current
    stream; no host synchronisation."""
    if not us >= 0:
        raise ValueError(f"us must be >= 0, got {us}")
    _kernel()[(1,)](int(us * 1000.0), num_warps=1)
