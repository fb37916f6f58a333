"""A direct all-gather of three peers (4 ranks) on the toy device, its whole modelled event
log against one derived by hand (the serial baseline's all-gather once paid its
received bytes twice).

usage: gather_log.py   (4 ranks)

The toy device tests/data/event-log.toml (full mesh, a link of L = 100 GB/s per peer,
HBM 1000 GB/s, 1 us launches, library fraction 1), with the link latency cut to 0.1 us
so that the received data starts landing while the senders still read: rank r's X (a
128 x 256 fp32 chunk, XB bytes) goes to every peer at once as the direct kernel sends it,
each peer's copy into rows 128r.. of its Y; then the kernel waits for the three chunks
it receives and lands them as one stream (``steady``, as the FiCCO serial baseline's).

By hand (t = the launch, 1 us):
- each send holds its link for XB / L from t; the kernel reads X for it as the link
  takes it (XB at L over the same interval: three reads at 3 L = 300 GB/s of 1000, so
  they end with the links, not XB / BW apart at the HBM's full rate);
- each chunk arrives LAT after its last byte left: t_arr = t + XB / L + LAT;
- the three chunks came in over three links at once: they began to arrive at
  t_arr - 3 XB / (3 L) = t + LAT and land as one stream at 3 L until t_arr; the HBM has
  1000 - 300 GB/s free beside the reads, so the stream is absorbed by t_arr and the
  kernel ends there.
Before the fix the reads took the HBM whole for 3 XB / BW from t, and the stream was
taken to begin 3 XB / L (one link's rate) before t_arr: it started at 0, before the
kernel, and ended 3 XB / BW late (what --ablate contention removed from g5).

Prints ``GATHER-LOG OK`` or the expected and got logs side by side; exits non-zero on a
mismatch.
"""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))

from event_log import compare, _events  # noqa: E402  (the comparison of event_log.py)

from devices.spec import load_device  # noqa: E402
from emulator.engine.plan import Plan, Slots, StepsPhase  # noqa: E402
from emulator.engine.runner import RunOptions, run_plan  # noqa: E402
from emulator.engine.steps import CuStep  # noqa: E402
from emulator.runtime import watchdog  # noqa: E402

DEVICE = Path(__file__).resolve().parents[1] / "data" / "event-log.toml"
_D = tomllib.loads(DEVICE.read_text())
LAUNCH = _D["compute"]["launch_us"] * 1e-6  # 1 us
L = _D["interconnect"]["link_gb_per_s_per_direction"] * 1e9  # 100 GB/s
LAT = 0.1e-6  # the case's link latency (replaced below)
E = 4
CHUNK, N = 128, 256
XB = CHUNK * N * E  # 131072 bytes
W = 4


def plan_of(r: int):
    slots = Slots()
    base = slots.alloc("Y from", W)
    peers = [c for c in range(W) if c != r]
    x_all = (0, CHUNK, 0, N)
    mine = (CHUNK * r, CHUNK * r + CHUNK, 0, N)
    steps = [CuStep(f"send to {c}", "ag", [("X", x_all)], ("Y", mine), c,
                    signal_slots=[base + r], signal_elems=[CHUNK * N], concurrent=j > 0)
             for j, c in enumerate(peers)]
    wait = slots.region("Y from peers", [base + c for c in peers], [CHUNK * N] * len(peers))
    steps.append(CuStep("final", "ag", [], None, r, wait, len(peers) * XB,
                        steady=True, writers=len(peers)))
    layout = [("X", (CHUNK, N), np.float32), ("Y", (W * CHUNK, N), np.float32)]
    result = [("Y", (CHUNK * c, CHUNK * c + CHUNK, 0, N)) for c in peers]
    return Plan(layout, {"X": ("X", 0)}, [StepsPhase("gather", steps)], slots, result)


def x_of(rank: int) -> np.ndarray:
    return np.random.default_rng([48, rank]).integers(-1, 2, (CHUNK, N)).astype(np.float32)


def log_of(r: int) -> list:
    t = LAUNCH
    link_end = t + XB / L  # each send, its link alone
    arr = link_end + LAT
    first = arr - 3 * XB / (3 * L)  # = t + LAT: three links at once
    log = [("launch", "gather", 0.0, t)]
    for c in (c for c in range(W) if c != r):
        log += [(f"link->{c}", f"send to {c}", t, link_end),
                ("ag", f"send to {c}", t, link_end)]  # reads paced by the link: no later
    log += [("hbm", "final received data lands", first, arr),  # 3 L stream, absorbed
            ("ag", "final", arr, arr)]
    return log


def main() -> int:
    comm = MPI.COMM_WORLD
    if comm.size != W:
        print(f"gather_log.py runs on {W} ranks", flush=True)
        return 2
    r = comm.rank
    watchdog.open_board(comm)
    spec = load_device(str(DEVICE))
    spec = dataclasses.replace(spec, interconnect=dataclasses.replace(
        spec.interconnect, link_latency_s=LAT, links=W - 1))
    res = run_plan(comm, plan_of(r), spec, "gather", {"X": x_of(r)},
                   RunOptions("fp32", 60.0, record=True))
    want = np.concatenate([x_of(c) for c in range(W) if c != r])
    data_ok = res.result is not None and np.array_equal(res.result, want)
    ok, table = compare(log_of(r), _events(res))
    tables = comm.gather((data_ok, ok, table), root=0)
    good = comm.allreduce(data_ok and ok, MPI.LAND)
    watchdog.close_board()
    if r == 0:
        if good:
            print("GATHER-LOG OK", flush=True)
        else:
            for rank, (d, o, tab) in enumerate(tables):
                print(f" rank {rank}: data {'OK' if d else 'WRONG'}, log "
                      f"{'OK' if o else 'DIFFERS'}\n{tab}", flush=True)
            print("GATHER-LOG MISMATCH", flush=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
