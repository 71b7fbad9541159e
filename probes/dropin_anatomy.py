"""Where the FLA drop-in's time goes (issue 56; H100 run at dcd25fe, data in results/nvidia-h100-80gb-hbm3/dev_checks/dropin_anatomy_dcd25fe.json): graph + per-kernel times by input form."""
import json, sys, torch
from kernels.spec import make_prefill_inputs
from kernels.prefill import gdn_prefill
from kernels.prefill.qk_norm import qk_l2norm
from kernels.model.fla_compat import chunk_gated_delta_rule
from kernels.bench.timing import time_fn
from kernels.bench.anatomy import kernel_times
import torch.nn.functional as F

out = []
for T in (8192, 131072):
    inp = make_prefill_inputs([T], seed=0, device="cuda")
    q4, k4, v = inp["q"], inp["k"], inp["v"]          # [T, 4, D] unit norm, [T, 8, D]
    g = (-torch.exp(inp["A_log"]) * F.softplus(inp["a"].float() + inp["dt_bias"])).contiguous()
    beta = torch.sigmoid(inp["b"].float()).to(torch.bfloat16).contiguous()
    q8 = q4.repeat_interleave(2, dim=1).contiguous(); k8 = k4.repeat_interleave(2, dim=1).contiguous()
    # transformers-like: v a view into a wider buffer
    big = torch.empty(T, 3 * 8 * 128, dtype=torch.bfloat16, device="cuda")
    big[:, :1024].copy_(v.reshape(T, -1)); vview = big[:, :1024].view(1, T, 8, 128)
    cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    case = {
      "contest": lambda: gdn_prefill(**inp),
      "dropin_gva4_nonorm": lambda: chunk_gated_delta_rule(q4[None], k4[None], v[None], g[None], beta[None], output_final_state=True),
      "dropin_rep8_nonorm": lambda: chunk_gated_delta_rule(q8[None], k8[None], v[None], g[None], beta[None], output_final_state=True),
      "dropin_rep8_norm": lambda: chunk_gated_delta_rule(q8[None], k8[None], v[None], g[None], beta[None], output_final_state=True, use_qk_l2norm_in_kernel=True),
      "dropin_rep8_norm_vview": lambda: chunk_gated_delta_rule(q8[None], k8[None], vview, g[None], beta[None], output_final_state=True, use_qk_l2norm_in_kernel=True),
      "dropin_gva4_norm": lambda: chunk_gated_delta_rule(q4[None], k4[None], v[None], g[None], beta[None], output_final_state=True, use_qk_l2norm_in_kernel=True),
      "qknorm8": lambda: qk_l2norm(q8, k8),
    }
    for name, fn in case.items():
        t = time_fn(fn, "graph", rep=20, warmup=3)
        kt = kernel_times(fn, calls=3)
        row = dict(T=T, case=name, graph_us=t.median_us,
                   kernels=[(r.kernel[:60], round(r.median_us, 1)) for r in kt.itertuples()])
        print(json.dumps(row), flush=True); out.append(row)
from kernels.spec import make_decode_inputs
from kernels.decode import gdn_decode
from kernels.model.fla_compat import fused_recurrent_gated_delta_rule
for B in (1, 16, 64, 256):
    inp = make_decode_inputs(B, seed=0, device="cuda")
    q4, k4, v = inp["q"], inp["k"], inp["v"]
    g = (-torch.exp(inp["A_log"]) * F.softplus(inp["a"].float() + inp["dt_bias"])).contiguous()
    beta = torch.sigmoid(inp["b"].float()).to(torch.bfloat16).contiguous()
    q8 = q4.repeat_interleave(2, dim=2).contiguous(); k8 = k4.repeat_interleave(2, dim=2).contiguous()
    h0 = inp["state"].transpose(-1, -2)
    case = {
      "contest": lambda: gdn_decode(**inp),
      "dropin_rep8_norm": lambda: fused_recurrent_gated_delta_rule(q8, k8, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True),
      "dropin_rep8_nonorm": lambda: fused_recurrent_gated_delta_rule(q8, k8, v, g, beta, initial_state=h0, output_final_state=True),
      "dropin_gva4_nonorm": lambda: fused_recurrent_gated_delta_rule(q4, k4, v, g, beta, initial_state=h0, output_final_state=True),
      "dropin_gva4_nonorm_f32beta": lambda: fused_recurrent_gated_delta_rule(q4, k4, v, g, beta.float(), initial_state=h0, output_final_state=True),
    }
    for name, fn in case.items():
        t = time_fn(fn, "graph", rep=20, warmup=3)
        kt = kernel_times(fn, calls=3)
        row = dict(B=B, case=name, graph_us=t.median_us,
                   kernels=[(r.kernel[:60], round(r.median_us, 2)) for r in kt.itertuples()])
        print(json.dumps(row), flush=True); out.append(row)
import os
json.dump(out, open(os.environ.get("OUT", ".") + "/probe_dropin.json", "w"), indent=1)
