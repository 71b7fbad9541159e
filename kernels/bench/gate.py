"""The correctness gate of one call, and the statuses a gated row carries.

Every timing run gates each implementation against the reference on the same
inputs first: a call that fails, raises or is unavailable is reported, not timed.
"""
from __future__ import annotations

from typing import Callable

__all__ = ["PASS", "FAIL", "ERROR", "UNAVAILABLE", "short_reason", "gate_call"]

PASS, FAIL, ERROR, UNAVAILABLE = "pass", "fail", "error", "unavailable"


def short_reason(e: BaseException, limit: int = 300) -> str:
    """``e`` as one line of at most ``limit`` characters (a row's ``reason``)."""
    msg = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def gate_call(fn: Callable, inputs: dict, reference, device: str) -> dict:
    """Run ``fn(**inputs)`` once and check it against ``reference`` (out, state).

    Returns a dict: ``status`` (pass/fail/error), ``ok``, the error numbers of
    :func:`kernels.checks.check_outputs`, ``input_untouched`` (whether the
    input ``state`` survived; it is restored when it did not) and ``reason``.
    """
    import torch
    from kernels.checks import check_outputs

    state = inputs.get("state")
    before = state.clone() if isinstance(state, torch.Tensor) else None
    row = dict(status=ERROR, ok=False, max_abs_err=float("nan"), rel_l2_err=float("nan"),
               n_bad=-1, n_total=-1, input_untouched=None, reason="")
    try:
        out = fn(**inputs)
        _sync(device)
        res = check_outputs(tuple(out), tuple(reference))
        row.update(res.as_dict())
        row["status"] = PASS if res.ok else FAIL
    except Exception as e:  # an implementation that raises is reported, not fatal
        row["reason"] = short_reason(e)
    if before is not None:
        untouched = bool(torch.equal(state, before))
        row["input_untouched"] = untouched
        if not untouched:
            state.copy_(before)
            if row["status"] == PASS:
                row["reason"] = "outputs correct, but the input state was modified (restored)"
    return row
