"""Third-party solutions in worker processes of their own, gated and timed like our rows.

A solution is code we did not write: it may abort, fault (an illegal address poisons its
CUDA context), hang, or change process-wide torch settings at import. The notebooks
therefore load each one (:func:`kernels.contest.loader.load_solution`, unscoped: the
process is the solution's) in its own worker, reusing the peer worker's process and
protocol (:class:`kernels.peers_worker.PeerWorker`, served by :func:`solution_impls`). The
solution is read once, here: the worker receives what was read
(:meth:`kernels.contest.formats.SolutionSource.as_dict`), not the path::

    sols = remote_solutions(["solution:a.json"], ["dir/"], op="decode")  # label -> ...
    res = sols["a"].run("64", inputs, reference, device="cuda", methods=["graph"], rep=50)
    res["gate"]      # kernels.bench.gate.gate_call's row, computed in the worker

A worker that dies (abort, segfault) or answers nothing within :data:`SOLUTION_TIMEOUT_S`
raises :class:`kernels.peers_worker.WorkerError` naming the solution and the signal; the
notebooks report that as the solution's gate outcome and go on. After a gate ``error`` the
worker is stopped so that the next shape starts a fresh process (a CUDA fault leaves the
old one unusable); the build cache makes that restart cheap. The solution's worker starts
without ``GDN_QLA_SITE`` (tilelang's site): it sees this process's packages.
"""
from __future__ import annotations

import atexit
import json
import signal
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

from ..peers_worker import PeerWorker, RemotePeer, WorkerError
from .formats import SOLUTION_PREFIX, SolutionError, SolutionSource, read_solution

__all__ = ["SOLUTION_TIMEOUT_S", "SolutionWorker", "RemoteSolution", "remote_solutions",
           "check_entries", "describe", "solution_impls", "solution_checks", "shims_note"]

#: Seconds a solution's worker may take to answer one request (a CUDA build at load, one
#: gate, or one timing run) before it is killed and the request reported as a hang.
SOLUTION_TIMEOUT_S = 600.0
_HOOK = "kernels.contest.remote:solution_impls"
_CHECK_HOOK = "kernels.contest.remote:solution_checks"


# --------------------------------------------------------------------------- parent side


class SolutionWorker(PeerWorker):
    """A :class:`PeerWorker` serving one solution; its errors name the solution and,
    when the process was killed, the signal."""

    def __init__(self, label: str, timeout_s: float = SOLUTION_TIMEOUT_S, serve: str = _HOOK):
        super().__init__(serve, site="", timeout_s=timeout_s)
        self.label = label

    def request(self, msg: dict) -> dict:
        try:
            return super().request(msg)
        except WorkerError as e:
            code = None if self.proc is None else self.proc.poll()
            how = ""
            if code is not None and code < 0:
                try:
                    how = f"killed by {signal.Signals(-code).name}: "
                except ValueError:
                    how = f"killed by signal {-code}: "
            raise WorkerError(f"solution {self.label}: {how}{e}") from None


class RemoteSolution(RemotePeer):
    """A solution in its :class:`SolutionWorker`: ``label`` (its name), ``language``,
    ``definition``, ``graph_capturable``, ``origin``; :meth:`run` as
    :meth:`RemotePeer.run`."""

    def __init__(self, worker, key: str, src, version: str = ""):
        super().__init__(worker, key, True, version=version)
        self.label, self.language, self.definition = src.name, src.language, src.definition
        self.graph_capturable, self.origin = src.graph_capturable, src.origin

    def __repr__(self) -> str:
        return f"RemoteSolution({self.label!r}, {self.language}, {self.origin})"

    def info(self) -> dict:
        """Provenance: what was loaded and how it was built."""
        return dict(label=self.label, origin=self.origin, language=self.language,
                    definition=self.definition, graph_capturable=self.graph_capturable,
                    build=self.version)

    def run(self, key, inputs, reference, *, device, methods=(), rep=10, warmup=2,
            timeline=False, trace=None, kernel_calls=0) -> dict:
        methods = list(methods)
        dropped = [m for m in methods if m == "graph" and not self.graph_capturable]
        res = super().run(key, inputs, reference, device=device,
                          methods=[m for m in methods if m not in dropped], rep=rep,
                          warmup=warmup, timeline=timeline, trace=trace,
                          kernel_calls=kernel_calls)
        if res["gate"].get("status") == "error":
            self.worker.close(kill=True)   # the next call starts a fresh process
        res["timings"] += [dict(method=m, error="not graph-capturable: its CUDA sources "
                                "launch on the default stream") for m in dropped]
        return res


def _unique(label: str, taken: set) -> str:
    out, i = label, 2
    if out in taken:
        out = f"{label} [solution]"
    while out in taken:
        out, i = f"{label} [solution {i}]", i + 1
    taken.add(out)
    return out


def _unavailable(name: str, reason: str, origin: str):
    """A :class:`kernels.peers.Unavailable` that remembers the path it was asked for (the
    provenance's ``origin``, by which the runner matches it to ``--solutions``)."""
    from ..peers import Unavailable

    out = Unavailable(name, reason)
    out.origin = origin
    return out


def remote_solutions(explicit: Iterable[str], added: Iterable[str] = (), *, op: str,
                     taken: Iterable[str] = (), timeout_s: float = SOLUTION_TIMEOUT_S
                     ) -> Dict[str, object]:
    """``label -> RemoteSolution or kernels.peers.Unavailable``, one worker each (loaded,
    CUDA built, before this returns).

    ``explicit``: ``solution:<path>`` entries of a notebook's ``impls`` (one of the other
    op is unavailable, with the reason). ``added``: paths from the ``solutions`` parameter,
    kept only when their definition is ``op``'s (the runner passes them to every notebook).
    Labels are the solutions' names, made unique against ``taken`` (the other rows).
    """
    taken = set(taken)
    out: Dict[str, object] = {}
    todo = [(e, True) for e in explicit] + [(e, False) for e in added]
    for entry, must in todo:
        path = entry[len(SOLUTION_PREFIX):] if entry.startswith(SOLUTION_PREFIX) else entry
        origin = str(Path(path).expanduser().resolve())
        try:
            src = read_solution(path, op if must else None)
        except (SolutionError, ValueError) as e:
            out[_unique(Path(path).name or path, taken)] = _unavailable(path, str(e), origin)
            continue
        if src.op != op:
            print(f"solution {src.name} ({src.origin}): a {src.op} solution, not used by "
                  f"this {op} notebook")
            continue
        label = _unique(src.name, taken)
        key = json.dumps(src.as_dict())
        worker = SolutionWorker(label, timeout_s)
        atexit.register(worker.close)
        try:
            st = worker.status([key])[key]
        except WorkerError as e:
            worker.close(kill=True)
            out[label] = _unavailable(label, str(e), origin)
            continue
        if not st.get("available"):
            worker.close()
            out[label] = _unavailable(label, st.get("reason", "the worker could not load it"),
                                      origin)
            continue
        out[label] = RemoteSolution(worker, key, src, version=st.get("version", ""))
    return out


def check_entries(sources: Sequence[SolutionSource], timeout_s: float = SOLUTION_TIMEOUT_S
                  ) -> List[tuple]:
    """Load each read solution's entry in a worker of its own, as a notebook's worker will
    (:func:`solution_checks`), before any notebook starts: ``[(src, ok, text, shims)]``,
    ``text`` the build line (``ok``) or the reason it could not load (the message a
    notebook would report), ``shims`` what its worker made harmless off CUDA
    (:func:`shims_note`; the same for every solution of a run, so the runner says it once). What can be checked without a GPU: Python/Triton modules are
    imported and their entry resolved and matched to the definition's arity; CUDA sources
    are built later, by the notebooks' workers."""
    out = []
    # started together: their imports (torch, triton) overlap
    workers = [SolutionWorker(src.name, timeout_s, serve=_CHECK_HOOK).start()
               for src in sources]
    for src, worker in zip(sources, workers):
        key = json.dumps(src.as_dict())
        try:
            st = worker.status([key])[key]
        except WorkerError as e:
            out.append((src, False, str(e), ""))
            continue
        finally:
            worker.close(kill=True)
        if st.get("available"):
            info = json.loads(st["version"])
            out.append((src, True, info["build"] + (
                f", {_device_note('device')}" if info["device"] else ""), info["shims"]))
        else:
            out.append((src, False, st.get("reason", ""), ""))
    return out


# --------------------------------------------------------------------------- worker side

def solution_impls(names: Iterable[str]) -> Dict[str, tuple]:
    """The solution worker's hook: ``{name: (SolutionImpl or Unavailable, build)}`` where
    ``name`` is a read solution (:meth:`SolutionSource.as_dict` as JSON), loaded unscoped
    (this process is the solution's)."""
    from ..peers import Unavailable
    from .loader import cpu_shims, load_solution

    shims = cpu_shims()
    out = {}
    for name in names:
        src = SolutionSource.from_dict(json.loads(name))
        try:
            fn = load_solution(src, scoped=False)
        except Exception as e:  # reported as the solution's reason
            out[name] = (Unavailable(src.name, f"{type(e).__name__}: {e}"), "")
        else:
            out[name] = (fn, _build_info(fn, shims))
    return out


class _NotBuiltHere:
    """A CUDA solution in the check worker: truthy, not built (the notebooks' workers build
    it on the GPU)."""

    def __bool__(self) -> bool:
        return True


def solution_checks(names: Iterable[str]) -> Dict[str, tuple]:
    """The entry check's hook (:func:`check_entries`): as :func:`solution_impls`, except that
    CUDA solutions are not built, and a load error's reason is the message alone."""
    from ..peers import Unavailable
    from .formats import CUDA_LANGUAGES
    from .loader import cpu_shims, load_solution

    shims = cpu_shims()
    out = {}
    for name in names:
        src = SolutionSource.from_dict(json.loads(name))
        if src.language in CUDA_LANGUAGES:
            out[name] = (_NotBuiltHere(), json.dumps(dict(
                build=f"{src.language}: built by the notebooks' workers", shims="",
                device=False)))
            continue
        try:
            fn = load_solution(src, scoped=False)
        except SolutionError as e:
            out[name] = (Unavailable(src.name, str(e)), "")
        except Exception as e:  # noqa: BLE001 - any load failure is the solution's
            out[name] = (Unavailable(src.name, f"{src.origin}: {type(e).__name__}: {e}"), "")
        else:
            out[name] = (fn, json.dumps(dict(build=_build_info(fn), shims=shims_note(shims),
                                             device=bool(fn.device_param and shims))))
    return out


def _build_info(fn, shims=()) -> str:
    """What the worker's status reports as the 'version': language and build, and what
    this worker made harmless off CUDA (:func:`shims_note`)."""
    how = fn.language + (f"/{fn.binding}" if fn.binding else "")
    if fn.build_s is not None:
        how += (f", built in {fn.build_s:.1f} s" if not fn.cached
                else f", cached build (checked in {fn.build_s:.2f} s)")
    how += ", destination-passing" if fn.dps else ", value-returning"
    if fn.device_param and shims:
        how += f", {_device_note(fn.device_param)}"
    note = shims_note(shims)
    return how + (f"; {note}" if note else "")


def _device_note(param: str) -> str:
    return f"its {param}='cuda' default given the inputs' device"


def shims_note(shims) -> str:
    """One line naming what a solution's worker made harmless off CUDA (the names
    :func:`.loader.cpu_shims` returned); empty when nothing."""
    parts = [f"{name} as a host stand-in" if name == "torch.cuda.current_stream"
             else f"{name} as no-op" for name in shims]
    return ("off CUDA: " + ", ".join(parts)) if parts else ""


def describe(sols: Dict[str, object]) -> List[dict]:
    """Provenance rows of :func:`remote_solutions`' result (unavailable ones with reason)."""
    return [s.info() if hasattr(s, "info") else
            dict(label=k, origin=getattr(s, "origin", ""), available=False, reason=s.reason)
            for k, s in sols.items()]
