"""CPU-side host time of one rank's ``prefill_multi_gpu`` call, launches and collective stubbed.

What the GPU waits for when a rank's host enqueues more slowly than its kernels run: the
Python of the call (validation, planning, allocations, the small torch ops on the
boundaries, binding the launches). Every Triton launch is a no-op (the interpreter's
``InterpretedFunction.run``, counted), the group is torch's ``fake`` process group of
``--world`` ranks (``get_rank``/``get_world_size`` as with a real group) and the all-gather
returns at once. Inputs are the contest heads (HQ=4, HV=8, D=128), one sequence of ``T``
tokens split evenly over the ranks (:func:`kernels.prefill.multi_gpu.even_bounds`), on the
``meta`` device by default: torch ops dispatch and allocate (nothing is computed, no memory
is touched), so the time is the host's share without the CPU doing a GPU's work, and a host
sync (``.item()``, ``.tolist()``, ``int(tensor)``) on a device tensor fails as it would
block on a GPU. ``--device cpu`` runs the torch ops for real instead (their compute counts).
Also ``gdn_prefill`` (``fused``) on the whole ``T`` and on one rank's share, for comparison.

Per case one JSON line: the min and median over ``--rounds`` rounds of the mean µs per call
of ``--calls`` calls, in process CPU time (``time.process_time``: waiting for a core on a
shared machine does not count), the Triton launches per call, and the torch ops per call
(aten ops dispatched, by a ``TorchDispatchMode``; ``allocs``: those whose output is new
storage) with their names. A prediction aid for the GPU host (its launches, allocator and
clock differ), not a measurement of it.

    python scripts/probes/multi_gpu_host_cpu.py [--T 32768,262144,1048576] [--world 2]
        [--calls 200] [--rounds 7] [--device meta]

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


class _OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched, and those whose first output is fresh storage."""

    def __init__(self):
        super().__init__()
        self.ops, self.allocs = collections.Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = set()
        for x in list(args) + list(kwargs.values()):
            for t in (x if isinstance(x, (list, tuple)) else (x,)):
                if isinstance(t, torch.Tensor):
                    before.add(id(t.untyped_storage()) if t.device.type == "meta"
                               else t.untyped_storage().data_ptr())
        out = func(*args, **kwargs)
        self.ops[str(func.overloadpacket.__name__)] += 1
        first = out[0] if isinstance(out, (list, tuple)) and out else out
        if isinstance(first, torch.Tensor):
            key = (id(first.untyped_storage()) if first.device.type == "meta"
                   else first.untyped_storage().data_ptr())
            if key not in before:
                self.allocs += 1
        return out


def _inputs(T: int, device: str) -> dict:
    """One sequence of ``T`` tokens at the contest heads, no initial state (notebook 05's
    timed inputs), on ``device`` (values: zeros; nothing reads them)."""
    s = CONTEST
    bf = torch.bfloat16
    z = dict(device=device)
    return dict(q=torch.zeros(T, s.num_q_heads, s.head_dim, dtype=bf, **z),
                k=torch.zeros(T, s.num_q_heads, s.head_dim, dtype=bf, **z),
                v=torch.zeros(T, s.num_v_heads, s.head_dim, dtype=bf, **z),
                a=torch.zeros(T, s.num_v_heads, dtype=bf, **z),
                b=torch.zeros(T, s.num_v_heads, dtype=bf, **z),
                A_log=torch.zeros(s.num_v_heads, **z), dt_bias=torch.zeros(s.num_v_heads, **z),
                cu_seqlens=torch.tensor([0, T], dtype=torch.int64, device=device), state=None)


def _measure(fn, calls: int, rounds: int) -> dict:
    for _ in range(10):
        fn()
    LAUNCHES[0] = 0
    fn()
    launches = LAUNCHES[0]
    with _OpCount() as c:
        fn()
    means = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        means.append((time.process_time() - t0) / calls * 1e6)
    return dict(min_us=round(min(means), 1), median_us=round(statistics.median(means), 1),
                launches=launches, torch_ops=sum(c.ops.values()), allocs=c.allocs,
                ops=dict(sorted(c.ops.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="32768,262144,1048576", help="tokens of the whole call")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default="meta", choices=("meta", "cpu"))
    args = ap.parse_args()
    interpreter.InterpretedFunction.run = _no_launch
    multi_gpu._all_gather = _no_gather
    torch.set_num_threads(1)
    W = args.world
    for T in (int(t) for t in args.T.split(",")):
        x = _inputs(T, args.device)
        bounds = multi_gpu.even_bounds(T, W)
        cases = [("gdn_prefill", T, None, lambda: gdn_prefill(**x, check_values=False))]
        for r in range(W):
            t0, t1 = bounds[r], bounds[r + 1]
            mine = {n: (t[t0:t1] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
            if r == 0:
                half = dict(mine, cu_seqlens=torch.tensor([0, t1 - t0], device=args.device))
                cases.append(("gdn_prefill", t1 - t0, None,
                              lambda h=half: gdn_prefill(**h, check_values=False)))
            cases.append(("multi_gpu", t1 - t0, r, lambda m=mine, r=r: _rank_call(m, bounds, r, W)))
        for name, tokens, rank, fn in cases:
            row = dict(impl=name, T_call=T, T_rank=tokens, rank=rank, world=W if rank is not None
                       else None, device=args.device)
            print(json.dumps(dict(row, **_measure(fn, args.calls, args.rounds))), flush=True)


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
