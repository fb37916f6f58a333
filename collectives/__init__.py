"""Collective algorithms, each a function that builds an address-space map (fused
forms) or a list of CU steps (kernels of their own). They never call raw MPI.

This package file only names what exists, so the CLI can validate options
without importing MPI; the algorithms live in the submodules (``ring``).
"""

COLLECTIVES = ("rs", "ar")
MODES = ("sequential", "t3")
TOPOLOGY_ALGORITHMS = {"ring": ("ring",)}
