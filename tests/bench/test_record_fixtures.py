"""The GPU-only entry points say clearly that they need a GPU (CPU), and the
ncu target builds its callables from the contract's implementations."""
import pytest
import torch

from kernels import ncu_target
from kernels.bench import record_fixtures

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU exit; this host has a GPU")
@pytest.mark.parametrize("main, argv, code", [
    pytest.param(record_fixtures.main, ["OUT"], 2, id="record_fixtures"),
    pytest.param(ncu_target.main, ["--impl", "ours", "--B", "1"], ncu_target.EXIT_UNAVAILABLE,
                 id="ncu_target"),
])
def test_entry_points_without_gpu(main, argv, code, tmp_path, capsys):
    argv = [str(tmp_path / a) if a == "OUT" else a for a in argv]
    assert main(argv) == code
    assert "GPU" in capsys.readouterr().err


@pytest.mark.parametrize("impl, op", [
    pytest.param("torch", "decode", id="torch-decode"),
    pytest.param("torch", "prefill", id="torch-prefill"),
])
def test_build_call_on_cpu(impl, op):
    fn = ncu_target.build_call(impl, op, B=1, lens=[3], device="cpu")
    out, state = fn()
    assert out.dtype == torch.bfloat16 and state.dtype == torch.float32


def test_build_call_unavailable_peer():
    with pytest.raises(RuntimeError, match="unavailable"):
        ncu_target.build_call("cudnn", "decode", B=1, device="cpu")
