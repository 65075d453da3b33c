"""What one walk carries: the query, a branch's state, and the places a packet can be."""

from __future__ import annotations

from dataclasses import dataclass

from traceflow.bundle import kube
from traceflow.model.conntrack import Conntrack
from traceflow.model.packet import Packet
from traceflow.model.trace import Disposition, Drop, Exit, Hop, Leg, Verdict, typed_detail
from traceflow.walk.endpoints import Endpoint, Frontend, Kind

MAX_LOCATIONS = 64          # a packet visiting more places than this is looping
HOST_ZONE = "host"          # the kernel's conntrack, apart from OVS zones


# ---- query ----------------------------------------------------------------------------

@dataclass
class Query:
    """One question. ``source``/``service`` are the pod and Service of the pod-to-* commands
    (None when the source is no pod); ``src``/``dst`` are the typed ends of any question
    (``traceflow.walk.endpoints``), derived from those when a caller gives only them."""
    kind: str                       # pod-to-svc | pod-to-pod | external-to-nodeport | ...
    source: kube.Pod | None
    dst_ip: str
    dst_port: int
    protocol: str                   # TCP | UDP | SCTP
    src_port: int
    destination_label: str          # "default/backendsvc"
    service: kube.Service | None = None
    endpoint: str | None = None     # pin: only paths ending at this pod / IP
    reply: bool = True
    src: Endpoint | None = None
    dst: Endpoint | None = None
    via: str | None = None          # the node an outside packet enters (--via)
    entry_nodes: tuple = ()         # outside sources: the nodes it may enter, in order
    assumptions: tuple = ()         # what resolving the ends assumed (said as warnings)
    captured: object = None         # a real packet the question starts from
    #                                 (traceflow.walk.seen.Captured), or None

    def __post_init__(self) -> None:
        if self.src is None and self.source is not None:
            # the source pod's address of the destination's family (a dual-stack pod)
            self.src = Endpoint.of_pod(self.source, 6 if ":" in (self.dst_ip or "") else 4)
        if self.dst is None:
            if self.service is not None:
                self.dst = Endpoint.of_service(self.service, Frontend.CLUSTERIP, self.dst_ip,
                                               self.dst_port)
            else:
                self.dst = Endpoint(Kind.POD, self.dst_ip, None, self.destination_label)

    @property
    def source_label(self) -> str:
        return self.src.key if self.src is not None else "?"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "source": self.source_label,
                "destination": self.destination_label,
                "protocol": self.protocol, "dst_port": self.dst_port, "src_port": self.src_port,
                "dst_ip": self.dst_ip,
                "source_endpoint": self.src.as_dict() if self.src is not None else None,
                "destination_endpoint": self.dst.as_dict() if self.dst is not None else None,
                "via": self.via,
                **({"capture": self.captured.as_dict()} if self.captured is not None else {}),
                **({"family": "ipv6"} if self.family == 6 else {})}

    @property
    def family(self) -> int:
        """4 or 6: the family of the addresses (an IPv6 question's JSON says "family")."""
        return 6 if ":" in (self.dst_ip or "") else 4


# ---- branch state -----------------------------------------------------------------------

class _OpenLeg:
    """A leg being walked. Its hops are a chain of immutable ``(hop, previous)`` cells, so
    a fork shares every hop so far with its parent (parent pointers) and adding a hop costs
    the same however long the path is; ``Branch.legs`` materialises them as ``Leg`` lists."""

    __slots__ = ("direction", "verdict", "description", "chain", "count", "disposition", "exit")

    def __init__(self, direction: str, verdict: Verdict, description: str, chain=None,
                 count: int = 0, disposition: Disposition | None = None,
                 exit: Exit | None = None):
        self.direction, self.verdict, self.description = direction, verdict, description
        self.chain, self.count = chain, count
        self.disposition, self.exit = disposition, exit

    def copy(self) -> "_OpenLeg":
        return _OpenLeg(self.direction, self.verdict, self.description, self.chain, self.count,
                        self.disposition, self.exit)

    def add(self, hop: Hop) -> None:
        self.chain = (hop, self.chain)
        self.count += 1

    @property
    def hops(self) -> list:
        """The hops in order (a new list: add hops with ``Branch.add``)."""
        out = [None] * self.count
        cell, i = self.chain, self.count
        while cell is not None:
            i -= 1
            out[i], cell = cell
        return out

    def last_hops(self):
        """The hops newest first, without materialising the leg."""
        cell = self.chain
        while cell is not None:
            hop, cell = cell
            yield hop


class Branch:
    """One way the packet can go so far. Forks are cheap: legs share their hop history
    with the parent, and each node's conntrack is copied only when a fork first uses it."""

    def __init__(self, legs: list, weight: float = 1.0, choices: list | None = None,
                 conntrack: dict | None = None, steps: int = 0, end: tuple | None = None,
                 final_packet: Packet | None = None, target: str | None = None):
        self._legs = [_OpenLeg(l.direction, l.verdict, l.description, None, 0,
                               l.disposition, l.exit) for l in legs]
        for open_leg, leg in zip(self._legs, legs):
            for hop in leg.hops:
                open_leg.add(hop)
        self.weight = weight
        self.choices = list(choices or [])
        self.conntrack = dict(conntrack or {})   # node -> Conntrack
        self._ct_owned: set = set(self.conntrack)  # nodes whose Conntrack no other branch holds
        self.steps = steps
        self.end = end                  # (Verdict, Drop | None, endpoint pod or None)
        self.final_packet = final_packet   # the packet as the endpoint received it
        self.target = target               # the backend this branch chose (pod key or IP)
        self.disposition: Disposition | None = None   # how the current leg ended
        self.exit: Exit | None = None      # left-cluster: where and as what it left
        self.entry: tuple | None = None    # (node, device) an outside packet entered by
        self.handoff: tuple | None = None  # (node, device): handed to a CNI datapath the
        #                                     bundle lacks (host-only), where replies come back
        self.place: str | None = None      # the device the packet is on (Hop.device by default)

    def fork(self) -> "Branch":
        nb = Branch.__new__(Branch)
        nb._legs = [leg.copy() for leg in self._legs]
        nb.weight, nb.choices = self.weight, list(self.choices)
        # both now hold the same Conntrack objects: whichever uses one first copies it
        nb.conntrack, nb._ct_owned = dict(self.conntrack), set()
        self._ct_owned = set()
        nb.steps, nb.end = self.steps, None
        nb.final_packet, nb.target = self.final_packet, self.target
        nb.disposition, nb.exit, nb.entry = None, None, self.entry
        nb.handoff, nb.place = self.handoff, self.place
        return nb

    @property
    def legs(self) -> list:
        """The legs as the trace model has them (hop lists materialised)."""
        return [Leg(l.direction, l.verdict, l.hops, l.description, l.disposition, l.exit)
                for l in self._legs]

    def start_leg(self, direction: str, description: str) -> None:
        self._legs.append(_OpenLeg(direction, Verdict.UNKNOWN, description))
        self.place = None

    def set_verdicts(self, verdict: Verdict, only_unknown: bool = False) -> None:
        for leg in self._legs:
            if not only_unknown or leg.verdict == Verdict.UNKNOWN:
                leg.verdict = verdict

    def choose_target(self, cluster, ip: str) -> None:
        """Remember the backend a load balancer picked (only the request's first choice)."""
        if self.target is None and self.leg.direction == "request":
            pod = cluster.pod_by_ip(ip)
            self.target = pod.key if pod else ip

    @property
    def leg(self) -> _OpenLeg:
        return self._legs[-1]

    def add(self, hop: Hop) -> None:
        if hop.detail is None:
            hop.detail = typed_detail(hop)
        if hop.device is None:
            hop.device = self.place
        self.leg.add(hop)

    def ct(self, node: str) -> Conntrack:
        """This branch's conntrack of ``node``, its own to change."""
        if node not in self._ct_owned:
            shared = self.conntrack.get(node)
            self.conntrack[node] = shared.copy() if shared is not None else Conntrack()
            self._ct_owned.add(node)
        return self.conntrack[node]

    def ct_view(self, node: str) -> Conntrack:
        """``node``'s conntrack to read only (no copy): for a simulator that copies anyway."""
        return self.conntrack.get(node) or Conntrack()

    def set_ct(self, node: str, conntrack: Conntrack) -> None:
        """Replace ``node``'s conntrack with one nobody else holds (an OVS run's)."""
        self.conntrack[node] = conntrack
        self._ct_owned.add(node)

    def finish(self, verdict: Verdict, drop: Drop | None = None, endpoint=None,
               disposition: Disposition | None = None, exit: Exit | None = None) -> "Branch":
        """End the current leg. The disposition is the one its maker states (on the Drop, or
        here); a delivery to a pod or a node's stack, or an unknown, says itself."""
        if disposition is None and drop is not None:
            disposition = drop.disposition
        if disposition is None:
            disposition = _implied(verdict, endpoint)
        if drop is not None and drop.disposition is None:
            drop.disposition = disposition
        self.end = (verdict, drop, endpoint)
        self.leg.verdict = verdict
        self.leg.disposition = disposition
        self.leg.exit = exit
        self.disposition, self.exit = disposition, exit
        return self


def _implied(verdict: Verdict, endpoint) -> Disposition:
    """The disposition only the verdict and the receiver tell: a delivery (to a pod, or to
    a hostNetwork pod's node stack) or an unknown. A drop always states its own."""
    if verdict == Verdict.UNKNOWN:
        return Disposition.UNKNOWN
    if verdict == Verdict.DELIVERED:
        if isinstance(endpoint, kube.Pod) and endpoint.host_network:
            return Disposition.DELIVERED_HOST
        return Disposition.DELIVERED_POD
    raise AssertionError("a dropped leg must state its disposition (traceflow.trace.Disposition)")


# ---- locations: (node, place) ---------------------------------------------------------------

@dataclass
class AtOvs:
    """An OVS bridge, the packet arriving on ``in_port``."""
    node: str
    in_port: int
    packet: Packet


@dataclass
class AtHost:
    """The kernel host stack, the packet arriving on interface ``iif`` (None: sent locally)."""
    node: str
    iif: str
    packet: Packet


@dataclass
class AtBpf:
    """A BPF program attached to a device's tc/tcx hook (``ingress``/``egress``), or reached
    by tail call (``via`` names the caller)."""
    node: str
    device: str
    hook: str                  # ingress | egress
    program: str               # e.g. from-container, cil_from_netdev
    packet: Packet
    via: str | None = None


@dataclass
class AtUnderlay:
    """Between nodes, outside any bundle: the packet sent by ``node`` out of ``device``."""
    node: str
    device: str
    packet: Packet
    nexthop: str | None = None


# ---- small helpers shared by components -----------------------------------------------------

def tuple5(pkt: Packet) -> tuple:
    return (pkt.nw_proto, pkt.nw_src, pkt.tp_src, pkt.nw_dst, pkt.tp_dst)


def fmt(pkt: Packet) -> str:
    return f"{hostport(pkt.nw_src, pkt.tp_src)} -> {hostport(pkt.nw_dst, pkt.tp_dst)}"


def describe(pkt: Packet, q: Query | None) -> str:
    proto = pkt.proto_name
    text = f"{fmt(pkt)} {proto}"
    if q is not None:
        text = f"{q.source_label} -> {q.destination_label}: " + text
    return text


def primary_ip(iface, family: int = 4) -> str | None:
    """The device's first primary address of ``family`` (an IPv6 one of global scope first:
    a link-local address is no source for routed traffic)."""
    if iface is None:
        return None
    addrs = [a for a in iface.addresses if a.family == family and not a.secondary]
    if family == 6:
        addrs.sort(key=lambda a: a.scope == "link")
    return addrs[0].address if addrs else None


def hostport(ip, port) -> str:
    """``10.0.0.1:80``, ``[fd00::1]:80`` (an IPv6 address is bracketed before its port)."""
    if port is None:
        return str(ip)
    return f"[{ip}]:{port}" if ip and ":" in str(ip) else f"{ip}:{port}"


def new_leg(b: Branch, pkt: Packet) -> None:
    """A new leg of the same direction (the packet re-enters a datapath after the host)."""
    b.start_leg(b.leg.direction, describe(pkt, None))
