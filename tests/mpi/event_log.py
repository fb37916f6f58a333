"""The whole modelled event log of one toy configuration per executor kind, against a
log computed by hand (SimPy-style timeline tests), plus the data against numpy.

usage: event_log.py [CASE ...]   (2 ranks; no CASE: every case of ``CASES``)

Each case is a two-rank plan built directly against the engine API (as
tests/mpi/mechanisms.py and run/configs/pull_ag_gemm.py build theirs) on the toy
device tests/data/event-log.toml (fp32). For every rank, every event the run
records (``RankResult.events`` as (track, name, start, end)) is compared with a
list derived in this file from the device's numbers, read from the TOML here,
and the formulas as docs/design.md and the docstrings of emulator/model/*.py
state them. Nothing here calls the emulator's cost, clock or transfer code to
get an expected time: the arithmetic is written out, one comment per event
naming the formula. Times match within a relative 1e-9 (absolute 1e-15 s).

Cases (r = this rank, o = the other one; chunk c = rows 128c..128c+128 of a
256 x 256 output, two 128 x 128 tiles; K = 64; S = 2 WG slots per stage, so one
chunk is one stage; every phase pays the 1 us launch):

- wg-stores:   C = A @ B; the WGs of stage 0 update chunk o straight into rank o
               (``remote_map``); chunk r is tracked after 2 writes (reduce-scatter).
- store-queue: wg-stores with a tile per stage on a slow link, the store queue one
               stage's own stores: each stage is held until the stores of the stage
               before it have left (the link pushes back a wave behind).
- dma-push:    the same reduce-scatter, chunk o's two tiles pushed as updates by
               DMA engines 0 and 1 at once (``dma_map``), round-robin arbitration;
               the peer's updates landing while stage 1 writes take half the HBM from
               it (reserved after it in program order), and the stage's displaced
               bytes are served after it.
- loaded-latency: dma-push with a latency-bound GEMM kernel: stage 1's loads wait
               behind the DMA reads queued in the DRAM (loaded latency).
- pull:        AG -> GEMM: rank r's A rows are resident; DMA engine 0 writes a flag to
               rank o (``flag_map``), rank o pulls the rows with DMA engine 1
               (``pull_map``); every GEMM WG is gated on the A rows it reads.
- wave-slots:  the pull case with each stage holding an own tile and a pulled one: each
               stage splits into two groups, each taking the stage's compute; stage 1's
               own tile starts on its WG slot as soon as stage 0's own tile frees it,
               while stage 0's pulled tile still waits for its rows.
- flag:        a GEMM whose chunk r raises a flag at rank o once written; rank r's
               stage 1 is gated on the flag rank o raises (no data moves).
- nic:         on two nodes of one GPU (each node's NIC the device's ``[nic]``, into a
               fabric), chunk o is sent to rank o's receive buffer R by a NIC put
               (issue cost; the route: the NIC's rate and latency), R tracked at rank o.
- cu-executor: reduce-scatter whose chunk o is sent by a concurrent CU kernel on half
               the CUs, adding a local input X on the way (``Executor("cu", 0.5)``,
               ``adds=``).
- cu-prioritised, cu-plain: a GEMM beside a CU kernel pushing a resident block, its
               blocks dispatched first (holding half the CUs, and the L2's bandwidth its
               loads and stores take, until it ends) or after the GEMM launch's last wave
               is (section 6b).
- cu-steps:    a ``StepsPhase`` CU kernel: send X to rank o, wait for rank o's X,
               land it, add both into Z.
- persistent:  a persistent GEMM with P = 3 physical WGs; own tiles first, then the
               tiles of chunk o stored straight into rank o's R; WG 0 and WG 1 poll
               the two R tiles (exit flags) before the kernel ends.
- persistent-puts: on two nodes, a persistent GEMM (P = 3) whose WGs share the HBM
               per round (``fair_share``), its chunk o NIC-put to rank o's R: each WG on
               its own track, the WG that writes chunk o's last tile pays the put's issue.
- launch-wait: an all-reduce in two kernels: the GEMM's WGs store every tile into
               both ranks' slot buffer S; an elementwise kernel waits (``waits``) for
               both blocks of S, pays its launch, and sums them into Z.

- self-slots:  launch-wait with the S map also in the GEMM phase, so the S blocks'
               completions are computed there: the own block, written by this
               rank's own WGs into another local buffer, completes with those local
               writes and is not landed as if a peer had written it (this case found
               that the engine did; fixed).

Prints ``EVENT-LOG OK <case> (<n> events per rank)`` per matching case and
``EVENT-LOG MISMATCH <case>`` (with expected vs got side by side, per rank)
otherwise; exits non-zero if any case mismatched. Ends with ``EVENT-LOG DONE``.
"""

from __future__ import annotations

import math

import sys
import tomllib
from pathlib import Path

import numpy as np
from mpi4py import MPI

from devices.commands import Executor
from devices.regions import tile_grid
from devices.spec import load_device
from emulator.model.dram import Dram
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.kernel import Kernel, make_wgs
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.producers import Elementwise, Source, TiledGemm
from emulator.engine.runner import RunOptions, run_plan
from emulator.engine.steps import CuStep
from emulator.runtime import watchdog

DEVICE = Path(__file__).resolve().parents[1] / "data" / "event-log.toml"

# ---------------------------------------------------------------- the device, by hand
# Read from the TOML and converted to SI units here (not through devices.spec).
_D = tomllib.loads(DEVICE.read_text())
CUS = _D["compute"]["cus"]  # 2
CLOCK = _D["compute"]["clock_ghz"] * 1e9  # 1 GHz
FPC = _D["compute"]["fp32_flops_per_cycle_per_cu"]  # 1024
VFPC = _D["compute"]["fp32_vector_flops_per_cycle_per_cu"]  # 8
TM, TN = _D["compute"]["wg_tile_m"], _D["compute"]["wg_tile_n"]  # 128 x 128
WGS_PER_CU = _D["compute"]["wgs_per_cu"]  # 1
LAUNCH = _D["compute"]["launch_us"] * 1e-6  # 1 us
L2 = _D["memory"]["l2_mb"] * (1 << 20)  # 16 MiB
BW = _D["memory"]["hbm_gb_per_s"] * 1e9  # 1000 GB/s
UPD = _D["memory"]["nmc_update_cost"]  # 2: an update costs 2 writes
SETUP = _D["dma"]["setup_ns"] * 1e-9  # 100 ns
L = _D["interconnect"]["link_gb_per_s_per_direction"] * 1e9  # 100 GB/s
LAT = _D["interconnect"]["link_latency_ns"] * 1e-9  # 1 us
NIC_BW = _D["nic"]["gb_per_s"] * 1e9  # 50 GB/s
NIC_LAT = _D["nic"]["latency_ns"] * 1e-9  # 2 us
NIC_ISSUE = _D["nic"]["issue_ns"] * 1e-9  # 100 ns per put (or flag put)

# the DRAM's read/write turnaround: DramSpec's defaults (the TOML has no [dram] section):
# tWTR + tRTW = 14 ns per batch of 12 writes of 64 B, one channel per 32 GB/s of HBM
CHANNELS = round(BW / 32e9)  # 31
TURN = 14e-9 * BW / CHANNELS / (12 * 64)  # extra bytes of channel time per byte written
# while a GEMM stage reads (a communication write's turnaround) = 0.588

E = 4  # fp32 bytes per element
F = CUS * CLOCK * FPC  # dense FLOP/s: cus x clock x flops_per_cycle_per_cu = 2.048e12
FV = CUS * CLOCK * VFPC  # vector FLOP/s = 1.6e10
S = CUS * WGS_PER_CU  # WG slots per stage = 2

M = N = 256  # output
K = 64  # inner dimension
TILE = TM * TN * E  # bytes of one 128 x 128 output tile = 65536
A_PANEL = TM * K * E  # an A row panel (h kK e) = 32768
B_PANEL = K * TN * E  # a B column panel (kK w e) = 32768
WG_FLOPS = 2 * TM * TN * K  # 2 h w kK
WG_S = WG_FLOPS * S / F  # a WG in an ordinary stage: 2 h w kK x S / F = 2.048 us
# a stage = one tile row: distinct panels U = 1 A panel + 2 B panels; reads = U + max(0,
# 1 - L2/U) x (R - U) = U since the L2 holds them (outputs bypass it: TiledGemm default)
STAGE_READS = A_PANEL + 2 * B_PANEL
assert L2 >= STAGE_READS
STAGE_CAP = STAGE_READS / WG_S  # the stage's reads stream at most at reads/compute = 48 GB/s

RTOL, ATOL = 1e-9, 1e-15
CHUNK = 128


def chunk(c: int) -> tuple[int, int, int, int]:
    return (CHUNK * c, CHUNK * c + CHUNK, 0, N)


def tiles_of(c: int) -> list[tuple[int, int, int, int]]:
    r0, r1, _, _ = chunk(c)
    return [(r0, r1, 0, TN), (r0, r1, TN, 2 * TN)]


def nm(buffer: str, region) -> str:
    """A tracked region's name, as a map names its signal: buffer + [r0, r1, c0, c1]."""
    return f"{buffer}{list(region)}"


def inputs_of(case: int, rank: int, **shapes) -> dict[str, np.ndarray]:
    """Rank ``rank``'s seeded inputs in {-1, 0, 1} (every rank can rebuild every rank's)."""
    rng = np.random.default_rng([case, rank])
    return {name: rng.integers(-1, 2, shape).astype(np.float32) for name, shape in shapes.items()}


# ---------------------------------------------------------------- building blocks
def _space(slots: Slots, name: str, blocks, cols: int, tm: int = TM, tn: int = TN) -> TileSpace:
    tiles = tile_grid(blocks, cols, tm, tn)
    return TileSpace(name, tiles, slots.alloc(f"{name} tile", len(tiles)))


def _gemm(spec, space: TileSpace, order_tiles, a="A", b="Bm", kernel=None, **kw) -> Kernel:
    ids = [space.tile_at(t) for t in order_tiles]
    wgs, wg_tile = make_wgs(space, ids, K, 1)
    return Kernel(TiledGemm(a, b, kernel=kernel), space, wgs, wg_tile, np.arange(len(wgs)),
                  kw.pop("stage_size", spec.wgs_per_stage), **kw)


GEMM_LAYOUT = [("A", (M, K), np.float32), ("Bm", (K, N), np.float32), ("C", (M, N), np.float32)]
GEMM_INPUTS = {"A": ("A", 0), "Bm": ("Bm", 0)}


def _matmul(case: int, rank: int, **extra) -> np.ndarray:
    x = inputs_of(case, rank, A=(M, K), Bm=(K, N), **extra)
    return x["A"] @ x["Bm"]


# ================================================================ 1. WG stores
def wg_stores_plan(spec, r, o):
    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    gemm = _gemm(spec, cspace, tiles_of(o) + tiles_of(r))  # stage 0: chunk o, stage 1: chunk r
    cmap = AddressMap(cspace, r, 2, "update", gemm.local_writes())
    cmap.remote_map(chunk(o), o, op="update")  # the producing WG updates rank o's chunk o
    cmap.track(chunk(r), after=2)  # own write + rank o's
    plan = Plan(GEMM_LAYOUT, GEMM_INPUTS, [KernelPhase("wg-stores", gemm, [cmap], "rs")], slots,
                [("C", chunk(r))])
    x = inputs_of(1, r, A=(M, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def wg_stores_want(r, o):
    rows = slice(*chunk(r)[:2])
    return _matmul(1, 0)[rows] + _matmul(1, 1)[rows]


def wg_stores_log(r, o):
    t = LAUNCH  # launch_s, from t = 0
    s0_read = t + WG_S  # stage 0: reads at reads/compute end with the compute
    s0_link = s0_read + 2 * TILE / L  # send: 2 remote tiles on link->o from the read end
    s0_end = s0_link  # the group ends at max(writes (none local), link stores)
    arr = s0_link + LAT  # rank o's stage-0 tiles arrive here: link end + lat (symmetric)
    s1_end = s0_end + WG_S + UPD * 2 * TILE / BW  # stage 1: read phase, then 2 local updates (u B)
    land_from = arr - 2 * TILE / L  # land: streams into the HBM from arrival - B/L
    absorbed = land_from + UPD * 2 * TILE / BW  # ... costing u B at the full (idle) HBM
    assert absorbed <= s0_end  # (the HBM is idle before stage 1 starts)
    landed = max(arr, absorbed)  # usable at max(t_in, landed)
    done = max(s1_end, landed)  # trigger complete: max(local write, landing)
    return [
        ("launch", "wg-stores", 0.0, t),  # launch_us
        ("gemm", "stage 0", t, s0_end),  # compute, reads, link stores
        (f"link->{o}", "stage 0 stores", s0_read, s0_link),  # send(read end, 2 tiles)
        ("gemm", "stage 1", s0_end, s1_end),  # starts when stage 0 retired
        ("hbm", f"{nm('C', chunk(r))} remote updates land", arr, landed),  # land(arr, 2 tiles)
        ("tracker", f"{nm('C', chunk(r))} complete", done, done),  # max(local, landed)
    ]


# ================================================================ 1b. store queue
# wg-stores with one tile per stage (stage 0: tile A of chunk o, stage 1: tile B of chunk
# o, both stored into rank o's C by the producing WG; stages 2, 3: chunk r's tiles,
# updated locally), on a link cut to LQ = 20 GB/s so that a tile's stores (3.28 us on the
# link) take longer than a stage's compute (WG_S = 2.048 us), with the store queue of one
# stage (``Kernel.store_queue = STAGE``): a stage retires once its own stores have begun
# to leave, so stage 1 is held until stage 0's stores have left (the link pushes back a
# wave behind) and stage 2 until stage 1's have. Rank o's updates into chunk r are not
# tracked (no landing to time: the data still arrive, and are checked).
LQ = 20e9


def store_queue_plan(spec, r, o):
    from emulator.engine.kernel import STAGE

    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    gemm = _gemm(spec, cspace, tiles_of(o) + tiles_of(r), store_queue=STAGE, stage_size=1)
    cmap = AddressMap(cspace, r, 2, "update", gemm.local_writes(), local_ok=True)
    cmap.remote_map(chunk(o), o, op="update")
    plan = Plan(GEMM_LAYOUT, GEMM_INPUTS, [KernelPhase("store-queue", gemm, [cmap], "rs")],
                slots, [("C", chunk(r))])
    x = inputs_of(11, r, A=(M, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def store_queue_want(r, o):
    rows = slice(*chunk(r)[:2])
    return _matmul(11, 0)[rows] + _matmul(11, 1)[rows]


def store_queue_log(r, o):
    t = LAUNCH
    q = TILE / LQ  # one stage's stores on the link
    s0_read = t + WG_S  # stage 0: compute (its reads stream with it)
    s0_link = s0_read + q  # its tile leaves from its read end
    s0_end = s0_read  # retires once its stores began to leave (queue = its own bytes)
    s1_read = s0_end + WG_S
    s1_link = s0_link + q  # the link is stage 0's until s0_link
    s1_end = max(s1_read, s1_link - q)  # held until stage 0's stores have left
    assert s1_end == s0_link > s1_read
    s2_end = s1_end + WG_S + UPD * TILE / BW  # local update after its compute
    s3_end = s2_end + WG_S + UPD * TILE / BW
    return [
        ("launch", "store-queue", 0.0, t),
        ("gemm", "stage 0", t, s0_end),
        (f"link->{o}", "stage 0 stores", s0_read, s0_link),
        ("gemm", "stage 1", s0_end, s1_end),
        (f"link->{o}", "stage 1 stores", s1_read, s1_link),
        ("gemm", "stage 2", s1_end, s2_end),
        ("gemm", "stage 3", s2_end, s3_end),
    ]


# ================================================================ 2. DMA push, 2 engines
def dma_push_plan(spec, r, o, kernel=None):
    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    gemm = _gemm(spec, cspace, tiles_of(o) + tiles_of(r), kernel=kernel)
    cmap = AddressMap(cspace, r, 2, "update", gemm.local_writes())
    ta, tb = tiles_of(o)
    cmap.dma_map(ta, o, op="update", after=1, executor=Executor("dma", 0))
    cmap.dma_map(tb, o, op="update", after=1, executor=Executor("dma", 1))
    cmap.track(chunk(r), after=2)
    plan = Plan(GEMM_LAYOUT, GEMM_INPUTS,
                [KernelPhase("dma-push", gemm, [cmap], "rs", fused=True)], slots,
                [("C", chunk(r))], arbitration="round-robin")
    x = inputs_of(2, r, A=(M, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def dma_push_want(r, o):
    rows = slice(*chunk(r)[:2])
    return _matmul(2, 0)[rows] + _matmul(2, 1)[rows]


def dma_push_log(r, o, c0: float = WG_S, c1: float = WG_S):
    """``c0``, ``c1``: the compute of stage 0 and 1 (a WG's time: WG_S at the peak)."""
    ta, tb = tiles_of(o)
    t = LAUNCH
    s0_end = t + c0 + UPD * 2 * TILE / BW  # stage 0: read phase, then 2 local updates
    # command A (DMA engine 0), trigger = tile A after 1 write: complete at stage 0's end
    a_t0 = s0_end + SETUP  # dma_push: t0 = max(done, engine free) + setup
    a_read = a_t0 + TILE / (0.5 * BW)  # round-robin: comm gets half the HBM while a stage follows
    a_link = a_t0 + TILE / L  # link from t0
    a_end = max(a_read, a_link)  # end = max of both
    # command B (DMA engine 1): its own engine is free, so the same t0; its reads are
    # issued at once too. The DRAM queue (Q bytes) holds A's unserved bytes, so the part
    # of B beyond Q - TILE fills it and is served alone (beside A: the other half), the
    # rest follows A in the round-robin lane of half the HBM
    dram = Dram("x", BW, load_device(str(DEVICE)).dram)
    blk = max(0.0, 2 * TILE - dram.queue_bytes)
    b_t0 = s0_end + SETUP  # t0 = max(done, engine 1 free = 0) + setup
    b_read = a_read + (TILE - blk) / (0.5 * BW)
    b_link = a_link + TILE / L  # the one link to o is A's until a_link: B follows
    b_end = max(b_read, b_link)
    b_arr = b_end + LAT  # last of rank o's pushes into chunk r arrives (symmetric)
    # stage 1 from s0_end: reads at cap = reads / compute (at most the half A and B leave);
    # the HBM is full only while B's blocking bytes are served: the reads stall that long
    cap = STAGE_READS / c1
    assert cap <= 0.5 * BW
    s1_hbm = s0_end + STAGE_READS / cap + blk / (0.5 * BW)
    assert a_t0 + blk / (0.5 * BW) <= s1_hbm
    s1_read = max(s0_end + c1, s1_hbm)  # read phase ends at max(compute, reads)
    s1_end = s1_read + UPD * 2 * TILE / BW  # 2 local updates at the full HBM
    # track chunk r (after the last stage: no cap): rank o's updates land from b_arr - B/L,
    # offered burst by burst as they stream in; the last burst beside stage 1's reads
    land_from = b_arr - 2 * TILE / L
    cost_bytes = UPD * 2 * TILE
    nb = math.ceil(cost_bytes / dram.burst_bytes - 1e-9)
    last = land_from + (nb - 1) * (2 * TILE / L) / nb
    absorbed = last + (cost_bytes / nb) / (BW - cap if last < s1_hbm else BW)
    displaced = 0.0
    if s1_read <= last < s1_end:  # the last burst is offered while stage 1 writes at the
        # full HBM (reserved before it in program order): it takes round-robin's half of
        # it from the stage (Dram.preempt), whose displaced bytes are served after the
        # last stage (Dram.settle)
        assert last + (cost_bytes / nb) / (0.5 * BW) <= s1_end
        absorbed = last + (cost_bytes / nb) / (0.5 * BW)
        displaced = cost_bytes / nb
    landed = max(b_arr, absorbed)
    done = max(s1_end, landed)
    settle = ([("displaced", "displaced bytes", s1_end, s1_end + displaced / BW)] if displaced
              else [])
    return settle + [
        ("launch", "dma-push", 0.0, t),  # launch_us
        ("gemm", "stage 0", t, s0_end),  # compute, reads, updates
        ("tracker", f"{nm('C', ta)} complete", s0_end, s0_end),  # local write only (after=1)
        ("tracker", f"{nm('C', tb)} complete", s0_end, s0_end),
        ("dma", f"{nm('C', ta)} -> {o}", a_t0, a_end),  # dma_push on engine 0
        (f"link->{o}", f"dma {nm('C', ta)}", a_t0, a_link),
        ("dma", f"{nm('C', tb)} -> {o}", b_t0, b_end),  # dma_push on engine 1, at once
        (f"link->{o}", f"dma {nm('C', tb)}", b_t0, b_link),
        ("gemm", "stage 1", s0_end, s1_end),  # reads wait for the DMA reads
        ("hbm", f"{nm('C', chunk(r))} remote updates land", b_arr, landed),  # land
        ("tracker", f"{nm('C', chunk(r))} complete", done, done),
    ]


# ================================================================ 2b. loaded latency
# The dma-push plan with the GEMM kernel model's clock (emulator/model/gemm.py): a 128 x 128
# tile, K step 64 (the whole K: one step), 2 pipeline stages (one step's loads in flight),
# the main loop at the peak, and a latency of LAT0 = 3 us, longer than the step (WG_S):
# the K loop is latency-bound, a WG takes L (prologue) + 1 x max(WG_S, L / 1) = 2 L.
# Stage 0 runs on an idle queue: c0 = 2 LAT0. Stage 1 starts at stage 0's end while the
# two DMA reads (A, then B behind it in round-robin's lane) are queued: its loads wait
# behind their mean unserved bytes over its unloaded compute window [s0, s0 + c0]
# (Dram.queued), so its latency is LAT0 + queued / BW.
LAT0 = 3e-6


def _latency_kernel():
    from emulator.model.gemm import GemmKernel

    return GemmKernel(TM, TN, WGS_PER_CU, tile_k=K, stages=2, efficiency=1.0,
                      latency_s=LAT0, elem_bytes=E, modelled=True)


def loaded_plan(spec, r, o):
    return dma_push_plan(spec, r, o, kernel=_latency_kernel())


def loaded_log(r, o):
    c0 = 2 * LAT0  # L + max(WG_S, L): latency-bound
    assert LAT0 > WG_S
    s0_end = LAUNCH + c0 + UPD * 2 * TILE / BW
    a_t0 = s0_end + SETUP  # both DMA reads offered at once (each one burst: TILE <= 64 KiB)
    a_end = a_t0 + TILE / (0.5 * BW)  # A: served in round-robin's half from a_t0
    # B: the part beyond the queue's room (blk) is served alone beside A from a_t0, the rest
    # behind A in the lane (dma-push's arithmetic)
    blk = max(0.0, 2 * TILE - Dram("x", BW, load_device(str(DEVICE)).dram).queue_bytes)
    assert a_t0 + blk / (0.5 * BW) <= a_end
    b_end = a_end + (TILE - blk) / (0.5 * BW)
    w0, w1 = s0_end, s0_end + c0  # stage 1's unloaded compute window
    assert b_end <= w1
    # mean unserved bytes over the window: each burst is served evenly from its service
    # start (both a_t0) to its end, so it holds TILE x (end - a_t0) / 2 byte-seconds
    queued = (TILE * (a_end - a_t0) / 2 + TILE * (b_end - a_t0) / 2) / (w1 - w0)
    c1 = 2 * (LAT0 + queued / BW)  # the loaded latency, prologue and pipeline bound
    return dma_push_log(r, o, c0, c1)


# ================================================================ 3. pull after a flag
AG_TILE = CHUNK * K * E  # one rank's A rows: 128 x 64 fp32 = 32768 bytes


def pull_plan(spec, r, o, tiles=None):
    slots = Slots()
    aspace = _space(slots, "AG", [chunk(0)[:2], chunk(1)[:2]], K, TM, K)  # one tile per chunk
    flags = TileSpace("AG", aspace.tiles, slots.alloc("AG flag", len(aspace)))
    own, other = (*chunk(r)[:2], 0, K), (*chunk(o)[:2], 0, K)
    writes = np.zeros(len(aspace), np.int64)
    writes[aspace.tile_at(own)] = 1  # resident before the kernel
    amap = AddressMap(aspace, r, 2, "store", writes, incoming_op="store")
    arrived = {own: amap.flag_map(own, [o], flags),  # DMA engine 0 raises rank o's flag
               other: amap.pull_map(other, o, amap.flag_signal(flags, other),
                                    executor=Executor("dma", 1))}
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    gemm = _gemm(spec, cspace, tiles or tiles_of(r) + tiles_of(o), a="AG")
    gemm = gemm.with_gates({w: (arrived[(int(r0), int(r1), 0, K)],)
                            for w, (r0, r1) in enumerate(gemm.wgs[:, :2])})
    cmap = AddressMap(cspace, r, 2, "store", gemm.local_writes(), local_ok=True)
    preload = [([aspace.slot(aspace.tile_at(own))], [CHUNK * K])]
    layout = [("AG", (M, K), np.float32), ("Bm", (K, N), np.float32), ("C", (M, N), np.float32)]
    plan = Plan(layout, {"A": ("AG", CHUNK * r), "Bm": ("Bm", 0)},
                [KernelPhase("pull+gemm", gemm, [cmap, amap], "ag", fused=True, preload=preload)],
                slots, [("C", (0, M, 0, N))])
    x = inputs_of(3, r, A=(CHUNK, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def pull_want(r, o):
    a = np.concatenate([inputs_of(3, s, A=(CHUNK, K), Bm=(K, N))["A"] for s in (0, 1)])
    return a @ inputs_of(3, r, A=(CHUNK, K), Bm=(K, N))["Bm"]


def pull_log(r, o):
    own, other = (*chunk(r)[:2], 0, K), (*chunk(o)[:2], 0, K)
    t = LAUNCH
    own_done = t  # preload: the own rows are resident at the phase start
    flag_t0 = own_done + SETUP  # flag_put: t0 = max(done, engine free) + setup
    flag_arr = flag_t0 + LAT  # rank o's flag arrives here at t0 + lat (symmetric)
    s0_start = max(t, own_done)  # stage 0 (own rows) gated on the resident rows
    s0_end = s0_start + WG_S + 2 * TILE / BW  # read phase, then 2 stores
    pull_t0 = flag_arr + SETUP  # dma_pull: t0 = max(done = flag arrival, engine free) + setup
    link_start = pull_t0 + LAT  # the request reaches rank o
    link_end = link_start + AG_TILE / L  # the rows cross o -> r
    arrived = link_end + LAT  # last byte + lat
    hbm_from = max(link_start + LAT, arrived - AG_TILE / L)  # lands as it streams in
    assert hbm_from >= s0_end  # (the HBM is idle by then)
    landed = max(arrived, hbm_from + AG_TILE / BW)  # usable at max(arrived, landed)
    s1_start = max(s0_end, landed)  # stage 1 (rank o's rows) gated on the pull
    s1_end = s1_start + WG_S + 2 * TILE / BW
    return [
        ("launch", "pull+gemm", 0.0, t),  # launch_us
        ("tracker", f"{nm('AG', own)} complete", own_done, own_done),  # resident
        ("dma", f"flag {nm('AG', own)} -> {o}", own_done, flag_t0),  # flag_put
        ("gemm", "stage 0", s0_start, s0_end),
        ("tracker", f"AG flags{list(other)} complete", flag_arr, flag_arr),  # the peer's flag
        (f"link<-{o}", f"pull AG flags{list(other)}", link_start, link_end),  # dma_pull link
        ("dma", f"AG flags{list(other)} <- {o}", pull_t0, landed),  # engine busy until usable
        ("gemm", "stage 1", s1_start, s1_end),
    ]


def wave_plan(spec, r, o):
    """The pull case with each stage holding an own tile and a pulled one: own tile 0,
    rank o's tile 0 (stage 0), own tile 1, rank o's tile 1 (stage 1)."""
    own, other = tiles_of(r), tiles_of(o)
    return pull_plan(spec, r, o, [own[0], other[0], own[1], other[1]])


def wave_log(r, o):
    """Each stage splits into two groups (own rows: resident; rank o's: pulled). A group
    takes the stage's compute (WG_S: its WGs share the GPU with the other group's) and
    runs on its items' WG slots as soon as they are free: stage 1's own tile (slot 0)
    starts when stage 0's own tile ends, while stage 0's pulled tile (slot 1) still waits
    for its rows. Reads stream at reads / WG_S; a group's reads are its panels (an A panel
    and a B panel) x the stage's sharing (3 distinct panels of 4: 3/4)."""
    t = LAUNCH
    own_done = t  # resident at the phase start
    flag_t0 = own_done + SETUP
    flag_arr = flag_t0 + LAT
    pull_t0 = flag_arr + SETUP
    link_start = pull_t0 + LAT
    link_end = link_start + AG_TILE / L
    arrived = link_end + LAT
    hbm_from = max(link_start + LAT, arrived - AG_TILE / L)
    landed = max(arrived, hbm_from + AG_TILE / BW)
    cap = 0.75 * (A_PANEL + B_PANEL) / WG_S  # a stage-0 group's reads (no panel in the L2)
    a0, a1 = own_done, own_done + WG_S + TILE / BW  # stage 0 group 0, alone on the HBM
    c0 = a1  # stage 1 group 0: slot 0 free at a1 (stage 0's pulled tile not started)
    b0 = landed  # stage 0 group 1: gated on the pull
    # the pulled rows land at the whole rate from hbm_from (a burst, reserved before the
    # stages in program order), paying the turnaround as c reads alongside: c's reads
    # (at their cap, far under the rate) pause for it
    burst = AG_TILE * (1 + TURN) / BW
    assert c0 < hbm_from and hbm_from + burst < c0 + WG_S
    c_read = c0 + WG_S + burst
    assert b0 < c_read < b0 + WG_S  # c stores while b reads
    c1 = c_read + TILE / (BW - cap)  # its store shares the HBM with b's reads
    b1 = b0 + WG_S + TILE / BW  # alone on the HBM when it stores (c is done)
    assert c1 < b0 + WG_S
    d0 = b1  # stage 1 group 1: slot 1 free at b1 (its rows are in)
    d1 = d0 + WG_S + TILE / BW
    return [
        ("launch", "pull+gemm", 0.0, t),
        ("tracker", f"{nm('AG', chunk(r)[:2] + (0, K))} complete", own_done, own_done),
        ("dma", f"flag {nm('AG', chunk(r)[:2] + (0, K))} -> {o}", own_done, flag_t0),
        ("gemm", "stage 0 group 0", a0, a1),
        ("tracker", f"AG flags{list(chunk(o)[:2] + (0, K))} complete", flag_arr, flag_arr),
        (f"link<-{o}", f"pull AG flags{list(chunk(o)[:2] + (0, K))}", link_start, link_end),
        ("dma", f"AG flags{list(chunk(o)[:2] + (0, K))} <- {o}", pull_t0, landed),
        ("gemm", "stage 0 group 1", b0, b1),
        ("gemm", "stage 1 group 0", c0, c1),
        ("gemm", "stage 1 group 1", d0, d1),
    ]


# ================================================================ 4. flag only
def flag_plan(spec, r, o):
    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    flags = TileSpace("C", cspace.tiles, slots.alloc("C flag", len(cspace)))
    gemm = _gemm(spec, cspace, tiles_of(r) + tiles_of(o))
    cmap = AddressMap(cspace, r, 2, "store", gemm.local_writes(), local_ok=True)
    cmap.flag_map(chunk(r), [o], flags)  # chunk r written here -> a flag at rank o
    gate = cmap.flag_signal(flags, chunk(o))  # rank o's flag for its chunk o
    gemm = gemm.with_stage_gates({1: (gate,)})  # stage 1 (chunk o) waits for it
    plan = Plan(GEMM_LAYOUT, GEMM_INPUTS, [KernelPhase("flag", gemm, [cmap], "rs", fused=True)],
                slots, [("C", (0, M, 0, N))])
    x = inputs_of(4, r, A=(M, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def flag_want(r, o):
    return _matmul(4, r)


def flag_log(r, o):
    t = LAUNCH
    s0_end = t + WG_S + 2 * TILE / BW  # stage 0 (chunk r): read phase, then 2 stores
    flag_t0 = s0_end + SETUP  # flag_put: t0 = max(done, engine free) + setup
    flag_arr = flag_t0 + LAT  # rank o's flag arrives here at its t0 + lat (symmetric)
    s1_start = max(s0_end, flag_arr)  # stage 1 gated on that flag
    s1_end = s1_start + WG_S + 2 * TILE / BW
    return [
        ("launch", "flag", 0.0, t),  # launch_us
        ("gemm", "stage 0", t, s0_end),
        ("tracker", f"{nm('C', chunk(r))} complete", s0_end, s0_end),  # local writes
        ("dma", f"flag {nm('C', chunk(r))} -> {o}", s0_end, flag_t0),  # flag_put: done..t0
        ("gemm", "stage 1", s1_start, s1_end),  # max(CUs free, gate)
    ]


# ================================================================ 5. NIC put
def nic_plan(spec, r, o, name="nic", case=5, **kernel):
    """``kernel``: the GEMM kernel's options (a persistent grid: ``persistent_puts_plan``)."""
    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    rspace = _space(slots, "R", [(0, CHUNK)], N)  # rank o's chunk of rows for r, from o
    gemm = _gemm(spec, cspace, tiles_of(o) + tiles_of(r), **kernel)
    cmap = AddressMap(cspace, r, 2, "store", gemm.local_writes(), local_ok=True)
    cmap.dma_map(chunk(o), o, op="store", after=1, executor=Executor("nic"), to=rspace,
                 to_region=(0, CHUNK, 0, N))
    rmap = AddressMap(rspace, r, 2, "store", np.zeros(len(rspace), np.int64),
                      incoming_op="store")
    rmap.track((0, CHUNK, 0, N))
    layout = GEMM_LAYOUT + [("R", (CHUNK, N), np.float32)]
    plan = Plan(layout, GEMM_INPUTS, [KernelPhase(name, gemm, [cmap, rmap], "a2a", fused=True)],
                slots, [("C", chunk(r)), ("R", (0, CHUNK, 0, N))])
    x = inputs_of(case, r, A=(M, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def nic_want(r, o, case=5):
    rows = slice(*chunk(r)[:2])
    return np.concatenate([_matmul(case, r)[rows], _matmul(case, o)[rows]])


def nic_log(r, o):
    R = (0, CHUNK, 0, N)
    t = LAUNCH
    s0_read = t + WG_S  # stage 0 (chunk o): read phase
    s0_end = s0_read + 2 * TILE / BW + 2 * NIC_ISSUE  # 2 stores, + 2 nic_issue_s (put + flag)
    put = s0_end  # nic_put issued when the region is written
    put_read = put + 2 * TILE / BW  # the NIC's read of B at the (idle) HBM
    put_nic = put + 2 * TILE / NIC_BW  # B on the route: the NIC port
    put_end = max(put_read, put_nic)
    put_arr = put_end + NIC_LAT  # the flag, behind the data: end + the route's latency
    # stage 1 from s0_end: the NIC's read (ordered before it) holds the whole HBM until put_read
    s1_read = max(s0_end + WG_S, put_read + STAGE_READS / STAGE_CAP)
    s1_end = s1_read + 2 * TILE / BW  # 2 stores
    land_from = put_arr - 2 * TILE / L  # NIC data lands like any write: streamed at L
    assert land_from >= s1_end
    landed = max(put_arr, land_from + 2 * TILE / BW)  # stores: B at the idle HBM
    return [
        ("launch", "nic", 0.0, t),  # launch_us
        ("gemm", "stage 0", t, s0_end),  # the group that completes the NIC region issues
        ("tracker", f"{nm('C', chunk(o))} complete", s0_end, s0_end),  # local writes only
        ("link->" + str(o), f"put {nm('C', chunk(o))}", put, put_nic),  # the NIC port
        ("nic", f"put {nm('C', chunk(o))} -> {o}", put, put_end),  # nic_put
        ("gemm", "stage 1", s0_end, s1_end),
        ("hbm", f"{nm('R', R)} remote stores land", put_arr, landed),  # land at rank r
        ("tracker", f"{nm('R', R)} complete", landed, landed),
    ]


# ================================================================ 6. CU executor
SHARE = 0.5


def cu_executor_plan(spec, r, o):
    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    gemm = _gemm(spec, cspace, tiles_of(o) + tiles_of(r))
    cmap = AddressMap(cspace, r, 2, "update", gemm.local_writes())
    cmap.dma_map(chunk(o), o, op="update", after=1, executor=Executor("cu", share=SHARE),
                 adds=[("X", (0, CHUNK, 0, N))])
    cmap.track(chunk(r), after=2)
    layout = GEMM_LAYOUT + [("X", (CHUNK, N), np.float32)]
    plan = Plan(layout, {**GEMM_INPUTS, "X": ("X", 0)},
                [KernelPhase("cu-executor", gemm, [cmap], "rs", fused=True)], slots,
                [("C", chunk(r))])
    return plan, inputs_of(6, r, A=(M, K), Bm=(K, N), X=(CHUNK, N))


def cu_executor_want(r, o):
    rows = slice(*chunk(r)[:2])
    x = [inputs_of(6, s, A=(M, K), Bm=(K, N), X=(CHUNK, N)) for s in (0, 1)]
    # own product + rank o's product of these rows + rank o's X (added by its CU kernel)
    return (x[r]["A"] @ x[r]["Bm"])[rows] + (x[o]["A"] @ x[o]["Bm"])[rows] + x[o]["X"]


def cu_executor_log(r, o):
    t = LAUNCH
    comp = WG_S / (1 - SHARE)  # the producer's compute / (1 - share) for the whole phase
    cap = STAGE_READS / comp  # reads at most at reads/compute
    s0_end = t + comp + UPD * 2 * TILE / BW  # stage 0 (chunk o): read phase, 2 updates
    # cu_send at t0 = max(done, CU kernel free): read 2 copies (chunk + X), add, send
    c_t0 = s0_end
    c_reads = c_t0 + 2 * 2 * TILE / BW  # copies x B at the (idle) HBM
    c_adds = c_t0 + (2 - 1) * 2 * TILE / E / (SHARE * FV)  # (n-1) B/e FLOPs at share x Fv
    c_read = max(c_reads, c_adds)
    c_link = c_t0 + 2 * TILE / L  # the result leaves from t0
    c_end = max(c_read, c_link)  # end = max(reads, link)
    c_arr = c_end + LAT
    # stage 1 from s0_end: no HBM until the CU kernel's reads end, then at cap
    s1_read = max(s0_end + comp, c_reads + STAGE_READS / cap)
    s1_end = s1_read + UPD * 2 * TILE / BW
    land_from = c_arr - 2 * TILE / L  # rank o's sum streams in from arrival - B/L
    absorbed = land_from + UPD * 2 * TILE / (BW - cap)  # beside stage 1's reads
    assert c_reads <= land_from and absorbed <= c_reads + STAGE_READS / cap
    landed = max(c_arr, absorbed)
    done = max(s1_end, landed)
    return [
        ("launch", "cu-executor", 0.0, t),  # launch_us
        ("gemm", "stage 0", t, s0_end),  # compute slowed by 1/(1 - share)
        ("tracker", f"{nm('C', chunk(o))} complete", s0_end, s0_end),  # local writes only
        (f"link->{o}", f"cu {nm('C', chunk(o))}", c_t0, c_link),  # cu_send: send from t0
        ("cu-kernel", f"{nm('C', chunk(o))} -> {o}", c_t0, c_end),  # cu_send
        ("gemm", "stage 1", s0_end, s1_end),
        ("hbm", f"{nm('C', chunk(r))} remote updates land", c_arr, landed),  # land
        ("tracker", f"{nm('C', chunk(r))} complete", done, done),
    ]


# ================================================================ 6b. CU dispatch
# A GEMM (stage 0: chunk o's 2 tiles, stage 1: chunk r's) beside a CU kernel of half the CUs
# that pushes this rank's resident X block (256 x 256 fp32 = 4 tiles, 256 KiB, preloaded)
# into the peer's X at the same rows; the peer's block is tracked here (a sink).
# prioritised: the push comes first in program order and its blocks hold their CUs from
#   the start until it ends; the GEMM runs the kernel model's clock with an L2 of
#   XL2 = 160 GB/s (a step's panels: 2 x (128 + 128) x 64 x 4 B), so stage 0 runs on half
#   the CUs and with the L2 less the push's loads and stores, 2 x its bytes spread evenly
#   over its transfer, averaged over the stage's window; stage 1 (after the push ended) on
#   every CU and the whole L2;
# plain: the push's blocks wait for the GEMM launch's last wave (stage 1) to start; the
#   GEMM holds every CU.
XR = 256  # rows (and columns) of a rank's X block
XB4 = XR * N * E  # its bytes: 262144
XL2 = 160e9  # the modelled kernel's L2 bandwidth (bytes/s)
STEP_L2 = S * (TM + TN) * K * E  # a K step's panel loads of the whole wave: 131072 bytes


def _l2_kernel():
    from emulator.model.gemm import GemmKernel

    return GemmKernel(TM, TN, WGS_PER_CU, tile_k=K, stages=2, efficiency=1.0, l2_bw=XL2,
                      elem_bytes=E, modelled=True)


def _xs(c: int) -> tuple[int, int, int, int]:
    return (XR * c, XR * c + XR, 0, N)


def cu_dispatch_plan(spec, r, o, dispatch):
    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    gemm = _gemm(spec, cspace, tiles_of(o) + tiles_of(r),
                 kernel=_l2_kernel() if dispatch == "prioritised" else None)
    cmap = AddressMap(cspace, r, 2, "store", gemm.local_writes(), local_ok=True)
    xspace = _space(slots, "X", [_xs(0)[:2], _xs(1)[:2]], N)
    own = xspace.tiles_in(_xs(r))
    writes = np.zeros(len(xspace), np.int64)
    writes[own] = 1
    xmap = AddressMap(xspace, r, 2, "store", writes, incoming_op="store", local_ok=True)
    xmap.dma_map(_xs(r), o, op="store", after=1,
                 executor=Executor("cu", 0, SHARE, dispatch=dispatch))
    xmap.track(_xs(o), after=1)
    preload = [([xspace.slot(t) for t in own], [xspace.elems(t) for t in own])]
    layout = GEMM_LAYOUT + [("X", (2 * XR, N), np.float32)]
    plan = Plan(layout, {**GEMM_INPUTS, "X": ("X", XR * r)},
                [KernelPhase(f"cu-{dispatch}", gemm, [cmap, xmap], "ag", fused=True,
                             preload=preload)], slots, [("X", (0, 2 * XR, 0, N))])
    return plan, inputs_of(11, r, A=(M, K), Bm=(K, N), X=(XR, N))


def cu_dispatch_want(r, o):
    return np.concatenate([inputs_of(11, s, A=(M, K), Bm=(K, N), X=(XR, N))["X"]
                           for s in (0, 1)])


def _cu_push_log(r, o, t0: float):
    """The push (cu_send at t0: 4 bursts of reads at the HBM, the link from t0), and the
    peer's push landing here (symmetric: arrival = its end + LAT; its bursts absorbed
    before that)."""
    end = t0 + XB4 / L  # the link decides (reads: 4 x 64 KiB at ~1 TB/s)
    arrival = end + LAT
    return end, arrival, [
        ("tracker", f"{nm('X', _xs(r))} complete", LAUNCH, LAUNCH),  # resident: preloaded
        # when the phase's kernel starts
        (f"link->{o}", f"cu {nm('X', _xs(r))}", t0, end),
        ("cu-kernel", f"{nm('X', _xs(r))} -> {o}", t0, end),
        ("hbm", f"{nm('X', _xs(o))} remote stores land", arrival, arrival),
        ("tracker", f"{nm('X', _xs(o))} complete", arrival, arrival),
    ]


def cu_prioritised_log(r, o):
    t = LAUNCH
    end, _, push = _cu_push_log(r, o, t)  # first in program order: from the start
    # stage 0 on half the CUs, from t: the window of its compute without the L2's loss
    alone = max(WG_S, STEP_L2 / XL2) / (1 - SHARE)  # (one K step; L2 bound 0.82 us < WG_S)
    assert end < t + alone  # the push's loads and stores, all inside the window
    taken = 2 * XB4 / alone  # its L2 bytes/s over [t, t + alone]: 128 GB/s
    assert taken < XL2
    c0 = max(WG_S, STEP_L2 / (XL2 - taken)) / (1 - SHARE)
    assert c0 > alone  # the L2 bound now decides
    # its reads (at most reads / c0) find the HBM busy with the push's reads (4 bursts at
    # the full HBM from t, reserved first): they stream from t + XB4 / BW, then the stores
    s0_end = t + XB4 / BW + c0 + 2 * TILE / BW
    c1 = max(WG_S, STEP_L2 / XL2)  # after the push: every CU, the whole L2
    s1_end = s0_end + c1 + 2 * TILE / BW
    return push + [
        ("launch", "cu-prioritised", 0.0, t),
        ("gemm", "stage 0", t, s0_end),
        ("gemm", "stage 1", s0_end, s1_end),
    ]


def cu_plain_log(r, o):
    t = LAUNCH
    s0_end = t + WG_S + 2 * TILE / BW  # every CU: the push waits
    s1_end = s0_end + WG_S + 2 * TILE / BW
    _, _, push = _cu_push_log(r, o, s0_end)  # from the last wave's start (stage 1)
    return push + [
        ("launch", "cu-plain", 0.0, t),
        ("gemm", "stage 0", t, s0_end),
        ("gemm", "stage 1", s0_end, s1_end),
    ]


# ================================================================ 7. StepsPhase CU kernel
XB = CHUNK * N * E  # X: 128 x 256 fp32 = 131072 bytes


def cu_steps_plan(spec, r, o):
    slots = Slots()
    ybase = slots.alloc("Y block", 2)
    x_all = (0, CHUNK, 0, N)
    steps = [
        CuStep("send", "ag", [("X", x_all)], ("Y", chunk(r)), o, signal_slots=[ybase + r],
               signal_elems=[CHUNK * N]),
        CuStep("sum", "ag", [("X", x_all), ("Y", chunk(o))], ("Z", x_all), r,
               wait=slots.region(f"Y from {o}", [ybase + o], [CHUNK * N]), wait_bytes=XB),
    ]
    layout = [("X", (CHUNK, N), np.float32), ("Y", (M, N), np.float32),
              ("Z", (CHUNK, N), np.float32)]
    plan = Plan(layout, {"X": ("X", 0)}, [StepsPhase("cu-steps", steps)], slots, [("Z", x_all)])
    return plan, inputs_of(7, r, X=(CHUNK, N))


def cu_steps_want(r, o):
    return inputs_of(7, 0, X=(CHUNK, N))["X"] + inputs_of(7, 1, X=(CHUNK, N))["X"]


def cu_steps_log(r, o, frac: float = 1.0):
    """``frac``: the library fraction of the link peak the CU kernel's send achieves."""
    t = LAUNCH
    send_read = t + XB / BW  # read X at the HBM
    send_link = t + XB / (frac * L)  # a remote result is sent while the reads stream, holding
    # the link for B / frac bytes' time
    send_end = max(send_read, send_link)
    arr = send_end + LAT  # rank o's X arrives here (symmetric)
    land_from = arr - XB / L  # land: streams into the HBM from arrival - B/L
    # a store: offered to the HBM burst by burst as it streams in at L, each burst then
    # served at BW (idle after send_read): the last burst is offered at the arrival
    # less one burst's streaming time
    burst = Dram("x", BW, load_device(str(DEVICE)).dram).burst_bytes
    nb = math.ceil(XB / burst - 1e-9)
    absorbed = land_from + (nb - 1) * (XB / nb) / L + (XB / nb) / BW
    assert land_from >= send_read
    ready = max(send_end, max(arr, absorbed))  # wait for the received region, landed
    sum_read = ready + 2 * XB / BW  # read both copies
    sum_end = sum_read + XB / BW  # a local result is written after the reads
    return [
        ("launch", "cu-steps", 0.0, t),  # launch_us
        (f"link->{o}", "send", t, send_link),  # send
        ("ag", "send", t, send_end),  # max(reads, link)
        # the CU kernel's wait logs the HBM's absorption (log_hbm_end): from the first
        # byte's landing (arrival - B/L) until absorbed (here before the last byte arrives)
        ("hbm", "sum received data lands", land_from, absorbed),
        ("ag", "sum", ready, sum_end),
    ]


# ================================================================ 8. persistent kernel
P = 3  # physical WGs


def persistent_plan(spec, r, o):
    slots = Slots()
    cspace = _space(slots, "C", [chunk(0)[:2], chunk(1)[:2]], N)
    rspace = _space(slots, "R", [(0, CHUNK)], N)
    rmap = AddressMap(rspace, r, 2, "store", np.zeros(len(rspace), np.int64),
                      incoming_op="store")
    flags = tuple(rmap.track(t) for t in tiles_of(0))  # R's two tiles: WG 0 and WG 1 poll
    gemm = _gemm(spec, cspace, tiles_of(r) + tiles_of(o), stage_size=P, persistent=True,
                 exit_waits=flags)
    cmap = AddressMap(cspace, r, 2, "store", gemm.local_writes(), local_ok=True)
    cmap.remote_map(chunk(o), o, op="store", to=rspace, to_region=(0, CHUNK, 0, N))
    layout = GEMM_LAYOUT + [("R", (CHUNK, N), np.float32)]
    plan = Plan(layout, GEMM_INPUTS,
                [KernelPhase("persistent", gemm, [cmap, rmap], "a2a", fused=True)], slots,
                [("C", chunk(r)), ("R", (0, CHUNK, 0, N))])
    x = inputs_of(8, r, A=(M, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def persistent_want(r, o):
    rows = slice(*chunk(r)[:2])
    return np.concatenate([_matmul(8, r)[rows], _matmul(8, o)[rows]])


def persistent_log(r, o):
    r0, r1 = tiles_of(0)  # R's tiles
    t = LAUNCH
    wg = WG_FLOPS * max(P, CUS) / F  # a persistent WG has F / max(P, CUs): 3.072 us
    reads = A_PANEL + B_PANEL  # one tile: its A panel and B panel
    cap = reads / wg  # at most reads/compute
    # round 0: tasks 0, 1 (chunk r, local stores), 2 (chunk o col 0, stored into rank o)
    rd = t + wg  # all three read phases end together (3 x cap << BW)
    w0_end = rd + TILE / BW  # task 0's store: the HBM is free
    w1_end = w0_end + TILE / BW  # task 1's store after task 0's (full-rate writes queue)
    w2_link = rd + TILE / L  # task 2: no local write; its tile leaves on link->o at the read end
    w2_end = w2_link
    arr2 = w2_link + LAT  # rank o's task 2 arrives in R tile 0 here (symmetric)
    # round 1: task 3 (chunk o col 1) on WG 0 from w0_end; task 1's store holds the HBM
    # until w1_end, then the reads stream at cap
    w3_read = max(w0_end + wg, w1_end + reads / cap)
    w3_link = w3_read + TILE / L  # link->o free again: send from the read end
    w3_end = w3_link
    arr3 = w3_link + LAT  # rank o's task 3 arrives in R tile 1
    cu_free = max(w3_end, w1_end, w2_end)  # the kernel's WGs done with their tasks
    wg_end = max(w3_end, arr2, w1_end, arr3, w2_end)  # WG 0 polls R tile 0, WG 1 R tile 1
    # R tile 0 lands from arr2 - B/L beside task 3's reads; R tile 1 at the idle HBM
    l0_from = arr2 - TILE / L
    assert w1_end <= l0_from and l0_from + TILE / (BW - cap) <= w3_read
    landed0 = max(arr2, l0_from + TILE / (BW - cap))
    l1_from = arr3 - TILE / L
    assert l1_from >= w3_read
    landed1 = max(arr3, l1_from + TILE / BW)
    return [
        ("launch", "persistent", 0.0, t),  # launch_us
        ("wg0", "task 0", t, w0_end),  # read phase, store
        ("wg1", "task 1", t, w1_end),  # read phase, store after task 0's
        ("wg2", "task 2", t, w2_end),  # read phase, link store
        (f"link->{o}", "stage 0 stores", rd, w2_link),  # send
        ("wg0", "task 3", w0_end, w3_end),  # task i on WG i mod P, from its WG's end
        (f"link->{o}", "stage 1 stores", w3_read, w3_link),  # send
        ("tracker", "exit flags polled", cu_free, wg_end),  # each WG its flags j, j+P
        ("hbm", f"{nm('R', r0)} remote stores land", arr2, landed0),  # land
        ("tracker", f"{nm('R', r0)} complete", landed0, landed0),
        ("hbm", f"{nm('R', r1)} remote stores land", arr3, landed1),
        ("tracker", f"{nm('R', r1)} complete", landed1, landed1),
    ]


# ================================================================ 8b. per-WG puts
def persistent_puts_plan(spec, r, o):
    """On two nodes: a fair-share persistent GEMM (P = 3) whose chunk o is NIC-put to rank
    o's R once written (the nic case's plan); the WG that writes chunk o's last tile
    issues the put."""
    return nic_plan(spec, r, o, "persistent-puts", 9, stage_size=P, persistent=True,
                    fair_share=True)


def persistent_puts_want(r, o):
    return nic_want(r, o, 9)


def persistent_puts_log(r, o):
    R = (0, CHUNK, 0, N)
    t = LAUNCH
    wg = WG_FLOPS * max(P, CUS) / F  # a persistent WG has F / max(P, CUs)
    # round 0: tasks 0, 1 (chunk o), 2 (chunk r col 0) on WGs 0, 1, 2, served together
    # (fair share): distinct panels 2 A + 2 B (the L2 holds them) at most at reads /
    # compute, then the 3 tiles' stores at the HBM
    reads0 = 2 * A_PANEL + 2 * B_PANEL
    assert reads0 / wg < BW
    end0 = t + wg + 3 * TILE / BW
    put = end0 + 2 * NIC_ISSUE  # WG 1 writes chunk o's last tile: it issues the put (+ flag)
    # the put (after round 0 in program order): the NIC reads B at the idle HBM and sends it
    # on its port; the flag follows the data: end + the route's latency
    put_end = max(put + 2 * TILE / BW, put + 2 * TILE / NIC_BW)
    put_arr = put_end + NIC_LAT
    # round 1: task 3 (chunk r col 1) on WG 0 from its end; its panels (A of chunk r, B col 1)
    # are the previous round's, all in the L2: no DRAM reads; its compute, then its store
    end1 = end0 + wg + TILE / BW
    assert put + 2 * TILE / BW <= end0 + wg  # the put's read is over before the store
    land_from = put_arr - 2 * TILE / L  # rank o's put lands streamed at L, the HBM idle
    assert land_from >= end1
    landed = max(put_arr, land_from + 2 * TILE / BW)
    return [
        ("launch", "persistent-puts", 0.0, t),
        ("gemm", "round 0", t, end0),  # the round's one HBM reservation
        ("wg0", "task 0", t, end0),  # each WG's own task on its own track
        ("wg1", "task 1", t, put),  # the put's issue cost on the WG that issues it
        ("wg2", "task 2", t, end0),
        ("tracker", f"{nm('C', chunk(o))} complete", put, put),
        ("nic", f"put {nm('C', chunk(o))} -> {o}", put, put_end),
        (f"link->{o}", f"put {nm('C', chunk(o))}", put, put + 2 * TILE / NIC_BW),
        ("gemm", "round 1", end0, end1),
        ("wg0", "task 3", end0, end1),
        ("hbm", f"{nm('R', R)} remote stores land", put_arr, landed),
        ("tracker", f"{nm('R', R)} complete", landed, landed),
    ]


# ================================================================ 9. waits + launch
def launch_wait_plan(spec, r, o, sinks: bool = False):
    """``sinks``: the S map is also a map of the GEMM phase (as tests/mpi/mechanisms.py's
    gemv-allreduce has it), so each S block's completion is computed there."""
    slots = Slots()
    cspace = _space(slots, "C", [(0, M)], N)
    sspace = _space(slots, "S", [(0, M), (M, 2 * M)], N)  # block s: rank s's C
    zspace = _space(slots, "Z", [(0, M)], N)
    gemm = _gemm(spec, cspace, [tuple(t) for t in cspace.tiles.tolist()])
    cmap = AddressMap(cspace, r, 2, "store", gemm.local_writes())
    cmap.remote_map((0, M, 0, N), [0, 1], op="store", to=sspace,
                    to_region=(r * M, (r + 1) * M, 0, N))  # every rank's block r
    smap = AddressMap(sspace, r, 2, "store", np.zeros(len(sspace), np.int64), incoming_op="store")
    blocks = tuple(smap.track((s * M, (s + 1) * M, 0, N)) for s in (0, 1))
    items = np.column_stack([zspace.tiles, np.zeros((len(zspace), 2), np.int64)])
    items[:, 5] = 1
    reduce = Kernel(Elementwise(((Source("S", 0), Source("S", M)),)), zspace, items,
                    np.arange(len(zspace)), np.arange(len(zspace)), spec.wgs_per_stage)
    zmap = AddressMap(zspace, r, 2, "store", reduce.local_writes(), local_ok=True)
    layout = GEMM_LAYOUT + [("S", (2 * M, N), np.float32), ("Z", (M, N), np.float32)]
    plan = Plan(layout, GEMM_INPUTS,
                [KernelPhase("gemm", gemm, [cmap, smap] if sinks else [cmap], "rs", fused=True),
                 KernelPhase("reduce", reduce, [zmap], "rs", waits=blocks)],
                slots, [("Z", (0, M, 0, N))])
    x = inputs_of(9, r, A=(M, K), Bm=(K, N))
    return plan, {"A": x["A"], "Bm": x["Bm"]}


def launch_wait_want(r, o):
    return _matmul(9, 0) + _matmul(9, 1)


def launch_wait_log(r, o):
    t = LAUNCH
    # GEMM stage s (tile row s): read phase, store into the own S block (a write into another
    # local buffer: B), the same tiles to rank o's S block on the link from the read end
    s0_read = t + WG_S
    s0_self = s0_read + 2 * TILE / BW  # own block written: its signal's arrival
    s0_link = s0_read + 2 * TILE / L
    s0_end = max(s0_self, s0_link)  # max(writes, link stores)
    s1_read = s0_end + WG_S
    s1_self = s1_read + 2 * TILE / BW
    s1_link = s1_read + 2 * TILE / L
    s1_end = max(s1_self, s1_link)
    arr_peer = s1_link + LAT  # rank o's last tiles in my S block o (symmetric)
    # the reduce launch: max(CUs free, waits = latest arrival in S blocks 0 and 1), + launch
    wait = max(s1_end, s1_self, arr_peer)
    z0 = wait + LAUNCH
    ew = (2 - 1) * TM * TN * S / FV  # elementwise: (n-1) h w FLOPs x S / Fv = 2.048 us
    ew_reads = 2 * 2 * TILE  # 2 items x n copies x h w e, at most at reads/compute
    assert ew_reads / ew < BW
    z0_end = z0 + ew + 2 * TILE / BW  # read phase, then 2 stores
    z1_end = z0_end + ew + 2 * TILE / BW
    return [
        ("launch", "gemm", 0.0, t),  # launch_us
        ("gemm", "stage 0", t, s0_end),
        (f"link->{o}", "stage 0 stores", s0_read, s0_link),  # send
        ("gemm", "stage 1", s0_end, s1_end),
        (f"link->{o}", "stage 1 stores", s1_read, s1_link),
        ("launch", "reduce", wait, z0),  # starts at the waits' arrival, pays launch_us
        ("gemm", "stage 0", z0, z0_end),  # elementwise stage: 2 items
        ("gemm", "stage 1", z0_end, z1_end),
    ]


def self_slots_plan(spec, r, o):
    return launch_wait_plan(spec, r, o, sinks=True)


def self_slots_log(r, o):
    """launch-wait's log plus the S blocks' completions in the GEMM phase. Block r holds
    this rank's own tiles, written by its own WGs into another local buffer: the stage
    already charged them as local writes (cost.py ``with_writes``: h w e for a write into
    another local buffer), and design.md computes a trigger's completion as "max(the
    producer's last local write to its slots, the landing of the *peers'* writes in this
    HBM)": block r has no peer writes, so it completes when its last tile is written,
    with no landing. Block o is landed (4 tiles of rank o, streamed in at L)."""
    base = launch_wait_log(r, o)
    t = LAUNCH
    s0_end = max(t + WG_S + 2 * TILE / BW, t + WG_S + 2 * TILE / L)
    s1_read = s0_end + WG_S
    s1_self = s1_read + 2 * TILE / BW  # the own block's last local write
    s1_link = s1_read + 2 * TILE / L
    arr_peer = s1_link + LAT  # rank o's last tiles of block o
    land_from = arr_peer - 4 * TILE / L  # block o (4 tiles) streams in from arrival - B/L
    assert land_from + 4 * TILE / (BW - STAGE_CAP) <= s1_read  # beside stage 1's reads
    landed = max(arr_peer, land_from + 4 * TILE / (BW - STAGE_CAP))
    own, peer = (r * M, (r + 1) * M, 0, N), (o * M, (o + 1) * M, 0, N)
    return base + [
        ("tracker", f"{nm('S', own)} complete", s1_self, s1_self),  # last local write
        ("hbm", f"{nm('S', peer)} remote stores land", arr_peer, landed),  # land
        ("tracker", f"{nm('S', peer)} complete", landed, landed),
    ]


CASES = {
    "wg-stores": (wg_stores_plan, wg_stores_want, wg_stores_log),
    "dma-push": (dma_push_plan, dma_push_want, dma_push_log),
    "loaded-latency": (loaded_plan, dma_push_want, loaded_log),
    "pull": (pull_plan, pull_want, pull_log),
    "wave-slots": (wave_plan, pull_want, wave_log),
    "flag": (flag_plan, flag_want, flag_log),
    "nic": (nic_plan, nic_want, nic_log),
    "cu-executor": (cu_executor_plan, cu_executor_want, cu_executor_log),
    "cu-prioritised": (lambda spec, r, o: cu_dispatch_plan(spec, r, o, "prioritised"),
                       cu_dispatch_want, cu_prioritised_log),
    "cu-plain": (lambda spec, r, o: cu_dispatch_plan(spec, r, o, "plain"), cu_dispatch_want,
                 cu_plain_log),
    "cu-steps": (cu_steps_plan, cu_steps_want, cu_steps_log),
    "persistent": (persistent_plan, persistent_want, persistent_log),
    "persistent-puts": (persistent_puts_plan, persistent_puts_want, persistent_puts_log),
    "launch-wait": (launch_wait_plan, launch_wait_want, launch_wait_log),
    "store-queue": (store_queue_plan, store_queue_want, store_queue_log),
    "self-slots": (self_slots_plan, launch_wait_want, self_slots_log),
}


# ---------------------------------------------------------------- comparison
def _events(res):
    return [(e.track, e.name, e.start, e.end) for e in res.events
            if not e.track.startswith("counter:")]  # the DRAM's counter samples


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(RTOL * max(abs(a), abs(b)), ATOL)


def _paired(want: list, got: list) -> list[tuple]:
    """Expected and got events paired by (track, name, k-th by start), in time order; a
    side is None where the other log has no such event."""
    def keyed(log):
        out, seen = {}, {}
        for ev in sorted(log, key=lambda e: (e[0], e[1], e[2], e[3])):
            k = seen[ev[:2]] = seen.get(ev[:2], -1) + 1
            out[(*ev[:2], k)] = ev
        return out

    w, g = keyed(want), keyed(got)
    keys = sorted(set(w) | set(g), key=lambda k: ((w.get(k) or g[k])[2], k))
    return [(w.get(k), g.get(k)) for k in keys]


def compare(want: list, got: list) -> tuple[bool, str]:
    """(match, a side-by-side table in us; mismatching rows marked !!)."""
    ok = True
    rows = []
    for w, g in _paired(want, got):
        good = (w is not None and g is not None and _close(w[2], g[2]) and _close(w[3], g[3]))
        ok = ok and good
        fmt = (lambda e: f"{e[0]:<10} {e[1]:<44.44} {e[2] * 1e6:16.9f} {e[3] * 1e6:16.9f}"
               if e else f"{'-':<10} {'-':<44} {'':16} {'':16}")
        rows.append(f"  {'  ' if good else '!!'} {fmt(w)} | {fmt(g)}")
    head = (f"     {'expected (us)':<88} | {'got (us)'}\n"
            f"     {'track':<10} {'name':<44} {'start':>16} {'end':>16} | "
            f"{'track':<10} {'name':<44} {'start':>16} {'end':>16}")
    return ok, head + "\n" + "\n".join(rows)


def two_nodes(spec):
    """The toy device as two nodes of one GPU, each node's NIC the device's ``[nic]``."""
    import dataclasses

    ic = dataclasses.replace(spec.interconnect, gpus_per_node=1, nodes=2, network="fabric",
                             nics_per_node=1, nic_bw=NIC_BW, nic_latency_s=NIC_LAT)
    return dataclasses.replace(spec, interconnect=ic)


def main(names: list[str]) -> int:
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        print("event_log.py runs on 2 ranks", flush=True)
        return 2
    r = comm.rank
    o = 1 - r
    watchdog.open_board(comm)
    spec = load_device(str(DEVICE))
    opts = RunOptions("fp32", 60.0, record=True)
    failed = []
    for name in names or list(CASES):
        build, want_of, log_of = CASES[name]
        on = two_nodes(spec) if name in ("nic", "persistent-puts") else spec
        if name == "store-queue":  # a slow link: the stores take longer than the compute
            import dataclasses

            on = dataclasses.replace(on, interconnect=dataclasses.replace(
                on.interconnect, link_bw=LQ))
        plan, inputs = build(on, r, o)
        res = run_plan(comm, plan, on, name, inputs, opts)
        want = want_of(r, o)
        data_ok = res.result is not None and np.array_equal(res.result, want)
        log_ok, table = compare(log_of(r, o), _events(res))
        tables = comm.gather((data_ok, log_ok, table, len(res.events)), root=0)
        ok = comm.allreduce(data_ok and log_ok, MPI.LAND)
        if r == 0:
            if ok:
                print(f"EVENT-LOG OK {name} ({tables[0][3]} events per rank)", flush=True)
            else:
                failed.append(name)
                print(f"EVENT-LOG MISMATCH {name}", flush=True)
                for rank, (d_ok, l_ok, tab, n) in enumerate(tables):
                    print(f" rank {rank}: data {'OK' if d_ok else 'WRONG'}, event log "
                          f"{'OK' if l_ok else 'DIFFERS'} ({n} events)\n{tab}", flush=True)
    watchdog.close_board()
    if r == 0:
        print(f"EVENT-LOG DONE {len(names or CASES) - len(failed)} ok, failed: "
              f"{' '.join(failed) or '-'}", flush=True)
    return 1 if comm.bcast(failed, root=0) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
