"""Which bf16 rounding of the long path carries the final-state error with long memory?

A CPU emulation, in float32 torch (float64 for the exact intra-chunk solve), of the long
path (``cp_long``: phase A summaries, phase B combine, phase C walk, all at ``BV = 128``)
on the contest shape (HQ = 4, HV = 8, D = 128, one sequence,
``kernels.spec.make_prefill_inputs([T], seed=0)``) with every value head long-memory
(``kernels.stress_inputs.with_gates(x, "every head long memory")``), each rounding point
of the kernels a switch, every variant checked against the chunked float32 reference
(``kernels.reference.prefill_reference_chunked``) under the contest rule (``kernels.checks``).

The rounding points (``mode``: ``"f32"`` none, ``"bf16"`` rounded to bf16, ``"x2"`` split
``hi + lo`` as :mod:`kernels.prefill.dots`' ``"bf16x2"``, 16 significant bits):

* per walk phase (``A``: phase A, the summaries; ``C``: phase C, the outputs and the final
  state), the operands of :func:`kernels.prefill.state_walk_t.state_walk_t_kernel`'s
  products: ``sk`` the state in ``S^T k^T``, ``r`` the residual ``rhs`` in ``rhs^T Tb^T``,
  ``nd`` the decayed ``v_new`` in the state update, and in phase C only ``sq`` the state
  in ``S^T q^T`` and ``no`` ``v_new`` in ``v_new^T Aqk^T`` (outputs only);
* ``tb`` / ``aq``: ``Tb`` / ``scale Aqk`` as the walks see them (bf16 storage, or f32
  storage rounded by a bf16 product: the same; ``x2``: f32 storage split by a bf16x2
  product);
* ``pb``: phase B's ``S^T M^T`` product (both operands; the kernel's is bf16);
* ``summ``: the summaries ``[M^T ; X^T]`` as stored (the kernel's: f32);
* ``solve``: ``Tm = (I + A)^-1`` exact (float64) or ``"kernel"`` (the batched solve's
  block formulas with its precisions: bf16x2 diagonal inverses, one tf32 pass, emulated
  by truncating to 10 mantissa bits, for the off-diagonal blocks), or ``"dither:i"``
  (``--dither``: other plausible low bits of ``Tb``, for the spread of the max);
* ``tail``: ``(L, phase-C roundings)`` for the last ``L`` chunks of the sequence only (a
  candidate fix: the final state remembers only its last few chunks).

The GPU cannot be matched bit for bit (the solve's low bits and the order of the f32
sums differ), so the max abs error of the state, a tail statistic over 131,072
elements, moves by about +-10 % between equally plausible realizations (``--dither``,
``--seed``); its relative L2 error does not.

The segments are the plan's (:func:`kernels.prefill.plan.prefill_plan` on the CPU, i.e.
132 SMs: ``seg_t`` and, for ``cp_long_split``, the device's choice between fine and coarse
segments re-derived from the gates as :func:`.context_parallel.segment_split_kernel`
does). The truncation of phase A (``LOG_EPS``) is checked not to apply (it would drop
nothing with these gates below ~200 chunks per segment); the probe refuses otherwise.

Prints one JSON line per variant: max abs error, relative L2 error and elements outside
the tolerance of the outputs and of the final state, the worst state element (head, v, k,
its reference value). Numbers: docs/notes/long_context.md, "Long memory at 32k: which
rounding (CPU emulation)".

    PYTHONPATH=$PWD python scripts/probes/long_memory_emulate.py [--T 32768 ...] \
        [--seed 0 ...] [--variants default,bf16x2,...|list] [--dither N] [--out file.jsonl]

On 2 CPU cores at 32k: ~10 s of setup (reference, solves), ~4 s per variant (all
variants: ~4 min); 131k: ~35 s and ~16 s.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

BT = 64
WALK_KEYS = ("sk", "r", "nd")            # phase A and C: the state update's operands
OUT_KEYS = ("sq", "no")                  # phase C only: the outputs' operands


def rnd(x: torch.Tensor, mode: str) -> torch.Tensor:
    """``x`` (float32) as a product sees it: ``"f32"`` as is, ``"bf16"`` rounded to
    nearest even bf16, ``"x2"`` as ``hi + lo`` (both bf16), ``"tf32"`` truncated to 10
    mantissa bits (the tensor core's reading of an f32 register)."""
    if mode == "f32":
        return x
    if mode == "bf16":
        return x.to(torch.bfloat16).float()
    if mode == "x2":
        hi = x.to(torch.bfloat16).float()
        return hi + (x - hi).to(torch.bfloat16).float()
    if mode == "tf32":
        return (x.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)
    raise ValueError(f"rounding mode must be f32, bf16, x2 or tf32, got {mode!r}")


def mm_prec(a, b, prec: str):
    """``a @ b`` as :func:`kernels.prefill.dots.mm` computes it (f32 operands)."""
    if prec == "bf16x2":
        ah, bh = rnd(a, "bf16"), rnd(b, "bf16")
        al, bl = rnd(a - ah, "bf16"), rnd(b - bh, "bf16")
        return ah @ bh + ah @ bl + al @ bh
    return rnd(a, prec) @ rnd(b, prec)


#: The GPU configurations (the kernels' roundings, :mod:`kernels.prefill.config`).
_DEFAULT = dict(A=dict(sk="bf16", r="bf16", nd="bf16"),
                C=dict(sk="bf16", r="bf16", nd="bf16", sq="bf16", no="bf16"),
                tb="bf16", aq="bf16", pb="bf16", summ="f32", solve="kernel")


def _cfg(base=None, **over) -> dict:
    """A configuration: ``base`` (the default's) with overrides ``A_sk="x2"``, ``tb="f32"``,
    ``walk="x2"`` (every walk operand), ``sk="x2"`` (both phases) ..."""
    c = json.loads(json.dumps(base or _DEFAULT))
    for key, val in over.items():
        if key == "walk":
            for ph in ("A", "C"):
                c[ph] = {k: val for k in c[ph]}
        elif key in WALK_KEYS:
            c["A"][key] = c["C"][key] = val
        elif key in OUT_KEYS:
            c["C"][key] = val
        elif key[:2] in ("A_", "C_"):
            c[key[0]][key[2:]] = val
        elif key in ("tb", "aq", "pb", "summ", "solve"):
            c[key] = val
        elif key == "tail":   # (L, {phase-C switch: mode}): the last L chunks' roundings
            L, ph = val
            c["tail"] = [L, dict(c["C"], **ph)]
        else:
            raise ValueError(f"unknown rounding switch {key!r}")
    return c


_F32 = _cfg(walk="f32", tb="f32", aq="f32", pb="f32", solve="exact")

#: The variants (name -> configuration). GPU configs first (their measured numbers are in
#: docs/notes/long_context.md), then one rounding on alone, one off alone, pairs, fixes.
VARIANTS = {
    "all_f32": _F32,
    "default": _cfg(),
    "default_exact_solve": _cfg(solve="exact"),
    "bf16x2": _cfg(walk="x2"),
    "accurate": _cfg(walk="x2", tb="x2", aq="x2", solve="exact"),
    # one rounding on, everything else f32
    "only_sk": _cfg(_F32, sk="bf16"),
    "only_A_sk": _cfg(_F32, A_sk="bf16"),
    "only_C_sk": _cfg(_F32, C_sk="bf16"),
    "only_r": _cfg(_F32, r="bf16"),
    "only_nd": _cfg(_F32, nd="bf16"),
    "only_tb": _cfg(_F32, tb="bf16"),
    "only_solve": _cfg(_F32, solve="kernel"),
    "only_pb": _cfg(_F32, pb="bf16"),
    "only_summ": _cfg(_F32, summ="bf16"),
    "only_out": _cfg(_F32, sq="bf16", no="bf16", aq="bf16"),
    # one rounding off (f32), the default otherwise
    "default-sk": _cfg(sk="f32"),
    "default-A_sk": _cfg(A_sk="f32"),
    "default-C_sk": _cfg(C_sk="f32"),
    "default-r": _cfg(r="f32"),
    "default-nd": _cfg(nd="f32"),
    "default-tb": _cfg(tb="f32"),
    "default-pb": _cfg(pb="f32"),
    "default-out": _cfg(sq="f32", no="f32", aq="f32"),
    # pairs
    "only_sk+tb": _cfg(_F32, sk="bf16", tb="bf16"),
    "only_r+nd": _cfg(_F32, r="bf16", nd="bf16"),
    "default-r-nd": _cfg(r="f32", nd="f32"),
    "default-sk-tb": _cfg(sk="f32", tb="f32"),
    # candidate fixes: splits (x2) the GPU can do
    "fix_sk_x2": _cfg(sk="x2"),
    "fix_C_sk_x2": _cfg(C_sk="x2"),
    "fix_A_sk_x2": _cfg(A_sk="x2"),
    "fix_sk_nd_x2": _cfg(sk="x2", nd="x2"),
    "fix_sk_r_x2": _cfg(sk="x2", r="x2"),
    "fix_sk_r_nd_x2": _cfg(sk="x2", r="x2", nd="x2"),
    "fix_C_sk_r_nd_x2": _cfg(C_sk="x2", C_r="x2", C_nd="x2"),
    "fix_walk_x2_tb_x2": _cfg(walk="x2", tb="x2"),
    "fix_sk_x2_tb_x2": _cfg(sk="x2", tb="x2"),
    "fix_sk_tf32": _cfg(sk="tf32"),
}
_X2 = dict(sk="x2", r="x2", nd="x2", sq="x2", no="x2")
for _L in (1, 2, 4, 8, 16, 32):
    VARIANTS[f"tail{_L}_bf16x2"] = _cfg(tail=(_L, _X2))
    VARIANTS[f"tail{_L}_r_nd_x2"] = _cfg(tail=(_L, dict(r="x2", nd="x2")))


def chunked(x: torch.Tensor, nc: int) -> torch.Tensor:
    """``[T, H, ...]`` -> ``[H, nc, 64, ...]``."""
    return x.reshape(nc, BT, *x.shape[1:]).movedim(2, 0)


def solve_kernel(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)^-1`` of strictly lower ``[..., 64, 64]`` f32 tiles by the batched solve's
    block formulas (:func:`kernels.prefill.intra_chunk.solve_bands`): the 16 x 16 diagonal
    blocks through their 8 x 8 blocks (Neumann, bf16x2), the off-diagonal blocks in one
    tf32 pass."""
    BC = 16
    blk = lambda M, i, j: M[..., i * BC:(i + 1) * BC, j * BC:(j + 1) * BC]   # noqa: E731
    eye = torch.eye(BC)
    m8 = (torch.arange(BC)[:, None] // 8) == (torch.arange(BC)[None, :] // 8)
    T0 = []
    for i in range(4):
        A0 = blk(A, i, i)
        D8 = A0 * m8
        P2 = mm_prec(D8, D8, "bf16x2")
        P4 = mm_prec(P2, P2, "bf16x2")
        Ti8 = mm_prec(mm_prec(eye - D8, eye + P2, "bf16x2"), eye + P4, "bf16x2")
        T0.append(mm_prec(eye - mm_prec(Ti8, A0 - D8, "bf16x2"), Ti8, "bf16x2"))
    Tm = torch.zeros_like(A)
    blocks = {(i, i): T0[i] for i in range(4)}     # (I, J): block (I, J) of Tm
    for d in (1, 2, 3):
        for i in range(d, 4):
            acc = sum(mm_prec(blk(A, i, i - m), blocks[i - m, i - d], "tf32")
                      for m in range(1, d + 1))
            blocks[i, i - d] = -mm_prec(T0[i], acc, "tf32")
    for (i, j), b in blocks.items():
        Tm[..., i * BC:(i + 1) * BC, j * BC:(j + 1) * BC] = b
    return Tm


class Inputs:
    """The chunked inputs of one length, shared by every variant: per ``[H, nc]`` chunk
    ``k, q, v`` (f32 of bf16), ``gc``, ``Tb`` (f32: exact and kernel-solved), ``scale Aqk``
    (f32), the initial state ``S0 [H, K, V]``."""

    def __init__(self, x: dict):
        q, k, v = x["q"], x["k"], x["v"]
        T, HQ, D = q.shape
        H = v.shape[1]
        G = H // HQ
        assert T % BT == 0, "T must be a multiple of 64"
        nc = T // BT
        self.T, self.H, self.D, self.nc = T, H, D, nc
        self.scale = x["scale"] or 1.0 / math.sqrt(D)
        # gates as the intra-chunk kernel (f32, per-chunk cumsum)
        g = -torch.exp(x["A_log"].float()) * F.softplus(x["a"].float() + x["dt_bias"].float())
        beta = torch.sigmoid(x["b"].float())
        self.gc = chunked(g, nc).cumsum(-1)                          # [H, nc, 64]
        beta = chunked(beta, nc)
        self.k = chunked(k.float().repeat_interleave(G, dim=1), nc)  # [H, nc, 64, D]
        self.q = chunked(q.float().repeat_interleave(G, dim=1), nc)
        self.v = chunked(v.float(), nc)
        self.S0 = (x["state"][0].float().transpose(-1, -2).contiguous() if x["state"] is not None
                   else torch.zeros(H, D, D))
        gc64 = self.gc.double()
        diff = gc64[..., :, None] - gc64[..., None, :]
        lower = torch.ones(BT, BT, dtype=torch.bool).tril()
        strict = lower.tril(-1)
        decay = torch.exp(diff.clamp_max(0.0))
        k64 = self.k.double()
        A64 = (beta.double()[..., :, None] * (k64 @ k64.transpose(-1, -2)) * decay) * strict
        eye = torch.eye(BT, dtype=torch.float64)
        Tm = torch.linalg.solve_triangular(eye + A64, eye.expand_as(A64), upper=False,
                                           unitriangular=True)
        self.tb = {"exact": (Tm * beta.double()[..., None, :]).float()}
        del Tm
        # the kernel's solve: A in f32 as the kernel forms it
        A32 = ((self.k @ self.k.transpose(-1, -2)) * beta[..., :, None]
               * decay.float()) * strict
        self.tb["kernel"] = solve_kernel(A32) * beta[..., None, :]
        del A32, A64
        self.aq = (self.scale * (self.q.double() @ k64.transpose(-1, -2)) * decay * lower).float()
        self._dither = {}
        self.lb = self.gc[..., -1]    # log bound per chunk: beta |k|^2 <= ~1 adds nothing
        self.bkn_max = float((beta * (self.k * self.k).sum(-1)).max())


    def tb_for(self, solve: str) -> torch.Tensor:
        """``Tb`` in f32 from the solve ``"exact"``, ``"kernel"`` or ``"dither:i"`` (the
        exact one times ``1 + 2^-12 u``, ``u`` uniform in [-1, 1) from seed ``i``: another
        set of plausible low bits, as a solve of other roundings would leave)."""
        if not solve.startswith("dither:"):
            return self.tb[solve]
        if solve not in self._dither:
            gen = torch.Generator().manual_seed(int(solve.split(":")[1]))
            u = torch.rand(self.tb["exact"].shape, generator=gen) * 2 - 1
            self._dither = {solve: self.tb["exact"] * (1 + u * 2.0 ** -12)}
        return self._dither[solve]


def segments(inp: Inputs, log_eps: float = -20.0):
    """Chunks per segment as the plan (and the device's split) would use at this length,
    and the plan's path. Refuses where phase A's truncation would drop anything."""
    from kernels.prefill.context_parallel import cp_split
    from kernels.prefill.plan import prefill_plan
    plan = prefill_plan(inp.T, 1, inp.H, inp.D, device="cpu")
    if plan.path not in ("cp_long", "cp_long_split"):
        # shorter than the long path: emulate its rule's segments anyway (16 per sequence)
        from kernels.prefill.context_parallel import cp_long_segment_chunks
        seg = cp_long_segment_chunks(inp.T, 1)
        if cp_split(seg):
            raise SystemExit(f"T={inp.T}: not the long path and the rule would split")
    else:
        seg = plan.phase_c["seg_t"] // BT
        if plan.split:   # segment_split_kernel: fine when 2 * slow (segment, head) <= 132
            n_f = -(-inp.nc // seg)
            sums = inp.lb[:, :n_f * seg].reshape(inp.H, n_f, seg).sum(-1)[:, :-1]
            n_slow = int((sums > log_eps).sum())
            if not (n_slow > 0 and 2 * n_slow <= 132):
                seg *= 2
    if inp.bkn_max - 1.0 > 1.0:
        raise SystemExit("beta |k|^2 > 2: the log bound is not the decay alone")
    if float(inp.lb.reshape(inp.H, -1, seg).sum(-1).min()) <= log_eps:
        raise SystemExit(f"T={inp.T}: phase A's truncation would apply (not emulated)")
    return seg, plan.path


def walk(inp: Inputs, S, seg: int, ph: dict, tb, aq, outputs: bool, segs=None, steps=None):
    """Walk the chunks ``steps`` (default: all ``seg``) of the segments ``segs`` (a slice;
    default: all) from ``S`` (``[H, n, K, cols]``) with the roundings ``ph`` (phase A: ``v``
    padded to the columns, see :func:`emulate`); returns the end states and, with
    ``outputs``, the outputs ``[H, n, steps, 64, V]`` (bf16)."""
    segs = segs or slice(None)
    steps = range(seg) if steps is None else steps
    H = S.shape[0]
    sh = (H, inp.nc // seg, seg)
    k, gc = inp.k.reshape(*sh, BT, -1)[:, segs], inp.gc.reshape(*sh, BT)[:, segs]
    v, q = inp.v.reshape(*sh, BT, -1)[:, segs], inp.q.reshape(*sh, BT, -1)[:, segs]
    tbs = tb.reshape(*sh, BT, BT)[:, segs]
    aqs = aq.reshape(*sh, BT, BT)[:, segs] if outputs else None
    cols = S.shape[-1]
    if cols != v.shape[-1]:   # phase A: [I | 0] sees values only in its X columns
        v = torch.cat([torch.zeros(*v.shape[:-1], cols - v.shape[-1]), v], -1)
    outs = []
    for j in steps:
        kj, gj = k[:, :, j], gc[:, :, j]
        eg = torch.exp(gj)[..., None]
        gl = gj[..., -1:]
        R = v[:, :, j] - (kj @ rnd(S, ph["sk"])) * eg
        N = tbs[:, :, j] @ rnd(R, ph["r"])
        if outputs:
            o = ((q[:, :, j] @ rnd(S, ph["sq"])) * (inp.scale * eg)
                 + aqs[:, :, j] @ rnd(N, ph["no"]))
            outs.append(o.to(torch.bfloat16))
        S = S * torch.exp(gl)[..., None] + kj.transpose(-1, -2) @ rnd(
            N * torch.exp(gl - gj)[..., None], ph["nd"])
    if outputs and not outs:
        return S, torch.zeros(*v.shape[:2], 0, BT, inp.D, dtype=torch.bfloat16)
    return S, (torch.stack(outs, 2) if outputs else None)


def emulate(inp: Inputs, seg: int, c: dict):
    """The long path with roundings ``c``: ``(o [T, H, V] bf16, ht [H, V, K] f32)``. With
    ``c["tail"] = (L, ph)`` the last ``L`` chunks of the sequence (of its last segment,
    ``L <= seg``) walk with the phase-C roundings ``ph`` instead of ``c["C"]``."""
    H, D, nc = inp.H, inp.D, inp.nc
    nseg = nc // seg
    tb = rnd(inp.tb_for(c["solve"]), c["tb"])
    aq = rnd(inp.aq, c["aq"])
    # phase A: [I | 0] per segment (the last one's is not needed)
    S = torch.cat([torch.eye(D).expand(H, nseg, D, D), torch.zeros(H, nseg, D, D)], -1)
    S, _ = walk(inp, S, seg, c["A"], tb, aq, False)
    M, X = rnd(S[..., :D], c["summ"]), rnd(S[..., D:], c["summ"])
    # phase B: the entering states
    s0 = [inp.S0]
    for s in range(nseg - 1):
        s0.append(rnd(M[:, s], c["pb"]) @ rnd(s0[-1], c["pb"]) + X[:, s])
    s0 = torch.stack(s0, 1)
    # phase C
    tail, ph_t = c.get("tail") or (0, None)
    if not 0 <= tail <= seg:
        raise ValueError(f"tail must lie in 0..{seg} chunks, got {tail}")
    if tail:
        _, o1 = walk(inp, s0[:, :-1], seg, c["C"], tb, aq, True, slice(0, nseg - 1))
        S, o2 = walk(inp, s0[:, -1:], seg, c["C"], tb, aq, True, slice(nseg - 1, nseg),
                     range(seg - tail))
        S, o3 = walk(inp, S, seg, ph_t, tb, aq, True, slice(nseg - 1, nseg),
                     range(seg - tail, seg))
        o = torch.cat([o1, torch.cat([o2, o3], 2)], 1)
    else:
        S, o = walk(inp, s0, seg, c["C"], tb, aq, True)
    o = o.reshape(H, nc * BT, D).transpose(0, 1)
    return o, S[:, -1].transpose(-1, -2)


def errors(o, ht, ref) -> dict:
    """Max abs error and elements outside the contest rule of the outputs and the final
    state; the worst state element."""
    from kernels.checks import check_close
    ro, rs = ref[0], ref[1][0]
    co = check_close(o, ro)
    cs = check_close(ht, rs)
    d = (ht - rs).abs()
    i = int(d.argmax())
    h, vv, kk = i // (d.shape[1] * d.shape[2]), (i // d.shape[2]) % d.shape[1], i % d.shape[2]
    return dict(o_max_abs=round(co.max_abs_err, 6), o_bad=co.n_bad,
                o_rel_l2=round(co.rel_l2_err, 6),
                state_max_abs=round(cs.max_abs_err, 6), state_bad=cs.n_bad,
                state_rel_l2=round(cs.rel_l2_err, 6),
                worst=dict(head=h, v=vv, k=kk, ref=round(float(rs[h, vv, kk]), 4)),
                ok=co.ok and cs.ok)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[32768],
                    help="sequence lengths (multiples of 64; default 32768)")
    ap.add_argument("--variants", default="",
                    help="comma-separated names of VARIANTS (default: all); "
                         "'list' prints them")
    ap.add_argument("--gates", default="every head long memory",
                    help="gate set of kernels.stress_inputs.with_gates")
    ap.add_argument("--seed", type=int, nargs="+", default=[0],
                    help="input seeds (kernels.spec.make_prefill_inputs; default 0)")
    ap.add_argument("--dither", type=int, default=0,
                    help="also run each variant with this many dithered solves "
                         "(Inputs.tb_for): the spread of the max over plausible low bits")
    ap.add_argument("--out", default="", help="also append the JSON lines to this file")
    args = ap.parse_args(argv)
    if args.variants == "list":
        for n, c in VARIANTS.items():
            print(n, json.dumps(c))
        return
    names = [n for n in args.variants.split(",") if n] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown} (try --variants list)")
    from kernels.reference import prefill_reference_chunked
    from kernels.spec import make_prefill_inputs
    from kernels.stress_inputs import with_gates
    torch.set_num_threads(2)
    out = open(args.out, "a") if args.out else None
    for T, seed in [(T, sd) for T in args.T for sd in args.seed]:
        t0 = time.time()
        x = with_gates(make_prefill_inputs([T], seed=seed), args.gates)
        ref = prefill_reference_chunked(**x)
        inp = Inputs(x)
        seg, path = segments(inp)
        print(f"# T={T}, seed {seed}: path {path}, {seg} chunks per segment ({inp.nc // seg} segments), "
              f"setup {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        runs = [(n, VARIANTS[n]) for n in names]
        runs += [(f"{n}@dither:{i}", dict(c, solve=f"dither:{i}"))
                 for i in range(1, args.dither + 1) for n, c in runs]
        for name, cfg in runs:
            t1 = time.time()
            o, ht = emulate(inp, seg, cfg)
            row = dict(T=T, seed=seed, gates=args.gates, seg_chunks=seg, variant=name,
                       **errors(o, ht, ref), s=round(time.time() - t1, 1))
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
