"""Cheaper repeat launches of our Triton kernels (the ``fused`` prefill's, and decode's).

On the eager path the host time between the two launches decides the call's
span at short lengths (the GPU waits for the second launch). Triton's
``kernel[grid](...)`` binds and specialises every argument on every call, which costs
more host time the more arguments a kernel has (docs/notes/prefill.md, "Numbers behind the
rules").

:class:`FastLaunch` keeps, per kernel, the compiled kernel Triton returned for
a *launch key* and launches it directly (``compiled[grid](*args)``) when the key
repeats. The key holds everything Triton specialises on for our arguments:

* the current device;
* per positional argument: ``None``; a tensor's dtype and whether its address is
  16-byte aligned; an int's value class (``== 1``, divisible by 16, other);
  a float's type;
* the keyword arguments (constexprs and launch options such as ``num_warps``,
  ``launch_pdl``) as given, in order.

:meth:`FastLaunch.bind` does all of that ahead of time and returns a zero-argument
launch: the ``fused`` pipeline binds every kernel of a call before launching the
first, so only the bound launches (a fraction of a whole ``state_walk_fwd``) stand
between two kernels.

A key seen for the first time goes through ``kernel[grid](...)`` (compiling if
needed) and its compiled kernel is kept. Off CUDA (the interpreter) or with
``GDN_FAST_LAUNCH=0`` every launch takes the plain path. If the direct launch
raises a ``TypeError`` / ``AttributeError`` (Triton's internal launch API
changed), the plain path is used from then on (with one warning) -- it is an
optimisation, never a requirement. CUDA errors propagate.
"""
from __future__ import annotations

import os
import warnings

from . import interpret

interpret.install()

import torch  # noqa: E402

try:
    from triton import knobs as _knobs  # noqa: E402
except ImportError:   # pragma: no cover - tritons before knobs: the runner path below
    _knobs = None

__all__ = ["FastLaunch", "fast_launch_enabled"]

_DISABLED_REASON = None


def fast_launch_enabled() -> bool:
    """Whether direct launches are on (CUDA build, not the interpreter, not disabled)."""
    return (not interpret.INTERPRET and _DISABLED_REASON is None
            and os.environ.get("GDN_FAST_LAUNCH", "1") != "0")


def _tensor_key(t, addr: int):
    return (t.dtype, addr % 16 == 0)


def _arg_key(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return _tensor_key(x, x.data_ptr())
    if isinstance(x, bool):
        return ("b", x)
    if isinstance(x, int):
        return ("i", _int_class(x))
    if isinstance(x, float):
        return "f"
    return (type(x).__name__, x)   # anything else: exact (a miss at worst)


def _int_class(x: int) -> int:
    """What Triton specialises an int argument on: 1, divisible by 16, or neither."""
    return 1 if x == 1 else (16 if x % 16 == 0 else 0)


def _current_stream() -> int:
    """The current CUDA stream's handle (what Triton's own launcher asks torch for)."""
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())


class FastLaunch:
    """``FastLaunch(jit_fn)[grid](*args, **kwargs)``: as ``jit_fn[grid](...)``, cheaper
    on repeats. ``args``: the kernel's non-constexpr parameters in order (positional);
    ``kwargs``: constexprs by name and launch options."""

    def __init__(self, fn):
        self.fn = fn
        params = getattr(fn, "params", None) or []   # (the interpreter's wrapper has none)
        self._n_plain = -1 if not params else 0
        for p in params:                      # our kernels: plain parameters first
            if p.is_constexpr:
                break
            self._n_plain += 1
        self._consts = [(p.name, p.default if p.has_default else None, p.has_default)
                        for p in params[self._n_plain:]]
        self._compiled = {}
        self._keyed = {}    # (caller key, int classes) -> (compiled kernel, constexpr tail, tensor positions)
        self._int_pos = {}  # caller key -> positions of the int arguments

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def bind(self, grid, args, kwargs):
        """A zero-argument callable that launches ``fn[grid](*args, **kwargs)``.

        Everything but the launch itself (the key, the argument order, tensors turned
        into addresses, Triton's handles, the current stream) is done here, so a
        pipeline can bind its second kernel before launching its first and leave only
        the launch between the two. A key not seen yet binds to :meth:`launch`
        (compiling on the call)."""
        if not fast_launch_enabled() or len(args) != self._n_plain:
            return lambda: self.fn[grid](*args, **kwargs)
        key, addrs = self._key_addrs(args, kwargs)
        entry = self._compiled.get(key)
        if entry is None:
            return lambda: self.launch(grid, args, kwargs)
        ck, tail = entry
        # tensors as raw addresses: Triton's C launcher takes an int as is, where a tensor
        # costs a ``data_ptr()`` call and a ``cuPointerGetAttribute`` driver query each
        # (the tensors stay referenced by ``args`` until the launch)
        ordered = addrs + tail
        try:
            runner = ck[tuple(grid) + (1,) * (3 - len(grid))]
        except (TypeError, AttributeError) as e:
            self._disable(e)
            return lambda: self.fn[grid](*args, **kwargs)
        stream = _current_stream()

        def go():
            try:
                runner(*ordered, stream=stream)
            except (TypeError, AttributeError) as e:
                self._disable(e)
                self.fn[grid](*args, **kwargs)
        return go

    @staticmethod
    def _key_addrs(args, kwargs):
        """The launch key, and ``args`` with every tensor replaced by its address (one
        pass: each address is read once)."""
        keys, addrs = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                p = a.data_ptr()
                keys.append(_tensor_key(a, p))
                addrs.append(p)
            else:
                keys.append(_arg_key(a))
                addrs.append(a)
        return (torch.cuda.current_device(), tuple(keys), tuple(kwargs.items())), addrs

    def _ordered(self, args, kwargs):
        ordered = list(args)
        for name, default, has_default in self._consts:
            if name in kwargs:
                ordered.append(kwargs[name])
            elif has_default:
                ordered.append(default)
            else:   # Triton accepted the first launch without it: cannot happen
                raise TypeError(f"{self.fn.__name__}: constexpr {name} not given")
        return ordered

    @staticmethod
    def _disable(e):
        """Triton's internals changed: plain launches from now on (CUDA errors, e.g. one
        left by an earlier kernel, propagate)."""
        global _DISABLED_REASON
        _DISABLED_REASON = f"{type(e).__name__}: {e}"
        warnings.warn(f"direct Triton launches disabled ({_DISABLED_REASON}); "
                      "using kernel[grid](...)", RuntimeWarning, stacklevel=4)

    def launch_keyed(self, key, grid, args, make_kwargs):
        """:meth:`launch` for a call site that names its own ``key``: a hashable that the
        caller guarantees fixes everything Triton specialises on in ``args`` and the
        keyword arguments except the tensors' addresses and the ints' values (their dtypes,
        which arguments are None, the constexprs and launch options). Here only the
        addresses are read (their 16-byte alignment checked) and the ints classed, so a
        repeat costs a fraction of the generic key; ``make_kwargs()`` builds the keyword
        arguments, called only on a miss (first use, a misaligned tensor, a new int class),
        which takes :meth:`launch`."""
        if not fast_launch_enabled() or len(args) != self._n_plain:
            return self.fn[grid](*args, **make_kwargs())
        ipos = self._int_pos.get(key)
        if ipos is not None:
            entry = self._keyed.get((key, tuple(_int_class(args[i]) for i in ipos)))
            if entry is not None:
                ck, tail, tpos = entry
                addrs, m = list(args), 0
                for i in tpos:
                    p = args[i].data_ptr()
                    addrs[i] = p
                    m |= p
                if not m & 15:
                    try:
                        g = tuple(grid) + (1,) * (3 - len(grid))
                        rt = _knobs.runtime if _knobs is not None else None
                        if (rt is not None and rt.launch_enter_hook is None
                                and rt.launch_exit_hook is None):
                            # the compiled kernel's runner without its wrapper: Triton's C
                            # launcher, called as CompiledKernel.__getitem__'s runner does
                            ck.run(g[0], g[1], g[2], _current_stream(), ck.function,
                                   ck.packed_metadata, None, None, None, *addrs, *tail)
                        else:   # a profiler's launch hooks: Triton's own runner calls them
                            ck[g](*addrs, *tail, stream=_current_stream())
                    except (TypeError, AttributeError) as e:
                        self._disable(e)
                        return self.fn[grid](*args, **make_kwargs())
                    return ck
        kwargs = make_kwargs()
        ck = self.launch(grid, args, kwargs)
        tpos = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        if fast_launch_enabled() and ck is not None and all(
                args[i].data_ptr() % 16 == 0 for i in tpos):
            ipos = self._int_pos[key] = tuple(
                i for i, a in enumerate(args) if isinstance(a, int) and not isinstance(a, bool))
            self._keyed[(key, tuple(_int_class(args[i]) for i in ipos))] = (
                ck, self._ordered((), kwargs), tpos)
        return ck

    def launch(self, grid, args, kwargs):
        if not fast_launch_enabled() or len(args) != self._n_plain:
            return self.fn[grid](*args, **kwargs)
        key, addrs = self._key_addrs(args, kwargs)
        entry = self._compiled.get(key)
        if entry is None:
            ck = self.fn[grid](*args, **kwargs)
            self._compiled[key] = (ck, self._ordered((), kwargs))
            return ck
        ck, tail = entry
        try:
            ck[tuple(grid) + (1,) * (3 - len(grid))](*addrs, *tail, stream=_current_stream())
        except (TypeError, AttributeError) as e:
            self._disable(e)
            return self.fn[grid](*args, **kwargs)
        return ck
