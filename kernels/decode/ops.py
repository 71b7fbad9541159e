"""Launcher and public entry point of the GDN decode kernel.

``gdn_decode_fwd`` checks (metadata only, before anything is allocated or
launched), allocates the outputs and launches :func:`gdn_decode_kernel` once;
``gdn_decode`` is the public function with the documented signature.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..spec import resolve_scale, validate_decode_inputs
from .config import DecodeConfig
from .kernel import gdn_decode_kernel
from .table import config_for_device

__all__ = ["gdn_decode_fwd", "gdn_decode"]


def _check_buffer(name, x, dtype, shape, q) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if x.device != q.device:
        raise ValueError(f"{name} must be on {q.device} (like q), got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {x.stride()})")


def _resolve_config(config, batch: int, head_dim: int, device) -> DecodeConfig:
    if config is None:
        return config_for_device(batch, device).fit(head_dim)
    if isinstance(config, str):
        config = DecodeConfig.from_name(config)
    elif not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, a config name or None, "
                        f"got {type(config).__name__}")
    config.check(head_dim)
    return config


def gdn_decode_fwd(q, k, v, state, A_log, a, dt_bias, b, scale, config, inplace, output,
                   output_state=None):
    """Check, allocate, launch. Returns ``(output, new_state)``; see :func:`gdn_decode`."""
    shape = validate_decode_inputs(q, k, v, state, A_log, a, dt_bias, b, scale)
    HQ, HV, D = shape.num_q_heads, shape.num_v_heads, shape.head_dim
    B = q.shape[0]
    if output is not None:
        _check_buffer("output", output, torch.bfloat16, (B, 1, HV, D), q)
    if output_state is not None:
        if inplace:
            raise ValueError("output_state must be None when inplace=True (the new state "
                             "goes into state)")
        _check_buffer("output_state", output_state, torch.float32, (B, HV, D, D), q)
    cfg = _resolve_config(config, B, D, q.device)

    o = output if output is not None else q.new_empty((B, 1, HV, D))
    ht = state if inplace else (output_state if output_state is not None
                                else torch.empty_like(state))
    grid = (cfg.programs(B, HV, D),)
    gdn_decode_kernel[grid](
        q, k, v, state, ht, A_log, a, dt_bias, b, o, resolve_scale(scale, D),
        HQ=HQ, HV=HV, D=D, BV=cfg.BV, BK=cfg.block_k(D), V_TILES=cfg.V_TILES, PREFETCH=cfg.PREFETCH,
        EVICT="evict_first" if cfg.EVICT_FIRST else "",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o, ht


def gdn_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
               A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
               scale: Optional[float] = None, *,
               config: Union[DecodeConfig, str, None] = None, inplace: bool = False,
               output: Optional[torch.Tensor] = None,
               output_state: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One Gated DeltaNet decode step (one token per sequence), one kernel launch.

    Gates are computed in the kernel from their raw inputs:
    ``decay = exp(-exp(A_log) * softplus(a + dt_bias))``, ``beta = sigmoid(b)``.
    Value head ``h`` uses q/k head ``h // (HV // HQ)``.

    Args:
        q: `[B, 1, HQ, D]` bf16 queries (normalised by the caller).
        k: `[B, 1, HQ, D]` bf16 keys (normalised by the caller).
        v: `[B, 1, HV, D]` bf16 values; ``HV`` a multiple of ``HQ``.
        state: `[B, HV, D, D]` f32, k-last: element ``(k, v)`` of head ``h`` at
            ``state[b, h, v, k]``. Left untouched unless ``inplace``.
        A_log: `[HV]` f32.
        a: `[B, 1, HV]` bf16 raw decay gate input.
        dt_bias: `[HV]` f32.
        b: `[B, 1, HV]` bf16 raw beta gate input.
        scale: output scale; None or 0 means ``1/sqrt(D)``.
        config: a :class:`DecodeConfig` (or its name); None picks
            :func:`kernels.decode.config_for` of the batch size on this GPU.
        inplace: write the new state into ``state`` and return it.
        output: optional preallocated `[B, 1, HV, D]` bf16 output.
        output_state: optional preallocated `[B, HV, D, D]` f32 buffer for the new
            state (not with ``inplace``); the contest's destination-passing entry
            point (:mod:`kernels.contest`) writes into the evaluator's buffers.

    Returns:
        ``(output [B, 1, HV, D] bf16, new_state [B, HV, D, D] f32)``.

    Raises:
        TypeError / ValueError naming the offending argument, before anything
        is allocated or written.
    """
    return gdn_decode_fwd(q, k, v, state, A_log, a, dt_bias, b, scale, config, inplace, output,
                          output_state)
