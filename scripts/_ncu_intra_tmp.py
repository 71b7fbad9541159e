import torch
from kernels.prefill.intra_chunk import intra_chunk_fwd
from kernels.spec import PREFILL_SHAPES, make_prefill_inputs
import sys
x = make_prefill_inputs(PREFILL_SHAPES[sys.argv[1]], device="cuda")
for _ in range(3):
    intra_chunk_fwd(x["k"], x["v"], x["cu_seqlens"], a=x["a"], b=x["b"], A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"], scale=0.088, storage="compact", num_warps=4, col_blocks=2)
torch.cuda.synchronize()
