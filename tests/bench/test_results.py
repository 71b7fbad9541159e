"""ResultWriter: atomic replacement on success, last good results kept on failure."""
import os

import pandas as pd
import pytest

from kernels.bench.results import ResultWriter, load_provenance, load_results

NB = "01_decode_crossover"


def _write(root, value, fail=False, **kw):
    with ResultWriter(NB, root=root, gpu="NVIDIA H200", **kw) as w:
        w.write_csv(pd.DataFrame({"B": [1, 4], "median_us": [value, value]}), "decode_times")
        w.write_json({"value": value, "nan": float("nan")}, "provenance")
        if fail:
            raise RuntimeError("boom")
    return w


def test_success_moves_folder_into_place(tmp_path):
    w = _write(tmp_path, 1.0)
    final = tmp_path / "nvidia-h200" / NB
    assert w.final_dir == final and w.committed == final
    res = load_results(final)
    assert list(res) == ["decode_times"] and list(res["decode_times"]["median_us"]) == [1.0, 1.0]
    assert load_provenance(final) == {"value": 1.0, "nan": None}
    assert [p.name for p in (tmp_path / "nvidia-h200").iterdir()] == [NB]  # no temp left


def test_second_success_replaces_first(tmp_path):
    _write(tmp_path, 1.0)
    _write(tmp_path, 2.0)
    res = load_results(tmp_path / "nvidia-h200" / NB)
    assert list(res["decode_times"]["median_us"]) == [2.0, 2.0]


@pytest.mark.parametrize("keep_failed, leftover", [
    pytest.param(True, {NB, f"failed-{NB}"}, id="keep-failed"),
    pytest.param(False, {NB}, id="discard"),
])
def test_failed_run_leaves_previous_results_intact(tmp_path, keep_failed, leftover):
    _write(tmp_path, 1.0)
    with pytest.raises(RuntimeError, match="boom"):
        _write(tmp_path, 2.0, fail=True, keep_failed=keep_failed)
    slug_dir = tmp_path / "nvidia-h200"
    assert {p.name for p in slug_dir.iterdir()} == leftover
    res = load_results(slug_dir / NB)
    assert list(res["decode_times"]["median_us"]) == [1.0, 1.0]
    if keep_failed:
        failed = load_results(slug_dir / f"failed-{NB}")
        assert list(failed["decode_times"]["median_us"]) == [2.0, 2.0]


def test_open_commit_across_cells(tmp_path):
    w = ResultWriter(NB, root=tmp_path, gpu="nvidia-h100-80gb-hbm3").open()
    assert w.dir.name == f".tmp-{NB}-{os.getpid()}" and w.dir.parent.name == "nvidia-h100-80gb-hbm3"
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().plot([1, 2], [3, 4])
    png = w.save_fig(fig, "decode_times")
    assert png.suffix == ".png" and png.read_bytes()[:4] == b"\x89PNG"
    final = w.commit()
    assert (final / "decode_times.png").exists()


def test_save_fig_writes_a_palette_png_close_to_matplotlibs(tmp_path):
    import io

    import numpy as np
    from matplotlib.figure import Figure
    from PIL import Image

    fig = Figure(figsize=(4, 2))
    ax = fig.subplots()
    for i in range(6):
        ax.plot(np.linspace(0, 1, 50) ** (i + 1), label=str(i))
    ax.legend()
    with ResultWriter(NB, root=tmp_path, gpu="x") as w:
        w.save_fig(fig, "curves")
    png = tmp_path / "x" / NB / "curves.png"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=150, bbox_inches="tight")
    with Image.open(png) as got, Image.open(buf) as full:
        assert got.mode == "P" and got.size == full.size
        assert [round(d) for d in got.info["dpi"]] == [150, 150]   # notebooks size the display by it
        diff = np.abs(np.asarray(got.convert("RGB"), float) - np.asarray(full.convert("RGB"), float))
        assert diff.mean() < 1.0 and png.stat().st_size < len(buf.getvalue())
    fig.patch.set_alpha(0.0)                     # transparency: kept as matplotlib writes it
    with ResultWriter(NB, root=tmp_path, gpu="x") as w:
        w.save_fig(fig, "clear")
    with Image.open(tmp_path / "x" / NB / "clear.png") as got:
        assert got.mode == "RGBA"


def test_writing_requires_open(tmp_path):
    w = ResultWriter(NB, root=tmp_path, gpu="x")
    with pytest.raises(RuntimeError, match="not open"):
        w.write_json({}, "a")


@pytest.mark.parametrize("bad", ["", "../x", ".hidden"])
def test_bad_notebook_names(tmp_path, bad):
    with pytest.raises(ValueError):
        ResultWriter(bad, root=tmp_path)


def test_default_slug_is_this_host(tmp_path):
    from kernels.device import gpu_slug

    assert ResultWriter(NB, root=tmp_path).parent == tmp_path / gpu_slug()
