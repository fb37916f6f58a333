"""Arbitration policies and the topology-aware clock."""

import pytest

from emulator.model.arbitration import CommWindow, Mca, RoundRobin
from emulator.model.clock import BandwidthTimeline, RankClock


def test_round_robin_halves_communication_only_while_compute_follows():
    hbm = BandwidthTimeline("hbm", 100.0)
    rr = RoundRobin()
    assert rr.comm(hbm, 0.0, 100.0, CommWindow(True)) == pytest.approx(2.0)
    assert rr.comm(hbm, 10.0, 100.0, CommWindow(False)) == pytest.approx(11.0)  # fallback


@pytest.mark.parametrize("u1, threshold", [(0.9, 5), (0.6, 10), (0.3, 30), (0.1, None)])
def test_mca_threshold_follows_the_first_stage_intensity(u1, threshold):
    mca = Mca()
    mca.observe_first_stage(u1)
    mca.observe_first_stage(0.0)  # only the first (isolated) stage counts
    assert mca.describe()["occupancy_threshold"] == threshold
    t = threshold or float("inf")
    ceiling = 1.0 if threshold is None else t / (t + 1)
    floor = 0.0 if threshold is None else 1 / (t + 1)
    assert mca.comm_fraction == pytest.approx(max(floor, ceiling - u1))


def test_mca_protects_a_memory_bound_gemm_and_drains_at_kernel_end():
    mca = Mca()
    mca.observe_first_stage(0.9)
    hbm = BandwidthTimeline("hbm", 100.0)
    # while compute runs: only the anti-starvation share 1/(T+1) = 1/6
    assert mca.comm(hbm, 0.0, 10.0, CommWindow(True)) == pytest.approx(0.6)
    assert mca.comm(BandwidthTimeline("h", 100.0), 0.0, 10.0, CommWindow(False)) == \
        pytest.approx(0.1)


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
