"""Compile the fused walks for sm_90 on a machine without a GPU; print registers / spills /
shared memory (what decides programs per SM).

    pip install --no-deps --target /tmp/t36 triton==3.6.0      # the GPU host's triton
    PYTHONPATH=/tmp/t36:. python scripts/compile_walk_sm90.py [--kernel walk|walk_t] \\
        [--bv 64] [--warps 4] [--stages 2] [--loop-stages 2] [--pipe-skip q] [--ttgir out]

Triton compiles to PTX and cubin without a driver when given the target; ``cuobjdump``
(shipped with triton) reads the registers and stack (spill) bytes. Pointer arguments are
marked 16-byte aligned as on the GPU (without that the pipeliner makes different
choices). The contest shape (HQ=4, HV=8, K=V=128, T and N not specialised), the
``"tm"`` intermediates with inline outputs and an initial state. With triton 3.6 these
numbers matched the GPU's for every variant checked (docs/notes.md, prefill v9); 3.7
pipelines differently.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.prefill import state_walk, state_walk_t

PTRS = {"p": "*bf16", "k": "*bf16", "w": "*bf16", "u": "*bf16", "gc": "*fp32", "h0": "*fp32",
        "cu_seqlens": "*i64", "o": "*bf16", "ht": "*fp32", "q": "*bf16", "v": "*bf16",
        "tb": "*bf16", "aq": "*bf16"}
NONE = {"ob", "s0", "h", "v_new", "summ"}


def constexprs(kernel: str, BV: int, loop_stages, pipe_skip: str) -> dict:
    common = dict(H=8, G=2, K=128, V=128, BT=64, BV=BV, USE_H0=True, DOT_PREC="bf16",
                  OUT_PREC="bf16", LOOP_STAGES=loop_stages, PDL_WAIT=True)
    if kernel == "walk_t":
        return common
    return dict(common, SEG_T=0, FROM_S0=False, CHAIN=False, STORE_H=False, STORE_VNEW=False,
                FUSE_OUTPUT=True, SUMMARY=False, FROM_FIRST=False, WP_STACK=False,
                W_SPLIT=False, CHAIN_PREC="bf16", PDL_TRIGGER="", TM_FORM=True,
                ACC_FUSE=False, EARLY_LOADS=False, PIPE_SKIP=pipe_skip)


def compile_walk(kernel: str, BV: int, warps: int, stages: int, loop_stages, pipe_skip: str = ""):
    fn = state_walk_t.state_walk_t_kernel if kernel == "walk_t" else state_walk.state_walk_kernel
    names = fn.arg_names
    const = constexprs(kernel, BV, loop_stages, pipe_skip)
    sig, cx = {}, {}
    for i, n in enumerate(names):
        if n in PTRS:
            sig[n] = PTRS[n]
        elif n in NONE:
            sig[n], cx[(i,)] = "constexpr", None
        elif n == "scale":
            sig[n] = "fp32"
        elif n in ("T", "N"):
            sig[n] = "i32"
        elif n in const:
            sig[n], cx[(i,)] = "constexpr", const[n]
        else:   # a constexpr with a default
            continue
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in PTRS if n in names}
    return triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=stages, launch_pdl=True))


def resources(ck) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(ck.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                         text=True).stdout
    os.unlink(f.name)
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    return dict(regs=int(m.group(1)) if m else None, stack_bytes=int(m.group(2)) if m else None,
                shared_bytes=ck.metadata.shared)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=("walk", "walk_t"), default="walk_t")
    ap.add_argument("--bv", type=int, default=128)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--loop-stages", type=int, default=2, help="0: the launch's stages")
    ap.add_argument("--pipe-skip", default="", choices=("", "q", "aq"))
    ap.add_argument("--ttgir", help="write the TTGIR here")
    a = ap.parse_args()
    ck = compile_walk(a.kernel, a.bv, a.warps, a.stages, a.loop_stages or None, a.pipe_skip)
    r = resources(ck)
    per_sm = min(65536 // (r["regs"] * 32 * a.warps), 233472 // max(r["shared_bytes"], 1))
    print(f"triton {triton.__version__} {a.kernel} BV={a.bv} warps={a.warps} "
          f"stages={a.stages} loop_stages={a.loop_stages} pipe_skip={a.pipe_skip!r}: "
          f"{r['regs']} registers, {r['stack_bytes']} B stack, {r['shared_bytes']} B shared "
          f"-> {per_sm} program(s) per SM")
    if a.ttgir:
        with open(a.ttgir, "w") as f:
            f.write(ck.asm["ttgir"])


if __name__ == "__main__":
    main()
