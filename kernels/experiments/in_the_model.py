"""Notebook 06 — ours inside Qwen3-Next: one Gated DeltaNet layer and one decoder block of
transformers' Qwen3-Next (the contest's per-GPU shape: 4 key heads, 8 value heads, head size
128; the rest of Qwen3-Next-80B-A3B's published config; random weights, seeded), run with
each implementation of its two GDN functions bound by :func:`kernels.model.hf.use`:

* ``ours`` (:mod:`kernels.model.fla_compat`), ``fla`` (FLA's functions, what transformers
  binds where FLA is installed), ``torch`` (the layer's own torch path, the reference).

Sections: (1) **gate** — the layer's output and the GDN call's final state of ``ours`` and
``fla`` against the torch path (the contest rule, :func:`kernels.checks.check_outputs`) at
``gate_T`` tokens; the GDN call's arguments are captured from the layer itself. (2)
**prefill** — the GDN layer and the decoder block (GDN layer, its norms and the sparse MoE
as transformers runs them) at each length: time per implementation with ``methods``
(``graph``: GPU time where the call can be captured; ``event`` where it cannot; ``host``:
host time of an eager call), and the GDN call's share of the block (the GDN function alone
on the captured arguments against the block, same method). (3) **decode** — one cached
token through the block at each batch size, the same methods. Only what passed the gate is
timed; a method that cannot time a call (a capture that fails) is skipped with its reason.
"""
from __future__ import annotations

from typing import Dict

import pandas as pd

from kernels.bench.gate import short_reason

from .common import (COMMON_PARAMS, Param, Run, collect_params as _collect, figure_legend,
                     fmt_us, new_figure, progress, start_run)

STEM = "06_in_the_model"
IMPLS = ("ours", "fla", "torch")

PARAMS = COMMON_PARAMS + (
    Param("impls", "list", list(IMPLS), "ours, fla (FLA's functions), torch (the layer's own path)"),
    Param("num_k_heads", "int", 4, "GDN key heads (Qwen3-Next-80B-A3B's 16 at TP4)"),
    Param("num_v_heads", "int", 8, "GDN value heads (32 at TP4)"),
    Param("head_dim", "int", 128, "GDN key and value head size"),
    Param("hidden_size", "int", 2048, "the model's hidden size (published)"),
    Param("num_experts", "int", 512, "MoE experts (published)"),
    Param("num_experts_per_tok", "int", 10, "experts per token (published)"),
    Param("moe_intermediate_size", "int", 512, "expert MLP width (published)"),
    Param("gate_T", "int", 512, "tokens of the gate's prefill"),
    Param("prefill_lengths", "list", [512, 2048, 8192, 32768, 131072], "tokens of one prompt"),
    Param("torch_max_T", "int", 8192, "the torch path is timed up to this length"),
    Param("decode_batch_sizes", "list", [1, 4, 16, 64, 256], "sequences of a decode step"),
    Param("decode_context", "int", 64, "tokens prefilled per sequence before the decode steps"),
    Param("methods", "list", ["graph", "event", "host"], "timing methods (kernels/bench/timing.py)"),
    Param("repetitions", "int", 10, "timed calls per point"),
    Param("warmup", "int", 2, "untimed calls first (compilation, FLA's autotuning)"),
    Param("seed", "int", 0, "seed of the weights and inputs"),
)

GATE_COLUMNS = ["impl", "what", "status", "max_abs_err", "rel_l2_err", "reason"]
TIMES_COLUMNS = ["impl", "part", "T", "B", "method", "median_us", "p20_us", "p80_us", "n"]


def collect_params(namespace: dict) -> dict:
    """This notebook's parameters from ``namespace`` (the notebook's ``globals()``)."""
    return _collect(namespace, PARAMS, STEM)


def start(params: dict) -> Run:
    """Open the run; build the config, the GDN layer and the decoder block (bf16, seeded)."""
    run = start_run(STEM, params)
    import torch
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    p = run.params
    cfg = Qwen3NextConfig(
        hidden_size=p["hidden_size"], linear_num_key_heads=p["num_k_heads"],
        linear_num_value_heads=p["num_v_heads"], linear_key_head_dim=p["head_dim"],
        linear_value_head_dim=p["head_dim"], num_experts=p["num_experts"],
        num_experts_per_tok=p["num_experts_per_tok"],
        moe_intermediate_size=p["moe_intermediate_size"],
        shared_expert_intermediate_size=p["moe_intermediate_size"],
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(p["seed"])
    block = Qwen3NextDecoderLayer(cfg, layer_idx=0).to(run.device, torch.bfloat16).eval()
    run.state.update(cfg=cfg, block=block, layer=block.linear_attn)
    run.extra_provenance["model"] = dict(
        config="Qwen3-Next-80B-A3B (published) at TP4 GDN heads", gdn_heads=(
            p["num_k_heads"], p["num_v_heads"], p["head_dim"]), hidden=p["hidden_size"],
        experts=(p["num_experts"], p["num_experts_per_tok"], p["moe_intermediate_size"]))
    return run


def _hidden(run: Run, B: int, T: int, seed: int):
    import torch

    g = torch.Generator(device=run.device).manual_seed(seed)
    return torch.randn(B, T, run.params["hidden_size"], generator=g, device=run.device,
                       dtype=torch.bfloat16)


#: The captured GDN call's keyword arguments the notebook passes on (the model's others
#: are transformers' own).
_CALL_KEYS = ("g", "beta", "initial_state", "use_qk_l2norm_in_kernel")


def _captured_call(run: Run, h):
    """The layer's GDN prefill call's arguments (captured from the torch path)."""
    from kernels.model import hf

    mod = __import__(type(run.state["layer"]).__module__, fromlist=["x"])
    seen = {}
    with hf.use(run.state["layer"], "torch"):
        torch_fn = mod.torch_chunk_gated_delta_rule

        def record(*a, **k):
            seen.update(args=a, kwargs=k)
            return torch_fn(*a, **k)

        mod.torch_chunk_gated_delta_rule = record
        run.state["layer"](h)
    return seen["args"], seen["kwargs"]


def _gdn_fn(impl: str):
    from kernels.model import fla_compat, hf

    if impl == "ours":
        return fla_compat.chunk_gated_delta_rule
    if impl == "fla":
        return hf._fla("torch_chunk_gated_delta_rule")
    import transformers.models.qwen3_next.modeling_qwen3_next as m
    return getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule)


def run_gate(run: Run) -> pd.DataFrame:
    """The layer's output and the GDN call's final state per implementation against the
    torch path → ``gate.csv``; the passing implementations in ``run.state["passed"]``."""
    import torch

    from kernels.checks import check_outputs
    from kernels.model import hf

    p = run.params
    h = _hidden(run, 1, p["gate_T"], p["seed"])
    args, kwargs = _captured_call(run, h)
    kwargs = {k: v for k, v in kwargs.items() if k in _CALL_KEYS}
    kwargs["output_final_state"] = True
    with torch.no_grad():
        with hf.use(run.state["layer"], "torch"):
            ref_layer = run.state["layer"](h)
        ref_gdn = _gdn_fn("torch")(*args, **kwargs)
    rows, passed = [], ["torch"]
    for impl in [i for i in p["impls"] if i != "torch"]:
        try:
            with torch.no_grad(), hf.use(run.state["layer"], impl):
                out = run.state["layer"](h)
                gdn = _gdn_fn(impl)(*args, **kwargs)
            res = check_outputs((out, gdn[0], gdn[1]), (ref_layer, ref_gdn[0], ref_gdn[1]),
                                names=("layer output", "gdn output", "final state"))
            rows.append(dict(impl=impl, what="layer output, gdn output, final state",
                             status="pass" if res.ok else "fail",
                             max_abs_err=res.max_abs_err, rel_l2_err=res.rel_l2_err,
                             reason=res.reason))
            if res.ok:
                passed.append(impl)
        except Exception as e:
            rows.append(dict(impl=impl, what="layer", status="error", max_abs_err=float("nan"),
                             rel_l2_err=float("nan"), reason=short_reason(e)))
    run.state["passed"] = [i for i in p["impls"] if i in passed]
    df = pd.DataFrame(rows, columns=GATE_COLUMNS)
    run.write_csv(df, "gate")
    return df


def _time(run: Run, fn, methods, base: dict, what: str) -> list:
    from kernels.bench.timing import time_each

    p = run.params
    return run.timed_rows(time_each(fn, methods, rep=p["repetitions"], warmup=p["warmup"]),
                          what, base)


def run_prefill(run: Run) -> pd.DataFrame:
    """Per length and passing implementation: the GDN call alone (captured arguments), the
    GDN layer and the decoder block → ``prefill_times.csv``."""
    import torch

    from kernels.model import hf

    p = run.params
    methods = run.usable_methods(p["methods"])
    rows = []
    for T in progress(p["prefill_lengths"], "prefill lengths", "length"):
        h = _hidden(run, 1, T, p["seed"] + T)
        args, kwargs = _captured_call(run, h)
        kwargs = {k: v for k, v in kwargs.items() if k in _CALL_KEYS}
        for impl in run.state["passed"]:
            if impl == "torch" and T > p["torch_max_T"]:
                continue
            gdn = _gdn_fn(impl)
            with torch.no_grad(), hf.use(run.state["layer"], impl):
                for part, fn in (("gdn call", lambda: gdn(*args, **kwargs)),
                                 ("gdn layer", lambda: run.state["layer"](h)),
                                 ("block", lambda: run.state["block"](h, position_embeddings=None))):
                    rows += _time(run, fn, methods, dict(impl=impl, part=part, T=T, B=1),
                                  f"prefill {impl} {part} T={T}")
    df = pd.DataFrame(rows).reindex(columns=TIMES_COLUMNS)
    run.write_csv(df, "prefill_times")
    return df


def run_decode(run: Run) -> pd.DataFrame:
    """Per batch size and passing implementation: one cached token through the block
    (``decode_context`` tokens prefilled first) → ``decode_times.csv``."""
    import torch
    from transformers import DynamicCache

    from kernels.model import hf

    p = run.params
    methods = run.usable_methods(p["methods"])
    rows = []
    for B in progress(p["decode_batch_sizes"], "decode batch sizes", "B"):
        for impl in run.state["passed"]:
            with torch.no_grad(), hf.use(run.state["block"], impl):
                cache = DynamicCache(config=run.state["cfg"])
                run.state["block"](_hidden(run, B, p["decode_context"], p["seed"]),
                                   position_embeddings=None, past_key_values=cache)
                x = _hidden(run, B, 1, p["seed"] + 1)
                rows += _time(run, lambda: run.state["block"](x, position_embeddings=None,
                                                         past_key_values=cache),
                              methods, dict(impl=impl, part="block decode step", T=1, B=B),
                              f"decode {impl} B={B}")
    df = pd.DataFrame(rows).reindex(columns=TIMES_COLUMNS)
    run.write_csv(df, "decode_times")
    return df


def gdn_share(prefill: pd.DataFrame) -> pd.DataFrame:
    """The GDN call's time over the block's, per implementation, length and method."""
    if prefill.empty:
        return pd.DataFrame(columns=["impl", "T", "method", "gdn_us", "block_us", "share"])
    t = prefill.pivot_table(index=["impl", "T", "method"], columns="part",
                            values="median_us").reset_index()
    if "gdn call" not in t or "block" not in t:
        return pd.DataFrame(columns=["impl", "T", "method", "gdn_us", "block_us", "share"])
    t = t.rename(columns={"gdn call": "gdn_us", "block": "block_us"})
    t["share"] = t["gdn_us"] / t["block_us"]
    return t[["impl", "T", "method", "gdn_us", "block_us", "share"]].dropna()


def _title(run: Run, what: str, method: str) -> str:
    p = run.params
    return (f"{what} — {run.gpu}; GDN HK={p['num_k_heads']} HV={p['num_v_heads']} "
            f"D={p['head_dim']}, MoE {p['num_experts']}x{p['num_experts_per_tok']}; "
            f"method {method}")


def plot_block_times(run: Run, df: pd.DataFrame, x: str, part: str, what: str):
    """Time of ``part`` vs ``x`` per implementation, one panel per method."""
    d = df[df["part"] == part]
    if d.empty:
        return None
    methods = list(dict.fromkeys(d["method"]))
    fig, axes = new_figure(1, len(methods))
    for ax, m in zip(axes[0], methods):
        for impl, g in d[d["method"] == m].groupby("impl", sort=False):
            g = g.sort_values(x)
            ax.plot(g[x], g["median_us"], marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel=x, ylabel="µs", title=m)
    figure_legend(fig, axes)
    fig.suptitle(_title(run, what, ", ".join(methods)))
    return fig


def plot_share(run: Run, share: pd.DataFrame):
    """The block's time split into the GDN call and the rest, stacked, per length and
    implementation (first GPU method of the run)."""
    if share.empty:
        return None
    m = share["method"].iloc[0]
    d = share[share["method"] == m].sort_values(["T", "impl"])
    fig, axes = new_figure(1, 1, panel=(9.0, 3.8))
    ax = axes[0][0]
    labels = [f"{int(r.T)}\n{r.impl}" for r in d.itertuples()]
    ax.bar(labels, d["gdn_us"], label="GDN call")
    ax.bar(labels, (d["block_us"] - d["gdn_us"]).clip(lower=0), bottom=d["gdn_us"],
           label="rest of the block (norms, projections, conv, MoE)")
    ax.set(ylabel="µs", yscale="log", xlabel="tokens / implementation")
    figure_legend(fig, axes)
    fig.suptitle(_title(run, "Decoder block prefill: the GDN call's share", m))
    return fig


def conclusion_markdown(dfs: Dict[str, pd.DataFrame]) -> str:
    """What the tables say, computed from them."""
    gate, prefill, decode, share = dfs["gate"], dfs["prefill"], dfs["decode"], dfs["share"]
    lines = ["### Conclusion", ""]
    for r in gate.itertuples():
        lines.append(f"- gate {r.impl}: {r.status} (max abs err {r.max_abs_err:.3g})"
                     + (f" — {r.reason}" if r.status != "pass" and r.reason else ""))
    for m in dict.fromkeys(prefill.get("method", [])):
        b = prefill[(prefill["method"] == m) & (prefill["part"] == "block")]
        for T, g in b.groupby("T"):
            t = dict(zip(g["impl"], g["median_us"]))
            if "ours" in t and "fla" in t:
                lines.append(f"- block prefill T={T} ({m}): ours {fmt_us(t['ours'])}, "
                             f"fla {fmt_us(t['fla'])} ({t['fla'] / t['ours']:.2f}x)")
    for r in share.itertuples():
        if r.impl == "ours":
            lines.append(f"- GDN share of the block, ours, T={r.T} ({r.method}): "
                         f"{100 * r.share:.0f} %")
    if not decode.empty:
        lines.append(f"- decode step of the block: {len(decode)} timed points "
                     f"(decode_times.csv)")
    return "\n".join(lines) + "\n"
