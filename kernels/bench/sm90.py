"""Registers, spills and shared memory of the Triton kernels one call launches, compiled for sm_90.

``record_launches(fn)`` runs ``fn()`` once (on a GPU or on the Triton interpreter) and
records every Triton launch: the kernel, its grid, each argument's type (tensor dtype and
16-byte alignment, int, float, None), its constexprs and launch options (``num_warps``,
``num_stages``, ``maxnreg``, ``launch_pdl``). The fused pipeline's direct launches
(:mod:`kernels.launch`) are switched off for that call so every launch goes through
Triton's ``run``.

``compile_resources(launches)`` compiles each distinct launch for ``GPUTarget("cuda", 90,
32)`` in a subprocess (``python -m kernels.bench.sm90``; no GPU and no driver needed, the
interpreter switched off there) and reads the cubin with the ``cuobjdump`` Triton ships:
``regs`` per thread, ``stack`` bytes (register spills live there), ``shared`` bytes, and the
``programs_per_sm`` an H100/H200 SM fits (65,536 registers, 228 KB shared memory, 2,048
threads, 32 programs). Pointer arguments are marked 16-byte aligned when they were, as on
the GPU (the pipeliner decides differently without it); ints are not specialised. A Gluon
kernel (the sm_90 phase C) compiles the same way, its TMA descriptors typed as Triton
specialises them, its ``num_warps`` counting the worker partitions' warps.
Resources match the GPU's for the same triton version (triton 3.6 on the GPU host; the CPU
venv has 3.7, which pipelines some loops differently: ``docs/notes/prefill.md``, prefill v9).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, List

import pandas as pd

__all__ = ["record_launches", "compile_resources", "programs_per_sm", "SM90_LIMITS",
           "RESOURCE_COLUMNS"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl", "num_ctas")
#: Per-SM limits of compute capability 9.0 (H100, H200).
SM90_LIMITS = dict(regs=65536, shared=233472, threads=2048, programs=32, shared_per_program=1024)
RESOURCE_COLUMNS = ["kernel", "grid", "num_warps", "num_stages", "maxnreg", "regs", "stack",
                    "shared", "programs_per_sm", "programs", "waves", "error"]
_DTYPES = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float16": "fp16",
           "torch.int64": "i64", "torch.int32": "i32", "torch.int8": "i8", "torch.uint8": "u8",
           "torch.bool": "i1"}


def _describe(x):
    import torch

    if x is None:
        return {"t": "none"}
    if isinstance(x, torch.Tensor):
        return {"t": "tensor", "dtype": _DTYPES.get(str(x.dtype), str(x.dtype)),
                "aligned": x.data_ptr() % 16 == 0}
    if isinstance(x, bool):
        return {"t": "bool", "v": x}
    if isinstance(x, int):
        return {"t": "int", "v": x}
    if isinstance(x, float):
        return {"t": "float", "v": x}
    if isinstance(x, str):
        return {"t": "str", "v": x}
    if hasattr(x, "block_shape") and hasattr(x, "layout"):   # a Gluon TMA descriptor
        from triton.runtime.jit import mangle_type

        return {"t": "sig", "v": mangle_type(x)}   # the type Triton specialises it as
    return {"t": "other", "v": type(x).__name__}


@contextlib.contextmanager
def _env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None) if old is None else os.environ.__setitem__(name, old)


def record_launches(fn: Callable[[], object]) -> List[dict]:
    """The Triton launches of one call of ``fn()`` (see the module docstring), in order:
    ``{"module", "name", "grid", "args": {param: descriptor}, "options"}``."""
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - every triton we support has it
        pass
    seen: List[dict] = []
    originals = {cls: cls.run for cls in classes}

    def make(orig):
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup:
                py = getattr(self, "fn", None)
                names = list(getattr(self, "arg_names", []))
                desc = {n: _describe(a) for n, a in zip(names, args)}
                desc.update({k: _describe(v) for k, v in kwargs.items() if k not in _OPTIONS})
                g = grid if not callable(grid) else "callable"
                seen.append(dict(module=getattr(py, "__module__", "?"),
                                 name=getattr(py, "__name__", "?"),
                                 grid=list(g) if isinstance(g, (tuple, list)) else g,
                                 args=desc,
                                 options={k: kwargs[k] for k in _OPTIONS if k in kwargs}))
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        return run

    try:
        for cls, orig in originals.items():
            cls.run = make(orig)
        with _env("GDN_FAST_LAUNCH", "0"):
            fn()
    finally:
        for cls, orig in originals.items():
            cls.run = orig
    return seen


def programs_per_sm(regs: int, shared: int, num_warps: int, limits: dict = SM90_LIMITS) -> int:
    """Programs of ``num_warps`` warps an SM holds at ``regs`` registers per thread (allocated
    per warp in units of 256) and ``shared`` bytes of shared memory."""
    threads = 32 * num_warps
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = limits["regs"] // (per_warp * num_warps)
    by_shared = limits["shared"] // (shared + limits["shared_per_program"])
    return int(max(0, min(by_regs, by_shared, limits["threads"] // threads, limits["programs"])))


def _constexprs(launch: dict) -> set:
    """Names of the launched kernel's ``tl.constexpr`` parameters (from its signature, so the
    same under the interpreter and on a GPU)."""
    import importlib
    import inspect

    f = getattr(importlib.import_module(launch["module"]), launch["name"], None)
    f = getattr(f, "fn", f)
    try:
        params = inspect.signature(f).parameters
    except (TypeError, ValueError):
        return set()
    return {n for n, p in params.items() if "constexpr" in str(p.annotation)}


def _key(launch: dict) -> str:
    """What the compiled kernel depends on: a constexpr's value, a runtime int's width (not
    its value: ints are not specialised), a float's type, each tensor's dtype and alignment."""
    const = _constexprs(launch)

    def arg(name, d):
        if name in const or d["t"] not in ("int", "float"):
            return d
        if d["t"] == "int":
            return {"t": "int", "w": 32 if -2 ** 31 <= d["v"] < 2 ** 31 else 64}
        return {"t": "float"}

    args = {n: arg(n, d) for n, d in launch["args"].items()}
    return json.dumps([launch["module"], launch["name"], args, launch["options"]], sort_keys=True)


def compile_resources(launches: List[dict], timeout: float = 900.0, n_sm: int = 132
                      ) -> pd.DataFrame:
    """Compile each distinct launch of ``launches`` for sm_90 (subprocess) and return one row
    per launch (:data:`RESOURCE_COLUMNS`; ``programs`` is the grid's size, ``waves`` =
    programs / (programs per SM x ``n_sm``)). A launch that fails to compile gets ``error``."""
    distinct, order = {}, []
    for ln in launches:
        k = _key(ln)
        if k not in distinct:
            distinct[k] = ln
        order.append(k)
    keys = list(distinct)
    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "launches.json"
        spec.write_text(json.dumps([distinct[k] for k in keys]))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([str(_REPO_ROOT)] + (
            [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        proc = subprocess.run([sys.executable, "-m", "kernels.bench.sm90", str(spec)],
                              capture_output=True, text=True, env=env, cwd=str(_REPO_ROOT),
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"sm_90 compile failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-1500:]}")
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    by_key = dict(zip(keys, results))
    rows = []
    for ln, k in zip(launches, order):
        r = by_key[k]
        grid = ln["grid"] if isinstance(ln["grid"], list) else []
        programs = 1
        for g in grid:
            programs *= int(g)
        warps = int(r.get("num_warps") or ln["options"].get("num_warps", 4))
        per_sm = (programs_per_sm(r["regs"], r["shared"], warps)
                  if r.get("regs") is not None else None)
        rows.append(dict(kernel=ln["name"], grid="x".join(map(str, grid)), num_warps=warps,
                         num_stages=ln["options"].get("num_stages"),
                         maxnreg=ln["options"].get("maxnreg"), regs=r.get("regs"),
                         stack=r.get("stack"), shared=r.get("shared"), programs_per_sm=per_sm,
                         programs=programs if grid else None,
                         waves=(programs / (per_sm * n_sm)) if per_sm and grid else None,
                         error=r.get("error", "")))
    return pd.DataFrame(rows, columns=RESOURCE_COLUMNS)


# --------------------------------------------------------------------------- subprocess side


def _compile_one(ln: dict, cuobjdump: str) -> dict:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jf = getattr(importlib.import_module(ln["module"]), ln["name"])
    if jf.is_gluon():   # the sm_90 phase C (kernels.prefill.state_walk_gluon)
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    sig, cx, attrs = {}, {}, {}
    for i, p in enumerate(jf.params):
        d = ln["args"].get(p.name)
        if p.is_constexpr:
            if d is None:
                if not p.has_default:
                    raise ValueError(f"constexpr {p.name} not given")
                val = p.default
            else:
                val = None if d["t"] == "none" else d.get("v")
            sig[p.name], cx[(i,)] = "constexpr", val
        elif d is None or d["t"] == "none":
            sig[p.name], cx[(i,)] = "constexpr", None
        elif d["t"] == "tensor":
            sig[p.name] = "*" + d["dtype"]
            if d["aligned"]:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif d["t"] == "bool":
            sig[p.name] = "i1"
        elif d["t"] == "int":
            sig[p.name] = "i32" if -2 ** 31 <= d["v"] < 2 ** 31 else "i64"
        elif d["t"] == "float":
            sig[p.name] = "fp32"
        elif d["t"] == "sig":
            sig[p.name] = d["v"]
        else:
            raise ValueError(f"argument {p.name}: cannot type a {d['t']} ({d.get('v')})")
    opts = {k: v for k, v in ln["options"].items() if v is not None}
    ck = triton.compile(ASTSource(jf, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                        options=opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(ck.asm["cubin"])
    try:
        out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, timeout=120).stdout
    finally:
        os.unlink(f.name)
    m = re.search(r"REG:(\d+)", out)
    s = re.search(r"STACK:(\d+)", out)
    # num_warps: a Gluon kernel's counts its worker partitions' warps too
    return dict(regs=int(m.group(1)) if m else None, stack=int(s.group(1)) if s else None,
                shared=int(ck.metadata.shared), num_warps=int(ck.metadata.num_warps))


def main(argv=None) -> int:
    import triton

    argv = sys.argv[1:] if argv is None else argv
    launches = json.loads(Path(argv[0]).read_text())
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    res = []
    for ln in launches:
        try:
            res.append(_compile_one(ln, tool))
        except Exception as e:  # reported per launch
            res.append(dict(regs=None, stack=None, shared=None,
                            error=f"{type(e).__name__}: {e}"[:300]))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
