"""Any flashinfer-bench solution as an implementation in our calling convention.

:func:`load_solution` takes

- a solution JSON (flashinfer-bench's ``Solution``: ``name, definition, author, spec
  {language, target_hardware, entry_point "<file>::<symbol>", destination_passing_style,
  binding}, sources [{path, content}]``);
- a contest starter-kit folder: ``config.toml`` (``[solution] name, definition, author``;
  ``[build] language, entry_point`` and optionally ``destination_passing_style``,
  ``binding``) plus the sources: the files of ``solution/<language>/`` (not its
  sub-folders), as the starter kit packs them;
- ``module:function``: a Python callable already importable, with the definition's
  argument names (its op from ``op=`` or from whether it takes ``cu_seqlens``);

and returns a :class:`SolutionImpl`, called like ours::

    fn(q, k, v, state, A_log, a, dt_bias, b, [cu_seqlens,] scale=None) -> (output, new_state)

Languages: ``python`` and ``triton`` (the entry module imported as a package from the
solution's own folder; a JSON's sources are written to a cache folder first), ``cuda`` /
``cpp`` with ``binding`` ``tvm-ffi`` (the default, as in flashinfer-bench: sources that
export the entry with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC``, built with ``tvm_ffi.cpp.build``)
or ``torch`` (a ``torch.utils.cpp_extension`` module exporting the entry). CUDA builds
target the GPU at hand, are cached under :func:`cache_dir` by a hash of the sources, the
binding, torch/tvm-ffi versions and the GPU's compute capability, and report their time
(``build_s``, ``cached``).

Argument mapping: the contest's GDN definitions (:mod:`.definitions`) use our names, dtypes
and k-last state layout, in our order, so inputs pass through by position; ``scale`` None
or 0 becomes ``1/sqrt(D)`` (a float, as the contest passes it); a ``state`` of None (zero
initial state, allowed by our prefill) becomes a zero tensor. Destination-passing style
(``spec.destination_passing_style`` / ``[build] destination_passing_style``; absent, the
entry's signature decides: inputs + 2 parameters, or a parameter named ``output``):
the wrapper allocates ``output``/``new_state`` from the definition's output shapes and
dtypes and passes them last. Inputs are checked against the definition's shapes and
dtypes (a ``ValueError`` naming the argument) before the solution runs.

Hygiene (``scoped=True``, the default): after loading, neither the solution's modules nor
its changes to torch's global settings (:data:`TORCH_SETTINGS`, e.g.
``torch.set_float32_matmul_precision("high")`` at import) remain in this process; each call
puts them back for its duration (a few µs of host time) so the solution computes as it
would in flashinfer-bench. Third-party libraries it imports for the first time stay
loaded, like any library. ``scoped=False`` (the solution worker, whose process belongs to
the solution) leaves everything in place, as flashinfer-bench does.
"""
from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from .definitions import OPS

try:
    import tomllib
except ImportError:  # Python 3.10: starter-kit folders need 3.11+
    tomllib = None

__all__ = ["SOLUTION_PREFIX", "SolutionError", "SolutionSource", "SolutionImpl", "read_solution",
           "load_solution", "cache_dir", "TORCH_SETTINGS", "torch_settings"]

SOLUTION_PREFIX = "solution:"
PY_LANGUAGES = ("python", "triton")
CUDA_LANGUAGES = ("cuda", "cpp")
#: flashinfer-bench's languages (``tilelang``: it builds those itself; this loader does not)
LANGUAGES = PY_LANGUAGES + CUDA_LANGUAGES + ("tilelang",)
BINDINGS = ("tvm-ffi", "torch")
#: a starter-kit folder's sources: the files of ``solution/<language>/`` itself (not its
#: sub-folders) with these suffixes, as the starter kit packs them
#: (flashinfer-bench's ``pack_solution_from_files``)
SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".c", ".h", ".hpp")
_CUDA_SUFFIXES = (".cu",)
_CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")
_DEF_RE = re.compile(r"^gdn_(decode|prefill)_qk(\d+)_v(\d+)_d(\d+)_k_last$")
_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# a CUDA source that launches on the caller's stream (torch's, or TVM-FFI's env stream,
# which tvm-ffi sets from torch's current stream) can be captured into a CUDA graph
_STREAM_API_RE = re.compile(r"getCurrentCUDAStream|TVMFFIEnvGetStream|getCurrentStream")


class SolutionError(ValueError):
    """A solution that cannot be loaded; the message names the file and the field."""


def cache_dir() -> Path:
    """Where JSON sources are unpacked and CUDA solutions built:
    ``$XDG_CACHE_HOME/gdn-kernel-suite/solutions`` (``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gdn-kernel-suite" / "solutions"


# --------------------------------------------------------------------------- torch settings

def _tf32(attr_owner: Callable, attr: str):
    return (lambda: getattr(attr_owner(), attr),
            lambda v: setattr(attr_owner(), attr, v))


def _settings_table():
    import torch

    matmul = lambda: torch.backends.cuda.matmul  # noqa: E731
    cudnn = lambda: torch.backends.cudnn  # noqa: E731
    return (
        ("float32_matmul_precision", torch.get_float32_matmul_precision,
         torch.set_float32_matmul_precision),
        ("cuda.matmul.allow_tf32", *_tf32(matmul, "allow_tf32")),
        ("cuda.matmul.allow_fp16_reduced_precision_reduction",
         *_tf32(matmul, "allow_fp16_reduced_precision_reduction")),
        ("cuda.matmul.allow_bf16_reduced_precision_reduction",
         *_tf32(matmul, "allow_bf16_reduced_precision_reduction")),
        ("cudnn.allow_tf32", *_tf32(cudnn, "allow_tf32")),
        ("cudnn.benchmark", *_tf32(cudnn, "benchmark")),
        ("cudnn.deterministic", *_tf32(cudnn, "deterministic")),
        ("default_dtype", torch.get_default_dtype, torch.set_default_dtype),
        ("grad_enabled", torch.is_grad_enabled, torch.set_grad_enabled),
        ("deterministic_algorithms", torch.are_deterministic_algorithms_enabled,
         torch.use_deterministic_algorithms),
        ("num_threads", torch.get_num_threads, torch.set_num_threads),
    )


#: Names of the process-wide torch settings a load restores (see the module docstring).
TORCH_SETTINGS = ("float32_matmul_precision", "cuda.matmul.allow_tf32",
                  "cuda.matmul.allow_fp16_reduced_precision_reduction",
                  "cuda.matmul.allow_bf16_reduced_precision_reduction", "cudnn.allow_tf32",
                  "cudnn.benchmark", "cudnn.deterministic", "default_dtype", "grad_enabled",
                  "deterministic_algorithms", "num_threads")


def torch_settings() -> Dict[str, object]:
    """The current values of :data:`TORCH_SETTINGS`."""
    return {name: get() for name, get, _ in _settings_table()}


def _apply_settings(values: Dict[str, object]) -> None:
    for name, get, put in _settings_table():
        if name in values and get() != values[name]:
            put(values[name])


# --------------------------------------------------------------------------- reading

@dataclass
class SolutionSource:
    """A solution read (not yet imported or built): what :func:`read_solution` returns."""

    origin: str                    # the file or folder it came from (for messages)
    name: str
    definition: str
    author: str
    op: str
    language: str
    entry_file: str                # relative to the source root
    entry_symbol: str
    dps: Optional[bool]            # None: decided from the entry's signature
    binding: Optional[str]
    sources: Dict[str, str]        # relative path -> content
    root: Optional[Path] = None    # folder whose files are the sources (starter kit)
    fields: Dict[str, str] = field(default_factory=dict)  # our field -> its name in origin
    packed: Optional[dict] = None  # flashinfer-bench's Solution dict (see fib_solution)

    @property
    def graph_capturable(self) -> bool:
        """Python/Triton launch on torch's current stream; a CUDA solution only if its
        sources take the caller's stream (otherwise it launches on the default stream,
        which CUDA graph capture refuses)."""
        if self.language in PY_LANGUAGES:
            return True
        return any(_STREAM_API_RE.search(c) for c in self.sources.values())

    @property
    def shape(self) -> Tuple[int, int, int]:
        """``(num_q_heads, num_v_heads, head_dim)`` of its definition's name."""
        m = _DEF_RE.match(self.definition)
        return int(m.group(2)), int(m.group(3)), int(m.group(4))

    def err(self, what: str, key: str) -> SolutionError:
        return SolutionError(f"{self.origin}: field {self.fields.get(key, key)!r}: {what}")

    def fib_solution(self) -> dict:
        """The solution in flashinfer-bench's format (a copy), for its trace set: a JSON as
        read; a starter-kit folder packed as the starter kit packs it (its sources, entry
        ``<file>::<function>``, ``destination_passing_style`` true unless config.toml says
        otherwise, ``binding`` if given)."""
        return copy.deepcopy(self.packed)


def _need(d, key: str, origin: str, where: str, typ=str):
    if not isinstance(d, dict) or key not in d:
        raise SolutionError(f"{origin}: missing field {where + key!r}")
    v = d[key]
    if not isinstance(v, typ) or (typ is str and not v.strip()):
        raise SolutionError(f"{origin}: field {where + key!r} must be a non-empty "
                            f"{typ.__name__}, got {v!r}")
    return v


def _op_of(defn: str, origin: str, field_name: str, op: Optional[str]) -> str:
    m = _DEF_RE.match(defn)
    if not m:
        raise SolutionError(f"{origin}: field {field_name!r} is {defn!r}, not a GDN definition "
                            "(gdn_decode|prefill_qk<HQ>_v<HV>_d<D>_k_last)")
    if op is not None and m.group(1) != op:
        raise SolutionError(f"{origin}: field {field_name!r} is {defn!r}, a {m.group(1)} "
                            f"definition; a {op} implementation is needed here")
    return m.group(1)


def _split_entry(entry: str, origin: str, field_name: str) -> Tuple[str, str]:
    if entry.count("::") != 1 or not all(entry.split("::")):
        raise SolutionError(f"{origin}: field {field_name!r} is {entry!r}; expected "
                            "'<file>::<function>'")
    f, sym = entry.split("::")
    return f, sym


def _check_rel(path: str, origin: str) -> None:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts or not path:
        raise SolutionError(f"{origin}: field 'sources[].path' {path!r} must be relative, "
                            "without '..'")


def _read_json(path: Path, op: Optional[str]) -> SolutionSource:
    origin = str(path)
    try:
        sol = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise SolutionError(f"{origin}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise SolutionError(f"{origin}: not valid JSON: {e}") from e
    if not isinstance(sol, dict):
        raise SolutionError(f"{origin}: a solution JSON is an object, got {type(sol).__name__}")
    name = _need(sol, "name", origin, "")
    defn = _need(sol, "definition", origin, "")
    author = _need(sol, "author", origin, "")
    spec = _need(sol, "spec", origin, "", dict)
    language = _need(spec, "language", origin, "spec.").lower()
    entry = _need(spec, "entry_point", origin, "spec.")
    srcs = _need(sol, "sources", origin, "", list)
    sources = {}
    for i, s in enumerate(srcs):
        p = _need(s, "path", origin, f"sources[{i}].")
        c = s.get("content") if isinstance(s, dict) else None
        if not isinstance(c, str):
            raise SolutionError(f"{origin}: field 'sources[{i}].content' must be a string")
        _check_rel(p, origin)
        if p in sources:
            raise SolutionError(f"{origin}: field 'sources': duplicate path {p!r}")
        sources[p] = c
    dps = spec.get("destination_passing_style")
    if dps is not None and not isinstance(dps, bool):
        raise SolutionError(f"{origin}: field 'spec.destination_passing_style' must be true "
                            f"or false, got {dps!r}")
    entry_file, symbol = _split_entry(entry, origin, "spec.entry_point")
    src = SolutionSource(origin, name, defn, author, _op_of(defn, origin, "definition", op),
                         language, entry_file, symbol, dps, spec.get("binding"), sources,
                         fields=dict(entry="spec.entry_point", language="spec.language",
                                     dps="spec.destination_passing_style",
                                     binding="spec.binding"), packed=sol)
    return _validate(src)


def _read_folder(path: Path, op: Optional[str]) -> SolutionSource:
    cfg_path = path / "config.toml"
    origin = str(cfg_path)
    if not cfg_path.is_file():
        inner = sorted(p.parent.name for p in path.glob("*/config.toml"))
        raise SolutionError(f"{path}: no config.toml (a starter-kit folder holds config.toml "
                            "and solution/<language>/)"
                            + (f"; its sub-folders {inner} have one: pass those" if inner else ""))
    if tomllib is None:
        raise SolutionError(f"{origin}: reading config.toml needs Python 3.11+ (tomllib)")
    try:
        cfg = tomllib.loads(cfg_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SolutionError(f"{origin}: not valid TOML: {e}") from e
    sol = _need(cfg, "solution", origin, "", dict)
    build = _need(cfg, "build", origin, "", dict)
    name = _need(sol, "name", origin, "solution.")
    defn = _need(sol, "definition", origin, "solution.")
    author = _need(sol, "author", origin, "solution.")
    language = _need(build, "language", origin, "build.").lower()
    entry = _need(build, "entry_point", origin, "build.")
    root = path / "solution" / language
    if not root.is_dir():
        raise SolutionError(f"{origin}: field 'build.language' is {language!r} but {root} is "
                            "not a folder")
    sources = {p.name: p.read_text() for p in sorted(root.iterdir())
               if p.is_file() and p.suffix.lower() in SOURCE_SUFFIXES}
    if not sources:
        raise SolutionError(f"{root}: no source files ({', '.join(SOURCE_SUFFIXES)})")
    if "::" in entry:
        entry_file, symbol = _split_entry(entry, origin, "build.entry_point")
    else:  # the starter kit's bare function name: the one Python file defining it
        symbol = entry
        found = [p for p, c in sources.items() if p.endswith(".py") and _defines(c, symbol)]
        if len(found) != 1:
            raise SolutionError(f"{origin}: field 'build.entry_point' is {entry!r}: "
                                f"{'no' if not found else len(found)} Python file(s) under "
                                f"{root} define it; write '<file>::{entry}'")
        entry_file = found[0]
    dps = build.get("destination_passing_style")
    if dps is not None and not isinstance(dps, bool):
        raise SolutionError(f"{origin}: field 'build.destination_passing_style' must be true "
                            f"or false, got {dps!r}")
    spec = {"language": language, "target_hardware": ["cuda"],
            "entry_point": f"{entry_file}::{symbol}", "dependencies": [],
            "destination_passing_style": True if dps is None else dps}
    if "binding" in build:
        spec["binding"] = build["binding"]
    packed = {"name": name, "definition": defn, "author": author,
              "description": f"starter-kit folder {path}", "spec": spec,
              "sources": [{"path": p, "content": c} for p, c in sources.items()]}
    src = SolutionSource(origin, name, defn, author,
                         _op_of(defn, origin, "solution.definition", op), language, entry_file,
                         symbol, dps, build.get("binding"), sources, root=root,
                         fields=dict(definition="solution.definition", entry="build.entry_point",
                                     language="build.language",
                                     dps="build.destination_passing_style",
                                     binding="build.binding"), packed=packed)
    return _validate(src)


def _defines(text: str, symbol: str) -> bool:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == symbol
               for n in tree.body)


def _validate(src: SolutionSource) -> SolutionSource:
    if src.language not in LANGUAGES:
        raise src.err(f"language {src.language!r} is not one of flashinfer-bench's "
                      f"({', '.join(LANGUAGES)})", "language")
    if src.entry_file not in src.sources:
        raise src.err(f"entry file {src.entry_file!r} is not among the sources "
                      f"({', '.join(sorted(src.sources))})", "entry")
    if src.language in PY_LANGUAGES and not src.entry_file.endswith(".py"):
        raise src.err(f"a {src.language} entry point must be a .py file, got "
                      f"{src.entry_file!r}", "entry")
    if src.language in CUDA_LANGUAGES:
        src.binding = (src.binding or "tvm-ffi").lower()
        if src.binding not in BINDINGS:
            raise src.err(f"binding {src.binding!r} is not one of {', '.join(BINDINGS)}",
                          "binding")
    return src


def read_solution(path, op: Optional[str] = None) -> SolutionSource:
    """Read and check a solution JSON or starter-kit folder without running any of it: the
    one reader of solutions (notebooks, Nsight Compute targets, ``make contest-eval``).
    ``op`` (``"decode"``/``"prefill"``): refuse a definition of the other op."""
    if op is not None and op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    text = str(path)
    if text.startswith(SOLUTION_PREFIX):
        text = text[len(SOLUTION_PREFIX):]
    p = Path(text).expanduser()
    if p.is_dir():
        return _read_folder(p.resolve(), op)
    if p.is_file():
        return _read_json(p.resolve(), op)
    raise SolutionError(f"{text}: no such solution JSON or starter-kit folder")


# --------------------------------------------------------------------------- the callable

@functools.lru_cache(maxsize=16)
def _definition(op: str, hq: int, hv: int, d: int) -> dict:
    from ..spec import GDNShape
    from .definitions import definition

    return definition(op, GDNShape(hq, hv, d))


class SolutionImpl:
    """A loaded solution, called in our convention (see the module docstring).

    Attributes: ``name``, ``language``, ``definition`` (its name), ``op``, ``dps``
    (destination-passing), ``graph_capturable``, ``binding`` (CUDA), ``build_s`` and
    ``cached`` (CUDA builds), ``origin`` (file, folder or ``module:function``).
    """

    def __init__(self, entry: Callable, *, name: str, language: str, definition: Optional[str],
                 op: str, dps: bool, graph_capturable: bool, origin: str,
                 binding: Optional[str] = None, build_s: Optional[float] = None,
                 cached: Optional[bool] = None, scope: Optional["_Scope"] = None):
        self.entry = entry
        self.name, self.language, self.definition, self.op = name, language, definition, op
        self.dps, self.graph_capturable, self.origin = dps, graph_capturable, origin
        self.binding, self.build_s, self.cached = binding, build_s, cached
        self._scope = scope
        m = _DEF_RE.match(definition or "")
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


class _Scope:
    """The solution's modules and torch settings, installed for the length of a call."""

    def __init__(self, prefix: str, modules: Dict[str, object], settings: Dict[str, object]):
        self.prefix, self.modules, self.settings = prefix, modules, settings
        self._saved: List[Tuple[Dict[str, object], int]] = []

    def __enter__(self):
        self._saved.append((torch_settings(), len(sys.modules)))
        sys.modules.update(self.modules)
        _apply_settings(self.settings)

    def __exit__(self, *exc):
        ours, n_before = self._saved.pop()
        self.settings = torch_settings()
        if len(sys.modules) != n_before + len(self.modules):   # it imported more of itself
            self.modules.update({k: m for k, m in sys.modules.items()
                                 if k == self.prefix or k.startswith(self.prefix + ".")})
        for k in self.modules:
            sys.modules.pop(k, None)
        _apply_settings(ours)
        return False


# --------------------------------------------------------------------------- loading

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


def _signature_dps(fn, src: SolutionSource, n_in: int, n_out: int) -> bool:
    """Destination-passing when the entry names an ``output`` parameter or requires the
    inputs and the outputs; value-returning when it takes exactly the inputs."""
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


def _import_python(src: SolutionSource, key: str, scoped: bool):
    """Import the entry module as package ``gdn_solution_<key>``; ``(fn, scope)``."""
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
            _apply_settings(before_settings)
    return fn, (_Scope(pkg, mine, settings) if scoped else None)


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


def _build_tvm_ffi(src: SolutionSource, key: str):
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
    return fn, build_s, cached


def _build_torch(src: SolutionSource, key: str):
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
    return fn, build_s, cached


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
    n_in, n_out = (len(_definition(op, 4, 8, 128)[k]) for k in ("inputs", "outputs"))
    src = SolutionSource(spec, spec, "", "", op, "python", "", fn_name, None, None, {},
                         fields=dict(dps="destination_passing_style"))
    return SolutionImpl(fn, name=spec, language="python", definition=None, op=op,
                        dps=_signature_dps(fn, src, n_in, n_out), graph_capturable=True,
                        origin=spec)


def load_solution(path, op: Optional[str] = None, *, scoped: bool = True) -> SolutionImpl:
    """A solution JSON, starter-kit folder or ``module:function`` (``solution:`` prefix
    allowed) as a :class:`SolutionImpl` in our calling convention.

    ``op``: refuse a definition of the other op. ``scoped``: see the module docstring.
    Raises :class:`SolutionError` naming the file and field (malformed JSON/folder, wrong
    definition, missing entry point, build failure); ``RuntimeError`` when this host cannot
    build it (no GPU, no tvm-ffi).
    """
    text = str(path)
    if text.startswith(SOLUTION_PREFIX):
        text = text[len(SOLUTION_PREFIX):]
    if not Path(text).expanduser().exists() and _CALLABLE_RE.match(text):
        return _load_callable(text, op)
    src = read_solution(text, op)
    if src.language not in PY_LANGUAGES + CUDA_LANGUAGES:
        raise src.err(f"language {src.language!r} is not supported here (python, triton, "
                      "cuda, cpp); flashinfer-bench builds it (make contest-eval)", "language")
    n_in, n_out = (len(_definition(src.op, 4, 8, 128)[k]) for k in ("inputs", "outputs"))
    import torch

    key = _hash(src.name, src.language, src.binding, src.entry_file, src.entry_symbol,
                sorted(src.sources.items()), torch.__version__,
                _gpu_arch() if src.language in CUDA_LANGUAGES else None)
    build_s = cached = scope = None
    if src.language in PY_LANGUAGES:
        fn, scope = _import_python(src, key, scoped)
    elif src.binding == "torch":
        fn, build_s, cached = _build_torch(src, key)
    else:
        fn, build_s, cached = _build_tvm_ffi(src, key)
    dps = src.dps if src.dps is not None else _signature_dps(fn, src, n_in, n_out)
    return SolutionImpl(fn, name=src.name, language=src.language, definition=src.definition,
                        op=src.op, dps=dps, graph_capturable=src.graph_capturable,
                        origin=src.origin, binding=src.binding if src.language in
                        CUDA_LANGUAGES else None, build_s=build_s, cached=cached, scope=scope)
