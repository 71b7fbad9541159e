"""GDN (Gated DeltaNet) kernels and the instruments that measure them.

Importing this package touches neither torch nor triton; import the
submodules (``kernels.spec``, ``kernels.reference``, ``kernels.decode``,
``kernels.prefill``, ``kernels.peers``, ``kernels.bench``) for the work.
"""
__version__ = "0.1.0"
