"""Platforms: every GPU and system preset loads; bad system files are refused with one
line and exit 2; each new system runs gemm+ar numerically on its full GPU count with
PASS; its library collective's modelled time is within 10% of the alpha-beta(-gamma)
formula of the library's schedule, computed here from the preset files' own numbers and
the protocol the library chose (its share of the bandwidth, its latencies: the choice
itself is checked against NCCL's formulas in ``test_library.py``), not from the
emulator's code; routes, shared ports and ring orders of the topology model."""

from __future__ import annotations

import json
import tomllib

import re

import pytest

from tests.conftest import ROOT, run_cli, run_pooled

PRESETS = ROOT / "devices" / "presets"
NEW_SYSTEMS = ["mi210x4", "mi210-2node", "mi300x-x8", "a100-sxm-x8", "a100-pcie-x8", "h800-x8",
               "a100-sxm-2x8", "a100-pcie-2x8", "h800-2x8"]


def _toml(path) -> dict:
    return tomllib.loads(path.read_text())


def _figures(system: str) -> dict:
    """The numbers of a system as its files state them (SI units)."""
    sysd = _toml(PRESETS / "systems" / f"{system}.toml")
    gpu = _toml(PRESETS / f"{sysd['gpu']}.toml")
    ic, intra, net = gpu["interconnect"], sysd["intra"], sysd.get("network", {})
    return {
        "n": sysd["nodes"] * sysd["gpus_per_node"], "g": sysd["gpus_per_node"],
        "topology": intra["topology"],
        "L": intra.get("link_gb_per_s_per_direction", ic["link_gb_per_s_per_direction"]) * 1e9,
        "lat": intra.get("link_latency_ns", ic["link_latency_ns"]) * 1e-9,
        "f": intra.get("library_fraction", ic.get("library_fraction", 1.0)),
        "socket": intra.get("socket_gb_per_s_per_direction", 0) * 1e9,
        "socket_lat": intra.get("socket_latency_ns", 0) * 1e-9,
        "nic": net.get("nic_gb_per_s_per_direction", 0) * 1e9,
        "nics": net.get("nics_per_node", 0), "nic_lat": net.get("latency_ns", 0) * 1e-9,
        "f_net": net.get("library_fraction", 1.0),
        "hbm": gpu["memory"]["hbm_gb_per_s"] * 1e9,
    }


def _alpha_beta(x: dict, size: float, kind: str, lib: dict, first: bool) -> float:
    """Modelled time of a library RS or AG of ``size`` bytes as the library runs it: its
    ring, whose n-1 steps inside a node each wait for the previous piece (piece / rate +
    latency per step, on the GPU's port and a PCIe ring's socket link), while across
    nodes the node's boundary GPU streams its n-1 pieces back to back over every NIC of
    the node (fed ahead by the faster links: one latency); the slower of the two. On one
    full-mesh node: direct sends (a link per peer). Each hop at the preset's fraction x
    the protocol's share ``bw_ratio``, at least the protocol's per-step latency; the
    call's fixed latency on its first
    kernel (``first``); a direct RS adds the gamma term of its reduction (read n copies
    of S/n, write one, at the HBM rate)."""
    n, g = x["n"], x["g"]
    piece = size / n
    r, fixed = lib["bw_ratio"], lib["fixed_s"] if first else 0.0
    hw, hw_net = lib["hw_lat_intra_s"], lib["hw_lat_net_s"]
    if x["topology"] == "full-mesh" and n == g:
        t = fixed + piece / (x["L"] * x["f"] * r) + max(x["lat"], hw)
        return t + ((n + 1) * piece / x["hbm"] if kind == "rs" else 0.0)
    hops = [(x["L"] * x["f"] * r, max(x["lat"], hw))] if g > 1 else []
    if x["topology"] == "pcie":
        hops.append((min(x["L"], x["socket"]) * x["f"] * r,
                     max(x["lat"], hw) + x["socket_lat"]))
    t = max([(n - 1) * (piece / bw + lat) for bw, lat in hops] or [0.0])
    if n > g:
        nics = x["nic"] * x["nics"]
        if x["topology"] == "pcie":
            nics = min(x["L"], nics)
        t = max(t, (n - 1) * piece / (nics * x["f_net"] * r) + max(x["nic_lat"], hw_net))
    return fixed + t


def test_every_preset_loads_and_devices_lists_them():
    proc = run_cli(["devices"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    for path in list(PRESETS.glob("*.toml")) + list((PRESETS / "systems").glob("*.toml")):
        assert re.search(rf"^{re.escape(path.stem)} ", proc.stdout, re.M), path.stem
    for name in NEW_SYSTEMS:
        assert (PRESETS / "systems" / f"{name}.toml").exists()
    from devices.system import load_system, system_size

    for name in NEW_SYSTEMS:
        spec = load_system(name)
        assert system_size(spec) == _figures(name)["n"], name
        assert "bf16" in spec.flops_per_cycle_per_cu


@pytest.mark.parametrize("text,complaint", [
    ('gpu = "nope"\nnodes = 1\ngpus_per_node = 4\n[intra]\ntopology = "switch"\n',
     "unknown device 'nope'"),
    ('gpu = "mi210"\nnodes = 2\ngpus_per_node = 4\n[intra]\ntopology = "switch"\n',
     "needs a [network] section"),
    ('gpu = "mi210"\nnodes = 1\ngpus_per_node = 8\n[intra]\ntopology = "full-mesh"\n',
     "needs 7 links"),
    ('gpu = "mi210"\nnodes = 1\ngpus_per_node = 6\n[intra]\ntopology = "pcie"\nsockets = 4\n'
     'socket_gb_per_s_per_direction = 10\n', "must divide gpus_per_node"),
    ('gpu = "mi210"\nnodes = 2\ngpus_per_node = 4\n[intra]\ntopology = "switch"\n[network]\n'
     'kind = "fabric"\nnics_per_node = 3\nnic_gb_per_s_per_direction = 10\nlatency_ns = 1\n',
     "nics_per_node = 3 must divide"),
    ('gpu = "mi210"\nnodes = 1\ngpus_per_node = 4\n[intra]\ntopology = "torus"\n',
     "topology = 'torus'"),
    ('gpu = "mi210"\nnodes = 1\ngpus_per_node = 4\n[intra]\ntopology = "switch"\n'
     'link_gb_per_s_per_direction = -3\n', "impossible hardware"),
    ('gpu = "mi210"\nnodes = 1\ngpus_per_node = 4\nextra = 1\n[intra]\ntopology = "switch"\n',
     "unknown key"),
    ('gpu = "mi210"\nnodes = 1\n[intra]\ntopology = "switch"\n', "missing key 'gpus_per_node'"),
    ('gpu = "mi210"\nnodes = 1\ngpus_per_node = 4\n[intra]\ntopology = "switch"\n'
     'library_fraction = 1.5\n', "library_fraction"),
    ('gpu = "mi210"\nnodes = [1\n', "malformed TOML"),
])
def test_bad_system_files_are_refused_with_one_line_and_exit_2(tmp_path, text, complaint):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ndescription = "y"\n' + text)
    proc = run_pooled(["run", "--system", str(bad), "--m", "64", "--n", "64", "--k", "64"],
                      timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and complaint in lines[0], proc.stderr


def test_system_options_are_checked():
    proc = run_pooled(["run", "--system", "a100-sxm-x8", "-n", "4"], timeout=60)
    assert proc.returncode == 2 and "has 8 GPUs" in proc.stderr, proc.stderr
    proc = run_pooled(["run", "--system", "a100-sxm-x8", "--topology", "ring"], timeout=60)
    assert proc.returncode == 2 and "--system gives" in proc.stderr, proc.stderr


@pytest.mark.parametrize("system", NEW_SYSTEMS)
def test_each_system_runs_gemm_ar_numerically_and_matches_alpha_beta(tmp_path, system):
    out = tmp_path / "run.json"
    m, n, k = 2048, 1024, 64
    proc = run_pooled(["run", "--system", system, "--collective", "ar", "--m", str(m), "--n",
                    str(n), "--k", str(k), "--mode", "sequential,t3", "--dtype", "fp32",
                    "--json", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    x = _figures(system)
    assert doc["world_size"] == x["n"] and doc["device"]["system"] == system
    assert all(r["numerics"] == "pass" for r in doc["runs"]), [r["numerics"] for r in doc["runs"]]
    seq = next(r for r in doc["runs"] if r["mode"] == "sequential")
    size = m * n * 4
    for kind in ("rs", "ag"):
        want = _alpha_beta(x, size, kind, seq["library"][kind], kind == "rs")
        got = seq["phases"][kind]
        assert got == pytest.approx(want, rel=0.10), (kind, got, want)
        bw = seq["bandwidth"][kind]  # nccl-tests' definitions
        assert bw["algbw_gb_s"] == pytest.approx(size / got / 1e9)
        assert bw["busbw_gb_s"] == pytest.approx(size / got / 1e9 * (x["n"] - 1) / x["n"])
    assert "busbw" in proc.stdout


def test_routes_shared_ports_and_ring_order():
    import dataclasses

    from devices.system import load_system
    from emulator.model.topology import NoRoute, Topology

    pcie = load_system("a100-pcie-2x8").interconnect
    direct, ring = Topology(pcie, 16, "direct"), Topology(pcie, 16, "ring")
    # within a socket: the GPU's PCIe port; across sockets + the CPU link, whose 32 GB/s
    # the socket's 4 GPUs share in a direct pattern and one GPU uses in a ring
    assert [h.port for h in direct.route(0, 1).hops] == ["port-up[0]"]
    assert direct.route(0, 5).rate == pytest.approx(32e9 / 4)
    assert ring.route(4, 3).rate == pytest.approx(32e9)
    assert direct.route(0, 5).latency == pytest.approx(1500e-9 + 500e-9)
    # across nodes: the socket's NIC (12.5 GB/s), shared by its 4 GPUs when all send
    assert direct.route(0, 9).rate == pytest.approx(12.5e9 / 4)
    assert ring.route(8, 7).rate == pytest.approx(12.5e9)
    assert direct.route(0, 9).latency == pytest.approx(3000e-9)
    # a ring crosses each node boundary once
    order = ring.ring()
    assert sorted(order) == list(range(16))
    assert sum(ring.node(order[i]) != ring.node(order[i - 1]) for i in range(16)) == 2
    # a 2 x 2 torus of nodes: the ring snakes (every node hop is one torus link)
    torus = dataclasses.replace(pcie, network="torus2d", torus=(2, 2), nodes=4,
                                torus_hop_latency_s=700e-9)
    t = Topology(torus, 32, "ring")
    nodes = [t.node(r) for r in t.ring()][:: 8]
    assert nodes == [0, 1, 3, 2]
    assert t.route(0, 3 * 8).latency == pytest.approx(3000e-9 + 700e-9)  # two links away
    # dimension-ordered (X, then Y): every torus link of the route is a hop
    assert [h.port for h in t.route(0, 3 * 8).hops] == ["port-up[0]", "torus[0:x+]",
                                                       "torus[2:y+]"]

    ringed = dataclasses.replace(load_system("t3-sim").interconnect)
    with pytest.raises(NoRoute, match="neighbours only"):
        Topology(ringed, 8).route(0, 2)


def test_a_torus_route_contends_on_every_link():
    """A 4 x 4 torus of one GPU per node, every GPU sending to every other (direct). Each
    link's sharers are the distinct sources of the routes that cross it (counted here
    from the routes themselves) and a route's rate is the least share of its links. By
    hand, link x+ out of node 0 (x = 0, y = 0) carries the X phase of routes in row y = 0
    only, going + (x distance 1 or the tie 2): from x = 0 to x = 1, 2 and from x = 3 to
    x = 1 through x = 0: 2 sources, nodes 0 and 12."""
    from devices.system import load_system
    from emulator.model.topology import Topology

    ic = load_system("mi210-torus16").interconnect
    t = Topology(ic, 16, "direct")
    users: dict[str, set[int]] = {}
    for s in range(16):
        for d in range(16):
            if s != d:
                for h in t.route(s, d).hops:
                    users.setdefault(h.port, set()).add(s)
    assert {p: len(u) for p, u in users.items()} == t.sharers()
    far = t.route(0, 10)  # 2 steps in x, 2 in y: four links, four hops of latency
    assert len(far.hops) == 4
    assert far.latency == pytest.approx(ic.nic_latency_s + 3 * ic.torus_hop_latency_s)
    assert far.rate == pytest.approx(min(ic.nic_bw / len(users[h.port]) for h in far.hops))
    assert t.sharers()["torus[0:x+]"] == 2


@pytest.mark.parametrize("collective,topology", [("rs", "full-mesh"), ("a2a", "full-mesh"),
                                                 ("ag", "full-mesh"), ("a2a", "switch")])
def test_fused_direct_collectives_beat_sequential_on_every_link(tmp_path, collective, topology):
    """The bounded-queue cases: with each stage's tiles spread over the destinations and a bounded
    store queue, fused direct RS, AG and all-to-all are faster than GEMM-then-collective
    (modelled times: deterministic, not wall time)."""
    out = tmp_path / "r.json"
    proc = run_pooled(["run", "-n", "8", "--collective", collective, "--topology", topology,
                       "--m", "8192", "--n", "4096", "--k", "1024", "--timing-only",
                       "--mode", "sequential,t3", "--json", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    t = {r["mode"]: r["modelled_time_s"] for r in json.loads(out.read_text())["runs"]}
    assert t["t3"] < t["sequential"], t


def test_an_outside_mpiexec_with_another_rank_count_than_the_system_is_refused():
    import sys

    from tests.conftest import mpiexec, run_group

    proc = run_group([mpiexec(), "-n", "4", sys.executable, "-m", "emulator.app.cli", "run",
                      "--system", "a100-sxm-x8", "--m", "256", "--n", "128", "--k", "64"],
                     timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "system a100-sxm-x8 has 8 GPUs" in proc.stderr
