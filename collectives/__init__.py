"""Collective algorithms, each a function that builds an address-space map (fused
forms) or a list of CU steps (kernels of their own). They never call raw MPI."""

from collectives.ring import (
    ChunkSlots,
    RingContext,
    ag_steps,
    ring_chunks,
    sequential_rs_steps,
    t3_rs_map,
)

COLLECTIVES = ("rs", "ar")
MODES = ("sequential", "t3")
TOPOLOGY_ALGORITHMS = {"ring": ("ring",)}

__all__ = ["COLLECTIVES", "MODES", "TOPOLOGY_ALGORITHMS", "ChunkSlots", "RingContext",
           "ag_steps", "ring_chunks", "sequential_rs_steps", "t3_rs_map"]
