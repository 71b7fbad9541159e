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
