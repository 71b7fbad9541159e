"""CPU-side Python time of one eager ``fused`` prefill call per path, launches stubbed.

Every Triton launch is replaced by a no-op at one place (the interpreter's
``InterpretedFunction.run``), so what is timed is the Python of a call: validation,
planning, allocation, binding the launches. The launches take the path they take on a
CUDA host: :class:`kernels.launch.FastLaunch`'s direct launches are switched on (off
CUDA they bind to the plain launch), each first launch of a key "compiles" to a
compiled-kernel stand-in whose launcher is a no-op, so the keys, the addresses and the
calls into the launcher are timed as a CUDA host runs them (Triton's C launcher itself
and CUDA's allocator are not). Inputs are the contest shape (HQ=4, HV=8,
D=128) on the CPU; the paths: the token-recurrent kernel (T=6), one launch (T=64), the walk
(T=512), the chained CP (T=8192) and the long CP (T=16384), each one sequence.

This is a prediction aid for the GPU host's time (its launches, its allocator and its
clock differ), not a measurement of it. Prints one JSON line per path: the median and the
minimum over ``--rounds`` rounds of the mean µs per call of ``--calls`` calls, in the
process's CPU time (``time.process_time``: on a shared machine, time spent waiting for a
core does not count).

    TRITON_INTERPRET=1 python scripts/probes/prefill_host_cpu.py [--calls 300] [--rounds 7]
                                                                 [--paths walk,cp]

Run from a checkout's root (it imports ``kernels`` from the current directory).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.getcwd())

import inspect  # noqa: E402

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402
from triton.runtime.jit import KernelParam  # noqa: E402


class _Compiled:
    """What a first launch returns on a CUDA host (a ``CompiledKernel``), with no-op launches:
    ``ck[grid](*args, stream=)`` and ``ck.run(...)`` (Triton's C launcher)."""

    function = packed_metadata = None

    def __getitem__(self, grid):
        return self.run

    def run(self, *args, **kwargs):
        return None


_COMPILED = _Compiled()
# the interpreter's kernels as JIT functions present themselves to FastLaunch (their
# parameters), and every launch a no-op returning the stand-in compiled kernel
interpreter.InterpretedFunction.params = property(lambda self: [
    KernelParam(i, p, False, False)
    for i, p in enumerate(inspect.signature(self.fn).parameters.values())])
interpreter.InterpretedFunction.run = lambda self, *a, **k: _COMPILED
torch.cuda.current_device = lambda: 0

from kernels import launch  # noqa: E402
from kernels.prefill import gdn_prefill  # noqa: E402
from kernels.spec import make_prefill_inputs  # noqa: E402

PATHS = (("recurrent", 6), ("single", 64), ("walk", 512), ("cp", 8192), ("cp_long", 16384))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--paths", default=",".join(p for p, _ in PATHS))
    args = ap.parse_args()
    paths = args.paths.split(",")
    launch.fast_launch_enabled = lambda: True        # direct launches, as on a CUDA host
    launch._current_stream = lambda *dev: 0   # (older trees: no argument)
    torch.set_num_threads(1)
    for name, T in PATHS:
        if name not in paths:
            continue
        x = make_prefill_inputs([T], seed=0)
        for _ in range(20):
            gdn_prefill(**x, check_values=False)
        means = []
        for _ in range(args.rounds):
            t0 = time.process_time()
            for _ in range(args.calls):
                gdn_prefill(**x, check_values=False)
            means.append((time.process_time() - t0) / args.calls * 1e6)
        print(json.dumps(dict(path=name, T=T, median_us=round(statistics.median(means), 1),
                              min_us=round(min(means), 1))), flush=True)


if __name__ == "__main__":
    main()
