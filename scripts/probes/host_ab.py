"""Host µs per eager call of our decode and prefill, for an A/B of two trees in one call.

Imports ``kernels`` from the folder named by ``--root`` (e.g. an older commit's tree
unpacked under ``.probe/``), so both trees are timed on the same host, minutes apart.
The prefill cases are meant to cover every path (by the plan rules, not checked here):
T = 6 recurrent, 64 one launch, 57 x 64 the walk, 8,192 chained CP, 16,384 long CP.
Method: as ``kernels.bench.timing``'s ``host`` (10 calls per sample, no sync inside,
synchronised between samples; median of 100 samples), written inline so that an old tree
without that method can be measured too. Prints one JSON line.

    python scripts/probes/host_ab.py --root .probe/old --tag old
"""
import argparse
import json
import sys
import time


def host_us(fn, rep=100, calls=10):
    import torch

    for _ in range(20):
        fn()
    xs = []
    for _ in range(rep):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        xs.append((time.perf_counter() - t0) * 1e6 / calls)
    torch.cuda.synchronize()
    xs.sort()
    return round(xs[len(xs) // 2], 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--tag", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.root)
    import triton

    from kernels.decode import gdn_decode
    from kernels.prefill import gdn_prefill
    from kernels.spec import make_decode_inputs, make_prefill_inputs

    @triton.jit
    def empty_kernel():
        pass

    res = dict(tag=args.tag, bare_launch=host_us(lambda: empty_kernel[(1,)]()))
    for B in (1, 8, 64):
        inp = make_decode_inputs(B, device="cuda")
        res[f"decode_B{B}"] = host_us(lambda: gdn_decode(**inp))
    for lens in ([6], [64], [64] * 57, [8192], [16384]):   # recurrent, single, walk, cp, long
        inp = make_prefill_inputs(lens, device="cuda")
        name = f"prefill_{len(lens)}x{lens[0]}" if len(lens) > 1 else f"prefill_{lens[0]}"
        res[name] = host_us(lambda: gdn_prefill(**inp))
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
