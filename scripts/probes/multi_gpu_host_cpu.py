"""CPU-side host time of one rank's ``prefill_multi_gpu`` call, launches and collective stubbed.

What the GPU waits for when a rank's host enqueues more slowly than its kernels run: the
Python of the call (validation, planning, allocations, the small torch ops on the
boundaries, binding the launches). Every Triton launch is a no-op (the interpreter's
``InterpretedFunction.run``, counted), the group is torch's ``fake`` process group of
``--world`` ranks (``get_rank``/``get_world_size`` as with a real group) and the all-gather
returns at once. Inputs are the contest heads (HQ=4, HV=8, D=128), one sequence of ``T``
tokens split evenly over the ranks (:func:`kernels.prefill.multi_gpu.even_bounds`), no
initial state (notebook 05's timed inputs), on the CPU: the torch ops between the launches
run for real, so their compute counts where a GPU would run them as kernels (``host_us``
takes it out). Also ``gdn_prefill`` (``fused``) on the whole ``T``
and on one rank's share, for comparison. Each case also runs once on the ``meta`` device
(``sync_free``): a host sync there (``.item()``, ``.tolist()``, ``int(tensor)`` on a device
tensor) raises, as it would block on a GPU.

Per case one JSON line: ``min_us`` and ``median_us``, the min and median over ``--rounds``
rounds of the mean µs per call of ``--calls`` calls, in process CPU time
(``time.process_time``: waiting for a core on a shared machine does not count); the Triton
launches per call; the torch ops per call (aten ops dispatched, by a ``TorchDispatchMode``;
``allocs``: those whose output is new storage) with their names; ``compute_ops`` and
``compute_us``, those ops that touch at least 64 KiB and the time inside them in the best of
10 calls (on the CPU mostly the work a GPU does in a kernel), and ``host_us``: ``min_us`` without that time, each
such op counted at the mean time of the others (its dispatch). A prediction aid for the GPU
host (its launches, allocator and clock differ; off CUDA :class:`kernels.launch.FastLaunch`
binds to the plain launch), not a measurement of it.

    python scripts/probes/multi_gpu_host_cpu.py [--T 32768,262144,1048576] [--world 2]
        [--calls 200] [--rounds 7]

Run from a checkout's root (it imports ``kernels`` from the current directory).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from kernels.prefill import gdn_prefill, multi_gpu  # noqa: E402
from kernels.spec import CONTEST  # noqa: E402

LAUNCHES = [0]


def _no_launch(self, *args, **kwargs):
    LAUNCHES[0] += 1


def _no_gather(out, inp, group=None, async_op=False):
    return None


#: Ops that touch no element (allocations and views): never counted as compute.
_NO_TOUCH = {"empty", "empty_like", "empty_strided", "as_strided", "view", "detach", "slice",
             "select", "unsqueeze", "alias", "_reshape_alias", "reshape", "expand"}


class _OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched, those whose first output is fresh storage
    (``allocs``), and times those that touch at least 64 KiB (``big``: on the CPU their
    time is mostly the compute a GPU would do in a kernel) against the others."""

    def __init__(self):
        super().__init__()
        self.ops, self.allocs = collections.Counter(), 0
        self.big, self.big_s, self.small_s = 0, 0.0, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = {t.untyped_storage().data_ptr()
                  for x in list(args) + list(kwargs.values())
                  for t in (x if isinstance(x, (list, tuple)) else (x,))
                  if isinstance(t, torch.Tensor)}
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        dt = time.perf_counter() - t0
        name = str(func.overloadpacket.__name__)
        self.ops[name] += 1
        first = out[0] if isinstance(out, (list, tuple)) and out else out
        if isinstance(first, torch.Tensor):
            if first.untyped_storage().data_ptr() not in before:
                self.allocs += 1
            if name not in _NO_TOUCH and first.numel() * first.element_size() >= 65536:
                self.big += 1
                self.big_s += dt
                return out
        self.small_s += dt
        return out


def _inputs(T: int, device: str) -> dict:
    """One sequence of ``T`` tokens at the contest heads, no initial state, on ``device``
    (uninitialised token tensors: no kernel runs, and untouched pages cost no memory)."""
    s = CONTEST
    e = dict(dtype=torch.bfloat16, device=device)
    return dict(q=torch.empty(T, s.num_q_heads, s.head_dim, **e),
                k=torch.empty(T, s.num_q_heads, s.head_dim, **e),
                v=torch.empty(T, s.num_v_heads, s.head_dim, **e),
                a=torch.empty(T, s.num_v_heads, **e), b=torch.empty(T, s.num_v_heads, **e),
                A_log=torch.zeros(s.num_v_heads, device=device),
                dt_bias=torch.zeros(s.num_v_heads, device=device),
                cu_seqlens=torch.tensor([0, T], dtype=torch.int64, device=device), state=None)


def _measure(fn, calls: int, rounds: int) -> dict:
    for _ in range(10):
        fn()
    LAUNCHES[0] = 0
    fn()
    launches = LAUNCHES[0]
    reps, big_s = 10, []
    with _OpCount() as c:
        for _ in range(reps):
            b0 = c.big_s
            fn()
            big_s.append(c.big_s - b0)
    n_ops = sum(c.ops.values())
    small_op_us = c.small_s / max(n_ops - c.big, 1) * 1e6
    big_us = min(big_s) * 1e6   # (the best call's, as min_us is the best round's)
    means = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        means.append((time.process_time() - t0) / calls * 1e6)
    lo = min(means)
    return dict(min_us=round(lo, 1), median_us=round(statistics.median(means), 1),
                host_us=round(lo - big_us + c.big / reps * small_op_us, 1),
                launches=launches, torch_ops=n_ops // reps, allocs=c.allocs // reps,
                compute_ops=c.big // reps, compute_us=round(big_us, 1),
                ops={k: n // reps for k, n in sorted(c.ops.items())})


def _sync_free(make) -> bool:
    """Whether one call on ``meta`` tensors runs through (no host sync)."""
    try:
        make("meta")()
    except (RuntimeError, NotImplementedError) as e:
        print(json.dumps(dict(sync_error=str(e)[:200])), file=sys.stderr)
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="32768,262144,1048576", help="tokens of the whole call")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    interpreter.InterpretedFunction.run = _no_launch
    multi_gpu._all_gather = _no_gather
    torch.set_num_threads(1)
    W = args.world
    for T in (int(t) for t in args.T.split(",")):
        bounds = multi_gpu.even_bounds(T, W)

        def whole(dev):
            x = _inputs(T, dev)
            return lambda: gdn_prefill(**x, check_values=False)

        def share(dev):
            x = _inputs(bounds[1], dev)
            return lambda: gdn_prefill(**x, check_values=False)

        def rank_call(r):
            def make(dev):
                x = _inputs(T, dev)
                mine = {n: (t[bounds[r]:bounds[r + 1]] if n in ("q", "k", "v", "a", "b")
                            else t) for n, t in x.items()}
                return lambda: _rank_call(mine, bounds, r, W)
            return make

        cases = [("gdn_prefill", T, None, whole), ("gdn_prefill", bounds[1], None, share)]
        cases += [("multi_gpu", bounds[r + 1] - bounds[r], r, rank_call(r)) for r in range(W)]
        for name, tokens, rank, make in cases:
            row = dict(impl=name, T_call=T, T_rank=tokens, rank=rank,
                       world=W if rank is not None else None)
            sync_free = _sync_free(make)
            print(json.dumps(dict(row, **_measure(make("cpu"), args.calls, args.rounds),
                                  sync_free=sync_free)), flush=True)


_GROUPS = {}


def _rank_call(mine: dict, bounds: list, rank: int, world: int):
    """One rank's call on a fake group of ``world`` ranks where this process is ``rank``
    (the default group is re-made when the rank changes: once per case, outside the
    timing)."""
    if _GROUPS.get("rank") != rank:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        _GROUPS["rank"] = rank
    return multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)


if __name__ == "__main__":
    main()
