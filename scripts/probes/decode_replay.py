"""Replay decode vs the standard step on the GPU: µs per generated token at B = 1, 64, 512
for every L, fp32 and bf16 checkpoints, one token per call and speculative T=4 (accepted
1/3/2/2), each kind gated first against the float32 reference of its token stream (notebook
01 section 9's own gate and timing: ``kernels.experiments.decode_replay.run_replay``), with
``graph`` timing. Prints the tables, the best L per B against the targets, and the bytes
model's floor fraction; with ``--configs`` it repeats the run per decode config (BV and
warps of the replay kernel; the default ``auto`` is ``config_for(B)``).

    PYTHONPATH=$PWD python3 scripts/probes/decode_replay.py [--B 1 64 512] [--L 1 2 4 8 16]
        [--configs auto BV16-w1-s1-t1 BV32-w2-s1-t1] [--method graph] [--root .probe/old]
-> $OUT/decode_replay_<sha>[_<root>].jsonl (one row per timed point; results/<gpu>/dev_checks/)

``--root``: import ``kernels`` from that folder instead (an older tree unpacked there, e.g.
``git archive <sha> kernels | tar -x -C .probe/old``), so that two runs in one GPU call
time the old and the new kernel on the same card; the rows carry ``root`` and the file
name its last part. The ``kernels`` imported is printed first.
"""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--B", type=int, nargs="+", default=[1, 64, 512])
ap.add_argument("--L", type=int, nargs="+", default=[1, 2, 4, 8, 16])
ap.add_argument("--configs", nargs="+", default=["auto"])
ap.add_argument("--method", default="graph")
ap.add_argument("--root", default=None, help="import kernels from this folder (A/B)")
ap.add_argument("--reps", type=int, default=30)
args = ap.parse_args()
if args.root:
    sys.path.insert(0, os.path.abspath(args.root))

import pandas as pd  # noqa: E402

import kernels  # noqa: E402
from kernels.experiments import decode_crossover as dx  # noqa: E402
from kernels.experiments import decode_replay as rp  # noqa: E402

print(f"kernels from {os.path.dirname(kernels.__file__)}", flush=True)
sha = os.environ.get("GDN_GIT_SHA", "dev")[:7]
tag = f"_{os.path.basename(os.path.normpath(args.root))}" if args.root else ""
root = os.environ.get("OUT", "/tmp")
out = open(os.path.join(root, f"decode_replay_{sha}{tag}.jsonl"), "w")
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
failed = False
for cfg in args.configs:
    params = {p.name: p.default for p in dx.PARAMS}
    params.update(device="cuda", profile="probe",
                  output_root=os.path.join(root, f"replay_probe{tag}"),
                  replay_batch_sizes=args.B, replay_L=args.L, replay_method=args.method,
                  replay_repetitions=args.reps, replay_config=cfg, drift_steps=[1, 1000])
    run = dx.start(params)
    res = dx.run_replay(run)
    gate, times = res["gate"], res["times"]
    bad = gate[gate.status != "pass"]
    if len(bad):
        failed = True
        print(f"GATE FAILURES ({cfg}):\n{bad[['label', 'state_dtype', 'B', 'status', 'reason']]}")
    for r in times.itertuples():
        row = dict(config_param=cfg, label=r.label, kind=r.kind, L=int(r.L), T=int(r.T),
                   B=int(r.B), state_dtype=r.state_dtype, config=r.config, method=r.method,
                   us_per_token=round(r.us_per_token, 3), p20=round(r.p20_us, 3),
                   p80=round(r.p80_us, 3), floor_us=round(r.floor_us, 3),
                   frac_of_floor=round(r.frac_of_floor, 3), gpu=r.gpu, sha=sha,
                   root=args.root or ".")
        out.write(json.dumps(row) + "\n")
    out.flush()
    print(f"\n=== replay_config={cfg}, {args.method}: µs per generated token ===")
    print(rp.replay_table(times).round(2))
    print(rp.replay_table(times, spec=True).round(2))
    print(rp.replay_markdown(times, gate, None))
    if cfg == args.configs[0]:
        drift = dx.run_replay_drift(run)
        print(rp.replay_drift_table(drift))
    run.finish()
sys.exit(1 if failed else 0)
