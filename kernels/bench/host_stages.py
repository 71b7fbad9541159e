"""Where an eager call's host time goes: the whole call, the bare-launch floor, each stage.

``python -m kernels.bench.host_stages --out FILE.csv`` (a CUDA GPU; ``--smoke``: tiny shapes
and few calls, on the CPU under the Triton interpreter too) times, for the contest's decode
batches and notebook 02's prefill shapes:

* ``call``: the public call (:func:`kernels.decode.gdn_decode`,
  :func:`kernels.prefill.gdn_prefill`), host µs per call as :mod:`.timing`'s ``host``
  method takes it (back-to-back calls, no synchronisation inside a sample);
* ``bare_launch``: one ``kernel[grid]()`` of an empty kernel (:func:`.timing.bare_launch_fn`),
  the floor of any Triton call on that host;
* each stage of the call alone, on the same inputs, timed the same way: the checks, the
  plan (or config) lookup, the allocations, and per kernel the building of its launch
  (key, arguments, Triton's handles: ``bind:<kernel>``) and the launch itself
  (``launch:<kernel>``); ``rest`` is the call less the stages (the glue between them);
* ``gpu_graph``: the call's GPU time (:mod:`.timing`'s ``graph`` method; GPU only), so a
  host change can be seen to leave the GPU's work alone.

Why stages alone: a clock read around each stage inside the call costs about as much as the
smaller stages (0.1-0.5 µs each), and a sampling profiler cannot resolve a 30 µs call. Each
stage is the call's own code (the functions the call runs, on its arguments), so the sum of
the stages is close to the call; ``rest`` says how close.

The stages follow the call's path as the code stands (:func:`decode_stages`,
:func:`prefill_stages`): a change of the call path changes them with it.

Rows (one CSV): ``kind`` (decode / prefill), ``shape`` (``B=1``, a prefill
:func:`kernels.spec.lens_label`), ``path`` (the prefill plan's path), ``stage``,
``host_us`` (median of the samples, µs per call), ``p20_us``, ``p80_us``, ``calls``
(calls timed in all).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from typing import Callable, List, Sequence, Tuple

__all__ = ["decode_stages", "prefill_stages", "measure", "main", "DECODE_BATCHES",
           "PREFILL_SHAPES", "COLUMNS"]

#: The contest's decode batch sizes timed (issue 55: host-bound up to B = 64).
DECODE_BATCHES = (1, 64)
#: Notebook 02's prefill shapes (:data:`kernels.experiments.prefill_overhead`'s default).
PREFILL_SHAPES = ("T6", "T64", "100+28", "T512", "T2048", "T8192", "4x1024", "16x256",
                  "57x64")
COLUMNS = ("kind", "shape", "path", "stage", "host_us", "p20_us", "p80_us", "calls")

Stage = Tuple[str, Callable[[], object]]


def decode_stages(inp: dict) -> List[Stage]:
    """The stages of one :func:`kernels.decode.gdn_decode` call on ``inp`` (a dense state,
    the default options: a fresh output and new state), in the call's order."""
    import torch

    from ..decode import ops
    from ..spec import resolve_scale

    q, k, v, state = inp["q"], inp["k"], inp["v"], inp["state"]
    A_log, a, dt_bias, b = inp["A_log"], inp["a"], inp["dt_bias"], inp["b"]
    B, T, HQ, D = q.shape
    HV = v.shape[2]
    cfg = ops.resolve_config(None, B, D, q.device)
    o, ht = torch.empty_like(v), torch.empty_like(state)
    grid = (cfg.programs(B, HV, D),)

    def checks():   # a repeat's checks: the signature and its lookup
        return ops._CALLS.get(ops.signature(q, k, v, state, A_log, a, dt_bias, b, None, None,
                                            None, None, None, False, None, None, None))

    def alloc():
        return torch.empty_like(v), torch.empty_like(state)

    def args():
        key = (T, HQ, HV, D, cfg, False, False, True, state.dtype, None)
        return key, (q, k, v, state, ht, ht, q, A_log, a, dt_bias, b, o, None,
                     resolve_scale(None, D), state.shape[0])

    key, call_args = args()

    def kwargs():
        return dict(T=T, HQ=HQ, HV=HV, D=D, BV=cfg.BV, BK=cfg.block_k(D), V_TILES=cfg.V_TILES,
                    PREFETCH=cfg.PREFETCH, EVICT="evict_first" if cfg.EVICT_FIRST else "",
                    POOLED=False, INTERMEDIATE=False, HAS_STATUS=False,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    return [("checks", checks),
            ("alloc", alloc),
            ("bind:decode", args),
            ("launch:decode",
             lambda: ops._DECODE_LAUNCH.launch_keyed(key, grid, call_args, kwargs))]


def prefill_stages(inp: dict) -> Tuple[str, List[Stage]]:
    """``(path, stages)`` of one ``fused`` :func:`kernels.prefill.gdn_prefill` call on
    ``inp`` (the default options), in the call's order, following
    :func:`kernels.prefill.pipeline.fused_launches` for the plan's path."""
    import torch

    from ..prefill import pipeline as pl
    from ..prefill.chunk_index import num_slots
    from ..prefill.plan import CALLS
    from ..prefill.intra_chunk import intra_chunk_fwd
    from ..prefill.recurrent import recurrent_fwd
    from ..prefill.state_walk import state_walk_fwd
    from ..spec import resolve_scale, validate_prefill_inputs

    q, k, v, state = inp["q"], inp["k"], inp["v"], inp["state"]
    A_log, a, dt_bias, b, cu = inp["A_log"], inp["a"], inp["dt_bias"], inp["b"], inp["cu_seqlens"]
    check_values = q.device.type != "cuda"
    shape = validate_prefill_inputs(q, k, v, state, A_log, a, dt_bias, b, cu, None,
                                    check_values=check_values)
    scale = resolve_scale(None, shape.head_dim)
    guard = not check_values
    plan = pl._shape_plan(q, shape, cu, None, None)
    o, ht = torch.empty_like(v), torch.empty_like(state)

    def checks():   # a repeat's checks and plan: the signature and its lookup
        return (CALLS.get((pl.call_signature(q, k, v, state, A_log, a, dt_bias, b, cu, None,
                                             None, None, None, None, None, None, "fused"),
                           type(None), None)))

    stages = [("checks+plan", checks),
              ("alloc", lambda: (torch.empty_like(v), torch.empty_like(state)))]
    if plan.path == "recurrent":
        stages.append(("bind+launch:recurrent",
                       lambda: recurrent_fwd(q, k, v, state, A_log, a, dt_bias, b, cu, scale,
                                             o, ht, guard=guard)))
        return plan.path, stages
    ws = pl.workspace_views(plan, q.device)
    stages.append(("workspace", lambda: pl.workspace_views(plan, q.device)))
    tb, gc, aqk, lb = ws["Tb"], ws["gc"], ws["Aqk"], ws.get("log_bound")
    intra, walkers = plan.intra, None
    if plan.path == "single":
        flags = pl._walker_flags(q.device, num_slots(plan.T, plan.N) * plan.HV)
        walkers = dict(plan.walkers, initial_state=state, final_state=ht, output=o,
                       flags=flags, guard=guard, status=None)
        intra = plan.intra_single

    def bind_intra():
        return intra_chunk_fwd(k, v, cu, q, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                               scale=scale, defer=True, walkers=walkers, log_bound=lb,
                               out=(tb, gc, aqk, ws.get("scratch")), **intra)[3]

    binds = [("intra", bind_intra)]
    if plan.path == "walk":
        binds.append(("walk", lambda: pl._walk(plan.walk, q, k, v, tb, aqk, gc, cu, state, o,
                                                ht, scale, guard, None)))
    elif plan.path == "cp":
        summary, negl = ws["summary"], ws["negligible"]
        binds.append(("phase_a", lambda: state_walk_fwd(
            k, tb, v, gc, cu, summary=summary, log_bound=lb, negligible=negl, defer=True,
            **plan.phase_a)))
        binds.append(("phase_c", lambda: state_walk_fwd(
            k, tb, v, gc, cu, p=aqk, initial_state=state, summary=summary, output=o,
            final_state=ht, negligible=negl, guard=guard, status=None, defer=True, q=q,
            scale=scale, **plan.phase_c)))
    elif plan.path != "single":   # the long paths: stages of the binds as one
        binds.append(("long_phases", lambda: pl._cp_long(
            plan, ws, q, k, v, cu, state, o, ht, scale, lambda: None, guard, None)))
    for name, bind in binds:
        stages.append((f"bind:{name}", bind))
    if plan.path in ("single", "walk", "cp"):
        for name, bind in binds:
            stages.append((f"launch:{name}", bind()))
    return plan.path, stages


def _median_row(samples: Sequence[float]) -> dict:
    xs = sorted(samples)
    pick = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]   # noqa: E731
    return dict(host_us=round(pick(0.5), 3), p20_us=round(pick(0.2), 3),
                p80_us=round(pick(0.8), 3))


def _time(fn, rep: int, calls: int, sync) -> dict:
    from .timing import host_samples

    for _ in range(3):
        fn()
    return dict(_median_row(host_samples(fn, rep, calls, clock=time.perf_counter, sync=sync)),
                calls=rep * calls)


def _rows(kind, label, path, call, stages, rep, calls, sync, gpu) -> List[dict]:
    from .timing import MethodUnavailable, time_fn

    base = dict(kind=kind, shape=label, path=path)
    whole = _time(call, rep, calls, sync)
    rows = [dict(base, stage="call", **whole)]
    total = 0.0
    for name, fn in stages:
        r = _time(fn, rep, calls, sync)
        total += r["host_us"]
        rows.append(dict(base, stage=name, **r))
    rows.append(dict(base, stage="rest", host_us=round(whole["host_us"] - total, 3),
                     p20_us="", p80_us="", calls=""))
    if gpu:
        try:
            t = time_fn(call, "graph", rep=max(10, rep // 4), warmup=3)
            rows.append(dict(base, stage="gpu_graph", host_us=round(t.median_us, 3),
                             p20_us=round(t.p20_us, 3), p80_us=round(t.p80_us, 3), calls=t.n))
        except MethodUnavailable as e:
            print(f"  {label}: no graph time ({e})", file=sys.stderr)
    return rows


def measure(*, smoke: bool = False, rep: int = 200, calls: int = 10,
            decode_batches: Sequence[int] = DECODE_BATCHES,
            prefill_shapes: Sequence[str] = PREFILL_SHAPES, device=None) -> List[dict]:
    """Every row (see the module doc). ``rep`` samples of ``calls`` back-to-back calls per
    stage (200 x 10: 2,000 calls, synchronised between samples so the GPU's queue never
    fills); ``smoke``: a tiny head shape, two samples of two calls, no GPU time (the CPU
    test's run)."""
    import torch

    from ..decode import gdn_decode
    from ..prefill import gdn_prefill
    from ..spec import CONTEST, GDNShape, lens_label, make_decode_inputs, make_prefill_inputs
    from ..spec import parse_shape
    from .timing import bare_launch_fn

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = str(device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    shape = CONTEST
    if smoke:
        shape, rep, calls = GDNShape(1, 2, 16), 2, 2
        decode_batches, prefill_shapes = (1,), ("T6", "2x64", "T256")
    rows = [dict(kind="floor", shape="", path="", stage="bare_launch",
                 **_time(bare_launch_fn(), rep, calls, sync))]
    for B in decode_batches:
        inp = make_decode_inputs(B, shape, device=device)
        args = [inp[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")]
        rows += _rows("decode", f"B={B}", "", lambda: gdn_decode(*args), decode_stages(inp),
                      rep, calls, sync, cuda)
        print(f"decode B={B}: done", file=sys.stderr)
    for spec in prefill_shapes:
        _, lens = parse_shape(spec)
        inp = make_prefill_inputs(lens, shape, device=device)
        args = [inp[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b",
                                 "cu_seqlens")]
        path, stages = prefill_stages(inp)
        rows += _rows("prefill", lens_label(lens), path, lambda: gdn_prefill(*args), stages,
                      rep, calls, sync, cuda)
        print(f"prefill {lens_label(lens)}: done", file=sys.stderr)
    return rows


def _print(rows) -> None:
    floor = next((r["host_us"] for r in rows if r["stage"] == "bare_launch"), None)
    print(f"bare launch: {floor} µs host")
    for r in rows:
        if r["kind"] == "floor":
            continue
        ratio = (f"  ({r['host_us'] / floor:.2f} x bare)" if r["stage"] == "call" and floor
                 else "")
        print(f"{r['kind']:8s} {r['shape']:8s} {r['path']:10s} {r['stage']:24s} "
              f"{r['host_us']:9.2f} µs{ratio}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="CSV file to write (the rows); printed either way")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, few calls (a CPU run under the interpreter)")
    ap.add_argument("--rep", type=int, default=200, help="samples per stage")
    ap.add_argument("--calls", type=int, default=10, help="back-to-back calls per sample")
    ns = ap.parse_args(argv)
    if ns.rep < 1 or ns.calls < 1:
        ap.error("--rep and --calls must be >= 1")
    rows = measure(smoke=ns.smoke, rep=ns.rep, calls=ns.calls)
    _print(rows)
    if ns.out:
        with open(ns.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {len(rows)} rows to {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
