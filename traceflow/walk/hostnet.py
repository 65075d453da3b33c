"""A node's own stack as a sender and a receiver: the node itself (kubelet, an agent: ``trace
node/NAME ...``) and hostNetwork pods, which send and receive in their node's stack, not
through a veth.

Sending is the kernel's local output path (net/ipv4/ip_output.c: __ip_queue_xmit ->
ip_local_out): output route lookup, the OUTPUT hook (where kube-proxy DNATs Services for host
processes), a second lookup when OUTPUT changed the destination (ip_route_me_harder),
POSTROUTING, then conntrack, the neighbour and the device, from where the walk continues like
any packet leaving the host (into the CNI's gateway port, or out of the node). A packet of a
connection conntrack already knows (a reply the node sends back) is translated by conntrack
instead of the NAT rules: the destination before routing (nf_nat_ipv4_local_fn at OUTPUT),
the source at POSTROUTING.

Receiving is local delivery (ip_local_deliver): the route says `local`, the INPUT hook runs
(kube-proxy's KUBE-EXTERNAL-SERVICES and KUBE-FIREWALL live there), and conntrack rewrites
the source back for a reply (the un-DNAT of a Service's answer).

``host`` below is the object that walks a node's host stack (route, netfilter, send); the
functions only chain its steps in the kernel's order for a locally sent or received packet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from traceflow.model.errors import InputError
from traceflow.model.trace import Disposition, Drop, Hop, Verdict

NEEDED = ("ip-route.txt", "ip-addr.txt")


@dataclass(frozen=True)
class Sender:
    """Who sends from a node's stack: a hostNetwork pod, or the node itself."""
    node: str
    key: str                     # "default/agent" or "node/worker1"
    address: str | None          # the pod's IP (its node's), or the node's InternalIP
    is_pod: bool = False


def check_source(snap, pod) -> None:
    """Refuse (exit 2) a hostNetwork source the bundle cannot trace: its node's routes and
    addresses are what a locally sent packet starts from."""
    check_node(snap, pod.node, f"{pod.key} uses the host network: its packets start in node "
                               f"{pod.node}'s own stack")


def check_node(snap, node: str, what: str) -> None:
    names = set(snap.bundle.names()) if hasattr(snap.bundle, "names") else set()
    missing = [f"nodes/{node}/{n}" for n in NEEDED if f"nodes/{node}/{n}" not in names]
    if missing:
        raise InputError(f"{what}, and the bundle lacks {', '.join(missing)} to follow them "
                         "(collect the node too)", missing[0])


def send(host, branch, sender: Sender, packet, at_host):
    """[(branch, next location or None)] for ``packet`` sent by ``sender``'s node stack."""
    from traceflow.engines.netfilter.engine import NodeContext
    from traceflow.model.conntrack import reverse
    from traceflow.walk.state import HOST_ZONE, tuple5
    node_name = sender.node
    node = host.snap.node(node_name)
    loc = at_host(node_name, None, packet)
    entry, is_reply = branch.ct_view(node_name).lookup(HOST_ZONE, tuple5(packet))
    new_conn = entry is None
    if sender.is_pod:
        # components as for any pod (trace-json-v1): "pod" where it sends and receives
        said = (f"{sender.key} uses the host network: {node_name}'s own stack sends to "
                f"{packet.nw_dst}")
        component = "pod"
    else:
        said = f"{node_name}'s own stack (a process on the node) sends to {packet.nw_dst}"
        component = "host"
    branch.add(Hop(node_name, component, None, None,
                   f"{said} (local output: route, OUTPUT hook, route again, POSTROUTING)",
                   packet=packet.headers(), detail="host"))
    late_src = None
    if entry is not None:
        # a packet of a known connection: conntrack translates it (nf_nat_ipv4_local_fn
        # rewrites the destination before the OUTPUT rules, the source at POSTROUTING)
        target = entry.orig if is_reply else reverse(entry.reply)
        want_dst = (target[1], target[2]) if is_reply else (target[3], target[4])
        want_src = (target[3], target[4]) if is_reply else (target[1], target[2])
        if entry.nat and (packet.nw_dst, packet.tp_dst) != want_dst:
            from traceflow.walk.ct_hop import ct_hop as _ct_hop
            before = packet.copy()
            packet.nw_dst, packet.tp_dst = want_dst
            branch.add(_ct_hop(node_name, entry, is_reply, before, packet, "OUTPUT"))
        if entry.nat and (packet.nw_src, packet.tp_src) != want_src:
            late_src = (entry, is_reply, want_src)
    # an unbound socket: the route chooses the source address (its `src`, else the primary
    # address of the device it goes out of), which is not always the node's InternalIP; a
    # reply leaves from the address the connection was made to (the accepted socket's)
    replying = branch.leg.direction == "reply"
    # the kernel confirmed the request's conntrack entry when it was delivered here, NAT or
    # not: a reply is never a new connection
    new_conn = entry is None and not replying
    dec = host._route(branch, node_name, node, packet, iif=None, use_src=replying)
    if dec.kind not in ("unicast", "local"):
        return [(host._no_route(branch, node_name, dec), None)]
    src = dec.prefsrc or _primary_ip(node.interface(dec.dev), packet.family)
    if new_conn and src and src != packet.nw_src:
        before = packet.copy()
        packet.nw_src = src
        own = (f"{sender.key}'s own IP is {sender.address}" if sender.is_pod
               else f"{node_name}'s InternalIP is {sender.address}")
        branch.add(Hop(node_name, "route", None, None,
                       f"source address {src}: the one the route gives for {dec.dev} "
                       f"(an unbound socket; {own})",
                       packet=packet.headers(), changed=packet.diff(before), detail="route"))
    orig = packet.copy()
    ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets,
                      interface_addresses=node.interface_addresses, in_iface=None,
                      out_iface=dec.dev, ct_state={"NEW"} if new_conn else {"ESTABLISHED"},
                      ct_dir="REPLY" if is_reply else "ORIGINAL", connmark=0, node=node_name)
    outcomes, untracked = [], set()
    for ob, opkt, _ in host._netfilter(branch, node.netfilter_for(packet.family), "OUTPUT",
                                       packet, ctx, node_name):
        if ob.end:
            outcomes.append((ob, opkt, dec))
            continue
        octx = ctx
        if opkt.extra.pop("untracked", False):
            # raw OUTPUT's NOTRACK (Antrea: to external IPs): no NAT at POSTROUTING, no entry
            octx = dataclasses.replace(ctx, ct_state={"UNTRACKED"})
            untracked.add(id(ob))
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
            octx.out_iface = odec.dev
        outcomes.extend(host._postrouting(ob, node_name, node, opkt, octx, odec))
    tup = (orig.nw_proto, orig.nw_src, orig.tp_src, orig.nw_dst, orig.tp_dst)
    # one outcome at a time: a file one branch lacks must not end the other branches
    from traceflow.bundle.snapshot import Missing
    results = []
    for outcome in outcomes:
        try:
            results.extend(host._send_all([outcome], loc, node,
                                          new_conn and id(outcome[0]) not in untracked, tup,
                                          late_src))
        except Missing as miss:
            results.append((host.walk.missing(outcome[0], node_name, "neigh", miss), None))
    return results


def _over_loopback(b, node_name: str, pkt, dec):
    """A locally sent packet for one of the node's own addresses goes over `lo` to a local
    socket: whether something listens there is not in the bundle."""
    return b.finish(Verdict.UNKNOWN, Drop(
        node_name, "route", dec.table, dec.route.text if dec.route is not None else None,
        f"{pkt.nw_dst} is {node_name}'s own address: the packet goes over lo to a local socket "
        f"on {_hp(pkt.nw_dst, pkt.tp_dst)}, which the bundle does not describe", Disposition.UNKNOWN))


def _hp(ip, port) -> str:
    from traceflow.walk.state import hostport
    return hostport(ip, port)


def local_receiver(cluster, query, node_name: str, pkt, direction: str):
    """Who in ``node_name``'s own stack a packet local to it is for, in this trace: the
    hostNetwork pod or the node that is the destination (request) or the source (reply), or
    a hostNetwork pod the Service's translation chose; else None."""
    from traceflow.walk.endpoints import Kind
    end = query.src if direction == "reply" else query.dst
    if end is not None and end.kind is Kind.NODE:
        return end if end.node == node_name else None
    want = end.pod if end is not None and end.kind is Kind.POD else None
    if want is None and direction == "request" and query.service is not None:
        want = _host_network_backend(cluster, query.service, node_name, pkt.nw_dst)
        if want is None and _node_backend(cluster, query.service, node_name, pkt.nw_dst):
            # an endpoint that is the node's own address and no pod (the API server of
            # `default/kubernetes` on a control-plane node): the node's own stack receives it
            from traceflow.walk.endpoints import Endpoint
            return Endpoint.of_node(node_name, pkt.nw_dst)
    if want is None or not want.host_network or want.node != node_name:
        return None
    # a reply comes back to whichever local address the request left from
    return want if direction == "reply" or pkt.nw_dst in want.addresses else None


def _host_network_backend(cluster, svc, node_name: str, ip: str):
    for addr, pod_key, node in cluster.endpoints_of(svc.key):
        if addr == ip and pod_key and node in (None, node_name):
            ns, _, name = pod_key.partition("/")
            pod = cluster.find_pod(ns, name)
            if pod is not None and pod.host_network and pod.node == node_name:
                return pod
    return None


def _node_backend(cluster, svc, node_name: str, ip: str) -> bool:
    """Whether the Service has ``ip`` (local to ``node_name``) as an endpoint of no pod."""
    return any(addr == ip and not pod_key and node in (None, node_name)
               for addr, pod_key, node in cluster.endpoints_of(svc.key))


def _primary_ip(iface, family: int = 4) -> str | None:
    from traceflow.walk.state import primary_ip
    return primary_ip(iface, family) if iface is not None else None


def receive(host, b, loc, node, ipkt, late_src, receiver, orig=None):
    """The last step of local delivery, after the INPUT hook: the reply's source un-NAT, then
    the socket of ``receiver`` (a hostNetwork pod, or the node's own stack)."""
    from traceflow.walk.ct_hop import ct_hop as _ct_hop
    from traceflow.walk.endpoints import Endpoint
    from traceflow.walk.state import hostport
    if late_src is None and b.leg.direction == "request" and orig is not None:
        # confirmed at LOCAL_IN (nf_confirm): the local socket's answer is ESTABLISHED
        from traceflow.walk.state import HOST_ZONE, tuple5
        if b.ct_view(loc.node).lookup(HOST_ZONE, orig)[0] is None:
            b.ct(loc.node).commit(HOST_ZONE, orig, tuple5(ipkt),
                                  where=f"{loc.node} kernel conntrack (local delivery)",
                                  nat=None if tuple5(ipkt) == orig else "dst")
    if late_src is not None:             # conntrack's source rewrite happens at INPUT
        entry, is_reply, (ip, port) = late_src
        before, ipkt = ipkt, ipkt.copy()
        ipkt.nw_src, ipkt.tp_src = ip, port
        b.add(_ct_hop(loc.node, entry, is_reply, before, ipkt, "INPUT"))
    if isinstance(receiver, Endpoint):
        b.add(Hop(loc.node, "host", None, None,
                  f"delivered to {loc.node}'s own stack ({hostport(ipkt.nw_dst, ipkt.tp_dst)}): a socket "
                  "of the node itself receives it (whether one listens on that port is not in "
                  "the bundle)", packet=ipkt.headers(), detail="host"))
        b.final_packet = ipkt
        return b.finish(Verdict.DELIVERED, None, receiver.key, Disposition.DELIVERED_HOST)
    b.add(Hop(loc.node, "pod", None, None,
              f"delivered to {receiver.key} ({ipkt.nw_dst if ipkt.nw_dst in receiver.addresses else receiver.ip}), "
              f"which uses {loc.node}'s host network",
              packet=ipkt.headers(), detail="pod"))
    b.final_packet = ipkt
    return b.finish(Verdict.DELIVERED, None, receiver)
