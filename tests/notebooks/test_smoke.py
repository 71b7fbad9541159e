"""Execute every notebook end to end in the smoke profile (papermill, via the runner).

Marked ``slow`` (a few minutes on 2 CPU cores under the Triton interpreter);
it still runs in CI. One module-scoped run of ``python -m kernels.runner
--profile smoke --notebooks all`` into ``tmp_path``, then per notebook: it
completed, its CSVs carry the docs/design.md results-contract columns, no implementation produced a
wrong result, ours passed the gate everywhere (a GPU peer may refuse the
smoke profile's small head size: reported, not failed), its PNGs, conclusion
and provenance exist.

On the CPU nothing is timed on a GPU and nothing pretends it was: decode
timings use the ``cpu_wall`` method only, the prefill notebook writes no
``prefill_times.csv``, and the ncu notebook parses the committed fixtures
(``source`` = ``fixture:...``).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

REQUIRED = {
    "01_decode_crossover": ("decode_times.csv",
                            ["impl", "config", "B", "method", "median_us", "p20_us", "p80_us",
                             "floor_us"]),
    "02_prefill_launch_overhead": ("prefill_times.csv",
                                   ["impl", "variant", "lens", "T", "N", "method", "median_us",
                                    "launches"]),
    "03_ncu_instruction_counts": ("ncu_metrics.csv",
                                  ["impl", "config", "B", "kernel", "metric", "value"]),
    "04_prefill_scaling": ("prefill_scaling.csv",
                           ["impl", "lens", "T", "N", "method", "median_us", "p20_us",
                            "p80_us", "kernel", "role"]),
    "05_prefill_multi_gpu": ("times.csv",
                             ["impl", "gpus", "T", "method", "median_us", "p20_us", "p80_us"]),
    "06_in_the_model": ("prefill_times.csv",
                        ["impl", "part", "T", "B", "method", "median_us", "p20_us", "p80_us"]),
}
IMPLS = {"ours", "fla", "flashinfer", "torch", "fla (triton)", "fla (flashqla backend)",
         "flashqla", "fla_recurrent", "ours (multi_gpu)", "fla cp_context"}


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Run all notebooks once; returns (result dir, runner output, seconds)."""
    from tests.results_guard import smoke_results_state

    root = tmp_path_factory.mktemp("smoke-results")
    users = smoke_results_state()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.runner", "--profile", "smoke", "--notebooks", "all",
         "--output-root", str(root), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=850)
    seconds = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"runner failed ({proc.returncode}):\n{log[-6000:]}"
    # a user's `make run` results (results/smoke/) are left as they were
    assert smoke_results_state() == users, "the test run wrote into results/smoke/"
    slugs = [p for p in root.iterdir() if p.is_dir()]
    assert len(slugs) == 1, f"expected one <gpu-slug> folder under {root}: {slugs}"
    return slugs[0], log, seconds


def test_smoke_summary(smoke):
    """The runner's end-of-run summary names every notebook with its seconds and the count.

    How long the run takes is printed (CI logs keep it), never asserted: a wall-time
    bound on a shared 2-core machine tests the machine, not the code.
    """
    _, log, seconds = smoke
    print(f"smoke run of all notebooks: {seconds:.0f} s")
    summary = log[log.index("== summary"):]
    for stem in REQUIRED:
        assert re.search(rf"^{stem}: ok \(\d+ s\)$", summary, re.M), f"{stem} not ok:\n{summary}"
    assert f"{len(REQUIRED)}/{len(REQUIRED)} notebooks ok" in summary


@pytest.mark.parametrize("stem", list(REQUIRED))
def test_notebook_outputs(smoke, stem):
    out, _, _ = smoke
    folder = out / stem
    assert (out / f"{stem}.ipynb").exists(), f"executed notebook of {stem} missing"
    assert folder.is_dir(), f"result folder {folder} missing"
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["params"]["profile"] == "smoke"
    assert prov["experiment"]["notebook"] == stem
    assert (folder / "conclusion.md").read_text().startswith("### Conclusion")
    assert list(folder.glob("*.png")), f"{stem}: no figures"
    csv, cols = REQUIRED[stem]
    if stem == "02_prefill_launch_overhead" and not _has_gpu():
        # no GPU, no timelines: no timings file at all rather than placeholder rows
        assert not (folder / csv).exists(), "prefill_times.csv written without GPU timings"
        return
    df = pd.read_csv(folder / csv)
    assert len(df), f"{csv} is empty"
    missing = [c for c in cols if c not in df.columns]
    assert not missing, f"{csv} lacks columns {missing}"
    assert set(df.impl) <= IMPLS | ({"unknown"} if stem.startswith("03") else set())


@pytest.mark.parametrize("stem", ["01_decode_crossover", "02_prefill_launch_overhead"])
def test_gate_passed_for_every_impl_that_ran(smoke, stem):
    out, _, _ = smoke
    gate = pd.read_csv(out / stem / "gate.csv")
    ran = gate[gate.status != "unavailable"]
    assert len(ran), f"{stem}: no implementation ran"
    # a wrong result fails, whoever produced it
    wrong = ran[ran.status == "fail"]
    assert wrong.empty, f"{stem}: gate failures:\n{wrong.to_string()}"
    # ours must run everywhere; a peer may refuse the smoke profile's small head size
    # (status "error" with its exception, reported in gate.csv and the conclusion)
    ours = ran[ran.impl == "ours"]
    assert len(ours) and (ours.status == "pass").all(), ours[ours.status != "pass"].to_string()
    peers_err = ran[(ran.impl != "ours") & (ran.status == "error")]
    if len(peers_err):
        print(f"{stem}: peers that raised on the smoke shape:\n"
              f"{peers_err[['label', 'reason']].drop_duplicates().to_string()}")
    if not _has_gpu():
        assert peers_err.empty, peers_err.to_string()


def test_decode_smoke_specifics(smoke):
    out, _, _ = smoke
    folder = out / "01_decode_crossover"
    times = pd.read_csv(folder / "decode_times.csv")
    gate = pd.read_csv(folder / "gate.csv")
    if not _has_gpu():
        assert set(times.method) == {"cpu_wall"}, "only honest CPU timings on the CPU"
    # only implementations that passed the gate at that B were timed
    passed = set(map(tuple, gate[gate.status == "pass"][["label", "B"]].values))
    assert set(map(tuple, times[["label", "B"]].values)) <= passed
    for png in ("time_vs_B", "speedup", "bw_fraction", "sweep_heatmaps", "serving_pooled",
                "serving_tokens", "serving_state_dtype", "drift"):
        assert (folder / f"{png}.png").exists(), png
    assert list((folder / "decode_configs").glob("*.json")), "dispatch table not written"
    assert (times.floor_us > 0).all()
    # serving sections: every case of ours passed and was timed (cpu_wall on the CPU)
    sgate = pd.read_csv(folder / "serving_gate.csv")
    ours = sgate[sgate.label == "ours"]
    assert len(ours) and (ours.status == "pass").all(), ours.to_string()
    assert not (sgate.status == "fail").any()
    serving = pd.read_csv(folder / "serving_times.csv")
    assert set(serving.section) == {"pooled", "tokens", "state_dtype"}
    assert {"pooled", "dense"} <= set(serving.layout) and serving["T"].max() > 1
    assert set(serving.state_dtype) == {"float32", "bfloat16"} and serving.intermediate.any()
    drift = pd.read_csv(folder / "drift.csv")
    assert set(drift.what) == {"output", "state"} and drift.step.max() > 1
    # replay section: every kind gated (and passed) before it was timed
    rgate = pd.read_csv(folder / "replay_gate.csv")
    assert len(rgate) and (rgate.status == "pass").all(), rgate.to_string()
    rtimes = pd.read_csv(folder / "replay_times.csv")
    assert set(rtimes.kind) == {"standard", "replay", "standard_spec", "replay_spec"}
    assert (rtimes.bytes_per_token > 0).all()
    for png in ("replay_times", "replay_spec_times", "replay_bytes", "replay_drift"):
        assert (folder / f"{png}.png").exists(), png


def test_prefill_smoke_specifics(smoke):
    out, _, _ = smoke
    folder = out / "02_prefill_launch_overhead"
    assert (folder / "gate_errors.png").exists()
    # the recurrent-vs-chunked section: every point gated, ours passing three ways
    rgate = pd.read_csv(folder / "recurrent_gate.csv")
    ours = rgate[rgate.impl == "ours"]
    assert set(ours.label) == {"ours-recurrent", "ours-chunked", "ours-fused"}
    assert (ours.status == "pass").all(), ours.to_string()
    assert not (rgate.status == "fail").any()
    if _has_gpu():
        for png in ("gantt", "waterfall", "time_vs_T", "busy_idle", "recurrent_crossover"):
            assert (folder / f"{png}.png").exists(), png
        assert list(folder.glob("trace_*.json")), "no Chrome traces saved"
        assert len(pd.read_csv(folder / "recurrent_crossover.csv"))
    else:
        skipped = pd.read_csv(folder / "skipped.csv")
        assert skipped.reason.str.contains("CUDA GPU").any()


def test_ncu_smoke_specifics(smoke):
    out, _, _ = smoke
    folder = out / "03_ncu_instruction_counts"
    df = pd.read_csv(folder / "ncu_metrics.csv")
    assert (folder / "metrics_per_impl.png").exists()
    if not _has_gpu():
        assert df.source.str.startswith("fixture:").all()
        assert "not from a measurement" in (folder / "conclusion.md").read_text()


def test_scaling_smoke_specifics(smoke):
    out, _, _ = smoke
    folder = out / "04_prefill_scaling"
    gate = pd.read_csv(folder / "gate.csv")
    assert (gate[gate.label == "ours"].status == "pass").all()
    assert set(gate.label) >= {"ours", "fla (triton)", "flashqla"}   # labels, never bare "fla"
    check = pd.read_csv(folder / "reference_check.csv")
    assert check.ok.all() and len(check) == gate.lens.nunique()
    plan = pd.read_csv(folder / "plan.csv")
    assert set(plan.path) <= {"recurrent", "one launch", "walk", "chained CP", "long CP",
                              "long CP, split on the device"}
    res = pd.read_csv(folder / "resources.csv")   # compiled for sm_90 on any host
    assert len(res) and (res.regs > 0).all() and (res.programs_per_sm >= 1).all()
    assert (folder / "time_vs_T.png").exists() and (folder / "gate_errors.png").exists()
    gates = pd.read_csv(folder / "gate_dependence.csv")   # every gate set of ours, gated
    ours = gates[(gates.impl == "ours") & (gates.method != "kernel")]
    assert list(ours.gates) == ["generator", "one long-memory head", "every head long memory"]
    assert ours.status.isin(["pass", "fail"]).all() and (ours.max_abs_err > 0).all()
    assert ours[ours.status == "pass"].median_us.notna().all()
    assert ours[ours.status != "pass"].median_us.isna().all()   # a failing set is not timed
    assert (folder / "gate_dependence.png").exists() and "**Gate dependence**" in (
        folder / "conclusion.md").read_text()
    if not _has_gpu():
        skipped = pd.read_csv(folder / "skipped.csv")
        # FlashQLA went through the peer worker, which reported why it cannot run here
        assert skipped.what.str.startswith("flashqla").any()
        assert skipped.reason.str.contains("CUDA GPU").any()
        # no per-kernel times of the peers either, and nothing pretends there were
        peer = skipped[skipped.what.str.contains("per-kernel times of every implementation")]
        assert len(peer) == 1 and "CUDA GPU" in peer.reason.iloc[0]
        assert not (folder / "peer_kernels.csv").exists()
    else:   # ours at least, beside whichever peer passed its gate at the smoke shape
        peer = pd.read_csv(folder / "peer_kernels.csv")
        assert "ours" in set(peer.impl) and (peer.median_us > 0).all()
        assert (folder / "peer_kernels.png").exists()


def test_multi_gpu_smoke_specifics(smoke):
    """Notebook 05 on the CPU: two gloo rank processes; ours gated on one and on both ranks
    (each rank its slice, a sequence straddling them) and timed with the host clock only;
    FLA and FlashQLA (its row through the peer worker) unavailable with their reasons; the
    scaling table's efficiency and host columns; the link probe and the exchange measured."""
    out, _, _ = smoke
    folder = out / "05_prefill_multi_gpu"
    assert (out / "05_prefill_multi_gpu.ipynb").exists()
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["experiment"]["ranks"]["world_size"] == 2
    assert prov["experiment"]["ranks"]["env"]["NCCL_NVLS_ENABLE"] == "0"
    gate = pd.read_csv(folder / "gate.csv")
    ours = gate[gate.impl.str.startswith("ours")]
    assert set(map(tuple, ours[["impl", "gpus"]].values)) == {
        ("ours", 1), ("ours (multi_gpu)", 1), ("ours (multi_gpu)", 2)}
    assert (ours.status == "pass").all(), ours.to_string()
    times = pd.read_csv(folder / "times.csv")
    assert len(times) == len(ours) and (times.median_us > 0).all()
    if not _has_gpu():
        assert set(times.method) == {"cpu_wall"}
        assert (gate[~gate.impl.str.startswith("ours")].status == "unavailable").all()
        assert gate[gate.impl == "flashqla"].reason.str.contains("CUDA GPU").all()
    assert "flashqla" in set(gate.impl)
    scaling = pd.read_csv(folder / "scaling.csv")
    assert {"efficiency", "ours 2 GPUs host (µs)", "flashqla 1 GPU (µs)"} <= set(scaling.columns)
    link = pd.read_csv(folder / "link.csv")
    assert set(link.what) == {"probe", "exchange", "scan hop"} and (link.busbw_gbs > 0).all()
    assert len(pd.read_csv(folder / "exchange.csv")) == 1
    for png in ("time_vs_T", "scaling", "link"):
        assert (folder / f"{png}.png").exists(), png
    assert (folder / "conclusion.md").read_text().startswith("### Conclusion")


def test_in_the_model_smoke_specifics(smoke):
    """Notebook 06 on the CPU: ours passes the layer gate; the GDN share comes from host
    time in the ranges (no CUDA activities, no kernel table, the reason in skipped.csv);
    the drop-in and gdn_prefill / gdn_decode pass the reference before being timed, with
    the ratio of their times."""
    out, _, _ = smoke
    folder = out / "06_in_the_model"
    gate = pd.read_csv(folder / "gate.csv")
    assert (gate[gate.impl == "ours"].status == "pass").all() and (gate.impl == "ours").any()
    share = pd.read_csv(folder / "gdn_share.csv")
    assert set(share.part) == {"prefill", "decode step"} and "ours" in set(share.impl)
    assert share.share.between(0, 1).all() and (share.gdn_us > 0).all()
    dgate = pd.read_csv(folder / "dropin_gate.csv")
    assert set(dgate.call) == {"drop-in", "drop-in, contest layout", "contest entry point"}
    assert (dgate.status == "pass").all(), dgate.to_string()
    cmp = pd.read_csv(folder / "dropin_vs_contest.csv")
    assert set(cmp.part) == {"prefill", "decode step"}
    assert list(cmp.ratio) == pytest.approx(list(cmp.dropin_contest_layout_us / cmp.contest_us))
    assert list(cmp.ratio_captured) == pytest.approx(list(cmp.dropin_us / cmp.contest_us))
    assert (folder / "gdn_share.png").exists()
    if not _has_gpu():
        assert share.source.str.startswith("host time").all()
        assert not (folder / "gdn_kernels.csv").exists()
        skipped = pd.read_csv(folder / "skipped.csv")
        assert skipped.what.str.startswith("GDN share by kernel").any()
        assert set(cmp.method) == {"cpu_wall"}


@pytest.mark.parametrize("stem", list(REQUIRED))
def test_figures_read_well_on_smoke_data(smoke, stem):
    """The figures the smoke CSVs draw pass the audit of ``tests/experiments/test_figures.py`` (title
    naming the shape and profile, labelled axes in µs, a log axis with two labelled ticks or
    more, no empty panel, no legend over data, ≤ 1,400 px inline)."""
    from kernels.experiments.redraw import _params, draw
    from test_figures import audit_figure

    out, _, _ = smoke
    figs = draw(out / stem)
    assert figs or stem == "02_prefill_launch_overhead", f"{stem}: no figure drawn from its CSVs"
    params = _params(out / stem)   # titles name the smoke shape and profile
    assert params.get("profile") == "smoke"
    problems = {name: p for name, fig in figs.items()
                if (p := audit_figure(fig, name, params))}
    assert not problems, "; ".join(f"{n}: {', '.join(p)}" for n, p in problems.items())


@pytest.mark.parametrize("stem", ["01_decode_crossover", "04_prefill_scaling"])
def test_measuring_cells_show_progress(smoke, stem):
    """The measuring loops print a tqdm bar (to stderr) naming what they measure."""
    import nbformat

    out, _, _ = smoke
    nb = nbformat.read(str(out / f"{stem}.ipynb"), as_version=4)
    err = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                  for o in c.get("outputs", []) if o.get("name") == "stderr")
    assert re.search(r"gate: .+100%\|", err), err[-2000:]
    assert re.search(r"timing.+100%\|", err), err[-2000:]
