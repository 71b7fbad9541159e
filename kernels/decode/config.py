"""The decode kernel's launch configuration: explicit levers, no autotuning.

A :class:`DecodeConfig` fixes how the ``[B, HV, V, K]`` fp32 state is cut into
programs. One program owns ``V_TILES`` consecutive tiles of ``BV`` state rows
(each row is one value index ``v``: ``K`` contiguous floats) of one
``(sequence, value head)`` pair; it loads q, k and the gate scalars once and
walks its tiles. The grid therefore has ``B * HV * D / (BV * V_TILES)`` programs.

Levers:

- ``BV``: rows per tile (the tile lives in registers: ``BV*D/(32*num_warps)``
  floats per thread).
- ``num_warps``: warps per program.
- ``num_stages``: passed to Triton. The kernel has no ``tl.dot``, and on
  triton 3.7 the generated PTX is identical for every value (no ``cp.async``
  pipelining of the tile loop); kept as an explicit lever so a sweep can show it.
- ``V_TILES``: tiles one program walks, reusing its q/k/gate loads.
- ``BK``: K chunk width of the thread layout (capped at ``D``). A row is held
  as ``D/BK`` chunks; ``BK/4`` lanes share a row (16-byte vectors), so a row
  reduction costs ``log2(BK/4)`` shuffles. ``BK=128`` (the default) is FLA's
  layout: a whole 128-float row per warp instruction, 5 shuffles per reduction.
- ``PREFETCH``: issue the load of tile ``t+1`` before updating tile ``t``
  (two tiles in flight per program); only meaningful with ``V_TILES > 1``.
- ``EVICT_FIRST``: mark the streamed state loads/stores ``evict_first``.

Names look like ``"BV8-w1-s1-t1"``, with ``-k<BK>`` (when ``BK != 128``),
``-pf`` and ``-ef`` appended.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, List

__all__ = ["DecodeConfig", "FLA_LIKE", "config_grid"]

_NAME_RE = re.compile(r"^BV(\d+)-w(\d+)-s(\d+)-t(\d+)(?:-k(\d+))?(-pf)?(-ef)?$")


def _pow2(x) -> bool:
    return isinstance(x, int) and x >= 1 and not (x & (x - 1))


@dataclass(frozen=True)
class DecodeConfig:
    """One launch configuration of :func:`kernels.decode.gdn_decode`.

    Args:
        BV: state rows (value indices) per tile, a power of two.
        num_warps: warps per program, a power of two.
        num_stages: Triton's software-pipelining depth (see the module docstring).
        V_TILES: `BV`-row tiles one program walks; ``BV * V_TILES`` must divide ``D``.
        BK: K chunk width of the thread layout, a power of two >= 4 (capped at ``D``).
        PREFETCH: load tile ``t+1`` before updating tile ``t``.
        EVICT_FIRST: ``evict_first`` cache policy on the state stream.
    """

    BV: int
    num_warps: int
    num_stages: int
    V_TILES: int = 1
    BK: int = 128
    PREFETCH: bool = False
    EVICT_FIRST: bool = False

    def __post_init__(self):
        for field in ("BV", "num_warps", "V_TILES", "BK"):
            val = getattr(self, field)
            if not _pow2(val):
                raise ValueError(f"DecodeConfig.{field} must be a power of two >= 1, got {val!r}")
        if self.BK < 4:
            raise ValueError(f"DecodeConfig.BK must be >= 4 (one 16-byte vector), got {self.BK}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"DecodeConfig.num_stages must be an int >= 1, got {self.num_stages!r}")

    def __hash__(self) -> int:
        """The fields' hash, computed once (every eager decode call hashes its config into
        its launch key)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.BV, self.num_warps, self.num_stages,
                                               self.V_TILES, self.BK, self.PREFETCH,
                                               self.EVICT_FIRST))
        return h

    @property
    def name(self) -> str:
        """``"BV8-w1-s1-t1"`` plus ``-k<BK>`` / ``-pf`` / ``-ef`` where they differ
        from the defaults."""
        s = f"BV{self.BV}-w{self.num_warps}-s{self.num_stages}-t{self.V_TILES}"
        if self.BK != 128:
            s += f"-k{self.BK}"
        return s + ("-pf" if self.PREFETCH else "") + ("-ef" if self.EVICT_FIRST else "")

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_name(cls, name: str) -> "DecodeConfig":
        """Parse a :attr:`name` back into a config (``ValueError`` if malformed)."""
        m = _NAME_RE.match(str(name).strip())
        if not m:
            raise ValueError(f"not a decode config name: {name!r} "
                             f"(expected like 'BV8-w1-s1-t1' or 'BV32-w4-s1-t2-k32-pf')")
        bv, w, s, t, bk, pf, ef = m.groups()
        return cls(int(bv), int(w), int(s), int(t), BK=int(bk) if bk else 128,
                   PREFETCH=bool(pf), EVICT_FIRST=bool(ef))

    # ------------------------------------------------------------------ fitting to D
    def check(self, head_dim: int) -> None:
        """Raise ``ValueError`` (naming ``config``) unless this config tiles ``head_dim``."""
        span = self.BV * self.V_TILES
        if span > head_dim or head_dim % span:
            raise ValueError(f"config {self.name}: BV*V_TILES={span} must divide head size D={head_dim}")

    def block_k(self, head_dim: int) -> int:
        """The chunk width the kernel uses for ``head_dim``: ``min(BK, D)``."""
        return min(self.BK, head_dim)

    def programs(self, batch: int, num_v_heads: int, head_dim: int) -> int:
        """Grid size for a batch: ``B * HV * D / (BV * V_TILES)``."""
        return batch * num_v_heads * (head_dim // (self.BV * self.V_TILES))

    def fit(self, head_dim: int) -> "DecodeConfig":
        """The nearest valid config for ``head_dim`` (used for table configs on small D)."""
        bv = min(self.BV, head_dim)
        tiles = max(1, min(self.V_TILES, head_dim // bv))
        warps = max(1, min(self.num_warps, bv * head_dim // 128))
        if (bv, tiles, warps) == (self.BV, self.V_TILES, self.num_warps):
            return self
        return replace(self, BV=bv, V_TILES=tiles, num_warps=warps,
                       PREFETCH=self.PREFETCH and tiles > 1)


FLA_LIKE = DecodeConfig(BV=8, num_warps=1, num_stages=1, V_TILES=1)
"""FLA fused_recurrent's layout: 16 one-warp programs per head at D=128, each
re-loading q, k and the gates, a whole 128-float row per warp instruction."""


def config_grid(BVs: Iterable[int] = (8, 16, 32, 64, 128), warps: Iterable[int] = (1, 2, 4, 8),
                stages: Iterable[int] = (1,), v_tiles: Iterable[int] = (1, 2, 4),
                BKs: Iterable[int] = (16, 32, 128), prefetch: Iterable[bool] = (False, True),
                evict_first: Iterable[bool] = (False,), head_dim: int = 128,
                max_tile_regs: int = 128) -> List[DecodeConfig]:
    """Every valid, non-redundant config of the given levers for ``head_dim``.

    Dropped: ``BV * V_TILES`` not dividing ``head_dim``; ``BK > head_dim``;
    warps that would hold copies of the same rows (``BV * BK < 128 * num_warps``,
    i.e. fewer row slots than lanes); ``num_stages > 1`` or ``PREFETCH`` with
    one tile (no loop); tiles needing more than ``max_tile_regs`` fp32 registers
    per thread (``BV*D/(32*num_warps)``, twice that with ``PREFETCH``).
    """
    out = []
    for bv in BVs:
        for t in v_tiles:
            span = bv * t
            if span > head_dim or head_dim % span:
                continue
            for bk in BKs:
                if bk > head_dim:
                    continue
                for w in warps:
                    if bv * bk < 128 * w:
                        continue
                    for s in stages:
                        for pf in prefetch:
                            if t == 1 and (s > 1 or pf):
                                continue
                            if bv * head_dim * (2 if pf else 1) > max_tile_regs * 32 * w:
                                continue
                            for ef in evict_first:
                                out.append(DecodeConfig(bv, w, s, t, BK=bk, PREFETCH=pf,
                                                        EVICT_FIRST=ef))
    return out
