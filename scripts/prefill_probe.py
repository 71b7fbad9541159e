"""Probe prefill configs on a GPU: correctness, graph time and per-kernel durations.

    python scripts/prefill_probe.py [--out probe.csv] [--budget-s 480] [--quick]

For every (shape, config, cp) row: the contest check against the float32
reference (a failing row is reported, not timed), the ``graph`` median (warm
L2, the README's method) and the GPU duration of each kernel of one call
(torch.profiler), the eager ``cupti_cold`` span. At the end, registers / spills / shared memory of every
compiled prefill kernel. Rows stream to stdout and to the CSV as they finish;
the run stops cleanly when ``--budget-s`` is used up.
"""
from __future__ import annotations

import argparse
import csv
import time
from dataclasses import replace

import torch

from kernels.bench.timeline import record_timeline
from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.prefill import ACCURATE_CONFIG, PrefillConfig, gdn_prefill, plan_fused
from kernels.reference import prefill_reference
from kernels.spec import CONTEST, PREFILL_SHAPES, make_prefill_inputs

SHAPES = ["T6", "T64", "T512", "T2048", "T8192", "4x1024", "16x256", "57x64"]
CONFIGS = {
    "default": PrefillConfig(),
    "wu": PrefillConfig(intermediates="wu"),
    "single": PrefillConfig(single_launch=True, intermediates="wu"),
    "single_tm": PrefillConfig(single_launch=True),
    "iw8nreg128": PrefillConfig(intra_warps=8, intra_maxnreg=128),
    "walk128w8": PrefillConfig(walk_BV=128, walk_warps=8),
    "first_inline": PrefillConfig(first_chunk_inline=True, intermediates="wu"),
    "offdiag_tf32": PrefillConfig(solve="blocks", intra_offdiag_precision="tf32"),
    "rows": PrefillConfig(solve="blocks", intra_solve_diag="rows"),
    "rows_offdiag_tf32": PrefillConfig(solve="blocks", intra_solve_diag="rows",
                                       intra_offdiag_precision="tf32"),
    "precise": PrefillConfig(storage="precise", intra_precision="bf16x2",
                             walk_precision="bf16x2", inline_precision="bf16x2"),
    "walk_x2": PrefillConfig(walk_precision="bf16x2", inline_precision="bf16x2"),
    "storage_precise": PrefillConfig(storage="precise"),
    "storage_precise_walk_x2": PrefillConfig(storage="precise", walk_precision="bf16x2",
                                             inline_precision="bf16x2"),
    "intra_x2_walk_x2": PrefillConfig(intra_precision="bf16x2", walk_precision="bf16x2",
                                      inline_precision="bf16x2"),
    "cpk_bv16": PrefillConfig(cp_combine="kernel", walk_BV=16),
    "cpk_bv32": PrefillConfig(cp_combine="kernel", walk_BV=32),
    "cpk_bv64": PrefillConfig(cp_combine="kernel", walk_BV=64),
    "cpi_bv32": PrefillConfig(walk_BV=32),
    "chain_bf16x2": PrefillConfig(cp_chain_precision="bf16x2"),
    "chain_tf32x3": PrefillConfig(cp_chain_precision="tf32x3"),
    "tm": PrefillConfig(intermediates="tm"),
    "batched": PrefillConfig(solve="batched", intra_solve_precision="ieee",
                             intra_offdiag_precision="ieee", intra_band_store=False,
                             intra_maxnreg=255),   # (probe 30's "batched": ieee, assembled)
    "batched_offtf32": PrefillConfig(solve="batched", intra_offdiag_precision="tf32"),
    "batched_tf32x3": PrefillConfig(solve="batched", intra_solve_precision="tf32x3"),
    "bt3_off1": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                              intra_offdiag_precision="tf32"),
    "bx2": PrefillConfig(solve="batched", intra_solve_precision="bf16x2"),
    "bt3_band": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                              intra_band_store=True),
    "bt3_w8n128": PrefillConfig(solve="batched", intra_solve_precision="tf32x3", walk_warps=8,
                                walk_maxnreg=128),
    "bt3_w4n128_bv32": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                     walk_BV=32, walk_maxnreg=128),
    "bx2_band": PrefillConfig(solve="batched", intra_solve_precision="bf16x2",
                              intra_band_store=True),
    "bx2_band_n128": PrefillConfig(solve="batched", intra_solve_precision="bf16x2",
                                   intra_band_store=True, intra_maxnreg=128),
    "bx2_band_n168": PrefillConfig(solve="batched", intra_solve_precision="bf16x2",
                                   intra_band_store=True, intra_maxnreg=168),
    "bx2_band_nopdl": PrefillConfig(solve="batched", intra_solve_precision="bf16x2",
                                    intra_band_store=True, pdl=False),
    "bt3_offx2_band": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                    intra_offdiag_precision="bf16x2", intra_band_store=True),
    "bt3_off1_band": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                   intra_offdiag_precision="tf32", intra_band_store=True),
    "bt3_off1_band_n128": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                        intra_offdiag_precision="tf32", intra_band_store=True,
                                        intra_maxnreg=128),
    "bt3_off1_band_n112": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                        intra_offdiag_precision="tf32", intra_band_store=True,
                                        intra_maxnreg=112),
    "bt3_off1_band_n96": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                       intra_offdiag_precision="tf32", intra_band_store=True,
                                       intra_maxnreg=96),
    "bt3_off1_band_n128_w2": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                           intra_offdiag_precision="tf32",
                                           intra_band_store=True, intra_warps=2),
    "blocks": PrefillConfig(solve="blocks"),
    "v8_w128_ls2": PrefillConfig(walk_BV=128, walk_warps=8, walk_stages=2, walk_loop_stages=2),
    "v8_w128_ls3": PrefillConfig(walk_BV=128, walk_warps=8, walk_stages=3, walk_loop_stages=3),
    "v8_w64w8_ls2": PrefillConfig(walk_BV=64, walk_warps=8, walk_stages=2, walk_loop_stages=2),
    "v8_w64w4_ls2": PrefillConfig(walk_BV=64, walk_warps=4, walk_stages=2, walk_loop_stages=2),
    "n8_t3": PrefillConfig(intra_solve_diag="neumann8"),
    "n8_x2": PrefillConfig(intra_solve_diag="neumann8", intra_solve_precision="bf16x2"),
    "n8_x2_offx2": PrefillConfig(intra_solve_diag="neumann8", intra_solve_precision="bf16x2",
                                 intra_offdiag_precision="bf16x2"),
    "tree": PrefillConfig(intra_solve_tree=True),
    "tree_acc": PrefillConfig(intra_solve_tree=True, walk_acc_fuse=True),
    "acc": PrefillConfig(walk_acc_fuse=True),
    "acc_early": PrefillConfig(walk_acc_fuse=True, walk_early_loads=True),
    "early": PrefillConfig(walk_early_loads=True),
    "batched_early": PrefillConfig(solve="batched", walk_early_loads=True),
    "tm_bv32": PrefillConfig(intermediates="tm", walk_BV=32),
    "tm_bv16": PrefillConfig(intermediates="tm", walk_BV=16),
    "tm_w8": PrefillConfig(intermediates="tm", walk_warps=8),
    "tm_ls2": PrefillConfig(intermediates="tm", walk_loop_stages=2),
    "tm_x2": PrefillConfig(intermediates="tm", walk_precision="bf16x2",
                           inline_precision="bf16x2"),
    "tm_inreg168": PrefillConfig(intermediates="tm", intra_maxnreg=168),
    "tm_inreg128": PrefillConfig(intermediates="tm", intra_maxnreg=128),
    "tm_iw8": PrefillConfig(intermediates="tm", intra_warps=8),
    "tm_wnreg168": PrefillConfig(intermediates="tm", walk_maxnreg=168),
    "tm_wnreg128": PrefillConfig(intermediates="tm", walk_maxnreg=128),
    "tm_bv32_s16": PrefillConfig(intermediates="tm", walk_BV=32, summary_BV=16),
    "tm_bv32_s64": PrefillConfig(intermediates="tm", walk_BV=32, summary_BV=64),
    "tm_tile": PrefillConfig(intermediates="tm", solve="tile"),
    "tm_s64": PrefillConfig(intermediates="tm", summary_BV=64),
    "tm_bv32_s128": PrefillConfig(intermediates="tm", walk_BV=32, summary_BV=128),
    "tm_bv32_s64w8": PrefillConfig(intermediates="tm", walk_BV=32, summary_BV=64,
                                   summary_warps=8),
    "tm_bv32_s128w8": PrefillConfig(intermediates="tm", walk_BV=32, summary_BV=128,
                                    summary_warps=8),
    "tm_bv32_s64st2": PrefillConfig(intermediates="tm", walk_BV=32, summary_BV=64,
                                    summary_stages=2),
    "tm_bv128w8": PrefillConfig(intermediates="tm", walk_BV=128, walk_warps=8),
    "pskq": PrefillConfig(walk_loop_stages=2, walk_pipe_skip="q"),
    "pskaq": PrefillConfig(walk_loop_stages=2, walk_pipe_skip="aq"),
    "ls2": PrefillConfig(walk_loop_stages=2),
    "two_launch": PrefillConfig(single_launch=False),
    "walkers_512": PrefillConfig(single_launch_max_T=512),
    "nofirst": PrefillConfig(first_chunk_inline=False),
    "first": PrefillConfig(first_chunk_inline=True),
    "wt128": PrefillConfig(walk_transposed=True),
    "wt128_ls3": PrefillConfig(walk_transposed=True, walk_stages=3, walk_loop_stages=3),
    "wt64": PrefillConfig(walk_transposed=True, walk_BV=64),
    "wt64_ls3": PrefillConfig(walk_transposed=True, walk_BV=64, walk_stages=3,
                              walk_loop_stages=3),
    "wt32_ls3": PrefillConfig(walk_transposed=True, walk_BV=32, walk_stages=3,
                              walk_loop_stages=3),
    "wt16_ls3": PrefillConfig(walk_transposed=True, walk_BV=16, walk_stages=3,
                              walk_loop_stages=3),
    "accurate": ACCURATE_CONFIG,
    "accurate_tm": replace(ACCURATE_CONFIG, intermediates="tm"),
}
CPS = {"T8192": [None, 8, 32], "T2048": [None, 8, 16], "4x1024": [None, 8]}
CP_CONFIGS = ("default", "cpk_bv16", "cpk_bv32", "cpk_bv64", "cpi_bv32", "chain_bf16x2",
              "tm_bv32", "tm_bv32_s64")


def short(name: str) -> str:
    for key in ("intra_chunk", "state_walk", "segment_combine", "chunk_output", "gates"):
        if key in name:
            return key
    return name[:24]


def kernel_stats():
    """(kernel, n_regs, n_spills, shared bytes, constexprs summary) of compiled prefill kernels."""
    from kernels.prefill import context_parallel, intra_chunk, state_walk
    out = []
    for fn in (intra_chunk.intra_chunk_kernel, state_walk.state_walk_kernel,
               context_parallel.segment_combine_kernel):
        caches = getattr(fn, "device_caches", {})
        for dev, entry in caches.items():
            cache = entry[0] if isinstance(entry, tuple) else entry
            for key, k in cache.items():
                md = getattr(k, "metadata", None)
                out.append((fn.__name__, getattr(k, "n_regs", "?"), getattr(k, "n_spills", "?"),
                            getattr(md, "shared", "?"), getattr(md, "num_warps", "?"),
                            str(key)[:160]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe.csv")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--stages1", action="store_true",
                    help="only: the fused walk with num_stages=1 (bypasses the config check; "
                         "it crashed on triton 3.6 before -- run in its own process)")
    args = ap.parse_args()
    t_start = time.time()
    if args.stages1:
        PrefillConfig.__post_init__ = lambda self: None   # let walk_stages=1 through
        CONFIGS.clear()
        CONFIGS["stages1"] = PrefillConfig(walk_stages=1)
        args.configs = ["stages1"]
    f = open(args.out, "w", newline="")
    wr = None
    for shape in args.shapes:
        lens = PREFILL_SHAPES[shape]
        x = make_prefill_inputs(lens, CONTEST, seed=0, device="cuda", with_state=True)
        ref = prefill_reference(**x)
        T, N = sum(lens), len(lens)
        for cname in args.configs:
            cfg = CONFIGS[cname]
            for cp in CPS.get(shape, [None]) if cname in CP_CONFIGS else [None]:
                if time.time() - t_start > args.budget_s:
                    print("budget used up; stopping", flush=True)
                    break
                row = dict(shape=shape, config=cname, cp=cp,
                           seg=plan_fused(T, N, 8, 128, torch.device("cuda"), cp, cfg)[1])
                call = lambda: gdn_prefill(**x, variant="fused", config=cfg, cp=cp)  # noqa: E731
                try:
                    r = check_outputs(call(), ref)
                    row.update(ok=r.ok, max_abs=r.max_abs_err, rel_l2=r.rel_l2_err)
                    if r.ok:
                        row["graph_us"] = time_fn(call, "graph", rep=30, warmup=3).median_us
                        tl = record_timeline(call)
                        for i, g in enumerate(tl.gpu.itertuples()):
                            row[f"k{i}"] = f"{short(g.name)}={g.dur_us:.1f}"
                        row["span_us"] = tl.summary()["span_us"]
                        row["cold_us"] = time_fn(call, "cupti_cold", rep=30,
                                                 warmup=3).median_us
                        torch.cuda.synchronize()
                        t_h = time.perf_counter()
                        for _ in range(20):
                            call()
                        row["host_us"] = (time.perf_counter() - t_h) / 20 * 1e6
                        torch.cuda.synchronize()
                    else:
                        row["reason"] = r.reason[:120]
                except Exception as e:  # report, keep going
                    row.update(ok=False, reason=f"{type(e).__name__}: {str(e)[:160]}")
                print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in row.items()), flush=True)
                if wr is None:
                    wr = csv.DictWriter(f, fieldnames=["shape", "config", "cp", "seg", "ok",
                                                       "max_abs", "rel_l2", "graph_us", "span_us", "cold_us", "host_us",
                                                       "k0", "k1", "k2", "k3", "reason"],
                                        extrasaction="ignore")
                    wr.writeheader()
                wr.writerow(row)
                f.flush()
        del x, ref
        torch.cuda.empty_cache()
    for s in kernel_stats():
        print("STATS", *s, flush=True)
    print(f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
