"""Target tables of ours vs the peers, computed from committed result folders.

    python -m kernels.report                       # print the markdown
    python -m kernels.report --update              # also rewrite docs/results.md's generated block

Decode (issue target, ``cupti_cold``): ours-adaptive <= max(0.9 x the faster
peer, floor / 0.95), the floor being the state bytes over the copy bandwidth
measured in the same run. Prefill (``graph`` replay): the best of our variants
<= 0.9 x the faster peer; eager ``fused``: launches, and its ``cupti_cold``
span over its graph time (target <= 2). Long context (notebook 04, ``graph``):
ours <= 0.9 x the fastest peer at every length. Every number is read from
``results/<gpu>/*/*.csv``; nothing is typed by hand.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import List, Optional, Tuple

import pandas as pd

from .bench.timing import METHODS, method_meaning

__all__ = ["decode_targets", "decode_methods", "replay_targets", "replay_target",
           "prefill_targets", "TARGET_RATIO", "ratio_table", "scaling_targets", "committed_runs",
           "timing_era", "TIMING_FIX", "render", "main"]

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _gpu_name(folder: Path) -> str:
    return folder.name


def _peer_columns(op: str) -> dict:
    """``{column: labels}`` of the ``op`` peers with a column in these tables, from their
    rows of :data:`kernels.peers.PEERS` (:func:`kernels.peers.peer_columns`)."""
    from .peers import peer_columns

    return {col: tuple(dict.fromkeys(labels)) for col, labels in peer_columns(op).items()}


def _peer_column(wide: pd.DataFrame, labels) -> Optional[pd.Series]:
    """The column of ``wide`` (one per label) of the first of ``labels`` it has, or None."""
    return next((wide[x] for x in labels if x in wide.columns), None)


def decode_targets(folder: Path) -> pd.DataFrame:
    """Per B: peers (those with a column, :func:`_peer_columns`), ours-adaptive, floor,
    target, met (µs, cupti_cold)."""
    d = pd.read_csv(folder / "01_decode_crossover" / "decode_times.csv")
    d = d[d.method == "cupti_cold"]
    t = d.pivot_table(index="B", columns="label", values="median_us")
    floor = d.groupby("B").floor_us.first()
    peers = _peer_columns("decode")
    out = pd.DataFrame({**{col: _peer_column(t, labels) for col, labels in peers.items()},
                        "ours (FLA-like BV8)": t.get("ours-fla-like"),
                        "ours (adaptive)": t.get("ours-adaptive"), "floor": floor})
    best_peer = out[list(peers)].min(axis=1)
    out["target"] = pd.concat([0.9 * best_peer, floor / 0.95], axis=1).max(axis=1)
    out["ours / best peer"] = out["ours (adaptive)"] / best_peer
    out["met"] = out["ours (adaptive)"] <= out["target"]
    return out.reset_index()


def _host_bound(host: pd.Series, gpu: pd.Series) -> pd.Series:
    """Whether an eager call is host-bound: its host time per call exceeds its GPU time
    (``graph``), so back-to-back eager calls leave the GPU idle between them."""
    return (host > gpu).map({True: "**yes**", False: "no"}).where(host.notna() & gpu.notna())


def decode_methods(folder: Path, label: str = "ours-adaptive") -> pd.DataFrame:
    """Per B: ``label``'s median under each timing method of notebook 01 (three GPU-time
    methods and ``host``, µs of host time per eager call), the bare-launch floor of
    ``host`` (one empty Triton kernel launched in the same run), ours' host time over it,
    whether the eager call is host-bound (host > ``graph``), and the implementation with
    the lowest host time at that B."""
    d = pd.read_csv(folder / "01_decode_crossover" / "decode_times.csv")
    ours = d[d.label == label].pivot_table(index="B", columns="method", values="median_us")
    out = pd.DataFrame({m: ours.get(m) for m in METHODS if m in ours.columns})
    host = d[d.method == "host"]
    if not host.empty:
        out["bare launch"] = host.groupby("B").floor_us.first()
        out["host / bare"] = out["host"] / out["bare launch"]
        if "graph" in out:
            out["host-bound"] = _host_bound(out["host"], out["graph"])
        low = host.loc[host.groupby("B").median_us.idxmin()].set_index("B")
        out["lowest host"] = low.label + " " + low.median_us.map(lambda x: f"{x:.1f}")
    return out.reset_index()


#: Batch sizes the replay decode's targets are stated at.
REPLAY_TARGET_B = (1, 64, 512)


def replay_target(kind: str, B: int) -> float:
    """Replay decode target per generated token, as a ratio to the standard call: one token
    per call (``kind="replay"``) ≤ 0.65 × (no slower at B = 1); speculative T = 4
    verification (``"replay_spec"``) ≤ 0.6 ×."""
    if kind == "replay_spec":
        return 0.6
    return 1.0 if B == 1 else 0.65


def replay_targets(folder: Path) -> pd.DataFrame:
    """Per state dtype, B (1, 64, 512) and call kind (one token; speculative T = 4 with the
    notebook's acceptance pattern): the standard step, the replay's best ``L`` and its time
    per generated token, their ratio against the target, and the fraction of the replay's
    own byte floor it reaches (notebook 01's replay section)."""
    d = pd.read_csv(folder / "01_decode_crossover" / "replay_times.csv")
    rows = []
    for dname in dict.fromkeys(d.state_dtype):
        for kind, std_kind in (("replay", "standard"), ("replay_spec", "standard_spec")):
            for B in REPLAY_TARGET_B:
                target = replay_target(kind, B)
                at = d[(d.B == B) & (d.state_dtype == dname)]
                std, rep = at[at.kind == std_kind], at[at.kind == kind]
                if std.empty or rep.empty:
                    continue
                best = rep.loc[rep.us_per_token.idxmin()]
                s0 = float(std.us_per_token.iloc[0])
                rows.append({"state": dname, "B": B, "call": "T=4 spec" if kind == "replay_spec"
                             else "T=1", "standard": s0, "best L": int(best.L),
                             "replay": float(best.us_per_token),
                             "replay / standard": float(best.us_per_token) / s0,
                             "target": target,
                             "met": float(best.us_per_token) / s0 <= target,
                             "of own floor": float(best.frac_of_floor)})
    return pd.DataFrame(rows)


def prefill_targets(folder: Path) -> pd.DataFrame:
    """Per shape: peers (graph), our best variant (graph), target, met; eager fused figures."""
    p = pd.read_csv(folder / "02_prefill_launch_overhead" / "prefill_times.csv")
    g = p[p.method == "graph"]
    c = p[p.method == "cupti_cold"]
    present = {col: labels for col, labels in _peer_columns("prefill").items()
               if set(labels) & set(p.label)}
    rows = []
    for lens in p.lens.drop_duplicates():
        gs = g[g.lens == lens].set_index("label").median_us
        cs = c[c.lens == lens].set_index("label")
        peers = {col: next((float(gs[x]) for x in labels if x in gs.index), float("nan"))
                 for col, labels in present.items()}
        ours = gs[[x for x in gs.index if x.startswith("ours")]]
        best_peer = min(v for v in peers.values() if v == v and v is not None)
        fused_graph = gs.get("ours-fused")
        fused_span = cs.median_us.get("ours-fused")
        rows.append({
            "lens": lens, "T": int(p.loc[p.lens == lens, "T"].iloc[0]),
            **peers,
            "ours best": ours.min(), "ours variant": ours.idxmin().replace("ours-", ""),
            "target": 0.9 * best_peer, "met": ours.min() <= 0.9 * best_peer,
            "fused launches": int(cs.launches.get("ours-fused")),
            "fused cupti_cold": fused_span,
            "span / graph": fused_span / fused_graph,
        })
    return pd.DataFrame(rows)


def prefill_host(folder: Path, label: str = "ours-fused") -> pd.DataFrame:
    """Per shape of notebook 02: ``label``'s GPU time (``graph``, ``cupti_cold``) and host
    time per eager call (``host``), the bare-launch floor measured in the same run, ours'
    host time over it, whether the eager call is host-bound (host > ``graph``), and the
    implementation with the lowest host time at that shape. Empty where the run has no ``host`` rows."""
    p = pd.read_csv(folder / "02_prefill_launch_overhead" / "prefill_times.csv",
                    dtype={"lens": str})
    host = p[p.method == "host"]
    if host.empty:
        return pd.DataFrame()
    ours = p[p.label == label].pivot_table(index="lens", columns="method", values="median_us",
                                           sort=False)
    order = list(dict.fromkeys(p.lens))
    out = pd.DataFrame({m: ours.get(m) for m in ("graph", "cupti_cold", "host")}).loc[order]
    out["bare launch"] = host.groupby("lens").floor_us.first()
    out["host / bare"] = out["host"] / out["bare launch"]
    out["host-bound"] = _host_bound(out["host"], out["graph"])
    low = host.loc[host.groupby("lens").median_us.idxmin()].set_index("lens")
    out["lowest host"] = low.label + " " + low.median_us.map(lambda x: f"{x:.1f}")
    return out.rename_axis("lens").reset_index()


def solution_times(folder: Path) -> pd.DataFrame:
    """Solutions loaded from paths (``make run SOLUTIONS=...``) next to ours, per notebook
    and shape: µs, ``cupti_cold`` (notebook 01: ``ours-adaptive``; notebook 02:
    ``ours-fused``, the default dispatch the packed solution carries). Empty without any."""
    parts = []
    for nb, csv, key, ours in (("01 decode", "01_decode_crossover/decode_times.csv", "B",
                                "ours-adaptive"),
                               ("02 prefill", "02_prefill_launch_overhead/prefill_times.csv",
                                "lens", "ours-fused")):
        f = folder / csv
        if not f.exists():
            continue
        d = pd.read_csv(f)
        d = d[d.method == "cupti_cold"]
        sols = list(dict.fromkeys(d[d.impl == "solution"].label))
        if not sols:
            continue
        t = d[d.label.isin([ours] + sols)].pivot_table(index=key, columns="label",
                                                       values="median_us", sort=False)
        t = t[[ours] + sols].rename(columns={ours: f"ours ({ours})"})
        t.insert(0, "shape", [f"{key}={x}" if key == "B" else str(x) for x in t.index])
        t.insert(0, "notebook", nb)
        parts.append(t.reset_index(drop=True))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def contest_table(folder: Path, op: str) -> Tuple[pd.DataFrame, dict]:
    """``contest_<op>/``: flashinfer-bench's latency (µs) per workload and solution, the
    score row last; and ``run.json`` (commit, versions). Empty frame without a run."""
    d = folder / f"contest_{op}"
    if not (d / "comparison.csv").exists():
        return pd.DataFrame(), {}
    c = pd.read_csv(d / "comparison.csv", dtype={"workload": str})
    t = c.pivot_table(index="workload", columns="solution", values="fib_us", sort=False)
    failed = c[c.status != "PASSED"]
    for _, r in failed.iterrows():      # a failed workload shows its status, not a time
        t.loc[r.workload, r.solution] = float("nan")
    t = t.map(lambda x: ("failed" if x != x else f"{x:.2f}" if x < 10 else f"{x:.1f}"))
    sc = pd.read_csv(d / "scores.csv").set_index("solution").score
    t.loc["score"] = [f"**{sc[s]:.2f}**" if s in sc.index else "baseline" for s in t.columns]
    run = json.loads((d / "run.json").read_text()) if (d / "run.json").exists() else {}
    return t.reset_index(), run


#: Notebook 04's target: ours <= 0.9 x the fastest peer.
TARGET_RATIO = 0.9


def ratio_table(times: pd.DataFrame, method: Optional[str] = None) -> pd.DataFrame:
    """Per shape (with ``method``, default the first timed): each implementation's
    median (one column per ``label``), the fastest of the others (peers and solutions),
    ``ours / fastest peer`` and whether it meets the 0.9 target."""
    t = times[times.kernel.fillna("") == ""] if "kernel" in times else times
    if t.empty:
        return pd.DataFrame()
    method = method or t.method.iloc[0]
    t = t[t.method == method]
    wide = t.pivot_table(index=["lens", "T", "N"], columns="label", values="median_us",
                         sort=False)
    peers = [c for c in wide.columns if c != "ours"]
    out = wide.reset_index()
    if peers:
        best = wide[peers].min(axis=1)
        out["fastest peer"] = wide[peers].idxmin(axis=1).to_numpy()
        out["fastest peer us"] = best.to_numpy()
        if "ours" in wide:
            out["ours / fastest peer"] = (wide["ours"] / best).to_numpy()
            out["target met"] = out["ours / fastest peer"] <= TARGET_RATIO
    out.insert(3, "method", method)
    return out


def scaling_targets(folder: Path) -> pd.DataFrame:
    """Notebook 04, per shape (``graph`` µs): the peers, ours, ours / fastest peer, target
    (0.9 x the fastest peer), met; in order of total tokens (from :func:`ratio_table`, the
    notebook's table)."""
    d = pd.read_csv(folder / "04_prefill_scaling" / "prefill_scaling.csv", dtype={"lens": str})
    r = ratio_table(d, "graph")
    out = pd.DataFrame({"lens": r.lens, "T": r["T"].astype(int)})
    for col, labels in _peer_columns("prefill").items():
        peer = _peer_column(r, labels)
        if peer is not None:
            out[col] = peer
    out["ours"] = r["ours"]
    out["ours / fastest peer"] = r["ours / fastest peer"]
    out["target"] = TARGET_RATIO * r["fastest peer us"]
    out["met"] = r["target met"].astype(bool)
    return out.sort_values(["T", "lens"]).reset_index(drop=True)


def triton_versions_table(folder: Path) -> pd.DataFrame:
    """``triton_versions.csv`` (:mod:`kernels.bench.triton_versions`) per triton version: the
    ptxas it ran, contest cases passed, hard-input cases passed by the default and the
    accurate config, and the range of ``graph`` time against the first version listed."""
    from .bench.triton_versions import graph_table

    d = pd.read_csv(folder / "triton_versions.csv")
    d = d.drop_duplicates(["triton", "kernel", "shape", "inputs"], keep="last")
    versions = list(dict.fromkeys(d.triton))
    g = graph_table(d)
    rows = []
    for v in versions:
        x = d[d.triton == v]
        contest = x[x.inputs == "contest"]
        stress = x[x.inputs.str.startswith("stress")]
        row = {"triton": v, "ptxas": x.ptxas.iloc[0] if "ptxas" in x else "",
               "contest gate": f"{int(contest.passed.sum())}/{len(contest)}",
               "hard inputs, default": f"{int(stress[stress.kernel == 'prefill'].passed.sum())}/"
                                       f"{int((stress.kernel == 'prefill').sum())}",
               "hard inputs, accurate": f"{int(stress[stress.kernel == 'prefill-accurate'].passed.sum())}/"
                                        f"{int((stress.kernel == 'prefill-accurate').sum())}"}
        timed = g is not None and v in g and versions[0] in g
        r = (g[v] / g[versions[0]]).dropna() if timed else None
        for k in ("decode", "prefill"):
            rk = r[r.index.get_level_values(0) == k] if r is not None else ()
            row[f"{k} graph / {versions[0]}"] = (f"{rk.min():.2f}–{rk.max():.2f}" if len(rk)
                                                else "—")
        rows.append(row)
    return pd.DataFrame(rows)


def untimed_note(folder: Path) -> str:
    """`` Not timed (—): impl at lens: status (reason).`` for notebook 04's gate rows that did
    not pass (a failing or crashing call is reported, not timed); empty if all passed."""
    path = folder / "04_prefill_scaling" / "gate.csv"
    if not path.exists():
        return ""
    g = pd.read_csv(path, dtype={"lens": str})
    bad = g[g.status.isin(["fail", "error"])]
    if bad.empty:
        return ""
    items = []
    for r in bad.itertuples(index=False):
        why = str(r.reason).splitlines()[0].split(". ")[0][:90] if isinstance(r.reason, str) else ""
        items.append(f"{r.label} at {r.lens}: {r.status}" + (f" ({why})" if why else ""))
    return " Not timed (—): " + "; ".join(items) + "."


#: The commit that made ``graph`` capture enough calls per replay and ``event`` hide the
#: launch path (docs/design.md, "Measuring"): a run of an older commit timed the host's
#: launch cost wherever a call is shorter than it.
TIMING_FIX = "0dfd4a0"
_REPO = Path(__file__).resolve().parents[1]
#: How each kind of committed result is timed, when not by the suite's methods.
_NOT_OUR_TIMING = {"03_ncu_instruction_counts": "none (Nsight Compute counts)",
                   "contest": "flashinfer-bench 0.1.2 (host-inclusive events)",
                   "contest_decode": "the contest's flashinfer-bench (CUPTI span)",
                   "contest_prefill": "the contest's flashinfer-bench (CUPTI span)",
                   "faults": "none (pass or fail)"}


def timing_era(sha: str) -> str:
    """Whether commit ``sha`` has the timing fix (:data:`TIMING_FIX`) in its history, by
    this checkout's git; ``"unknown"`` where git cannot tell (not a commit of this clone)."""
    import subprocess

    try:
        p = subprocess.run(["git", "merge-base", "--is-ancestor", TIMING_FIX, sha], cwd=_REPO,
                           capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return {0: f"after `{TIMING_FIX}`", 1: f"before `{TIMING_FIX}`"}.get(p.returncode, "unknown")


def committed_runs(root: Path) -> pd.DataFrame:
    """One row per committed result under ``root`` with a record of its commit: the notebook
    folders (``provenance.json``), the contest evaluations (``run.json``), files with a
    ``<name>.provenance.json`` beside them, and ``triton_versions.csv`` (its ``git_sha``
    column). Columns: GPU folder, results, commit (7 characters), date (UTC) and timing (the
    suite's methods, before or after :data:`TIMING_FIX`, or what else timed it)."""
    found = []
    for gpu in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        for prov in sorted(gpu.glob("*/provenance.json")) + sorted(gpu.glob("contest*/run.json")):
            found.append((gpu.name, prov.parent.name + "/", prov.parent.name,
                          json.loads(prov.read_text())))
        for prov in sorted(gpu.glob("*.provenance.json")):
            stem = prov.name[:-len(".provenance.json")]
            found.append((gpu.name, f"{stem}.csv", stem, json.loads(prov.read_text())))
        tv = gpu / "triton_versions.csv"
        if tv.exists():
            d = pd.read_csv(tv)
            for sha in dict.fromkeys(d.git_sha):
                found.append((gpu.name, tv.name, "triton_versions",
                              {"git_sha": sha, "timestamp": d[d.git_sha == sha].timestamp.max()}))
    rows = []
    for gpu, name, kind, rec in found:
        sha = str(rec.get("git_sha", "unknown"))
        timing = _NOT_OUR_TIMING.get(kind) or f"ours, {timing_era(sha)}"
        rows.append({"GPU": gpu, "results": name, "commit": f"`{sha[:7]}`",
                     "date": str(rec.get("timestamp", "?"))[:10], "timing": timing})
    return pd.DataFrame(rows, columns=["GPU", "results", "commit", "date", "timing"])


def _md(df: pd.DataFrame) -> str:
    def fmt(x):
        if isinstance(x, bool):
            return "yes" if x else "**no**"
        if isinstance(x, float):
            if x != x:
                return "—"
            return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"
        return str(x)
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(x) for x in r) + " |")
    return "\n".join(lines)


def multi_gpu_scaling(folder: Path) -> pd.DataFrame:
    """Notebook 05's scaling table of a ``<W>x-<gpu>`` folder: per length ours on one GPU and
    on ``W``, the speedup, FLA's cp_context, and ours' host µs per eager call (where the run
    recorded it); empty without the CSV."""
    f = folder / "05_prefill_multi_gpu" / "scaling.csv"
    if not f.exists():
        return pd.DataFrame()
    d = pd.read_csv(f)
    return d.drop(columns=[c for c in ("gpus", "fla 1 GPU (µs)", "efficiency") if c in d])


def _methods_of(folder: Path) -> list:
    """The timing methods of notebook 05's ``times.csv`` in ``folder``."""
    t = pd.read_csv(folder / "05_prefill_multi_gpu" / "times.csv")
    return list(dict.fromkeys(t["method"]))


def _methods_legend(methods) -> str:
    """``"`m`: what its numbers are; ..."`` for timing ``methods`` (their meanings:
    :data:`kernels.bench.timing.TIMING_METHODS`)."""
    return "; ".join(f"`{m}`: {method_meaning(m) or '?'}" for m in methods) or "method ?"


def render(root: Path, gpus: List[str]) -> str:
    """The markdown block: one decode and one prefill table per GPU."""
    parts = ["*Generated by `python -m kernels.report --update` from the CSVs under "
             "`results/`; rerun it after new GPU runs.*", ""]
    runs = committed_runs(root)
    if not runs.empty:
        parts += ["#### Committed runs — which commit made which results", "", _md(runs), "",
                  "From each run's `provenance.json` (`run.json` of a contest evaluation, the "
                  "`git_sha` column of `triton_versions.csv`). Timing: runs timed with the "
                  f"suite's methods before `{TIMING_FIX}` replayed one call per graph launch "
                  "and timed `event` with the launch path inside, so their `graph` and "
                  "`event` numbers of calls under ~15 µs are the host's "
                  "([design](design.md#measuring)).", ""]
    for gpu in gpus:
        folder = root / gpu
        if not (folder / "01_decode_crossover" / "decode_times.csv").exists():
            meth = pd.DataFrame()
        else:
            dec = decode_targets(folder)
            parts += [f"#### Decode, {gpu} — µs, `cupti_cold` (cold L2, CUPTI span, median)", "",
                      _md(dec), "",
                      f"Target met at {int(dec.met.sum())} of {len(dec)} batch sizes. "
                      "Target = max(0.9 × faster peer, floor / 0.95); floor = state bytes / "
                      "copy bandwidth measured in the same run.", ""]
            meth = decode_methods(folder)
        if "host" in meth.columns:
            parts += [f"#### Decode timing methods and host time, {gpu} — ours (adaptive), µs, "
                      "median", "", _md(meth), "",
                      _methods_legend([m for m in METHODS if m in meth.columns])
                      + " (bare launch: one empty Triton kernel in the same run; "
                      "[instruments](design.md#measuring)).", ""]
        if (folder / "01_decode_crossover" / "replay_times.csv").exists():
            rep = replay_targets(folder)
            parts += [f"#### Replay decode, {gpu} — µs per generated token, `graph` replay "
                      "(warm L2)", "", _md(rep), "",
                      f"Target met at {int(rep.met.sum())} of {len(rep)} points. `of own "
                      "floor`: the replay's bytes per token (checkpoint read, write-back every "
                      "L tokens, ring) over the copy bandwidth, divided by its time "
                      "([serving decode](serving_decode.md)).", ""]
        if (folder / "02_prefill_launch_overhead" / "prefill_times.csv").exists():
            pre = prefill_targets(folder)
            parts += [f"#### Prefill, {gpu} — µs, `graph` replay (warm L2); eager `fused` "
                      "span with `cupti_cold`", "", _md(pre), "",
                      f"Graph-replay target (0.9 × fastest peer) met at {int(pre.met.sum())} of "
                      f"{len(pre)} shapes; eager span ≤ 2 × graph at "
                      f"{int((pre['span / graph'] <= 2).sum())} of {len(pre)}.", ""]
            ph = prefill_host(folder)
            if not ph.empty:
                parts += [f"#### Prefill host time, {gpu} — ours (fused), µs, median", "",
                          _md(ph), "",
                          "`host`: µs of host time per eager call (no sync), against one "
                          "bare Triton launch in the same run; host figures move between "
                          "host machines, so only a run's own ratios compare "
                          "([instruments](design.md#measuring)).", ""]
        if (folder / "04_prefill_scaling" / "prefill_scaling.csv").exists():
            sc = scaling_targets(folder)
            parts += [f"#### Long-context prefill (notebook 04), {gpu} — µs, `graph` replay "
                      "(warm L2), median", "", _md(sc), "",
                      f"Target (0.9 × fastest peer) met at {int(sc.met.sum())} of {len(sc)} "
                      "shapes." + untimed_note(folder), ""]
        sol = solution_times(folder)
        if not sol.empty:
            parts += [f"#### Solutions loaded from paths, {gpu} — µs, `cupti_cold`", "",
                      _md(sol), "",
                      "Each solution ran in a worker process of its own, gated there against "
                      "the reference on the notebook's inputs; `ours` is timed in the "
                      "notebook's process ([solutions.md](solutions.md)).", ""]
        for op in ("decode", "prefill"):
            ct, run = contest_table(folder, op)
            if ct.empty:
                continue
            parts += [f"#### Contest evaluation, {op}, {gpu} — µs, flashinfer-bench "
                      f"{run.get('params', {}).get('version', '')} (CUPTI span, cold L2)", "",
                      _md(ct), "",
                      f"`make contest-eval` at `{str(run.get('git_sha', '?'))[:7]}`: "
                      "latency per workload (mean over trials of the median), score = mean "
                      "over workloads of baseline / solution latency "
                      "([contest.md](contest.md)).", ""]
        if (folder / "triton_versions.csv").exists():
            tv = triton_versions_table(folder)
            parts += [f"#### Triton versions, {gpu} — `python -m kernels.bench.triton_versions`",
                      "", _md(tv), "",
                      "Gate: contest rule against the float32 reference; `graph` replay "
                      "medians per contest case, as a range of ratios to the first version. "
                      "The hard inputs fail the default config by design (docs/notes/prefill.md, "
                      "hard inputs); `ACCURATE_CONFIG` is the one that must pass them.", ""]
    for folder in sorted(p for p in root.glob("*x-*") if p.is_dir()):
        sc = multi_gpu_scaling(folder)
        if sc.empty:
            continue
        prov = json.loads((folder / "05_prefill_multi_gpu" / "provenance.json").read_text())
        parts += [f"#### Prefill on the GPUs of one host (notebook 05), {folder.name} — µs, "
                  "slowest rank, median", "", _md(sc), "",
                  f"At `{str(prov.get('git_sha', '?'))[:7]}`; "
                  f"{_methods_legend(_methods_of(folder))} (`kernels/bench/timing.py`); "
                  "host: µs of host time per eager call.", ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default="results")
    ap.add_argument("--gpus", nargs="+", default=["nvidia-h200", "nvidia-h100-80gb-hbm3"])
    ap.add_argument("--update", action="store_true",
                    help="rewrite the generated block of --doc with the tables")
    ap.add_argument("--doc", default="docs/results.md")
    a = ap.parse_args(argv)
    text = render(Path(a.results), a.gpus)
    print(text)
    if a.update:
        doc = Path(a.doc)
        s = doc.read_text()
        if BEGIN not in s or END not in s:
            raise SystemExit(f"{doc} has no {BEGIN} ... {END} block")
        s = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END),
                   lambda _: f"{BEGIN}\n{text}\n{END}", s, flags=re.S)
        doc.write_text(s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
