"""GPU self-check of the prefill: correctness on the contest shapes, then (optionally) timing.

    python -m kernels.prefill.selfcheck                       # all variants, all shapes
    python -m kernels.prefill.selfcheck --shapes T8192 T6 --variants fused --time
    python -m kernels.prefill.selfcheck --shapes T8192 --cp 0 4 8 16 --time
    python -m kernels.prefill.selfcheck --shapes T8192 T64 57x64 --accurate --time

Correctness is the contest rule (:func:`kernels.checks.check_outputs`) against
:func:`kernels.reference.prefill_reference` on :func:`kernels.spec.make_prefill_inputs`
(unit-norm q/k). Timing uses :func:`kernels.bench.timing.time_fn` (``graph`` and
``cupti_cold``). Prints one line per (shape, variant, cp, config). Runs on CPU
too (interpreter; only sensible for small shapes and D).
"""
from __future__ import annotations

import argparse
import time
from typing import Iterable, List, Optional

import torch

from ..checks import check_outputs
from ..reference import prefill_reference
from ..spec import CONTEST, PREFILL_SHAPES, GDNShape, make_prefill_inputs
from . import VARIANTS, gdn_prefill, launch_count_hint, plan_fused
from .config import ACCURATE_CONFIG, DEFAULT_CONFIG, PrefillConfig

__all__ = ["run_checks", "main"]


def run_checks(shapes: Iterable[str], variants: Iterable[str], *, cps=(None,),
               configs: Optional[List[PrefillConfig]] = None, time_methods=(),
               shape: GDNShape = CONTEST, device: str = "cuda", with_state: bool = True,
               seed: int = 0) -> List[dict]:
    """One dict per (shape, variant, cp, config): correctness numbers (+ timings)."""
    rows = []
    configs = configs or [DEFAULT_CONFIG]
    for name in shapes:
        lens = PREFILL_SHAPES[name]
        x = make_prefill_inputs(lens, shape, seed=seed, device=device, with_state=with_state)
        t0 = time.perf_counter()
        ref = prefill_reference(**x)
        ref_s = time.perf_counter() - t0
        T, N = sum(lens), len(lens)
        for variant in variants:
            for cp in (cps if variant in ("fused", "graph") else (None,)):
                for cfg in configs:
                    kw = dict(variant=variant, config=cfg)
                    if variant in ("fused", "graph"):
                        kw["cp"] = cp
                    row = dict(shape=name, T=T, N=N, variant=variant, cp=cp, config=cfg.name)
                    if variant in ("fused", "graph"):
                        row["seg_chunks"] = plan_fused(T, N, shape.num_v_heads, shape.head_dim,
                                                       torch.device(device), cp, cfg)[1]
                    row["launches"] = launch_count_hint(variant, T, N, shape.num_v_heads,
                                                        shape.head_dim, device, cp)["kernels"]
                    try:
                        out = gdn_prefill(**x, **kw)
                        out = gdn_prefill(**x, **kw)   # graph: a replay
                        r = check_outputs(out, ref)
                        row.update(ok=r.ok, max_abs=r.max_abs_err, rel_l2=r.rel_l2_err,
                                   reason=r.reason)
                    except Exception as e:  # report, keep going
                        row.update(ok=False, reason=f"{type(e).__name__}: {e}")
                    if row.get("ok") and time_methods:
                        from ..bench.timing import time_fn
                        for m in time_methods:
                            try:
                                t = time_fn(lambda: gdn_prefill(**x, **kw), m)
                                row[f"{m}_us"] = t.median_us
                            except Exception as e:
                                row[f"{m}_us"] = f"{type(e).__name__}"
                    row["ref_s"] = round(ref_s, 2)
                    rows.append(row)
                    print(_fmt(row), flush=True)
    return rows


def _fmt(row: dict) -> str:
    keys = ["shape", "variant", "cp", "seg_chunks", "config", "launches", "ok", "max_abs",
            "rel_l2", "graph_us", "cupti_cold_us", "event_us", "reason"]
    parts = []
    for k in keys:
        if k in row and row[k] not in ("", None) or k in ("cp",):
            v = row.get(k)
            parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return "  ".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(PREFILL_SHAPES),
                    choices=list(PREFILL_SHAPES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--cp", nargs="+", type=int, default=None,
                    help="segment sizes to force for fused/graph (0 = off); default: the rule")
    ap.add_argument("--accurate", action="store_true",
                    help="fused with DEFAULT_CONFIG and ACCURATE_CONFIG")
    ap.add_argument("--time", action="store_true", help="also time (graph, cupti_cold)")
    ap.add_argument("--nostate", action="store_true")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cps = [None] if args.cp is None else [c if c else False for c in args.cp]
    configs = [DEFAULT_CONFIG, ACCURATE_CONFIG] if args.accurate else None
    variants = ["fused"] if args.accurate else args.variants
    rows = run_checks(args.shapes, variants, cps=cps, configs=configs,
                      time_methods=("graph", "cupti_cold") if args.time else (),
                      device=device, with_state=not args.nostate)
    bad = [r for r in rows if not r.get("ok")]
    print(f"{len(rows) - len(bad)}/{len(rows)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
