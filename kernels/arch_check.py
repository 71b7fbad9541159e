"""Compile every Triton kernel of ours for GPUs we do not have, at the launches our
dispatch rules pick, and check each against that architecture's limits.

    python -m kernels.arch_check                      # sm_80 86 89 90 100 120, a table
    python -m kernels.arch_check --arch 86,120 --json out.json --jobs 2 --scope dispatch

No GPU is needed (nor used: run it with ``TRITON_INTERPRET`` unset or 0). For each
compute capability of :data:`kernels.gpu_limits.ARCHS` the module

1. **captures the launches**: it runs the real entry points — ``gdn_decode`` at every
   contest batch size with every config an unknown GPU's fallback table or a shipped
   table (``kernels/decode_configs/``) can pick, ``gdn_replay_decode`` (B = 1 and 64,
   T = 1 and 4, L = 8 and 16), and ``gdn_prefill`` (``fused`` and
   ``graph`` with the default config at every contest prefill shape and the
   long-context lengths :data:`LONG_LENGTHS`, and the FLA drop-in's chunked call with the
   L2 norm of ``q`` and ``k`` in the kernels at those lengths; with ``--scope all``, the
   default, also
   ``fused`` with :data:`~kernels.prefill.ACCURATE_CONFIG`, at the contest shapes
   notebook 02's ``no_sync``, ``fused_gates`` and ``unfused``, and one rank of
   :func:`~kernels.prefill.multi_gpu.prefill_multi_gpu` with its collective stubbed) — on CPU tensors, with the device queries of the launch
   rules answered for that architecture (its SM count, shared memory per block,
   programmatic dependent launch from sm_90 on, its compute capability: the Gluon phase C
   of the long paths on sm_90) and Triton's ``JITFunction.run`` (Gluon's too) replaced by
   a recorder, so nothing executes;
2. **compiles** each distinct launch (kernel, argument types and specialisation,
   constexprs, ``num_warps`` / ``num_stages`` / ``maxnreg`` / ``launch_pdl``) with
   ``triton.compile(..., target=GPUTarget("cuda", cc, 32))``: pointer arguments 16-byte
   aligned as torch allocates them, integers specialised as Triton does (``== 1``,
   divisible by 16) except where the kernel says ``do_not_specialize``;
3. **reports** registers and spill bytes (``cuobjdump`` shipped with Triton), shared
   memory, and whether the block fits: shared memory within the architecture's
   per-block limit, ``registers * 32 * num_warps`` within the SM's register file, and
   no ``griddepcontrol`` instruction below sm_90.

The result is one row per (arch, launch): ``arch, kernel, launches (where the rules
picked it: entry point and shape), num_warps, num_stages, constexprs, regs,
spill_bytes, shared_bytes, smem_limit, fits, uses_pdl, error``. ``--json`` writes them
with the Triton version; the exit status is 1 if any launch does not compile or does
not fit. ``tests/test_arch_check.py`` runs this in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

from .gpu_limits import ARCHS, ArchLimits

__all__ = ["Launch", "capture_launches", "compile_launch", "check", "main",
           "LONG_LENGTHS", "SCOPES"]

#: Long-context single-sequence lengths captured besides the contest shapes: the chained
#: context parallelism (4,096-16,383 tokens) and the long path (from 16,384).
LONG_LENGTHS = (4096, 16384, 65536)


@dataclass
class Launch:
    """One distinct kernel launch as Triton would compile it."""

    kernel: str                         # module.function
    signature: Dict[str, str]
    constexprs: Dict[str, object]
    divisible16: List[str]
    options: Dict[str, object]
    where: List[str] = field(default_factory=list)
    fn: object = field(default=None, repr=False, compare=False)

    def key(self) -> str:
        return json.dumps([self.kernel, self.signature, {k: repr(v) for k, v in
                           self.constexprs.items()}, self.divisible16, self.options],
                          sort_keys=True)


def _dtype_name(t) -> str:
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
             torch.float64: "fp64", torch.int32: "i32", torch.int64: "i64", torch.int8: "i8",
             torch.uint8: "u8", torch.bool: "i1", torch.int16: "i16"}
    return names[t.dtype]


def _describe(fn, args, kwargs) -> Launch:
    """What Triton specialises a launch of ``fn`` on (see the module docstring)."""
    import torch

    params = fn.params
    names = [p.name for p in params]
    bound = dict(zip(names, args))
    options = {k: v for k, v in kwargs.items() if k not in names}
    bound.update({k: v for k, v in kwargs.items() if k in names})
    dns = set(getattr(fn, "do_not_specialize", ()) or ())
    dns |= {names[i] for i in dns if isinstance(i, int)}
    sig, const, div = {}, {}, []
    for i, p in enumerate(params):
        v = bound[p.name] if p.name in bound else (p.default if p.has_default else None)
        if p.is_constexpr or v is None:
            sig[p.name], const[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _dtype_name(v)
            if v.data_ptr() % 16 == 0:
                div.append(p.name)
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            if p.name not in dns and i not in dns and v == 1:
                sig[p.name], const[p.name] = "constexpr", 1
                continue
            sig[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
            if p.name not in dns and i not in dns and v % 16 == 0:
                div.append(p.name)
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        elif hasattr(v, "block_shape") and hasattr(v, "layout"):   # a Gluon TMA descriptor
            from triton.runtime.jit import mangle_type

            sig[p.name] = mangle_type(v)
        else:
            raise TypeError(f"{fn.__name__}: cannot describe argument {p.name}={v!r}")
    opts = {k: options[k] for k in ("num_warps", "num_stages", "maxnreg", "launch_pdl")
            if options.get(k) is not None}
    opts.setdefault("num_warps", 4)
    opts.setdefault("num_stages", 3)
    return Launch(f"{fn.fn.__module__}.{fn.fn.__name__}", sig, const, div, opts, fn=fn)


@contextmanager
def _emulating(arch: ArchLimits, record):
    """Answer the launch rules' device queries for ``arch``; record launches instead of
    running them."""
    import triton
    from triton.runtime.jit import JITFunction

    from .prefill import context_parallel, pdl, plan
    from . import gpu_limits

    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def run(self, *args, grid, warmup, **kwargs):
        record(self, args, kwargs)

    patch(JITFunction, "run", run)
    fast = os.environ.get("GDN_FAST_LAUNCH")
    os.environ["GDN_FAST_LAUNCH"] = "0"   # the launch-key cache asks for a CUDA device
    patch(context_parallel, "sm_count", lambda device: arch.n_sm)
    patch(plan, "sm_count", lambda device: arch.n_sm)
    patch(plan, "device_cc", lambda device: arch.cc)   # the Gluon phase C's rule
    patch(pdl, "_device_ok", lambda device: arch.pdl and pdl._HAVE_GDC
          and pdl._launch_option_known())
    patch(gpu_limits, "device_limits", lambda device: arch)
    plan.clear_plan_cache()   # plans are remembered per device, not per emulated arch
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        plan.clear_plan_cache()
        if fast is None:
            os.environ.pop("GDN_FAST_LAUNCH", None)
        else:
            os.environ["GDN_FAST_LAUNCH"] = fast
        del triton


SCOPES = ("dispatch", "all")


def _entry_points(scope: str = "all"):
    """``(label, thunk)`` of every call whose launches we compile (CPU tensors).
    ``scope="dispatch"``: decode and the default prefill path (``fused``, ``graph``, the
    default config) only; ``"all"`` adds the accurate config and notebook 02's unfused
    variants."""
    import torch

    from .decode import ReplayRing, gdn_decode, gdn_replay_decode
    from .decode.table import CONFIG_DIR, DEFAULT_TABLE, load_config_table
    from .prefill import ACCURATE_CONFIG, gdn_prefill
    from .spec import DECODE_BATCH_SIZES, PREFILL_SHAPES, make_decode_inputs, make_prefill_inputs

    configs = {c.name: c for c in DEFAULT_TABLE.values()}
    for p in sorted(CONFIG_DIR.glob("*.json")):
        configs.update({c.name: c for c in load_config_table(p.stem).values()})
    for B in DECODE_BATCH_SIZES:
        x = make_decode_inputs(B)
        for name, cfg in configs.items():
            yield f"decode B={B} {name}", (lambda x=x, cfg=cfg: gdn_decode(
                x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                x["scale"], config=cfg))
    # the replay decode at notebook 01's largest L and its T = 1 / speculative T = 4 calls
    for B, T, L, pooled in ((1, 1, 16, False), (64, 1, 8, False), (64, 4, 8, True)):
        x = make_decode_inputs(B, tokens=T, pool_size=2 * B if pooled else None,
                               state_dtype=torch.bfloat16 if pooled else torch.float32)
        ring = ReplayRing.empty(x["state"].shape[0], 4, 8, 128, L)
        back = torch.zeros(B, dtype=torch.int32) if T > 1 else None
        yield f"replay B={B} T={T} L={L}", (lambda x=x, ring=ring, back=back: gdn_replay_decode(
            **x, ring=ring, rollback=back, check_values=False))
    shapes = dict(PREFILL_SHAPES)
    shapes.update({f"T{n}": [n] for n in LONG_LENGTHS})
    for label, lens in shapes.items():
        x = make_prefill_inputs(lens)
        args = (x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                x["cu_seqlens"], x["scale"])
        # check_values=False: what a CUDA device does by default (cu_seqlens checked on the
        # device, by the guard in the last kernel or the guard's own launch)
        runs = [("fused", {}), ("graph", dict(variant="graph"))]
        if scope == "all":
            runs.append(("fused accurate", dict(config=ACCURATE_CONFIG)))
        if scope == "all" and label in PREFILL_SHAPES:
            runs += [(v, dict(variant=v)) for v in ("no_sync", "fused_gates", "unfused")]
        for name, kw in runs:
            yield f"prefill {name} {label}", (lambda args=args, kw=kw: gdn_prefill(
                *args, check_values=False, **kw))
    # the FLA drop-in with the L2 norm of q and k in the kernels (transformers' Qwen3-Next
    # call): the chunked kernels' QK_NORM launches, the long paths' (Gluon phase C) included
    for n in LONG_LENGTHS:
        yield f"prefill fla qk_norm T{n}", (lambda n=n: _fla_qk_norm(n))
    if scope == "all":
        yield "prefill multi_gpu rank 1 of 2 T131072", _multi_gpu_rank
    del torch


def _fla_qk_norm(T: int):
    """:func:`.model.fla_compat.chunk_gated_delta_rule` with ``use_qk_l2norm_in_kernel`` on
    one sequence of ``T`` tokens (FLA's precomputed gates, a k-last initial state)."""
    import torch

    from .model.fla_compat import chunk_gated_delta_rule
    from .spec import make_prefill_inputs

    x = make_prefill_inputs([T])
    HV = x["v"].shape[1]
    g = torch.full((1, T, HV), -0.1)
    beta = torch.full((1, T, HV), 0.5, dtype=torch.bfloat16)
    chunk_gated_delta_rule(x["q"][None], x["k"][None], x["v"][None], g, beta,
                           initial_state=x["state"], output_final_state=True,
                           use_qk_l2norm_in_kernel=True, state_v_first=True,
                           cu_seqlens=x["cu_seqlens"])


def _multi_gpu_rank():
    """Rank 1 of a two-rank :func:`.prefill.multi_gpu.prefill_multi_gpu` at 131,072 tokens
    (one sequence straddling the ranks), its collective stubbed: the launches of a rank."""
    from unittest import mock

    import torch

    from .prefill import multi_gpu
    from .spec import make_prefill_inputs

    x = make_prefill_inputs([65536])
    x["cu_seqlens"] = torch.tensor([0, 131072])
    with mock.patch.object(multi_gpu.dist, "get_world_size", lambda group=None: 2), \
            mock.patch.object(multi_gpu.dist, "get_rank", lambda group=None: 1), \
            mock.patch.object(multi_gpu, "all_gather_into", lambda out, inp, group=None: None):
        multi_gpu.prefill_multi_gpu(**x, bounds=[0, 65536, 131072], group=object(),
                                    check_values=False)


def capture_launches(arch: ArchLimits, scope: str = "all") -> List[Launch]:
    """The distinct launches of :func:`_entry_points` under ``arch``'s rules."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    found: Dict[str, Launch] = {}
    where = [""]

    def record(fn, args, kwargs):
        launch = _describe(fn, args, kwargs)
        launch = found.setdefault(launch.key(), launch)
        if where[0] not in launch.where:
            launch.where.append(where[0])

    with _emulating(arch, record):
        from .prefill import clear_graph_cache

        for label, thunk in _entry_points(scope):
            where[0] = label
            thunk()
        clear_graph_cache()
    return list(found.values())


def _resources(ck) -> dict:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    return dict(regs=int(m.group(1)) if m else None,
                spill_bytes=int(m.group(2)) if m else None)


def compile_launch(launch: Launch, arch: ArchLimits) -> dict:
    """Compile ``launch`` for ``arch`` and check it against the limits (one report row)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = launch.fn
    if fn.is_gluon():   # (the sm_90 phase C: kernels.prefill.state_walk_gluon)
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    names = [p.name for p in fn.params]
    const = {(names.index(n),): v for n, v in launch.constexprs.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in launch.divisible16}
    opts = dict(launch.options)
    row = dict(arch=arch.cc, gpu=arch.name, kernel=launch.kernel,
               num_warps=opts["num_warps"], num_stages=opts["num_stages"],
               maxnreg=opts.get("maxnreg"), launch_pdl=bool(opts.get("launch_pdl")),
               constexprs={k: v for k, v in launch.constexprs.items() if v is not None},
               launches=launch.where, smem_limit=arch.smem_per_block,
               regs=None, spill_bytes=None, shared_bytes=None, uses_pdl=None, fits=False,
               compile_s=None, error="")
    t0 = time.perf_counter()
    try:
        ck = triton.compile(ASTSource(fn, launch.signature, const, attrs),
                            target=GPUTarget("cuda", arch.cc, 32), options=opts)
    except Exception as e:   # report, do not stop: every launch gets its row
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
        return row
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    row["num_warps"] = int(ck.metadata.num_warps)   # a Gluon kernel's: its partitions' too
    row.update(_resources(ck))
    row["shared_bytes"] = int(ck.metadata.shared)
    row["uses_pdl"] = "griddepcontrol" in ck.asm["ptx"]
    problems = []
    if row["shared_bytes"] > arch.smem_per_block:
        problems.append(f"shared memory {row['shared_bytes']} B > {arch.smem_per_block} B")
    if row["regs"] is not None and row["regs"] * 32 * row["num_warps"] > arch.regs_per_sm:
        problems.append(f"{row['regs']} registers x {32 * row['num_warps']} threads > "
                        f"{arch.regs_per_sm}")
    if row["uses_pdl"] and not arch.pdl:
        problems.append("griddepcontrol (programmatic dependent launch) below sm_90")
    row["fits"] = not problems
    row["error"] = "; ".join(problems)
    return row


def check(archs: Sequence[int], jobs: int = 1, kernels: Optional[str] = None,
          progress=None, scope: str = "all") -> List[dict]:
    """Capture and compile for each of ``archs``; one row per (arch, launch)."""
    import multiprocessing as mp

    rows = []
    for cc in archs:
        arch = ARCHS[cc]
        launches = capture_launches(arch, scope)
        if kernels:
            launches = [lc for lc in launches if re.search(kernels, lc.kernel)]
        if progress:
            progress(f"sm_{cc} ({arch.name}): {len(launches)} distinct launches")
        if jobs > 1:
            global _JOBS
            _JOBS = (launches, arch)
            with mp.get_context("fork").Pool(jobs) as pool:
                rows += pool.map(_compile_index, range(len(launches)))
        else:
            rows += [compile_launch(lc, arch) for lc in launches]
    return rows


_JOBS = None


def _compile_index(i: int) -> dict:
    launches, arch = _JOBS
    return compile_launch(launches[i], arch)


def _table(rows: List[dict]) -> str:
    head = f"{'arch':>5} {'kernel':<42} {'warps':>5} {'stg':>3} {'regs':>4} {'spill':>5} " \
           f"{'smem KB':>8} {'limit':>6} {'pdl':>3}  fits"
    out = [head]
    for r in rows:
        smem = "-" if r["shared_bytes"] is None else f"{r['shared_bytes'] / 1024:.1f}"
        out.append(f"{r['arch']:>5} {r['kernel'].split('.')[-1][:42]:<42} {r['num_warps']:>5} "
                   f"{r['num_stages']:>3} {str(r['regs'] or '-'):>4} "
                   f"{str(r['spill_bytes'] if r['spill_bytes'] is not None else '-'):>5} "
                   f"{smem:>8} {r['smem_limit'] // 1024:>6} {'yes' if r['uses_pdl'] else 'no':>3}"
                   f"  {'yes' if r['fits'] else 'NO: ' + r['error']}")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.arch_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=",".join(str(c) for c in ARCHS),
                    help=f"compute capabilities, comma-separated (known: {', '.join(map(str, ARCHS))})")
    ap.add_argument("--json", help="write the rows (and the triton version) to this file")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    ap.add_argument("--kernels", help="only kernels whose module.name matches this regex")
    ap.add_argument("--scope", choices=SCOPES, default="all",
                    help="dispatch: decode and the default prefill path (fused, graph); all (default): "
                         "also the accurate config and the unfused variants of notebook 02")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        ap.error("run with TRITON_INTERPRET unset or 0: the kernels must be Triton JIT functions")
    archs = [int(c) for c in a.arch.split(",") if c.strip()]
    unknown = [c for c in archs if c not in ARCHS]
    if unknown:
        ap.error(f"--arch: unknown {unknown} (known: {', '.join(map(str, ARCHS))})")
    import triton

    t0 = time.perf_counter()
    rows = check(archs, jobs=max(1, a.jobs), kernels=a.kernels, scope=a.scope,
                 progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(_table(rows))
    bad = [r for r in rows if not r["fits"]]
    print(f"triton {triton.__version__}: {len(rows)} launches compiled for "
          f"sm_{', sm_'.join(map(str, archs))} in {time.perf_counter() - t0:.0f} s; "
          f"{len(bad)} do not compile or fit")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(triton=triton.__version__, archs={c: asdict(ARCHS[c]) for c in archs},
                           rows=rows), f, indent=1, default=repr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
