"""numba's on-disk cache of the emulator's loop kernels, built once per install.

The GEMV and embedding-bag kernels (``devices.loop_kernels``, ``cache=True``: the only
numba code; a GEMM's or a copy's runs import no numba) compile in a few seconds of CPU
the first time and load from numba's cache (``NUMBA_CACHE_DIR``, by default
``~/.cache/t3emu/numba``) in well under a second after that. ``run/_setup.sh`` builds the
cache when it installs (``python -m emulator.runtime.numba_cache``, one line saying so);
an install made otherwise (``pip install .``) builds it on its first numeric run, whose
first rank says so before it compiles. A marker file, named by a hash of the kernels'
source, its place (numba keeps a cache per source file's path) and the numba and Python
versions, records that the cache holds the kernels of
this install (numba itself recompiles a kernel whose source changed).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

MESSAGE = ("t3emu: compiling the numba kernels once for this install (a few seconds; "
           "later runs load them from {dir})")


def _marker() -> Path:
    from emulator.runtime.process import pin_threads

    cache = Path(pin_threads(dict(os.environ))["NUMBA_CACHE_DIR"])
    src = Path(__file__).resolve().parents[2] / "devices" / "loop_kernels.py"
    from importlib.metadata import version

    h = hashlib.sha256(src.read_bytes())  # numba's cache is per source file and place
    h.update(f"{src} {version('numba')} {sys.version}".encode())
    return cache / f".t3emu-kernels-{h.hexdigest()[:16]}"


def built() -> bool:
    """Whether the cache holds this install's kernels."""
    return _marker().exists()


def build(say=None) -> float:
    """Compile (or load) every kernel into the cache and mark it; the seconds it took.
    ``say``: called with a line before a compile that the marker says is needed."""
    marker = _marker()
    t0 = time.monotonic()
    if say is not None and not marker.exists():
        say(MESSAGE.format(dir=marker.parent))
    from devices import loop_kernels

    loop_kernels.warm_up()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return time.monotonic() - t0


def main() -> int:
    from emulator.runtime.process import pin_threads

    pin_threads()  # NUMBA_CACHE_DIR before numba is imported
    if built():
        return 0
    took = build(lambda line: print(line, file=sys.stderr, flush=True))
    print(f"t3emu: numba kernels compiled in {took:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
