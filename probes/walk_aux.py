"""Probe (temporary): the Gluon phase C reading the gate-free ``Ab`` and forming ``Tb`` and
``scale * Aqk`` itself on an aux warpgroup, one chunk ahead of the state chain
(docs/notes/long_path_probe.md, "Verdict", next step (1)).

Written before any code of the probe.

What changes against the product walk (:mod:`kernels.prefill.state_walk_gluon`)
---------------------------------------------------------------------------------
The producer loads ``k``, ``q``, ``v`` and ``Ab`` (``[T, HV, 64]`` bf16, the layout of
``Tb``) instead of ``k``, ``q``, ``v``, ``Tb``, ``Aqk``. An aux partition (one warpgroup)
waits for the stage, issues the ``Q Kᵀ`` ``wgmma`` (``[64, D] @ [D, 64]`` from shared
memory), forms ``dec = exp(min(gc_i − gc_j, 0))`` once per chunk, and stores
``Tb = where(j <= i, Ab · dec, 0)`` and ``scale · Aqk = where(j <= i, scale · (Q Kᵀ · dec), 0)``
(bf16) into one of two ``formed`` buffers, then arrives on ``formed[b]``; it waits on
``consumed[b]`` (both state warpgroups done with chunk ``i − 2``) before overwriting a buffer.
The state warpgroups' step is the product's with ``Tb`` / ``Aqk`` read from the formed
buffers (they wait on ``formed`` only after issuing ``S kᵀ`` and ``S qᵀ``). Scope: no
``qk_norm`` (the host function refuses ``qk_norms``); everything else the product walk
handles (varlen units, partial last chunks, the device split, the split tail, the guard)
is kept, because the code paths are the product's.

Prediction (H100, 131,072 tokens, one sequence, HQ = HK = 4, HV = 8, D = 128)
-----------------------------------------------------------------------------
Today: the Gluon walk 404 µs (CUPTI), byte roof 370 µs of which ``Tb`` + ``Aqk`` are
268 MB (~91 µs). At 131k the plan walks units of 4,096 tokens: 32 × 8 = 256 programs of 64
chunk steps over 132 SMs (one CTA per SM: ~160 KB shared memory), i.e. ~2 programs per SM
in sequence, ~3.2 µs per chunk step and SM. Per step a program moves ~80 KB (``q``, ``k``
32, ``v`` 16, ``Tb`` + ``Aqk`` 16, ``o`` 16); the chain alone measured 1.7 µs per step
(H200, the Gluon walk probe) and the tensor work ~1.1 µs per step: the walk is
bandwidth-bound, not chain-bound.

* Bytes: ``Ab`` (134 MB) replaces ``Tb`` + ``Aqk`` (268 MB): −134 MB, roof 370 → ~326 µs;
  per step ~72 KB instead of ~80 KB (−10 %). ``q``, ``k`` are already read.
* Compute: ``Q Kᵀ`` is 1.05 MFLOP per (chunk, value head); the walk's programs are per value
  head, so both value heads of a q/k head form it: 17.2 GFLOP at 131k (2 × the 8.6 of the
  notes, which counts it once per q/k head), +12.5 % on the state warpgroups' 8.4 MFLOP
  per step (~1.26 µs of tensor time per step at peak, still under the ~2.9 µs of bytes).
  Elementwise: one 64 × 64 ``exp`` tile per step, shared by ``Tb`` and ``Aqk``, 32 per
  thread of the aux warpgroup; two multiplies and selects per entry.
* Registers: 4 warpgroups (state 0, state 1, aux, the producer's warp padded to a
  warpgroup) share 512 registers per thread-slot (65,536 / 128): producer 24, aux ~88
  (the ``Q Kᵀ`` accumulator 32, ``Ab`` 16 bf16 / 32 f32, ``dec`` 32, column gates 16), the
  state warpgroups ~200 each against 256 / 240 today (the H200 probe's note: "a warpgroup
  of its own does not fit the register file at 240 / 240 / 24"). Expect more spills in the
  state warpgroups than today's 8–48 B (triton 3.7.1); the compile check reports them.
* Shared memory: 2 stages × (``k`` 16 + ``q`` 16 + ``v`` 16 + ``Ab`` 8 KB) = 112 KB, formed
  2 × (8 + 8) = 32 KB, ``o`` 32 KB: ~176 KB (≤ 227 KB), still one CTA per SM.
* The chain: not exposed if the aux stays a chunk ahead (it needs the stage's bytes and
  ``consumed[b]`` from the state warpgroups' step ``i − 2``; its ~1 µs of work per chunk
  fits in a 3 µs step). The state warpgroups' step gains a ``formed`` wait (expected
  free) and loses nothing else; the risk is the register cut (spills on the chain) and
  the aux's ``wgmma`` sharing the tensor pipe with the chain.

**Predicted: ~365 µs at 131k (range 345–410; 0.90 × today's walk), 0.90 × the product walk
at 32k.** If the state warpgroups spill heavily at ~200 registers (hundreds of bytes), the
chain lengthens and the walk can land at 410–450.

Rule (docs/notes/long_path_probe.md): **go** if the new walk ≤ 406 µs at 131k on the H100;
**stop** at ≥ 504 µs; in between: report. The timings here are CUDA-graph (``graph``, warm
L2) of the new walk and of the product walk in the same run on the same card; compare the
ratio against the 404 µs CUPTI baseline's card.
"""
