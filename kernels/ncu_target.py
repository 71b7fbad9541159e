"""The process Nsight Compute profiles: one measured call inside an NVTX range.

    python -m kernels.ncu_target --impl ours --config BV8-w1-s1-t1 --B 64
    python -m kernels.ncu_target --impl fla --B 64
    python -m kernels.ncu_target --impl flashinfer --op prefill --lens 512,512

Builds seeded contest inputs on CUDA (:func:`kernels.spec.make_decode_inputs`
or ``make_prefill_inputs``), runs the implementation ``--warmup`` times
*outside* any range (compilation, FlashInfer's JIT, autotuning), synchronises,
then runs exactly one call inside the NVTX push/pop range ``gdnbench_measured``
(default domain), so ``ncu --nvtx --nvtx-include gdnbench_measured/`` profiles
only the kernels of that call.

Implementations: ``ours`` (:func:`kernels.decode.gdn_decode` with ``--config``,
or the prefill pipeline with ``--variant``), and every peer name of
:mod:`kernels.peers` (``fla``, ``flashinfer``, ``flashinfer_inplace``,
``torch``), and ``solution:<path>`` (a flashinfer-bench solution loaded by
:func:`kernels.contest.load_solution`, unscoped: this process is its own). Prints nothing on stdout (ncu writes its CSV there); exit status 3
when the implementation is unavailable, with the reason on stderr.

A program above the instruments (it composes ours, the peers and the solutions), which
:func:`kernels.bench.ncu.run_ncu` runs under ncu by its module name.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

from .bench.ncu import EXIT_UNAVAILABLE, NVTX_RANGE

__all__ = ["build_call", "nvtx_range", "main"]


class nvtx_range:
    """Push/pop an NVTX range in the default domain (the ``nvtx`` package when
    importable, else ``torch.cuda.nvtx``)."""

    def __init__(self, name: str):
        self.name = name
        try:
            import nvtx

            self._push = lambda: nvtx.push_range(message=name)
            self._pop = nvtx.pop_range
        except ImportError:
            import torch

            self._push = lambda: torch.cuda.nvtx.range_push(name)
            self._pop = torch.cuda.nvtx.range_pop

    def __enter__(self):
        self._push()
        return self

    def __exit__(self, *exc):
        self._pop()
        return False


def build_call(impl: str, op: str = "decode", *, B: int = 64, lens=(512,), config: Optional[str] = None,
               variant: str = "fused", seed: int = 0, device: str = "cuda") -> Callable[[], object]:
    """A zero-argument callable running ``impl`` on seeded contest inputs.

    Raises ``RuntimeError`` (with the peer's reason) when ``impl`` is unavailable.
    """
    from kernels import spec

    if op == "decode":
        inputs = spec.make_decode_inputs(B, seed=seed, device=device)
    elif op == "prefill":
        inputs = spec.make_prefill_inputs(list(lens), seed=seed, device=device)
    else:
        raise ValueError(f"op must be 'decode' or 'prefill', got {op!r}")
    if impl.startswith("solution:"):
        from kernels.contest.loader import load_solution

        fn = load_solution(impl, op, scoped=False)
        return lambda: fn(**inputs)
    if impl == "ours":
        if op == "decode":
            from kernels.decode import gdn_decode

            return lambda: gdn_decode(**inputs, config=config)
        from kernels.prefill import make_prefill_impl

        fn = make_prefill_impl(variant)
        return lambda: fn(**inputs)
    from kernels.peers import peer_impls

    fn = peer_impls(op, [impl])[impl]   # built here, worker peers too: the process is ncu's
    if not fn:
        raise RuntimeError(f"{impl} ({op}) unavailable: {fn.reason}")
    return lambda: fn(**inputs)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kernels.ncu_target", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", required=True, help="ours | fla | flashinfer | flashinfer_inplace | torch")
    p.add_argument("--op", default="decode", choices=("decode", "prefill"))
    p.add_argument("--B", type=int, default=64, help="decode batch size")
    p.add_argument("--lens", default="512", help="prefill sequence lengths, comma separated")
    p.add_argument("--config", default=None, help="decode config name of ours (default: table)")
    p.add_argument("--variant", default="fused", help="prefill variant of ours")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before the range")
    p.add_argument("--range", default=NVTX_RANGE, help="NVTX range name")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("ncu_target: no CUDA GPU visible", file=sys.stderr)
        return EXIT_UNAVAILABLE
    lens = [int(x) for x in str(args.lens).split(",") if x.strip()]
    try:
        fn = build_call(args.impl, args.op, B=args.B, lens=lens, config=args.config,
                        variant=args.variant, seed=args.seed)
    except (RuntimeError, ImportError, ValueError) as e:   # ValueError: SolutionError
        print(f"ncu_target: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    for _ in range(max(0, args.warmup)):
        fn()
    torch.cuda.synchronize()
    with nvtx_range(args.range):
        fn()
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
