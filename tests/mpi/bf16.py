"""Every operation in bf16 with every configuration the device runs, in one MPI job.

Run by tests/test_bf16.py under several rank counts; each operation runs the real worker
(numerics against numpy + MPI's own collectives) on A100s behind a switch and must PASS.
"""

import sys

from mpi4py import MPI

from emulator.app.config import RunConfig
from emulator.app.worker import _main

OPERATIONS = ("gemm+rs", "gemm+ag", "gemm+ar", "gemm+a2a", "ag+gemm", "gemv+ar", "emb+a2a",
              "a2a+gemm")


def main() -> int:
    world = MPI.COMM_WORLD.size
    for op in OPERATIONS:
        # uneven rows at every size; a GEMV's N is its few right-hand sides, an embedding's
        # K its lookups per bag
        shape = dict(m=40 * world + 3, n={"gemv+ar": 2}.get(op, 136), k={"emb+a2a": 5}.get(op, 72))
        cfg = RunConfig(ranks=world, collective=op, topology="switch", device="a100-sxm",
                        dtype="bf16", values="normal", watchdog_s=120, **shape).validate()
        if _main(cfg) != 0:
            print(f"BF16 FAIL {op}", flush=True)
            return 1
    if MPI.COMM_WORLD.rank == 0:
        print(f"BF16 OK {len(OPERATIONS)} operations on {world} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
