"""The contest bridge: our kernels as flashinfer-bench solutions, evaluated by
flashinfer-bench itself.

- :mod:`.bundle`       package modules -> self-contained source (import rewriting,
                       the torch/triton-only import check)
- :mod:`.definitions`  flashinfer-bench definitions and workloads from :mod:`kernels.spec`
- :mod:`.solution`     our solutions (and the FlashInfer baseline's) in its format
- :mod:`.evaluate`     the contest's flashinfer-bench build on them, the baseline and
                       other solutions (GPU): contest scores, per-workload table, traces
- :mod:`.formats`      reading a solution JSON or starter-kit folder: ``read_solution``,
                       the one reader (also :mod:`.evaluate`'s)
- :mod:`.build`        one builder per language and binding (python/triton import, CUDA
                       through TVM-FFI or torch's ``cpp_extension``; others refused)
- :mod:`.scope`        the solution's modules and torch settings kept to it
- :mod:`.adapter`      the callable in our calling convention (arguments, destination
                       passing)
- :mod:`.loader`       any solution (JSON, starter-kit folder, one already read,
                       ``module:function``) through those: :func:`load_solution`
- :mod:`.remote`       third-party solutions in worker processes of their own (notebooks)

Command line (``python -m kernels.contest``)::

    pack --op decode|prefill [--variant fused|graph] --out DIR   # DIR/<name>.json
    evaluate [--ops decode,prefill] [--solutions a.json,dir/] [--root results]  # GPU

Importing this package imports neither torch nor flashinfer-bench.
"""


def __getattr__(name):
    """``kernels.contest.load_solution`` (imported on first use: the loader needs torch)."""
    if name == "load_solution":
        from .loader import load_solution

        return load_solution
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
