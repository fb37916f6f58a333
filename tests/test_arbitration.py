"""The DRAM queue's arbitration policies, the L2 across stages, and the topology-aware
clock."""

import dataclasses

import numpy as np
import pytest

from devices.regions import tile_grid
from devices.spec import DramSpec, load_device
from emulator.model.arbitration import (POLICIES, CommWindow, ComputeExclusive, FrFcfs, Mca,
                                        RoundRobin, policy_named)
from emulator.model.clock import BandwidthTimeline, RankClock
from emulator.model.cost import CostModel
from emulator.model.dram import Dram

DURING = CommWindow(True)  # a later GEMM stage competes
AFTER = CommWindow(False)  # the kernel has ended: drain

# 100 B/s, one channel of 2 requests of 5 bytes: the queue holds 10 bytes
# (requests held back by a policy wait at most 100 s before they are issued anyway)
SMALL = DramSpec(channels=1, queue_depth=2, access_bytes=5, turnaround_s=0.0, burst_bytes=5,
                 starvation_s=100.0)


def _dram(spec: DramSpec = SMALL) -> Dram:
    return Dram("hbm", 100.0, spec)


def test_round_robin_fills_the_queue_and_stalls_the_gemm_beyond_a_fair_share():
    dram = _dram()
    # a 50-byte burst: 40 bytes find the queue full of communication and are served alone
    end = dram.comm(RoundRobin(), 0.0, 50.0, DURING)
    assert end == pytest.approx(0.5)
    # a GEMM read of 50 bytes at its demand of 50 B/s, reserved next in program order:
    # it gets nothing while the queue is full of the burst
    _, gemm_end = dram.reserve(0.0, 50.0, cap=50.0)
    fair = 1.0  # with half the rate for each stream it would take 1 s at 50 B/s
    assert gemm_end > fair + 0.3


def test_mca_never_fills_the_queue_and_serves_compute_first():
    mca = Mca()
    mca.observe_first_stage(0.6)  # T = 10: communication only under 10/11 of the peak
    assert mca.describe()["occupancy_threshold"] == 10
    dram = _dram()
    _, gemm_end = dram.reserve(0.0, 50.0, cap=50.0)  # the GEMM is reserved first
    end = dram.comm(mca, 0.0, 50.0, DURING)
    assert gemm_end == pytest.approx(1.0)  # untouched
    # communication gets 10/11 x 100 - 50 B/s while the GEMM reads, then the ceiling
    assert end == pytest.approx(1.0 + (50 - (1000 / 11 - 50)) / (1000 / 11), rel=1e-6)
    # drained at full rate once no compute follows
    assert _dram().comm(mca, 0.0, 50.0, AFTER) == pytest.approx(0.5)


def test_mca_anti_starvation_issues_held_communication_after_the_wait_limit():
    # the GEMM reserved first keeps 95 of 100 B/s for 3 s, over the ceiling 10/11:
    # communication under the ceiling gets nothing, so after the wait limit (2 s) it is
    # issued anyway: it has what the GEMM leaves (5 B/s) until the GEMM's read phase
    # ends, then the starved share (50 B/s)
    spec = dataclasses.replace(SMALL, starvation_s=2.0)
    mca = Mca()
    mca.observe_first_stage(0.6, 0.6)
    assert mca.lookahead == 1 and mca.describe()["first_stage_read_utilisation"] == 0.6
    dram = _dram(spec)
    dram.reserve(0.0, 285.0, cap=95.0)
    end = dram.comm(mca, 0.0, 20.0, DURING)
    assert 3.0 < end <= 3.0 + 15.0 / 50.0 + 1e-9
    # a GEMM reading for 10 s: with the limit, its 5 B/s from 2 s on; without it (a
    # limit beyond the GEMM), only once the GEMM's reads end
    for limit, lo, hi in ((2.0, 2.0, 2.0 + 20.0 / 5.0), (100.0, 10.0, 11.0)):
        dram = _dram(dataclasses.replace(SMALL, starvation_s=limit))
        dram.reserve(0.0, 950.0, cap=95.0)
        assert lo < dram.comm(mca, 0.0, 20.0, DURING) <= hi + 1e-9
    # compute-exclusive: no ceiling, no anti-starvation: only the (1 - u1) it leaves
    ex = ComputeExclusive()
    ex.observe_first_stage(0.6, 0.95)
    assert ex.lookahead == 1 and ex.ceiling(_dram(spec), DURING) is None


# the first stage's occupancy q1 = u1 / (1 - u1) requests per channel (M/M/1): 9, 1.5,
# 0.43, 0.11; at the band edges u1 = 0.75, 0.5, 0.25: q1 = 3, 1, 1/3 exactly
@pytest.mark.parametrize("u1, threshold", [(0.9, 5), (0.6, 10), (0.3, 30), (0.1, None),
                                           (0.75, 5), (0.5, 10), (0.25, 30), (1.0, 5)])
def test_mca_threshold_follows_the_first_stage_occupancy(u1, threshold):
    mca = Mca()
    mca.observe_first_stage(u1)
    mca.observe_first_stage(0.0)  # only the first (isolated) stage counts
    assert mca.describe()["occupancy_threshold"] == threshold
    q1 = mca.describe()["first_stage_occupancy"]
    assert q1 == (float("inf") if u1 == 1.0 else pytest.approx(u1 / (1 - u1)))
    t = threshold or float("inf")
    assert mca.ceiling_fraction == pytest.approx(1.0 if threshold is None else t / (t + 1))


def test_the_first_stage_occupancy_from_its_bursts_and_mca_holding_communication_back():
    """A stage alone on t3-sim (Q = 31 channels x 64 x 64 B = 124 KiB: one channel per
    32 GB/s of 1 TB/s; mu = 1 TB/s): 4 K steps each loading a 256 KiB burst, then a 1 MiB
    write burst, over 20 us. A burst of B > Q holds Q (B - Q) + Q^2 / 2 byte-seconds over
    mu; per channel over 20 us, in 64-byte requests: 5.7, over MCA's top band (3):
    T = 5, so communication offered while a GEMM stage reads at 4/5 of the HBM gets 5/6 -
    4/5 of it."""
    from emulator.engine.launch import queue_occupancy

    spec = load_device("t3-sim")
    ki = 1024.0
    q, mu, ch = 124 * ki, spec.hbm_bw, 31
    assert spec.dram.channels_for(mu) * spec.dram.queue_depth * spec.dram.access_bytes == q
    reads = 4 * (q * (256 * ki - q) + q * q / 2) / mu
    writes = (q * (1024 * ki - q) + q * q / 2) / mu
    want = (reads + writes) / 20e-6 / (ch * 64)
    got = queue_occupancy(spec, 1024 * ki, 4, 19e-6, 1024 * ki, 20e-6)
    assert got == pytest.approx(want) and 5.6 < got < 5.8
    # bursts within the queue hold B^2 / 2 / mu; reads that keep the HBM busy keep it full
    assert queue_occupancy(spec, 64 * ki, 1, 1e-6, 0.0, 1e-6) == pytest.approx(
        (64 * ki) ** 2 / 2 / mu / 1e-6 / (ch * 64))
    assert queue_occupancy(spec, 10 * q, 1, 1e-6, 0.0, 1e-6) == pytest.approx(q / (ch * 64))
    mca = Mca()
    mca.observe_first_stage(0.2, 0.2, got)  # a low utilisation, yet bursts fill the queue
    assert mca.describe()["occupancy_threshold"] == 5
    assert mca.describe()["first_stage_occupancy"] == pytest.approx(got)
    dram = _dram()
    dram.reserve(0.0, 80.0, cap=80.0)  # the GEMM reads at 80 of 100 B/s for 1 s
    end = dram.comm(mca, 0.0, 10.0, DURING)  # 10 bytes under the ceiling 5/6 x 100
    held = 500.0 / 6 - 80.0  # 3.33 B/s beside the GEMM, then the ceiling alone
    assert end == pytest.approx(1.0 + (10.0 - held) / (500.0 / 6))
    assert _dram().comm(mca, 0.0, 10.0, DURING) == pytest.approx(10.0 / (500.0 / 6))


def test_fcfs_serves_a_burst_ahead_of_compute_and_exclusive_leaves_it_the_gaps():
    dram = _dram()
    dram.comm(FrFcfs(), 0.0, 50.0, DURING)
    assert dram.reserve(0.0, 50.0, cap=50.0)[1] == pytest.approx(1.5)  # waits for all of it
    ex = ComputeExclusive()
    ex.observe_first_stage(0.8)
    dram = _dram()
    assert dram.comm(ex, 0.0, 10.0, DURING) == pytest.approx(10.0 / 20.0)  # 1 - 0.8 of it


def test_every_policy_by_name():
    for name in POLICIES:
        assert policy_named(name).name == name
    with pytest.raises(ValueError, match="not in"):
        policy_named("lottery")


def test_a_compute_request_waits_behind_the_communication_queued_ahead_of_it():
    # loaded latency: FR-FCFS serves a 50-byte burst offered at 0 alone, over [0, 0.5] s:
    # unserved 50 (0.5 - t) / 0.5 bytes, at most the queue's 10 bytes
    dram = _dram()
    assert dram.comm(FrFcfs(), 0.0, 50.0, DURING) == pytest.approx(0.5)
    assert dram.queued(0.0, 0.0) == pytest.approx(10.0)  # 50 unserved: the queue is full
    assert dram.queued(0.45, 0.45) == pytest.approx(5.0)
    # the mean over [0.4, 0.5]: from 10 down to 0 -> 5; over [0.4, 0.6]: 5 x 0.1 / 0.2
    assert dram.queued(0.4, 0.5) == pytest.approx(5.0)
    assert dram.queued(0.4, 0.6) == pytest.approx(2.5)
    # a policy's room: MCA lets communication hold T requests of A bytes per channel (T = 5,
    # 25 bytes, beyond this queue's 10; a room of 4 bytes caps it), compute-exclusive none
    mca = Mca()
    mca.observe_first_stage(0.9)
    assert mca.comm_room(dram) == 5 * 1 * 5
    assert dram.queued(0.0, 0.0, 4.0) == pytest.approx(4.0)
    assert ComputeExclusive().comm_room(dram) == 0.0 and RoundRobin().comm_room(dram) is None
    assert dram.queued(0.0, 0.0, ComputeExclusive().comm_room(dram)) == 0.0
    assert dram.queued(0.6, 1.0) == 0.0  # (served bursts are dropped 10 us after)
    # a steady stream below the HBM's rate (a copy engine paced by its link) keeps nothing
    # queued; communication on a DRAM of its own (the contention counterfactual) neither
    steady = _dram()
    steady.stream(RoundRobin(), 0.0, 50.0, DURING, rate=20.0)
    assert steady.queued(0.0, 1.0) == 0.0
    apart = _dram(dataclasses.replace(SMALL, shared=False))
    apart.comm(FrFcfs(), 0.0, 50.0, DURING)
    assert apart.queued(0.0, 0.5) == 0.0


def test_backlog_counts_only_communication_still_unserved():
    dram = _dram(dataclasses.replace(SMALL, burst_bytes=10))
    dram.comm(RoundRobin(), 0.0, 10.0, DURING)  # fits the queue: half the rate, 0.2 s
    assert dram.backlog(0.0) == pytest.approx(10.0)
    assert dram.backlog(0.1) == pytest.approx(5.0)
    assert dram.backlog(0.3) == 0.0


def test_turnaround_charges_writes_only_while_a_gemm_reads():
    spec = DramSpec(channels=32, turnaround_s=14e-9, write_batch=12)
    dram = Dram("hbm", 1e12, spec)
    extra = 14e-9 * (1e12 / 32) / (12 * 64)
    assert dram.write_cost(100.0, "update", 2.0, mixed=True) == pytest.approx(200 + 100 * extra)
    assert dram.write_cost(100.0, "store", 2.0, mixed=False) == pytest.approx(100.0)


@pytest.mark.parametrize("burst_kb", [16, 32, 128])
def test_burst_size_moves_a_stage_by_under_half_a_percent(burst_kb):
    """A stage-sized DMA burst then a GEMM stage, at the default burst (64 KB) and
    others: the GEMM's end moves by less than 0.5%."""
    def gemm_end(burst: int) -> float:
        dram = Dram("hbm", 1e12, DramSpec(burst_bytes=burst << 10))
        for i in range(160):  # T3: a stage's 160 regions of 32 KB triggered together
            dram.comm(RoundRobin(), 0.0, 32768.0, DURING)
        for i in range(40):  # landing updates streaming in at 75 GB/s
            dram.comm(RoundRobin(), i * 65536 / 75e9, 2 * 65536.0, DURING, offered_rate=150e9)
        return dram.reserve(0.0, 50e6, cap=520e9)[1]

    assert gemm_end(burst_kb) == pytest.approx(gemm_end(64), rel=5e-3)


def test_l2_keeps_the_previous_stages_panels_when_they_fit():
    spec = load_device("t3-sim")
    cm = CostModel(spec, "fp16")
    k = 1024
    stage = lambda r0: np.array([(r0, r0 + 128, c, c + 128, 0, k)  # noqa: E731
                                 for c in range(0, 128 * 20, 128)])
    first = cm.gemm_compute(stage(0))[2]
    assert first == pytest.approx((128 + 20 * 128) * k * 2)  # every panel once
    cm.l2_commit(stage(0), False)
    second = cm.gemm_compute(stage(128))[2]
    assert second == pytest.approx(128 * k * 2)  # only its new A panel: B is still in L2
    cm.l2_reset()
    assert cm.gemm_compute(stage(128))[2] == pytest.approx(first)


def _gemm_alone(spec, m: int, n: int, k: int, group: int = 1) -> tuple[float, float]:
    """(modelled time, DRAM read bytes) of an M x N x K GEMM's stages run alone, its WGs
    in the rasterisation order of ``group`` (``tile_grid``)."""
    cm = CostModel(spec, "fp16")
    tiles = tile_grid([(0, m)], n, spec.wg_tile_m, spec.wg_tile_n, group)
    wgs = np.array([(r0, r1, c0, c1, 0, k) for r0, r1, c0, c1 in tiles.tolist()])
    t = total = 0.0
    for i in range(0, len(wgs), spec.wgs_per_stage):
        st = wgs[i: i + spec.wgs_per_stage]
        _, compute, reads = cm.gemm_compute(st, True)
        cm.l2_commit(st, True)
        t += max(compute, reads / spec.hbm_bw)
        total += reads
    return t, total


SHAPES = [(2048, 12288, 1536), (2048, 20480, 2560), (8192, 4256, 2128), (16384, 3072, 384),
          (2048, 8192, 4096)]


@pytest.mark.parametrize("group", [1, 8])
def test_twice_the_cus_is_never_slower_on_a_gemm(group):
    """GPU-2X-CU's stages hold twice the WGs: fewer distinct panels per FLOP."""
    for m, n, k in SHAPES:
        one, two = (_gemm_alone(load_device(d), m, n, k, group)[0]
                    for d in ("t3-sim", "t3-sim-2x-cu"))
        assert two <= one, (m, n, k, group, one, two)


def test_grouped_rasterisation_covers_the_same_tiles_and_shares_panels():
    rows = [(0, 300), (300, 520)]  # two uneven row blocks (ring chunks)
    row_major = tile_grid(rows, 1000, 128, 128)
    grouped = tile_grid(rows, 1000, 128, 128, group=2)
    assert sorted(map(tuple, row_major.tolist())) == sorted(map(tuple, grouped.tolist()))
    assert [tuple(t) for t in grouped[:3].tolist()] == [(0, 128, 0, 128), (128, 256, 0, 128),
                                                       (0, 128, 128, 256)]
    assert (grouped[:, 0] < 300).sum() == (row_major[:, 0] < 300).sum()  # blocks kept apart
    assert (grouped[: (row_major[:, 0] < 300).sum(), 1] <= 300).all()
    # a wide output: a stage of 160 WGs row-major spans 3 tile rows x 64 columns (67
    # panels); grouped by 8 it spans 8 rows x 20 columns (28 panels): fewer DRAM reads
    spec = load_device("t3-sim")
    t_rm, reads_rm = _gemm_alone(spec, 2048, 8192, 4096, 1)
    t_g, reads_g = _gemm_alone(spec, 2048, 8192, 4096, 8)
    assert reads_g < 0.6 * reads_rm and t_g <= t_rm


def _clock(topology: str, world: int = 4) -> RankClock:
    from devices.spec import InterconnectSpec
    from emulator.model.topology import Topology

    return RankClock(0, 1e12, Topology(InterconnectSpec(topology, 10.0, 0.0), world), 1, 1.0)


def test_switch_ports_are_shared_and_ring_links_are_neighbours_only():
    sw = _clock("switch")
    assert sw.send(1, 0.0, 10.0) == pytest.approx(1.0)
    assert sw.send(2, 0.0, 10.0) == pytest.approx(2.0)  # one up port for every destination
    # two 10-byte transfers arriving together share the 10 B/s down port
    assert sw.receive(1.0, 10.0) == pytest.approx(1.0)
    assert sw.receive(1.0, 10.0) == pytest.approx(2.0)
    mesh = _clock("full-mesh")
    assert mesh.send(1, 0.0, 10.0) == mesh.send(2, 0.0, 10.0) == pytest.approx(1.0)
    assert mesh.receive(1.0, 10.0) == 1.0
    ring = _clock("ring")
    assert ring.send(3, 0.0, 10.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no link to rank 2"):
        ring.send(2, 0.0, 10.0)


def test_fill_stops_at_until_and_respects_a_ceiling():
    hbm = BandwidthTimeline("hbm", 10.0)
    hbm.reserve(0.0, 50.0, cap=6.0)  # 6 B/s in [0, 8.33)
    start, end, left = hbm.fill(0.0, 100.0, ceiling=8.0, until=5.0)
    assert (start, end) == (0.0, 5.0) and left == pytest.approx(90.0)
