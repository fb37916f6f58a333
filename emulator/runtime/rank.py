"""The rank's runtime object: the only mutable state this process keeps between calls.

One emulated GPU per process, so one ``RankRuntime`` per process (``RANK``): its
status board, when it began its first producer stage, the fault hooks it fired,
whether it serves a pooled job, and scratch buffers kept from one run to the next. Everything else is passed as
arguments; nothing else at module level changes after import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RankRuntime:
    board: Any = None  # the watchdog's StatusBoard while a job runs
    first_stage_unix: float | None = None  # when this process began its first producer stage
    faults_fired: list[str] = field(default_factory=list)
    pooled: bool = False  # a rank of a pooled job (``app.pool_rank``): runs one after another
    _workspace: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def workspace(self, shape: tuple[int, int]) -> np.ndarray:
        """An fp32 output-shaped canvas producers compute into, kept for the next run."""
        if shape not in self._workspace:
            self._workspace.clear()
            self._workspace[shape] = np.empty(shape, np.float32)
        return self._workspace[shape]


RANK = RankRuntime()
