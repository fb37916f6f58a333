"""Every modelled-time formula of data movement, once (the cost model's transfer half).

Symbols as in ``emulator/model/cost.py``; L = link bytes/s per direction, lat =
link latency, e = bytes per element. Each function reserves the resources it
uses on a rank's ``RankClock``, logs the modelled event it makes, and (for the
executors) returns (end: when the executor is done, arrival: when the data is
usable at its destination).

- ``send``: B bytes leave on the route to the receiver (``topology.py``: a link,
  or a switch's up port, an inter-socket link, a NIC share; every port of the
  route streams them together, in each interval at the rate the busiest leaves,
  at most the slowest one's) from ``ready`` until ``link_end``; the last byte
  arrives at ``link_end + lat`` (lat: the route's latency, the sum of its hops'). Every executor achieves its own share of the
  route's peak (``fraction``: the preset's ``[executors]`` figures, the library's
  ``library_fraction`` x its protocol's share): it holds the ports for
  B / fraction bytes' time.
- ``land``: B bytes whose last byte arrived at ``t_arrival`` pass the
  receiver's ports (its NIC's receive side for those from other nodes across a
  fabric, then a switch's down port; from ``since`` on when producers' stores sent
  them over a whole kernel, see ``RankClock.receive``), and land in its HBM as they stream in, from
  ``t_in - B / L`` on, costing B (store) or ``update_cost`` x B (update) of
  HBM time under the arbitration policy, plus the read/write turnaround when a
  GEMM stage reads alongside (``Dram.write_cost``); usable at max(t_in, landed).
- Every DMA command is queued on its engine when triggered; the engine's front end
  sets commands up (``dma_setup_s``: fetch, decode, schedule) one after another while
  the data path moves earlier commands' data, and a command's transfer starts when its
  set-up and the engine's previous transfer are both done (``SerialResource.setup``):
  commands queued behind a running transfer hide their set-up under it (DMA-Latte,
  arXiv 2511.06605, breaks an MI300X DMA transfer's latency into command scheduling
  and synchronisation; the values are the presets').
- ``dma_push``: the source read is issued to the DRAM as soon as the command is
  set up (T3: "RS reads of a stage's regions, issued as soon as both copies
  have landed"; commands in issue order), while the link transfer starts as above,
  at ``copy_fraction`` of the route's peak; the engine is busy until both end.
- ``dma_pull``: the engine on the reader: its set-up, the request crosses
  the link (lat), the data crosses the peer->reader direction (at
  ``copy_fraction`` of its peak) and the reader's ports (a switch's down port, the
  NIC's receive side: shared with all it receives, ``RankClock.receive``), lands in the
  reader's HBM as it streams (a store); usable at max(last byte + lat, landed).
- ``dma_copy``: a device-local copy (gather, scatter) on an engine: its set-up
  as above, then the source read and the destination write stream
  through the HBM together (2 B under the arbitration policy); usable when written.
- ``flag_put``: a signal with no data: its set-up on the engine, then lat.
- ``nic_put`` (GPU-initiated, ROC_SHMEM style): the issuing WG has paid
  ``nic_issue_s`` per put and per flag put and ``put_fence_s`` between them
  (charged by the kernel); the NIC reads the source at the HBM while it sends on the
  route (``send``: its NIC port, shared with every other transfer through it) at
  ``put_fraction`` of the route's peak; the flag put, ordered behind the data by the
  fence, arrives with it: usable at end + the route's latency.
- ``cu_send``: a CU-driven kernel step on ``share`` of the CUs: read the local
  copies (each B) at the HBM, add them (vector FLOPs at ``share`` of the
  vector rate), then write the sum locally (B, or ``update_cost`` x B) or
  send it on the link while the reads stream, at the share of the route's peak its
  kind achieves (``fraction``: the library's kernels' ``library_fraction``, or
  another CU kernel's stores' ``store_fraction``).
"""

from __future__ import annotations

from emulator.model.arbitration import Alone, CommWindow
from emulator.model.clock import RankClock
from emulator.model.cost import CostModel

_EXCLUSIVE = Alone()
_ALONE = CommWindow()


def _absorb(clock: RankClock, cost: CostModel, first: float, last: float, nbytes: float,
            op: str, policy, window: CommWindow, steady: bool = False) -> float:
    """When the HBM has absorbed ``nbytes`` written as ``op`` that stream in from ``first``
    to ``last`` (offered to the DRAM as they come), under ``policy`` (``steady``: as one
    stream, ``Dram.stream``)."""
    cost_bytes = clock.hbm.write_cost(nbytes, op, cost.spec.update_cost,
                                      window.compute_after)
    rate = cost_bytes / (last - first) if last > first else None
    serve = clock.hbm.stream if steady else clock.hbm.comm
    return serve(policy, first, cost_bytes, window, f"landing {op}s", rate)


def fraction(clock: RankClock, cost: CostModel, dst: int, executor: str) -> float:
    """The share of the route's peak ``executor`` (``devices.spec.EXECUTORS``: "store",
    "copy", "put", "library") achieves to ``dst``: the preset's ``[executors]`` fractions,
    the library's ``library_fraction`` (``[network] library_fraction`` across nodes);
    every other transfer that leaves the node goes through a NIC at ``put_fraction``."""
    ic = clock.topology.ic
    return cost.spec.executors.fraction(
        executor, ic.library_fraction, clock.topology.crosses_network(clock.rank, dst),
        ic.library_fraction_network)


def library_send(clock: RankClock, cost: CostModel, dst: int, choice=None) -> tuple[float,
                                                                                   float]:
    """(share of the route's peak, latency to ``dst``) of a step of a library collective:
    ``library_fraction`` x its protocol's share (``choice``: the library's ``Choice``,
    ``emulator/model/library.py``; None: no library model, the preset's own ring
    kernels, at the route's latency), arriving the protocol's per-step hardware latency
    after it left: the library's own measured latency of a step over that kind of link
    (tuning.cc's hwLat, the link included), so that the emulated call and the library's
    prediction are one model (the preset's link latency, often an ASSUMPTION,
    is for the other executors)."""
    share, lat = fraction(clock, cost, dst, "library"), clock.latency(dst)
    if choice is not None:
        share *= choice.bw_ratio
        if clock.topology.ic.library_latency:  # (the library-latency counterfactual: the
            lat = (choice.hw_lat_net_s if clock.topology.crosses_network(clock.rank, dst)
                   else choice.hw_lat_intra_s)  # route's own latency, as any executor's)
    return share, lat


def send(clock: RankClock, dst: int, ready: float, nbytes: float, what: str,
         fraction: float = 1.0, channels: bool = False) -> float:
    """Reserve the route to ``dst`` for ``nbytes`` from ``ready`` (``fraction``: the sender's
    achieved share of its peak, see ``fraction()``; ``channels``: a library collective's
    channels' route, ``Topology.route``); return when the last byte has left."""
    link_end = clock.send(dst, ready, nbytes, fraction, channels)
    clock.log(f"link->{dst}", what, ready, link_end, bytes=nbytes)
    return link_end


def land(clock: RankClock, cost: CostModel, t_arrival: float, nbytes: float, op: str,
         what: str, policy=_EXCLUSIVE, window: CommWindow = _ALONE,
         log_hbm_end: bool = False, since: float | None = None, steady: bool = False,
         network: float = 0.0, channels: bool = False, writers: int = 1) -> float:
    """When ``nbytes`` received (last byte at ``t_arrival``; ``network`` of them from other
    nodes, ``channels``: over a library collective's channels; ``writers``: peers that sent
    them at once, each over its own link where the GPU has one per peer) are usable in
    this HBM. The
    logged event runs from the arrival until they are usable, or (``log_hbm_end``, a CU
    kernel's wait) is the HBM's absorption of them, from the first byte's landing on."""
    t_in = clock.receive(t_arrival, nbytes, since, network, channels)
    first = clock.streamed_from(t_in, nbytes, writers)
    absorbed = _absorb(clock, cost, first, t_in, nbytes, op, policy, window, steady)
    landed = max(t_in, absorbed)
    if log_hbm_end:
        clock.log("hbm", what, first, absorbed)
    else:
        clock.log("hbm", what, t_arrival, landed)
    return landed


def dma_push(clock: RankClock, cost: CostModel, engine, done: float, dst: int, nbytes: float,
             what: str, policy=_EXCLUSIVE, window: CommWindow = _ALONE,
             steady: bool = False) -> tuple[float, float]:
    """A DMA transfer of ``nbytes`` to ``dst`` once its trigger is ``done``; its arrival
    (``steady``: the engine reads as it sends, at the route's rate)."""
    t0 = engine.setup(done, cost.spec.dma_setup_s)
    issue = max(engine.fetched_at, engine.issued_at)  # reads issued once set up
    engine.issued_at = issue
    share = fraction(clock, cost, dst, "copy")
    if steady:
        read_end = clock.hbm.stream(policy, t0, nbytes, window, "dma reads",
                                    clock.route(dst).rate * share)
    else:
        read_end = clock.hbm.comm(policy, issue, nbytes, window, "dma reads")
    link_end = clock.send(dst, t0, nbytes, share)
    end = max(read_end, link_end)
    engine.free_at = end
    clock.log("dma", f"{what} -> {dst}", t0, end, bytes=nbytes)
    clock.log(f"link->{dst}", f"dma {what}", t0, link_end, bytes=nbytes)
    return end, end + clock.latency(dst)


def dma_pull(clock: RankClock, cost: CostModel, engine, done: float, src: int, nbytes: float,
             what: str, policy=_EXCLUSIVE, window: CommWindow = _ALONE) -> tuple[float, float]:
    """A DMA get of ``nbytes`` from ``src`` into this HBM; when the data is usable here."""
    lat = clock.topology.route(src, clock.rank).latency
    t0 = engine.setup(done, cost.spec.dma_setup_s)
    link_start = t0 + lat  # the read request reaches the peer
    link = clock.link_in(src)
    share = fraction(clock, cost, src, "copy")  # (the same route, the other direction)
    link_end = link.reserve(link_start, nbytes / share)[1]
    clock.log(f"link<-{src}", f"pull {what}", link_start, link_end, bytes=nbytes)
    arrived = link_end + lat
    first = max(link_start + lat, arrived - nbytes / (link.rate * share))
    network = nbytes if clock.topology.crosses_network(src, clock.rank) else 0.0
    t_in = clock.receive(arrived, nbytes, since=first, network=network)  # the reader's ports,
    if t_in > arrived:  # shared with everything else it receives (pushes, its other pulls)
        arrived, first = t_in, max(first, t_in - nbytes / clock.link_bw)
    landed = max(arrived, _absorb(clock, cost, first, arrived, nbytes, "store", policy, window))
    engine.free_at = landed
    clock.log("dma", f"{what} <- {src}", t0, landed, bytes=nbytes)
    return landed, landed


def dma_copy(clock: RankClock, cost: CostModel, engine, done: float, nbytes: float,
             what: str, policy=_EXCLUSIVE, window: CommWindow = _ALONE) -> tuple[float, float]:
    """A local copy of ``nbytes`` on a DMA engine once its trigger is ``done``; when the
    copy is usable."""
    t0 = engine.setup(done, cost.spec.dma_setup_s)
    end = clock.hbm.stream(policy, t0, 2 * nbytes, window, "dma copies")
    engine.free_at = end
    clock.log("dma", f"copy {what}", t0, end, bytes=nbytes)
    return end, end


def flag_put(clock: RankClock, cost: CostModel, engine, done: float, dst: int,
             what: str) -> tuple[float, float]:
    """A signal with no data (a stream write of a flag) once ``done``; its arrival."""
    t0 = engine.setup(done, cost.spec.dma_setup_s)
    engine.free_at = t0
    clock.log("dma", f"flag {what} -> {dst}", done, t0)
    return t0, t0 + clock.latency(dst)


def nic_put(clock: RankClock, cost: CostModel, done: float, dst: int, nbytes: float,
            what: str, policy=_EXCLUSIVE, window: CommWindow = _ALONE) -> tuple[float, float]:
    """A GPU-initiated put (+ fence + flag put) issued at ``done``; when the flag arrives.
    It crosses the route to ``dst`` (the NIC's port shared with every other transfer
    that leaves through it, and the route's latency: a torus's further hops included)."""
    read_end = clock.hbm.comm(policy, done, nbytes, window, "nic reads")
    nic_end = send(clock, dst, done, nbytes, f"put {what}", fraction(clock, cost, dst, "put"))
    end = max(read_end, nic_end)
    clock.log("nic", f"put {what} -> {dst}", done, end, bytes=nbytes)
    return end, end + clock.latency(dst)


def cu_send(clock: RankClock, cost: CostModel, cu, done: float, dst: int, copies: int,
            nbytes: float, op: str, what: str, policy=_EXCLUSIVE,
            window: CommWindow = _ALONE, share: float = 1.0,
            steady: bool = False, executor: str = "store") -> tuple[float, float]:
    """A CU kernel step: read ``copies`` local copies of ``nbytes``, add, write locally
    (``dst`` = this rank) or send to ``dst``; when the result is usable there (``steady``:
    a send's reads stream at its link rate; ``executor``: "library", the library's
    kernel, or "store", another kernel's stores)."""
    t0 = max(done, cu.free_at)
    if steady and dst != clock.rank:
        read_end = clock.hbm.stream(policy, t0, copies * nbytes, window, "cu-kernel reads",
                                    clock.route(dst).rate * fraction(clock, cost, dst,
                                                                     executor))
    else:
        read_end = clock.hbm.comm(policy, t0, copies * nbytes, window, "cu-kernel reads")
    vec = cost.spec.vector_flops(cost.dtype)
    if copies > 1 and vec:
        read_end = max(read_end, t0 + (copies - 1) * nbytes / cost.e / (share * vec))
    if dst == clock.rank:
        end = arrival = clock.hbm.comm(policy, read_end, cost.update_cost_bytes(nbytes, op),
                                       window, "cu-kernel writes")
    else:
        link_end = send(clock, dst, t0, nbytes, f"cu {what}",
                        fraction(clock, cost, dst, executor))
        end = max(read_end, link_end)
        arrival = end + clock.latency(dst)
    cu.free_at = end
    clock.log("cu-kernel", f"{what} -> {dst}", t0, end, bytes=nbytes)
    return end, arrival
