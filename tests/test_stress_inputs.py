"""Hard prefill inputs (correlated keys, beta ~ 1, long memory) and what passes on them.

On these inputs every bf16-intermediate pipeline -- ours by default, FLA's and
FlashInfer's -- exceeds the contest tolerance on an H200
(``results/nvidia-h200/dev_checks/prefill_solve_stress_9167759.csv``); the ``precise``
configuration passes. The CPU checks below use small head sizes; the GPU ones the
contest shapes.
"""
from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.checks import check_outputs  # noqa: E402
from kernels.prefill import ACCURATE_CONFIG, gdn_prefill  # noqa: E402
from kernels.reference import prefill_reference  # noqa: E402
from kernels.spec import CONTEST, GDNShape, make_prefill_inputs  # noqa: E402
from kernels.stress_inputs import LONG_MEMORY_DT, make_prefill_stress_inputs, with_gates  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S32 = GDNShape(2, 4, 32)
PRECISE = ACCURATE_CONFIG


@pytest.mark.parametrize("spread, lens", [
    pytest.param(0.0, [5, 0, 7], id="identical-keys"),
    pytest.param(0.02, [12], id="near-parallel"),
])
def test_generator_shapes_and_gates(spread, lens):
    x = make_prefill_stress_inputs(lens, S32, spread=spread)
    plain = make_prefill_inputs(lens, S32)
    for name, t in plain.items():
        if isinstance(t, torch.Tensor):
            assert x[name].shape == t.shape and x[name].dtype == t.dtype, name
    assert torch.allclose(x["k"].float().norm(dim=-1), torch.ones(sum(lens), 2), atol=1e-2)
    assert torch.all(x["b"] == 4.0) and torch.all(x["a"] == -6.0)
    assert torch.equal(x["v"], plain["v"]) and torch.equal(x["q"], plain["q"])


def test_zero_spread_gives_one_key_per_sequence_and_head():
    x = make_prefill_stress_inputs([6, 4], S32, spread=0.0)
    k = x["k"]
    assert torch.equal(k[0:6], k[0:1].expand(6, -1, -1))
    assert torch.equal(k[6:10], k[6:7].expand(4, -1, -1))
    assert not torch.equal(k[0], k[6])


def test_negative_spread_is_refused():
    with pytest.raises(ValueError, match="spread"):
        make_prefill_stress_inputs([4], S32, spread=-1.0)


@pytest.mark.parametrize("lens", [[64, 70], [100, 28]], ids=["64+70", "100+28-one-launch"])
@pytest.mark.parametrize("spread", [0.0, 0.02], ids=["identical-keys", "near-parallel"])
def test_precise_config_passes_hard_inputs(spread, lens):
    x = make_prefill_stress_inputs(lens, S32, spread=spread, device=DEV)
    r = check_outputs(gdn_prefill(**x, variant="fused", config=PRECISE), prefill_reference(**x))
    assert r.ok, f"{r.reason} (max abs {r.max_abs_err:.3e})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("lens, spread", [
    pytest.param([64] * 8, 0.0, id="8x64-identical-keys"),
    pytest.param([300, 64], 0.02, id="300+64-near-parallel"),
    pytest.param([8192], 0.02, id="T8192-cp-near-parallel"),
])
def test_gpu_precise_config_passes_hard_inputs(lens, spread):
    x = make_prefill_stress_inputs(lens, CONTEST, spread=spread, device="cuda")
    r = check_outputs(gdn_prefill(**x, variant="fused", config=PRECISE), prefill_reference(**x))
    assert r.ok, f"{r.reason} (max abs {r.max_abs_err:.3e})"


def test_with_gates_changes_only_the_gates_and_leaves_the_inputs():
    x = make_prefill_inputs([130], seed=3)
    keep = {n: t.clone() for n, t in x.items() if isinstance(t, torch.Tensor)}
    dt_bias = LONG_MEMORY_DT + math.log(-math.expm1(-LONG_MEMORY_DT))
    assert with_gates(x, "generator")["A_log"] is x["A_log"]
    one = with_gates(x, "one long-memory head")
    assert float(one["A_log"][0]) == 0.0 and float(one["dt_bias"][0]) == pytest.approx(dt_bias)
    assert torch.equal(one["A_log"][1:], x["A_log"][1:]) and one["k"] is x["k"]
    every = with_gates(x, "every head long memory")
    assert (every["A_log"] == 0).all() and torch.allclose(every["dt_bias"],
                                                         torch.full_like(x["dt_bias"], dt_bias))
    # softplus(dt_bias) is dt: the per-token log decay is about -A dt = -1e-3
    assert float(torch.nn.functional.softplus(every["dt_bias"][0])) == pytest.approx(1e-3)
    for n, t in keep.items():
        assert torch.equal(x[n], t), n                  # the given inputs are untouched
    with pytest.raises(ValueError, match="gates must be one of"):
        with_gates(x, "slow")
