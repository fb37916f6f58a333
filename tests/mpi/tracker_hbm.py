"""Run under mpiexec -n N: HBM ops and the tracker's put-with-signal across ranks."""

import sys

import numpy as np
from mpi4py import MPI

from devices.hbm import Hbm
from devices.tracker import TrackedRegion, Tracker, WatchdogTimeout

comm = MPI.COMM_WORLD
rank, n = comm.rank, comm.size
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


for dtype in (np.float32, np.float16):
    hbm = Hbm(comm, [("X", (7, 5), dtype)], ("gemm", "rs"))
    tracker = Tracker(comm, 4, lambda s: f"slot {s}")
    region = (1, 4, 2, 5)  # 3 x 3, strided
    # every rank updates rank 0's region concurrently with (rank+1), and signals slot 0
    hbm.update("X", region, np.full((3, 3), rank + 1, dtype), "rs", 0)
    tracker.signal(0, [0], [9], float(rank + 10))
    if rank == 0:
        tr = TrackedRegion("X[1:4,2:5]", np.array([0]), np.array([9 * n]))
        t = tracker.wait(tr, 30.0)
        got = hbm.load("X", region, "rs")
        expect(np.array_equal(got, np.full((3, 3), n * (n + 1) / 2, dtype)), f"{dtype} sum {got}")
        expect(t == float(n - 1 + 10), f"arrival time max {t}")
        untouched = hbm.view("X").copy()
        untouched[1:4, 2:5] = 0
        untouched[0] = 0  # row 0 is the left neighbour's store target
        expect(not untouched.any(), "writes outside the region")
        # a wait that cannot complete names what is missing
        try:
            tracker.wait(TrackedRegion("never", np.array([1]), np.array([5]), "test"), 0.2)
            expect(False, "watchdog did not fire")
        except WatchdogTimeout as exc:
            expect("slot 1 has 0/5 element-updates" in str(exc), str(exc))
    # a plain store to the right neighbour
    hbm.store("X", (0, 1, 0, 5), np.arange(5, dtype=dtype) + rank, "gemm", (rank + 1) % n)
    comm.Barrier()
    hbm.win.Sync()
    left = (rank - 1) % n
    if n > 1 or dtype == np.float32:
        expect(np.array_equal(hbm.view("X")[0], np.arange(5, dtype=dtype) + left), "store")
    traffic = hbm.traffic_by_rank()
    expect(traffic[0, 1, 2] == 9 * n * np.dtype(dtype).itemsize, f"update bytes {traffic[0]}")
    tracker.free()
    hbm.free()

ok = comm.allreduce(not failures, MPI.LAND)
if failures:
    print(f"rank {rank}: {failures}", file=sys.stderr)
sys.exit(0 if ok else 1)
