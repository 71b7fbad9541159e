"""Nsight Compute: the CSV parser (on fixtures), the command line, availability.

Parametrized over every ``tests/fixtures/ncu_*.csv``: the synthetic raw page
written by hand in ncu's format, and real recordings of
``python -m kernels.bench.record_fixtures tests/fixtures`` (GPU host).
"""
import math
from pathlib import Path

import pytest

from kernels.bench.ncu import (DEFAULT_METRICS, NCU_COLUMNS, ncu_available, ncu_command,
                               parse_ncu_csv, run_ncu)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CSVS = sorted(FIXTURES.glob("ncu_*.csv"))
SYNTHETIC = FIXTURES / "ncu_synthetic_raw_decode.csv"


@pytest.fixture(params=CSVS, ids=[p.stem for p in CSVS])
def ncu_csv(request):
    return request.param


def test_every_fixture_parses_to_default_metrics(ncu_csv):
    df = parse_ncu_csv(ncu_csv.read_text())
    assert list(df.columns) == NCU_COLUMNS and len(df)
    for launch, g in df.groupby("launch"):
        assert set(DEFAULT_METRICS) <= set(g["metric"]), launch
        v = g.set_index("metric")["value"]
        assert v["gpu__time_duration.sum"] > 0
        assert v["launch__grid_size"] >= 1 and v["launch__block_size"] >= 1
        assert v["dram__bytes_read.sum"] >= 0
        hit = v["lts__t_sector_hit_rate.pct"]
        assert math.isnan(hit) or 0 <= hit <= 100


@pytest.mark.parametrize("metric, value, unit", [
    pytest.param("smsp__inst_executed.sum", 13_421_772.0, "inst", id="thousands-separators"),
    pytest.param("dram__bytes_read.sum", 33_570_816.0, "byte", id="bytes"),
    pytest.param("gpu__time_duration.sum", 18_176.0, "nsecond", id="time-ns"),
    pytest.param("launch__grid_size", 8192.0, "", id="unitless"),
    pytest.param("launch__waves_per_multiprocessor", 0.47, "", id="fraction"),
    pytest.param("launch__registers_per_thread", 64.0, "register/thread", id="compound-unit"),
])
def test_synthetic_values(metric, value, unit):
    df = parse_ncu_csv(SYNTHETIC.read_text())
    row = df[(df["launch"] == 0) & (df["metric"] == metric)].iloc[0]
    assert row["kernel"] == "fused_recurrent_gated_delta_rule_fwd_kernel"
    assert row["value"] == pytest.approx(value) and row["unit"] == unit


def test_synthetic_na_and_quoted_commas():
    df = parse_ncu_csv(SYNTHETIC.read_text())
    second = df[df["launch"] == 1]
    assert second["kernel"].iloc[0].startswith("void at::native::vectorized_elementwise_kernel<4,")
    assert math.isnan(second.set_index("metric")["value"]["lts__t_sector_hit_rate.pct"])


HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",' \
         '"Block Size","Grid Size","Device","CC",'


@pytest.mark.parametrize("units, cell, value, unit", [
    pytest.param("usecond", "18.18", 18_180.0, "nsecond", id="usecond"),
    pytest.param("us", "1.5", 1_500.0, "nsecond", id="us"),
    pytest.param("msecond", "2", 2e6, "nsecond", id="msecond"),
    pytest.param("Mbyte", "33.57", 33.57e6, "byte", id="Mbyte"),
    pytest.param("Kbyte", "1,024.00", 1.024e6, "byte", id="Kbyte-separator"),
    pytest.param("Minst", "13.42", 13.42e6, "inst", id="Minst"),
    pytest.param("%", "97.5", 97.5, "%", id="percent"),
])
def test_auto_scaled_units_become_base_units(units, cell, value, unit):
    text = "\n".join([
        "==PROF== Connected to process 1 (/usr/bin/python3)",
        HEADER + '"some__metric.sum"',
        '"","","","","","","","","","","","' + units + '"',
        '"0","1","python3","h","k","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","' + cell + '"',
        "==PROF== Disconnected from process 1",
    ])
    row = parse_ncu_csv(text).iloc[0]
    assert row["value"] == pytest.approx(value) and row["unit"] == unit


def test_details_page_parses_too():
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","p","h","k","1","7","Command line profiler metrics","smsp__inst_executed.sum",'
        '"inst","6,000,000"',
    ])
    df = parse_ncu_csv(text)
    assert df.iloc[0]["metric"] == "smsp__inst_executed.sum" and df.iloc[0]["value"] == 6e6


@pytest.mark.parametrize("text, empty", [
    pytest.param("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM\n", True, id="prof-only"),
    pytest.param("hello world\n", None, id="not-ncu"),
])
def test_output_without_table(text, empty):
    if empty:
        assert parse_ncu_csv(text).empty
    else:
        with pytest.raises(ValueError, match="not ncu CSV"):
            parse_ncu_csv(text)


def test_command_line():
    cmd = ncu_command(dict(impl="ours", config="BV8-w1-s1-t1", B=64), ncu="ncu", python="py")
    line = " ".join(cmd)
    assert line.startswith("ncu --csv --page raw ")
    assert "--nvtx --nvtx-include gdnbench_measured/" in line
    assert "--metrics " + ",".join(DEFAULT_METRICS) in line
    assert line.endswith("py -m kernels.ncu_target --impl ours --op decode "
                         "--range gdnbench_measured --B 64 --config BV8-w1-s1-t1")
    with pytest.raises(ValueError, match="impl"):
        ncu_command({"B": 1})


def test_availability_is_reported_not_raised():
    ok, reason = ncu_available()
    assert isinstance(ok, bool) and reason
    if not ok:
        with pytest.raises(RuntimeError, match="run_ncu: "):
            run_ncu(dict(impl="ours", B=1))


@pytest.mark.gpu
def test_run_ncu_on_our_decode(tmp_path):
    ok, reason = ncu_available()
    if not ok:
        pytest.skip(reason)
    df = run_ncu(dict(impl="ours", B=4), out_csv=tmp_path / "raw.csv")
    assert set(DEFAULT_METRICS) <= set(df["metric"]) and df["launch"].nunique() == 1
    assert (tmp_path / "raw.csv").read_text()


def test_command_line_with_sections_and_one_kernel():
    cmd = ncu_command(dict(impl="ours", op="prefill", lens=[8192]), ncu="ncu", python="py",
                      sections=("SpeedOfLight", "WarpStateStats"), kernel="state_walk")
    line = " ".join(cmd)
    assert line.startswith("ncu --csv --page details --print-units base ")
    assert "--section SpeedOfLight --section WarpStateStats" in line and "--metrics" not in line
    assert "-k regex:state_walk -c 1" in line
    assert line.endswith("--impl ours --op prefill --range gdnbench_measured --lens 8192")


def test_details_page_keeps_the_section():
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","p","h","k","1","7","Occupancy","Achieved Occupancy","%","31.5"',
    ])
    row = parse_ncu_csv(text).iloc[0]
    assert row["section"] == "Occupancy" and row["value"] == 31.5


def test_details_page_of_ncu_2025_with_rule_columns():
    """ncu 2025: NVTX columns, rule columns that metric rows leave out, rule rows without a
    metric (seen on the H100 host)."""
    head = ('"ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range",'
            '"Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",'
            '"Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
            '"Rule Description","Estimated Speedup Type","Estimated Speedup"')
    ids = '"0","481","python3.12","127.0.0.1","481 ""<default domain>:r"" ","state_walk_kernel",' \
          '"1","7","(128, 1, 1)","(9, 8, 4)","0","9.0",'
    text = "\n".join([
        head,
        ids + '"GPU Speed Of Light Throughput","Duration","ns","43,744",',
        ids + '"GPU Speed Of Light Throughput","DRAM Throughput","%","21.78",',
        ids + '"Occupancy","","","","AchievedOccupancy","WRN","low","local","12.5"',
    ])
    df = parse_ncu_csv(text)
    assert list(df.metric) == ["Duration", "DRAM Throughput"]
    assert df.value.tolist() == [43744.0, 21.78] and (df.kernel == "state_walk_kernel").all()
    assert df.section.iloc[0] == "GPU Speed Of Light Throughput"
