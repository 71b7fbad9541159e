"""Probe: the product's phase C choices on an sm_90 GPU -- whole ``gdn_prefill`` calls with
the Gluon phase C (:mod:`kernels.prefill.state_walk_gluon`, what
:func:`kernels.prefill.config.walk_gluon_rule` picks on sm_90) against the same calls forced
to the Triton phase C (``PrefillConfig(gluon_walk=False)``).

Points (the generator's inputs, :func:`kernels.spec.make_prefill_inputs`, seed 0, initial
states): one sequence of 32,768, 131,072 and 1,048,576 tokens, and a packed batch of four
sequences that end mid-chunk, 33,000 + 16,421 + 12,000 + 4,700 tokens (an average of 258
chunks: the long path; four sequences of 8,192 tokens average 128 chunks and take the
chained CP, where phase C is not this walk). Per point and choice:

* ``kind: plan``: the path and the phase C kernel the plan picked (the Gluon choice must
  report ``phase_c_gluon: true``, else the point is an error: the rule fell back);
* ``kind: gate``: the call's ``o`` and final state against the float32 chunked reference
  (:func:`kernels.reference.prefill_reference_chunked`; one sequence in pieces of 131,072
  tokens, each starting from the previous piece's state, as notebook 05 does at these
  lengths), contest rule (:func:`kernels.checks.check_outputs`), and for the Gluon choice
  the max abs difference of ``o`` and of the state to the Triton choice's (expected 0.0);
* ``kind: time`` (only what passed its gate): the whole call with the suite's ``graph``
  method (:func:`kernels.bench.timing.time_fn`, L2 flushed, median of 20) and per kernel
  with CUPTI (:func:`kernels.bench.anatomy.kernel_times`, warm L2, eager, median of 3
  calls), phase C's kernel singled out.

One JSON line per row on stdout and in ``$OUT/gluon_product_<sha>.jsonl`` (``GDN_GIT_SHA``
names it). Exit status 1 if a gate failed, a plan fell back or a call raised.

    PYTHONPATH=$PWD python3 scripts/probes/gluon_product.py --import-check   # CPU
    GDN_GIT_SHA=<sha> PYTHONPATH=$PWD timeout 300 python3 scripts/probes/gluon_product.py \\
        --out $OUT                                                           # H200
"""
from __future__ import annotations

import argparse
import json
import os
import sys

#: The points: label -> sequence lengths.
POINTS = {"T32768": [32768], "T131072": [131072], "T1048576": [1048576],
          "varlen4": [33000, 16421, 12000, 4700]}
#: Tokens per piece of the reference of one long sequence.
REF_PIECE = 131072


def reference(x: dict):
    """The float32 chunked reference of ``x``: whole for a packed batch, in pieces of
    :data:`REF_PIECE` tokens (state handed on) for one long sequence."""
    import torch

    from kernels.reference import prefill_reference_chunked

    T, N = x["q"].shape[0], x["cu_seqlens"].numel() - 1
    if N > 1 or T <= REF_PIECE:
        return prefill_reference_chunked(**x)
    outs, state = [], x["state"]
    for s in range(0, T, REF_PIECE):
        e = min(s + REF_PIECE, T)
        o, state = prefill_reference_chunked(
            **{n: x[n][s:e] for n in ("q", "k", "v", "a", "b")}, state=state,
            A_log=x["A_log"], dt_bias=x["dt_bias"], scale=x["scale"],
            cu_seqlens=torch.tensor([0, e - s], dtype=x["cu_seqlens"].dtype,
                                    device=x["q"].device))
        outs.append(o)
    return torch.cat(outs), state


def run(points, out_dir: str) -> int:
    import torch
    import triton

    from kernels.bench.anatomy import kernel_times
    from kernels.bench.timing import time_fn
    from kernels.checks import check_outputs
    from kernels.prefill import PrefillConfig, gdn_prefill, prefill_plan
    from kernels.spec import make_prefill_inputs

    sha = os.environ.get("GDN_GIT_SHA", "dev")[:7]
    gpu = torch.cuda.get_device_name()
    cc = torch.cuda.get_device_capability()
    out = open(os.path.join(out_dir, f"gluon_product_{sha}.jsonl"), "w")

    def emit(row):
        row = dict(row, gpu=gpu, cc=list(cc), sha=sha, triton=triton.__version__,
                   torch=torch.__version__)
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()

    configs = {"gluon": None, "triton": PrefillConfig(gluon_walk=False)}
    status = 0
    for label in points:
        lens = POINTS[label]
        x = make_prefill_inputs(lens, seed=0, device="cuda", with_state=True)
        T, N = x["q"].shape[0], len(lens)
        HV, D = x["v"].shape[1], x["v"].shape[2]
        info = dict(point=label, T=T, N=N)
        ref = reference(x)
        outs, timed = {}, {}
        for impl, cfg in configs.items():
            p = prefill_plan(T, N, HV, D, "cuda", config=cfg)
            emit(dict(info, kind="plan", impl=impl, path=p.path, seg_chunks=p.seg_chunks,
                      phase_c_gluon=p.phase_c_gluon))
            if p.phase_c_gluon != (impl == "gluon"):
                # a point off the long path (no phase C to choose): an error only for the
                # one-sequence points, which must take it
                emit(dict(info, kind="error" if p.seg_chunks else "skip", impl=impl,
                          error=f"the plan's phase C is not this choice (path {p.path}, "
                                f"phase_c_gluon={p.phase_c_gluon})"))
                status |= 1 if p.seg_chunks else 0
                continue
            fn = (lambda cfg=cfg: gdn_prefill(**x, config=cfg))   # noqa: E731
            try:
                o, ht = fn()
                torch.cuda.synchronize()
            except Exception as e:   # noqa: BLE001 -- report, go on with the others
                emit(dict(info, kind="error", impl=impl, error=f"{type(e).__name__}: {e}"[:400]))
                status = 1
                continue
            outs[impl] = (o, ht)
            r = check_outputs((o, ht), tuple(ref))
            row = dict(info, kind="gate", impl=impl, ok=bool(r.ok), max_abs=r.max_abs_err,
                       rel_l2=r.rel_l2_err, reason=r.reason)
            emit(row)
            status |= 0 if r.ok else 1
            if r.ok:
                timed[impl] = fn
        if len(outs) == 2:
            (og, hg), (ot, htt) = outs["gluon"], outs["triton"]
            emit(dict(info, kind="gate", impl="gluon vs triton",
                      o_max_abs=(og.float() - ot.float()).abs().max().item(),
                      state_max_abs=(hg - htt).abs().max().item(),
                      bitwise=bool(torch.equal(og, ot) and torch.equal(hg, htt))))
        del outs
        for impl, fn in timed.items():
            g = time_fn(fn, "graph", rep=20, warmup=3)
            kt = kernel_times(fn, calls=3)
            walks = kt[kt.kernel.str.contains("state_walk_gluon|state_walk_t")]
            if walks.empty:
                continue
            c = walks.iloc[-1]
            emit(dict(info, kind="time", impl=impl, call_graph_us=g.median_us,
                      call_graph_p20_us=g.p20_us, call_graph_p80_us=g.p80_us,
                      phase_c_kernel=str(c.kernel)[:40], phase_c_us=float(c.median_us),
                      kernels={f"{k.role}|{str(k.kernel)[:24]}": round(float(k.median_us), 1)
                               for k in kt.itertuples()},
                      method="graph: median of 20 replays, L2 flushed; per kernel: CUPTI, "
                             "warm L2, eager, median of 3 calls"))
        del x, ref, timed
        torch.cuda.empty_cache()
    out.close()
    return status


def import_check() -> int:
    """CPU: the modules import and the rule's answer on this host (no launch)."""
    from kernels.prefill import prefill_plan
    from kernels.prefill.state_walk_gluon import HAVE_GLUON

    p = prefill_plan(131072, 1, 8, 128, "cpu")
    print(json.dumps(dict(have_gluon=HAVE_GLUON, path=p.path, phase_c_gluon=p.phase_c_gluon,
                          note="off CUDA the rule picks the Triton phase C")))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default=",".join(POINTS),
                    help=f"comma-separated, of {', '.join(POINTS)}")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--import-check", action="store_true",
                    help="CPU: import the modules and print the rule's choice here")
    a = ap.parse_args(argv)
    points = a.points.split(",")
    if any(p not in POINTS for p in points):
        ap.error(f"--points: pick from {', '.join(POINTS)}")
    if a.import_check:
        return import_check()
    return run(points, a.out)


if __name__ == "__main__":
    sys.exit(main())
