"""cupti_cold us of gdn_decode with T = 1..4 tokens per sequence at B = 1, 4, 8, 32, 64, 512 (the
table's config), gated against the float32 reference, tagged so that two trees can be compared
(issue 20's target: T=4 in one call <= 1.3 x one T=1 call). Used to measure the unrolled
token loop (merged in the twelfth session) against the loop before it, and the UT form of
branch decode-ut (all 2T row reductions against the entering state) against main:
    PYTHONPATH=$PWD python3 scripts/probes/decode_tokens.py new
    git archive <old commit> kernels | tar -x -C .probe/old   # here, then carry .probe
    PYTHONPATH=$PWD/.probe/old python3 scripts/probes/decode_tokens.py old
-> $OUT/decode_tokens_<tag>.json (results/<gpu>/dev_checks/decode_tokens_*.json)
"""
import json
import os
import sys

from kernels.bench.timing import time_fn
from kernels.checks import check_outputs
from kernels.decode import gdn_decode
from kernels.reference import decode_reference
from kernels.spec import make_decode_inputs

tag = sys.argv[1]
rows = []
for B in (1, 4, 8, 32, 64, 512):
    for T in (1, 2, 3, 4):
        x = make_decode_inputs(B, device="cuda", tokens=T)
        r = check_outputs(gdn_decode(**x), decode_reference(**x))
        t = time_fn(lambda: gdn_decode(**x), "cupti_cold", rep=50, warmup=5) if r.ok else None
        rows.append(dict(tag=tag, B=B, T=T, ok=bool(r.ok), max_abs=float(r.max_abs_err),
                         cupti_cold_us=None if t is None else float(t.median_us)))
        print(json.dumps(rows[-1]), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"decode_tokens_{tag}.json"), "w"))
