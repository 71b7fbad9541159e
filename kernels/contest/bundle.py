"""Bundle modules of the ``kernels`` package into self-contained source.

Two forms, both generated from the package's own files (nothing is copied by
hand, so a packed solution always carries the kernels of this commit):

- :func:`bundle_package` — the modules a set of roots needs (followed through
  every intra-package import, function-level ones included), laid out as the
  sub-package ``<prefix>/`` with their relative imports intact; absolute
  ``kernels.`` imports are rewritten to relative ones. Data files a module reads
  beside itself (the decode dispatch tables) are added by the caller.
- :func:`flatten_modules` — modules concatenated into one file, their
  intra-package imports dropped (a flashinfer-bench definition's reference is a
  single ``main.py``). Refused when two modules define the same top-level name.

:func:`check_imports` is the guard against the seed's evaluation-server
``COMPILE_ERROR`` (its packed code imported a package the server lacked): the
bundled code may import only the standard library, ``torch`` and ``triton``
(and ``numpy`` inside :mod:`kernels.interpret`, whose patches run only under the
Triton CPU interpreter, which itself requires numpy).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

__all__ = ["PACKAGE", "PACKAGE_DIR", "module_file", "module_closure", "bundle_package",
           "flatten_modules", "check_imports", "ALLOWED_THIRD_PARTY"]

PACKAGE = "kernels"
PACKAGE_DIR = Path(__file__).resolve().parent.parent
ALLOWED_THIRD_PARTY = ("torch", "triton")
#: third-party imports allowed in one module only: module (relative dotted path) -> roots
MODULE_EXCEPTIONS = {"interpret": ("numpy",)}


def module_file(name: str) -> Path:
    """The file of module ``name`` (``"kernels.decode.ops"``): a ``.py`` file or a
    package's ``__init__.py``. ``ValueError`` if ``name`` is not in the package."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        raise ValueError(f"module {name!r} is not in the {PACKAGE!r} package")
    base = PACKAGE_DIR.joinpath(*parts[1:])
    if base.is_dir() and (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    raise ValueError(f"module {name!r} has no file under {PACKAGE_DIR}")


def _is_module(name: str) -> bool:
    try:
        module_file(name)
        return True
    except ValueError:
        return False


def _is_package(name: str) -> bool:
    return module_file(name).name == "__init__.py"


def _package_of(name: str) -> str:
    """The package relative imports of module ``name`` resolve against."""
    return name if _is_package(name) else name.rsplit(".", 1)[0]


def _resolve_from(node: ast.ImportFrom, name: str) -> Optional[str]:
    """Absolute module an ``ImportFrom`` in module ``name`` imports from, or None when
    it is not an intra-package import."""
    if node.level == 0:
        mod = node.module or ""
        return mod if mod == PACKAGE or mod.startswith(PACKAGE + ".") else None
    base = _package_of(name).split(".")
    if node.level - 1 >= len(base):
        raise ValueError(f"{name}: relative import beyond the {PACKAGE!r} package")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _parents(name: str) -> List[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _intra_imports(name: str) -> List[str]:
    """Modules of the package that importing ``name`` executes (its own imports at any
    depth of the file, the packages above each of them)."""
    tree = ast.parse(module_file(name).read_text(), filename=str(module_file(name)))
    found: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.append(alias.name)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve_from(node, name)
            if target is None:
                continue
            found.append(target)
            for alias in node.names:   # `from . import interpret`: a submodule
                sub = f"{target}.{alias.name}"
                if alias.name != "*" and _is_module(sub):
                    found.append(sub)
    out = []
    for mod in found:
        for m in _parents(mod) + [mod]:
            if m not in out:
                out.append(m)
    return out


def module_closure(roots: Iterable[str]) -> List[str]:
    """``roots`` and every package module importing them executes, sorted by name."""
    todo = [r for root in roots for r in _parents(root) + [root]]
    seen: set = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        module_file(name)
        seen.add(name)
        todo.extend(m for m in _intra_imports(name) if m not in seen)
    return sorted(seen)


def _relative(target: str, name: str) -> str:
    """``target`` (absolute, in the package) as a relative module path seen from ``name``."""
    pkg = _package_of(name).split(".")
    tgt = target.split(".")
    common = 0
    while common < min(len(pkg), len(tgt)) and pkg[common] == tgt[common]:
        common += 1
    return "." * (len(pkg) - common + 1) + ".".join(tgt[common:])


def _rewrite_absolute(source: str, name: str) -> str:
    """``source`` of module ``name`` with absolute ``kernels.`` imports made relative."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: List[Tuple[int, int, str]] = []
    for node in ast.walk(tree):
        new = None
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _resolve_from(node, name):
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            new = f"from {_relative(node.module, name)} import {names}"
        elif isinstance(node, ast.Import) and any(
                a.name == PACKAGE or a.name.startswith(PACKAGE + ".") for a in node.names):
            if len(node.names) != 1 or not node.names[0].asname or "." not in node.names[0].name:
                raise ValueError(f"{name}, line {node.lineno}: write `import kernels.x.y as z` "
                                 "or `from kernels.x import y` so the bundler can rewrite it")
            alias = node.names[0]
            parent, leaf = alias.name.rsplit(".", 1)
            new = f"from {_relative(parent, name)} import {leaf} as {alias.asname}"
        if new is not None:
            indent = lines[node.lineno - 1][:node.col_offset]
            edits.append((node.lineno, node.end_lineno, indent + new + "\n"))
    for start, end, text in sorted(edits, reverse=True):
        lines[start - 1:end] = [text]
    return "".join(lines)


def _bundle_path(name: str, prefix: str) -> str:
    rel = module_file(name).relative_to(PACKAGE_DIR)
    return str(Path(prefix, rel).as_posix())


def bundle_package(roots: Iterable[str], prefix: str = "gdn") -> Dict[str, str]:
    """The modules ``roots`` need as ``{path: source}``, paths under ``prefix/``
    mirroring the package (``kernels/decode/ops.py`` -> ``gdn/decode/ops.py``)."""
    return {_bundle_path(n, prefix): _rewrite_absolute(module_file(n).read_text(), n)
            for n in module_closure(roots)}


def _top_level_names(tree: ast.Module) -> List[str]:
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.extend(t.id for t in targets if isinstance(t, ast.Name))
    return [n for n in names if n != "__all__"]


def flatten_modules(modules: Iterable[str]) -> str:
    """``modules`` (dependencies first) as one source file.

    Each module's intra-package imports are dropped (the names they bring must be
    defined, unaliased, by an earlier module of the list); ``from __future__``
    imports are hoisted to the top. ``ValueError`` on an aliased or unresolved
    intra-package import, or a top-level name defined by two modules.
    """
    modules = list(modules)
    defined: Dict[str, str] = {}
    futures: List[str] = []
    parts: List[str] = []
    for name in modules:
        source = module_file(name).read_text()
        tree = ast.parse(source)
        lines = source.splitlines(keepends=True)
        drop = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                futures.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and _resolve_from(node, name):
                for alias in node.names:
                    if alias.asname or alias.name not in defined:
                        raise ValueError(f"{name}: `{alias.name}` of line {node.lineno} is "
                                         "not defined (unaliased) by an earlier module")
            elif isinstance(node, ast.Import) and any(
                    a.name.split(".")[0] == PACKAGE for a in node.names):
                raise ValueError(f"{name}, line {node.lineno}: cannot flatten `import kernels...`")
            else:
                continue
            drop.update(range(node.lineno, node.end_lineno + 1))
        for n in _top_level_names(tree):
            if n in defined:
                raise ValueError(f"{n!r} is defined by both {defined[n]} and {name}")
            defined[n] = name
        body = "".join(line for i, line in enumerate(lines, 1) if i not in drop)
        parts.append(f"# ---- {name} ----\n{body.strip()}\n")
    head = "".join(f"from __future__ import {f}\n" for f in dict.fromkeys(futures))
    return head + "\n\n" + "\n\n".join(parts)


def _stdlib() -> frozenset:
    return frozenset(sys.stdlib_module_names) | {"__future__"}


def check_imports(sources: Dict[str, str], prefix: str = "gdn") -> None:
    """Raise ``ValueError`` naming the file and module when a ``.py`` source of
    ``sources`` imports anything but the standard library, ``torch``, ``triton``,
    and relative (bundled) modules (plus :data:`MODULE_EXCEPTIONS`)."""
    std = _stdlib()
    for path, text in sources.items():
        if not path.endswith(".py"):
            continue
        rel = Path(path).with_suffix("")
        rel_parts = rel.parts[1:] if rel.parts and rel.parts[0] == prefix else rel.parts
        extra = MODULE_EXCEPTIONS.get(".".join(rel_parts), ())
        for node in ast.walk(ast.parse(text, filename=path)):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            for root in roots:
                if root not in std and root not in ALLOWED_THIRD_PARTY and root not in extra:
                    raise ValueError(f"{path}, line {node.lineno}: imports {root!r}; packed code "
                                     f"may import only the standard library and "
                                     f"{', '.join(ALLOWED_THIRD_PARTY)}")
