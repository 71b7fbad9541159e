"""Every Triton kernel of ours compiles for sm_80 ... sm_120 at the launches the dispatch
rules pick there, and fits that architecture (``kernels.arch_check``, no GPU needed);
the launch rules read the device's shared-memory limit.

The compile test runs ``python -m kernels.arch_check`` in a subprocess with
``TRITON_INTERPRET=0`` (the kernels must be Triton JIT functions, which this test
process, on the interpreter, does not have): ``--scope all`` for sm_86 (99 KB per block,
no programmatic dependent launch), ``--scope dispatch`` for the other five.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernels.gpu_limits import ARCHS, device_limits, limits_for

ROOT = Path(__file__).resolve().parents[1]
KB = 1024

#: every top-level kernel we launch, and the ones the default path launches
ALL_KERNELS = {"gdn_decode_kernel", "gdn_replay_kernel", "chunk_gates_kernel", "intra_chunk_kernel",
               "state_walk_kernel", "state_walk_t_kernel", "segment_combine_t_kernel",
               "pack_kernel", "unpack_kernel", "recurrent_prefill_kernel", "segment_split_kernel",
               "rank_chain_kernel", "rank_index_kernel", "rank_fix_kernel"}
DISPATCH_KERNELS = {"gdn_decode_kernel", "gdn_replay_kernel", "intra_chunk_kernel",
                    "state_walk_kernel",
                    "state_walk_t_kernel", "segment_combine_t_kernel", "pack_kernel",
                    "unpack_kernel", "recurrent_prefill_kernel", "segment_split_kernel"}
#: launched on sm_90 only (the long paths' phase C, kernels.prefill.config.walk_gluon_rule)
SM90_KERNELS = {"state_walk_gluon_kernel"}


def test_limits_table():
    assert sorted(ARCHS) == [80, 86, 89, 90, 100, 120]
    assert {cc: a.smem_per_block // KB for cc, a in ARCHS.items()} == {
        80: 163, 86: 99, 89: 99, 90: 227, 100: 227, 120: 99}
    assert {cc for cc, a in ARCHS.items() if a.pdl} == {90, 100, 120}
    assert limits_for((8, 6)) is ARCHS[86]
    assert limits_for(87) is ARCHS[86]          # nearest lower of the same major
    assert limits_for(75).smem_per_block == 99 * KB   # unknown major: the smallest row
    assert device_limits("cpu") is ARCHS[90]    # the interpreter keeps the Hopper rules


@pytest.mark.parametrize("cc", sorted(ARCHS))
@pytest.mark.parametrize("BV, programs, want", [
    pytest.param(32, 64, 3, id="few-programs"),   # 3 stages wherever they fit
    pytest.param(64, 1000, 3, id="wide"),
    pytest.param(16, 1000, 2, id="many-narrow"),
])
def test_walk_stages_rule_reads_the_device_limit(cc, BV, programs, want):
    from kernels.prefill.config import WALK_3_STAGE_SMEM, walk_launch_rule, walk_stages_rule

    a = ARCHS[cc]
    fits3 = a.smem_per_block >= WALK_3_STAGE_SMEM
    got = walk_stages_rule(BV, programs, a.n_sm, a.smem_per_block)
    assert got == (want if fits3 else 2)
    assert walk_launch_rule(BV, programs, a.n_sm, False,
                            smem_per_block=a.smem_per_block)[1] == got
    assert walk_stages_rule(BV, programs, a.n_sm) == want   # no limit given: as measured
    assert fits3 == (cc in (80, 90, 100))
    assert WALK_3_STAGE_SMEM >= 155_648  # the largest 3-stage walk compiled (sm_120, triton 3.6)


def _arch_check(archs, scope, out: Path):
    env = dict(os.environ, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "kernels.arch_check", "--arch",
                          ",".join(map(str, archs)), "--scope", scope, "--json", str(out),
                          "--jobs", str(os.cpu_count() or 1)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    print(f"arch_check {archs} {scope}: {time.monotonic() - t0:.0f} s")
    return res


@pytest.mark.slow
def test_every_kernel_compiles_and_fits_every_arch(tmp_path):
    pytest.importorskip("triton.backends.nvidia", reason="triton without its NVIDIA backend")
    runs = [([86], "all"), ([80, 89, 90, 100, 120], "dispatch")]
    rows, versions = [], set()
    for archs, scope in runs:
        out = tmp_path / f"{scope}.json"
        res = _arch_check(archs, scope, out)
        assert out.exists(), res.stderr[-4000:]
        doc = json.loads(out.read_text())
        versions.add(doc["triton"])
        bad = [r for r in doc["rows"] if not r["fits"]]
        assert not bad, "\n".join(f"sm_{r['arch']} {r['kernel']} {r['launches'][:2]}: {r['error']}"
                                  for r in bad)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        for cc in archs:
            mine = [r for r in doc["rows"] if r["arch"] == cc]
            kernels = {r["kernel"].split(".")[-1] for r in mine}
            want = (ALL_KERNELS if scope == "all" else DISPATCH_KERNELS)
            assert kernels == want | (SM90_KERNELS if cc == 90 else set()), cc
            assert all(r["shared_bytes"] <= ARCHS[cc].smem_per_block for r in mine)
            assert all(r["regs"] and r["regs"] * 32 * r["num_warps"] <= 65536 for r in mine)
        rows += doc["rows"]
    print(f"triton {versions}: {len(rows)} launches compiled")
    # Hopper-only features: off below sm_90, on from sm_90 (the walks wait on the grid)
    for cc in ARCHS:
        mine = [r for r in rows if r["arch"] == cc]
        pdl = [r for r in mine if r["uses_pdl"] or r["launch_pdl"]]
        if ARCHS[cc].pdl:
            assert pdl, f"sm_{cc}: no launch uses programmatic dependent launch"
        else:
            assert not pdl, f"sm_{cc}: {[(r['kernel'], r['launches'][:1]) for r in pdl]}"
    # the stage rule read each device's limit through the real dispatch (the fused walk and
    # CP phase C; phase A, SUMMARY, keeps its 3 stages: 66 KB)
    for cc in ARCHS:
        walks = {r["num_stages"] for r in rows
                 if r["arch"] == cc and r["kernel"].endswith(".state_walk_kernel")
                 and not r["constexprs"].get("SUMMARY")}
        assert walks == ({2, 3} if ARCHS[cc].smem_per_block >= 160 * KB else {2}), (cc, walks)
    # every contest prefill shape and long length was captured on every arch
    from kernels.arch_check import LONG_LENGTHS
    from kernels.spec import PREFILL_SHAPES

    labels = set(PREFILL_SHAPES) | {f"T{n}" for n in LONG_LENGTHS}
    for cc in ARCHS:
        seen = {w.split()[-1] for r in rows if r["arch"] == cc for w in r["launches"]
                if w.startswith("prefill fused ")}
        assert labels <= seen, (cc, labels - seen)
