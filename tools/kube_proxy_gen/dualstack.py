"""The dual-stack example cluster: the scenario services of cluster.py (no filler) with an IPv6
address beside every IPv4 one, as a dual-stack kube-proxy renders it.

A dual-stack kube-proxy runs two proxiers (pkg/proxy/*/proxier.go, NewDualStackProxier), one
per family, each seeing only its family's addresses: the Service's ClusterIP of that family
(spec.clusterIPs), the EndpointSlice of that address type, the node's address of that family,
the loadBalancerSourceRanges and externalIPs of that family. So each family is rendered from a
*projection* of the cluster: ``DualCluster.v4`` is the cluster IPv4 sees (the same objects as
the single-stack example, minus IPv6-only Services), ``DualCluster.v6`` the one IPv6 sees, and
the renderers of iptables.py / nftables.py / ipvs.py write each with its Family
(kube_proxy_gen.family): iptables-save.txt and ip6tables-save.txt; the ip and ip6 kube-proxy
tables in one `nft list ruleset`; one `ipvsadm -Ln` and one `ipset list` holding both.

Addresses: each IPv4 one has an IPv6 twin by the same host number (10.244.1.5 ->
fd00:10:244:1::5, 10.96.0.10 -> fd00:10:96::a, node 192.168.10.11 -> 2001:db8:10::11, the
LoadBalancer pool 172.18.255.0/24 -> 2001:db8:ff::/120, externalIPs 203.0.113.0/24 ->
2001:db8:cafe::/120). Families: default/kubernetes and kube-system/metrics-server are IPv4
only, logging/syslog IPv6 only (ipFamilies [IPv6]), every other Service PreferDualStack
[IPv4, IPv6]; every pod has both addresses.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import random
from dataclasses import dataclass

import yaml

from kube_proxy_gen import host
from kube_proxy_gen.cluster import (CLUSTER_CIDR, NODES, SEED, SERVICE_CIDR, Cluster, Endpoint,
                                    NodeSpec, Pod, SCENARIOS, Service, _Builder)
from kube_proxy_gen.family import Family, v4, v6
from kube_proxy_gen.k8s import (_k8s_list, endpointslices_yaml, nodes_yaml, pods_yaml,
                                services_yaml)

CLUSTER_CIDR6 = "fd00:10:244::/56"
SERVICE_CIDR6 = "fd00:10:96::/108"      # as many addresses as 10.96.0.0/12
POD_CIDR6 = "fd00:10:244:{n}::/64"
NODE_NET6 = "2001:db8:10::/64"
ROUTER6 = "2001:db8:10::1"
LB_POOL6 = "2001:db8:ff::"
EXTERNAL_POOL6 = "2001:db8:cafe::"
# loadBalancerSourceRanges: the IPv6 twins of 198.51.100.0/24 and 203.0.113.0/24
SOURCE_RANGES6 = {"198.51.100.0/24": "2001:db8:5100::/48", "203.0.113.0/24": "2001:db8:cafe::/48"}
IPV4_ONLY = {"default/kubernetes", "kube-system/metrics-server"}
IPV6_ONLY = {"logging/syslog"}

V4 = v4(CLUSTER_CIDR)
V6 = v6(CLUSTER_CIDR6)


def node6(node: NodeSpec) -> NodeSpec:
    """The node as its IPv6 proxier sees it: the IPv6 InternalIP, the IPv6 pod CIDR (whose
    first address is antrea-gw0's, as the IPv4 one's), the same MAC."""
    host_part = node.ip.rsplit(".", 1)[1]
    number = int(ipaddress.ip_network(node.pod_cidr).network_address.packed[2])
    return NodeSpec(node.name, f"2001:db8:10::{host_part}", POD_CIDR6.format(n=number), node.mac)


def twin(ip: str) -> str:
    """The IPv6 address of an IPv4 one (see the module doc)."""
    addr = ipaddress.ip_address(ip)
    if addr in ipaddress.ip_network("10.244.0.0/16"):       # pod CIDR N, host h
        return str(ipaddress.ip_address(f"fd00:10:244:{addr.packed[2]}::{addr.packed[3]:x}"))
    if addr in ipaddress.ip_network("192.168.10.0/24"):     # a node: the same digits
        return f"2001:db8:10::{ip.rsplit('.', 1)[1]}"
    for net, base in ((SERVICE_CIDR, "fd00:10:96::"), ("172.18.255.0/24", LB_POOL6),
                      ("203.0.113.0/24", EXTERNAL_POOL6)):
        network = ipaddress.ip_network(net)
        if addr in network:          # the same offset in the IPv6 range
            return str(ipaddress.ip_address(int(ipaddress.ip_address(base))
                                            + int(addr) - int(network.network_address)))
    raise ValueError(f"no IPv6 twin for {ip}")


@dataclass
class DualCluster:
    v4: Cluster                  # the cluster as the IPv4 proxier sees it
    v6: Cluster                  # ... and the IPv6 one
    families: dict               # Service key -> ("IPv4", "IPv6") in spec.ipFamilies order

    @property
    def nodes(self) -> tuple:
        return self.v4.nodes


def build_dualstack() -> DualCluster:
    """The dual-stack cluster (deterministic): the scenario services of the single-stack
    example, drawn by the same seeded builder, without the filler."""
    b = _Builder()
    b.add_control_plane()
    for namespace, name, kind, ports, nodes, options in SCENARIOS:
        b.add_service(namespace, name, kind, ports, nodes, **dict(options))
    full = b.cluster
    families = {s.key: ("IPv4",) if s.key in IPV4_ONLY else ("IPv6",) if s.key in IPV6_ONLY
                else ("IPv4", "IPv6") for s in full.services}
    four = Cluster(full.nodes, list(full.pods), [s for s in full.services
                                                 if "IPv4" in families[s.key]], full.uids)
    six_nodes = tuple(node6(n) for n in full.nodes)
    pods6 = [dataclasses.replace(p, ip=twin(p.ip)) for p in full.pods]
    services6 = []
    for s in full.services:
        if "IPv6" not in families[s.key]:
            continue
        services6.append(dataclasses.replace(
            s, cluster_ip=twin(s.cluster_ip),
            endpoints=tuple(dataclasses.replace(e, ip=twin(e.ip)) for e in s.endpoints),
            external_ips=tuple(twin(ip) for ip in s.external_ips),
            lb_ips=tuple(twin(ip) for ip in s.lb_ips),
            lb_source_ranges=tuple(SOURCE_RANGES6[r] for r in s.lb_source_ranges)))
    six = Cluster(six_nodes, pods6, services6, full.uids)
    return DualCluster(four, six, families)


# ---------------------------------------------------------------------------------------------
# The k8s/ files: the IPv4 objects, with their IPv6 twins added where the API has them


def _load(text: str) -> list:
    return yaml.safe_load(text)["items"]


def k8s_files(dual: DualCluster) -> dict[str, str]:
    v6_pods = {(p.namespace, p.name): p.ip for p in dual.v6.pods}
    pods = _load(pods_yaml(dual.v4))
    for item in pods:
        meta = item["metadata"]
        ip6 = v6_pods[(meta["namespace"], meta["name"])]
        item["status"]["podIPs"].append({"ip": ip6})
    six = {s.key: s for s in dual.v6.services}
    four = {s.key: s for s in dual.v4.services}
    # every Service once, as the API serves it (the IPv6-only one from the IPv6 projection)
    merged = Cluster(dual.v4.nodes, [], sorted(list(dual.v4.services) + [
        s for k, s in six.items() if k not in four], key=lambda s: (s.namespace, s.name)),
        dual.v4.uids)
    services = _load(services_yaml(merged))
    for item in services:
        key = f"{item['metadata']['namespace']}/{item['metadata']['name']}"
        fams = dual.families[key]
        spec = item["spec"]
        ips = [four[key].cluster_ip if f == "IPv4" else six[key].cluster_ip for f in fams]
        spec["clusterIP"], spec["clusterIPs"] = ips[0], ips
        spec["ipFamilies"] = list(fams)
        spec["ipFamilyPolicy"] = "PreferDualStack" if len(fams) == 2 else "SingleStack"
        if key in six and key in four:
            if six[key].external_ips:
                spec["externalIPs"] = list(four[key].external_ips) + list(six[key].external_ips)
            if six[key].lb_source_ranges:
                spec["loadBalancerSourceRanges"] = (list(four[key].lb_source_ranges)
                                                    + list(six[key].lb_source_ranges))
            if six[key].lb_ips:
                item["status"]["loadBalancer"]["ingress"] += [
                    {"ip": ip, "ipMode": "VIP"} for ip in six[key].lb_ips]
    slices = _load(endpointslices_yaml(dual.v4))
    for item in _load(endpointslices_yaml(dual.v6)):
        # the IPv6 slice of a Service is an object of its own (its own name and uid)
        meta = item["metadata"]
        key = f"{meta['namespace']}/{meta['labels']['kubernetes.io/service-name']}"
        if key == "default/kubernetes":
            continue
        item["addressType"] = "IPv6"
        rng = random.Random(f"{SEED}/EndpointSlice/{key}/ipv6")
        meta["name"] = meta["generateName"] + "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789")
                                                      for _ in range(5))
        meta["uid"] = str(__import__("uuid").UUID(int=rng.getrandbits(128), version=4))
        slices.append(item)
    slices.sort(key=lambda i: (i["metadata"]["namespace"], i["metadata"]["name"]))
    nodes = _load(nodes_yaml(dual.v4))
    for item, n6 in zip(nodes, dual.v6.nodes):
        item["spec"]["podCIDRs"].append(n6.pod_cidr)
        item["status"]["addresses"].insert(1, {"address": n6.ip, "type": "InternalIP"})
    return {"k8s/pods.yaml": _k8s_list(pods), "k8s/services.yaml": _k8s_list(services),
            "k8s/endpointslices.yaml": _k8s_list(slices), "k8s/nodes.yaml": _k8s_list(nodes)}


# ---------------------------------------------------------------------------------------------
# Host files of a dual-stack node


def ip_addr(dual: DualCluster, node: NodeSpec, mode: str) -> str:
    """`ip addr show`: the single-stack node's interfaces with their IPv6 addresses (ens192's
    global one, antrea-gw0's pod-CIDR gateway, before their link-local ones as the kernel
    lists them; kube-ipvs0's IPv6 virtual addresses after its IPv4 ones)."""
    n6 = dual.v6.node(node.name)
    globals6 = {"ens192": f"{n6.ip}/64",
                "antrea-gw0": f"{ipaddress.ip_network(n6.pod_cidr)[1]}/64"}
    ipvs6 = host.ipvs_addresses(dual.v6) if mode == "ipvs" else []
    out: list[str] = []
    device = None

    def close(dev) -> None:
        if dev == "kube-ipvs0":
            for ip in ipvs6:
                out.extend([f"    inet6 {ip}/128 scope global ",
                            "       valid_lft forever preferred_lft forever"])

    for line in host.ip_addr(dual.v4, node, mode).splitlines():
        if not line.startswith(" "):
            close(device)
            device = line.split(": ")[1]
        if line.startswith("    inet6 ") and device in globals6 and " scope link" in line:
            out.extend([f"    inet6 {globals6.pop(device)} scope global ",
                        "       valid_lft forever preferred_lft forever"])
        out.append(line)
    close(device)
    return "\n".join(out) + "\n"


def ip_route(dual: DualCluster, node: NodeSpec, mode: str) -> str:
    """`ip route show table all`: the IPv4 routes, then IPv6's (main, then local), as the
    kernel lists them; the other nodes' IPv6 pod CIDRs via their antrea-gw0 IPv6 address,
    onlink (Antrea encap, pkg/agent/route: the peer gateway, with a neighbour entry of the
    global virtual MAC). IPv6 forwarding is on: each global prefix has its subnet-router
    anycast route (addrconf_join_anycast)."""
    n6 = dual.v6.node(node.name)
    lines = host.ip_route(dual.v4, node, mode).splitlines()
    four = [l for l in lines if not _is_v6_line(l)]
    old6 = [l for l in lines if _is_v6_line(l)]
    main = [f"{NODE_NET6} dev ens192 proto kernel metric 256 pref medium",
            f"{n6.pod_cidr} dev antrea-gw0 proto kernel metric 256 pref medium"]
    for other in dual.v6.nodes:
        if other.name != node.name:
            gw = ipaddress.ip_network(other.pod_cidr)[1]
            main.append(f"{other.pod_cidr} via {gw} dev antrea-gw0 metric 1024 onlink "
                        "pref medium")
    main.sort(key=lambda l: ipaddress.ip_network(l.split()[0]))
    main = ([l for l in old6 if l.startswith("::1 ")] + main
            + [l for l in old6 if l.startswith("fe80::/64 ")]
            + [f"default via {ROUTER6} dev ens192 metric 1024 pref medium"])
    gw6 = ipaddress.ip_network(n6.pod_cidr)[1]
    local = [("::1", "local ::1 dev lo table local proto kernel metric 0 pref medium"),
             ("2001:db8:10::", "anycast 2001:db8:10:: dev ens192 table local proto kernel "
                               "metric 0 pref medium"),
             (n6.ip, f"local {n6.ip} dev ens192 table local proto kernel metric 0 pref medium"),
             (str(gw6 - 1), f"anycast {gw6 - 1} dev antrea-gw0 table local proto kernel "
                            "metric 0 pref medium"),
             (str(gw6), f"local {gw6} dev antrea-gw0 table local proto kernel metric 0 "
                        "pref medium")]
    if mode == "ipvs":
        local += [(ip, f"local {ip} dev kube-ipvs0 table local proto kernel metric 0 pref "
                       "medium") for ip in host.ipvs_addresses(dual.v6)]
    local += [(l.split()[1], l) for l in old6 if l.startswith("local fe80::")]
    local.sort(key=lambda item: ipaddress.ip_address(item[0]))
    multicast = [l for l in old6 if l.startswith("multicast ")]
    return "\n".join(four + main + [l for _, l in local] + multicast) + "\n"


def _is_v6_line(line: str) -> bool:
    words = line.split()
    first = words[0] if words else ""
    if first in ("local", "broadcast", "multicast", "anycast") and len(words) > 1:
        first = words[1]
    return ":" in first


IP6_RULE = "0:\tfrom all lookup local\n32766:\tfrom all lookup main\n"


def ip_neigh(dual: DualCluster, node: NodeSpec, mode: str) -> str:
    """`ip neigh show` (both families): the single-stack entries, the IPv6 router on ens192
    and the other nodes' antrea-gw0 IPv6 addresses (PERMANENT, Antrea's global virtual MAC)."""
    lines = host.ip_neigh(dual.v4, node, mode).splitlines()
    lines.insert(-1, f"{ROUTER6} dev ens192 lladdr {host.ROUTER_MAC} router REACHABLE")
    for other in dual.v6.nodes:
        if other.name != node.name:
            lines.insert(-1, f"{ipaddress.ip_network(other.pod_cidr)[1]} dev antrea-gw0 lladdr "
                         f"{host.GLOBAL_VIRTUAL_MAC} PERMANENT")
    return "\n".join(lines) + "\n"


def families() -> tuple[Family, Family]:
    return V4, V6
