"""The registry's operations as the tests enumerate them (their older short names)."""

from collectives import TOPOLOGIES, supported as _supported  # noqa: F401 - re-exported
from emulator.app.catalog import registry

REG = registry()
COLLECTIVES = tuple(op.aliases[0] for op in REG.operations.values() if op.aliases)
COLLECTIVE_ALGORITHMS = {c: REG.operation(c).algorithms for c in COLLECTIVES}


def splits(collective: str) -> bool:
    """Whether the operation's producer splits K over several WGs (--split-k > 1)."""
    return REG.operation(collective).split_k


def modes_for(collective: str, algorithm: str | None = None, ranks: int = 0,
              topology: str = "", device: str = "t3-sim", dtype: str = "fp16"
              ) -> tuple[str, ...]:
    """The configurations of the operation (with ``algorithm``); with ``ranks``: those
    ``device`` (in ``topology``) runs at that size in ``dtype`` (as ``--mode all`` keeps
    them)."""
    modes = REG.configurations_for(REG.operation(collective), algorithm)
    if not ranks:
        return modes
    from devices.spec import load_device, with_topology

    spec = load_device(device)
    spec = with_topology(spec, topology) if topology else spec
    return tuple(m for m in modes if not REG.refusal(m, spec, dtype, ranks))


# families with a numerics matrix of their own on 2, 3, 4 and 8 ranks (tests/test_te.py,
# tests/test_ficco.py): the whole-registry matrix runs them on every topology at 2 and 3
# ranks only
OWN_MATRIX = ("te-", "ficco-")


def matrix_modes(collective: str, algorithm: str, ranks: int, topology: str,
                 dtype: str = "fp16") -> tuple[str, ...]:
    """The modes tests/mpi/matrix.py (and properties.py) run for a combination at
    ``ranks``."""
    modes = modes_for(collective, algorithm, ranks, topology, dtype=dtype)
    if ranks <= 3:
        return modes
    return tuple(m for m in modes if not m.startswith(OWN_MATRIX))


# the whole-registry matrices' shape (tests/mpi/matrix.py, timing_only.py): divisible
# neither by the rank counts nor by 128. An embedding's K is its pooling factor (lookups
# per bag, each a row of N): 9 lookups give the same uneven bags as 129 at a fourteenth of
# the lookups, in the emulator and in numpy's reference alike.
MATRIX_SHAPE = dict(m=517, n=300, k=129)


def matrix_shape(collective: str) -> dict:
    if REG.operation(collective).producer == "embedding":
        return {**MATRIX_SHAPE, "k": 9}
    return MATRIX_SHAPE


def supported(collective: str, algorithm: str, topology: str) -> bool:
    return _supported(REG.operation(collective).algorithms, algorithm, topology)


# what a timing-only run must give exactly as the numeric run of the same configuration
SAME_AS_NUMERIC = ("modelled_time_s", "phases", "rank_phases_s", "rank_kernel_end_s",
                   "dram_bytes_per_rank")


def check_numerics_and_timing_only(emulate, base: list[str]) -> dict:
    """Run ``t3emu run BASE`` in fp32 (integer inputs: bit-exact), in fp16 (within the
    tolerance) and fp16 timing-only (the same modelled times, phases, kernel ends and DRAM
    bytes as the numeric run); return the fp32 document."""
    exact = emulate(base + ["--dtype", "fp32"])
    for run in exact["runs"]:
        assert run["numerics"] == "pass" and run["max_abs_error"] == 0.0, run["mode"]
    half = emulate(base + ["--dtype", "fp16"])
    assert {r["numerics"] for r in half["runs"]} == {"pass"}
    timing = emulate(base + ["--dtype", "fp16", "--timing-only"])
    for a, b in zip(half["runs"], timing["runs"], strict=True):
        for key in SAME_AS_NUMERIC:
            assert a[key] == b[key], (a["mode"], key)
    return exact
