"""Provenance: every field present, JSON-ready, sane without a GPU."""
import datetime as dt
import importlib.metadata
import json

import pytest
import torch

from kernels.bench.provenance import collect_provenance, git_info
from kernels.packages import package_version

FIELDS = ("gpu", "gpu_slug", "sm_count", "l2_bytes", "driver", "cuda", "torch", "triton", "fla",
          "flashinfer", "python", "git_sha", "git_dirty", "timing_methods_rev", "fastcall", "params",
          "timestamp", "hostname")


def test_fields_and_json():
    rec = collect_provenance({"B": (1, 4), "method": "event", "x": float("nan")})
    assert set(FIELDS) <= set(rec)
    json.dumps(rec)  # JSON-ready as is
    assert rec["params"]["B"] == [1, 4]
    assert rec["torch"] == importlib.metadata.version("torch")
    from kernels.bench.timing import TIMING_METHODS_REV

    assert rec["timing_methods_rev"] == TIMING_METHODS_REV >= 1   # 0: runs before the field
    assert set(rec["fastcall"]) == {"mode", "loaded", "reason", "enabled"}
    ts = dt.datetime.fromisoformat(rec["timestamp"])
    assert ts.utcoffset() == dt.timedelta(0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU values; this host has a GPU")
def test_cpu_values():
    rec = collect_provenance({})
    assert rec["gpu"] == rec["sm_count"] == rec["l2_bytes"] == rec["driver"] == "none"
    assert rec["gpu_slug"] == "cpu-interpreter"


@pytest.mark.parametrize("module, want", [
    pytest.param("pandas", None, id="installed"),
    pytest.param("surely_not_a_module_xyz", "absent", id="absent"),
])
def test_package_version(module, want):
    v = package_version(module)
    assert v == want if want else v not in ("absent", "")


def test_fastcall_says_whether_plans_could_serve(monkeypatch):
    """The record names the plans' state as it is: loaded once a call built the extension,
    not enabled under ``GDN_FAST_LAUNCH=0``."""
    from kernels import fastcall

    fastcall.load()
    assert collect_provenance({})["fastcall"] == dict(fastcall.status(), enabled=True)
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    assert collect_provenance({})["fastcall"]["enabled"] is False


def test_git_info_outside_a_checkout(tmp_path):
    assert git_info(tmp_path) == {"git_sha": "unknown", "git_dirty": "unknown"}


def test_git_info_here():
    info = git_info()
    assert info["git_sha"] == "unknown" or len(info["git_sha"]) == 40


def test_git_sha_from_the_environment_outside_a_checkout(tmp_path, monkeypatch):
    from kernels.bench.provenance import git_info

    monkeypatch.setenv("GDN_GIT_SHA", "abc123")
    monkeypatch.setenv("GDN_GIT_DIRTY", "False")
    assert git_info(tmp_path) == {"git_sha": "abc123", "git_dirty": "False"}
    monkeypatch.delenv("GDN_GIT_SHA")
    assert git_info(tmp_path)["git_sha"] == "unknown"


def test_git_sha_from_the_environment_wins_over_a_checkout(monkeypatch):
    """The GPU host's copy of the tree can carry a stale .git: the stated commit wins."""
    from kernels.bench.provenance import git_info

    monkeypatch.setenv("GDN_GIT_SHA", "abc123")
    monkeypatch.setenv("GDN_GIT_DIRTY", "False")
    assert git_info() == {"git_sha": "abc123", "git_dirty": "False"}


def test_a_short_sha_from_the_environment_is_stored_in_full(monkeypatch):
    """One format: a short ``GDN_GIT_SHA`` that this checkout knows becomes the 40-hex id."""
    import subprocess
    from pathlib import Path

    from kernels.bench.provenance import full_sha

    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                          text=True).stdout.strip()
    if len(head) != 40:
        pytest.skip("not a git checkout")
    monkeypatch.setenv("GDN_GIT_SHA", head[:7])
    assert git_info()["git_sha"] == head
    assert full_sha(head[:7]) == full_sha(head) == head
    assert full_sha("abc123") == "abc123"            # not a commit here: kept as given
