"""Nsight Compute metrics of one call, as a tidy DataFrame.

``run_ncu({"impl": "ours", "config": "BV8-w1-s1-t1", "B": 64})`` runs::

    ncu --csv --page raw --print-units base --nvtx --nvtx-include gdnbench_measured/ \\
        --metrics <DEFAULT_METRICS> --target-processes all \\
        <python> -m kernels.ncu_target --impl ours --op decode --B 64 --config ...

in a subprocess (only the kernels of the one call inside the NVTX range are
profiled; see :mod:`kernels.ncu_target`) and returns
:func:`parse_ncu_csv` of its output: one row per (launch, metric) with columns
``launch, kernel, metric, value, unit``.

The raw page (``--page raw``) is wide: a header row
``"ID","Process ID","Process Name","Host Name","Kernel Name","Context",
"Stream","Block Size","Grid Size","Device","CC",<metric>,...``, then a units
row (empty identification cells, one unit per metric), then one row per
profiled launch. ncu interleaves ``==PROF==`` lines, quotes every field and
prints thousands separators (``"13,421,772"``). The details page (long form,
``"Metric Name","Metric Unit","Metric Value"``) parses too.

Values are converted to base units (``byte``, ``nsecond``, ``inst``, ``cycle``
...) whatever ncu's unit scaling, so a value compares across runs.

ncu's defaults apply: caches are flushed before each profiled kernel
(``--cache-control all``) and clocks are locked to base (``--clock-control
base``), so ``gpu__time_duration`` is a cold, base-clock duration - compare it
between kernels, not with the timings of :mod:`kernels.bench.timing`.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import pandas as pd

__all__ = ["NVTX_RANGE", "EXIT_UNAVAILABLE", "DEFAULT_METRICS", "NCU_COLUMNS", "ncu_available",
           "ncu_command", "run_ncu", "parse_ncu_csv", "find_ncu"]

#: The NVTX range around the one profiled call of :mod:`kernels.ncu_target`.
NVTX_RANGE = "gdnbench_measured"
#: :mod:`kernels.ncu_target`'s exit status when the implementation is unavailable.
EXIT_UNAVAILABLE = 3

DEFAULT_METRICS = (
    "gpu__time_duration.sum",            # kernel duration (ns)
    "smsp__inst_executed.sum",           # warp instructions executed
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sector_hit_rate.pct",        # L2 hit rate
    "launch__grid_size",
    "launch__block_size",
    "launch__waves_per_multiprocessor",
    "launch__registers_per_thread",
)
NCU_COLUMNS = ["launch", "kernel", "metric", "value", "unit"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
# A metric column of the raw page: "<unit>__<counter>[.<rollup>...]".
_METRIC_RE = re.compile(r"^[a-z0-9]+__[A-Za-z0-9_.]+$")


def find_ncu() -> Optional[str]:
    """Path of the ``ncu`` executable: ``$GDN_NCU``, ``PATH``, then ``/usr/local/cuda/bin``."""
    env = os.environ.get("GDN_NCU")
    if env and Path(env).is_file():
        return env
    found = shutil.which("ncu")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if Path(cand).is_file():
            return cand
    return None


def ncu_available() -> Tuple[bool, str]:
    """``(True, "ncu at PATH")`` or ``(False, what is missing)``; never raises."""
    exe = find_ncu()
    if exe is None:
        return False, ("Nsight Compute CLI 'ncu' not found (not on PATH, not in "
                       "/usr/local/cuda/bin; set GDN_NCU=/path/to/ncu)")
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible (ncu profiles GPU kernels)"
    except ImportError:  # pragma: no cover
        return False, "torch is not importable"
    return True, f"ncu at {exe}"


def ncu_command(target: dict, metrics: Sequence[str] = DEFAULT_METRICS, *, ncu: str = "ncu",
                python: Optional[str] = None, sections: Sequence[str] = (),
                kernel: Optional[str] = None) -> list:
    """The argv of one profile of ``target`` (keys: ``impl``; optional ``op``
    (decode|prefill), ``B``, ``lens``, ``config``, ``variant``, ``seed``, ``warmup``).

    ``sections`` (e.g. ``SpeedOfLight``, ``Occupancy``, ``WarpStateStats``): profile those
    Nsight Compute sections and print the details page (one row per metric of each
    section) instead of the raw page of ``metrics``. ``kernel``: a regular expression;
    only the first launch whose name matches it is profiled."""
    if "impl" not in target:
        raise ValueError(f"target needs an 'impl' key, got {target}")
    rng = target.get("range", NVTX_RANGE)
    if sections:
        what = ["--page", "details"] + [a for s in sections for a in ("--section", s)]
    else:
        what = ["--page", "raw", "--metrics", ",".join(metrics)]
    cmd = [ncu, "--csv"] + what[:2] + ["--print-units", "base",
           "--nvtx", "--nvtx-include", f"{rng}/"] + what[2:] + (
           ["-k", f"regex:{kernel}", "-c", "1"] if kernel else []) + [
           "--target-processes", "all",
           python or sys.executable, "-m", "kernels.ncu_target",
           "--impl", str(target["impl"]), "--op", str(target.get("op", "decode")),
           "--range", rng]
    if "B" in target:
        cmd += ["--B", str(int(target["B"]))]
    if target.get("lens") is not None:
        lens = target["lens"]
        cmd += ["--lens", lens if isinstance(lens, str) else ",".join(str(int(x)) for x in lens)]
    for key in ("config", "variant", "seed", "warmup"):
        if target.get(key) is not None:
            cmd += [f"--{key}", str(target[key])]
    return cmd


def run_ncu(target: dict, metrics: Sequence[str] = DEFAULT_METRICS,
            out_csv: Optional[Union[str, Path]] = None, timeout: float = 600.0,
            sections: Sequence[str] = (), kernel: Optional[str] = None) -> pd.DataFrame:
    """Profile one call of ``target`` with ncu; return :func:`parse_ncu_csv` of it
    (``sections`` / ``kernel``: see :func:`ncu_command`; the details page adds a
    ``section`` column).

    ``out_csv``: also keep ncu's raw output there. Raises ``RuntimeError``
    naming what is missing (ncu, GPU), the implementation's unavailability,
    a counter-permission problem, a timeout, or an output without kernels.
    """
    ok, reason = ncu_available()
    if not ok:
        raise RuntimeError(f"run_ncu: {reason}")
    cmd = ncu_command(target, metrics, ncu=find_ncu(), sections=sections, kernel=kernel)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_REPO_ROOT)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        proc = subprocess.run(cmd, cwd=str(_REPO_ROOT), env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"run_ncu: ncu timed out after {timeout:.0f} s: {' '.join(cmd)}") from e
    text = proc.stdout
    if out_csv is not None:
        Path(out_csv).parent.mkdir(parents=True, exist_ok=True)
        Path(out_csv).write_text(text)
    tail = (proc.stderr or "")[-1500:] + (text[-500:] if "==ERROR==" in text else "")
    if "ERR_NVGPUCTRPERM" in text + (proc.stderr or ""):
        raise RuntimeError("run_ncu: no permission to read GPU performance counters "
                           "(ERR_NVGPUCTRPERM); run as root or set the driver option "
                           "NVreg_RestrictProfilingToAdminUsers=0")
    if proc.returncode == EXIT_UNAVAILABLE or "ncu_target:" in (proc.stderr or ""):
        raise RuntimeError(f"run_ncu: target unavailable: {tail.strip()}")
    if proc.returncode != 0:
        raise RuntimeError(f"run_ncu: ncu exited with {proc.returncode}: {tail.strip()}\n"
                           f"command: {' '.join(cmd)}")
    df = parse_ncu_csv(text)
    if df.empty:
        raise RuntimeError(f"run_ncu: ncu profiled no kernel inside NVTX range "
                           f"{target.get('range', NVTX_RANGE)!r}: {tail.strip()}")
    return df


# --------------------------------------------------------------------------- parsing

_TIME = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
         "second": 1e9, "s": 1e9}
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BASES = ("byte", "inst", "cycle", "sector", "request", "warp", "thread", "block", "wavefront")


def _to_base(value: float, unit: str) -> Tuple[float, str]:
    """``(value, unit)`` in base units: time in ``nsecond``, ``Kbyte`` -> ``byte`` ..."""
    u = (unit or "").strip()
    if u in _TIME:
        return value * _TIME[u], "nsecond"
    m = re.fullmatch(r"([KMGT]?)(byte|inst|cycle|sector|request|warp|thread|block|wavefront)(/.*)?", u)
    if m and m.group(2) in _BASES:
        return value * _PREFIX[m.group(1)], m.group(2) + (m.group(3) or "")
    return value, u


def _number(text: str) -> float:
    """``"13,421,772"`` -> 13421772.0; ``"n/a"``, ``""`` -> NaN."""
    t = (text or "").strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return math.nan
    try:
        return float(t)
    except ValueError:
        return math.nan


def _csv_rows(text: str) -> list:
    # CSV rows start with a quote; ==PROF== / ==WARNING== lines and the
    # profiled program's own output do not.
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """Tidy ncu ``--csv`` output (raw or details page).

    Returns columns ``launch`` (ncu's launch ID, int), ``kernel``, ``metric``,
    ``value`` (float in base units; NaN for ``n/a``), ``unit``. Raises
    ``ValueError`` when the text holds no ncu CSV header.
    """
    rows = _csv_rows(text)
    head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if head is None:
        if re.search(r"^==[A-Z]+==", text, re.M):  # ncu ran but printed no table
            return pd.DataFrame(columns=NCU_COLUMNS)
        raise ValueError("not ncu CSV output: no header row starting with \"ID\"")
    header, body = rows[head], rows[head + 1:]
    if "Metric Name" in header and "Metric Value" in header:
        return _parse_details(header, body)
    return _parse_raw(header, body)


def _parse_raw(header: list, body: list) -> pd.DataFrame:
    metric_cols = [i for i, h in enumerate(header) if _METRIC_RE.match(h)]
    i_name = header.index("Kernel Name") if "Kernel Name" in header else 4
    units = [""] * len(header)
    if body and body[0] and body[0][0] == "":
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    out = []
    for r in body:
        if not r or r[0] == "ID" or r[0] == "":
            continue
        try:
            launch = int(_number(r[0]))
        except ValueError:
            continue
        for i in metric_cols:
            if i >= len(r):
                continue
            v, u = _to_base(_number(r[i]), units[i])
            out.append((launch, r[i_name], header[i], v, u))
    return pd.DataFrame(out, columns=NCU_COLUMNS)


def _parse_details(header: list, body: list) -> pd.DataFrame:
    ix = {h: i for i, h in enumerate(header)}
    out = []
    need = max(ix["Metric Name"], ix["Metric Value"], ix["Kernel Name"])
    for r in body:
        # metric rows end at "Metric Value" (ncu 2025 adds rule columns that only its rule
        # rows fill); rule rows have no metric name
        if len(r) <= need or r[0] == "ID" or not r[ix["Metric Name"]].strip():
            continue
        v, u = _to_base(_number(r[ix["Metric Value"]]), r[ix.get("Metric Unit", 0)]
                        if "Metric Unit" in ix else "")
        out.append((int(_number(r[ix["ID"]])), r[ix["Kernel Name"]], r[ix["Metric Name"]], v, u,
                    r[ix["Section Name"]] if "Section Name" in ix else ""))
    df = pd.DataFrame(out, columns=NCU_COLUMNS + ["section"])
    return df if "Section Name" in ix else df[NCU_COLUMNS]
