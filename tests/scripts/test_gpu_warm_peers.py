"""scripts/gpu_warm_peers.py: the shapes it compiles FlashQLA for are the full profile's."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_warm_peers", ROOT / "scripts" / "gpu_warm_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shapes_are_the_full_profiles_in_order():
    from kernels.runner import load_profile

    m = _load()
    nb04 = load_profile("full")["notebooks"]["04_prefill_scaling"]["shapes"]
    got = m.profile_shapes(["04", "02"])
    assert got[:len(nb04)] == nb04 and "57x64" in got and "T6" in got
    assert len(got) == len(set(got))


def test_needs_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert _load().main(["--shapes", "6"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
