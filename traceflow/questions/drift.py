"""Drift: what Kubernetes asks for against what the datapath would do (traceflow audit).

- ``policy``: a traced path the flows deliver although the NetworkPolicies as written deny it,
  or drop by policy although the policies allow it (per trace, ``policy_drift``);
- ``backends``: a node balances a Service port to other backends than its EndpointSlices list
  (stale, missing, extra, wrong port, unequal weight) — per datapath, see backends.py;
- ``peer-route``: a node lacks the route, or the tunnel flow, to another node's pod CIDR;
- ``pod-gateway``: a pod's own default route or gateway ARP entry disagrees with the CNI's
  gateway on its node.

The last three belong to nodes: each takes the nodes to look at (None: all), so that the
workers of an audit split by node find them for their own nodes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import yaml

from traceflow.bundle import kube
from traceflow.bundle.snapshot import Missing
from traceflow.model.trace import Verdict
from traceflow.questions.backends import Balanced, IpvsReader, NetfilterReader
from traceflow.questions.check import describe_path, policy_of
from traceflow.questions.matrix import pair_label, service_ports

WEIGHT_TOLERANCE = 0.01


@dataclass
class Finding:
    kind: str                       # policy | backends | peer-route | pod-gateway
    subject: str                    # what it is about (service port, node, pod)
    message: str
    evidence: list = field(default_factory=list)   # file:line: text, one per line

    def key(self) -> tuple:
        return (self.kind, self.subject, self.message)


# ---- (a) NetworkPolicy intent vs flows --------------------------------------------------------
class PolicyCache:
    """The policies selecting each pod, and the intent asked of pods alike (same namespace,
    labels and address) towards one server: an audit asks it for millions of paths."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._selecting: dict = {}
        self._intent: dict = {}
        self._pods = {p.key: p for p in cluster.pods}
        self._at: dict = {}
        self.by_path: dict = {}         # id(path) -> (path, server question, allowed)
        self.clean: dict = {}           # id(paths) -> paths of a trace that found nothing

    def pod(self, key: str):
        return self._pods.get(key)

    def release(self) -> None:
        """Forget the paths seen (their traces are no longer kept)."""
        self._at.clear()
        self.by_path.clear()
        self.clean.clear()

    def at_server(self, path, server_ip: str) -> tuple:
        """``_at_server``, once per path (a shared trace's paths are asked for every client)."""
        got = self._at.get(id(path))
        if got is None or got[0] is not path:
            if len(self._at) > 100_000:
                self._at.clear()
            got = self._at[id(path)] = (path, _at_server(path, server_ip))
        return got[1]

    def selecting(self, pod, policy_type: str) -> list:
        key = (pod.key, policy_type)
        got = self._selecting.get(key)
        if got is None:
            got = self._selecting[key] = self.cluster.policies_selecting(pod, policy_type)
        return got

    def intent(self, client, server, proto: str, port) -> tuple[bool | None, str]:
        if not self.selecting(client, "Egress") and not self.selecting(server, "Ingress"):
            return True, "no NetworkPolicy selects either pod"
        key = (client.key, server.key, proto, port)
        got = self._intent.get(key)
        if got is None:
            if len(self._intent) > 200_000:
                self._intent.clear()
            got = self._intent[key] = policy_intent(self.cluster, client, server, proto, port)
        return got


def policy_intent(cluster, client, server, proto: str, port: int | None) -> tuple[bool | None, str]:
    """(allowed as written?, which policies decided); None when the bundle cannot tell."""
    why = []
    allowed: bool | None = True
    for direction, pod, peer in (("egress", client, server.ip), ("ingress", server, client.ip)):
        pols = cluster.policies_selecting(pod, "Egress" if direction == "egress" else "Ingress")
        if not pols:
            continue
        results = [(p, *kube.rule_allows(cluster, p, direction, peer, proto, port)) for p in pols]
        if any(ok is True for _, ok, _ in results):
            p, _, n = next(r for r in results if r[1] is True)
            why.append(f"{direction} of {pod.key} allowed by {p.namespace}/{p.name} rule {n}")
        elif any(ok is None for _, ok, _ in results):
            allowed = None if allowed is not False else False
            why.append(f"{direction} of {pod.key}: undecidable from the bundle")
        else:
            allowed = False
            why.append(f"{direction} of {pod.key} denied: "
                       f"{', '.join(f'{p.namespace}/{p.name}' for p, _, _ in results)} select it "
                       f"and no rule allows {proto}/{port}")
    return allowed, "; ".join(why) or "no NetworkPolicy selects either pod"


def _at_server(path, server_ip: str) -> tuple[int | None, str | None]:
    """(destination port, source address) of the request as it reaches the server."""
    for leg in path.legs:
        if leg.direction != "request":
            continue
        for hop in reversed(leg.hops):
            pk = hop.packet or {}
            if pk.get("nw_dst") == server_ip and pk.get("tp_dst"):
                return int(pk["tp_dst"]), pk.get("nw_src")
    return None, None


def policy_drift(cluster, client, trace, policies: PolicyCache | None = None) -> list[Finding]:
    out = []
    policies = policies or PolicyCache(cluster)
    paths = trace.paths
    if trace.query.get("shares_trace_of") and policies.clean.get(id(paths)) is paths:
        # a trace shared with the clients of one class: every question below comes out as
        # it did for the client that found nothing in it (the same paths and server
        # questions, each answered once per path in ``by_path``; a backend of the
        # destination never shares a trace, traceflow.questions.runner)
        return out
    # the pods' addresses of the trace's family (an IPv6 trace's packet never has the IPv4
    # ones: the Service port would be taken for the pod's)
    family = 6 if trace.query.get("family") == "ipv6" else 4
    # a trace shared with another client of its class shows that client's address
    traced_ip = ((trace.query.get("source_endpoint") or {}).get("address")
                 or client.address(family) or client.ip)
    for path in trace.paths:
        server = policies.pod(path.endpoint) if path.endpoint else None
        if server is None or path.verdict == Verdict.UNKNOWN or server.key == client.key:
            continue        # a pod cannot block connections to itself (Kubernetes' rule)
        if server.host_network:
            continue        # NetworkPolicy is undefined for hostNetwork pods (Kubernetes docs)
        port, seen_src = policies.at_server(path, server.address(family) or server.ip)
        port = port or trace.query.get("dst_port")
        if seen_src and seen_src != traced_ip:
            continue        # source NAT on the way: the server sees a node address, not the pod
        proto = trace.query.get("protocol") or "TCP"
        # a path of a trace shared with clients of one class: the walk compared them on
        # every policy question this asks (traceflow.walk.intent), so the answer is theirs too
        known = policies.by_path.get(id(path))
        if known is not None and known[0] is path and known[1] == (server.key, proto, port):
            allowed = known[2]
            why = None
        else:
            allowed, why = policies.intent(client, server, proto, port)
            policies.by_path[id(path)] = (path, (server.key, proto, port), allowed)
        if allowed is None:
            continue
        if why is None and ((path.verdict == Verdict.DELIVERED and allowed is False) or
                            (path.verdict == Verdict.DROPPED and allowed is True)):
            allowed, why = policies.intent(client, server, proto, port)   # the client's words
            if allowed is None:
                continue
        subject = f"{client.key} -> {server.key}:{port}/{proto}"
        is_policy, _ = policy_of(path.drop)
        if path.verdict == Verdict.DELIVERED and allowed is False:
            out.append(Finding("policy", subject, "the flows deliver a connection the "
                               f"NetworkPolicies as written deny ({why})",
                               _path_evidence(path)))
        elif path.verdict == Verdict.DROPPED and is_policy and allowed is True:
            out.append(Finding("policy", subject, "the flows drop by policy a connection the "
                               f"NetworkPolicies as written allow ({why})",
                               [describe_path(path)]))
    if not out:
        if len(policies.clean) > 100_000:
            policies.clean.clear()
        policies.clean[id(paths)] = paths
    return out


def _path_evidence(path) -> list[str]:
    """The policy-table hops a delivered path went through (where an allow flow matched)."""
    out = []
    for leg in path.legs:
        for hop in leg.hops:
            name = (hop.table_name or "") + " " + str(hop.table or "")
            if any(w in name for w in ("Ingress", "Egress", "ingress", "egress")) or \
                    str(hop.table) in ("50", "90", "60", "100"):
                where = f"{hop.source.file}:{hop.source.line}" if hop.source else hop.node
                out.append(f"{where}: {hop.rule}")
    return out[:6]


# ---- (b) EndpointSlices vs balanced backends ---------------------------------------------------
def expected_endpoints(bundle) -> dict:
    """(service key, port name, PROTO) -> {(ip, port): "file:line"} of ready endpoints
    (EndpointSlices, else Endpoints); an IPv6 EndpointSlice's under (key, name, PROTO, 6)."""
    out: dict = {}
    for name in ("k8s/endpointslices.yaml", "k8s/endpoints.yaml"):
        text = bundle.text(name)
        if not text:
            continue
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        doc = yaml.load(text, Loader=loader) or {}
        items = doc.get("items") or [] if isinstance(doc, dict) else []
        starts = [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith("- ")]
        if len(starts) != len(items):
            starts = [None] * len(items)        # unusual layout: name the file only
        for item, line in zip(items, starts):
            where = f"{name}:{line}" if line else name
            if isinstance(item, dict):
                _endpoints_of(item, where, name.endswith("endpointslices.yaml"), out)
        if out or name.endswith("endpointslices.yaml") and items:
            return out
    return out


def _endpoints_of(item: dict, where: str, is_slice: bool, out: dict) -> None:
    meta = item.get("metadata") or {}
    if is_slice:
        svc = (meta.get("labels") or {}).get("kubernetes.io/service-name")
        family = {"IPv4": (), "IPv6": (6,)}.get(item.get("addressType", "IPv4"))
        if not svc or family is None:
            return
        key = f"{meta.get('namespace', 'default')}/{svc}"
        for p in item.get("ports") or [{}]:
            slot = out.setdefault((key, p.get("name") or "", p.get("protocol") or "TCP")
                                  + family, {})
            for ep in item.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("ready") is False:
                    continue
                for addr in ep.get("addresses") or []:
                    slot[(addr, p.get("port"))] = where
        return
    key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
    for sub in item.get("subsets") or []:
        for p in sub.get("ports") or [{}]:
            slot = out.setdefault((key, p.get("name") or "", p.get("protocol") or "TCP"), {})
            for addr in sub.get("addresses") or []:
                slot[(addr.get("ip"), p.get("port"))] = where


def backend_drift(snap, nodes=None) -> list[Finding]:
    """For every node (of ``nodes``; None: all) and Service port: its balancer's backends
    against the EndpointSlices."""
    cluster = snap.cluster
    expected = expected_endpoints(snap.bundle)
    from traceflow.cni import backend_readers
    readers = {cls: cls(snap) for cls in (IpvsReader, NetfilterReader)}
    cni_readers = backend_readers(snap)     # the CNI's own load balancers, asked first
    out = []
    pods_by_node: dict = {}
    for p in cluster.pods:
        if p.ip and p.node and not p.host_network:
            pods_by_node.setdefault(p.node, p)
    fallback_client = next(iter(pods_by_node.values()), None)
    ports = service_ports(cluster)
    listed = {k[0] for k in expected}
    for node_name in snap.bundle.node_names():
        if nodes is not None and node_name not in nodes:
            continue
        try:
            node = snap.node(node_name)
            use = _readers(snap, node, readers, cni_readers)
        except Missing:
            continue
        client = pods_by_node.get(node_name) or fallback_client
        for dst in ports:
            svc = dst.service
            v6 = ":" in dst.ip
            client_ip = ((client.address(6) if v6 else client.ip) if client else None) or \
                ("fd00:ffff::fffe" if v6 else "10.255.255.254")
            sp = next(p for p in svc.ports if p.port == dst.port and p.protocol.upper() == dst.protocol)
            want = expected.get((svc.key, sp.name or "", dst.protocol) + ((6,) if v6 else ()))
            if want is None:
                want = {} if svc.key not in listed else None
            if want is None:
                continue        # a port name the slices do not list: nothing to compare
            for reader in use:
                try:
                    got = reader.balanced(node, client_ip, dst.ip, dst.port, dst.protocol)
                except Missing:     # a node folder the manifest does not list, half there
                    got = None
                if got is None:
                    continue
                out.extend(_compare(f"{pair_label(dst)} on {node_name}", reader.datapath,
                                    want, got, sp.target_port))
                break           # the first datapath that balances it decides
    return out


def _readers(snap, node, readers: dict, cni_readers: list) -> list:
    out = [r for r in cni_readers if r.applies(node)]
    if snap.kube_proxy == "ipvs" and node.ipvs is not None:
        out.append(readers[IpvsReader])
    elif node.netfilter is not None:
        out.append(readers[NetfilterReader])
    return out


def _compare(subject: str, datapath: str, want: dict, got: list[Balanced],
             target_port) -> list[Finding]:
    out = []
    want_ips = {ip: port for ip, port in want}
    got_ips: dict = {}
    for b in got:
        got_ips.setdefault(b.ip, []).append(b)

    def ev(b: Balanced) -> str:
        return f"{b.source.file}:{b.source.line}: {b.text}" if b.source else b.text
    for ip, bs in sorted(got_ips.items()):
        if ip not in want_ips:
            out.append(Finding("backends", subject, f"{datapath} balances to {ip}:{bs[0].port}, "
                               "which the EndpointSlices do not list (stale or extra backend)",
                               [ev(b) for b in bs]))
        elif want_ips[ip] is not None and bs[0].port is not None and bs[0].port != want_ips[ip]:
            out.append(Finding("backends", subject, f"{datapath} sends {ip} to port "
                               f"{bs[0].port}, the EndpointSlice says {want_ips[ip]}",
                               [ev(b) for b in bs]))
    for (ip, port), where in sorted(want.items(), key=lambda kv: str(kv[0])):
        if ip not in got_ips:
            out.append(Finding("backends", subject, f"the EndpointSlices list {ip}:{port} but "
                               f"{datapath} never balances to it (missing backend)",
                               [f"{where}: endpoint {ip}:{port}"] + [ev(b) for b in got][:4]))
    shares = [b.share for b in got]
    if len(shares) > 1 and max(shares) - min(shares) > WEIGHT_TOLERANCE:
        out.append(Finding("backends", subject, f"{datapath} splits new connections unequally ("
                           + ", ".join(f"{b.ip} {b.share:.0%}" for b in got) + ")",
                           [ev(b) for b in got]))
    return out


# ---- (c) routes and tunnel flows to peers' pod CIDRs ---------------------------------------------
def peer_route_drift(snap, nodes=None) -> list[Finding]:
    from traceflow.engines.routing.lookup import route_lookup
    cluster = snap.cluster
    out = []
    for name in snap.bundle.node_names():
        if nodes is not None and name not in nodes:
            continue
        if not snap.bundle.has(f"nodes/{name}/ip-route.txt"):
            continue
        node = snap.node(name)
        tunnel_text = _tunnel_flows(snap, node)
        for peer in cluster.nodes:
            if peer.name == name:
                continue
            for cidr in peer.pod_cidrs:
                net = ipaddress.ip_network(cidr, strict=False)
                probe = str(next(net.hosts()))
                dec = route_lookup(node.ip_rules_for(net.version), node.routes, probe,
                                   local_addresses=node.local_addresses)
                route = dec.route
                subject = f"{name} -> {peer.name} pods {cidr}"
                if dec.kind != "unicast" or route is None:
                    out.append(Finding("peer-route", subject, f"no usable route on {name} to "
                                       f"{peer.name}'s pod CIDR: {dec.reason}",
                                       [f"{route.source.file}:{route.source.line}: {route.text}"]
                                       if route is not None and route.source else []))
                elif route.dst.length == 0 and snap.conventions.kernel_routes_pod_cidrs:
                    out.append(Finding("peer-route", subject, f"{name} has no route for "
                                       f"{peer.name}'s pod CIDR: it falls to the default route "
                                       f"({route.text}), out of the underlay instead of the "
                                       "CNI's gateway",
                                       [f"{route.source.file}:{route.source.line}: {route.text}"]))
                if tunnel_text is not None and not _has_tunnel_flow(tunnel_text, cidr):
                    out.append(Finding("peer-route", subject, f"{name}'s OVS flows have no "
                                       f"tunnel flow for {peer.name}'s pod CIDR {cidr} (no flow "
                                       f"matching nw_dst={cidr} sets a tunnel destination)",
                                       [f"nodes/{name}/ovs-flows.txt"]))
    return out


def _tunnel_flows(snap, node) -> str | None:
    """The node's flow text when its bridge has a tunnel port (encap mode), else None."""
    if node._file("ovs-flows.txt") is None:
        return None
    try:
        ports = node.bridge.ports
    except Missing:
        return None
    if snap.conventions.tunnel_port(ports) is None:
        return None
    return node._file("ovs-flows.txt")[0]


def _has_tunnel_flow(text: str, cidr: str) -> bool:
    if ":" in cidr:          # an IPv6 pod CIDR: its flow sets the tunnel's IPv6 destination
        return any(f"ipv6_dst={cidr}" in line and ("tun_ipv6_dst" in line
                                                   or "TUN_IPV6_DST" in line)
                   for line in text.splitlines())
    for line in text.splitlines():
        if f"nw_dst={cidr}" in line and ("tun_dst" in line or "TUN_IPV4_DST" in line):
            return True
    return False


# ---- (d) a pod's own route and ARP vs the CNI's gateway ---------------------------------------
def pod_gateway_drift(snap, nodes=None) -> list[Finding]:
    from traceflow.engines.neigh import parse_ip_neigh
    from traceflow.engines.routing.parse import parse_ip_routes
    cluster = snap.cluster
    out = []
    for pod in cluster.pods:
        if not pod.node or pod.host_network or (nodes is not None and pod.node not in nodes):
            continue
        files = snap.pod_files(pod)
        if "ip-route.txt" not in files:
            continue
        n = next((x for x in cluster.nodes if x.name == pod.node), None)
        try:
            ports = snap.node(pod.node).bridge.ports
        except Missing:
            continue
        gw_ip, gw_mac, _ = snap.conventions.default_gateway(n.pod_cidrs if n else (), ports)
        routes = parse_ip_routes(*files["ip-route.txt"])
        default = next((r for r in routes.table("main") if r.dst.length == 0 and r.family == 4
                        and r.type == "unicast"), None)
        if default is None:
            out.append(Finding("pod-gateway", pod.key, "the pod has no default route (the CNI's "
                               f"gateway is {gw_ip})", [f"{files['ip-route.txt'][1]}"]))
            continue
        if default.gateway and str(default.gateway) != gw_ip:
            out.append(Finding("pod-gateway", pod.key, f"the pod's default route goes via "
                               f"{default.gateway}, the CNI's gateway on {pod.node} is {gw_ip}",
                               [f"{default.source.file}:{default.source.line}: {default.text}"]))
            continue
        if "ip-neigh.txt" in files and gw_mac:
            neigh = parse_ip_neigh(*files["ip-neigh.txt"])
            entry = next((e for e in neigh if str(e.ip) == gw_ip), None)
            if entry is not None and entry.lladdr and entry.lladdr.lower() != gw_mac.lower():
                out.append(Finding("pod-gateway", pod.key, f"the pod's ARP entry for its gateway "
                                   f"{gw_ip} is {entry.lladdr}, the gateway port's MAC on "
                                   f"{pod.node} is {gw_mac}",
                                   [f"{entry.source.file}:{entry.source.line}: "
                                    f"{entry.source.text.strip()}"]))
            elif entry is not None and any(s in ("FAILED", "INCOMPLETE") for s in entry.states):
                out.append(Finding("pod-gateway", pod.key, f"the pod's ARP entry for its gateway "
                                   f"{gw_ip} is {'/'.join(entry.states)}",
                                   [f"{entry.source.file}:{entry.source.line}: "
                                    f"{entry.source.text.strip()}"]))
    return out

