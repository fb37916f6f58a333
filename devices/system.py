"""System presets: which GPU, how many per node, the intra-node topology, the network
between nodes, and how many nodes (``devices/presets/systems/*.toml``).

A system file names a GPU (a preset of ``devices/presets`` or a path) and
overrides the GPU's own [interconnect] with the system's. Loading a system gives
the GPU's ``DeviceSpec`` whose ``interconnect`` is the system's, so everything
downstream (the cost model, the topology's routes, the checks) reads one spec.
Units as in device files: GB/s per direction, ns.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from devices.schema import OMIT, Key, Table, check
from devices.spec import (NETWORKS, PRESET_DIR, TOPOLOGIES, DeviceSpec, SpecError, load_device,
                          read_toml)

SYSTEM_DIR = PRESET_DIR / "systems"

_FRACTION = dict(minimum=0, maximum=1, open_min=True,
                 why="the share of the links' peak the library achieves")
# The system file's schema (``devices/schema.py``); a key's attribute is the
# ``InterconnectSpec`` field it sets
SYSTEM_TABLE = Table(hardware=True, doc="A system preset: GPUs, their topology, the network "
                     "between nodes and how many nodes (t3emu devices)", keys={
    "name": Key(str, doc="the system's name"),
    "description": Key(str),
    "gpu": Key(str, doc="a GPU preset or a path to a GPU file (relative: to this file)"),
    "sources": Key(dict, default=OMIT, doc="where each key's value comes from "
                   "(devices/sources.py)"),
    "nodes": Key(int),
    "gpus_per_node": Key(int, zero=True, doc="0: any number of GPUs (nodes = 1)"),
    "intra": Table({
        "topology": Key(str, choices=TOPOLOGIES),
        "link_gb_per_s_per_direction": Key(float, attr="link_bw", scale=1e9, default=OMIT,
                                           unit="GB/s"),
        "link_latency_ns": Key(float, attr="link_latency_s", scale=1e-9, default=OMIT,
                               zero=True, unit="ns"),
        "links": Key(int, default=OMIT),
        "sockets": Key(int, default=OMIT),
        "socket_gb_per_s_per_direction": Key(float, attr="socket_bw", scale=1e9,
                                             default=OMIT, unit="GB/s"),
        "socket_latency_ns": Key(float, attr="socket_latency_s", scale=1e-9, default=OMIT,
                                 zero=True, unit="ns"),
        "library_fraction": Key(float, default=OMIT, **_FRACTION),
    }, doc="the GPU's own [interconnect], overridden"),
    "network": Table({
        "kind": Key(str, attr="network", choices=NETWORKS),
        "nics_per_node": Key(int),
        "nic_gb_per_s_per_direction": Key(float, attr="nic_bw", scale=1e9, unit="GB/s"),
        "latency_ns": Key(float, attr="nic_latency_s", scale=1e-9, zero=True, unit="ns"),
        "torus_x": Key(int, default=OMIT),
        "torus_y": Key(int, default=OMIT),
        "torus_hop_latency_ns": Key(float, attr="torus_hop_latency_s", scale=1e-9,
                                    default=OMIT, zero=True, unit="ns"),
        "library_fraction": Key(float, attr="library_fraction_network", default=OMIT,
                                **_FRACTION),
    }, required=False, doc="between nodes (needed when nodes > 1)"),
})
TOP_KEYS = ("gpu", "nodes", "gpus_per_node")  # the top-level keys a --set may name


def list_systems() -> list[str]:
    return sorted(p.stem for p in SYSTEM_DIR.glob("*.toml"))


def parse_system(data: dict[str, Any], source: str, overrides: tuple = ()) -> DeviceSpec:
    """Validate a parsed system file; return its GPU's spec with the system's interconnect."""
    top = check(data, SYSTEM_TABLE, source)
    net = top.get("network")
    gpu_path = Path(top["gpu"])
    if not gpu_path.is_absolute() and gpu_path.suffix == ".toml":
        gpu_path = Path(source).parent / gpu_path
    try:
        gpu = load_device(str(gpu_path) if gpu_path.suffix == ".toml" else top["gpu"],
                          overrides, in_system=True)
    except SpecError as exc:
        raise SpecError(f"{source}: gpu = {top['gpu']!r}: {exc}") from None
    nodes, per_node = top["nodes"], top["gpus_per_node"]
    ic: dict[str, Any] = {**top["intra"], **{k: v for k, v in (net or {}).items()
                                             if k not in ("torus_x", "torus_y")}}
    ic["gpus_per_node"] = per_node
    ic["nodes"] = nodes
    if per_node == 0 and nodes != 1:
        raise SpecError(f"{source}: gpus_per_node = 0 (any number of GPUs) needs nodes = 1")
    if nodes > 1 and net is None:
        raise SpecError(f"{source}: nodes = {nodes} needs a [network] section")
    sockets = ic.get("sockets", 1)
    if ic["topology"] == "pcie":
        if per_node % sockets:
            raise SpecError(f"{source}: [intra] sockets = {sockets} must divide gpus_per_node "
                            f"= {per_node}")
        if sockets > 1 and not ic.get("socket_bw"):
            raise SpecError(f"{source}: [intra] sockets = {sockets} needs "
                            f"socket_gb_per_s_per_direction")
    elif sockets != 1:
        raise SpecError(f"{source}: [intra] sockets only applies to topology = 'pcie'")
    if net is not None:
        if per_node == 0 or per_node % ic["nics_per_node"]:
            raise SpecError(f"{source}: [network] nics_per_node = {ic['nics_per_node']} must "
                            f"divide gpus_per_node = {per_node} (GPUs share NICs evenly)")
        if ic["network"] == "torus2d":
            xy = (net.get("torus_x", 0), net.get("torus_y", 0))
            if xy[0] * xy[1] != nodes:
                raise SpecError(f"{source}: [network] torus_x x torus_y = {xy[0]} x {xy[1]} "
                                f"must equal nodes = {nodes}")
            ic["torus"] = xy
        elif "torus_x" in net or "torus_y" in net:
            raise SpecError(f"{source}: [network] torus_x/torus_y only apply to kind = "
                            f"'torus2d'")
    interconnect = dataclasses.replace(gpu.interconnect, **ic)
    if ic["topology"] == "full-mesh" and per_node - 1 > interconnect.links:
        raise SpecError(f"{source}: a full mesh of {per_node} GPUs needs {per_node - 1} links "
                        f"per GPU; {gpu.name} has {interconnect.links}")
    extra: dict[str, Any] = {}
    if net is not None and not gpu.nics:  # the GPU-initiated NIC executor: its NIC share
        share = ic["nics_per_node"] / per_node
        extra = {"nics": 1, "nic_bw": ic["nic_bw"] * share,
                 "nic_latency_s": ic["nic_latency_s"]}
    return dataclasses.replace(gpu, interconnect=interconnect, system=data["name"],
                               description=f"{data['description']} ({gpu.name})", **extra)


def system_size(spec: DeviceSpec) -> int:
    """GPUs in the device's system (0: any number, as T3's ring)."""
    ic = spec.interconnect
    return ic.gpus_per_node * ic.nodes


def load_system(name_or_path: str, overrides: tuple = ()) -> DeviceSpec:
    """Load a system preset by name (see `list_systems`) or a system TOML file by path, with
    the ``--set`` overrides of its keys and its GPU's (``devices/overrides.py``)."""
    from devices import overrides as ov

    data, path = read_toml(name_or_path, SYSTEM_DIR, "system", list_systems())
    mine = [(k, v) for k, v in overrides if ov.split(k, True)[0] == "system"]
    source = str(path) + (f" with --set {ov.describe(tuple(mine))}" if mine else "")
    return parse_system(ov.apply(data, overrides, "system", True), source, overrides)
