"""Timeline of one ``prefill_multi_gpu`` call per rank: which rank waits, and for what.

Starts ``--world`` rank processes (``torch.multiprocessing``, ``spawn``; NCCL on one GPU
each, NVLink multicast off in every process: ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``; without CUDA, gloo on the
CPU under the Triton interpreter, a plumbing check). Inputs as notebook 05's: one sequence
of ``--T`` tokens at ``--hq/--hv/--d`` heads (the contest's by default), the generator's gates,
no initial state, the tokens split by ``even_bounds``. Each rank:

1. gates its share once against the float32 reference (outputs; the final state summed
   over the ranks): a failed gate is reported, and nothing is timed;
2. ``--reps`` calls as notebook 05 times them (barrier, synchronize, CUDA events around one
   eager call), and per call the host's share: ``enter_ns``, when the rank entered the call
   (``time.time_ns()``, one clock for all ranks of the host: the skew between ranks is what
   the all-gather makes the earlier rank wait for) and ``enqueue_us``, the host time until
   the call returned (every launch enqueued, no sync);
3. one more call under ``torch.profiler`` (CPU and CUDA activities: CUPTI): every GPU
   kernel's name, start and duration, relative to the call's first host event, and the
   GPU's idle gaps between them (where it waited for the host or for the other rank: the
   all-gather's kernel spans the wait on the rank that arrived first); the Chrome trace
   of that call goes to ``<out>/trace_rank<r>.json`` (Perfetto).

Rank 0 writes ``<out>/timeline.json`` (``out``: ``--out``, else ``$OUT``, else the current
folder): per rank the gate, the events' µs, ``enqueue_us`` and ``enter_ns`` per call, the
kernel list and the gaps. Under 2 minutes on 2 x H200 at 262,144 tokens (most of it the
kernels' first compile):

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 scripts/probes/multi_gpu_timeline.py --T 262144 --out $OUT [--root .probe/old]

``--root``: import ``kernels`` from that folder (an older tree unpacked there, e.g.
``git archive <sha> | tar -x -C .probe/old``) for an A/B on the same host; default: the
current folder.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

#: NVLink multicast off (the lent hosts' rule), set in the parent and again in every rank.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def _inputs(T, hq, hv, d, dev, seed=0):
    """One sequence of ``T`` tokens, generated on ``dev`` from ``seed`` (the same on every
    rank), as notebook 05's."""
    import torch

    from kernels.spec import GDNShape, make_prefill_inputs

    small = make_prefill_inputs([1], GDNShape(hq, hv, d), seed=seed)   # gate parameters
    gen = torch.Generator(dev).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=dev)

    def unit(x):
        return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(torch.bfloat16)

    return dict(q=unit(randn(T, hq, d)), k=unit(randn(T, hq, d)),
                v=randn(T, hv, d).to(torch.bfloat16), a=randn(T, hv).to(torch.bfloat16),
                b=randn(T, hv).to(torch.bfloat16), A_log=small["A_log"].to(dev),
                dt_bias=small["dt_bias"].to(dev), state=None,
                cu_seqlens=torch.tensor([0, T], dtype=torch.int64, device=dev))


def _kernels(prof, t_call_us):
    """GPU kernels of the profiled call ``[(name, start_us, dur_us)]`` (start relative to
    the call's first host event, ``t_call_us`` on the profiler's clock) and the GPU's idle
    gaps between consecutive kernels ``[(after, before, gap_us)]``."""
    from torch.autograd import DeviceType

    ks = sorted(((e.name, e.time_range.start - t_call_us, e.time_range.elapsed_us())
                 for e in prof.events() if e.device_type == DeviceType.CUDA),
                key=lambda k: k[1])
    gaps = [(a[0], b[0], round(b[1] - (a[1] + a[2]), 2)) for a, b in zip(ks, ks[1:])]
    return [(n, round(s, 2), round(du, 2)) for n, s, du in ks], gaps


def _rank(rank, args, tmp):
    for k, v in NO_MULTICAST.items():
        os.environ[k] = v
    sys.path.insert(0, os.path.abspath(args.root))
    import torch
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch.distributed as dist

    from kernels.checks import check_close
    from kernels.prefill.multi_gpu import even_bounds, prefill_multi_gpu
    from kernels.reference import prefill_reference_chunked

    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    kw = {}
    if cuda:
        torch.cuda.set_device(dev)
        kw["device_id"] = dev
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp}/init",
                            rank=rank, world_size=args.world, **kw)
    W, T = args.world, args.T
    bounds = even_bounds(T, W)
    t0, t1 = bounds[rank], bounds[rank + 1]
    x = _inputs(T, args.hq, args.hv, args.d, dev)
    mine = {n: (t[t0:t1] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}

    def call():
        return prefill_multi_gpu(**mine, bounds=bounds)

    # 1. the gate (the first call also compiles)
    o, h = call()
    ref_o, ref_h = prefill_reference_chunked(**x)
    dist.all_reduce(h)
    res = [check_close(o, ref_o[t0:t1]), check_close(h, ref_h, name="new_state")]
    ok = torch.tensor([float(all(c.ok for c in res))], device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    row = dict(rank=rank, T=T, T_rank=t1 - t0, world=W, device=str(dev),
               gpu=torch.cuda.get_device_name(dev) if cuda else "cpu",
               gate=dict(ok=bool(ok.item()), mine_ok=all(c.ok for c in res),
                         max_abs_err=max(c.max_abs_err for c in res),
                         reason="; ".join(c.reason for c in res if c.reason)))
    del ref_o, ref_h
    if row["gate"]["ok"]:
        # 2. calls as notebook 05 times them, with the host's share
        for _ in range(args.warmup):
            call()
        ev, enq, enter = [], [], []
        for _ in range(args.reps):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            enter.append(time.time_ns())
            s = time.perf_counter()
            call()
            enq.append(round((time.perf_counter() - s) * 1e6, 1))
            if cuda:
                b.record()
                b.synchronize()
                ev.append(round(a.elapsed_time(b) * 1e3, 1))
        row.update(events_us=ev, enqueue_us=enq, enter_ns=enter)
        # 3. one call under the profiler
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            with record_function("prefill_multi_gpu call"):
                call()
            if cuda:
                torch.cuda.synchronize()
        mark = next(e for e in prof.events() if e.name == "prefill_multi_gpu call")
        row["call_host_us"] = round(mark.time_range.elapsed_us(), 1)
        row["kernels"], row["gaps"] = _kernels(prof, mark.time_range.start)
        prof.export_chrome_trace(os.path.join(args.out, f"trace_rank{rank}.json"))
    rows = [None] * W
    dist.all_gather_object(rows, row)
    if rank == 0:
        with open(os.path.join(args.out, "timeline.json"), "w") as f:
            json.dump(dict(root=args.root, bounds=bounds, ranks=rows), f, indent=1)
        for r in rows:
            print(json.dumps({k: r.get(k) for k in ("rank", "gpu", "gate", "events_us",
                                                     "enqueue_us", "call_host_us")}))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=262144, help="tokens of the one sequence")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hq", type=int, default=4)
    ap.add_argument("--hv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--root", default=".")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for k, v in NO_MULTICAST.items():
        os.environ[k] = v
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gdn-timeline-") as tmp:
        mp.start_processes(_rank, args=(args, tmp), nprocs=args.world, join=True,
                           start_method="spawn")


if __name__ == "__main__":
    main()
