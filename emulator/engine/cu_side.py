"""A concurrent CU kernel beside the producer: when its thread blocks hold CUs, and what
they take from the producer's stages (``launch.py`` asks per stage; ``executors.py``
reports each of its transfers).

**CU dispatch** (``devices.commands.DISPATCH``; the C3 study's remedies, Agrawal et al.,
arXiv:2412.14335). The CU kernel's blocks hold whole CUs, ``share`` of them (one block per
channel, each on a CU of its own; ASSUMPTION: a block of a collective beside a GEMM block
that fills the CU's LDS and registers cannot share its CU, so the CU's issue slots and
load/store pipeline are the collective's while it holds it). When it holds them:

- ``partitioned`` (CU masking): from the start to the end of the producer's run, whether
  or not the CU kernel still moves data;
- ``prioritised`` (launched first, or a higher-priority stream: its blocks are dispatched
  ahead of the producer's pending ones, and no running block is preempted): from the
  start until its last transfer ends; the producer's later stages have every CU back;
- ``plain`` (launched beside a running producer at the same priority): the block
  scheduler dispatches the producer's running launch whole first, so the CU kernel's
  blocks start when that launch's last wave starts (``program.plain_wave``: its
  transfers are placed after that stage in program order, and wait for its start); then
  as ``prioritised``.

A producer stage that starts while the CU kernel holds its CUs runs on the rest
(``share``): its compute takes 1 / (1 - share) as long (``stage_cost``); a stage that
starts after the CU kernel's last transfer ended (all of them timed, in program order)
runs on every CU. The CUs a configuration keeps from the producer anyway (``margin``:
TransformerEngine's ``set_sm_margin``) stay kept.

**The L2's bandwidth**: the CU kernel's loads and stores go through the L2 as the
producer's panel loads do (its blocks run on the same dies), so while it moves data the
producer's K loop has the L2's bandwidth less the CU kernel's rate: every byte it sends is
loaded through the L2 and stored through it (``l2_rate``: 2 x its bytes over the stage's
window; ``emulator/model/gemm.py`` bounds a K step by the L2's bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from emulator.model.dram import bytes_within


@dataclass
class CuSide:
    dispatch: str = "partitioned"
    share: float = 0.0  # of the CUs its blocks hold
    margin: float = 0.0  # of the CUs the producer leaves anyway (its own launch's choice)
    left: int = 0  # its transfers not yet timed (program order)
    first: float = math.inf  # when its first transfer could start
    last: float = 0.0  # when its last timed transfer ended
    moves: list = field(default_factory=list)  # (start, end, bytes) of its transfers

    def ran(self, start: float, end: float, nbytes: float) -> None:
        """One of its transfers was timed: it could start at ``start`` and ended at
        ``end``, moving ``nbytes``."""
        self.left -= 1
        self.first = min(self.first, start)
        self.last = max(self.last, end)
        self.moves.append((start, end, nbytes))

    def holds(self, t: float) -> bool:
        """Whether its blocks hold their CUs at ``t`` (module docstring)."""
        if not self.share:
            return False
        if self.dispatch == "partitioned":
            return True
        done = self.left <= 0 and t >= self.last
        if self.dispatch == "plain":
            return self.first <= t and not done
        return not done

    def share_at(self, t: float) -> float:
        """The share of the CUs a producer stage starting at ``t`` runs without."""
        return max(self.margin, self.share if self.holds(t) else 0.0)

    def l2_rate(self, t0: float, t1: float) -> float:
        """Bytes/s its loads and stores take from the L2 between ``t0`` and ``t1``: each
        transfer's bytes loaded and stored, spread evenly over it."""
        if t1 <= t0 or not self.moves:
            return 0.0
        return 2.0 * bytes_within(self.moves, t0, t1) / (t1 - t0)
