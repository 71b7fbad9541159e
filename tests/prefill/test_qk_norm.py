"""The one-launch L2 norm of q and k (kernels/prefill/qk_norm.py) on the GPU where there
is one, else on the CPU (Triton interpreter): FLA's formula exactly, torch.nn.functional.normalize's result up to bf16
rounding, zero rows and ragged row counts, bad inputs named."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.prefill.qk_norm import EPS, qk_l2norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # as tests/decode/test_decode.py


def _fla_l2norm(x, eps=EPS):
    xf = x.float()
    return (xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("shape", [(1, 37, 2, 16), (3, 5, 4, 32), (70, 3, 64)])
def test_matches_fla_and_torch_normalize(shape):
    """Both outputs equal FLA's l2norm (f32 inside, one bf16 rounding) to the last bit but
    one, and torch's normalize to bf16 rounding; unit row norms; inputs untouched."""
    gen = torch.Generator().manual_seed(len(shape))
    q = (torch.randn(*shape, generator=gen) * 3).bfloat16().to(DEVICE)
    k = torch.randn(*shape, generator=gen).bfloat16().to(DEVICE)
    q0, k0 = q.clone(), k.clone()
    qn, kn = qk_l2norm(q, k)
    assert qn.dtype == kn.dtype == torch.bfloat16 and qn.shape == kn.shape == q.shape
    for x, y in ((q, qn), (k, kn)):
        torch.testing.assert_close(y.float(), _fla_l2norm(x).float(), atol=0, rtol=2 ** -7)
        torch.testing.assert_close(y.float(), F.normalize(x.float(), dim=-1),
                                   atol=4e-3, rtol=8e-3)
        norms = y.float().norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_zero_rows_stay_zero_and_eps_is_inside_the_root():
    """A zero row gives zeros (as FLA and normalize do); a tiny row is divided by
    sqrt(sum + eps), not by its own norm (FLA's semantics, not normalize's)."""
    q = torch.zeros(4, 16, dtype=torch.bfloat16, device=DEVICE)
    k = torch.zeros(4, 16, dtype=torch.bfloat16, device=DEVICE)
    q[1] = 1.0
    k[2] = 1e-4
    qn, kn = qk_l2norm(q, k)
    assert not qn[0].any() and not kn[0].any()
    torch.testing.assert_close(qn[1].float(), torch.full((16,), 0.25, device=DEVICE))
    expected = 1e-4 / (16 * 1e-8 + EPS) ** 0.5
    torch.testing.assert_close(kn[2].float(), torch.full((16,), expected, device=DEVICE), rtol=1e-2, atol=0)


def test_empty_and_bad_inputs():
    e = torch.empty(0, 2, 16, dtype=torch.bfloat16)
    qn, kn = qk_l2norm(e, e)
    assert qn.shape == e.shape and kn.shape == e.shape
    x = torch.ones(4, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="same shape"):
        qk_l2norm(x, x[:2])
    with pytest.raises(ValueError, match="k must be contiguous"):
        qk_l2norm(x[:, :8].contiguous(), torch.ones(8, 4, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="power of two"):
        qk_l2norm(x[:, :12].contiguous(), x[:, :12].contiguous())
