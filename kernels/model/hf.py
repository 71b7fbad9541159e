"""Our kernels inside a transformers model: ``kernels.model.use_ours(model)``.

transformers' Qwen3-Next (and every model built the same way) calls two module-level
functions from its Gated DeltaNet layer's ``forward``: ``torch_chunk_gated_delta_rule``
(prefill) and ``torch_recurrent_gated_delta_rule`` (one cached token). Each is decorated
with ``use_kernel_func_from_hub_with_fallback(name, "fla")``, which binds, once at import,
FLA's function of that name if FLA is installed, else the torch reference; with the
``kernels`` hub package a third source can be mapped in by ``kernelize``. That package
cannot be used here: it is imported as ``kernels``, the name of this suite. So
:func:`use_ours` does what the decorator does, later: it rebinds those two names in the
module that defines the model's GDN layer class to our FLA-signature functions
(:mod:`.fla_compat`), wrapped like transformers wraps FLA's (keyword arguments the
function does not take are dropped). transformers' files are not changed.

:func:`use` binds FLA's functions, FlashQLA's prefill or the layer's own torch path the
same way (notebook 06 compares them). The names are module globals, so the switch holds for every model of that class in the
process until :meth:`Swap.undo` (also a context manager: ``with use_ours(model): ...``).
"""
from __future__ import annotations

import functools
import inspect
import sys

from .fla_compat import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

__all__ = ["use_ours", "use", "IMPLS", "Swap", "TARGETS", "gdn_layers", "peer_function"]

#: The module-level names the GDN layer's ``forward`` calls, and our function for each.
TARGETS = {
    "torch_chunk_gated_delta_rule": chunk_gated_delta_rule,
    "torch_recurrent_gated_delta_rule": fused_recurrent_gated_delta_rule,
}


def gdn_layers(model) -> list:
    """The model's Gated DeltaNet layers (modules whose class name ends in
    ``GatedDeltaNet``)."""
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


def _wrapped(fn, name):
    """``fn`` called as transformers calls the function it replaces: keyword arguments
    ``fn`` does not name (the model's extra ``**kwargs``) are dropped."""
    params = tuple(p for p, v in inspect.signature(fn).parameters.items()
                   if v.kind is not inspect.Parameter.VAR_KEYWORD)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **{k: v for k, v in kwargs.items() if k in params})

    call.__name__ = name
    return call


class Swap:
    """The rebinding :func:`use_ours` made: ``modules`` (the patched modules' names),
    ``undo()`` restores what was bound before; a context manager that undoes on exit."""

    def __init__(self, saved: dict):
        self._saved = saved
        self.modules = sorted({mod for mod, _ in saved})

    def undo(self) -> None:
        for (mod, name), fn in self._saved.items():
            setattr(sys.modules[mod], name, fn)
        self._saved = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
        return False


def peer_function(impl: str, name: str):
    """The peer's function bound for transformers' ``name`` (one of :data:`TARGETS`):
    ``fla``: FLA's ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``;
    ``flashqla``: FlashQLA's ``chunk_gated_delta_rule`` for the prefill and FLA's recurrent
    call for the cached token (FlashQLA has no decode kernel). ImportError where the
    package does not import."""
    if impl not in ("fla", "flashqla"):
        raise ValueError(f"impl must be 'fla' or 'flashqla', got {impl!r}")
    if name not in TARGETS:
        raise ValueError(f"name must be one of {tuple(TARGETS)}, got {name!r}")
    if name == "torch_chunk_gated_delta_rule":
        if impl == "flashqla":
            from flash_qla import chunk_gated_delta_rule as chunk
        else:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as chunk
        return chunk
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as recurrent
    return recurrent


#: What :func:`use` can bind: ``ours`` (:mod:`.fla_compat`), ``fla`` (FLA's functions, as
#: transformers binds them where FLA is installed), ``flashqla`` (:func:`peer_function`)
#: and ``torch`` (the layer's own torch path: the functions transformers wrote, the
#: decorator's fallback).
IMPLS = ("ours", "fla", "flashqla", "torch")


def use(model, impl: str) -> Swap:
    """Bind ``impl`` (one of :data:`IMPLS`) in the module of ``model``'s GDN layers (see
    the module's notes); :func:`use_ours` is ``use(model, "ours")``. Returns the
    :class:`Swap` that undoes it. ``fla`` and ``flashqla`` raise ImportError where their
    package does not import."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    layers = gdn_layers(model)
    if not layers:
        raise ValueError(f"model has no Gated DeltaNet layer (a module whose class name ends "
                         f"in 'GatedDeltaNet'): {type(model).__name__}")
    if impl in ("fla", "flashqla"):     # import first: a failure binds nothing
        peers = {name: _wrapped(peer_function(impl, name), name) for name in TARGETS}
    saved = {}
    for mod_name in sorted({type(m).__module__ for m in layers}):
        mod = sys.modules[mod_name]
        missing = [n for n in TARGETS if not callable(getattr(mod, n, None))]
        if missing:
            raise ValueError(f"model's GDN layers come from {mod_name}, which defines no "
                             f"{', '.join(missing)}: this transformers version calls its "
                             f"kernels another way")
        for name, ours in TARGETS.items():
            current = getattr(mod, name)
            original = _ORIGINAL.setdefault((mod_name, name), current)
            if impl == "ours":
                fn = _wrapped(ours, name)
            elif impl in ("fla", "flashqla"):
                fn = peers[name]
            else:   # the torch function under transformers' decorator
                fn = getattr(original, "__wrapped__", original)
            saved[(mod_name, name)] = current
            setattr(mod, name, fn)
    return Swap(saved)


#: What each patched module bound before the first :func:`use` (transformers' wrappers).
_ORIGINAL: dict = {}


def use_ours(model) -> Swap:
    """Make ``model``'s Gated DeltaNet layers run our kernels (FLA's signature,
    :mod:`.fla_compat`) for prefill and decode. One line for a loaded model::

        import kernels.model; kernels.model.use_ours(model)

    Returns a :class:`Swap` (``.undo()``, or use it as a context manager). Raises
    ValueError naming ``model`` if it has no GDN layer whose module defines the two
    functions :data:`TARGETS` names. The model's tensors must suit our kernels (bf16
    activations, equal key and value head sizes): :mod:`.fla_compat` raises otherwise.
    """
    return use(model, "ours")
