"""A node's host files in each mode: ip addr, ip route, ip rule.
"""

from __future__ import annotations

import ipaddress
import random

from kube_proxy_gen.cluster import Cluster, NodeSpec, SEED


def _mac(node: NodeSpec, index: int) -> str:
    rng = random.Random(f"{SEED}/{node.name}/mac/{index}")
    octets = [rng.randrange(256) for _ in range(6)]
    octets[0] = (octets[0] | 0x02) & 0xFE           # locally administered, unicast
    return ":".join(f"{o:02x}" for o in octets)


def _link_local(mac: str) -> str:
    octets = [int(o, 16) for o in mac.split(":")]
    octets[0] ^= 0x02
    eui = octets[:3] + [0xFF, 0xFE] + octets[3:]
    return str(ipaddress.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui)))


def ipvs_addresses(cluster: Cluster) -> list[str]:
    """Addresses kube-proxy binds to kube-ipvs0 (cluster IPs, external IPs, LB IPs)."""
    seen: list[str] = []
    for svc in cluster.services:
        for ip in (svc.cluster_ip, *svc.external_ips, *svc.lb_ips):
            if ip not in seen:
                seen.append(ip)
    return seen


def _interfaces(cluster: Cluster, node: NodeSpec, mode: str) -> list[dict]:
    gw = ipaddress.ip_network(node.pod_cidr)
    links = [
        {"name": "lo", "flags": "LOOPBACK,UP,LOWER_UP", "mtu": 65536, "rest": "qdisc noqueue "
         "state UNKNOWN group default qlen 1000", "mac": None,
         "inet": [("127.0.0.1/8", None, "host")], "inet6": [("::1/128", "host")]},
        {"name": "ens192", "flags": "BROADCAST,MULTICAST,UP,LOWER_UP", "mtu": 1500,
         "rest": "qdisc mq state UP group default qlen 1000", "mac": node.mac,
         "altname": "enp11s0", "inet": [(f"{node.ip}/24", "192.168.10.255", "global")]},
        {"name": "ovs-system", "flags": "BROADCAST,MULTICAST", "mtu": 1500,
         "rest": "qdisc noop state DOWN group default qlen 1000", "mac": _mac(node, 3),
         "inet": [], "inet6": []},
        {"name": "genev_sys_6081", "flags": "BROADCAST,MULTICAST,UP,LOWER_UP", "mtu": 65000,
         "rest": "qdisc noqueue master ovs-system state UNKNOWN group default qlen 1000",
         "mac": _mac(node, 4), "inet": []},
        {"name": "antrea-gw0", "flags": "BROADCAST,MULTICAST,UP,LOWER_UP", "mtu": 1450,
         "rest": "qdisc noqueue state UNKNOWN group default qlen 1000", "mac": _mac(node, 5),
         "inet": [(f"{node.gateway_ip}/{gw.prefixlen}", str(gw.broadcast_address), "global")]},
    ]
    if mode == "ipvs":
        links.append({"name": "kube-ipvs0", "flags": "BROADCAST,NOARP", "mtu": 1500,
                      "rest": "qdisc noop state DOWN group default", "mac": _mac(node, 6),
                      "inet": [(f"{ip}/32", None, "global") for ip in ipvs_addresses(cluster)],
                      "inet6": []})
    for link in links:
        if "inet6" not in link:
            link["inet6"] = [(f"{_link_local(link['mac'])}/64", "link")]
    return links


def ip_addr(cluster: Cluster, node: NodeSpec, mode: str) -> str:
    lines = []
    for index, link in enumerate(_interfaces(cluster, node, mode), 1):
        lines.append(f"{index}: {link['name']}: <{link['flags']}> mtu {link['mtu']} "
                     f"{link['rest']}")
        if link["mac"] is None:
            lines.append("    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00")
        else:
            lines.append(f"    link/ether {link['mac']} brd ff:ff:ff:ff:ff:ff")
        if link.get("altname"):
            lines.append(f"    altname {link['altname']}")
        for cidr, brd, scope in link["inet"]:
            brd_text = f" brd {brd}" if brd else ""
            lines += [f"    inet {cidr}{brd_text} scope {scope} {link['name']}",
                      "       valid_lft forever preferred_lft forever"]
        for cidr, scope in link["inet6"]:
            lines += [f"    inet6 {cidr} scope {scope}",
                      "       valid_lft forever preferred_lft forever"]
    return "\n".join(lines) + "\n"


def ip_route(cluster: Cluster, node: NodeSpec, mode: str) -> str:
    """``ip route show table all``: main, then local (trie order), then IPv6."""
    main = [(ipaddress.ip_network("0.0.0.0/0"),
             "default via 192.168.10.1 dev ens192 proto static")]
    for other in cluster.nodes:
        net = ipaddress.ip_network(other.pod_cidr)
        if other.name == node.name:
            main.append((net, (f"{net} dev antrea-gw0 proto kernel scope link src "
                               f"{node.gateway_ip}")))
        else:
            main.append((net, f"{net} via {other.gateway_ip} dev antrea-gw0 onlink"))
    main.append((ipaddress.ip_network("192.168.10.0/24"),
                 f"192.168.10.0/24 dev ens192 proto kernel scope link src {node.ip}"))
    local = []
    for link in _interfaces(cluster, node, mode):
        for cidr, brd, _ in link["inet"]:
            iface = ipaddress.ip_interface(cidr)
            dev = link["name"]
            if dev == "lo":
                local.append((iface.network, (f"local {iface.network} dev lo table local "
                                              f"proto kernel scope host src {iface.ip}")))
            local.append((ipaddress.ip_network(f"{iface.ip}/32"),
                          (f"local {iface.ip} dev {dev} table local proto kernel scope host "
                           f"src {iface.ip}")))
            bcast = brd or (str(iface.network.broadcast_address)
                            if iface.network.prefixlen < 31 else None)
            if bcast:
                local.append((ipaddress.ip_network(f"{bcast}/32"),
                              (f"broadcast {bcast} dev {dev} table local proto kernel scope "
                               f"link src {iface.ip}")))

    def trie(item):
        net = item[0]
        return int(net.network_address), -net.prefixlen
    lines = [text for _, text in sorted(main, key=trie)]
    lines += [text for _, text in sorted(local, key=trie)]
    links = [link for link in _interfaces(cluster, node, mode) if link["inet6"]]
    lines.append("::1 dev lo proto kernel metric 256 pref medium")
    lines += [f"fe80::/64 dev {link['name']} proto kernel metric 256 pref medium"
              for link in links if link["name"] != "lo"]
    lines.append("local ::1 dev lo table local proto kernel metric 0 pref medium")
    lines += [f"local {cidr.split('/')[0]} dev {link['name']} table local proto kernel metric 0 "
              "pref medium" for link in sorted(links, key=lambda l: l["inet6"][0][0])
              for cidr, _ in link["inet6"] if link["name"] != "lo"]
    lines += [f"multicast ff00::/8 dev {link['name']} table local proto kernel metric 256 pref "
              "medium" for link in links if link["name"] != "lo"]
    return "\n".join(lines) + "\n"


IP_RULE = ("0:\tfrom all lookup local\n32766:\tfrom all lookup main\n"
           "32767:\tfrom all lookup default\n")

ROUTER_MAC = "00:00:5e:00:01:0a"          # the default gateway 192.168.10.1 (a VRRP MAC)
# Antrea's global virtual MAC: in encap mode the agent adds a PERMANENT neighbour with it for
# every other node's gateway IP on antrea-gw0 (pkg/agent/route/route_linux.go, addRoutes /
# the onlink routes' next hops; pkg/agent/config GlobalVirtualMAC)
GLOBAL_VIRTUAL_MAC = "aa:bb:cc:dd:ee:ff"


def ip_neigh(cluster: Cluster, node: NodeSpec, mode: str) -> str:
    """``ip neigh show``: the default gateway on ens192 (learnt by ARP), the other nodes'
    gateway IPs on antrea-gw0 (permanent, Antrea's global virtual MAC), and the link-local
    router. Entries for peers and local pods come and go with traffic: none are listed."""
    lines = [f"192.168.10.1 dev ens192 lladdr {ROUTER_MAC} REACHABLE"]
    for other in cluster.nodes:
        if other.name != node.name:
            lines.append(f"{other.gateway_ip} dev antrea-gw0 lladdr {GLOBAL_VIRTUAL_MAC} "
                         "PERMANENT")
    lines.append(f"fe80::200:5eff:fe00:10a dev ens192 lladdr {ROUTER_MAC} router STALE")
    return "\n".join(lines) + "\n"
