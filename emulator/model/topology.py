"""Where each GPU of a job sits and the route a transfer between two of them takes.

Ranks are placed in blocks: rank r is GPU ``r mod G`` of node ``r div G`` (G
GPUs per node; a PCIe node has ``sockets`` blocks of G / sockets GPUs). A route
from ``src`` to ``dst`` is the list of ports (one direction each) it crosses on
the sender's side, each with the rate this GPU gets of it and its latency; the
data streams through them at the slowest one's rate (cut-through), every port
carrying it in the same intervals (``clock.reserve_together``: where one port is
busy with other transfers, the others are not held either), and arrives after the
sum of their latencies.

Intra-node (one hop unless said):
- ring: a link per direction to each ring neighbour (local index +-1 mod G);
- full-mesh: a link per direction to every GPU of the node;
- switch (NVSwitch): the GPU's up port; the receiver's down port is contended
  on its side (``RankClock.receive``);
- pcie: as a switch within a socket (the GPU's x16 link to its PCIe switch);
  across sockets the inter-socket CPU link is a second hop.
Inter-node: the GPU's NIC (``nics_per_node`` NICs, the node's GPUs spread
evenly over them) into a non-blocking fabric (``fabric``: ``latency`` end to
end) or a 2D torus of nodes (``torus2d``: dimension-ordered, shortest way
round, ``latency`` plus ``torus_hop_latency`` per further node; every torus link
of the route is a hop, shared by all the flows that cross it).
Ports several GPUs send across (a socket link, a NIC, a torus link) are split
evenly among the GPUs whose flows cross them in the job's traffic pattern:
each rank to the one before it on the ring (``ring``), or every rank to every
other (``direct``). ASSUMPTION: those flows run at the same time, as in a
collective where every rank moves the same bytes; the emulator cannot see
the other ranks' reservations, so it does not arbitrate them dynamically. On PCIe systems the
GPU reaches its socket's NIC through its own PCIe port first.

The receiving side (reserved by the receiver: ``RankClock.receive``):
behind a switch or PCIe the GPU's down port takes everything it receives; across a
fabric its NIC's receive side (``receive_hop``: the NIC of its own socket's block, so
no socket link is crossed on the way in) takes what came over the network, split evenly among the
GPUs that receive through it in the traffic pattern, as the sending side is. So
writers on other nodes that send to one GPU at once (an incast) queue at its NIC,
while a GPU taking turns with its node's other GPUs gets its share. On a torus the
last link of the route is the receiving node's port, already booked by the sender.

A ring over the job (``ring``) visits the nodes in an order that crosses the
network as few times as possible (a snake over a torus), and each node's GPUs
socket by socket.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.spec import InterconnectSpec


def has_down_port(ic: InterconnectSpec) -> bool:
    """Whether each GPU receives through a port of its own that all its incoming transfers
    share (a switch's or PCIe's down port; ``RankClock.receive``)."""
    return ic.topology in ("switch", "pcie")


def has_receive_queue(ic: InterconnectSpec) -> bool:
    """Whether some GPU's receiving side queues its incoming transfers: a down port, or
    (across a fabric) its NIC's receive side (``Topology.receive_hop``)."""
    return has_down_port(ic) or ic.network == "fabric"


class NoRoute(ValueError):
    """Two GPUs the topology does not connect (a ring's non-neighbours)."""


@dataclass(frozen=True)
class Hop:
    port: str  # one direction of a link or port, e.g. "link[0->1]", "nic-out[1.0]"
    rate: float  # bytes/s this GPU gets of it
    latency: float  # seconds
    shared: bool = False  # several GPUs' flows cross it: each gets an equal share


@dataclass(frozen=True)
class Route:
    hops: tuple[Hop, ...]

    @property
    def rate(self) -> float:
        return min(h.rate for h in self.hops)

    @property
    def latency(self) -> float:
        return sum(h.latency for h in self.hops)


class Topology:
    def __init__(self, ic: InterconnectSpec, world: int, pattern: str = "direct"):
        if pattern not in ("ring", "direct"):
            raise ValueError(f"traffic pattern {pattern!r}: ring or direct")
        self.ic, self.world, self.pattern = ic, world, pattern
        self._sharers: dict[str, int] | None = None
        self._receivers: dict[str, int] | None = None
        self.per_node = ic.gpus_on_node(world)
        if world % self.per_node:
            raise ValueError(f"{world} GPUs do not fill nodes of {self.per_node}")
        self.nodes = world // self.per_node
        self.sockets = ic.sockets if ic.topology == "pcie" else 1
        self.per_socket = self.per_node // self.sockets
        self.switched = has_down_port(ic)
        self._routes: dict[tuple[int, int], Route] = {}

    @classmethod
    def of(cls, spec, world: int, pattern: str = "direct") -> Topology:
        return cls(spec.interconnect, world, pattern)

    def node(self, r: int) -> int:
        return r // self.per_node

    def socket(self, r: int) -> int:
        return (r % self.per_node) // self.per_socket

    def crosses_network(self, src: int, dst: int) -> bool:
        return self.node(src) != self.node(dst)

    def route(self, src: int, dst: int, channels: bool = False) -> Route:
        """The ports from ``src`` to ``dst``. ``channels``: a library collective's ring, whose
        channels cross the network over every NIC of the node (NCCL's search.cc picks
        the NICs round-robin over the channels; each channel's ring leaves a node from
        another GPU), so its node-to-node step streams at the node's NICs together."""
        key = (src, dst, channels)
        r = self._routes.get(key)
        if r is None:
            hops = self._hops(src, dst)
            if channels and self.crosses_network(src, dst) and self.ic.network == "fabric":
                ic = self.ic
                hops = [h for h in hops if not h.port.startswith("nic-out")]
                hops.append(Hop(f"nics-out[{self.node(src)}]",
                                ic.nic_bw * max(1, ic.nics_per_node), ic.nic_latency_s))
            if any(h.shared for h in hops):
                sharers = self.sharers()
                hops = [Hop(h.port, h.rate / max(1, sharers.get(h.port, 1)), h.latency)
                        if h.shared else h for h in hops]
            r = self._routes[key] = Route(tuple(hops))
        return r

    def flows(self):
        """The (src, dst) pairs the job's collectives use: each rank to the one before it on
        the ring (``ring``), or every rank to every other (``direct``)."""
        if self.pattern == "ring":
            ring = self.ring()
            return [(ring[i], ring[i - 1]) for i in range(self.world) if self.world > 1]
        return [(s, d) for s in range(self.world) for d in range(self.world) if s != d]

    def sharers(self) -> dict[str, int]:
        """Shared port -> how many GPUs send across it in the job's traffic pattern."""
        if self._sharers is None:
            users: dict[str, set[int]] = {}
            for s, d in self.flows():
                for h in self._hops(s, d):
                    if h.shared:
                        users.setdefault(h.port, set()).add(s)
            self._sharers = {p: len(u) for p, u in users.items()}
        return self._sharers

    def receive_hop(self, dst: int, channels: bool = False) -> Hop | None:
        """The port on ``dst``'s side that its data from other nodes crosses before its down
        port: across a fabric, the receive side of ``dst``'s NIC (``channels``: a library
        collective's ring arrives over every NIC of the node, ``route``), at the share the
        GPUs receiving through it in the traffic pattern get; None on one node or a torus
        (whose last link, the receiving node's port, the sender books)."""
        ic = self.ic
        if self.nodes == 1 or ic.network != "fabric":
            return None
        if channels:
            return Hop(f"nics-in[{self.node(dst)}]", ic.nic_bw * max(1, ic.nics_per_node), 0.0)
        port = self._nic_in(dst)
        if self._receivers is None:
            users: dict[str, set[int]] = {}
            for s, d in self.flows():
                if self.crosses_network(s, d):
                    users.setdefault(self._nic_in(d), set()).add(d)
            self._receivers = {p: len(u) for p, u in users.items()}
        return Hop(port, ic.nic_bw / max(1, self._receivers.get(port, 1)), 0.0)

    def _nic(self, r: int) -> int:
        """The NIC of the node that GPU ``r`` sends and receives through."""
        return (r % self.per_node) // (self.per_node // self.ic.nics_per_node)

    def _nic_in(self, r: int) -> str:
        return f"nic-in[{self.node(r)}.{self._nic(r)}]"

    def _hops(self, src: int, dst: int) -> list[Hop]:
        ic = self.ic
        if src == dst or not (0 <= src < self.world and 0 <= dst < self.world):
            raise NoRoute(f"no route from rank {src} to rank {dst} in a job of {self.world}")
        L, lat = ic.link_bw, ic.link_latency_s
        if self.node(src) == self.node(dst):
            if ic.topology in ("ring", "full-mesh"):
                if ic.topology == "ring" and not self._ring_neighbours(src, dst):
                    raise NoRoute(f"rank {src} has no link to rank {dst} (a ring links "
                                  f"neighbours only)")
                return [Hop(f"link[{src}->{dst}]", L, lat)]
            hops = [Hop(f"port-up[{src}]", L, lat)]
            if self.socket(src) != self.socket(dst):
                a, b = self.socket(src), self.socket(dst)
                hops.append(Hop(f"socket[{self.node(src)}.{a}->{b}]", ic.socket_bw,
                                ic.socket_latency_s, shared=True))
            return hops
        if not ic.network:
            raise NoRoute(f"ranks {src} and {dst} are on different nodes and the system has "
                          f"no network")
        hops = [Hop(f"port-up[{src}]", L, 0.0)] if ic.topology == "pcie" else []
        nic = self._nic(src)
        if ic.network == "torus2d":
            links = self._torus_links(self.node(src), self.node(dst))
            hops += [Hop(port, ic.nic_bw, ic.nic_latency_s if i == 0 else
                         ic.torus_hop_latency_s, shared=True) for i, port in enumerate(links)]
        else:
            hops.append(Hop(f"nic-out[{self.node(src)}.{nic}]", ic.nic_bw, ic.nic_latency_s,
                            shared=True))
        return hops

    def _ring_neighbours(self, a: int, b: int) -> bool:
        g = self.per_node
        d = (a - b) % g
        return d in (1, g - 1)

    def _torus_links(self, a: int, b: int) -> list[str]:
        """The node-to-node links of the dimension-ordered route from node a to node b: X
        first, then Y, each the shortest way round (ties: the + direction)."""
        X, Y = self.ic.torus
        (x, y), (bx, by) = divmod(a, Y), divmod(b, Y)
        links = []
        for dim, size, pos, end in (("x", X, x, bx), ("y", Y, y, by)):
            d = (end - pos) % size
            step, sign = (1, "+") if d <= size - d else (-1, "-")
            for _ in range(min(d, size - d)):
                links.append(f"torus[{x * Y + y}:{dim}{sign}]")
                pos = (pos + step) % size
                if dim == "x":
                    x = pos
                else:
                    y = pos
        return links

    def ring(self) -> tuple[int, ...]:
        """An order of all ranks for ring algorithms: node by node (a snake over a torus),
        each node's GPUs in order (socket by socket), so the ring crosses the network
        once per node and each socket link once per direction."""
        if self.ic.network == "torus2d" and self.nodes > 1:
            X, Y = self.ic.torus
            nodes = [x * Y + (y if x % 2 == 0 else Y - 1 - y) for x in range(X)
                     for y in range(Y)]
        else:
            nodes = list(range(self.nodes))
        return tuple(n * self.per_node + g for n in nodes for g in range(self.per_node))

    def describe(self) -> str:
        ic = self.ic
        intra = f"{ic.topology}" + (f" ({self.sockets} sockets)" if self.sockets > 1 else "")
        if self.nodes == 1:
            return intra
        return (f"{self.nodes} nodes x {self.per_node} GPUs ({intra}) over a "
                f"{ic.network} ({ic.nics_per_node} NICs per node)")
