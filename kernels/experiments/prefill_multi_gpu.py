"""Notebook 05 — prefill across the GPUs of one host: how much faster is one long prompt on
two GPUs (:mod:`kernels.prefill.multi_gpu`) than on one, and what does the exchange cost?

The notebook's kernel starts one process per rank with ``torch.multiprocessing`` (``spawn``;
NCCL on GPUs, one GPU each, NVLink multicast kept off in every process: ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``; gloo on the CPU, the
smoke profile). :func:`run_ranks` runs everything in one start of the ranks:

1. **Link** — an all-gather bandwidth probe (``probe_sizes_kib`` per rank, ``busbw`` as
   nccl-tests counts it), the exchange's own all-gather (``[M ; F]`` of one piece per
   rank, :func:`kernels.prefill.multi_gpu.exchange_bytes`) timed alone, and one hop of the
   alternative, a scan over the ranks (a send of one state) → ``link.csv``.
2. For each length of ``lengths`` (one sequence): the inputs, generated on every rank's
   device from one seed (identical), and the float32 reference
   (:func:`kernels.reference.prefill_reference_chunked`, in pieces of ``reference_piece``
   tokens with the state handed on: bounded memory at 2M tokens); then each implementation
   is **gated** on the same inputs (each rank its slice of the outputs; the final states
   summed over the ranks) → ``gate.csv``, and only what passed is **timed** →
   ``times.csv``: on one GPU (rank 0 alone) ours (:func:`kernels.prefill.gdn_prefill`,
   ``fused``), ours through :mod:`~kernels.prefill.multi_gpu` with a one-rank group, FLA
   (:mod:`kernels.peers` ``fla``), FlashQLA (``flashqla``, in the peer worker
   :mod:`kernels.peers_worker` that rank 0 starts, with its own site ``GDN_QLA_SITE``;
   unavailable, with the worker's reason, where it cannot run); on all ranks ours and FLA's
   context parallelism
   (``cp_context`` of ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``; no initial or
   final states, so the notebook's inputs have no initial state by default and FLA's gate
   checks its outputs only).

Timing: :func:`kernels.bench.timing.time_ranks`, method ``head_start_events`` (the GPU
time of the call behind a head-start spin, the slowest rank's, with ``host_us`` beside it;
its module doc says how), median, p20, p80 over ``repetitions`` calls after ``warmup``; on
the CPU the host clock (``cpu_wall``: the interpreter, plumbing only). FlashQLA is timed in
its worker, one process on one GPU: ``event`` (GPU time, launch hidden; cold L2, which at
these lengths is a small part of the call) with ``host`` (host µs per eager call) as its
``host_us``. Results on GPUs go to ``<output_root>/<W>x-<gpu-slug>/`` (``W`` GPUs: 2, 4 or
8; ``world_size``), with every GPU and the link between them in the provenance.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Dict

import numpy as np
import pandas as pd

from kernels.bench.gate import ERROR, FAIL, PASS, UNAVAILABLE, short_reason
from kernels.bench.timing import CPU_WALL, RANKS_METHOD, method_meaning

from .common import (COMMON_PARAMS, Param, Run, collect_params as _collect, figure_legend,
                     fmt_us, fmt_x, new_figure, progress, start_run)

STEM = "05_prefill_multi_gpu"
#: NVLink multicast off in every rank's process (the lent hosts' rule).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
#: Targets of the issue (benchmarks, not tests). Speed-up of ours on ``W`` GPUs over ours
#: on one, per GPU count: ``(from T, below T or None, at least)``; none stated for other
#: counts. FlashQLA on one GPU is to be slower than ours on ``W`` from ``QLA_FROM_T``, and
#: the eager call's host time below its GPU time from ``HOST_FROM_T`` (on 2 and 4 GPUs).
SPEEDUP_TARGETS = {2: ((131072, 262144, 1.5), (262144, None, 1.8)),
                   4: ((524288, 1048576, 3.0), (1048576, None, 3.4))}
QLA_FROM_T, HOST_FROM_T = 262144, 131072
EXCHANGE_SHARE_MAX, EXCHANGE_AT_T = 0.05, 1048576
IMPLS = ("ours", "ours (multi_gpu)", "fla (triton)", "flashqla", "fla cp_context")
#: FlashQLA's methods in its worker (GPU time, then host time: its row's ``host_us``).
REMOTE_METHODS = ("event", "host")


def speedup_targets(world: int) -> tuple:
    """The issue's speed-up targets on ``world`` GPUs, ``((from_T, below_T or None,
    target), ...)``; empty where the issue states none (8 GPUs)."""
    return SPEEDUP_TARGETS.get(int(world), ())


def _band(lo: int, hi) -> str:
    return f"at {lo:,}–{hi - 1:,} tokens" if hi else f"from {lo:,} tokens"

PARAMS = COMMON_PARAMS + (
    Param("lengths", "list", [32768, 65536, 131072, 262144, 524288, 1048576, 2097152],
          "tokens of the one sequence of each call"),
    Param("world_size", "int", 2,
          "ranks of the multi-GPU runs: 2, 4 or 8 (one GPU each; processes on the CPU)"),
    Param("impls", "list", list(IMPLS),
          "ours (gdn_prefill, one GPU), ours (multi_gpu) (one GPU and all ranks), "
          "fla (triton) (one GPU), flashqla (one GPU, in the peer worker), "
          "fla cp_context (all ranks)"),
    Param("repetitions", "int", 30, "timed calls per point"),
    Param("warmup", "int", 5, "untimed calls before timing (compilation, FLA's autotuning)"),
    Param("seed", "int", 0, "seed of the inputs"),
    Param("with_state", "bool", False,
          "pass an initial state (FLA's cp_context takes none: its gate then fails)"),
    Param("reference_piece", "int", 262144,
          "the reference runs in pieces of at most this many tokens (state handed on)"),
    Param("probe_sizes_kib", "list", [64, 256, 1024, 4096, 16384, 65536, 262144],
          "all-gather bandwidth probe: bytes per rank (KiB)"),
    Param("probe_repetitions", "int", 20, "timed all-gathers per probe size"),
    Param("num_q_heads", "int", 4, "HQ query/key heads (HK equals it)"),
    Param("num_v_heads", "int", 8, "HV value heads"),
    Param("head_dim", "int", 128, "head size D (K and V equal it)"),
)

GATE_COLUMNS = ["impl", "gpus", "T", "status", "checked", "max_abs_err", "reason", "gpu"]
TIMES_COLUMNS = ["impl", "gpus", "T", "method", "median_us", "p20_us", "p80_us", "n",
                 "host_us", "gpu"]
EXCHANGE_COLUMNS = ["T", "bytes_per_rank", "bytes_received", "exchange_us", "at_link_bw_us",
                    "link_busbw_gbs", "scan_us", "call_us", "share"]
LINK_COLUMNS = ["what", "bytes_per_rank", "gpus", "method", "median_us", "algbw_gbs",
                "busbw_gbs", "gpu"]


def collect_params(namespace: dict) -> dict:
    """This notebook's parameters from ``namespace`` (the notebook's ``globals()``)."""
    return _collect(namespace, PARAMS, STEM)


# --------------------------------------------------------------------------- set-up


def _link_description(n: int) -> dict:
    """The GPUs ``0 .. n-1`` and what connects them (``nvidia-smi topo -m`` where it runs,
    and torch's peer-access answer)."""
    import subprocess

    import torch

    out = {"gpus": [torch.cuda.get_device_name(i) for i in range(n)]}
    out["peer_access"] = all(torch.cuda.can_device_access_peer(i, j)
                             for i in range(n) for j in range(n) if i != j)
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=30).stdout
        rows = [line.split() for line in topo.splitlines() if line.startswith("GPU")]
        out["topo"] = {r[0]: r[1:n + 1] for r in rows[:n]}
        out["link"] = out["topo"].get("GPU0", ["?", "?"])[1] if n > 1 else "none"
    except (OSError, subprocess.SubprocessError) as e:
        out["link"] = f"unknown (nvidia-smi topo -m: {short_reason(e)})"
    return out


def start(params: dict) -> Run:
    """Open the run with ``W = world_size`` ranks, or as many as there are GPUs (the
    multi-GPU rows are then skipped, with the reason: ``make run`` on a one-GPU host still
    measures the one-GPU rows). On CUDA with ``W > 1`` the result folder is
    ``<W>x-<gpu-slug>`` and the provenance names every GPU and the link."""
    import torch

    from kernels.device import gpu_slug

    W = int(params["world_size"])
    if W < 1:
        raise ValueError(f"world_size must be >= 1, got {W}")
    cuda = str(params.get("device", "auto")).startswith("cuda") or (
        params.get("device", "auto") == "auto" and torch.cuda.is_available())
    have = torch.cuda.device_count() if cuda else W
    run = start_run(STEM, params,
                    slug=f"{min(W, have)}x-{gpu_slug()}" if cuda and min(W, have) > 1 else None)
    if have < W:
        run.skip(f"the {W}-GPU runs", f"world_size={W} needs {W} GPUs; torch sees {have}")
        W = have
    run.state["world"] = W
    if run.on_gpu:
        run.extra_provenance.update(_link_description(W))
        print(f"GPUs: {run.extra_provenance['gpus']}; link GPU0-GPU1: "
              f"{run.extra_provenance.get('link')}")
    run.extra_provenance["ranks"] = dict(world_size=W, backend="nccl" if run.on_gpu else "gloo",
                                         env=NO_MULTICAST)
    return run


# --------------------------------------------------------------------------- the ranks


def run_ranks(run: Run) -> Dict[str, pd.DataFrame]:
    """Start ``world_size`` rank processes, run the probe and every length's gate and times
    there (:func:`_rank_main`), and return ``{"gate", "times", "link"}`` (written as CSVs)."""
    import torch.multiprocessing as mp

    p = run.params
    W = run.state["world"]
    for k, v in NO_MULTICAST.items():
        os.environ[k] = v   # the ranks inherit this environment
    spec = {k: p[k] for k in ("lengths", "impls", "repetitions", "warmup", "seed", "with_state",
                              "reference_piece", "probe_sizes_kib", "probe_repetitions",
                              "num_q_heads", "num_v_heads", "head_dim")}
    spec.update(cuda=run.on_gpu, gpu=run.gpu)
    with tempfile.TemporaryDirectory(prefix="gdn-ranks-") as tmp:
        print(f"starting {W} ranks ({'nccl' if run.on_gpu else 'gloo'}); progress from rank 0")
        t0 = time.perf_counter()
        mp.start_processes(_rank_main, args=(W, spec, tmp), nprocs=W, join=True,
                           start_method="spawn")
        rows = json.loads((Path(tmp) / "rows.json").read_text())
    print(f"ranks done in {time.perf_counter() - t0:.0f} s")
    for s in rows["skipped"]:
        run.skip(s["what"], s["reason"])
    out = {"gate": pd.DataFrame(rows["gate"], columns=GATE_COLUMNS),
           "times": pd.DataFrame(rows["times"], columns=TIMES_COLUMNS),
           "link": pd.DataFrame(rows["link"], columns=LINK_COLUMNS)}
    for name, df in out.items():
        run.write_csv(df, name)
    bad = out["gate"][out["gate"].status.isin([FAIL, ERROR])]
    for _, r in bad.iterrows():
        print(f"GATE {r.status.upper()}: {r.impl} on {r.gpus} GPU(s) at T={r['T']}: {r.reason}")
    return out


def _rank_main(rank: int, world: int, spec: dict, tmp: str) -> None:
    """One rank: join the group, probe the link, gate and time every implementation at every
    length; rank 0 writes the rows to ``<tmp>/rows.json``."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", rank) if spec["cuda"] else torch.device("cpu")
    kw = {}
    if spec["cuda"]:
        torch.cuda.set_device(dev)
        kw["device_id"] = dev
    dist.init_process_group("nccl" if spec["cuda"] else "gloo", init_method=f"file://{tmp}/init",
                            rank=rank, world_size=world, **kw)
    one = dist.new_group([0])          # rank 0 alone: the one-GPU runs
    ctx = _Ranks(rank, world, dev, spec, one)
    # an exception leaves at once (no barrier a failed rank's peer would never reach):
    # start_processes then stops the other ranks and raises it in the notebook
    ctx.probe()
    lengths = [int(L) for L in spec["lengths"]]
    for L in (progress(lengths, f"gate, then time, per length ({world} ranks)", "length")
              if rank == 0 else lengths):
        ctx.length(L)
    if rank == 0:
        (Path(tmp) / "rows.json").write_text(json.dumps(dict(
            gate=ctx.gate, times=ctx.times, link=ctx.link, skipped=ctx.skipped)))
        from kernels.peers_worker import close_workers
        close_workers()   # FlashQLA's worker (end_rank_process skips the atexit hook)
    dist.barrier()
    dist.destroy_process_group()
    from kernels.prefill.multi_gpu import end_rank_process
    end_rank_process()


class _Ranks:
    """What one rank does (:func:`_rank_main`); rows are kept on rank 0."""

    def __init__(self, rank, world, dev, spec, one):
        from kernels.spec import GDNShape

        self.rank, self.world, self.dev, self.spec, self.one = rank, world, dev, spec, one
        self.shape = GDNShape(spec["num_q_heads"], spec["num_v_heads"], spec["head_dim"])
        self.gate, self.times, self.link, self.skipped = [], [], [], []
        self._skipped_once = set()
        self._flashqla = None   # (rank 0's peer or the reason) once resolved

    def _flashqla_peer(self):
        """FlashQLA in the peer worker, resolved once on rank 0 (which starts the worker)
        and agreed by every rank (the one-GPU rows' barriers need the same rows on all):
        rank 0 gets the :class:`kernels.peers_worker.RemotePeer`, the others ``True``; or,
        everywhere, why it cannot run (the worker's reason on rank 0)."""
        import torch.distributed as dist

        if self._flashqla is None:
            from kernels import registry

            peer, reason = None, "unavailable on rank 0"
            if self.rank == 0:
                try:
                    impl = registry.peers(["flashqla"], "prefill")[0]
                    peer, reason = (impl.fn, "") if impl else (None, impl.reason)
                except Exception as e:   # a worker that cannot start: the row says why
                    reason = f"peer worker: {short_reason(e)}"
            ok = self._reduce([float(peer is not None)], dist.ReduceOp.MAX)[0] > 0
            self._flashqla = (peer if self.rank == 0 else True) if ok else reason
        return self._flashqla

    def _remote(self, peer, row: dict, x: dict, ref) -> None:
        """Rank 0: gate ``peer`` in its worker on this length's inputs and, if it passed,
        time it there (:data:`REMOTE_METHODS` on CUDA); its gate and times rows."""
        L = row["T"]
        methods = list(REMOTE_METHODS) if self.spec["cuda"] else []
        try:
            res = peer.run(str(L), x, ref, device=str(self.dev), methods=methods,
                           rep=self.spec["repetitions"], warmup=self.spec["warmup"])
        except Exception as e:   # a worker that dies is reported like a failing call
            self.gate.append(dict(row, status=ERROR, max_abs_err=math.inf,
                                  reason=short_reason(e)))
            return
        g = res["gate"]
        self.gate.append(dict(row, status=g["status"], max_abs_err=g.get("max_abs_err", math.nan),
                              reason=g.get("reason", "")))
        if g["status"] != PASS:
            return
        by = {t["method"]: t for t in res["timings"]}
        for m, t in by.items():
            if "error" in t:
                self._skip(f"{row['impl']} {m} at T={L}", t["error"])
        gpu = by.get(REMOTE_METHODS[0], {})
        if "median_us" in gpu:
            self.times.append(dict(impl=row["impl"], gpus=1, T=L, gpu=self.spec["gpu"],
                                   host_us=by.get("host", {}).get("median_us", math.nan),
                                   **{k: gpu[k] for k in ("method", "median_us", "p20_us",
                                                          "p80_us", "n")}))

    # -- collectives on small host numbers
    def _reduce(self, values, op, group=None):
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.dev)
        dist.all_reduce(t, op=op, group=group)
        return t.tolist()

    def _skip(self, what, reason):
        if self.rank == 0 and what not in self._skipped_once:
            self._skipped_once.add(what)
            self.skipped.append(dict(what=what, reason=reason))

    # -- timing
    def _time(self, fn, group) -> dict:
        """``repetitions`` calls of ``fn`` after ``warmup`` on the ranks of ``group``
        (:func:`kernels.bench.timing.time_ranks`)."""
        from kernels.bench.timing import time_ranks

        return time_ranks(fn, self.dev, rep=self.spec["repetitions"],
                          warmup=self.spec["warmup"], group=group)

    # -- 1. the link
    def probe(self) -> None:
        """All-gather bandwidth at ``probe_sizes_kib`` per rank and at the exchange's own
        size; and one hop of the alternative, a scan over ranks (rank 0 sends rank 1 a
        state, ``HV * D * D`` float32: half the exchange's bytes)."""
        import torch
        import torch.distributed as dist

        from kernels.prefill.multi_gpu import all_gather_into, exchange_bytes

        if self.world < 2:
            self._skip("link probe", "world_size is 1")
            return
        ex = exchange_bytes(self.shape.num_v_heads, self.shape.head_dim, 1)
        sizes = [("probe", int(k) * 1024) for k in self.spec["probe_sizes_kib"]]
        sizes += [("exchange", ex), ("scan hop", ex // 2)]
        saved = self.spec
        self.spec = dict(saved, repetitions=saved["probe_repetitions"],
                         warmup=max(saved["warmup"], 1))
        try:
            for what, nbytes in sizes:
                n = max(nbytes // 4, 1)
                src = torch.ones(n, dtype=torch.float32, device=self.dev)
                dst = torch.empty(n * self.world, dtype=torch.float32, device=self.dev)
                if what == "scan hop":
                    fn = {0: lambda: dist.send(src, 1), 1: lambda: dist.recv(dst[:n], 0)}.get(
                        self.rank, lambda: None)
                    moved = n * 4
                else:
                    fn, moved = (lambda: all_gather_into(dst, src)), self.world * n * 4
                t = self._time(fn, None)
                algbw = moved / (t["median_us"] * 1e-6) / 1e9
                bus = algbw if what == "scan hop" else algbw * (self.world - 1) / self.world
                self.link.append(dict(what=what, bytes_per_rank=n * 4, gpus=self.world,
                                      algbw_gbs=algbw, busbw_gbs=bus, gpu=saved["gpu"],
                                      **{k: t[k] for k in ("method", "median_us")}))
        finally:
            self.spec = saved

    # -- 2. one length
    def _inputs(self, L: int) -> dict:
        """One sequence of ``L`` tokens, generated on this rank's device from the seed (the
        same on every rank: the generator runs on the same kind of device)."""
        import torch

        from kernels.spec import make_prefill_inputs

        s = self.shape
        small = make_prefill_inputs([1], s, seed=self.spec["seed"])   # gate parameters
        gen = torch.Generator(self.dev).manual_seed(self.spec["seed"])
        bf = torch.bfloat16

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=self.dev)

        def unit(x):
            return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(bf)

        x = dict(q=unit(randn(L, s.num_q_heads, s.head_dim)),
                 k=unit(randn(L, s.num_q_heads, s.head_dim)),
                 v=randn(L, s.num_v_heads, s.head_dim).to(bf),
                 a=randn(L, s.num_v_heads).to(bf), b=randn(L, s.num_v_heads).to(bf),
                 A_log=small["A_log"].to(self.dev), dt_bias=small["dt_bias"].to(self.dev),
                 cu_seqlens=torch.tensor([0, L], dtype=torch.int64, device=self.dev),
                 state=(randn(1, s.num_v_heads, s.head_dim, s.head_dim) * 0.1
                        if self.spec["with_state"] else None))
        return x

    def _reference(self, x: dict):
        """The float32 chunked reference of the one sequence, in pieces of at most
        ``reference_piece`` tokens, each piece starting from the previous one's state."""
        import torch

        from kernels.reference import prefill_reference_chunked

        L, piece = x["q"].shape[0], max(int(self.spec["reference_piece"]), 64)
        outs, state = [], x["state"]
        for s in range(0, L, piece):
            e = min(s + piece, L)
            sl = {n: x[n][s:e] for n in ("q", "k", "v", "a", "b")}
            o, state = prefill_reference_chunked(
                **sl, state=state, A_log=x["A_log"], dt_bias=x["dt_bias"],
                cu_seqlens=torch.tensor([0, e - s], dtype=torch.int64, device=self.dev))
            outs.append(o)
        return torch.cat(outs), state

    def _impls(self, x: dict, bounds: list):
        """``(name, gpus, fn or reason, checked)``: the callables of this length (``fn()``
        returns this rank's ``(output slice, final state or None)``)."""
        import torch.distributed as dist

        from kernels import registry
        from kernels.prefill import gdn_prefill
        from kernels.prefill.multi_gpu import prefill_multi_gpu

        r, W = self.rank, self.world
        t0, t1 = bounds[r], bounds[r + 1]
        mine = {n: (t[t0:t1] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
        L = x["q"].shape[0]
        out = []
        want = self.spec["impls"]
        if "ours" in want:
            out.append(("ours", 1, lambda: gdn_prefill(**x), "output, final state"))
        if "ours (multi_gpu)" in want:
            out.append(("ours (multi_gpu)", 1, lambda: prefill_multi_gpu(
                **x, bounds=[0, L], group=self.one), "output, final state"))
            if W > 1:
                out.append(("ours (multi_gpu)", W, lambda: prefill_multi_gpu(
                    **mine, bounds=bounds, group=dist.group.WORLD), "output, final state"))
        if "fla (triton)" in want:
            fla = registry.peers(["fla"], "prefill", in_process=True)[0]
            out.append(("fla (triton)", 1, (lambda: fla.fn(**x)) if fla else fla.reason,
                        "output, final state"))
        if "flashqla" in want:   # gated and timed in the peer worker (rank 0's)
            out.append(("flashqla", 1, self._flashqla_peer(), "output, final state"))
        if "fla cp_context" in want and W > 1:
            out.append(("fla cp_context", W, _fla_cp(mine, x["cu_seqlens"], x["state"]),
                        "output (no final state)"))
        return out

    def length(self, L: int) -> None:
        """Gate every implementation at ``L`` tokens, time what passed everywhere."""
        import torch
        import torch.distributed as dist

        from kernels.checks import check_close
        from kernels.prefill.multi_gpu import even_bounds

        W, r = self.world, self.rank
        bounds = even_bounds(L, W)
        x = self._inputs(L)
        ref_o, ref_h = self._reference(x)
        for name, gpus, fn, checked in self._impls(x, bounds):
            on = gpus == W or r == 0          # one-GPU runs: rank 0 alone
            group = None if gpus == W else self.one
            row = dict(impl=name, gpus=gpus, T=L, checked=checked, gpu=self.spec["gpu"])
            if isinstance(fn, str):
                self._skip(f"{name} on {gpus} GPU(s)", fn)
                if r == 0:
                    self.gate.append(dict(row, status=UNAVAILABLE, max_abs_err=math.nan,
                                          reason=fn))
                continue
            if not on:
                dist.barrier()
                continue
            if not callable(fn):   # the peer worker's (rank 0; the others wait above)
                self._remote(fn, row, x, (ref_o, ref_h))
                if gpus < W:
                    dist.barrier()
                continue
            t0, t1 = (bounds[r], bounds[r + 1]) if gpus > 1 else (0, L)
            status, err, reason = PASS, 0.0, ""
            try:
                o, h = fn()
                res = [check_close(o, ref_o[t0:t1])]
                if h is not None:
                    if gpus > 1:
                        dist.all_reduce(h, group=group)
                    res.append(check_close(h, ref_h, name="new_state"))
                ok = all(c.ok for c in res)
                err = max(c.max_abs_err for c in res)
                reason = "; ".join(c.reason for c in res if c.reason)
            except Exception as e:   # a call that raises is reported like a wrong one
                ok, err, reason = False, math.inf, short_reason(e)
                status = ERROR
            good, worst = self._reduce([float(ok), err], dist.ReduceOp.MIN, group)[0], \
                self._reduce([err], dist.ReduceOp.MAX, group)[0]
            if not good and status == PASS:
                status = FAIL
                reason = reason or "another rank's slice failed"
            if r == 0:
                self.gate.append(dict(row, status=status, max_abs_err=worst, reason=reason))
            if status == PASS:
                self.times.append(dict(dict(impl=name, gpus=gpus, T=L, gpu=self.spec["gpu"]),
                                       **self._time(fn, group)))
            if gpus < W:
                dist.barrier()
            if self.spec["cuda"]:
                torch.cuda.empty_cache()
        del x, ref_o, ref_h


def _fla_cp(mine: dict, cu_seqlens, state):
    """FLA's context-parallel prefill of this rank's contiguous slice (its ``contiguous``
    layout: ``T / W`` tokens per rank, as :func:`even_bounds` cuts powers of two), gates as
    PyTorch ops inside the call like the ``fla`` peer; or why it cannot run."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or mine["q"].device.type != "cuda":
        return "FLA (Triton) needs a CUDA GPU"
    if state is not None:
        return "FLA's cp_context takes no initial state (with_state is on)"
    try:
        from fla.ops.cp import build_cp_context
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:
        return f"cannot import FLA's context parallelism: {short_reason(e)}"
    from kernels.peers import prefill_gates

    ctx = build_cp_context(cu_seqlens, group=dist.group.WORLD, cu_seqlens_cpu=cu_seqlens.cpu())

    def call():
        g, beta = prefill_gates(mine["A_log"], mine["a"], mine["dt_bias"], mine["b"])
        o, _ = chunk_gated_delta_rule(mine["q"][None], mine["k"][None], mine["v"][None],
                                      g[None], beta[None], scale=mine["q"].shape[-1] ** -0.5,
                                      cp_context=ctx)
        return o[0].to(torch.bfloat16), None

    return call


# --------------------------------------------------------------------------- tables


def scaling_table(run: Run, times: pd.DataFrame) -> pd.DataFrame:
    """Per length: ours on one GPU, ours on the run's ``W`` ranks, the speedup and scaling
    efficiency (speedup / ``W``), FLA on one GPU and with cp_context, FlashQLA on one GPU
    (its worker's ``event`` time), ours against FLA's CP and ours on ``W`` against
    FlashQLA on one, and the host µs per eager call beside the GPU times (ours on one GPU
    and on ``W``, FlashQLA)."""
    world = run.state["world"]
    if times.empty or world < 2:
        return pd.DataFrame(columns=["T", "gpus", "speedup", "efficiency"])
    t = times.pivot_table(index="T", columns=["impl", "gpus"], values="median_us")

    def col(impl, gpus):
        return t[(impl, gpus)] if (impl, gpus) in t.columns else pd.Series(np.nan, t.index)

    out = pd.DataFrame({"ours 1 GPU (µs)": col("ours", 1),
                        f"ours {world} GPUs (µs)": col("ours (multi_gpu)", world),
                        "fla 1 GPU (µs)": col("fla (triton)", 1),
                        f"fla cp_context {world} GPUs (µs)": col("fla cp_context", world),
                        "flashqla 1 GPU (µs)": col("flashqla", 1)})
    out["speedup"] = out["ours 1 GPU (µs)"] / out[f"ours {world} GPUs (µs)"]
    out["efficiency"] = out["speedup"] / world
    out["fla cp / ours"] = out[f"fla cp_context {world} GPUs (µs)"] / out[f"ours {world} GPUs (µs)"]
    out[f"flashqla 1 GPU / ours {world} GPUs"] = (out["flashqla 1 GPU (µs)"]
                                                  / out[f"ours {world} GPUs (µs)"])
    h = (times.pivot_table(index="T", columns=["impl", "gpus"], values="host_us")
         if "host_us" in times and times["host_us"].notna().any() else pd.DataFrame())
    for impl, gpus, name in (("ours", 1, "ours 1 GPU host (µs)"),
                             ("ours (multi_gpu)", world, f"ours {world} GPUs host (µs)"),
                             ("flashqla", 1, "flashqla 1 GPU host (µs)")):
        out[name] = h[(impl, gpus)] if (impl, gpus) in h.columns else np.nan
    out.insert(0, "gpus", world)
    return out.reset_index()


def exchange_table(run: Run, link: pd.DataFrame, times: pd.DataFrame) -> pd.DataFrame:
    """The exchange's all-gather: bytes, measured time, the time the probe's best bandwidth
    predicts, the alternative's time (a scan: ``W - 1`` serial hops of one state, each as
    measured), and the all-gather's share of ours on the run's ``W`` ranks at each length."""
    world = run.state["world"]
    ex = link[link.what == "exchange"]
    probe = link[link.what == "probe"]
    if ex.empty:
        return pd.DataFrame(columns=EXCHANGE_COLUMNS)
    e = ex.iloc[0]
    hop = link[link.what == "scan hop"]
    hop_us = float(hop.iloc[0].median_us) if len(hop) else math.nan
    bw = float(probe.busbw_gbs.max()) if len(probe) else math.nan
    ours = times[(times.impl == "ours (multi_gpu)") & (times.gpus == world)]
    rows = []
    for _, r in ours.sort_values("T").iterrows():
        rows.append(dict(T=int(r["T"]), bytes_per_rank=int(e.bytes_per_rank),
                         bytes_received=int(e.bytes_per_rank) * (world - 1),
                         exchange_us=float(e.median_us),
                         at_link_bw_us=e.bytes_per_rank * (world - 1) / (bw * 1e9) * 1e6,
                         link_busbw_gbs=bw, scan_us=(world - 1) * hop_us,
                         call_us=float(r.median_us),
                         share=float(e.median_us) / float(r.median_us)))
    return pd.DataFrame(rows, columns=EXCHANGE_COLUMNS)


# --------------------------------------------------------------------------- figures


def where(experiment: dict) -> str:
    """The figures' second title line from the provenance's ``experiment`` dict (or
    :func:`experiment_of` a run): the ranks, the GPUs and the link, the timing method."""
    ranks = experiment.get("ranks", {})
    W = ranks.get("world_size", 1)
    if ranks.get("backend") == "nccl":
        gpus = experiment.get("gpus") or [experiment.get("gpu", "?")]
        return (f"{W}× {gpus[0]}, link {experiment.get('link', '?')} · "
                "GPU time (CUDA events behind a head-start spin), slowest rank")
    return f"{W} gloo processes on the CPU · cpu_wall (interpreter)"


def experiment_of(run: Run) -> dict:
    """What :meth:`Run.finish` writes as the provenance's ``experiment`` (the part
    :func:`where` reads)."""
    return dict(run.extra_provenance, gpu=run.gpu)


def plot_times(times: pd.DataFrame, subtitle: str):
    """Time per call vs tokens, every implementation and GPU count (log-log); a series
    timed with another method than the ranks' (FlashQLA in its worker: ``event``) names
    it in its label."""
    if times.empty:
        return None
    fig, axes = new_figure(1, 1, panel=(8.0, 4.2))
    ax = axes[0, 0]
    main = times["method"].mode().iloc[0]
    for (impl, gpus, method), d in times.groupby(["impl", "gpus", "method"]):
        d = d.sort_values("T")
        how = "" if method == main else f" ({method}: {method_meaning(method)})"
        ax.errorbar(d["T"], d.median_us, yerr=[d.median_us - d.p20_us, d.p80_us - d.median_us],
                    marker="o", ms=3, capsize=2, label=f"{impl}, {gpus} GPU(s){how}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens (one sequence)")
    ax.set_ylabel("time per call (µs)")
    ax.set_title(f"Prefill time vs length (median, p20-p80)\n{subtitle}", fontsize=9)
    figure_legend(fig, axes)
    return fig


def plot_scaling(scaling: pd.DataFrame, subtitle: str):
    """Speedup of ours on all ranks over one GPU, and of FLA's CP over FLA, vs tokens."""
    if scaling.empty or scaling["speedup"].isna().all():
        return None
    world = int(scaling["gpus"].iloc[0])
    fig, axes = new_figure(1, 1, panel=(8.0, 3.8))
    ax = axes[0, 0]
    ax.plot(scaling["T"], scaling["speedup"], marker="o", label=f"ours: 1 GPU / {world} GPUs")
    fla = scaling["fla 1 GPU (µs)"] / scaling[f"fla cp_context {world} GPUs (µs)"]
    if fla.notna().any():
        ax.plot(scaling["T"], fla, marker="s", label=f"fla: 1 GPU / cp_context {world} GPUs")
    ax.axhline(world, color="gray", lw=0.8, ls=":", label=f"ideal ({world}×)")
    for i, (lo, hi, target) in enumerate(speedup_targets(world)):
        right = hi if hi else max(float(scaling["T"].max()), lo) * 2
        ax.hlines(target, lo, right, color="tab:red", lw=1.0, ls="--",
                  label="issue's targets" if i == 0 else None)
        ax.annotate(f"≥ {target:g}× {_band(lo, hi)}", (lo, target), fontsize=7,
                    color="tab:red", va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens (one sequence)")
    ax.set_ylabel("speedup (time on 1 GPU / on all)")
    ax.set_title(f"Scaling to {world} GPUs (ratio of medians)\n{subtitle}", fontsize=9)
    figure_legend(fig, axes)
    return fig


def plot_link(link: pd.DataFrame, exchange: pd.DataFrame, subtitle: str):
    """All-gather bus bandwidth vs bytes per rank (the exchange's size and a scan's hop
    marked), and the exchange's share of the call vs tokens (where measured)."""
    if link.empty:
        return None
    ncols = 2 if not exchange.empty else 1
    fig, axes = new_figure(1, ncols, panel=(5.0, 3.6))
    ax = axes[0, 0]
    pr = link[link.what == "probe"].sort_values("bytes_per_rank")
    ax.plot(pr.bytes_per_rank, pr.busbw_gbs, marker="o", label="all-gather probe")
    ex = link[link.what == "exchange"]
    ax.plot(ex.bytes_per_rank, ex.busbw_gbs, marker="*", ms=10, ls="", color="tab:red",
            label="the exchange ([M ; F])")
    hop = link[link.what == "scan hop"]
    ax.plot(hop.bytes_per_rank, hop.busbw_gbs, marker="v", ms=7, ls="", color="tab:green",
            label="a scan's hop (send/recv)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")   # small messages run orders below the link's rate: a linear axis
    ax.set_xlabel("bytes per rank")   # drew the exchange and a scan's hop onto the probe
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("All-gather bandwidth", fontsize=9)
    if ncols == 2:
        ax = axes[0, 1]
        ax.plot(exchange["T"], 100 * exchange["share"], marker="o",
                label="exchange (all-gather alone) / call")
        ax.axhline(100 * EXCHANGE_SHARE_MAX, color="tab:red", lw=0.8, ls="--",
                   label=f"target ≤ {EXCHANGE_SHARE_MAX:.0%} at {EXCHANGE_AT_T:,}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (one sequence)")
        ax.set_ylabel("exchange / call (%)")
        ax.set_title("The exchange's share of the call", fontsize=9)
    fig.suptitle(f"The link\n{subtitle}", fontsize=9)
    figure_legend(fig, axes)
    return fig


# --------------------------------------------------------------------------- conclusion


def conclusion_markdown(run: Run, dfs: Dict[str, pd.DataFrame]) -> str:
    """The targets, each with its number from the tables (or why there is none)."""
    W = run.state["world"]
    gate, times = dfs["gate"], dfs["times"]
    scaling, exchange = dfs["scaling"], dfs["exchange"]
    gpus = run.extra_provenance.get("gpus") or [run.gpu]
    method = RANKS_METHOD if run.on_gpu else CPU_WALL
    names = f"{len(gpus)}× {gpus[0]}" if len(set(gpus)) == 1 and len(gpus) > 1 else ", ".join(gpus)
    lines = ["### Conclusion", "",
             f"{W} ranks on {names} (link: {run.extra_provenance.get('link', 'n/a')}); "
             f"timing: `{method}`, {method_meaning(method)}."]
    failed = gate[gate.status.isin([FAIL, ERROR])]
    lines.append(f"- Gate: {int((gate.status == PASS).sum())} of {len(gate)} pass"
                 + (f"; **failed**: {', '.join(sorted(set(failed.impl)))}" if len(failed) else ""))
    qla_rows = gate[gate.impl == "flashqla"]
    if len(qla_rows) and not (qla_rows.status == PASS).any():
        lines.append(f"- FlashQLA (1 GPU): no row passed the gate "
                     f"({qla_rows.status.iloc[0]}: {qla_rows.reason.iloc[0]}).")
    elif len(qla_rows) and not (qla_rows.status == PASS).all():
        bad = qla_rows[qla_rows.status != PASS]
        lines.append("- FlashQLA (1 GPU) did not pass at " + ", ".join(
            f"{int(t):,} ({st}: {why})" for t, st, why in zip(bad["T"], bad.status, bad.reason)))
    if scaling.empty or scaling["speedup"].isna().all():
        lines.append("- Scaling: no timing of ours on both 1 and "
                     f"{W} GPUs in this run.")
        return "\n".join(lines)
    targets = speedup_targets(W)
    if not targets:
        lines.append(f"- Speed-up on {W} GPUs: the issue states no target for {W} GPUs.")
    for lo, hi, target in targets:
        band = scaling[(scaling["T"] >= lo) & ((scaling["T"] < hi) if hi else True)]
        band = band[band["speedup"].notna()]
        what = f"≥ {fmt_x(target)} on {W} GPUs {_band(lo, hi)}"
        if band.empty:
            lines.append(f"- {what}: not measured (no such length timed on both).")
            continue
        worst = band.loc[band["speedup"].idxmin()]
        met = bool((band["speedup"] >= target).all())
        lines.append(f"- {what}: {'met' if met else 'not met'} (lowest {fmt_x(worst.speedup)} "
                     f"at {int(worst['T']):,}; efficiency {worst.efficiency:.0%}).")
    qla = scaling[(scaling["T"] >= QLA_FROM_T)][f"flashqla 1 GPU / ours {W} GPUs"].dropna()
    lines.append(f"- Faster than FlashQLA on one GPU at every length from {QLA_FROM_T:,}: "
                 + ("not measured (FlashQLA did not run or pass)" if qla.empty else
                    f"{'met' if bool((qla > 1).all()) else 'not met'} (FlashQLA / ours "
                    f"{fmt_x(qla.min())} … {fmt_x(qla.max())})"))
    if W in (2, 4):
        long = scaling[scaling["T"] >= HOST_FROM_T]
        hb = long[[f"ours {W} GPUs host (µs)", f"ours {W} GPUs (µs)"]].dropna()
        lines.append(f"- Host time of the eager call below its GPU time from {HOST_FROM_T:,} "
                     f"on {W} GPUs: " + ("not measured" if hb.empty else
                     ("met" if bool((hb.iloc[:, 0] < hb.iloc[:, 1]).all()) else "not met")
                     + f" (host / GPU {fmt_x((hb.iloc[:, 0] / hb.iloc[:, 1]).min())} … "
                       f"{fmt_x((hb.iloc[:, 0] / hb.iloc[:, 1]).max())})"))
    gpu_s = "GPU time" if run.on_gpu else "time"
    lines.append(f"- Per length, {gpu_s} of ours on 1 → {W} GPUs (speedup, efficiency = "
                 f"speedup / {W}); FLA's cp_context on {W}; FlashQLA on 1 (its worker's "
                 "`event`); the host µs per eager call beside them:")
    for _, r in scaling.iterrows():
        host = (f"; host per eager call {fmt_us(r['ours 1 GPU host (µs)'])} → "
                f"{fmt_us(r[f'ours {W} GPUs host (µs)'])}")
        qla = ""
        if np.isfinite(r["flashqla 1 GPU (µs)"]):
            qla = (f"; FlashQLA 1 GPU {fmt_us(r['flashqla 1 GPU (µs)'])} (host "
                   f"{fmt_us(r['flashqla 1 GPU host (µs)'])}; FlashQLA / ours on {W}: "
                   f"{fmt_x(r[f'flashqla 1 GPU / ours {W} GPUs'])})")
        eff = f"{r.efficiency:.0%}" if np.isfinite(r.efficiency) else "n/a"
        lines.append(f"  - {int(r['T']):,}: {fmt_us(r['ours 1 GPU (µs)'])} → "
                     f"{fmt_us(r[f'ours {W} GPUs (µs)'])} ({fmt_x(r.speedup)}, efficiency "
                     f"{eff}); FLA CP {fmt_us(r[f'fla cp_context {W} GPUs (µs)'])}{qla}{host}")
    cp = scaling["fla cp / ours"].dropna()
    lines.append("- Faster than FLA's cp_context at every length: "
                 + ("not measured (FLA's CP did not run)" if cp.empty else
                    f"{'met' if bool((cp > 1).all()) else 'not met'} (FLA CP / ours "
                    f"{fmt_x(cp.min())} … {fmt_x(cp.max())})"))
    at = exchange[exchange["T"] == EXCHANGE_AT_T] if not exchange.empty else exchange
    if len(at):
        s = float(at.iloc[0].share)
        lines.append(f"- Exchange ≤ {EXCHANGE_SHARE_MAX:.0%} of the call at {EXCHANGE_AT_T:,}: "
                     f"{'met' if s <= EXCHANGE_SHARE_MAX else 'not met'} ({s:.2%}; "
                     f"{fmt_us(at.iloc[0].exchange_us)} for {int(at.iloc[0].bytes_received):,} "
                     f"bytes received, {fmt_us(at.iloc[0].at_link_bw_us)} at the probe's "
                     f"{at.iloc[0].link_busbw_gbs:.0f} GB/s; a scan over the ranks instead: "
                     f"{fmt_us(at.iloc[0].scan_us)}).")
    else:
        lines.append(f"- Exchange share at {EXCHANGE_AT_T:,}: not measured in this run.")
    return "\n".join(lines)
