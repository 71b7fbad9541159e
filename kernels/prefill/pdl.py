"""Programmatic dependent launch (PDL) between the ``fused`` variant's kernels.

On Hopper a kernel launched with the PDL attribute may start while the kernel
before it in the stream is still running: its programs are placed on the SMs
once every program of the earlier kernel has called
``griddepcontrol.launch_dependents`` (or exited). Each of its programs then
calls ``griddepcontrol.wait`` before it reads anything the earlier kernel
writes; the wait returns when that kernel has completed and its memory is
visible. What this buys (measured in ``docs/notes/prefill.md``): the launch latency
between the two kernels, and whatever the later kernel does before its wait
(index arithmetic, the initial-state load of the walk) overlaps the earlier
kernel's last programs.

Rules the kernels follow (so ordering stays transitive across three kernels):

* the intra-chunk kernel and CP phase A trigger at the start of each program
  (after the last store measured no better: docs/notes/prefill.md);
* every program of a PDL-launched kernel waits before it exits, also on its
  early-return paths, so that kernel's completion implies the completion of the
  kernel before it (phase C reads what the intra-chunk kernel wrote two launches
  earlier);
* only inputs of the whole call (``initial_state``) are read before the wait.

Off CUDA (the interpreter) or on a Triton without the launch option the
kernels run with the flags off: :func:`launch_options` returns ``{}``.
"""
from __future__ import annotations

import functools

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:   # triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    _HAVE_GDC = True
except ImportError:   # pragma: no cover - older triton
    gdc_launch_dependents = gdc_wait = None
    _HAVE_GDC = False

__all__ = ["grid_wait", "grid_trigger", "pdl_supported", "launch_options"]


def _launch_option_known() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:   # pragma: no cover - no nvidia backend
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.lru_cache(maxsize=None)
def _device_ok(device: torch.device) -> bool:
    if interpret.INTERPRET or device.type != "cuda" or not _HAVE_GDC:
        return False
    if torch.cuda.get_device_capability(device)[0] < 9:
        return False
    return _launch_option_known()


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can use PDL: CUDA, compute capability >= 9.0, not the
    interpreter, and a Triton with ``launch_pdl`` and the ``gdc_*`` intrinsics (cached
    per device: it is asked on every launch)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _device_ok(device)


def launch_options(enabled: bool, device: torch.device) -> dict:
    """Keyword arguments of a PDL launch (``{"launch_pdl": True}``) or ``{}``."""
    return {"launch_pdl": True} if enabled and pdl_supported(device) else {}


if _HAVE_GDC:
    @triton.jit
    def grid_wait(ON: tl.constexpr):
        """``griddepcontrol.wait`` when ``ON``: the earlier kernel is complete after it."""
        if ON:
            gdc_wait()

    @triton.jit
    def grid_trigger(ON: tl.constexpr):
        """``griddepcontrol.launch_dependents`` when ``ON``: the next kernel may be placed."""
        if ON:
            gdc_launch_dependents()
else:   # pragma: no cover - older triton: the flags are never on
    @triton.jit
    def grid_wait(ON: tl.constexpr):
        pass

    @triton.jit
    def grid_trigger(ON: tl.constexpr):
        pass
