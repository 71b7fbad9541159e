"""Cheaper repeat launches of our Triton kernels (the ``fused`` prefill's, and decode's).

On the eager path the host time between the two launches decides the call's
span at short lengths (the GPU waits for the second launch). Triton's
``kernel[grid](...)`` binds and specialises every argument on every call, which costs
more host time the more arguments a kernel has (docs/notes/prefill.md, "Numbers behind the
rules").

:class:`FastLaunch` keeps, per kernel, the compiled kernel Triton returned for
a *launch key* and launches it directly (Triton's C launcher, tensors as addresses) when
the key repeats. The key holds everything Triton specialises on for our arguments:

* the current device;
* per positional argument: ``None``; a tensor's dtype and whether its address is
  16-byte aligned; an int's value class (``== 1``, divisible by 16, other);
  a float's type;
* the keyword arguments (constexprs and launch options such as ``num_warps``,
  ``launch_pdl``) as given, in order.

Every call site of ours names its own key (:meth:`FastLaunch.launch_keyed`,
:meth:`FastLaunch.bind_keyed`): a tuple of what it derives the keyword arguments from
and its tensors' dtypes (or None), built from values it holds; only the addresses are
read and the ints classed per call, and the keyword arguments are built only the first
time. :meth:`FastLaunch.bind` does the same with a generic key (:func:`signature`) for
sites without one. The binds do all of that ahead of time and return a zero-argument
launch: the ``fused`` pipeline binds every kernel of a call before launching the first,
so only the bound launches stand between two kernels.

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

__all__ = ["FastLaunch", "fast_launch_enabled", "dtypes", "signature"]

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


def _current_stream(dev: int) -> int:
    """The current CUDA stream's handle on device ``dev`` (what Triton's own launcher asks
    torch for)."""
    return torch._C._cuda_getCurrentRawStream(dev)


def _device() -> int:
    """The current CUDA device's index (the C call under ``torch.cuda.current_device``,
    without its Python wrapper: a launch only happens once CUDA is initialised)."""
    return torch._C._cuda_getDevice()


def _no_hooks(rt) -> bool:
    """Whether no launch hook is set (a profiler's): Triton >= 3.6 keeps them in a
    ``HookChain`` (empty: ``calls == []``), earlier ones as a callable or None."""
    e, x = rt.launch_enter_hook, rt.launch_exit_hook
    return ((e is None or getattr(e, "calls", True) == []) and
            (x is None or getattr(x, "calls", True) == []))


def _direct(hit, grid, stream):
    """``(run, call)``: ``run(*call)`` launches the compiled kernel of ``hit`` (``(compiled
    kernel, arguments with the tensors as addresses, constexpr tail)``) on ``grid`` and
    ``stream``: Triton's C launcher called as ``CompiledKernel.__getitem__``'s runner calls
    it, without that wrapper and, with no launch hook set, without launch metadata or
    hooks; with a profiler's launch hooks set, that runner (it calls them)."""
    ck, addrs, tail = hit
    g = tuple(grid) + (1,) * (3 - len(grid))
    rt = _knobs.runtime if _knobs is not None else None
    if rt is not None and _no_hooks(rt):
        return ck.run, (g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, None,
                        None, None, *addrs, *tail)
    runner = ck[g]
    return (lambda *a: runner(*a, stream=stream)), (*addrs, *tail)


def dtypes(*tensors):
    """Each tensor's dtype (None for None): the part of a call site's launch key that
    says which tensors it passes and of what kind."""
    return tuple([None if t is None else t.dtype for t in tensors])


def signature(args, kwargs):
    """The generic launch key of :meth:`FastLaunch.bind`: per argument its dtype (a
    tensor), its value (a bool) or its type, and the keyword arguments as given."""
    return (tuple([a.dtype if isinstance(a, torch.Tensor) else
                   (a if isinstance(a, bool) or a is None else type(a)) for a in args]),
            tuple(kwargs.items()))


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
        # (device, caller key, int classes) -> (compiled kernel, constexpr tail, tensor
        # positions); (device, caller key) -> positions of the int arguments
        self._keyed = {}
        self._int_pos = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

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
        return (_device(), tuple(keys), tuple(kwargs.items())), addrs

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

    def bind(self, grid, args, kwargs):
        """:meth:`bind_keyed` with the generic key (:func:`signature`) for a call site
        without its own: every argument's dtype, type or None-ness and the keyword
        arguments as given."""
        return self.bind_keyed(signature(args, kwargs), grid, args, lambda: kwargs)

    def bind_keyed(self, key, grid, args, make_kwargs):
        """A zero-argument callable that launches ``fn[grid](*args, **make_kwargs())``.

        ``key`` as for :meth:`launch_keyed`. Everything but the launch itself (the key,
        the tensors' addresses, Triton's handles, the current stream) is done here, so a
        pipeline can bind its second kernel before launching its first and leave only the
        launch between the two. A key (or int class, or misaligned tensor) not seen yet
        binds to :meth:`launch_keyed`'s first-use path (compiling on the call)."""
        if not fast_launch_enabled() or len(args) != self._n_plain:
            kwargs = make_kwargs()
            return lambda: self.fn[grid](*args, **kwargs)
        dev = _device()
        hit = self._hit(dev, key, args)
        if hit is None:
            kwargs = make_kwargs()
            return lambda: self._first(dev, key, grid, args, kwargs)
        try:
            run, call = _direct(hit, grid, _current_stream(dev))
        except (TypeError, AttributeError) as e:
            self._disable(e)
            kwargs = make_kwargs()
            return lambda: self.fn[grid](*args, **kwargs)

        def go():
            try:
                run(*call)
            except (TypeError, AttributeError) as e:
                self._disable(e)
                self.fn[grid](*args, **make_kwargs())
        return go

    def launch_keyed(self, key, grid, args, make_kwargs):
        """:meth:`launch` for a call site that names its own ``key``: a hashable that the
        caller guarantees fixes everything Triton specialises on in ``args`` and the
        keyword arguments except the tensors' addresses and the ints' values (their dtypes,
        which arguments are None, the constexprs and launch options; the current device is
        added here). Here only the addresses are read (their 16-byte alignment checked)
        and the ints classed, so a repeat costs a fraction of the generic key;
        ``make_kwargs()`` builds the keyword arguments, called only on a miss (first use,
        a misaligned tensor, a new int class), which takes :meth:`launch`."""
        if not fast_launch_enabled() or len(args) != self._n_plain:
            return self.fn[grid](*args, **make_kwargs())
        dev = _device()
        hit = self._hit(dev, key, args)
        if hit is None:
            return self._first(dev, key, grid, args, make_kwargs())
        ck, addrs, tail = hit
        try:
            g = tuple(grid) + (1,) * (3 - len(grid))
            rt = _knobs.runtime if _knobs is not None else None
            if rt is not None and _no_hooks(rt):   # as _direct, without its argument tuple
                ck.run(g[0], g[1], g[2], _current_stream(dev), ck.function, ck.packed_metadata,
                       None, None, None, *addrs, *tail)
            else:
                run, call = _direct(hit, grid, _current_stream(dev))
                run(*call)
        except (TypeError, AttributeError) as e:
            self._disable(e)
            return self.fn[grid](*args, **make_kwargs())
        return ck

    def _hit(self, dev, key, args):
        """``(compiled kernel, args with the tensors as addresses, constexpr tail)`` for a
        repeat of ``key`` on device ``dev`` with the ints in classes seen and every tensor
        16-byte aligned; else None."""
        ipos = self._int_pos.get((dev, key))
        if ipos is None:
            return None
        entry = self._keyed.get((dev, key, tuple([_int_class(args[i]) for i in ipos])))
        if entry is None:
            return None
        ck, tail, tpos = entry
        addrs, m = list(args), 0
        for i in tpos:
            p = args[i].data_ptr()
            addrs[i] = p
            m |= p
        return None if m & 15 else (ck, addrs, tail)

    def _first(self, dev, key, grid, args, kwargs):
        """A keyed launch not seen yet: :meth:`launch`, and its compiled kernel kept for
        ``key`` and the ints' classes when every tensor is 16-byte aligned."""
        ck = self.launch(grid, args, kwargs)
        tpos = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        if fast_launch_enabled() and ck is not None and all(
                args[i].data_ptr() % 16 == 0 for i in tpos):
            ipos = self._int_pos[(dev, key)] = tuple(
                i for i, a in enumerate(args) if isinstance(a, int) and not isinstance(a, bool))
            self._keyed[(dev, key, tuple(_int_class(args[i]) for i in ipos))] = (
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
            ck[tuple(grid) + (1,) * (3 - len(grid))](*addrs, *tail,
                                                     stream=_current_stream(key[0]))
        except (TypeError, AttributeError) as e:
            self._disable(e)
            return self.fn[grid](*args, **kwargs)
        return ck
