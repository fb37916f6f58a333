"""The registry's operations as the tests enumerate them (their older short names)."""

from collectives import TOPOLOGIES, supported as _supported  # noqa: F401 - re-exported
from emulator.app.catalog import registry

REG = registry()
COLLECTIVES = tuple(a for op in REG.operations.values() for a in op.aliases)
COLLECTIVE_ALGORITHMS = {c: REG.operation(c).algorithms for c in COLLECTIVES}


def splits(collective: str) -> bool:
    """Whether the operation's producer splits K over several WGs (--split-k > 1)."""
    return REG.operation(collective).split_k


def modes_for(collective: str, algorithm: str | None = None) -> tuple[str, ...]:
    return REG.configurations_for(REG.operation(collective), algorithm)


def supported(collective: str, algorithm: str, topology: str) -> bool:
    return _supported(REG.operation(collective).algorithms, algorithm, topology)
