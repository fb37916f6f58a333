"""Device and interconnect specifications, loaded from TOML presets or user files.

A spec is a frozen dataclass in SI units (Hz, bytes, bytes/s, seconds); the TOML
files use the units engineers read datasheets in (GHz, MB, GB/s, ns) and every
preset names its sources in comments.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


class SpecError(ValueError):
    """A device file is malformed or describes impossible hardware."""


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
        return {"store": self.store_fraction, "copy": self.copy_fraction,
                "put": self.put_fraction, "library": library}[executor]


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


# TOML schema: section -> key -> (type, unit scale to SI, attribute name)
_SCHEMA: dict[str, dict[str, tuple[type, float, str]]] = {
    "compute": {
        "cus": (int, 1, "cus"),
        "clock_ghz": (float, 1e9, "clock_hz"),
        "fp16_flops_per_cycle_per_cu": (int, 1, "fp16"),
        "fp32_flops_per_cycle_per_cu": (int, 1, "fp32"),
        "wg_tile_m": (int, 1, "wg_tile_m"),
        "wg_tile_n": (int, 1, "wg_tile_n"),
        "wgs_per_cu": (int, 1, "wgs_per_cu"),
    },
    "memory": {
        "l2_mb": (float, 1 << 20, "l2_bytes"),
        "hbm_gb_per_s": (float, 1e9, "hbm_bw"),
        "nmc_update_cost": (float, 1, "nmc_update_cost"),
    },
    "dma": {
        "engines": (int, 1, "dma_engines"),
        "setup_ns": (float, 1e-9, "dma_setup_s"),
    },
    "interconnect": {
        "topology": (str, 1, "topology"),
        "link_gb_per_s_per_direction": (float, 1e9, "link_bw"),
        "link_latency_ns": (float, 1e-9, "link_latency_s"),
        "links": (int, 1, "links"),
    },
    # every data mover's achieved share of its port's peak, its fixed costs and the source
    # of each (``ExecutorSpec``)
    "executors": {
        "store_fraction": (float, 1, "store_fraction"),
        "store_source": (str, 1, "store_source"),
        "copy_fraction": (float, 1, "copy_fraction"),
        "copy_source": (str, 1, "copy_source"),
        "put_fraction": (float, 1, "put_fraction"),
        "put_fence_ns": (float, 1e-9, "put_fence_s"),
        "put_source": (str, 1, "put_source"),
        "library_source": (str, 1, "library_source"),
    },
}
# optional keys: section -> key -> (type, unit scale to SI, attribute name, default)
_OPTIONAL: dict[str, dict[str, tuple[type, float, str, Any]]] = {
    "compute": {
        "fp16_vector_flops_per_cycle_per_cu": (int, 1, "vfp16", None),
        "fp32_vector_flops_per_cycle_per_cu": (int, 1, "vfp32", None),
        "launch_us": (float, 1e-6, "launch_s", 0.0),
        "launch_source": (str, 1, "launch_source", ""),
        # the GPU's architecture (CUDA compute capability "sm80", "sm90"; AMD "gfx90a", ...):
        # forms that exist on one architecture only (Flux's Hopper RS) check it
        "arch": (str, 1, "arch", ""),
        "bf16_flops_per_cycle_per_cu": (int, 1, "bf16", None),
        # the GEMMs' WG rasterisation: 1 = row-major; G > 1 = grouped (bands of G tile rows
        # walked column by column: CUTLASS's threadblock swizzle, Triton's GROUP_SIZE_M)
        "wg_raster_group": (int, 1, "wg_raster_group", 1),
        # a stage of fewer WGs than its slots: "slots" = each WG still runs at 1/S of the
        # peak (T3's model); "spread" = the WGs spread over the CUs first, each CU holding
        # ceil(n / CUs) of them (NVIDIA's block scheduler fills SMs before doubling up)
        "partial_stage": (str, 1, "partial_stage", "slots"),
        # resident WGs per CU of a light memory-bound kernel (persistent grids' maximum)
        "max_wgs_per_cu": (int, 1, "max_wgs_per_cu", 0),
    },
    "memory": {
        "dram_channels": (int, 1, "dram_channels", 0),
        "dram_queue_depth": (int, 1, "dram_queue_depth", DramSpec.queue_depth),
        "dram_access_bytes": (int, 1, "dram_access_bytes", DramSpec.access_bytes),
        "dram_turnaround_ns": (float, 1e-9, "dram_turnaround_s", DramSpec.turnaround_s),
        "dram_write_batch": (int, 1, "dram_write_batch", DramSpec.write_batch),
        "dram_burst_kb": (float, 1 << 10, "dram_burst_bytes", DramSpec.burst_bytes),
        "dram_starvation_ns": (float, 1e-9, "dram_starvation_s", DramSpec.starvation_s),
        # memory-bound kernels (``cost.py``, "latency and row locality"): the loaded DRAM
        # latency, the bytes a WG keeps in flight, and a row miss's channel time
        "latency_ns": (float, 1e-9, "mem_latency_s", 0.0),
        "wg_inflight_bytes": (int, 1, "wg_inflight_bytes", 0),
        "l2_gb_per_s": (float, 1e9, "l2_bw", 0.0),
        "dram_banks": (int, 1, "dram_banks", 0),
        "dram_bank_groups": (int, 1, "dram_bank_groups", 0),
        "dram_row_miss_cost": (float, 1, "dram_row_miss_cost", 1.0),
        # the share of the datasheet's rate a streaming kernel sustains, measured: the HBM's
        # ceiling in the model is hbm_gb_per_s x this where a measurement exists (the
        # datasheet's rate still sets the channel count; a what-if on hbm_gb_per_s keeps
        # the share); its source
        "sustained_fraction": (float, 1, "hbm_sustained", 0.0),
        "sustained_source": (str, 1, "hbm_sustained_source", ""),
    },
    "interconnect": {
        "library_fraction": (float, 1, "library_fraction", 1.0),
        "library": (str, 1, "library", ""),
        "library_link": (str, 1, "library_link", ""),
    },
    "nic": {
        "count": (int, 1, "nics", 0),
        "gb_per_s": (float, 1e9, "nic_bw", 0.0),
        "latency_ns": (float, 1e-9, "nic_latency_s", 0.0),
        "issue_ns": (float, 1e-9, "nic_issue_s", 0.0),
    },
}
_TOP_KEYS = {"name", "description"}
_MAY_BE_ZERO = {"link_latency_ns", "setup_ns", "put_fence_ns", "launch_us", "count", "gb_per_s", "latency_ns",
                "issue_ns", "dram_channels", "dram_turnaround_ns", "max_wgs_per_cu",
                "wg_inflight_bytes", "dram_banks", "l2_gb_per_s", "dram_bank_groups"}


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def _where(source: str, section: str, key: str) -> str:
    return f"{source}: [{section}] {key}"


# Every number of a device or system file, in the key's own unit (GB/s, us, ns, MB, a
# count, a fraction), lies in this range unless it is 0: the presets' lie from 0.5 to
# 27,500; six orders of magnitude either side admit any GPU while refusing a typo's
# 1e-300 (times of 300 digits) or 1e300 (overflows inside the ranks).
PLAUSIBLE = (1e-6, 1e9)


def checked_value(where: str, value: Any, typ: type, scale: float, may_be_zero: bool) -> Any:
    """A file's value of type ``typ`` in SI units (x ``scale``); impossible hardware (a
    negative, non-finite or, unless ``may_be_zero``, zero number) is refused."""
    if typ is str:
        if not isinstance(value, str):
            raise SpecError(f"{where} must be a string, got {value!r}")
        return value
    ok_types = (int,) if typ is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_types):
        raise SpecError(f"{where} must be {'an integer' if typ is int else 'a number'}, "
                        f"got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not may_be_zero):
        raise SpecError(f"{where} = {value!r} is impossible hardware; it must be "
                        f"{'>= 0' if may_be_zero else '> 0'}")
    if value and not PLAUSIBLE[0] <= value <= PLAUSIBLE[1]:
        raise SpecError(f"{where} = {value!r} is implausible hardware: a value other than "
                        f"0 must lie from {PLAUSIBLE[0]:g} to {PLAUSIBLE[1]:g} in the key's "
                        f"unit")
    return typ(value * scale) if typ is int else float(value) * scale


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
    """Validate a parsed TOML document and build the spec (all keys required)."""
    unknown = set(data) - _TOP_KEYS - set(_SCHEMA) - set(_OPTIONAL) - {"gemm"}
    if unknown:
        raise SpecError(f"{source}: unknown key(s) {sorted(unknown)}; allowed: "
                        f"{sorted(_TOP_KEYS | set(_SCHEMA) | set(_OPTIONAL) | {'gemm'})}")
    for key in _TOP_KEYS:
        if not isinstance(data.get(key), str):
            raise SpecError(f"{source}: missing key '{key}' (a string)" if key not in data
                            else f"{source}: '{key}' must be a string, got {data[key]!r}")
    values: dict[str, Any] = {}
    if "gemm" in data:  # a list of tiles, not numbers: checked on its own
        values["gemm"] = parse_gemm(data["gemm"], source)
        data = {k: v for k, v in data.items() if k != "gemm"}
    if isinstance(data.get("compute"), dict) and "atomic_dtypes" in data["compute"]:
        compute = dict(data["compute"])  # a list, not a number: checked here
        atomics = compute.pop("atomic_dtypes")
        if not (isinstance(atomics, list) and all(a in DTYPES for a in atomics)):
            raise SpecError(f"{source}: [compute] atomic_dtypes = {atomics!r} must be a list "
                            f"of {', '.join(DTYPES)}")
        data = {**data, "compute": compute}
        values["atomic_dtypes"] = tuple(atomics)
    for section in dict.fromkeys([*_SCHEMA, *_OPTIONAL]):
        keys = {k: (*v, ...) for k, v in _SCHEMA.get(section, {}).items()}
        keys.update(_OPTIONAL.get(section, {}))
        table = data.get(section, {} if section not in _SCHEMA else None)
        if not isinstance(table, dict):
            raise SpecError(f"{source}: missing section [{section}]")
        extra = set(table) - set(keys)
        if extra:
            raise SpecError(f"{source}: [{section}] unknown key(s) {sorted(extra)}; "
                            f"allowed: {sorted(keys)}")
        for key, (typ, scale, attr, default) in keys.items():
            if key not in table:
                if default is ...:
                    raise SpecError(f"{source}: [{section}] missing key '{key}'")
                values[attr] = default
                continue
            values[attr] = checked_value(_where(source, section, key), table[key], typ, scale,
                                         key in _MAY_BE_ZERO)
    if values["topology"] not in TOPOLOGIES:
        raise SpecError(f"{source}: [interconnect] topology = {values['topology']!r}; "
                        f"allowed: {list(TOPOLOGIES)}")
    if (values["vfp16"] is None) != (values["vfp32"] is None):
        raise SpecError(f"{source}: [compute] give both fp16_ and fp32_vector_flops_per_cycle_per_cu "
                        f"or neither")
    if values["partial_stage"] not in PARTIAL_STAGES:
        raise SpecError(f"{source}: [compute] partial_stage = {values['partial_stage']!r}; "
                        f"allowed: {list(PARTIAL_STAGES)}")
    if values["nics"] and not values["nic_bw"] > 0:
        raise SpecError(f"{source}: [nic] count = {values['nics']} needs gb_per_s > 0")
    if not 0 < values["library_fraction"] <= 1:
        raise SpecError(f"{source}: [interconnect] library_fraction must be in (0, 1], got "
                        f"{values['library_fraction']}")
    if values["library"] and values["library"] not in LIBRARIES:
        raise SpecError(f"{source}: [interconnect] library = {values['library']!r}; "
                        f"allowed: {sorted(LIBRARIES)} (or leave it out: no library model)")
    if values["library_link"] not in ("", "pci"):
        raise SpecError(f"{source}: [interconnect] library_link = {values['library_link']!r}; "
                        f"allowed: 'pci' (or leave it out)")
    for key in ("store_fraction", "copy_fraction", "put_fraction"):
        if not 0 < values[key] <= 1:
            raise SpecError(f"{source}: [executors] {key} must be in (0, 1] (the share of the "
                            f"port's peak it achieves), got {values[key]}")
    if values["dram_row_miss_cost"] < 1.0:
        raise SpecError(f"{source}: [memory] dram_row_miss_cost must be >= 1 (a row miss "
                        f"costs at least a hit), got {values['dram_row_miss_cost']}")
    if values["hbm_sustained"] and not 0 < values["hbm_sustained"] <= 1:
        raise SpecError(f"{source}: [memory] sustained_fraction must be in (0, 1] (the share "
                        f"of hbm_gb_per_s a streaming kernel sustains), got "
                        f"{values['hbm_sustained']}")
    if values["hbm_sustained"] and not values["hbm_sustained_source"]:
        raise SpecError(f"{source}: [memory] sustained_fraction needs sustained_source (the "
                        f"measurement it comes from)")
    if values["nmc_update_cost"] < 1.0:
        raise SpecError(f"{source}: [memory] nmc_update_cost must be >= 1 (an update "
                        f"costs at least a write), got {values['nmc_update_cost']}")
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
        gemm=values.get("gemm"),
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
                      starvation_s=values["dram_starvation_s"]),
    )


_TILE_KEYS = ("m", "n", "k", "stages", "per_cu")
GEMM_KEYS = ("enabled", "mainloop_efficiency", "source", "stream_k", "tiles")


def parse_gemm(table: Any, source: str) -> GemmSpec:
    """``[gemm]``: ``tiles`` (a list of ``{m, n, k, stages, per_cu}``: the tile, its K step,
    pipeline depth and resident WGs per CU), ``mainloop_efficiency`` in (0, 1], ``source``
    (where they come from), ``enabled`` (default true; false: ``t3emu gemm`` lists the
    catalogue, runs keep the fixed tile) and ``stream_k`` (default false: whether the
    heuristic may pick stream-K kernels)."""
    where = f"{source}: [gemm]"
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table")
    extra = set(table) - set(GEMM_KEYS)
    if extra:
        raise SpecError(f"{where} unknown key(s) {sorted(extra)}; allowed: {list(GEMM_KEYS)}")
    tiles = table.get("tiles")
    if not isinstance(tiles, list) or not tiles:
        raise SpecError(f"{where} tiles must be a non-empty list of {{m, n, k, stages, per_cu}}")
    shapes = []
    for i, t in enumerate(tiles):
        if not isinstance(t, dict) or set(t) != set(_TILE_KEYS):
            raise SpecError(f"{where} tiles[{i}] = {t!r} must have exactly the keys "
                            f"{', '.join(_TILE_KEYS)}")
        vals = [checked_value(f"{where} tiles[{i}].{key}", t[key], int, 1, False)
                for key in _TILE_KEYS]
        if vals[3] < 2:
            raise SpecError(f"{where} tiles[{i}].stages = {vals[3]} must be >= 2 (a "
                            f"pipeline loads one K step while it computes another)")
        shapes.append(TileShape(*vals))
    eff = checked_value(f"{where} mainloop_efficiency", table.get("mainloop_efficiency"),
                        float, 1, False) if "mainloop_efficiency" in table else None
    if eff is None or eff > 1:
        raise SpecError(f"{where} mainloop_efficiency must be in (0, 1] (a measured fraction "
                        f"of the matrix peak), got {table.get('mainloop_efficiency')!r}")
    src = table.get("source", "")
    if not isinstance(src, str):
        raise SpecError(f"{where} source must be a string, got {src!r}")
    flags = []
    for key, default in (("enabled", True), ("stream_k", False)):
        flag = table.get(key, default)
        if not isinstance(flag, bool):
            raise SpecError(f"{where} {key} must be true or false, got {flag!r}")
        flags.append(flag)
    return GemmSpec(tuple(shapes), eff, src, *flags)


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
