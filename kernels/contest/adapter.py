"""A built solution as an implementation in our calling convention: argument adaptation.

The contest's GDN definitions (:mod:`.definitions`) use our names, dtypes and k-last state
layout, in our order, so inputs pass through by position; ``scale`` None or 0 becomes
``1/sqrt(D)`` (a float, as the contest passes it); a ``state`` of None (zero initial state,
allowed by our prefill) becomes a zero tensor. Destination-passing style (the solution says
so, or the entry's signature decides: inputs + 2 parameters, or a parameter named
``output``): the wrapper allocates ``output``/``new_state`` from the definition's output
shapes and dtypes and passes them last. Inputs are checked against the definition's shapes
and dtypes (a ``ValueError`` naming the argument) before the solution runs.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Dict, Optional

from .formats import DEF_RE, SolutionSource
from .scope import Scope

__all__ = ["SolutionImpl", "signature_dps", "definition_io"]


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

    def __call__(self, *args, **kwargs):
        inputs, outs = self._prepare(self._bind(args, kwargs))
        if self._scope is not None:
            with self._scope:
                res = self.entry(*inputs, *outs)
        else:
            res = self.entry(*inputs, *outs)
        if self.dps:
            return tuple(outs)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise TypeError(f"{self.name}: a value-returning solution must return (output, "
                            f"new_state), got {type(res).__name__}"
                            + (f" of {len(res)}" if isinstance(res, (tuple, list)) else ""))
        return tuple(res)


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
