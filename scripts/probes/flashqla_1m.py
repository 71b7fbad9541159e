"""FlashQLA (and FLA's FlashQLA backend) at 1,048,576 tokens through the peer worker, with ours
run first in this process (the OOM of notebook 04 at 1M): gate + graph.
Run (GPU host, after gpu_lite and gpu_qla_unpack of scripts/gpu_host.sh, with
PYTHONPATH=/root/gpusite:$PWD): python3 scripts/probes/flashqla_1m.py
Writes $OUT/qla1m.json (dev_checks/flashqla_1m_after_oom_fix_d45e49d.json).
"""
import json, os
import torch
from kernels.spec import make_prefill_inputs
from kernels.reference import prefill_reference_chunked
from kernels.prefill import make_prefill_impl
from kernels.experiments.common import gate_call, time_call
from kernels.peers_worker import remote_prefill_impls
rows = []
x = make_prefill_inputs([1 << 20], seed=0, device="cuda")
ref = prefill_reference_chunked(**x)
ours = make_prefill_impl("fused")
g = gate_call(ours, x, ref, "cuda")
t = time_call(lambda: ours(**x), "graph", rep=20, warmup=3)
rows.append(dict(impl="ours", gate=g.get("status"), max_abs=g.get("max_abs_err"), graph_us=t.median_us))
print(json.dumps(rows[-1], default=str), flush=True)
for name, p in remote_prefill_impls(["flashqla", "fla_flashqla"]).items():
    if not p:
        rows.append(dict(impl=name, gate="unavailable", reason=p.reason)); continue
    res = p.run("1M", x, ref, device="cuda", methods=["graph"], rep=20, warmup=3)
    rows.append(dict(impl=name, gate=res["gate"].get("status"), max_abs=res["gate"].get("max_abs_err"),
                     reason=res["gate"].get("reason", ""), timings=res["timings"]))
    print(json.dumps(rows[-1], default=str), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "qla1m.json"), "w"), default=str)
