"""The registry as the application sees it: this package's entries plus the user's
configuration files (``--configs``: paths, or names of the shipped examples)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from emulator.engine.registry import REGISTRY, Registry


def registry(configs: Iterable[str] = ()) -> Registry:
    import collectives.registry  # noqa: F401 - registers T3's operations and configurations

    from emulator.app.packaged import configs_path

    for path in configs:
        REGISTRY.load(configs_path(path))
    return REGISTRY


@contextlib.contextmanager
def plugins_forgotten():
    """Within the block, configuration files may be loaded; after it the registry holds
    what it held before (a process that runs one ``t3emu run`` after another, as a pooled
    job's rank, behaves as a process per run)."""
    snap = registry().snapshot()
    try:
        yield
    finally:
        REGISTRY.restore(snap)
