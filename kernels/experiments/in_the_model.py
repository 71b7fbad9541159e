"""Notebook 06 — ours inside Qwen3-Next: one Gated DeltaNet layer and one decoder block of
transformers' Qwen3-Next (the contest's per-GPU shape: 4 key heads, 8 value heads, head size
128; the rest of Qwen3-Next-80B-A3B's published config; random weights, seeded: every
matrix normal(0, initializer_range), :func:`_init_weights`), run with
each implementation of its two GDN functions bound by :func:`kernels.model.hf.use`:

* ``ours`` (:mod:`kernels.model.fla_compat`), ``fla`` (FLA's functions, what transformers
  binds where FLA is installed), ``flashqla`` (FlashQLA's prefill, FLA's decode call; only
  where ``flash_qla`` imports in this process, else skipped with the reason), ``torch``
  (the layer's own torch path, the reference).

Sections: (1) **gate** — the layer's output and the GDN call's final state of each
implementation against the torch path (the contest rule, :func:`kernels.checks.check_outputs`)
at ``gate_T`` tokens; the GDN call's arguments are captured from the layer itself. (2)
**prefill** — the GDN layer and the decoder block (GDN layer, its norms and the sparse MoE
as transformers runs them, its experts by ``experts_implementation``) at each length: time per implementation with ``methods`` (the
layer) and ``block_methods`` (the block) (``graph``: GPU time where the call can be captured;
``event`` where it cannot, e.g. an MoE that synchronises; ``host``: host time of an eager
call). (3) **the
GDN share** — torch.profiler over ``profile_calls`` eager calls of the block (prefill at
each of ``share_lengths``, decode step at each of ``share_batch_sizes``): device time summed by kernel, a kernel counted
as GDN when its launch lies inside the ``record_function`` range :data:`GDN_RANGE` around the
GDN function call (the same attribution for every implementation, the torch path's many
small kernels included), the rest of the block otherwise. Without CUDA activities (the CPU
smoke run) the share is host time inside the ranges, labelled so. (4) **the adaptation's
cost** — the drop-in on the layer's captured arguments against :func:`kernels.prefill.gdn_prefill`
/ :func:`kernels.decode.gdn_decode` on the same work (inputs in the contest's layout built from
the same tensors: q/k at the key heads, L2-normalised; the raw gates ``a``, ``b`` the layer
computed), both gated against :mod:`kernels.reference` first, timed with ``compare_methods``.
(5) **decode** — one cached token through the block at each batch size (``block_methods``). Only what passed
its gate is timed; a method that cannot time a call is skipped with its reason.
"""
from __future__ import annotations

import contextlib
from typing import Dict

import pandas as pd

from kernels.bench.anatomy import profile_events, range_share
from kernels.bench.gate import short_reason

from .common import (COMMON_PARAMS, Param, Run, collect_params as _collect, figure_legend,
                     fmt_us, new_figure, progress, start_run)

STEM = "06_in_the_model"
IMPLS = ("ours", "fla", "flashqla", "torch")
#: transformers' MoE experts implementations (``config._experts_implementation``).
EXPERTS = ("grouped_mm", "batched_mm", "eager")
#: record_function ranges of the profiled calls: the GDN function call inside the layer, and
#: one call of the block.
GDN_RANGE, BLOCK_RANGE = "gdn06::gdn_call", "gdn06::block"

PARAMS = COMMON_PARAMS + (
    Param("impls", "list", list(IMPLS),
          "ours, fla (FLA's functions), flashqla (where flash_qla imports), torch (the layer's own path)"),
    Param("num_k_heads", "int", 4, "GDN key heads (Qwen3-Next-80B-A3B's 16 at TP4)"),
    Param("num_v_heads", "int", 8, "GDN value heads (32 at TP4)"),
    Param("head_dim", "int", 128, "GDN key and value head size"),
    Param("hidden_size", "int", 2048, "the model's hidden size (published)"),
    Param("num_experts", "int", 512, "MoE experts (published)"),
    Param("num_experts_per_tok", "int", 10, "experts per token (published)"),
    Param("moe_intermediate_size", "int", 512, "expert MLP width (published)"),
    Param("experts_implementation", "str", "grouped_mm",
          "transformers' MoE experts: grouped_mm (grouped GEMMs, no host sync: the block captures in a graph), batched_mm, or eager (a loop over the hit experts that syncs)"),
    Param("gate_T", "int", 512, "tokens of the gate's prefill"),
    Param("prefill_lengths", "list", [512, 2048, 8192, 32768, 131072], "tokens of one prompt"),
    Param("torch_max_T", "int", 8192, "the torch path is timed and profiled up to this length"),
    Param("decode_batch_sizes", "list", [1, 4, 16, 64, 256], "sequences of a decode step"),
    Param("decode_context", "int", 64, "tokens prefilled per sequence before the decode steps"),
    Param("methods", "list", ["graph", "event", "host"],
          "timing methods of the GDN layer (kernels/bench/timing.py; event: GPU time where graph cannot capture)"),
    Param("block_methods", "list", ["graph", "event"],
          "timing methods of the decoder block, prefill and decode step (graph where the block captures; event otherwise, e.g. with the eager experts, which sync)"),
    Param("compare_methods", "list", ["graph"], "timing methods of the drop-in against gdn_prefill / gdn_decode"),
    Param("share_lengths", "list", [512, 8192, 131072], "prefill lengths of the GDN share (profiled)"),
    Param("share_batch_sizes", "list", [1, 64, 256], "decode batch sizes of the GDN share (profiled)"),
    Param("profile_calls", "int", 3, "profiled eager calls per point of the GDN share"),
    Param("repetitions", "int", 10, "timed calls per point"),
    Param("warmup", "int", 2, "untimed calls first (compilation, FLA's autotuning)"),
    Param("seed", "int", 0, "seed of the weights and inputs"),
)

GATE_COLUMNS = ["impl", "what", "status", "max_abs_err", "rel_l2_err", "reason"]
TIMES_COLUMNS = ["impl", "part", "T", "B", "method", "median_us", "p20_us", "p80_us", "n"]
SHARE_COLUMNS = ["impl", "part", "T", "B", "source", "gdn_us", "rest_us", "share",
                 "gdn_kernels", "rest_kernels", "calls"]
KERNEL_COLUMNS = ["impl", "part", "T", "B", "group", "kernel", "us_per_call", "launches_per_call"]
COMPARE_COLUMNS = ["part", "T", "B", "method", "dropin_us", "dropin_contest_layout_us",
                   "contest_us", "ratio", "ratio_captured"]
COMPARE_GATE_COLUMNS = ["part", "T", "B", "call", "status", "max_abs_err", "rel_l2_err", "reason"]
#: the drop-in's time over the contest entry point's (the adaptation costs nothing
#: measurable at or below it)
COMPARE_TARGET = 1.05


def collect_params(namespace: dict) -> dict:
    """This notebook's parameters from ``namespace`` (the notebook's ``globals()``); an
    ``experts_implementation`` outside :data:`EXPERTS` raises ValueError (before any model
    is built)."""
    params = _collect(namespace, PARAMS, STEM)
    if params["experts_implementation"] not in EXPERTS:
        raise ValueError(f"experts_implementation must be one of {', '.join(EXPERTS)}, got "
                         f"{params['experts_implementation']!r}")
    return params


def _flashqla_importable() -> str:
    """Why ``flash_qla`` cannot be used in this process ('' when it imports)."""
    try:
        import flash_qla  # noqa: F401
    except Exception as e:      # ImportError, or its import-time device checks
        return f"flash_qla does not import in this process ({short_reason(e)})"
    return ""


def start(params: dict) -> Run:
    """Open the run; build the config, the GDN layer and the decoder block (bf16, seeded).
    ``flashqla`` is dropped from the implementations (recorded in skipped.csv) where
    ``flash_qla`` does not import in-process."""
    run = start_run(STEM, params)
    import torch
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    p = run.params
    if "flashqla" in p["impls"]:
        why = _flashqla_importable()
        if why:
            run.skip("flashqla (all sections)", why)
            p["impls"] = [i for i in p["impls"] if i != "flashqla"]
    cfg = Qwen3NextConfig(
        hidden_size=p["hidden_size"], linear_num_key_heads=p["num_k_heads"],
        linear_num_value_heads=p["num_v_heads"], linear_key_head_dim=p["head_dim"],
        linear_value_head_dim=p["head_dim"], num_experts=p["num_experts"],
        num_experts_per_tok=p["num_experts_per_tok"],
        moe_intermediate_size=p["moe_intermediate_size"],
        shared_expert_intermediate_size=p["moe_intermediate_size"],
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    cfg._experts_implementation = p["experts_implementation"]
    torch.manual_seed(p["seed"])
    with torch.device(run.device):
        block = Qwen3NextDecoderLayer(cfg, layer_idx=0)
    _init_weights(block, cfg.initializer_range, p["seed"])
    block = block.to(torch.bfloat16).eval()
    run.state.update(cfg=cfg, block=block, layer=block.linear_attn)
    run.extra_provenance["model"] = dict(
        config="Qwen3-Next-80B-A3B (published) at TP4 GDN heads", gdn_heads=(
            p["num_k_heads"], p["num_v_heads"], p["head_dim"]), hidden=p["hidden_size"],
        experts=(p["num_experts"], p["num_experts_per_tok"], p["moe_intermediate_size"]),
        experts_implementation=p["experts_implementation"])
    return run


def _init_weights(block, std: float, seed: int) -> None:
    """Every matrix (projections, convolution, router, experts) drawn from
    ``normal(0, std)``, seeded, as transformers' ``_init_weights`` does for a model: a bare
    decoder layer is not initialised by transformers (its experts are ``torch.empty``, its
    router zeros, which would send every token to the same experts). Vectors (norms,
    ``A_log``, ``dt_bias``) keep their constructed values."""
    import torch

    for i, (_, w) in enumerate(sorted(block.named_parameters())):
        if w.dim() >= 2:
            g = torch.Generator(device=w.device).manual_seed(seed * 1009 + i)
            with torch.no_grad():
                w.normal_(0.0, std, generator=g)


def _hidden(run: Run, B: int, T: int, seed: int):
    import torch

    g = torch.Generator(device=run.device).manual_seed(seed)
    return torch.randn(B, T, run.params["hidden_size"], generator=g, device=run.device,
                       dtype=torch.bfloat16)


def _module(run: Run):
    """The module whose globals the GDN layer calls (transformers' modeling file)."""
    import sys

    return sys.modules[type(run.state["layer"]).__module__]


#: The captured GDN call's keyword arguments the notebook passes on (the model's others
#: are transformers' own).
_CALL_KEYS = ("g", "beta", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel")


@contextlib.contextmanager
def _recording(run: Run, name: str, seen: dict):
    """While open, the layer's call of the module function ``name`` records its arguments
    in ``seen`` (``args``, ``kwargs``) and returns zeros instead of computing (the layer's
    output is not used: capturing a 131,072-token call costs no GDN computation); the
    layer's raw gate inputs ``b``, ``a`` (from ``fix_query_key_value_ordering``) go to
    ``seen["ba"]``."""
    import torch

    mod, layer = _module(run), run.state["layer"]
    bound, split = getattr(mod, name), layer.fix_query_key_value_ordering

    def record(q, k, v, *a, **kw):
        seen.update(args=(q, k, v) + a, kwargs={n: x for n, x in kw.items() if n in _CALL_KEYS})
        B, _, HV, D = v.shape
        return torch.zeros_like(v), (torch.zeros(B, HV, q.shape[-1], D, device=v.device)
                                     if kw.get("output_final_state") else None)

    def record_split(*a, **k):
        out = split(*a, **k)
        seen["ba"] = (out[4], out[5])
        return out

    setattr(mod, name, record)
    layer.fix_query_key_value_ordering = record_split
    try:
        yield seen
    finally:
        setattr(mod, name, bound)
        del layer.fix_query_key_value_ordering      # the class's method again


def _captured_call(run: Run, h):
    """The layer's GDN prefill call on ``h``: ``{args, kwargs, ba}``."""
    import torch

    seen = {}
    with torch.no_grad(), _recording(run, "torch_chunk_gated_delta_rule", seen):
        run.state["layer"](h)
    return seen


def _gdn_fn(impl: str, name: str = "torch_chunk_gated_delta_rule"):
    """``impl``'s function for transformers' ``name``, as :func:`kernels.model.hf.use`
    binds it."""
    from kernels.model import hf

    if impl == "ours":
        return hf.TARGETS[name]
    if impl in ("fla", "flashqla"):
        return hf.peer_function(impl, name)
    import transformers.models.qwen3_next.modeling_qwen3_next as m
    fn = getattr(m, name)
    return getattr(fn, "__wrapped__", fn)


def run_gate(run: Run) -> pd.DataFrame:
    """The layer's output and the GDN call's output and final state per implementation
    against the torch path → ``gate.csv``; the passing implementations in
    ``run.state["passed"]``."""
    import torch

    from kernels.checks import check_outputs
    from kernels.model import hf

    p = run.params
    h = _hidden(run, 1, p["gate_T"], p["seed"])
    seen = _captured_call(run, h)
    args, kwargs = seen["args"], dict(seen["kwargs"], output_final_state=True)
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


def _prefill_impls(run: Run, T: int) -> list:
    """The passing implementations run at ``T`` tokens (torch up to ``torch_max_T``)."""
    return [i for i in run.state["passed"] if i != "torch" or T <= run.params["torch_max_T"]]


def run_prefill(run: Run) -> pd.DataFrame:
    """Per length and passing implementation: the GDN layer and the decoder block →
    ``prefill_times.csv``."""
    import torch

    from kernels.model import hf

    p = run.params
    methods = {"gdn layer": run.usable_methods(p["methods"]),
               "block": run.usable_methods(p["block_methods"])}
    rows = []
    for T in progress(p["prefill_lengths"], "prefill lengths", "length"):
        h = _hidden(run, 1, T, p["seed"] + T)
        for impl in _prefill_impls(run, T):
            with torch.no_grad(), hf.use(run.state["layer"], impl):
                for part, fn in (("gdn layer", lambda: run.state["layer"](h)),
                                 ("block", lambda: run.state["block"](h, position_embeddings=None))):
                    rows += _time(run, fn, methods[part], dict(impl=impl, part=part, T=T, B=1),
                                  f"prefill {impl} {part} T={T}")
    df = pd.DataFrame(rows).reindex(columns=TIMES_COLUMNS)
    run.write_csv(df, "prefill_times")
    return df


def _decode_cache(run: Run, B: int):
    """A cache holding ``decode_context`` tokens per sequence, prefilled through the block
    with whatever is bound; and the next token's hidden state."""
    from transformers import DynamicCache

    p = run.params
    cache = DynamicCache(config=run.state["cfg"])
    run.state["block"](_hidden(run, B, p["decode_context"], p["seed"]),
                       position_embeddings=None, past_key_values=cache)
    return cache, _hidden(run, B, 1, p["seed"] + 1)


def run_decode(run: Run) -> pd.DataFrame:
    """Per batch size and passing implementation: one cached token through the block
    (``decode_context`` tokens prefilled first), timed with ``block_methods`` →
    ``decode_times.csv``. FlashQLA has no
    decode kernel (its binding runs FLA's decode call): not timed here."""
    import torch

    from kernels.model import hf

    p = run.params
    methods = run.usable_methods(p["block_methods"])
    rows = []
    for B in progress(p["decode_batch_sizes"], "decode batch sizes", "B"):
        for impl in [i for i in run.state["passed"] if i != "flashqla"]:
            with torch.no_grad(), hf.use(run.state["block"], impl):
                cache, x = _decode_cache(run, B)
                rows += _time(run, lambda: run.state["block"](x, position_embeddings=None,
                                                         past_key_values=cache),
                              methods, dict(impl=impl, part="block decode step", T=1, B=B),
                              f"decode {impl} B={B}")
    df = pd.DataFrame(rows).reindex(columns=TIMES_COLUMNS)
    run.write_csv(df, "decode_times")
    return df


# ----------------------------------------------------------------------------- GDN share

@contextlib.contextmanager
def _gdn_ranges(run: Run):
    """While open, the two GDN functions bound in the layer's module run inside a
    ``record_function`` range :data:`GDN_RANGE` (whichever implementation is bound)."""
    from torch.profiler import record_function

    from kernels.model.hf import TARGETS

    mod = _module(run)
    saved = {n: getattr(mod, n) for n in TARGETS}

    def ranged(fn):
        def call(*a, **k):
            with record_function(GDN_RANGE):
                return fn(*a, **k)
        return call

    for n, fn in saved.items():
        setattr(mod, n, ranged(fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(mod, n, fn)


def run_share(run: Run):
    """The GDN call's share of the block by kernel (see the module docstring): prefill at
    each of ``share_lengths``, the decode step at each of ``share_batch_sizes`` (fewer
    points than the timings: each profiled point costs seconds), per passing implementation →
    ``gdn_share.csv`` and ``gdn_kernels.csv``; returns ``(share, kernels)``."""
    import torch

    from kernels.model import hf

    p = run.params
    cuda = run.on_gpu
    if not cuda:
        run.skip("GDN share by kernel (gdn_kernels.csv)",
                 "no CUDA activities off the GPU: the share is host time in the ranges")
    points = [("prefill", T, 1) for T in p["share_lengths"]] + \
        [("decode step", 1, B) for B in p["share_batch_sizes"]]
    shares, kernels = [], []
    for part, T, B in progress(points, "GDN share (profiler)", "point"):
        impls = _prefill_impls(run, T) if part == "prefill" else \
            [i for i in run.state["passed"] if i != "flashqla"]
        for impl in impls:
            base = dict(impl=impl, part=part, T=T, B=B)
            try:
                with torch.no_grad(), hf.use(run.state["block"], impl):
                    if part == "prefill":
                        h = _hidden(run, 1, T, p["seed"] + T)
                        fn = lambda: run.state["block"](h, position_embeddings=None)  # noqa: E731
                    else:
                        cache, x = _decode_cache(run, B)
                        fn = lambda: run.state["block"](x, position_embeddings=None,  # noqa: E731
                                                        past_key_values=cache)
                    with _gdn_ranges(run):
                        events = profile_events(fn, p["profile_calls"], cuda, BLOCK_RANGE)
                share, rows = range_share(events, p["profile_calls"], cuda, BLOCK_RANGE,
                                          GDN_RANGE)
            except Exception as e:
                run.skip(f"GDN share {impl} {part} T={T} B={B}", short_reason(e))
                continue
            shares.append(dict(base, **share))
            kernels += [dict(base, **r) for r in rows]
    share = pd.DataFrame(shares, columns=SHARE_COLUMNS)
    kern = pd.DataFrame(kernels, columns=KERNEL_COLUMNS)
    run.write_csv(share, "gdn_share")
    if cuda:
        run.write_csv(kern, "gdn_kernels")
    return share, kern


# ----------------------------------------------------------------------------- the drop-in's cost

def contest_inputs(run: Run, seen: dict) -> dict:
    """The captured GDN call's work in the contest's layout (:func:`kernels.prefill.gdn_prefill`
    / :func:`kernels.decode.gdn_decode`): ``q``, ``k`` at the key heads (transformers'
    repeat undone: head ``h`` of the key heads is head ``h * HV / HQ`` of the repeat),
    L2-normalised as the call would; ``v``; the layer's raw ``a``, ``b`` with its ``A_log``,
    ``dt_bias`` in f32 (what its ``g``, ``beta`` are computed from); the initial state
    k-last (None for a prompt). Prefill inputs are packed ``[T, ...]`` with ``cu_seqlens``;
    decode inputs keep their ``[B, 1, ...]`` shape."""
    import torch

    from kernels.prefill.qk_norm import qk_l2norm

    layer = run.state["layer"]
    q, k, v = seen["args"][:3]
    B, T, HV, D = v.shape
    r = HV // layer.num_k_heads
    q, k = qk_l2norm(q[:, :, ::r].contiguous(), k[:, :, ::r].contiguous())
    b, a = seen["ba"]
    h0 = seen["kwargs"].get("initial_state")
    out = dict(q=q, k=k, v=v.contiguous(),
               state=None if h0 is None else h0.float().transpose(-1, -2).contiguous(),
               A_log=layer.A_log.detach().float(), a=a.contiguous(),
               dt_bias=layer.dt_bias.detach().float(), b=b.contiguous())
    if h0 is None:       # a prompt: packed
        out.update(q=q[0], k=k[0], v=out["v"][0], a=out["a"][0], b=out["b"][0],
                   cu_seqlens=torch.tensor([0, T], dtype=torch.int64, device=v.device))
    return out


def _captured_decode(run: Run, B: int) -> dict:
    """The layer's GDN decode call at batch ``B`` (``decode_context`` tokens cached by the
    torch path): ``{args, kwargs, ba}``; its initial state handed over as ours leaves it
    in a cache (the ``[K, V]`` view of a k-last buffer)."""
    import torch

    from kernels.model import hf

    seen = {}
    with torch.no_grad(), hf.use(run.state["block"], "torch"):
        cache, x = _decode_cache(run, B)
        with _recording(run, "torch_recurrent_gated_delta_rule", seen):
            run.state["block"](x, position_embeddings=None, past_key_values=cache)
    h0 = seen["kwargs"]["initial_state"].float()
    seen["kwargs"]["initial_state"] = h0.transpose(-1, -2).contiguous().transpose(-1, -2)
    return seen


def _compare_point(run: Run, part: str, T: int, B: int, seen: dict, methods):
    """Gate the drop-in (captured arguments) and the contest's entry point (the same work
    in its layout) against :mod:`kernels.reference`; time both when both pass. Returns
    ``(gate rows, time rows)``."""
    import torch

    from kernels.checks import check_outputs
    from kernels.decode import gdn_decode
    from kernels.model.fla_compat import (chunk_gated_delta_rule,
                                          fused_recurrent_gated_delta_rule)
    from kernels.prefill import gdn_prefill
    from kernels.reference import decode_reference, prefill_reference_chunked

    ci = contest_inputs(run, seen)
    args, kw = seen["args"], seen["kwargs"]
    # the drop-in on the contest entry point's tensors: q/k at the key heads (unit norm, the
    # in-kernel norm still applied), v contiguous; g and beta as the layer computed them
    lay = (ci["q"], ci["k"], ci["v"]) if part != "prefill" else \
        (ci["q"][None], ci["k"][None], ci["v"][None])   # (g, beta: in ``kw``, as captured)
    fn_fla = chunk_gated_delta_rule if part == "prefill" else fused_recurrent_gated_delta_rule
    layout = lambda **o: fn_fla(*lay, **dict(kw, **o))  # noqa: E731
    if part == "prefill":
        dropin = lambda **o: chunk_gated_delta_rule(*args, **dict(kw, **o))  # noqa: E731
        contest = lambda: gdn_prefill(**ci)  # noqa: E731
        ref = prefill_reference_chunked(**ci)
        unpack = lambda o, ht: (o[0], ht.transpose(-1, -2))  # noqa: E731
    else:
        dropin = lambda **o: fused_recurrent_gated_delta_rule(*args, **dict(kw, **o))  # noqa: E731
        contest = lambda: gdn_decode(**ci)  # noqa: E731
        ref = decode_reference(**ci)
        unpack = lambda o, ht: (o, ht.transpose(-1, -2))  # noqa: E731
    base = dict(part=part, T=T, B=B)
    gates, ok = [], True
    for call, fn in (("drop-in", lambda: unpack(*dropin(output_final_state=True))),
                     ("drop-in, contest layout", lambda: unpack(*layout(output_final_state=True))),
                     ("contest entry point", lambda: contest()[:2])):
        try:
            with torch.no_grad():
                res = check_outputs(fn(), ref)
            gates.append(dict(base, call=call, status="pass" if res.ok else "fail",
                              max_abs_err=res.max_abs_err, rel_l2_err=res.rel_l2_err,
                              reason=res.reason))
            ok = ok and res.ok
        except Exception as e:
            gates.append(dict(base, call=call, status="error", max_abs_err=float("nan"),
                              rel_l2_err=float("nan"), reason=short_reason(e)))
            ok = False
    if not ok:
        run.skip(f"drop-in vs contest {part} T={T} B={B}", "a call failed its gate")
        return gates, []
    what = f"drop-in vs contest {part} T={T} B={B}"
    times = {"drop-in": _time(run, dropin, methods, {}, f"{what} drop-in"),
             "layout": _time(run, layout, methods, {}, f"{what} drop-in, contest layout"),
             "contest": _time(run, contest, methods, {}, f"{what} contest")}
    med = {c: {t["method"]: t["median_us"] for t in rows} for c, rows in times.items()}
    rows = []
    for m in methods:
        d, lo, c = (med[k].get(m) for k in ("drop-in", "layout", "contest"))
        if d is None or lo is None or c is None:
            continue
        rows.append(dict(base, method=m, dropin_us=d, dropin_contest_layout_us=lo,
                         contest_us=c, ratio=lo / c, ratio_captured=d / c))
    return gates, rows


def run_compare(run: Run):
    """The drop-in against the contest's entry points on the same work, prefill at each
    length and decode at each batch size (see the module docstring) →
    ``dropin_gate.csv``, ``dropin_vs_contest.csv``; returns ``(gate, times)``."""
    p = run.params
    methods = run.usable_methods(p["compare_methods"])
    gates, rows = [], []
    for T in progress(p["prefill_lengths"], "drop-in vs contest (prefill)", "length"):
        g, r = _compare_point(run, "prefill", T, 1,
                              _captured_call(run, _hidden(run, 1, T, p["seed"] + T)), methods)
        gates, rows = gates + g, rows + r
    for B in progress(p["decode_batch_sizes"], "drop-in vs contest (decode)", "B"):
        g, r = _compare_point(run, "decode step", 1, B, _captured_decode(run, B), methods)
        gates, rows = gates + g, rows + r
    gate = pd.DataFrame(gates, columns=COMPARE_GATE_COLUMNS)
    times = pd.DataFrame(rows, columns=COMPARE_COLUMNS)
    run.write_csv(gate, "dropin_gate")
    run.write_csv(times, "dropin_vs_contest")
    return gate, times


# ----------------------------------------------------------------------------- figures

def _title(run: Run, what: str, method: str) -> str:
    p = run.params
    return (f"{what} — {run.gpu}; GDN HK={p['num_k_heads']} HV={p['num_v_heads']} "
            f"D={p['head_dim']}, MoE {p['num_experts']}x{p['num_experts_per_tok']} "
            f"({p['experts_implementation']}); "
            f"{method}")


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
    fig.suptitle(_title(run, what, "method " + ", ".join(methods)))
    return fig


def plot_share(run: Run, share: pd.DataFrame):
    """The block's time split into the GDN call's kernels and the rest's, as stacked
    fractions per length (prefill) or batch size (decode) and implementation; the block's
    total above each bar."""
    if share.empty:
        return None
    parts = [pt for pt in ("prefill", "decode step") if (share["part"] == pt).any()]
    fig, axes = new_figure(1, len(parts), panel=(7.0, 3.8))
    for ax, part in zip(axes[0], parts):
        x = "T" if part == "prefill" else "B"
        d = share[share["part"] == part].sort_values([x, "impl"])
        labels = [f"{x}={int(getattr(r, x))}\n{r.impl}" for r in d.itertuples()]
        total = d["gdn_us"] + d["rest_us"]
        ax.bar(labels, d["share"], label="GDN call (its kernels)")
        ax.bar(labels, 1 - d["share"], bottom=d["share"],
               label="rest of the block (norms, projections, conv, MoE)")
        for i, t in enumerate(total):
            ax.text(i, 1.01, fmt_us(t), ha="center", va="bottom", fontsize=7)
        ax.set(ylim=(0, 1.12), ylabel="share of the block's time", title=part)
        ax.tick_params(axis="x", labelsize=7)
    figure_legend(fig, axes)
    fig.suptitle(_title(run, "Decoder block: the GDN call's share", share["source"].iloc[0]))
    return fig


def conclusion_markdown(dfs: Dict[str, pd.DataFrame]) -> str:
    """What the tables say, computed from them."""
    gate, prefill, decode = dfs["gate"], dfs["prefill"], dfs["decode"]
    share, cgate, compare = dfs["share"], dfs["dropin_gate"], dfs["compare"]
    lines = ["### Conclusion", ""]
    for r in gate.itertuples():
        lines.append(f"- gate {r.impl}: {r.status} (max abs err {r.max_abs_err:.3g})"
                     + (f" — {r.reason}" if r.status != "pass" and r.reason else ""))
    for df, part, x in ((prefill, "gdn layer", "T"), (prefill, "block", "T"),
                        (decode, "block decode step", "B")):
        for m in dict.fromkeys(df.get("method", [])):
            if m == "host":
                continue
            b = df[(df["method"] == m) & (df["part"] == part)]
            for at, g in b.groupby(x):
                t = dict(zip(g["impl"], g["median_us"]))
                if "ours" in t and len(t) > 1:
                    peers = ", ".join(f"{i} {fmt_us(u)} ({u / t['ours']:.2f}x ours)"
                                      for i, u in t.items() if i != "ours")
                    lines.append(f"- {part} {x}={at} ({m}): ours {fmt_us(t['ours'])}; {peers}")
    for r in share[share["impl"] == "ours"].itertuples():
        at = f"T={r.T}" if r.part == "prefill" else f"B={r.B}"
        lines.append(f"- GDN share of the block, ours, {r.part} {at}: {100 * r.share:.0f} % "
                     f"of {fmt_us(r.gdn_us + r.rest_us)} ({r.source})")
    bad = cgate[cgate["status"] != "pass"]
    if len(cgate):
        lines.append(f"- drop-in and contest entry point against the reference: "
                     f"{len(cgate) - len(bad)} of {len(cgate)} pass"
                     + (f" (failing: {', '.join(f'{r.call} {r.part} T={r.T} B={r.B}' for r in bad.itertuples())})"
                        if len(bad) else ""))
    if len(compare):
        worst = compare.loc[compare["ratio"].idxmax()]
        over = compare[compare["ratio"] > COMPARE_TARGET]
        lines.append(f"- the adaptation: the drop-in over gdn_prefill / gdn_decode on the same "
                     f"tensors (q/k at the key heads, v contiguous): "
                     f"{compare['ratio'].min():.2f}x to {worst['ratio']:.2f}x (worst: "
                     f"{worst['part']} T={worst['T']} B={worst['B']}, {worst['method']}); "
                     + ("within" if over.empty else f"{len(over)} of {len(compare)} points over")
                     + f" the {COMPARE_TARGET:.2f}x target")
        wc = compare.loc[compare["ratio_captured"].idxmax()]
        lines.append(f"- with the model's own layout (the captured call: q/k repeated to the "
                     f"value heads, v a view of the convolution's output): "
                     f"{compare['ratio_captured'].min():.2f}x to {wc['ratio_captured']:.2f}x "
                     f"(worst {wc['part']} T={wc['T']} B={wc['B']}: "
                     f"{fmt_us(wc['dropin_us'])} against {fmt_us(wc['contest_us'])})")
    if not decode.empty:
        lines.append(f"- decode step of the block: {len(decode)} timed points "
                     f"(decode_times.csv)")
    return "\n".join(lines) + "\n"
