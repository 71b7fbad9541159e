"""Notebook 01, section 9 — replay decode: a checkpoint written back every ``L`` tokens.

The standard decode reads and writes each sequence's whole state per step (its floor:
read + write at copy bandwidth). :func:`kernels.decode.gdn_replay_decode` reads a
checkpoint and a ring of the last ``n <= L`` tokens' residuals and writes the checkpoint
back only when the ring is full, so its floor per token is read + write / ``L`` plus the
ring; speculative verification rolls back by dropping ring entries instead of storing a
state per token. Four kinds of call, each at every B and state dtype:

- ``standard``: :func:`kernels.decode.gdn_decode`, one token, state updated in place;
- ``replay``: the replay decode, one token, at each ``L`` of ``replay_L``;
- ``standard_spec``: ``gdn_decode`` verifying ``T = 4`` tokens with the intermediate
  states returned (what a speculative engine rolls back to; reading the accepted one
  afterwards is not timed);
- ``replay_spec``: the replay decode verifying ``T = 4`` tokens, each call rolling back
  the drafts the previous one rejected (``rollback``), accepting ``replay_accept[c]`` of
  them in call ``c`` (cycled).

**Gate first**: each kind runs ``replay_calls`` consecutive calls on fresh inputs, and
every call is checked (contest rule) against its float32 reference on the state the
kernel left before it (``decode_reference``, ``replay_decode_reference``): outputs, the
state or checkpoint it leaves, the ring. Only passing kinds are timed: one sample is ``replay_calls`` consecutive calls (with
``graph``: captured once, replayed; the ring advances on the device, so the sample
averages over whole write-back cycles), divided by the tokens they generate.
``floor_us`` is each contract's bytes per generated token (:func:`bytes_per_token`) at the
copy bandwidth of this run. :func:`run_replay_drift` runs ``max(drift_steps)`` one-token
steps of the standard and the replay decode against the float32 multi-step reference and
reports the outputs' error and the written-back state's (the checkpoint against the
reference state as of the same token).
"""
from __future__ import annotations

import functools
from typing import Dict, List

import numpy as np
import pandas as pd

from kernels.bench.gate import FAIL, PASS
from kernels.bench.timing import CPU_WALL, method_available, time_each
from kernels.report import replay_target

from .common import (Param, Run, batch_axis, figure_legend, fmt_us, fmt_x, new_figure, progress,
                     unique_in_order)
from .decode_serving import timing_title

SPEC_T = 4
KINDS = ("standard", "replay", "standard_spec", "replay_spec")
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
PARAMS = (
    Param("replay_L", "list", [1, 2, 4, 8, 16],
          "replay: ring lengths L (the checkpoint is written back every L tokens)"),
    Param("replay_batch_sizes", "list", [1, 8, 32, 64, 128, 512], "replay: batch sizes B"),
    Param("replay_state_dtype", "list", ["float32", "bfloat16"],
          "replay: checkpoint (state) dtypes"),
    Param("replay_accept", "list", [1, 3, 2, 2],
          "replay: tokens accepted of each 4-token verification, cycled (mean 2, half)"),
    Param("replay_calls", "int", 16,
          "replay: consecutive calls per gate and timed sample (a multiple of every L and of "
          "len(replay_accept))"),
    Param("replay_method", "str", "graph", "replay: timing method"),
    Param("replay_repetitions", "int", 30, "replay: timed samples per point"),
    Param("replay_config", "str", "auto",
          "replay: decode config of every call (auto: each kind's default, the standard "
          "step config_for(B), the replay replay_config_for)"),
)
GATE_COLUMNS = ["kind", "label", "L", "T", "B", "state_dtype", "status", "reason",
                "max_abs_err", "rel_l2_err", "gpu"]
TIME_COLUMNS = ["kind", "label", "L", "T", "B", "state_dtype", "config", "method",
                "us_per_token", "p20_us", "p80_us", "bytes_per_token", "floor_us",
                "frac_of_floor", "tokens_per_sample", "n", "gpu"]
DRIFT_COLUMNS = ["label", "L", "state_dtype", "step", "what", "max_abs_err", "rel_l2_err",
                 "gpu"]


def _dtype(name: str):
    import torch

    try:
        return getattr(torch, DTYPES[str(name)])
    except KeyError:
        raise ValueError(f"replay_state_dtype values must be float32 or bfloat16, "
                         f"got {name!r}") from None


def _label(kind: str, L) -> str:
    return {"standard": "standard", "replay": f"replay L={L}",
            "standard_spec": f"standard T={SPEC_T} +states",
            "replay_spec": f"replay T={SPEC_T} L={L}"}[kind]


def check_params(p: dict) -> None:
    """ValueError naming the parameter for a replay setting that cannot run."""
    Ls = [int(x) for x in p["replay_L"]]
    K, acc = int(p["replay_calls"]), [int(a) for a in p["replay_accept"]]
    if not Ls or min(Ls) < 1:
        raise ValueError(f"replay_L must be ints >= 1, got {p['replay_L']}")
    if not acc or min(acc) < 1 or max(acc) > SPEC_T:
        raise ValueError(f"replay_accept must be ints in 1..{SPEC_T}, got {p['replay_accept']}")
    if K < 1 or any(K % L for L in Ls) or K % len(acc):
        raise ValueError(f"replay_calls must be a multiple of every L ({Ls}) and of "
                         f"len(replay_accept)={len(acc)}, got {K}")
    for d in p["replay_state_dtype"]:
        _dtype(d)


def _cases(p: dict) -> List[tuple]:
    out = []
    for kind in KINDS:
        for L in ([int(x) for x in p["replay_L"]] if kind.startswith("replay") else [0]):
            out.append((kind, L))
    return out


# --------------------------------------------------------------------------- bytes


def _replay_calls_bytes(B, shape, dtype, L, T, accept, calls) -> tuple:
    """(bytes, tokens generated) of ``calls`` replay calls in steady state (the ring's
    header simulated on the host, after one warm-up pass over the pattern)."""
    from kernels.decode import replay_state_bytes

    mt = max(T, 4)
    nmax = max(L, mt)
    n, back, total, gen = 0, 0, 0.0, 0
    warm = len(accept) * max(L, 1) * 4
    for c in range(warm + calls):
        n -= back
        flush = n + T > L
        if c >= warm:
            total += replay_state_bytes(B, shape.num_q_heads, shape.num_v_heads,
                                        shape.head_dim, state_dtype=dtype, n=n, T=T,
                                        flush=flush)
            gen += accept[c % len(accept)] if T > 1 else 1
        n = T if flush else n + T
        assert n <= nmax
        back = T - accept[c % len(accept)] if T > 1 else 0
    return total, gen


def bytes_per_token(kind: str, B: int, shape, dtype, L: int, accept, calls: int) -> float:
    """Bytes the contract of ``kind`` moves per generated token: the standard step reads
    and writes the state (``standard_spec`` also writes ``T`` intermediate states, per
    accepted token); the replay reads its checkpoint, writes it every ``L`` tokens and
    reads/writes ring entries (:func:`kernels.decode.replay_state_bytes`)."""
    from kernels.spec import decode_state_bytes

    full = decode_state_bytes(B, shape, dtype)        # read + write
    if kind == "standard":
        return float(full)
    if kind == "standard_spec":
        return (full + full / 2 * SPEC_T) / float(np.mean(accept))
    T = SPEC_T if kind == "replay_spec" else 1
    total, gen = _replay_calls_bytes(B, shape, dtype, L, T, list(accept), calls)
    return total / gen


# --------------------------------------------------------------------------- gate + time


def _config(run: Run, B: int, replay: bool):
    """The config of a kind at ``B``: ``replay_config`` by name, or with ``auto`` what each
    call picks by default (the standard step its table's config, the replay
    :func:`kernels.decode.replay.replay_config_for`)."""
    from kernels.decode import DecodeConfig, config_for
    from kernels.decode.replay import replay_config_for

    name = str(run.params["replay_config"])
    if name != "auto":
        return DecodeConfig.from_name(name)
    d, hv = run.params["head_dim"], run.params["num_v_heads"]
    return replay_config_for(B, d, hv, run.device) if replay else config_for(B).fit(d)


class _Case:
    """One kind at one (B, dtype, L): its inputs, state, ring and the call sequence."""

    def __init__(self, run: Run, kind: str, B: int, dname: str, L: int, data: dict):
        import torch

        from kernels.decode import ReplayRing, gdn_decode, gdn_replay_decode

        p, shape = run.params, run.state["shape"]
        self.kind, self.B, self.L = kind, B, L
        self.K = int(p["replay_calls"])
        self.accept = [int(a) for a in p["replay_accept"]]
        self.T = SPEC_T if kind.endswith("spec") else 1
        self.cfg = _config(run, B, kind.startswith("replay"))
        self.steps = data["steps_spec"] if self.T > 1 else data["steps"]
        self.state = data["state0"].to(_dtype(dname), copy=True)
        self.ring = (ReplayRing.empty(B, shape.num_q_heads, shape.num_v_heads, shape.head_dim,
                                      L, device=run.device)
                     if kind.startswith("replay") else None)
        dev = run.device
        # rollback of call c: the drafts call c-1 rejected (the pattern's last before c=0)
        self.rollbacks = [torch.full((B,), self.T - self.accept[(c - 1) % len(self.accept)],
                                     dtype=torch.int32, device=dev) for c in range(self.K)]
        if kind == "standard":
            self.call = functools.partial(gdn_decode, inplace=True, config=self.cfg)
        elif kind == "standard_spec":
            self.call = functools.partial(gdn_decode, inplace=True, config=self.cfg,
                                          intermediate_states=True)
        else:
            self.call = functools.partial(gdn_replay_decode, ring=self.ring, config=self.cfg)

    def run_call(self, c: int):
        kw = dict(self.steps[c % len(self.steps)], state=self.state)
        if self.kind == "replay_spec" and c > 0:   # the first call has nothing to roll back
            kw["rollback"] = self.rollbacks[c % self.K]
        return self.call(**kw)

    def timed(self):
        """The sample: ``K`` consecutive calls (the ring keeps rolling back each call's
        rejected drafts; the standard ones rewrite their state)."""
        def fn():
            for c in range(self.K):
                kw = dict(self.steps[c], state=self.state)
                if self.kind == "replay_spec":
                    kw["rollback"] = self.rollbacks[c]
                self.call(**kw)
        return fn

    @property
    def tokens_per_sample(self) -> int:
        return self.K if self.T == 1 else sum(self.accept[c % len(self.accept)]
                                              for c in range(self.K))


def _gate(case: _Case, data: dict) -> dict:
    """Run the case's ``K`` calls from its fresh state; each call against its float32
    reference on the state (and ring) the kernel left before it: ``decode_reference``
    for the standard kinds, ``replay_decode_reference`` for the replay ones. Every call's
    outputs, the state it leaves (the replay's checkpoint) and the replay's ring
    residuals pass the contest rule, the ring's other fields are equal. Per call, so a
    bf16 state's rounding is the contract's own, not an error that accumulates."""
    import torch

    from kernels.checks import check_close
    from kernels.reference import decode_reference, replay_decode_reference

    worst = dict(max_abs_err=0.0, rel_l2_err=0.0)
    for c in range(case.K):
        state0 = case.state.clone()
        ring0 = case.ring.clone() if case.ring is not None else None
        res = case.run_call(c)
        kw = dict(case.steps[c], state=state0)
        if case.ring is None:
            want = decode_reference(**kw, intermediate_states=case.T > 1)
            checks = [(res[0], want[0], "output"), (case.state, want[1], "state")]
        else:
            back = case.rollbacks[c] if case.kind == "replay_spec" and c > 0 else None
            want = replay_decode_reference(**kw, ring=ring0, rollback=back)
            checks = [(res[0], want[0], "output"), (case.state, want[1], "checkpoint"),
                      (case.ring.u, want[2].u, "ring.u")]
            same = (torch.equal(case.ring.head, want[2].head)
                    and torch.equal(case.ring.k, want[2].k)
                    and torch.equal(case.ring.count, want[2].count)
                    and bool(torch.allclose(case.ring.g, want[2].g, rtol=1e-5, atol=1e-6)))
            if not same:
                return dict(status=FAIL, reason=f"call {c}: ring header, keys or log decays "
                            f"differ from the reference", **worst)
        for got, ref, name in checks:
            r = check_close(got.float(), ref.float(), name=name)
            worst = dict(max_abs_err=max(worst["max_abs_err"], r.max_abs_err),
                         rel_l2_err=max(worst["rel_l2_err"], r.rel_l2_err))
            if not r.ok:
                return dict(status=FAIL, reason=f"call {c}: {r.reason}", **worst)
        if case.kind == "standard_spec":   # the engine continues from the accepted state
            case.state.copy_(res[2][:, case.accept[c % len(case.accept)] - 1])
    return dict(status=PASS, reason="", **worst)


def _data(run: Run, B: int) -> dict:
    """Inputs for ``replay_calls`` one-token calls and as many T=4 calls."""
    from kernels.spec import make_decode_inputs

    p, shape = run.params, run.state["shape"]
    K = int(p["replay_calls"])
    one = make_decode_inputs(B, shape, seed=p["seed"], device=run.device, tokens=K)
    spec = make_decode_inputs(B, shape, seed=p["seed"] + 1, device=run.device,
                              tokens=K * SPEC_T)

    def cut(x, t0, t1):
        return dict({n: x[n][:, t0:t1].contiguous() for n in ("q", "k", "v", "a", "b")},
                    A_log=x["A_log"], dt_bias=x["dt_bias"])

    return dict(state0=one["state"], steps=[cut(one, c, c + 1) for c in range(K)],
                steps_spec=[cut(spec, c * SPEC_T, (c + 1) * SPEC_T) for c in range(K)])


def run_replay(run: Run, copy_bw: float) -> Dict[str, pd.DataFrame]:
    """Gate every kind at every B, state dtype and L; time the passing ones with
    ``replay_method``. Returns ``{"gate": replay_gate, "times": replay_times}`` (CSVs)."""
    p = run.params
    check_params(p)
    shape = run.state["shape"]
    method = p["replay_method"]
    ok, why = method_available(method, run.device)
    if not ok:
        run.skip(f"replay timing with {method}", why)
    cases = _cases(p)
    dnames = unique_in_order(DTYPES.get(str(d), str(d)) for d in p["replay_state_dtype"])
    gate_rows, time_rows = [], []
    for B in progress([int(b) for b in p["replay_batch_sizes"]],
                      f"replay: gate + timing of {len(cases) * len(dnames)} cases per B "
                      f"({method})", "B"):
        data = _data(run, B)
        for dname in dnames:
            for kind, L in cases:
                case = _Case(run, kind, B, dname, L, data)
                base = dict(kind=kind, label=_label(kind, L), L=L, T=case.T, B=B,
                            state_dtype=dname, gpu=run.gpu)
                try:
                    row = _gate(case, data)
                except Exception as e:   # reported, not timed
                    row = dict(status="error", reason=f"{type(e).__name__}: {e}"[:300])
                gate_rows.append(dict(base, **row))
                if row["status"] != PASS:
                    print(f"REPLAY GATE {row['status'].upper()}: {base['label']} {dname} "
                          f"B={B}: {row['reason']}")
                    continue
                if not ok:
                    continue
                nbytes = bytes_per_token(kind, B, shape, _dtype(dname), L, case.accept,
                                         case.K)
                floor = nbytes / copy_bw * 1e6 if np.isfinite(copy_bw) and copy_bw > 0 \
                    else float("nan")
                timings = time_each(case.timed(), [method], rep=int(p["replay_repetitions"]),
                                    warmup=int(p["warmup"]))
                per = case.tokens_per_sample
                for t in run.timed_rows(timings, f"replay {base['label']} {dname} B={B}",
                                        dict(base, config=case.cfg.name)):
                    time_rows.append(dict(
                        t, us_per_token=t["median_us"] / per, p20_us=t["p20_us"] / per,
                        p80_us=t["p80_us"] / per, bytes_per_token=nbytes, floor_us=floor,
                        tokens_per_sample=per))
                del case
    gate = pd.DataFrame(gate_rows, columns=GATE_COLUMNS)
    times = pd.DataFrame(time_rows, columns=TIME_COLUMNS)
    times["frac_of_floor"] = times.floor_us / times.us_per_token
    run.write_csv(gate, "replay_gate")
    if len(times):
        run.write_csv(times, "replay_times")
    return dict(gate=gate, times=times)


def replay_gate_summary(gate: pd.DataFrame) -> pd.DataFrame:
    """One row per (kind, L, dtype), one column per B: the gate status."""
    if gate is None or gate.empty:
        return pd.DataFrame()
    g = gate.assign(case=gate.label + " " + gate.state_dtype)
    return g.pivot_table(index="case", columns="B", values="status", aggfunc="first",
                         sort=False)


def replay_table(times: pd.DataFrame, spec: bool = False) -> pd.DataFrame:
    """µs per generated token: one row per (B, dtype), one column per label."""
    if times is None or times.empty:
        return pd.DataFrame()
    t = times[times["T"] > 1] if spec else times[times["T"] == 1]
    if t.empty:
        return pd.DataFrame()
    out = t.pivot_table(index=["state_dtype", "B"], columns="label", values="us_per_token",
                        sort=False)
    return out[unique_in_order(t.label)]


# --------------------------------------------------------------------------- drift


def run_replay_drift(run: Run) -> pd.DataFrame:
    """``max(drift_steps)`` one-token calls of the standard decode (in place) and of the
    replay decode at each ``L``, per state dtype, against the float32 multi-step
    reference: that step's output, and the state written back (the standard's state; the
    replay's checkpoint, against the reference state as of the token it holds)."""
    from kernels.checks import check_close
    from kernels.decode import ReplayRing, gdn_decode, gdn_replay_decode
    from kernels.reference import decode_steps_reference
    from kernels.spec import make_decode_inputs

    p, shape = run.params, run.state["shape"]
    check_params(p)
    steps = sorted({int(s) for s in p["drift_steps"]})
    N, B = steps[-1], int(p["drift_batch"])
    base = make_decode_inputs(B, shape, seed=p["seed"], device=run.device, tokens=N)
    back = max(int(x) for x in p["replay_L"])     # the checkpoint is at most L tokens behind
    need = {s - j for s in steps for j in range(back + 1) if s - j >= 1}
    ref_out, _, ref_states = decode_steps_reference(**base, record_steps=sorted(need))
    cfg_std, cfg_rep = _config(run, B, False), _config(run, B, True)
    rows = []
    dnames = unique_in_order(DTYPES.get(str(d), str(d)) for d in p["replay_state_dtype"])
    variants = [("standard", 0)] + [("replay", int(L)) for L in p["replay_L"]]
    for dname in dnames:
        for kind, L in variants:
            state = base["state"].to(_dtype(dname), copy=True)
            ring = (ReplayRing.empty(B, shape.num_q_heads, shape.num_v_heads, shape.head_dim,
                                     L, device=run.device) if kind == "replay" else None)
            for t in progress(range(N), f"replay drift: {_label(kind, L)}, {dname}", "step"):
                step = {n: (x[:, t:t + 1].contiguous() if n in ("q", "k", "v", "a", "b")
                            else x) for n, x in base.items() if n != "state"}
                if ring is None:
                    out, _ = gdn_decode(**step, state=state, inplace=True, config=cfg_std)
                else:
                    out, _ = gdn_replay_decode(**step, state=state, ring=ring, config=cfg_rep)
                if t + 1 not in steps:
                    continue
                behind = t + 1 - (int(ring.head[0, 1]) if ring is not None else 0)
                want = ref_states[behind] if behind else base["state"].float()
                for what, got, ref in (("output", out[:, 0].float(), ref_out[:, t]),
                                       ("state written back", state.float(), want)):
                    r = check_close(got, ref, name=what)
                    rows.append(dict(label=_label(kind, L), L=L, state_dtype=dname, step=t + 1,
                                     what=what, max_abs_err=r.max_abs_err,
                                     rel_l2_err=r.rel_l2_err, gpu=run.gpu))
    drift = pd.DataFrame(rows, columns=DRIFT_COLUMNS)
    run.write_csv(drift, "replay_drift")
    return drift


def replay_drift_table(drift: pd.DataFrame) -> pd.DataFrame:
    """Max abs error at the last step: rows (dtype, label), columns output / state."""
    if drift is None or drift.empty:
        return pd.DataFrame()
    last = drift[drift.step == drift.step.max()]
    return last.pivot_table(index=["state_dtype", "label"], columns="what",
                            values="max_abs_err", sort=False)


# --------------------------------------------------------------------------- figures


def plot_replay_times(times: pd.DataFrame, spec: bool = False, accept=()):
    """µs per generated token vs B (standard and each L; fp32 solid, bf16 dashed) and
    replay / standard per L; ``accept``: the acceptance pattern (for the title)."""
    if times is None or times.empty:
        return None
    t = times[times["T"] > 1] if spec else times[times["T"] == 1]
    if t.empty:
        return None
    std_kind = "standard_spec" if spec else "standard"
    fig, axes = new_figure(1, 2, panel=(5.6, 4.2))
    ax, ar = axes[0]
    Bs = sorted(t.B.unique())
    colors = {}
    for (label, dname), g in t.groupby(["label", "state_dtype"], sort=False):
        g = g.sort_values("B")
        kw = dict(ls="-" if dname == "float32" else "--", marker="o", ms=3)
        if label in colors:
            kw["color"] = colors[label]
        line, = ax.plot(g.B, g.us_per_token, label=f"{label}, {dname}", **kw)
        colors.setdefault(label, line.get_color())
        ax.fill_between(g.B, g.p20_us, g.p80_us, color=line.get_color(), alpha=0.12)
    batch_axis(ax, Bs)
    ax.set_yscale("log")
    ax.set_ylabel("µs per generated token")
    ax.set_title("time per generated token" + (f" (T={SPEC_T} verification)" if spec else ""),
                 fontsize=9)
    vals = []
    for dname, d in t.groupby("state_dtype", sort=False):
        std = d[d.kind == std_kind].set_index("B").us_per_token
        for label, g in d[d.kind != std_kind].groupby("label", sort=False):
            r = (g.set_index("B").us_per_token / std).dropna().sort_index()
            if len(r):
                ar.plot(r.index, r.values, marker="o", ms=3, color=colors.get(label),
                        ls="-" if dname == "float32" else "--", label=f"{label}, {dname}")
                vals += list(r.values)
    batch_axis(ar, Bs)
    ar.axhline(1.0, color="k", lw=0.8)
    target = replay_target("replay_spec" if spec else "replay", 64)
    ar.axhline(target, color="k", lw=0.8, ls=":")
    ar.text(0.02, target, f"target {target}×", transform=ar.get_yaxis_transform(), fontsize=7,
            va="bottom")
    ar.set_ylabel(f"replay / {_label(std_kind, 0)} (per token)")
    ar.set_title("replay against the standard call (<1: replay faster)", fontsize=9)
    figure_legend(fig, axes)   # outside: a dozen lines, no room inside the panels
    what = (f"speculative verification, T={SPEC_T}, accepted "
            f"{'/'.join(str(a) for a in accept)} per call") if spec else "one token per call"
    fig.suptitle(f"GDN replay decode vs standard, {what} — {timing_title(t)}", fontsize=10)
    return fig


def _legend_below(ax) -> None:
    ax.legend(fontsize=6, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))


def plot_replay_bytes(times: pd.DataFrame):
    """Bytes per generated token of each contract (relative to the standard step's read +
    write) vs L, and the achieved fraction of each contract's floor vs B."""
    if times is None or times.empty:
        return None
    fig, axes = new_figure(1, 2, panel=(5.6, 4.0))
    ax, af = axes[0]
    std = times[times.kind == "standard"].set_index(["B", "state_dtype"]).bytes_per_token
    r = times.join(std.rename("std_bytes"), on=["B", "state_dtype"])
    B0 = int(r.B.max())
    sel = r[(r.B == B0) & r.kind.str.startswith("replay")]
    for (kind, dname), g in sel.groupby(["kind", "state_dtype"], sort=False):
        g = g.drop_duplicates("L").sort_values("L")
        ax.plot(g.L, g.bytes_per_token / g.std_bytes, marker="o", ms=3,
                ls="-" if dname == "float32" else "--", label=f"{kind}, {dname}")
    drawn = set()   # one grey line per ratio: the dtypes' relative ratios nearly coincide
    for (kind, dname), g in r[(r.B == B0) & r.kind.str.startswith("standard")].groupby(
            ["kind", "state_dtype"], sort=False):
        y = float((g.bytes_per_token / g.std_bytes).iloc[0])
        if round(y, 2) not in drawn:
            drawn.add(round(y, 2))
            ax.axhline(y, lw=0.8, ls="-" if dname == "float32" else "--", color="grey")
    ax.set_xscale("log", base=2)
    Ls = sorted(int(x) for x in sel.L.unique()) if len(sel) else []
    if Ls:
        ax.set_xticks(Ls, [str(x) for x in Ls])
    ax.minorticks_off()
    ax.set_xlabel("ring length L")
    ax.set_ylabel("bytes per generated token / standard step's")
    ax.set_title(f"each contract's bytes per token (B={B0}; grey: standard, T=1 and "
                 f"T={SPEC_T} +states)", fontsize=8)
    _legend_below(ax)
    for (label, dname), g in times.groupby(["label", "state_dtype"], sort=False):
        g = g.sort_values("B")
        af.plot(g.B, g.frac_of_floor, marker="o", ms=3,
                ls="-" if dname == "float32" else "--", label=f"{label}, {dname}")
    batch_axis(af, sorted(times.B.unique()))
    af.set_ylabel("own floor / measured time")
    af.set_title("fraction of each contract's floor (copy bandwidth)", fontsize=9)
    _legend_below(af)
    fig.suptitle(f"GDN replay decode: bytes per token and floors — {timing_title(times)}",
                 fontsize=10)
    return fig


def plot_replay_drift(drift: pd.DataFrame):
    """Max abs error vs consecutive steps: outputs and the state written back."""
    if drift is None or drift.empty:
        return None
    whats = unique_in_order(drift.what)
    fig, axes = new_figure(1, len(whats), panel=(5.4, 3.8))
    for ax, what in zip(axes[0], whats):
        for (label, dname), g in drift[drift.what == what].groupby(["label", "state_dtype"],
                                                                   sort=False):
            g = g.sort_values("step")
            ax.plot(g.step, g.max_abs_err.clip(lower=1e-12), marker="o", ms=3,
                    ls="-" if dname == "float32" else "--", label=f"{label}, {dname}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        st = sorted(drift.step.unique())
        ax.set_xticks(st, [str(s) for s in st])
        ax.minorticks_off()
        ax.axhline(1e-2, color="k", lw=0.8, ls=":")
        ax.set_xlabel("consecutive one-token calls")
        ax.set_ylabel("max abs error vs float32 reference")
        ax.set_title(what, fontsize=9)
    figure_legend(fig, axes)
    gpu = str(drift.gpu.iloc[0])
    fig.suptitle(f"GDN replay decode: drift against the float32 reference — {gpu} "
                 "(errors, not timings; dotted: contest atol 1e-2)", fontsize=10)
    return fig


# --------------------------------------------------------------------------- conclusion


def _best(times, kind_prefix, B, dname):
    t = times[(times.B == B) & (times.state_dtype == dname)
              & times.kind.str.startswith(kind_prefix)]
    return t.loc[t.us_per_token.idxmin()] if len(t) else None


def replay_markdown(times: pd.DataFrame, gate: pd.DataFrame, drift: pd.DataFrame) -> str:
    """The replay paragraphs of the conclusion, from the tables (targets: the best L at
    B = 64 and 512 ≤ 0.65 × the standard step and no slower at B = 1; speculative T=4
    ≤ 0.6 × the standard T=4 call with intermediate states; drift no worse)."""
    lines = []
    if gate is not None and len(gate):
        bad = gate[gate.status != PASS]
        lines.append(f"**Replay gate:** {len(gate)} cases; " + (
            "all passed." if bad.empty else "failing (not timed): " + "; ".join(
                f"{r.label} {r.state_dtype} B={r.B} ({r.status}: {r.reason})"
                for r in bad.head(8).itertuples()) + "."))
    if times is not None and len(times):
        method = str(times.method.iloc[0])
        items = []
        Bs = sorted(int(b) for b in times.B.unique())
        for dname in unique_in_order(times.state_dtype):
            for B in unique_in_order([Bs[0], *(b for b in (64, 512) if b in Bs)]):
                for std_kind, rk in (("standard", "replay"), ("standard_spec", "replay_spec")):
                    target = replay_target(rk, B)
                    s = times[(times.B == B) & (times.state_dtype == dname)
                              & (times.kind == std_kind)]
                    best = _best(times[times.kind == rk], rk, B, dname)
                    if s.empty or best is None:
                        continue
                    s0 = float(s.us_per_token.iloc[0])
                    ratio = best.us_per_token / s0
                    verdict = ("" if method == CPU_WALL else
                               f"; target ≤ {target}× → {'met' if ratio <= target else 'missed'}"
                               f"; at {best.frac_of_floor:.0%} of its own floor")
                    items.append(
                        f"{dname}, B={B}, {'T=4 spec' if rk == 'replay_spec' else 'T=1'}: "
                        f"best {best.label} {fmt_us(best.us_per_token)} per token vs "
                        f"{fmt_us(s0)} ({fmt_x(ratio)}{verdict}; "
                        f"{best.bytes_per_token / 1e6:.3g} MB per token)")
        if items:
            note = (" — interpreter wall time: plumbing only, no verdict on the targets"
                    if method == CPU_WALL else "")
            lines.append(f"**Replay decode ({method}, per generated token{note}):**\n"
                         + "\n".join(f"- {i}" for i in items))
    if drift is not None and len(drift):
        last = int(drift.step.max())
        parts = []
        for (dname, what), g in drift[drift.step == last].groupby(["state_dtype", "what"],
                                                                  sort=False):
            std = g[g.label == "standard"].max_abs_err
            rep = g[g.label != "standard"].max_abs_err
            if len(std) and len(rep):
                parts.append(f"{dname} {what}: standard {float(std.iloc[0]):.2e}, replay "
                             f"{float(rep.min()):.2e}–{float(rep.max()):.2e}")
        if parts:
            lines.append(f"**Replay drift after {last} steps** (max abs error vs the float32 "
                         "reference): " + "; ".join(parts) + ".")
    return "\n\n".join(lines)
