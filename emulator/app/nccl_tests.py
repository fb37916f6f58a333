"""``t3emu nccl-tests``: the library collectives of a system over message sizes, printed
as nccl-tests prints them (size, count, type, time, algbw, busbw).

Each size is one timing-only run of the emulator (``api.run``) of the operation
whose collective is the one asked for, in the ``sequential`` configuration (the
producer, then the library's collective kernel); the row is that kernel's
modelled time, its launch included: the library's schedule on the modelled links and ports, with the
algorithm, protocol and channels its tuning model chose
(``emulator/model/library.py``), whose own prediction is printed beside it.
Sizes follow nccl-tests: the whole gathered, scattered or reduced buffer (``size``
bytes, ``count`` elements of ``type``); algbw = size / time, busbw = algbw x (n-1)/n
(all-reduce: x 2(n-1)/n).
"""

from __future__ import annotations

from collections.abc import Callable

COLLECTIVES = {  # name -> (operation, its collective's phase or span, cols are k)
    "all-gather": ("ag+gemm", "ag", True),
    "reduce-scatter": ("gemm+rs", "rs", False),
    "all-reduce": ("gemm+ar", "ar", False),
}
E = 2  # fp16 ("half"): bytes per element
MAX_COLS = 8192


def shape(size: int, ranks: int) -> tuple[int, int]:
    """(rows, cols) of a buffer of ``size`` bytes: rows a multiple of the ranks (every
    rank owns a chunk), at most ``MAX_COLS`` columns."""
    elems = size // E
    if elems < ranks or elems % ranks:
        raise ValueError(f"{size} B is not a whole number of {E}-byte elements per rank "
                         f"for {ranks} ranks")
    cols = min(elems // ranks, MAX_COLS)
    while elems % cols or (elems // cols) % ranks:
        cols -= 1
    return elems // cols, cols


def dims(size: int, ranks: int, collective: str) -> dict:
    """The run's M, N, K for a buffer of ``size`` bytes."""
    rows, cols = shape(size, ranks)
    return (dict(m=rows, n=128, k=cols) if COLLECTIVES[collective][2]
            else dict(m=rows, n=cols, k=16))


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def measure(system: str, collective: str, size: int, ranks: int, overrides=(),
            watchdog_s: float = 60.0) -> dict:
    """One row: the emulator's modelled time of the library collective of ``size`` bytes."""
    from emulator import api

    op, phase, _ = COLLECTIVES[collective]
    res = api.run(op, **dims(size, ranks, collective), system=system, ranks=ranks,
                  modes="sequential", timing_only=True, set=dict(overrides),
                  watchdog_s=watchdog_s)
    run = res["sequential"].raw
    bw = run["bandwidth"][phase]
    lib = next(iter(run["library"].values()))
    # the call as nccl-tests times it: its kernel's launch and its run (the library's base
    # latency includes the launch; the phase's window starts after it)
    t = bw["time_s"] + res.doc["device"]["launch_s"]
    alg = size / t
    factor = bw["busbw_gb_s"] / bw["algbw_gb_s"]
    return {"size": size, "count": size // E, "type": "half", "time_us": t * 1e6,
            "algbw": alg / 1e9, "busbw": alg * factor / 1e9,
            "algorithm": lib["algorithm"], "protocol": lib["protocol"],
            "channels": lib["channels"], "predicted_us": lib["predicted_us"],
            "library": lib["library"]}


def header(system: str, collective: str, ranks: int, library: str) -> list[str]:
    return [f"# {collective} on {system}, {ranks} GPUs: {library} (emulated; modelled time)",
            f"# {'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>7} "
            f"{'busbw':>7}  {'algo/proto':<13} {'ch':>3} {'model':>10}",
            f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>7} "
            f"{'(GB/s)':>7}  {'':<13} {'':>3} {'(us)':>10}"]


def row(r: dict) -> str:
    return (f"  {r['size']:>12} {r['count']:>12} {r['type']:>6} {r['time_us']:>10.1f} "
            f"{r['algbw']:>7.2f} {r['busbw']:>7.2f}  "
            f"{r['algorithm'] + '/' + r['protocol']:<13} {r['channels']:>3} "
            f"{r['predicted_us']:>10.1f}")


def table(system: str, collective: str, ranks: int, size_list: list[int], overrides=(),
          echo: Callable[[str], None] = print, watchdog_s: float = 60.0) -> list[dict]:
    rows = []
    for size in size_list:
        r = measure(system, collective, size, ranks, overrides, watchdog_s)
        if not rows:
            for line in header(system, collective, ranks, r["library"]):
                echo(line)
        rows.append(r)
        echo(row(r))
    return rows
