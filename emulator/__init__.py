"""The emulator's machinery, by layer (each a subpackage; arrows point down only):

- ``app``: command line, configuration, launcher, worker, sweeps, reports, bench;
- ``engine``: the one mechanism configurations are written against (producers,
  maps and signals, executors, kernels, plans) and the per-rank runner;
- ``model``: modelled time (timelines, cost formulas, arbitration);
- ``runtime``: the rank's process services (abort, watchdog, faults, MPI helpers).

``engine`` and ``model`` never import ``collectives`` or ``app``
(``tests/test_layers.py`` walks the imports).
"""
