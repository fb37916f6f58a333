"""The library collectives' own cost model: what NCCL (or RCCL) picks for a collective
of B bytes and what its schedule pays, from the libraries' tuning code.

Sources (read from the code, quoted where the tables are set):
- NCCL v2.23.4 ``src/graph/tuning.cc``: base latencies, hardware latencies per link
  kind and protocol, the LL and LL128 bandwidth caps, the ring latency formula, the
  choice of the least predicted time; ``src/enqueue.cc`` (``topoGetAlgoInfo``): fewer
  channels for small messages; ``src/graph/search.cc`` and ``connect.cc``: the channel
  count the topology search finds (speed arrays, channel duplication).
- RCCL (ROCm/rccl at 0cbce2a7, NCCL 2.21.5 based) ``src/graph/tuning.cc``: base
  latencies 12/12/17 us and its tuning models 4 (``gfx90a``, MI200: LL128 on) and 5
  (``gfx942``, MI300X: LL128 off), each with hardware latencies and protocol
  bandwidth ratios.

What a library collective runs in the emulator (``emulator/engine/steps.py``):
the algorithm's schedule (a ring per channel; on a full mesh the library's rings,
one per link, run as direct sends over the same links) on the modelled ports, each
send at ``fraction`` of the route's peak: the preset's ``library_fraction`` (what
the Simple protocol reaches with every channel) x the chosen protocol's share of
Simple's bandwidth (``bw_ratio``: LL's and LL128's factors and caps); each step's data arrives the
protocol's hardware latency (``hw_lat``) after it left, and the kernel pays the
library's base latency once (less the launch the emulator charges anyway) plus the
latency of any step its emulated schedule does not take itself.

Not modelled yet (the library is held to its ring): the tree all-reduce across
nodes, NVLS (NVSwitch multicast on Hopper), CollNet and PAT. All-to-all is NCCL's
grouped send/receive, outside the tuning model: it keeps ``library_fraction`` and
the route's latency.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from emulator.model import params

_NCCL_SRC = "library: NVIDIA/nccl v2.23.4 src/graph/tuning.cc"
# search.cc, connect.cc and tuning.cc rules the model follows (each entry: the line it copies)
RULES = params.table("nccl_rules", {
    "search_max_channels": 16,  # search.cc: at most 16 ring channels from the search
    "dup_speed": 25,  # search.cc ncclTopoDupChannels: duplicate when speed >= 25
    "dup_hopper_speed": 50,  # ... on sm90 not when speed < 50 with more than 4 channels
    "dup_hopper_channels": 4,
    "ll_bw_share": 0.5,  # tuning.cc: LL's busBw x 1/2 (half of each line is flags)
    "ll128_bw_share": 0.92,  # tuning.cc: LL128's busBw x 120/128 (92%)
    "simple_net_overhead": 3,  # tuning.cc: the intra step overhead x 3 for Simple
    "ar_simple_multinode_factor": 1.4,  # tuning.cc: multi-node ring Simple all-reduce
    "ar_simple_multinode_bytes": 64,  # ... when nbytes / (channels x ranks) >= 64
    "thread_step": 128,  # enqueue.cc: threads halved while a multiple of 128
}, "", "NCCL's ring search, protocol caps and latency rules",
    "library: NVIDIA/nccl v2.23.4 src/graph/search.cc, connect.cc, tuning.cc, enqueue.cc")

PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL's collectives (ncclFunc...): the name a Choice shows, passes over the ring (an
# all-reduce: a reduce-scatter then an all-gather, 2 x (n-1) steps)
KINDS = {"ReduceScatter": ("reduce-scatter", 1), "AllGather": ("all-gather", 1),
         "AllReduce": ("all-reduce", 2)}
# the emulator's collective phases (or spans) by the NCCL collective they run
PHASES = {"rs": "ReduceScatter", "ag": "AllGather", "ar": "AllReduce"}


@dataclass(frozen=True)
class Tables:
    """One library version's constants for the ring algorithm (per protocol LL, LL128,
    Simple; latencies in us, bandwidths in GB/s)."""

    name: str
    base_lat: tuple[float, float, float]
    hw_lat_intra: tuple[float, float, float]  # NVLink / XGMI (PCI: ``hw_lat_pci``)
    hw_lat_pci: tuple[float, float, float]
    hw_lat_net: tuple[float, float, float]
    ll_max_bw: tuple[float, float, float]  # by nodes: 1, 2, more
    ll128_per_channel: float  # perChMaxRingLL128Bw
    ll128: bool  # LL128 enabled on this GPU
    bw_ratio: tuple[float, float, float] = (1.0, 1.0, 1.0)  # RCCL: busBw x ratio per protocol
    speeds: tuple[float, ...] = ()  # search.cc's speed array (default: _DEFAULTS')
    hopper: bool = False  # sm90: its speed array and channel-duplication rule
    max_channels: int = 0  # MAXCHANNELS (default: _DEFAULTS')
    net_overhead: float = 0.0  # us per intra step of a multi-node ring (x3 for Simple)


_DEFAULTS = params.table("nccl_defaults", {
    "speeds": (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),  # search.cc, sm80 speedArrayIntra
    "max_channels": 32,  # MAXCHANNELS
    "net_overhead": 1.0,  # tuning.cc: us per intra step of a multi-node ring (Intel host)
}, "us, GB/s", "NCCL's search speeds, channel limit and network step overhead",
    "library: NVIDIA/nccl v2.23.4 src/graph/search.cc, tuning.cc, device.h")


def _tables(name: str, **kw) -> Tables:
    return Tables(name, **{**_DEFAULTS, **kw})


_NCCL = params.table("nccl_latencies", dict(  # NCCL v2.23.4 tuning.cc
    base_lat=(6.6, 14.0, 8.4),  # baseLat[RING]
    hw_lat_intra=(0.6, 1.9, 3.4),  # hwLat[NVLINK][RING]
    hw_lat_pci=(1.0, 2.5, 5.7),  # hwLat[PCI][RING]
    hw_lat_net=(2.7, 4.0, 14.0),  # hwLat[NET][RING]
), "us", "NCCL's ring base and hardware latencies per protocol", _NCCL_SRC)
_RCCL = params.table("rccl_common", dict(  # RCCL tuning.cc: every Ring entry of baseLat; PCI as all its models
    base_lat=(12.0, 12.0, 17.0),
    hw_lat_pci=(2.2, 2.2, 5.7),
    ll_max_bw=(87.7, 22.5, 19.0),  # ASSUMPTION: NCCL's Ampere row of llMaxBws
    ll128_per_channel=20.0,
    max_channels=128,  # RCCL MAXCHANNELS
    net_overhead=2.0,  # NCCL's value for an AMD host CPU
), "us, GB/s", "RCCL's base latencies, PCI latencies, LL caps (NCCL's Ampere row: an "
    "assumption, RCCL keeps none of its own) and channel limit",
    "library: ROCm/rccl @0cbce2a7 src/graph/tuning.cc")

LIBRARIES: dict[str, Tables] = params.table("library_tables", {
    # NCCL llMaxBws / perChMaxRingLL128Bws rows: Ampere (compute capability 8.x), Hopper (9.x)
    "nccl-ampere": _tables("NCCL 2.23.4 (Ampere)", ll_max_bw=(87.7, 22.5, 19.0),
                          ll128_per_channel=20.0, ll128=True, **_NCCL),
    "nccl-hopper": _tables("NCCL 2.23.4 (Hopper)", ll_max_bw=(141.0, 45.0, 35.0),
                          ll128_per_channel=36.7, ll128=True, hopper=True,
                          speeds=(60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3), **_NCCL),
    # tuning_model_4 (gfx90a: LL128 enabled) and tuning_model_5 (gfx942: LL128 off)
    "rccl-mi200": _tables("RCCL (tuning model 4, MI200)", hw_lat_intra=(0.8, 2.2, 3.6),
                         hw_lat_net=(35.4, 87.8, 209.2), bw_ratio=(0.15, 0.41, 1.0),
                         ll128=True, **_RCCL),
    "rccl-mi300": _tables("RCCL (tuning model 5, MI300X)", hw_lat_intra=(0.8, 0.0, 2.1),
                         hw_lat_net=(9.5, 0.0, 320.0), bw_ratio=(0.08, 0.0, 1.0),
                         ll128=False, **_RCCL),
}, "us, GB/s", "each library's tuning rows: LL/LL128 caps, hardware latencies, protocol "
   "bandwidth ratios, speed arrays", "library: NVIDIA/nccl v2.23.4 src/graph/tuning.cc "
   "(llMaxBws, perChMaxRingLL128Bws, sm90 speedArrayIntra); ROCm/rccl @0cbce2a7 "
   "src/graph/tuning.cc (tuning models 4 and 5)")
# enqueue.cc: threads per channel (maxThreads[RING]) and threadThresholds per protocol
_THREADS = params.table("nccl_threads", (512, 640, 512), "threads",
                        "threads per channel per protocol (maxThreads[RING])",
                        "library: NVIDIA/nccl v2.23.4 src/enqueue.cc")
_THREAD_THRESHOLD = params.table("nccl_thread_threshold", (8, 8, 64), "bytes",
                                 "bytes per thread below which a call drops channels",
                                 "library: NVIDIA/nccl v2.23.4 src/enqueue.cc threadThresholds")


@dataclass(frozen=True)
class Choice:
    """What the library runs for one collective call, and its own prediction."""

    library: str
    collective: str
    algorithm: str
    protocol: str
    channels: int  # channels the call runs on (fewer than the communicator's when small;
    # its time is still the prediction's: see ``choose``)
    comm_channels: int
    nbytes: int
    busbw_gb_per_s: float  # the call's bus bandwidth (the prediction's, whatever its channels)
    predicted_us: float  # the library's predicted time (latency + bytes / algbw)
    latency_us: float
    bw_ratio: float  # the call's share of the Simple protocol's full bus bandwidth
    hw_lat_intra_s: float
    hw_lat_net_s: float
    fixed_s: float  # charged once at the kernel's start (base latency beyond the launch,
    # latency of library steps its emulated schedule does not take)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return (f"{self.library}: {self.algorithm}/{self.protocol}, {self.channels} "
                f"channel(s)")


def _channels(tables: Tables, busbw: float) -> tuple[int, int, float]:
    """(search channels after duplication, communicator channels, GB/s per search
    channel): search.cc tries the speeds from the highest and keeps the most total
    bandwidth (at most 16 ring channels), ncclTopoDupChannels doubles them (speed / 2)
    when the speed is >= 25 (on sm90 not when it is < 50 with more than 4 channels),
    and the communicator runs 2 channels per search channel (connect.cc)."""
    best = (0.0, 1, busbw)
    for speed in tables.speeds:
        n = min(RULES["search_max_channels"], int(busbw // speed))
        if n >= 1 and n * speed > best[0] + 1e-9:
            best = (n * speed, n, float(speed))
    _, n, speed = best
    if speed >= RULES["dup_speed"] and not (tables.hopper and speed < RULES["dup_hopper_speed"]
                                            and n > RULES["dup_hopper_channels"]):
        n, speed = 2 * n, speed / 2
    return n, min(tables.max_channels, 2 * n), speed


def choose(tables_name: str, kind: str, nbytes: int, ranks: int, nodes: int,
           busbw_simple: float, pci: bool, launch_s: float = 0.0,
           schedule_steps: int | None = None) -> Choice:
    """NCCL's (RCCL's) ring choice for a ``kind`` (a key of ``KINDS``) of ``nbytes`` (NCCL's
    count: the whole gathered or scattered buffer) over ``ranks`` GPUs on ``nodes``
    nodes; ``busbw_simple``: GB/s the Simple protocol reaches with every channel (the
    bottleneck of the ring's ports, x ``library_fraction``); ``pci``: the intra-node
    links are PCIe. ``schedule_steps``: dependent steps the emulated schedule takes
    itself (default: the ring's)."""
    t = LIBRARIES[tables_name]
    n = max(1, ranks)
    shown, passes = KINDS[kind]
    nsteps = passes * (n - 1)
    inter_steps = passes * (nodes - 1)
    search_ch, comm_ch, _ = _channels(t, busbw_simple)
    hw_intra = t.hw_lat_pci if pci else t.hw_lat_intra
    node_row = 0 if nodes == 1 else (1 if nodes == 2 else 2)
    best = None
    for p, proto in enumerate(PROTOCOLS):
        if proto == "LL128" and not t.ll128:
            continue
        bus = busbw_simple * t.bw_ratio[p]
        if proto == "LL":
            bus = min(t.ll_max_bw[node_row], bus * RULES["ll_bw_share"])
        elif proto == "LL128":
            bus = min(bus * RULES["ll128_bw_share"], search_ch * t.ll128_per_channel)
        if bus <= 0:
            continue
        overhead = t.net_overhead * (RULES["simple_net_overhead"] if proto == "Simple" else 1) \
            if nodes > 1 else 0.0
        lat = (t.base_lat[p] + (nsteps - inter_steps) * max(hw_intra[p], overhead)
               + inter_steps * t.hw_lat_net[p])
        if kind == "AllReduce" and proto == "Simple" and nodes > 1 and \
                nbytes / (comm_ch * n) >= RULES["ar_simple_multinode_bytes"]:
            lat *= RULES["ar_simple_multinode_factor"]  # tuning.cc: multi-node ring Simple AR
        algbw = bus * n / max(1, nsteps)
        time_us = lat + nbytes / (1e3 * algbw)
        if best is None or time_us < best[0]:
            best = (time_us, p, proto, bus, lat)
    time_us, p, proto, bus, lat = best
    nc, nt = comm_ch, _THREADS[p]
    threshold = _THREAD_THRESHOLD[p] * (n if proto == "LL" else 1)
    # enqueue.cc (topoGetAlgoInfo): once the algorithm and protocol are chosen from the
    # predicted times, a small call runs on fewer channels (then fewer threads) so that
    # every thread has at least its threshold of bytes. The prediction is not redone:
    # the channels dropped are those a latency-bound call does not need (each thread
    # still sends one protocol line per step), so the call runs at the predicted bus
    # bandwidth and the emulated call and the prediction are one model.
    while nbytes < nc * nt * threshold:
        if nc > 1:
            nc -= 1
        elif nt % RULES["thread_step"] == 0:
            nt //= 2
        else:
            break
    call_bus = bus
    own = n - 1 if schedule_steps is None else schedule_steps
    hw_intra_s, hw_net_s = hw_intra[p] * 1e-6, t.hw_lat_net[p] * 1e-6
    fixed = max(0.0, t.base_lat[p] * 1e-6 - launch_s) + max(0, nsteps - own * passes
                                                             ) * hw_intra_s
    return Choice(t.name, shown, "ring", proto, nc, comm_ch, int(nbytes),
                  round(call_bus, 3), round(time_us, 3), round(lat, 3),  # not a parameter: the record's rounding
                  call_bus / busbw_simple, hw_intra_s, hw_net_s, fixed)


def simple_busbw(ic, per_node: int, nodes: int, world: int) -> float:
    """GB/s the library's ring reaches with the Simple protocol and every channel: the
    slowest of its ports x ``library_fraction``. Intra-node: a GPU's link (switch or PCIe
    port, a ring link; the socket link a PCIe ring crosses; on a full mesh the rings, one
    per link, use every link); across nodes the channels' rings spread over every NIC of
    a node (search.cc: NICs round-robin over channels)."""
    rates = []
    local = min(per_node, world)
    if local > 1:
        links = local - 1 if ic.topology == "full-mesh" else 1
        rate = ic.link_bw * links
        if ic.topology == "pcie" and ic.sockets > 1 and ic.socket_bw:
            rate = min(rate, ic.socket_bw)
        rates.append(rate * ic.library_fraction)
    if nodes > 1:
        nics = 1 if ic.network == "torus2d" else max(1, ic.nics_per_node)
        rates.append(nics * ic.nic_bw * ic.library_fraction_network)
    return min(rates) / 1e9 if rates else 0.0


def for_problem(spec, topology, phase: str, nbytes: int, schedule: str) -> Choice | None:
    """The library's choice for the run's collective ``phase`` (a key of ``PHASES``; None:
    the preset names no library, T3's simulator runs its own ring kernels at the links'
    rates; or the phase is no ring collective of the tuning model)."""
    ic = spec.interconnect
    kind = PHASES.get(phase)
    if not ic.library or kind is None or topology.world < 2:
        return None
    busbw = simple_busbw(ic, topology.per_node, topology.nodes, topology.world)
    pci = ic.library_link == "pci" or ic.topology == "pcie"
    steps = 1 if schedule == "direct" else topology.world - 1
    return choose(ic.library, kind, nbytes, topology.world, topology.nodes, busbw, pci,
                  spec.launch_s, steps)
