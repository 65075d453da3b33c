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
    from traceflow.neigh import parse_ip_neigh
    from traceflow.routing.parse import parse_ip_routes
    if "ip-route.txt" in files and "ip-neigh.txt" in files:
        default = default_route(parse_ip_routes(*files["ip-route.txt"]))
        if default is not None and default.gateway:
            neigh = parse_ip_neigh(*files["ip-neigh.txt"])
            entry = next((n for n in neigh if str(n.ip) == str(default.gateway)), None)
            if entry is not None and entry.lladdr:
                return (str(default.gateway), entry.lladdr,
                        f"from the pod's own routes and neighbours ({files['ip-route.txt'][1]})",
                        default.text, default.source, entry)
    return None


def pod_mac(files: dict) -> str | None:
    if "ip-addr.txt" not in files:
        return None
    from traceflow.routing.parse import parse_ip_addr
    for iface in parse_ip_addr(*files["ip-addr.txt"]):
        if iface.name == "eth0" and iface.mac:
            return iface.mac
    return None
