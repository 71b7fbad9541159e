"""kernels.interpret: the CPU-interpreter work-arounds, checked with tiny Triton kernels.

On the interpreter (no GPU) bf16 ``tl.dot`` and bf16 arithmetic must match
torch exactly (the patch computes in float32 and rounds back to bf16 per
operation, which is what torch does); ``@triton.autotune`` keeps its first
config; a scalar comparison used as the mask of a block load/store works (on
triton >= 3.9 only with the splat patch). On a GPU the same kernels run natively and must match within bf16
rounding.
"""
from __future__ import annotations

import os

import pytest
import torch

from kernels import interpret  # installs the patches before any kernel below is defined

import triton  # noqa: E402  (after kernels.interpret on purpose)
import triton.language as tl  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
if not INTERPRET and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("TRITON_INTERPRET=0 but no CUDA GPU: nothing can run Triton here",
                allow_module_level=True)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, c16_ptr,
                M: tl.constexpr,  # rows of a
                N: tl.constexpr,  # columns of b
                K: tl.constexpr,  # inner size
                ):
    o_m = tl.arange(0, M)
    o_n = tl.arange(0, N)
    o_k = tl.arange(0, K)
    b_a = tl.load(a_ptr + o_m[:, None] * K + o_k[None, :])   # [M, K] bf16
    b_b = tl.load(b_ptr + o_k[:, None] * N + o_n[None, :])   # [K, N] bf16
    b_c = tl.dot(b_a, b_b)                                   # [M, N] f32 accumulate
    tl.store(c_ptr + o_m[:, None] * N + o_n[None, :], b_c)
    tl.store(c16_ptr + o_m[:, None] * N + o_n[None, :], b_c.to(tl.bfloat16))


@triton.jit
def _bf16_arith_kernel(a_ptr, b_ptr, out_ptr, lt_ptr, mixed_ptr,
                       n,                       # number of elements (masked tail)
                       BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    b_a = tl.load(a_ptr + o, mask=m, other=0.0)  # bf16
    b_b = tl.load(b_ptr + o, mask=m, other=0.0)  # bf16
    b_o = b_a * b_b + b_a - b_b                  # bf16 arithmetic, rounded per op
    tl.store(out_ptr + o, b_o, mask=m)
    tl.store(lt_ptr + o, (b_a < b_b).to(tl.int8), mask=m)
    tl.store(mixed_ptr + o, b_a.to(tl.float32) * b_b.to(tl.float32) + 1.0, mask=m)


@pytest.mark.parametrize("M,N,K", [
    pytest.param(16, 16, 16, id="16x16x16"),
    pytest.param(32, 16, 64, id="32x16x64"),
    pytest.param(16, 128, 128, id="16x128x128-D128"),
])
def test_bf16_dot_matches_torch(M, N, K):
    g = torch.Generator().manual_seed(M * N + K)
    a = torch.randn(M, K, generator=g).bfloat16().to(DEVICE)
    b = torch.randn(K, N, generator=g).bfloat16().to(DEVICE)
    c = torch.empty(M, N, device=DEVICE)
    c16 = torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16)
    _dot_kernel[(1,)](a, b, c, c16, M=M, N=N, K=K)
    expected = a.float() @ b.float()
    torch.testing.assert_close(c, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(c16, expected.bfloat16(), rtol=2 ** -7, atol=1e-2)


def _run_arith(n):
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=g).bfloat16().to(DEVICE)
    b = torch.randn(n, generator=g).bfloat16().to(DEVICE)
    out = torch.empty_like(a)
    lt = torch.empty(n, dtype=torch.int8, device=DEVICE)
    mixed = torch.empty(n, device=DEVICE)
    _bf16_arith_kernel[(triton.cdiv(n, 64),)](a, b, out, lt, mixed, n, BLOCK=64)
    return a, b, out, lt, mixed


@pytest.mark.parametrize("n", [pytest.param(64, id="n64"), pytest.param(100, id="n100-masked")])
def test_bf16_arithmetic_matches_torch(n):
    """Within one bf16 rounding per op of torch (GPU may fuse a*b+a into one FMA)."""
    a, b, out, lt, mixed = _run_arith(n)
    expected = a * b + a - b  # torch rounds to bf16 after each op
    ab = a.float() * b.float()
    ulps = 2.0 ** -7 * (ab.abs() + (ab + a.float()).abs() + expected.float().abs())
    err = (out.float() - expected.float()).abs()
    assert bool((err <= ulps).all()), f"max excess {float((err - ulps).max())}"
    assert torch.equal(lt.bool(), a < b)
    torch.testing.assert_close(mixed, a.float() * b.float() + 1.0)


def test_bf16_rounding_is_round_to_nearest_even():
    a, b, out, _, _ = _run_arith(64)
    assert torch.equal(out, a * b + a - b)


_CONFIGS = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})]


@triton.autotune(configs=_CONFIGS, key=["n"])
@triton.jit
def _which_block_kernel(out_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + o, tl.full([BLOCK], BLOCK, tl.int32), mask=o < n)


def test_autotune_runs():
    n = 100
    out = torch.zeros(n, dtype=torch.int32, device=DEVICE)
    _which_block_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](out, n)
    used = set(out.tolist())
    assert len(used) == 1 and used <= {16, 64}
    if INTERPRET:
        assert used == {16}, "under the interpreter autotune must keep only the first config"


@triton.jit
def _scalar_mask_kernel(x_ptr, idx_ptr, y_ptr, n_rows,
                        N: tl.constexpr):  # row length
    i = tl.program_id(0)
    row = tl.load(idx_ptr + i).to(tl.int64)
    valid = (row >= 0) & (row < n_rows)           # a scalar int1 mask for [N] blocks
    o = tl.arange(0, N)
    b_x = tl.load(x_ptr + tl.where(valid, row, 0) * N + o, mask=valid, other=-1.0)
    tl.store(y_ptr + i * N + o, b_x)
    tl.store(x_ptr + tl.where(valid, row, 0) * N + o, b_x + 100.0, mask=valid)


def test_scalar_comparison_masks_a_block_load_and_store():
    x = torch.arange(12, dtype=torch.float32, device=DEVICE).reshape(3, 4)
    idx = torch.tensor([2, -1, 3, 0], dtype=torch.int32, device=DEVICE)
    y = torch.zeros(4, 4, device=DEVICE)
    before = x.clone()
    _scalar_mask_kernel[(4,)](x, idx, y, 3, N=4)
    assert torch.equal(y[0], before[2]) and torch.equal(y[3], before[0])
    assert bool((y[1] == -1.0).all()) and bool((y[2] == -1.0).all())  # masked off: other
    assert torch.equal(x[1], before[1])                                # no store
    assert torch.equal(x[[0, 2]], before[[0, 2]] + 100.0)


@pytest.mark.skipif(not INTERPRET, reason="the patches exist only under TRITON_INTERPRET=1")
def test_patches_installed_once():
    from triton.runtime import interpreter as interp

    assert interpret.INTERPRET and interpret.installed()
    builder = interp.InterpreterBuilder
    dot, splat, autotune = builder.create_dot, builder.create_splat, triton.autotune
    interpret.install()  # idempotent
    assert builder.create_dot is dot and builder.create_splat is splat
    assert triton.autotune is autotune


@pytest.mark.skipif(INTERPRET, reason="on the interpreter the patches are active")
def test_install_is_noop_on_gpu():
    assert not interpret.installed()
