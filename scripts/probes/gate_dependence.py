"""Notebook 04's "What the gates cost" section alone (the notebook's own functions, nothing
else of the notebook): ours and the ``gate_impls`` at ``gate_shapes`` with each gate set,
gated and timed, ours per kernel. For a GPU call that cannot afford the whole notebook.

    PYTHONPATH=$PWD python3 scripts/probes/gate_dependence.py [impl ...]   # default ours flashqla
-> $OUT/results/<gpu>/04_prefill_scaling/gate_dependence.csv (+ provenance.json); the table
   is printed. (FlashQLA runs in the peer worker: GDN_QLA_SITE, docs/gpu_host.md.)
"""
import os
import sys

from kernels.experiments import prefill_scaling as ps

impls = sys.argv[1:] or ["ours", "flashqla"]
ns = {p.name: p.default for p in ps.PARAMS}
ns.update(profile="full", device="cuda", impls=impls, gate_impls=impls, shapes=["131072"],
          output_root=os.path.join(os.environ.get("OUT", "/tmp"), "results"))
run = ps.start(ps.collect_params(ns))
df = ps.run_gate_dependence(run)
print(ps.gate_dependence_table(df).to_string())
print(df.to_string())
run.finish()
