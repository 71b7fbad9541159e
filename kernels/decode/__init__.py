"""Triton GDN decode: kernel, launcher, config space and per-GPU config tables.

- :mod:`.kernel`  ``gdn_decode_kernel`` (Triton)
- :mod:`.ops`     ``gdn_decode_fwd`` launcher and the public ``gdn_decode``
- :mod:`.config`  ``DecodeConfig``, ``FLA_LIKE``, ``config_grid``
- :mod:`.table`   ``config_for`` / ``load_config_table`` / ``write_config_table``
- :mod:`.replay`  ``gdn_replay_decode``, ``ReplayRing``: a checkpoint written back every
  ``L`` tokens and a ring of residuals (:mod:`.replay_kernel`)
"""
from .config import FLA_LIKE, DecodeConfig, config_grid
from .ops import gdn_decode, gdn_decode_fwd
from .replay import ReplayRing, gdn_replay_decode, replay_state_bytes
from .table import (CONFIG_DIR, DEFAULT_TABLE, clear_config_cache, config_for,
                    load_config_table, write_config_table)

__all__ = ["gdn_decode", "gdn_decode_fwd", "DecodeConfig", "FLA_LIKE", "config_grid",
           "config_for", "load_config_table", "write_config_table", "clear_config_cache",
           "DEFAULT_TABLE", "CONFIG_DIR", "gdn_replay_decode", "ReplayRing",
           "replay_state_bytes"]
