"""The fused walk alone, under several launch variants (GPU instrument).

    python scripts/walk_variants.py [--shapes 16x256 57x64 8x256] [--out walk.csv]

(a shape is a name of ``kernels.spec.PREFILL_SHAPES`` or ``NxL``, N sequences of L tokens)

For each shape: the intra-chunk kernel runs once (default config, ``"tm"``
intermediates); then, for each walk variant (tile width, warps, launch stages,
chunk-loop pipeline stages, register cap), the walk kernel alone is timed with
CUDA-graph replay (warm L2, as it runs after the intra-chunk kernel), its outputs
and final state compared with the default variant's, and the compiled kernel's
registers, spills and shared memory reported with the programs per SM they allow.
"""
from __future__ import annotations

import argparse
import csv

import torch

from kernels.bench.timing import time_fn
from kernels.prefill import DEFAULT_CONFIG, state_walk
from kernels.prefill.intra_chunk import intra_chunk_fwd
from kernels.prefill.pipeline import _intra
from kernels.prefill.state_walk import state_walk_fwd
from kernels.spec import PREFILL_SHAPES, make_prefill_inputs

# (label, BV, num_warps, num_stages, loop_stages, pipe_skip: the load kept out of the loop's
# pipeline, see state_walk_fwd)
VARIANTS = [
    ("bv64_w4_ls1", 64, 4, 2, 1, ""),
    ("bv64_w4_ls2", 64, 4, 2, 2, ""),
    ("bv64_w4_ls2_skipq", 64, 4, 2, 2, "q"),
    ("bv64_w4_ls3", 64, 4, 3, 3, ""),
    ("bv64_w4_ls3_skipq", 64, 4, 3, 3, "q"),
    ("bv64_w8_ls1", 64, 8, 2, 1, ""),
    ("bv64_w8_ls2", 64, 8, 2, 2, ""),
    ("bv128_w8_ls1", 128, 8, 2, 1, ""),
    ("bv128_w8_ls2", 128, 8, 2, 2, ""),
    ("bv32_w4_ls2", 32, 4, 2, 2, ""),
    ("bv32_w4_ls2_skipq", 32, 4, 2, 2, "q"),
    ("bv32_w4_ls3", 32, 4, 3, 3, ""),
    ("bv32_w4_ls3_skipq", 32, 4, 3, 3, "q"),
    ("bv16_w4_ls3", 16, 4, 3, 3, ""),
    ("bv16_w4_ls3_skipq", 16, 4, 3, 3, "q"),
]


def compiled_stats(seen):
    """(regs, spills, shared) of walk kernels compiled since ``seen`` (a set of keys)."""
    out = []
    for entry in getattr(state_walk.state_walk_kernel, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        for key, k in cache.items():
            if key not in seen:
                seen.add(key)
                out.append((k.n_regs, k.n_spills, k.metadata.shared))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["16x256", "57x64"])
    ap.add_argument("--variants", nargs="+", default=[v[0] for v in VARIANTS])
    ap.add_argument("--out", default="walk_variants.csv")
    args = ap.parse_args()
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    seen = set()
    compiled_stats(seen)
    rows = []
    for shape in args.shapes:
        if shape in PREFILL_SHAPES:
            lens = PREFILL_SHAPES[shape]
        else:   # "NxL": N sequences of L tokens
            n, length = map(int, shape.split("x"))
            lens = [length] * n
        x = make_prefill_inputs(lens, device="cuda")
        q, k, v, cu = x["q"], x["k"], x["v"], x["cu_seqlens"]
        T, HV, D = v.shape
        N = cu.numel() - 1
        scale = D ** -0.5
        w, _, gc, P, _ = intra_chunk_fwd(k, v, cu, a=x["a"], b=x["b"], A_log=x["A_log"],
                                         dt_bias=x["dt_bias"], q=q, scale=scale, tm_out=True,
                                         **_intra(DEFAULT_CONFIG, True))
        ref = None   # (the first variant run is the reference of the others)
        for label, BV, warps, stages, ls, pipe_skip in VARIANTS:
            if label not in args.variants:
                continue
            o = torch.empty_like(v)
            ht = torch.empty(N, HV, D, D, dtype=torch.float32, device=v.device)

            def walk():
                state_walk_fwd(k, w, v, gc, cu, p=P, initial_state=x["state"], output=o,
                               final_state=ht, BV=BV, num_warps=warps, num_stages=stages,
                               loop_stages=ls, pipe_skip=pipe_skip, q=q, scale=scale,
                               tm_form=True, dot_precision="bf16", out_precision="bf16")
            try:
                walk()
                torch.cuda.synchronize()
            except Exception as e:   # noqa: BLE001 - report and go on
                print(f"{shape} {label}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            if ref is None:
                ref = (o.float().clone(), ht.clone())
            d_o = (o.float() - ref[0]).abs().max().item()
            d_s = (ht - ref[1]).abs().max().item()
            t = time_fn(walk, "graph", rep=50, warmup=5, flush_l2=False)
            st = compiled_stats(seen)
            regs, spills, smem = st[-1] if st else ("?", "?", "?")
            per_sm = "?"
            if st:
                per_sm = min(65536 // (regs * 32 * warps) if regs else 99,
                             (233472 // smem) if smem else 99, 64 // warps)
            programs = N * HV * (D // BV)
            row = dict(shape=shape, variant=label, BV=BV, warps=warps, stages=stages,
                       loop_stages=ls, walk_us=round(t.median_us, 2), regs=regs,
                       spills=spills, smem=smem, per_sm=per_sm, programs=programs,
                       waves=round(programs / (per_sm * n_sm), 2) if per_sm != "?" else "?",
                       d_out=d_o, d_state=d_s)
            rows.append(row)
            print(" ".join(f"{a}={b}" for a, b in row.items()), flush=True)
        torch.cuda.empty_cache()
    if not rows:
        raise SystemExit("no variant ran")
    with open(args.out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


if __name__ == "__main__":
    main()
