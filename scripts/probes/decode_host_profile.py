"""cProfile of eager gdn_decode calls (B=64, direct launches): where the ~80 us of host time
per call goes on the GPU host.
Run (GPU host): PYTHONPATH=$PWD python3 scripts/probes/decode_host_profile.py
(dev_checks/decode_host_profile_<sha>.txt; docs/notes.md, "Decode's host path").
"""
import cProfile
import io
import os
import pstats
import time

import torch

from kernels.decode import gdn_decode
from kernels.spec import make_decode_inputs

x = make_decode_inputs(64, device="cuda")
for _ in range(50):
    gdn_decode(**x)
torch.cuda.synchronize()
n = 2000
t0 = time.perf_counter()
for _ in range(n):
    gdn_decode(**x)
torch.cuda.synchronize()
wall = (time.perf_counter() - t0) / n * 1e6
prof = cProfile.Profile()
prof.enable()
for _ in range(n):
    gdn_decode(**x)
prof.disable()
torch.cuda.synchronize()
s = io.StringIO()
st = pstats.Stats(prof, stream=s).sort_stats("tottime")
st.print_stats(25)
text = f"{n} calls, {wall:.1f} us per call without the profiler (B=64)\n" + s.getvalue()
print(text)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "decode_host_profile.txt"), "w") as f:
    f.write(text)
