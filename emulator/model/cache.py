"""The cache a running kernel shares with communication traffic (the model's L2: the
device's last level in front of the HBM).

Where communication's HBM traffic passes through that cache (``[memory]
comm_through_l2``: a memory-side cache, which every request to DRAM crosses: MI300X's
Infinity Cache, NVIDIA's L2 slices in front of their memory controllers), the copy
engines' reads, the peers' writes landing and a CU collective's traffic allocate lines
there as the kernel's own misses do, and evict what they displace.

The share a stream keeps: a cache whose replacement does not track reuse (the panel model
of ``cost.py`` already takes the L2 as keeping a share of a working set proportional to
its capacity, not strict LRU) evicts a line chosen regardless of its owner at every
allocation, so every line lives, on average, the same number of allocations, and each
stream holds the cache in proportion to its allocation rate (Little's law: occupancy =
allocations per second x lifetime). A kernel allocating g bytes/s (its DRAM reads, and its
writes where its outputs are cached) beside communication allocating c bytes/s keeps

    share = g / (g + c)

of the capacity (``share``). Its misses g depend on the capacity it keeps (fewer panels
held: more re-reads), so the share is the fixed point of ``share(g(share))``, reached by
``ITERATIONS`` substitutions from the kernel alone (``settle``): the miss rate rises as
the share falls and the share rises with the miss rate, so the iterates close in from one
side (deterministic: the same count every time). A kernel alone, or communication that
bypasses the cache, keeps it all (share 1).

The share scales the capacity the panel model gives the kernel's inputs within a stage
and what it leaves for the next stage (``CostModel.l2_share``), so DMA traffic that
passes while a stage runs evicts panels the stage (and the next one) would have re-used.
"""

from __future__ import annotations

from typing import Callable

# the fixed point's substitutions (tests/test_cache.py: 0.25 -> 0.2895 -> 0.2865)
ITERATIONS = 3  # not a parameter: a numerical method's step count


def share(kernel_rate: float, comm_rate: float) -> float:
    """The share of the cache a kernel allocating ``kernel_rate`` bytes/s keeps beside
    communication allocating ``comm_rate`` bytes/s (module docstring)."""
    if comm_rate <= 0.0:
        return 1.0
    if kernel_rate <= 0.0:
        return 0.0
    return kernel_rate / (kernel_rate + comm_rate)


def settle(kernel_rate_at: Callable[[float], float], comm_rate: float) -> float:
    """The kernel's share: ``kernel_rate_at(share)`` is its allocation rate when it keeps
    ``share`` of the cache; ``ITERATIONS`` substitutions from the whole cache."""
    s = 1.0
    if comm_rate <= 0.0:
        return s
    for _ in range(ITERATIONS):
        s = share(kernel_rate_at(s), comm_rate)
    return s
