"""A question that starts from a real packet: where it was captured, which leg of its
connection it is, and where the walk takes it from there.

``Captured`` rides on the Query (``traceflow.questions.capture.start`` makes it from a
frame). The walk reads it in three places (``traceflow.walk.core``):

- the request's first packet is the captured one (its MACs, TTL, ports, flags), and a pod
  sender's first hop keeps the captured MACs where its files say otherwise (said);
- ``start``: a packet seen on a node's device (``--seen-at NODE:IFACE``) is walked from
  there: the CNI's datapath says where its own devices lead (``Datapath.start_at``: OVS's
  gateway, tunnel and pod ports; a BPF hook), any other device is the host's: received, the
  host stack takes it (``enter_from_outside``); sent, it is on the wire to whoever owns its
  destination. A frame captured in a VXLAN/Geneve tunnel continues on the node its outer
  destination names (``Datapath.arrive_by_tunnel``), the outer header being the tunnel hop;
- a packet of an established connection (no SYN) is walked after its connection's first
  packet and the answer, so conntrack holds the connection (``+est``) when it passes.

A reply (SYN-ACK, or a server's packet) needs nothing here: the question is its connection,
and the reply leg is the captured packet's.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceflow.bundle.snapshot import Missing
from traceflow.model.errors import InputError
from traceflow.model.packet import Packet, Tunnel
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.state import fmt


@dataclass(frozen=True)
class SeenAt:
    """Where a packet was captured: a node's device, or inside a pod (its eth0)."""
    node: str | None
    device: str | None
    pod: str | None = None              # "ns/name" when captured inside the pod
    sent: bool | None = None            # the node's side of the device sent it (tcpdump's
    #                                     Out) / received it (In) / not known
    how: str = ""                       # --seen-at, the pcapng interface, the cooked header ...

    @property
    def label(self) -> str:
        if self.pod is not None:
            return f"{self.pod} eth0"
        way = "" if self.sent is None else (" (sent)" if self.sent else " (received)")
        return f"{self.node} {self.device}{way}"

    def as_dict(self) -> dict:
        return {"node": self.node, "device": self.device, "pod": self.pod,
                "direction": None if self.sent is None else ("out" if self.sent else "in"),
                "how": self.how or None}


@dataclass
class Captured:
    """The packet a question starts from, and what the capture told about it."""
    packet: Packet                      # as captured (a tunnel frame's inner packet)
    frame: str                          # "trace.pcap frame 3", "--tcpdump"
    direction: str                      # "request" | "reply": its leg of the connection
    established: bool                   # not its connection's first packet (no SYN)
    why: str                            # how the direction was told
    seen_at: SeenAt | None = None       # where it was captured, when known
    start: SeenAt | None = None         # where the walk starts (None: at its sender)
    outer: Tunnel | None = None         # the tunnel header it was captured in
    taken: tuple = ()                   # what was taken from the capture, in words
    notes: tuple = ()                   # what that assumes
    flags: str | None = None            # the captured TCP flags (syn,ack / ack,psh ...)

    def as_dict(self) -> dict:
        return {"frame": self.frame, "direction": self.direction,
                "established": self.established, "why": self.why,
                "seen_at": self.seen_at.as_dict() if self.seen_at else None,
                "starts_at": self.start.as_dict() if self.start else None,
                "tcp_flags": self.flags,
                "packet": self.packet.headers(),
                "outer": None if self.outer is None else {
                    "kind": self.outer.kind, "src": self.outer.src, "dst": self.outer.dst,
                    "vni": self.outer.vni, "dport": self.outer.dport},
                "taken": list(self.taken), "notes": list(self.notes)}


def first_packet(q) -> Packet | None:
    """The request's first packet when the capture is a request-direction one."""
    c = q.captured
    if c is None or c.direction != "request":
        return None
    pkt = c.packet.copy()
    if c.established:
        pkt.tcp_flags = "syn" if pkt.nw_proto == 6 else None  # its connection's first packet
    return pkt


def keep_captured_macs(walk, branch, loc, q) -> None:
    """A pod sender's first hop: the datapath put the MACs its files say on the packet; the
    capture saw what the pod really sent, and that is what the next hop gets (said)."""
    c = q.captured
    if c is None or c.direction != "request" or c.start is not None or loc is None:
        return
    pkt = getattr(loc, "packet", None)
    if pkt is None:
        return
    said = []
    for name, seen in (("dl_src", c.packet.dl_src), ("dl_dst", c.packet.dl_dst)):
        derived = getattr(pkt, name)
        if seen != "00:00:00:00:00:00" and seen != derived:
            setattr(pkt, name, seen)
            said.append(f"{name} {seen} (the files say {derived})")
    if not said:
        return
    hop = next(branch.leg.last_hops(), None)
    text = f"the capture ({c.frame}) shows " + ", ".join(said) + ": traced as captured"
    if hop is not None:
        hop.packet = pkt.headers()
        hop.notes.append(text)
    walk.warnings.append(text)


def start(walk, branch, packet: Packet, q) -> list:
    """The request leg from where the packet was captured (``q.captured.start``)."""
    c = q.captured
    at = c.start
    if c.outer is not None:
        return _from_tunnel(walk, branch, packet, q, at)
    way = {True: "sent by", False: "received by", None: "seen on"}[at.sent]
    branch.add(Hop(at.node, "capture", at.device, None,
                   f"captured on {at.node}'s {at.device} ({way} {at.node}'s side, {at.how}): "
                   f"{fmt(packet)}; the walk starts here", packet=packet.headers(),
                   detail="capture", device=at.device,
                   notes=[f"the hops before {at.node} {at.device} are not traced: the packet "
                          "is taken as captured"]))
    branch.place = at.device
    try:
        loc = walk.datapath.start_at(branch, at.node, at.device, packet, q, at.sent)
        if loc is NotImplemented:
            loc = _host_device(walk, branch, at, packet, q)
    except Missing as miss:
        return [walk.missing(branch, at.node, "capture", miss)]
    if loc is None:
        return [branch]
    if isinstance(loc, tuple):                       # (branch, location) from the host's helpers
        branch, loc = loc
        if loc is None:
            return [branch]
    return walk._run(branch, loc, q)


def _host_device(walk, branch, at: SeenAt, packet: Packet, q):
    """A device of the node's own (no datapath claims it): received, the host stack (or the
    datapath's ingress program there) takes it; sent, it is on the wire."""
    sent = at.sent
    if sent is None:
        iface = walk.snap.node(at.node).interface(at.device)
        mac = (iface.mac or "").lower() if iface is not None else ""
        if mac and packet.dl_src == mac:
            sent = True
        elif mac and packet.dl_dst == mac:
            sent = False
        else:
            raise InputError(f"cannot tell whether {at.node} sent or received the packet on "
                             f"{at.device} (neither MAC is {at.device}'s {mac or '(unknown)'}): "
                             f"say --seen-at {at.node}:{at.device}:in (received) or :out (sent)",
                             "--seen-at")
    if not sent:
        return walk.datapath.enter_from_outside(branch, at.node, at.device, packet, q)
    return _on_the_wire(walk, branch, at.node, at.device, packet, q)


def _on_the_wire(walk, branch, node: str, device: str, packet: Packet, q):
    """Sent out of ``node``'s ``device``: to another node's address, a pod of another node
    (the network between nodes routes it), or out of the cluster."""
    cluster = walk.cluster
    peer = cluster.node_by_ip(packet.nw_dst)
    if peer is not None and peer.name != node:
        return walk.host.to_node(branch, node, device, peer, packet)
    owner = cluster.node_for_pod_ip(packet.nw_dst)
    if owner is not None and owner.name != node:
        branch.add(Hop(owner.name, "underlay", None, None,
                       f"{node} -> {owner.name} over the network between nodes: {packet.nw_dst} "
                       f"is in {owner.name}'s pod CIDR ({', '.join(owner.pod_cidrs)})",
                       packet=packet.headers(), detail="underlay",
                       notes=[f"assumed: the network between nodes routes {packet.nw_dst} to "
                              f"{owner.name} (native routing); not in the bundle"]))
        device = walk._entry_device(owner.name, owner.internal_ip)
        return walk.datapath.enter_from_outside(branch, owner.name, device, packet, q)
    return (walk.host.leave_cluster(branch, node, device, None, packet), None)


def _from_tunnel(walk, branch, packet: Packet, q, at: SeenAt | None) -> list:
    """A frame captured in a VXLAN/Geneve tunnel: the outer header is the tunnel hop, and
    the inner packet arrives on the node the outer destination names."""
    outer = q.captured.outer
    peer = walk.cluster.node_by_ip(outer.dst)
    where = f" on {at.node}'s {at.device}" if at is not None and at.node else ""
    if peer is None:
        raise InputError(f"the tunnel's outer destination {outer.dst} ({q.captured.frame}) is "
                         "no node of the bundle (k8s/nodes.yaml): nothing to follow it to",
                         "--seen-at" if at is not None else q.captured.frame)
    inner = packet.copy()
    inner.tunnel = Tunnel(outer.kind, outer.src, outer.dst, outer.vni, outer.dport)
    sender = walk.cluster.node_by_ip(outer.src)
    kind = "Geneve" if outer.kind == "geneve" else outer.kind.upper()
    node = at.node if at is not None and at.node else peer.name
    branch.add(Hop(node, "tunnel", outer.kind, None,
                   f"captured{where} in a {kind} tunnel: outer {outer.src}"
                   f"{f' ({sender.name})' if sender else ''} -> {outer.dst} ({peer.name}) "
                   f"UDP/{outer.dport} VNI {outer.vni}; {peer.name} decapsulates it",
                   packet=inner.headers(), detail="capture",
                   device=at.device if at is not None else None,
                   notes=["the outer header is the capture's; the hops before it are not "
                          "traced"]))
    try:
        loc = walk.datapath.arrive_by_tunnel(branch, peer.name, inner, q)
    except Missing as miss:
        return [walk.missing(branch, peer.name, "tunnel", miss)]
    if loc is None:
        return [branch]
    return walk._run(branch, loc, q)


def mid_path(q) -> bool:
    """Whether the walk started where the packet was captured, past its sender."""
    c = q.captured
    return c is not None and c.direction == "request" and (c.start is not None
                                                            or c.outer is not None)


def before_the_capture(walk, b, loc, q) -> bool:
    """A reply reaching a node its request did not cross in this trace, when the walk started
    mid-path: the request did cross it before it was captured, and what that left in
    conntrack (its NAT, OVS's committed zones) is not known. The reply stops there, unknown
    (said), instead of meeting a conntrack that looks empty."""
    if not mid_path(q) or b.leg.direction != "reply":
        return False
    crossed = {h.node for leg in b.legs if leg.direction == "request" for h in leg.hops
               if h.detail != "capture"}
    if loc.node in crossed:
        return False
    at = q.captured.start
    where = f"{at.node} {at.device}" if at is not None else "the tunnel"
    why = (f"the reply reaches {loc.node}, which the request crossed before it was captured "
           f"({where}): what that left in {loc.node}'s conntrack (NAT, committed zones) is not "
           "in a trace that starts at the capture; trace from the sender to follow it")
    b.add(Hop(loc.node, "capture", None, None, why, unknown=True, detail="capture"))
    b.finish(Verdict.UNKNOWN, Drop(loc.node, "capture", None, None, why, Disposition.UNKNOWN))
    return True


def established_leg(walk, rb, server, q) -> list:
    """After its connection's first packet and the answer: the captured packet itself, with
    conntrack holding the connection (established)."""
    eb = rb.fork()
    eb.end = None
    pkt = q.captured.packet.copy()
    eb.start_leg("request", f"the captured packet ({q.captured.frame}), conntrack established: "
                            f"{fmt(pkt)}")
    return walk._request(eb, pkt, q)


def not_established(rb, q) -> None:
    """The connection's set-up failed: the captured packet is not walked (said)."""
    rb.choices.append(f"the captured packet ({q.captured.frame}) is not walked: its "
                      "connection's set-up did not complete in the trace")

