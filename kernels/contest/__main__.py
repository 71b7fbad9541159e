"""``python -m kernels.contest pack|evaluate`` (see :mod:`kernels.contest`)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _comma_list(text: str) -> list:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.contest",
                                     description="Our GDN kernels as flashinfer-bench solutions.")
    sub = parser.add_subparsers(dest="command", required=True)
    pack = sub.add_parser("pack", help="write a solution JSON for a public definition")
    pack.add_argument("--op", required=True, choices=("decode", "prefill"))
    pack.add_argument("--variant", default=None,
                      help="prefill variant: fused (default) or graph")
    pack.add_argument("--out", required=True, help="folder for <solution-name>.json")
    ev = sub.add_parser("evaluate", help="the contest's flashinfer-bench on ours, FlashInfer's "
                                         "baseline and --solutions (CUDA GPU; "
                                         "docs/contest.md)")
    ev.add_argument("--ops", default="decode,prefill", help="comma list of decode, prefill")
    ev.add_argument("--solutions", default="",
                    help="comma list of solution JSONs / starter-kit folders to evaluate too")
    ev.add_argument("--root", default=None,
                    help="results root (default: the repository's results/); writes "
                         "<root>/<gpu-slug>/contest_<op>/")
    ev.add_argument("--rep", type=int, default=50,
                    help="calls per workload for our own cupti_cold cross-check")
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

    from .evaluate import check_arguments, check_environment, evaluate

    ops, solutions = _comma_list(args.ops), _comma_list(args.solutions)
    if args.rep < 1:
        parser.error(f"--rep must be >= 1, got {args.rep}")
    try:
        check_arguments(ops, solutions)
    except ValueError as e:
        parser.error(str(e))
    try:
        check_environment()
    except RuntimeError as e:
        print(f"contest evaluate: {e}", file=sys.stderr)
        return 1
    evaluate(ops, solutions=solutions, root=args.root, rep=args.rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
