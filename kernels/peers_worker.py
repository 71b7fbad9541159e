"""Prefill peers in a worker process with a site folder of their own, measured like the rest.

FlashQLA (and FLA with its FlashQLA backend, :data:`kernels.peers.WORKER_PEERS`) needs
tilelang, which pins ``apache-tvm-ffi < 0.1.13`` while FlashInfer's bundle carries 0.1.15:
the two cannot share one Python process. The notebooks therefore run these peers in a
worker started with its own ``PYTHONPATH``:

    GDN_QLA_SITE=<folder with flash_qla, tilelang, ...>   # docs/gpu_host.md, scripts/gpu_host.sh

The worker's ``PYTHONPATH`` is ``$GDN_QLA_SITE`` (first, so its packages win), the
repository, then the parent's ``PYTHONPATH`` (FLA, for ``fla_flashqla``). Without
``GDN_QLA_SITE`` the worker inherits the parent's path (FlashQLA is then available only if
installed there).

Parent side::

    peers = remote_prefill_impls(["flashqla", "fla_flashqla"])   # RemotePeer or Unavailable
    res = peers["flashqla"].run("8192", inputs, reference, methods=["graph"], rep=50, warmup=5)
    res["gate"]        # the row of kernels.bench.gate.gate_call, computed in the worker
    res["timings"]     # [{method, median_us, p20_us, p80_us, n} or {method, error}]
    res["timeline"]    # kernels.bench.timeline summary of one call (CUDA), or None
    res = peers["flashqla"].run("131072", inputs, reference, kernel_calls=7)
    res["kernel_rows"] # kernels.bench.anatomy.kernel_times rows (CUDA), or [] with
    res["kernel_error"]  # the reason

The parent hands the inputs and the float32 reference over as a ``torch.save`` file (CPU
tensors; written once per shape, :meth:`PeerWorker.put`); the worker moves them to the
device, gates the peer with :func:`kernels.bench.gate.gate_call` (the contest rule
against that reference), and only if it passes records a timeline
(:func:`kernels.bench.timeline.record_timeline`), the per-kernel durations of
``kernel_calls`` calls (:func:`kernels.bench.anatomy.kernel_times`, what notebook 04
records for ours) and times it with
:func:`kernels.bench.timing.time_each`: the same instruments as the parent's rows, which
land in the same tables.

Protocol: one JSON request per line on the worker's stdin, one JSON response per line on
its stdout (the worker moves everything else its libraries print to stderr). Requests:
``{"op": "status", "names": [...]}``, ``{"op": "run", "name", "data", "device", "methods",
"rep", "warmup", "timeline", "trace", "kernel_calls"}``, ``{"op": "quit"}``. A response carries ``"ok":
true`` or ``"ok": false, "error": ...``. ``--serve module:function`` names the hook that
builds what the worker serves, ``function(names) -> {name: (callable or Unavailable,
version)}``: :func:`prefill_peers` (the default), the solutions' hook in
:mod:`kernels.contest.remote`, a fake in the tests.
"""
from __future__ import annotations

import atexit
import collections
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, Iterable, Optional

__all__ = ["SITE_ENV", "PREFILL_PEERS_HOOK", "worker_env", "PeerWorker", "RemotePeer",
           "remote_prefill_impls", "prefill_peers", "close_workers", "release_cached_memory",
           "main"]

SITE_ENV = "GDN_QLA_SITE"
#: The hook of the FlashQLA peers' worker (:func:`prefill_peers`).
PREFILL_PEERS_HOOK = "kernels.peers_worker:prefill_peers"
_REPO_ROOT = Path(__file__).resolve().parents[1]


def worker_env(site: Optional[str] = None, base: Optional[dict] = None) -> dict:
    """The worker's environment: ``base`` (default ``os.environ``) with ``PYTHONPATH`` =
    ``site`` (default ``$GDN_QLA_SITE``) : repository : the base ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    site = env.get(SITE_ENV) if site is None else site
    parts = ([site] if site else []) + [str(_REPO_ROOT)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class WorkerError(RuntimeError):
    """The worker died, timed out or answered an error."""


class PeerWorker:
    """One worker process (started on the first request); see the module docstring."""

    def __init__(self, serve: str = PREFILL_PEERS_HOOK, site: Optional[str] = None,
                 python: Optional[str] = None, timeout_s: float = 1800.0):
        self.serve = serve
        self.site = site
        self.python = python or sys.executable
        self.timeout_s = timeout_s
        self.proc: Optional[subprocess.Popen] = None
        self._stderr = collections.deque(maxlen=60)
        self._tmp = None
        self._data = None          # (key, path) of the inputs file written last

    # -- process
    def start(self) -> "PeerWorker":
        if self.proc is not None and self.proc.poll() is None:
            return self
        site = self.site if self.site is not None else os.environ.get(SITE_ENV)
        if site and not Path(site).is_dir():
            raise WorkerError(f"{SITE_ENV}={site} is not a folder (see docs/gpu_host.md)")
        self.proc = subprocess.Popen(
            [self.python, "-m", "kernels.peers_worker", "--serve", self.serve],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=str(_REPO_ROOT), env=worker_env(site), bufsize=1)
        self._drainer = threading.Thread(target=self._drain, args=(self.proc.stderr,),
                                         daemon=True)
        self._drainer.start()
        return self

    def _drain(self, stream):
        for line in stream:
            self._stderr.append(line.rstrip())

    def stderr_tail(self, n: int = 15) -> str:
        """The last ``n`` lines the worker wrote to stderr (a dead worker's: all of them,
        once its pipe is drained)."""
        if self.proc is not None and self.proc.poll() is not None:
            self._drainer.join(timeout=5)
        # (faulthandler's list of loaded extension modules is one long line of noise)
        lines = [ln for ln in self._stderr
                 if ln.strip() and not ln.startswith("Extension modules:")][-n:]
        return "\n".join(lines) if lines else "(empty)"

    def request(self, msg: dict) -> dict:
        """Send ``msg``, return the response; :class:`WorkerError` if the worker fails."""
        self.start()
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"peer worker is gone ({e}); its stderr:\n{self.stderr_tail()}")
        box = {}
        reader = threading.Thread(target=lambda: box.update(line=self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(self.timeout_s)
        if reader.is_alive():
            self.close(kill=True)
            raise WorkerError(f"peer worker gave no answer to {msg.get('op')!r} within "
                              f"{self.timeout_s:.0f} s; its stderr:\n{self.stderr_tail()}")
        line = box.get("line") or ""
        if not line:
            code = self.proc.wait(timeout=10)
            raise WorkerError(f"peer worker exited (code {code}) during {msg.get('op')!r}; "
                              f"its stderr:\n{self.stderr_tail()}")
        resp = json.loads(line)
        if not resp.get("ok"):
            raise WorkerError(f"peer worker: {resp.get('error')}")
        return resp

    def close(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                if kill:
                    raise OSError
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._data = None

    def __enter__(self) -> "PeerWorker":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    # -- requests
    def status(self, names: Iterable[str]) -> dict:
        """``{name: {"available", "reason", "version"}}`` plus ``"_python"``: the worker's
        interpreter and its package versions."""
        return self.request({"op": "status", "names": list(names)})["peers"]

    def put(self, key: str, inputs: dict, reference) -> str:
        """Write ``inputs`` and ``reference`` (CPU copies) for the worker; the path. The
        file of the previous key is deleted (one shape at a time)."""
        import torch

        if self._data is not None and self._data[0] == key:
            return self._data[1]
        if self._tmp is None:
            base = "/dev/shm" if Path("/dev/shm").is_dir() else None
            self._tmp = tempfile.TemporaryDirectory(prefix="gdn-peers-", dir=base)
        if self._data is not None:
            Path(self._data[1]).unlink(missing_ok=True)
        path = str(Path(self._tmp.name) / f"data-{abs(hash(key))}.pt")
        cpu = {n: (t.detach().cpu() if isinstance(t, torch.Tensor) else t)
               for n, t in inputs.items()}
        ref = None if reference is None else tuple(t.detach().cpu() for t in reference)
        torch.save({"inputs": cpu, "reference": ref}, path)
        self._data = (key, path)
        return path

    def run(self, name: str, data: str, *, device: str, methods=(), rep: int = 10,
            warmup: int = 2, timeline: bool = False, trace: Optional[str] = None,
            kernel_calls: int = 0) -> dict:
        return self.request({"op": "run", "name": name, "data": data, "device": str(device),
                             "methods": list(methods), "rep": int(rep), "warmup": int(warmup),
                             "timeline": bool(timeline), "trace": trace,
                             "kernel_calls": int(kernel_calls)})


class RemotePeer:
    """A prefill peer that runs in a :class:`PeerWorker`. Truthy when available; ``reason``
    says why not. Not callable in this process: use :meth:`run`."""

    remote = True

    def __init__(self, worker: PeerWorker, name: str, available: bool, reason: str = "",
                 version: str = ""):
        self.worker, self.name = worker, name
        self.available, self.reason, self.version = bool(available), reason, version

    def __bool__(self) -> bool:
        return self.available

    def __repr__(self) -> str:
        return f"RemotePeer({self.name!r}, available={self.available})"

    def run(self, key: str, inputs: dict, reference, *, device: str, methods=(),
            rep: int = 10, warmup: int = 2, timeline: bool = False,
            trace: Optional[str] = None, kernel_calls: int = 0) -> dict:
        """Gate (always) and, if it passes, time with ``methods`` (and record one timeline;
        with ``kernel_calls`` > 0 the per-kernel durations of that many calls,
        :func:`kernels.bench.anatomy.kernel_times`) in the worker. ``key`` names the inputs
        (one file per key). Returns ``{"gate": row, "timings": [...], "timeline": summary
        or None, "timeline_error": str, "kernel_rows": [row dicts], "kernel_error": str}``."""
        path = self.worker.put(key, inputs, reference)
        release_cached_memory()
        return self.worker.run(self.name, path, device=device, methods=methods, rep=rep,
                               warmup=warmup, timeline=timeline, trace=trace,
                               kernel_calls=kernel_calls)


def release_cached_memory() -> None:
    """Give this process's cached, unused CUDA blocks back to the driver. The worker is a
    second process on the same GPU, and PyTorch's caching allocator keeps what a process
    freed: at 1,048,576 tokens on an H100 the notebook's process held 54 GiB (mostly
    cache), and FlashQLA ran out of memory in the worker with 2.4 GiB free."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


_WORKERS: Dict[tuple, PeerWorker] = {}


def close_workers() -> None:
    """Stop every worker :func:`remote_prefill_impls` started."""
    for w in _WORKERS.values():
        w.close()
    _WORKERS.clear()


atexit.register(close_workers)


def remote_prefill_impls(names: Iterable[str], *, serve: str = PREFILL_PEERS_HOOK
                         ) -> Dict[str, object]:
    """``{name: RemotePeer or kernels.peers.Unavailable}`` from one shared worker (started
    here; the reason of a worker that cannot start becomes every peer's reason)."""
    from .peers import Unavailable

    names = list(names)
    key = (serve, os.environ.get(SITE_ENV))
    worker = _WORKERS.get(key)
    if worker is None:
        worker = _WORKERS[key] = PeerWorker(serve)
    try:
        st = worker.status(names)
    except WorkerError as e:
        worker.close(kill=True)
        _WORKERS.pop(key, None)
        return {n: Unavailable(n, f"peer worker failed to start: {e}") for n in names}
    out = {}
    for n in names:
        s = st.get(n, {})
        if s.get("available"):
            out[n] = RemotePeer(worker, n, True, version=s.get("version", ""))
        else:
            site = os.environ.get(SITE_ENV)
            where = (f" (worker site {SITE_ENV}={site})" if site else
                     f" ({SITE_ENV} is not set: the worker uses this process's packages)")
            out[n] = Unavailable(n, s.get("reason", "unknown to the worker") + where)
    return out


# --------------------------------------------------------------------------- worker side


def prefill_peers(names: Iterable[str]) -> Dict[str, tuple]:
    """The peer worker's hook: ``{name: (callable or Unavailable, version)}`` of the prefill
    peers ``names`` (:func:`kernels.peers.prefill_impls`)."""
    from .peers import peer_version, prefill_impls

    return {n: (fn, peer_version(n)) for n, fn in prefill_impls(list(names)).items()}


def _serve(hook: str, out) -> None:
    import importlib

    import torch

    module, function = hook.split(":")
    serve = getattr(importlib.import_module(module), function)
    built: dict = {}
    loaded: dict = {}

    def impl(name):
        if name not in built:
            built[name] = serve([name])[name]
        return built[name]

    def answer(obj):
        out.write(json.dumps(obj, default=float) + "\n")
        out.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "quit":
                answer({"ok": True})
                return
            if op == "status":
                from .packages import package_version

                peers = {}
                for n in req["names"]:
                    fn, version = impl(n)
                    peers[n] = dict(available=bool(fn), reason="" if fn else fn.reason,
                                    version=version)
                peers["_python"] = dict(
                    executable=sys.executable, torch=torch.__version__,
                    tilelang=package_version("tilelang"),
                    flash_qla=package_version("flash_qla", ("flash-qla",)),
                    tvm_ffi=package_version("tvm_ffi", ("apache-tvm-ffi",)))
                answer({"ok": True, "peers": peers})
            elif op == "run":
                answer(dict(ok=True, **_run(req, impl(req["name"])[0], loaded)))
            else:
                answer({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as e:  # the worker reports and keeps serving
            answer({"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]})


def _run(req: dict, fn, loaded: dict) -> dict:
    """Gate ``fn`` on the request's inputs and time it. Afterwards the worker gives back its
    cached CUDA blocks (graph pools, outputs, workspaces; the loaded inputs stay): the
    notebook's process runs the in-process peers next on the same GPU, and at 1,048,576
    tokens on an H100 FlashInfer ran out of memory there while the worker held 63.75 GiB
    after FlashQLA's run."""
    try:
        return _gate_and_time(req, fn, loaded)
    finally:
        release_cached_memory()


def _gate_and_time(req: dict, fn, loaded: dict) -> dict:
    import torch

    from .bench.gate import PASS, UNAVAILABLE, gate_call, short_reason
    from .bench.timing import time_each

    if not fn:
        return dict(gate=dict(status=UNAVAILABLE, ok=False, reason=fn.reason), timings=[],
                    timeline=None, timeline_error="", kernel_rows=[], kernel_error="")
    device = req["device"]
    if loaded.get("path") != req["data"]:
        loaded.clear()
        release_cached_memory()   # the previous shape's blocks: the notebook's process needs them
        blob = torch.load(req["data"], map_location="cpu", weights_only=False)
        inputs = {n: (t.to(device) if isinstance(t, torch.Tensor) else t)
                  for n, t in blob["inputs"].items()}
        ref = tuple(t.to(device) for t in blob["reference"])
        loaded.update(path=req["data"], inputs=inputs, ref=ref)
    inputs, ref = loaded["inputs"], loaded["ref"]
    gate = gate_call(fn, inputs, ref, device)
    res = dict(gate=gate, timings=[], timeline=None, timeline_error="", kernel_rows=[],
               kernel_error="")
    kernel_calls = int(req.get("kernel_calls") or 0)
    if gate.get("status") != PASS or not (req.get("methods") or req.get("timeline")
                                          or kernel_calls):
        return res
    call = (lambda: fn(**inputs))
    methods = list(req.get("methods") or [])
    # host time before this request's profiler sessions (the host runs slower after one:
    # docs/notes/instruments.md, "Host time after a profiler session")
    first = [m for m in methods if m == "host"]
    res["timings"] = time_each(call, first, rep=req["rep"], warmup=req["warmup"])
    if req.get("timeline"):
        try:
            from .bench.timeline import record_timeline

            tl = record_timeline(call)
            res["timeline"] = tl.summary()
            res["kernels"] = [dict(name=r.name, start_us=float(r.start_us),
                                   dur_us=float(r.dur_us)) for r in tl.gpu.itertuples()]
            if req.get("trace"):
                tl.export_chrome_trace(req["trace"])
        except Exception as e:
            res["timeline_error"] = short_reason(e)
    if kernel_calls > 0:
        try:
            from .bench import anatomy

            kt = anatomy.kernel_times(call, calls=kernel_calls)
            res["kernel_rows"] = [{c: (v.item() if hasattr(v, "item") else v)
                                   for c, v in r.items()} for r in kt.to_dict("records")]
        except Exception as e:
            res["kernel_error"] = short_reason(e)
    res["timings"] += time_each(call, [m for m in methods if m not in first], rep=req["rep"],
                                warmup=req["warmup"])
    return res


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kernels.peers_worker",
                                 description="serve implementations over stdin/stdout (JSON lines)")
    ap.add_argument("--serve", default=PREFILL_PEERS_HOOK,
                    help="module:function building what the worker serves")
    args = ap.parse_args(argv)
    # a fatal signal (abort, segfault) prints the Python stack to stderr: the reason's tail
    faulthandler.enable()
    # the protocol keeps the real stdout; whatever else prints (Python or C) goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(args.serve, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
