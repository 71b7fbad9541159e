"""Notebook 01 — where does one decode kernel overtake another as B grows?

The seed (``seed/subit-prefill-pr.txt``) found on a B200 with CUPTI timing
that the FLA-style recurrent kernel (BV=8, one launch) beats FlashInfer at
small batch and loses from B≈8 on (1.30× faster at B=1, 1.43× slower at
B=64), and that choosing ``num_warps`` per batch moved the crossover to
B≈16. This module measures the same on the GPU at hand:

1. :func:`run_gate` — every implementation at every B against
   :func:`kernels.reference.decode_reference` on the same inputs; ours is
   gated at every config of the sweep grid. Failing ones are not timed.
   :func:`run_host` — their ``host`` time per B and the bare-launch floor, before the
   sweep's first profiler session (after one, the host ran slower).
2. :func:`run_sweep` — time every passing config of ours per B;
   :func:`best_configs` → the dispatch table (:func:`write_dispatch_table`),
   :func:`plot_heatmaps` (BV × num_warps per B).
3. :func:`run_timing` — every passing implementation × GPU method × B, with those rows, →
   the tidy ``decode_times.csv`` (floor and fraction of copy bandwidth from
   :mod:`kernels.bench.roofline`).
4. :func:`plot_time_vs_B`, :func:`plot_speedup` (crossovers by log-linear
   interpolation, :func:`crossover_points`), :func:`plot_bw_fraction`.
5. :func:`run_serving` (sections 7a–c: pooled vs dense state, ``T`` tokens per
   call, fp32 vs bf16 state, with FlashInfer's bf16-state and multi-token
   kernels) and :func:`run_drift` (section 8: a bf16 state over
   ``drift_steps`` consecutive steps) — from :mod:`.decode_serving`;
   :func:`run_replay` (section 9: the replay decode against the standard step, from
   :mod:`.decode_replay`).
6. :func:`conclusion_markdown` — the conclusion, computed from the tables.

Implementation names (the ``impls`` parameter): ``ours-adaptive`` (the
config this run's sweep picked per B, or :func:`kernels.decode.config_for`
without a sweep), ``ours-fla-like`` (:data:`kernels.decode.FLA_LIKE`, the
seed's BV=8 kernel), ``ours:<config name>`` (a fixed config), and the peers
``fla``, ``flashinfer``, ``torch``. The CSVs carry ``label`` (that name) and
``impl`` (``ours``/``fla``/``flashinfer``/``torch``) and ``config``.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from kernels import registry
from kernels.bench.gate import ERROR, FAIL, PASS, UNAVAILABLE, gate_call, short_reason
from kernels.bench.timing import CPU_WALL, METHODS, method_available, time_each
from kernels.peers import default_peers
from kernels.registry import Impl

from .common import (COMMON_PARAMS, Param, Run, batch_axis, collect_params as _collect,
                     figure_legend, fmt_us, fmt_x, host_table, method_title, new_figure, plural,
                     progress, start_run, unique_in_order)

from . import decode_replay as _replay
from . import decode_serving as _serving
from .decode_replay import (plot_replay_bytes, plot_replay_drift,  # noqa: F401
                            plot_replay_times, replay_drift_table, replay_gate_summary,
                            replay_table, run_replay_drift)
from .decode_serving import (drift_table, plot_drift, plot_serving_pooled,  # noqa: F401
                             plot_serving_state_dtype, plot_serving_tokens, run_drift,
                             serving_gate_summary, serving_markdown, serving_table)

STEM = "01_decode_crossover"
SEED_CROSSOVER_B = 8         # seed, B200, CUPTI: fla-recurrent (BV=8) vs FlashInfer
SEED_ADAPTIVE_CROSSOVER_B = 16  # seed, B200, after per-batch num_warps
SEED_SPEEDUP = {1: 1.30, 64: 1 / 1.43}  # seed, B200: fla-recurrent vs FlashInfer (>1: faster)
CONTEST_METHOD = "cupti_cold"
FLA_LIKE_NAME = "BV8-w1-s1-t1"  # kernels.decode.FLA_LIKE.name
# How a peer is gated and timed: (config label, kernels.peers name). FlashInfer
# updates the state in place; its ``flashinfer`` adapter copies the state first
# (a full extra read + write of it), ``flashinfer_inplace`` is the kernel alone.
# Both are gated; the in-place one is timed (on its own copy of the inputs), so
# every implementation moves the same bytes: read the state once, write it once.
PEER_VARIANTS = {"flashinfer": (("default", "flashinfer"), ("inplace", "flashinfer_inplace"))}

PARAMS = COMMON_PARAMS + (
    Param("batch_sizes", "list", [1, 4, 8, 16, 32, 48, 64, 128, 256, 512],
          "decode batch sizes B"),
    Param("impls", "list", ["ours-adaptive", "ours-fla-like", *default_peers("decode", STEM)],
          "implementations: ours-adaptive, ours-fla-like, ours:<config>, fla, flashinfer, torch, "
          "solution:<path> (a flashinfer-bench solution JSON or starter-kit folder, run in a "
          "worker of its own; docs/solutions.md)"),
    Param("solutions", "list", [],
          "more solution paths (the make variable SOLUTIONS); those with a decode definition are added"),
    Param("methods", "list", list(METHODS),
          "timing methods (GPU time: cupti_cold, graph, event; host: host µs per eager call; "
          "cpu_wall is interpreter plumbing only)"),
    Param("sweep_BV", "list", [8, 16, 32, 64, 128], "config sweep: BV values"),
    Param("sweep_num_warps", "list", [1, 2, 4, 8], "config sweep: num_warps values"),
    Param("sweep_num_stages", "list", [1], "config sweep: num_stages values"),
    Param("sweep_V_TILES", "list", [1, 2, 4], "config sweep: V_TILES values (tiles per program)"),
    Param("sweep_BK", "list", [16, 32, 128], "config sweep: BK values (K chunk width of the thread layout)"),
    Param("sweep_PREFETCH", "list", [False, True], "config sweep: PREFETCH values (V_TILES > 1 only)"),
    Param("sweep_method", "str", "cupti_cold", "timing method of the config sweep"),
    Param("sweep_repetitions", "int", 20, "timed calls per config of the sweep"),
    Param("speedup_baselines", "list", ["flashinfer", "fla"],
          "implementations the speedup/crossover figure compares against"),
    Param("repetitions", "int", 100, "timed calls per point"),
    Param("warmup", "int", 10, "untimed calls before timing"),
    Param("seed", "int", 0, "seed of the inputs"),
    Param("num_q_heads", "int", 4, "HQ query/key heads (HK equals it)"),
    Param("num_v_heads", "int", 8, "HV value heads"),
    Param("head_dim", "int", 128, "head size D (K and V equal it)"),
    Param("write_dispatch_table", "bool", False,
          "also write the best configs to kernels/decode_configs/<gpu-slug>.json"),
    Param("pooled", "list", [False, True],
          "serving: state layouts timed (false: dense state, true: a pool of 2B slots)"),
    Param("tokens_per_step", "list", [1, 2, 3, 4],
          "serving: tokens per sequence in one call (multi-token / speculative decoding)"),
    Param("state_dtype", "list", ["float32", "bfloat16"],
          "serving and drift: state dtypes (float32, bfloat16)"),
    Param("serving_method", "str", "cupti_cold", "timing method of the serving sections"),
    Param("drift_steps", "list", [1, 100, 1000],
          "drift: consecutive decode steps after which errors are reported"),
    Param("drift_batch", "int", 8, "drift: batch size B of the consecutive steps"),
) + _replay.PARAMS

TIMES_COLUMNS = ["impl", "config", "B", "method", "median_us", "p20_us", "p80_us", "floor_us",
                 "n", "frac_of_copy_bw", "gpu", "label"]


def collect_params(namespace: dict) -> dict:
    """This notebook's parameters from ``namespace`` (the notebook's ``globals()``)."""
    return _collect(namespace, PARAMS, STEM)


def impl_of(label: str) -> str:
    """``ours-adaptive`` → ``ours``; peers keep their name."""
    return "ours" if label.startswith("ours") else label


def start(params: dict) -> Run:
    """Open the run (device, result folder) and fix the shape of the inputs."""
    from kernels.spec import GDNShape

    run = start_run(STEM, params)
    shape = GDNShape(params["num_q_heads"], params["num_v_heads"], params["head_dim"])
    run.state.update(shape=shape, inputs={}, refs={}, fns={})
    print(f"shape: HQ={shape.num_q_heads} HV={shape.num_v_heads} D={shape.head_dim}; "
          f"B in {params['batch_sizes']}; impls {params['impls']}")
    return run


# --------------------------------------------------------------------------- inputs & impls


def _inputs(run: Run, B: int):
    """Seeded inputs of batch ``B`` and their reference outputs (cached per run)."""
    from kernels.reference import decode_reference
    from kernels.spec import make_decode_inputs

    if B not in run.state["inputs"]:
        inputs = make_decode_inputs(B, run.state["shape"], seed=run.params["seed"],
                                    device=run.device)
        run.state["inputs"][B] = inputs
        run.state["refs"][B] = decode_reference(**inputs)
    return run.state["inputs"][B], run.state["refs"][B]


def config_grid_from_params(params: dict) -> list:
    """The sweep's valid configs (:func:`kernels.decode.config_grid`)."""
    from kernels import decode

    levers = dict(BVs=tuple(params["sweep_BV"]), warps=tuple(params["sweep_num_warps"]),
                  stages=tuple(params["sweep_num_stages"]), v_tiles=tuple(params["sweep_V_TILES"]),
                  BKs=tuple(params["sweep_BK"]),
                  prefetch=tuple(bool(x) for x in params["sweep_PREFETCH"]),
                  head_dim=params["head_dim"])
    return list(decode.config_grid(**levers))


def _ours(config):
    from kernels.decode import gdn_decode

    return functools.partial(gdn_decode, config=config)


def resolve_impls(params: dict) -> List[Impl]:
    """Every implementation of ``impls`` (:mod:`kernels.registry`), then the decode
    solutions of ``impls`` and ``solutions``, each in a worker of its own. Ours is one
    record per entry (its configs are chosen per B); a peer of :data:`PEER_VARIANTS` is one
    record per variant."""
    def ours_of(entry):
        if entry in ("ours-adaptive", "ours-fla-like") or entry.startswith("ours:"):
            from kernels.decode import gdn_decode

            return [registry.Impl(entry, "ours", "decode", "ours", gdn_decode, variant=entry)]
        return None

    return registry.resolve(params, "decode", ours_of=ours_of,
                            known_ours="ours-adaptive, ours-fla-like, ours:<config>",
                            variants=PEER_VARIANTS)


# --------------------------------------------------------------------------- 1. gate


def run_gate(run: Run) -> pd.DataFrame:
    """Correctness gate of every implementation at every B (``gate.csv``).

    ``ours-adaptive`` is gated at every config of the sweep grid (the
    candidates it may pick); ``ours-fla-like`` at :data:`FLA_LIKE`. Peers that
    are not installed get status ``unavailable`` and their reason.
    """
    from kernels.decode import FLA_LIKE, DecodeConfig, config_for

    p = run.params
    impls = resolve_impls(p)
    run.record_solutions(impls)
    grid = config_grid_from_params(p)
    run.state["grid"] = grid
    rows = []
    peers = run.state["peers"] = {}   # label -> the records of its variants
    for r in impls:
        if r.kind in ("peer", "worker"):
            peers.setdefault(r.label, []).append(r)
    sols = run.state["solutions"] = {r.label: r for r in impls if r.kind == "solution"}
    ours = [r.label for r in impls if r.kind == "ours"]
    n_impls = len(ours) + len(peers) + len(sols)
    for B in progress(p["batch_sizes"], f"gate: {plural(n_impls, 'implementation')} per B", "B"):
        inputs, ref = _inputs(run, B)
        for label in unique_in_order([r.label for r in impls if r.kind != "solution"]):
            if label == "ours-adaptive":
                cands = grid or [config_for(B).fit(p["head_dim"])]
            elif label == "ours-fla-like":
                cands = [FLA_LIKE]
            elif label.startswith("ours:"):
                cands = [DecodeConfig.from_name(label.split(":", 1)[1])]
            else:
                cands = peers[label]
            for cand in cands:
                if isinstance(cand, Impl):   # a peer's variant
                    cname, fn, reason = cand.variant, cand.fn, cand.reason
                else:
                    cname, fn, reason = cand.name, _ours(cand), ""
                base = dict(label=label, impl=impl_of(label), B=B, config=cname, gpu=run.gpu)
                if not fn:
                    rows.append(dict(base, status=UNAVAILABLE, ok=False, reason=reason))
                    continue
                row = gate_call(fn, inputs, ref, run.device)
                if cname == "inplace" and row["status"] == PASS:
                    row["reason"] = "updates the state in place by design (restored after the check)"
                rows.append(dict(base, **row))
        for label, rec in sols.items():   # each in its worker: a crash is this row's outcome
            base = dict(label=label, impl="solution", B=B, config="default", gpu=run.gpu)
            if not rec:
                rows.append(dict(base, status=UNAVAILABLE, ok=False, reason=rec.reason))
                continue
            try:
                rows.append(dict(base, **registry.gate(rec, f"B{B}", inputs, ref, run.device)))
            except Exception as e:
                rows.append(dict(base, status=ERROR, ok=False, reason=short_reason(e)))
    gate = pd.DataFrame(rows)
    for label, g in gate[gate.status == UNAVAILABLE].groupby("label"):
        run.skip(f"{label} (all B)", str(g.reason.iloc[0]))
    bad = gate[gate.status.isin([FAIL, ERROR])]
    for _, r in bad.iterrows():
        print(f"GATE {r.status.upper()}: {r.label} {r.config} B={r.B}: {r.reason}")
    run.write_csv(gate, "gate")
    return gate


def gate_summary(gate: pd.DataFrame) -> pd.DataFrame:
    """One row per implementation, one column per B: ``pass``/``fail``/...;
    for ours-adaptive ``pass k/n`` (configs of the grid that passed)."""
    def cell(g):
        if len(g) == 1:
            return g.status.iloc[0]
        k = int((g.status == PASS).sum())
        return f"{'pass' if k else 'fail'} {k}/{len(g)}"
    s = gate.groupby(["label", "B"], sort=False).apply(cell, include_groups=False)
    out = s.unstack("B")
    return out.loc[unique_in_order(gate.label)]


# --------------------------------------------------------------------------- 2. sweep


def run_sweep(run: Run, gate: pd.DataFrame) -> pd.DataFrame:
    """Time every config that passed the gate, per B, with ``sweep_method``
    (``sweep.csv``). Empty when the method cannot run here (printed)."""
    p = run.params
    method = p["sweep_method"]
    ok, why = method_available(method, run.device)
    grid = run.state.get("grid") or []
    cols = ["B", "config", "BV", "num_warps", "num_stages", "V_TILES", "method", "median_us",
            "p20_us", "p80_us", "n", "gpu"]
    if not grid:
        run.skip("config sweep", "the sweep grid is empty")
        return pd.DataFrame(columns=cols)
    if not ok:
        run.skip("config sweep", why)
        return pd.DataFrame(columns=cols)
    passed = gate[(gate.label == "ours-adaptive") & (gate.status == PASS)]
    rows = []
    n_cfg = passed.groupby("B").config.nunique().max() if len(passed) else 0
    for B in progress(p["batch_sizes"], f"sweep: up to {plural(int(n_cfg), 'config')} per B "
                      f"({method})", "B"):
        inputs, _ = _inputs(run, B)
        good = set(passed[passed.B == B].config)
        for cfg in grid:
            if cfg.name not in good:
                continue
            fn = _ours(cfg)
            timings = time_each(lambda: fn(**inputs), [method], rep=p["sweep_repetitions"],
                                warmup=p["warmup"])
            rows += run.timed_rows(timings, f"sweep {cfg.name} B={B}", dict(
                B=B, config=cfg.name, BV=cfg.BV, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, V_TILES=cfg.V_TILES, gpu=run.gpu))
    sweep = pd.DataFrame(rows, columns=cols)
    run.write_csv(sweep, "sweep")
    return sweep


def best_configs(sweep: pd.DataFrame) -> pd.DataFrame:
    """The fastest config per B (ties: the first in sweep order), with how
    much it beats the FLA-like BV=8 config when that was swept."""
    if sweep.empty:
        return pd.DataFrame(columns=["B", "config", "median_us", "fla_like_us", "gain_vs_fla_like"])
    idx = sweep.groupby("B", sort=True)["median_us"].idxmin()
    best = sweep.loc[idx, ["B", "config", "BV", "num_warps", "num_stages", "V_TILES", "method",
                           "median_us"]].reset_index(drop=True)
    fla = sweep[sweep.config == FLA_LIKE_NAME].set_index("B")["median_us"]
    best["fla_like_us"] = best.B.map(fla)
    best["gain_vs_fla_like"] = best.fla_like_us / best.median_us
    return best


def write_dispatch_table(run: Run, best: pd.DataFrame) -> dict:
    """Write the best config per B as a dispatch table into the result folder
    and, with ``write_dispatch_table``, into ``kernels/decode_configs/``.
    Prints both paths; returns ``{B: DecodeConfig}`` (empty without a sweep)."""
    from kernels.device import gpu_slug
    from kernels.decode import DecodeConfig, write_config_table

    if best.empty:
        print("no sweep results: no dispatch table written; ours-adaptive uses config_for(B)")
        return {}
    table = {int(r.B): DecodeConfig.from_name(r.config) for r in best.itertuples()}
    slug = gpu_slug(run.gpu) if run.on_gpu else gpu_slug()
    local = run.path("decode_configs") / f"{slug}.json"
    local.parent.mkdir(parents=True, exist_ok=True)
    method = str(best.method.iloc[0]) if "method" in best else run.params["sweep_method"]
    meta = dict(gpu_name=run.gpu, method=method,
                repetitions=run.params["sweep_repetitions"],
                shape=dict(HQ=run.params["num_q_heads"], HV=run.params["num_v_heads"],
                           D=run.params["head_dim"]))
    source = f"sweep {meta['method']} ({STEM})"
    path = write_config_table(table, slug, path=local, source=source, meta=meta)
    print(f"dispatch table for {slug} written to {path}")
    if run.params.get("write_dispatch_table"):
        pkg = write_config_table(table, slug, source=source, meta=meta)
        print(f"dispatch table also written to the package: {pkg} (commit it to ship it)")
    else:
        print("package table untouched (write_dispatch_table=False)")
    run.state["table"] = table
    return table


def plot_heatmaps(sweep: pd.DataFrame, *, gpu: str = ""):
    """One panel per B: BV × num_warps, colour = time / best time at that B
    (best over num_stages and V_TILES), text = µs."""
    if sweep is None or sweep.empty:
        return None
    Bs = sorted(sweep.B.unique())
    ncols = min(4, max(1, len(Bs)))
    nrows = max(1, math.ceil(len(Bs) / ncols))
    fig, axes = new_figure(nrows, ncols, panel=(3.6, 3.0))
    for ax in axes.flat[len(Bs):]:
        ax.set_axis_off()
    method = sweep.method.iloc[0] if len(sweep) else ""
    worst = sweep.groupby("B").median_us.agg(lambda x: x.max() / x.min())
    vmax = float(min(3.0, max(1.5, worst.max())))  # one colour scale for every panel
    for ax, B in zip(axes.flat, Bs):
        s = sweep[sweep.B == B]
        piv = s.pivot_table(index="BV", columns="num_warps", values="median_us", aggfunc="min")
        best = float(np.nanmin(piv.values))
        im = ax.imshow(piv.values / best, cmap="viridis_r", vmin=1.0, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(piv.columns)), [str(c) for c in piv.columns])
        ax.set_yticks(range(len(piv.index)), [str(i) for i in piv.index])
        ax.set_xlabel("num_warps")
        ax.set_ylabel("BV")
        for i in range(piv.shape[0]):
            for j in range(piv.shape[1]):
                v = piv.values[i, j]
                if np.isfinite(v):
                    ax.text(j, i, f"{v:.3g}" + ("*" if v == best else ""), ha="center",
                            va="center", fontsize=7,
                            color="white" if v / best > 1.25 else "black")
        bc = s.loc[s.median_us.idxmin(), "config"]
        ax.set_title(f"B={B}: best {bc}", fontsize=9)
    fig.colorbar(im, ax=axes.ravel().tolist(), label=f"time / best at this B (capped at {vmax:.2g})",
                 shrink=0.8)
    fig.suptitle(f"Decode config sweep, µs, method: {method} — {gpu}{_cpu_notes([method])}")
    return fig


# --------------------------------------------------------------------------- 3. timing


def _copy_bw(run: Run) -> float:
    if "copy_bw" not in run.state:
        try:
            from kernels.bench.roofline import copy_bandwidth

            # 1 GiB on a GPU; a small buffer on the CPU (smoke runs: plumbing only)
            nbytes = (1 << 30) if run.on_gpu else (32 << 20)
            bw = float(copy_bandwidth(device=run.device, nbytes=nbytes))
            print(f"device copy bandwidth: {bw / 1e9:.1f} GB/s (bytes read + written)")
        except Exception as e:
            run.skip("copy-bandwidth floor", short_reason(e))
            bw = float("nan")
        run.state["copy_bw"] = bw
        run.extra_provenance["copy_bandwidth_Bps"] = bw
    return run.state["copy_bw"]


def floor_us(B: int, shape, bw: float) -> float:
    """Time to read and write the fp32 state once at copy bandwidth ``bw``."""
    from kernels.spec import decode_state_bytes

    if not np.isfinite(bw) or bw <= 0:
        return float("nan")
    try:
        from kernels.bench.roofline import floor_us as _floor

        return float(_floor(decode_state_bytes(B, shape), bw))
    except ImportError:
        return decode_state_bytes(B, shape) / bw * 1e6


def method_floor_us(run: Run, method: str, B: int, shape, bw: float) -> float:
    """The ``floor_us`` of a row: the copy-bandwidth floor of the state's bytes for the GPU
    methods, one bare Triton launch for ``host`` (:meth:`Run.host_floor_us`)."""
    return run.host_floor_us() if method == "host" else floor_us(B, shape, bw)


def _label_config(run: Run, label: str, B: int):
    from kernels.decode import FLA_LIKE, DecodeConfig, config_for

    if label == "ours-adaptive":
        table = run.state.get("table") or {}
        return table.get(B) or config_for(B).fit(run.params["head_dim"])
    if label == "ours-fla-like":
        return FLA_LIKE
    if label.startswith("ours:"):
        return DecodeConfig.from_name(label.split(":", 1)[1])
    return None


def _local_rows(run: Run, gate: pd.DataFrame, methods: List[str], B: int, inputs) -> List[dict]:
    """Rows of every implementation of ``impls`` timed in this process at ``B`` with each of
    ``methods`` (its config, or a peer's last passing variant); one that did not pass the
    gate is skipped with its reason."""
    p, rows = run.params, []
    peers = run.state.get("peers", {})
    fl = {m: method_floor_us(run, m, B, run.state["shape"],
                             float("nan") if m == "host" else _copy_bw(run)) for m in methods}
    for label in p["impls"]:
        if label.startswith("solution:"):
            continue
        cfg = _label_config(run, label, B)
        g = gate[(gate.label == label) & (gate.B == B)]
        if cfg is not None:
            cname, fn, call_inputs = cfg.name, _ours(cfg), inputs
            g = g[g.config == cname]
        else:  # a peer: its last passing variant (flashinfer: in place)
            passing = [r for r in peers.get(label, [])
                       if ((g.config == r.variant) & (g.status == PASS)).any()]
            cname = passing[-1].variant if passing else "default"
            fn = passing[-1].fn if passing else None
            g = g[g.config == cname]
            # an in-place peer gets its own copy of the inputs
            call_inputs = dict(inputs, state=inputs["state"].clone()) \
                if cname == "inplace" else inputs
        if g.empty or (g.status != PASS).any():
            why = "not gated" if g.empty else f"gate {g.status.iloc[0]}"
            if g.empty or g.status.iloc[0] != UNAVAILABLE:
                run.skip(f"{label} {cname} B={B} {'/'.join(methods)}", why)
            continue
        for method in methods:
            timings = time_each(lambda: fn(**call_inputs), [method], rep=p["repetitions"],
                                warmup=p["warmup"])
            rows += run.timed_rows(timings, f"{label} B={B}", dict(
                impl=impl_of(label), config=cname, B=B, floor_us=fl[method], gpu=run.gpu,
                label=label))
    return rows


def run_host(run: Run, gate: pd.DataFrame) -> pd.DataFrame:
    """The ``host`` rows of every implementation timed in this process, and the bare-launch
    floor, before the sweep's first profiler session (after a ``cupti_cold`` session every
    later call ran slower on an H100: docs/notes/instruments.md, "Host time after a profiler
    session"). ``ours-adaptive`` runs the installed dispatch table's config here (the
    sweep's is not known yet; the host work is one launch either way). Kept for
    :func:`run_timing`; a solution's host is timed in its worker, which takes it first."""
    p = run.params
    run.state["host_rows"] = rows = []
    if "host" not in p["methods"] or not method_available("host", run.device)[0]:
        return pd.DataFrame(rows, columns=TIMES_COLUMNS)   # (run_timing says why)
    run.host_floor_us()
    passed = set(gate[gate.status == PASS].label)
    n_timed = len([n for n in p["impls"] if n in passed])
    for B in progress(p["batch_sizes"], f"host: {plural(n_timed, 'implementation')} per B",
                      "B"):
        inputs, _ = _inputs(run, B)
        rows += _local_rows(run, gate, ["host"], B, inputs)
    return pd.DataFrame(rows, columns=TIMES_COLUMNS)


def run_timing(run: Run, gate: pd.DataFrame) -> pd.DataFrame:
    """Time every implementation that passed the gate at B, per method
    (``decode_times.csv``): the ``host`` rows from :func:`run_host` (taken there, before
    the sweep, if it ran; here otherwise), the GPU methods here. Methods that cannot run
    here are skipped with a printed reason; nothing is written for them."""
    p = run.params
    methods = run.usable_methods(p["methods"])
    if "host" in methods and "host_rows" not in run.state:
        run_host(run, gate)
    rows = list(run.state.get("host_rows", [])) if "host" in methods else []
    passed = set(gate[gate.status == PASS].label)
    n_timed = len([n for n in p["impls"] if n in passed])
    gpu_methods = [m for m in methods if m != "host"]
    for method in gpu_methods:
        for B in progress(p["batch_sizes"], f"timing: {plural(n_timed, 'implementation')} "
                          f"per B ({method})", "B"):
            inputs, _ = _inputs(run, B)
            rows += _local_rows(run, gate, [method], B, inputs)
    if methods and run.state.get("solutions"):
        n_sols = len([n for n in run.state["solutions"] if n in passed])
        shape, bw = run.state["shape"], _copy_bw(run)
        for B in progress(p["batch_sizes"], f"timing: {plural(n_sols, 'solution')} per B "
                          f"({', '.join(methods)}), in their workers", "B"):
            inputs, ref = _inputs(run, B)
            rows += _time_solutions(run, gate, methods, B, inputs, ref,
                                    {m: method_floor_us(run, m, B, shape, bw) for m in methods})
    order = {m: i for i, m in enumerate(methods)}   # rows (and panels) in the asked order
    rows.sort(key=lambda r: order.get(r.get("method"), len(order)))
    times = pd.DataFrame(rows, columns=TIMES_COLUMNS)
    times["frac_of_copy_bw"] = (times.floor_us / times.median_us).where(times.method != "host")
    if len(times):
        run.write_csv(times, "decode_times")
    else:
        print("no timings in this run: decode_times.csv not written")
    return times


def _time_solutions(run: Run, gate: pd.DataFrame, methods: List[str], B: int, inputs, ref,
                    fl: Dict[str, float]) -> List[dict]:
    """Rows of the solutions that passed the gate at ``B``, timed with every one of
    ``methods`` in one request to each worker (gated again there on the same inputs): one
    copy of the inputs to the worker per B, not one per method, since a B = 512 state is
    268 MB each way."""
    p, rows = run.params, []
    for label, rec in run.state.get("solutions", {}).items():
        g = gate[(gate.label == label) & (gate.B == B)]
        if g.empty or g.status.iloc[0] != PASS:
            if not g.empty and g.status.iloc[0] != UNAVAILABLE:
                run.skip(f"{label} B={B}", f"gate {g.status.iloc[0]}")
            continue
        res = run.worker_result(rec.fn, f"B{B}", inputs, ref, f"{label} B={B}",
                                methods=list(methods), rep=p["repetitions"],
                                warmup=p["warmup"])
        if res:
            rows += [dict(r, floor_us=fl.get(r["method"], float("nan")))
                     for r in run.timed_rows(res["timings"], f"{label} B={B}", dict(
                         impl="solution", config="default", B=B, gpu=run.gpu, label=label))]
    return rows


def times_table(times: pd.DataFrame) -> pd.DataFrame:
    """Median µs: one row per (method, B), one column per implementation."""
    if times.empty:
        return pd.DataFrame()
    out = times.pivot_table(index=["method", "B"], columns="label", values="median_us", sort=False)
    return out[unique_in_order(times.label)]


def run_serving(run: Run) -> Dict[str, pd.DataFrame]:
    """Sections 7: pooled vs dense, T tokens per call, fp32 vs bf16 state
    (:func:`kernels.experiments.decode_serving.run_serving`, floors from this
    run's copy bandwidth)."""
    return _serving.run_serving(run, _copy_bw(run))


# --------------------------------------------------------------------------- 4. analysis


def run_replay(run: Run) -> Dict[str, pd.DataFrame]:
    """Section 9: the replay decode against the standard step
    (:func:`kernels.experiments.decode_replay.run_replay`, floors from this run's copy
    bandwidth)."""
    return _replay.run_replay(run, _copy_bw(run))


def crossover_points(Bs: Sequence[float], speedups: Sequence[float]) -> List[tuple]:
    """Where ``speedups`` (baseline time / challenger time) crosses 1.

    Points are sorted by B; between two measured points whose speedups lie on
    opposite sides of 1 the crossing is interpolated linearly in ``log B``
    (log-linear). A point exactly at 1 is a crossing at that B. Returns
    ``[(B_cross, direction)]`` with direction ``"faster→slower"`` (the
    challenger loses its lead as B grows) or ``"slower→faster"``.
    """
    pts = sorted((float(b), float(s)) for b, s in zip(Bs, speedups)
                 if np.isfinite(b) and np.isfinite(s) and b > 0)
    out = []
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        d0, d1 = s0 - 1.0, s1 - 1.0
        if d0 == 0:
            continue  # counted as the previous pair's end point
        if d0 * d1 < 0 or d1 == 0:
            f = d0 / (d0 - d1)
            lb = math.log(b0) + f * (math.log(b1) - math.log(b0))
            out.append((math.exp(lb), "faster→slower" if d0 > 0 else "slower→faster"))
    return out


def speedups(times: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per method, B and challenger: ``speedup = baseline time / challenger time``."""
    base = times[times.label == baseline][["method", "B", "median_us"]].rename(
        columns={"median_us": "baseline_us"})
    ch = times[times.label != baseline][["method", "B", "label", "median_us"]]
    m = ch.merge(base, on=["method", "B"])
    m["speedup"] = m.baseline_us / m.median_us
    m["baseline"] = baseline
    return m


def crossover_table(times: pd.DataFrame, baselines: Sequence[str]) -> pd.DataFrame:
    """One row per method × baseline × challenger: first crossover B (NaN
    when none), all crossings, and the speedup at the smallest and largest B."""
    rows = []
    for baseline in baselines:
        if baseline not in set(times.label):
            continue
        sp = speedups(times, baseline)
        for (method, label), g in sp.groupby(["method", "label"], sort=False):
            g = g.sort_values("B")
            cr = crossover_points(g.B, g.speedup)
            lo, hi = g.iloc[0], g.iloc[-1]
            if cr:
                summary = "crosses"
            elif (g.speedup > 1).all():
                summary = "faster at every B"
            elif (g.speedup < 1).all():
                summary = "slower at every B"
            else:
                summary = "ties"
            rows.append(dict(method=method, baseline=baseline, challenger=label,
                             crossover_B=cr[0][0] if cr else float("nan"),
                             direction=cr[0][1] if cr else "",
                             crossings="; ".join(f"{b:.3g} ({d})" for b, d in cr),
                             summary=summary, B_min=int(lo.B), speedup_at_B_min=float(lo.speedup),
                             B_max=int(hi.B), speedup_at_B_max=float(hi.speedup)))
    return pd.DataFrame(rows, columns=["method", "baseline", "challenger", "crossover_B",
                                       "direction", "crossings", "summary", "B_min",
                                       "speedup_at_B_min", "B_max", "speedup_at_B_max"])


def _cpu_notes(methods) -> str:
    return "\n(cpu_wall: interpreter wall time, plumbing only)" if CPU_WALL in set(methods) else ""


def _auto_logy(ax, values) -> None:
    """Log y when the values span more than 20×, else linear from 0."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / v.min() > 20:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def _gpu_of(times: pd.DataFrame) -> str:
    return str(times.gpu.iloc[0]) if "gpu" in times and len(times) else ""


def plot_time_vs_B(times: pd.DataFrame):
    """Time vs B (log-x), one line per implementation with its p20–p80 band
    and the copy-bandwidth floor; one panel per method."""
    if times is None or times.empty:
        return None
    methods = unique_in_order(times.method)
    ncols = 2 if len(methods) == 4 else max(1, len(methods))
    fig, axes = new_figure(math.ceil(len(methods) / ncols), ncols, panel=(5.2, 3.4))
    gpu = _gpu_of(times)
    color = {lab: f"C{k % 10}" for k, lab in enumerate(unique_in_order(times.label))}
    for ax, method in zip(axes.flat, methods):
        t = times[times.method == method]
        for label in unique_in_order(t.label):
            s = t[t.label == label].sort_values("B")
            ax.plot(s.B, s.median_us, marker="o", ms=3, label=label, color=color[label])
            ax.fill_between(s.B, s.p20_us, s.p80_us, color=color[label], alpha=0.2)
        fl = t.drop_duplicates("B").sort_values("B")
        if fl.floor_us.notna().any():
            ax.plot(fl.B, fl.floor_us, "k--" if method != "host" else "k:", lw=1,
                    label="copy-bandwidth floor" if method != "host"
                    else "one bare Triton launch (host floor)")
        batch_axis(ax, sorted(t.B.unique()))
        ax.set_xlabel("batch size B")
        ax.set_ylabel("µs per call, median, p20–p80")
        _auto_logy(ax, t.median_us)
        ax.set_title(method_title(method), fontsize=9)
    figure_legend(fig, axes)   # outside: it covered the dashed floor at small B
    fig.suptitle(f"GDN decode: time vs batch size — {gpu}{_cpu_notes(methods)}")
    return fig


def _ratio_scale(ax, values) -> None:
    """Linear y around 1 when the ratios span less than 4×, else log2."""
    v = np.asarray(list(values), dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return
    lo, hi = min(float(v.min()), 1.0), max(float(v.max()), 1.0)
    if hi / lo > 4:
        ax.set_yscale("log", base=2)
    else:
        pad = 0.08 * (hi - lo) + 0.02
        ax.set_ylim(lo - pad, hi + pad)


def plot_speedup(times: pd.DataFrame, baselines: Sequence[str]):
    """Speedup of the compared implementations over each baseline vs B (rows:
    methods, columns: baselines). The eager torch reference is left out (its
    ratios are in ``crossovers.csv``) unless it is the baseline; the y axis is
    linear around 1 unless the ratios span more than 4×; crossovers are marked
    by vertical lines and listed in one text box per panel (labels cannot
    overlap)."""
    if times is None or times.empty:
        return None
    methods = unique_in_order(times.method)
    asked = list(baselines) or ["flashinfer"]
    baselines = [b for b in asked if b in set(times.label)]
    missing = [b for b in asked if b not in baselines]
    if not baselines:
        return None
    fig, axes = new_figure(max(1, len(methods)), len(baselines), panel=(5.4, 3.8))
    gpu = _gpu_of(times)
    color = {lab: f"C{k % 10}" for k, lab in enumerate(unique_in_order(times.label))}
    for i, method in enumerate(methods):
        t = times[times.method == method]
        for j, baseline in enumerate(baselines):
            ax = axes[i][j]
            ax.set_title(f"vs {baseline} — {method_title(method)}", fontsize=9)
            sp = speedups(t, baseline)
            left_out = [l for l in unique_in_order(sp.label) if impl_of(l) == "torch"]
            sp = sp[~sp.label.isin(left_out)]
            notes = []
            for label in unique_in_order(sp.label):
                g = sp[sp.label == label].sort_values("B")
                line, = ax.plot(g.B, g.speedup, marker="o", ms=3, label=label,
                                color=color[label])   # one colour per label in every panel
                for b, d in crossover_points(g.B, g.speedup):
                    ax.axvline(b, color=line.get_color(), ls=":", lw=1)
                    notes.append(f"{label}: B≈{b:.3g} ({d})")
            ax.axhline(1.0, color="k", lw=0.8)
            _ratio_scale(ax, sp.speedup)
            batch_axis(ax, sorted(t.B.unique()))
            ax.set_xlabel("batch size B")
            ax.set_ylabel(f"{baseline} time / time (>1: faster)")
            if left_out:
                notes.append(f"left out: {', '.join(left_out)} (eager reference; crossovers.csv)")
            ax.text(0.02, 0.02, "crossovers:\n" + ("\n".join(notes) if notes else "none"),
                    transform=ax.transAxes, fontsize=6.5, va="bottom", ha="left",
                    bbox=dict(boxstyle="round", fc="white", ec="0.7", alpha=0.85))
    figure_legend(fig, axes)   # outside: in a panel it covered the curves
    fig.suptitle(f"GDN decode: speedup and crossover batch size — {gpu}, "
                 f"timing: {', '.join(methods)} (median){_cpu_notes(methods)}"
                 + (f"\n(not measured in this run, so no panel: vs {', '.join(missing)})"
                    if missing else ""))
    return fig


def plot_bw_fraction(times: pd.DataFrame):
    """Achieved fraction of device copy bandwidth (state bytes / time) vs B, on a log
    axis: the fractions differ by orders (a slow reference, small B), and on a linear
    one the small ones lie on top of each other at 0."""
    if times is None or times.empty:
        return None
    methods = [m for m in unique_in_order(times.method) if m != "host"]   # not a GPU time
    if not methods:
        return None
    fig, axes = new_figure(1, max(1, len(methods)), panel=(5.2, 3.6))
    gpu = _gpu_of(times)
    for ax, method in zip(axes.flat, methods):
        t = times[times.method == method]
        if not t.frac_of_copy_bw.notna().any():
            ax.text(0.5, 0.5, "copy bandwidth not measured", ha="center", va="center",
                    transform=ax.transAxes)
        for label in unique_in_order(t.label):
            s = t[t.label == label].sort_values("B")
            ax.plot(s.B, s.frac_of_copy_bw, marker="o", ms=3, label=label)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        batch_axis(ax, sorted(t.B.unique()))
        v = t.frac_of_copy_bw.to_numpy(float)
        v = v[np.isfinite(v) & (v > 0)]
        if len(v):
            ax.set_yscale("log")
            ax.set_ylim(float(v.min()) / 2, max(1.5, float(v.max()) * 1.5))
        ax.set_xlabel("batch size B")
        ax.set_ylabel("state bytes / time ÷ copy bandwidth")
        ax.set_title(f"method: {method}", fontsize=9)
    figure_legend(fig, axes)
    fig.suptitle(f"GDN decode: achieved fraction of copy bandwidth — {gpu}{_cpu_notes(methods)}")
    return fig


# --------------------------------------------------------------------------- 5. conclusion


def _pick(Bs, want):
    Bs = sorted(int(b) for b in Bs)
    return want if want in Bs else (Bs[0] if want == 1 else Bs[-1])


def _best_vs_peer(t: pd.DataFrame, B: int) -> str:
    s = t[t.B == B]
    ours = s[s.impl == "ours"]
    peers = s[s.impl != "ours"]
    if ours.empty or peers.empty:
        return f"B={B}: " + ("no peer measured" if peers.empty else "ours not measured")
    o = ours.loc[ours.median_us.idxmin()]
    q = peers.loc[peers.median_us.idxmin()]
    r = q.median_us / o.median_us
    verdict = "faster" if r > 1 else "slower"
    ratio = r if r > 1 else 1 / r
    return (f"B={B}: best ours ({o.label}, {o.config}) {fmt_us(o.median_us)} vs best peer "
            f"({q.label}) {fmt_us(q.median_us)} → ours {fmt_x(ratio)} {verdict}")


def _seed_verdict(cx: pd.DataFrame, method: str, challenger: str, expected: float) -> str:
    row = cx[(cx.method == method) & (cx.baseline == "flashinfer") & (cx.challenger == challenger)]
    if row.empty:
        return f"{challenger} vs flashinfer not measured with {method}: cannot check"
    r = row.iloc[0]
    ends = [f"{sp:.2f}× at B={b} (seed {SEED_SPEEDUP[b]:.2f}×)"
            for b, sp in ((r.B_min, r.speedup_at_B_min), (r.B_max, r.speedup_at_B_max))
            if b in SEED_SPEEDUP and challenger != "ours-adaptive"]
    return _crossing_verdict(r, challenger, expected) + (
        "; speedup " + ", ".join(ends) if ends else "")


def _crossing_verdict(r, challenger: str, expected: float) -> str:
    if np.isfinite(r.crossover_B):
        holds = expected / 2 <= r.crossover_B <= expected * 2
        return (f"{challenger} vs flashinfer crosses at B≈{r.crossover_B:.3g} ({r.direction}) → "
                f"{'holds' if holds else 'does not hold'} (rule: within a factor 2 of "
                f"{expected:g})")
    return (f"{challenger} is {r.summary} vs flashinfer (B={r.B_min}…{r.B_max}) → "
            f"does not hold (no crossover in range)")


def conclusion_markdown(dfs: Dict[str, pd.DataFrame]) -> str:
    """The notebook's conclusion from its DataFrames.

    ``dfs``: ``times`` (decode_times), ``gate`` (gate.csv) and optionally
    ``best`` (:func:`best_configs`), ``crossovers`` (:func:`crossover_table`;
    computed against flashinfer and fla when absent), the serving sections'
    ``serving_times``, ``serving_gate`` and ``drift`` frames and the replay section's
    ``replay_times``, ``replay_gate`` and ``replay_drift``.
    """
    serving = serving_markdown(dfs.get("serving_times"), dfs.get("serving_gate"),
                               dfs.get("drift"))
    replay = _replay.replay_markdown(dfs.get("replay_times"), dfs.get("replay_gate"),
                                     dfs.get("replay_drift"))
    text = _crossover_conclusion(dfs)
    return text + "".join("\n\n" + x for x in (serving, replay) if x)


def _crossover_conclusion(dfs: Dict[str, pd.DataFrame]) -> str:
    times = dfs.get("times", pd.DataFrame(columns=TIMES_COLUMNS))
    gate = dfs.get("gate")
    lines = []
    gpu = _gpu_of(times) or (str(gate.gpu.iloc[0]) if gate is not None and len(gate) else "")
    lines.append(f"### Conclusion — {gpu}")
    if gate is not None and len(gate):
        ran = gate[gate.status != UNAVAILABLE]
        failed = ran[ran.status != PASS]
        unav = unique_in_order(gate[gate.status == UNAVAILABLE].label)
        n_cfg = ran[ran.label == "ours-adaptive"].config.nunique()
        txt = (f"**Gate:** {plural(ran.label.nunique(), 'implementation')} ran at B ∈ "
               f"{sorted(int(b) for b in gate.B.unique())}"
               + (f" (ours-adaptive over {n_cfg} configs)" if n_cfg > 1 else "") + "; ")
        if failed.empty:
            txt += "all passed the contest rule (atol = rtol = 1e-2)."
        else:
            fl = failed.groupby("label").apply(
                lambda g: f"{g.name} ({plural(len(g), 'failing point')}, e.g. {g.config.iloc[0]} "
                          f"B={g.B.iloc[0]}: {g.reason.iloc[0]})", include_groups=False)
            txt += "failing (not timed): " + "; ".join(fl) + "."
        if unav:
            txt += f" Not available here: {', '.join(unav)}."
        lines.append(txt)
    if times.empty:
        lines.append("**No timings** in this run (no timing method could run on this device), "
                     "so there is no crossover to report.")
        return "\n\n".join(lines)
    if CPU_WALL in set(times.method):
        lines.append("*`cpu_wall` is host wall time of the Triton CPU interpreter: it exercises "
                     "the plumbing and says nothing about GPU performance.*")
    cx = dfs.get("crossovers")
    if cx is None:
        cx = crossover_table(times, ["flashinfer", "fla"])
    best = dfs.get("best")
    for method in unique_in_order(times.method):
        c = cx[cx.method == method]
        if c.empty:
            lines.append(f"**{method}:** no baseline measured, no crossover to compute.")
            continue
        items = []
        for r in c.itertuples():
            if np.isfinite(r.crossover_B):
                items.append(f"{r.challenger} vs {r.baseline}: crossover B≈{r.crossover_B:.3g} "
                             f"({r.direction})")
            else:
                items.append(f"{r.challenger} vs {r.baseline}: {r.summary} "
                             f"(speedup {r.speedup_at_B_min:.2f} at B={r.B_min}, "
                             f"{r.speedup_at_B_max:.2f} at B={r.B_max})")
        lines.append(f"**Crossovers, {method}:**\n" + "\n".join(f"- {i}" for i in items))
    method = CONTEST_METHOD if CONTEST_METHOD in set(times.method) else times.method.iloc[0]
    t = times[times.method == method]
    picks = unique_in_order([_pick(t.B.unique(), 1), _pick(t.B.unique(), 64),
                             int(max(t.B.unique()))])
    lines.append(f"**Ours vs the best peer ({method}):**\n"
                 + "\n".join(f"- {_best_vs_peer(t, b)}" for b in picks))
    seed = [f"- FLA's kernel: {_seed_verdict(cx, method, 'fla', SEED_CROSSOVER_B)}",
            f"- our FLA-like BV=8 config: "
            f"{_seed_verdict(cx, method, 'ours-fla-like', SEED_CROSSOVER_B)}",
            f"- ours-adaptive (seed after per-B num_warps: B≈{SEED_ADAPTIVE_CROSSOVER_B}): "
            f"{_seed_verdict(cx, method, 'ours-adaptive', SEED_ADAPTIVE_CROSSOVER_B)}"]
    lines.append(f"**Seed check** (B200, CUPTI: FLA-style recurrent kernel overtaken by "
                 f"FlashInfer at B≈{SEED_CROSSOVER_B}); here on {gpu} with {method}:\n"
                 + "\n".join(seed))
    host = host_table(times)
    if len(host):
        floor = float(host.floor_us.iloc[0])
        parts = [f"{r.label} {r.median_us:.0f} µs ({r.x_floor:.1f}× the floor)"
                 for r in host.itertuples()]
        lines.append(f"**Host time per eager call** (`host`, median over B; one bare Triton "
                     f"launch takes {floor:.1f} µs here): " + "; ".join(parts) + ".")
    if best is not None and len(best):
        parts = [f"B={int(r.B)}: {r.config}" + (f" ({r.gain_vs_fla_like:.2f}× vs BV8-w1)"
                                                 if np.isfinite(r.gain_vs_fla_like) else "")
                 for r in best.itertuples()]
        lines.append("**Dispatch table** (fastest passing config per B): " + "; ".join(parts) + ".")
    return "\n\n".join(lines)
