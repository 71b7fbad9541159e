"""Probe (CPU): shared-memory wavefronts per item of the Gluon intra kernel's front
warpgroups (``scripts/probes/gluon_intra.py``), from its compiled sm_90a PTX, no GPU.

Why: ``fused_copy`` took 1,412 µs at 131,072 tokens where ``front`` took 116, with 0 spills
and no local memory; the cost sat in shared-memory bank conflicts that the compile report
does not show (docs/notes/long_context.md, "Why fused_copy is slow").

How: each variant is compiled by :func:`gluon_intra.compile_sm90`; in its PTX the two front
partitions are the code after ``setmaxnreg`` to 240 registers (the default partition's
``dec``, the worker's ``inc``) up to the next ``setmaxnreg``. The integer instructions of
the whole function are evaluated for the partition's 128 threads (``%tid.x``, constants,
``global_smem`` = 0; anything loaded or floating-point is unknown), in program text order,
twice (values defined later in the text but earlier in the loop). Every ``st.shared``,
``ld.shared`` and ``stmatrix`` of the partition gets its per-thread address and predicate,
and each warp's access its wavefronts: 32 banks of 4 B, one wavefront per distinct word in
the busiest bank, at least one per 128 B. One pass over a partition's text is one loop
iteration, i.e. one item (a chunk and a q/k head, both value heads). A model of the bank
rule, not the hardware's counter: Nsight Compute's
``l1tex__data_pipe_lsu_wavefronts_mem_shared`` is the measurement.

    python3 scripts/probes/smem_wavefronts.py [--variants front,fused_copy,fused_copy2] [--lines 8]

One JSON line per variant and partition: ``wavefronts`` (per item, its 4 warps),
``conflict_free`` (what the same accesses would take without conflicts), ``unknown`` (accesses
whose address the evaluation could not follow) and, with ``--lines N``, the N source
locations with the most wavefronts.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

M32 = (1 << 32) - 1
_INT_OPS = {"add", "sub", "mul", "mad", "shl", "shr", "and", "or", "xor", "not", "min", "max",
            "neg", "div", "rem", "bfe", "abs"}


def _known(vals) -> bool:
    return all(v is not None for v in vals)


def _split_ops(s: str):
    return [x.strip() for x in re.split(r",(?![^{]*})", s)]


class _Threads:
    """Integer registers of a set of threads, one numpy array each (None: unknown)."""

    def __init__(self, tids):
        self.tid = np.asarray(tids, dtype=np.int64)
        self.reg = {}

    def value(self, tok: str):
        tok = tok.strip()
        if tok == "%tid.x":
            return self.tid.copy()
        if tok.startswith("%tid"):
            return np.zeros_like(self.tid)
        if tok.startswith("%"):
            return self.reg.get(tok)
        if tok == "global_smem":
            return np.zeros_like(self.tid)
        if re.fullmatch(r"-?0[xX][0-9a-fA-F]+|-?\d+", tok):
            return np.full_like(self.tid, int(tok, 0))
        return None

    def address(self, tok: str):
        m = re.fullmatch(r"\[\s*([^\]+]+?)\s*(?:\+\s*(-?\d+))?\s*\]", tok.strip())
        if m is None:
            return None
        base = self.value(m.group(1))
        return None if base is None else base + int(m.group(2) or 0)

    def execute(self, op: str, ops, pred):
        """One non-memory instruction: set its destination(s) where computable."""
        base = op.split(".")[0]
        srcs = [self.value(x) for x in ops[1:]]
        res = None
        floating = ".f" in op and base not in ("cvt", "mov")
        if base in ("mov", "cvt") and len(srcs) == 1 and srcs[0] is not None:
            if not (base == "cvt" and (".f" in op or ".rn" in op)):
                res = srcs[0] & M32 if ".u32.u64" in op else srcs[0]
        elif base == "setp" and not floating and _known(srcs[:2]):
            a, b = srcs[0], srcs[1]
            if not (".s" in op):
                a, b = a & M32, b & M32
            cmp = op.split(".")[1]
            r = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b,
                 "ge": a >= b}.get(cmp)
            res = None if r is None else r.astype(np.int64)
        elif base == "selp" and not floating and _known(srcs):
            res = np.where(srcs[2] != 0, srcs[0], srcs[1])
        elif base in _INT_OPS and not floating and srcs and _known(srcs):
            a = srcs[0]
            b = srcs[1] if len(srcs) > 1 else None
            res = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                   "mad": lambda: a * b + srcs[2], "shl": lambda: a << b,
                   "shr": lambda: (a >> b) if ".s" in op else ((a & M32) >> b),
                   "and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b,
                   "not": lambda: ~a, "min": lambda: np.minimum(a, b),
                   "max": lambda: np.maximum(a, b), "neg": lambda: -a,
                   "div": lambda: a // np.where(b == 0, 1, b),
                   "rem": lambda: a % np.where(b == 0, 1, b),
                   "bfe": lambda: (a >> b) & ((1 << srcs[2]) - 1), "abs": lambda: np.abs(a)}[base]()
            if "32" in op:
                res = res & M32
                if ".s32" in op:
                    res = np.where(res >= 1 << 31, res - (1 << 32), res)
        for d in re.findall(r"%[a-z]+\d+", ops[0].split("|")[0]):
            old = self.reg.get(d)
            if isinstance(pred, np.ndarray) and res is not None and old is not None:
                self.reg[d] = np.where(pred, res, old)
            elif isinstance(pred, str):
                self.reg[d] = None
            else:
                self.reg[d] = res


def _wavefronts(addr, width: int, active):
    """``(wavefronts, conflict_free)`` of one warp's access of ``width`` bytes per thread."""
    words = {int(a) // 4 + w for a in addr[active] for w in range(max(1, width // 4))}
    if not words:
        return 0, 0
    ideal = max(1, -(-len(words) * 4 // 128))
    return max(max(collections.Counter(w % 32 for w in words).values()), ideal), ideal


def partitions(ptx_lines):
    """``[(name, first_line, end_line, first_tid)]`` of the two front partitions (0-based
    line indices, end exclusive)."""
    marks = [(i, l) for i, l in enumerate(ptx_lines) if "setmaxnreg" in l]
    out = []
    for k, (i, l) in enumerate(marks):
        if l.strip().endswith("240;"):
            end = marks[k + 1][0] if k + 1 < len(marks) else len(ptx_lines)
            name, tid0 = ("default", 0) if ".dec." in l else ("worker", 128)
            out.append((name, i, end, tid0))
    return out


def analyse(ptx: str, lines_top: int = 0):
    """Per front partition: wavefronts of one loop iteration (one item), as described in
    the module docstring."""
    L = ptx.splitlines()
    files = dict(re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M))
    rows = []
    for name, lo, hi, tid0 in partitions(L):
        th = _Threads(range(tid0, tid0 + 128))
        per_loc = collections.defaultdict(lambda: [0, 0])
        tot = dict(wavefronts=0, conflict_free=0, unknown=0)
        for sweep in range(2):
            loc = None
            for i, raw in enumerate(L):
                m = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", raw)
                if m:
                    loc = f"{os.path.basename(files.get(m.group(1), '?'))}:{m.group(2)}"
                    continue
                line = raw.split("//")[0].strip().rstrip(";").strip()
                if not line or line[0] in ".${}" or line.endswith(":"):
                    continue
                pred = None
                m = re.match(r"@(!?)(%p\d+)\s+(.*)", line)
                if m:
                    pv = th.reg.get(m.group(2))
                    pred = "unknown" if pv is None else (pv == 0 if m.group(1) else pv != 0)
                    line = m.group(3)
                parts = line.split(None, 1)
                op, ops = parts[0], _split_ops(parts[1]) if len(parts) > 1 else []
                is_mem = op.startswith(("ld.shared", "st.shared", "stmatrix"))
                if not is_mem:
                    if ops:
                        th.execute(op, ops, pred)
                    continue
                if op.startswith("ld.shared"):
                    for d in re.findall(r"%[a-z]+\d+", ops[0]):
                        th.reg[d] = None
                if sweep == 0 or not lo <= i < hi:
                    continue
                width = 16 if "stmatrix" in op or ".v4" in op else 8 if ".v2" in op else 4
                if op.startswith(("ld", "st.")) and op.endswith(("b16", "u16")) and ".v" not in op:
                    width = 2
                addr = th.address(ops[1] if op.startswith("ld") else ops[0])
                if addr is None or isinstance(pred, str):
                    tot["unknown"] += 1
                    continue
                active = np.ones(128, bool) if pred is None else pred
                for w in range(4):
                    s = slice(32 * w, 32 * w + 32)
                    a, b = _wavefronts(addr[s], width, active[s])
                    tot["wavefronts"] += a
                    tot["conflict_free"] += b
                    per_loc[loc][0] += a
                    per_loc[loc][1] += b
        row = dict(partition=name, **tot)
        if lines_top:
            top = sorted(per_loc.items(), key=lambda kv: -kv[1][0])[:lines_top]
            row["top"] = [dict(loc=k, wavefronts=v[0], conflict_free=v[1]) for k, v in top]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    import gluon_intra as gi

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="front,fused_copy,fused,fused_copy2,fused2",
                    help=f"of {', '.join(gi.VARIANTS)}")
    ap.add_argument("--lines", type=int, default=0,
                    help="also list the N source locations with the most wavefronts")
    a = ap.parse_args(argv)
    for var in a.variants.split(","):
        if var not in gi.VARIANTS:
            ap.error(f"--variants: pick from {', '.join(gi.VARIANTS)}")
        extra, stages, band_rows = gi.VARIANTS[var]
        ck, _ = gi.compile_sm90(extra=extra, stages=stages, band_rows=band_rows)
        for row in analyse(ck.asm["ptx"], a.lines):
            print(json.dumps(dict(variant=var, **row)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
