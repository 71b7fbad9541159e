"""Every prefill variant against the float32 reference under the contest rule.

CPU runs use the Triton interpreter (small head sizes, sequences <= ~300
tokens; chunk size stays 64). GPU-only checks (T = 8192, sync-free on CUDA,
graph replays) are marked ``gpu`` and skip with a reason elsewhere.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import replace
import os
import sys
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.checks import check_outputs  # noqa: E402
from kernels.prefill import (ACCURATE_CONFIG, DEFAULT_CONFIG, VARIANTS, PrefillConfig,  # noqa: E402
                             clear_graph_cache, gdn_prefill, graph_cache_info,
                             launch_count_hint, make_prefill_impl)
from kernels.prefill import graph as graph_mod  # noqa: E402
from kernels.prefill import pipeline  # noqa: E402
from kernels.prefill import plan as plan_mod  # noqa: E402
from kernels.reference import prefill_reference  # noqa: E402
from kernels.spec import GDNShape, make_prefill_inputs  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S16 = GDNShape(1, 2, 16)
S32 = GDNShape(2, 4, 32)
S128 = GDNShape(1, 2, 128)


def _id(D, lens, cu, state, extra=""):
    return (f"D{D}-lens[{','.join(map(str, lens))}]-{'int32' if cu == torch.int32 else 'int64'}"
            f"-{'state' if state else 'nostate'}{extra}")


CASES = [(S16, [1], torch.int64, True), (S16, [130], torch.int32, False),
         (S32, [100, 0, 28], torch.int32, True), (S16, [64, 64, 5, 0], torch.int64, False),
         (GDNShape(2, 2, 16), [3, 70], torch.int64, True)]
CASE_PARAMS = [pytest.param(s, l, c, st, id=_id(s.head_dim, l, c, st,
                                                  "-G1" if s.group == 1 else ""))
               for s, l, c, st in CASES]


@functools.lru_cache(maxsize=None)
def _case(shape, lens, cu_dtype, with_state, seed=0):
    x = make_prefill_inputs(list(lens), shape, seed=seed, cu_dtype=cu_dtype,
                            with_state=with_state, device=DEV)
    return x, prefill_reference(**x)


def case(shape, lens, cu_dtype=torch.int64, with_state=True, seed=0):
    return _case(shape, tuple(lens), cu_dtype, with_state, seed)


@contextlib.contextmanager
def _rules(**patches):
    """Patch rules of :mod:`kernels.prefill.plan` (the one place a call's path is chosen)
    for the block, with no plan remembered across its edges."""
    with mock.patch.multiple(plan_mod, **patches):
        plan_mod.clear_plan_cache()
        try:
            yield
        finally:
            plan_mod.clear_plan_cache()


def assert_ok(out, ref):
    r = check_outputs(out, ref)
    assert r.ok, f"{r.reason} (max abs {r.max_abs_err:.3e}, rel L2 {r.rel_l2_err:.3e})"


pytestmark = pytest.mark.filterwarnings("ignore:graph variant. no CUDA device")


# --------------------------------------------------------------------------- variants

@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "recurrent"])
@pytest.mark.parametrize("shape, lens, cu_dtype, with_state", CASE_PARAMS)
def test_variant_matches_reference(variant, shape, lens, cu_dtype, with_state):
    """(The token-recurrent variant: tests/prefill/test_recurrent.py, on shorter shapes.)"""
    x, ref = case(shape, lens, cu_dtype, with_state)
    before = {n: t.clone() for n, t in x.items() if torch.is_tensor(t)}
    out = gdn_prefill(**x, variant=variant)
    assert_ok(out, ref)
    for n, t in before.items():
        assert torch.equal(x[n], t), f"{variant} modified input {n}"


@pytest.mark.parametrize("variant", ["unfused", "fused"])
@pytest.mark.parametrize("lens, with_state", [
    pytest.param([70], True, id=_id(128, [70], torch.int64, True)),
    pytest.param([5, 64], False, id=_id(128, [5, 64], torch.int64, False)),
])
def test_variant_D128(variant, lens, with_state):
    x, ref = case(S128, lens, torch.int64, with_state)
    assert_ok(gdn_prefill(**x, variant=variant), ref)


@pytest.mark.parametrize("variant", ["no_sync", "fused"])
def test_scale_and_preallocated_outputs(variant):
    x, _ = case(S16, [40, 0, 9], torch.int32, True)
    x = dict(x, scale=0.3)
    ref = prefill_reference(**x)
    o = torch.full((49, 2, 16), float("nan"), dtype=torch.bfloat16, device=DEV)
    st = torch.full((3, 2, 16, 16), float("nan"), device=DEV)
    out = gdn_prefill(**x, variant=variant, output=o, output_state=st)
    assert out[0] is o and out[1] is st
    assert_ok(out, ref)


@pytest.mark.parametrize("variant, options", [
    pytest.param("fused", dict(cp=1), id="fused-cp"),
    pytest.param("fused", dict(cp=False), id="fused"),
    pytest.param("no_sync", {}, id="no_sync"),
])
def test_config_levers_keep_results(variant, options):
    """Every lever of :class:`PrefillConfig` passes the contest rule in every composition
    (``single_launch_max_T=0``: T = 160 would otherwise be one launch)."""
    x, ref = case(S32, [100, 0, 60], torch.int32, True)   # T > 128: the walk kernel runs
    assert_ok(gdn_prefill(**x, variant=variant, BV=16, **options), ref)
    for cfg in (PrefillConfig(walk_BV=16), PrefillConfig(storage="precise"),
                PrefillConfig(solve="blocks"), PrefillConfig(precision="bf16x2"),
                PrefillConfig(cp_chain_precision="tf32x3"),
                PrefillConfig(pdl=False), ACCURATE_CONFIG):
        assert cfg.name != "default"
        assert_ok(gdn_prefill(**x, variant=variant, config=replace(cfg, single_launch_max_T=0),
                              **options), ref)


@pytest.mark.parametrize("shape, lens, cu_dtype, with_state, BV", [
    pytest.param(S16, [100, 0, 60], torch.int32, True, None, id="D16-empty-mid-state"),
    pytest.param(S32, [130, 64, 1], torch.int64, False, 16, id="D32-ragged-nostate-BV16"),
    pytest.param(S128, [70, 65], torch.int64, True, None, id="D128-two-chunks-state"),
    pytest.param(S128, [0, 129], torch.int32, False, 64, id="D128-empty-first-BV64"),
])
def test_transposed_walk_matches_reference(shape, lens, cu_dtype, with_state, BV):
    """The walk holding ``S^T`` (:mod:`kernels.prefill.state_walk_t`; by
    :func:`walk_transposed_rule` for short walks of width 64, forced here) writes every
    output row and final state (NaN-filled buffers catch a missed write)."""
    from kernels import interpret
    from kernels.prefill import pipeline
    from kernels.prefill.config import WALKER_BV
    if not interpret.INTERPRET and shape.head_dim < WALKER_BV:
        pytest.skip(f"off the interpreter the walkers need head size >= {WALKER_BV} "
                    "(config.WALKER_BV); smaller heads take the walk")
    x, ref = case(shape, lens, cu_dtype, with_state)
    T, N, HV, D = sum(lens), len(lens), shape.num_v_heads, shape.head_dim
    o = torch.full((T, HV, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    st = torch.full((N, HV, D, D), float("nan"), device=DEV)
    with _rules(walk_transposed_rule=mock.Mock(return_value=True)), \
            mock.patch.object(pipeline, "state_walk_t_fwd",
                              wraps=pipeline.state_walk_t_fwd) as walk_t:
        out = gdn_prefill(**x, variant="fused", cp=False, output=o, output_state=st,
                          config=PrefillConfig(walk_BV=BV, single_launch_max_T=0))
    assert walk_t.call_count == 1
    assert_ok(out, ref)


@pytest.mark.parametrize("shape, lens, cu_dtype, with_state, max_T", [
    pytest.param(S16, [1], torch.int64, True, 128, id="D16-T1-state"),
    pytest.param(S16, [0, 30, 34], torch.int64, False, 128, id="D16-empty-first-nostate"),
    pytest.param(S32, [20, 0, 9, 0], torch.int32, True, 128, id="D32-empty-seqs-state"),
    pytest.param(S16, [100, 0, 28], torch.int32, True, 128, id="D16-100-0-28-state"),
    pytest.param(S16, [65], torch.int64, False, 128, id="D16-65-nostate"),
    pytest.param(S32, [64, 64], torch.int64, True, 128, id="D32-two-full-chunks"),
    pytest.param(S32, [1, 127, 0], torch.int32, False, 128, id="D32-1-127-empty-last"),
    pytest.param(S128, [100, 28], torch.int64, True, 128, id="D128-100-28-state"),
    pytest.param(S128, [6], torch.int32, False, 128, id="D128-T6-nostate"),
    pytest.param(S16, [300, 0, 190, 22], torch.int64, True, 512, id="D16-512-mixed"),
])
def test_single_launch_walkers_match_reference(shape, lens, cu_dtype, with_state, max_T):
    """T <= single_launch_max_T: one launch, walker programs in the intra-chunk grid wait
    for each chunk's flag and take their count off (all flags zero afterwards); empty
    sequences' final states come from their walkers (NaN-filled outputs catch a missed
    write)."""
    from kernels import interpret
    from kernels.prefill import pipeline
    from kernels.prefill.config import WALKER_BV
    if not interpret.INTERPRET and shape.head_dim < WALKER_BV:
        pytest.skip(f"off the interpreter the walkers need head size >= {WALKER_BV} "
                    "(config.WALKER_BV); smaller heads take the walk")
    x, ref = case(shape, lens, cu_dtype, with_state)
    T, N, HV, D = sum(lens), len(lens), shape.num_v_heads, shape.head_dim
    o = torch.full((T, HV, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    st = torch.full((N, HV, D, D), float("nan"), device=DEV)
    no_walk = AssertionError("walk launched")
    with mock.patch.object(pipeline, "state_walk_fwd", side_effect=no_walk), \
            mock.patch.object(pipeline, "state_walk_t_fwd", side_effect=no_walk):
        out = gdn_prefill(**x, variant="fused", output=o, output_state=st,
                          config=PrefillConfig(single_launch_max_T=max_T, recurrent_max_T=0))
    assert_ok(out, ref)
    assert int(pipeline._walker_flags(x["q"].device, 1).abs().sum()) == 0


def test_single_launch_up_to_max_T_only():
    from kernels.prefill import pipeline
    x, ref = case(S16, [100, 28], torch.int64, True)
    with mock.patch.object(pipeline, "state_walk_fwd", wraps=pipeline.state_walk_fwd) as walk:
        assert_ok(gdn_prefill(**x, variant="fused",
                              config=PrefillConfig(single_launch_max_T=64)), ref)
    assert walk.call_count == 1


def test_config_validation():
    with pytest.raises(ValueError, match="walk_BV"):
        PrefillConfig(walk_BV=24)
    with pytest.raises(ValueError, match="storage"):
        PrefillConfig(storage="fp8")
    with pytest.raises(ValueError, match="solve"):
        PrefillConfig(solve="tile")
    with pytest.raises(ValueError, match="precision must be one of 'bf16', 'bf16x2'"):
        PrefillConfig(precision="tf32")
    with pytest.raises(ValueError, match="cp_chain_precision"):
        PrefillConfig(cp_chain_precision="tf32")
    with pytest.raises(ValueError, match="pdl"):
        PrefillConfig(pdl=1)
    with pytest.raises(ValueError, match="single_launch_max_T"):
        PrefillConfig(single_launch_max_T=-1)
    with pytest.raises(ValueError, match="recurrent_max_T"):
        PrefillConfig(recurrent_max_T=-1)
    with pytest.raises(TypeError):
        PrefillConfig(walk_warps=4)   # a removed lever
    assert PrefillConfig().name == "default"
    assert ACCURATE_CONFIG.name == ("storage=precise,solve=blocks,precision=bf16x2,"
                                    "cp_chain_precision=tf32x3")
    assert PrefillConfig(walk_BV=128).fit(64).walk_BV == 64
    x, _ = case(S16, [20, 10, 19], torch.int64, True)
    with pytest.raises(TypeError, match="config"):
        gdn_prefill(**x, config="fast")


def test_make_prefill_impl_calling_convention():
    x, ref = case(S16, [1], torch.int64, True)
    for variant in VARIANTS:
        fn = make_prefill_impl(variant)
        assert fn.variant == variant
        assert_ok(fn(**x), ref)


# --------------------------------------------------------------------------- context parallel

@pytest.mark.parametrize("shape, lens, with_state", [
    pytest.param(S16, [200, 0, 65, 1], True, id=_id(16, [200, 0, 65, 1], torch.int64, True)),
    pytest.param(S32, [200], False, id=_id(32, [200], torch.int64, False)),
])
def test_context_parallel_forced_on_equals_off(shape, lens, with_state):
    """CP is exact algebra: with ~fp32 walk and chain products it matches the plain walk
    to 1e-4; the default bf16 products only need to pass the contest check."""
    x, ref = case(shape, lens, torch.int64, with_state)
    precise = PrefillConfig(precision="bf16x2", cp_chain_precision="tf32x3")
    off = gdn_prefill(**x, variant="fused", cp=False, config=precise)
    assert_ok(off, ref)
    for seg, long in ((1, False), (2, False), (2, True)):   # chained, then the long path
        with _rules(cp_long=lambda T, N: long):
            on = gdn_prefill(**x, variant="fused", cp=seg, config=precise)
            assert_ok(on, ref)
            torch.testing.assert_close(on[1], off[1], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(on[0].float(), off[0].float(), atol=1e-2, rtol=0)
            assert_ok(gdn_prefill(**x, variant="fused", cp=seg), ref)


@pytest.mark.parametrize("seg, long, solve, storage, expected", [
    # T=128, N=1, HV=2, D=16: Tb and Aqk, 2 * 64 * 2 B, + 4 (gc) + 256 (the "blocks"
    # solve's scratch) = 516 B per token and head; CP with 1-chunk segments: 3 slots
    pytest.param(0, False, "blocks", "compact", 128 * 2 * 516, id="blocks-no-cp"),
    # with the chunks' log bounds [3, HV] f32 and the segments' flags [3, HV] int32
    pytest.param(1, False, "blocks", "compact", 128 * 2 * 516 + 3 * 2 * 16 * 32 * 4 + 48,
                 id="blocks-cp-chained"),
    # the long path also holds the entering states [S, HV, D, D], the chunks' log bounds
    # [3, HV] f32 and the segments' flags [3, HV] int32
    pytest.param(1, True, "blocks", "compact", 128 * 2 * 516 + 3 * 2 * 16 * 48 * 4 + 48,
                 id="blocks-cp-long"),
    # the "batched" solve (the default) works in registers: no scratch
    pytest.param(0, False, "batched", "compact", 128 * 2 * 260, id="batched-no-cp"),
    # "precise": fp32 Tb and Aqk
    pytest.param(0, False, "batched", "precise", 128 * 2 * 516, id="batched-precise"),
])
def test_workspace_bytes(seg, long, solve, storage, expected):
    cfg = PrefillConfig(storage=storage, solve=solve)
    with _rules(cp_long=lambda T, N: long):
        plan = plan_mod.prefill_plan(128, 1, 2, 16, "cpu", cp=seg, config=cfg)
    assert plan.workspace_bytes == expected


@pytest.mark.parametrize("solve, single, expected", [
    pytest.param("batched", False, 128, id="batched"),
    pytest.param("batched", True, None, id="batched-one-launch"),
    pytest.param("blocks", False, None, id="blocks"),
])
def test_intra_maxnreg_rule(solve, single, expected):
    from kernels.prefill.config import intra_maxnreg_rule
    assert intra_maxnreg_rule(solve, single) == expected


@pytest.mark.parametrize("config, single, maxnreg", [
    pytest.param(PrefillConfig(), False, 128, id="default"),
    pytest.param(PrefillConfig(), True, None, id="default-one-launch"),
    pytest.param(ACCURATE_CONFIG, False, None, id="accurate"),
])
def test_intra_kernel_arguments_from_config(config, single, maxnreg):
    """What the variants hand the intra-chunk launcher."""
    from kernels.prefill.plan import intra_kwargs
    kw = intra_kwargs(config, single=single)
    assert kw == dict(storage=config.storage, solve=config.solve, maxnreg=maxnreg, num_warps=4)


@pytest.mark.parametrize("units, V, cp, expected", [
    pytest.param(57, 128, False, 64, id="57x64"),
    pytest.param(16, 128, False, 64, id="16x256"),
    pytest.param(4, 128, False, 32, id="4x1024"),
    pytest.param(1, 128, False, 16, id="T2048"),
    pytest.param(9, 128, True, 32, id="T8192-cp"),
    pytest.param(57, 16, False, 16, id="capped-at-V"),
])
def test_walk_tile_rule(units, V, cp, expected):
    from kernels.prefill.config import walk_tile_rule
    assert walk_tile_rule(units, 8, V, 132, cp) == expected


@pytest.mark.parametrize("BV, programs, short, precise, expected, skip", [
    pytest.param(64, 912, True, False, (4, 2, 2), "q", id="57x64-short-wide"),
    pytest.param(64, 256, True, False, (4, 2, 2), "q", id="16x256-short-wide"),
    pytest.param(64, 256, True, True, (4, 2, 1), "", id="16x256-short-wide-precise"),
    pytest.param(16, 64, True, False, (4, 3, None), "", id="T64-narrow-few"),
    pytest.param(16, 256, False, False, (4, 2, None), "", id="4x1024-narrow-many"),
    pytest.param(16, 64, False, False, (4, 3, None), "", id="T2048-narrow-few"),
    pytest.param(64, 144, False, False, (8, 3, None), "", id="T8192-cp-wide"),
    pytest.param(64, 144, False, True, (8, 2, None), "", id="T8192-cp-wide-precise"),
    pytest.param(16, 64, False, True, (4, 2, None), "", id="T2048-narrow-few-precise"),
])
def test_walk_launch_rule(BV, programs, short, precise, expected, skip):
    from kernels.prefill.config import walk_launch_rule, walk_pipe_skip_rule
    assert walk_launch_rule(BV, programs, 132, short, precise) == expected
    assert walk_pipe_skip_rule(BV, short, precise) == skip


@pytest.mark.parametrize("BV, short, precise, expected", [
    pytest.param(64, True, False, True, id="16x256-57x64-short-wide"),
    pytest.param(64, True, True, False, id="short-wide-precise"),
    pytest.param(32, True, False, False, id="short-narrow"),
    pytest.param(64, False, False, False, id="long-or-cp"),
])
def test_walk_transposed_rule(BV, short, precise, expected):
    from kernels.prefill.config import walk_transposed_rule
    assert walk_transposed_rule(BV, short, precise) is expected


@pytest.mark.parametrize("T, N, long, seg", [
    (8192, 1, False, 8), (16320, 1, False, 16), (16384, 1, True, 16), (32768, 2, True, 16),
    (131072, 1, True, 128), (1 << 20, 1, True, 1024), (64, 1, False, 2)])
def test_cp_long_rule(T, N, long, seg):
    from kernels.prefill.context_parallel import cp_long, cp_long_segment_chunks
    assert cp_long(T, N) is long
    assert cp_long_segment_chunks(T, N) == seg


@pytest.mark.parametrize("shape, lens, seg", [
    (S16, [100, 0, 60], 1),          # boundaries inside and between sequences, an empty one
    (S16, [300, 5, 0, 129], 2),      # sequences shorter than a segment
    (S32, [0], 1),                   # one empty sequence: the state is handed through
    (S32, [200, 64, 1], 1),
    (GDNShape(1, 2, 128), [130, 70], 1),
])
def test_cp_long_path(shape, lens, seg):
    """The long-context path (transposed phase A, combine kernel, transposed phase C) forced
    at small sizes: same results as the reference, inputs untouched."""
    x, ref = case(shape, lens, torch.int32, True)
    before = {n: t.clone() for n, t in x.items() if isinstance(t, torch.Tensor)}
    with _rules(cp_long=lambda T, N: True), \
            mock.patch.object(pipeline, "_cp_long", wraps=pipeline._cp_long) as long_path:
        out = gdn_prefill(**x, variant="fused", cp=seg)
    assert long_path.call_count == 1
    assert_ok(out, ref)
    for n, t in before.items():
        assert torch.equal(x[n], t), n


def test_cp_long_split_tail_lowers_the_state_error():
    """Phase C's split tail (:data:`kernels.prefill.config.TAIL_SPLIT_CHUNKS`), every head
    long-memory, one sequence of two units (8 chunks, then 2 full and a partial one): the
    final state is closer to the float32 reference with the default tail and with a
    2-chunk one than with none (``TAIL_SPLIT_CHUNKS = 0``, read by the plan); the outputs
    before the tail are bit for bit the tail-less walk's, all of them pass."""
    from kernels.prefill import config as cfg_mod
    from kernels.reference import prefill_reference_chunked
    from kernels.stress_inputs import with_gates

    x = with_gates(make_prefill_inputs([700], GDNShape(1, 1, 32), seed=0, cu_dtype=torch.int32,
                                       device=DEV), "every head long memory")
    ref = prefill_reference_chunked(**x)
    out, err = {}, {}
    for tail in (0, 2, cfg_mod.TAIL_SPLIT_CHUNKS):
        with mock.patch.object(cfg_mod, "TAIL_SPLIT_CHUNKS", tail), \
                _rules(cp_long=lambda T, N: True), \
                mock.patch.object(pipeline, "phase_c_fwd", wraps=pipeline.phase_c_fwd) as c:
            out[tail] = gdn_prefill(**x, variant="fused", cp=8)
        assert c.call_args.kwargs["tail"] == tail
        assert_ok(out[tail], ref)
        d = out[tail][1] - ref[1]
        err[tail] = (d.abs().max().item(), (d.norm() / ref[1].norm()).item())
    for tail in (2, cfg_mod.TAIL_SPLIT_CHUNKS):
        assert err[tail][0] < err[0][0] and err[tail][1] < err[0][1], err
    # the last unit starts at 512: with a 2-chunk tail its chunks from 576 are split
    assert torch.equal(out[2][0][:576], out[0][0][:576])
    assert torch.equal(out[cfg_mod.TAIL_SPLIT_CHUNKS][0][:512], out[0][0][:512])
    assert not torch.equal(out[2][0][576:], out[0][0][576:])


def _decay_case(shape, lens, A, k_scale=1.0, seed=0):
    """Inputs of the spec with every head's decay rate ``A`` (``A_log = log A``) and ``k``
    scaled by ``k_scale`` (1: unit norm), and their reference."""
    x = make_prefill_inputs(list(lens), shape, seed=seed, cu_dtype=torch.int64, device=DEV)
    x["A_log"] = torch.full_like(x["A_log"], float(torch.tensor(A).log()))
    x["dt_bias"] = torch.full_like(x["dt_bias"], 2.0)      # softplus(a + 2) ~ 2 per token
    x["k"] = (x["k"].float() * k_scale).to(torch.bfloat16)
    return x, prefill_reference(**x)


def test_intra_chunk_log_bound():
    """The intra-chunk kernel's per-chunk log transition bound: gc at the chunk's last token
    plus sum_t log max(1, beta_t |k_t|^2 - 1), per chunk slot (gaps untouched)."""
    from kernels import gpu_limits
    from kernels.prefill.intra_chunk import intra_chunk_fwd
    from kernels.prefill.gates import gates_torch
    # |k|^2 from A's diagonal (sm_90 and others), from k itself on sm_100 (LB_DIAG)
    for k_scale, cc in ((1.0, 90), (3.0, 90), (3.0, 100)):
        x, _ = _decay_case(S16, [100, 0, 64, 3], 0.05, k_scale)
        T, HV = x["q"].shape[0], x["v"].shape[1]
        lb = torch.full((T // 64 + 4, HV), 7.0, device=DEV)
        with mock.patch.object(gpu_limits, "device_limits", lambda dev: gpu_limits.ARCHS[cc]):
            intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], x["q"], a=x["a"], b=x["b"],
                            A_log=x["A_log"], dt_bias=x["dt_bias"], log_bound=lb)
        g, beta = gates_torch(x["A_log"], x["a"], x["dt_bias"], x["b"])
        kn = x["k"].float().pow(2).sum(-1).repeat_interleave(HV // x["k"].shape[1], dim=1)
        per_tok = g.float() + torch.log(torch.clamp(beta.float() * kn - 1.0, min=1.0))
        # slots: seq 0 chunks 0, 1 -> 0, 1; seq 2 (bos 100) chunk 0 -> 1 + 2 = 3;
        # seq 3 (bos 164) -> 2 + 3 = 5; slots 2 and 4 are gaps
        for slot, (t0, t1) in {0: (0, 64), 1: (64, 100), 3: (100, 164), 5: (164, 167)}.items():
            torch.testing.assert_close(lb[slot], per_tok[t0:t1].sum(0), atol=1e-3, rtol=1e-4)
        assert torch.all(lb[2] == 7.0) and torch.all(lb[4] == 7.0)


@pytest.mark.parametrize("A, k_scale, expect_skip", [
    pytest.param(8.0, 1.0, True, id="strong-decay"),      # ~ -16 per token: M negligible
    pytest.param(1e-4, 1.0, False, id="no-decay"),        # the whole segment is walked
    # ~ -0.3 per token would be negligible within a segment, but |k|^2 = 6.25 makes the
    # bound grow: no skipping
    pytest.param(0.15, 2.5, False, id="large-k"),
])
@pytest.mark.parametrize("long", [True, False], ids=["long", "chained"])
def test_cp_truncation(A, k_scale, expect_skip, long):
    """Phase A of both CP paths skips the chunks whose contribution the decay has made
    negligible, and phase B (long) or the chain (phase C, chained) the negligible
    transitions -- only where the bound says so -- and the outputs still match the
    reference."""
    # D=64 for the chained walk: its 64-column tiles then hold columns of M or of X, not both
    # (a tile with both is walked whole)
    x, ref = _decay_case(S16 if long else GDNShape(1, 2, 64), [300, 5, 200], A, k_scale)
    name = "segment_combine_t_fwd" if long else "state_walk_fwd"
    with _rules(cp_long=lambda T, N: long), \
            mock.patch.object(pipeline, name, wraps=getattr(pipeline, name)) as spy:
        # without decay the default's bf16 products miss the tolerance (the documented
        # long-memory corner): the accurate preset there
        out = gdn_prefill(**x, variant="fused", cp=2,
                          config=None if expect_skip else ACCURATE_CONFIG)
    negl = (spy.call_args[0][2] if long else
            next(c.kwargs["negligible"] for c in spy.call_args_list if c.kwargs.get("chain")))
    # real phase-A slots (not a sequence's last segment): seq 0 has 3 segments of 128
    # tokens (slots 0-2, 0 and 1 summarised), seq 1 one (slot 3), seq 2 (bos 305 -> start
    # 2 + 2 = 4) two (4, 5: 4 summarised)
    flags = negl[[0, 1, 4]]
    assert bool(torch.all(flags == 1)) is expect_skip and bool(torch.all(flags == 0)) is (
        not expect_skip)
    if k_scale == 1.0:   # (growing states are outside the contest rule's tolerance)
        assert_ok(out, ref)


@pytest.mark.parametrize("A, fine", [
    pytest.param(1e-4, True, id="long-memory"),    # every segment's M walked: fine split
    pytest.param(8.0, False, id="strong-decay"),   # M negligible everywhere: the rule's
])
def test_cp_long_split_on_device(A, fine):
    """The long path with the split chosen on the device (the rule's segments of
    ``cp_split`` size, forced here at 2 chunks): the split kernel halves the segments of
    the sequences where some head's M is walked in full and keeps them where the decay makes
    every M negligible; either way the outputs match the reference."""
    x, ref = _decay_case(S16, [300, 5, 200], A)
    # the rule's CP (segments of 2 chunks at this length), the long path, the split
    with _rules(cp_long=lambda T, N: True, cp_segment_chunks=lambda *a: 2,
                cp_split=lambda seg: True), \
            mock.patch.object(pipeline, "segment_split_fwd",
                              wraps=pipeline.segment_split_fwd) as spy:
        out = gdn_prefill(**x, variant="fused", config=ACCURATE_CONFIG if fine else None)
    assert spy.call_count == 1
    mult = spy.call_args[0][2].tolist()
    # seq 0 (300 tokens: 5 one-chunk slots) and seq 2 (200: 4) have segments before their
    # last; seq 1 (5 tokens) has none, so nothing of it is walked in full
    assert mult == ([1, 2, 1] if fine else [2, 2, 2])
    assert_ok(out, ref)


# --------------------------------------------------------------------------- graph variant

def test_graph_bucket_reuse_and_padding():
    """Calls in one bucket reuse its buffers; stale rows/sequences never leak."""
    clear_graph_cache()
    big, ref_big = case(S16, [90, 30, 7], torch.int64, True, seed=1)     # T=127, N=3
    small, ref_small = case(S16, [100], torch.int64, True, seed=2)       # T=100, N=1
    mid, ref_mid = case(S16, [60, 0, 50], torch.int64, True, seed=3)     # T=110, N=3
    assert_ok(gdn_prefill(**big, variant="graph"), ref_big)
    assert_ok(gdn_prefill(**mid, variant="graph"), ref_mid)      # same bucket (128, 4)
    assert_ok(gdn_prefill(**small, variant="graph"), ref_small)  # bucket (128, 1)
    info = graph_cache_info()
    assert [(b["T_pad"], b["N_pad"]) for b in info] == [(128, 4), (128, 1)]
    assert all(b["bytes"] > 0 for b in info)
    assert all(b["captured"] == (DEV == "cuda") for b in info)
    assert graph_mod.bucket_of(6, 1) == (64, 1) and graph_mod.bucket_of(8192, 57) == (8192, 64)
    clear_graph_cache()
    assert graph_cache_info() == []


# --------------------------------------------------------------------------- no host sync

_SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
                 "__index__")
_PREFILL_DIR = os.path.join("kernels", "prefill")


@pytest.fixture
def forbid_host_reads():
    """Make any device-to-host read issued from kernels/prefill code raise."""
    originals = {m: getattr(torch.Tensor, m) for m in _SYNC_METHODS}
    calls = []

    def guard(name):
        orig = originals[name]

        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if _PREFILL_DIR in caller:
                calls.append((name, caller))
                raise AssertionError(f"host read Tensor.{name} from {caller}")
            return orig(self, *args, **kwargs)
        return wrapper

    with mock.patch.multiple(torch.Tensor, **{m: guard(m) for m in _SYNC_METHODS}):
        yield calls


@pytest.mark.parametrize("variant, options", [
    pytest.param("no_sync", {}, id="no_sync"),
    pytest.param("fused", {}, id="fused"),
    pytest.param("fused", {"cp": 1}, id="fused-cp"),
    pytest.param("recurrent", {}, id="recurrent"),
])
def test_no_sync_variants_never_read_device_values(forbid_host_reads, variant, options):
    x, ref = case(S16, [100, 0, 28], torch.int32, True)
    out = gdn_prefill(**x, variant=variant, check_values=False, **options)
    assert forbid_host_reads == []
    assert_ok(out, ref)


def test_host_sync_guard_catches_the_unfused_chunk_table(forbid_host_reads):
    """The guard above is live: the host-built chunk table trips it."""
    x, _ = case(S16, [100, 0, 28], torch.int32, True)
    with pytest.raises(AssertionError, match="host read"):
        gdn_prefill(**x, variant="unfused", check_values=False)


# --------------------------------------------------------------------------- bad inputs

def _bad(name, value):
    def edit(x):
        x = dict(x)
        x[name] = value(x) if callable(value) else value
        return x
    return edit


BAD = [
    pytest.param(_bad("q", lambda x: x["q"].float()), TypeError, "q", id="q-float32"),
    pytest.param(_bad("v", lambda x: x["v"][:, :1].contiguous()), ValueError, "v",
                 id="v-heads-not-multiple"),
    pytest.param(_bad("cu_seqlens", lambda x: x["cu_seqlens"].float()), TypeError,
                 "cu_seqlens", id="cu-float"),
    pytest.param(_bad("cu_seqlens", lambda x: torch.tensor([0, 20, 10, 49],
                                                          device=DEV)), ValueError,
                 "cu_seqlens", id="cu-decreasing"),
    pytest.param(_bad("cu_seqlens", lambda x: torch.tensor([0, 20, 30, 48], device=DEV)),
                 ValueError, "cu_seqlens", id="cu-end-not-T"),
    pytest.param(_bad("state", lambda x: x["state"][:2].contiguous()), ValueError, "state",
                 id="state-wrong-N"),
    pytest.param(_bad("a", lambda x: x["a"].float()), TypeError, "a", id="a-float32"),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("edit, exc, name", BAD)
def test_bad_inputs_raise_named_error_and_leave_inputs(variant, edit, exc, name):
    x, _ = case(S16, [20, 10, 19], torch.int64, True)
    x = edit(x)
    before = {n: t.clone() for n, t in x.items() if torch.is_tensor(t)}
    with pytest.raises(exc, match=name):
        gdn_prefill(**x, variant=variant, check_values=True)
    for n, t in before.items():
        assert torch.equal(x[n], t)


@pytest.mark.parametrize("kwargs, exc, match", [
    pytest.param(dict(variant="nope"), ValueError, "variant", id="unknown-variant"),
    pytest.param(dict(variant="unfused", cp=True), ValueError, "cp", id="cp-on-unfused"),
    pytest.param(dict(BV=24), ValueError, "BV", id="BV-not-pow2"),
    pytest.param(dict(output=torch.empty(49, 2, 16)), TypeError, "output", id="output-dtype"),
    pytest.param(dict(output_state=torch.empty(3, 2, 16, 8)), ValueError, "output_state",
                 id="output_state-shape"),
])
def test_bad_options(kwargs, exc, match):
    x, _ = case(S16, [20, 10, 19], torch.int64, True)
    kwargs = {n: (t.to(DEV) if torch.is_tensor(t) else t) for n, t in kwargs.items()}
    with pytest.raises(exc, match=match):
        gdn_prefill(**x, **kwargs)


# --------------------------------------------------------------------------- launch counts

def test_launch_count_hint():
    hints = {v: launch_count_hint(v, T=64, N=1) for v in VARIANTS}
    assert hints["fused"]["kernels"] == 1 and hints["fused"]["syncs"] == 0   # one launch
    assert hints["no_sync"]["syncs"] == 0 and hints["no_sync"]["copies"] == 0
    assert hints["unfused"]["syncs"] > 0 and hints["unfused"]["torch_ops"] == 8
    assert hints["graph"]["graph_launches"] == 1
    assert launch_count_hint("fused", T=8192, N=1, device="cpu")["cp"] is True
    assert launch_count_hint("fused", T=8192, N=1, device="cpu")["kernels"] == 3  # CP
    assert launch_count_hint("fused", T=512, N=1, device="cpu")["kernels"] == 2   # intra, walk
    assert launch_count_hint("fused", T=16384, N=1, device="cpu")["kernels"] == 4  # long CP
    # from 64 chunks per segment the split kernel chooses the segments on the device
    assert launch_count_hint("fused", T=65536, N=1, device="cpu")["kernels"] == 5
    assert launch_count_hint("fused", T=65536, N=1, device="cpu", cp=64)["kernels"] == 4
    short = launch_count_hint("fused", T=6, N=1, device="cpu")   # the token-recurrent kernel
    assert short["kernels"] == 1 and short["cp"] is False and "recurrent" in short["note"]
    assert launch_count_hint("recurrent", T=4096, N=1)["kernels"] == 1
    with pytest.raises(ValueError):
        launch_count_hint("nope")


# --------------------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fused", "graph", "no_sync"])
def test_gpu_contest_shape_T8192(variant):
    x, ref = case(GDNShape(4, 8, 128), [8192], torch.int64, True)
    assert_ok(gdn_prefill(**x, variant=variant), ref)
    assert_ok(gdn_prefill(**x, variant=variant), ref)   # graph: the replay


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[6], [64], [64] * 57, [256] * 16, [100, 28], [1024] * 4,
                                  [2048]],
                         ids=["T6", "T64", "57x64", "16x256", "100+28", "4x1024", "T2048"])
def test_gpu_contest_shapes_fused_and_cp(lens):
    x, ref = case(GDNShape(4, 8, 128), lens, torch.int64, True)
    assert_ok(gdn_prefill(**x, variant="fused"), ref)
    assert_ok(gdn_prefill(**x, variant="fused", cp=True), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("accurate", [False, True], ids=["default", "accurate"])
def test_gpu_long_context_path(accurate):
    """>= 16,384 tokens per sequence on average: the long CP path, against the reference
    (also with ACCURATE_CONFIG)."""
    from kernels.prefill import ACCURATE_CONFIG
    lens = [40000, 20000]
    x, ref = case(GDNShape(4, 8, 128), lens, torch.int64, True)
    cfg = ACCURATE_CONFIG if accurate else None
    assert plan_mod.prefill_plan(sum(lens), 2, 8, 128, "cuda", config=cfg).seg_chunks > 0
    with mock.patch.object(pipeline, "_cp_long", wraps=pipeline._cp_long) as long_path:
        assert_ok(gdn_prefill(**x, variant="fused", config=cfg), ref)
    assert long_path.call_count == 1


@pytest.mark.gpu
def test_gpu_no_sync_under_cuda_sync_debug_mode():
    x, ref = case(GDNShape(4, 8, 128), [100, 0, 28], torch.int32, True)
    gdn_prefill(**x, variant="fused")   # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out_ns = gdn_prefill(**x, variant="no_sync")
        out_f = gdn_prefill(**x, variant="fused")
        out_cp = gdn_prefill(**x, variant="fused", cp=1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for out in (out_ns, out_f, out_cp):
        assert_ok(out, ref)


_MANY = [0, 1, 63, 64, 65, 200, 7, 0, 128, 300] * 6 + [5, 0, 77, 64]   # N = 64, with empties


@pytest.mark.gpu
@pytest.mark.parametrize("lens, cu_dtype", [([16384], torch.int64), (_MANY, torch.int32)],
                         ids=["T16384-int64", "N64-mixed-int32"])
@pytest.mark.parametrize("variant", ["fused", "no_sync"])
def test_gpu_long_sequence_and_many_sequences(lens, cu_dtype, variant):
    """The issue's range: T up to >= 16384, N up to >= 64 (empty and ragged sequences)."""
    x, ref = case(GDNShape(4, 8, 128), lens, cu_dtype, True)
    assert_ok(gdn_prefill(**x, variant=variant), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("lens, cp, options", [
    pytest.param([2048], False, {}, id="T2048-walk"),
    pytest.param([8192], None, {}, id="T8192-cp-chain"),
    pytest.param([40000], None, {}, id="T40000-cp-long"),
    pytest.param([64] * 57, False, {}, id="57x64-transposed"),
    pytest.param([100, 0, 28], False, dict(single_launch_max_T=0), id="100+28-two-launches"),
    pytest.param([8192], None, dict(storage="precise", solve="blocks", precision="bf16x2",
                                    cp_chain_precision="tf32x3"), id="T8192-cp-accurate"),
])
def test_gpu_pdl_launches_give_the_same_bits(lens, cp, options):
    """Programmatic dependent launch changes when kernels start, never what they compute."""
    from kernels.prefill.pdl import pdl_supported
    if not pdl_supported(torch.device("cuda")):
        pytest.skip("PDL needs compute capability >= 9.0 and triton's launch_pdl")
    x, ref = case(GDNShape(4, 8, 128), lens, torch.int64, True)
    on = gdn_prefill(**x, variant="fused", cp=cp, config=PrefillConfig(pdl=True, **options))
    off = gdn_prefill(**x, variant="fused", cp=cp, config=PrefillConfig(pdl=False, **options))
    assert_ok(on, ref)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


@pytest.mark.gpu
@pytest.mark.parametrize("lens, cp", [([100, 0, 60], False), ([4096], 16)],
                         ids=["100+0+60", "T4096-cp16"])
def test_gpu_direct_launches_give_the_same_bits(monkeypatch, lens, cp):
    """Repeat launches reuse the compiled kernel directly (the call sites' keyed binds,
    kernels.launch.FastLaunch.bind_keyed); same results."""
    from kernels import launch
    from kernels.prefill import intra_chunk, state_walk
    x, ref = case(GDNShape(4, 8, 128), lens, torch.int32, True)
    first = gdn_prefill(**x, variant="fused", cp=cp)
    again = gdn_prefill(**x, variant="fused", cp=cp)   # direct launches
    assert launch.fast_launch_enabled()
    assert intra_chunk._INTRA_LAUNCH._keyed and state_walk._WALK_LAUNCH._keyed
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    plain = gdn_prefill(**x, variant="fused", cp=cp)
    assert_ok(again, ref)
    for out in (first, again):
        assert torch.equal(out[0], plain[0]) and torch.equal(out[1], plain[1])
