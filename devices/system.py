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

from devices.spec import (NETWORKS, PRESET_DIR, TOPOLOGIES, DeviceSpec, SpecError, checked_value,
                          load_device, read_toml)

SYSTEM_DIR = PRESET_DIR / "systems"

# section -> key -> (type, unit scale, attribute of InterconnectSpec or None, required)
_SYSTEM: dict[str, dict[str, tuple[type, float, str | None, bool]]] = {
    "": {"gpu": (str, 1, None, True), "nodes": (int, 1, None, True),
         "gpus_per_node": (int, 1, "gpus_per_node", True)},
    "intra": {
        "topology": (str, 1, "topology", True),
        "link_gb_per_s_per_direction": (float, 1e9, "link_bw", False),
        "link_latency_ns": (float, 1e-9, "link_latency_s", False),
        "links": (int, 1, "links", False),
        "sockets": (int, 1, "sockets", False),
        "socket_gb_per_s_per_direction": (float, 1e9, "socket_bw", False),
        "socket_latency_ns": (float, 1e-9, "socket_latency_s", False),
        "library_fraction": (float, 1, "library_fraction", False),
    },
    "network": {
        "kind": (str, 1, "network", True),
        "nics_per_node": (int, 1, "nics_per_node", True),
        "nic_gb_per_s_per_direction": (float, 1e9, "nic_bw", True),
        "latency_ns": (float, 1e-9, "nic_latency_s", True),
        "torus_x": (int, 1, None, False),
        "torus_y": (int, 1, None, False),
        "torus_hop_latency_ns": (float, 1e-9, "torus_hop_latency_s", False),
        "library_fraction": (float, 1, "library_fraction_network", False),
    },
}
_MAY_BE_ZERO = {"gpus_per_node", "link_latency_ns", "socket_latency_ns", "latency_ns",
                "torus_hop_latency_ns"}


def list_systems() -> list[str]:
    return sorted(p.stem for p in SYSTEM_DIR.glob("*.toml"))


def _value(source: str, section: str, key: str, value: Any, typ: type, scale: float) -> Any:
    where = f"{source}: [{section}] {key}" if section else f"{source}: {key}"
    return checked_value(where, value, typ, scale, key in _MAY_BE_ZERO)


def parse_system(data: dict[str, Any], source: str, overrides: tuple = ()) -> DeviceSpec:
    """Validate a parsed system file; return its GPU's spec with the system's interconnect."""
    allowed = {"name", "description", *_SYSTEM[""], "intra", "network"}
    unknown = set(data) - allowed
    if unknown:
        raise SpecError(f"{source}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str):
            raise SpecError(f"{source}: missing key '{key}' (a string)" if key not in data
                            else f"{source}: '{key}' must be a string, got {data[key]!r}")
    got: dict[str, dict[str, Any]] = {}
    for section, keys in _SYSTEM.items():
        table = data if not section else data.get(section)
        if table is None:
            if section == "network":
                continue
            raise SpecError(f"{source}: missing section [{section}]")
        if not isinstance(table, dict):
            raise SpecError(f"{source}: [{section}] must be a table")
        if section:
            extra = set(table) - set(keys)
            if extra:
                raise SpecError(f"{source}: [{section}] unknown key(s) {sorted(extra)}; "
                                f"allowed: {sorted(keys)}")
        vals = got.setdefault(section, {})
        for key, (typ, scale, _, required) in keys.items():
            if key not in table:
                if required:
                    raise SpecError(f"{source}: {f'[{section}] ' if section else ''}missing "
                                    f"key '{key}'")
                continue
            vals[key] = _value(source, section, key, table[key], typ, scale)
    top, intra, net = got[""], got["intra"], got.get("network")
    gpu_path = Path(top["gpu"])
    if not gpu_path.is_absolute() and gpu_path.suffix == ".toml":
        gpu_path = Path(source).parent / gpu_path
    try:
        gpu = load_device(str(gpu_path) if gpu_path.suffix == ".toml" else top["gpu"],
                          overrides, in_system=True)
    except SpecError as exc:
        raise SpecError(f"{source}: gpu = {top['gpu']!r}: {exc}") from None
    nodes, per_node = top["nodes"], top["gpus_per_node"]
    ic: dict[str, Any] = {}
    for section, vals in (("intra", intra), ("network", net or {})):
        for key, value in vals.items():
            attr = _SYSTEM[section][key][2]
            if attr:
                ic[attr] = value
    ic["gpus_per_node"] = per_node
    ic["nodes"] = nodes
    if ic["topology"] not in TOPOLOGIES:
        raise SpecError(f"{source}: [intra] topology = {ic['topology']!r}; allowed: "
                        f"{list(TOPOLOGIES)}")
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
        if ic["network"] not in NETWORKS:
            raise SpecError(f"{source}: [network] kind = {ic['network']!r}; allowed: "
                            f"{list(NETWORKS)}")
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
    for key in ("library_fraction", "library_fraction_network"):
        if not 0 < ic.get(key, 1.0) <= 1:
            raise SpecError(f"{source}: library_fraction must be in (0, 1], got {ic[key]}")
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
