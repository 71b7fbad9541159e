"""kernels.report: target tables computed from result CSVs (synthetic folders)."""
import pandas as pd
import pytest

from kernels.report import (decode_methods, decode_targets, main, prefill_host, prefill_targets,
                            replay_targets,
                            scaling_targets)


def _write(tmp_path):
    gpu = tmp_path / "gpu-x"
    (gpu / "01_decode_crossover").mkdir(parents=True)
    (gpu / "02_prefill_launch_overhead").mkdir(parents=True)
    rows = []
    for label, impl, t1, t64 in [("fla", "fla", 2.6, 18.3), ("flashinfer", "flashinfer", 2.7, 18.4),
                                 ("ours-adaptive", "ours", 2.0, 18.0),
                                 ("ours-fla-like", "ours", 2.3, 18.1)]:
        for B, t in ((1, t1), (64, t64)):
            rows.append(dict(impl=impl, config="c", B=B, method="cupti_cold", median_us=t,
                             p20_us=t, p80_us=t, floor_us=0.25 * B, label=label))
    pd.DataFrame(rows).to_csv(gpu / "01_decode_crossover" / "decode_times.csv", index=False)
    rows = []
    for label, impl, variant, g, c, n in [("fla", "fla", "default", 34.0, 700.0, 15),
                                          ("flashinfer", "flashinfer", "default", 46.0, 400.0, 13),
                                          ("ours-fused", "ours", "fused", 20.0, 42.0, 2),
                                          ("ours-no_sync", "ours", "no_sync", 25.0, 190.0, 4)]:
        for method, t in (("graph", g), ("cupti_cold", c)):
            rows.append(dict(impl=impl, variant=variant, lens="6", T=6, N=1, method=method,
                             median_us=t, launches=n, label=label))
    pd.DataFrame(rows).to_csv(gpu / "02_prefill_launch_overhead" / "prefill_times.csv", index=False)
    return gpu


def test_decode_target_is_the_larger_of_peer_and_floor(tmp_path):
    d = decode_targets(_write(tmp_path)).set_index("B")
    assert d.loc[1, "target"] == pytest.approx(0.9 * 2.6)          # peer-bound
    assert d.loc[64, "target"] == pytest.approx(16.0 / 0.95)       # floor-bound
    assert bool(d.loc[1, "met"]) and not bool(d.loc[64, "met"])


def test_prefill_best_variant_and_eager_ratio(tmp_path):
    p = prefill_targets(_write(tmp_path)).iloc[0]
    assert p["ours variant"] == "fused" and p["ours best"] == 20.0
    assert p["target"] == pytest.approx(0.9 * 34.0) and bool(p["met"])
    assert p["span / graph"] == pytest.approx(42.0 / 20.0) and p["fused launches"] == 2


def test_update_rewrites_only_the_block(tmp_path):
    _write(tmp_path)
    doc = tmp_path / "results.md"
    doc.write_text("intro\n<!-- results:begin -->\nSTALE-TABLE\n<!-- results:end -->\noutro\n")
    main(["--results", str(tmp_path), "--gpus", "gpu-x", "--update", "--doc", str(doc)])
    s = doc.read_text()
    assert s.startswith("intro\n") and s.endswith("outro\n") and "STALE-TABLE" not in s
    assert "| 64 |" in s and "Decode, gpu-x" in s


def test_decode_methods_host_against_the_bare_launch(tmp_path):
    gpu = _write(tmp_path)
    path = gpu / "01_decode_crossover" / "decode_times.csv"
    d = pd.read_csv(path)
    host = [dict(impl="ours", config="c", B=B, method="host", median_us=h, p20_us=h, p80_us=h,
                 floor_us=10.0, label=label)
            for label, hs in (("ours-adaptive", (30.0, 25.0)), ("fla", (90.0, 20.0)))
            for B, h in zip((1, 64), hs)]
    graph = [dict(impl="ours", config="c", B=B, method="graph", median_us=g, p20_us=g, p80_us=g,
                  floor_us=0.25 * B, label="ours-adaptive") for B, g in ((1, 1.8), (64, 26.0))]
    pd.concat([d, pd.DataFrame(host + graph)]).to_csv(path, index=False)
    m = decode_methods(gpu).set_index("B")
    assert m.loc[1, "cupti_cold"] == 2.0 and m.loc[1, "host"] == 30.0
    assert m.loc[1, "host / bare"] == pytest.approx(3.0) and m.loc[64, "bare launch"] == 10.0
    assert m.loc[1, "lowest host"] == "ours-adaptive 30.0"
    assert m.loc[64, "lowest host"] == "fla 20.0"
    # host-bound: host time per eager call above the GPU time (graph) at that B
    assert m.loc[1, "host-bound"] == "**yes**"           # 30 µs of host against 1.8 of GPU
    assert m.loc[64, "host-bound"] == "no"               # 25 against 26


def test_replay_targets_best_L_against_the_standard_step(tmp_path):
    gpu = _write(tmp_path)
    rows = []
    for B, std, reps in ((64, 10.0, {1: 12.0, 4: 6.0}), (512, 100.0, {1: 120.0, 4: 70.0})):
        rows.append(dict(kind="standard", L=0, B=B, state_dtype="float32", us_per_token=std,
                         frac_of_floor=1.0))
        rows += [dict(kind="replay", L=L, B=B, state_dtype="float32", us_per_token=t,
                      frac_of_floor=0.5) for L, t in reps.items()]
    pd.DataFrame(rows).to_csv(gpu / "01_decode_crossover" / "replay_times.csv", index=False)
    r = replay_targets(gpu).set_index("B")
    assert list(r.index) == [64, 512] and (r["best L"] == 4).all()
    assert r.loc[64, "replay / standard"] == pytest.approx(0.6) and bool(r.loc[64, "met"])
    assert r.loc[512, "replay / standard"] == pytest.approx(0.7) and not bool(r.loc[512, "met"])


def test_scaling_targets_against_the_fastest_peer(tmp_path):
    gpu = _write(tmp_path)
    (gpu / "04_prefill_scaling").mkdir()
    rows = []
    for impl, a, b in [("flashqla", 700.0, 140.0), ("flashinfer", 800.0, 130.0),
                       ("fla (triton)", 3000.0, 260.0), ("ours", 900.0, 110.0)]:
        rows.append(dict(impl=impl, label=impl, lens="131072", T=131072, N=1, method="graph",
                         median_us=a))
        rows.append(dict(impl=impl, label=impl, lens="8192", T=8192, N=1, method="graph",
                         median_us=b))
        rows.append(dict(impl=impl, label=impl, lens="8192", T=8192, N=1, method="kernel",
                         median_us=1.0))
    pd.DataFrame(rows).to_csv(gpu / "04_prefill_scaling" / "prefill_scaling.csv", index=False)
    s = scaling_targets(gpu).set_index("lens")
    assert list(s.index) == ["8192", "131072"]                 # by total tokens
    assert s.loc["131072", "ours / fastest peer"] == pytest.approx(900 / 700)
    assert not bool(s.loc["131072", "met"]) and bool(s.loc["8192", "met"])
    assert s.loc["8192", "target"] == pytest.approx(0.9 * 130)


def test_a_peer_row_with_a_column_joins_the_tables(tmp_path, monkeypatch):
    """The peer columns are the rows of kernels.peers.PEERS with a column, in their order: a
    new row's peer gets its column in notebook 04's table."""
    from kernels import peers

    gpu = _write(tmp_path)
    (gpu / "04_prefill_scaling").mkdir()
    rows = [dict(impl=impl, label=impl, lens="8192", T=8192, N=1, method="graph", median_us=t)
            for impl, t in (("flashqla", 140.0), ("fla (triton)", 260.0), ("new peer", 100.0),
                            ("ours", 110.0))]
    pd.DataFrame(rows).to_csv(gpu / "04_prefill_scaling" / "prefill_scaling.csv", index=False)
    before = scaling_targets(gpu)
    assert list(before.columns[2:4]) == ["FLA (triton)", "FlashQLA"]   # PEERS' order
    new = peers.Peer("newpeer", "prefill", peers._torch_prefill, "new peer", "torch",
                     column="New")
    monkeypatch.setattr(peers, "PEERS", peers.PEERS + (new,))
    s = scaling_targets(gpu).iloc[0]
    assert s["New"] == 100.0 and "New" not in before.columns


def test_triton_versions_table_and_untimed_note(tmp_path):
    from kernels.report import triton_versions_table, untimed_note

    gpu = tmp_path / "gpu-y"
    rows = []
    for v, px, f in (("3.6.0", "ptxas 12.8", 1.0), ("3.9.0", "ptxas-blackwell 13.4", 1.1)):
        rows += [dict(triton=v, ptxas=px, kernel="decode", shape="B=1", inputs="contest",
                      passed=True, graph_us=5.0 * f),
                 dict(triton=v, ptxas=px, kernel="prefill", shape="T6", inputs="contest",
                      passed=True, graph_us=10.0 * (2 - f)),
                 dict(triton=v, ptxas=px, kernel="prefill", shape="8x64", inputs="stress s=0",
                      passed=False, graph_us=None),
                 dict(triton=v, ptxas=px, kernel="prefill-accurate", shape="8x64",
                      inputs="stress s=0", passed=True, graph_us=None)]
    gpu.mkdir()
    pd.DataFrame(rows).to_csv(gpu / "triton_versions.csv", index=False)
    t = triton_versions_table(gpu).set_index("triton")
    assert t.loc["3.9.0", "ptxas"] == "ptxas-blackwell 13.4"
    assert t.loc["3.9.0", "contest gate"] == "2/2"
    assert t.loc["3.9.0", "hard inputs, default"] == "0/1"
    assert t.loc["3.9.0", "hard inputs, accurate"] == "1/1"
    assert t.loc["3.9.0", "decode graph / 3.6.0"] == "1.10–1.10"
    assert t.loc["3.9.0", "prefill graph / 3.6.0"] == "0.90–0.90"

    assert untimed_note(gpu) == ""   # no notebook 04 gate
    (gpu / "04_prefill_scaling").mkdir()
    pd.DataFrame([dict(label="ours", impl="ours", lens="8", status="pass", reason=""),
                  dict(label="peer", impl="peer", lens="1048576", status="error",
                       reason="OutOfMemoryError: CUDA out of memory. Tried 4 GiB\nmore")]
                 ).to_csv(gpu / "04_prefill_scaling" / "gate.csv", index=False)
    assert untimed_note(gpu) == (" Not timed (—): peer at 1048576: error "
                                 "(OutOfMemoryError: CUDA out of memory).")


def test_committed_results_page_matches_the_committed_csvs():
    """docs/results.md's generated block is what ``--update`` writes from ``results/``."""
    from pathlib import Path

    from kernels.report import BEGIN, END, render

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "results.md").read_text()
    block = page[page.index(BEGIN) + len(BEGIN):page.index(END)].strip()
    expected = render(root / "results", ["nvidia-h200", "nvidia-h100-80gb-hbm3"]).strip()
    assert block == expected, "docs/results.md is stale: run python -m kernels.report --update"


def test_solution_and_contest_tables_from_csvs(tmp_path):
    """The generated solution and contest tables carry the CSVs' numbers: each solution's
    column next to ours, a failed workload shown as failed, the score row from scores.csv."""
    import json

    import pandas as pd

    from kernels.report import contest_table, solution_times

    nb = tmp_path / "01_decode_crossover"
    nb.mkdir()
    pd.DataFrame([
        dict(impl="ours", B=1, method="cupti_cold", median_us=2.0, label="ours-adaptive"),
        dict(impl="solution", B=1, method="cupti_cold", median_us=3.5, label="sol-a"),
        dict(impl="solution", B=1, method="graph", median_us=9.0, label="sol-a"),
    ]).to_csv(nb / "decode_times.csv", index=False)
    sol = solution_times(tmp_path)
    assert list(sol.columns) == ["notebook", "shape", "ours (ours-adaptive)", "sol-a"]
    assert sol.iloc[0]["sol-a"] == 3.5 and sol.iloc[0]["shape"] == "B=1"

    c = tmp_path / "contest_decode"
    c.mkdir()
    pd.DataFrame([
        dict(workload="1", solution="base", status="PASSED", fib_us=4.0),
        dict(workload="1", solution="mine", status="PASSED", fib_us=2.0),
        dict(workload="4", solution="base", status="PASSED", fib_us=8.0),
        dict(workload="4", solution="mine", status="INCORRECT_NUMERICAL", fib_us=1.0),
    ]).to_csv(c / "comparison.csv", index=False)
    pd.DataFrame([dict(solution="mine", score=0.0)]).to_csv(c / "scores.csv", index=False)
    (c / "run.json").write_text(json.dumps({"git_sha": "abcdef0123"}))
    t, run = contest_table(tmp_path, "decode")
    t = t.set_index("workload")
    assert t.loc["1", "mine"] == "2.00" and t.loc["4", "mine"] == "failed"
    assert t.loc["score", "mine"] == "**0.00**" and t.loc["score", "base"] == "baseline"
    assert run["git_sha"] == "abcdef0123"
    assert contest_table(tmp_path, "prefill")[0].empty


def test_prefill_host_against_the_bare_launch(tmp_path):
    gpu = _write(tmp_path)
    path = gpu / "02_prefill_launch_overhead" / "prefill_times.csv"
    d = pd.read_csv(path)
    assert prefill_host(gpu).empty                     # no host rows: no table
    host = [dict(impl="x", variant="v", lens="6", T=6, N=1, method="host", median_us=h,
                 launches=1, label=label, floor_us=15.0)
            for label, h in (("ours-fused", 45.0), ("flashinfer", 300.0), ("fla", 40.0))]
    pd.concat([d, pd.DataFrame(host)]).to_csv(path, index=False)
    h = prefill_host(gpu).set_index("lens").loc["6"]
    assert h["graph"] == 20.0 and h["cupti_cold"] == 42.0 and h["host"] == 45.0
    assert h["host / bare"] == pytest.approx(3.0) and h["lowest host"] == "fla 40.0"
    assert h["host-bound"] == "**yes**"                # 45 µs of host against 20 of GPU


def test_multi_gpu_scaling_table_on_the_results_page(tmp_path):
    folder = tmp_path / "2x-gpu-x" / "05_prefill_multi_gpu"
    folder.mkdir(parents=True)
    pd.DataFrame([dict(T=262144, gpus=2, **{"ours 1 GPU (µs)": 1500.0, "ours 2 GPUs (µs)": 900.0,
                                              "fla 1 GPU (µs)": 7000.0, "speedup": 1500 / 900,
                                              "efficiency": 1500 / 1800})]
                 ).to_csv(folder / "scaling.csv", index=False)
    pd.DataFrame([dict(impl="ours", gpus=1, T=262144, method="head_start_events",
                       median_us=1500.0)]).to_csv(folder / "times.csv", index=False)
    (folder / "provenance.json").write_text('{"git_sha": "abcdef123"}')
    doc = tmp_path / "results.md"
    doc.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    main(["--results", str(tmp_path), "--gpus", "none", "--update", "--doc", str(doc)])
    s = doc.read_text()
    assert "notebook 05), 2x-gpu-x" in s and "| 262144 | 1500.0 | 900.0 | 1.67 |" in s
    assert "At `abcdef1`" in s and "head_start_events" in s and "efficiency" not in s


def test_committed_runs_table_from_provenance(tmp_path):
    """The runs table reads each run's own record: commit (7 characters), date, and whether
    the suite's timing methods of that commit had the fix, or what else timed it."""
    import json
    import subprocess
    from pathlib import Path

    import pandas as pd

    from kernels.report import TIMING_FIX, committed_runs, timing_era

    repo = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "rev-parse", TIMING_FIX], cwd=repo,
                      capture_output=True).returncode:
        pytest.skip("the timing fix's commit is not in this clone")
    fix = subprocess.run(["git", "rev-parse", TIMING_FIX], cwd=repo, capture_output=True,
                         text=True).stdout.strip()
    before = subprocess.run(["git", "rev-parse", TIMING_FIX + "~1"], cwd=repo,
                            capture_output=True, text=True).stdout.strip()
    gpu = tmp_path / "some-gpu"
    for name, sha in (("01_decode_crossover", fix), ("02_prefill_launch_overhead", before),
                      ("03_ncu_instruction_counts", before)):
        (gpu / name).mkdir(parents=True)
        (gpu / name / "provenance.json").write_text(json.dumps(
            {"git_sha": sha, "timestamp": "2026-11-28T00:00:00+00:00"}))
    (gpu / "faults.provenance.json").write_text(json.dumps({"git_sha": "f" * 40,
                                                            "timestamp": "2026-11-27T01:00"}))
    pd.DataFrame([dict(git_sha=before, timestamp="2026-11-25T15:58:19+00:00")]).to_csv(
        gpu / "triton_versions.csv", index=False)
    t = committed_runs(tmp_path).set_index("results")
    assert t.loc["01_decode_crossover/", "timing"] == f"ours, after `{TIMING_FIX}`"
    assert t.loc["01_decode_crossover/", "commit"] == f"`{fix[:7]}`"
    assert t.loc["02_prefill_launch_overhead/", "timing"] == f"ours, before `{TIMING_FIX}`"
    assert t.loc["03_ncu_instruction_counts/", "timing"].startswith("none")
    assert t.loc["faults.csv", "date"] == "2026-11-27" and t.loc["faults.csv", "commit"] == "`fffffff`"
    assert t.loc["triton_versions.csv", "timing"] == f"ours, before `{TIMING_FIX}`"
    assert timing_era("f" * 40) == "unknown"
