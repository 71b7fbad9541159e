"""Programmatic dependent launch is a GPU-only launch option: off on the CPU interpreter."""
from __future__ import annotations

import pytest
import torch

from kernels.prefill.config import PrefillConfig
from kernels.prefill.pdl import launch_options, pdl_supported


@pytest.mark.parametrize("enabled", [True, False])
def test_no_pdl_off_cuda(enabled):
    cpu = torch.device("cpu")
    assert pdl_supported(cpu) is False
    assert launch_options(enabled, cpu) == {}


def test_pdl_is_a_config_lever_on_by_default():
    assert PrefillConfig().pdl is True
    assert PrefillConfig(pdl=False).name == "pdl=False"
