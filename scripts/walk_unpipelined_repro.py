"""Reproduce the unpipelined-walk fault on a GPU, for compute-sanitizer (instrument).

    compute-sanitizer --tool memcheck python scripts/walk_unpipelined_repro.py --BV 32

Runs the ``fused`` variant's two kernels directly (the pipeline refuses
``walk_loop_stages=1`` below width 64) on single-chunk sequences, with the walk's
chunk loop unpipelined at the given tile width, and checks the result against the
float32 reference. On an H200 with triton 3.6 widths 16 and 32 raised an illegal
memory access (docs/notes.md, prefill v5); width 64 passed.
"""
from __future__ import annotations

import argparse

import torch

from kernels.checks import check_outputs
from kernels.prefill import PrefillConfig
from kernels.prefill.intra_chunk import intra_chunk_fwd
from kernels.prefill.pipeline import _intra
from kernels.prefill.state_walk import state_walk_fwd
from kernels.reference import prefill_reference
from kernels.spec import CONTEST, make_prefill_inputs, resolve_scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--BV", type=int, default=32)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--loop-stages", type=int, default=1)
    ap.add_argument("--lens", type=int, nargs="+", default=[64] * 4)
    args = ap.parse_args()
    x = make_prefill_inputs(args.lens, CONTEST, seed=0, device="cuda", with_state=True)
    T, N = sum(args.lens), len(args.lens)
    HV, D = x["v"].shape[1], x["v"].shape[2]
    w, u, gc, P, ob = intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], a=x["a"], b=x["b"],
                                      A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"],
                                      scale=resolve_scale(None, D), **_intra(PrefillConfig()))
    o = torch.empty(T, HV, D, dtype=torch.bfloat16, device="cuda")
    ht = torch.empty(N, HV, D, D, dtype=torch.float32, device="cuda")
    state_walk_fwd(x["k"], w, u, gc, x["cu_seqlens"], p=P, ob=ob, initial_state=x["state"],
                   output=o, final_state=ht, BV=args.BV, num_warps=args.warps, num_stages=2,
                   loop_stages=args.loop_stages, dot_precision="bf16", out_precision="bf16")
    torch.cuda.synchronize()
    r = check_outputs((o, ht), prefill_reference(**x))
    print(f"BV={args.BV} warps={args.warps} loop_stages={args.loop_stages}: ok={r.ok} "
          f"max_abs={r.max_abs_err:.3g}")


if __name__ == "__main__":
    main()
