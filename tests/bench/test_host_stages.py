"""The host-stage profiler (kernels.bench.host_stages) on the CPU: its smoke run times every
stage of a decode call and of prefill calls on three paths, and writes the rows."""
import csv
import math

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
    assert [r["stage"] for r in by[("floor", "")]] == ["bare_launch"]
    stages = {key: [r["stage"] for r in rs] for key, rs in by.items()}
    assert stages[("decode", "B=1")] == ["call", "checks", "alloc", "bind:decode",
                                         "launch:decode", "rest"]
    paths = {key: rs[0]["path"] for key, rs in by.items() if key[0] == "prefill"}
    assert paths == {("prefill", "6"): "recurrent", ("prefill", "2x64"): "single",
                     ("prefill", "256"): "walk"}
    assert stages[("prefill", "256")] == ["call", "checks+plan", "alloc", "workspace",
                                          "bind:intra", "bind:walk", "launch:intra",
                                          "launch:walk", "rest"]
    for r in rows:
        if r["stage"] != "rest":
            assert math.isfinite(float(r["host_us"])) and float(r["host_us"]) > 0, r
            assert int(r["calls"]) == 4, r
