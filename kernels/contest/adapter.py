"""A built solution as an implementation in our calling convention: argument adaptation.

The contest's GDN definitions (:mod:`.definitions`) use our names, dtypes and k-last state
layout, in our order, so inputs pass through by position; ``scale`` None or 0 becomes
``1/sqrt(D)`` (a float, as the contest passes it); a ``state`` of None (zero initial state,
allowed by our prefill) becomes a zero tensor. Destination-passing style (the solution says
so, or the entry's signature decides: inputs + 2 parameters, or a parameter named
``output``): the wrapper allocates ``output``/``new_state`` from the definition's output
shapes and dtypes and passes them last. Inputs are checked against the definition's shapes
and dtypes (a ``ValueError`` naming the argument) before the solution runs.

An entry with a ``device`` parameter defaulting to CUDA (``device="cuda"``: written for the
GPU) is handed the inputs' device when the inputs are elsewhere (the CPU interpreter), so it
allocates where its inputs live. An exception raised inside the solution's own code comes
back as a :class:`SolutionCallError` naming the file and line of the innermost frame in the
solution's folder (and the original exception as its cause): the row's reason then says
where to look.
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Callable, Dict, Optional

from .formats import DEF_RE, SolutionSource
from .scope import Scope

__all__ = ["SolutionImpl", "SolutionCallError", "signature_dps", "definition_io",
           "solution_frame"]


class SolutionCallError(RuntimeError):
    """An exception raised inside a solution's code: ``where`` (``file:line in function``,
    the innermost frame in the solution's folder) before the original type and message."""

    def __init__(self, where: str, error: BaseException):
        super().__init__(f"{where}: {type(error).__name__}: {error}")
        self.where = where


def _entry_folder(entry: Callable) -> Optional[Path]:
    """The folder of the file defining ``entry`` (decorators unwrapped); None for compiled
    entries (a CUDA solution's), which have no Python frames to point at."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(entry))
    except (TypeError, ValueError):
        return None
    return Path(path).resolve().parent if path else None


def solution_frame(tb, folder: Path, shown_from: Optional[Path] = None) -> Optional[str]:
    """``"file:line in function"`` of the innermost frame of traceback ``tb`` whose file lies
    in ``folder``, the file relative to ``shown_from`` (default ``folder``) where it lies
    there; None when no frame does."""
    hit = None
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename)
        if path.is_absolute() and path.resolve().is_relative_to(folder):
            hit = (path.resolve(), tb.tb_lineno, tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    if hit is None:
        return None
    path, line, func = hit
    base = shown_from if shown_from is not None and path.is_relative_to(shown_from) else folder
    return f"{path.relative_to(base)}:{line} in {func}"


@functools.lru_cache(maxsize=16)
def _definition(op: str, hq: int, hv: int, d: int) -> dict:
    from ..spec import GDNShape
    from .definitions import definition

    return definition(op, GDNShape(hq, hv, d))


def definition_io(op: str):
    """``(inputs, outputs)``: how many of each ``op``'s definition has."""
    d = _definition(op, 4, 8, 128)
    return len(d["inputs"]), len(d["outputs"])


class SolutionImpl:
    """A loaded solution, called in our convention (see the module docstring).

    Attributes: ``name``, ``language``, ``definition`` (its name), ``op``, ``dps``
    (destination-passing), ``graph_capturable``, ``binding`` (CUDA), ``build_s`` and
    ``cached`` (CUDA builds), ``origin`` (file, folder or ``module:function``).
    """

    def __init__(self, entry: Callable, *, name: str, language: str, definition: Optional[str],
                 op: str, dps: bool, graph_capturable: bool, origin: str,
                 binding: Optional[str] = None, build_s: Optional[float] = None,
                 cached: Optional[bool] = None, scope: Optional[Scope] = None):
        self.entry = entry
        self.name, self.language, self.definition, self.op = name, language, definition, op
        self.dps, self.graph_capturable, self.origin = dps, graph_capturable, origin
        self.binding, self.build_s, self.cached = binding, build_s, cached
        self._scope = scope
        m = DEF_RE.match(definition or "")
        self._shape = tuple(int(x) for x in m.groups()[1:]) if m else None
        self._names = list(_definition(op, 4, 8, 128)["inputs"])
        self._folder = _entry_folder(entry)
        origin_dir = Path(origin).expanduser().resolve()
        # where the solution's files are named from: a starter kit's folder (its origin is
        # config.toml), else the entry's own folder (a JSON's sources, unpacked)
        self._shown_from = origin_dir.parent if origin_dir.is_file() else None
        self.device_param = _cuda_device_param(entry)
        self.__name__ = name

    def __repr__(self) -> str:
        return (f"SolutionImpl({self.name!r}, {self.language}"
                f"{'/' + self.binding if self.binding else ''}, {self.definition}, "
                f"dps={self.dps})")

    def _bind(self, args, kwargs) -> Dict[str, object]:
        if len(args) > len(self._names):
            raise TypeError(f"{self.name}: takes at most {len(self._names)} arguments "
                            f"({', '.join(self._names)}), got {len(args)}")
        vals = dict(zip(self._names, args))
        for k, v in kwargs.items():
            if k not in self._names:
                raise TypeError(f"{self.name}: unexpected argument {k!r} "
                                f"(takes {', '.join(self._names)})")
            if k in vals:
                raise TypeError(f"{self.name}: argument {k!r} given twice")
            vals[k] = v
        vals.setdefault("scale", None)
        missing = [n for n in self._names if n not in vals]
        if missing:
            raise TypeError(f"{self.name}: missing argument(s) {', '.join(missing)}")
        return vals

    def _prepare(self, vals: Dict[str, object]):
        """Inputs in the definition's order (checked) and the outputs to write."""
        import torch

        from ..spec import resolve_scale

        q, v = vals["q"], vals["v"]
        if not (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor)):
            raise TypeError(f"{self.name}: q and v must be tensors")
        shape = self._shape or (q.shape[-2], v.shape[-2], q.shape[-1])
        defn = _definition(self.op, *shape)
        if vals.get("state") is None:
            n = (vals["cu_seqlens"].numel() - 1) if self.op == "prefill" else q.shape[0]
            vals["state"] = torch.zeros(n, shape[1], shape[2], shape[2], dtype=torch.float32,
                                        device=q.device)
        vals["scale"] = resolve_scale(vals["scale"], shape[2])
        axes = {n: a["value"] for n, a in defn["axes"].items() if a["type"] == "const"}
        for name, spec in defn["inputs"].items():
            x = vals[name]
            if spec["shape"] is None:
                continue
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{self.name}: argument {name!r} must be a tensor, got "
                                f"{type(x).__name__}")
            want = getattr(torch, spec["dtype"])
            if x.dtype != want:
                raise ValueError(f"{self.name}: argument {name!r} must be {spec['dtype']} "
                                 f"({self.definition or defn['name']}), got {x.dtype}")
            if x.dim() != len(spec["shape"]):
                raise ValueError(f"{self.name}: argument {name!r} must have shape "
                                 f"{spec['shape']}, got {tuple(x.shape)}")
            for sym, n in zip(spec["shape"], x.shape):
                if axes.setdefault(sym, int(n)) != int(n):
                    raise ValueError(f"{self.name}: argument {name!r} has {sym} = {n}, but "
                                     f"{axes[sym]} from the definition or an earlier argument "
                                     f"({defn['name']})")
        args = [vals[n] for n in self._names]
        outs = []
        if self.dps:
            for name, spec in defn["outputs"].items():
                outs.append(torch.empty(tuple(axes[s] for s in spec["shape"]),
                                        dtype=getattr(torch, spec["dtype"]), device=q.device))
        return args, outs

    def _call_entry(self, inputs, outs):
        extra = {}
        if self.device_param and inputs[0].device.type != "cuda":
            extra[self.device_param] = inputs[0].device
        try:
            return self.entry(*inputs, *outs, **extra)
        except Exception as e:
            if self._folder is None:
                raise
            where = solution_frame(e.__traceback__, self._folder, self._shown_from)
            if where is None:
                where = self._entry_line() + " (raised by a wrapper of the entry)"
            raise SolutionCallError(where, e) from e

    def _entry_line(self) -> str:
        """``file:line in name`` of the entry's definition (a decorator's line included)."""
        fn = inspect.unwrap(self.entry)
        path = Path(inspect.getsourcefile(fn)).resolve()
        base = (self._shown_from if self._shown_from is not None
                and path.is_relative_to(self._shown_from) else self._folder)
        return f"{path.relative_to(base)}:{fn.__code__.co_firstlineno} in {fn.__name__}"

    def __call__(self, *args, **kwargs):
        inputs, outs = self._prepare(self._bind(args, kwargs))
        if self._scope is not None:
            with self._scope:
                res = self._call_entry(inputs, outs)
        else:
            res = self._call_entry(inputs, outs)
        if self.dps:
            return tuple(outs)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise TypeError(f"{self.name}: a value-returning solution must return (output, "
                            f"new_state), got {type(res).__name__}"
                            + (f" of {len(res)}" if isinstance(res, (tuple, list)) else ""))
        return tuple(res)


def _cuda_device_param(entry: Callable) -> Optional[str]:
    """``"device"`` when the entry takes a ``device`` parameter by keyword whose default
    names CUDA (``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``); else None."""
    try:
        p = inspect.signature(entry).parameters.get("device")
    except (TypeError, ValueError):
        return None
    if p is None or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
        return None
    return "device" if str(p.default).startswith("cuda") else None


def signature_dps(fn, src: SolutionSource) -> bool:
    """Destination-passing when the entry names an ``output`` parameter or requires the
    inputs and the outputs; value-returning when it takes exactly the inputs (what decides
    when the solution does not say)."""
    n_in, n_out = definition_io(src.op)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True   # not introspectable (compiled): flashinfer-bench's default
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in pos if p.default is p.empty]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        raise src.err(f"{src.entry_symbol} takes *args: say destination_passing_style "
                      "explicitly", "dps")
    if any(p.name == "output" for p in pos) or len(required) >= n_in + n_out:
        return True
    if len(required) <= n_in <= len(pos):
        return False
    raise src.err(f"not given, and {src.entry_symbol}{inspect.signature(fn)} takes neither "
                  f"the definition's {n_in} inputs nor {n_in} inputs + {n_out} outputs", "dps")
