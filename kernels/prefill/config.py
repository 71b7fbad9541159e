"""The prefill's levers and launch rules: explicit, no autotuning.

Every default was measured on an H200 or H100 (graph replay, the contest shapes): the
numbers are in docs/notes/prefill.md ("Numbers behind the rules"). The ``fused``
variant's path with the defaults (the compositions before it launch the same kernels):

* the intra-chunk kernel (gates + cumsum + ``A`` + solve) stores ``Tb = Tm diag(beta)``
  and ``scale * Aqk`` (``[T, HV, 64]`` bf16 each; the ``"tm"`` intermediates), the walk
  forms ``v_new`` and the outputs from ``k``, ``v``, ``q`` itself (less traffic than
  handing it ``w``, ``u``, ``P``, ``ob``);
* the ``"batched"`` solve with a 128-register cap (:func:`intra_maxnreg_rule`), 4 warps;
* walks: bf16 products, tile width by :func:`walk_tile_rule`, warps and stages by
  :func:`walk_launch_rule`, the transposed walk by :func:`walk_transposed_rule`;
* calls of up to ``recurrent_max_T`` tokens: the token-recurrent kernel
  (:mod:`.recurrent`, :func:`recurrent_rule`); up to ``single_launch_max_T``: one launch
  (walker programs);
* programmatic dependent launch of the walks (:mod:`.pdl`), triggered at the start of
  the earlier kernel's programs;
* context parallelism from 64 chunks per sequence (:mod:`.context_parallel`), phase C
  chaining the segment transitions itself (3 launches).

The levers other experiments used are gone; ``docs/notes/prefill.md`` ("Prune (issue 22)")
lists each with what it taught and the commit that still has it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

__all__ = ["PrefillConfig", "DEFAULT_CONFIG", "ACCURATE_CONFIG", "walk_tile_rule",
           "intra_maxnreg_rule", "walk_pipe_skip_rule", "walk_transposed_rule",
           "walk_warps_rule", "walk_stages_rule", "walk_launch_rule", "SHORT_WALK_CHUNKS",
           "WALK_3_STAGE_SMEM", "INTRA_WARPS", "SUMMARY_WARPS", "SUMMARY_STAGES", "WALKER_BV",
           "RECURRENT_MAX_T", "recurrent_rule", "walk_gluon_rule", "TAIL_SPLIT_CHUNKS",
           "tail_split_rule"]

#: ``num_warps`` of the intra-chunk kernel (8 were slower).
INTRA_WARPS = 4
#: CP phase A: warps and stages (the third stage paid; ~115 KB of shared memory at D = 128);
#: phase B: warps.
SUMMARY_WARPS, SUMMARY_STAGES = 4, 3
#: State columns per walker program of the one-launch path: narrower walkers miscompiled on
#: triton 3.6 (right on the interpreter), so walkers run only where the head size is >= 64.
WALKER_BV = 64


#: Calls of up to this many tokens (all sequences together) take the token-recurrent kernel
#: (:mod:`.recurrent`) instead of the chunked path: the crossover of the two, measured in
#: notebook 02 ("Recurrent or chunked", ``recurrent_crossover.csv``). The total bounds the
#: longest sequence, which sets the recurrent kernel's serial steps, without a sync. The
#: smallest crossover of that section on the H200 (B=1: 24; a mixed batch of 4: 32), with
#: the kernel's 8-token blocks (docs/notes/recurrent_prefill.md).
RECURRENT_MAX_T = 24


#: Chunks at the end of each sequence in which the long path's phase C splits the two
#: products that carry the final state's bf16 error, ``rhs^T Tb^T`` and the state update
#: (their register operands, the residual and the decayed ``v_new``, as bf16 hi + lo:
#: ``"bf16x2"``, :mod:`.dots`), where the config's products are ``"bf16"``. The state
#: forgets what entered before these chunks, so its error is about that of splitting every
#: chunk's, at a fraction of the cost (the CPU emulation, its spread and the predicted cost:
#: docs/notes/long_context.md, "Long memory at 32k: which rounding").
TAIL_SPLIT_CHUNKS = 8


def tail_split_rule(config: "PrefillConfig") -> int:
    """Phase C's split tail (``tail`` of :func:`.pipeline.phase_c_fwd`):
    :data:`TAIL_SPLIT_CHUNKS` with ``"bf16"`` products, 0 with ``"bf16x2"`` (every product
    split already)."""
    return TAIL_SPLIT_CHUNKS if config.precision == "bf16" else 0


def _pow2(x) -> bool:
    return isinstance(x, int) and x >= 1 and not (x & (x - 1))


@dataclass(frozen=True)
class PrefillConfig:
    """The prefill's levers (each one used by a default or by :data:`ACCURATE_CONFIG`).

    Args:
        walk_BV: state tile width of the walk; None: :func:`walk_tile_rule`.
        storage: ``"compact"`` (bf16 ``Tb`` / ``Aqk``, like FLA's intermediates) or
            ``"precise"`` (fp32): compact halves the bytes at ~4e-3 state error on
            long-memory heads.
        solve: the intra-chunk solve, ``"batched"`` (16 x 16 block formulas in registers,
            the faster) or ``"blocks"`` (the blocks through a scratch, fp32 ``ieee``
            products: the accurate preset's).
        precision: products with the state and the inline outputs: ``"bf16"`` (one
            tensor-core pass, like FLA; faster at the peers' error) or ``"bf16x2"`` (~fp32).
        cp_chain_precision: products ``M_s @ S`` of phase C's chain: ``"bf16"`` (faster, same
            errors to the 4th digit), ``"bf16x2"`` or ``"tf32x3"`` (~fp32).
        pdl: launch the walks with programmatic dependent launch (:mod:`.pdl`; Hopper and
            newer, ignored elsewhere).
        single_launch_max_T: calls of up to this many tokens (no CP, head size >= 64) are
            one launch: walker programs in the intra-chunk grid walk each sequence as its
            chunk programs flag their chunks (no host gap on the eager path; at T=512 one
            launch was slower, hence 128). 0: never.
        recurrent_max_T: calls of up to this many tokens without forced CP take the
            token-recurrent kernel (:func:`recurrent_rule`); default
            :data:`RECURRENT_MAX_T`. 0: never (notebook 02's chunked rows).
        log_eps: the negligible threshold, a natural log: the CP walks drop a segment's
            transition, and the chunks' contributions before the last one that counts,
            where the decay bounds them by ``exp(log_eps)`` on the way to the segment's end
            (the kernels' ``LOG_EPS``; :mod:`.context_parallel`). -20: at most 2e-9 of the
            state, below its float32 rounding (docs/notes/long_context.md, "Prefill v11");
            it decides accuracy, so every kernel reads this one value.
        gluon_walk: let :func:`walk_gluon_rule` pick the Gluon phase C of the long path
            where it applies (sm_90); False: always the Triton phase C (the A/B test of
            the two, ``tests/prefill/test_gluon.py``).

    Measured numbers: docs/notes/prefill.md, "Numbers behind the rules".
    """

    walk_BV: Optional[int] = None
    storage: str = "compact"
    solve: str = "batched"
    precision: str = "bf16"
    cp_chain_precision: str = "bf16"
    pdl: bool = True
    single_launch_max_T: int = 128
    recurrent_max_T: int = RECURRENT_MAX_T
    log_eps: float = -20.0
    gluon_walk: bool = True

    def __post_init__(self):
        if self.walk_BV is not None and (not _pow2(self.walk_BV) or self.walk_BV < 16):
            raise ValueError(f"walk_BV must be None or a power of two >= 16, got {self.walk_BV}")
        for f, ok in (("storage", ("compact", "precise")), ("solve", ("batched", "blocks")),
                      ("precision", ("bf16", "bf16x2")),
                      ("cp_chain_precision", ("bf16", "bf16x2", "tf32x3"))):
            if getattr(self, f) not in ok:
                raise ValueError(f"{f} must be one of {', '.join(map(repr, ok))}, "
                                 f"got {getattr(self, f)!r}")
        for f in ("pdl", "gluon_walk"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"{f} must be a bool, got {getattr(self, f)!r}")
        for f in ("single_launch_max_T", "recurrent_max_T"):
            x = getattr(self, f)
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise ValueError(f"{f} must be an int >= 0, got {x!r}")
        if (not isinstance(self.log_eps, (int, float)) or isinstance(self.log_eps, bool)
                or not -100.0 <= self.log_eps < 0):
            raise ValueError(f"log_eps must be a number in [-100, 0), got {self.log_eps!r}")

    @property
    def name(self) -> str:
        """Non-default fields as ``field=value`` joined by ``,`` (``"default"`` if none)."""
        d = PrefillConfig()
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name) != getattr(d, f.name)]
        return ",".join(parts) or "default"

    def fit(self, D: int) -> "PrefillConfig":
        """``walk_BV`` capped at the head size ``D``."""
        return replace(self, walk_BV=None if self.walk_BV is None else min(self.walk_BV, D))


DEFAULT_CONFIG = PrefillConfig()

#: fp32 ``Tb`` / ``Aqk``, ~fp32 (bf16x2) products, the ``"blocks"`` solve (fp32 products)
#: and tf32x3 chain products. The default (bf16 intermediates and products, like FLA and
#: FlashInfer) meets the contest tolerance on the contest inputs; on correlated keys with
#: beta ~ 1 and long memory (:mod:`kernels.stress_inputs`) it does not, and neither do FLA
#: or FlashInfer, while this config does, at about twice the time (docs/notes/prefill.md,
#: "Numbers behind the rules").
ACCURATE_CONFIG = PrefillConfig(storage="precise", solve="blocks", precision="bf16x2",
                                cp_chain_precision="tf32x3")


def recurrent_rule(T: int, cp, config: PrefillConfig) -> bool:
    """Whether a ``fused`` / ``graph`` call of ``T`` tokens takes the token-recurrent kernel:
    ``T <= config.recurrent_max_T`` unless context parallelism is forced (``cp`` True or
    an int)."""
    return not cp and T <= config.recurrent_max_T


def walk_gluon_rule(cc: Optional[int], interpreted: bool, have_gluon: bool, D: int,
                    config: PrefillConfig) -> bool:
    """Whether the long paths' phase C is the warp-specialized Gluon walk
    (:mod:`.state_walk_gluon`) instead of the Triton one (:mod:`.state_walk_t`, the path of
    every other GPU and of the CPU interpreter). All of:

    * ``cc == 90``, the device's compute capability exactly 9.0 (None off CUDA): the kernel
      is ``wgmma``, TMA and ``setmaxnreg`` code for sm_90a (no ``wgmma`` on sm_100 / sm_120);
    * not ``interpreted`` (Gluon kernels have no CPU interpreter);
    * ``have_gluon``: ``triton.experimental.gluon`` imports with the Hopper API the kernel
      uses (:data:`.state_walk_gluon.HAVE_GLUON`);
    * head size ``D = K = V = 128`` (two warpgroups of 64 rows of ``S^T``, ``[64, 128]``
      ``k`` / ``q`` tiles);
    * the config's ``"compact"`` storage and ``"bf16"`` precision (bf16 ``Tb`` / ``Aqk``
      tiles for TMA and bf16 products: what the kernel reproduces of the Triton walk), and
      ``gluon_walk``.

    At launch, the tensors TMA reads and writes must have 16-byte aligned base addresses
    (every torch allocation has; :func:`.pipeline.phase_c_fwd` takes the Triton
    walk for a view that does not). The kernel handles everything else of phase C on the
    long paths: packed sequences, partial last chunks, the device split, the guard."""
    return (cc == 90 and not interpreted and have_gluon and D == 128
            and config.storage == "compact" and config.precision == "bf16"
            and config.gluon_walk)


def intra_maxnreg_rule(solve: str, single: bool = False) -> Optional[int]:
    """Register cap of the intra-chunk kernel: 128 for the ``"batched"`` solve, else None
    (the compiler's choice; also for the one-launch path, ``single``, whose walker
    programs need more).

    Uncapped it takes three programs of 4 warps per SM; at 128 it spills nothing, four fit
    and it is faster (112 and 96 spill). Numbers: docs/notes/prefill.md, "Numbers behind the
    rules".
    """
    return 128 if (solve == "batched" and not single) else None


def walk_tile_rule(units: int, HV: int, V: int, n_sm: int, cp: bool) -> int:
    """State tile width of the walk when ``walk_BV`` is None: 32 with CP; otherwise 64 when
    that launches ``>= 1.5 * n_sm`` programs, 32 when that launches ``>= 0.9 * n_sm``, else
    16; capped at ``V``: wide tiles re-read ``k``, ``q``, ``Tb``, ``Aqk`` less, narrow ones
    fill the GPU when the launch has few programs. Numbers: docs/notes/prefill.md, "Numbers
    behind the rules".
    """
    if cp:
        return min(32, V)
    for bv, need in ((64, 1.5), (32, 0.9)):
        if bv <= V and units * HV * (V // bv) >= need * n_sm:
            return bv
    return min(16, V)


#: Shared memory per block (bytes) that a 3-stage walk may need at D = 128 (the chained CP
#: walk, ``python -m kernels.arch_check``); on devices with less per block (sm_86, sm_89,
#: sm_120) the walks take 2 stages.
WALK_3_STAGE_SMEM = 160 * 1024


def walk_stages_rule(BV: int, programs: int, n_sm: int,
                     smem_per_block: Optional[int] = None) -> int:
    """``num_stages`` of the fused walk / CP phase C.

    3 (loads two chunks ahead) unless the third stage's buffers would cost programs
    per SM that the launch needs: at ``BV <= 32`` two stages fit two programs per SM
    (~106 KB shared memory each at D = 128), three only one (~158 KB); at ``BV = 64``
    one fits either way. So 3 when ``BV >= 64`` or ``programs <= n_sm``, else 2 (numbers:
    docs/notes/prefill.md, "Numbers behind the rules"; ``num_stages=1`` crashed the walks on
    triton 3.6). ``smem_per_block``: the device's limit
    (:func:`.context_parallel.smem_per_block`); below :data:`WALK_3_STAGE_SMEM` always 2
    (compiled, not measured: ``kernels.arch_check``).
    """
    if smem_per_block is not None and smem_per_block < WALK_3_STAGE_SMEM:
        return 2
    return 3 if BV >= 64 or programs <= n_sm else 2


#: Average chunks per sequence up to which the fused walk (no CP) counts as short.
SHORT_WALK_CHUNKS = 4


def walk_launch_rule(BV: int, programs: int, n_sm: int, short: bool, precise: bool = False,
                     smem_per_block: Optional[int] = None):
    """``(num_warps, num_stages, loop_stages)`` of the fused walk / CP phase C.

    Short walks (no CP, at most :data:`SHORT_WALK_CHUNKS` chunks per sequence on
    average) at tile width 64: 4 warps, two programs per SM (255 registers). With compact
    storage the chunk loop is pipelined over 2 stages with ``q`` left out of the pipeline
    (:func:`walk_pipe_skip_rule`; 99 KB of shared memory); otherwise it is unpipelined (~57 KB) -- pipelining every load takes 131 KB,
    one program per SM. Otherwise :func:`walk_warps_rule`,
    :func:`walk_stages_rule` and the launch's stages for the loop (unpipelined loops at
    width 16 or 32 crashed on triton 3.6). ``precise``: the
    ``"precise"`` storage -- at most 2 stages (3 exceed the shared memory per block).
    ``smem_per_block``: the device's limit, passed to :func:`walk_stages_rule`. Numbers:
    docs/notes/prefill.md, "Numbers behind the rules".
    """
    if short and BV >= 64:
        return 4, 2, (1 if precise else 2)
    stages = walk_stages_rule(BV, programs, n_sm, smem_per_block)
    return walk_warps_rule(BV), min(stages, 2) if precise else stages, None


def walk_transposed_rule(BV: int, short: bool, precise: bool = False) -> bool:
    """Whether the walk holds ``S^T`` (:mod:`.state_walk_t`): for the short compact-storage
    walks (no CP, at most :data:`SHORT_WALK_CHUNKS` chunks per sequence on average) that
    :func:`walk_tile_rule` gives width 64, i.e. many programs of one to four chunks, where
    holding ``S^T`` keeps computed operands in registers; the long, narrow walks are slower
    transposed and keep the untransposed walk (numbers: docs/notes/prefill.md, "Numbers behind
    the rules")."""
    return short and BV >= 64 and not precise


def walk_pipe_skip_rule(BV: int, short: bool, precise: bool = False) -> str:
    """The load of the walk kept out of its chunk loop's pipeline: ``"q"`` for the
    short compact-storage walks at width 64 that :func:`walk_launch_rule` pipelines over 2 stages
    (so two programs fit per SM), else ``""`` (the longer walks run one program per SM or
    narrow tiles, where an exposed load costs: docs/notes/prefill.md, "Numbers behind the
    rules")."""
    return "q" if short and BV >= 64 and not precise else ""


def walk_warps_rule(BV: int) -> int:
    """``num_warps`` of the fused walk: 8 for ``BV >= 64`` (else 4)."""
    return 8 if BV >= 64 else 4
