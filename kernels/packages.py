"""Which Python packages are installed, and their versions.

Read from the distributions' metadata, so nothing is imported: the peers' status
and every run's provenance name the versions they ran with.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util

__all__ = ["DISTRIBUTIONS", "package_version"]

#: module name -> distribution names to try, in order (the packages provenance records).
DISTRIBUTIONS = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
    "fla": ("fla-core", "flash-linear-attention"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "flash_qla": ("flash-qla",),
}


def package_version(module: str, dists=None) -> str:
    """Installed version of ``module`` (via its distribution's metadata), else
    ``"present (version unknown)"`` when importable, else ``"absent"``."""
    for d in dists or DISTRIBUTIONS.get(module, (module,)):
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            continue
        except Exception:  # pragma: no cover - broken metadata
            continue
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return "present (version unknown)" if found else "absent"
