"""``t3emu nccl-tests``: the library collectives of a system over message sizes, printed
as NVIDIA's nccl-tests prints them (size, count, type, redop, root, time, algbw, busbw,
then the ``Out of bounds values`` and ``Avg bus bandwidth`` lines).

Each size is one timing-only run of the emulator (``api.run``; every size's run in one
pooled MPI job) of the operation whose collective is the one asked for, in the
``sequential`` configuration (the producer, then the library's collective kernel); the
row is that kernel's
modelled time, its launch included: the library's schedule on the modelled links and ports, with the
algorithm, protocol and channels its tuning model chose
(``emulator/model/library.py``), whose own prediction is printed beside it (the
all-to-all is NCCL's grouped send/receive, outside the tuning model: no choice shown).

Sizes, counts and bandwidths follow nccl-tests' ``setupArgs`` and ``get*Bw``
(``src/common.cu``, ``src/all_gather.cu``, ...): ``count = size / element size``;
all_gather, reduce_scatter and alltoall round the count per rank down to a whole
16 bytes (``(count / nranks) & ~(16 / eltSize - 1)``) and print that per-rank count,
with size = that count x ranks x element size (0 when it rounds to nothing);
all_reduce keeps every element. algbw = size / time; busbw = algbw x (n-1)/n
(all_reduce: x 2(n-1)/n).
"""

from __future__ import annotations

import re
from collections.abc import Callable

# nccl-tests' collective (its binary without ``_perf``) -> (the operation whose collective
# it is, that collective's phase or span, reduces, counts per rank)
COLLECTIVES = {
    "all_gather": ("gemm+ag", "ag", False, True),
    "reduce_scatter": ("gemm+rs", "rs", True, True),
    "all_reduce": ("gemm+ar", "ar", True, False),
    "alltoall": ("gemm+a2a", "a2a", False, True),
}
# nccl-tests' -d names -> the emulator's dtypes (the others it names have none here)
DATATYPES = {"half": "fp16", "bfloat16": "bf16", "float": "fp32"}
NCCL_DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float",
                  "double", "bfloat16")
# nccl-tests' -o names; the model times each as a sum (see OPS_HELP)
OPS = ("sum", "prod", "max", "min", "avg")
OPS_HELP = ("every one is timed as sum: the model's reduction costs its bytes and one "
            "arithmetic operation per element, the same for prod, max and min; avg (NCCL: a "
            "sum of inputs premultiplied by 1/n) without its multiply")
ALIGN_BYTES = 16  # nccl-tests: a rank's count a whole 16 bytes
MAX_COLS = 8192
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgG]?)[bB]?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """A size as nccl-tests' ``parsesize`` reads it: a number (``1.5`` allowed), an optional
    K, M or G (either case; powers of 1024), the bytes truncated to a whole number; a
    trailing B is allowed (``1KB``)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r}: a size such as 8, 1K, 128M or 1G (K, M, G: powers "
                         f"of 1024)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def datatype(name: str) -> str:
    """The emulator's dtype for nccl-tests' ``-d`` name; ValueError names the supported."""
    if name not in DATATYPES:
        why = "the emulator has no such type; " if name in NCCL_DATATYPES else ""
        raise ValueError(f"{why}supported: {', '.join(DATATYPES)}")
    return DATATYPES[name]


def resolve(name: str) -> str:
    """nccl-tests' name of the collective a user names: any name or alias ``t3emu run``
    takes for its operation (``all_gather``, ``all_gather_perf``, ``all-gather``, ``ag``,
    ``gemm+ag``); ValueError names the choices."""
    from emulator.app.catalog import registry
    from emulator.engine.registry import RegistryError

    if name in COLLECTIVES:
        return name
    try:
        operation = registry().operation(name).name
    except RegistryError:
        operation = None
    found = [c for c, v in COLLECTIVES.items() if v[0] == operation]
    if not found:
        raise ValueError(f"nccl-tests' {', '.join(COLLECTIVES)} (or with _perf), or a name "
                         f"`t3emu run` takes for their operations: "
                         f"{', '.join(v[0] for v in COLLECTIVES.values())}")
    return found[0]


def element_bytes(dtype: str) -> int:
    from emulator.model.cost import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def counts(size: int, ranks: int, collective: str, e: int) -> tuple[int, int, int]:
    """nccl-tests' row for ``size`` bytes (``-b``, ``-e``, ``-f``): (bytes printed, count
    printed, elements the emulated run moves). all_reduce's count need not be a multiple of
    the ranks: it is timed as the next multiple (at most ranks - 1 elements more)."""
    count = size // e
    if COLLECTIVES[collective][3]:
        base = (count // ranks) & ~(max(1, ALIGN_BYTES // e) - 1)
        return base * ranks * e, base, base * ranks
    return count * e, count, -(-count // ranks) * ranks


def shape(elems: int, ranks: int) -> tuple[int, int]:
    """(rows, cols) of a buffer of ``elems`` elements (a multiple of the ranks): rows a
    multiple of the ranks (every rank owns a chunk), at most ``MAX_COLS`` columns."""
    if elems < ranks or elems % ranks:
        raise ValueError(f"{elems} elements are not a whole number per rank for {ranks} ranks")
    cols = min(elems // ranks, MAX_COLS)
    while elems % cols or (elems // cols) % ranks:
        cols -= 1
    return elems // cols, cols


def dims(elems: int, ranks: int) -> dict:
    """The run's M, N, K for a collective of ``elems`` elements (each operation's
    collective moves its M x N output)."""
    rows, cols = shape(elems, ranks)
    return dict(m=rows, n=cols, k=16)


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def library_name(system: str, overrides=()) -> str:
    from devices.system import load_system
    from emulator.model.library import LIBRARIES

    lib = load_system(system, dict(overrides)).interconnect.library
    return LIBRARIES[lib].name if lib else "no library"


def measure(system: str, collective: str, size: int, ranks: int, overrides=(),
            watchdog_s: float = 60.0, dtype: str = "fp16", op: str = "sum") -> dict:
    """One row: the emulator's modelled time of the library collective of ``size`` bytes
    (nccl-tests' ``-b``/``-e`` size, rounded as nccl-tests rounds it)."""
    from emulator import api

    collective = resolve(collective)
    operation, phase, reduces, _ = COLLECTIVES[collective]
    e = element_bytes(dtype)
    nbytes, count, elems = counts(size, ranks, collective, e)
    name = next(k for k, v in DATATYPES.items() if v == dtype)
    row = {"size": nbytes, "count": count, "type": name, "redop": op if reduces else "none",
           "root": -1, "time_us": 0.0, "algbw": 0.0, "busbw": 0.0, "algorithm": None,
           "protocol": None, "channels": None, "predicted_us": None}
    if not elems:  # NCCL returns at once from a call of no elements: nothing to time
        return row
    res = api.run(operation, **dims(elems, ranks), dtype=dtype, system=system, ranks=ranks,
                  modes="sequential", timing_only=True, set=dict(overrides),
                  watchdog_s=watchdog_s)
    run = res["sequential"].raw
    bw = run["bandwidth"][phase]
    # the call as nccl-tests times it: its kernel's launch and its run (the library's base
    # latency includes the launch; the phase's window starts after it)
    t = bw["time_s"] + res.doc["device"]["launch_s"]
    alg = nbytes / t
    factor = bw["busbw_gb_s"] / bw["algbw_gb_s"]
    row.update(time_us=t * 1e6, algbw=alg / 1e9, busbw=alg * factor / 1e9)
    lib = next(iter(run["library"].values()), None)
    if lib:
        row.update(algorithm=lib["algorithm"], protocol=lib["protocol"],
                   channels=lib["channels"], predicted_us=lib["predicted_us"])
    return row


def _num(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: 2 decimals, fewer where the width needs it."""
    for fmt in (f"{{:{width}.2f}}", f"{{:{width}.1f}}", f"{{:{width}.0f}}"):
        if len(s := fmt.format(value)) <= width:
            return s
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


def header(system: str, collective: str, ranks: int, library: str) -> list[str]:
    return [f"# {collective} on {system}, {ranks} GPUs: {library} (emulated; modelled time, "
            f"no data checked)",
            f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
            f"{'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}  {'algo/proto':<13} "
            f"{'ch':>3} {'model':>8}",
            f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  "
            f"{'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}  {'':<13} {'':>3} {'(us)':>8}"]


def row(r: dict) -> str:
    choice = f"{r['algorithm']}/{r['protocol']}" if r["algorithm"] else "-"
    model = _num(r["predicted_us"], 8) if r["predicted_us"] is not None else "-"
    return (f"{r['size']:>12}  {r['count']:>12}  {r['type']:>8}  {r['redop']:>6}  "
            f"{r['root']:>6}  {_num(r['time_us'], 7)}  {_num(r['algbw'], 6)}  "
            f"{_num(r['busbw'], 6)}  {'N/A':>6}  {choice:<13} "
            f"{r['channels'] if r['channels'] is not None else '-':>3} {model:>8}")


def avg_busbw(rows: list[dict]) -> float:
    """nccl-tests' ``Avg bus bandwidth``: the mean of every row's busbw."""
    return sum(r["busbw"] for r in rows) / len(rows) if rows else 0.0


def footer(rows: list[dict]) -> list[str]:
    """nccl-tests' closing lines (no data is checked: as nccl-tests -c 0, 0 out of bounds)."""
    return [f"# {'Out of bounds values':<20} : 0 OK",
            f"# {'Avg bus bandwidth':<20} : {avg_busbw(rows):g}",
            "#"]


def table(system: str, collective: str, ranks: int, size_list: list[int], overrides=(),
          echo: Callable[[str], None] = print, watchdog_s: float = 60.0,
          dtype: str = "fp16", op: str = "sum") -> list[dict]:
    from emulator.app.pool import pooled

    collective, rows = resolve(collective), []
    for line in header(system, collective, ranks, library_name(system, overrides)):
        echo(line)
    with pooled():  # every size's run in one MPI job, started once
        for size in size_list:
            r = measure(system, collective, size, ranks, overrides, watchdog_s, dtype, op)
            rows.append(r)
            echo(row(r))
    for line in footer(rows):
        echo(line)
    return rows
