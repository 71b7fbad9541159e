"""Any flashinfer-bench solution as an implementation in our calling convention.

:func:`load_solution` takes a solution JSON or starter-kit folder (read by
:func:`.formats.read_solution`, or already read: a :class:`.formats.SolutionSource`), or
``module:function`` (a Python callable already importable, with the definition's argument
names; its op from ``op=`` or from whether it takes ``cu_seqlens``), and returns a
:class:`.adapter.SolutionImpl`, called like ours::

    fn(q, k, v, state, A_log, a, dt_bias, b, [cu_seqlens,] scale=None) -> (output, new_state)

The roles, one module each: reading the formats (:mod:`.formats`), building by language and
binding (:mod:`.build`), keeping torch's settings and the solution's modules to the solution
(:mod:`.scope`), adapting the arguments (:mod:`.adapter`), the worker process the notebooks
run each solution in (:mod:`.remote`).

``scoped=True`` (the default): after loading, neither the solution's modules nor its changes
to torch's global settings remain in this process (:mod:`.scope`). ``scoped=False`` (the
solution worker, whose process belongs to the solution) leaves everything in place, as
flashinfer-bench does.

Off CUDA the solution's worker first calls :func:`cpu_shims`: solutions written for the GPU
mark NVTX ranges, synchronize and ask for the current stream, calls that mean nothing on
the CPU interpreter but raise there ("Torch not compiled with CUDA enabled"); the shims make
them no-ops, so such a solution is gated on a CPU machine as it is on a GPU.
"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import List, Optional

from .adapter import SolutionImpl, signature_dps, solution_frame
from .build import build, cache_dir
from .formats import (CUDA_LANGUAGES, SOLUTION_PREFIX, SolutionError, SolutionSource,
                      read_solution)

__all__ = ["load_solution", "cpu_shims", "CPU_SHIMS"]

_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


#: What :func:`cpu_shims` replaces, in the order it reports them.
CPU_SHIMS = ("torch.cuda.nvtx", "torch.cuda.synchronize", "torch.cuda.current_stream")


class _NoNVTX:
    """NVTX's C functions as no-ops (a CPU build of torch has a stub that raises)."""

    @staticmethod
    def rangePushA(msg):
        return 0

    @staticmethod
    def rangePop():
        return 0

    @staticmethod
    def rangeStartA(msg):
        return 0

    @staticmethod
    def rangeEndA(range_id):
        return None

    @staticmethod
    def markA(msg):
        return None


class _HostStream:
    """What ``torch.cuda.current_stream()`` returns off CUDA: the attributes and methods
    solutions use on a stream (its handle 0, the default stream's; synchronizing is a
    no-op: the CPU has finished when a call returns)."""

    cuda_stream = 0
    device_index = None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait_stream(self, stream) -> None:
        return None

    def __repr__(self) -> str:
        return "<host stand-in for torch.cuda.current_stream() (no CUDA)>"


def _nvtx_works(nvtx) -> bool:
    try:
        nvtx.range_push("gdn-probe")
        nvtx.range_pop()
    except RuntimeError:
        return False
    return True


def cpu_shims() -> List[str]:
    """Where torch has no CUDA device, make the CUDA-only conveniences solutions use
    harmless, in this process: NVTX ranges and marks (``torch.cuda.nvtx.range`` as decorator
    or context manager, ``range_push``/``range_pop``, ``mark``; replaced only where NVTX
    itself fails, as in a CPU build of torch) do nothing, ``torch.cuda.synchronize()``
    returns at once, ``torch.cuda.current_stream()`` is a :class:`_HostStream`. Returns the
    names of :data:`CPU_SHIMS` replaced now or by an earlier call (empty with CUDA).

    Only the solution's worker calls it (its process belongs to the solution): a notebook's
    process keeps torch as it is, so our own code cannot come to rely on the shims.
    """
    import torch
    import torch.cuda.nvtx as nvtx

    if torch.cuda.is_available():
        return []
    done = []
    if isinstance(nvtx._nvtx, _NoNVTX) or not _nvtx_works(nvtx):
        nvtx._nvtx = _NoNVTX()
        done.append("torch.cuda.nvtx")
    if getattr(torch.cuda.synchronize, "_gdn_shim", False) is False:
        def synchronize(device=None) -> None:
            return None

        synchronize._gdn_shim = True
        torch.cuda.synchronize = synchronize
    if getattr(torch.cuda.current_stream, "_gdn_shim", False) is False:
        def current_stream(device=None) -> _HostStream:
            return _HostStream()

        current_stream._gdn_shim = True
        torch.cuda.current_stream = current_stream
    return done + ["torch.cuda.synchronize", "torch.cuda.current_stream"]


def _load_callable(spec: str, op: Optional[str]) -> SolutionImpl:
    mod_name, fn_name = spec.split(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise SolutionError(f"{spec}: cannot import: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise SolutionError(f"{spec}: {fn_name} is not callable")
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    op = op or ("prefill" if "cu_seqlens" in names else "decode")
    src = SolutionSource(spec, spec, "", "", op, "python", "", fn_name, None, None, {},
                         fields=dict(dps="destination_passing_style"))
    return SolutionImpl(fn, name=spec, language="python", definition=None, op=op,
                        dps=signature_dps(fn, src), graph_capturable=True, origin=spec)


def load_solution(path, op: Optional[str] = None, *, scoped: bool = True) -> SolutionImpl:
    """A solution JSON, starter-kit folder, :class:`SolutionSource` or ``module:function``
    (``solution:`` prefix allowed) as a :class:`SolutionImpl` in our calling convention.

    ``op``: refuse a definition of the other op. ``scoped``: see the module docstring.
    Raises :class:`SolutionError` naming the file and field (malformed JSON/folder, wrong
    definition, missing entry point, build failure); ``RuntimeError`` when this host cannot
    build it (no GPU, no tvm-ffi).
    """
    if isinstance(path, SolutionSource):
        src = path
        if op is not None and src.op != op:
            raise src.err(f"{src.definition!r} is a {src.op} definition; a {op} "
                          "implementation is needed here", "definition")
    else:
        text = str(path)
        if text.startswith(SOLUTION_PREFIX):
            text = text[len(SOLUTION_PREFIX):]
        if not Path(text).expanduser().exists() and _CALLABLE_RE.match(text):
            return _load_callable(text, op)
        src = read_solution(text, op)
    try:
        built = build(src, scoped)
    except SolutionError as e:
        # an import that failed inside the solution's code: say where
        cause = e.__cause__
        where = None if cause is None else solution_frame(
            cause.__traceback__, Path(src.root or cache_dir()).resolve(),
            Path(src.origin).resolve().parent if src.root else None)
        if where is None:
            raise
        if not src.root:   # a JSON's sources: drop the cache's src-<hash>/ folder
            where = where.split("/", 1)[-1]
        raise SolutionError(f"{e} (at {where})") from cause
    dps = src.dps if src.dps is not None else signature_dps(built.fn, src)
    return SolutionImpl(built.fn, name=src.name, language=src.language,
                        definition=src.definition, op=src.op, dps=dps,
                        graph_capturable=src.graph_capturable, origin=src.origin,
                        binding=src.binding if src.language in CUDA_LANGUAGES else None,
                        build_s=built.build_s, cached=built.cached, scope=built.scope)
