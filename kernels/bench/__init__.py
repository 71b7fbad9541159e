"""The instruments: what measures the kernels (import the submodules).

- :mod:`.gate`        ``gate_call`` (one call against the reference), the row statuses
  ``PASS`` / ``FAIL`` / ``ERROR`` / ``UNAVAILABLE``, ``short_reason``
- :mod:`.timing`      ``time_fn`` with ``cupti_cold`` / ``graph`` / ``event``; ``time_each``
  (a row per method), ``method_available``
- :mod:`.timeline`    ``record_timeline``, ``Timeline``, ``plot_gantt``
- :mod:`.ncu`         ``run_ncu``, ``parse_ncu_csv``, ``ncu_available``
  (:mod:`kernels.ncu_target` is the process ncu profiles)
- :mod:`.roofline`    ``copy_bandwidth``, ``tensor_rate``, ``decode_bytes``, ``prefill_bytes``,
  ``prefill_kernel_model``, ``floor_us``
- :mod:`.anatomy`     ``kernel_times``, ``kernel_roles`` (per-kernel times of a prefill call)
- :mod:`.sm90`        ``record_launches``, ``compile_resources`` (registers / shared memory)
- :mod:`.provenance`  ``collect_provenance``
- :mod:`.results`     ``ResultWriter``, ``load_results``
- :mod:`.chrome_trace` torch.profiler Chrome-trace reading shared by timing and timeline
- :mod:`.record_fixtures` records the GPU fixtures of the tests (run once on a GPU)

Importing this package imports nothing heavy.
"""
