"""Host time of one eager gdn_decode call (Python entry to launch return, no sync), with the
direct launch (kernels.launch.FastLaunch) and with GDN_FAST_LAUNCH=0 (kernel[grid](...)).
Run (GPU host): PYTHONPATH=$PWD python3 scripts/probes/decode_host_cost.py
(dev_checks/decode_host_cost_<sha>.json; docs/notes.md).
"""
import json
import os
import statistics
import time

import torch

from kernels.decode import gdn_decode
from kernels.spec import make_decode_inputs

rows = []
for B in (1, 64):
    x = make_decode_inputs(B, device="cuda")
    for fast in ("1", "0", "1"):
        os.environ["GDN_FAST_LAUNCH"] = fast
        for _ in range(20):
            gdn_decode(**x)
        torch.cuda.synchronize()
        ts = []
        for _ in range(300):
            t0 = time.perf_counter()
            gdn_decode(**x)
            ts.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
        rows.append(dict(B=B, fast_launch=fast, host_us_median=statistics.median(ts),
                         host_us_p20=sorted(ts)[len(ts) // 5]))
        print(json.dumps(rows[-1]), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "decode_host_cost.json"), "w"))
