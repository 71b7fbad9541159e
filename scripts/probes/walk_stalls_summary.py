"""Summarise Nsight Compute's per-instruction warp-stall samples (``ncu -i REP --page source
--csv --print-source sass``, one block per profiled kernel, as ``walk_stalls.py`` makes):
per kernel, the stall reasons' shares of all samples, and the SASS opcodes that hold most
samples with their top reasons.

    python3 scripts/probes/walk_stalls_summary.py walk_sass.csv   # or .csv.gz
"""
import collections
import csv
import gzip
import io
import sys


def blocks(path):
    """The per-kernel blocks of the export: lists of rows, the first being the header."""
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    out, cur = [], None
    for r in csv.reader(io.StringIO(raw.read())):
        if r and r[0] == "Kernel Name":
            cur = []
            out.append(cur)
        elif cur is not None:
            cur.append(r)
    return out


def summarise(block, top=12):
    hdr, data = block[0], [r for r in block[1:] if len(r) >= len(block[0])]
    ix = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    tot, by_op = collections.Counter(), collections.defaultdict(collections.Counter)
    for r in data:
        words = r[ix["Source"]].split()
        op = (words[1] if words and words[0].startswith("@") else (words or ["?"])[0])
        for c in reasons:
            v = float(r[ix[c]] or 0)
            tot[c] += v
            by_op[op.split(".")[0]][c] += v
    total = sum(tot.values()) or 1.0
    lines = [f"{len(data)} SASS lines, {total:.0f} stall samples"]
    lines += [f"  {c[6:]:20s} {100 * v / total:5.1f} %" for c, v in tot.most_common(8)]
    for s, op in sorted(((sum(v.values()), k) for k, v in by_op.items()), reverse=True)[:top]:
        why = ", ".join(f"{c[6:]} {100 * v / s:.0f} %" for c, v in by_op[op].most_common(3))
        lines.append(f"    {op:10s} {100 * s / total:5.1f} %  ({why})")
    return "\n".join(lines)


if __name__ == "__main__":
    for i, b in enumerate(blocks(sys.argv[1])):
        print(f"== profiled kernel {i}\n{summarise(b)}")
