"""A hostNetwork pod's packets: sent and received by its node's own stack, not through a veth.

Sending is the kernel's local output path: output route lookup, the OUTPUT hook (where
kube-proxy DNATs Services for host processes), a second lookup when OUTPUT changed the
destination, POSTROUTING, then conntrack, the neighbour and the device, from where the walk
continues like any packet leaving the host (into the CNI's gateway port, or out of the node).
Receiving is local delivery: the route says `local`, the INPUT hook runs, and conntrack
rewrites the source back for a reply (the un-DNAT of a Service's answer).

``host`` below is the object that walks a node's host stack (route, netfilter, send); the
functions only chain its steps in the kernel's order for a locally sent or received packet.
"""

from __future__ import annotations

from traceflow.model.errors import InputError
from traceflow.model.trace import Hop, Verdict

NEEDED = ("ip-route.txt", "ip-addr.txt")


def check_source(snap, pod) -> None:
    """Refuse (exit 2) a hostNetwork source the bundle cannot trace: its node's routes and
    addresses are what a locally sent packet starts from."""
    names = set(snap.bundle.names()) if hasattr(snap.bundle, "names") else set()
    missing = [f"nodes/{pod.node}/{n}" for n in NEEDED if f"nodes/{pod.node}/{n}" not in names]
    if missing:
        raise InputError(f"{pod.key} uses the host network: its packets start in node {pod.node}'s "
                         f"own stack, and the bundle lacks {', '.join(missing)} to follow them "
                         "(collect the node too)", missing[0])


def send(host, branch, pod, packet, at_host):
    """[(branch, next location or None)] for ``packet`` sent by hostNetwork ``pod``."""
    from traceflow.engines.netfilter.engine import NodeContext
    node_name = pod.node
    node = host.snap.node(node_name)
    loc = at_host(node_name, None, packet)
    # components as for any pod (trace-json-v1): "pod" where it sends and receives
    branch.add(Hop(node_name, "pod", None, None,
                   f"{pod.key} uses the host network: {node_name}'s own stack sends to "
                   f"{packet.nw_dst} (local output: route, OUTPUT hook, route again, POSTROUTING)",
                   packet=packet.headers()))
    # an unbound socket: the route chooses the source address (its `src`, else the primary
    # address of the device it goes out of), which is not always the node's InternalIP
    dec = host._route(branch, node_name, node, packet, iif=None, use_src=False)
    if dec.kind not in ("unicast", "local"):
        return [(host._no_route(branch, node_name, dec), None)]
    src = dec.prefsrc or _primary_ip(node.interface(dec.dev))
    if src and src != packet.nw_src:
        before = packet.copy()
        packet.nw_src = src
        branch.add(Hop(node_name, "route", None, None,
                       f"source address {src}: the one the route gives for {dec.dev} "
                       f"(an unbound socket; {pod.key}'s own IP is {pod.ip})",
                       packet=packet.headers(), changed=packet.diff(before)))
    orig = packet.copy()
    ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets, in_iface=None,
                      out_iface=dec.dev, ct_state={"NEW"}, ct_dir="ORIGINAL", connmark=0,
                      node=node_name)
    outcomes = []
    for ob, opkt, _ in host._netfilter(branch, node.netfilter, "OUTPUT", packet, ctx, node_name):
        if ob.end:
            outcomes.append((ob, opkt, dec))
            continue
        odec = dec
        if opkt.nw_dst == orig.nw_dst and dec.kind == "local":
            # for the node itself, and OUTPUT did not send it elsewhere (kube-proxy DNATs
            # the node's connections to its own NodePorts there)
            outcomes.append((_over_loopback(ob, node_name, opkt, dec), opkt, dec))
            continue
        if opkt.nw_dst != orig.nw_dst:       # OUTPUT's DNAT re-routes the packet
            odec = host._route(ob, node_name, node, opkt, iif=None)
            if odec.kind == "local":
                outcomes.append((_over_loopback(ob, node_name, opkt, odec), opkt, odec))
                continue
            if odec.kind != "unicast":
                outcomes.append((host._no_route(ob, node_name, odec), opkt, odec))
                continue
            ctx.out_iface = odec.dev
        outcomes.extend(host._postrouting(ob, node_name, node, opkt, ctx, odec))
    tup = (orig.nw_proto, orig.nw_src, orig.tp_src, orig.nw_dst, orig.tp_dst)
    # one outcome at a time: a file one branch lacks must not end the other branches
    from traceflow.bundle.snapshot import Missing
    results = []
    for outcome in outcomes:
        try:
            results.extend(host._send_all([outcome], loc, node, True, tup, None))
        except Missing as miss:
            results.append((host.walk.missing(outcome[0], node_name, "neigh", miss), None))
    return results


def _over_loopback(b, node_name: str, pkt, dec):
    """A locally sent packet for one of the node's own addresses goes over `lo` to a local
    socket: whether something listens there is not in the bundle."""
    from traceflow.model.trace import Drop
    return b.finish(Verdict.UNKNOWN, Drop(
        node_name, "route", dec.table, dec.route.text if dec.route is not None else None,
        f"{pkt.nw_dst} is {node_name}'s own address: the packet goes over lo to a local socket "
        f"on {pkt.nw_dst}:{pkt.tp_dst}, which the bundle does not describe"))


def local_receiver(cluster, query, node_name: str, pkt, direction: str):
    """The hostNetwork pod of this trace that a packet local to ``node_name`` is for: the
    source on the reply leg, the destination on the request leg; else None."""
    want = query.source if direction == "reply" else None
    if direction == "request" and query.kind == "pod-to-pod":
        ns, _, name = str(query.destination_label).partition("/")
        want = cluster.find_pod(ns, name) if name else None
    if want is None or not want.host_network or want.node != node_name:
        return None
    # a reply comes back to whichever local address the request left from
    return want if direction == "reply" or want.ip == pkt.nw_dst else None


def _primary_ip(iface) -> str | None:
    from traceflow.walk.state import primary_ip
    return primary_ip(iface) if iface is not None else None


def receive(host, b, loc, node, pkt, ctx, late_src, pod):
    """Local delivery to hostNetwork ``pod``: INPUT hook, the reply's source un-NAT."""
    from traceflow.walk.ct_hop import ct_hop as _ct_hop
    results = []
    ctx.out_iface = None
    for ib, ipkt, _ in host._netfilter(b, node.netfilter, "INPUT", pkt, ctx, loc.node):
        if ib.end:
            results.append((ib, None))
            continue
        if late_src is not None:             # conntrack's source rewrite happens at INPUT
            entry, is_reply, (ip, port) = late_src
            before, ipkt = ipkt, ipkt.copy()
            ipkt.nw_src, ipkt.tp_src = ip, port
            ib.add(_ct_hop(loc.node, entry, is_reply, before, ipkt, "INPUT"))
        ib.add(Hop(loc.node, "pod", None, None,
                   f"delivered to {pod.key} ({pod.ip}), which uses {loc.node}'s host network",
                   packet=ipkt.headers()))
        ib.final_packet = ipkt
        results.append((ib.finish(Verdict.DELIVERED, None, pod), None))
    return results
