"""Kernel roles, the per-kernel roofline model, the measured tensor rate, and the sm_90
resource table of the launches one prefill call makes (compiled on the CPU)."""
import functools

import pytest
import torch

from kernels.bench import anatomy, roofline, sm90
from kernels.spec import CONTEST, GDNShape, make_prefill_inputs


@pytest.mark.parametrize("names, roles", [
    (["intra_chunk_kernel"], ["intra-chunk + walkers"]),
    (["intra_chunk_kernel", "state_walk_t_kernel"], ["intra-chunk", "walk"]),
    (["intra_chunk_kernel", "state_walk_kernel", "state_walk_kernel"],
     ["intra-chunk", "CP phase A", "CP phase C"]),
    (["intra_chunk_kernel", "state_walk_t_kernel", "segment_combine_t_kernel",
      "state_walk_t_kernel"], ["intra-chunk", "CP phase A", "CP phase B", "CP phase C"]),
    (["pack_kernel", "intra_chunk_kernel", "state_walk_kernel", "unpack_kernel"],
     ["pack_kernel", "intra-chunk", "walk", "unpack_kernel"]),
])
def test_kernel_roles(names, roles):
    assert anatomy.kernel_roles(names) == roles


def test_kernel_times_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        anatomy.kernel_times(lambda: None, calls=1)


def test_prefill_kernel_model_matches_the_notes():
    # docs/notes/prefill.md, prefill v9: the walk at 16x256 moves ~48 MB (k, q 8, v 8, Tb + Aqk 8,
    # state in and out 16, outputs 8) and does ~4.3 GFLOP
    w = roofline.prefill_kernel_model("walk", [256] * 16, CONTEST)
    assert w["bytes"] / 1e6 == pytest.approx(48.5, rel=0.05)
    assert w["flops"] / 1e9 == pytest.approx(4.3, rel=0.05)
    intra = roofline.prefill_kernel_model("intra-chunk", [8192], CONTEST)
    nch = 8192 // 64 * 8                                      # K K^T, q K^T and the solve
    assert intra["flops"] == pytest.approx(nch * (2 * 2 * 64 * 64 * 128 + 2 * 64 ** 3 / 3))
    # CP: phase C of the long path reads the entering states instead of the initial state,
    # phase B does one D^3 product per transition (segments - sequences)
    seg = 64
    b = roofline.prefill_kernel_model("CP phase B", [131072], CONTEST, seg_chunks=seg,
                                      long_cp=True)
    assert b["flops"] == (131072 // (seg * 64) - 1) * 8 * 2 * 128 ** 3
    chained = roofline.prefill_kernel_model("CP phase C", [8192], CONTEST, seg_chunks=16)
    long = roofline.prefill_kernel_model("CP phase C", [8192], CONTEST, seg_chunks=16,
                                         long_cp=True)
    assert chained["flops"] > long["flops"] == w["flops"] * 8192 / 4096
    # the long path's intra-chunk kernel also writes one f32 bound per chunk-head
    intra_long = roofline.prefill_kernel_model("intra-chunk", [8192], CONTEST, seg_chunks=16,
                                               long_cp=True)
    assert intra_long["bytes"] - intra["bytes"] == nch * 4
    with pytest.raises(ValueError, match="unknown kernel role"):
        roofline.prefill_kernel_model("nope", [64])


def test_tensor_rate_on_the_cpu_is_positive():
    assert roofline.tensor_rate("cpu", n=64, reps=2) > 0


def test_programs_per_sm():
    assert sm90.programs_per_sm(128, 0, 4) == 4          # 65536 / (128 * 128)
    assert sm90.programs_per_sm(255, 0, 8) == 1
    assert sm90.programs_per_sm(64, 120_000, 4) == 1     # shared memory bound
    assert sm90.programs_per_sm(32, 0, 1) == 32          # the program limit


def test_sm90_resources_of_a_prefill_call(interpret):
    from kernels.prefill import gdn_prefill

    x = make_prefill_inputs([200], GDNShape(2, 4, 32),   # > 128 tokens: two launches
                            device="cpu" if interpret else "cuda")
    launches = sm90.record_launches(lambda: gdn_prefill(**x, variant="fused", cp=False))
    assert [ln["name"] for ln in launches] == ["intra_chunk_kernel", "state_walk_kernel"]
    assert launches[0]["args"]["k"] == {"t": "tensor", "dtype": "bf16", "aligned": True}
    df = sm90.compile_resources(launches)
    assert list(df.columns) == sm90.RESOURCE_COLUMNS and (df.error == "").all(), df.error
    assert (df.regs > 0).all() and (df.programs_per_sm >= 1).all() and (df.shared > 0).all()


def test_distinct_launches_keep_constexpr_values_apart():
    """Two launches that differ only in a constexpr's value compile to two kernels (two rows);
    launches that differ only in a runtime int's value compile to one."""
    from kernels.bench.sm90 import _key

    base = dict(module="kernels.decode.replay_kernel", name="gdn_replay_kernel", grid=[8],
                options={"num_warps": 1},
                args={"P": {"t": "int", "v": 64}, "BV": {"t": "int", "v": 16},
                      "scale": {"t": "float", "v": 0.088}})

    def variant(**args):
        return dict(base, args={**base["args"], **{k: {"t": "int", "v": v} for k, v in args.items()}})

    assert _key(variant(BV=16)) != _key(variant(BV=32))          # constexpr
    assert _key(variant(P=64)) == _key(variant(P=128))            # runtime int
    assert _key(variant(P=64)) != _key(variant(P=2 ** 40))        # ... of another width


def test_sm90_resources_of_the_gluon_phase_c():
    """Notebook 04's resource table covers the Gluon phase C: its TMA descriptors are typed
    as Triton specialises them (a launch recorded on the CPU, where the launch itself then
    fails for want of a driver) and it compiles for sm_90a, its warps counting the worker
    partitions (4 + 4 state warps, 1 + 3 producer)."""
    pytest.importorskip("triton.backends.nvidia", reason="triton without its NVIDIA backend")
    from kernels.prefill import state_walk_gluon as swg

    if not swg.HAVE_GLUON:
        pytest.skip("this Triton has no triton.experimental.gluon")
    T, HQ, H, D, seg = 4096, 4, 8, 128, 1024
    dev = "cuda" if torch.cuda.is_available() else "cpu"   # on a GPU the launch runs
    z = functools.partial(torch.zeros, device=dev)
    bf = torch.bfloat16
    go = swg.state_walk_gluon_fwd(
        z(T, HQ, D, dtype=bf), z(T, HQ, D, dtype=bf), z(T, H, D, dtype=bf),
        z(T, H, 64, dtype=bf), z(T, H, 64, dtype=bf), z(T, H),
        torch.tensor([0, T], dtype=torch.int32, device=dev), s0=z(T // seg + 1, H, D, D),
        output=z(T, H, D, dtype=bf), final_state=z(1, H, D, D), scale=0.1, seg_t=seg, tail=8,
        defer=True)

    def launch():
        try:
            go()
        except RuntimeError:   # no driver on the CPU: recorded before Triton needed one
            if dev == "cuda":
                raise

    launches = sm90.record_launches(launch)
    assert [ln["name"] for ln in launches] == ["state_walk_gluon_kernel"]
    assert launches[0]["args"]["k_desc"]["t"] == "sig"
    df = sm90.compile_resources(launches)
    assert (df.error == "").all(), df.error.tolist()
    row = df.iloc[0]
    assert row.num_warps == 12 and row.regs > 0 and row.shared > 0
    assert row.programs_per_sm >= 1 and row.programs == (T // seg + 1) * H
