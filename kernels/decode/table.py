"""Batch-adaptive config dispatch: per-GPU tables of batch size -> config.

A table is the data file ``kernels/decode_configs/<gpu-slug>.json``::

    {"gpu": "nvidia-h200", "source": "...", "timestamp": "...",
     "configs": {"1": "BV8-w1-s1-t1", "64": "BV32-w4-s1-t1"}, ...metadata}

written by :func:`write_config_table` (the decode sweep) and read by
:func:`load_config_table`. :func:`config_for` applies the fallback rules:

1. no table for the GPU (unknown GPU, or no GPU at all) -> :data:`DEFAULT_TABLE`,
   a built-in heuristic;
2. a batch size between table entries -> the entry of the largest table batch
   size at or below it; below the smallest entry -> the smallest entry;
3. above the largest entry -> the largest entry (rule 2 covers it).

Loaded tables are cached per file; :func:`write_config_table` refreshes the cache.
"""
from __future__ import annotations

import bisect
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, Mapping, Optional, Union

from .config import DecodeConfig

__all__ = ["CONFIG_DIR", "DEFAULT_TABLE", "HEURISTIC_SOURCE", "config_for", "config_for_device",
           "load_config_table", "write_config_table", "table_path", "clear_config_cache"]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "decode_configs"
HEURISTIC_SOURCE = "heuristic (not yet measured)"

_C = DecodeConfig.from_name
#: Built-in fallback for GPUs without a table (also the content of the initial,
#: unmeasured Hopper tables). Small batches need many small programs to cover
#: ~132 SMs; large batches want fewer, fatter programs (16 KiB tiles) that still
#: keep >= ~40 KiB of state loads in flight per SM.
DEFAULT_TABLE: Dict[int, DecodeConfig] = {
    1: _C("BV8-w1-s1-t1-k32"),    # 128 one-warp programs at HV=8, D=128: ~one per SM
    4: _C("BV16-w2-s1-t1-k32"),   # 256 programs
    8: _C("BV16-w2-s1-t1-k32"),   # 512 programs
    16: _C("BV32-w4-s1-t1-k32"),  # 512 programs of 16 KiB tiles
    32: _C("BV32-w4-s1-t1-k32"),  # 1024 programs
    48: _C("BV32-w4-s1-t1-k32"),  # 1536 programs
    64: _C("BV32-w4-s1-t1-k32"),  # 2048 programs, ~2 waves of 16 KiB loads per SM
}

PathLike = Union[str, Path]
# (gpu_slug, path as given) -> table: every decode call looks its table up, and building and
# hashing a Path each time was a fifth of the call's host time (docs/notes/decode.md,
# "Decode's host path")
_cache: Dict[tuple, Optional[Dict[int, DecodeConfig]]] = {}
_device_slugs: Dict[int, str] = {}
_picked: Dict[tuple, DecodeConfig] = {}   # config_for_device's answers


def table_path(gpu_slug: str, path: Optional[PathLike] = None) -> Path:
    """Where the table of ``gpu_slug`` lives: ``path`` if it is a ``.json`` file,
    ``path/<gpu_slug>.json`` if it is a folder, else ``CONFIG_DIR/<gpu_slug>.json``."""
    if path is None:
        return CONFIG_DIR / f"{gpu_slug}.json"
    p = Path(path)
    return p if p.suffix == ".json" else p / f"{gpu_slug}.json"


def clear_config_cache() -> None:
    """Forget loaded tables (they are re-read on next use)."""
    _cache.clear()
    _picked.clear()


def load_config_table(gpu_slug: str, path: Optional[PathLike] = None
                      ) -> Optional[Dict[int, DecodeConfig]]:
    """The table of ``gpu_slug`` as ``{batch: DecodeConfig}``, or None if it has none.

    A file that exists but cannot be parsed raises ``ValueError`` naming it.
    """
    key = (gpu_slug, None if path is None else str(path))
    if key in _cache:
        return _cache[key]
    p = table_path(gpu_slug, path)
    table = None
    if p.is_file():
        try:
            raw = json.loads(p.read_text())
            table = {int(bs): DecodeConfig.from_name(name) for bs, name in raw["configs"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed decode config table {p}: {e}") from e
        if not table:
            raise ValueError(f"decode config table {p} has no configs")
    _cache[key] = table
    return table


def write_config_table(table: Mapping[int, Union[DecodeConfig, str]], gpu_slug: str,
                       path: Optional[PathLike] = None, *, source: str = "measured",
                       meta: Optional[Mapping] = None) -> Path:
    """Write ``{batch: config}`` as the table of ``gpu_slug``; return the file.

    Args:
        table: batch size -> :class:`DecodeConfig` (or its name); non-empty.
        gpu_slug: e.g. ``"nvidia-h200"``.
        path: a ``.json`` file or a folder (default ``kernels/decode_configs/``).
        source: how the table was obtained (e.g. ``"sweep cupti_cold"``).
        meta: extra JSON-serialisable metadata (provenance, timing method...).
    """
    if not table:
        raise ValueError("table must map at least one batch size to a config")
    configs = {}
    for bs in sorted(table, key=int):
        cfg = table[bs]
        cfg = DecodeConfig.from_name(cfg) if isinstance(cfg, str) else cfg
        if int(bs) < 1:
            raise ValueError(f"table batch sizes must be >= 1, got {bs}")
        configs[str(int(bs))] = cfg.name
    doc = {"gpu": gpu_slug, "source": source,
           "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    doc.update(dict(meta or {}))
    doc["configs"] = configs
    p = table_path(gpu_slug, path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(p)
    clear_config_cache()   # any key may name this file (a folder or the file itself)
    return p


def _pick(table: Mapping[int, DecodeConfig], batch: int) -> DecodeConfig:
    keys = sorted(table)
    i = bisect.bisect_right(keys, batch) - 1
    return table[keys[max(i, 0)]]


def _current_slug(device=None) -> Optional[str]:
    import torch

    if isinstance(device, (str, int)):   # "cpu", "cuda:1", 0: as torch reads them
        device = torch.device(device)
    if device is not None and device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    idx = device.index if device is not None and device.index is not None \
        else torch.cuda.current_device()
    slug = _device_slugs.get(idx)
    if slug is None:
        from ..device import gpu_slug

        slug = _device_slugs[idx] = gpu_slug(torch.cuda.get_device_name(idx))
    return slug


def config_for(batch: int, gpu_slug: Optional[str] = None,
               path: Optional[PathLike] = None) -> DecodeConfig:
    """The config to use for ``batch`` sequences on ``gpu_slug`` (default: this GPU).

    Table of the GPU if there is one, else :data:`DEFAULT_TABLE`; see the module
    docstring for the rules between and beyond table entries.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    slug = gpu_slug if gpu_slug is not None else _current_slug()
    table = load_config_table(slug, path) if slug else None
    return _pick(table or DEFAULT_TABLE, batch)


def config_for_device(batch: int, device, head_dim: Optional[int] = None) -> DecodeConfig:
    """:func:`config_for` on the GPU holding ``device`` (the default table off-GPU),
    fitted to ``head_dim`` when given; remembered per argument until the tables change
    (every eager decode call asks)."""
    key = (batch, device, head_dim)
    cfg = _picked.get(key)
    if cfg is None:
        slug = _current_slug(device)
        table = load_config_table(slug) if slug else None
        cfg = _pick(table or DEFAULT_TABLE, batch)
        cfg = _picked[key] = cfg if head_dim is None else cfg.fit(head_dim)
    return cfg
