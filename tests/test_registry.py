"""kernels.registry: every notebook's implementations as one record type, a peer added in
one place (a row of kernels.peers.PEERS). CPU, no worker started: cheap."""
from __future__ import annotations

import pytest

from kernels import peers, registry
from kernels.experiments import decode_crossover as dx
from kernels.experiments import prefill_overhead as px
from kernels.experiments import prefill_scaling as xs
from kernels.reference import prefill_reference
from kernels.spec import GDNShape, make_prefill_inputs


def _params(module, **kw):
    p = {q.name: q.default for q in module.PARAMS}
    p.update(solutions=[], **kw)
    return p


def test_records_of_ours_and_peers_in_order():
    impls = px.resolve_impls(_params(px, impls=["fla", "ours", "torch"],
                                     variants=["fused", "recurrent"]))
    assert [(r.label, r.kind, r.impl, r.variant) for r in impls] == [
        ("fla (triton)", "peer", "fla", "default"), ("ours-fused", "ours", "ours", "fused"),
        ("ours-recurrent", "ours", "ours", "recurrent"), ("torch", "peer", "torch", "default")]
    fla, torch_ = impls[0], impls[-1]
    assert not fla and fla.fn is None and "CUDA GPU" in fla.reason and "\n" not in fla.reason
    assert torch_ and torch_.where == "process" and not torch_.reason


def test_unknown_entries_are_refused_before_anything_runs():
    for module, params in ((px, _params(px, impls=["ours", "nope"])),
                           (dx, _params(dx, impls=["ours-adaptive", "nope"])),
                           (xs, dict(impls=["ours", "nope"]))):
        with pytest.raises(ValueError, match=r"unknown impls \['nope'\]; known: .*solution:"):
            module.resolve_impls(params)


def test_one_peer_as_several_variants():
    impls = dx.resolve_impls(_params(dx, impls=["flashinfer", "ours-fla-like"]))
    fi = [r for r in impls if r.label == "flashinfer"]
    assert [(r.variant, r.name) for r in fi] == [("default", "flashinfer"),
                                                 ("inplace", "flashinfer_inplace")]
    assert all(not r and r.kind == "peer" for r in fi)   # no GPU here


def test_worker_peers_are_refused_where_a_section_calls_in_process():
    with pytest.raises(ValueError, match="peer worker"):
        registry.peers(["flashqla"], "prefill", in_process=True)


def test_an_unavailable_build_of_ours_is_a_record_with_its_reason():
    def broken():
        raise RuntimeError("no such kernel\nsecond line")

    r = registry.ours("ours-x", broken, op="prefill", variant="x")
    assert not r and r.kind == "ours" and r.reason.startswith("RuntimeError: no such kernel")


def test_adding_a_peer_is_one_row(monkeypatch):
    """A new row of PEERS: notebook 02 accepts its name, builds it, labels it and gates it."""
    def build():
        return lambda **kw: prefill_reference(**kw)

    row = peers.Peer("mine", "prefill", build, "mine (test)", "torch")
    monkeypatch.setattr(peers, "PEERS", peers.PEERS + (row,))
    (rec,) = px.resolve_impls(_params(px, impls=["mine"]))
    assert (rec.label, rec.kind, rec.impl) == ("mine (test)", "peer", "mine") and rec
    assert peers.prefill_label("mine") == "mine (test)"
    x = make_prefill_inputs([5, 3], GDNShape(1, 2, 16), seed=0)
    assert registry.gate(rec, "5+3", x, prefill_reference(**x), "cpu")["status"] == "pass"
