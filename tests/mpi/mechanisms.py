"""The engine's mechanisms, each in a plan built directly against its API and checked
against numpy + MPI's own collectives, with the modelled event log.

usage: mechanisms.py DTYPE  (on any number of ranks; the NIC case needs >= 2)

- gemv-allreduce: a GEMV (vector producer) whose WGs store their tiles straight into
  every rank's slot buffer (the producing WG as executor, ``remote_map(to=)``), then a
  reduction kernel (elementwise producer) that waits on the slots' signals and pays a
  launch: Z = sum over ranks of W_r x_r, against ``Allreduce``.
- persistent-nic: a persistent GEMV (P = 3 WGs, remote tiles first) whose finished
  row chunks go to their owners by NIC puts (put, fence, flag), and whose WGs poll the
  peers' flags at exit: each rank's slot s holds rank s's rows, against ``allgather``.
- cu-rs: a GEMM whose output chunks are sent to their owners as updates by a CU
  kernel running beside it on a quarter of the CUs; the owner's chunk is the
  reduce-scatter, against ``Reduce_scatter``.
Prints ``MECHANISMS OK <cases>`` on success.
"""

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from collectives.common import ring_chunks
from devices.commands import Executor
from devices.regions import tile_grid
from devices.spec import load_device
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.kernel import Kernel, make_wgs
from emulator.engine.plan import KernelPhase, Plan, Slots
from emulator.engine.producers import Elementwise, Gemv, Source, TiledGemm
from emulator.engine.runner import RunOptions, run_plan
from emulator.runtime import watchdog

DEVICE = Path(__file__).resolve().parents[1] / "data" / "four-dma.toml"
M, K, B = 517, 129, 3  # uneven: no multiple of the tile sizes or of the rank counts


def _space(slots, name, blocks, cols, spec):
    tiles = tile_grid(blocks, cols, spec.wg_tile_m, spec.wg_tile_n)
    return TileSpace(name, tiles, slots.alloc(f"{name} tile", len(tiles)))


def _events(res):
    return [(e.track, e.name, e.start, e.end) for e in res.events]


def gemv_allreduce(comm, spec, dt, w, x):
    n, r = comm.size, comm.rank
    slots = Slots()
    yspace = _space(slots, "Y", [(0, M)], B, spec)
    sspace = _space(slots, "S", [(s * M, (s + 1) * M) for s in range(n)], B, spec)
    zspace = _space(slots, "Z", [(0, M)], B, spec)
    wgs, wg_tile = make_wgs(yspace, range(len(yspace)), K, 1)
    gemv = Kernel(Gemv("W", "x"), yspace, wgs, wg_tile, np.arange(len(wgs)), spec.wgs_per_stage)
    ymap = AddressMap(yspace, r, n, "store", gemv.local_writes())
    ymap.remote_map((0, M, 0, B), list(range(n)), op="store", to=sspace,
                    to_region=(r * M, (r + 1) * M, 0, B))
    smap = AddressMap(sspace, r, n, "store", np.zeros(len(sspace), np.int64),
                      incoming_op="store")
    arrived = tuple(smap.track((s * M, (s + 1) * M, 0, B)) for s in range(n))
    items = np.column_stack([zspace.tiles, np.zeros((len(zspace), 2), np.int64)])
    items[:, 5] = 1
    reduce = Kernel(Elementwise((tuple(Source("S", s * M) for s in range(n)),)), zspace, items,
                    np.arange(len(zspace)), np.arange(len(zspace)), spec.wgs_per_stage)
    zmap = AddressMap(zspace, r, n, "store", reduce.local_writes(), local_ok=True)
    layout = [("W", (M, K), dt), ("x", (K, B), dt), ("Y", (M, B), dt), ("S", (n * M, B), dt),
              ("Z", (M, B), dt)]
    plan = Plan(layout, {"W": ("W", 0), "x": ("x", 0)},
                [KernelPhase("gemv", gemv, [ymap, smap], "rs", fused=True),
                 KernelPhase("reduce", reduce, [zmap], "rs", waits=arrived)],
                slots, [("Z", (0, M, 0, B))])
    return plan, {"W": w, "x": x}


def persistent_nic(comm, spec, dt, w, x):
    n, r = comm.size, comm.rank
    chunks = ring_chunks(M, n)
    slots = Slots()
    yspace = _space(slots, "Y", chunks, B, spec)
    width = max(b - a for a, b in chunks)

    def blocks(c):  # receiver c's slot buffer: one block of its chunk's rows per sender
        return [(s * width, s * width + chunks[c][1] - chunks[c][0]) for s in range(n)]

    base = slots.alloc("G tile", len(tile_grid(blocks(0), B, spec.wg_tile_m, spec.wg_tile_n)))

    def gspace_of(c):  # the same slots on every rank (chunk 0 is the largest)
        return TileSpace("G", tile_grid(blocks(c), B, spec.wg_tile_m, spec.wg_tile_n), base)

    gspace = gspace_of(r)
    others = [(r + s) % n for s in range(1, n)]
    order = [t for c in others + [r] for t in yspace.tiles_in((*chunks[c], 0, B))]
    wgs, wg_tile = make_wgs(yspace, order, K, 1)
    ymap = AddressMap(yspace, r, n, "store", np.bincount(wg_tile, minlength=len(yspace)))
    for c in others:
        ymap.dma_map((*chunks[c], 0, B), c, op="store", after=1, executor=Executor("nic"),
                     to=gspace_of(c), to_region=(*blocks(c)[r], 0, B))
    ymap.track((*chunks[r], 0, B))
    gmap = AddressMap(gspace, r, n, "store", np.zeros(len(gspace), np.int64),
                      incoming_op="store", local_ok=True)  # its own block stays empty
    flags = tuple(gmap.track((*blocks(r)[s], 0, B)) for s in others)
    kernel = Kernel(Gemv("W", "x"), yspace, wgs, wg_tile, np.arange(len(wgs)), 3,
                    persistent=True, exit_waits=flags)
    layout = [("W", (M, K), dt), ("x", (K, B), dt), ("Y", (M, B), dt), ("G", (n * width, B), dt)]
    result = [("G", (*blocks(r)[s], 0, B)) for s in others]
    plan = Plan(layout, {"W": ("W", 0), "x": ("x", 0)},
                [KernelPhase("gemv+puts", kernel, [ymap, gmap], "a2a", fused=True)], slots,
                result)
    return plan, {"W": w, "x": x}


def cu_rs(comm, spec, dt, a, b):
    n, r = comm.size, comm.rank
    chunks = ring_chunks(M, n)
    slots = Slots()
    cspace = _space(slots, "C", chunks, B, spec)
    order = [t for c in [(r + s) % n for s in range(1, n + 1)]
             for t in cspace.tiles_in((*chunks[c], 0, B))]
    wgs, wg_tile = make_wgs(cspace, order, K, 1)
    gemm = Kernel(TiledGemm("A", "Bm"), cspace, wgs, wg_tile, np.arange(len(wgs)),
                  spec.wgs_per_stage)
    cmap = AddressMap(cspace, r, n, "update", gemm.local_writes())
    for c in range(n):
        if c != r:
            cmap.dma_map((*chunks[c], 0, B), c, op="update", after=1,
                         executor=Executor("cu", share=0.25))
    cmap.track((*chunks[r], 0, B), after=n)
    layout = [("A", (M, K), dt), ("Bm", (K, B), dt), ("C", (M, B), dt)]
    plan = Plan(layout, {"A": ("A", 0), "Bm": ("Bm", 0)},
                [KernelPhase("gemm+rs", gemm, [cmap], "rs", fused=True)], slots,
                [("C", (*chunks[r], 0, B))], arbitration="round-robin")
    return plan, {"A": a, "Bm": b}


def main(dtype: str) -> int:
    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    watchdog.open_board(comm)
    spec = load_device(str(DEVICE))
    dt = np.float16 if dtype == "fp16" else np.float32
    rng = np.random.default_rng([7, r])
    w = rng.integers(-1, 2, (M, K)).astype(dt)  # |sums| stay exact in fp16
    x = rng.integers(-1, 2, (K, B)).astype(dt)
    y = w.astype(np.float32) @ x.astype(np.float32)
    chunks = ring_chunks(M, n)
    opts = RunOptions(dtype, 60.0, record=True)
    ok, cases = True, []

    def check(name, got, want, res):
        nonlocal ok
        good = bool(np.array_equal(got.astype(np.float32), want))
        good = comm.allreduce(good, MPI.LAND)
        ev = _events(res)
        times_ok = all(e >= s >= 0 for _, _, s, e in ev) and res.end > 0
        times_ok = comm.allreduce(times_ok, MPI.LAND)
        if r == 0:
            print(f"{name}: data {'OK' if good else 'WRONG'}, {len(ev)} events, end "
                  f"{res.end * 1e6:.3f} us", flush=True)
        ok = ok and good and times_ok
        cases.append(name)
        return ev

    plan, inputs = gemv_allreduce(comm, spec, dt, w, x)
    res = run_plan(comm, plan, spec, "gemv-allreduce", inputs, opts)
    want = np.empty_like(y)
    comm.Allreduce(y, want, op=MPI.SUM)
    ev = check("gemv-allreduce", res.result, want, res)
    tracks = {e[0] for e in ev}
    launches = [e for e in ev if e[0] == "launch"]
    # two kernels, each paying the device's 2 us launch; the reduction after the GEMV's slots
    assert [e[1] for e in launches] == ["gemv", "reduce"], launches
    assert all(abs(e[3] - e[2] - spec.launch_s) < 1e-15 for e in launches)
    assert n == 1 or any(t.startswith("link->") for t in tracks), tracks
    assert res.phases["reduce"][0] >= res.phases["gemv"][1]

    if n > 1:
        plan, inputs = persistent_nic(comm, spec, dt, w, x)
        res = run_plan(comm, plan, spec, "persistent-nic", inputs, opts)
        every = comm.allgather(y)
        want = np.concatenate([every[s][chunks[r][0]:chunks[r][1]]
                               for s in [(r + k) % n for k in range(1, n)]])
        ev = check("persistent-nic", res.result, want, res)
        tracks = {e[0] for e in ev}
        assert {"wg0", "wg1", "wg2", "nic"} <= tracks, tracks
        puts = [e for e in ev if e[0] == "nic"]
        assert len(puts) == n - 1, puts  # one put per peer's slice, by its last WG
        # remote-first order: every put leaves before the WGs finish the local chunk
        assert max(e[2] for e in puts) <= res.end

    a = rng.integers(-1, 2, (M, K)).astype(dt)
    bm = rng.integers(-1, 2, (K, B)).astype(dt)
    plan, inputs = cu_rs(comm, spec, dt, a, bm)
    res = run_plan(comm, plan, spec, "cu-rs", inputs, opts)
    part = a.astype(np.float32) @ bm.astype(np.float32)
    want = np.empty((chunks[r][1] - chunks[r][0], B), np.float32)
    comm.Reduce_scatter(part, want, recvcounts=[(b1 - b0) * B for b0, b1 in chunks],
                        op=MPI.SUM)
    ev = check("cu-rs", res.result, want, res)
    assert n == 1 or len([e for e in ev if e[0] == "cu-kernel"]) == n - 1, ev
    watchdog.close_board()
    if r == 0 and ok:
        print(f"MECHANISMS OK {' '.join(cases)} on {n} ranks {dtype}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
