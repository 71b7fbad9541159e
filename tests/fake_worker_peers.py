"""A worker hook for the peer-worker tests (``--serve tests.fake_worker_peers:fake_peers``):
``good`` is the float32 reference, ``bad`` returns outputs off by 1, ``missing`` is
unavailable, ``crash`` raises, ``where`` reports the worker's PYTHONPATH in its reason."""
import os

import torch

from kernels.peers import Unavailable
from kernels.reference import prefill_reference


def _good(**kw):
    return prefill_reference(**kw)


def _bad(**kw):
    o, s = prefill_reference(**kw)
    return (o.float() + 1).to(torch.bfloat16), s


def _crash(**kw):
    raise ValueError("fake peer failure")


def fake_peers(names):
    """``{name: (callable or Unavailable, version)}``, the worker hook's contract."""
    out = {}
    for n in names:
        if n == "good":
            out[n] = _good
        elif n == "bad":
            out[n] = _bad
        elif n == "crash":
            out[n] = _crash
        elif n == "where":
            out[n] = Unavailable(n, "PYTHONPATH=" + os.environ.get("PYTHONPATH", ""))
        else:
            out[n] = Unavailable(n, f"fake: no peer {n!r}")
    return {n: (fn, "fake-1.0") for n, fn in out.items()}


def _fake_kernel_times(fn, calls=5, warmup=3):
    """A fixed :func:`kernels.bench.anatomy.kernel_times` table (two kernels) after one
    call of ``fn()``: the CPU has no CUDA kernels to record."""
    import pandas as pd

    from kernels.bench.anatomy import KERNEL_TIME_COLUMNS

    fn()
    return pd.DataFrame(dict(k=[0, 1], kernel=["chunk_fwd<64>", "state_walk"],
                             role=["chunk_fwd<64>", "state_walk"], median_us=[10.0, 20.0],
                             p20_us=[9.0, 19.0], p80_us=[11.0, 21.0], calls=calls,
                             span_us=35.0), columns=KERNEL_TIME_COLUMNS)


def fake_peers_with_kernel_times(names):
    """:func:`fake_peers`, with ``kernel_times`` replaced by :func:`_fake_kernel_times` in
    the worker (``--serve tests.fake_worker_peers:fake_peers_with_kernel_times``)."""
    from kernels.bench import anatomy

    anatomy.kernel_times = _fake_kernel_times
    return fake_peers(names)
