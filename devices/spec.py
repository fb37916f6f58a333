"""Device and interconnect specifications, loaded from TOML presets or user files.

A spec is a frozen dataclass in SI units (Hz, bytes, bytes/s, seconds); the TOML
files use the units engineers read datasheets in (GHz, MB, GB/s, ns) and every
preset names its sources in comments.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.schema import OMIT, REQUIRED, Key, SpecError, Table, check, flat

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESET_DIR = Path(__file__).parent / "presets"
DEFAULT_PRESET = "t3-sim"
TOPOLOGIES = ("ring", "full-mesh", "switch", "pcie")  # the same names as collectives.TOPOLOGIES
NETWORKS = ("fabric", "torus2d")  # inter-node networks (systems of several nodes)
DTYPES = ("fp16", "bf16", "fp32")
PARTIAL_STAGES = ("slots", "spread")
# collective libraries with a tuning model (``emulator/model/library.py`` holds the tables)
LIBRARIES = ("nccl-ampere", "nccl-hopper", "rccl-mi200", "rccl-mi300")


@dataclass(frozen=True)
class InterconnectSpec:
    """How the GPUs of a job are connected: the intra-node topology and, for a system of
    several nodes, the network between the nodes (``emulator/model/topology.py`` turns
    it into routes through ports)."""

    topology: str  # intra-node: ring, full-mesh, switch or pcie
    link_bw: float  # bytes/s per direction of one link (or switch / PCIe port)
    link_latency_s: float
    links: int = 7  # peer links (or switch ports) per device
    # PCIe: GPUs behind PCIe switches under ``sockets`` CPU sockets joined by a CPU link
    sockets: int = 1
    socket_bw: float = 0.0  # bytes/s per direction of the inter-socket link
    socket_latency_s: float = 0.0
    # a system of several nodes (0: every rank of the job on one node)
    gpus_per_node: int = 0
    nodes: int = 1
    network: str = ""  # "", "fabric" (NICs into a non-blocking fabric) or "torus2d"
    nics_per_node: int = 0
    nic_bw: float = 0.0  # bytes/s per NIC per direction
    nic_latency_s: float = 0.0  # end to end through the fabric (torus: to the first node)
    torus: tuple[int, int] = (0, 0)  # nodes along x and y (torus2d)
    torus_hop_latency_s: float = 0.0  # each further node a torus route passes
    # what a library collective (NCCL/RCCL) achieves of the link (and NIC) peak
    library_fraction: float = 1.0
    library_fraction_network: float = 1.0
    # the collective library whose tuning model times the library collectives
    # (``emulator/model/library.py``: "nccl-ampere", "nccl-hopper", "rccl-mi200",
    # "rccl-mi300"; "": none, T3's simulator runs its own ring kernels at link rate)
    library: str = ""
    library_link: str = ""  # "pci": the library sees PCIe links (NCCL's PCI latencies)
    # a switch's (or PCIe's) down port queues the writers of one receiver one after another
    # (the hardware; False only in the ``ingress`` counterfactual, ``ablation.py``)
    ingress_queue: bool = True
    # the library's own latency: its base latency per call and its protocols' per-step
    # latency (False only in the ``library-latency`` counterfactual, ``ablation.py``)
    library_latency: bool = True

    def gpus_on_node(self, world: int) -> int:
        return self.gpus_per_node or world

    def links_needed(self, world: int) -> int:
        """Intra-node links each device of a ``world``-GPU job uses on this topology."""
        local = min(world, self.gpus_on_node(world))
        if local <= 1:
            return 0
        return {"ring": min(2, local - 1), "full-mesh": local - 1, "switch": 1,
                "pcie": 1}[self.topology]


# the ways a GPU moves data to a peer (``ExecutorSpec``; ``t3emu devices`` lists them)
EXECUTORS = {
    "store": "SM/CU stores into a peer's HBM (a producing kernel's epilogue, a fused or "
             "persistent kernel's puts over the link)",
    "copy": "copy engine / SDMA transfer (push or pull) over the link",
    "put": "NIC RDMA write (GPU-initiated put; any transfer but the library's that "
           "crosses nodes), of the NIC's line rate",
    "library": "the collective library's kernel (NCCL/RCCL: [interconnect] and [network] "
               "library_fraction, with its protocol's share from its tuning model)",
}


@dataclass(frozen=True)
class ExecutorSpec:
    """What each way of moving data achieves of its port's peak, and its fixed costs
    (``emulator/model/transfers.py`` charges them; the library's fractions are the
    interconnect's ``library_fraction``). A device file states every one with its source
    (``[executors]``): none moves at the port's peak by omission. The defaults are for
    specs built in code only."""

    store_fraction: float = 1.0  # a kernel's stores into a peer's HBM, of the link's peak
    copy_fraction: float = 1.0  # a copy engine's transfer, of the link's peak
    put_fraction: float = 1.0  # a NIC's RDMA write, of the NIC's line rate
    put_fence_s: float = 0.0  # a WG's fence between a put and its flag put (ordering)
    sources: dict = field(default_factory=dict)  # executor -> where its figures come from

    def fraction(self, executor: str, library: float, crosses_network: bool,
                 library_network: float) -> float:
        """The share of the route's peak ``executor`` (a key of ``EXECUTORS``) achieves;
        ``library``/``library_network``: the library's own fractions."""
        if crosses_network:  # every byte leaving the node goes through a NIC
            return library_network if executor == "library" else self.put_fraction
        if executor == "library":  # (only the fraction asked for is read: the causes
            return library  # split skips a step whose changed fields a run never read)
        if executor == "store":
            return self.store_fraction
        if executor == "copy":
            return self.copy_fraction
        if executor == "put":
            return self.put_fraction
        raise KeyError(executor)


@dataclass(frozen=True)
class DramSpec:
    """The memory controller in front of the HBM (``emulator/model/dram.py``). Defaults:
    T3 Table 1's HBM2 as GPGPU-Sim models it (the simulator family T3 builds on)."""

    channels: int = 0  # 0: one per 32 GB/s of HBM bandwidth (an HBM2 channel at 1 GHz DDR)
    queue_depth: int = 64  # requests per channel queue (GPGPU-Sim's FR-FCFS queue: 64)
    access_bytes: int = 64  # bytes per DRAM request
    turnaround_s: float = 14e-9  # tWTR + tRTW of one read->write->read bus turnaround
    write_batch: int = 12  # writes served per turnaround (write-queue drain, 28 -> 16)
    burst_bytes: int = 64 << 10  # requests the model batches into one burst
    # ASSUMPTION: a communication request held back by an arbitration policy is issued
    # anyway once it has waited 1,000 DRAM command cycles (1 us at HBM2's 1 GHz): T3 names
    # a wait limit (anti-starvation) but not its value; 1,000 cycles is a common
    # starvation counter (an order above a full queue's drain, 128 ns, so compute's read
    # bursts keep their priority) and far below a GEMM stage (tens of us), so no stream
    # waits for a whole stage.
    starvation_s: float = 1e-6
    banks: int = 0  # DRAM banks of the whole HBM (0: row switches between streams not modelled)
    row_miss_cost: float = 1.0  # channel time of an access that misses the open row, in hits
    shared: bool = True  # communication shares the compute stream's queues (the hardware);
    # False only in the ``contention`` counterfactual (``emulator/model/ablation.py``)

    def channels_for(self, hbm_bw: float) -> int:
        return self.channels or max(1, round(hbm_bw / 32e9))


@dataclass(frozen=True)
class TileShape:
    """A thread-block tile the library ships: tm x tn output, tk per K step, ``stages``
    K steps in the software pipeline, ``per_cu`` WGs resident per CU."""

    m: int
    n: int
    k: int
    stages: int
    per_cu: int

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass(frozen=True)
class GemmSpec:
    """The GEMM kernels a device's vendor library ships (``[gemm]``;
    ``emulator/model/gemm.py`` chooses one per problem and times it)."""

    tiles: tuple[TileShape, ...]
    mainloop_efficiency: float  # a large GEMM's main loop, of the matrix peak (measured)
    source: str = ""  # where the tiles and the efficiency come from
    enabled: bool = True  # False: listed (``t3emu gemm``) but runs keep the fixed tile
    stream_k: bool = False  # the library's heuristic may pick stream-K kernels (split-K it
    # always may: cuBLASLt's and hipBLASLt's algorithms split K)


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    description: str
    cus: int
    clock_hz: float
    flops_per_cycle_per_cu: dict[str, int]  # dtype -> dense matrix FLOP/cycle/CU (bf16:
    # listed for the record; runs compute in fp16 or fp32)
    wg_tile_m: int
    wg_tile_n: int
    wgs_per_cu: int
    l2_bytes: int
    hbm_bw: float  # bytes/s
    nmc_update_cost: float  # time of an op-and-store relative to a plain write (CCDWL/CCDL)
    dma_engines: int
    dma_setup_s: float
    interconnect: InterconnectSpec
    source: str = ""
    # optional keys (absent from a device file: the defaults below)
    vector_flops_per_cycle_per_cu: dict[str, int] | None = None  # dtype -> FLOP/cycle/CU of
    # the vector ALUs (GEMV, reductions); None: their FLOPs are not timed (memory-bound)
    launch_s: float = 0.0  # cost of each kernel launch (the GPU-side gap between kernels)
    launch_source: str = ""  # where launch_s comes from
    matrix_efficiency: float = 1.0  # the fixed tile's GEMM stages' share of the matrix peak
    # (a device without [gemm]; 1: at the peak)
    hbm_datasheet: float = 0.0  # bytes/s the datasheet gives (``hbm_bw`` is the measured
    # sustained rate where the preset has one: x ``[memory] sustained_fraction``)
    hbm_sustained_source: str = ""
    arch: str = ""  # "sm80", "sm90", "gfx90a", "gfx942" ("" : not a vendor's GPU)
    nics: int = 0  # GPU-initiated network interfaces (0: none)
    nic_bw: float = 0.0  # bytes/s per NIC per direction
    nic_latency_s: float = 0.0
    nic_issue_s: float = 0.0  # a WG's cost to issue one put (or flag put)
    system: str = ""  # the system preset this device sits in ("" : the GPU file alone)
    dram: DramSpec = DramSpec()  # the memory controller ([memory] dram_* keys)
    wg_raster_group: int = 1  # WG rasterisation: 1 row-major, G > 1 grouped by G tile rows
    partial_stage: str = "slots"  # a stage of fewer WGs than slots: "slots" (each at 1/S of
    # the peak, T3's model) or "spread" (over the CUs first: ceil(n / CUs) per CU)
    atomic_dtypes: tuple[str, ...] = ("fp16", "fp32")  # dtypes with native atomic adds
    # ([compute] atomic_dtypes): what a configuration reducing by atomics (Flux's RS-A) needs
    max_wgs_per_cu: int = 0  # resident WGs per CU of a light memory-bound kernel (embedding
    # pooling, GEMV): the occupancy limit of persistent grids (0: wgs_per_cu)
    mem_latency_s: float = 0.0  # loaded DRAM latency a WG's reads see (0: not modelled)
    l2_bw: float = 0.0  # bytes/s the L2 serves the CUs (0: not modelled; the GEMM kernel
    # model's bound on a K step's panel loads)
    wg_inflight_bytes: int = 0  # read bytes one WG of a memory-bound kernel keeps in flight
    # (with mem_latency_s: its rate is at most inflight / latency, Little's law)
    dram_banks: int = 0  # DRAM banks of the whole HBM (0: row locality not modelled)
    dram_bank_groups: int = 0  # bank groups per channel: an update's CCDWL delays only the
    # next access to its group (``update_cost``; 0: every update pays nmc_update_cost)
    dram_row_miss_cost: float = 1.0  # channel time of a DRAM access that misses the open
    # row, relative to a row hit
    comm_through_l2: bool = False  # communication's HBM traffic (copy engines' reads and
    # writes, peers' writes landing) passes through the cache the model's L2 stands for and
    # allocates there (a memory-side cache), sharing its capacity with a running kernel
    executors: ExecutorSpec = ExecutorSpec()  # each data mover's share of peak and fixed costs
    gemm: GemmSpec | None = None  # the library's GEMM kernels ([gemm]; None: one fixed tile
    # of wg_tile_m x wg_tile_n at the peak)

    @property
    def update_cost(self) -> float:
        """HBM time of an op-and-store update relative to a write. T3: an update raises the
        column-to-column delay after it to CCDWL = ``nmc_update_cost`` x CCDL, and CCDL
        (the burst's own time) governs back-to-back accesses to the same bank group; an
        access to another group follows after CCDS, which the burst covers. With accesses
        spread evenly over ``dram_bank_groups`` groups (no bank-group-aware reordering:
        ASSUMPTION) the next access is in the same group with probability 1/G, so an
        update costs 1 + (nmc_update_cost - 1) / G writes; without bank groups
        (``dram_bank_groups`` = 0) every update pays the whole ``nmc_update_cost``."""
        g = self.dram_bank_groups
        return 1.0 + (self.nmc_update_cost - 1.0) / g if g else self.nmc_update_cost

    @property
    def max_resident_wgs(self) -> int:
        """Resident WGs of a light memory-bound kernel: the persistent grid's maximum."""
        return self.cus * (self.max_wgs_per_cu or self.wgs_per_cu)

    @property
    def put_issue_s(self) -> float:
        """A WG's cost of one GPU-initiated put: issue it, fence, issue its flag put."""
        return 2 * self.nic_issue_s + self.executors.put_fence_s

    @property
    def wgs_per_stage(self) -> int:
        """WG tiles the CUs hold at once: one GEMM stage (T3)."""
        return self.cus * self.wgs_per_cu

    def peak_flops(self, dtype: str) -> float:
        """Dense matrix FLOP/s of the whole device (CUs x clock x FLOP/cycle/CU)."""
        return self.cus * self.clock_hz * self.flops_per_cycle_per_cu[dtype]

    def vector_flops(self, dtype: str) -> float | None:
        """Vector-ALU FLOP/s of the whole device, None if the spec does not give it. bf16
        elementwise work (adds of partials) is widened to fp32: the fp32 rate."""
        if self.vector_flops_per_cycle_per_cu is None:
            return None
        rates = self.vector_flops_per_cycle_per_cu
        return self.cus * self.clock_hz * rates.get(dtype, rates["fp32"])

    def dtype_refusal(self, dtype: str) -> str:
        """Why this device cannot compute in ``dtype`` ("" : it can)."""
        if dtype not in self.flops_per_cycle_per_cu:
            return (f"device {self.name} gives no {dtype} matrix rate ([compute] "
                    f"{dtype}_flops_per_cycle_per_cu)")
        return ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _k(kind: type, scale: float = 1.0, attr: str = "", default: Any = REQUIRED, **kw) -> Key:
    return Key(kind, attr=attr, scale=scale, default=default, **kw)


_FRACTION = dict(minimum=0, maximum=1, open_min=True)
_OFF = "off: "  # the provenance of a default that turns a mechanism off (devices/sources.py)
_GPGPUSIM = ("library: GPGPU-Sim's HBM2 memory controller (gpgpu-sim_distribution, "
             "configs: the simulator family of T3's Table 1)")
# The GPU file's schema (``devices/schema.py``): required keys first, then the optional
# ones with the defaults a file that leaves them out gets.
DEVICE_TABLE = Table(hardware=True, doc="A GPU preset: one emulated GPU (t3emu devices)", keys={
    "name": _k(str, doc="the GPU's name"),
    "description": _k(str, doc="one line: the GPU and its sources"),
    "sources": _k(dict, default=OMIT, doc="where each key's value comes from "
                  "(devices/sources.py): \"SECTION.KEY\" = \"KIND: reference\" or "
                  "{assumption = \"reason\", low = X, high = Y}"),
    "compute": Table({
        "cus": _k(int, doc="compute units (SMs)"),
        "clock_ghz": _k(float, 1e9, "clock_hz", unit="GHz"),
        "fp16_flops_per_cycle_per_cu": _k(int, attr="fp16", doc="dense matrix FLOP/cycle/CU"),
        "fp32_flops_per_cycle_per_cu": _k(int, attr="fp32", doc="dense matrix FLOP/cycle/CU"),
        "wg_tile_m": _k(int, doc="the fixed GEMM tile's rows per WG"),
        "wg_tile_n": _k(int, doc="the fixed GEMM tile's columns per WG"),
        "wgs_per_cu": _k(int, doc="resident GEMM WGs per CU"),
        "fp16_vector_flops_per_cycle_per_cu": _k(int, attr="vfp16", default=None,
                                                 doc="vector ALU FLOP/cycle/CU (GEMV)",
                                                 source=_OFF + "vector FLOPs are not timed"),
        "fp32_vector_flops_per_cycle_per_cu": _k(int, attr="vfp32", default=None,
                                                 source=_OFF + "vector FLOPs are not timed"),
        "launch_us": _k(float, 1e-6, "launch_s", 0.0, zero=True, unit="us",
                        doc="cost of each kernel launch", source=_OFF + "launches are free"),
        "launch_source": _k(str, default="", doc="where launch_us comes from"),
        # the share of the matrix peak the fixed tile's GEMM stages reach (a device without
        # a [gemm] section: its kernels are the fixed wg_tile_m x wg_tile_n tile)
        "matrix_efficiency": _k(float, default=1.0, **_FRACTION,
                                why="a share of the matrix peak",
                                doc="the fixed tile's share of the matrix peak",
                                source=_OFF + "the fixed tile at the matrix peak"),
        # the GPU's architecture (CUDA compute capability "sm80", "sm90"; AMD "gfx90a", ...):
        # forms that exist on one architecture only (Flux's Hopper RS) check it
        "arch": _k(str, default="", doc="sm80, sm90, gfx90a, gfx942, ..."),
        "bf16_flops_per_cycle_per_cu": _k(int, attr="bf16", default=None,
                                          source=_OFF + "no bf16 matrix rate (bf16 refused)"),
        # the GEMMs' WG rasterisation: 1 = row-major; G > 1 = grouped (bands of G tile rows
        # walked column by column: CUTLASS's threadblock swizzle, Triton's GROUP_SIZE_M)
        "wg_raster_group": _k(int, default=1, doc="1: row-major; G > 1: bands of G tile rows",
                              source=_OFF + "row-major WG order, no rasterisation"),
        # a stage of fewer WGs than its slots: "slots" = each WG still runs at 1/S of the
        # peak (T3's model); "spread" = the WGs spread over the CUs first, each CU holding
        # ceil(n / CUs) of them (NVIDIA's block scheduler fills SMs before doubling up)
        "partial_stage": _k(str, default="slots", choices=PARTIAL_STAGES,
                            source="paper: T3 section 4 (a partial stage's WGs each at 1/S "
                                   "of the peak, T3's model)"),
        # resident WGs per CU of a light memory-bound kernel (persistent grids' maximum)
        "max_wgs_per_cu": _k(int, default=0, zero=True,
                             source="derived: wgs_per_cu (0: a light kernel's residency is "
                                    "the GEMM's)"),
        "atomic_dtypes": _k(list, default=OMIT, items=str, choices=DTYPES,
                            doc="dtypes with native atomic adds"),
    }),
    "memory": Table({
        "l2_mb": _k(float, 1 << 20, "l2_bytes", unit="MB"),
        "hbm_gb_per_s": _k(float, 1e9, "hbm_bw", unit="GB/s", doc="the datasheet's rate"),
        "nmc_update_cost": _k(float, minimum=1, why="an update costs at least a write",
                              doc="an op-and-store's time relative to a write"),
        "dram_channels": _k(int, default=0, zero=True,
                            source="derived: hbm_gb_per_s / 32 (an HBM2 channel at 1 GHz DDR)"),
        "dram_queue_depth": _k(int, default=DramSpec.queue_depth, source=_GPGPUSIM),
        "dram_access_bytes": _k(int, default=DramSpec.access_bytes, source=_GPGPUSIM),
        "dram_turnaround_ns": _k(float, 1e-9, "dram_turnaround_s", DramSpec.turnaround_s,
                                 zero=True, unit="ns", source=_GPGPUSIM + " (tWTR + tRTW)"),
        "dram_write_batch": _k(int, default=DramSpec.write_batch, source=_GPGPUSIM),
        "dram_burst_kb": _k(float, 1 << 10, "dram_burst_bytes", DramSpec.burst_bytes,
                            unit="KiB", source={
                                "assumption": "the model's batching of DRAM requests into "
                                              "bursts: a time resolution, not hardware; a "
                                              "quarter to 4x of it moves queueing detail only",
                                "low": 16, "high": 256}),
        "dram_starvation_ns": _k(float, 1e-9, "dram_starvation_s", DramSpec.starvation_s,
                                 unit="ns", source={
                                     "assumption": "T3 names an anti-starvation wait but not "
                                                   "its value; from a full queue's drain "
                                                   "(~128 ns) to a tenth of a GEMM stage",
                                     "low": 128, "high": 10000}),
        # memory-bound kernels (``cost.py``, "latency and row locality"): the loaded DRAM
        # latency, the bytes a WG keeps in flight, and a row miss's channel time
        "latency_ns": _k(float, 1e-9, "mem_latency_s", 0.0, zero=True, unit="ns",
                         source=_OFF + "no loaded-latency bound"),
        "wg_inflight_bytes": _k(int, default=0, zero=True,
                                source=_OFF + "no Little's-law bound"),
        "l2_gb_per_s": _k(float, 1e9, "l2_bw", 0.0, zero=True, unit="GB/s",
                          source=_OFF + "no L2 bandwidth bound"),
        "dram_banks": _k(int, default=0, zero=True, source=_OFF + "no row locality"),
        "dram_bank_groups": _k(int, default=0, zero=True,
                               source=_OFF + "every update pays nmc_update_cost"),
        "dram_row_miss_cost": _k(float, default=1.0, minimum=1,
                                 why="a row miss costs at least a hit",
                                 source=_OFF + "a row miss costs a hit"),
        # the share of the datasheet's rate a streaming kernel sustains, measured: the HBM's
        # ceiling in the model is hbm_gb_per_s x this where a measurement exists (the
        # datasheet's rate still sets the channel count; a what-if on hbm_gb_per_s keeps
        # the share); its source
        "sustained_fraction": _k(float, 1, "hbm_sustained", 0.0, zero=True, maximum=1,
                                 why="the share of hbm_gb_per_s a streaming kernel sustains",
                                 source=_OFF + "the HBM at its datasheet rate"),
        "sustained_source": _k(str, 1, "hbm_sustained_source", ""),
        # where communication's HBM traffic meets the cache the model's L2 stands for
        # (``emulator/model/cache.py``)
        "comm_through_l2": _k(bool, default=False,
                              doc="communication's HBM traffic allocates in the L2",
                              source=_OFF + "communication's traffic bypasses the L2"),
    }),
    "dma": Table({
        "engines": _k(int, attr="dma_engines"),
        "setup_ns": _k(float, 1e-9, "dma_setup_s", zero=True, unit="ns"),
    }),
    "interconnect": Table({
        "topology": _k(str, choices=TOPOLOGIES),
        "link_gb_per_s_per_direction": _k(float, 1e9, "link_bw", unit="GB/s"),
        "link_latency_ns": _k(float, 1e-9, "link_latency_s", zero=True, unit="ns"),
        "links": _k(int),
        "library_fraction": _k(float, default=1.0, **_FRACTION,
                               source=_OFF + "the library at the link's peak"),
        "library": _k(str, default="", choices=LIBRARIES,
                      why="or leave it out: no library model",
                      source=_OFF + "no library tuning model (collectives at link rate)"),
        "library_link": _k(str, default="", choices=("pci",), why="or leave it out",
                           source="derived: the topology (pcie: PCI latencies)"),
    }),
    # every data mover's achieved share of its port's peak, its fixed costs and the source
    # of each (``ExecutorSpec``)
    "executors": Table({
        "store_fraction": _k(float, **_FRACTION, why="the share of the port's peak it achieves"),
        "store_source": _k(str),
        "copy_fraction": _k(float, **_FRACTION, why="the share of the port's peak it achieves"),
        "copy_source": _k(str),
        "put_fraction": _k(float, **_FRACTION, why="the share of the port's peak it achieves"),
        "put_fence_ns": _k(float, 1e-9, "put_fence_s", zero=True, unit="ns"),
        "put_source": _k(str),
        "library_source": _k(str),
    }),
    "nic": Table({
        "count": _k(int, attr="nics", default=0, zero=True,
                    source=_OFF + "no GPU-initiated NIC (a system's [network] gives them)"),
        "gb_per_s": _k(float, 1e9, "nic_bw", 0.0, zero=True, unit="GB/s",
                       source=_OFF + "no GPU-initiated NIC"),
        "latency_ns": _k(float, 1e-9, "nic_latency_s", 0.0, zero=True, unit="ns",
                         source=_OFF + "no GPU-initiated NIC"),
        "issue_ns": _k(float, 1e-9, "nic_issue_s", 0.0, zero=True, unit="ns",
                       source=_OFF + "a put costs its WG nothing to issue"),
    }, required=False, empty=True),
    # the library's GEMM kernels: a list of tiles (their K step, pipeline depth and resident
    # WGs per CU), the mainloop's measured fraction of the peak, where they come from,
    # whether runs use them and whether the heuristic may pick stream-K kernels
    "gemm": Table({
        "tiles": _k(list, nonempty=True, items=Table(hardware=True, keys={
            "m": _k(int), "n": _k(int), "k": _k(int),
            "stages": _k(int, minimum=2, why="a pipeline loads one K step while it computes "
                                            "another"),
            "per_cu": _k(int)})),
        "mainloop_efficiency": _k(float, **_FRACTION,
                                  why="a measured fraction of the matrix peak"),
        "source": _k(str, default=""),
        "enabled": _k(bool, default=True, source="derived: a [gemm] section is used"),
        "stream_k": _k(bool, default=False, source=_OFF + "no stream-K kernels"),
    }, hardware=True, required=False),
})
GEMM_KEYS = tuple(sorted(DEVICE_TABLE.keys["gemm"].keys))


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def preset_path(name_or_path: str, directory: Path) -> Path | None:
    """The file of preset ``name_or_path`` in ``directory``, or the file it names (None:
    neither a preset nor a path)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return path
    path = directory / f"{name_or_path}.toml"
    return path if path.exists() else None


def read_toml(name_or_path: str, directory: Path, what: str, presets: list[str]) -> tuple:
    """(parsed document, path) of preset ``name_or_path`` in ``directory`` or of a file."""
    path = preset_path(name_or_path, directory)
    if path is None:
        raise SpecError(f"unknown {what} {name_or_path!r}; presets: {presets} "
                        f"or a path to a .toml file")
    if not path.is_file():
        raise SpecError(f"{what} file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text()), path
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: malformed TOML: {exc}") from None


def parse_spec(data: dict[str, Any], source: str) -> DeviceSpec:
    """Validate a parsed TOML document and build the spec."""
    values = flat(check(data, DEVICE_TABLE, source), DEVICE_TABLE)
    if (values["vfp16"] is None) != (values["vfp32"] is None):
        raise SpecError(f"{source}: [compute] give both fp16_ and fp32_vector_flops_per_cycle_per_cu "
                        f"or neither")
    if values["nics"] and not values["nic_bw"] > 0:
        raise SpecError(f"{source}: [nic] count = {values['nics']} needs gb_per_s > 0")
    if values["hbm_sustained"] and not values["hbm_sustained_source"]:
        raise SpecError(f"{source}: [memory] sustained_fraction needs sustained_source (the "
                        f"measurement it comes from)")
    gemm = values.get("tiles")
    return DeviceSpec(
        name=data["name"],
        description=data["description"],
        cus=values["cus"],
        clock_hz=values["clock_hz"],
        flops_per_cycle_per_cu={"fp16": values["fp16"], "fp32": values["fp32"],
                                **({} if values["bf16"] is None else {"bf16": values["bf16"]})},
        wg_tile_m=values["wg_tile_m"],
        wg_tile_n=values["wg_tile_n"],
        wgs_per_cu=values["wgs_per_cu"],
        l2_bytes=int(values["l2_bytes"]),
        hbm_bw=values["hbm_bw"] * (values["hbm_sustained"] or 1.0),
        hbm_datasheet=values["hbm_bw"],
        hbm_sustained_source=values["hbm_sustained_source"],
        nmc_update_cost=values["nmc_update_cost"],
        dma_engines=values["dma_engines"],
        dma_setup_s=values["dma_setup_s"],
        interconnect=InterconnectSpec(
            topology=values["topology"],
            link_bw=values["link_bw"],
            link_latency_s=values["link_latency_s"],
            links=values["links"],
            library_fraction=values["library_fraction"],
            library=values["library"],
            library_link=values["library_link"],
        ),
        source=source,
        vector_flops_per_cycle_per_cu=(None if values["vfp16"] is None or values["vfp32"] is None
                                       else {"fp16": values["vfp16"], "fp32": values["vfp32"]}),
        launch_s=values["launch_s"],
        launch_source=values["launch_source"],
        matrix_efficiency=values["matrix_efficiency"],
        arch=values["arch"],
        wg_raster_group=values["wg_raster_group"],
        atomic_dtypes=values.get("atomic_dtypes", DeviceSpec.atomic_dtypes),
        partial_stage=values["partial_stage"],
        max_wgs_per_cu=values["max_wgs_per_cu"],
        mem_latency_s=values["mem_latency_s"],
        wg_inflight_bytes=values["wg_inflight_bytes"],
        l2_bw=values["l2_bw"],
        dram_banks=values["dram_banks"],
        dram_bank_groups=values["dram_bank_groups"],
        dram_row_miss_cost=values["dram_row_miss_cost"],
        comm_through_l2=values["comm_through_l2"],
        gemm=None if gemm is None else GemmSpec(
            tuple(TileShape(t["m"], t["n"], t["k"], t["stages"], t["per_cu"]) for t in gemm),
            values["mainloop_efficiency"], values["source"], values["enabled"],
            values["stream_k"]),
        executors=ExecutorSpec(
            store_fraction=values["store_fraction"], copy_fraction=values["copy_fraction"],
            put_fraction=values["put_fraction"], put_fence_s=values["put_fence_s"],
            sources={e: values[f"{e}_source"] for e in EXECUTORS}),
        nics=values["nics"],
        nic_bw=values["nic_bw"],
        nic_latency_s=values["nic_latency_s"],
        nic_issue_s=values["nic_issue_s"],
        dram=DramSpec(channels=values["dram_channels"] or (  # the datasheet's channels
            round(values["hbm_bw"] / 32e9) if values["hbm_sustained"] else 0),
                      queue_depth=values["dram_queue_depth"],
                      access_bytes=values["dram_access_bytes"],
                      turnaround_s=values["dram_turnaround_s"],
                      write_batch=values["dram_write_batch"],
                      burst_bytes=int(values["dram_burst_bytes"]),
                      starvation_s=values["dram_starvation_s"],
                      banks=values["dram_banks"],
                      row_miss_cost=values["dram_row_miss_cost"]),
    )


def with_topology(spec: DeviceSpec, topology: str) -> DeviceSpec:
    """The device in another intra-node topology (``--topology``)."""
    return dataclasses.replace(spec, interconnect=dataclasses.replace(spec.interconnect,
                                                                      topology=topology))


def load_device(name_or_path: str, overrides: tuple = (), in_system: bool = False) -> DeviceSpec:
    """Load a preset by name (see `list_presets`) or a user TOML file by path, with the
    ``--set`` overrides of its keys (``devices/overrides.py``) written in before the checks."""
    from devices import overrides as ov

    data, path = read_toml(name_or_path, PRESET_DIR, "device", list_presets())
    mine = [(k, v) for k, v in overrides if ov.split(k, in_system)[0] == "gpu"]
    source = str(path) + (f" with --set {ov.describe(tuple(mine))}" if mine else "")
    return parse_spec(ov.apply(data, overrides, "gpu", in_system), source)
