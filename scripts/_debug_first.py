import sys, torch
from kernels.prefill import gdn_prefill, PrefillConfig
from kernels.prefill.intra_chunk import intra_chunk_fwd
from kernels.prefill.state_walk import state_walk_fwd
from kernels.spec import PREFILL_SHAPES, make_prefill_inputs
case, shape = sys.argv[1], sys.argv[2]
x = make_prefill_inputs(PREFILL_SHAPES[shape], device="cuda")
T = x["q"].shape[0]; N = x["cu_seqlens"].numel() - 1
o = torch.empty(T, 8, 128, dtype=torch.bfloat16, device="cuda")
ht = torch.empty(N, 8, 128, 128, dtype=torch.float32, device="cuda")
kw = dict(a=x["a"], b=x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"], scale=0.088,
          storage="compact", num_warps=4, col_blocks=2)
if case == "nofirst":
    gdn_prefill(**x, variant="fused", config=PrefillConfig(first_chunk_inline=False))
elif case == "first":
    gdn_prefill(**x, variant="fused")
elif case == "intra_first":
    intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], first_step=dict(initial_state=x["state"], final_state=ht, output=o), **kw)
elif case.startswith("intra_first_bv"):
    intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], first_step=dict(initial_state=x["state"], final_state=ht, output=o, BV=int(case[14:])), **kw)
elif case == "intra_first_w8":
    kw["num_warps"] = 8
    intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], first_step=dict(initial_state=x["state"], final_state=ht, output=o), **kw)
elif case == "intra_first_nostate":
    intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], first_step=dict(initial_state=None, final_state=ht, output=o), **kw)
elif case == "walk_from_first":
    w, u, gc, P, ob = intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], **kw)
    torch.cuda.synchronize()
    state_walk_fwd(x["k"], w, u, gc, x["cu_seqlens"], p=P, ob=ob, initial_state=x["state"], output=o, final_state=ht, BV=16, from_first=True)
torch.cuda.synchronize()
print(case, shape, "OK")
