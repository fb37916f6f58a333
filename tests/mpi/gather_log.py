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

A second case, ``switch-stores``: the four ranks behind a switch (one up port each, the
link cut to LQ = 20 GB/s), a GEMM over a 512 x 256 output of 128 x 128 fp32 tiles, three
tiles a stage: stage 0 the first tile of each peer's chunk, stage 1 the second, both
stored into the owners' C by the producing WGs (a reduce-scatter's updates), stage 2 the
rank's own two tiles, updated locally. The store queue is one stage's own stores
(``Kernel.store_queue = STAGE``). By hand (C = a WG's compute, q = a tile on the port):
stage 0's three stores leave one after another on the up port from its read end t + C;
it retires then (its stores have begun to leave). Stage 1 computes until t + 2C, but its
stores find the port busy until t + C + 3q: it retires only once they begin then (the
port pushes back a wave behind; per destination it would have waited until only the
last destination's tile was left to send). Stage 2 follows with its two local updates.

Prints ``GATHER-LOG OK <case>`` or the expected and got logs side by side; exits non-zero
on a mismatch.
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


# ---------------------------------------------------------------- switch-stores
LQ = 20e9
TM = TN = 128
K = 64


def stores_plan(spec, r: int):
    from emulator.engine.addrmap import AddressMap, TileSpace
    from emulator.engine.kernel import STAGE, Kernel, make_wgs
    from emulator.engine.plan import KernelPhase
    from emulator.engine.producers import TiledGemm
    from devices.regions import tile_grid

    slots = Slots()
    chunks = [(TM * c, TM * c + TM) for c in range(W)]
    tiles = tile_grid(chunks, 2 * TN, TM, TN)
    space = TileSpace("C", tiles, slots.alloc("C tile", len(tiles)))
    peers = [(r + d) % W for d in range(1, W)]
    order = ([(TM * c, TM * c + TM, 0, TN) for c in peers]
             + [(TM * c, TM * c + TM, TN, 2 * TN) for c in peers]
             + [(TM * r, TM * r + TM, 0, TN), (TM * r, TM * r + TM, TN, 2 * TN)])
    ids = [space.tile_at(t) for t in order]
    wgs, wg_tile = make_wgs(space, ids, K, 1)
    kernel = Kernel(TiledGemm("A", "Bm"), space, wgs, wg_tile, np.arange(len(wgs)), W - 1,
                    store_queue=STAGE)
    cmap = AddressMap(space, r, W, "update", kernel.local_writes(), local_ok=True)
    for c in peers:
        cmap.remote_map((TM * c, TM * c + TM, 0, 2 * TN), c, op="update")
    layout = [("A", (W * TM, K), np.float32), ("Bm", (K, 2 * TN), np.float32),
              ("C", (W * TM, 2 * TN), np.float32)]
    return Plan(layout, {"A": ("A", 0), "Bm": ("Bm", 0)},
                [KernelPhase("switch-stores", kernel, [cmap], "rs")], slots,
                [("C", (TM * r, TM * r + TM, 0, 2 * TN))])


def ab_of(rank: int) -> dict:
    rng = np.random.default_rng([49, rank])
    return {"A": rng.integers(-1, 2, (W * TM, K)).astype(np.float32),
            "Bm": rng.integers(-1, 2, (K, 2 * TN)).astype(np.float32)}


def stores_log(r: int) -> list:
    t = LAUNCH
    cus = _D["compute"]["cus"] * _D["compute"]["wgs_per_cu"]  # S = 2 slots
    flops = _D["compute"]["fp32_flops_per_cycle_per_cu"] * _D["compute"]["cus"] * \
        _D["compute"]["clock_ghz"] * 1e9
    C = 2 * TM * TN * K * cus / flops  # a WG's time: 2 h w k x S / F = 2.048 us
    q = TM * TN * E / LQ  # one tile on the up port
    upd = _D["memory"]["nmc_update_cost"] * 2 * TM * TN * E / (_D["memory"]["hbm_gb_per_s"]
                                                             * 1e9)
    peers = sorted((r + d) % W for d in range(1, W))
    log = [("launch", "switch-stores", 0.0, t), ("gemm", "stage 0", t, t + C)]
    for j, c in enumerate(peers):  # one after another on the up port, from the read end
        log.append((f"link->{c}", "stage 0 stores", t + C, t + C + (j + 1) * q))
    s1_end = max(t + 2 * C, t + C + 3 * q)  # held until stage 0's stores have left
    assert s1_end == t + C + 3 * q
    log.append(("gemm", "stage 1", t + C, s1_end))
    for j, c in enumerate(peers):  # behind stage 0's on the port
        log.append((f"link->{c}", "stage 1 stores", t + 2 * C, t + C + (4 + j) * q))
    log.append(("gemm", "stage 2", s1_end, s1_end + C + upd))  # 2 local updates
    return log


def run_case(comm, name: str, spec, plan, inputs, want, log) -> bool:
    r = comm.rank
    res = run_plan(comm, plan, spec, name, inputs, RunOptions("fp32", 60.0, record=True))
    data_ok = res.result is not None and np.array_equal(res.result, want)
    ok, table = compare(log, _events(res))
    tables = comm.gather((data_ok, ok, table), root=0)
    good = comm.allreduce(data_ok and ok, MPI.LAND)
    if r == 0:
        if good:
            print(f"GATHER-LOG OK {name}", flush=True)
        else:
            for rank, (d, o, tab) in enumerate(tables):
                print(f" rank {rank}: data {'OK' if d else 'WRONG'}, log "
                      f"{'OK' if o else 'DIFFERS'}\n{tab}", flush=True)
            print(f"GATHER-LOG MISMATCH {name}", flush=True)
    return good


def main() -> int:
    comm = MPI.COMM_WORLD
    if comm.size != W:
        print(f"gather_log.py runs on {W} ranks", flush=True)
        return 2
    r = comm.rank
    watchdog.open_board(comm)
    base = load_device(str(DEVICE))
    spec = dataclasses.replace(base, interconnect=dataclasses.replace(
        base.interconnect, link_latency_s=LAT, links=W - 1))
    good = run_case(comm, "gather", spec, plan_of(r), {"X": x_of(r)},
                    np.concatenate([x_of(c) for c in range(W) if c != r]), log_of(r))
    switch = dataclasses.replace(base, interconnect=dataclasses.replace(
        base.interconnect, topology="switch", link_bw=LQ))
    mine = slice(TM * r, TM * r + TM)
    want = sum(ab_of(c)["A"] @ ab_of(c)["Bm"] for c in range(W))[mine]
    good = run_case(comm, "switch-stores", switch, stores_plan(switch, r), ab_of(r), want,
                    stores_log(r)) and good
    watchdog.close_board()
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
