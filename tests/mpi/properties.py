"""Property-based tests under MPI: hypothesis draws cases on rank 0, every rank runs them.

Run as ``mpiexec -n R python -m mpi4py tests/mpi/properties.py EXAMPLES``. Rank 0 runs
a hypothesis test whose body broadcasts the drawn case (shape, collective, algorithm,
topology, dtype, values, split-K) to all ranks; all run every mode (above 3 ranks, those
of the whole-registry matrix: ``tests.ops.matrix_modes``) numerically and timing-only
through the emulator's own entry point (``worker.execute``), and rank 0 checks the
properties:

- every mode passes the numerics check against the independent reference (numpy
  GEMMs + MPI's own collectives, tolerances derived from the dtype);
- timing-only gives exactly the numeric run's modelled times, phases and DRAM bytes;
- a repeated timing-only run gives the same numbers (determinism);
- modelled times respect the physical lower bounds (GEMM at peak, collective bytes
  over the links) and ideal-overlap is never slower than sequential;
- per-rank phases are well-formed (start <= end <= the run's total) and the GEMM
  reads at least its inputs once.

Shrinking broadcasts each smaller case the same way. When a property fails rank 0
prints the falsifying case and the job exits 1.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback

from mpi4py import MPI

from collectives import TOPOLOGY_ALGORITHMS
from tests.ops import COLLECTIVE_ALGORITHMS, matrix_modes, splits
from collectives.common import ring_chunks
from devices.spec import load_device
from emulator.app.config import RunConfig
from emulator.app.worker import execute

comm = MPI.COMM_WORLD
DEVICE = load_device("t3-sim")
STOP = "stop"


def run_case(case: dict) -> tuple[dict | None, dict | None, dict | None]:
    """All ranks: the numeric run, the timing-only run and a repeat of it."""
    cfg = RunConfig(ranks=comm.size, watchdog_s=120.0, **case).validate()
    numeric, _ = execute(comm, cfg, DEVICE)
    timing, _ = execute(comm, dataclasses.replace(cfg, timing_only=True), DEVICE)
    again, _ = execute(comm, dataclasses.replace(cfg, timing_only=True), DEVICE)
    return numeric, timing, again


def check(case: dict, numeric: dict, timing: dict, again: dict) -> None:
    lb = numeric["lower_bounds_s"]
    floor = max(lb["gemm_compute"], lb["collective_link"])
    e = 2 if case["dtype"] == "fp16" else 4
    runs = {r["mode"]: r for r in numeric["runs"]}
    for run, t_run, t_again in zip(numeric["runs"], timing["runs"], again["runs"]):
        mode = run["mode"]
        assert run["numerics"] == "pass", (mode, run["numerics_notes"], run["max_abs_error"])
        for key in ("modelled_time_s", "phases", "rank_end_s", "dram_bytes_per_rank",
                    "arbitration"):
            assert run[key] == t_run[key], (mode, key, run[key], t_run[key])
            assert t_run[key] == t_again[key], (mode, key, "repeat differs")
        total = run["modelled_time_s"]
        assert total >= floor * (1 - 1e-9), (mode, total, lb)
        for rank_phases in run["rank_phases_s"]:
            for name, (start, end) in rank_phases.items():
                assert 0 <= start <= end <= total * (1 + 1e-12), (mode, name, start, end)
        for rank, dram in enumerate(run["dram_bytes_per_rank"]):
            r0, r1 = ring_chunks(case["m"], comm.size)[rank]
            rows = r1 - r0 if case["collective"] == "ag" else case["m"]  # rows of A it reads
            assert dram["gemm_read"] >= e * (rows * case["k"] + case["k"] * case["n"]) * 0.999, \
                (mode, rank, dram)
    if "ideal-overlap" in runs and "sequential" in runs:
        assert (runs["ideal-overlap"]["modelled_time_s"]
                <= runs["sequential"]["modelled_time_s"] * (1 + 1e-12))


def rank0(examples: int) -> int:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    world = comm.size

    @st.composite
    def cases(draw):
        collective = draw(st.sampled_from(list(COLLECTIVE_ALGORITHMS)))
        topology = draw(st.sampled_from(["ring", "full-mesh", "switch"]))
        algos = [a for a in COLLECTIVE_ALGORITHMS[collective] if a in TOPOLOGY_ALGORITHMS[topology]]
        if not algos:
            topology = "full-mesh"
            algos = list(COLLECTIVE_ALGORITHMS[collective])
        k = draw(st.integers(1, 300))
        algorithm = draw(st.sampled_from(algos))
        dtype = draw(st.sampled_from(["fp16", "fp32"]))
        return {
            "collective": collective,
            "topology": topology,
            "algorithm": algorithm,
            # every configuration at up to 3 ranks; above, those of the whole-registry
            # matrix (the families with a matrix of their own are left out there)
            "mode": "all" if world <= 3 else ",".join(
                matrix_modes(collective, algorithm, world, topology, dtype)),
            "m": draw(st.integers(world, 700)),
            "n": draw(st.integers(1, 400)),
            "k": k,
            "dtype": dtype,
            "values": draw(st.sampled_from(["int", "normal"])),
            "split_k": draw(st.integers(1, min(k, 3))) if splits(collective) else 1,
            "seed": draw(st.integers(0, 2**31)),
        }

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(cases())
    def emulator_properties(case):
        print(f"case: {case}", flush=True)
        comm.bcast(case, root=0)
        numeric, timing, again = run_case(case)
        check(case, numeric, timing, again)

    try:
        emulator_properties()
        print(f"properties hold for {examples} cases on {world} ranks", flush=True)
        return 0
    except Exception:  # noqa: BLE001 - report the falsifying case, end the other ranks
        traceback.print_exc()
        return 1
    finally:
        comm.bcast(STOP, root=0)


def others() -> int:
    while (case := comm.bcast(None, root=0)) != STOP:
        run_case(case)
    return 0


if __name__ == "__main__":
    from emulator.runtime.process import install_abort_handlers, pin_threads

    pin_threads()
    install_abort_handlers()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    sys.exit(rank0(n) if comm.rank == 0 else others())
