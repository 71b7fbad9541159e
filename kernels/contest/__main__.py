"""``python -m kernels.contest pack|evaluate`` (see :mod:`kernels.contest`)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.contest",
                                     description="Our GDN kernels as flashinfer-bench solutions.")
    sub = parser.add_subparsers(dest="command", required=True)
    pack = sub.add_parser("pack", help="write a solution JSON for a public definition")
    pack.add_argument("--op", required=True, choices=("decode", "prefill"))
    pack.add_argument("--variant", default=None,
                      help="prefill variant: fused (default) or graph")
    pack.add_argument("--out", required=True, help="folder for <solution-name>.json")
    ev = sub.add_parser("evaluate", help="flashinfer-bench on our solutions and FlashInfer "
                                         "(CUDA GPU, flashinfer-bench importable)")
    ev.add_argument("--ops", default="decode,prefill", help="comma list of decode, prefill")
    ev.add_argument("--out", default=None,
                    help="trace-set root (default results/<gpu-slug>/contest)")
    ev.add_argument("--warmup", type=int, default=10, help="flashinfer-bench warmup_runs")
    ev.add_argument("--iterations", type=int, default=50, help="flashinfer-bench iterations")
    ev.add_argument("--trials", type=int, default=3, help="flashinfer-bench num_trials")
    ev.add_argument("--rep", type=int, default=50,
                    help="calls per point for our cupti_cold and host-call timings")
    ev.add_argument("--no-baseline", action="store_true", help="skip the FlashInfer solutions")
    args = parser.parse_args(argv)

    if args.command == "pack":
        from .solution import solution, write_solution

        try:
            sol = solution(args.op, variant=args.variant)
        except ValueError as e:
            parser.error(str(e))
        path = write_solution(sol, args.out)
        print(f"{path}  ({sol['definition']}, {len(sol['sources'])} source files, "
              f"entry {sol['spec']['entry_point']})")
        return 0

    from .evaluate import evaluate

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in ("decode", "prefill")]
    if bad or not ops:
        parser.error(f"--ops must list decode and/or prefill, got {args.ops!r}")
    evaluate(ops, out=args.out, warmup=args.warmup, iterations=args.iterations,
             trials=args.trials, rep=args.rep, baseline=not args.no_baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
