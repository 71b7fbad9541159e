"""Which device a run uses, and its name as a folder/table key.

``gpu_slug`` turns a device name into the key used by ``results/<slug>/`` and
``kernels/decode_configs/<slug>.json``: lowercased, runs of characters other
than ``[a-z0-9]`` replaced by one ``-``, leading/trailing ``-`` stripped::

    "NVIDIA H200"            -> "nvidia-h200"
    "NVIDIA H100 80GB HBM3"  -> "nvidia-h100-80gb-hbm3"

Without a GPU the slug is ``"cpu-interpreter"`` (CPU runs execute the Triton
kernels under ``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import re
from typing import Optional

__all__ = ["CPU_SLUG", "slugify", "gpu_slug", "has_gpu", "resolve_device"]

CPU_SLUG = "cpu-interpreter"


def slugify(name: str) -> str:
    """``name`` lowercased, runs of non ``[a-z0-9]`` characters -> ``-``, stripped."""
    return re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")


def has_gpu() -> bool:
    """Whether torch sees a CUDA GPU."""
    import torch

    return bool(torch.cuda.is_available())


def gpu_slug(name: Optional[str] = None) -> str:
    """The slug of ``name``, or of the current CUDA device when ``name`` is None.

    With ``name`` None and no GPU: ``"cpu-interpreter"``.
    """
    if name is None:
        if not has_gpu():
            return CPU_SLUG
        import torch

        name = torch.cuda.get_device_name()
    return slugify(name)


def resolve_device(device: str = "auto"):
    """``"auto"`` -> cuda when a GPU is visible, else cpu; ``"cuda"``/``"cuda:N"``
    (raises ``RuntimeError`` when there is no GPU) or ``"cpu"`` as given.

    Returns a ``torch.device``.
    """
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    d = str(device).strip().lower()
    if d == "auto":
        return torch.device("cuda" if has_gpu() else "cpu")
    if d.startswith("cuda"):
        if not has_gpu():
            raise RuntimeError(f"device={device!r} requested but torch sees no CUDA GPU "
                               f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
        return torch.device(d)
    if d == "cpu":
        return torch.device("cpu")
    raise ValueError(f"device must be 'auto', 'cuda[:N]' or 'cpu', got {device!r}")
