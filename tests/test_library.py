"""The library collectives' cost model (``emulator/model/library.py``) against NCCL's
formulas worked by hand, and the emulated library kernels against it.

Hand derivations (NCCL 2.23.4 tuning.cc, ring, 8 GPUs on one NVLink node, Simple
bus bandwidth 240 GB/s):
- channel search: speed 40 GB/s x 6 rings = 240 (the most of any speed); 40 >= 25
  so the channels double (12 x 20); the communicator runs 2 per search channel: 24.
- LL:     bus min(87.7, 240 x 0.5) = 87.7;     lat 6.6 + 7 x 0.6 = 10.8 us
- LL128:  bus min(240 x 0.92, 12 x 20) = 220.8; lat 14 + 7 x 1.9 = 27.3 us
- Simple: bus 240;                              lat 8.4 + 7 x 3.4 = 32.2 us
- an all-gather of B bytes takes lat + B / (1e3 x bus x 8/7) us.
"""

from __future__ import annotations

import pytest

from emulator.model import library


def _ag(nbytes, ranks=8, nodes=1, bus=240.0, name="nccl-ampere", kind="AllGather"):
    return library.choose(name, kind, nbytes, ranks, nodes, bus, pci=False)


def test_the_tables_match_the_spec_names():
    from devices.spec import LIBRARIES

    assert set(LIBRARIES) == set(library.LIBRARIES)


def test_channel_search_as_nccl():
    assert library._channels(library.LIBRARIES["nccl-ampere"], 240.0) == (12, 24, 20.0)
    # Hopper, 8 x 20.6 GB/s: 40 x 4 = 160 (speed 20 x 8 ties, the higher speed is kept);
    # 40 >= 25 and only 4 channels, so they double: 8 x 20; 16 on the communicator
    assert library._channels(library.LIBRARIES["nccl-hopper"], 164.8) == (8, 16, 20.0)
    # a two-node A100 ring bound by 90 GB/s of NICs: 30 x 3 -> 6 x 15 -> 12
    assert library._channels(library.LIBRARIES["nccl-ampere"], 90.0) == (6, 12, 15.0)


@pytest.mark.parametrize("nbytes, proto, lat, bus", [
    (1 << 20, "LL", 10.8, 87.7),         # 10.8 + 1048576 / (1e3 x 100.23) = 21.26 us
    (1 << 30, "Simple", 32.2, 240.0),    # 32.2 + 2^30 / (1e3 x 274.29) = 3946.9 us
])
def test_protocol_choice_and_prediction_by_hand(nbytes, proto, lat, bus):
    c = _ag(nbytes)
    assert (c.algorithm, c.protocol) == ("ring", proto)
    assert c.latency_us == pytest.approx(lat)
    assert c.predicted_us == pytest.approx(lat + nbytes / (1e3 * bus * 8 / 7), abs=1e-3)


def test_ll128_wins_between_ll_and_simple():
    # 16 MB: LL 10.8 + 167.4 = 178.2; LL128 27.3 + 66.5 = 93.8; Simple 32.2 + 61.2 = 93.4
    # -> Simple; 8 MB: LL128 27.3 + 33.2 = 60.5 < Simple 32.2 + 30.6 = 62.8 -> LL128
    assert _ag(8 << 20).protocol == "LL128"
    assert _ag(16 << 20).protocol == "Simple"


def test_small_messages_run_on_fewer_channels_at_the_predicted_bandwidth():
    # LL's threshold: nBytes < nc x 512 threads x 8 x nRanks -> nc falls to 1 at 32 KB;
    # enqueue.cc does not redo the prediction, and the call runs at the bus bandwidth the
    # prediction used (LL: min(87.7, 240 x 0.5)), not 1/24 of it
    small = _ag(32 << 10)
    assert small.protocol == "LL" and small.channels == 1
    assert small.bw_ratio == pytest.approx(87.7 / 240)
    assert small.busbw_gb_per_s == pytest.approx(87.7)
    assert small.predicted_us == pytest.approx(10.8 + (32 << 10) / (1e3 * 87.7 * 8 / 7),
                                               abs=1e-3)
    assert _ag(1 << 30).channels == 24 and _ag(1 << 30).bw_ratio == 1.0


def test_multi_node_latency_counts_network_steps():
    # all-reduce, 16 GPUs on 2 nodes, Simple: 2(n-1) = 30 steps, 2 of them across the
    # network; intra steps cost max(3.4, 3 x 1 us net overhead); x1.4 (multi-node Simple AR)
    c = _ag(1 << 30, ranks=16, nodes=2, bus=90.0, kind="AllReduce")
    assert c.protocol == "Simple"
    assert c.latency_us == pytest.approx((8.4 + 28 * 3.4 + 2 * 14.0) * 1.4)


def test_rccl_mi300_never_picks_ll128():
    for size in (1 << 10, 1 << 16, 1 << 22, 1 << 28):
        assert _ag(size, name="rccl-mi300", bus=336.0).protocol != "LL128"
    # RCCL's base latency: 17 us for Simple
    assert _ag(1 << 30, name="rccl-mi300", bus=336.0).latency_us == pytest.approx(
        17.0 + 7 * 2.1)


def test_simple_busbw_spreads_a_ring_over_every_nic():
    from devices.system import load_system
    from emulator.model.topology import Topology

    spec = load_system("a100-sxm-2x8")
    topo = Topology.of(spec, 16)
    ic = spec.interconnect
    # 4 NICs x 25 GB/s x 0.9 (NCCL over IB) < 300 x 0.8 over NVLink
    assert library.simple_busbw(ic, 8, 2, 16) == pytest.approx(90.0)
    route = topo.route(7, 8, channels=True)
    assert route.rate == pytest.approx(4 * ic.nic_bw)
    assert topo.route(7, 8).rate < route.rate  # one NIC, shared


def test_a_preset_without_a_library_has_no_choice():
    from devices.spec import load_device
    from emulator.model.topology import Topology

    spec = load_device("t3-sim")
    assert library.for_problem(spec, Topology.of(spec, 8), "rs", 1 << 20, "ring") is None


def test_an_unknown_library_is_refused(tmp_path):
    from devices.spec import PRESET_DIR, SpecError, load_device

    text = (PRESET_DIR / "a100-sxm.toml").read_text().replace(
        'library = "nccl-ampere"', 'library = "mpi"')
    path = tmp_path / "gpu.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match="library = 'mpi'"):
        load_device(str(path))


def test_emulated_library_kernels_follow_the_model():
    """The emulated ring (8 A100s, 1 GB all-gather: bandwidth-bound) takes the library's
    predicted time within 1%; on two nodes its channels use every NIC: busbw near the
    node's 4 NICs x 25 GB/s x 0.9 = 90 GB/s, where one NIC would give at most 25."""
    from emulator.app import nccl_tests

    one = nccl_tests.measure("a100-sxm-x8", "all-gather", 1 << 30, 8)
    assert one["protocol"] == "Simple" and one["channels"] == 24
    assert one["time_us"] == pytest.approx(one["predicted_us"], rel=0.01)
    two = nccl_tests.measure("a100-sxm-2x8", "reduce-scatter", 1 << 28, 16)
    assert 80 < two["busbw"] <= 90.0
    small = nccl_tests.measure("h800-x8", "all-reduce", 1 << 12, 8)
    assert small["protocol"] == "LL" and small["time_us"] < 60
