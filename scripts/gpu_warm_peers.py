"""Compile the worker peers (FlashQLA and FLA's FlashQLA backend) for notebook 04's and 02's
full-profile shapes ahead of the notebook call.

TileLang compiles FlashQLA for each shape on first use (2-40 s each with the host's nvcc) and
keeps the result in its cache under $HOME, which stays while the machine is warm. Notebook 04
took 516 s of a call's 600 on an H100 with those compiles inside; running this in an earlier
call (e.g. the one that unpacks FlashQLA's site) leaves the notebook call the measuring alone.
Each shape is gated (not timed) in the worker against the chunked float32 reference, so a
failure shows here first.

    python3 scripts/gpu_warm_peers.py [--notebooks 04 02] [--shapes 8192 4x8192 ...]

on the GPU host after ``gpu_qla_unpack`` (scripts/gpu_host.sh; FLA's FlashQLA backend also needs
``gpu_lite; gpu_env``, else it is reported unavailable and FlashQLA alone is compiled -- the
same TileLang kernels).
"""
from __future__ import annotations

import argparse
import sys
import time

STEMS = {"02": "02_prefill_launch_overhead", "04": "04_prefill_scaling"}


def profile_shapes(notebooks) -> list:
    """The ``shapes`` notebook ``02``/``04`` runs in the full profile (profile value, else the
    notebook's default), in order, without repeats."""
    from kernels.experiments import prefill_overhead, prefill_scaling
    from kernels.runner import load_profile

    prof = load_profile("full")["notebooks"]
    modules = {"02": prefill_overhead, "04": prefill_scaling}
    out = []
    for nb in notebooks:
        default = next(p.default for p in modules[nb].PARAMS if p.name == "shapes")
        for s in prof.get(STEMS[nb], {}).get("shapes", default):
            if s not in out:
                out.append(s)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebooks", nargs="+", default=["04", "02"], choices=sorted(STEMS))
    ap.add_argument("--shapes", nargs="+", help="instead of the notebooks' shapes")
    a = ap.parse_args(argv)
    import torch

    from kernels.peers_worker import remote_prefill_impls
    from kernels.reference import prefill_reference_chunked
    from kernels.spec import make_prefill_inputs, parse_shape

    if not torch.cuda.is_available():
        print("gpu_warm_peers: needs a CUDA GPU", file=sys.stderr)
        return 2
    peers = remote_prefill_impls(["flashqla", "fla_flashqla"])
    live = {n: p for n, p in peers.items() if p}
    for n, p in peers.items():
        if not p:
            print(f"{n}: unavailable ({p.reason})")
    if not live:
        return 1
    bad, seen = 0, set()
    for spec in a.shapes or profile_shapes(a.notebooks):
        label, lens = parse_shape(spec)
        if label in seen:   # "8192" and "T8192" are one shape
            continue
        seen.add(label)
        x = make_prefill_inputs(lens, seed=0, device="cuda")
        ref = prefill_reference_chunked(**x)
        for n, p in live.items():
            t0 = time.perf_counter()
            gate = p.run(label, x, ref, device="cuda")["gate"]
            print(f"{n:<14} {label:<10} {gate.get('status')} ({time.perf_counter() - t0:.1f} s) "
                  f"{gate.get('reason', '')[:100]}", flush=True)
            bad += gate.get("status") != "pass"
        del x, ref
        torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
