"""Where an eager call's host time goes: the whole call, the bare-launch floor, each stage.

``python -m kernels.bench.host_stages --out FILE.csv`` (a CUDA GPU; ``--smoke``: tiny shapes
and few calls, on the CPU under the Triton interpreter too) times, for the contest's decode
batches (the standard decode and the replay decode, ``L`` = :data:`REPLAY_L`, kind
``replay_decode``) and notebook 02's prefill shapes:

* ``call``: the public call (:func:`kernels.decode.gdn_decode`,
  :func:`kernels.prefill.gdn_prefill`), host µs per call as :mod:`.timing`'s ``host``
  method takes it (back-to-back calls, no synchronisation inside a sample);
* ``bare_launch``: one ``kernel[grid]()`` of an empty kernel (:func:`.timing.bare_launch_fn`),
  the floor of any Triton call on that host;
* ``recorded_launch``: the same empty kernel's recorded launch list replayed
  (:func:`recorded_launch_fn`): the floor of a call that replays its launches;
* each stage of a repeat call alone, on the same inputs, timed the same way: the signature
  and its lookup (the checks, the plan), the allocations, and the replay of the launch list
  recorded on the signature's first call (``replay``: this call's addresses into the slots,
  Triton's C launches); ``rest`` is the call less the stages (the glue between them); after
  it, per kernel of the list, its C launch alone with the arguments filled beforehand
  (``launch:<kernel>``, a part of ``replay``);
* where the call is served by its :mod:`kernels.fastcall` plan (one C call: checks,
  outputs, workspace, ``cuLaunchKernelEx``), the stages are that call alone (``fastcall``)
  and ``rest`` the Python around it; after them ``python_path``: the same call with the
  plan set aside (the recorded Python replay it replaced, two attribute swaps included),
  and the ``launch:<kernel>`` rows of the Python list;
* ``gpu_graph``: the call's GPU time (:mod:`.timing`'s ``graph`` method; GPU only), so a
  host change can be seen to leave the GPU's work alone.

Why stages alone: a clock read around each stage inside the call costs about as much as the
smaller stages (0.1-0.5 µs each), and a sampling profiler cannot resolve a 30 µs call. Each
stage is the call's own code (the functions the call runs, on its arguments), so the sum of
the stages is close to the call; ``rest`` says how close.

The stages follow the call's path as the code stands (:func:`decode_stages`,
:func:`prefill_stages`): a change of the call path changes them with it.

Rows (one CSV): ``kind`` (decode / replay_decode / prefill), ``shape`` (``B=1``, a prefill
:func:`kernels.spec.lens_label`), ``path`` (the prefill plan's path; ``L=4``), ``stage``,
``host_us`` (median of the samples, µs per call), ``p20_us``, ``p80_us``, ``calls``
(calls timed in all).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from typing import Callable, List, Sequence, Tuple

__all__ = ["decode_stages", "replay_decode_stages", "replay_ring", "prefill_stages", "recorded_launch_fn", "key_costs", "measure", "main", "DECODE_BATCHES",
           "PREFILL_SHAPES", "COLUMNS"]

#: The contest's decode batch sizes timed (issue 55: host-bound up to B = 64).
DECODE_BATCHES = (1, 64)
#: Notebook 02's prefill shapes (:data:`kernels.experiments.prefill_overhead`'s default).
PREFILL_SHAPES = ("T6", "T64", "100+28", "T512", "T2048", "T8192", "4x1024", "16x256",
                  "57x64")
#: The replay decode's ring length timed (a write-back every 4 tokens at T = 1).
REPLAY_L = 4
COLUMNS = ("kind", "shape", "path", "stage", "host_us", "p20_us", "p80_us", "calls")

Stage = Tuple[str, Callable[[], object]]


def decode_stages(inp: dict) -> Tuple[List[Stage], List[Stage]]:
    """``(stages, parts)`` of a repeat :func:`kernels.decode.gdn_decode` call on ``inp`` (a
    dense state, the default options: a fresh output and new state), in the call's order:
    the signature and its lookup (``checks``), the allocations, the recorded launch list's
    replay (``replay``: the addresses read into its slots, the C launch); ``parts``: the
    list's launches alone, arguments filled beforehand (``launch:<kernel>``, part of
    ``replay``)."""
    import torch

    from ..decode import gdn_decode, ops

    q, k, v, state = inp["q"], inp["k"], inp["v"], inp["state"]
    A_log, a, dt_bias, b = inp["A_log"], inp["a"], inp["dt_bias"], inp["b"]
    sig = ops.signature(q, k, v, state, A_log, a, dt_bias, b, None, None, None, None, None,
                        False, None, None, None)
    gdn_decode(q, k, v, state, A_log, a, dt_bias, b)   # the signature's first call: recorded
    c = ops._CALLS[sig]
    o, ht = torch.empty_like(v), torch.empty_like(state)
    srcs = (q, k, v, state, A_log, a, dt_bias, b, None, None, None, None, o, ht, ht)

    def checks():   # a repeat's checks: the signature and its lookup
        return ops._CALLS.get(ops.signature(q, k, v, state, A_log, a, dt_bias, b, None, None,
                                            None, None, None, False, None, None, None))

    if c.fast is not None:   # the one C call (kernels.fastcall): checks, outputs, launch
        run, plan = c.fast
        given = (None, None, None, False, None, q, k, v, state, A_log, a, dt_bias, b, None,
                 None, None, None)

        def python_path():   # the same call with the plan set aside: the Python replay
            ops._LAST, c.fast = None, None
            try:
                return gdn_decode(q, k, v, state, A_log, a, dt_bias, b)
            finally:
                ops._LAST = c.fast = (run, plan)
        return ([("fastcall", lambda: run(plan, *given))],
                [("python_path", python_path)] + _parts(c.launches, srcs, None))
    stages = [("checks", checks),
              ("alloc", lambda: (torch.empty_like(v), torch.empty_like(state)))]
    if c.launches is None:   # (not recorded: the keyed launch)
        args = (q, k, v, state, ht, ht, q, A_log, a, dt_bias, b, o, None, c.scale, c.P)
        return stages + [("launch", lambda: ops._DECODE_LAUNCH.launch_keyed(
            c.key, c.grid, args, c.kwargs))], []
    return (stages + [("replay", lambda: c.launches.run(srcs))],
            _parts(c.launches, srcs, None))


def replay_ring(inp: dict, L: int = REPLAY_L):
    """An empty :class:`kernels.decode.ReplayRing` for ``inp``'s state (a dense state)."""
    from ..decode import ReplayRing

    q, v, st = inp["q"], inp["v"], inp["state"]
    return ReplayRing.empty(st.shape[0], q.shape[2], v.shape[2], q.shape[3], L,
                            device=q.device)


def replay_decode_stages(inp: dict, ring, check_values=None) -> Tuple[List[Stage], List[Stage]]:
    """``(stages, parts)`` of a repeat :func:`kernels.decode.gdn_replay_decode` call on
    ``inp`` and ``ring`` (a dense state, no rollback, the default options but
    ``check_values``), in the call's order: the signature and its lookup (``checks``), the
    ring headers' host check where the call checks values (``values``: off CUDA by
    default), the output, the recorded list's replay; or, where its :mod:`kernels.fastcall`
    plan serves it, that one C call (``fastcall``) and ``python_path`` as for the decode.
    Each stage updates the checkpoint and the ring in place as the call does."""
    import torch

    from ..decode import gdn_replay_decode, replay

    names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")
    q, k, v, state, A_log, a, dt_bias, b = (inp[n] for n in names)

    def call():
        return gdn_replay_decode(q, k, v, state, A_log, a, dt_bias, b, ring=ring,
                                 check_values=check_values)

    def signature():
        return replay.replay_signature(q, k, v, state, A_log, a, dt_bias, b, None, None, ring,
                                       None, None, None, check_values, None)

    call()   # the signature's first call: recorded
    c = replay._CALLS[signature()]
    o = torch.empty_like(v)
    srcs = (q, k, v, state, A_log, a, dt_bias, b, None, None, None, None, ring.k, ring.u,
            ring.g, ring.head, ring.count, o)
    if c.fast is not None:   # the one C call (kernels.fastcall)
        run, plan = c.fast
        given = (None, None, check_values, ring.L, ring.max_tokens) + srcs[:17]

        def python_path():   # the same call with the plan set aside: the Python replay
            replay._LAST, c.fast = None, None
            try:
                return call()
            finally:
                replay._LAST = c.fast = (run, plan)
        return ([("fastcall", lambda: run(plan, *given))],
                [("python_path", python_path)] + _parts(c.launches, srcs, None))
    stages = [("checks", lambda: replay._CALLS.get(signature()))]
    if c.values:
        stages.append(("values", lambda: replay._check_ring_values(ring, None, None)))
    stages.append(("alloc", lambda: torch.empty_like(v)))
    if c.launches is None:   # (not recorded)
        return stages + [("launch", call)], []
    return (stages + [("replay", lambda: c.launches.run(srcs))],
            _parts(c.launches, srcs, None))


def _parts(lst, srcs, ws) -> List[Stage]:
    return [(f"launch:{name}", go) for name, go in lst.parts(srcs, ws)]


def prefill_stages(inp: dict) -> Tuple[str, List[Stage], List[Stage]]:
    """``(path, stages, parts)`` of a repeat ``fused`` :func:`kernels.prefill.gdn_prefill`
    call on ``inp`` (the default options), in the call's order
    (:func:`kernels.prefill.pipeline.run_call`): the signature and its lookup
    (``checks+plan``), the outputs, the workspace (one allocation, where the plan has
    one), the recorded launch list's replay; ``parts``: its launches alone."""
    import torch

    from ..prefill import gdn_prefill
    from ..prefill import pipeline as pl
    from ..prefill.plan import CALLS
    from ..spec import check_cu_seqlens_values

    q, k, v, state = inp["q"], inp["k"], inp["v"], inp["state"]
    A_log, a, dt_bias, b, cu = inp["A_log"], inp["a"], inp["dt_bias"], inp["b"], inp["cu_seqlens"]

    def signature():
        return (pl.call_signature(q, k, v, state, A_log, a, dt_bias, b, cu, None, None, None,
                                  None, None, None, None, "fused"), type(None), None)

    gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu)   # the first call: recorded
    c = CALLS[signature()]
    path = c.plan.path if c.plan is not None else "recurrent"
    o, ht = torch.empty_like(v), torch.empty_like(state)
    words = c.ws_words
    ws = torch.empty(words, dtype=torch.float32, device=q.device) if words else None
    srcs = (q, k, v, state, A_log, a, dt_bias, b, cu, None, None, None, o, ht)
    if c.fast is not None:   # the one C call (kernels.fastcall)
        from ..prefill.plan import FAST
        run, plan = c.fast
        given = ("fused", None, None, None, None, None, q, k, v, state, A_log, a, dt_bias, b,
                 cu, None, None, None)

        def python_path():   # the same call with the plan set aside: the Python replay
            FAST[0], c.fast = None, None
            try:
                return gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu)
            finally:
                FAST[0] = c.fast = (run, plan)
        return path, [("fastcall", lambda: run(plan, *given))], (
            [("python_path", python_path)] + _parts(c.launches, srcs, ws))
    stages = [("checks+plan", lambda: CALLS.get(signature()))]
    if c.checked:   # (off CUDA: cu_seqlens' values checked on the host per call)
        stages.append(("values", lambda: check_cu_seqlens_values(cu, c.T)))
    stages.append(("alloc", lambda: (torch.empty_like(v), torch.empty_like(state))))
    if words:
        stages.append(("workspace", lambda: torch.empty(words, dtype=torch.float32,
                                                        device=q.device)))
    if c.launches is None:   # (not recordable, e.g. the Gluon walk: the normal path)
        stages.append(("launches", lambda: pl._launch_call(
            c, q, k, v, state, A_log, a, dt_bias, b, cu, o, ht, ws, None)))
        return path, stages, []
    stages.append(("replay", lambda: c.launches.run(srcs, ws)))
    return path, stages, _parts(c.launches, srcs, ws)


def recorded_launch_fn():
    """A callable that replays the recorded launch list of the empty kernel of
    :func:`.timing.bare_launch_fn` (:class:`kernels.launch.LaunchList`): the floor of a
    recorded call on this host, to set against ``bare_launch``."""
    from ..launch import FastLaunch, recording
    from .timing import empty_kernel

    fl = FastLaunch(empty_kernel())
    for _ in range(2):   # the first compiles, the second is recorded from the direct path
        with recording() as rec:
            fl.launch_keyed("empty", (1,), (), dict)
    lst = rec.build((), 0)
    return lambda: lst.run(())


def key_costs(n: int = 100_000, device="cpu") -> List[dict]:
    """What a repeat decode call (B = 1, the contest's heads) costs on the host apart from
    its launch, and its signature's variants: ns per call over ``n`` calls
    (``time.perf_counter_ns``), launches stubbed (the call's recorded list holds none), so
    it runs on any machine. Rows ``kind="key"``: ``signature`` (the key of
    :func:`kernels.decode.ops.signature`: per tensor type, shape, dtype, device,
    contiguity), ``lookup`` (it and its dict lookup: the call's ``checks``),
    ``signature_strides`` (strides for contiguity), ``data_ptrs`` (the eight addresses alone: a floor no safe key reaches),
    ``call_stubbed`` (the whole repeat call, its launch list empty), and the recorded
    replay's per-call checks (``fast_launch_enabled``, ``no_hooks``)."""
    import torch

    from .. import launch
    from ..decode import gdn_decode, ops
    from ..spec import CONTEST, make_decode_inputs

    inp = make_decode_inputs(1, CONTEST, device=device)
    q, k, v, st, A_log, a, dt_bias, b = (inp[x] for x in ("q", "k", "v", "state", "A_log",
                                                          "a", "dt_bias", "b"))
    ts = (q, k, v, st, A_log, a, dt_bias, b)
    opts = (None, None, None, None, None, False, None, None, None)

    def strides():
        return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
                k.device, v.shape, v.stride(), v.dtype, v.device, st.shape, st.stride(),
                st.dtype, st.device, A_log.shape, A_log.stride(), A_log.dtype, A_log.device,
                a.shape, a.stride(), a.dtype, a.device, dt_bias.shape, dt_bias.stride(),
                dt_bias.dtype, dt_bias.device, b.shape, b.stride(), b.dtype, b.device)

    real = ops._DECODE_LAUNCH.launch_keyed
    ops._DECODE_LAUNCH.launch_keyed = lambda *a_, **k_: None   # (nothing noted: no launch)
    try:
        ops.clear_calls()
        gdn_decode(*ts)   # the signature's first call records an empty list
        cases = [("signature", lambda: ops.signature(*ts, *opts)),
                 ("lookup", lambda: ops._CALLS.get(ops.signature(*ts, *opts))),
                 ("signature_strides", strides),
                 ("data_ptrs", lambda: [t.data_ptr() for t in ts]),
                 ("call_stubbed", lambda: gdn_decode(*ts)),
                 ("fast_launch_enabled", launch.fast_launch_enabled)]
        if launch._knobs is not None:
            cases.append(("no_hooks", lambda: launch._no_hooks(launch._knobs.runtime)))
        rows = []
        for name, fn in cases:
            for _ in range(1000):
                fn()
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            ns = (time.perf_counter_ns() - t0) / n
            rows.append(dict(kind="key", shape="B=1", path=str(device), stage=name,
                             host_us=round(ns / 1000, 4), p20_us="", p80_us="", calls=n))
    finally:
        ops._DECODE_LAUNCH.launch_keyed = real
        ops.clear_calls()
    return rows


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


def _rows(kind, label, path, call, stages, parts, rep, calls, sync, gpu) -> List[dict]:
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
    for name, fn in parts:   # (parts of a stage above: not in rest)
        rows.append(dict(base, stage=name, **_time(fn, rep, calls, sync)))
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

    from ..decode import gdn_decode, gdn_replay_decode
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
    rows = [dict(kind="floor", shape="", path="", stage=name, **_time(fn, rep, calls, sync))
            for name, fn in (("bare_launch", bare_launch_fn()),
                             ("recorded_launch", recorded_launch_fn()))]
    for B in decode_batches:
        inp = make_decode_inputs(B, shape, device=device)
        args = [inp[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")]
        rows += _rows("decode", f"B={B}", "", lambda: gdn_decode(*args),
                      *decode_stages(inp), rep, calls, sync, cuda)
        print(f"decode B={B}: done", file=sys.stderr)
    for B in decode_batches:
        inp = make_decode_inputs(B, shape, device=device)
        ring = replay_ring(inp)
        args = [inp[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")]
        rows += _rows("replay_decode", f"B={B}", f"L={REPLAY_L}",
                      lambda: gdn_replay_decode(*args, ring=ring),
                      *replay_decode_stages(inp, ring), rep, calls, sync, cuda)
        print(f"replay decode B={B}: done", file=sys.stderr)
    for spec in prefill_shapes:
        _, lens = parse_shape(spec)
        inp = make_prefill_inputs(lens, shape, device=device)
        args = [inp[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b",
                                 "cu_seqlens")]
        path, stages, parts = prefill_stages(inp)
        rows += _rows("prefill", lens_label(lens), path, lambda: gdn_prefill(*args), stages,
                      parts, rep, calls, sync, cuda)
        print(f"prefill {lens_label(lens)}: done", file=sys.stderr)
    return rows


def _print(rows) -> None:
    floor = next((r["host_us"] for r in rows if r["stage"] == "bare_launch"), None)
    print(f"bare launch: {floor} µs host")
    for r in rows:
        if r["kind"] == "floor":
            if r["stage"] != "bare_launch":
                print(f"{r['stage']}: {r['host_us']} µs host")
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
    ap.add_argument("--keys", type=int, metavar="N", default=0,
                    help="only the decode key costs (key_costs, N calls each, launches "
                         "stubbed: any machine)")
    ns = ap.parse_args(argv)
    if ns.rep < 1 or ns.calls < 1 or ns.keys < 0:
        ap.error("--rep, --calls must be >= 1 and --keys >= 0")
    if ns.keys:
        rows = key_costs(ns.keys)
        for r in rows:
            print(f"{r['stage']:22s} {r['host_us'] * 1000:9.1f} ns")
    else:
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
