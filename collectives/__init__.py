"""Collective algorithms and the configurations built from them, each a function that
builds address-space maps (fused forms) or a list of CU steps (kernels of their own);
they never call raw MPI (``reference`` is the independent check, not an algorithm).

``registry`` registers the operations and configurations (importing it fills
``emulator.engine.registry.REGISTRY``); ``ring``, ``direct`` and ``consumer`` are
the algorithms; ``operations`` composes them per operation; ``t3`` and
``baselines`` are the configurations. Importing this package needs no MPI.
"""

TOPOLOGIES = ("ring", "full-mesh", "switch", "pcie")
# algorithms each topology can run, the default first (direct needs a link, or a switch
# port, to every peer)
TOPOLOGY_ALGORITHMS = {"ring": ("ring",), "full-mesh": ("direct", "ring"),
                       "switch": ("direct", "ring"), "pcie": ("ring", "direct")}
ALGORITHMS = ("ring", "direct")


def default_algorithm(algorithms: tuple[str, ...], topology: str) -> str:
    """The topology's preferred algorithm among those an operation has."""
    for algo in TOPOLOGY_ALGORITHMS[topology]:
        if algo in algorithms:
            return algo
    return algorithms[0]


def default_topology(algorithms: tuple[str, ...]) -> str:
    """The topology a run takes when none is given: the first (ring, full-mesh, switch,
    pcie) on which one of the operation's algorithms runs (a ring for what a ring runs,
    a full mesh for direct-only operations such as the all-to-alls)."""
    return next(t for t in TOPOLOGIES if any(a in TOPOLOGY_ALGORITHMS[t] for a in algorithms))


def supported(algorithms: tuple[str, ...], algorithm: str, topology: str) -> bool:
    return algorithm in algorithms and algorithm in TOPOLOGY_ALGORITHMS[topology]
