"""Triton GDN decode against the float32 reference (CPU: Triton interpreter).

Most cases use small head sizes (D=16/32) because the interpreter is slow;
a few D=128 cases with B<=2 cover the contest shape.
"""
from __future__ import annotations

import json

import pytest
import torch

from kernels.device import gpu_slug
from kernels.checks import check_outputs
from kernels.decode import (DEFAULT_TABLE, FLA_LIKE, DecodeConfig, config_for, config_grid,
                            gdn_decode, load_config_table, write_config_table)
from kernels.reference import decode_reference
from kernels.spec import CONTEST, GDNShape, make_decode_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
C = DecodeConfig.from_name


def _inputs(B, shape, seed=0, scale=None):
    return make_decode_inputs(B, shape, seed=seed, device=DEVICE, scale=scale)


# ----------------------------------------------------------------------------- correctness

CASES = [
    # B, (HQ, HV, D), config, inplace, scale
    pytest.param(1, (1, 2, 16), FLA_LIKE, False, None, id="B1-HV2-HQ1-D16-fla"),
    pytest.param(3, (2, 4, 32), C("BV8-w1-s1-t2-pf"), False, None, id="B3-HV4-HQ2-D32-t2-pf"),
    pytest.param(5, (4, 4, 16), C("BV8-w1-s1-t1"), True, None, id="B5-HV4-HQ4-D16-inplace"),
    pytest.param(2, (1, 2, 32), C("BV8-w1-s1-t4"), True, 0.0, id="B2-HV2-HQ1-D32-t4-inplace-scale0"),
    pytest.param(3, (1, 1, 32), C("BV16-w2-s2-t2"), False, 0.3, id="B3-HV1-HQ1-D32-s2-scale0.3"),
    pytest.param(1, (2, 4, 32), C("BV32-w2-s1-t1-ef"), False, None, id="B1-HV4-HQ2-D32-BV32-ef"),
    pytest.param(2, (1, 2, 32), C("BV16-w1-s1-t2-k8-pf"), False, None, id="B2-HV2-HQ1-D32-k8-t2-pf"),
    pytest.param(3, (2, 2, 32), C("BV8-w1-s1-t1-k16"), True, 1.5, id="B3-HV2-HQ2-D32-k16-inplace"),
    pytest.param(7, (1, 2, 16), None, False, None, id="B7-HV2-HQ1-D16-default"),
    pytest.param(1, (4, 8, 128), FLA_LIKE, False, None, id="B1-HV8-D128-fla"),
    pytest.param(2, (4, 8, 128), C("BV32-w4-s1-t2-k32-pf-ef"), True, None,
                 id="B2-HV8-D128-k32-t2-pf-ef-inplace"),
    pytest.param(1, (4, 8, 128), C("BV64-w4-s1-t2-k16"), False, 0.1, id="B1-HV8-D128-k16-t2"),
    pytest.param(1, (4, 8, 128), None, False, 0.0, id="B1-HV8-D128-default-scale0"),
]


@pytest.mark.parametrize("B, heads, config, inplace, scale", CASES)
def test_decode_matches_reference(B, heads, config, inplace, scale):
    inp = _inputs(B, GDNShape(*heads), seed=B, scale=scale)
    state_in = inp["state"].clone()
    ref = decode_reference(**inp)

    out, new_state = gdn_decode(**inp, config=config, inplace=inplace)

    res = check_outputs((out, new_state), ref)
    assert res.ok, res.reason
    assert out.shape == (B, 1, heads[1], heads[2]) and out.dtype == torch.bfloat16
    if inplace:
        assert new_state is inp["state"]
    else:
        assert new_state.data_ptr() != inp["state"].data_ptr()
        assert torch.equal(inp["state"], state_in), "input state was modified"


def test_scale_none_and_zero_mean_inverse_sqrt_d():
    shape = GDNShape(1, 2, 16)
    inp = _inputs(2, shape, seed=3)
    out_none, st_none = gdn_decode(**inp)
    out_zero, st_zero = gdn_decode(**{**inp, "scale": 0})
    out_explicit, _ = gdn_decode(**{**inp, "scale": 16 ** -0.5})
    assert torch.equal(out_none, out_zero) and torch.equal(st_none, st_zero)
    assert torch.equal(out_none, out_explicit)
    out_two, _ = gdn_decode(**{**inp, "scale": 2.0})
    assert check_outputs((out_two, st_none), decode_reference(**{**inp, "scale": 2.0})).ok


def test_preallocated_output_is_filled_and_returned():
    inp = _inputs(3, GDNShape(2, 4, 16), seed=5)
    buf = torch.full((3, 1, 4, 16), 7.0, dtype=torch.bfloat16, device=DEVICE)
    out, new_state = gdn_decode(**inp, output=buf, config=FLA_LIKE)
    assert out is buf
    assert check_outputs((out, new_state), decode_reference(**inp)).ok


def test_configs_agree_with_each_other():
    """Every config of a small grid gives the same state (fp32) and output."""
    inp = _inputs(2, GDNShape(1, 2, 32), seed=9)
    ref_out, ref_state = gdn_decode(**inp, config=FLA_LIKE)
    grid = config_grid(BVs=(8, 16, 32), warps=(1, 2), v_tiles=(1, 2, 4), BKs=(8, 16, 32),
                       head_dim=32)
    assert len(grid) > 8
    for cfg in grid:
        out, st = gdn_decode(**inp, config=cfg)
        assert torch.allclose(st, ref_state, atol=1e-6, rtol=1e-5), cfg.name
        assert (out.float() - ref_out.float()).abs().max() <= 1e-2, cfg.name


GPU_CONFIGS = ["BV8-w1-s1-t1", "BV8-w1-s1-t1-k32", "BV16-w2-s1-t1-k32", "BV32-w4-s1-t1-k32",
               "BV32-w4-s1-t1-k16", "BV64-w4-s1-t1", "BV128-w8-s1-t1-k32", "BV32-w4-s2-t2",
               "BV32-w4-s1-t2-k32-pf", "BV16-w1-s1-t8-k8-pf-ef", "BV64-w8-s1-t2-k32-pf-ef"]


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 33, 64])
def test_contest_shape_on_gpu(B, cuda_device):
    """Every lever compiles and is correct on the GPU at the contest shape."""
    inp = make_decode_inputs(B, CONTEST, seed=B, device=cuda_device)
    ref = decode_reference(**inp)
    for name in GPU_CONFIGS:
        res = check_outputs(gdn_decode(**inp, config=name), ref)
        assert res.ok, f"{name}: {res.reason}"


@pytest.mark.gpu
def test_gpu_direct_launches_give_the_same_bits(monkeypatch, cuda_device):
    """Repeat decode launches reuse the compiled kernel directly (kernels.launch): the same
    bits as kernel[grid](...), dense and pooled (the pool updated in place), T = 1 and 3."""
    from kernels import launch
    from kernels.decode import ops

    for T in (1, 3):
        inp = make_decode_inputs(48, CONTEST, seed=T, device=cuda_device, tokens=T)
        pool = torch.cat([inp["state"], inp["state"]]).contiguous()
        slots = torch.arange(47, -1, -1, device=cuda_device, dtype=torch.int32) * 2
        runs = {}
        for mode in ("first", "again", "plain"):
            if mode == "plain":
                monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
            dense = gdn_decode(**inp)
            p = pool.clone()
            out, _ = gdn_decode(**{**inp, "state": p}, state_indices=slots, check_values=False)
            runs[mode] = (dense[0], dense[1], out, p)
            if mode == "again":
                assert launch.fast_launch_enabled() and ops._DECODE_LAUNCH._compiled
        monkeypatch.delenv("GDN_FAST_LAUNCH")
        for mode in ("first", "again"):
            assert all(torch.equal(a, b) for a, b in zip(runs[mode], runs["plain"])), (T, mode)
        assert check_outputs(runs["again"][:2], decode_reference(**inp)).ok


# ----------------------------------------------------------------------------- bad inputs

BAD = [
    pytest.param(lambda i: {**i, "q": i["q"].float()}, {}, TypeError, "q", id="q-fp32"),
    pytest.param(lambda i: {**i, "state": i["state"][:, :, :8]}, {}, ValueError, "state",
                 id="state-shape"),
    pytest.param(lambda i: {**i, "b": i["b"][:1]}, {}, ValueError, "b", id="b-batch"),
    pytest.param(lambda i: i, {"output": torch.empty(2, 1, 2, 16, dtype=torch.float32)},
                 TypeError, "output", id="output-dtype"),
    pytest.param(lambda i: i, {"output": torch.empty(2, 1, 2, 8, dtype=torch.bfloat16)},
                 ValueError, "output", id="output-shape"),
    pytest.param(lambda i: i, {"config": DecodeConfig(32, 1, 1, 1)}, ValueError, "config",
                 id="config-BV-too-wide"),
    pytest.param(lambda i: i, {"config": DecodeConfig(8, 1, 1, 4)}, ValueError, "config",
                 id="config-tiles-too-many"),
    pytest.param(lambda i: i, {"config": "BV8-warps1"}, ValueError, "config name",
                 id="config-bad-name"),
]


@pytest.mark.parametrize("mutate, kwargs, exc, name", BAD)
def test_bad_inputs_raise_before_writing(mutate, kwargs, exc, name):
    inp = mutate(_inputs(2, GDNShape(1, 2, 16), seed=1))
    kwargs = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in kwargs.items()}
    before = inp["state"].clone()
    with pytest.raises(exc, match=name):
        gdn_decode(**inp, inplace=True, **kwargs)
    assert torch.equal(inp["state"], before), "state written before the error"


# ----------------------------------------------------------------------------- configs

def test_config_names_round_trip():
    assert FLA_LIKE.name == "BV8-w1-s1-t1"
    assert FLA_LIKE == DecodeConfig(BV=8, num_warps=1, num_stages=1, V_TILES=1)
    grid = config_grid(evict_first=(False, True), stages=(1, 2))
    assert len({c.name for c in grid}) == len(grid)
    for cfg in grid:
        assert DecodeConfig.from_name(cfg.name) == cfg
    assert C("BV32-w4-s2-t2-pf-ef") == DecodeConfig(32, 4, 2, 2, PREFETCH=True, EVICT_FIRST=True)
    assert C("BV32-w4-s1-t1-k32").BK == 32 and C("BV32-w4-s1-t1-k128") == C("BV32-w4-s1-t1")


@pytest.mark.parametrize("D", [16, 128])
def test_config_grid_is_valid(D):
    grid = config_grid(head_dim=D, stages=(1, 2))
    assert grid and (FLA_LIKE in grid) == (D == 128)
    for cfg in grid:
        cfg.check(D)
        assert cfg.V_TILES > 1 or (cfg.num_stages == 1 and not cfg.PREFETCH)
        assert cfg.BK <= D and cfg.BV * cfg.BK >= 128 * cfg.num_warps


def test_config_rejects_non_power_of_two_and_fits_small_d():
    with pytest.raises(ValueError, match="BV"):
        DecodeConfig(12, 1, 1)
    with pytest.raises(ValueError, match="num_stages"):
        DecodeConfig(8, 1, 0)
    with pytest.raises(ValueError, match="BK"):
        DecodeConfig(8, 1, 1, BK=2)
    fitted = C("BV32-w4-s1-t2-pf").fit(16)
    fitted.check(16)
    assert fitted == DecodeConfig(16, 2, 1, 1)
    assert FLA_LIKE.fit(128) is FLA_LIKE


# ----------------------------------------------------------------------------- tables

def test_gpu_slug():
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"


def test_table_round_trip(tmp_path):
    table = {1: FLA_LIKE, 16: C("BV32-w4-s1-t1"), 64: C("BV64-w4-s1-t2-pf")}
    path = write_config_table(table, "test-gpu", tmp_path, source="unit test",
                              meta={"method": "graph"})
    assert path == tmp_path / "test-gpu.json"
    doc = json.loads(path.read_text())
    assert doc["source"] == "unit test" and doc["method"] == "graph" and doc["timestamp"]
    assert doc["configs"] == {"1": "BV8-w1-s1-t1", "16": "BV32-w4-s1-t1", "64": "BV64-w4-s1-t2-pf"}
    assert load_config_table("test-gpu", tmp_path) == table
    # rewriting refreshes the cache
    write_config_table({1: "BV16-w2-s1-t1"}, "test-gpu", tmp_path)
    assert load_config_table("test-gpu", tmp_path) == {1: C("BV16-w2-s1-t1")}


@pytest.mark.parametrize("batch, expected", [
    pytest.param(1, "BV16-w1-s1-t1", id="below-smallest"),
    pytest.param(4, "BV16-w1-s1-t1", id="exact"),
    pytest.param(7, "BV16-w1-s1-t1", id="between-takes-below"),
    pytest.param(16, "BV32-w4-s1-t1", id="exact-2"),
    pytest.param(63, "BV32-w4-s1-t1", id="between-2"),
    pytest.param(64, "BV64-w4-s1-t1", id="max"),
    pytest.param(1000, "BV64-w4-s1-t1", id="above-max"),
])
def test_config_for_fallback_rules(tmp_path, batch, expected):
    write_config_table({4: "BV16-w1-s1-t1", 16: "BV32-w4-s1-t1", 64: "BV64-w4-s1-t1"},
                       "test-gpu", tmp_path)
    assert config_for(batch, "test-gpu", tmp_path).name == expected


def test_unknown_gpu_uses_default_table(tmp_path):
    for batch in (1, 5, 64, 512):
        got = config_for(batch, "no-such-gpu", tmp_path)
        below = max([b for b in DEFAULT_TABLE if b <= batch] or [min(DEFAULT_TABLE)])
        assert got == DEFAULT_TABLE[below]
    with pytest.raises(ValueError, match="batch"):
        config_for(0, "no-such-gpu", tmp_path)


def test_malformed_table_raises(tmp_path):
    (tmp_path / "broken.json").write_text('{"configs": {"1": "not-a-config"}}')
    with pytest.raises(ValueError, match="broken.json"):
        load_config_table("broken", tmp_path)


@pytest.mark.parametrize("slug", ["nvidia-h200", "nvidia-h100-80gb-hbm3"])
def test_shipped_tables_cover_contest_batches(slug):
    table = load_config_table(slug)
    assert table, f"missing kernels/decode_configs/{slug}.json"
    for cfg in table.values():
        cfg.check(CONTEST.head_dim)
    assert min(table) == 1
