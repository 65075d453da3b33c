"""A captured frame as the packet of one component command: ``ovs-trace`` (the flow
ofproto/trace would be given: in_port, MACs, VLAN, addresses, TTL, ports, TCP flags, the
tunnel's outer addresses and VNI), ``nf-trace`` (addresses, ports, protocol, the interface it
arrived on or left by) and ``route-get`` (destination, source, input interface).

Where it was captured (``--seen-at``, the pcapng interface) gives OVS's in_port or the
netfilter/routing interface, on the command's NODE; a capture elsewhere is refused.
"""

from __future__ import annotations

from traceflow.model.errors import InputError
from traceflow.questions.capture.frames import Frame
from traceflow.questions.capture.start import (direction, from_interface, seen_at,
                                               with_direction)
from traceflow.walk.seen import SeenAt

WORDS = {6: "tcp", 17: "udp", 132: "sctp"}


def _where(snap, node: str, frame: Frame, seen: str | None, namespace: str) -> SeenAt | None:
    where = seen_at(snap, seen, namespace) if seen else from_interface(snap, frame)[0]
    if where is not None and where.node != node:
        raise InputError(f"the packet was seen on {where.label}, not on NODE {node}",
                         "--seen-at")
    return with_direction(snap, where, frame)


def info(frame: Frame, where: SeenAt | None, why: str, notes: list) -> dict:
    """The ``query.capture`` of a component trace."""
    return {"frame": frame.ref, "why": why, "taken": frame.taken(), "notes": notes,
            "seen_at": where.as_dict() if where is not None else None, "starts_at": None,
            "hop": "1.1"}


def ovs_flow(snap, node: str, frame: Frame, seen: str | None, namespace: str = "default",
             pod_port=None) -> tuple[str, list, dict]:
    """(flow spec, --ct-next states, capture info) for ``ovs-trace NODE`` of ``frame``.
    ``pod_port(pod key)`` gives a pod's OVS port name (--seen-at POD)."""
    where = _where(snap, node, frame, seen, namespace)
    notes: list = []
    if where is None:
        raise InputError("ovs-trace needs the port the packet enters OVS by: --seen-at "
                         "NODE:PORT (a port of nodes/NODE/ovs-show.txt) or POD", "--seen-at")
    port = where.device
    if where.pod is not None:
        port = pod_port(where.pod) if pod_port is not None else None
        if port is None:
            raise InputError(f"no OVS port of {where.pod} on {node}: give --seen-at NODE:PORT",
                             "--seen-at")
    n, t = frame.network, frame.transport
    fields = [f"in_port={port}", WORDS[n.proto]]
    if frame.link is not None:
        fields += [f"dl_src={frame.link.src}"] if frame.link.src else []
        fields += [f"dl_dst={frame.link.dst}"] if frame.link.dst else []
        if frame.link.vlans:
            fields.append(f"dl_vlan={frame.link.vlans[-1]}")
            if len(frame.link.vlans) > 1:
                notes.append("only the innermost VLAN tag is given to OVS")
    fields += [f"nw_src={n.src}", f"nw_dst={n.dst}",
               f"nw_ttl={n.ttl if n.ttl is not None else 64}",
               f"tp_src={t.sport}", f"tp_dst={t.dport}"]
    if n.ttl is None:
        notes.append("the TTL is not in the capture: 64 assumed")
    if n.proto == 6 and t.flags is not None:
        bits = {"fin": 0x01, "syn": 0x02, "rst": 0x04, "psh": 0x08, "ack": 0x10, "urg": 0x20,
                "ece": 0x40, "cwr": 0x80}
        fields.append(f"tcp_flags=0x{sum(bits[f] for f in t.flags):03x}")
    if frame.outer is not None:
        fields += [f"tun_src={frame.outer.network.src}", f"tun_dst={frame.outer.network.dst}",
                   f"tun_id={frame.outer.vni}"]
    leg, established, why = direction(snap, frame)
    ct_next: list = []
    if established or leg == "reply":
        state = "trk,est,rpl" if leg == "reply" else "trk,est"
        ct_next = [state] * 8
        notes.append(f"not its connection's first packet: each ct() recirculation resumes with "
                     f"{state} (as ofproto/trace --ct-next)")
    return ",".join(fields), ct_next, info(frame, where, why, notes)


def nf_packet(snap, node: str, frame: Frame, seen: str | None,
              namespace: str = "default") -> tuple[dict, dict]:
    """(nf-trace's src, dst, protocol, sport, dport, iif, oif; capture info)."""
    where = _where(snap, node, frame, seen, namespace)
    n, t = frame.network, frame.transport
    iif = oif = None
    if where is not None and where.pod is None:
        if where.sent:
            oif = where.device
        else:
            iif = where.device
    notes = []
    _, established, why = direction(snap, frame)
    if established:
        notes.append("not its connection's first packet: nf-trace walks the rules as for a new "
                     "connection (the nat table sees only a connection's first packet; "
                     "conntrack applies its NAT to the rest)")
    return ({"src": n.src, "dst": n.dst, "protocol": WORDS[n.proto], "sport": t.sport,
             "dport": t.dport, "iif": iif, "oif": oif}, info(frame, where, why, notes))


def route_packet(snap, node: str, frame: Frame, seen: str | None,
                 namespace: str = "default") -> tuple[dict, dict]:
    """(route-get's dst, src, iif; capture info)."""
    where = _where(snap, node, frame, seen, namespace)
    iif = where.device if where is not None and where.pod is None and not where.sent else None
    _, _, why = direction(snap, frame)
    return ({"dst": frame.network.dst, "src": frame.network.src, "iif": iif},
            info(frame, where, why, []))


def pod_port_of(snap, frame: Frame):
    """A pod's port on its datapath, as the CNI's Datapath starts the pod's packets
    (``leave_pod``): ``port(pod key)`` -> the OVS port name, or None."""
    def port(key: str):
        from traceflow.model.trace import Leg, Verdict
        from traceflow.questions.solver import Solver
        from traceflow.walk.state import Branch
        pod = snap.cluster.find_pod(*key.split("/", 1))
        if pod is None:
            return None
        solver = Solver(snap)
        branch = Branch([Leg("request", Verdict.UNKNOWN, [], "")])
        from traceflow.questions.capture.start import frame_query
        q = frame_query(snap, frame)
        loc = solver.datapath.leave_pod(branch, pod, frame.packet(), q)
        number = getattr(loc, "in_port", None)
        if number is None:
            return None
        return snap.node(pod.node).bridge.port_name(number)
    return port
