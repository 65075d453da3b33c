"""kube-proxy's IPVS mode: the iptables rules it still writes, `ipset list`, `ipvsadm -Ln`.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass

from kube_proxy_gen.cluster import CLUSTER_CIDR, Cluster, MASQ_MARK, NodeSpec, SEED, port_views
from kube_proxy_gen.family import Family, v4
from kube_proxy_gen.iptables import _Table, _counters, _kubelet_chains, _postrouting_rules, _q


IPSETS = (   # name, type, comment (pkg/proxy/ipvs/ipset.go), in kube-proxy's ipsetInfo order
    ("KUBE-LOOP-BACK", "hash:ip,port,ip",
     "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
    ("KUBE-CLUSTER-IP", "hash:ip,port",
     "Kubernetes service cluster ip + port for masquerade purpose"),
    ("KUBE-EXTERNAL-IP", "hash:ip,port",
     "Kubernetes service external ip + port for masquerade and filter purpose"),
    ("KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port",
     "Kubernetes service external ip + port with externalTrafficPolicy=local"),
    ("KUBE-LOAD-BALANCER", "hash:ip,port", "Kubernetes service lb portal"),
    ("KUBE-LOAD-BALANCER-FW", "hash:ip,port",
     "Kubernetes service load balancer ip + port for load balancer with sourceRange"),
    ("KUBE-LOAD-BALANCER-LOCAL", "hash:ip,port",
     "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"),
    ("KUBE-LOAD-BALANCER-SOURCE-IP", "hash:ip,port,ip",
     "Kubernetes service load balancer ip + port + source IP for packet filter purpose"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "hash:ip,port,net",
     "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"),
    ("KUBE-NODE-PORT-TCP", "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"),
    ("KUBE-NODE-PORT-LOCAL-TCP", "bitmap:port",
     "Kubernetes nodeport TCP port with externalTrafficPolicy=local"),
    ("KUBE-NODE-PORT-UDP", "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"),
    ("KUBE-NODE-PORT-LOCAL-UDP", "bitmap:port",
     "Kubernetes nodeport UDP port with externalTrafficPolicy=local"),
    ("KUBE-NODE-PORT-SCTP-HASH", "hash:ip,port",
     "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"),
    ("KUBE-NODE-PORT-LOCAL-SCTP-HASH", "hash:ip,port",
     "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"),
    ("KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port", "Kubernetes health check node port"),
    ("KUBE-IPVS-IPS", "hash:ip", "Addresses on the ipvs interface"),
)
_IPSET_COMMENT = {name: comment for name, _, comment in IPSETS}


def node_addresses(node: NodeSpec) -> list[str]:
    """Addresses NodePorts listen on (kube-proxy: every local address but kube-ipvs0's)."""
    return [node.ip, node.gateway_ip]


def ipset_members(cluster: Cluster, node: str) -> dict[str, list[str]]:
    spec = cluster.node(node)
    sets: dict[str, list[str]] = {name: [] for name, _, _ in IPSETS}

    def add(name: str, entry: str) -> None:
        if entry not in sets[name]:
            sets[name].append(entry)

    for v in port_views(cluster, node):
        svc, p, proto = v.svc, v.port, v.proto
        for ep in v.endpoints:
            if ep.node == node:
                add("KUBE-LOOP-BACK", f"{ep.ip},{proto}:{p.target_port},{ep.ip}")
        add("KUBE-CLUSTER-IP", f"{svc.cluster_ip},{proto}:{p.port}")
        add("KUBE-IPVS-IPS", svc.cluster_ip)
        for ip in svc.external_ips:
            add("KUBE-EXTERNAL-IP-LOCAL" if svc.etp_local else "KUBE-EXTERNAL-IP",
                f"{ip},{proto}:{p.port}")
            add("KUBE-IPVS-IPS", ip)
        for ip in svc.lb_ips:
            add("KUBE-LOAD-BALANCER", f"{ip},{proto}:{p.port}")
            if svc.etp_local:
                add("KUBE-LOAD-BALANCER-LOCAL", f"{ip},{proto}:{p.port}")
            if svc.lb_source_ranges:
                add("KUBE-LOAD-BALANCER-FW", f"{ip},{proto}:{p.port}")
                for src in svc.lb_source_ranges:
                    add("KUBE-LOAD-BALANCER-SOURCE-CIDR", f"{ip},{proto}:{p.port},{src}")
                    if ipaddress.ip_address(spec.ip) in ipaddress.ip_network(src):
                        add("KUBE-LOAD-BALANCER-SOURCE-IP", f"{ip},{proto}:{p.port},{ip}")
            add("KUBE-IPVS-IPS", ip)
        if p.node_port:
            upper = proto.upper()
            add(f"KUBE-NODE-PORT-{upper}", str(p.node_port))
            if svc.etp_local:
                add(f"KUBE-NODE-PORT-LOCAL-{upper}", str(p.node_port))
        if svc.health_check_node_port:
            add("KUBE-HEALTH-CHECK-NODE-PORT", str(svc.health_check_node_port))
    return sets


def iptables_save_ipvs(cluster: Cluster, node: str, fam: Family | None = None) -> str:
    """``iptables-save`` on ``node`` with kube-proxy in IPVS mode (writeIptablesRules);
    ``ip6tables-save`` of the IPv6 proxier for ``fam`` IPv6 (its ipsets are KUBE-6-*)."""
    fam = fam or v4(CLUSTER_CIDR)
    sets = ipset_members(cluster, node)
    mangle, flt, nat = (_Table(t, _counters(node, t) if fam.version == 4 else
                               _counters(node + "/ipv6", t)) for t in ("mangle", "filter", "nat"))
    _kubelet_chains(mangle, flt, nat, fam)
    for chain in ("KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER",
                  "KUBE-MARK-MASQ"):
        nat.chain(chain)
    for chain in ("KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL",
                  "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER"):
        flt.chain(chain)
    nat.add("PREROUTING", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("OUTPUT", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("POSTROUTING", '-m comment --comment "kubernetes postrouting rules" '
            "-j KUBE-POSTROUTING")
    flt.add("INPUT", '-m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER')
    flt.add("INPUT", '-m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL')
    flt.add("INPUT", '-m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT')
    flt.add("INPUT", "-j KUBE-FIREWALL")
    flt.add("FORWARD", '-m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL')
    flt.add("FORWARD", '-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD')
    flt.add("OUTPUT", "-j KUBE-FIREWALL")

    nat.add("KUBE-SERVICES", f"-s {fam.loopback} -j RETURN")

    def set_rule(table: _Table, chain: str, name: str, flags: str, target: str,
                 proto: str = "") -> None:
        if sets[name]:
            table.add(chain, (f"-p {proto} " if proto else "") + f"-m comment --comment "
                      f"{_q(_IPSET_COMMENT[name])} -m set --match-set {fam.ipset(name)} {flags} "
                      f"-j {target}")

    set_rule(nat, "KUBE-POSTROUTING", "KUBE-LOOP-BACK", "dst,dst,src", "MASQUERADE")
    set_rule(nat, "KUBE-SERVICES", "KUBE-LOAD-BALANCER", "dst,dst", "KUBE-LOAD-BALANCER")
    set_rule(nat, "KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-LOCAL", "dst,dst", "RETURN")
    for proto in ("tcp", "udp"):
        set_rule(nat, "KUBE-NODE-PORT", f"KUBE-NODE-PORT-LOCAL-{proto.upper()}", "dst",
                 "RETURN", proto)
        set_rule(nat, "KUBE-NODE-PORT", f"KUBE-NODE-PORT-{proto.upper()}", "dst",
                 "KUBE-MARK-MASQ", proto)
    set_rule(flt, "KUBE-PROXY-FIREWALL", "KUBE-LOAD-BALANCER-FW", "dst,dst",
             "KUBE-SOURCE-RANGES-FIREWALL")
    set_rule(flt, "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-LOAD-BALANCER-SOURCE-CIDR", "dst,dst,src",
             "RETURN")
    set_rule(flt, "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-LOAD-BALANCER-SOURCE-IP", "dst,dst,src",
             "RETURN")
    if sets["KUBE-CLUSTER-IP"]:
        nat.add("KUBE-SERVICES", f"! -s {fam.cluster_cidr} -m comment --comment "
                f"{_q(_IPSET_COMMENT['KUBE-CLUSTER-IP'])} -m set --match-set "
                f"{fam.ipset('KUBE-CLUSTER-IP')} dst,dst -j KUBE-MARK-MASQ")
    for name, masquerade in (("KUBE-EXTERNAL-IP", True), ("KUBE-EXTERNAL-IP-LOCAL", False)):
        if not sets[name]:
            continue
        head = (f"-m comment --comment {_q(_IPSET_COMMENT[name])} -m set --match-set "
                f"{fam.ipset(name)} dst,dst")
        if masquerade:
            nat.add("KUBE-SERVICES", f"{head} -j KUBE-MARK-MASQ")
        nat.add("KUBE-SERVICES", f"{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type "
                "LOCAL -j ACCEPT")
        nat.add("KUBE-SERVICES", f"{head} -m addrtype --dst-type LOCAL -j ACCEPT")
    nat.add("KUBE-SERVICES", "-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")
    nat.add("KUBE-LOAD-BALANCER", "-j KUBE-MARK-MASQ")
    flt.add("KUBE-SOURCE-RANGES-FIREWALL", "-j DROP")
    for name in ("KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"):
        if sets[name]:
            nat.add("KUBE-SERVICES", f"-m set --match-set {fam.ipset(name)} dst,dst -j ACCEPT")
    flt.add("KUBE-FORWARD", '-m comment --comment "kubernetes forwarding rules" -m mark --mark '
            f"{MASQ_MARK:#x}/{MASQ_MARK:#x} -j ACCEPT")
    flt.add("KUBE-FORWARD", '-m comment --comment "kubernetes forwarding conntrack rule" '
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    flt.add("KUBE-NODE-PORT", '-m comment --comment "Kubernetes health check node port" '
            f"-m set --match-set {fam.ipset('KUBE-HEALTH-CHECK-NODE-PORT')} dst -j ACCEPT")
    for name, flags in (("KUBE-LOAD-BALANCER", "dst,dst"), ("KUBE-CLUSTER-IP", "dst,dst"),
                        ("KUBE-EXTERNAL-IP", "dst,dst"), ("KUBE-HEALTH-CHECK-NODE-PORT", "dst")):
        flt.add("KUBE-IPVS-FILTER", f"-m set --match-set {fam.ipset(name)} {flags} -j RETURN")
    flt.add("KUBE-IPVS-FILTER", "-m conntrack --ctstate NEW -m set --match-set "
            f"{fam.ipset('KUBE-IPVS-IPS')} dst -j REJECT --reject-with {fam.reject_with}")
    _postrouting_rules(nat)
    tool = "ip6tables-save" if fam.version == 6 else "iptables-save"
    return "\n".join(mangle.render(tool) + flt.render(tool) + nat.render(tool)) + "\n"


def _ipset_size(kind: str, entries: int) -> int:
    """`Size in memory` as ipset 7.17 on Linux 6.x reports it (fitted; cosmetic)."""
    if kind == "bitmap:port":
        return 8264
    base, per = {"hash:ip": (216, 40), "hash:ip,port": (216, 48), "hash:ip,port,ip": (208, 56),
                 "hash:ip,port,net": (464, 64)}[kind]
    return base + per * entries


def ipset_list(cluster: Cluster, node: str, iptables_text: str,
               fam: Family | None = None) -> str:
    """``ipset list``: sets in creation order; hash members in (seeded) hash order. For
    ``fam`` IPv6, the IPv6 proxier's sets (KUBE-6-*, family inet6)."""
    fam = fam or v4(CLUSTER_CIDR)
    sets = ipset_members(cluster, node)
    rng = random.Random(f"{SEED}/{node}/ipset" + ("/ipv6" if fam.version == 6 else ""))
    blocks = []
    for base, kind, _ in IPSETS:
        name = fam.ipset(base)
        members = list(sets[base])
        if kind == "bitmap:port":
            members.sort(key=int)
            header, revision = "range 0-65535", 3
        else:
            rng.shuffle(members)
            revision = {"hash:ip": 6, "hash:ip,port": 7, "hash:ip,port,ip": 6,
                        "hash:ip,port,net": 8}[kind]
            header = (f"family {fam.ipset_family} hashsize 1024 maxelem 65536 bucketsize 12 "
                      f"initval {rng.getrandbits(32):#010x}")
        references = iptables_text.count(f"--match-set {name} ")
        blocks.append("\n".join([f"Name: {name}", f"Type: {kind}", f"Revision: {revision}",
                                 f"Header: {header}",
                                 f"Size in memory: {_ipset_size(kind, len(members))}",
                                 f"References: {references}",
                                 f"Number of entries: {len(members)}", "Members:", *members]))
    return "\n\n".join(blocks) + "\n"


@dataclass(frozen=True)
class VirtualServer:
    protocol: str
    address: str
    port: int
    persistent: int | None
    destinations: tuple[tuple[str, int], ...]


def virtual_servers(cluster: Cluster, node: str) -> list[VirtualServer]:
    """The IPVS services kube-proxy programs on ``node`` (syncService/syncEndpoint)."""
    out = []
    spec = cluster.node(node)
    for v in port_views(cluster, node):
        svc, p = v.svc, v.port
        cluster_dests = tuple((e.ip, p.target_port) for e in v.cluster_endpoints)
        external_dests = (tuple((e.ip, p.target_port) for e in v.cluster_endpoints
                                if e.node == node) if svc.etp_local else cluster_dests)
        vip = [(svc.cluster_ip, p.port, cluster_dests)]
        vip += [(ip, p.port, external_dests) for ip in (*svc.external_ips, *svc.lb_ips)]
        if p.node_port:
            vip += [(ip, p.node_port, external_dests) for ip in node_addresses(spec)]
        for address, port, dests in vip:
            out.append(VirtualServer(p.protocol, address, port, svc.affinity_timeout,
                                     tuple(sorted(dests, key=_addr_port_key))))
    return out


def _addr_port_key(item: tuple[str, int]) -> tuple[int, int]:
    return int(ipaddress.ip_address(item[0])), item[1]


def ipvsadm(cluster: Cluster, node: str, also: Cluster | None = None) -> str:
    """``ipvsadm -Ln`` (ipvsadm sorts services by protocol, address, port); ``also``: the
    cluster as the IPv6 proxier sees it, whose virtual servers the same table lists (IPv6
    addresses bracketed, after the IPv4 ones of the same protocol)."""
    rng = random.Random(f"{SEED}/{node}/ipvs-conns")
    proto_order = {"TCP": 6, "UDP": 17, "SCTP": 132}
    lines = ["IP Virtual Server version 1.2.1 (size=4096)",
             "Prot LocalAddress:Port Scheduler Flags",
             "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn"]
    found = virtual_servers(cluster, node) + (virtual_servers(also, node) if also else [])
    servers = sorted(found, key=lambda s: (
        proto_order[s.protocol], ipaddress.ip_address(s.address).version,
        int(ipaddress.ip_address(s.address)), s.port))
    for vs in servers:
        flags = f" persistent {vs.persistent}" if vs.persistent else ""
        lines.append(f"{vs.protocol:<4} {_hostport(vs.address, vs.port)} rr{flags}")
        for ip, port in vs.destinations:
            active = rng.choice((0, 0, 0, 1, 2)) if vs.protocol == "TCP" else 0
            inactive = rng.choice((0, 0, 1, 3, 7))
            lines.append(f"  -> {_hostport(ip, port):<28} {'Masq':<7} {1:<6} {active:<10} "
                         f"{inactive}".rstrip())
    return "\n".join(lines) + "\n"


def _hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
