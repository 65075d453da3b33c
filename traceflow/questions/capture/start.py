"""A captured frame as the question: its connection's two ends resolved from the addresses
by the rules `traceflow trace` uses (a pod, a Service frontend, a node, an outside address),
which leg of the connection it is, where it was captured and where the walk starts.

Which leg: a SYN is its connection's first packet (the request); a SYN-ACK the answer (the
reply leg; the request that opened the connection is walked first, so conntrack holds it);
any other packet is told by its ends: the side that is a Service frontend, or a pod's
declared port, or a well-known port facing an ephemeral one, is the server (said as an
assumption when only the ports tell). A packet of an established connection in the
request's direction is walked after its connection's first packet and the answer
(traceflow.walk.seen).

Where it was captured: ``--seen-at POD`` (inside the pod: its eth0) or ``NODE:IFACE`` (with
``:in``/``:out`` when the capture does not say which way), else the pcapng interface name
when it names one device of the bundle (``NODE:IFACE`` as `-o pcap` writes it, or a device
only one node has). A request seen on a node's device starts the walk there; anywhere else
the walk starts at the sender, and the captured packet is found among the trace's hops.
"""

from __future__ import annotations

import dataclasses

from traceflow.bundle.snapshot import Missing
from traceflow.model.errors import InputError
from traceflow.questions.capture.frames import Frame
from traceflow.walk.seen import Captured, SeenAt

EPHEMERAL = 32768                 # Linux's ip_local_port_range starts here (32768-60999)
PROTOCOL_NAMES = {6: "TCP", 17: "UDP", 132: "SCTP"}


# ---- which leg of its connection the packet is ----------------------------------------------

def direction(snap, frame: Frame) -> tuple[str, bool, str]:
    """("request" | "reply", established, why)."""
    t = frame.transport
    if t.proto == 6 and t.flags is not None:
        if frame.syn:
            return "request", False, "a SYN: its connection's first packet"
        if frame.syn_ack:
            return "reply", False, ("a SYN-ACK: the answer to its connection's first packet "
                                    "(traced as the reply leg, after the request)")
    if t.proto == 6 and t.flags is None:
        return "request", False, "TCP flags not shown: taken as its connection's first packet"
    side, why = server_side(snap, frame)
    what = {6: f"a TCP packet with flags {t.flag_text.upper() if t.flags is not None else '?'}",
            17: "a UDP datagram", 132: "an SCTP packet"}[t.proto]
    if side == "src":
        return "reply", True, f"{what} from the server side ({why}): the reply leg"
    if t.proto == 6:
        return "request", True, (f"{what} (no SYN) towards the server side ({why}): a packet "
                                 "of an established connection, walked after its first "
                                 "packet and the answer")
    return "request", False, f"{what} towards the server side ({why}): traced as its flow's first"


def server_side(snap, frame: Frame) -> tuple[str, str]:
    """("dst" | "src", why): which end of the frame is the server."""
    n, t = frame.network, frame.transport
    cluster = snap.cluster
    for side, ip, port in (("dst", n.dst, t.dport), ("src", n.src, t.sport)):
        what = _frontend(cluster, ip, port, t.proto)
        if what:
            return side, f"{ip}:{port} is {what}"
    for side, ip, port in (("dst", n.dst, t.dport), ("src", n.src, t.sport)):
        for pod in cluster.pods_at(ip):
            if any(num == port for _, num, _ in pod.container_ports):
                return side, f"{ip}:{port} is a port {pod.key} declares"
    if t.dport < 1024 <= t.sport or (t.sport >= EPHEMERAL > t.dport):
        return "dst", f"assumed from the ports: {t.dport} is the service port, {t.sport} the client's"
    if t.sport < 1024 <= t.dport or (t.dport >= EPHEMERAL > t.sport):
        return "src", f"assumed from the ports: {t.sport} is the service port, {t.dport} the client's"
    return "dst", "assumed: neither end is a Service or a declared port; the sender taken as the client"


def _frontend(cluster, ip: str, port: int, proto: int) -> str | None:
    name = PROTOCOL_NAMES.get(proto, "")
    svc = cluster.service_at(ip)
    if svc is not None and any(p.port == port and p.protocol.upper() == name for p in svc.ports):
        return f"Service {svc.key}'s cluster IP"
    for s in cluster.services:
        if ip in s.lb_ips or ip in s.external_ips:
            if any(p.port == port for p in s.ports):
                return f"a frontend of Service {s.key}"
    if cluster.node_by_ip(ip) is not None:
        for s in cluster.services:
            if any(p.node_port == port and p.protocol.upper() == name for p in s.ports):
                return f"NodePort {port} of Service {s.key}"
    return None


# ---- where it was seen -------------------------------------------------------------------------

def devices(snap, node: str) -> set:
    """The device names a capture on ``node`` can name: its interfaces, its OVS ports, the
    tunnel device the manifest names."""
    model = snap.node(node)
    out = {i.name for i in model.interfaces}
    try:
        out |= set(model.bridge.ports)
    except Missing:
        pass
    tunnel = ((snap.bundle.manifest.get("nodes") or {}).get(node) or {}).get("tunnel_dev")
    if tunnel:
        out.add(tunnel)
    return out


def seen_at(snap, text: str, namespace: str = "default") -> SeenAt:
    """``--seen-at``: POD (inside the pod) or NODE:IFACE[:in|:out]."""
    text = text.strip()
    if ":" not in text:
        from traceflow.questions import resolve
        pod = resolve.pod(snap.cluster, text, namespace, "--seen-at")
        return SeenAt(pod.node, "eth0", pod.key, None, "--seen-at")
    parts = text.split(":")
    if len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("in", "out")):
        raise InputError(f"--seen-at {text!r}: write POD, or NODE:IFACE, or NODE:IFACE:in "
                         "(received) / :out (sent)", "--seen-at")
    node = parts[0].removeprefix("node/")
    device = parts[1]
    names = snap.bundle.node_names()
    if node not in names:
        raise InputError(f"--seen-at {text!r}: node {node} is not in the bundle (it has: "
                         f"{', '.join(sorted(names)) or 'none'})", "--seen-at")
    known = devices(snap, node)
    if known and device not in known:
        raise InputError(f"--seen-at {text!r}: {node} has no device {device} (nodes/{node}/"
                         f"ip-addr.txt, ovs-show.txt: {', '.join(sorted(known)[:12])}"
                         f"{' ...' if len(known) > 12 else ''})", "--seen-at")
    sent = {"in": False, "out": True}.get(parts[2]) if len(parts) == 3 else None
    return SeenAt(node, device, None, sent, "--seen-at")


def from_interface(snap, frame: Frame) -> tuple[SeenAt | None, str | None]:
    """The pcapng interface (or tcpdump -i any's) as the place it was seen, when it names one
    device of the bundle: (SeenAt or None, a note when it could not be used)."""
    name = frame.interface
    if not name:
        return None, None
    names = snap.bundle.node_names()
    node, _, device = name.partition(":")
    if device and node in names:
        device = device.partition(":")[0]
        if device in devices(snap, node):
            return SeenAt(node, device, None, None, "the capture's interface name"), None
        return None, (f"the capture's interface {name!r}: {node} has no device {device!r}; "
                      "where it was seen is not used (--seen-at says it)")
    having = [n for n in names if name in devices(snap, n)]
    if len(having) == 1:
        return SeenAt(having[0], name, None, None, "the capture's interface name"), None
    pods = [p for p in (snap.cluster.pod_by_ip(ip) for ip in (frame.network.src,
                                                             frame.network.dst)) if p]
    if not having and name == "eth0" and len(pods) == 1:     # a pod's own interface
        return SeenAt(pods[0].node, "eth0", pods[0].key, None,
                      f"the capture's interface name (inside {pods[0].key})"), None
    if not having:
        return None, (f"the capture's interface {name!r} is no device of the bundle's nodes: "
                      "where it was seen is not used (--seen-at says it)")
    return None, (f"the capture's interface {name!r} is a device of {', '.join(sorted(having))}: "
                  "which node's is not known (--seen-at NODE:IFACE says it)")


# ---- the question ------------------------------------------------------------------------------

def frame_query(snap, frame: Frame, seen: str | None = None, namespace: str = "default",
                via: str | None = None, pin: str | None = None, reply: bool = True,
                expect: str | None = None):
    """The Query (traceflow.walk.state) of a captured frame; ``expect`` is ``pod-to-svc`` or
    ``pod-to-pod`` when the command promises those ends."""
    from traceflow.questions import resolve
    notes: list = []
    leg, established, why = direction(snap, frame)
    n, t = frame.network, frame.transport
    if leg == "reply" and not reply:
        raise InputError(f"{frame.ref} is a reply ({why}): its leg is the reply; leave out "
                         "--no-reply", "--no-reply")
    client, server = ((n.src, t.sport), (n.dst, t.dport)) if leg == "request" else \
        ((n.dst, t.dport), (n.src, t.sport))
    where = seen_at(snap, seen, namespace) if seen else None
    if where is None:
        where, note = from_interface(snap, frame)
        if note:
            notes.append(note)
    where = with_direction(snap, where, frame)
    proto = PROTOCOL_NAMES[n.proto]
    src_ref = _ref(snap, client[0], frame, "source")
    dst_ref = _ref(snap, server[0], frame, "destination")
    dst_text = f"{dst_ref}:{server[1]}"
    try:
        q = resolve.trace_query(snap, src_ref, dst_text, namespace, None, proto.lower(),
                                client[1], via, pin, reply)
    except InputError as err:
        raise frame.error(f"its connection {client[0]}:{client[1]} -> {server[0]}:{server[1]} "
                           f"{proto}: {err}") from None
    q = _addressed_as_captured(q, client[0], server[0])
    _expect(q, expect, frame)
    start = _start(snap, frame, where, leg)
    if start is not None and q.src is not None and q.src.kind.value == "pod":
        notes.append(f"the walk starts where the packet was captured ({start.label}): the hops "
                     f"from {q.src.key} to there are not traced")
    if where is not None and (start is not None or leg == "reply" or where.pod == _key(q.dst)):
        front = _backend_of(snap.cluster, server[0], server[1])
        if front is not None and (q.dst is None or q.dst.service is None):
            notes.append(f"{server[0]}:{server[1]} is a backend of Service {front}: if the "
                         "client connected to the Service, the translation before the capture "
                         "(and the reply's un-NAT there) is not in this trace; trace the "
                         "Service to see it")
    if frame.link is not None and frame.link.vlans:
        notes.append(f"VLAN {', '.join(map(str, frame.link.vlans))}: the walk carries the "
                     "packet untagged, as the node's VLAN device hands it on (ovs-trace takes "
                     "the tag as dl_vlan)")
    captured = Captured(frame.packet(), frame.ref, leg, established, why, where, start,
                        frame.outer.tunnel() if frame.outer is not None else None,
                        tuple(frame.taken()), tuple(notes), frame.transport.flag_text)
    q.captured = captured
    q.assumptions = tuple(q.assumptions) + tuple(notes)
    return q


def with_direction(snap, where: SeenAt | None, frame: Frame) -> SeenAt | None:
    """Which way the packet crossed the device, when --seen-at did not say: the capture's
    own word (pcapng flags, a cooked header, tcpdump's In/Out), else the device's MAC as the
    frame's source (sent) or destination (received)."""
    if where is None or where.pod is not None or where.sent is not None:
        return where
    if frame.direction:
        return dataclasses.replace(where, sent=frame.direction == "out",
                                   how=f"{where.how}; which way from the capture")
    try:
        iface = snap.node(where.node).interface(where.device)
    except Missing:
        iface = None
    mac = (iface.mac or "").lower() if iface is not None else ""
    link = frame.link if frame.outer is None else frame.outer.link
    if mac and link is not None and mac in (link.src, link.dst):
        return dataclasses.replace(where, sent=link.src == mac,
                                   how=f"{where.how}; which way from {where.device}'s MAC {mac}")
    return where


def _key(endpoint) -> str | None:
    return endpoint.key if endpoint is not None else None


def _ref(snap, ip: str, frame: Frame, role: str) -> str:
    """How `traceflow trace` is given the address: itself, or ``node/NAME`` for an address a
    node holds that is not its InternalIP (its gateway's, a masquerade's)."""
    cluster = snap.cluster
    if cluster.pod_by_ip(ip) or cluster.node_by_ip(ip) or cluster.service_at(ip):
        return ip
    for name in sorted(snap.bundle.node_names()):
        try:
            local = snap.node(name).local_addresses
        except Missing:
            continue
        if ip in local:
            return f"node/{name}"
    return ip


def _addressed_as_captured(q, client_ip: str, server_ip: str):
    """A node named by another of its addresses keeps the captured address as its own."""
    if q.src is not None and q.src.address != client_ip:
        q.src = dataclasses.replace(q.src, address=client_ip)
    if q.dst is not None and q.dst.address != server_ip and q.dst.kind.value == "node":
        q.dst = dataclasses.replace(q.dst, address=server_ip)
        q.dst_ip = server_ip
    return q


def _expect(q, expect: str | None, frame: Frame) -> None:
    if expect is None:
        return
    ok = (q.src is not None and q.src.kind.value == "pod" and not q.src.host_network
          and q.dst is not None and (
              (expect == "pod-to-svc" and q.dst.kind.value == "service"
               and q.dst.frontend is not None and q.dst.frontend.value == "clusterip")
              or (expect == "pod-to-pod" and q.dst.kind.value == "pod")))
    if not ok:
        raise frame.error(f"its connection is {q.kind} ({q.source_label} -> "
                           f"{q.destination_label}), not {expect}: use `traceflow trace` with "
                           "the capture")


def _start(snap, frame: Frame, where: SeenAt | None, leg: str) -> SeenAt | None:
    """Where the walk starts: a request seen on a node's device starts there; seen inside a
    pod, at its sender (the pod itself, or the sender of what the pod received)."""
    if where is None:
        return None
    n = frame.network
    if where.pod is not None:
        pod = snap.cluster.find_pod(*where.pod.split("/", 1))
        if pod is not None and pod.ip not in (n.src, n.dst):
            raise frame.error(f"{where.pod} ({pod.ip}) neither sent nor received "
                               f"{frame.flow()}: --seen-at names another place")
        return None
    if leg == "reply":
        return None
    return where


def _backend_of(cluster, ip: str, port: int) -> str | None:
    """The Service whose endpoints include ``ip`` (and whose target port is ``port``)."""
    for svc in cluster.services:
        if not any(p.target_port in (port, str(port)) or p.port == port for p in svc.ports):
            continue
        if any(addr == ip for addr, _, _ in cluster.endpoints_of(svc.key)):
            return svc.key
    return None


# ---- the trace, and the captured packet in it -----------------------------------------------

def trace_frame(snap, q, frame: Frame):
    """The trace of a captured frame's question, with the hop that is the captured packet
    (``query.capture.hop``), or a warning saying how the trace differs from it."""
    from traceflow.questions.capture.compare import compare, states, trace_document
    from traceflow.questions.solver import Solver
    trace = Solver(snap).trace(q)
    c = q.captured
    where = (c.seen_at.node, c.seen_at.device) if c.seen_at is not None and \
        c.seen_at.pod is None else None
    predicted = states(trace_document(trace))
    if c.established and c.direction == "request":      # the captured leg, after the set-up
        predicted = [s for s in predicted if s.after_reply] or predicted
    finding = compare(frame, predicted, where)
    info = trace.query.get("capture")
    if isinstance(info, dict):
        info["hop"] = finding.state.ref if finding.matches else None
    if trace.paths and not finding.matches:
        trace.warnings.append("the captured packet is not what the trace has: "
                              + " ".join(line.strip() for line in finding.lines()))
    return trace
