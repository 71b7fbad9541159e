"""Issue 20 lead: is multi-token decode (T = 4) slow because it runs the T = 1 table's configs?
Hypothesis: each token costs two row reductions per row, each ``log2(BK / 4)`` shuffles plus
in-thread adds (kernels/decode/config.py, ``BK``); the T = 1 tables pick ``BK = 128`` (5
shuffles), and at T = 4 the shuffles (not the bytes) would bound the call: at B = 64, BV8-w1,
8,192 programs x 320 shuffles / 132 SMs ~ 20k warp-shuffles per SM ~ 10 us at one per clock,
the extra time measured for T = 4 over T = 1. ``BK = 16`` / ``32`` need 2 / 3 shuffles.
Sweeps configs at B = 32, 64, 512 with T = 4 (and the same configs at T = 1), cupti_cold,
each gated against the float32 reference.

Outcome (H200, de65b81): refuted, BK = 16 / 32 are slower at T = 4 (docs/notes.md). Second
grid (``tiles``): the table's BK = 128 with several tiles per program, optionally prefetching
the next tile while one is updated (``V_TILES``, ``PREFETCH``): does overlapping one tile's
T-token compute with the next tile's load pay, if the extra time at T = 4 is the updates'
instructions not overlapping the state stream?

Run (GPU host): PYTHONPATH=$PWD python3 scripts/probes/decode_tokens_configs.py [bk|tiles]
-> $OUT/decode_tokens_configs[_tiles].json (dev_checks/decode_tokens_configs[_tiles]_<sha>.json)
"""
import json
import os
import sys

from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.decode import config_for, config_grid, gdn_decode
from kernels.reference import decode_reference
from kernels.spec import make_decode_inputs

mode = (sys.argv[1:] or ["bk"])[0]
if mode == "tiles":
    grid = config_grid(BVs=(4, 8, 16, 32), warps=(1, 2, 4), v_tiles=(1, 2, 4), BKs=(128,),
                       prefetch=(False, True))
else:
    grid = config_grid(BVs=(4, 8, 16, 32), warps=(1, 2, 4), v_tiles=(1,), BKs=(16, 32, 128),
                       prefetch=(False,))
out = {"grid": [c.name for c in grid], "rows": []}


def timed(x, ref, cfg):
    r = check_outputs(gdn_decode(**x, config=cfg), ref)
    if not r.ok:
        return None
    return time_fn(lambda: gdn_decode(**x, config=cfg), "cupti_cold", rep=20, warmup=3).median_us


for B in (32, 64, 512):
    xs = {T: make_decode_inputs(B, device="cuda", tokens=T) for T in (1, 4)}
    refs = {T: decode_reference(**x) for T, x in xs.items()}
    table = config_for(B)
    for cfg in [table] + [c for c in grid if c != table]:
        row = dict(B=B, config=cfg.name, table=cfg == table)
        for T in (1, 4):
            try:
                row[f"T{T}_us"] = timed(xs[T], refs[T], cfg)
            except Exception as e:   # a config that does not compile or fit
                row[f"T{T}_us"] = None
                row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    rows = [r for r in out["rows"] if r["B"] == B and r.get("T4_us")]
    t1 = next(r["T1_us"] for r in rows if r["table"])
    best = sorted(rows, key=lambda r: r["T4_us"])[:5]
    print(f"B={B}: table {table.name} T1 {t1:.2f} us; best T4: "
          + ", ".join(f"{r['config']} {r['T4_us']:.2f} ({r['T4_us'] / t1:.2f}x T1)" for r in best),
          flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "decode_tokens_configs"
                           + ("_tiles" if mode == "tiles" else "") + ".json"), "w"),
          indent=1)
