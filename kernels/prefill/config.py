"""Launch and precision levers of the prefill kernels: explicit, no autotuning.

Every default was measured on an H200 (graph replay, the contest shapes;
``scripts/prefill_probe.py``, rows in ``results/nvidia-h200/dev_checks/``,
the step table in ``docs/notes.md``):

* the ``"tm"`` intermediates: the intra-chunk kernel stops after the solve and hands the
  walk ``Tb = Tm diag(beta)`` and ``scale * Aqk``; the walk forms ``v_new`` and the
  outputs from ``k``, ``v``, ``q`` itself (H200, probe 25: intra -40...-45 %, walks
  equal or faster; graph 57x64 90.0 -> 70.8 us, 16x256 73.5 -> 54.0, T=8192 189.9 ->
  166.7, then 139.9 with the tm tile widths);
* intra-chunk kernel: the ``"batched"`` solve -- the 16 x 16 block formulas in registers,
  each block diagonal as one batch of four products, the diagonal inverses through their
  8 x 8 blocks in bf16x2 (``"neumann8"``), one tf32 pass off the diagonal, ``Tb`` stored band
  by band -- with a 128-register cap (:func:`intra_maxnreg_rule`): H200 intra 57x64
  27.7 -> 13.5 us, T=8192 49.2 -> 22.5 against the ``"blocks"`` scratch solve (probes
  30-36); 4 warps (8: slower). With
  ``"wu"``: products in 2 column blocks, bf16 products for ``w``, ``u`` and the output
  terms (output rel-L2 ~4.0e-3, the peers' level);
* walks: bf16 products with the state and a bf16 inline ``P @ S`` (walk
  -12...-25 %, output rel-L2 ~3.3e-3 vs 3.2e-3); tile width by
  :func:`walk_tile_rule`; warps and stages by :func:`walk_launch_rule`: short walks
  (no CP, <= 4 chunks per sequence) at width 64 with 4 warps and an unpipelined chunk
  loop, otherwise 8 warps at width 64 and :func:`walk_stages_rule` (3 stages where it
  costs no occupancy; an unpipelined loop below width 64 crashes on triton 3.6);
* programmatic dependent launch of the walks (:mod:`.pdl`), triggered at the start
  of the earlier kernel's programs (-0.5...-3 us; with 2-stage walks ``"start"``
  cost T=2048 +8 us, with the stage rule it does not);
* CP phase A with 3 stages (T=8192 phase A 56 -> 46 us) at width 64 with ``"tm"``;
* context parallelism from 64 chunks per sequence, segments by
  :func:`.context_parallel.cp_segment_chunks`, phase C chaining the segment
  transitions itself (3 launches);
* compact bf16 storage of the intermediates.

Sweep them on the GPU with ``gdn_prefill(..., config=PrefillConfig(...))``;
:func:`sweep_configs` lists a small grid.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import List, Optional

__all__ = ["PrefillConfig", "DEFAULT_CONFIG", "sweep_configs", "PRECISIONS", "walk_tile_rule",
           "intra_maxnreg_rule", "walk_pipe_skip_rule", "walk_transposed_rule",
           "walk_warps_rule", "walk_stages_rule", "walk_launch_rule", "SHORT_WALK_CHUNKS"]


#: Precisions a product may take (:mod:`.dots`).
PRECISIONS = ("bf16x2", "bf16", "tf32", "tf32x3", "ieee")


def _pow2(x) -> bool:
    return isinstance(x, int) and x >= 1 and not (x & (x - 1))


@dataclass(frozen=True)
class PrefillConfig:
    """Launch configuration of the prefill stage kernels.

    Args:
        walk_BV: state tile width of the fused walk (outputs inline) and of CP
            phase C; None: :func:`walk_tile_rule`.
        walk_warps, walk_stages: ``num_warps`` / ``num_stages`` of the state walks;
            None: :func:`walk_launch_rule` (the walks that store chunk states use 4
            warps unless given, and 2 stages).
        split_BV: tile width of the walk that stores chunk states (unfused
            compositions); None: :func:`.state_walk.default_bv`.
        intra_warps: ``num_warps`` of the intra-chunk (+ gates) kernel.
        output_BV, output_warps: the separate output kernel (unfused compositions).
        summary_BV, summary_warps, summary_stages: tile width over the ``K + V``
            columns (None: 64 with the ``"tm"`` intermediates, 32 with ``"wu"``; measured
            on an H200, T=8192 phase A 50 -> 34 us for ``"tm"`` from 32 to 64), ``num_warps``
            and ``num_stages`` of CP phase A (3 stages: ~115 KB
            shared memory at D = 128). Stages must be
            >= 2: with 1 the walks hit an illegal memory access on triton 3.6 (H200).
        combine_warps: ``num_warps`` of CP phase B.
        cp_min_avg_chunks: CP is considered from this many chunks per sequence
            on average (see :mod:`.context_parallel`).
        storage: ``"precise"`` or ``"compact"`` storage of the per-token
            intermediates ``w``, ``u``, ``P``, ``ob`` (:data:`.intra_chunk.STORAGE`):
            compact halves their bytes at ~4e-3 state error on long-memory heads.
        solve: the intra-chunk solve, ``"tile"`` (registers, whole-tile products),
            ``"blocks"`` (16 x 16 blocks through a scratch) or ``"batched"`` (the blocks'
            formulas in registers, batched by block diagonal; :mod:`.intra_chunk`).
        walk_precision: products with the state in the walks (``w @ S``,
            ``k^T @ v_new``; :mod:`.dots`): ``"bf16x2"`` (~fp32) or ``"bf16"``
            (one tensor-core product, like FLA's walk).
        inline_precision: the fused walk's inline ``P @ S`` (outputs only).
        Defaults measured on an H200 (scripts/prefill_probe.py, docs/notes.md): bf16 walk
        and inline products cut the walk by 10-25 % at output rel-L2 ~3.4e-3 (vs 3.2e-3).
        intra_precision: ``w``, ``u`` and the output terms in the intra-chunk kernel
            (``"bf16"``: the fp32 ``Tm`` / ``Aqk`` rounded to bf16 for one product each,
            as FLA does; ``"bf16x2"``: split hi + lo, ~fp32).
        intra_col_blocks: the intra-chunk kernel's products with ``k``, ``v``, ``q`` in
            that many blocks of columns (fewer live registers).
        intra_solve_precision: products of the solve's diagonal inverses; None:
            ``"bf16x2"`` with ``"neumann8"`` (powers bounded by 35 x), ``"tf32x3"`` for the
            16 x 16 Neumann products of ``"batched"`` and ``"tile"``, ``"ieee"`` for ``"blocks"``. One-pass ``"tf32"`` / ``"bf16"`` are refused for the
            Neumann inverses: on correlated keys (:mod:`kernels.stress_inputs`) their
            errors reached 1e14 on an H200 while the contest inputs looked fine.
        intra_solve_diag: the four diagonal 16 x 16 inverses (None: ``"neumann8"`` for the
            ``"batched"`` solve, else ``"neumann"``): ``"neumann"``
            (``(I-D)(I+D^2)(I+D^4)(I+D^8)``, six dependent products each, in
            ``intra_solve_precision``), ``"rows"`` (``"blocks"`` solve: fp32 forward
            substitution, 15 row steps; no intermediate larger than the inverse) or
            ``"neumann8"`` (``"batched"`` solve: Neumann on the 8 x 8 diagonal blocks, whose
            powers grow at most 35 x instead of 6435 x, then one 2 x 2 block step).
        intra_offdiag_precision: products of the ``"blocks"`` / ``"batched"`` solve's
            off-diagonal blocks ``T_IJ = -T_II sum A_IK T_KJ`` (None: ``"tf32"`` for
            ``"batched"``, else as ``intra_solve_precision``).
            Their operands are bounded by the inverse itself, unlike the Neumann
            powers, so one tensor-core pass (``"tf32"``) keeps ~1e-3 relative error.
        intra_maxnreg, walk_maxnreg: register cap per thread of the intra-chunk kernel /
            the fused walk (None: :func:`intra_maxnreg_rule` / the compiler's choice).
        cp_combine: how CP finds each segment's entering state: ``"inline"`` (each
            phase-C program chains the transitions of the segments before it: 3
            launches) or ``"kernel"`` (a separate serial combine kernel: 4 launches).
        cp_chain_precision: products ``M_s @ S`` of the inline CP chain (phase C applying
            the earlier segments' transitions): ``"bf16"`` (default), ``"bf16x2"`` or
            ``"tf32x3"`` (~fp32; ``"tf32"`` / ``"ieee"`` operands ran out of shared memory
            at width 64). Measured on an H200 (probe 23, docs/notes.md): T=8192 207.5 ->
            189.5 us graph from tf32x3 to bf16, and the same errors to the 4th digit on
            contest and hard inputs (the walk already rounds the state to bf16 for its
            products every chunk).
        first_chunk_inline: without CP, the intra-chunk program of each sequence's
            first chunk also walks that chunk (outputs and the state after it), so
            one-chunk sequences never reach the walk kernel and longer ones start at
            chunk 1. Off by default. With ``"wu"``, measured on an H200, it made the
            intra-chunk kernel heavier for every program (57 KB shared memory, more spills)
            and only 57x64 gained (-4 %; T=64 +43 %, 16x256 +30 %). With ``"tm"`` at T=512
            (H100, probe 47) the intra kernel went 6.4 -> 14.8 us and the walk stayed 12.2:
            graph 19.5 -> 26.5 us, and the eager span did not shorten (it only hides more
            GPU time under the host's second launch).
        stack_wp: store ``w`` and ``P`` side by side (``[T, HV, 2, K]``) so the fused
            walk multiplies both by the state in one ``[128, K]`` bf16 product per
            chunk instead of two ``[64, K]`` ones (only with bf16 walk and inline
            precisions and compact storage; otherwise ignored). Off by default:
            measured on an H200 the reshape/split around the product cost more than
            the product saved (T=2048 walk 47.5 -> 85.2 us; docs/notes.md).
        intra_split: run the intra-chunk kernel as two launches of the same kernel
            (gates + ``A`` + solve; then the products, one program per column
            block): smaller programs, one launch more (3 without CP, 4 with).
            Needs ``solve="blocks"``; ignored with ``first_chunk_inline``. Off by
            default: on an H200 the two launches were slower together except at
            T=64 (T=8192: 111 vs 94 us; docs/notes.md).
        pdl: the ``fused`` variant's walk kernels start with programmatic dependent
            launch (:mod:`.pdl`): placed while the kernel before them finishes, waiting
            in-kernel before they read its outputs (Hopper and newer; ignored elsewhere).
        walk_loop_stages: software-pipeline stages of the fused walk's chunk loop alone
            (``tl.range(..., num_stages=)``); None: :func:`walk_launch_rule` (1 for short
            walks at width 64, else the launch's stages). 1 needs a walk tile of at least
            64 columns: at 16 / 32 it hit an illegal memory access on triton 3.6 (H200;
            compute-sanitizer: 1024-byte shared-memory reads past the allocation, the
            compiler's operand staging -- ``scripts/walk_unpipelined_repro.py``), so
            :func:`.pipeline.prefill_fused` refuses it before any launch.
        pdl_trigger: where each program of the kernel before a PDL launch lets it be
            placed: ``"end"`` (after its last store) or ``"start"`` (docs/notes.md has the
            H200 measurements of both).
        single_launch: one launch per call for short calls (no CP): with ``"tm"`` up to
            ``single_launch_max_T`` tokens through walker programs (below); with ``"wu"``
            when every sequence fits one chunk (``T <= 64``), the intra-chunk program also
            walks its chunk (as ``first_chunk_inline``) and empty sequences' final states
            are written by their (otherwise idle) intra-chunk programs. The history: on by
            default since the ``"tm"`` intermediates made the intra-chunk kernel ~6 us: the
            host then issued the walk launch after the GPU had finished the first kernel,
            and on the H100 host the eager ``cupti_cold`` span reached 2.0 x the graph time
            at T=6 / T=64. Measured on an H100 (probe 38): eager span T=6 18.5 -> 15.7 us,
            T=64 23.0 -> 17.1; graph replay 10.0 -> 14.5 / 11.5 -> 15.3 (the intra program
            walked its two state tiles serially; the walkers replaced that, probe 49). With
            ``"wu"`` (probe 17, H200) it was slower on both counts (T=6 graph 15.8 -> 21.0).
        single_launch_max_T, walker_BV: with ``single_launch`` and ``"tm"``, calls of up to
            this many tokens (no CP) are one launch: the intra-chunk grid gets walker
            programs (``walker_BV`` state columns of one sequence and head each) that walk
            the sequence as the chunk programs finish (a flag per chunk in global memory,
            release / acquire; the chunk programs never wait and have the lower program ids,
            so they are placed first). Why: on a slow host the second launch of the
            two-launch path arrives after the GPU has finished the first kernel (H100,
            notebook 02 at 24fd842: 100+28 eager span 34.8 us against 14.0 graph). Measured
            on an H100 (probe 48, graph / eager ``cupti_cold`` us, two launches -> walkers):
            T=6 11.7 / 33.8 -> 11.6 / 10.8, T=64 18.8 / 28.8 -> 12.1 / 11.6, 100+28 13.5 /
            25.2 -> 15.6 / 14.9; T=512 19.7 / 32.7 -> 31.4 / 34.8 (two walkers per head
            walk eight chunks), hence 128. ``walker_BV`` >= 64: 16 and 32 computed wrong
            results on the GPU (triton 3.6) and pass on the interpreter; the walkers are used
            only where the tile is at least 64 wide (head size >= 64) off the interpreter.
        intermediates: what the intra-chunk kernel of the ``fused`` variant hands the
            walks. ``"wu"``: the WY factors ``w``, ``u`` and the output terms ``P``, ``ob``
            (``[T, HV, D]`` each); the walk's chain per chunk is ``w @ S``, ``k^T @ v_new``.
            ``"tm"``: only ``Tb = Tm diag(beta)`` and ``scale * Aqk`` (``[T, HV, 64]`` each):
            the intra-chunk kernel stops after the solve (no ``[64, 64] x [64, D]``
            products, a quarter of the bytes), and the walk forms
            ``v_new = Tb (v - exp(gc) k S)`` and ``o = scale exp(gc) q S + Aqk v_new``
            itself (one more ``[64, 64] x [64, BV]`` product on its chain per chunk).
            ``"tm"`` excludes ``stack_wp`` and ``intra_split``.
        walk_early_loads: with ``"tm"``, the fused walk (and CP phase C) issues every load
            of a chunk (``k``, ``v``, ``gc``, ``Tb``, ``q``, ``Aqk``) before its first product,
            so their latencies overlap (more live registers).
        walk_acc_fuse: with bf16 walk products, the state update and the inline outputs
            accumulate in the products' accumulators (``S <- dot(k^T, v_new, acc=exp(g) S)``)
            instead of a separate fp32 add (fewer live registers).
        intra_band_store: with ``"tm"`` and the ``"batched"`` solve, ``Tb`` is stored block
            diagonal by block diagonal straight from the solve instead of assembled into
            one ``[64, 64]`` tile first.
        intra_solve_tree: the ``"batched"`` solve multiplies the diagonal blocks' Neumann
            factors as a tree, ``((I - A)(I + A^2)) ((I + A^4)(I + A^8))``: five dependent
            products instead of six.
        walk_pipe_skip: with ``"tm"``, a load of the fused walk kept out of its chunk loop's
            software pipeline (``"q"`` or ``"aq"``, ``scale * Aqk``; ``""``: none): every
            pipelined load has one shared-memory buffer per stage, and at width 64 with a
            2-stage loop all of them need 131 KB -- one program per SM; without ``q``'s two
            ``[64, 128]`` buffers 99 KB, two per SM. None: :func:`walk_launch_rule`.
        walk_transposed: with ``"tm"`` and no CP, the walk holds the state as ``S^T`` so
            every product is ``computed @ loaded^T`` (:mod:`.state_walk_t`): computed
            operands stay in registers, the loaded tiles are the shared-memory operands, and
            at width 128 with 8 warps the two warpgroups share one load of ``k``, ``q``,
            ``Tb``, ``Aqk``. Width ``walk_BV`` (None: 128), ``walk_warps`` (None: 8 at 128,
            else 4), ``walk_stages`` / ``walk_loop_stages`` (None: 2). None:
            :func:`walk_transposed_rule`.
        first_chunk_BV: state tile width of that first step, 16 or 64 (32 hit an
            out-of-bounds shared-memory read inside a product, compute-sanitizer, triton
            3.6, H200 -- a compiler fault; 32-column blocks of ``intra_col_blocks=4``
            gave wrong results on the same kernel).
    """

    walk_BV: Optional[int] = None
    walk_warps: Optional[int] = None
    walk_stages: Optional[int] = None
    split_BV: Optional[int] = None
    intra_warps: int = 4
    output_BV: int = 64
    output_warps: int = 4
    summary_BV: Optional[int] = None
    summary_warps: int = 4
    summary_stages: int = 3
    combine_warps: int = 4
    cp_min_avg_chunks: int = 64
    storage: str = "compact"
    solve: str = "batched"
    walk_precision: str = "bf16"
    inline_precision: str = "bf16"
    intra_precision: str = "bf16"
    intra_col_blocks: int = 2
    intra_solve_precision: Optional[str] = None
    intra_solve_diag: Optional[str] = None
    intra_offdiag_precision: Optional[str] = None
    intra_maxnreg: Optional[int] = None
    walk_maxnreg: Optional[int] = None
    cp_combine: str = "inline"
    cp_chain_precision: str = "bf16"
    first_chunk_inline: bool = False
    first_chunk_BV: int = 64
    single_launch: bool = True
    single_launch_max_T: int = 128
    walker_BV: int = 64
    stack_wp: bool = False
    intra_split: bool = False
    pdl: bool = True
    walk_loop_stages: Optional[int] = None
    pdl_trigger: str = "start"
    intermediates: str = "tm"
    walk_early_loads: bool = False
    walk_acc_fuse: bool = False
    intra_band_store: bool = True
    intra_solve_tree: bool = False
    walk_pipe_skip: Optional[str] = None
    walk_transposed: Optional[bool] = None

    def __post_init__(self):
        for f in ("walk_BV", "split_BV", "summary_BV"):
            v = getattr(self, f)
            if v is not None and (not _pow2(v) or v < 16):
                raise ValueError(f"{f} must be None or a power of two >= 16, got {v}")
        for f in ("output_BV",):
            v = getattr(self, f)
            if not _pow2(v) or v < 16:
                raise ValueError(f"{f} must be a power of two >= 16, got {v}")
        for f in ("walk_warps", "intra_warps", "output_warps", "summary_warps",
                  "combine_warps"):
            if f == "walk_warps" and self.walk_warps is None:
                continue
            if not _pow2(getattr(self, f)):
                raise ValueError(f"{f} must be a power of two, got {getattr(self, f)}")
        if self.storage not in ("precise", "compact"):
            raise ValueError(f"storage must be 'precise' or 'compact', got {self.storage!r}")
        if self.solve not in ("tile", "blocks", "batched"):
            raise ValueError(f"solve must be 'tile', 'blocks' or 'batched', got {self.solve!r}")
        if self.cp_chain_precision not in ("bf16", "bf16x2", "tf32x3"):
            raise ValueError(f"cp_chain_precision must be 'bf16', 'bf16x2' or 'tf32x3' (fp32 "
                             f"operands ran out of shared memory), got {self.cp_chain_precision!r}")
        for f in ("walk_precision", "inline_precision", "intra_precision"):
            if getattr(self, f) not in PRECISIONS:
                raise ValueError(f"{f} must be one of {', '.join(PRECISIONS)}, "
                                 f"got {getattr(self, f)!r}")
        if self.intra_solve_diag not in (None, "neumann", "rows", "neumann8"):
            raise ValueError(f"intra_solve_diag must be None, 'neumann', 'rows' or 'neumann8', "
                             f"got {self.intra_solve_diag!r}")
        need = {"rows": "blocks", "neumann8": "batched"}.get(self.intra_solve_diag, self.solve)
        if self.solve != need:
            raise ValueError(f"intra_solve_diag={self.intra_solve_diag!r} needs solve={need!r}, "
                             f"got {self.solve!r}")
        if self.intra_offdiag_precision not in (None,) + PRECISIONS:
            raise ValueError(f"intra_offdiag_precision must be None or one of {PRECISIONS}, "
                             f"got {self.intra_offdiag_precision!r}")
        if self.intra_solve_precision not in (None,) + PRECISIONS:
            raise ValueError(f"intra_solve_precision must be None or one of {PRECISIONS}, "
                             f"got {self.intra_solve_precision!r}")
        if (self.intra_solve_precision in ("tf32", "bf16") and not
                (self.solve == "blocks" and self.intra_solve_diag == "rows")):
            # Measured (H200, scripts/prefill_solve_stress.py): on correlated keys the Neumann
            # powers reach binomial sizes and one-pass products lose everything (output
            # errors up to 1e14 / inf); on the contest inputs they looked harmless.
            raise ValueError(f"intra_solve_precision={self.intra_solve_precision!r} (one "
                             "tensor-core pass) is unsafe for the Neumann inverses: output "
                             "errors up to 1e14 on correlated keys; use 'ieee', 'tf32x3', "
                             "'bf16x2', or intra_solve_diag='rows'")
        for f in ("intra_maxnreg", "walk_maxnreg"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or not 32 <= v <= 255):
                raise ValueError(f"{f} must be None or an int in [32, 255], got {v!r}")
        if self.intra_col_blocks not in (1, 2):
            # 4 (32-column blocks at D = 128) gave wrong results on an H200 with triton 3.6
            # while passing on the CPU interpreter (docs/notes.md); not investigated.
            raise ValueError(f"intra_col_blocks must be 1 or 2, got {self.intra_col_blocks}")
        if self.first_chunk_BV not in (16, 64):
            raise ValueError(f"first_chunk_BV must be 16 or 64 (32 miscompiles on triton 3.6), "
                             f"got {self.first_chunk_BV}")
        if self.walk_loop_stages is not None and self.walk_loop_stages not in (1, 2, 3, 4):
            raise ValueError(f"walk_loop_stages must be None or 1..4, got {self.walk_loop_stages!r}")
        if self.intermediates not in ("wu", "tm"):
            raise ValueError(f"intermediates must be 'wu' or 'tm', got {self.intermediates!r}")
        if self.intermediates == "tm":
            clash = [f for f in ("stack_wp", "intra_split") if getattr(self, f)]
            if clash:
                raise ValueError(f"intermediates='tm' cannot be combined with {', '.join(clash)} "
                                 f"(they are built on w, u, P, ob)")
        if self.walk_pipe_skip not in (None, "", "q", "aq"):
            raise ValueError(f"walk_pipe_skip must be None, '', 'q' or 'aq', "
                             f"got {self.walk_pipe_skip!r}")
        if self.pdl_trigger not in ("start", "end"):
            raise ValueError(f"pdl_trigger must be 'start' or 'end', got {self.pdl_trigger!r}")
        if self.cp_combine not in ("inline", "kernel"):
            raise ValueError(f"cp_combine must be 'inline' or 'kernel', got {self.cp_combine!r}")
        if not _pow2(self.walker_BV) or self.walker_BV < 64:
            # 16 and 32 gave wrong results on an H100 with triton 3.6 (probe 48) while
            # passing on the CPU interpreter -- the narrow-tile fault of first_chunk_BV=32
            raise ValueError(f"walker_BV must be a power of two >= 64 (16 / 32 computed wrong "
                             f"results on triton 3.6), got {self.walker_BV}")
        if self.cp_min_avg_chunks < 1:
            raise ValueError(f"cp_min_avg_chunks must be >= 1, got {self.cp_min_avg_chunks}")
        for f in ("walk_stages", "summary_stages"):
            if f == "walk_stages" and self.walk_stages is None:
                continue
            if getattr(self, f) < 2:
                # Seen on an H200 with triton 3.6 (docs/notes.md, 2026-11-22): every walk
                # launched with num_stages=1 died with an illegal memory access.
                raise ValueError(f"{f} must be >= 2 (num_stages=1 crashed the state walks with "
                                 f"an illegal memory access on triton 3.6), got {getattr(self, f)}")

    @property
    def name(self) -> str:
        """Non-default fields as ``field=value`` joined by ``,`` (``"default"`` if none)."""
        d = DEFAULT_CONFIG if "DEFAULT_CONFIG" in globals() else PrefillConfig()
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name) != getattr(d, f.name)]
        return ",".join(parts) or "default"

    def fit(self, D: int) -> "PrefillConfig":
        """Tile widths capped at the head size ``D`` (and ``2 D`` for ``summary_BV``)."""
        return replace(
            self,
            walk_BV=None if self.walk_BV is None else min(self.walk_BV, D),
            first_chunk_BV=self.first_chunk_BV if self.first_chunk_BV <= D else 16,
            split_BV=None if self.split_BV is None else min(self.split_BV, D),
            output_BV=min(self.output_BV, D),
            summary_BV=None if self.summary_BV is None else min(self.summary_BV, 2 * D),
        )


DEFAULT_CONFIG = PrefillConfig()

#: fp32-like intermediates (``w`` as a bf16 pair, fp32 ``u`` / ``ob``) and ~fp32 (bf16x2)
#: products everywhere. The default (bf16 intermediates and products, like FLA and
#: FlashInfer) meets the contest tolerance on the contest inputs; on correlated keys with
#: beta ~ 1 and long memory (:mod:`kernels.stress_inputs`) it does not, and neither do
#: FLA or FlashInfer, while this config does (max abs error <= 2e-3). Measured on an H200
#: (``results/nvidia-h200/dev_checks/prefill_solve_stress_*.csv``, ``prefill_probe_21_*``):
#: it costs 1.4-1.9x the default's graph time (T=64 17.9 -> 25.3 us, T=2048 61.9 -> 112.7,
#: T=8192 209 -> 385, 57x64 90 -> 168).
ACCURATE_CONFIG = PrefillConfig(storage="precise", intra_precision="bf16x2",
                                walk_precision="bf16x2", inline_precision="bf16x2",
                                cp_chain_precision="tf32x3", intermediates="wu",
                                solve="blocks", single_launch=False)


def intra_maxnreg_rule(solve: str, tm: bool, single: bool = False) -> Optional[int]:
    """Register cap of the intra-chunk kernel when ``intra_maxnreg`` is None: 128 for the
    ``"batched"`` solve with the ``"tm"`` intermediates (the fused variant), else None (the
    compiler's choice; also when the programs walk their first chunk, ``single``: the
    one-launch path and ``first_chunk_inline``, whose programs walk their
    chunk too and are few: ``T <= 128``).

    That kernel needs ~150-200 registers uncapped (three programs of 4 warps per SM); at 128
    it spills nothing and four fit. Measured on an H200 (probe 33, docs/notes.md): intra
    57x64 18.3 -> 15.4 us (tf32x3 / tf32 solve), 16x256 17.5 -> 15.0, T=8192 27.5 -> 26.2;
    112 and 96 spill and are slower. The ``"wu"`` kernel (products of ``w``, ``u`` after the
    solve) runs at 255 and spills when capped (probes 16, 26).
    """
    return 128 if (tm and solve == "batched" and not single) else None


def walk_tile_rule(units: int, HV: int, V: int, n_sm: int, cp: bool, tm: bool = False) -> int:
    """State tile width of the fused walk when ``walk_BV`` is None.

    With the ``"tm"`` intermediates (the default): 32 with CP; otherwise 64 when that
    launches ``>= 1.5 * n_sm`` programs, 32 when that launches ``>= 0.9 * n_sm``, else
    16. Measured on an H200 (probes 25-27, docs/notes.md): T=8192 (CP) phase C 91 -> 82 us
    at 32 vs 64; 4x1024 55 us at 32 vs 64 at 16 or 64; 57x64 and 16x256 best at 64
    (70.6 / 54.3 vs 72.4 / 56.9 at 32), T=2048 and T <= 512 at 16.

    With ``"wu"``: with context parallelism 64 (each phase-C program first chains the earlier
    segments' ``[K, K]`` transitions: fewer, wider programs repeat that less).
    Otherwise the widest of 64, 32, 16 that still launches ``units * HV * V / BV
    >= 1.5 * n_sm`` programs (a wide tile reads each chunk's ``w``, ``k``, ``P``
    once per tile, a narrow one has more programs for few sequences), else 16.
    Measured on an H200 (docs/notes.md): 4x1024 best at 16, 16x256 and 57x64 at
    64, T=8192 with CP at 64. Capped at ``V``.
    """
    if tm:
        if cp:
            return min(32, V)
        for bv, need in ((64, 1.5), (32, 0.9)):
            if bv <= V and units * HV * (V // bv) >= need * n_sm:
                return bv
        return min(16, V)
    if cp:
        return min(64, V)
    for bv in (64, 32):
        if bv <= V and units * HV * (V // bv) >= 1.5 * n_sm:
            return bv
    return min(16, V)


def walk_stages_rule(BV: int, programs: int, n_sm: int) -> int:
    """``num_stages`` of the fused walk / CP phase C when ``walk_stages`` is None.

    3 (loads two chunks ahead) unless the third stage's buffers would cost programs
    per SM that the launch needs: at ``BV <= 32`` two stages fit two programs per SM
    (~106 KB shared memory each at D = 128), three only one (~158 KB); at ``BV = 64``
    one fits either way. So 3 when ``BV >= 64`` or ``programs <= n_sm``, else 2.
    Measured on an H200 (docs/notes.md, probe 10): T=2048 walk 49.0 -> 39.5 us, T=8192
    phase C 85.9 -> 77.7, 16x256 35.5 -> 33.7; 4x1024 (256 programs at BV=16) 43 -> 60
    with 3, hence the rule.
    """
    return 3 if BV >= 64 or programs <= n_sm else 2


#: Average chunks per sequence up to which the fused walk (no CP) counts as short.
SHORT_WALK_CHUNKS = 4


def walk_launch_rule(BV: int, programs: int, n_sm: int, short: bool,
                     precise: bool = False, tm: bool = False):
    """``(num_warps, num_stages, loop_stages)`` of the fused walk / CP phase C when the
    config leaves them None.

    Short walks (no CP, at most :data:`SHORT_WALK_CHUNKS` chunks per sequence on
    average) at tile width 64: 4 warps, two programs per SM (255 registers). With the
    ``"tm"`` intermediates (compact storage) the chunk loop is pipelined over 2 stages
    with ``q`` left out of the pipeline (:func:`walk_pipe_skip_rule`; 99 KB of shared
    memory); otherwise it is unpipelined (~57 KB) -- pipelining every load takes 131 KB,
    one program per SM. Measured on an H200: probe 14 (57x64 walk 54.9 -> 46.0 us,
    16x256 33.3 -> 28.7 unpipelined against 3 stages), probe 43 (graph 57x64 55.7 / 55.5
    -> 54.4 / 54.1 us, 16x256 38.2 / 38.2 -> 38.0 / 37.8 with the 2-stage loop without
    ``q``; every load pipelined: 62.7 / 42.7). Otherwise :func:`walk_warps_rule`,
    :func:`walk_stages_rule` and the launch's stages for the loop. (An unpipelined loop at
    width 16 or 32 hit an illegal memory access on triton 3.6, H200: see
    :class:`PrefillConfig`.) ``precise``: the ``"precise"`` storage (``w`` as a bf16 pair,
    fp32 ``u`` / ``ob``) -- at most 2 stages: with 3 the CP walk at width 64 asked for
    265 KB of shared memory (H200: 227 KB per block).
    """
    if short and BV >= 64:
        return 4, 2, (2 if tm and not precise else 1)
    stages = walk_stages_rule(BV, programs, n_sm)
    return walk_warps_rule(BV), min(stages, 2) if precise else stages, None


def walk_transposed_rule(BV: int, short: bool, precise: bool = False, tm: bool = False) -> bool:
    """Whether the fused walk holds ``S^T`` (:mod:`.state_walk_t`) when ``walk_transposed`` is
    None: for the short ``"tm"`` walks (no CP, at most :data:`SHORT_WALK_CHUNKS` chunks per
    sequence on average) that :func:`walk_tile_rule` gives width 64, i.e. many programs of
    one to four chunks. Measured on an H200 (probe 45, graph us, untransposed ->
    transposed at width 128 / 8 warps): 16x256 38.2 -> 35.2, 57x64 54.7 -> 52.4. The
    long, narrow walks are slower transposed (4x1024 41.7 -> 57.9 at best, T=2048 50.2
    -> 79.5, T=512 19.8 -> 21.3, 100+28 12.3 -> 13.8), so they keep the untransposed walk."""
    return short and BV >= 64 and tm and not precise


def walk_pipe_skip_rule(BV: int, short: bool, precise: bool = False, tm: bool = False) -> str:
    """The load of the fused walk kept out of its chunk loop's pipeline when
    ``walk_pipe_skip`` is None: ``"q"`` for the short ``"tm"`` walks at width 64 that
    :func:`walk_launch_rule` pipelines over 2 stages (so two programs fit per SM), else
    ``""`` (the longer walks run one program per SM or narrow tiles, where an exposed
    load costs: H200, ``scripts/walk_variants.py``, 4x1024 30.3 -> 44.8 us, T=2048
    41.6 -> 64.7 with ``q`` unpipelined)."""
    return "q" if short and BV >= 64 and tm and not precise else ""


def walk_warps_rule(BV: int) -> int:
    """``num_warps`` of the fused walk when ``walk_warps`` is None: 8 for ``BV >= 64``."""
    return 8 if BV >= 64 else 4


def sweep_configs() -> List[PrefillConfig]:
    """A small grid for a GPU sweep of the ``fused`` variant (walk and intra levers)."""
    out = []
    for storage in ("precise", "compact"):
        for bv, warps in ((16, 4), (32, 4), (32, 8), (64, 8)):
            for stages in (2, 3):
                for iw in (4, 8):
                    out.append(PrefillConfig(walk_BV=bv, walk_warps=warps, walk_stages=stages,
                                             intra_warps=iw, storage=storage))
    return out
