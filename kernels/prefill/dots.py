"""Matrix products with an explicit precision, shared by the stage kernels.

Tensor cores multiply bf16 exactly (fp32 accumulation). An fp32 operand can
be split as ``x = hi + lo`` with ``hi = bf16(x)`` and ``lo = bf16(x - hi)``
(16 significant bits together), so:

* ``"bf16x2"``: each fp32 operand is split and the partial products summed
  (2 bf16 products when the other operand is bf16 -- keys, values, queries,
  the bf16-stored ``Tb`` are exact in bf16 -- and 3 when both are fp32,
  dropping ``lo * lo``). Close to fp32 accuracy at bf16 tensor-core speed and
  with half the registers of tf32 operands.
* ``"bf16"``: operands rounded to bf16, one product.
* ``"tf32"``, ``"tf32x3"``, ``"ieee"``: fp32 operands with that ``input_precision``.
"""
from __future__ import annotations

from .. import interpret

interpret.install()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["mm"]


@triton.jit
def _split(x):
    """``(hi, lo)`` bf16 with ``hi + lo`` = ``x`` to ~16 significant bits."""
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def mm(a, b, PREC: tl.constexpr, acc=None):
    """``acc + a @ b`` (fp32; ``acc`` None: zero) with precision ``PREC`` (see the module
    doc). ``"bf16x2"`` accumulates the partial products in order: ``acc``, then the
    ``hi`` product(s), then the ``lo`` one(s) (the Gluon phase C's split tail issues its
    ``wgmma`` in that order)."""
    if PREC == "bf16x2":
        if a.dtype == tl.bfloat16:
            if b.dtype == tl.bfloat16:
                return tl.dot(a, b, acc)
            else:
                b_hi, b_lo = _split(b)
                return tl.dot(a, b_lo, tl.dot(a, b_hi, acc))
        else:
            a_hi, a_lo = _split(a)
            if b.dtype == tl.bfloat16:
                return tl.dot(a_lo, b, tl.dot(a_hi, b, acc))
            else:
                b_hi, b_lo = _split(b)
                return tl.dot(a_lo, b_hi, tl.dot(a_hi, b_lo, tl.dot(a_hi, b_hi, acc)))
    elif PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PREC)
