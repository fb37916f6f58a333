"""Collective algorithms, each a function that builds address-space maps (fused forms)
or a list of CU steps (kernels of their own). They never call raw MPI.

This package file only names what exists, so the CLI can validate options
without importing MPI; the algorithms live in the submodules (``ring``,
``direct``, ``consumer``) and ``plans`` composes them into configurations.
"""

COLLECTIVES = ("rs", "ag", "ar", "a2a", "ag-gemm")
COLLECTIVE_HELP = {
    "rs": "reduce-scatter of the GEMM's partial output",
    "ag": "all-gather of each rank's GEMM output rows",
    "ar": "all-reduce = RS + AG (T3's tensor-parallel case)",
    "a2a": "all-to-all of the GEMM's output row chunks",
    "ag-gemm": "all-gather of the input rows feeding a GEMM (consumer-side fusion)",
}
ALGORITHMS = ("ring", "direct")
TOPOLOGIES = ("ring", "full-mesh", "switch")
# algorithms each topology can run, the default first (direct needs a link, or a switch
# port, to every peer)
TOPOLOGY_ALGORITHMS = {"ring": ("ring",), "full-mesh": ("direct", "ring"),
                       "switch": ("direct", "ring")}
COLLECTIVE_ALGORITHMS = {"rs": ("ring", "direct"), "ag": ("ring", "direct"),
                         "ar": ("ring", "direct"), "a2a": ("direct",),
                         "ag-gemm": ("ring", "direct")}
MODES = ("sequential", "t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc")
REDUCING = ("rs", "ar")  # collectives with a reduction: Ideal-RS+NMC applies


def modes_for(collective: str) -> tuple[str, ...]:
    """The configurations that exist for a collective (NMC only matters for reductions)."""
    return MODES if collective in REDUCING else MODES[:-1]


def default_algorithm(collective: str, topology: str) -> str:
    for algo in TOPOLOGY_ALGORITHMS[topology]:
        if algo in COLLECTIVE_ALGORITHMS[collective]:
            return algo
    return COLLECTIVE_ALGORITHMS[collective][0]


def supported(collective: str, algorithm: str, topology: str) -> bool:
    return (algorithm in COLLECTIVE_ALGORITHMS[collective]
            and algorithm in TOPOLOGY_ALGORITHMS[topology])
