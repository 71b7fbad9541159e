"""The host-stage profiler (kernels.bench.host_stages) on the CPU: its smoke run times every
stage of a repeat decode call and of repeat prefill calls on three paths (the replay of the
recorded launch list and each of its launches alone), and writes the rows."""
import csv
import math

import pytest

from kernels import interpret
from kernels.bench import host_stages


def test_smoke_run_times_every_stage(tmp_path):
    out = tmp_path / "stages.csv"
    assert host_stages.main(["--smoke", "--out", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == host_stages.COLUMNS
    by = {}
    for r in rows:
        by.setdefault((r["kind"], r["shape"]), []).append(r)
    assert [r["stage"] for r in by[("floor", "")]] == ["bare_launch", "recorded_launch"]
    stages = {key: [r["stage"] for r in rs] for key, rs in by.items()}
    paths = {key: rs[0]["path"] for key, rs in by.items() if key[0] == "prefill"}
    assert by[("replay_decode", "B=1")][0]["path"] == f"L={host_stages.REPLAY_L}"
    # the rows name the plan the call took: the planner's, whose rules depend on the device
    # (on an H100 the 2 x 64 call is a walk; off CUDA the single launch)
    import torch
    from kernels.prefill.plan import prefill_plan
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    want = {("prefill", "2x64"): prefill_plan(128, 2, 2, 16, dev).path,
            ("prefill", "256"): prefill_plan(256, 1, 2, 16, dev).path}
    assert paths == {("prefill", "6"): "recurrent", **want}
    if dev == "cpu":
        assert want == {("prefill", "2x64"): "single", ("prefill", "256"): "walk"}
    if stages[("decode", "B=1")][1] == "fastcall":   # (CUDA: the calls' plans serve them)
        from kernels import fastcall
        assert fastcall.status()["loaded"]
        gpu = ["gpu_graph"] if dev == "cuda" else []   # (CUDA: the call's GPU time beside)
        assert stages[("decode", "B=1")] == ["call", "fastcall", "rest", "python_path",
                                             "launch:gdn_decode_kernel", *gpu]
        assert stages[("prefill", "256")] == ["call", "fastcall", "rest", "python_path",
                                              "launch:intra_chunk_kernel",
                                              "launch:state_walk_kernel", *gpu]
        assert stages[("replay_decode", "B=1")] == ["call", "fastcall", "rest", "python_path",
                                                    "launch:gdn_replay_kernel", *gpu]
    else:
        assert stages[("decode", "B=1")] == ["call", "checks", "alloc", "replay", "rest",
                                             "launch:gdn_decode_kernel"]
        # (the replay decode off CUDA checks its ring headers on the host: "values")
        assert stages[("replay_decode", "B=1")] == ["call", "checks", "values", "alloc",
                                                    "replay", "rest",
                                                    "launch:gdn_replay_kernel"]
        # (off CUDA the values of cu_seqlens are checked on the host: the "values" stage)
        assert stages[("prefill", "6")] == ["call", "checks+plan", "values", "alloc",
                                            "replay", "rest",
                                            "launch:recurrent_prefill_kernel"]
        assert stages[("prefill", "256")] == ["call", "checks+plan", "values", "alloc",
                                              "workspace", "replay", "rest",
                                              "launch:intra_chunk_kernel",
                                              "launch:state_walk_kernel"]
    for r in rows:
        if r["stage"] != "rest":
            assert math.isfinite(float(r["host_us"])) and float(r["host_us"]) > 0, r
            if r["stage"] == "gpu_graph":   # (the graph method's sample count)
                assert int(r["calls"]) >= 10, r
            else:
                assert int(r["calls"]) == 4, r


def test_key_costs_time_each_variant_with_the_launch_stubbed():
    rows = host_stages.key_costs(n=50)
    assert [r["stage"] for r in rows][:5] == ["signature", "lookup", "signature_strides",
                                              "data_ptrs", "call_stubbed"]
    assert all(r["kind"] == "key" and r["host_us"] > 0 and r["calls"] == 50 for r in rows)


@pytest.mark.skipif(not interpret.INTERPRET, reason="the stub build on CPU inputs (the GPU "
                    "smoke run above times the CUDA plans)")
def test_decode_served_by_its_plan_times_the_c_call(monkeypatch):
    """Where the decode call is served by its fastcall plan (the stub build here) the stages
    are that one C call, then the Python replay it replaced and the list's launches."""
    from kernels import fastcall
    from kernels.decode import ops
    from kernels.spec import GDNShape, make_decode_inputs

    if fastcall._compiler() is None or fastcall.load() is None:
        pytest.skip(f"no fastcall extension here ({fastcall.status()['reason']})")
    ops.clear_calls()
    try:
        with fastcall.serving_stub():
            inp = make_decode_inputs(1, GDNShape(1, 2, 16), device="cpu")
            stages, parts = host_stages.decode_stages(inp)
            args = [inp[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")]
            from kernels.decode import gdn_decode
            rows = host_stages._rows("decode", "B=1", "", lambda: gdn_decode(*args), stages,
                                     parts, 2, 2, lambda: None, False)
            assert ops._LAST is not None   # (python_path put the plan back)
    finally:
        ops.clear_calls()
    assert [r["stage"] for r in rows] == ["call", "fastcall", "rest", "python_path",
                                          "launch:gdn_decode_kernel"]
    assert all(float(r["host_us"]) > 0 for r in rows if r["stage"] != "rest")


@pytest.mark.skipif(not interpret.INTERPRET, reason="the stub build on CPU inputs (the GPU "
                    "smoke run above times the CUDA plans)")
def test_replay_decode_served_by_its_plan_times_the_c_call():
    """The replay decode with its values unchecked (the CUDA default) is served by its plan
    (the stub build here): the stages are that one C call, then the Python replay it
    replaced and the list's launch."""
    from kernels import fastcall
    from kernels.decode import gdn_replay_decode, replay
    from kernels.spec import GDNShape, make_decode_inputs

    if fastcall._compiler() is None or fastcall.load() is None:
        pytest.skip(f"no fastcall extension here ({fastcall.status()['reason']})")
    replay.clear_calls()
    try:
        with fastcall.serving_stub():
            inp = make_decode_inputs(1, GDNShape(1, 2, 16), device="cpu")
            ring = host_stages.replay_ring(inp)
            stages, parts = host_stages.replay_decode_stages(inp, ring, check_values=False)
            args = [inp[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")]
            rows = host_stages._rows(
                "replay_decode", "B=1", "", lambda: gdn_replay_decode(
                    *args, ring=ring, check_values=False), stages, parts, 2, 2, lambda: None,
                False)
            assert replay._LAST is not None   # (python_path put the plan back)
    finally:
        replay.clear_calls()
    assert [r["stage"] for r in rows] == ["call", "fastcall", "rest", "python_path",
                                          "launch:gdn_replay_kernel"]
    assert all(float(r["host_us"]) > 0 for r in rows if r["stage"] != "rest")
