"""kernels.checks: the contest rule ``|x-ref| <= atol or |x-ref| <= rtol*|ref|``."""
from __future__ import annotations

import math

import pytest
import torch

from kernels.checks import ATOL, RTOL, CheckResult, check_close, check_outputs

NAN, INF = float("nan"), float("inf")


def _t(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype)


RULE_CASES = [
    # (actual, expected, ok) with the contest tolerances atol = rtol = 1e-2
    pytest.param(_t(1.0, 2.0), _t(1.0, 2.0), True, id="exact"),
    pytest.param(_t(0.009), _t(0.0), True, id="atol-branch-pass"),
    pytest.param(_t(0.011), _t(0.0), False, id="atol-branch-fail"),
    pytest.param(_t(-0.009), _t(0.0), True, id="atol-branch-negative-diff"),
    pytest.param(_t(100.9), _t(100.0), True, id="rtol-branch-pass"),
    pytest.param(_t(101.1), _t(100.0), False, id="rtol-branch-fail"),
    pytest.param(_t(-100.9), _t(-100.0), True, id="rtol-uses-abs-ref"),
    pytest.param(_t(0.5 + 0.009), _t(0.5), True, id="small-ref-atol-wins"),
    pytest.param(_t(NAN), _t(0.0), False, id="nan-actual"),
    pytest.param(_t(INF), _t(1e30), False, id="inf-actual"),
    pytest.param(_t(-INF), _t(0.0), False, id="neg-inf-actual"),
    pytest.param(_t(0.0), _t(NAN), False, id="nan-reference"),
    pytest.param(_t(1.0, 2.0, dtype=torch.bfloat16), _t(1.0, 2.0, dtype=torch.bfloat16), True,
                 id="bf16-exact"),
]


@pytest.mark.parametrize("actual,expected,ok", RULE_CASES)
def test_rule(actual, expected, ok):
    res = check_close(actual, expected)
    assert res.ok is ok
    assert res.n_total == expected.numel()
    assert (res.n_bad == 0) is ok
    assert (res.reason == "") is ok
    if not ok:
        assert res.reason.startswith("output:")


@pytest.mark.parametrize("actual,expected,ok", [
    pytest.param(_t(0.5), _t(0.0), True, id="atol-boundary-inclusive"),
    pytest.param(_t(3.0), _t(2.0), True, id="rtol-boundary-inclusive"),
    pytest.param(_t(0.75), _t(0.0), False, id="beyond-atol"),
])
def test_custom_tolerances_are_inclusive(actual, expected, ok):
    assert check_close(actual, expected, atol=0.5, rtol=0.5).ok is ok


def test_contest_tolerances():
    assert ATOL == RTOL == 1e-2


@pytest.mark.parametrize("actual,expected,what", [
    pytest.param(torch.zeros(2, 3), torch.zeros(3, 2), "shape", id="shape-transposed"),
    pytest.param(torch.zeros(6), torch.zeros(1, 6), "shape", id="shape-extra-dim"),
    pytest.param(torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4), "dtype", id="dtype-bf16-vs-f32"),
    pytest.param(torch.zeros(4, dtype=torch.float64), torch.zeros(4), "dtype", id="dtype-f64-vs-f32"),
])
def test_shape_and_dtype_must_match_exactly(actual, expected, what):
    res = check_close(actual, expected, name="new_state")
    assert not res.ok
    assert res.reason.startswith(f"new_state: {what}")
    assert res.n_bad == res.n_total == expected.numel()
    assert math.isinf(res.max_abs_err) and math.isinf(res.rel_l2_err)


def test_counts_and_error_summaries():
    ref = torch.zeros(10)
    ref[:5] = 10.0
    x = ref.clone()
    x[0] += 0.5        # rtol: 0.5 > 0.1 -> bad
    x[6] = 0.02        # atol: bad
    x[7] = 0.005       # atol: good
    x[1] += 0.05       # rtol: 0.05 <= 0.1 -> good
    res = check_close(x, ref)
    assert (res.ok, res.n_bad, res.n_total) == (False, 2, 10)
    assert res.max_abs_err == pytest.approx(0.5)
    expected_rel = float((x - ref).norm() / ref.norm())
    assert res.rel_l2_err == pytest.approx(expected_rel)
    assert "2/10" in res.reason


def test_nan_counts_and_infinite_errors():
    res = check_close(_t(NAN, 1.0, INF, 2.0), _t(0.0, 1.0, 0.0, 2.0))
    assert (res.ok, res.n_bad) == (False, 2)
    assert math.isinf(res.max_abs_err) and math.isinf(res.rel_l2_err)
    assert "2 NaN/Inf" in res.reason


def test_zero_reference_relative_error_falls_back_to_abs_norm():
    res = check_close(_t(0.003, 0.004), _t(0.0, 0.0))
    assert res.ok and res.rel_l2_err == pytest.approx(0.005)


def test_empty_tensors_pass():
    res = check_close(torch.zeros(0, 8), torch.zeros(0, 8))
    assert res.ok and res.n_total == 0


def test_inputs_not_modified_and_any_device_layout():
    a = torch.randn(4, 6).t()  # non-contiguous is fine for the checker
    b = a.clone()
    a0 = a.clone()
    assert check_close(a, b).ok
    assert torch.equal(a, a0)


def test_check_outputs_combines_both():
    out, st = torch.ones(3, dtype=torch.bfloat16), torch.zeros(2, 2)
    good = check_outputs((out, st), (out.clone(), st.clone()))
    assert good.ok and good.n_total == 3 + 4 and good.reason == ""
    bad_st = st.clone()
    bad_st[0, 0] = 1.0
    bad = check_outputs((out, bad_st), (out, st))
    assert not bad.ok and bad.n_bad == 1 and bad.n_total == 7
    assert bad.reason.startswith("new_state:") and "output:" not in bad.reason
    assert bad.max_abs_err == pytest.approx(1.0)
    both = check_outputs((out * 2, bad_st), (out, st))
    assert both.reason.count(";") == 1 and both.n_bad == 4


def test_check_outputs_shape_mismatch_in_one_output():
    res = check_outputs((torch.zeros(3), torch.zeros(2, 2)), (torch.zeros(3), torch.zeros(2, 3)))
    assert not res.ok and "new_state: shape" in res.reason


def test_as_dict():
    d = check_close(_t(1.0), _t(1.0)).as_dict()
    assert set(d) == {"ok", "max_abs_err", "rel_l2_err", "n_bad", "n_total", "reason"}
    assert isinstance(check_close(_t(1.0), _t(1.0)), CheckResult)
