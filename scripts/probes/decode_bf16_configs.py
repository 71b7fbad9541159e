"""Issue 20 lead: is our bf16-state decode slow because it runs the fp32 table's configs?
Sweeps decode configs with a bf16 state at B = 64, 128, 512 (cupti_cold, gated against the
float32 reference) and prints, per B, the table's config time (fp32 and bf16 state), the
best bf16 configs and the fp32 / bf16 speedups (target: >= 1.8x at B >= 64). 89 configs:
~3 minutes, mostly compilation.
Run (GPU host): PYTHONPATH=$PWD python3 scripts/probes/decode_bf16_configs.py
-> $OUT/decode_bf16_configs.json (dev_checks/decode_bf16_configs_<sha>.json)
"""
import json
import os

import torch

from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.decode import config_for, config_grid, gdn_decode
from kernels.reference import decode_reference
from kernels.spec import make_decode_inputs

grid = config_grid(BVs=(4, 8, 16, 32, 64), warps=(1, 2, 4, 8), v_tiles=(1, 2), BKs=(32, 128),
                   prefetch=(False, True))
rows = []
for B in (64, 128, 512):
    table = config_for(B)
    x32 = make_decode_inputs(B, device="cuda")
    x16 = make_decode_inputs(B, device="cuda", state_dtype=torch.bfloat16)
    ref16 = decode_reference(**x16)
    t32 = time_fn(lambda: gdn_decode(**x32), "cupti_cold", rep=30, warmup=5).median_us
    res = []
    for cfg in grid:
        try:
            r = check_outputs(gdn_decode(**x16, config=cfg), ref16)
            if not r.ok:
                continue
            t = time_fn(lambda c=cfg: gdn_decode(**x16, config=c), "cupti_cold", rep=20,
                        warmup=3).median_us
        except Exception as e:   # a config that does not fit: skip it
            print(cfg.name, type(e).__name__, str(e)[:80])
            continue
        res.append((t, cfg.name))
    res.sort()
    t16_table = next((t for t, n in res if n == table.name), None)
    row = dict(B=B, table=table.name, fp32_table_us=t32, bf16_table_us=t16_table,
               bf16_best=res[0][1], bf16_best_us=res[0][0], top5=res[:5],
               speedup_table=t32 / t16_table if t16_table else None,
               speedup_best=t32 / res[0][0])
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "decode_bf16_configs.json"), "w"))
