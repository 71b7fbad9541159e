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

A call whose launches are fixed by its signature records them once (:func:`recording`,
:class:`LaunchList`): the call runs its normal path with a recorder active, every
``FastLaunch`` launch of it is noted, and the list built from the notes holds per launch
the compiled kernel's C launcher, the grid and the full argument list with slots for the
call's tensors (an input, an output, or a byte offset into the call's workspace). A
repeat fills the slots with this call's addresses and runs the C launches: no key, no
lookups, no Python layer of Triton. Under the interpreter the list launches
``fn[grid](...)`` with this call's tensors in the slots (the same slots). Each launch is
also described as a :class:`LaunchSpec` (``LaunchList.specs``), from which
:mod:`kernels.fastcall` makes the one-C-call plan that replaces the replay where it is
available.
"""
from __future__ import annotations

import os
import threading
import warnings
from contextlib import contextmanager

from . import interpret

interpret.install()

import torch  # noqa: E402

try:
    from triton import knobs as _knobs  # noqa: E402
except ImportError:   # pragma: no cover - tritons before knobs: the runner path below
    _knobs = None

__all__ = ["FastLaunch", "fast_launch_enabled", "dtypes", "signature", "recording",
           "LaunchList", "LaunchSpec", "keep_buffer", "not_recordable", "replay_or_launch"]

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
        params = getattr(fn, "params", None)   # (the interpreter's wrapper has none)
        self._n_plain = -1 if params is None else 0
        params = params or []
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
        self._in_first = False

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
        go = self._bind(key, grid, args, make_kwargs)
        rec = getattr(_REC, "rec", None)
        if rec is None:
            return go

        def noted():   # bound while recording: noted by the recording active at launch
            r = getattr(_REC, "rec", None)
            if r is not None:
                r.note(self, key, grid, args, make_kwargs)
            go()
        return noted

    def _bind(self, key, grid, args, make_kwargs):
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
        rec = getattr(_REC, "rec", None)
        if rec is not None:
            rec.note(self, key, grid, args, make_kwargs)
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
        self._in_first = True
        try:
            ck = self.launch(grid, args, kwargs)
        finally:
            self._in_first = False
        tpos = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        if fast_launch_enabled() and ck is not None and all(
                args[i].data_ptr() % 16 == 0 for i in tpos):
            ipos = self._int_pos[(dev, key)] = tuple(
                i for i, a in enumerate(args) if isinstance(a, int) and not isinstance(a, bool))
            self._keyed[(dev, key, tuple(_int_class(args[i]) for i in ipos))] = (
                ck, self._ordered((), kwargs), tpos)
        return ck

    def launch(self, grid, args, kwargs):
        if getattr(_REC, "rec", None) is not None and not self._in_first:
            not_recordable()   # (no launch key here: a call launching so is not recorded)
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


# --- recorded launch lists ------------------------------------------------------------------

_REC = threading.local()   # .rec: the Recorder of the call being recorded on this thread
#: Buffers kept for the life of the process (:func:`keep_buffer`), by id: a recorded launch
#: may hold them as constants.
_KEPT: dict = {}


def keep_buffer(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as kept for the life of the process (e.g. the walkers' flag buffers): a
    recorded launch list may pass it as a constant. Returns ``t``."""
    _KEPT[id(t)] = t
    return t


def not_recordable() -> None:
    """Say that the call being recorded launches something its list cannot replay (a launch
    outside :class:`FastLaunch`'s keyed paths, e.g. a Gluon kernel with TMA descriptors):
    no list is built for it."""
    rec = getattr(_REC, "rec", None)
    while rec is not None:   # (and the recordings it is inside of)
        rec.ok = False
        rec = rec.parent


class Recorder:
    """The launches of one call, in launch order (:func:`recording`); ``parent``: the
    recording this one is inside of (a launch bound there is noted here)."""

    def __init__(self, parent=None):
        self.notes, self.ok, self.parent = [], True, parent

    def note(self, fl, key, grid, args, make_kwargs):
        self.notes.append((fl, key, tuple(grid), args, make_kwargs()))

    def build(self, sources, given: int, workspace=None):
        """The :class:`LaunchList` of the noted launches, or None where one cannot be built.

        ``sources``: the call's tensors (None where absent), in an order the caller keeps
        for every call of the signature; the first ``given`` are the caller's arguments,
        the rest derived ones (outputs: fresh or an input itself). Each tensor argument of
        a launch must be a source (by identity), a view into ``workspace`` (the call's
        one intermediate allocation, at a byte offset) or a :func:`keep_buffer` buffer;
        anything else (a tensor made inside a wrapper) fails the build. So does one
        tensor given twice (its slot would be ambiguous on the next call), a launch that
        did not take the keyed direct path (misaligned, disabled), and a launch of a
        kernel whose launcher Triton's C launch cannot stand for, and a recording marked
        :func:`not_recordable` (or one it is inside of: a launch bound there)."""
        r = self
        while r is not None:
            if not r.ok:
                return None
            r = r.parent
        ids = {}
        for i, t in enumerate(sources):
            if t is None:
                continue
            if id(t) in ids:
                if i < given:
                    return None
                continue
            ids[id(t)] = i
        fast = fast_launch_enabled()
        dev = _device() if fast else None
        ws_ptr = workspace.data_ptr() if workspace is not None else None
        entries, used, names, specs = [], set(), [], []
        for fl, key, grid, args, kwargs in self.notes:
            slots, tmpl = [], list(args)
            for pos, x in enumerate(args):
                if not isinstance(x, torch.Tensor):
                    continue
                i = ids.get(id(x))
                if i is not None:
                    slots.append((pos, i, 0, None))
                    used.add(i)
                elif ws_ptr is not None and x.untyped_storage().data_ptr() == ws_ptr:
                    slots.append((pos, -1, x.data_ptr() - ws_ptr,
                                  (x.dtype, tuple(x.shape), x.stride(), x.storage_offset())))
                elif id(x) not in _KEPT:
                    return None
            for pos, *_ in slots:   # (the recorded call's tensors are not kept)
                tmpl[pos] = None
            names.append(getattr(fl.fn, "__name__", "kernel"))
            cslots = [(pos, i, off) for pos, i, off, _ in slots]
            if not fast:
                entries.append((fl.fn, grid, tmpl, slots, kwargs))
                specs.append(_spec(LaunchSpec.interpreted, fl.fn, grid, args, tmpl, kwargs,
                                   cslots))
                continue
            hit = fl._hit(dev, key, args) if len(args) == fl._n_plain else None
            if hit is None:
                return None
            ck, addrs, tail = hit
            for pos, *_ in slots:
                addrs[pos] = None
            entries.append((_c_launch(ck, grid), addrs + list(tail), cslots))
            specs.append(_spec(LaunchSpec.compiled, ck, grid, addrs, tail, cslots))
        return LaunchList(fast, dev, entries, tuple(sorted(used)), tuple(names),
                          None if None in specs else specs)


@contextmanager
def recording():
    """Note every :class:`FastLaunch` launch made on this thread inside the block
    (:class:`Recorder`; the launches themselves run as usual)."""
    prev = getattr(_REC, "rec", None)
    rec = _REC.rec = Recorder(prev)
    try:
        yield rec
    finally:
        _REC.rec = prev



def replay_or_launch(call, sources, given: int, launch, workspace=None) -> None:
    """One call's launches: ``call.launches`` (a :class:`LaunchList`, None until recorded)
    run with this call's ``sources``; where there is none, or it cannot stand for this
    call, ``launch()`` (the normal path), noted and built into ``call.launches`` while no
    list exists and ``call.tries`` (tries left) lasts. ``given``, ``workspace``: as for
    :meth:`Recorder.build`."""
    lst = call.launches
    if lst is not None and lst.run(sources, workspace):
        return
    if lst is None and call.tries:
        call.tries -= 1
        with recording() as rec:
            launch()
        call.launches = rec.build(sources, given, workspace)
    else:
        launch()

def _c_launch(ck, grid):
    """``launch(stream, args)``: the compiled kernel ``ck`` on ``grid``, ``args`` its full
    argument list (tensors as addresses, constexprs included). Triton's C launch itself
    where the kernel needs no scratch memory (what ``CudaLauncher.__call__`` adds on top
    of it: allocating scratch), else that launcher."""
    g0, g1, g2 = tuple(grid) + (1,) * (3 - len(grid))
    run, fn, md = ck.run, ck.function, ck.packed_metadata
    if (getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0 and hasattr(run, "launch")):
        c, coop, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
        if hasattr(run, "arg_annotations"):   # Triton 3.7: the arguments as one list
            ann, sig = run.arg_annotations, run.kernel_signature
            return lambda stream, a: c(g0, g1, g2, stream, fn, coop, pdl, md, None, None,
                                       None, None, None, ann, sig, a)
        # Triton 3.6 (the GPU host's): scratch pointers, then the launcher's own arguments
        # (metadata, launch metadata, the two hooks) and the kernel's, spread
        return lambda stream, a: c(g0, g1, g2, stream, fn, coop, pdl, None, None, md, None,
                                   None, None, *a)
    return lambda stream, a: run(g0, g1, g2, stream, fn, md, None, None, None, *a)


def _tensors(tmpl, slots, sources, workspace) -> list:
    """A recorded argument list with this call's tensors in the slots: a source, or a view
    cut from ``workspace`` as recorded (the interpreter's form of a list)."""
    a = list(tmpl)
    for pos, i, _, view in slots:
        a[pos] = sources[i] if i >= 0 else workspace.view(view[0]).as_strided(
            view[1], view[2], view[3])
    return a


def _spec(make, *args):
    """A :class:`LaunchSpec`, or None where the kernel cannot be described (a launcher
    without Triton's metadata: the list then has no specs and makes no plan)."""
    try:
        return make(*args)
    except (AttributeError, TypeError, ValueError, ImportError):
        return None


class LaunchSpec:
    """One recorded launch as :mod:`kernels.fastcall` builds a plan from it: the CUfunction
    (under the interpreter a stand-in number), the grid, block, shared memory, PDL,
    cooperative and cluster settings, whether the kernel needs scratch memory, each argument
    in kernel order (``args``: the plain ones, slots None, a kept buffer as its address or
    tensor; ``kwargs``: the constexpr tail, or under the interpreter the keyword values),
    the slots ``(position, source, byte offset)``, and ``ck`` (the compiled kernel: its
    signature types the arguments) or ``types`` (under the interpreter: what Triton would
    specialise the recorded values as)."""

    __slots__ = ("ck", "types", "function", "grid", "block", "shared", "pdl", "coop",
                 "num_ctas", "scratch", "args", "kwargs", "slots")

    @classmethod
    def compiled(cls, ck, grid, addrs, tail, slots):
        s = cls()
        md = ck.metadata
        run = ck.run
        s.ck, s.types, s.function = ck, None, int(ck.function)
        s.grid = tuple(grid) + (1,) * (3 - len(grid))
        warps, s.num_ctas, s.shared = ck.packed_metadata   # (what Triton's launch is given)
        s.block = 32 * warps
        s.pdl = bool(getattr(run, "launch_pdl", getattr(md, "launch_pdl", False)))
        s.coop = bool(getattr(run, "launch_cooperative_grid",
                              getattr(md, "launch_cooperative_grid", False)))
        s.scratch = bool(getattr(run, "global_scratch_size", 1)
                         or getattr(run, "profile_scratch_size", 1))
        s.args, s.kwargs, s.slots = tuple(addrs), tuple(tail), tuple(slots)
        return s

    @classmethod
    def interpreted(cls, fn, grid, args, tmpl, kwargs, slots):
        from triton.runtime.jit import mangle_type

        s = cls()
        s.ck = None
        names = list(getattr(fn, "arg_names", ()))
        keep = (getattr(fn, "kwargs", None) or {}).get("do_not_specialize") or ()
        keep = {names.index(x) if isinstance(x, str) else x for x in keep}
        s.types = ([mangle_type(a, i not in keep) for i, a in enumerate(args)]
                   + ["constexpr"] * len(kwargs))
        name = getattr(fn, "__name__", "kernel")
        s.function = int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little")
        s.grid = tuple(grid) + (1,) * (3 - len(grid))
        s.block, s.shared = 32 * kwargs.get("num_warps", 4), 0
        s.num_ctas, s.scratch = 1, False
        s.pdl, s.coop = bool(kwargs.get("launch_pdl", False)), False
        s.args, s.kwargs, s.slots = tuple(tmpl), tuple(kwargs.values()), tuple(slots)
        return s


class LaunchList:
    """A signature's launches, recorded once (:meth:`Recorder.build`): :meth:`run` replays
    them with this call's tensors in the slots; ``specs``: each launch described for
    :func:`kernels.fastcall.make_plan` (:class:`LaunchSpec`)."""

    __slots__ = ("fast", "dev", "entries", "used", "names", "specs")

    def __init__(self, fast, dev, entries, used, names, specs=None):
        self.fast, self.dev, self.entries, self.used = fast, dev, entries, used
        self.names = names   # the kernels' names, in launch order
        self.specs = specs

    def __len__(self):
        return len(self.entries)

    def parts(self, sources, workspace=None):
        """``[(kernel name, launch)]``: each launch of :meth:`run` alone, its arguments
        filled now (:mod:`kernels.bench.host_stages` times what the launches cost apart
        from filling the slots)."""
        out = []
        for name, e in zip(self.names, self.entries):
            if not self.fast:
                fn, grid, tmpl, slots, kwargs = e
                a = _tensors(tmpl, slots, sources, workspace)
                out.append((name, lambda fn=fn, grid=grid, a=a, kw=kwargs: fn[grid](*a, **kw)))
                continue
            launch, tmpl, slots = e
            a = tmpl.copy()
            for pos, i, off in slots:
                a[pos] = (sources[i].data_ptr() if i >= 0 else workspace.data_ptr()) + off
            stream = _current_stream(self.dev)
            out.append((name, lambda launch=launch, a=a: launch(stream, a)))
        return out

    def run(self, sources, workspace=None) -> bool:
        """Launch the list with ``sources`` (as for :meth:`Recorder.build`) and
        ``workspace`` (this call's, of the recorded size). False, having launched nothing,
        where the list cannot stand for the normal path this time (direct launches off or
        disabled since, another current device, a profiler's launch hooks set, a tensor
        not 16-byte aligned): the caller then takes its normal path."""
        if not self.fast:
            for fn, grid, tmpl, slots, kwargs in self.entries:
                fn[grid](*_tensors(tmpl, slots, sources, workspace), **kwargs)
            return True
        if (not fast_launch_enabled() or _device() != self.dev
                or (_knobs is not None and not _no_hooks(_knobs.runtime))):
            return False
        ptrs, m = [None] * len(sources), 0
        for i in self.used:
            p = ptrs[i] = sources[i].data_ptr()
            m |= p
        if m & 15:
            return False
        base = workspace.data_ptr() if workspace is not None else 0
        stream = _current_stream(self.dev)
        for n, (launch, tmpl, slots) in enumerate(self.entries):
            a = tmpl.copy()
            for pos, i, off in slots:
                a[pos] = (ptrs[i] if i >= 0 else base) + off
            try:
                launch(stream, a)
            except (TypeError, AttributeError) as e:
                if n:   # (a later launch: the earlier ones ran; not a launch API change)
                    raise
                FastLaunch._disable(e)
                return False
        return True
