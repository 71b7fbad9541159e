"""Device naming and selection."""
import pytest
import torch

from kernels.device import CPU_SLUG, gpu_slug, has_gpu, resolve_device


@pytest.mark.parametrize("name, slug", [
    pytest.param("NVIDIA H200", "nvidia-h200", id="h200"),
    pytest.param("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3", id="h100-sxm"),
    pytest.param("  NVIDIA  GeForce RTX 3090 ", "nvidia-geforce-rtx-3090", id="spaces"),
    pytest.param("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb", id="dashes"),
    pytest.param("Tesla T4 (PCIe)", "tesla-t4-pcie", id="parens"),
])
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


def test_slug_of_this_host():
    assert gpu_slug() == (gpu_slug(torch.cuda.get_device_name()) if has_gpu() else CPU_SLUG)
    assert CPU_SLUG == "cpu-interpreter"


@pytest.mark.parametrize("arg, want", [
    pytest.param("auto", "cuda" if torch.cuda.is_available() else "cpu", id="auto"),
    pytest.param("cpu", "cpu", id="cpu"),
    pytest.param("CPU", "cpu", id="case"),
])
def test_resolve_device(arg, want):
    assert resolve_device(arg).type == want


def test_resolve_device_errors():
    with pytest.raises(ValueError, match="auto"):
        resolve_device("tpu")
    if not has_gpu():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            resolve_device("cuda")
