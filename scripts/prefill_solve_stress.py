"""Accuracy of the intra-chunk solve's options on correlated-key inputs (GPU).

    python scripts/prefill_solve_stress.py [--out solve_stress.csv]

For each key spread (:func:`kernels.stress_inputs.make_prefill_stress_inputs`;
0 = identical keys in a sequence, 1 = nearly independent), each length set and
each solve config (and FLA / FlashInfer when installed): the ``fused`` variant
against the float32 reference under the contest rule (max abs error, relative L2 error, pass/fail). Contest inputs hide
solve precision problems (``I + A`` is near the identity there); these do not.
"""
from __future__ import annotations

import argparse
import csv
from dataclasses import replace

import torch

from kernels.checks import check_outputs
from kernels.peers import prefill_impls
from kernels.prefill import ACCURATE_CONFIG, PrefillConfig, gdn_prefill
from kernels.reference import prefill_reference
from kernels.spec import CONTEST
from kernels.stress_inputs import make_prefill_stress_inputs

CONFIGS = {
    "default": PrefillConfig(),
    "v8 walk paths": PrefillConfig(walk_transposed=False, single_launch_max_T=0),
    "neumann-ieee (blocks, default before v8)": PrefillConfig(solve="blocks"),
    "precise": ACCURATE_CONFIG,
    "wu (default before 8a40956)": PrefillConfig(intermediates="wu"),
    "precise tm": replace(ACCURATE_CONFIG, intermediates="tm"),
    "walk-x2": PrefillConfig(walk_precision="bf16x2", inline_precision="bf16x2"),
    "storage-precise": PrefillConfig(storage="precise"),
    "storage-precise walk-x2": PrefillConfig(storage="precise", walk_precision="bf16x2",
                                             inline_precision="bf16x2"),
    "intra-x2 walk-x2": PrefillConfig(intra_precision="bf16x2", walk_precision="bf16x2",
                                      inline_precision="bf16x2"),
    "precise rows offdiag-tf32": replace(ACCURATE_CONFIG, intra_solve_diag="rows",
                                         intra_offdiag_precision="tf32"),
    # (one-pass "tf32" / "bf16" Neumann inverses were measured here at 9167759 --
    #  results/nvidia-h200/dev_checks/prefill_solve_stress_9167759.csv: errors up to 1e14 --
    #  and PrefillConfig refuses them since)
    "neumann-ieee offdiag-tf32": PrefillConfig(solve="blocks", intra_offdiag_precision="tf32"),
    "rows offdiag-ieee": PrefillConfig(solve="blocks", intra_solve_diag="rows"),
    "rows offdiag-tf32": PrefillConfig(solve="blocks", intra_solve_diag="rows",
                                       intra_offdiag_precision="tf32"),
    "rows offdiag-bf16": PrefillConfig(solve="blocks", intra_solve_diag="rows",
                                       intra_offdiag_precision="bf16"),
    "neumann8 tf32x3": PrefillConfig(intra_solve_diag="neumann8"),
    "neumann8 bf16x2": PrefillConfig(intra_solve_diag="neumann8", intra_solve_precision="bf16x2"),
    "batched ieee": PrefillConfig(solve="batched", intra_solve_precision="ieee",
                                  intra_offdiag_precision="ieee"),
    "batched tf32x3": PrefillConfig(solve="batched", intra_solve_precision="tf32x3"),
    "batched tf32x3 offdiag-tf32": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                                 intra_offdiag_precision="tf32"),
    "batched bf16x2": PrefillConfig(solve="batched", intra_solve_precision="bf16x2"),
    "batched tf32x3 offdiag-bf16x2": PrefillConfig(solve="batched", intra_solve_precision="tf32x3",
                                                   intra_offdiag_precision="bf16x2"),
    "precise batched": replace(ACCURATE_CONFIG, solve="batched"),
}
SPREADS = [0.0, 0.02, 0.1, 1.0]
PEERS = prefill_impls(("fla", "flashinfer"))
LENS = {"8x64": [64] * 8, "300+64": [300, 64]}
#: shapes that take the short-walk paths of the default (one launch with walkers at T <= 128;
#: the transposed walk for short walks at width 64): ``--lens-set short``
LENS_SHORT = {"100+28": [100, 28], "16x256": [256] * 16, "57x64": [64] * 57}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="solve_stress.csv")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), help="subset of CONFIGS")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--lens-set", choices=("default", "short"), default="default",
                    help="default: 8x64 and 300+64; short: 100+28, 16x256, 57x64")
    args = ap.parse_args()
    for name, fn in PEERS.items():
        if not fn:
            print(f"{name}: {fn!r}")
    rows = []
    for spread in SPREADS:
        for lname, lens in (LENS_SHORT if args.lens_set == "short" else LENS).items():
            x = make_prefill_stress_inputs(lens, CONTEST, spread=spread, device="cuda")
            ref = prefill_reference(**x)
            calls = {f"ours {c}": (lambda cfg=CONFIGS[c]: gdn_prefill(**x, variant="fused",
                                                                      config=cfg))
                     for c in args.configs}
            for name, fn in PEERS.items():
                if fn and not args.no_peers:
                    calls[name] = lambda fn=fn: fn(**x)
            for cname, call in calls.items():
                r = check_outputs(call(), ref)
                row = dict(spread=spread, lens=lname, config=cname, ok=r.ok,
                           max_abs=r.max_abs_err, rel_l2=r.rel_l2_err,
                           reason=r.reason[:90])
                rows.append(row)
                print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in row.items()), flush=True)
    with open(args.out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


if __name__ == "__main__":
    main()
