"""Peers: availability is reported, never raised; torch runs everywhere; on a GPU
every available peer matches the reference and leaves its input state alone."""
import os

import pytest
import torch

from kernels import peers
from kernels.checks import check_outputs
from kernels.reference import decode_reference, prefill_reference
from kernels.spec import make_decode_inputs, make_prefill_inputs

HAS_CUDA = torch.cuda.is_available()


def _installed(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("op, builder, names", [
    pytest.param("decode", peers.decode_impls, peers.DECODE_PEERS, id="decode"),
    pytest.param("prefill", peers.prefill_impls, peers.PREFILL_PEERS, id="prefill"),
])
def test_every_peer_is_callable_or_unavailable_with_reason(op, builder, names):
    impls = builder(names)
    assert list(impls) == list(names)
    assert impls["torch"]  # eager PyTorch runs on any device
    for name, fn in impls.items():
        if not fn:
            assert isinstance(fn, peers.Unavailable) and fn.name == name and fn.reason
            with pytest.raises(RuntimeError, match="unavailable"):
                fn()


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU reasons; this host has a GPU")
@pytest.mark.parametrize("builder, name, words", [
    pytest.param(peers.prefill_impls, "fla", ("fla-core", "CUDA GPU"), id="fla-prefill"),
    pytest.param(peers.decode_impls, "flashinfer", ("flashinfer", "CUDA GPU"), id="fi-decode"),
    pytest.param(peers.decode_impls, "flashinfer_inplace", ("flashinfer", "CUDA GPU"),
                 id="fi-inplace"),
    pytest.param(peers.prefill_impls, "flashinfer", ("flashinfer", "CUDA GPU"), id="fi-prefill"),
])
def test_gpu_peers_unavailable_on_cpu(builder, name, words):
    fn = builder([name])[name]
    assert not fn
    # not installed -> says which package; installed -> says it needs a GPU
    assert any(w in fn.reason for w in words), fn.reason


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour; this host has a GPU")
def test_fla_decode_on_cpu_needs_fla_and_the_interpreter(interpret):
    fn = peers.decode_impls(["fla"])["fla"]
    if not _installed("fla"):
        assert not fn and "fla-core is not installed" in fn.reason
    elif not interpret:
        assert not fn and "TRITON_INTERPRET=1" in fn.reason
    else:
        assert fn  # works under the interpreter: check the adapter against the spec
        inputs = make_decode_inputs(1)
        before = inputs["state"].clone()
        out = fn(**inputs)
        assert out[0].shape == (1, 1, 8, 128) and out[0].dtype == torch.bfloat16
        assert check_outputs(out, decode_reference(**inputs)).ok
        assert torch.equal(inputs["state"], before)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour; this host has a GPU")
def test_fla_recurrent_prefill_on_cpu_needs_fla_and_the_interpreter(interpret):
    from kernels.spec import GDNShape
    fn = peers.prefill_impls(["fla_recurrent"])["fla_recurrent"]
    if not _installed("fla"):
        assert not fn and "fla-core is not installed" in fn.reason
    elif not interpret:
        assert not fn and "TRITON_INTERPRET=1" in fn.reason
    else:
        assert fn and peers.prefill_label("fla_recurrent") == "fla (fused recurrent)"
        for with_state in (True, False):   # packed sequences, an empty one among them
            inputs = make_prefill_inputs([3, 0, 2], GDNShape(1, 2, 16), with_state=with_state)
            before = {n: t.clone() for n, t in inputs.items() if torch.is_tensor(t)}
            out = fn(**inputs)
            assert out[0].shape == (5, 2, 16) and out[0].dtype == torch.bfloat16
            assert check_outputs(out, prefill_reference(**inputs)).ok
            assert all(torch.equal(inputs[n], t) for n, t in before.items())


@pytest.mark.skipif(_installed("flashinfer"), reason="flashinfer is installed here")
def test_flashinfer_absent_names_the_package():
    assert "flashinfer-python is not installed" in peers.decode_impls(["flashinfer"])["flashinfer"].reason


def test_unknown_peer():
    fn = peers.decode_impls(["cudnn"])["cudnn"]
    assert not fn and "unknown decode peer" in fn.reason


def test_peer_status_table():
    df = peers.peer_status()
    assert list(df.columns) == ["impl", "op", "available", "reason", "version"]
    assert len(df) == len(peers.DECODE_PEERS) + len(peers.PREFILL_PEERS)
    torch_rows = df[df["impl"] == "torch"]
    assert torch_rows["available"].all() and (torch_rows["version"] != "absent").all()
    assert (df.loc[~df["available"], "reason"] != "").all()


def test_torch_decode_peer_matches_reference():
    inputs = make_decode_inputs(2)
    before = inputs["state"].clone()
    out = peers.decode_impls(["torch"])["torch"](**inputs)
    assert check_outputs(out, decode_reference(**inputs)).ok
    assert torch.equal(inputs["state"], before)


def test_torch_prefill_peer_matches_reference():
    inputs = make_prefill_inputs([5, 0, 3])
    out = peers.prefill_impls(["torch"])["torch"](**inputs)
    assert out[0].shape == (8, 8, 128) and out[0].dtype == torch.bfloat16
    assert check_outputs(out, prefill_reference(**inputs)).ok


@pytest.mark.parametrize("lens", [pytest.param([3], id="one"), pytest.param([2, 4], id="two")])
def test_prefill_gates_match_reference_gates(lens):
    from kernels.reference import gates_reference

    x = make_prefill_inputs(lens)
    g, beta = peers.prefill_gates(x["A_log"], x["a"], x["dt_bias"], x["b"])
    decay, beta_ref = gates_reference(x["A_log"], x["a"], x["dt_bias"], x["b"])
    assert torch.allclose(g.exp(), decay) and torch.equal(beta, beta_ref)
    assert g.dtype == beta.dtype == torch.float32 and g.shape == (sum(lens), 8)


# --------------------------------------------------------------------------- GPU


SERVING_PEERS = ("flashinfer_bf16_inplace", "flashinfer_mtp_inplace")


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in peers.DECODE_PEERS
                                  if n != "torch" and n not in SERVING_PEERS])
@pytest.mark.parametrize("B", [1, 8, 64])
def test_gpu_decode_peer_matches_reference(name, B):
    fn = peers.decode_impls([name])[name]
    if not fn:
        pytest.skip(fn.reason)
    inputs = make_decode_inputs(B, device="cuda")
    ref = decode_reference(**inputs)
    before = inputs["state"].clone()
    out, st = fn(**inputs)
    torch.cuda.synchronize()
    assert out.shape == (B, 1, 8, 128) and out.dtype == torch.bfloat16
    assert st.shape == (B, 8, 128, 128) and st.dtype == torch.float32
    assert check_outputs((out, st), ref).ok
    if name != "flashinfer_inplace":
        assert torch.equal(inputs["state"], before)


@pytest.mark.gpu
@pytest.mark.parametrize("name, T, state_dtype", [
    ("flashinfer_bf16_inplace", 1, torch.bfloat16), ("flashinfer_bf16_inplace", 4, torch.bfloat16),
    ("flashinfer_mtp_inplace", 2, torch.float32), ("flashinfer_mtp_inplace", 4, torch.float32)])
@pytest.mark.parametrize("B", [1, 64])
def test_gpu_serving_peer_matches_reference(name, T, state_dtype, B):
    """FlashInfer's bf16-state and multi-token kernels (in place) against the spec;
    a version without them (or without T > 1 on bf16) is skipped with the reason."""
    fn = peers.decode_impls([name])[name]
    if not fn:
        pytest.skip(fn.reason)
    inputs = make_decode_inputs(B, device="cuda", tokens=T, state_dtype=state_dtype)
    ref = decode_reference(**inputs)
    try:
        out, st = fn(**inputs)
    except Exception as e:  # e.g. an older FlashInfer that takes only T=1
        pytest.skip(f"{name} refused T={T}: {type(e).__name__}: {e}")
    torch.cuda.synchronize()
    assert out.shape == (B, T, 8, 128) and st.dtype == state_dtype
    assert check_outputs((out, st), ref).ok


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in peers.PREFILL_PEERS if n != "torch"])
@pytest.mark.parametrize("lens, with_state", [
    pytest.param([64], True, id="T64"),
    pytest.param([100, 28], True, id="100+28"),
    pytest.param([6, 0, 70], True, id="with-empty"),
    pytest.param([128], False, id="no-state"),
])
def test_gpu_prefill_peer_matches_reference(name, lens, with_state):
    fn = peers.prefill_impls([name])[name]
    if not fn:
        pytest.skip(fn.reason)
    inputs = make_prefill_inputs(lens, device="cuda", with_state=with_state)
    ref = prefill_reference(**inputs)
    out, st = fn(**inputs)
    torch.cuda.synchronize()
    assert out.shape == (sum(lens), 8, 128) and out.dtype == torch.bfloat16
    assert st.shape == (len(lens), 8, 128, 128) and st.dtype == torch.float32
    assert check_outputs((out, st), ref).ok


def test_prefill_labels_name_the_fla_backend():
    assert peers.prefill_label("fla") == "fla (triton)"
    assert peers.prefill_label("fla_flashqla") == "fla (flashqla backend)"
    assert set(peers.WORKER_PEERS) <= set(peers.PREFILL_PEERS)
    labels = [peers.prefill_label(n) for n in peers.PREFILL_PEERS]
    assert len(set(labels)) == len(labels) and "fla" not in labels


def test_notebooks_defaults_and_report_columns_come_from_the_rows(monkeypatch):
    """A row's ``default_in`` puts the peer in those notebooks' default ``impls`` (in PEERS'
    order) and its ``column`` in the results page's tables: adding a peer is one row."""
    from kernels.experiments import decode_crossover, ncu_counts, prefill_overhead, prefill_scaling

    assert peers.default_peers("prefill", prefill_overhead.STEM) == [
        "fla", "fla_recurrent", "fla_flashqla", "flashqla", "flashinfer"]
    assert peers.default_peers("prefill", "04") == ["fla", "fla_flashqla", "flashqla",
                                                    "flashinfer"]
    assert peers.default_peers("decode", "01") == ["fla", "flashinfer", "torch"]
    for mod, first, op in ((decode_crossover, 2, "decode"), (prefill_overhead, 1, "prefill"),
                           (prefill_scaling, 1, "prefill")):
        impls = next(p.default for p in mod.PARAMS if p.name == "impls")
        assert impls[first:] == peers.default_peers(op, mod.STEM), mod.STEM
    impls = next(p.default for p in ncu_counts.PARAMS if p.name == "impls")
    assert impls == peers.default_peers("decode", ncu_counts.STEM) + ["ours"]
    assert list(peers.peer_columns("prefill")) == ["FLA (triton)", "FLA (FlashQLA backend)",
                                                   "FlashQLA", "FlashInfer"]
    assert peers.peer_columns("decode") == {"FLA": ("fla", "fla"),
                                            "FlashInfer": ("flashinfer", "flashinfer")}
    new = peers.Peer("newpeer", "prefill", peers._torch_prefill, "new peer", "torch",
                     default_in=("04",), column="New")
    monkeypatch.setattr(peers, "PEERS", peers.PEERS + (new,))
    assert peers.default_peers("prefill", "04")[-1] == "newpeer"
    assert "newpeer" not in peers.default_peers("prefill", "02")
    assert peers.peer_columns("prefill")["New"] == ("new peer", "newpeer")


@pytest.mark.parametrize("name, switch", [("fla", "0"), ("fla_flashqla", "1")])
def test_fla_rows_set_flas_flashqla_switch_during_the_call(monkeypatch, name, switch):
    """FLA reads FLA_FLASH_QLA on every call: ``fla`` runs with it 0 (Triton), ``fla_flashqla``
    with it 1, and the caller's value is restored afterwards."""
    seen = {}

    def fake_chunk(q, k, v, g, beta, *, scale, initial_state, output_final_state,
                   state_v_first, cu_seqlens):
        seen["switch"] = os.environ.get("FLA_FLASH_QLA")
        return v.float(), initial_state

    class FakeBackend:
        def verify(self, name, *args, **kw):
            seen["verified"] = os.environ.get("FLA_FLASH_QLA")
            return True, None

        is_available = is_enabled = staticmethod(lambda: True)

    fakes = {"chunk_gated_delta_rule": fake_chunk, "FlashQLABackend": FakeBackend}
    monkeypatch.setattr(peers, "_need_package", lambda *a: None)
    monkeypatch.setattr(peers, "_need_cuda", lambda *a, **k: None)
    monkeypatch.setattr(peers, "_import", lambda module, attr, dist: fakes[attr])
    monkeypatch.setattr(peers.importlib, "import_module",
                        lambda m: type("M", (), {"_DISPATCH_DISABLED": False}))
    monkeypatch.setenv("FLA_FLASH_QLA", "caller")
    fn = peers.prefill_impls([name])[name]
    assert fn, getattr(fn, "reason", "")
    fn(**make_prefill_inputs([3]))
    assert seen["switch"] == switch
    assert seen.get("verified") == ("1" if name == "fla_flashqla" else None)
    assert os.environ["FLA_FLASH_QLA"] == "caller"


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU reason; this host has a GPU")
@pytest.mark.parametrize("name", ["flashqla", "fla_flashqla"])
def test_flashqla_peers_unavailable_on_cpu(name):
    fn = peers.prefill_impls([name])[name]
    assert not fn and ("CUDA GPU" in fn.reason or "not installed" in fn.reason), fn.reason
