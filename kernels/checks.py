"""The contest's correctness rule and error summaries.

An element passes when ``|x - ref| <= atol`` or ``|x - ref| <= rtol * |ref|``
(``atol = rtol = 1e-2``); shapes and dtypes must match exactly and NaN/Inf
fail. Every check also reports max abs error and relative-L2 error.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch

__all__ = ["ATOL", "RTOL", "CheckResult", "check_close", "check_outputs"]

ATOL = 1e-2
RTOL = 1e-2


@dataclass
class CheckResult:
    """Outcome of one comparison against the reference."""

    ok: bool
    max_abs_err: float
    rel_l2_err: float
    n_bad: int
    n_total: int
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def check_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float = ATOL,
                rtol: float = RTOL, name: str = "output") -> CheckResult:
    """Compare one tensor with its reference under the contest rule."""
    if tuple(actual.shape) != tuple(expected.shape):
        return CheckResult(False, float("inf"), float("inf"), expected.numel(), expected.numel(),
                           f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        return CheckResult(False, float("inf"), float("inf"), expected.numel(), expected.numel(),
                           f"{name}: dtype {actual.dtype} != {expected.dtype}")
    # on the device of ``actual`` (a GPU checks a 512-sequence fp32 state in
    # milliseconds; copying it to the host took ~0.5 s per check)
    x = actual.detach().float()
    r = expected.detach().to(x.device).float()
    finite = torch.isfinite(x)
    diff = (x - r).abs()
    good = finite & ((diff <= atol) | (diff <= rtol * r.abs()))
    n_bad = int((~good).sum())
    n = x.numel()
    max_abs = float(diff[finite].max()) if bool(finite.any()) else float("inf")
    if not bool(finite.all()):
        max_abs = float("inf")
    denom = float(r.norm())
    rel = float((x - r).norm()) / denom if denom > 0 else float((x - r).norm())
    if not bool(finite.all()):
        rel = float("inf")
    reason = "" if n_bad == 0 else (
        f"{name}: {n_bad}/{n} elements outside atol={atol}/rtol={rtol}"
        + ("" if bool(finite.all()) else f" ({int((~finite).sum())} NaN/Inf)"))
    return CheckResult(n_bad == 0, max_abs, rel, n_bad, n, reason)


def check_outputs(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
                  names=("output", "new_state", "intermediate_states"), **tol) -> CheckResult:
    """Check every output (``(output, new_state)``, plus the intermediate states when
    a decode returns them); the worst numbers of them. A different number of
    outputs fails."""
    if len(actual) != len(expected):
        n = sum(e.numel() for e in expected)
        return CheckResult(False, float("inf"), float("inf"), n, n,
                           f"{len(actual)} outputs returned, {len(expected)} expected")
    results = [check_close(a, e, name=n, **tol) for a, e, n in zip(actual, expected, names)]
    return CheckResult(
        ok=all(r.ok for r in results),
        max_abs_err=max(r.max_abs_err for r in results),
        rel_l2_err=max(r.rel_l2_err for r in results),
        n_bad=sum(r.n_bad for r in results),
        n_total=sum(r.n_total for r in results),
        reason="; ".join(r.reason for r in results if r.reason),
    )
