"""Run under mpiexec -n N: HBM ops and the tracker's put-with-signal across ranks."""

import sys

import numpy as np
from mpi4py import MPI

from devices.hbm import WIN_INFO, Hbm, Segment
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
        first = tracker.first_arrival(tr)
        expect(first == 10.0, f"first arrival (min over the writers) {first}")
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

# fp16 updates of overlapping regions of different shapes (a DMA chunk, a tile) land on
# the same elements at once: every one of them must count (locks cover row stripes)
seg_hbm, seg_tracker = Segment(comm, WIN_INFO), Segment(comm)
for rnd in range(2):  # the second run binds the same windows: it starts from zero again
    hbm = Hbm(comm, [("X", (130, 40), np.float16)], ("rs",), segment=seg_hbm)
    tracker = Tracker(comm, 2, lambda s: f"slot {s}", seg_tracker)
    for _ in range(3):
        hbm.update("X", (0, 130, 0, 40), np.ones((130, 40), np.float16), "rs", 0)
        hbm.update("X", (60, 70, 8, 16), np.full((10, 8), 2, np.float16), "rs", 0)
    tracker.signal(0, [1], [1], 1.0)
    if rank == 0:
        tracker.wait(TrackedRegion("all", np.array([1]), np.array([n])), 30.0)
        want = np.full((130, 40), 3 * n, np.float16)
        want[60:70, 8:16] += 6 * n
        expect(np.array_equal(hbm.load("X", (0, 130, 0, 40), "rs"), want),
               f"overlapping fp16 updates, run {rnd}")
    comm.Barrier()
    tracker.free()
    hbm.free()
# a reused tracker segment starts from zero whatever the run before wrote: a larger
# tracker's counts and times (at other offsets: the layout follows the slot count), then a
# smaller one and a larger one again
for rnd, slots in enumerate((64, 3, 96)):
    tracker = Tracker(comm, slots, lambda s: f"slot {s}", seg_tracker)
    every = TrackedRegion("every", np.arange(slots), np.full(slots, n if rnd != 1 else 0))
    expect(tracker.arrival(every) == 0.0 and tracker.first_arrival(every) == float("inf"),
           f"round {rnd} starts with arrivals {tracker.arrival(every)}, "
           f"{tracker.first_arrival(every)}")
    expect(not tracker.snapshot()[0].any(), f"round {rnd} starts with counts")
    comm.Barrier()  # every rank has read its start before any signals
    if rnd != 1:
        tracker.signal(0, list(range(slots)), [1] * slots, 100.0 + rnd + rank)
        if rank == 0:
            tracker.wait(every, 30.0)
            expect((tracker.first_arrival(every), tracker.arrival(every))
                   == (100.0 + rnd, 100.0 + rnd + n - 1),
                   f"round {rnd}: {tracker.first_arrival(every)}, {tracker.arrival(every)}")
    comm.Barrier()
    tracker.free()
seg_tracker.free()
seg_hbm.free()

# a new window counts as written whole (MPI does not promise its memory is zero);
# bound again at a smaller size, only that much of it is the run before's
fresh = Segment(comm)
fresh.bind(1 << 20)
expect(fresh.claim(1 << 20) == 1 << 20, "a new window's stale bytes")
expect(fresh.claim(1 << 10) == 1 << 10, "bound again smaller: that much of it")
expect(fresh.claim(1 << 20) == 1 << 20, "bound again: all of it may be the run before's")
fresh.free()

# the earliest and latest arrivals of a region signalled slot by slot: a run of slots
# (one contiguous accumulate) and scattered slots (an indexed one), by every rank at once
tracker = Tracker(comm, 8, lambda s: f"slot {s}")
tracker.signal(0, [0, 1, 2], [1, 1, 1], [5.0 + rank, 6.0 + rank, 7.0 + rank])
tracker.signal(0, [3, 6], [1, 1], [20.0 - rank, 30.0 + rank])
tracker.signal(0, [4], [1], 0.0 if rank == 0 else 9.0 + rank)  # rank 0's own write: time 0
if rank == 0:
    run = TrackedRegion("run", np.array([0, 1, 2]), np.array([n, n, n]))
    spread = TrackedRegion("spread", np.array([3, 6]), np.array([n, n]))
    tracker.wait(run, 30.0)
    tracker.wait(spread, 30.0)
    expect((tracker.first_arrival(run), tracker.arrival(run)) == (5.0, 7.0 + n - 1),
           f"run: {tracker.first_arrival(run)}, {tracker.arrival(run)}")
    expect((tracker.first_arrival(spread), tracker.arrival(spread)) == (20.0 - (n - 1),
                                                                       30.0 + n - 1),
           f"spread: {tracker.first_arrival(spread)}, {tracker.arrival(spread)}")
    mixed = TrackedRegion("mixed", np.array([4]), np.array([n]))
    tracker.wait(mixed, 30.0)  # a local write (time 0) says nothing of when data came in
    expect(tracker.first_arrival(mixed) == (10.0 if n > 1 else float("inf")),
           f"mixed: {tracker.first_arrival(mixed)}")
    untouched = TrackedRegion("none", np.array([7]), np.array([0]))
    expect(tracker.first_arrival(untouched) == float("inf"), "no arrival: inf")
comm.Barrier()
tracker.free()

# updates that cross the network are counted apart: here every odd rank sits on another
# "node" than rank 0 (``far``); a run of slots, scattered slots and one slot
tracker = Tracker(comm, 8, lambda s: f"slot {s}", far=[r % 2 != rank % 2 for r in range(n)])
tracker.signal(0, [0, 1], [2, 3], 1.0)
tracker.signal(0, [3, 5], [4, 1], 2.0)
tracker.signal(0, [7], [5], 3.0)
if rank == 0:
    region = TrackedRegion("all", np.array([0, 1, 3, 5, 7]), np.array([1] * 5))
    tracker.wait(TrackedRegion("last", np.array([7]), np.array([5 * n])), 30.0)
    tracker.wait(TrackedRegion("rest", np.array([0, 1, 3, 5]), np.array([2, 3, 4, 1]) * n),
                 30.0)
    odd = n // 2  # ranks 1, 3, ...
    expect(tracker.network_updates(region) == (15 * odd, 15 * n),
           f"network updates {tracker.network_updates(region)}, want {(15 * odd, 15 * n)}")
    expect(tracker.network_updates(TrackedRegion("one", np.array([7]), np.array([1])))
           == (5 * odd, 5 * n), "one slot's network updates")
comm.Barrier()
tracker.free()

# doorbells are on for every rank or for none: a rank that cannot open a socket (here
# the last one) turns them off for the job, and waits still complete by polling
import devices.tracker as tracker_mod  # noqa: E402

probe = Tracker(comm, 1, lambda s: f"slot {s}")
expect(probe.bell.works == (sys.platform == "linux"), "bells off on one Linux host")
probe.free()
real_socket = tracker_mod.socket.socket
if rank == n - 1:
    def no_socket(*args, **kwargs):
        raise OSError("sockets are not allowed here")
    tracker_mod.socket.socket = no_socket
tracker = Tracker(comm, 1, lambda s: f"slot {s}")
tracker_mod.socket.socket = real_socket
expect(not tracker.bell.works, "bells on although a rank has none")
tracker.signal((rank + 1) % n, [0], [1], 2.0)
expect(tracker.wait(TrackedRegion("bell-less", np.array([0]), np.array([1])), 30.0) == 2.0,
       "wait without bells")
comm.Barrier()
tracker.free()

ok = comm.allreduce(not failures, MPI.LAND)
if failures:
    print(f"rank {rank}: {failures}", file=sys.stderr)
sys.exit(0 if ok else 1)
