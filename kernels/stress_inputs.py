"""Hard but realistic prefill inputs: keys that point the same way, long memory.

The contest generator (:func:`kernels.spec.make_prefill_inputs`) draws unit-norm
keys independently, so within a chunk ``|k_i . k_j| ~ 1 / sqrt(D)`` and the
intra-chunk system ``I + A`` is close to the identity. Real prompts repeat tokens
and topics: keys inside a chunk can be nearly parallel. With ``beta ~ 1`` and
almost no decay, ``A`` is then close to a strictly lower matrix of ones, whose
Neumann powers grow like binomial coefficients (``C(15, 8) = 6435`` inside a
16 x 16 block) while the inverse stays O(1): a low-precision solve cancels
catastrophically there and nowhere on the contest inputs. These inputs exist to
catch that.

Long memory alone: :func:`with_gates` puts one or every value head of any prefill inputs
at the slow end of the generator's own gate range (:data:`GATE_SETS`), where the long
path cannot drop a segment's transition and walks whole segments.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .spec import CONTEST, GDNShape, make_prefill_inputs

__all__ = ["make_prefill_stress_inputs", "with_gates", "GATE_SETS", "LONG_MEMORY_A",
           "LONG_MEMORY_DT"]


def make_prefill_stress_inputs(lens: Sequence[int], shape: GDNShape = CONTEST, *,
                               spread: float = 0.02, beta_logit: float = 4.0,
                               decay_logit: float = -6.0, seed: int = 0, device="cpu",
                               with_state: bool = True,
                               cu_dtype: torch.dtype = torch.int64) -> dict:
    """Contest-layout prefill inputs with correlated keys and long memory.

    Every key of a (sequence, q/k head) is ``normalize(base + spread * noise)`` for
    one random unit ``base``: ``spread=0`` gives identical keys, ``spread ~ 1 /
    sqrt(D)`` cosine similarity ~0.5, large ``spread`` the contest's independent keys.
    ``b = beta_logit`` everywhere (``beta = sigmoid(4) ~ 0.98``) and ``a = decay_logit``
    (``softplus(a + dt_bias)`` tiny: decay per token > 0.99). Other tensors as
    :func:`kernels.spec.make_prefill_inputs` with the same seed. Shapes as there:
    ``q, k [T, HQ, D]``, ``v [T, HV, D]`` bf16, ``a, b [T, HV]`` bf16, state
    ``[N, HV, D, D]`` f32 or None, ``cu_seqlens [N+1]``.
    """
    if spread < 0:
        raise ValueError(f"spread must be >= 0, got {spread}")
    x = make_prefill_inputs(lens, shape, seed=seed, device="cpu", with_state=with_state,
                            cu_dtype=cu_dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    T, HQ, D = x["k"].shape
    k = torch.empty(T, HQ, D)
    bounds = x["cu_seqlens"].tolist()
    for n in range(len(bounds) - 1):
        t0, t1 = bounds[n], bounds[n + 1]
        if t1 == t0:
            continue
        base = torch.randn(1, HQ, D, generator=gen)
        base = base / base.norm(dim=-1, keepdim=True)
        k[t0:t1] = base + spread * torch.randn(t1 - t0, HQ, D, generator=gen)
    k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    x["k"] = k.to(torch.bfloat16)
    x["b"] = torch.full_like(x["b"], beta_logit)
    x["a"] = torch.full_like(x["a"], decay_logit)
    return {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in x.items()}


#: The gate sets of :func:`with_gates` (notebook 04's gate-dependence section).
GATE_SETS = ("generator", "one long-memory head", "every head long memory")
#: The slow end of the generator's gate range (``kernels.spec._gate_params``: A in [1, 16],
#: dt in [1e-3, 1e-1]): about -0.1 of log decay per 64-token chunk, so a segment of the
#: long path keeps far more than a negligible part of what entered it.
LONG_MEMORY_A = 1.0
LONG_MEMORY_DT = 1e-3


def with_gates(inputs: dict, gates: str) -> dict:
    """``inputs`` with the gate set ``gates`` (:data:`GATE_SETS`): ``"generator"`` as given;
    ``"one long-memory head"``: value head 0 at the slow end of the generator's range
    (:data:`LONG_MEMORY_A`, :data:`LONG_MEMORY_DT`); ``"every head long memory"``: all
    heads there. A new dict sharing every other tensor; ``inputs`` is not modified."""
    if gates not in GATE_SETS:
        raise ValueError(f"gates must be one of {GATE_SETS}, got {gates!r}")
    if gates == "generator":
        return dict(inputs)
    a_log = math.log(LONG_MEMORY_A)
    dt_bias = LONG_MEMORY_DT + math.log(-math.expm1(-LONG_MEMORY_DT))   # softplus^-1(dt)
    x = dict(inputs)
    if gates == "one long-memory head":
        x["A_log"], x["dt_bias"] = inputs["A_log"].clone(), inputs["dt_bias"].clone()
        x["A_log"][0], x["dt_bias"][0] = a_log, dt_bias
    else:
        x["A_log"] = inputs["A_log"].new_full(inputs["A_log"].shape, a_log)
        x["dt_bias"] = inputs["dt_bias"].new_full(inputs["dt_bias"].shape, dt_bias)
    return x
