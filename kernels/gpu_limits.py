"""Per-architecture limits that our launch rules and ``kernels.arch_check`` use.

One row per compute capability we compile for (``python -m kernels.arch_check``):
the largest shared memory one block may use (opt-in, bytes), the registers per SM,
the resident threads per SM, whether the architecture has programmatic dependent
launch (``griddepcontrol``, Hopper and newer), and the SM count of a representative
GPU (the launch rules size grids by SM count; on a real GPU the rules read the
device's own count). The shared-memory and thread figures are the CUDA programming
guide's per-compute-capability table; on a GPU, :func:`device_limits` reads the
device's own ``shared_memory_per_block_optin`` and SM count from torch instead, so
the table only matters where there is no device (compile checks, CPU tests).
Checked on hardware: sm_90 only (H100, H200: 232,448 bytes opt-in, as here).

Importing this module imports neither torch nor triton.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

__all__ = ["ArchLimits", "ARCHS", "limits_for", "device_limits"]


@dataclass(frozen=True)
class ArchLimits:
    cc: int                    #: compute capability as 10 * major + minor (80, 86, ...)
    name: str                  #: the representative GPU whose SM count is used
    smem_per_block: int        #: largest shared memory of one block (opt-in), bytes
    regs_per_sm: int           #: 32-bit registers per SM
    threads_per_sm: int        #: resident threads per SM
    n_sm: int                  #: SMs of the representative GPU
    pdl: bool                  #: programmatic dependent launch (griddepcontrol)


_KB = 1024
ARCHS: Dict[int, ArchLimits] = {a.cc: a for a in (
    ArchLimits(80, "A100", 163 * _KB, 65536, 2048, 108, False),
    ArchLimits(86, "RTX 3090", 99 * _KB, 65536, 1536, 82, False),
    ArchLimits(89, "RTX 4090", 99 * _KB, 65536, 1536, 128, False),
    ArchLimits(90, "H100 SXM", 227 * _KB, 65536, 2048, 132, True),
    ArchLimits(100, "B200", 227 * _KB, 65536, 2048, 148, True),
    ArchLimits(120, "RTX 5090", 99 * _KB, 65536, 1536, 170, True),
)}


def limits_for(cc: int) -> ArchLimits:
    """The row of compute capability ``cc`` (``80``, or ``(8, 0)``); an unknown one gets
    the row of the nearest lower known capability of the same major version, else the
    smallest shared-memory row (a new GPU is not assumed to be larger)."""
    if isinstance(cc, tuple):
        cc = 10 * cc[0] + cc[1]
    cc = int(cc)
    if cc in ARCHS:
        return ARCHS[cc]
    same = [c for c in ARCHS if c // 10 == cc // 10 and c < cc]
    if same:
        return ARCHS[max(same)]
    return min(ARCHS.values(), key=lambda a: (a.smem_per_block, -a.cc))


def device_limits(device) -> ArchLimits:
    """The limits of a CUDA ``device`` as its driver reports them (shared memory per
    block opt-in, SM count; the rest from its capability's row). Off CUDA: the sm_90 row
    (the interpreter runs the Hopper rules, as the measured defaults do)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return ARCHS[90]
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_limits(index)


_cache: Dict[int, ArchLimits] = {}


def _cuda_limits(index: int) -> ArchLimits:
    if index not in _cache:
        import torch

        p = torch.cuda.get_device_properties(index)
        row = limits_for((p.major, p.minor))
        smem = int(getattr(p, "shared_memory_per_block_optin", 0) or row.smem_per_block)
        _cache[index] = ArchLimits(10 * p.major + p.minor, p.name, smem, row.regs_per_sm,
                                   row.threads_per_sm, p.multi_processor_count,
                                   p.major >= 9)
    return _cache[index]
