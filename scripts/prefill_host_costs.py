"""Host-side cost of one eager ``fused`` prefill call, piece by piece (GPU needed).

    python scripts/prefill_host_costs.py [--lens 6] [--out host_costs.csv]

The eager path's ``cupti_cold`` span is the first kernel's start to the last
kernel's end; at short lengths it is set by how long the host takes between
the two launches, not by the GPU. This script times (``time.perf_counter``,
median of 7 blocks of 200 calls, no synchronisation inside a block; GPU work per
call is shorter than the host work at these lengths) the whole call and its
parts: input validation, output allocation, the intra-chunk launch, the walk
launch (whole, bind only, and the bound launch alone), and an empty Triton kernel as the launch floor of this host. It also
prints the ``cupti_cold`` span and the ``graph`` time of the whole call.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time

import torch
import triton
import triton.language as tl

from kernels.bench.timing import time_fn
from kernels.prefill import PrefillConfig, gdn_prefill, plan_fused
from kernels.prefill.intra_chunk import intra_chunk_fwd
from kernels.prefill.pipeline import _intra
from kernels.prefill.state_walk import state_walk_fwd
from kernels.spec import CONTEST, make_prefill_inputs, resolve_scale, validate_prefill_inputs


@triton.jit
def _empty_kernel(x):
    pass


def per_call_us(fn, blocks: int = 7, n: int = 200) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", type=int, nargs="+", default=[6])
    ap.add_argument("--out", default="host_costs.csv")
    args = ap.parse_args()
    x = make_prefill_inputs(args.lens, CONTEST, seed=0, device="cuda", with_state=True)
    cfg = PrefillConfig()
    T, N = sum(args.lens), len(args.lens)
    scale = resolve_scale(None, 128)
    BV, seg = plan_fused(T, N, 8, 128, torch.device("cuda"), None, cfg)
    w, u, gc, P, ob = intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], a=x["a"], b=x["b"],
                                      A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"],
                                      scale=scale, pdl_trigger="start", **_intra(cfg))
    o = torch.empty(T, 8, 128, dtype=torch.bfloat16, device="cuda")
    ht = torch.empty(N, 8, 128, 128, dtype=torch.float32, device="cuda")
    dummy = torch.empty(1, device="cuda")
    go_walk = state_walk_fwd(x["k"], w, u, gc, x["cu_seqlens"], p=P, ob=ob,
                             initial_state=x["state"], output=o, final_state=ht, BV=BV,
                             num_warps=4, num_stages=3, pdl=True, dot_precision="bf16",
                             out_precision="bf16", defer=True)
    go_walk()   # (compiles on the first call; later calls are the bound launch)
    go_walk = state_walk_fwd(x["k"], w, u, gc, x["cu_seqlens"], p=P, ob=ob,
                             initial_state=x["state"], output=o, final_state=ht, BV=BV,
                             num_warps=4, num_stages=3, pdl=True, dot_precision="bf16",
                             out_precision="bf16", defer=True)
    pieces = {
        "gdn_prefill(fused), whole call": lambda: gdn_prefill(**x, variant="fused"),
        "validate_prefill_inputs": lambda: validate_prefill_inputs(**x, check_values=False),
        "plan_fused": lambda: plan_fused(T, N, 8, 128, torch.device("cuda"), None, cfg),
        "2 output allocations": lambda: (torch.empty_like(o), torch.empty_like(ht)),
        "intra_chunk_fwd (allocs + launch)": lambda: intra_chunk_fwd(
            x["k"], x["v"], x["cu_seqlens"], a=x["a"], b=x["b"], A_log=x["A_log"],
            dt_bias=x["dt_bias"], q=x["q"], scale=scale, pdl_trigger="start", **_intra(cfg)),
        "state_walk_fwd (launch)": lambda: state_walk_fwd(
            x["k"], w, u, gc, x["cu_seqlens"], p=P, ob=ob, initial_state=x["state"], output=o,
            final_state=ht, BV=BV, num_warps=4, num_stages=3, pdl=True,
            dot_precision="bf16", out_precision="bf16"),
        "state_walk_fwd(defer=True) (bind only)": lambda: state_walk_fwd(
            x["k"], w, u, gc, x["cu_seqlens"], p=P, ob=ob, initial_state=x["state"], output=o,
            final_state=ht, BV=BV, num_warps=4, num_stages=3, pdl=True,
            dot_precision="bf16", out_precision="bf16", defer=True),
        "bound walk launch (go())": go_walk,
        "empty triton kernel (launch floor)": lambda: _empty_kernel[(1,)](dummy),
        "torch.empty (one allocation)": lambda: torch.empty(64, device="cuda"),
    }
    rows = []
    for name, fn in pieces.items():
        us = per_call_us(fn)
        rows.append(dict(piece=name, host_us=round(us, 2)))
        print(f"{name:40s} {us:8.2f} us", flush=True)
    call = lambda: gdn_prefill(**x, variant="fused")  # noqa: E731
    for method in ("cupti_cold", "graph"):
        t = time_fn(call, method, rep=50, warmup=5).median_us
        rows.append(dict(piece=f"whole call, GPU {method} (median)", host_us=round(t, 2)))
        print(f"{'whole call ' + method:40s} {t:8.2f} us (GPU)", flush=True)
    with open(args.out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=["piece", "host_us"])
        wr.writeheader()
        wr.writerows(rows)


if __name__ == "__main__":
    main()
