"""The contest bridge: our kernels as flashinfer-bench solutions, evaluated by
flashinfer-bench itself.

- :mod:`.bundle`       package modules -> self-contained source (import rewriting,
                       the torch/triton-only import check)
- :mod:`.definitions`  flashinfer-bench definitions and workloads from :mod:`kernels.spec`
- :mod:`.solution`     our solutions (and the FlashInfer baseline's) in its format
- :mod:`.evaluate`     its benchmark on them (GPU), traces and the comparison table
- :mod:`.loader`       any solution (JSON, starter-kit folder, ``module:function``) as an
                       implementation in our calling convention: :func:`load_solution`
- :mod:`.remote`       third-party solutions in worker processes of their own (notebooks)

Command line (``python -m kernels.contest``)::

    pack --op decode|prefill [--variant fused|graph] --out DIR   # DIR/<name>.json
    evaluate [--ops decode,prefill] [--out results/<gpu>/contest]  # GPU + flashinfer-bench

Importing this package imports neither torch nor flashinfer-bench.
"""


def __getattr__(name):
    """``kernels.contest.load_solution`` (imported on first use: the loader needs torch)."""
    if name == "load_solution":
        from .loader import load_solution

        return load_solution
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
