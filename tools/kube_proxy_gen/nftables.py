"""kube-proxy's nftables mode as `nft list table ip kube-proxy` (nft v1.0.6) prints it.
"""

from __future__ import annotations

import ipaddress
import random

from kube_proxy_gen.cluster import CLUSTER_CIDR, Cluster, MASQ_MARK, PortView, SEED, port_views
from kube_proxy_gen.family import Family, v4


def _nft_timeout(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def nft_ruleset(cluster: Cluster, node: str, fam: Family | None = None) -> str:
    """The kube-proxy table as ``nft list table ip kube-proxy`` prints it (pkg/proxy/nftables);
    ``table ip6 kube-proxy`` for ``fam`` IPv6 (ipX, ipvX_addr and noLocalhost of the IPv6
    proxier)."""
    fam = fam or v4(CLUSTER_CIDR)
    ipx = fam.nft
    chains: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    maps: dict[str, list[str]] = {"no-endpoint-services": [], "no-endpoint-nodeports": [],
                                  "firewall-ips": [], "service-ips": [], "service-nodeports": []}
    affinity_sets: list[tuple[str, int]] = []

    def chain(name: str, *rules: str) -> None:
        chains.setdefault(name, []).extend(rules)

    base = (("filter-prerouting", "filter", "prerouting", "dstnat - 10"),
            ("filter-input", "filter", "input", "-110"),
            ("filter-forward", "filter", "forward", "-110"),
            ("filter-output", "filter", "output", "-110"),
            ("nat-prerouting", "nat", "prerouting", "dstnat"),
            ("nat-output", "nat", "output", "-100"),
            ("nat-postrouting", "nat", "postrouting", "srcnat"))
    for name, kind, hook, priority in base:
        headers[name] = [f"type {kind} hook {hook} priority {priority}; policy accept;"]
        chain(name)
    chain("filter-input", "ct state new jump endpoints-check")
    chain("filter-forward", "ct state new jump endpoints-check")
    chain("filter-output", "ct state new jump endpoints-check", "ct state new jump firewall-check")
    chain("filter-prerouting", "ct state new jump firewall-check")
    chain("nat-output", "jump services")
    chain("nat-prerouting", "jump services")
    chain("nat-postrouting", "jump masquerading")
    chain("endpoints-check",
          f"{ipx} daddr . meta l4proto . th dport vmap @no-endpoint-services",
          f"fib daddr type local {fam.nft_no_localhost} meta l4proto . th dport vmap "
          "@no-endpoint-nodeports")
    chain("firewall-check", f"{ipx} daddr . meta l4proto . th dport vmap @firewall-ips")
    chain("services", f"{ipx} daddr . meta l4proto . th dport vmap @service-ips",
          f"fib daddr type local {fam.nft_no_localhost} meta l4proto . th dport vmap "
          "@service-nodeports")
    chain("masquerading", f"meta mark & {MASQ_MARK:#010x} == 0x00000000 return",
          f"meta mark set meta mark ^ {MASQ_MARK:#010x}", "masquerade fully-random")
    chain("mark-for-masquerade", f"meta mark set meta mark | {MASQ_MARK:#010x}")
    headers["reject-chain"] = [('comment "helper for @no-endpoint-services / '
                                '@no-endpoint-nodeports"')]
    chain("reject-chain", "reject")

    for v in port_views(cluster, node):
        _nft_service_port(v, chain, maps, affinity_sets, fam)

    addr = fam.nft_addr
    map_meta = {
        "no-endpoint-services": (f"{addr} . inet_proto . inet_service : verdict",
                                 "vmap to drop or reject packets to services with no endpoints"),
        "no-endpoint-nodeports": ("inet_proto . inet_service : verdict",
                                  ("vmap to drop or reject packets to service nodeports with no "
                                   "endpoints")),
        "firewall-ips": (f"{addr} . inet_proto . inet_service : verdict",
                         "destinations that are subject to LoadBalancerSourceRanges"),
        "service-ips": (f"{addr} . inet_proto . inet_service : verdict",
                        "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        "service-nodeports": ("inet_proto . inet_service : verdict", "NodePort traffic"),
    }
    blocks = []
    rng = random.Random(f"{SEED}/{node}/nft-hash-order")
    for name, (kind, comment) in map_meta.items():
        body = [f"type {kind}", f'comment "{comment}"']
        elements = list(maps[name])
        rng.shuffle(elements)                # the kernel lists hash-set elements in hash order
        if elements:
            body.append("elements = { " + ",\n\t\t\t     ".join(elements) + " }")
        blocks.append((f"map {name}", body))
    for name, timeout in affinity_sets:
        blocks.append((f"set {name}", [f"type {addr}", "size 65535", "flags dynamic,timeout",
                                       f"timeout {_nft_timeout(timeout)}"]))
    for name, rules in chains.items():
        blocks.append((f"chain {name}", headers.get(name, []) + rules))
    out = [f"table {ipx} kube-proxy {{", '\tcomment "rules for kube-proxy"']
    for i, (title, body) in enumerate(blocks):
        if i:
            out.append("")
        out.append(f"\t{title} {{")
        out += [f"\t\t{line}" for line in body]
        out.append("\t}")
    return "\n".join(out + ["}"]) + "\n"


def _nft_service_port(v: PortView, chain, maps, affinity_sets, fam: Family) -> None:
    """The nftables proxier's loop body for one service port."""
    svc, p, proto, name = v.svc, v.port, v.proto, v.name
    ipx = fam.nft
    key = f"{proto} . {p.port}"
    internal_verdict = "goto reject-chain"
    external_verdict = "goto reject-chain" if not v.has_endpoints else "drop"
    for ep in v.reachable_endpoints:
        chain(v.nft_endpoint(ep))
    if v.has_endpoints:
        chain(v.nft_service)
        if v.local_endpoints:
            chain(v.nft_local)
        if svc.externally_accessible:
            chain(v.nft_external)
        maps["service-ips"].append(f"{svc.cluster_ip} . {key} : goto {v.nft_service}")
    else:
        maps["no-endpoint-services"].append(
            f'{svc.cluster_ip} . {key} comment "{name}" : {internal_verdict}')
    for ip in svc.external_ips:
        if v.has_endpoints:
            maps["service-ips"].append(f"{ip} . {key} : goto {v.nft_external}")
        if not v.has_external_endpoints:
            maps["no-endpoint-services"].append(f'{ip} . {key} comment "{name}" : '
                                                f"{external_verdict}")
    if svc.lb_source_ranges and svc.lb_ips:
        chain(v.nft_firewall, f"{ipx} saddr != {{ " + ", ".join(sorted(
            svc.lb_source_ranges, key=lambda c: ipaddress.ip_network(c))) + " } drop")
    for ip in svc.lb_ips:
        if v.has_endpoints:
            maps["service-ips"].append(f"{ip} . {key} : goto {v.nft_external}")
        if svc.lb_source_ranges:
            maps["firewall-ips"].append(f'{ip} . {key} comment "{name}" : goto {v.nft_firewall}')
    if not v.has_external_endpoints:
        for ip in svc.lb_ips:
            maps["no-endpoint-services"].append(f'{ip} . {key} comment "{name}" : '
                                                f"{external_verdict}")
    if p.node_port:
        if v.has_endpoints:
            maps["service-nodeports"].append(f"{proto} . {p.node_port} : goto {v.nft_external}")
        if not v.has_external_endpoints:
            maps["no-endpoint-nodeports"].append(f'{proto} . {p.node_port} comment "{name}" : '
                                                 f"{external_verdict}")
    if not v.has_endpoints:
        return
    chain(v.nft_service, f"{ipx} daddr {svc.cluster_ip} {proto} dport {p.port} "
          f"{ipx} saddr != {fam.cluster_cidr} jump mark-for-masquerade")
    if svc.externally_accessible:
        if not svc.etp_local:
            chain(v.nft_external, "jump mark-for-masquerade")
        else:
            chain(v.nft_external,
                  f'{ipx} saddr {fam.cluster_cidr} goto {v.nft_service} comment "short-circuit pod '
                  'traffic"',
                  'fib saddr type local jump mark-for-masquerade comment "masquerade local '
                  'traffic"',
                  f'fib saddr type local goto {v.nft_service} comment "short-circuit local '
                  'traffic"')
        if v.has_external_endpoints:
            chain(v.nft_external, f"goto {v.nft_local if svc.etp_local else v.nft_service}")
    if svc.affinity_timeout:
        affinity_sets.extend((v.nft_affinity(ep), svc.affinity_timeout)
                             for ep in v.reachable_endpoints)
    _nft_lb_rules(v, chain, v.nft_service, v.cluster_endpoints, ipx)
    if v.local_endpoints:
        _nft_lb_rules(v, chain, v.nft_local, v.local_endpoints, ipx)
    for ep in v.reachable_endpoints:
        rules = [f"{ipx} saddr {ep.ip} jump mark-for-masquerade"]
        if svc.affinity_timeout:
            rules.append(f"update @{v.nft_affinity(ep)} {{ {ipx} saddr }}")
        rules.append(f"meta l4proto {proto} dnat to {v.ep_string(ep)}")
        chain(v.nft_endpoint(ep), *rules)


def _nft_lb_rules(v: PortView, chain, name: str, endpoints, ipx: str = "ip") -> None:
    if v.svc.affinity_timeout:
        for ep in endpoints:
            chain(name, f"{ipx} saddr @{v.nft_affinity(ep)} goto {v.nft_endpoint(ep)}")
    choices = ", ".join(f"{i} : goto {v.nft_endpoint(ep)}" for i, ep in enumerate(endpoints))
    chain(name, f"numgen random mod {len(endpoints)} vmap {{ {choices} }}")
