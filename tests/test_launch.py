"""Launch options of the fused prefill: PDL and direct (cached) Triton launches.

Both are GPU-only: off on the CPU interpreter. What can be checked here is that they
are off, and the launch key that decides when a cached compiled kernel may be reused.
The GPU tests in ``tests/prefill/test_prefill.py`` check that both give the same bits as plain launches.
"""
from __future__ import annotations

import os

import pytest
import torch

from kernels.prefill.config import PrefillConfig
from kernels.launch import FastLaunch, _arg_key
from kernels.prefill.pdl import launch_options, pdl_supported


@pytest.mark.parametrize("enabled", [True, False])
def test_no_pdl_off_cuda(enabled):
    cpu = torch.device("cpu")
    assert pdl_supported(cpu) is False
    assert launch_options(enabled, cpu) == {}


def test_pdl_is_a_config_lever_on_by_default():
    assert PrefillConfig().pdl is True
    assert PrefillConfig(pdl=False).name == "pdl=False"


_BASE = torch.zeros(64, dtype=torch.float32)


@pytest.mark.parametrize("a, b, same", [
    pytest.param(None, None, True, id="None-None"),
    pytest.param(_BASE, torch.ones(8), True, id="aligned-f32-tensors"),
    pytest.param(_BASE, _BASE[1:], False, id="aligned-vs-misaligned"),
    pytest.param(_BASE, _BASE.to(torch.bfloat16), False, id="f32-vs-bf16"),
    pytest.param(_BASE, None, False, id="tensor-vs-None"),
    pytest.param(32, 48, True, id="ints-both-div16"),
    pytest.param(32, 33, False, id="div16-vs-not"),
    pytest.param(1, 17, False, id="one-vs-other"),
    pytest.param(0.5, 2.0, True, id="floats"),
])
def test_launch_key_separates_what_triton_specialises_on(a, b, same):
    assert (_arg_key(a) == _arg_key(b)) is same


def test_fast_launch_is_plain_under_the_interpreter_or_without_params():
    calls = []

    class Plain:   # stands in for a jit function without Triton's parameter list
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    FastLaunch(Plain())[(2, 1, 1)](1, 2, K=3)
    assert calls == [((2, 1, 1), (1, 2), {"K": 3})]


def test_bind_defers_the_plain_launch():
    calls = []

    class Plain:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    go = FastLaunch(Plain()).bind((4,), (1, 2), dict(K=3))
    assert calls == []          # nothing launched at bind time
    go()
    assert calls == [((4,), (1, 2), {"K": 3})]


class _Param:
    def __init__(self, name, constexpr=False, default=None):
        self.name, self.is_constexpr = name, constexpr
        self.has_default, self.default = default is not None, default


class _Compiled:
    """Stands in for Triton's compiled kernel: ``ck[grid](*args, stream=)`` and its C
    launcher ``ck.run(gx, gy, gz, stream, function, packed_metadata, launch_metadata,
    enter_hook, exit_hook, *args)``."""

    function, packed_metadata = "function", "packed"

    def __init__(self):
        self.launched = []

    def __getitem__(self, grid):
        return lambda *args, stream=None: self.launched.append((grid, args, stream))

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        assert (function, packed, metadata, enter, exit_) == ("function", "packed", None,
                                                              None, None)
        self.launched.append(((gx, gy, gz), args, stream))


class _Jit:
    params = [_Param("x"), _Param("n"), _Param("K", True), _Param("FLAG", True, default=7)]

    def __init__(self):
        self.compiled = _Compiled()
        self.plain = 0

    def __getitem__(self, grid):
        def first(*args, **kw):
            self.plain += 1
            return self.compiled
        return first


def test_bound_launch_orders_arguments_and_passes_addresses(monkeypatch):
    """After the first (compiling) launch of a key, ``bind`` returns a launch with the
    constexprs in order, defaults filled, tensors as addresses and the stream fixed."""
    from kernels import launch
    monkeypatch.setattr(launch, "fast_launch_enabled", lambda: True)
    monkeypatch.setattr(launch, "_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda dev: 99)
    fn = _Jit()
    fl = FastLaunch(fn)
    x = torch.zeros(16)
    fl.bind((3,), (x, 5), dict(K=2))()        # first: the plain path compiles
    assert fn.plain == 1 and fn.compiled.launched == []
    go = fl.bind((3,), (x, 5), dict(K=2))
    assert fn.compiled.launched == []         # bound, not launched
    go()
    assert fn.plain == 1
    assert fn.compiled.launched == [((3, 1, 1), (x.data_ptr(), 5, 2, 7), 99)]


def test_bound_launch_falls_back_to_plain_when_triton_changes(monkeypatch):
    """A ``TypeError`` from the compiled kernel's launcher (Triton's internal API moved)
    turns direct launches off, with a warning, and launches through ``kernel[grid]``."""
    from kernels import launch
    monkeypatch.setattr(launch, "_DISABLED_REASON", None)
    monkeypatch.setattr(launch, "_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda dev: 1)
    monkeypatch.setenv("GDN_FAST_LAUNCH", "1")
    monkeypatch.setattr(launch.interpret, "INTERPRET", False)

    class Moved(_Compiled):
        def __getitem__(self, grid):
            def runner(*args, stream=None):
                raise TypeError("runner() got an unexpected keyword argument 'stream'")
            return runner

        def run(self, *args):
            raise TypeError("run() takes 9 positional arguments")

    fn = _Jit()
    fn.compiled = Moved()
    fl = FastLaunch(fn)
    x = torch.zeros(16)
    fl.bind((2,), (x, 3), dict(K=1))()          # compiles (plain path)
    go = fl.bind((2,), (x, 3), dict(K=1))
    with pytest.warns(RuntimeWarning, match="direct Triton launches disabled"):
        go()
    assert fn.plain == 2                        # the failed direct launch went plain
    assert not launch.fast_launch_enabled()


def _counted_kwargs():
    """``(built, make_kwargs)``: keyword arguments ``K=2``, each build appended to
    ``built`` (a keyed launch builds them only on a miss)."""
    built = []

    def make_kwargs():
        built.append(1)
        return dict(K=2)
    return built, make_kwargs


def test_keyed_launch_reads_only_addresses_and_int_classes(monkeypatch):
    """``launch_keyed``: the first call of a key compiles through the plain path (building
    the keyword arguments); a repeat launches the kept kernel with addresses, the constexpr
    tail and no keyword arguments built; a misaligned tensor or a new int class takes the
    generic path again (never the kernel specialised for another class)."""
    from kernels import launch
    monkeypatch.setattr(launch, "fast_launch_enabled", lambda: True)
    monkeypatch.setattr(launch, "_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda dev: 7)
    fn = _Jit()
    fl = FastLaunch(fn)
    built, kw = _counted_kwargs()
    x = torch.zeros(64)
    fl.launch_keyed("site", (3,), (x, 32), kw)            # compiles
    assert fn.plain == 1 and len(built) == 1
    fl.launch_keyed("site", (3,), (x, 48), kw)            # same int class (div 16): direct
    assert fn.plain == 1 and len(built) == 1
    assert fn.compiled.launched == [((3, 1, 1), (x.data_ptr(), 48, 2, 7), 7)]
    fl.launch_keyed("site", (3,), (x, 33), kw)            # another int class: generic path
    assert len(built) == 2
    fl.launch_keyed("site", (3,), (x[1:], 32), kw)        # misaligned address: generic path
    assert len(built) == 3
    n = len(fn.compiled.launched)
    fl.launch_keyed("site", (3,), (x, 17), kw)            # the class seen at 33: now direct
    assert len(built) == 3 and len(fn.compiled.launched) == n + 1


def test_keyed_bind_builds_nothing_on_a_repeat_and_keys_the_device(monkeypatch):
    """``bind_keyed``: the first bind of a key defers the plain (compiling) launch; a
    repeat binds the kept kernel without building the keyword arguments and launches only
    when called, with addresses, the constexpr tail and the stream of the bind's device;
    another current device is another key (a compiled kernel is loaded per device); a new
    dtype named in the key is a miss, never the kernel compiled for another."""
    from kernels import launch
    monkeypatch.setattr(launch, "fast_launch_enabled", lambda: True)
    device = [0]
    monkeypatch.setattr(launch, "_device", lambda: device[0])
    monkeypatch.setattr(launch, "_current_stream", lambda dev: 100 + dev)
    fn = _Jit()
    fl = FastLaunch(fn)
    built, kw = _counted_kwargs()
    x = torch.zeros(64)
    go = fl.bind_keyed(("site", x.dtype), (3,), (x, 32), kw)
    assert fn.plain == 0 and len(built) == 1          # bound: nothing launched yet
    go()
    assert fn.plain == 1 and fn.compiled.launched == []
    go = fl.bind_keyed(("site", x.dtype), (3,), (x, 48), kw)
    assert len(built) == 1 and fn.compiled.launched == []
    go()
    assert fn.plain == 1
    assert fn.compiled.launched == [((3, 1, 1), (x.data_ptr(), 48, 2, 7), 100)]
    device[0] = 1                                     # another device: a miss
    fl.bind_keyed(("site", x.dtype), (3,), (x, 48), kw)()
    assert fn.plain == 2 and len(built) == 2
    fl.bind_keyed(("site", x.dtype), (3,), (x, 48), kw)()
    assert fn.plain == 2 and fn.compiled.launched[-1][2] == 101
    y = x.to(torch.bfloat16)                          # a dtype the key names: a miss
    fl.bind_keyed(("site", y.dtype), (3,), (y, 48), kw)()
    assert fn.plain == 3 and len(built) == 3


def test_prefill_launch_keys_fix_what_triton_specialises_on(monkeypatch):
    """Every keyed launch of the prefill (``bind_keyed`` / ``launch_keyed`` sites), over
    paths, variants, configs and optional inputs: one key never goes with two sets of
    keyword arguments or two argument kinds (dtype, None, type), so a kernel kept for a key
    is the one Triton would have picked. Launches recorded, not run (the Python only)."""
    from kernels import launch
    from kernels.prefill import gdn_prefill
    from kernels.spec import GDNShape, make_prefill_inputs

    seen = {}

    def record(self, key, grid, args, make_kwargs):
        got = launch.signature(args, make_kwargs())   # argument kinds, keyword arguments
        assert seen.setdefault((self.fn.__name__, key), got) == got, (self.fn.__name__, key)
        return lambda: None

    monkeypatch.setattr(launch.FastLaunch, "bind_keyed", record)
    monkeypatch.setattr(launch.FastLaunch, "launch_keyed", lambda *a: record(*a)())
    # the inputs where kernels run (the unkeyed launches of the older variants run for real)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    status = torch.zeros(1, dtype=torch.int32, device=dev)
    for lens in ([6], [64], [512], [100, 28], [8192], [16384], [65536]):   # every path
        for cu_dtype in (torch.int64, torch.int32):
            for with_state in (True, False):
                x = make_prefill_inputs(lens, GDNShape(1, 2, 16), with_state=with_state,
                                        cu_dtype=cu_dtype, device=dev)
                for kw in (dict(), dict(check_values=False, status=status),
                           dict(config=PrefillConfig(storage="precise", pdl=False)),
                           dict(cp=False), dict(variant="unfused"),
                           dict(variant="no_sync", check_values=False)):
                    if "variant" not in kw or sum(lens) <= 512:   # (their gates run here)
                        gdn_prefill(**x, **kw)
    names = {name for name, _ in seen}
    assert {"intra_chunk_kernel", "state_walk_kernel", "state_walk_t_kernel",
            "segment_combine_t_kernel", "segment_split_kernel",
            "recurrent_prefill_kernel"} <= names


def test_direct_launch_only_without_launch_hooks():
    """A direct launch skips Triton's launch hooks, so it is taken only where none is set:
    an empty ``HookChain`` (Triton >= 3.6) or None; a hook added to the chain, or a
    callable (earlier Tritons), sends the launch through Triton's runner, which calls it."""
    from types import SimpleNamespace as NS

    from triton.knobs import HookChain

    from kernels import launch
    off, on = HookChain(), HookChain()
    on.add(lambda *a: None)
    assert launch._no_hooks(NS(launch_enter_hook=off, launch_exit_hook=HookChain()))
    assert launch._no_hooks(NS(launch_enter_hook=None, launch_exit_hook=None))
    assert not launch._no_hooks(NS(launch_enter_hook=on, launch_exit_hook=off))
    assert not launch._no_hooks(NS(launch_enter_hook=None, launch_exit_hook=lambda *a: None))


# --- recorded launch lists (kernels.launch.recording, LaunchList) -----------------------------

def _fast(monkeypatch, stream=5):
    from kernels import launch
    monkeypatch.setattr(launch, "fast_launch_enabled", lambda: True)
    monkeypatch.setattr(launch, "_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda dev: stream)
    return launch


def _record_two(launch, fl, x, y, out, ws, kept=None):
    """A call's two launches as a pipeline makes them: one bound then launched, one keyed;
    ``out`` a workspace view in the second."""
    view = ws[16:32]
    with launch.recording() as rec:
        fl.bind_keyed("a", (2,), (x, 32), lambda: dict(K=1))()
        fl.launch_keyed("b", (3, 4), (view if kept is None else kept, 48), lambda: dict(K=2))
        fl.launch_keyed("c", (1,), (out, 16), lambda: dict(K=3))
    return rec


def test_recorded_list_replays_the_launches_with_this_calls_addresses(monkeypatch):
    """A recorded list launches, in the recorded order, the kept kernels with this call's
    addresses in the tensors' slots (a workspace view at its byte offset into this call's
    workspace), the recorded ints, the constexpr tail and the current stream."""
    launch = _fast(monkeypatch)
    fn = _Jit()
    fl = FastLaunch(fn)
    x, y, out, ws = torch.zeros(64), torch.zeros(64), torch.zeros(64), torch.zeros(64)
    for _ in range(2):   # the first compiles (plain path), the second records direct hits
        rec = _record_two(launch, fl, x, y, out, ws)
    lst = rec.build((x, y, out), 2, ws)
    assert len(lst) == 3
    fn.compiled.launched.clear()
    x2, y2, out2, ws2 = torch.zeros(64), torch.zeros(64), torch.zeros(64), torch.zeros(64)
    monkeypatch.setattr(launch, "_current_stream", lambda dev: 11)
    assert lst.run((x2, y2, out2), ws2)
    assert fn.compiled.launched == [
        ((2, 1, 1), (x2.data_ptr(), 32, 1, 7), 11),
        ((3, 4, 1), (ws2.data_ptr() + 64, 48, 2, 7), 11),
        ((1, 1, 1), (out2.data_ptr(), 16, 3, 7), 11)]
    assert fn.plain == 3   # (the three first launches only)


def test_recorded_list_calls_tritons_c_launch_where_no_scratch_is_needed(monkeypatch):
    """A launcher without scratch memory is called at Triton's C ``launch`` (what
    ``CudaLauncher.__call__`` wraps), with the full argument list."""
    launch = _fast(monkeypatch, stream=3)
    monkeypatch.setattr(launch, "_DISABLED_REASON", None)
    calls = []

    class Launcher:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, True
        arg_annotations, kernel_signature = "ann", b"sig"

        def launch(self, *a):
            calls.append(a)

        def __call__(self, *a):   # (CudaLauncher.__call__: the keyed launch's path)
            pass

    fn = _Jit()
    fn.compiled.run = Launcher()
    fl = FastLaunch(fn)
    x = torch.zeros(64)
    for _ in range(2):
        with launch.recording() as rec:
            fl.launch_keyed("a", (2,), (x, 32), lambda: dict(K=1))
    lst = rec.build((x,), 1)
    calls.clear()
    x2 = torch.zeros(64)
    assert lst.run((x2,))
    assert calls == [(2, 1, 1, 3, "function", False, True, "packed", None, None, None, None,
                      None, "ann", b"sig", [x2.data_ptr(), 32, 1, 7])]


def test_recorded_list_declines_what_it_cannot_stand_for(monkeypatch):
    """A misaligned tensor or another current device: False and nothing launched (the
    caller takes its normal path)."""
    launch = _fast(monkeypatch)
    fn = _Jit()
    fl = FastLaunch(fn)
    x, y, out, ws = torch.zeros(64), torch.zeros(64), torch.zeros(64), torch.zeros(64)
    for _ in range(2):
        rec = _record_two(launch, fl, x, y, out, ws)
    lst = rec.build((x, y, out), 2, ws)
    fn.compiled.launched.clear()
    assert not lst.run((x[1:], y, out), ws)
    monkeypatch.setattr(launch, "_device", lambda: 1)
    assert not lst.run((x, y, out), ws)
    assert fn.compiled.launched == []


def test_a_list_is_built_only_where_every_tensor_has_a_slot(monkeypatch):
    """A tensor that is neither a source, nor in the workspace, nor a kept buffer (made
    inside a wrapper: it would be stale on the next call), one tensor given twice (which
    slot?), a launch marked unrecordable, a launch that did not take the direct path: no
    list. A kept buffer is a constant."""
    launch = _fast(monkeypatch)
    fn = _Jit()
    fl = FastLaunch(fn)
    x, y, out, ws = torch.zeros(64), torch.zeros(64), torch.zeros(64), torch.zeros(64)
    _record_two(launch, fl, x, y, out, ws)
    assert _record_two(launch, fl, x, y, out, ws, kept=torch.zeros(16)).build(
        (x, y, out), 2, ws) is None
    assert _record_two(launch, fl, x, y, out, ws).build((x, x, out), 2, ws) is None
    assert _record_two(launch, fl, x, y, out, ws).build((x, y, out), 2, ws) is not None
    buf = launch.keep_buffer(torch.zeros(16))
    rec = _record_two(launch, fl, x, y, out, ws, kept=buf)   # (compiles "b" with it)
    rec = _record_two(launch, fl, x, y, out, ws, kept=buf)
    lst = rec.build((x, y, out), 2, ws)
    fn.compiled.launched.clear()
    lst.run((x, y, out), ws)
    assert fn.compiled.launched[1][1][0] == buf.data_ptr()
    with launch.recording() as rec:
        fl.launch_keyed("a", (2,), (x, 32), lambda: dict(K=1))
        launch.not_recordable()
    assert rec.build((x,), 1) is None
    with launch.recording() as rec:
        fl.launch_keyed("a", (2,), (x[1:], 32), lambda: dict(K=1))   # misaligned: plain
    assert rec.build((x[1:],), 1) is None


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="about the Triton interpreter's launch (TRITON_INTERPRET=1) only")
def test_recorded_list_under_the_interpreter_launches_through_kernel_grid():
    """Off CUDA the list launches ``fn[grid](...)`` with this call's tensors in the slots
    and the workspace views cut from this call's workspace as recorded."""
    from kernels import launch
    calls = []

    class Plain:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    fl = FastLaunch(Plain())
    x, ws = torch.zeros(8), torch.zeros(16)
    with launch.recording() as rec:
        fl.launch_keyed("a", (2,), (x, ws.view(torch.int32)[4:8], 3), lambda: dict(K=1))
    lst = rec.build((x,), 1, ws)
    calls.clear()
    x2, ws2 = torch.ones(8), torch.arange(16.0)
    assert lst.run((x2,), ws2)
    (grid, (a0, a1, n), kw), = calls
    assert grid == (2,) and a0 is x2 and n == 3 and kw == dict(K=1)
    assert a1.dtype == torch.int32 and a1.data_ptr() == ws2.data_ptr() + 16 and a1.shape == (4,)
