"""Reading a solution: flashinfer-bench's solution JSON or the contest starter kit's folder,
checked, into a :class:`SolutionSource` (nothing imported, built or run).

- a solution JSON (flashinfer-bench's ``Solution``: ``name, definition, author, spec
  {language, target_hardware, entry_point "<file>::<symbol>", destination_passing_style,
  binding}, sources [{path, content}]``);
- a contest starter-kit folder: ``config.toml`` (``[solution] name, definition, author``;
  ``[build] language, entry_point`` and optionally ``destination_passing_style``,
  ``binding``) plus the sources: the files of ``solution/<language>/`` (not its
  sub-folders), as the starter kit packs them.

:func:`read_solution` is the one reader (notebooks, Nsight Compute targets, ``make
contest-eval``); a solution read in one process reaches its worker as
:meth:`SolutionSource.as_dict` (:meth:`SolutionSource.from_dict`), not read again.
Malformed input is a :class:`SolutionError` naming the file and the field.
"""
from __future__ import annotations

import ast
import copy
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Optional, Tuple

from .definitions import OPS

try:
    import tomllib
except ImportError:  # Python 3.10: starter-kit folders need 3.11+
    tomllib = None

__all__ = ["SOLUTION_PREFIX", "PY_LANGUAGES", "CUDA_LANGUAGES", "LANGUAGES", "BINDINGS",
           "SOURCE_SUFFIXES", "DEF_RE", "SolutionError", "SolutionSource", "read_solution"]

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
DEF_RE = re.compile(r"^gdn_(decode|prefill)_qk(\d+)_v(\d+)_d(\d+)_k_last$")
# a CUDA source that launches on the caller's stream (torch's, or TVM-FFI's env stream,
# which tvm-ffi sets from torch's current stream) can be captured into a CUDA graph
_STREAM_API_RE = re.compile(r"getCurrentCUDAStream|TVMFFIEnvGetStream|getCurrentStream")


class SolutionError(ValueError):
    """A solution that cannot be loaded; the message names the file and the field."""


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
        m = DEF_RE.match(self.definition)
        return int(m.group(2)), int(m.group(3)), int(m.group(4))

    def err(self, what: str, key: str) -> SolutionError:
        return SolutionError(f"{self.origin}: field {self.fields.get(key, key)!r}: {what}")

    def as_dict(self) -> dict:
        """The fields as JSON-able values (what a solution's worker receives)."""
        d = asdict(self)
        d["root"] = None if self.root is None else str(self.root)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SolutionSource":
        """The inverse of :meth:`as_dict` (already checked: nothing is read again)."""
        return cls(**dict(d, root=None if d["root"] is None else Path(d["root"])))

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
    m = DEF_RE.match(defn)
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
