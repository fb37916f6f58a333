"""Modelled clock against hand-computed timelines (SimPy-style tests).

The core: for every executor kind, a two-rank toy plan on tests/data/event-log.toml
whose whole modelled event log, on each rank, must equal a log derived by hand in
tests/mpi/event_log.py from the device's numbers and the documented formulas (and
whose data must equal numpy's). Besides, a few transfer formulas are checked in
process, on a fresh clock, against hand arithmetic (the switch's down port, a busy
DMA engine, NIC puts sharing the NIC, a local CU-kernel update)."""

from __future__ import annotations

import dataclasses

import re
import tomllib

import pytest

from tests.conftest import ROOT, run_mpi_script

CASES = ["wg-stores", "store-queue", "dma-push", "loaded-latency", "pull", "wave-slots", "flag", "nic", "cu-executor", "cu-prioritised", "cu-plain", "cu-steps",
         "persistent", "persistent-puts", "launch-wait", "self-slots"]
DEVICE = ROOT / "tests" / "data" / "event-log.toml"


def _block(stdout: str, case: str) -> str:
    """The script's report of ``case`` (its OK line, or the mismatch tables)."""
    m = re.search(rf"^EVENT-LOG (OK|MISMATCH) {re.escape(case)}\b.*?(?=^EVENT-LOG |\Z)",
                  stdout, re.S | re.M)
    return m.group(0) if m else stdout[-4000:]


@pytest.fixture(scope="module")
def job():
    """One 2-rank job runs every case (numba and MPI start once)."""
    return run_mpi_script("event_log.py", 2, timeout=300)


def test_the_job_ran_every_case(job):
    assert "EVENT-LOG DONE" in job.stdout, job.stdout[-3000:] + job.stderr[-3000:]
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]


@pytest.mark.parametrize("case", CASES)
def test_two_rank_event_log_is_the_hand_computed_one(job, case):
    assert re.search(rf"^EVENT-LOG OK {re.escape(case)} \(\d+ events per rank\)$", job.stdout,
                     re.M), _block(job.stdout, case) + job.stderr[-2000:]


# ---------------------------------------------------------------- in process, no MPI
_D = tomllib.loads(DEVICE.read_text())
BW = _D["memory"]["hbm_gb_per_s"] * 1e9  # 1000 GB/s
UPD = _D["memory"]["nmc_update_cost"]  # 2
SETUP = _D["dma"]["setup_ns"] * 1e-9  # 100 ns
L = _D["interconnect"]["link_gb_per_s_per_direction"] * 1e9  # 100 GB/s
LAT = _D["interconnect"]["link_latency_ns"] * 1e-9  # 1 us
NIC_BW = _D["nic"]["gb_per_s"] * 1e9  # 50 GB/s
NIC_LAT = _D["nic"]["latency_ns"] * 1e-9  # 2 us
FV = _D["compute"]["cus"] * _D["compute"]["clock_ghz"] * 1e9 \
    * _D["compute"]["fp32_vector_flops_per_cycle_per_cu"]  # 16 GFLOP/s
E = 4  # fp32
B = 65536  # one 128 x 128 fp32 tile


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-9 * max(abs(a), abs(b)), 1e-15)


def _same(got: list, want: list) -> None:
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        assert g[:2] == w[:2] and _close(g[2], w[2]) and _close(g[3], w[3]), (g, w)


def _spec(switched: bool = False, library: float = 1.0, nodes: int = 1, **fractions):
    from devices.spec import load_device

    spec = load_device(str(DEVICE))
    spec = dataclasses.replace(spec, executors=dataclasses.replace(spec.executors, **fractions))
    ic = dataclasses.replace(spec.interconnect, topology="switch" if switched else "full-mesh",
                             library_fraction=library)
    if nodes > 1:  # one GPU per node, each node's NIC (the device's) into a fabric
        ic = dataclasses.replace(ic, gpus_per_node=1, nodes=nodes, network="fabric",
                                 nics_per_node=1, nic_bw=NIC_BW, nic_latency_s=NIC_LAT)
    return dataclasses.replace(spec, interconnect=ic)


def _clock_of(spec):
    from emulator.model.clock import RankClock
    from emulator.model.topology import Topology

    return RankClock(0, spec.hbm_bw, Topology(spec.interconnect, 2), spec.dma_engines, 10.0,
                     nics=spec.nics)


def _clock(switched: bool = False, library: float = 1.0, nodes: int = 1, **fractions):
    from emulator.model.cost import CostModel

    spec = _spec(switched, library, nodes, **fractions)
    return _clock_of(spec), CostModel(spec, "fp32")


def _log(clock) -> list:
    return [(e.track, e.name, e.start, e.end) for e in clock.events]


@pytest.mark.parametrize("groups,factor", [(0, UPD), (1, UPD), (4, 1 + (UPD - 1) / 4)])
def test_an_update_delays_only_the_next_access_to_its_bank_group(groups, factor):
    """T3: CCDWL = 2 x CCDL after an op-and-store, where CCDL spaces back-to-back accesses to
    one bank group; with G groups the next access is in the update's group 1/G of the time
    (0: no bank groups modelled, every update pays 2x): an update of B lands in u B / BW
    with u = 1 + (2 - 1) / G, a store in B / BW (links of 10 TB/s: the HBM decides)."""
    from devices.spec import load_device
    from emulator.model import transfers
    from emulator.model.clock import RankClock
    from emulator.model.cost import CostModel
    from emulator.model.topology import Topology

    spec = load_device(str(DEVICE))
    ic = dataclasses.replace(spec.interconnect, link_bw=10e12)
    spec = dataclasses.replace(spec, interconnect=ic, dram_bank_groups=groups)
    clock = RankClock(0, spec.hbm_bw, Topology(ic, 2), spec.dma_engines, 10.0)
    cost = CostModel(spec, "fp32")
    fast = 10e12
    t = 10e-6
    store = transfers.land(clock, cost, t, B, "store", "s")
    update = transfers.land(clock, cost, 20e-6, B, "update", "u")
    # each lands from its first byte's arrival (t - B / 10 TB/s): B or u B at the HBM
    s_end = t - B / fast + B / BW
    u_end = 20e-6 - B / fast + factor * B / BW
    assert _close(store, s_end) and _close(update, u_end)
    assert spec.update_cost == factor
    _same(_log(clock), [("hbm", "s", t, s_end), ("hbm", "u", 20e-6, u_end)])


def test_two_writes_landing_behind_a_switch_share_the_down_port():
    from emulator.model import transfers

    clock, cost = _clock(switched=True)
    t = 10e-6
    first = transfers.land(clock, cost, t, B, "store", "a")
    second = transfers.land(clock, cost, t, B, "update", "b")
    # a: passes the down port from t - B/L (idle) -> t_in = t; lands from t_in - B/L, B at BW
    a_in = t
    a_hbm = (a_in - B / L) + B / BW
    # b: the down port is a's until t, so b passes it in [t, t + B/L]; lands from t_in - B/L
    # = t as an update (u B) at the HBM, idle after a's landing
    b_in = t + B / L
    b_hbm = (b_in - B / L) + UPD * B / BW
    assert _close(first, max(a_in, a_hbm)) and _close(second, max(b_in, b_hbm))
    _same(_log(clock), [("hbm", "a", t, max(a_in, a_hbm)), ("hbm", "b", t, max(b_in, b_hbm))])


@pytest.mark.parametrize("policy,share", [("fr-fcfs", 1.0), ("round-robin", 0.5), ("mca", 0.0)])
def test_a_dma_stream_reserved_after_a_gemm_stage_slows_it_as_if_reserved_first(policy, share):
    """A GEMM stage reads 1 MB at the full HBM from 0 (reserved first, as a stage before a
    command in program order); DMA reads of 200 KB offered at 0.5 us, after the last stage
    (no compute after it in program order), overlap it in modelled time. The policy's
    share of the HBM against compute goes to the DMA whatever the reservation order: it
    takes ``share`` x BW from the stage, and the stage's displaced bytes are served
    before the next one (``settle``): FR-FCFS (all of it) and round-robin (half) delay
    the GEMM by 200 KB / BW; MCA (compute first) leaves the stage alone and the reads wait."""
    from emulator.model.arbitration import CommWindow, policy_named

    gemm, dma = 1e6, 2e5
    clock, _ = _clock()
    hbm = clock.hbm
    assert hbm.reserve(0.0, gemm, None, "gemm reads", compute=True) == (0.0, gemm / BW)
    t = 0.5e-6
    end = hbm.comm(policy_named(policy), t, dma, CommWindow(False), "dma reads")
    if share:  # served at share x BW from t, inside the stage
        assert _close(end, t + dma / (share * BW))
        assert _close(hbm.displaced, dma)
    else:  # in the HBM's first free time: after the stage
        assert _close(end, gemm / BW + dma / BW) and hbm.displaced == 0.0
    nxt = hbm.settle(gemm / BW)  # the next stage starts once the displaced bytes are served
    assert _close(nxt, gemm / BW + (dma / BW if share else 0.0))
    if policy == "fr-fcfs":  # the same DMA reserved before the stage: the same times
        clock2, _ = _clock()
        first = clock2.hbm.comm(policy_named(policy), t, dma, CommWindow(True), "dma reads")
        stage = clock2.hbm.reserve(0.0, gemm, None, "gemm reads", compute=True)
        assert _close(first, end) and _close(stage[1], nxt)


def test_two_writers_arriving_at_once_queue_at_the_destination_port():
    """Two peers each complete a region of B bytes at this switched GPU at t. If their data
    came in together (first arrival = t: an unswizzled reduce-scatter's stage), the down
    port takes one region after the other: the second passes it at t + B/L. If each region
    trickled in since the kernel's start (first arrival 0), both fit in the port's free
    time before t and are in at t."""
    clock, _ = _clock(switched=True)
    t = 10e-6
    assert _close(clock.receive(t, B, since=t), t)  # [t - B/L, t]
    assert _close(clock.receive(t, B, since=t), t + B / L)  # behind it: [t, t + B/L]
    spread, _ = _clock(switched=True)
    assert _close(spread.receive(t, B, since=0.0), t)  # [0, B/L]
    assert _close(spread.receive(t, B, since=0.0), t)  # [B/L, 2 B/L]: before t


def test_without_the_ingress_queue_writers_arriving_together_pass_at_once():
    """The ``ingress`` counterfactual (``ablation.py``): the switched GPU's down port no
    longer queues the two regions that came in together; both are in at t. A full mesh has
    no such port: the ablation leaves its device as it was."""
    from emulator.model.ablation import ablate

    clock, _ = _clock(switched=True)
    spec = ablate(_spec(switched=True), ("ingress",))
    assert not spec.interconnect.ingress_queue and clock.ingress is not None
    free = _clock_of(spec)
    t = 10e-6
    assert free.ingress is None
    assert _close(free.receive(t, B, since=t), t) and _close(free.receive(t, B, since=t), t)
    mesh = _spec()
    assert ablate(mesh, ("ingress",)) == mesh


def test_two_writers_on_other_nodes_arriving_at_once_queue_at_the_receiving_nic():
    """Three nodes of one GPU (full mesh within, a fabric between): GPUs 1 and 2 each
    complete a region of B bytes at GPU 0 at t, all of it from the network. Came in
    together (first arrival t), they pass GPU 0's NIC one after the other: the first in
    [t - B/N, t], the second in [t, t + B/N] (N: the NIC's rate, one GPU per NIC). Bytes
    from this node (network 0) pass no NIC. Without the ingress queue (``ablation.py``)
    both are in at t."""
    from emulator.model.ablation import ablate
    from emulator.model.clock import RankClock
    from emulator.model.topology import Topology

    def clock_of(spec):
        return RankClock(0, spec.hbm_bw, Topology(spec.interconnect, 3), spec.dma_engines,
                         10.0, nics=spec.nics)

    spec = _spec(nodes=3)
    clock, t = clock_of(spec), 10e-6
    assert _close(clock.receive(t, B, since=t, network=B), t)
    assert _close(clock.receive(t, B, since=t, network=B), t + B / NIC_BW)
    assert _close(clock.receive(t, B, since=t), t)  # not from the network: no NIC
    free = clock_of(ablate(spec, ("ingress",)))
    assert _close(free.receive(t, B, since=t, network=B), t)
    assert _close(free.receive(t, B, since=t, network=B), t)


@pytest.mark.parametrize("pattern,share", [("direct", 2), ("ring", 1)])
def test_the_receiving_nic_is_split_among_the_gpus_that_receive_through_it(pattern, share):
    """Two nodes of two GPUs, one NIC each: every GPU receives from the other node in an
    all-to-all (``direct``: each GPU gets N/2 of its NIC, as each sends at N/2), one GPU
    per node in a ring (the whole NIC). A library's channels arrive over all the node's
    NICs; within a node nothing is crossed."""
    from emulator.model.topology import Topology

    spec = _spec(nodes=2)
    ic = dataclasses.replace(spec.interconnect, gpus_per_node=2)
    topo = Topology(ic, 4, pattern)
    hop = topo.receive_hop(0)
    assert hop.port == "nic-in[0.0]" and _close(hop.rate, NIC_BW / share)
    assert topo.receive_hop(0, channels=True).port == "nics-in[0]"
    assert Topology(ic, 2, pattern).receive_hop(0) is None  # one node


def test_pulls_from_two_peers_at_once_queue_at_the_reader_s_down_port():
    """A switched GPU of three pulls B from GPU 1 (engine 0) and B from GPU 2 (engine 1) at
    0: each request crosses (LAT), the data streams over [p0 + 2 LAT, arrived] (arrived =
    p0 + 2 LAT + B/L) on its own peer's direction, but both pass this GPU's down port:
    the second after the first, in at arrived + B/L (as two pushes arriving together)."""
    from emulator.model import transfers
    from emulator.model.cost import CostModel
    from emulator.model.clock import RankClock
    from emulator.model.topology import Topology

    spec = _spec(switched=True)
    clock = RankClock(0, spec.hbm_bw, Topology(spec.interconnect, 3), spec.dma_engines, 10.0)
    cost = CostModel(spec, "fp32")
    first, _ = transfers.dma_pull(clock, cost, clock.dma[0], 0.0, 1, B, "x")
    second, _ = transfers.dma_pull(clock, cost, clock.dma[1], 0.0, 2, B, "y")
    arrived = SETUP + 2 * LAT + B / L
    assert _close(first, arrived) and _close(second, arrived + B / L)


def test_a_route_s_ports_carry_its_bytes_in_the_bottleneck_s_window():
    """PCIe, two sockets of two GPUs, links of L, the CPU link L per direction shared by
    the socket's two GPUs (S = L/2 each). x: 0 -> 2 (up port + CPU link) at S over
    [0, B/S]. y: 0 -> 3 from 0 finds the CPU link full until B/S, so it holds neither port
    before then: both carry it at S over [B/S, 2B/S]. z: 0 -> 1 (up port only) from 0 has
    L - S = S of the up port until 2B/S: done at B/S. (Were y's up port booked from 0,
    z would find it full until B/S and end at B/S + B/L.)"""
    ic = dataclasses.replace(_spec().interconnect, topology="pcie", sockets=2,
                             socket_bw=L, socket_latency_s=LAT)
    from emulator.model.clock import RankClock
    from emulator.model.topology import Topology

    topo = Topology(ic, 4)
    clock = RankClock(0, BW, topo, 1, 10.0)
    S = L / 2
    assert [h.port for h in clock.route(2).hops] == ["port-up[0]", "socket[0.0->1]"]
    assert _close(clock.route(2).rate, S)
    assert _close(clock.send(2, 0.0, B), B / S)
    assert _close(clock.send(3, 0.0, B), 2 * B / S)
    assert _close(clock.send(1, 0.0, B), B / S)
    up, cpu = clock.ports["port-up[0]"], clock.ports["socket[0.0->1]"]
    assert _close(up.busy_bytes, 3 * B) and _close(cpu.busy_bytes, 2 * B)
    # the up port is full (S + S) over [0, B/S], then carries y alone
    assert _close(up.reserve(0.0, B)[0], B / S)


def test_dma_push_and_pull_wait_for_a_busy_engine():
    """Commands queued on a busy engine are set up by its front end while the data path
    is busy (``SerialResource.setup``): their transfers start when the engine frees."""
    from emulator.model import transfers

    clock, cost = _clock()
    engine = clock.executor("dma", 1)
    engine.free_at = 5e-6
    end, arr = transfers.dma_push(clock, cost, engine, 1e-6, 1, B, "x")
    t0 = max(1e-6 + SETUP, 5e-6)  # set up from its queueing at 1 us, then the engine frees
    push_end = max(t0 + B / BW, t0 + B / L)  # HBM read and link from t0
    assert _close(end, push_end) and _close(arr, push_end + LAT)
    landed, _ = transfers.dma_pull(clock, cost, engine, 2e-6, 1, B, "y")
    p0 = max(2e-6 + SETUP, push_end)  # set up at 2.1 us under the push; the engine is the
    link_end = p0 + LAT + B / L  # push's until its end; the request crosses, then B
    arrived = link_end + LAT
    hbm_end = max(p0 + 2 * LAT, arrived - B / L) + B / BW  # lands as it streams in
    assert _close(landed, max(arrived, hbm_end)) and _close(engine.free_at, landed)
    _same(_log(clock), [("dma", "x -> 1", t0, push_end), ("link->1", "dma x", t0, t0 + B / L),
                        ("link<-1", "pull y", p0 + LAT, link_end),
                        ("dma", "y <- 1", p0, max(arrived, hbm_end))])


def test_a_dma_queue_sets_up_the_next_command_under_the_running_transfer():
    """Three pushes of B queued at once on one engine (T3's tile commands): the front end
    sets them up one after another (SETUP each, from 0), the data path runs one transfer
    at a time; only the first set-up is exposed: the k-th transfer starts at
    max((k + 1) SETUP, end of the (k-1)-th) = SETUP + k B / L. Before, every command paid
    its set-up after the previous transfer (k SETUP more for the k-th). A fourth command
    queued late (after the third ends) pays its own set-up in full."""
    from emulator.model import transfers

    clock, cost = _clock()
    engine = clock.executor("dma", 0)
    assert SETUP < B / L  # the set-up hides under one transfer
    want = []
    for k, name in enumerate("abc"):
        end, _ = transfers.dma_push(clock, cost, engine, 0.0, 1, B, name)
        t0 = SETUP + k * B / L
        assert _close(end, t0 + B / L), (k, end)
        want += [("dma", f"{name} -> 1", t0, t0 + B / L),
                 (f"link->1", f"dma {name}", t0, t0 + B / L)]
    late = SETUP + 3 * B / L + 1e-6
    end, _ = transfers.dma_push(clock, cost, engine, late, 1, B, "d")
    assert _close(end, late + SETUP + B / L)
    want += [("dma", "d -> 1", late + SETUP, end), ("link->1", "dma d", late + SETUP, end)]
    _same(_log(clock), want)


def test_nic_puts_share_the_nic_and_the_flag_follows_the_data():
    """Two puts to the GPU of the other node: each crosses the route, the node's NIC port
    (its rate, the fabric's latency); the second waits for the first's bytes."""
    from emulator.model import transfers

    clock, cost = _clock(nodes=2)
    e1, a1 = transfers.nic_put(clock, cost, 0.0, 1, B, "p")
    e2, a2 = transfers.nic_put(clock, cost, 0.0, 1, B, "q")
    # p: HBM read [0, B/BW], NIC [0, B/NIC_BW]; q: HBM after p's read, NIC after p (the
    # earlier reservation keeps its rate)
    p_end = max(B / BW, B / NIC_BW)
    q_end = max(2 * B / BW, 2 * B / NIC_BW)
    assert _close(e1, p_end) and _close(a1, p_end + NIC_LAT)
    assert _close(e2, q_end) and _close(a2, q_end + NIC_LAT)


def test_a_cu_kernel_update_written_locally_after_its_adds():
    from emulator.model import transfers

    clock, cost = _clock()
    cu = clock.executor("cu", 0, 0.25)
    cu.free_at = 3e-6
    end, arrival = transfers.cu_send(clock, cost, cu, 1e-6, 0, 3, B, "update", "z", share=0.25)
    t0 = 3e-6  # max(done, CU kernel free)
    read_end = max(t0 + 3 * B / BW, t0 + (3 - 1) * B / E / (0.25 * FV))  # reads, adds at f Fv
    local = read_end + UPD * B / BW  # a local update after the reads: u B
    assert _close(end, local) and _close(arrival, local) and _close(cu.free_at, local)
    _same(_log(clock), [("cu-kernel", "z -> 0", t0, local)])


def test_each_executor_holds_the_link_for_its_bytes_over_its_own_fraction():
    """Equal footing: copy engine at copy_fraction, SM stores at store_fraction, the
    library's CU kernel at library_fraction, a NIC put at put_fraction of its rate, each
    on the toy device's 100 GB/s link (50 GB/s NIC)."""
    from emulator.model import transfers

    clock, cost = _clock(copy_fraction=0.5, store_fraction=0.25, put_fraction=0.8,
                         library=0.4)
    engine = clock.executor("dma", 0)
    end, arr = transfers.dma_push(clock, cost, engine, 0.0, 1, B, "c")
    t0 = SETUP
    copy_end = t0 + B / (0.5 * L)  # the link at half its peak; the HBM read is faster
    assert _close(end, copy_end) and _close(arr, copy_end + LAT)
    share = transfers.fraction(clock, cost, 1, "store")
    stores_end = transfers.send(clock, 1, copy_end, B, "s", share)
    assert share == 0.25 and _close(stores_end, copy_end + B / (0.25 * L))
    cu = clock.executor("cu", 0, 0.25)
    e_lib, _ = transfers.cu_send(clock, cost, cu, stores_end, 1, 1, B, "store", "l",
                                 share=0.25, executor="library")
    lib_end = stores_end + B / (0.4 * L)  # after the stores on the same link
    assert _close(e_lib, max(lib_end, stores_end + B / BW))
    # a put to the node peer (a GPU-initiated put that stays in the node) crosses the
    # node's link at put_fraction of it, after the stores and the library's kernel
    e_put, a_put = transfers.nic_put(clock, cost, lib_end, 1, B, "p")
    put_end = lib_end + max(B / BW, B / (0.8 * L))
    assert _close(e_put, put_end) and _close(a_put, put_end + LAT)
    _same(_log(clock), [("dma", "c -> 1", t0, copy_end), ("link->1", "dma c", t0, copy_end),
                        ("link->1", "s", copy_end, stores_end),
                        ("link->1", "cu l", stores_end, lib_end),
                        ("cu-kernel", "l -> 1", stores_end, lib_end),
                        ("link->1", "put p", lib_end, put_end),
                        ("nic", "put p -> 1", lib_end, put_end)])
    # across nodes: the NIC port at put_fraction of the NIC's rate, the fabric's latency
    clock, cost = _clock(nodes=2, put_fraction=0.8)
    e_put, a_put = transfers.nic_put(clock, cost, 0.0, 1, B, "p")
    put_end = max(B / BW, B / (0.8 * NIC_BW))
    assert _close(e_put, put_end) and _close(a_put, put_end + NIC_LAT)
