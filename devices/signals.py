"""Signals: handles on what a tracker counts (pure data, no MPI).

A ``TrackedRegion`` is a handle returned when a map or a plan asks the tracker
to watch something: tiles of a buffer (counting element-updates, local and
remote), flags (counting arrivals), or finished work items. Anything that must
wait (a WG, a kernel launch, an executor's queue entry) holds the handle
itself; identity is the object, never a rebuilt name (``eq=False``: two
handles are the same signal only if they are the same object). ``name`` and
``label`` are for people (watchdog dumps, traces).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class TrackedRegion:
    """A region the tracker watches: its slots and the count each must reach."""

    name: str
    slots: np.ndarray  # int64 slot ids
    thresholds: np.ndarray  # int64 element-updates (or arrivals) each slot must reach
    label: str = ""
    meta: dict = field(default_factory=dict)


Signal = TrackedRegion  # the engine's word for a handle one can wait on
