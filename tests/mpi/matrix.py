"""Every supported (collective, algorithm, topology) with every mode (above 3 ranks, but the
families with a matrix of their own: ``tests.ops.matrix_modes``), in one MPI job.

Run by tests/test_collectives.py on 2 and 8 ranks (on 3 and 4, tests/mpi/timing_only.py's
numeric runs are this matrix and more); each combination runs
the real worker (numerics against MPI's own collectives) and must PASS.
"""

import sys

from mpi4py import MPI

from tests.ops import COLLECTIVES, TOPOLOGIES, matrix_shape, matrix_modes, splits, supported
from emulator.app.config import RunConfig
from emulator.app.worker import _main


def combos():
    for collective in COLLECTIVES:
        for topology in TOPOLOGIES:
            for algorithm in ("ring", "direct"):
                if supported(collective, algorithm, topology):
                    yield collective, algorithm, topology


def main() -> int:
    world = MPI.COMM_WORLD.size
    done = 0
    for i, (collective, algorithm, topology) in enumerate(combos()):
        dtype = "fp32" if i % 2 else "fp16"
        for split in (1, 2) if topology == "full-mesh" and splits(collective) else (1,):
            modes = ",".join(matrix_modes(collective, algorithm, world, topology))
            cfg = RunConfig(ranks=world, collective=collective, topology=topology,
                            algorithm=algorithm, dtype=dtype, split_k=split, watchdog_s=60,
                            mode=modes, **matrix_shape(collective)).validate()
            if _main(cfg) != 0:
                print(f"MATRIX FAIL {collective} {algorithm} {topology} {dtype} split {split}",
                      flush=True)
                return 1
            done += 1
    if MPI.COMM_WORLD.rank == 0:
        print(f"MATRIX OK {done} combinations on {world} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
