"""The files shipped with the tool besides code: the paper scenarios (``run/*.toml``) and
the example configuration files (``run/configs/*.py``).

In a source checkout (and an editable install) they are the repository's ``run/``
directory; a built wheel carries the same files as package data of
``emulator.scenarios`` (``pyproject.toml`` maps that package onto ``run/``), so an
installed tool finds them from any directory.
"""

from __future__ import annotations

from pathlib import Path

_INSTALLED = Path(__file__).resolve().parents[1] / "scenarios"  # the wheel's copy of run/
_CHECKOUT = Path(__file__).resolve().parents[2] / "run"


def scenario_dir() -> Path:
    """The directory of the shipped scenarios."""
    return _INSTALLED if any(_INSTALLED.glob("*.toml")) else _CHECKOUT


def example_configs() -> dict[str, Path]:
    """name -> path of each shipped configuration file (``--configs NAME``)."""
    return {p.stem: p for p in sorted((scenario_dir() / "configs").glob("*.py"))
            if not p.name.startswith("_")}


def configs_path(name_or_path: str) -> str:
    """``--configs`` as a path: a file that exists or a ``.py`` path as given (a missing one
    is refused by the registry, naming it), else a shipped example of that name."""
    p = Path(name_or_path)
    if p.suffix == ".py" or p.exists():
        return name_or_path
    return str(example_configs().get(name_or_path, p))
