"""Time a handful of prefill configs of the fused variant on the contest shapes (GPU).

    python scripts/prefill_config_probe.py
"""
from kernels.prefill import PrefillConfig
from kernels.prefill.selfcheck import run_checks

CONFIGS = [
    PrefillConfig(),
    PrefillConfig(storage="compact"),
    PrefillConfig(walk_BV=16, walk_warps=4),
    PrefillConfig(walk_BV=16, walk_warps=4, storage="compact"),
    PrefillConfig(walk_stages=3),
    PrefillConfig(intra_warps=4),
]
rows = run_checks(["T64", "57x64", "4x1024", "T8192"], ["fused"], configs=CONFIGS,
                  time_methods=("graph", "cupti_cold"))
for r in rows:
    print(r["shape"], r["config"], "ok" if r.get("ok") else f"FAIL {r.get('reason', '')[:80]}",
          "graph_us=%.1f" % r.get("graph_us", float("nan")),
          "cupti_us=%.1f" % r.get("cupti_cold_us", float("nan")),
          "rel_l2=%.1e" % r.get("rel_l2", float("nan")))
