"""kernels.compare on small synthetic result sets."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from kernels import compare  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _decode(scale):
    rows = []
    for impl, configs in (("ours", ["BV8-w1-s1-t1", "BV32-w4-s1-t1"]), ("fla", [None])):
        for cfg in configs:
            for B in (1, 4, 64):
                for method in ("cupti_cold", "graph"):
                    m = scale * B * (2.0 if cfg == "BV8-w1-s1-t1" else 1.0) + (3 if impl == "fla" else 0)
                    rows.append(dict(impl=impl, config=cfg, B=B, method=method, median_us=m,
                                     p20_us=0.9 * m, p80_us=1.1 * m, floor_us=0.5 * B))
    return pd.DataFrame(rows)


def _prefill(scale, lens=("6", "100+28", "4x1024")):
    rows = []
    for impl, variants in (("ours", ["unfused", "fused"]), ("fla", ["-"])):
        for v in variants:
            for lab in lens:
                T = {"6": 6, "100+28": 128, "4x1024": 4096}[lab]
                N = {"6": 1, "100+28": 2, "4x1024": 4}[lab]
                rows.append(dict(impl=impl, variant=v, lens=lab, T=T, N=N, method="cupti_cold",
                                 median_us=scale * T / 10 + 5, launches=51 if v == "unfused" else 3))
    return pd.DataFrame(rows)


def _ncu(scale):
    rows = []
    for impl, kernels in (("fla", ["fused_recurrent_fwd"]), ("flashinfer", ["gdn_decode"]),
                          ("ours", ["k_a", "k_b"])):
        for k in kernels:
            for metric, unit, v in (("smsp__inst_executed.sum", "inst", 6e6),
                                    ("dram__bytes_read.sum", "byte", 3e7)):
                rows.append(dict(impl=impl, config="" if impl != "ours" else "BV32", B=64,
                                 kernel=k, metric=metric, value=scale * v, unit=unit))
    return pd.DataFrame(rows)


def _write(root: Path, parts: dict):
    for stem, (csv, df) in parts.items():
        (root / stem).mkdir(parents=True, exist_ok=True)
        df.to_csv(root / stem / csv, index=False)
    return root


@pytest.fixture
def two_sets(tmp_path):
    a = _write(tmp_path / "results" / "nvidia-h200", {
        "01_decode_crossover": ("decode_times.csv", _decode(1.0)),
        "02_prefill_launch_overhead": ("prefill_times.csv", _prefill(1.0)),
        "03_ncu_instruction_counts": ("ncu_metrics.csv", _ncu(1.0)),
    })
    b = _write(tmp_path / "results" / "nvidia-h100-80gb-hbm3", {
        "01_decode_crossover": ("decode_times.csv", _decode(2.0)),
        "02_prefill_launch_overhead": ("prefill_times.csv", _prefill(1.0, lens=("6", "100+28"))),
    })
    return a, b, tmp_path / "cmp"


def test_compare_writes_figures_and_ratio_tables(two_sets, capsys):
    a, b, out = two_sets
    assert compare.main([str(a), str(b), "--out", str(out)]) == 0
    log = capsys.readouterr().out
    assert "skip 03_ncu_instruction_counts" in log and "nvidia-h100-80gb-hbm3" in log
    for stem in ("01_decode_crossover", "02_prefill_launch_overhead"):
        assert (out / f"{stem}.png").stat().st_size > 10_000
        assert (out / f"{stem}_ratios.md").read_text().startswith("| impl |")
    assert not (out / "03_ncu_instruction_counts.png").exists()
    readme = (out / "README.md").read_text()
    assert "nvidia-h100-80gb-hbm3 vs nvidia-h200" in readme and "skip 03" in readme

    dec = pd.read_csv(out / "01_decode_crossover_ratios.csv")
    ratio = "ratio B/A (nvidia-h100-80gb-hbm3 / nvidia-h200)"
    assert len(dec) == len(_decode(1.0))  # every row matched, peers without config included
    fla = dec[dec.impl == "fla"]
    assert len(fla) == 6 and fla[ratio].notna().all()
    ours = dec[(dec.impl == "ours")]
    assert ours[ratio].tolist() == pytest.approx([2.0] * len(ours))
    assert "median_us [nvidia-h200]" in dec.columns and "floor_us [nvidia-h100-80gb-hbm3]" in dec.columns

    pre = pd.read_csv(out / "02_prefill_launch_overhead_ratios.csv")
    assert set(pre.lens) == {"6", "100+28"}  # 4x1024 only in A: not a matching row
    assert pre[ratio].tolist() == pytest.approx([1.0] * len(pre))
    assert "launches [nvidia-h200]" in pre.columns


def test_same_folder_names_get_parent_labels(tmp_path):
    a = _write(tmp_path / "abc123" / "nvidia-h200",
               {"03_ncu_instruction_counts": ("ncu_metrics.csv", _ncu(1.0))})
    b = _write(tmp_path / "def456" / "nvidia-h200",
               {"03_ncu_instruction_counts": ("ncu_metrics.csv", _ncu(0.5))})
    assert compare.set_labels(a, b) == ("abc123/nvidia-h200", "def456/nvidia-h200")
    done = compare.compare(a, b, tmp_path / "out", log=lambda *_: None)
    assert done["03_ncu_instruction_counts"].exists()
    assert done["01_decode_crossover"] is None
    t = pd.read_csv(tmp_path / "out" / "03_ncu_instruction_counts_ratios.csv")
    assert len(t) == len(_ncu(1.0))
    assert t.iloc[:, -1].tolist() == pytest.approx([0.5] * len(t))


def test_repeated_keys_match_in_order():
    spec = compare.SPECS[2]
    a = pd.DataFrame(dict(impl="ours", config="c", B=64, kernel="k", metric="m", value=[1.0, 2.0]))
    b = pd.DataFrame(dict(impl="ours", config="c", B=64, kernel="k", metric="m", value=[3.0, 8.0]))
    t = compare.ratio_table(a, b, spec, ("A", "B"))
    assert t["occurrence"].tolist() == [0, 1]
    assert t.iloc[:, -1].tolist() == [3.0, 4.0]


def test_lens_read_as_numbers_on_one_side_still_match(tmp_path):
    spec = compare.SPECS[1]
    pa = tmp_path / "a" / spec.stem
    pb = tmp_path / "b" / spec.stem
    for p, lens in ((pa, ["6", "64"]), (pb, ["6", "100+28"])):
        p.mkdir(parents=True)
        pd.DataFrame(dict(impl="ours", variant="fused", lens=lens, T=[6, 64 if lens[1] == "64" else 128],
                          N=[1, 1 if lens[1] == "64" else 2], method="graph", median_us=[10.0, 20.0],
                          launches=1)).to_csv(p / spec.csv, index=False)
    t = compare.ratio_table(compare.load_set(tmp_path / "a", spec),
                            compare.load_set(tmp_path / "b", spec), spec, ("a", "b"))
    assert t.lens.tolist() == ["6"]


def test_zero_baseline_gives_empty_ratio():
    spec = compare.SPECS[0]
    a = pd.DataFrame(dict(impl="torch", config="", B=[1], method="event", median_us=[0.0]))
    b = a.assign(median_us=[5.0])
    t = compare.ratio_table(a, b, spec, ("A", "B"))
    assert t.iloc[:, -1].isna().all()


def test_markdown_escapes_and_blanks_nan():
    df = pd.DataFrame({"a|b": ["x|y"], "v": [float("nan")], "w": [1.23456]})
    md = compare.to_markdown(df)
    assert md.splitlines()[0] == "| a\\|b | v | w |"
    assert md.splitlines()[2] == "| x\\|y |  | 1.235 |"


def test_nothing_to_compare_and_missing_folder(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "o")]) == 1
    assert compare.main([str(tmp_path / "nope"), str(tmp_path / "b")]) == 2
    assert "no result folder" in capsys.readouterr().err


def test_missing_columns_named(tmp_path):
    spec = compare.SPECS[0]
    (tmp_path / spec.stem).mkdir()
    pd.DataFrame(dict(impl=["x"], B=[1])).to_csv(tmp_path / spec.stem / spec.csv, index=False)
    with pytest.raises(ValueError, match="missing columns config, method, median_us"):
        compare.load_set(tmp_path, spec)


def test_cli_in_subprocess(two_sets):
    a, b, out = two_sets
    res = subprocess.run([sys.executable, "-m", "kernels.compare", str(a), str(b), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (out / "README.md").exists()


def test_label_column_is_matched_when_both_sides_have_it():
    """``ours-adaptive`` may pick the FLA-like config: same impl/config/B/method, other label."""
    spec = compare.SPECS[0]
    rows = dict(impl="ours", config="BV8-w1-s1-t1", B=[4, 4], method="graph",
                label=["ours-fla-like", "ours-adaptive"])
    a = pd.DataFrame(dict(rows, median_us=[10.0, 20.0]))
    b = pd.DataFrame(dict(rows, label=["ours-adaptive", "ours-fla-like"], median_us=[40.0, 30.0]))
    t = compare.ratio_table(a, b, spec, ("A", "B"))
    assert "occurrence" not in t.columns
    got = dict(zip(t.label, t.iloc[:, -1]))
    assert got == {"ours-fla-like": 3.0, "ours-adaptive": 2.0}


def test_compare_notebook_04(tmp_path):
    import pandas as pd

    from kernels.compare import compare

    def rows(f):
        out = []
        for impl in ("ours", "flashqla"):
            for lens, T in (("8192", 8192), ("131072", 131072)):
                out.append(dict(impl=impl, lens=lens, T=T, N=1, method="graph",
                                median_us=f * T / 64, p20_us=0, p80_us=0, kernel="", role=""))
        out.append(dict(impl="ours", lens="8192", T=8192, N=1, method="kernel", median_us=f * 40,
                        p20_us=0, p80_us=0, kernel="intra_chunk_kernel", role="intra-chunk"))
        return pd.DataFrame(out)

    a = _write(tmp_path / "a" / "gpu", {"04_prefill_scaling": ("prefill_scaling.csv", rows(1.0))})
    b = _write(tmp_path / "b" / "gpu", {"04_prefill_scaling": ("prefill_scaling.csv", rows(2.0))})
    done = compare(a, b, tmp_path / "cmp")
    assert done["04_prefill_scaling"].exists()
    t = pd.read_csv(tmp_path / "cmp" / "04_prefill_scaling_ratios.csv")
    assert len(t) == 5 and (t.filter(like="ratio").iloc[:, 0] == 2.0).all()


def _provenance(root: Path, stem: str, **fields):
    import json

    (root / stem / "provenance.json").write_text(json.dumps(dict(git_sha="abc", **fields)))


def test_runs_of_two_timing_revisions_are_refused_unless_allowed(two_sets, capsys, monkeypatch):
    """A provenance without ``timing_methods_rev`` is revision 0 (before the graph/event
    fix): set beside revision 1 it is refused with exit 2 naming the notebook, nothing
    written; with --allow-unlike the figure title, the tables and the README mark it. An
    untimed notebook (ncu counts) and a side without provenance are not checked."""
    from kernels.bench.timing import TIMING_METHODS_REV

    a, b, out = two_sets
    _provenance(a, "01_decode_crossover")                      # before the field: 0
    _provenance(b, "01_decode_crossover", timing_methods_rev=TIMING_METHODS_REV)
    _provenance(a, "02_prefill_launch_overhead", timing_methods_rev=TIMING_METHODS_REV)
    _provenance(b, "02_prefill_launch_overhead", timing_methods_rev=TIMING_METHODS_REV)
    assert compare.timing_rev(a, "01_decode_crossover") == 0
    assert compare.timing_rev(a, "03_ncu_instruction_counts") is None
    assert compare.main([str(a), str(b), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert ("different revisions of the timing methods" in err and "01_decode_crossover: "
            f"nvidia-h200 measured with timing-methods revision 0, nvidia-h100-80gb-hbm3 "
            f"with {TIMING_METHODS_REV}") in err
    assert "02_prefill" not in err and "--allow-unlike" in err
    assert not out.exists()

    figures = []
    real = compare.plot_notebook
    monkeypatch.setattr(compare, "plot_notebook",
                        lambda *args, **kw: figures.append(real(*args, **kw)) or figures[-1])
    assert compare.main([str(a), str(b), "--out", str(out), "--allow-unlike"]) == 0
    titles = [f._suptitle.get_text() for f in figures]
    assert "UNLIKE TIMING" in titles[0] and "UNLIKE" not in titles[1]
    dec = pd.read_csv(out / "01_decode_crossover_ratios.csv")
    assert set(dec.timing_methods_rev) == {f"0 vs {TIMING_METHODS_REV} (unlike)"}
    assert "timing_methods_rev" not in pd.read_csv(out / "02_prefill_launch_overhead_ratios.csv")
    assert (out / "01_decode_crossover_ratios.md").read_text().startswith("**UNLIKE TIMING")
    assert "compared with --allow-unlike" in (out / "README.md").read_text()


def test_each_decode_panel_names_its_own_floor(tmp_path):
    """The host panel's floor is one bare launch (host time), the GPU panels' the copy
    bandwidth of the state."""
    import matplotlib.pyplot as plt

    spec = compare.SPECS[0]
    d = _decode(1.0)
    d = pd.concat([d, d[d.method == "graph"].assign(method="host")])
    fig = compare.plot_notebook(spec, (d, d.assign(median_us=2 * d.median_us)), ("A", "B"))
    try:
        floors = {ax.get_title().split(":")[0]: [ln.get_label() for ln in ax.get_lines()
                                                 if "floor" in ln.get_label()]
                  for ax in fig.axes if ax.get_visible()}
    finally:
        plt.close(fig)
    assert floors["decode, method=host"] == ["bare-launch floor [A]", "bare-launch floor [B]"]
    assert floors["decode, method=graph"] == ["copy-bandwidth floor [A]",
                                              "copy-bandwidth floor [B]"]
