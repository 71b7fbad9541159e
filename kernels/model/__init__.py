"""Our kernels inside a model: FLA's signature (:mod:`.fla_compat`) and the switch that
puts them into a loaded transformers model (:mod:`.hf`, ``use_ours(model)``).

Importing this package does not import transformers (only :func:`.hf.use_ours` does).
"""
from __future__ import annotations

from .fla_compat import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from .hf import use, use_ours

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "use_ours", "use"]
