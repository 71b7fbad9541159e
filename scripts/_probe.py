import torch, triton, time, sys, importlib
print(sys.version); print(torch.__version__, triton.__version__, torch.version.cuda)
p = torch.cuda.get_device_properties(0); print(p.name, p.multi_processor_count, getattr(p, "L2_cache_size", None))
for m in ("papermill", "nvtx", "fla", "ipykernel", "nbconvert", "yaml"):
    try: mod = importlib.import_module(m); print(m, getattr(mod, "__version__", "?"))
    except Exception as e: print(m, "FAIL", e)
x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
for _ in range(20): y.copy_(x)
e.record(); torch.cuda.synchronize(); print("copy BW TB/s", 2 * x.numel() * 20 / (s.elapsed_time(e) * 1e-3) / 1e12)
from torch.profiler import profile, ProfilerActivity
a = torch.randn(1024, 1024, device="cuda")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    b = a @ a; c = b + 1; torch.cuda.synchronize()
evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
print("kineto gpu events", [(e.name[:30], ) for e in evs][:5])
prof.export_chrome_trace("/tmp/t.json"); import json; d = json.load(open("/tmp/t.json")); print(sorted({e.get("cat") for e in d["traceEvents"]} - {None}))
