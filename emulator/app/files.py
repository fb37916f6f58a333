"""Result files written atomically: a reader sees the old file or the new one, never half."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path


def _umask() -> int:
    """The process's umask, read without changing it where the kernel tells it (Linux
    4.7+: /proc/self/status); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over ``path``.
    The file gets the mode an ordinary write would (0666 less the umask), not mkstemp's
    0600."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~_umask())
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, doc: dict, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(doc, indent=indent))


def save_atomic(path: str | Path, write) -> str:
    """``write(temporary path)`` (a figure's ``savefig``), then rename it over ``path``: a
    failed write leaves the previous file intact. The temporary file keeps the suffix,
    which decides the image format."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=target.suffix or ".tmp",
                               dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(target)


class OutputError(OSError):
    """An output location that cannot take the results; the message names the option."""


def check_output_dir(directory: str | Path, option: str, need_bytes: int,
                     shown: str | Path | None = None) -> None:
    """Before a run: ``directory`` exists (created if missing) and takes a file, with at least
    ``need_bytes`` free, so finished results are not lost to a full or read-only disk."""
    d = Path(directory)
    shown = str(directory if shown is None else shown)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".t3emu-probe.", dir=d)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"invalid value for {option}: {shown!r} (cannot write in "
                          f"{str(d)!r}: {exc.strerror or exc})") from None
    free = shutil.disk_usage(d).free
    if free < need_bytes:
        raise OutputError(f"invalid value for {option}: {shown!r} (only "
                          f"{free / 2**20:.1f} MiB free on its file system; the results need "
                          f"about {need_bytes / 2**20:.0f} MiB)")


def check_output_file(path: str | Path, option: str, need_bytes: int) -> None:
    """``path`` can be written atomically: not a directory, its directory writable with room."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"invalid value for {option}: {str(path)!r} (a directory; give a "
                          f"file path)")
    check_output_dir(p.parent, option, need_bytes, shown=path)
