"""What one walk carries: the query, a branch's state, and the places a packet can be."""

from __future__ import annotations

from dataclasses import dataclass, field

from traceflow import kube
from traceflow.conntrack import Conntrack
from traceflow.packet import Packet
from traceflow.trace import Drop, Hop, Leg, Verdict

MAX_LOCATIONS = 64          # a packet visiting more places than this is looping
HOST_ZONE = "host"          # the kernel's conntrack, apart from OVS zones


# ---- query ----------------------------------------------------------------------------

@dataclass
class Query:
    kind: str                       # pod-to-svc | pod-to-pod
    source: kube.Pod
    dst_ip: str
    dst_port: int
    protocol: str                   # TCP | UDP | SCTP
    src_port: int
    destination_label: str          # "default/backendsvc"
    service: kube.Service | None = None
    endpoint: str | None = None     # pin: only paths ending at this pod / IP
    reply: bool = True

    def as_dict(self) -> dict:
        return {"kind": self.kind, "source": self.source.key, "destination": self.destination_label,
                "protocol": self.protocol, "dst_port": self.dst_port, "src_port": self.src_port,
                "dst_ip": self.dst_ip}


# ---- branch state -----------------------------------------------------------------------

@dataclass
class Branch:
    legs: list
    weight: float = 1.0
    choices: list = field(default_factory=list)
    conntrack: dict = field(default_factory=dict)   # node -> Conntrack
    steps: int = 0
    end: tuple | None = None        # (Verdict, Drop | None, endpoint pod or None)
    final_packet: Packet | None = None   # the packet as the endpoint received it
    target: str | None = None            # the backend this branch chose (pod key or IP)

    def fork(self) -> "Branch":
        return Branch([Leg(l.direction, l.verdict, list(l.hops), l.description) for l in self.legs],
                      self.weight, list(self.choices),
                      {n: ct.copy() for n, ct in self.conntrack.items()}, self.steps, None,
                      self.final_packet, self.target)

    def choose_target(self, cluster, ip: str) -> None:
        """Remember the backend a load balancer picked (only the request's first choice)."""
        if self.target is None and self.leg.direction == "request":
            pod = cluster.pod_by_ip(ip)
            self.target = pod.key if pod else ip

    @property
    def leg(self) -> Leg:
        return self.legs[-1]

    def add(self, hop: Hop) -> None:
        self.leg.hops.append(hop)

    def ct(self, node: str) -> Conntrack:
        return self.conntrack.setdefault(node, Conntrack())

    def finish(self, verdict: Verdict, drop: Drop | None = None, endpoint=None) -> "Branch":
        self.end = (verdict, drop, endpoint)
        self.leg.verdict = verdict
        return self


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
    return f"{pkt.nw_src}:{pkt.tp_src} -> {pkt.nw_dst}:{pkt.tp_dst}"


def describe(pkt: Packet, q: Query | None) -> str:
    proto = pkt.proto_name
    text = f"{pkt.nw_src}:{pkt.tp_src} -> {pkt.nw_dst}:{pkt.tp_dst} {proto}"
    if q is not None:
        text = f"{q.source.key} -> {q.destination_label}: " + text
    return text


def primary_ip(iface) -> str | None:
    if iface is None:
        return None
    for a in iface.ipv4():
        if not a.secondary:
            return a.address
    return None


def new_leg(b: Branch, pkt: Packet) -> None:
    """A new leg of the same direction (the packet re-enters a datapath after the host)."""
    b.legs.append(Leg(b.leg.direction, Verdict.UNKNOWN, [], describe(pkt, None)))
