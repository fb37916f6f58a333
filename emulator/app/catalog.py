"""The registry as the application sees it: this package's entries plus the user's
configuration files (``--configs``)."""

from __future__ import annotations

from collections.abc import Iterable

from emulator.engine.registry import REGISTRY, Registry


def registry(configs: Iterable[str] = ()) -> Registry:
    import collectives.registry  # noqa: F401 - registers T3's operations and configurations

    for path in configs:
        REGISTRY.load(path)
    return REGISTRY
