"""What the fused computation-collective operators share (Punniyamurthy et al., SC 2024): the
persistent grid's size and the round-robin task order of its physical WGs."""

from __future__ import annotations

import numpy as np

from collectives.common import Problem
from emulator.engine.registry import Param
from emulator.model import params

# The design: the ROC_SHMEM context costs registers, so the fused embedding kernel reaches
# lower occupancy than the plain kernel (``shmem_occupancy_loss``, measured on its
# embedding kernel only); applied in whole WGs per CU (a register budget admits whole WGs):
# 8 resident per CU on MI210 -> 7. The fused GEMV and GEMM kernels lose
# ``shmem_occupancy_loss_unmeasured`` (an assumption: emulator/model/params.py).
OCCUPANCY = Param(1.0, "fraction of the most persistent WGs the fused kernel can have "
                  "resident (the fused-operator study's occupancy knob)", 0.01, 1.0,
                  source="paper: the fused operators' study, occupancy knob: the most "
                         "resident by default")


def grid(p: Problem, per_cu: int | None = None, shmem_loss: bool = False) -> int:
    """Physical WGs of a fused persistent kernel: the occupancy knob x the most it can have
    resident (the device's light-kernel limit, or ``per_cu`` WGs per CU); ``shmem_loss``:
    less the communication context's measured loss in whole WGs per CU (the embedding
    kernel, where the design measured it; elsewhere the unmeasured loss)."""
    per = per_cu or (p.spec.max_wgs_per_cu or p.spec.wgs_per_cu)
    loss = params.value("shmem_occupancy_loss" if shmem_loss
                        else "shmem_occupancy_loss_unmeasured")
    if loss:
        per = max(1, int(per * (1.0 - loss) + 1e-9))
    most = p.spec.cus * per
    return max(1, round(p.param("occupancy", OCCUPANCY.default) * most))


def rounds(lists: list[list[int]]) -> list[int]:
    """The flat task order of a persistent grid whose WG i runs ``lists[i]`` in order (task
    j x P + i is WG i's j-th; the engine runs task t on WG t mod P): WGs with fewer tasks
    must be the last ones."""
    P = len(lists)
    counts = [len(x) for x in lists]
    if any(a < b for a, b in zip(counts, counts[1:])):
        raise ValueError("the WGs with fewer tasks must come last")
    out = []
    for j in range(max(counts, default=0)):
        out += [lists[i][j] for i in range(P) if j < counts[i]]
    return out


def staggered(p: Problem, owner: np.ndarray) -> np.ndarray:
    """Sort key of items bound for ``owner`` ranks: peers first (rank + 1, rank + 2, ...),
    this rank's own last (the communication-aware order)."""
    return (np.asarray(owner) - p.rank - 1) % p.world


def remote_first(p: Problem, owner: np.ndarray, within: np.ndarray) -> np.ndarray:
    """The communication-aware task order: items bound for peers first, interleaved over
    the peers (position ``within`` their owner's part, then peers in staggered order), so
    every round's stores spread over every link; this rank's own items last."""
    owner = np.asarray(owner)
    return np.lexsort((staggered(p, owner), np.asarray(within), owner == p.rank))
