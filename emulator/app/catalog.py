"""The registry as the application sees it: this package's entries plus the user's
configuration files (``--configs``: paths, or names of the shipped examples)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from emulator.engine.registry import REGISTRY, Registry


def registry(configs: Iterable[str] = ()) -> Registry:
    import collectives.registry  # noqa: F401 - registers T3's operations and configurations

    from emulator.app.packaged import configs_path

    for path in configs:
        path = configs_path(path)
        if str(Path(path).resolve()) in REGISTRY.plugins:  # loaded: a run's every call after
            continue  # the first (no check, no timer thread)
        if _check_alone(path):
            REGISTRY.load(path)
        else:  # a rank of an MPI job: the same limit, on a timer
            with _time_limit(path):
                REGISTRY.load(path)
    return REGISTRY


PLUGIN_LOAD_S = 30.0  # default of T3EMU_PLUGIN_LOAD_S: loading a file takes well under 1 s
_LOADED_TOKEN = "t3emu: configuration file loaded"
_checked: set[tuple] = set()  # (path, mtime, size) of files loaded alone in this process


def _check_alone(path: str) -> bool:
    """Whether this process may load the file now (False in a rank of an MPI job, which
    loads it under a time limit instead). Before a file runs in this process, it is loaded
    alone in a child Python with a time limit: a file that ends its process at import
    (``os._exit``, a signal) or never finishes loading is refused with one line, not a
    command that exits 0 having done nothing, or hangs. Each version of a file is checked
    once per process."""
    import os
    import subprocess
    import sys

    from emulator.app.launcher import under_mpi
    from emulator.engine.registry import RegistryError

    p = Path(path).resolve()
    if under_mpi():
        return False
    if not p.is_file():  # a missing file: the registry says so
        return True
    st = p.stat()
    key = (str(p), st.st_mtime_ns, st.st_size)
    if key in _checked:
        return True
    limit_s = load_limit_s()
    root = str(Path(__file__).resolve().parents[2])  # this tree's packages, as the ranks
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    code = ("import sys\n"
            "from emulator.engine.registry import RegistryError\n"
            "from emulator.app.catalog import registry\n"
            "try:\n"
            "    registry().load(sys.argv[1])\n"
            "except RegistryError:\n"
            "    pass  # the load in the command itself says why\n"
            f"print({_LOADED_TOKEN!r}, flush=True)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(p)], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=limit_s, errors="replace")
    except subprocess.TimeoutExpired:
        raise RegistryError(f"configuration file {path!r} did not finish loading within "
                            f"{limit_s:g} s (a loop or a wait at import?); "
                            f"T3EMU_PLUGIN_LOAD_S sets the limit") from None
    if _LOADED_TOKEN not in done.stdout:
        how = (f"was killed by signal {-done.returncode}" if done.returncode < 0 else
               f"ended its process with exit code {done.returncode}")
        last = done.stderr.strip().splitlines()[-1:] or [""]
        raise RegistryError(f"configuration file {path!r} {how} while loading (os._exit, "
                            f"a crash?); a configuration file only registers entries"
                            + (f"; its last line: {last[0][:200]}" if last[0] else ""))
    _checked.add(key)
    return True


def load_limit_s() -> float:
    """``T3EMU_PLUGIN_LOAD_S`` (default ``PLUGIN_LOAD_S``): the seconds a configuration
    file may take to load."""
    import os

    from emulator.engine.registry import RegistryError

    raw = os.environ.get("T3EMU_PLUGIN_LOAD_S", "")
    try:
        limit_s = float(raw) if raw else PLUGIN_LOAD_S
    except ValueError:
        limit_s = -1.0
    if not 0 < limit_s <= 86400:
        raise RegistryError(f"T3EMU_PLUGIN_LOAD_S={raw!r} is not a number of seconds "
                            f"(more than 0, at most 86400)")
    return limit_s


@contextlib.contextmanager
def _time_limit(path: str):
    """In a rank: a file still loading after the limit ends this rank with a message (the
    launcher then stops the job: a rank that exits without its marker), never a job
    whose other ranks wait for it forever."""
    import os
    import sys
    import threading


    limit_s = load_limit_s()

    def expire() -> None:
        sys.stderr.write(f"t3emu: error: configuration file {path!r} did not finish loading "
                         f"within {limit_s:g} s on this rank (a loop or a wait at import?); "
                         f"T3EMU_PLUGIN_LOAD_S sets the limit\n")
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


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
