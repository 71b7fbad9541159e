"""Roofline arithmetic (CPU) and the measured copy bandwidth (CPU clock / GPU events)."""
import pytest

from kernels.bench.roofline import (achieved_fraction, copy_bandwidth, decode_bytes,
                                    floor_us, prefill_bytes)
from kernels.spec import CONTEST, GDNShape, decode_state_bytes

MiB = 1 << 20


@pytest.mark.parametrize("B, state_mib", [
    pytest.param(1, 1, id="B1"),
    pytest.param(64, 64, id="B64"),
])
def test_decode_bytes_is_state_plus_small_tensors(B, state_mib):
    assert decode_state_bytes(B, CONTEST) == state_mib * MiB
    small = B * (2 * 4 * 128 + 2 * 8 * 128 + 2 * 8) * 2 + 2 * 8 * 4
    assert decode_bytes(B) == state_mib * MiB + small


@pytest.mark.parametrize("lens, with_state, want", [
    pytest.param([64], False, 64 * (2 * 4 + 2 * 8) * 128 * 2 + 64 * 16 * 2 + 2 * 8 + 64
                 + 8 * 128 * 128 * 4, id="T64-no-state"),
    pytest.param([64], True, 64 * (2 * 4 + 2 * 8) * 128 * 2 + 64 * 16 * 2 + 2 * 8 + 64
                 + 2 * 8 * 128 * 128 * 4, id="T64-state"),
])
def test_prefill_bytes(lens, with_state, want):
    assert prefill_bytes(lens, CONTEST, with_state) == want


def test_prefill_bytes_counts_each_sequence_state():
    one = prefill_bytes([128], CONTEST, True)
    two = prefill_bytes([64, 64], CONTEST, True)
    assert two - one == 2 * 8 * 128 * 128 * 4 + 8


def test_small_shape():
    assert decode_bytes(2, GDNShape(1, 2, 16)) == 2 * 2 * 2 * 16 * 16 * 4 + 2 * (2 * 16 + 2 * 2 * 16 + 2 * 2) * 2 + 16


@pytest.mark.parametrize("nbytes, bw, us", [
    pytest.param(64 * MiB, 4e12, 64 * MiB / 4e12 * 1e6, id="64MiB-at-4TBs"),
    pytest.param(0, 1e9, 0.0, id="zero"),
])
def test_floor_and_fraction(nbytes, bw, us):
    assert floor_us(nbytes, bw) == pytest.approx(us)
    if us:
        assert achieved_fraction(nbytes, us, bw) == pytest.approx(1.0)
        assert achieved_fraction(nbytes, 2 * us, bw) == pytest.approx(0.5)


def test_bad_bandwidth():
    with pytest.raises(ValueError):
        floor_us(1, 0)


def test_copy_bandwidth_cpu_is_positive_and_cached():
    bw = copy_bandwidth("cpu", nbytes=4 * MiB, reps=3)
    assert bw > 1e8
    assert copy_bandwidth("cpu", nbytes=4 * MiB, reps=3) == bw


@pytest.mark.gpu
def test_copy_bandwidth_gpu_is_plausible():
    bw = copy_bandwidth("cuda", nbytes=256 * MiB)
    assert 2e11 < bw < 2e13  # 0.2 .. 20 TB/s
