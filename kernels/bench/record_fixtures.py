"""Record the GPU fixtures of the instrument tests (run once on a GPU host).

    python -m kernels.bench.record_fixtures tests/fixtures

writes into OUTDIR (``<slug>`` = :func:`kernels.device.gpu_slug`):

* ``torch_trace_2kernels_<slug>.json`` - torch.profiler's Chrome trace of one call
  that launches two kernels (a torch elementwise kernel through the runtime API,
  a Triton kernel through the driver API) inside a ``gdnbench::call`` range;
* ``cupti_session_2kernels_<slug>.json`` - the profiler session ``cupti_cold``
  records for 5 iterations of the same call (flush ranges included);
* ``ncu_decode_<impl>_B64_<slug>.csv`` - ncu's raw-page CSV (as printed, with its
  ``==PROF==`` lines) of one decode call at B=64, for ``ours`` and each peer
  available here.

Each trace gets a ``gdnbench_fixture`` key with what the tests expect of it.
The script prints what it parsed back, and a cold single-kernel comparison of
the three timing methods, so one run also checks the instruments on this GPU.
Every step reports its own failure and the others still run.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

__all__ = ["main"]

CALL_KERNELS = 2
SESSION_ITERS = 5


def _two_kernel_call():
    """A zero-arg callable launching exactly two kernels: torch ``mul`` and a
    Triton ``x + 1`` (written here; launched through ``cuLaunchKernelEx``)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_one_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = o < n
        tl.store(y_ptr + o, tl.load(x_ptr + o, mask=m) + 1.0, mask=m)

    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    z = torch.empty_like(x)
    n = x.numel()

    def call():
        torch.mul(x, 2.0, out=y)
        add_one_kernel[(triton.cdiv(n, 1024),)](y, z, n, BLOCK=1024)

    return call


def _annotate(path: Path, expect: dict) -> None:
    doc = json.loads(path.read_text())
    doc["gdnbench_fixture"] = expect
    path.write_text(json.dumps(doc))


def _step(title, fn):
    print(f"--- {title}")
    try:
        fn()
    except Exception:
        traceback.print_exc()
        print(f"FAILED: {title}")
        return False
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench.record_fixtures",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--skip-ncu", action="store_true")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("record_fixtures needs a CUDA GPU; torch sees none", file=sys.stderr)
        return 2
    from ..device import gpu_slug
    from .ncu import ncu_available, run_ncu
    from .timeline import Timeline, record_trace
    from .timing import METHODS, MethodUnavailable, iteration_spans, record_cupti_session, time_fn

    out = args.outdir
    out.mkdir(parents=True, exist_ok=True)
    slug = gpu_slug()
    call = _two_kernel_call()
    ok = True

    def trace():
        p = record_trace(call, out / f"torch_trace_2kernels_{slug}.json")
        _annotate(p, dict(kernels=CALL_KERNELS, gpu_ops=CALL_KERNELS, launches=CALL_KERNELS,
                          host_syncs=0, torch=torch.__version__, gpu=torch.cuda.get_device_name()))
        tl = Timeline.from_chrome_trace(p)
        print(p)
        print(tl.gpu[["name", "kind", "stream", "start_us", "dur_us"]].to_string())
        print(tl.cpu[["name", "api", "kind", "start_us", "dur_us"]].to_string())
        print(tl.summary())

    def session():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        p = out / f"cupti_session_2kernels_{slug}.json"
        record_cupti_session(call, SESSION_ITERS, True, path=p)
        _annotate(p, dict(iterations=SESSION_ITERS, gpu_ops_per_iteration=CALL_KERNELS,
                          torch=torch.__version__, gpu=torch.cuda.get_device_name()))
        print(p)
        print("spans (µs):", [round(s, 2) for s in iteration_spans(str(p))])

    def methods():
        x = torch.randn(1 << 24, device="cuda")
        single = lambda: torch.mul(x, 2.0)  # noqa: E731 - one kernel, 64 MiB read
        for name, fn in (("single kernel", single), ("two kernels", call)):
            for m in METHODS:
                try:
                    t = time_fn(fn, m, rep=50, warmup=5)
                    print(f"{name:14s} {m:10s} median {t.median_us:9.2f} µs "
                          f"[p20 {t.p20_us:.2f}, p80 {t.p80_us:.2f}] n={t.n}")
                except MethodUnavailable as e:
                    print(f"{name:14s} {m:10s} unavailable: {e.reason}")

    def ncu():
        avail, reason = ncu_available()
        if not avail:
            raise RuntimeError(reason)
        for impl in ("ours", "fla", "flashinfer_inplace", "flashinfer"):
            p = out / f"ncu_decode_{impl}_B64_{slug}.csv"
            try:
                df = run_ncu(dict(impl=impl, B=64), out_csv=p)
            except RuntimeError as e:
                print(f"{impl}: {e}")
                p.unlink(missing_ok=True)  # keep only CSVs that hold a profiled kernel
                continue
            print(p)
            print(df.pivot_table(index="metric", columns="kernel", values="value").to_string())

    ok &= _step("Chrome trace of a 2-kernel call", trace)
    ok &= _step("cupti_cold profiler session", session)
    ok &= _step("timing methods side by side", methods)
    if not args.skip_ncu:
        ok &= _step("Nsight Compute raw CSV of one decode call", ncu)
    print("done" if ok else "done, with failures (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
