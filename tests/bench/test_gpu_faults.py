"""Fault cases on a GPU (issue 19): every case of :mod:`kernels.bench.faults` in its own
subprocess must end in a clear error or NaN-marked outputs (or the reference's numbers
where the inputs are legitimate), inputs untouched, the CUDA context alive afterwards.

The same run writes the committed table: ``python -m kernels.bench.faults --out
results/<gpu-slug>/faults.csv``.
"""
from __future__ import annotations

import pytest

from kernels.bench import faults

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("target", faults.TARGETS)
def test_fault_cases(target):
    sel = [c for c in faults.cases() if c.target == target]
    rows = faults.run_all(sel, jobs=4, progress=None)
    bad = [f"{r['case']}: {r['outcome']} (untouched {r['inputs_untouched']}, context "
           f"{r['context_ok']})" for r in rows if not r["passed"]]
    assert not bad, "\n".join(bad)
