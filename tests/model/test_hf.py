"""use_ours(model) in a transformers Qwen3-Next (tiny config: a GDN layer and an attention
layer, whose cache tracks the length; random weights; on the GPU where
there is one, else on the CPU under the Triton interpreter): prefill and a cached decode step give the layer's own torch path's
logits; undo restores transformers' binding; a model without GDN layers is refused."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from kernels.model import hf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # as tests/decode/test_decode.py


def tiny_model():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32)
    torch.manual_seed(0)
    return Qwen3NextForCausalLM(cfg).to(torch.bfloat16).eval()


def _prefill_then_step(model):
    ids = torch.arange(6, device=DEVICE)[None] % 64
    with torch.no_grad():
        out = model(ids, use_cache=True)
        step = model(torch.tensor([[7]], device=DEVICE), past_key_values=out.past_key_values, use_cache=True)
    return out.logits.float(), step.logits.float()


def test_use_ours_matches_the_torch_path_and_undoes():
    model = tiny_model().to(DEVICE)
    mod = __import__(type(hf.gdn_layers(model)[0]).__module__, fromlist=["x"])
    bound = {n: getattr(mod, n) for n in hf.TARGETS}
    with hf.use(model, "torch"):
        ref = _prefill_then_step(model)
    calls = []
    with hf.use_ours(model) as swap:
        assert swap.modules == [mod.__name__]
        for name in hf.TARGETS:   # count the calls that reach ours
            fn = getattr(mod, name)
            setattr(mod, name, lambda *a, _fn=fn, _n=name, **k: calls.append(_n) or _fn(*a, **k))
        ours = _prefill_then_step(model)
    assert calls == ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"]
    for got, want in zip(ours, ref):
        assert torch.allclose(got, want, atol=5e-2, rtol=5e-2), (got - want).abs().max()
    assert {n: getattr(mod, n) for n in hf.TARGETS} == bound     # undone


def test_refuses_a_model_without_gdn_layers():
    with pytest.raises(ValueError, match="model"):
        hf.use_ours(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="impl"):
        hf.use(torch.nn.Linear(2, 2), "triton")


def test_peer_functions_named_and_flashqla_refused_where_it_does_not_import():
    """``peer_function`` names bad arguments; binding FlashQLA where ``flash_qla`` does not
    import raises ImportError and leaves transformers' binding as it was."""
    with pytest.raises(ValueError, match="impl"):
        hf.peer_function("ours", "torch_chunk_gated_delta_rule")
    with pytest.raises(ValueError, match="name"):
        hf.peer_function("fla", "chunk_gated_delta_rule")
    try:
        import flash_qla  # noqa: F401
    except Exception:
        model = tiny_model()
        mod = __import__(type(hf.gdn_layers(model)[0]).__module__, fromlist=["x"])
        bound = {n: getattr(mod, n) for n in hf.TARGETS}
        with pytest.raises(ImportError):
            hf.use(model, "flashqla")
        assert {n: getattr(mod, n) for n in hf.TARGETS} == bound
    else:
        pytest.skip("flash_qla imports here: the refusal cannot be checked")
