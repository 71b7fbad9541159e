"""The one-call repeat of a recorded eager call: a small C++ extension (``kernels/csrc``).

A call whose launches were recorded (:class:`kernels.launch.LaunchList`) gets a *plan*
(:func:`make_plan`): per argument the metadata it must have (type, sizes, strides, dtype,
device), None, or an option (the recorded object, or an equal one of its type); the outputs
to allocate or alias; the workspace size; per launch the CUfunction, grid, block, shared
memory, PDL / cooperative flags and a prebuilt parameter buffer with slots for the call's
addresses. A repeat is one Python-to-C call, :func:`run` (``run(plan, *args)``): it checks
every argument against the plan, allocates (``at::empty_strided``, the caching allocator),
checks the 16-byte alignment the recorded specialisation assumed, fills the slots and calls
``cuLaunchKernelEx``; it returns the outputs, or None having launched nothing where anything
differs, and the call then takes its Python path (the recorder and the full checks, with
their errors).

The extension is compiled with the C++ compiler directly (no ninja): ``$CXX`` or ``c++`` /
``g++`` / ``clang++`` on the PATH, torch's headers and libraries, and on a CUDA torch the
CUDA headers (``$CUDA_HOME/include`` or Triton's bundled ones; ``libcuda`` is opened at
load time). The build is cached under ``$GDN_FASTCALL_CACHE`` (default
``~/.cache/gdn_kernels/fastcall``) by a hash of the source, the mode, torch's and Python's
versions and the flags. ``python -m kernels.fastcall`` builds it and says what it found or
lacks.

Modes: ``cuda`` (a CUDA torch: the real launcher) and ``stub`` (a CPU torch, for CI):
everything but the launch; each launch is noted instead (:func:`stub_last`). Under the
interpreter a stub plan is only used by a call while :func:`serving_stub` is on (tests):
its launches are then the recorded list's interpreter launches on the sources the C++ side
allocated, so a CPU test runs the whole path and compares the noted parameters with the
Python list's.

Off: ``GDN_FAST_LAUNCH=0`` (also read by the C++ side per call), no compiler, a failed
build (one warning, the reason in :func:`status`): every call keeps the Python path.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from . import interpret

__all__ = ["load", "status", "available", "make_plan", "run", "runner", "stub_last", "serving_stub",
           "pack", "SOURCE"]

SOURCE = Path(__file__).parent / "csrc" / "fastcall.cpp"
_LOCK = threading.Lock()
_MOD = None          # the loaded module
_REASON = None       # why there is none (a string), once tried
_SERVE_STUB = False


def _mode() -> str:
    return "cuda" if torch.version.cuda is not None and not interpret.INTERPRET else "stub"


def _compiler():
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if os.path.exists(cxx) else None)
    for c in ("c++", "g++", "clang++"):
        p = shutil.which(c)
        if p:
            return p
    return None


def _cuda_includes() -> list:
    """Where ``cuda.h`` and ``cuda_runtime_api.h`` (c10/cuda's) are: the CUDA toolkit's,
    else Triton's bundled copies."""
    dirs = []
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:   # pragma: no cover
        CUDA_HOME = None
    for home in (CUDA_HOME, os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda.h").exists():
            dirs.append(str(Path(home) / "include"))
            break
    try:
        import triton
        tri = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
        if (tri / "cuda.h").exists():
            dirs.append(str(tri))
    except ImportError:   # pragma: no cover
        pass
    return dirs


def _command(cxx, mode, out):
    from torch.utils import cpp_extension as ce

    torch_lib = ce.library_paths()[0]
    inc = ce.include_paths() + [sysconfig.get_paths()["include"]]
    defs = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    libs = ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    if mode == "cuda":
        cu = _cuda_includes()
        if not cu:
            raise RuntimeError("no cuda.h: set CUDA_HOME (the CUDA toolkit) or install a "
                               "Triton with its bundled NVIDIA headers")
        inc += cu
        libs += ["-lc10_cuda", "-ltorch_cuda", "-ldl"]
    else:
        defs.append("-DGDN_FASTCALL_STUB")
    return ([cxx, "-O2", _std(), "-shared", "-fPIC", "-fvisibility=hidden", *defs,
             *[f"-I{d}" for d in inc], str(SOURCE), "-o", str(out), f"-L{torch_lib}",
             f"-Wl,-rpath,{torch_lib}", *libs])


def _std() -> str:
    """The C++ standard torch's own extensions are built with (C++20 from torch 2.10 on,
    else C++17)."""
    from torch.utils import cpp_extension as ce

    return "-std=c++20" if "-std=c++20" in Path(ce.__file__).read_text() else "-std=c++17"


def _cache_dir() -> Path:
    root = os.environ.get("GDN_FASTCALL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "gdn_kernels" / "fastcall"


def build(verbose: bool = False) -> Path:
    """Compile the extension for this torch (cached); its path. Raises RuntimeError saying
    what is missing (no compiler, no CUDA headers) or the compiler's output."""
    mode = _mode()
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler: set CXX or install g++ (or clang++)")
    py_inc = Path(sysconfig.get_paths()["include"])
    if not (py_inc / "Python.h").exists():
        raise RuntimeError(f"no Python.h in {py_inc}: install this Python's development "
                           f"headers (python{sys.version_info[0]}.{sys.version_info[1]}-dev)")
    cmd = _command(cxx, mode, "OUT")
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update(repr((mode, torch.__version__, sys.version, cmd[:-1])).encode())
    d = _cache_dir() / f"{mode}-{h.hexdigest()[:20]}"
    so = d / "_gdn_fastcall.so"
    if so.exists():
        return so
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
    os.close(fd)
    cmd = _command(cxx, mode, tmp)
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"{mode} build failed ({cxx}):\n{r.stderr[-4000:]}")
    os.replace(tmp, so)
    return so


def load(verbose: bool = False):
    """The extension module, building it on first use; None (and one warning) where it
    cannot be had (:func:`status` says why)."""
    global _MOD, _REASON
    if _MOD is not None or _REASON is not None:
        return _MOD
    with _LOCK:
        if _MOD is not None or _REASON is not None:
            return _MOD
        if not SOURCE.is_file():   # (a bundled copy, e.g. a packed contest solution: quiet)
            _REASON = f"no source {SOURCE} (a copy of the package without kernels/csrc)"
            return None
        try:
            so = build(verbose)
            spec = importlib.util.spec_from_file_location(
                "_gdn_fastcall", so, loader=importlib.machinery.ExtensionFileLoader(
                    "_gdn_fastcall", str(so)))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            try:
                from triton import knobs
                mod.set_runtime(knobs.runtime)
            except ImportError:   # pragma: no cover - tritons before knobs: no hooks read
                pass
            _MOD = mod
        except Exception as e:   # (an optimisation: the Python path stays)
            _REASON = f"{type(e).__name__}: {e}"
            warnings.warn(f"kernels.fastcall unavailable, eager calls keep the Python path "
                          f"({_REASON.splitlines()[0]})", RuntimeWarning, stacklevel=3)
    return _MOD


def status() -> dict:
    """``{"mode", "loaded", "reason"}``: the build's mode, whether it is loaded, why not."""
    return dict(mode=_mode(), loaded=_MOD is not None, reason=_REASON)


@contextmanager
def serving_stub(on: bool = True):
    """Let calls use stub plans (a CPU torch under the interpreter; tests)."""
    global _SERVE_STUB
    prev, _SERVE_STUB = _SERVE_STUB, on
    try:
        yield
    finally:
        _SERVE_STUB = prev


def available() -> bool:
    """Whether calls make and use plans now: direct launches on (CUDA, not disabled) and the
    extension loaded, or, under the interpreter, :func:`serving_stub` on and the stub
    loaded. Builds the extension on first use."""
    from .launch import fast_launch_enabled

    if os.environ.get("GDN_FAST_LAUNCH", "1") == "0":
        return False
    if interpret.INTERPRET:
        return _SERVE_STUB and load() is not None
    return fast_launch_enabled() and load() is not None


# --- plans from recorded lists -------------------------------------------------------------

_FMT = {"i1": "<i", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u1": "<I",
        "u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q", "fp32": "<f", "f32": "<f",
        "fp64": "<d"}


def _int_sizes():
    """Triton 3.7's launcher passes i1 / u1 as 4 bytes (its extractors), 3.6's generated one
    as 1 (``int8_t``); the kernel reads the bytes it declares either way."""
    from triton.backends.nvidia import driver as nv

    if hasattr(nv, "make_launcher"):   # Triton <= 3.6: a generated launcher per kernel
        return {"i1": "<b", "u1": "<B"}
    return {}


def pack(ty: str, value) -> bytes:
    """One kernel parameter's bytes as Triton's launcher passes it (``ty``: its signature
    type, ``*...`` a pointer given as an address)."""
    if ty.startswith("*"):
        return struct.pack("<Q", value or 0)
    fmt = _FMT.get(ty)
    if fmt is None:
        raise ValueError(f"parameter type {ty} not handled")
    if not interpret.INTERPRET:
        fmt = _int_sizes().get(ty, fmt)
    return struct.pack(fmt, float(value) if ty in ("fp32", "f32", "fp64") else int(value))


def _types(spec) -> list:
    """Each argument's Triton type (``constexpr`` for those not passed): the compiled
    kernel's signature on a GPU; under the interpreter what Triton would specialise the
    recorded values as (:class:`kernels.launch.LaunchSpec`)."""
    if spec.ck is not None:
        return list(spec.ck.src.signature.values())
    return list(spec.types)


def _immutable(a) -> bool:
    """Whether a plan can require an option: None, bool, int, float, str, or a frozen
    dataclass of such fields (a :class:`kernels.decode.DecodeConfig` or
    :class:`kernels.prefill.PrefillConfig`). A call is served with the recorded object or
    an equal one of its exact type (a config built per call, as notebook 01's host rows
    do, or a scale computed per call: the Python path's signatures key on the value too);
    the plan holds a reference, so the recorded object's address is never reused."""
    if a is None or type(a) in (bool, int, float, str):
        return True
    params = getattr(type(a), "__dataclass_params__", None)
    return (params is not None and params.frozen
            and all(_immutable(getattr(a, f)) for f in type(a).__dataclass_fields__))


def make_plan(lst, opts, given, outs, workspace, returns, ws_source=None):
    """A plan from the recorded :class:`kernels.launch.LaunchList` ``lst`` (None where it
    cannot be one: the extension unavailable, a launch needing scratch memory or clusters, a
    parameter type not handled, an option of another type). :func:`run` then takes
    ``(plan, *opts, *given)``: ``opts`` the call's options as recorded, each required to be
    that object or an equal one of its exact type (so only immutable ones: :func:`_immutable`);
    ``given`` the list's first sources as recorded (a tensor: its type, sizes, strides,
    dtype and device required; None: None required). ``outs``: the list's derived sources
    after them (``("alias", i)`` of an earlier source or ``("empty", t)``, ``t`` the
    recorded output: its sizes, strides, dtype, device); ``workspace``: the recorded one or
    None; ``returns``: the source indices returned. ``ws_source``: the list's workspace is
    that source (a float32 tensor given or made, at the recorded byte offsets; ``workspace``
    then None), as where two plans share one allocation (the multi-GPU rank call's halves)."""
    mod = load()
    if mod is None or lst is None or lst.specs is None:
        return None
    n = len(opts)
    spec_args = []
    for a in opts:
        if not _immutable(a):
            return None
        spec_args.append(("is", a))
    for a in given:
        if a is None:
            spec_args.append(("none",))
        elif isinstance(a, torch.Tensor):
            spec_args.append(("tensor", a))
        else:
            return None
    outs = tuple(("alias", o[1] + n) if o[0] == "alias" else o for o in outs)
    returns = tuple(i + n for i in returns)
    launches, aligned = [], set()
    for s in lst.specs:
        if s.scratch or s.num_ctas != 1:
            return None
        types = _types(s)
        full = list(s.args) + list(s.kwargs)
        if len(types) != len(full):
            return None
        slots = {pos: (i, off) for pos, i, off in s.slots}
        params = []
        try:
            for pos, (ty, x) in enumerate(zip(types, full)):
                if ty == "constexpr":
                    continue
                if pos in slots:
                    if not ty.startswith("*"):
                        return None
                    i, off = slots[pos]
                    if i < 0 and ws_source is not None:
                        i = ws_source
                    i = i + n if i >= 0 else -1
                    params.append((8, i, off))
                    aligned.add(i)
                else:
                    if isinstance(x, torch.Tensor):   # a kept buffer
                        x = x.data_ptr()
                    params.append((len(pack(ty, x)), pack(ty, x)))
        except (ValueError, struct.error, TypeError):
            return None
        params += [(8, struct.pack("<Q", 0))] * 2   # the global and profile scratch: none
        launches.append((s.function, s.grid, s.block, s.shared, s.pdl, s.coop,
                         tuple(params)))
    try:
        plan = mod.make_plan(tuple(spec_args), tuple(outs), workspace, tuple(sorted(aligned)),
                             tuple(returns), tuple(launches), lst.dev if lst.fast else -1)
    except (ValueError, TypeError, OverflowError):
        return None
    if mod.STUB:
        return _StubPlan(plan, lst, n, ws_source)
    return plan


class _StubPlan:
    """A stub build's plan: :func:`run` notes the launches in C++ and then runs the
    recorded list's interpreter launches on the sources the C++ side allocated."""

    def __init__(self, plan, lst, n_opts, ws_source=None):
        self.plan, self.lst, self.n_opts, self.ws_source = plan, lst, n_opts, ws_source


def run(plan, *args):
    """``plan``'s outputs for this call (``args``: ``*opts, *given`` as for
    :func:`make_plan`), or None (nothing launched). A CUDA build's plan is best called as
    ``module.run(plan, ...)`` directly (:func:`runner`), without this wrapper."""
    if type(plan) is not _StubPlan:
        return _MOD.run(plan, *args)
    res = _MOD.run(plan.plan, *args)
    if res is not None:
        _, srcs, ws = _MOD.stub_last(plan.plan)
        if plan.ws_source is not None:
            ws = srcs[plan.n_opts + plan.ws_source]
        plan.lst.run(srcs[plan.n_opts:], ws.view(torch.float32) if ws is not None else None)
    return res


def runner(plan):
    """The function to call ``plan`` with: ``runner(plan)(plan, *args)`` as :func:`run`; for
    a CUDA build the extension's own ``run`` (no Python frame in between)."""
    return run if type(plan) is _StubPlan else _MOD.run


def stub_last(plan):
    """A stub plan's last run: ``(notes, sources, workspace)``; ``notes`` per launch a dict
    (``function``, ``grid``, ``block``, ``shared``, ``pdl``, ``coop``, ``params``: each
    parameter's bytes)."""
    return _MOD.stub_last(plan.plan if type(plan) is _StubPlan else plan)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Build (or find cached) and load the fastcall "
                                             "extension; say what it found or lacks.")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the compile command")
    ns = ap.parse_args(argv)
    print(f"mode: {_mode()}; compiler: {_compiler() or 'NONE (set CXX or install g++)'}; "
          f"cache: {_cache_dir()}")
    if _mode() == "cuda":
        print(f"CUDA headers: {_cuda_includes() or 'NONE (set CUDA_HOME)'}")
    print(f"ninja: not needed; C++ standard: {_std()}")
    import time
    t0 = time.perf_counter()
    mod = load(verbose=ns.verbose)
    dt = time.perf_counter() - t0
    if mod is None:
        print(f"UNAVAILABLE: {_REASON}")
        return 1
    print(f"loaded {mod.__file__} ({'stub' if mod.STUB else 'cuda'}) in {dt:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
