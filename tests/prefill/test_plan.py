"""The plan of a prefill call (:mod:`kernels.prefill.plan`): the one place the path is
chosen, what reads it, its workspace views, its memo, the negligible threshold.

Host rules only (no kernel runs), except one small interpreted call that checks the
threshold reaches the launches.
"""
from __future__ import annotations

import ast
import os
import pathlib
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.prefill import (DEFAULT_CONFIG, PrefillConfig, gdn_prefill,  # noqa: E402
                             launch_count_hint, pipeline, prefill_plan)
from kernels.prefill.plan import (LAUNCHES, PATH_LABELS, WORKSPACE_ALIGN,  # noqa: E402
                                  workspace_layout)
from kernels.spec import GDNShape, make_prefill_inputs  # noqa: E402

CPU = torch.device("cpu")   # the rules assume 132 SMs off CUDA
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("T, N, cp, path, launches", [
    (6, 1, None, "recurrent", 1),
    (64, 1, None, "single", 1),
    (512, 1, None, "walk", 2),
    (8192, 1, None, "cp", 3),
    (16384, 1, None, "cp_long", 4),
    (65536, 1, None, "cp_long_split", 5),
    (6, 1, True, "cp", 3),               # forced CP: not the recurrent kernel
    (65536, 1, True, "cp_long_split", 5),   # True: the rule's segments, split included
    (65536, 1, 64, "cp_long", 4),        # an int fixes the segments: no split (noted)
    (8192, 1, False, "walk", 2),
    (16384, 1, 32, "cp_long", 4),        # the rule would not split here either: no note
])
def test_plan_paths_and_launches(T, N, cp, path, launches):
    p = prefill_plan(T, N, 8, 128, CPU, cp)
    assert (p.path, p.launches) == (path, launches)
    assert p.launches == LAUNCHES[p.launch_key]["kernels"]
    hint = launch_count_hint("fused", T=T, N=N, device="cpu", cp=cp)
    assert hint["kernels"] == launches
    assert bool(p.note) is (cp == 64)
    if p.note:   # the split a forced segment size turns off is said, not silent
        assert "does not split" in p.note and p.note in hint["note"]


def _tile_and_segments(T, N, cp=None):
    """``(BV, seg_chunks)`` of the plan of ``T`` tokens in ``N`` sequences (8 heads of 128)
    on the CPU (the rules assume 132 SMs there); ``seg_chunks == 0``: no CP."""
    p = prefill_plan(T, N, 8, 128, CPU, cp)
    return p.BV, p.seg_chunks


def test_context_parallel_rule():
    """Documented rule: CP only for long average sequences that underfill the SMs; the walk's
    tile follows the programs there are."""
    plan = _tile_and_segments
    assert plan(8192, 1) == (32, 16)      # 8 segments x 16 chunks
    assert plan(4096, 1)[1] == 16
    assert plan(2048, 1) == (16, 0)       # too short: no CP, narrow tiles
    assert plan(16 * 256, 16) == (64, 0)  # many programs: wide tiles
    assert plan(4 * 1024, 4) == (32, 0)   # "tm": 128 programs at 32
    assert plan(1024, 1)[1] == 0       # too short
    assert plan(57 * 64, 57)[1] == 0   # many sequences: enough programs
    assert plan(8192, 1, cp=False)[1] == 0
    assert plan(6, 1, cp=True)[1] >= 2
    assert plan(6, 1, cp=1)[1] == 1   # plans are cached: True is not 1
    assert plan(8192, 1, cp=3)[1] == 3
    # long path (>= 16,384 tokens per sequence): 16 segments per sequence, walks 128 wide
    assert plan(16384, 1) == (128, 16)
    assert plan(131072, 1) == (128, 128)
    assert plan(1 << 20, 1) == (128, 1024)
    assert plan(131072, 1, cp=True) == (128, 128)
    assert plan(4 * 8192, 4)[1] == 0       # 4 sequences: enough programs


def test_plan_is_remembered_and_graph_plans_the_bucket():
    assert prefill_plan(512, 1, 8, 128, CPU) is prefill_plan(512, 1, 8, 128, "cpu")
    assert prefill_plan(6, 1, 8, 128, CPU, True) is not prefill_plan(6, 1, 8, 128, CPU, 1)
    g = prefill_plan(100, 3, 8, 128, CPU, graph=True)
    assert (g.T, g.N, g.path) == (128, 4, "single")
    assert prefill_plan(6, 1, 8, 128, CPU, graph=True).path == "recurrent"   # the call's T
    assert prefill_plan(30, 1, 8, 128, CPU, graph=True).path == "single"
    with pytest.raises(ValueError, match="cp"):
        prefill_plan(64, 1, 8, 128, CPU, cp=-1)
    with pytest.raises(ValueError, match="cp"):
        prefill_plan(64, 1, 8, 128, CPU, cp=2.0)


def test_plan_table_reads_the_plan(tmp_path):
    """Notebook 04's ``plan.csv``: the plan's path in words, tile, segments, launches."""
    from kernels.experiments.prefill_scaling import plan_table
    lens = {"T6": [6], "T64": [64], "2048": [2048], "8192": [8192], "65536": [65536],
            "2x300": [300, 300]}
    run = mock.Mock(state=dict(shape=GDNShape(4, 8, 128), shapes=list(lens.items())),
                    device="cpu")
    df = plan_table(run)
    assert list(df.columns) == ["lens", "T", "N", "path", "BV", "seg_chunks", "segments",
                                "launches", "phase_c"]
    assert df.path.tolist() == ["recurrent", "one launch", "walk", "chained CP",
                                "long CP, split on the device", "walk"]
    assert df.launches.tolist() == [1, 1, 2, 3, 5, 2]
    assert df.segments.tolist() == [0, 0, 0, 8, 16, 0]
    assert df.phase_c.tolist() == ["", "", "", "", "triton", ""]   # (CPU: the Triton walk)
    assert set(PATH_LABELS.values()) >= set(df.path)
    run.write_csv.assert_called_once()


@pytest.mark.parametrize("T, N, seg, long, split, solve", [
    (6, 1, 0, False, False, "batched"),
    (200, 3, 0, False, False, "blocks"),
    (8192, 1, 16, False, False, "batched"),
    (16384, 1, 16, True, False, "blocks"),
    (65536 + 5, 3, 64, True, True, "batched"),
])
def test_workspace_views_do_not_overlap(T, N, seg, long, split, solve):
    """One allocation per call: the views are disjoint, aligned, inside the buffer, and
    the bytes of intermediates are the layout's."""
    layout = workspace_layout(T, N, 8, 128, seg, long, split, "compact", solve)
    spans = sorted((off, off + n) for _, _, _, off, n in layout)
    assert all(a1 <= b0 for (_, a1), (b0, _) in zip(spans, spans[1:]))
    assert all(off % WORKSPACE_ALIGN == 0 for off, _ in spans)
    for _, dtype, shape, _, n in layout:
        assert n == torch.Size(shape).numel() * dtype.itemsize
    names = [v[0] for v in layout]
    assert ("s0" in names) is long and ("seg_mult" in names) is split
    assert ("scratch" in names) is (solve == "blocks")


def test_workspace_is_one_allocation():
    """A fused call's intermediates are views of one buffer of the plan's size."""
    for T in (64, 8192, 65536):   # one launch, chained CP, long CP with the split
        plan = prefill_plan(T, 1, 8, 128, CPU)
        ws = pipeline.workspace_views(plan, CPU)
        base = {t.untyped_storage().data_ptr() for t in ws.values()}
        assert len(base) == 1 and ws["Tb"].untyped_storage().nbytes() == plan.nbytes
        assert set(ws) == {v[0] for v in plan.layout}
        pad = WORKSPACE_ALIGN * len(plan.layout)
        assert plan.workspace_bytes <= plan.nbytes < plan.workspace_bytes + pad
        for name, dtype, shape, off, n in plan.layout:   # each view where the layout says
            t = ws[name]
            assert (t.dtype, tuple(t.shape), t.is_contiguous()) == (dtype, shape, True)
            assert t.data_ptr() - min(base) == off and t.numel() * t.element_size() == n
    assert ws["summary"].shape == (65536 // 2048 + 1, 8, 256, 128)   # half-segment slots


def test_negligible_threshold_is_the_config():
    """``log_eps`` is a config field (default -20), and the plan hands it to every kernel
    that drops negligible terms; nothing else in kernels/prefill defines it."""
    assert DEFAULT_CONFIG.log_eps == -20.0
    cfg = PrefillConfig(log_eps=-30.0)
    chained = prefill_plan(8192, 1, 8, 128, CPU, None, cfg)
    assert chained.phase_a["log_eps"] == chained.phase_c["log_eps"] == -30.0
    split = prefill_plan(65536, 1, 8, 128, CPU, None, cfg)
    assert split.phase_a["log_eps"] == split.split_args["log_eps"] == -30.0
    with pytest.raises(ValueError, match="log_eps"):
        PrefillConfig(log_eps=0.5)
    for f in (ROOT / "kernels" / "prefill").glob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):   # no kernel default or literal for LOG_EPS
            if isinstance(node, ast.arg) and node.arg == "LOG_EPS":
                assert f.name == "chunk_index.py" or node.annotation is not None
        assert "= -20.0" not in f.read_text() or f.name == "config.py", f.name


def test_log_eps_reaches_the_launches():
    """A chained-CP call hands the config's threshold to both phases."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"   # CPU tensors need the interpreter
    x = make_prefill_inputs([130], GDNShape(1, 2, 16), seed=0, device=dev)
    cfg = PrefillConfig(log_eps=-25.0)
    with mock.patch.object(pipeline, "state_walk_fwd", wraps=pipeline.state_walk_fwd) as walk:
        gdn_prefill(**x, variant="fused", cp=1, config=cfg)
    assert [c.kwargs["log_eps"] for c in walk.call_args_list] == [-25.0, -25.0]


def test_prefill_imports_no_experiment():
    """Imports run downward: nothing in kernels/prefill imports kernels/experiments."""
    for f in (ROOT / "kernels" / "prefill").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any("experiments" in n for n in names), f.name


@pytest.mark.parametrize("cc, interpreted, have, D, cfg, want", [
    pytest.param(90, False, True, 128, DEFAULT_CONFIG, True, id="sm90"),
    pytest.param(None, False, True, 128, DEFAULT_CONFIG, False, id="off-cuda"),
    pytest.param(90, True, True, 128, DEFAULT_CONFIG, False, id="interpreter"),
    pytest.param(90, False, False, 128, DEFAULT_CONFIG, False, id="no-gluon"),
    pytest.param(90, False, True, 64, DEFAULT_CONFIG, False, id="D64"),
    pytest.param(89, False, True, 128, DEFAULT_CONFIG, False, id="sm89"),
    pytest.param(100, False, True, 128, DEFAULT_CONFIG, False, id="sm100"),
    pytest.param(90, False, True, 128, PrefillConfig(precision="bf16x2"), False, id="bf16x2"),
    pytest.param(90, False, True, 128, PrefillConfig(storage="precise"), False, id="precise"),
    pytest.param(90, False, True, 128, PrefillConfig(gluon_walk=False), False, id="forced-off"),
])
def test_walk_gluon_rule(cc, interpreted, have, D, cfg, want):
    from kernels.prefill.config import walk_gluon_rule
    assert walk_gluon_rule(cc, interpreted, have, D, cfg) is want


@pytest.mark.parametrize("cc, D, cfg, T, want", [
    pytest.param(90, 128, None, 16384, True, id="sm90-long"),
    pytest.param(90, 128, None, 65536, True, id="sm90-long-split"),
    pytest.param(90, 128, None, 8192, False, id="sm90-chained-cp"),   # not a long path
    pytest.param(90, 64, None, 16384, False, id="sm90-D64"),
    pytest.param(90, 128, PrefillConfig(gluon_walk=False), 16384, False, id="sm90-forced-off"),
    pytest.param(100, 128, None, 16384, False, id="sm100"),
])
def test_plan_records_the_phase_c_kernel(cc, D, cfg, T, want):
    """The plan applies :func:`walk_gluon_rule` with the device's capability (faked here)
    on the long paths only, and what reads the plan shows it; on the interpreter never."""
    from kernels.prefill import plan as plan_mod
    with mock.patch.object(plan_mod, "device_cc", lambda device: cc), \
            mock.patch.object(plan_mod.interpret, "INTERPRET", False):
        plan_mod.clear_plan_cache()
        try:
            p = prefill_plan(T, 1, 8, D, CPU, config=cfg)
            hint = launch_count_hint("fused", T=T, N=1, D=D, device="cpu")
        finally:
            plan_mod.clear_plan_cache()
    assert p.phase_c_gluon is want
    if cfg is None:   # (the hint plans with the default config)
        assert ("Gluon" in hint["note"]) is want
    assert p.launches == LAUNCHES[p.launch_key]["kernels"]   # the same launches either way
    with mock.patch.object(plan_mod, "device_cc", lambda device: cc):
        plan_mod.clear_plan_cache()
        try:
            assert not prefill_plan(T, 1, 8, D, CPU, config=cfg).phase_c_gluon   # interpreter
        finally:
            plan_mod.clear_plan_cache()


@pytest.mark.parametrize("cfg, want", [
    pytest.param(None, "rule", id="default"),
    pytest.param(PrefillConfig(precision="bf16x2"), 0, id="bf16x2"),   # every product split
])
def test_plan_phase_c_split_tail(cfg, want):
    """The long path's phase C gets :func:`tail_split_rule`'s tail (the default's bf16
    products: :data:`TAIL_SPLIT_CHUNKS`; none where every product is split already)."""
    from kernels.prefill.config import TAIL_SPLIT_CHUNKS, tail_split_rule
    p = prefill_plan(16384, 1, 8, 128, CPU, config=cfg)
    assert p.path.startswith("cp_long")
    assert p.phase_c["tail"] == (TAIL_SPLIT_CHUNKS if want == "rule" else want)
    assert p.phase_c["tail"] == tail_split_rule(cfg or PrefillConfig())
    assert "tail" not in p.phase_a
