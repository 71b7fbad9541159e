"""Invalid ``cu_seqlens`` never passes for a result (issue 19).

With ``check_values=False`` the host does not look at the values (what the no-sync CUDA
paths do by default), so these interpreter runs exercise the device-side path: bounds
clamped in every kernel (outputs written only inside their tensors: canaries around
them stay intact), the guard turning every output row and final state into NaN, the
status bits, inputs untouched, the one-launch path's flags left at zero. Every path of
``fused`` carries the guard in its last kernel: the one-launch walkers, the walk alone
(``single_launch_max_T=0``), the chained CP walk and the long CP path's phase C; the
token-recurrent kernel guards in its one launch. With values
checked the same inputs raise a ValueError naming ``cu_seqlens`` before any launch.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.prefill import describe_status, gdn_prefill  # noqa: E402
from kernels.prefill import DEFAULT_CONFIG, pipeline  # noqa: E402
from kernels.prefill import plan as plan_mod  # noqa: E402
from kernels.prefill.chunk_index import CU_DECREASING, CU_END, CU_RANGE, CU_START  # noqa: E402
from kernels.spec import GDNShape, make_prefill_inputs  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S16 = GDNShape(1, 2, 16)
LENS = [3, 70, 0, 20]          # T = 93: the one-launch path of fused; 2 chunks in one sequence
T = sum(LENS)
CANARY = 7.0

# (id, cu_seqlens, expected status bits)
BAD = [
    ("end-short", [0, 3, 73, 73, 90], CU_END),
    ("end-long", [0, 3, 73, 73, 95], CU_END | CU_RANGE),
    ("negative", [-5, 3, 73, 73, 93], CU_START | CU_RANGE),
    ("decreasing", [0, 50, 20, 73, 93], CU_DECREASING),
    ("huge", [0, 3, 2**40, 73, 93], CU_DECREASING | CU_RANGE),
    ("start", [3, 3, 73, 73, 93], CU_START),
]
# (id, variant, cp, path): every composition and every path of fused: the one-launch
# walkers (T = 93), the walk kernel alone, the chained CP walk (cp=True) and the long CP path
WALK_ONLY = dataclasses.replace(DEFAULT_CONFIG, single_launch_max_T=0)
VARIANTS = [("fused", "fused", None, None), ("fused-walk", "fused", None, "walk"),
            ("fused-cp", "fused", True, None), ("fused-cp-long", "fused", True, "long"),
            ("no_sync", "no_sync", None, None), ("graph", "graph", None, None),
            ("unfused", "unfused", None, None), ("fused_gates", "fused_gates", None, None),
            ("recurrent", "recurrent", None, None)]


@contextlib.contextmanager
def _path(path):
    """The context that sends a fused call down ``path`` (None: the default rules): the
    plan's rule patched, no plan remembered across the block's edges."""
    if path != "long":
        yield
        return
    with mock.patch.object(plan_mod, "cp_long", lambda T, N: True):
        plan_mod.clear_plan_cache()
        try:
            yield
        finally:
            plan_mod.clear_plan_cache()


@pytest.fixture(scope="module")
def x():
    return make_prefill_inputs(LENS, S16, seed=3, device=DEV)


def _args(x, cu):
    return (x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"], cu,
            x["scale"])


def _canaried(shape, dtype, pad=4096):
    """An output tensor of ``shape`` inside a buffer with ``CANARY`` around it."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.full((n + 2 * pad,), CANARY, dtype=dtype, device=DEV)
    return buf, buf[pad:pad + n].view(shape), pad


def _run(x, cu, variant, cp, status, path=None):
    N = cu.numel() - 1
    HV, D = x["v"].shape[1], x["v"].shape[2]
    ob, o, pad = _canaried((T, HV, D), torch.bfloat16)
    hb, h, _ = _canaried((N, HV, D, D), torch.float32)
    with warnings.catch_warnings(), _path(path):
        warnings.simplefilter("ignore", RuntimeWarning)   # graph's no-CUDA fallback note
        out = gdn_prefill(*_args(x, cu), variant=variant, cp=cp, check_values=False,
                          output=o, output_state=h, status=status,
                          config=WALK_ONLY if path == "walk" else None)
    assert out[0].data_ptr() == o.data_ptr() and out[1].data_ptr() == h.data_ptr()
    for buf in (ob, hb):   # nothing written outside the outputs
        assert bool((buf[:pad] == CANARY).all()) and bool((buf[-pad:] == CANARY).all())
    return o, h


@pytest.mark.parametrize("variant,cp,path", [pytest.param(v, c, p, id=i)
                                             for i, v, c, p in VARIANTS])
def test_invalid_cu_seqlens_gives_nan_and_status(x, variant, cp, path):
    status = torch.full((1,), -1, dtype=torch.int32, device=DEV)
    # valid: the same numbers as the host-checked call, status 0
    o, h = _run(x, x["cu_seqlens"], variant, cp, status, path)
    with warnings.catch_warnings(), _path(path):
        warnings.simplefilter("ignore", RuntimeWarning)
        o2, h2 = gdn_prefill(*_args(x, x["cu_seqlens"]), variant=variant, cp=cp,
                             config=WALK_ONLY if path == "walk" else None)
    assert torch.equal(o, o2) and torch.equal(h, h2)
    assert bool(o.isfinite().all()) and int(status) == 0
    before = {k: v.clone() for k, v in x.items() if isinstance(v, torch.Tensor)}
    for name, values, bits in BAD:
        cu = torch.tensor(values, dtype=torch.int64, device=DEV)
        o, h = _run(x, cu, variant, cp, status, path)
        assert bool(o.isnan().all()), f"{name}: output not all NaN"
        assert bool(h.isnan().all()), f"{name}: output_state not all NaN"
        assert int(status) == bits, f"{name}: status {int(status)} ({describe_status(status)})"
        assert cu.tolist() == values
    for k, v in before.items():
        assert torch.equal(x[k], v), f"input {k} was modified"


def test_decreasing_cu_seqlens_leaves_walker_flags_zero(x):
    """One-launch path: with a decreasing cu_seqlens no chunk program sets a flag and no
    walker waits (no hang), so the flags stay zero and the next valid call is right."""
    cu = torch.tensor([0, 80, 20, 73, 93], dtype=torch.int64, device=DEV)
    o, h = _run(x, cu, "fused", None, None)
    assert bool(o.isnan().all()) and bool(h.isnan().all())
    flags = pipeline._FLAGS[x["q"].device]
    assert int(flags.abs().sum()) == 0
    o, h = _run(x, x["cu_seqlens"], "fused", None, None)
    o2, h2 = gdn_prefill(*_args(x, x["cu_seqlens"]), variant="fused", check_values=True)
    assert torch.equal(o, o2) and torch.equal(h, h2)


@pytest.mark.parametrize("variant", ["fused", "no_sync", "graph", "unfused"])
@pytest.mark.parametrize("name,values,match", [
    ("negative", [-5, 3, 73, 73, 93], "cu_seqlens must start at 0"),
    ("decreasing", [0, 50, 20, 73, 93], "cu_seqlens must be non-decreasing"),
    ("start", [3, 3, 73, 73, 93], "cu_seqlens must start at 0"),
    ("end-short", [0, 3, 73, 73, 90], r"cu_seqlens\[-1\] must equal T"),
    ("end-long", [0, 3, 73, 73, 95], r"cu_seqlens\[-1\] must equal T"),
])
def test_checked_values_raise_before_launch(x, variant, name, values, match):
    cu = torch.tensor(values, dtype=torch.int64, device=DEV)
    o = torch.full((T, 2, 16), CANARY, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match=match):
        gdn_prefill(*_args(x, cu), variant=variant, check_values=True, output=o)
    assert bool((o == CANARY).all())   # nothing launched


@pytest.mark.parametrize("status,exc,match", [
    (torch.zeros(1, dtype=torch.int64), ValueError, "status must be a one-element int32"),
    (torch.zeros(2, dtype=torch.int32), ValueError, "status must be a one-element int32"),
    ([0], TypeError, "status must be a torch.Tensor"),
])
def test_status_buffer_checked(x, status, exc, match):
    with pytest.raises(exc, match=match):
        gdn_prefill(*_args(x, x["cu_seqlens"]), status=status)


def test_status_zero_when_checked_on_host(x):
    status = torch.full((1,), -1, dtype=torch.int32, device=DEV)
    gdn_prefill(*_args(x, x["cu_seqlens"]), variant="unfused", status=status)
    assert int(status) == 0 and describe_status(status) == "ok"
    assert describe_status(CU_END | CU_DECREASING) == "cu_seqlens[-1] != T; cu_seqlens decreases"
