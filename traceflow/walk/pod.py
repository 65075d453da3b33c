"""A pod's side of its first hop: its default route and the neighbour entry for the gateway,
read from the pod's own files (``pods/<ns>/<name>/ip-route.txt``, ``ip-neigh.txt``,
``ip-addr.txt``). Without them the CNI's conventions give the gateway, and a warning says so.
"""

from __future__ import annotations


def default_route(tables):
    """The main table's default route of a pod (its gateway)."""
    for route in tables.table("main"):
        if route.family == 4 and route.dst.length == 0 and route.type == "unicast":
            return route
    return None


def pod_gateway(files: dict):
    """(gateway IP, gateway MAC, how we know, rule text, Source, neighbour) from the pod's
    files, or None when they do not say."""
    from traceflow.engines.neigh import ethernet_mac, parse_ip_neigh
    from traceflow.engines.routing.parse import parse_ip_routes
    if "ip-route.txt" in files and "ip-neigh.txt" in files:
        default = default_route(parse_ip_routes(*files["ip-route.txt"]))
        if default is not None and default.gateway:
            neigh = parse_ip_neigh(*files["ip-neigh.txt"])
            entry = next((n for n in neigh if str(n.ip) == str(default.gateway)), None)
            if entry is not None and entry.lladdr:
                return (str(default.gateway), ethernet_mac(entry),
                        f"from the pod's own routes and neighbours ({files['ip-route.txt'][1]})",
                        default.text, default.source, entry)
    return None


def pod_mac(files: dict) -> str | None:
    if "ip-addr.txt" not in files:
        return None
    from traceflow.engines.routing.addr import parse_ip_addr
    for iface in parse_ip_addr(*files["ip-addr.txt"]):
        if iface.name == "eth0" and iface.mac:
            return iface.mac
    return None


# What a pod-to-* trace assumes of the first packet that the query does not say (ovs-trace,
# an offline ofproto/trace, assumes nothing: a field left out is 0, as OVS reads it).
REALISTIC_FIRST_PACKET = ("first packet assumed as a Linux pod sends it: IPv4, TTL 64, a TCP SYN "
                          "(or the first UDP/SCTP datagram), conntrack state new")


def own_first_hop(datapath, branch, pod, files: dict, packet, cni_gateway: str | None,
                  mac_of):
    """The pod's first hop from its own files as they are (traceflow.bundle.podside).

    ``mac_of(ip) -> (mac, how, from_conventions)`` is the CNI's answer to the pod's ARP request for a next hop
    its ip-neigh.txt does not list (the gateway's MAC, or a local peer pod's MAC).

    Returns (gateway IP, gateway MAC, how we know, rule text, Source); False when the pod
    cannot send (the branch is finished with the reason and file:line); None when the pod has
    no ip-route.txt (the caller falls back to the CNI's conventions and says so)."""
    from traceflow.bundle.podside import first_hop
    from traceflow.model.trace import Disposition, Drop, Hop, Verdict
    hop = first_hop(files, pod.key, packet.nw_src or pod.ip, packet.nw_dst, cni_gateway,
                    datapath.name)
    if hop is None:
        return None
    if hop.drop or hop.unknown:
        verdict = Verdict.DROPPED if hop.drop else Verdict.UNKNOWN
        reason = hop.drop or hop.unknown
        branch.add(Hop(pod.node, "pod", "main", hop.rule, reason, source=hop.source,
                       unknown=verdict == Verdict.UNKNOWN, detail="route"))
        branch.finish(verdict, Drop(pod.node, "pod", "main", hop.rule, reason,
                                    Disposition(hop.drop_disposition) if hop.drop
                                    else Disposition.UNKNOWN))
        return False
    if hop.mac is None:   # the route is the pod's own, the MAC the CNI's: say which file lacks
        mac, how, convention = mac_of(hop.gateway)
        lacks = (f"no pods/{pod.namespace}/{pod.name}/ip-neigh.txt" if "ip-neigh.txt" in hop.absent
                 else "ip-neigh.txt has no usable entry for it")
        said = f"the MAC of next hop {hop.gateway} ({mac or 'unknown'}) {how or 'is not known'}"
        if convention or mac is None:     # an assumption: a warning; a fact the CNI shows: a note
            datapath.warnings.append(f"{pod.key}: {said} ({lacks})")
        return hop.gateway, mac, f"{hop.how}; {said}", hop.rule, hop.source
    return hop.gateway, hop.mac, hop.how, hop.rule, hop.source


def conventions_warning(pod, files: dict, cni_name: str, family: int = 4) -> str:
    """The warning for a first hop taken from the CNI's conventions, naming only the pod
    files the bundle really lacks (for IPv6: that its ip-route.txt has no IPv6 route)."""
    missing = [f for f in ("ip-route.txt", "ip-neigh.txt") if f not in files]
    text = f"{pod.key}: gateway and its MAC derived from {cni_name}'s conventions"
    if missing:
        text += f" (no pods/{pod.namespace}/{pod.name}/" + " and ".join(missing) + ")"
    elif family == 6:
        text += (f" (pods/{pod.namespace}/{pod.name}/ip-route.txt lists no IPv6 route: "
                 "`ip route show` prints IPv4 only)")
    return text
