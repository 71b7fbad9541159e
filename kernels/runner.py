"""Run the notebooks with papermill under a profile of parameters.

    python -m kernels.runner --profile auto|smoke|full --notebooks all|01,03
                             [--output-root DIR] [--device auto|cuda|cpu]
                             [--solutions a.json,kit/] [--solutions-may-fail]
                             [-p NAME=VALUE ...] [--fail-fast] [--list]

Profiles are YAML files (``kernels/profiles/{smoke,full}.yaml``, or a path):
a top-level ``defaults`` dict and one dict per notebook stem
(``01_decode_crossover:``) of papermill parameters. ``auto`` is ``full`` on
a CUDA GPU and ``smoke`` otherwise. Parameters, later ones winning:

1. ``defaults`` — passed to a notebook only where it declares the name;
2. the notebook's own dict — every name must be declared by the notebook;
3. ``device``, ``output_root`` (absolute) and ``profile`` — always;
4. ``-p NAME=VALUE`` from the command line (values parsed as YAML).

``--solutions`` (``make run SOLUTIONS=...``, docs/solutions.md) are read, then loaded
each in a worker of its own (:func:`kernels.contest.remote.check_entries`: the module
imported, the entry resolved and matched to the definition; CUDA sources are built later,
by the notebooks' workers) before any notebook starts: a missing, malformed or unloadable
one stops the run (exit 2; with ``--solutions-may-fail`` a warning, and the notebooks report
it unavailable). Each loaded one gets one line saying how, and off CUDA which GPU-only calls
its worker makes harmless. They are passed as ``solutions`` to every notebook declaring it. A profile's ``solution_shape`` maps an op to notebook stems and
parameters: when the solutions of that op have a definition whose heads or head size
(``gdn_<op>_qk<HQ>_v<HV>_d<D>_k_last``) differ from the notebook's shape, the notebook runs
at the definition's shape with those parameters on top of its own (the smoke profile's
are small enough for the interpreter), unless ``-p`` sets the shape.

The run ends with a summary (:func:`summarize`): per notebook, every implementation that
was unavailable, errored or failed the gate, with a one-line reason, and per requested
solution where it passed. Exit status: 0 when every notebook ran and every requested
solution passed the gate somewhere; 1 when a notebook failed or a requested solution never
passed (``--solutions-may-fail`` keeps it 0 for that); 2 for bad arguments (a profile,
selection, parameter or solution refused before any notebook starts, or another run
holding the output root); 130/143 when interrupted.

One run at a time per output root: the runner holds an exclusive lock on
``<output_root>/.runner.lock`` (``flock``: released by the OS however the run
ends, SIGKILL included) and writes its pid, start time and command into it; a
second run into the same root stops at once (exit 2) with a message naming the
first; a finished run deletes the lock file. Holding the lock, the runner first cleans what killed runs left in
``<output_root>/<gpu-slug>/`` (:func:`kernels.bench.results.sweep_leftovers`:
``.tmp-*`` folders deleted, results caught mid-swap restored).

Each notebook executes into a temporary file. On success it lands at
``<output_root>/<gpu-slug>/<stem>.ipynb``; the notebook itself writes its CSV/PNG/
provenance folder ``<output_root>/<gpu-slug>/<stem>/``. A figure the notebook displays
is that folder's PNG, linked rather than embedded a second time (:func:`link_figures`).
No HTML export: ``make html`` renders the executed notebooks into git-ignored ``.html``
files beside them. On failure the
runner names the notebook and the failing cell, keeps the executed notebook
as ``<output_root>/<gpu-slug>/failed-<stem>.ipynb`` (the last good results
stay untouched), goes on with the next notebook unless ``--fail-fast``, and
exits non-zero. Interrupted (Ctrl-C, or SIGTERM as ``timeout`` and schedulers
send) the runner keeps what the notebook had executed so far the same way
(papermill saves it at every cell's start and end: the finished cells' outputs
and their ``papermill.duration``), says where, and exits 130 (Ctrl-C) or 143
(SIGTERM). Only SIGKILL leaves nothing but the temporary folders.

The kernel (Jupyter ``python3``, run in the notebook's folder, talking to papermill
over local Unix sockets rather than TCP) inherits:
``TRITON_INTERPRET`` (1 without a CUDA GPU unless set, as the Makefile does),
the repository on ``PYTHONPATH``, ``MPLBACKEND=Agg`` (the notebooks display
the PNGs they save) and ``JUPYTER_PREFER_ENV_PATH=1`` (this environment's
kernelspec wins over a user-wide one).

Importing this module imports neither torch nor papermill.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

__all__ = ["REPO_ROOT", "NOTEBOOK_DIR", "OUTPUT_ROOT_ENV", "PROFILE_DIR", "PROFILES", "RunResult", "link_figures",
           "discover_notebooks", "select_notebooks", "load_profile", "resolve_profile",
           "notebook_parameters", "build_parameters", "current_gpu_slug", "run_notebook",
           "RunLock", "LOCK_NAME", "main"]

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
PROFILES = ("smoke", "full")
ALWAYS = ("device", "output_root", "profile")
OPS = ("decode", "prefill")
#: the notebook parameters of a GDN shape, in the order of a definition's name (qk, v, d)
SHAPE_PARAMS = ("num_q_heads", "num_v_heads", "head_dim")
KERNEL_NAME = "python3"
#: Where a notebook's ``output_root="auto"`` points when set (a run by hand, JupyterLab:
#: :func:`kernels.experiments.common.resolve_auto`); the runner passes its root explicitly.
OUTPUT_ROOT_ENV = "GDN_OUTPUT_ROOT"
_STEM = re.compile(r"^\d\d_[A-Za-z0-9_]+$")


class RunnerError(Exception):
    """A usage problem (bad profile, selection or parameter); exit code 2."""


# --------------------------------------------------------------------------- lock

LOCK_NAME = ".runner.lock"


class RunLock:
    """Exclusive lock of an output root (``<root>/.runner.lock``, ``flock``).

    ``acquire()`` raises :class:`RunnerError` naming the holder (pid, host, start
    time, command) when another process holds it. The OS drops the lock when the
    holder exits or is killed (the file then stays, naming the dead holder, until
    the next run); ``release()`` deletes the file while still holding the lock, so
    a finished run leaves nothing behind. A process that locked a file unlinked
    meanwhile sees that the path no longer names its file and tries again.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        self.root.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    info = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
                except ValueError:
                    info = {}
                os.close(fd)
                who = (f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started "
                       f"{info.get('started', '?')}, command: {info.get('command', '?')}")
                raise RunnerError(f"another run is writing into {self.root} ({who}); wait for it "
                                  f"to finish or stop it (lock: {self.path})") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder released (and unlinked) it between our open and flock
        info = dict(pid=os.getpid(), host=os.uname().nodename,
                    started=time.strftime("%Y-%m-%d %H:%M:%S %z"),
                    command=" ".join(getattr(sys, "orig_argv", sys.argv)))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


# --------------------------------------------------------------------------- discovery

def discover_notebooks(notebook_dir: Path = NOTEBOOK_DIR) -> Dict[str, Path]:
    """``{stem: path}`` of ``NN_name.ipynb`` notebooks in ``notebook_dir``, sorted."""
    notebook_dir = Path(notebook_dir)
    if not notebook_dir.is_dir():
        raise RunnerError(f"no notebook folder at {notebook_dir} (pass --notebook-dir)")
    return {p.stem: p for p in sorted(notebook_dir.glob("*.ipynb")) if _STEM.match(p.stem)}


def select_notebooks(available: Dict[str, Path], selection: str) -> Dict[str, Path]:
    """``"all"`` or a comma list of numbers/stems (``"01,03"``, ``"02_prefill_launch_overhead"``)."""
    if not available:
        raise RunnerError("no notebooks found")
    if selection.strip().lower() == "all":
        return dict(available)
    chosen: Dict[str, Path] = {}
    for token in (t.strip() for t in selection.split(",")):
        if not token:
            continue
        token = token[:-6] if token.endswith(".ipynb") else token
        hits = [s for s in available if s == token or s.split("_", 1)[0] == token.zfill(2)]
        if len(hits) != 1:
            raise RunnerError(f"--notebooks: {token!r} matches {len(hits)} notebooks "
                              f"(available: {', '.join(available)})")
        chosen[hits[0]] = available[hits[0]]
    if not chosen:
        raise RunnerError("--notebooks selected nothing")
    return dict(sorted(chosen.items()))


# --------------------------------------------------------------------------- profiles

def resolve_profile(profile: str, has_gpu: Optional[bool] = None) -> str:
    """``auto`` -> ``full`` on a CUDA GPU, ``smoke`` otherwise; other names as given."""
    if profile != "auto":
        return profile
    if has_gpu is None:
        has_gpu = _has_gpu()
    return "full" if has_gpu else "smoke"


def load_profile(profile: str) -> dict:
    """Load a profile by name (``kernels/profiles/<name>.yaml``) or path.

    Returns ``{"name", "path", "defaults", "notebooks": {stem: params}}``.
    """
    import yaml

    path = Path(profile)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = PROFILE_DIR / f"{profile}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise RunnerError(f"unknown profile {profile!r} (known: {', '.join(known)}, or a .yaml path)")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise RunnerError(f"{path}: a profile is a mapping of defaults and notebook stems")
    defaults = data.pop("defaults", None) or {}
    if not isinstance(defaults, dict):
        raise RunnerError(f"{path}: 'defaults' must be a mapping")
    variant = data.pop("solution_shape", None) or {}
    ok = isinstance(variant, dict) and set(variant) <= set(OPS)
    for stems in (variant.values() if ok else ()):
        ok = ok and isinstance(stems, dict) and all(
            _STEM.match(str(k)) and isinstance(x, (dict, type(None))) for k, x in stems.items())
    if not ok:
        raise RunnerError(f"{path}: 'solution_shape' maps an op ({', '.join(OPS)}) to "
                          f"notebook stems and their parameters")
    notebooks = {}
    for stem, params in data.items():
        if not _STEM.match(str(stem)):
            raise RunnerError(f"{path}: top-level key {stem!r} is neither 'defaults' nor a "
                              f"notebook stem like 01_decode_crossover")
        if params is not None and not isinstance(params, dict):
            raise RunnerError(f"{path}: {stem} must map parameter names to values")
        notebooks[str(stem)] = params or {}
    name = path.stem if path.parent == PROFILE_DIR else str(path)
    return {"name": name, "path": path, "defaults": defaults, "notebooks": notebooks,
            "solution_shape": {op: {str(k): x or {} for k, x in v.items()}
                               for op, v in variant.items()}}


def notebook_parameters(path: Path) -> Dict[str, dict]:
    """The parameters the notebook declares in its ``parameters`` cell (papermill's
    ``inspect_notebook``: name -> {inferred_type_name, default, help})."""
    import nbformat
    import papermill

    nb = nbformat.read(str(path), as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise RunnerError(f"{path.name}: {len(tagged)} cells tagged 'parameters' (want exactly 1)")
    return dict(papermill.inspect_notebook(str(path)))


def build_parameters(stem: str, declared: Dict[str, dict], profile: dict, *, device: str,
                     output_root: Path, overrides: Optional[dict] = None) -> dict:
    """The papermill parameters of one notebook (see the module docstring for the order)."""
    params = {k: v for k, v in profile["defaults"].items() if k in declared and k not in ALWAYS}
    own = profile["notebooks"].get(stem, {})
    unknown = sorted(set(own) - set(declared))
    if unknown:
        raise RunnerError(
            f"profile {profile['name']}: {stem} sets {', '.join(unknown)}, which the notebook "
            f"does not declare (its parameters: {', '.join(declared) or 'none'})")
    params.update({k: v for k, v in own.items() if k not in ALWAYS})
    params.update(device=device, output_root=str(output_root), profile=profile["name"])
    for k, v in (overrides or {}).items():
        if k not in declared and k not in ALWAYS:
            raise RunnerError(f"-p {k}: {stem} does not declare a parameter {k!r}")
        params[k] = v
    return params


def _parse_overrides(items: Sequence[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise RunnerError(f"-p expects NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


# --------------------------------------------------------------------------- device

def _has_gpu() -> bool:
    try:
        from kernels.device import has_gpu
    except ImportError:
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())
    return has_gpu()


def current_gpu_slug() -> str:
    """The slug the notebooks' ResultWriter uses: ``kernels.device.gpu_slug()``."""
    try:
        from kernels.device import gpu_slug
    except ImportError:  # the instruments are not installed: same rule, here
        if not _has_gpu():
            return "cpu-interpreter"
        import torch

        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    return gpu_slug()


def prepare_environment() -> None:
    """Make the kernel subprocess see the same world as this process: TRITON_INTERPRET
    as the Makefile sets it, the repository importable, this environment's kernelspec."""
    if "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "0" if _has_gpu() else "1"
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + paths)
    # prefer the kernelspec of this environment (.venv/share/jupyter) over a user one
    os.environ.setdefault("JUPYTER_PREFER_ENV_PATH", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")


# --------------------------------------------------------------------------- running

@dataclass
class RunResult:
    stem: str
    ok: bool
    seconds: float
    notebook: Optional[Path] = None
    message: str = ""
    files: List[Path] = field(default_factory=list)


def link_figures(ipynb: Path, result_dir: Path) -> int:
    """In the executed notebook ``ipynb``, replace each embedded PNG output that is byte
    for byte a PNG of ``result_dir`` (the notebook displays the figures it saves) by an
    ``<img>`` of that file, relative to the notebook's folder; returns how many. The
    embedded copies (base64) were over 90 % of a full run's executed notebooks."""
    import base64

    import nbformat

    pngs = {p.read_bytes(): p.name for p in result_dir.glob("*.png")}
    if not pngs:
        return 0
    nb = nbformat.read(str(ipynb), as_version=4)
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            name = pngs.get(base64.b64decode(out.get("data", {}).get("image/png", "")))
            if name is None:
                continue
            rel = f"{result_dir.name}/{name}"
            width = out.get("metadata", {}).get("image/png", {}).get("width")
            size = f' width="{width}"' if width else ""
            out["data"] = {"text/html": f'<img src="{rel}"{size} alt="{name}"/>',
                           "text/plain": f"<figure {rel}>"}
            out["metadata"] = {}
            n += 1
    if n:
        nbformat.write(nb, str(ipynb))
    return n


def _describe_failure(stem: str, exc: BaseException) -> str:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        first = next((ln for ln in (exc.source or "").splitlines() if ln.strip()), "")
        return (f"{stem}: cell {exc.cell_index} (execution count {exc.exec_count}, "
                f"`{first.strip()[:80]}`) raised {exc.ename}: {str(exc.evalue)[:500]}")
    return f"{stem}: {type(exc).__name__}: {str(exc)[:500]}"


# the kernel talks to papermill over local Unix sockets, not TCP: no open port, and no
# "Kernel is running over TCP without encryption" warning from every notebook
_KERNEL_CONFIG = {"KernelManager": {"transport": "ipc"}}


def run_notebook(path: Path, params: dict, out_dir: Path, *, progress_bar: bool = True,
                 log_output: bool = False, cwd: Optional[Path] = None) -> RunResult:
    """Execute one notebook into a temporary file, then move it into ``out_dir``."""
    import papermill
    from traitlets.config import Config

    stem = path.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{stem}.ipynb"
    failed = out_dir / f"failed-{stem}.ipynb"
    t0 = time.perf_counter()
    # inside out_dir (".tmp-": swept by the next run if this one is killed)
    with tempfile.TemporaryDirectory(prefix=f".tmp-run-{stem}-", dir=out_dir) as tmp:
        executed = Path(tmp) / f"{stem}.ipynb"
        try:
            papermill.execute_notebook(
                str(path), str(executed), parameters=params, kernel_name=KERNEL_NAME,
                progress_bar=progress_bar, log_output=log_output,
                cwd=str(cwd or path.parent), config=Config(_KERNEL_CONFIG))
        except (KeyboardInterrupt, SystemExit):
            # interrupted: keep what ran (papermill saved it cell by cell), then stop
            if executed.exists():
                shutil.move(str(executed), str(failed))
                print(f"INTERRUPTED {stem} after {time.perf_counter() - t0:.0f} s; the "
                      f"cells run so far are kept at {failed}", file=sys.stderr, flush=True)
            raise
        except Exception as exc:  # noqa: BLE001 - report any failure, keep going
            message = _describe_failure(stem, exc)
            kept = None
            if executed.exists():
                shutil.move(str(executed), str(failed))
                kept = failed
                message += f"; executed notebook kept at {failed}"
            return RunResult(stem, False, time.perf_counter() - t0, kept, message)
        link_figures(executed, out_dir / stem)
        shutil.move(str(executed), str(final))
    if failed.exists():  # an older failure is stale now
        failed.unlink()
    return RunResult(stem, True, time.perf_counter() - t0, final, f"{stem}: ok -> {final}")


# --------------------------------------------------------------------------- CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kernels.runner",
        description="Run the GDN notebooks with papermill under a parameter profile.")
    p.add_argument("--profile", default="auto",
                   help="auto (full on a CUDA GPU, smoke otherwise), smoke, full, or a .yaml path")
    p.add_argument("--notebooks", default="all", help="all, or a comma list like 01,03")
    p.add_argument("--output-root", default=None,
                   help="results root (default: the profile's output_root; smoke -> results/smoke, "
                        "full -> results); relative to the current directory")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="passed to every notebook as `device`")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a parameter of every selected notebook (value parsed as YAML)")
    p.add_argument("--notebook-dir", default=str(NOTEBOOK_DIR), help=argparse.SUPPRESS)
    p.add_argument("--solutions", default="",
                   help="comma list of flashinfer-bench solution JSONs / starter-kit folders, "
                        "passed as the 'solutions' parameter to every notebook declaring it "
                        "(each keeps those of its op; docs/solutions.md)")
    p.add_argument("--solutions-may-fail", action="store_true",
                   help="exit 0 even when a solution of --solutions never passed the gate "
                        "(exploratory runs); the summary still lists it")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failing notebook")
    p.add_argument("--log-output", action="store_true", help="stream cell output to the terminal")
    p.add_argument("--no-progress", action="store_true", help="no papermill progress bar")
    p.add_argument("--list", action="store_true",
                   help="list the notebooks, their parameters and the profile's values; run nothing")
    return p


def _plan(args) -> tuple:
    profile = load_profile(resolve_profile(args.profile))
    notebooks = select_notebooks(discover_notebooks(Path(args.notebook_dir)), args.notebooks)
    root = args.output_root or profile["defaults"].get("output_root")
    if not root:
        raise RunnerError(f"profile {profile['name']} sets no output_root; pass --output-root")
    overrides = _parse_overrides(args.param)
    solutions = _solution_paths(args.solutions)
    shapes = solution_shapes(solutions)
    plans, notes = [], []
    for stem, path in notebooks.items():
        declared = notebook_parameters(path)
        missing = [n for n in ALWAYS if n not in declared]
        if missing:
            print(f"warning: {stem} does not declare {', '.join(missing)} (papermill injects "
                  f"them anyway)", file=sys.stderr)
        params = build_parameters(stem, declared, profile, device=args.device,
                                  output_root=Path(root).resolve(), overrides=overrides)
        if solutions and "solutions" in declared:
            params["solutions"] = [p for p, _ in solutions]
        for op, (shape, names) in shapes.items():
            variant = profile["solution_shape"].get(op, {})
            if stem not in variant or set(SHAPE_PARAMS) & set(overrides):
                continue   # not a notebook of this op, or -p chose the shape
            if tuple(params.get(k) for k in SHAPE_PARAMS) == shape:
                continue
            unknown = sorted(set(variant[stem]) - set(declared))
            if unknown:
                raise RunnerError(f"profile {profile['name']}: solution_shape.{op}.{stem} sets "
                                  f"{', '.join(unknown)}, which the notebook does not declare")
            params = build_parameters(stem, declared, profile, device=args.device,
                                      output_root=Path(root).resolve(),
                                      overrides={**variant[stem], **dict(zip(SHAPE_PARAMS, shape)),
                                                 **overrides})
            params["solutions"] = [p for p, _ in solutions]
            notes.append(f"{stem}: at the shape of {', '.join(names)} (HQ={shape[0]} "
                         f"HV={shape[1]} D={shape[2]})" + (
                             f", with the values of profile {profile['name']}'s "
                             f"solution_shape.{op}" if variant[stem] else ""))
        plans.append((stem, path, declared, params))
    return profile, Path(root).resolve(), plans, notes, solutions


def _solution_paths(text: str) -> List[tuple]:
    """``--solutions a.json,dir/`` -> ``[(absolute path, SolutionSource)]``, each read (not
    run: :func:`kernels.contest.formats.read_solution`); a missing or malformed one is an
    error before any notebook starts."""
    out = []
    for item in (x.strip() for x in str(text or "").split(",")):
        if not item:
            continue
        path = Path(item).expanduser().resolve()
        if not path.exists():
            raise RunnerError(f"--solutions: {item} does not exist (a solution JSON or a "
                              "starter-kit folder)")
        from .contest.formats import SolutionError, read_solution

        try:
            out.append((str(path), read_solution(path)))
        except SolutionError as e:
            raise RunnerError(f"--solutions: {e}") from None
    return out


def _check_solutions(solutions: Sequence[tuple], may_fail: bool) -> bool:
    """Load every solution's entry before the first notebook (see the module docstring);
    one line each. False when one cannot load and ``may_fail`` is not set."""
    from .contest.remote import check_entries

    ok, notes = True, []
    for src, loaded, text, shims in check_entries([s for _, s in solutions]):
        if shims and shims not in notes:
            notes.append(shims)
        if loaded:
            print(f"solution {src.name}: {src.entry_file}::{src.entry_symbol} loads "
                  f"({text})", flush=True)
        elif may_fail:
            print(f"warning: --solutions: {text} (--solutions-may-fail: the notebooks report "
                  f"it unavailable)", file=sys.stderr, flush=True)
        else:
            print(f"error: --solutions: {text}", file=sys.stderr, flush=True)
            ok = False
    for note in notes:
        print(f"solutions' workers, {note}", flush=True)
    return ok


def solution_shapes(solutions: Sequence[tuple]) -> Dict[str, tuple]:
    """``op -> ((HQ, HV, D), [names])`` of the solutions' definitions; solutions of one op
    with two shapes are an error (a notebook runs one shape)."""
    out: Dict[str, tuple] = {}
    for _, src in solutions:
        shape, names = out.setdefault(src.op, (src.shape, []))
        if src.shape != shape:
            raise RunnerError(f"--solutions: {src.name} ({src.definition}) and {names[0]} are "
                              f"{src.op} solutions of two shapes; run them separately")
        names.append(src.name)
    return out


def _list(profile, root, plans, notes) -> None:
    print(f"profile {profile['name']} ({profile['path']}), output root {root}")
    for line in notes:
        print(line)
    for stem, path, declared, params in plans:
        print(f"\n{stem}  ({path})")
        for name, info in declared.items():
            value = repr(params[name]) if name in params else info.get("default")
            mark = "*" if name in params else " "
            print(f"  {mark} {name}: {info.get('inferred_type_name', '?')} = {value}"
                  f"   # {info.get('help', '')}")
    print("\n* = set by the profile, the runner or -p; the rest are the notebook's defaults")


def _exit_on_sigterm(signum, frame):
    """SIGTERM as an exception in the main thread, so that the run unwinds (the partly
    executed notebook kept, the lock released) instead of dying where it stands."""
    raise SystemExit(128 + signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        profile, root, plans, notes, solutions = _plan(args)
    except RunnerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list:
        _list(profile, root, plans, notes)
        return 0
    try:
        lock = RunLock(root).acquire()
    except RunnerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        return _run_all(args, profile, root, plans, notes, solutions)
    except KeyboardInterrupt:
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        lock.release()


def _run_all(args, profile, root, plans, notes, solutions) -> int:
    from .bench.results import sweep_leftovers

    prepare_environment()
    if solutions and not _check_solutions(solutions, args.solutions_may_fail):
        return 2
    slug = current_gpu_slug()
    out_dir = root / slug
    for line in sweep_leftovers(out_dir):
        print(line, flush=True)
    print(f"profile {profile['name']}, device {args.device}, gpu {slug}, results in {out_dir}; "
          f"notebooks: {', '.join(stem for stem, *_ in plans)}", flush=True)
    for line in notes:
        print(line, flush=True)
    results: List[RunResult] = []
    for stem, path, _, params in plans:
        print(f"\n== {stem}", flush=True)
        res = run_notebook(path, params, out_dir, progress_bar=not args.no_progress,
                           log_output=args.log_output)
        results.append(res)
        print(("  " if res.ok else "FAILED ") + res.message + f" ({res.seconds:.0f} s)",
              file=sys.stdout if res.ok else sys.stderr, flush=True)
        if not res.ok and args.fail_fast:
            break
    return summarize(results, len(plans), out_dir, solutions,
                     solutions_may_fail=args.solutions_may_fail)


# --------------------------------------------------------------------------- summary

_BAD = ("unavailable", "error", "fail")


def notebook_outcomes(folder: Path) -> dict:
    """What a notebook's result folder says about its implementations: ``{"problems":
    [(label, status, line)], "passed": {label}, "solutions": [provenance rows]}``.

    ``problems``: every label with rows ``unavailable``, ``error`` or ``fail`` in the
    folder's gate tables (``*gate.csv`` with ``label`` and ``status`` columns: not, say,
    notebook 04's hard-input accuracy table, where a failure is a finding), one line each:
    the status, at how many of its points, and the first reason. ``passed``: the labels
    with a ``pass`` row. ``solutions``: the provenance's ``solutions`` entries.
    """
    import csv

    rows: Dict[str, Dict[str, list]] = {}
    for path in sorted(Path(folder).glob("*gate.csv")):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if not {"label", "status"} <= set(reader.fieldnames or ()):
                continue
            for row in reader:
                rows.setdefault(row["label"], {}).setdefault(row["status"], []).append(
                    (row.get("reason") or "").strip())
    problems = []
    for label, by in rows.items():
        total = sum(len(v) for v in by.values())
        for status in _BAD:
            if status in by:
                reason = next((r for r in by[status] if r), "no reason given")
                where = "everywhere" if len(by[status]) == total else \
                    f"at {len(by[status])} of {total} points"
                problems.append((label, status, f"{label}: {status} {where}: "
                                 f"{reason if len(reason) <= 240 else reason[:237] + '...'}"))
    try:
        prov = json.loads((Path(folder) / "provenance.json").read_text())
        sols = prov.get("experiment", {}).get("solutions") or []
    except (OSError, ValueError):
        sols = []
    passed = {label for label, by in rows.items() if "pass" in by}
    return {"problems": problems, "passed": passed, "solutions": sols}


def _is_origin_of(origin: str, path: str) -> bool:
    """Whether a provenance ``origin`` (the JSON, or the folder's config.toml) is ``path``."""
    return bool(origin) and (origin == path or str(Path(origin).parent) == path)


def summarize(results: Sequence[RunResult], planned: int, out_dir: Path,
              solutions: Sequence[tuple] = (), *, solutions_may_fail: bool = False) -> int:
    """Print the end-of-run summary and return the exit status.

    Per notebook: ok or failed, then every implementation that was unavailable, errored
    or failed the gate (:func:`notebook_outcomes`). Per requested solution: the notebooks
    that gated it and whether it passed. Non-zero when a notebook failed or did not run,
    or (unless ``solutions_may_fail``) when a requested solution never passed the gate in
    any notebook: unavailable there, erroring, failing, or run by no selected notebook.
    """
    print("\n== summary", flush=True)
    outcomes = {}
    for r in results:
        print(f"{r.stem}: {'ok' if r.ok else 'FAILED'} ({r.seconds:.0f} s)", flush=True)
        if not r.ok:
            print(f"  {r.message}", flush=True)
        folder = Path(out_dir) / r.stem
        if r.ok and folder.is_dir():
            outcomes[r.stem] = notebook_outcomes(folder)
            for _, _, line in outcomes[r.stem]["problems"]:
                print(f"  {line}", flush=True)
    never = []
    for path, src in solutions:
        seen = [(stem, s["label"], s["label"] in o["passed"]) for stem, o in outcomes.items()
                for s in o["solutions"] if _is_origin_of(s.get("origin", ""), path)]
        if not seen:
            line = f"solution {src.name}: not gated (no notebook of this run gated its op, {src.op})"
        else:
            line = f"solution {src.name}: " + "; ".join(
                f"{'passed' if ok else 'never passed'} in {stem}" for stem, _, ok in seen)
        print(line, flush=True)
        if not any(ok for *_, ok in seen):
            never.append(src.name)
    failed = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)}/{planned} notebooks ok" +
          (f"; failed: {', '.join(r.stem for r in failed)}" if failed else ""), flush=True)
    if never:
        print(f"{len(never)} of {len(solutions)} requested solution"
              f"{'s' if len(solutions) != 1 else ''} never passed the gate: "
              f"{', '.join(never)}" + (" (--solutions-may-fail: exit status 0 for them)"
                                        if solutions_may_fail else ""), flush=True)
    for r in failed:
        print(f"FAILED {r.message}", file=sys.stderr)
    if failed or len(results) < planned:
        return 1
    return 1 if never and not solutions_may_fail else 0


if __name__ == "__main__":
    sys.exit(main())
