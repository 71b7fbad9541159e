"""Work-arounds for running our Triton kernels on the CPU interpreter.

Active only when ``TRITON_INTERPRET=1`` was set before triton was imported;
on a GPU :func:`install` does nothing. Four interpreter bugs are patched:

1. bf16 ``tl.dot`` and bf16 elementwise arithmetic operate on the raw uint16
   bits (triton issue 11584). We convert bf16 operands to float32, compute,
   and round back to bf16 where the result type is bf16.
2. float32 -> bf16 conversion truncates (round toward zero); GPUs and torch
   round to nearest even. We wrap the conversion to round to nearest even.
3. ``@triton.autotune`` with more than one config fails ("0 active drivers").
   Under the interpreter ``triton.autotune`` keeps only the first config.
4. A comparison keeps its operands' type (its data is bool but typed e.g.
   int64), so splatting a scalar comparison to an int1 block (a scalar
   ``mask=`` of ``tl.load``/``tl.store``) fills an int64 array. Triton >= 3.9's
   native masked load/store reject it ("mask has unsupported dtype"; 3.7
   converted it). A splat to an int1 block is made bool.
"""
from __future__ import annotations

import os

__all__ = ["INTERPRET", "install", "installed"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_installed = False


def installed() -> bool:
    """Whether the patches are in place (only ever under the interpreter)."""
    return _installed


def install() -> None:
    """Patch the interpreter once; a no-op unless ``TRITON_INTERPRET=1``."""
    global _installed
    if not INTERPRET or _installed:
        return
    import numpy as np
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    orig_convert = interp._convert_float

    def convert_float(x, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16 and rounding_mode is None:
            u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
            bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(np.asarray(x, dtype=np.float32))
            bits = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), bits)
            return bits.view(np.uint16)
        return orig_convert(x, src, dst, rounding_mode)

    interp._convert_float = convert_float
    to_float = convert_float

    def _f32(h):
        if h.dtype.scalar == tl.bfloat16:
            return to_float(h.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return h.data

    orig_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            acc = np.matmul(_f32(a), _f32(b), dtype=np.float32)
            out = acc + _f32(d)
            if d.dtype.scalar == tl.bfloat16:
                out = to_float(out.astype(np.float32), tl.float32, tl.bfloat16, None).view(np.uint16)
            else:
                out = out.astype(d.data.dtype)
            return interp.TensorHandle(out, d.dtype.scalar)
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    orig_binary = builder.binary_op

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16:
            out = op(_f32(lhs), _f32(rhs))
            if out.dtype == np.bool_:
                return interp.TensorHandle(out, tl.int1)
            out = to_float(out.astype(np.float32), tl.float32, tl.bfloat16, None).view(np.uint16)
            return interp.TensorHandle(out, tl.bfloat16)
        return orig_binary(self, lhs, rhs, op)

    orig_splat = builder.create_splat

    def create_splat(self, ret_ty, arg):
        out = orig_splat(self, ret_ty, arg)
        if ret_ty.scalar == tl.int1 and out.data.dtype != np.bool_:
            return interp.TensorHandle(out.data.astype(np.bool_), tl.int1)
        return out

    builder.create_dot = create_dot
    builder.binary_op = binary_op
    builder.create_splat = create_splat
    for name in ("create_fadd", "create_fsub", "create_fmul", "create_fdiv"):
        op = {"create_fadd": np.add, "create_fsub": np.subtract, "create_fmul": np.multiply,
              "create_fdiv": np.divide}[name]
        setattr(builder, name, (lambda o: lambda self, l, r: self.binary_op(l, r, o))(op))

    orig_autotune = triton.autotune

    def first_config_autotune(configs, *args, **kwargs):
        return orig_autotune(list(configs)[:1], *args, **kwargs)

    triton.autotune = first_config_autotune
    _installed = True


install()
