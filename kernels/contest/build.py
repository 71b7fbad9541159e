"""Building a solution read by :mod:`.formats` into its entry function: one builder per
language and binding.

- ``python``, ``triton``: :func:`build_python` imports the entry module as a package from the
  solution's own folder (a JSON's sources are written to :func:`cache_dir` first), so
  relative imports between its files work; scoped (:mod:`.scope`) unless told otherwise;
- ``cuda`` / ``cpp`` with binding ``tvm-ffi`` (the default, as in flashinfer-bench):
  :func:`build_tvm_ffi`, sources exporting the entry with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC``
  built with ``tvm_ffi.cpp.build``;
- ``cuda`` / ``cpp`` with binding ``torch``: :func:`build_torch`, a
  ``torch.utils.cpp_extension`` module exporting the entry;
- any other language flashinfer-bench knows (``tilelang``): refused, flashinfer-bench builds
  those itself (``make contest-eval``).

CUDA builds target the GPU at hand (``TVM_FFI_CUDA_ARCH_LIST`` / ``TORCH_CUDA_ARCH_LIST``),
are cached under :func:`cache_dir` by a hash of the sources, the binding, torch's version and
the GPU's compute capability, and report their time (:class:`Built`).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from .formats import CUDA_LANGUAGES, PY_LANGUAGES, SolutionError, SolutionSource
from .scope import Scope, apply_settings, torch_settings

__all__ = ["Built", "build", "build_python", "build_tvm_ffi", "build_torch", "cache_dir"]

_CUDA_SUFFIXES = (".cu",)
_CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")


def cache_dir() -> Path:
    """Where JSON sources are unpacked and CUDA solutions built:
    ``$XDG_CACHE_HOME/gdn-kernel-suite/solutions`` (``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gdn-kernel-suite" / "solutions"


@dataclass(frozen=True)
class Built:
    """What a builder returns: the entry ``fn``; for CUDA builds ``build_s`` and whether the
    cache held the build (``cached``); for a scoped Python import its :class:`Scope`."""

    fn: Callable
    build_s: Optional[float] = None
    cached: Optional[bool] = None
    scope: Optional[Scope] = None


def _hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


def _write_sources(src: SolutionSource, folder: Path) -> Path:
    for rel, content in src.sources.items():
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.is_file() or dest.read_text() != content:
            dest.write_text(content)
    return folder


def _source_root(src: SolutionSource, key: str) -> Path:
    """The folder holding the sources: the starter kit's own, or the JSON's unpacked."""
    if src.root is not None:
        return src.root
    return _write_sources(src, cache_dir() / f"src-{key[:16]}")


def build_python(src: SolutionSource, key: str, scoped: bool = True) -> Built:
    """Import the entry module as package ``gdn_solution_<key>``; scoped: its modules and
    torch settings leave the process again (:class:`Scope` restores them per call)."""
    import torch  # noqa: F401  (imported before the snapshot: not the solution's doing)

    root = _source_root(src, key)
    pkg = f"gdn_solution_{key[:12]}"
    mod_name = pkg + "." + ".".join(Path(src.entry_file).with_suffix("").parts)
    before_modules = set(sys.modules)
    before_path = list(sys.path)
    before_settings = torch_settings()
    try:
        init = root / "__init__.py"
        if init.is_file():
            spec = importlib.util.spec_from_file_location(
                pkg, init, submodule_search_locations=[str(root)])
        else:   # no __init__.py: a bare package on that folder
            spec = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
            spec.submodule_search_locations = [str(root)]
        package = importlib.util.module_from_spec(spec)
        sys.modules[pkg] = package
        if spec.loader is not None:
            spec.loader.exec_module(package)
        module = importlib.import_module(mod_name)
        fn = getattr(module, src.entry_symbol, None)
        if not callable(fn):
            raise src.err(f"{src.entry_file} defines no function {src.entry_symbol!r}",
                          "entry")
        settings = torch_settings()
    except SolutionError:
        scoped = True
        raise
    except Exception as e:
        scoped = True
        raise SolutionError(f"{src.origin}: importing {src.entry_file} failed: "
                            f"{type(e).__name__}: {e}") from e
    finally:
        if scoped:
            mine = {k: sys.modules.pop(k) for k in list(sys.modules)
                    if k not in before_modules and (k == pkg or k.startswith(pkg + "."))}
            sys.path[:] = before_path
            apply_settings(before_settings)
    return Built(fn, scope=Scope(pkg, mine, settings) if scoped else None)


def _gpu_arch() -> Tuple[int, int]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("building a CUDA solution needs a CUDA GPU (torch sees none)")
    return tuple(torch.cuda.get_device_capability())


@dataclass
class _Env:
    """Set environment variables for a block (the arch of the GPU at hand for a build)."""

    values: Dict[str, str]

    def __enter__(self):
        self._old = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self._old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return False


def _tail(text: str, n: int = 1500) -> str:
    text = str(text).strip()
    return text if len(text) <= n else "..." + text[-n:]


def build_tvm_ffi(src: SolutionSource, key: str) -> Built:
    """Build (or take from the cache) and load the TVM-FFI module of a CUDA/C++ solution."""
    try:
        import tvm_ffi
        import tvm_ffi.cpp
    except ImportError as e:
        raise RuntimeError(f"{src.origin}: binding tvm-ffi needs apache-tvm-ffi "
                           f"(not importable: {e})") from e
    major, minor = _gpu_arch()
    build = cache_dir() / f"tvm-ffi-{key[:16]}"
    srcdir = _write_sources(src, build / "src")
    name = f"gdn_solution_{key[:12]}"
    files = [srcdir / p for p in src.sources]
    lib = build / f"{name}.so"
    cached = lib.is_file()
    t0 = time.perf_counter()
    if not cached:
        try:
            with _Env({"TVM_FFI_CUDA_ARCH_LIST": f"{major}.{minor}"}):
                out = tvm_ffi.cpp.build(
                    name=name, cpp_files=[str(f) for f in files if f.suffix in _CPP_SUFFIXES],
                    cuda_files=[str(f) for f in files if f.suffix in _CUDA_SUFFIXES],
                    extra_include_paths=[str(srcdir)], extra_ldflags=["-lcuda"],
                    build_directory=str(build))
        except Exception as e:
            raise SolutionError(f"{src.origin}: build failed (tvm-ffi, sm_{major}{minor}): "
                                f"{type(e).__name__}: {_tail(e)}") from e
        if Path(out) != lib:
            Path(out).replace(lib)
    build_s = time.perf_counter() - t0
    try:
        mod = tvm_ffi.load_module(str(lib))
        fn = getattr(mod, src.entry_symbol)
    except AttributeError as e:
        raise src.err(f"the built module exports no function {src.entry_symbol!r} "
                      "(TVM_FFI_DLL_EXPORT_TYPED_FUNC)", "entry") from e
    except Exception as e:
        raise SolutionError(f"{src.origin}: loading the built module failed: "
                            f"{type(e).__name__}: {_tail(e)}") from e
    return Built(fn, build_s, cached)


def build_torch(src: SolutionSource, key: str) -> Built:
    """Build (or take from the cache) and import the ``cpp_extension`` module of a solution."""
    from torch.utils import cpp_extension

    major, minor = _gpu_arch()
    build = cache_dir() / f"torch-{key[:16]}"
    srcdir = _write_sources(src, build / "src")
    name = f"gdn_solution_{key[:12]}"
    files = [str(srcdir / p) for p in src.sources if Path(p).suffix in _CUDA_SUFFIXES
             + _CPP_SUFFIXES]
    cached = any(build.glob(f"{name}*.so"))
    before = set(sys.modules)
    t0 = time.perf_counter()
    try:
        with _Env({"TORCH_CUDA_ARCH_LIST": f"{major}.{minor}"}):
            ext = cpp_extension.load(name=name, sources=files, build_directory=str(build),
                                     extra_include_paths=[str(srcdir)],
                                     with_cuda=src.language == "cuda", verbose=False)
    except Exception as e:
        raise SolutionError(f"{src.origin}: build failed (torch cpp_extension, "
                            f"sm_{major}{minor}): {type(e).__name__}: {_tail(e)}") from e
    finally:
        for k in set(sys.modules) - before:
            if k == name or k.startswith(name + "."):
                sys.modules.pop(k, None)
    build_s = time.perf_counter() - t0
    fn = getattr(ext, src.entry_symbol, None)
    if fn is None:
        raise src.err(f"the built extension exports no function {src.entry_symbol!r}", "entry")
    return Built(fn, build_s, cached)


def build(src: SolutionSource, scoped: bool = True) -> Built:
    """The builder of ``src``'s language and binding (module docstring). Raises
    :class:`SolutionError` (refused language, import or build failure, missing entry) or
    ``RuntimeError`` (this host cannot build it: no GPU, no tvm-ffi)."""
    if src.language not in PY_LANGUAGES + CUDA_LANGUAGES:
        raise src.err(f"language {src.language!r} is not supported here (python, triton, "
                      "cuda, cpp); flashinfer-bench builds it (make contest-eval)", "language")
    import torch

    key = _hash(src.name, src.language, src.binding, src.entry_file, src.entry_symbol,
                sorted(src.sources.items()), torch.__version__,
                _gpu_arch() if src.language in CUDA_LANGUAGES else None)
    if src.language in PY_LANGUAGES:
        return build_python(src, key, scoped)
    return (build_torch if src.binding == "torch" else build_tvm_ffi)(src, key)
