"""The token-recurrent prefill (:mod:`kernels.prefill.recurrent`) against the float32
reference under the contest rule, and the dispatch that sends short calls to it.

CPU runs use the Triton interpreter (small head sizes). Invalid ``cu_seqlens`` (NaN
outputs, status bits, canaries intact) are covered with the other paths in
``tests/prefill/test_guard.py``; the no-host-sync check in ``tests/prefill/test_prefill.py``.
"""
from __future__ import annotations

import functools
import os
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.checks import check_outputs  # noqa: E402
from kernels.prefill import (DEFAULT_CONFIG, PrefillConfig, clear_graph_cache,  # noqa: E402
                             gdn_prefill, graph_cache_info, recurrent_rule)
from kernels.prefill import pipeline, recurrent  # noqa: E402
from kernels.prefill.config import RECURRENT_MAX_T  # noqa: E402
from kernels.reference import prefill_reference  # noqa: E402
from kernels.spec import GDNShape, make_prefill_inputs  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S16 = GDNShape(1, 2, 16)
S32 = GDNShape(2, 4, 32)
G1 = GDNShape(2, 2, 16)

pytestmark = pytest.mark.filterwarnings("ignore:graph variant. no CUDA device")


@functools.lru_cache(maxsize=None)
def _case(shape, lens, cu_dtype, with_state):
    x = make_prefill_inputs(list(lens), shape, seed=7, cu_dtype=cu_dtype, with_state=with_state,
                            device=DEV)
    return x, prefill_reference(**x)


def case(shape, lens, cu_dtype=torch.int64, with_state=True):
    return _case(shape, tuple(lens), cu_dtype, with_state)


def assert_ok(out, ref):
    r = check_outputs(out, ref)
    assert r.ok, f"{r.reason} (max abs {r.max_abs_err:.3e}, rel L2 {r.rel_l2_err:.3e})"


@pytest.mark.parametrize("shape, lens, cu_dtype, with_state", [
    pytest.param(S16, [0], torch.int64, True, id="T0-state"),
    pytest.param(S16, [0], torch.int32, False, id="T0-nostate"),
    pytest.param(S16, [1], torch.int64, False, id="T1-nostate"),
    pytest.param(S16, [1], torch.int32, True, id="T1-state"),
    pytest.param(S16, [5], torch.int32, True, id="T5-state"),
    pytest.param(S16, [63], torch.int64, False, id="T63-nostate"),
    pytest.param(S16, [64], torch.int64, True, id="T64-state"),
    pytest.param(S16, [65], torch.int32, False, id="T65-nostate"),
    pytest.param(S32, [3, 0, 7, 1], torch.int32, True, id="D32-mixed-empty-mid-state"),
    pytest.param(G1, [0, 9, 2, 0], torch.int64, False, id="G1-mixed-empty-first-last-nostate"),
])
def test_recurrent_matches_reference(shape, lens, cu_dtype, with_state):
    """Every output row and final state written (NaN-filled buffers catch a miss), the
    inputs untouched, one launch whatever the length. (The interpreter takes ~20 ms per
    token step of a program here: the shapes stay small.)"""
    x, ref = case(shape, lens, cu_dtype, with_state)
    T, N, HV, D = sum(lens), len(lens), shape.num_v_heads, shape.head_dim
    o = torch.full((T, HV, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    st = torch.full((N, HV, D, D), float("nan"), device=DEV)
    before = {n: t.clone() for n, t in x.items() if torch.is_tensor(t)}
    with mock.patch.object(pipeline, "recurrent_fwd", wraps=pipeline.recurrent_fwd) as rec:
        out = gdn_prefill(**x, variant="recurrent", output=o, output_state=st)
    assert rec.call_count == 1
    assert out[0].data_ptr() == o.data_ptr() and out[1].data_ptr() == st.data_ptr()
    assert_ok(out, ref)
    for n, t in before.items():
        assert torch.equal(x[n], t), f"input {n} was modified"


@pytest.mark.parametrize("lens, options, takes", [
    pytest.param([6], {}, True, id="T6"),
    pytest.param([5, 0, 11], {}, True, id="T16-mixed"),
    pytest.param([25], {}, False, id="T25"),
    pytest.param([6], dict(config=PrefillConfig(recurrent_max_T=0)), False, id="T6-off"),
    pytest.param([6], dict(cp=True), False, id="T6-cp-forced"),
    pytest.param([20], dict(config=PrefillConfig(recurrent_max_T=32)), True, id="T20-max32"),
])
def test_fused_dispatch(lens, options, takes):
    """``fused`` takes the token-recurrent kernel alone (no intra-chunk kernel) for calls of
    up to ``recurrent_max_T`` tokens without forced CP, the chunked path otherwise."""
    x, ref = case(S16, lens)
    assert RECURRENT_MAX_T == DEFAULT_CONFIG.recurrent_max_T == 24
    cfg = options.get("config", DEFAULT_CONFIG)
    assert recurrent_rule(sum(lens), options.get("cp"), cfg) is takes
    with mock.patch.object(pipeline, "recurrent_fwd", wraps=pipeline.recurrent_fwd) as rec, \
            mock.patch.object(pipeline, "intra_chunk_fwd",
                              wraps=pipeline.intra_chunk_fwd) as intra:
        assert_ok(gdn_prefill(**x, variant="fused", **options), ref)
    assert (rec.call_count, intra.call_count) == ((1, 0) if takes else (0, 1))


def test_graph_buckets_keep_the_recurrent_choice():
    """The graph variant decides on the call's own T: T = 6 and T = 40 share the padded
    shape (64, 1) but not a bucket."""
    clear_graph_cache()
    for lens in ([6], [40], [6]):
        x, ref = case(S16, lens)
        assert_ok(gdn_prefill(**x, variant="graph"), ref)
    info = graph_cache_info()
    assert sorted((b["T_pad"], b["N_pad"], b["recurrent"]) for b in info) == [
        (64, 1, False), (64, 1, True)]
    clear_graph_cache()


def test_tile_is_the_recurrent_tile_fitted_to_the_head_size():
    """One tile for every call of the path (eight warps at D = 128), fitted to the head size."""
    for N, D in ((1, 128), (64, 128), (3, 16)):
        cfg = recurrent.RECURRENT_TILE.fit(D)
        BV, BK, warps = recurrent.recurrent_tile(N, D, torch.device("cpu"))
        assert (BV, BK, warps) == (cfg.BV, cfg.block_k(D), cfg.num_warps)
        assert D % BV == 0 and D % BK == 0
    assert recurrent.recurrent_tile(1, 128, torch.device("cpu"))[2] == 8
