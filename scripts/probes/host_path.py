"""Timing methods against each other and the host path of our calls (GPU).

Prints and writes ``host_path_<sha>.json``: per case (a spin kernel of known duration,
decode B = 1, 8, 64, prefill [6], [64], 57x64, [8192]) the ``graph`` method as shipped before
(one call per graph, 8 replays per sample: ``graph_1call``), ``graph`` now, one graph of 200
calls behind a 300 µs spin (``graph_200``), ``cupti_cold``, ``event`` and ``host``; the host time of a bare Triton
launch; with ``--profile``, cProfile's top entries of 1,000 eager calls per case.

    python scripts/probes/host_path.py --out DIR [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys

import numpy as np
import torch

sys.path.insert(0, os.getcwd())

from kernels.bench.spin import spin  # noqa: E402
from kernels.bench.timing import _capture, bare_launch_fn, time_fn  # noqa: E402


def graph_fixed(fn, calls, replays_per_sample, rep=30):
    g = _capture(fn, 3, calls)
    g.replay()
    torch.cuda.synchronize()
    xs = []
    for _ in range(rep):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if replays_per_sample == 1:
            spin(300)      # the host launches the replay before the stream reaches s
        s.record()
        for _ in range(replays_per_sample):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        xs.append(s.elapsed_time(e) * 1e3 / (calls * replays_per_sample))
    del g
    return float(np.median(xs))


def cases():
    from kernels.decode import gdn_decode
    from kernels.prefill import gdn_prefill
    from kernels.spec import make_decode_inputs, make_prefill_inputs

    for us in (1, 3, 10, 100):
        yield f"spin{us}", (lambda us=us: spin(us)), None
    for B in (1, 8, 64):
        inp = make_decode_inputs(B, device="cuda")
        yield f"decode_B{B}", (lambda inp=inp: gdn_decode(**inp)), None
    for lens in ([6], [64], [64] * 57, [8192]):
        inp = make_prefill_inputs(lens, device="cuda")
        name = f"prefill_{len(lens)}x{lens[0]}" if len(lens) > 1 else f"prefill_{lens[0]}"
        yield name, (lambda inp=inp: gdn_prefill(**inp)), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    sha = os.environ.get("GDN_GIT_SHA", "nosha")[:7]
    res = dict(gpu=torch.cuda.get_device_name(), sha=sha, cases={})
    bare = bare_launch_fn()
    res["bare_launch_host_us"] = time_fn(bare, "host", rep=50, warmup=20).median_us
    print(f"bare launch host {res['bare_launch_host_us']:.2f} us", flush=True)
    profiles = {}
    for name, fn, _ in cases():
        row = {}
        for m in ("cupti_cold", "graph", "event", "host"):
            try:
                row[m] = round(time_fn(fn, m, rep=50, warmup=10).median_us, 3)
            except Exception as e:
                row[m] = f"{type(e).__name__}: {e}"[:200]
        row["graph_1call"] = round(graph_fixed(fn, 1, 8), 3)
        row["graph_200"] = round(graph_fixed(fn, 200 if not name.endswith("8192") else 20, 1,
                                             rep=10), 3)
        res["cases"][name] = row
        print(name, row, flush=True)
        if args.profile and not name.startswith("spin"):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(1000):
                fn()
            pr.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
            profiles[name] = s.getvalue()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"host_path_{sha}.json"), "w") as f:
        json.dump(res, f, indent=1)
    if profiles:
        with open(os.path.join(args.out, f"host_profile_{sha}.txt"), "w") as f:
            for k, v in profiles.items():
                f.write(f"===== {k}\n{v}\n")


if __name__ == "__main__":
    main()
