"""What a solution may change in the process, kept to itself: torch's global settings
(:data:`TORCH_SETTINGS`, e.g. ``torch.set_float32_matmul_precision("high")`` at import) and
its own modules.

A scoped load (:func:`kernels.contest.load_solution`, the default) leaves neither in the
process; :class:`Scope` puts them back for the length of each call (a few µs of host time),
so the solution computes as it would in flashinfer-bench. Third-party libraries it imports
for the first time stay loaded, like any library.
"""
from __future__ import annotations

import sys
from typing import Callable, Dict, List, Tuple

__all__ = ["TORCH_SETTINGS", "torch_settings", "apply_settings", "Scope"]


def _tf32(attr_owner: Callable, attr: str):
    return (lambda: getattr(attr_owner(), attr),
            lambda v: setattr(attr_owner(), attr, v))


def _settings_table():
    import torch

    matmul = lambda: torch.backends.cuda.matmul  # noqa: E731
    cudnn = lambda: torch.backends.cudnn  # noqa: E731
    return (
        ("float32_matmul_precision", torch.get_float32_matmul_precision,
         torch.set_float32_matmul_precision),
        ("cuda.matmul.allow_tf32", *_tf32(matmul, "allow_tf32")),
        ("cuda.matmul.allow_fp16_reduced_precision_reduction",
         *_tf32(matmul, "allow_fp16_reduced_precision_reduction")),
        ("cuda.matmul.allow_bf16_reduced_precision_reduction",
         *_tf32(matmul, "allow_bf16_reduced_precision_reduction")),
        ("cudnn.allow_tf32", *_tf32(cudnn, "allow_tf32")),
        ("cudnn.benchmark", *_tf32(cudnn, "benchmark")),
        ("cudnn.deterministic", *_tf32(cudnn, "deterministic")),
        ("default_dtype", torch.get_default_dtype, torch.set_default_dtype),
        ("grad_enabled", torch.is_grad_enabled, torch.set_grad_enabled),
        ("deterministic_algorithms", torch.are_deterministic_algorithms_enabled,
         torch.use_deterministic_algorithms),
        ("num_threads", torch.get_num_threads, torch.set_num_threads),
    )


#: Names of the process-wide torch settings a load restores (see the module docstring).
TORCH_SETTINGS = ("float32_matmul_precision", "cuda.matmul.allow_tf32",
                  "cuda.matmul.allow_fp16_reduced_precision_reduction",
                  "cuda.matmul.allow_bf16_reduced_precision_reduction", "cudnn.allow_tf32",
                  "cudnn.benchmark", "cudnn.deterministic", "default_dtype", "grad_enabled",
                  "deterministic_algorithms", "num_threads")


def torch_settings() -> Dict[str, object]:
    """The current values of :data:`TORCH_SETTINGS`."""
    return {name: get() for name, get, _ in _settings_table()}


def apply_settings(values: Dict[str, object]) -> None:
    """Set the settings of ``values`` that differ from the current ones."""
    for name, get, put in _settings_table():
        if name in values and get() != values[name]:
            put(values[name])


class Scope:
    """The solution's modules and torch settings, installed for the length of a call."""

    def __init__(self, prefix: str, modules: Dict[str, object], settings: Dict[str, object]):
        self.prefix, self.modules, self.settings = prefix, modules, settings
        self._saved: List[Tuple[Dict[str, object], int]] = []

    def __enter__(self):
        self._saved.append((torch_settings(), len(sys.modules)))
        sys.modules.update(self.modules)
        apply_settings(self.settings)

    def __exit__(self, *exc):
        ours, n_before = self._saved.pop()
        self.settings = torch_settings()
        if len(sys.modules) != n_before + len(self.modules):   # it imported more of itself
            self.modules.update({k: m for k, m in sys.modules.items()
                                 if k == self.prefix or k.startswith(self.prefix + ".")})
        for k in self.modules:
            sys.modules.pop(k, None)
        apply_settings(ours)
        return False
