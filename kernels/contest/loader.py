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
"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Optional

from .adapter import SolutionImpl, signature_dps
from .build import build
from .formats import (CUDA_LANGUAGES, SOLUTION_PREFIX, SolutionError, SolutionSource,
                      read_solution)

__all__ = ["load_solution"]

_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


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
    built = build(src, scoped)
    dps = src.dps if src.dps is not None else signature_dps(built.fn, src)
    return SolutionImpl(built.fn, name=src.name, language=src.language,
                        definition=src.definition, op=src.op, dps=dps,
                        graph_capturable=src.graph_capturable, origin=src.origin,
                        binding=src.binding if src.language in CUDA_LANGUAGES else None,
                        build_s=built.build_s, cached=built.cached, scope=built.scope)
