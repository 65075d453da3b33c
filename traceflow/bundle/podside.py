"""A pod's own first hop, read from its files as they are (pods/<ns>/<pod>/ip-route.txt,
ip-neigh.txt, ip-addr.txt): which route the pod's kernel takes, by which device, to which
next hop and MAC.

Only what the files say is used. When the files are absent, the CNI's conventions stand in
(the caller says so in a warning naming exactly the files that are absent). When they are
present but the pod cannot send (no route, a gateway nobody answers ARP for), the answer is
a drop with its reason, file and line: a wrong pod gateway is exactly what a trace must find.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traceflow.model.errors import Source

POD_FILES = ("ip-route.txt", "ip-neigh.txt", "ip-addr.txt")
# the interface a CNI plugs into the pod (the OVS port's peer); another device is not traced
POD_INTERFACE = "eth0"


@dataclass
class FirstHop:
    """How the pod sends to ``dst``: next hop, its MAC, device; or why it cannot."""

    gateway: str | None = None       # next hop IP (the destination itself when on-link)
    mac: str | None = None           # next hop MAC (None: not known from the files)
    dev: str = POD_INTERFACE
    rule: str | None = None          # the route's text
    source: Source | None = None
    how: str = ""
    drop: str | None = None          # the pod's kernel cannot send: why
    drop_disposition: str = "no-route"   # no-route | no-neighbour (traceflow.trace.Disposition)
    unknown: str | None = None       # it sends, but not where traceflow can follow
    absent: list = field(default_factory=list)   # the pod files the bundle lacks


def first_hop(files: dict, pod_key: str, pod_ip: str, dst_ip: str,
              cni_gateway: str | None, cni_name: str) -> FirstHop | None:
    """The pod's first hop from its files; None when it has no ip-route.txt (the caller uses
    the CNI's conventions). ``files`` maps file name -> (text, bundle path)."""
    absent = [f for f in POD_FILES if f not in files]
    if "ip-route.txt" not in files:
        return None
    from traceflow.engines.neigh import ethernet_mac, parse_ip_neigh
    from traceflow.engines.routing import Router, parse_ip_addr, parse_ip_routes, parse_ip_rules
    routes_text, routes_name = files["ip-route.txt"]
    tables = parse_ip_routes(routes_text, routes_name)
    if ":" in dst_ip and not any(r.family == 6 for r in tables):
        # `ip route show` lists IPv4 routes only: the file says nothing of IPv6 (the caller
        # uses the CNI's conventions and says so)
        return None
    interfaces = parse_ip_addr(*files["ip-addr.txt"]) if "ip-addr.txt" in files else None
    rules = parse_ip_rules("0:\tfrom all lookup local\n32766:\tfrom all lookup main\n"
                           "32767:\tfrom all lookup default\n", "(the kernel's default rules)")
    dec = Router(rules, tables, interfaces).lookup(dst_ip, pod_ip if interfaces else None)
    route = dec.route
    hop = FirstHop(rule=route.text.strip() if route is not None else None,
                   source=route.source if route is not None else None, absent=absent,
                   how=f"from the pod's own routes ({routes_name})")
    if dec.kind != "unicast" or not dec.dev:
        hop.drop = (f"{pod_key} has no usable route to {dst_ip} in {routes_name} "
                    f"({dec.reason}): the pod's kernel does not send the packet")
        return hop
    hop.dev = dec.dev
    hop.gateway = str(dec.gateway) if dec.gateway else dst_ip
    if hop.dev != POD_INTERFACE:
        hop.unknown = (f"{pod_key} sends to {dst_ip} by {hop.dev} ({routes_name} line "
                       f"{route.source.line}), not by {POD_INTERFACE}, the interface "
                       f"{cni_name} plugs into the node: where {hop.dev} leads is not traced")
        return hop
    neigh = None
    if "ip-neigh.txt" in files:
        neigh_text, neigh_name = files["ip-neigh.txt"]
        entry = next((n for n in parse_ip_neigh(neigh_text, neigh_name)
                      if str(n.ip) == hop.gateway and (n.dev in (None, hop.dev))), None)
        if entry is not None and entry.lladdr and not {"FAILED", "INCOMPLETE"} & set(entry.states):
            neigh = entry
            hop.mac = ethernet_mac(entry)
            hop.how += f"; next hop MAC from {neigh_name} line {entry.source.line}"
    if neigh is None and dec.gateway and cni_gateway and hop.gateway != cni_gateway:
        where = ("has no usable entry for it in ip-neigh.txt" if "ip-neigh.txt" in files
                 else "the bundle has no ip-neigh.txt for the pod")
        hop.drop_disposition = "no-neighbour"
        hop.drop = (f"{pod_key}'s route to {dst_ip} goes via {hop.gateway} ({routes_name} line "
                    f"{route.source.line}), but the gateway {cni_name} gives pods on this node "
                    f"is {cni_gateway}; {where}: the pod's ARP request for {hop.gateway} gets "
                    "no answer and the packet is never sent")
    return hop


def port_by_mac(pod_ports: dict, mac: str | None) -> tuple[str | None, str | None]:
    """(OVS port, IP the CNI's flows bind to it) for the pod's own MAC, when its IP is not
    the one the flows know (a SpoofGuard mismatch: the flows drop what the pod sends)."""
    if not mac:
        return None, None
    for ip, (port, known_mac) in pod_ports.items():
        if known_mac and known_mac.lower() == mac.lower():
            return port, ip
    return None, None
