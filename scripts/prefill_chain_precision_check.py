"""Accuracy of the CP chain's product precision at T=8192 (GPU): contest and hard inputs.

    python scripts/prefill_chain_precision_check.py

Prints, per input set and ``cp_chain_precision``, the contest check of the ``fused``
variant with 16-chunk CP segments against the float32 reference.
"""
from __future__ import annotations

from kernels.checks import check_outputs
from kernels.prefill import PrefillConfig, gdn_prefill
from kernels.reference import prefill_reference
from kernels.spec import make_prefill_inputs
from kernels.stress_inputs import make_prefill_stress_inputs


def main():
    for label, x in (("contest", make_prefill_inputs([8192], device="cuda")),
                     ("contest-2x4096+100", make_prefill_inputs([4096, 4096, 100], device="cuda",
                                                                seed=3)),
                     ("stress0.02", make_prefill_stress_inputs([8192], spread=0.02,
                                                               device="cuda")),
                     ("stress1.0", make_prefill_stress_inputs([8192], spread=1.0, device="cuda"))):
        ref = prefill_reference(**x)
        for name in ("tf32x3", "bf16x2", "bf16"):
            out = gdn_prefill(**x, variant="fused", cp=16,
                              config=PrefillConfig(cp_chain_precision=name))
            r = check_outputs(out, ref)
            print(label, "chain", name, r.ok,
                  f"max_abs={r.max_abs_err:.4f} rel_l2={r.rel_l2_err:.5f}", flush=True)


if __name__ == "__main__":
    main()
