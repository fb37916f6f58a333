"""The registry as the application sees it: this package's entries plus the user's
configuration files (``--configs``: paths, or names of the shipped examples)."""

from __future__ import annotations

from collections.abc import Iterable

from emulator.engine.registry import REGISTRY, Registry


def registry(configs: Iterable[str] = ()) -> Registry:
    import collectives.registry  # noqa: F401 - registers T3's operations and configurations

    from emulator.app.packaged import configs_path

    for path in configs:
        REGISTRY.load(configs_path(path))
    return REGISTRY
