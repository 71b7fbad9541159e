"""Where a result came from: device, software versions, code version, parameters.

``collect_provenance(params)`` returns a JSON-ready dict::

    gpu, gpu_slug, sm_count, l2_bytes, driver, cuda, torch, triton, fla,
    flashinfer, python, git_sha, git_dirty, timing_methods_rev, fastcall, params,
    timestamp (ISO-8601 UTC), hostname

``fastcall``: whether this process's eager calls of ours could take their one-call plans
(:func:`kernels.fastcall.status` plus ``enabled``, ``GDN_FAST_LAUNCH`` not ``0``), read when
the record is made (a notebook: at its end, so ``loaded`` says whether a call built it). A
``host`` row means the plan's cost only where it is ``loaded``.

``timing_methods_rev`` is :data:`kernels.bench.timing.TIMING_METHODS_REV`: which meaning
of the timing methods the run's numbers have (``kernels.compare`` refuses to set two
revisions side by side unless told to, and then marks them).

GPU fields are ``"none"`` without a GPU; the driver comes from ``nvidia-smi``
(or pynvml) and is ``"unknown"`` when neither answers; a package that is not
installed is ``"absent"``; outside a git checkout the git fields are
``"unknown"``. Nothing here raises: provenance must never fail a run.
"""
from __future__ import annotations

import datetime as _dt
import math
import platform
import socket
import subprocess
import os
from pathlib import Path
from typing import Optional

from ..device import gpu_slug
from ..packages import DISTRIBUTIONS, package_version

__all__ = ["collect_provenance", "git_info", "full_sha", "driver_version"]

_REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(cmd, cwd=None, timeout=10) -> Optional[str]:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def full_sha(sha: str, root: Path = _REPO_ROOT) -> str:
    """``sha`` as the full 40-hex commit id when the checkout at ``root`` knows the commit
    (a short id or a full one), else ``sha`` unchanged: one format in every provenance
    record wherever git can resolve it (the report shows 7 characters)."""
    return _run(["git", "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"], cwd=root) or sha


def git_info(root: Path = _REPO_ROOT) -> dict:
    """``{"git_sha": ..., "git_dirty": bool}`` (tracked files modified), or
    ``"unknown"`` for both outside a git checkout. ``GDN_GIT_SHA`` (and
    ``GDN_GIT_DIRTY``), when set, name the commit of a copied tree and take precedence;
    the sha is the full 40-hex id (:func:`full_sha`) where ``root`` can resolve it."""
    if os.environ.get("GDN_GIT_SHA"):
        # a copy of the tree (the offline GPU host): the caller states which commit it
        # sent, and whether its tree was dirty. It wins over a .git found in the copy,
        # which on that host can be a stale checkout (seen: an older HEAD, "dirty").
        return {"git_sha": full_sha(os.environ["GDN_GIT_SHA"], root),
                "git_dirty": os.environ.get("GDN_GIT_DIRTY", "unknown")}
    sha = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if not sha:
        return {"git_sha": "unknown", "git_dirty": "unknown"}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {"git_sha": sha, "git_dirty": bool(status) if status is not None else "unknown"}


def driver_version() -> str:
    """NVIDIA driver version from ``nvidia-smi`` or pynvml, else ``"unknown"``."""
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out:
        return out.splitlines()[0].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return "unknown"


def _gpu_fields() -> dict:
    import torch

    if not torch.cuda.is_available():
        return dict(gpu="none", gpu_slug=gpu_slug(), sm_count="none", l2_bytes="none",
                    compute_capability="none", driver="none",
                    cuda=torch.version.cuda or "none")
    idx = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    return dict(gpu=p.name, gpu_slug=gpu_slug(p.name), sm_count=int(p.multi_processor_count),
                l2_bytes=int(getattr(p, "L2_cache_size", 0) or 0) or "unknown",
                compute_capability=f"{p.major}.{p.minor}", driver=driver_version(),
                cuda=torch.version.cuda or "unknown")


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        try:
            return _jsonable(obj.item())
        except Exception:
            pass
    return str(obj)


def _fastcall_fields() -> dict:
    try:
        from .. import fastcall

        rec = dict(fastcall.status())
    except Exception as e:  # pragma: no cover - provenance never fails a run
        rec = dict(mode="unknown", loaded=False, reason=f"{type(e).__name__}: {e}")
    rec["enabled"] = os.environ.get("GDN_FAST_LAUNCH", "1") != "0"
    return rec


def collect_provenance(params: Optional[dict] = None) -> dict:
    """The provenance record of a run with ``params`` (see the module docstring)."""
    try:
        gpu = _gpu_fields()
    except Exception as e:  # pragma: no cover - a broken CUDA setup
        gpu = dict(gpu=f"error: {e}", gpu_slug="unknown", sm_count="unknown",
                   l2_bytes="unknown", compute_capability="unknown", driver="unknown",
                   cuda="unknown")
    rec = dict(gpu)
    rec.update({m: package_version(m) for m in DISTRIBUTIONS})
    rec["python"] = platform.python_version()
    rec.update(git_info())
    from .timing import TIMING_METHODS_REV

    rec["timing_methods_rev"] = TIMING_METHODS_REV
    rec["fastcall"] = _fastcall_fields()
    rec["params"] = _jsonable(dict(params or {}))
    rec["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rec["hostname"] = socket.gethostname()
    return rec
