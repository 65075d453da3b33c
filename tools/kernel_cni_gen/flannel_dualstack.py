"""flannel-dualstack: flannel-vxlan (kernel_cni_gen.flannel) made dual-stack, as Flannel runs
with ``"EnableIPv6": true`` and an ``IPv6Network`` in net-conf.json.

What Flannel adds for IPv6 (flannel-io/flannel, pkg/backend/vxlan):
- a second VXLAN device ``flannel-v6.<VNI>`` (vxlan.go createVXLANDevice: ``fmt.Sprintf
  ("flannel-v6.%d", cfg.VNI)``, the same VNI and port, ``vtepAddr: extIfaceV6IP``: its outer
  packets are IPv6 between the nodes' IPv6 addresses), with the node's IPv6 subnet's network
  address as a /128 (vxlan.go configureDeviceIPv4IPv6: ``PrefixLen: 128``);
- per remote node: ``<subnet> via <subnet's network address> dev flannel-v6.1 onlink``
  (vxlan_network.go handleSubnetEvents: ``v6VxlanRoute`` with ``Gw: v6Sn.IP`` and
  RTNH_F_ONLINK), a permanent neighbour for that address with the remote v6 VTEP's MAC, and
  its FDB entry ``<MAC> dev flannel-v6.1 dst <remote IPv6 address> self permanent``;
- ip6tables: FLANNEL-POSTRTG / FLANNEL-FWD with the IPv6 network (pkg/trafficmngr/iptables:
  the same rules for the v6 network, in the ip6tables manager).
The bridge plugin gives cni0 the subnet's ``::1`` and the pods an address of the /64 with a
default route via it (host-local IPAM's ``ranges`` of both families).
"""

from __future__ import annotations

from kernel_cni_gen import flannel, kube
from kernel_cni_gen.bundle import Example
from kernel_cni_gen.host import Iface, link_local, mac

NETWORK6 = "fd00:10:42::/56"
SERVICE6 = "fd00:10:43::/112"
GATEWAY6 = "2001:db8:122::1"
GATEWAY6_MAC = "52:54:00:12:35:02"


def subnet6(n: int) -> str:
    return f"fd00:10:42:{n:x}::" if n else "fd00:10:42::"


def node_ip6(n: int) -> str:
    return f"2001:db8:122::{10 + n}"


def build() -> Example:
    ex = flannel.build()
    ex.name = "flannel-dualstack"
    names = [name for name, _, _ in flannel.NODES]
    vtep6 = {name: mac(f"flannel-v6.1/{name}") for name in names}
    for pod in ex.pods:
        n = names.index(pod.node)
        last = pod.ip.rsplit(".", 1)[1]
        pod.ip6, pod.prefixlen6 = f"{subnet6(n)}{last}", 64
        gw = f"{subnet6(n)}1"
        pod.routes += [f"{subnet6(n)}/64 dev eth0 proto kernel metric 256 pref medium",
                       f"{NETWORK6} via {gw} dev eth0 metric 1024 pref medium",
                       "fe80::/64 dev eth0 proto kernel metric 256 pref medium",
                       f"default via {gw} dev eth0 metric 1024 pref medium"]
        pod.neigh += [f"{gw} dev eth0 lladdr {mac('cni0/' + pod.node)} router REACHABLE"]
    svc = ex.services[0]
    svc.cluster_ip6 = "fd00:10:43::78:f"
    for node in ex.nodes:
        n = names.index(node.name)
        node.ip6, node.pod_cidr6 = node_ip6(n), f"{subnet6(n)}/64"
        node.annotations.update({
            "flannel.alpha.coreos.com/backend-v6-data":
                f'{{"VNI":1,"VtepMAC":"{vtep6[node.name]}"}}',
            "flannel.alpha.coreos.com/public-ipv6": node.ip6})
        eth0, cni0 = node.iface("eth0"), node.iface("cni0")
        eth0.addrs += [(node.ip6, 64, None), (link_local(eth0.mac), 64, None)]
        cni0.addrs += [(f"{subnet6(n)}1", 64, None), (link_local(cni0.mac), 64, None)]
        v6dev = Iface(5 + len([i for i in node.ifaces if i.kind == "veth"]), "flannel-v6.1",
                      "vxlan", vtep6[node.name], [(subnet6(n), 128, None),
                                                  (link_local(vtep6[node.name]), 64, None)],
                      flannel.MTU - 20, state="UNKNOWN",
                      vxlan={"id": 1, "local": node.ip6, "dev": "eth0", "port": 8472})
        node.ifaces.append(v6dev)
        others = [(o, names.index(o)) for o in names if o != node.name]
        # `ip route show table all` lists the IPv6 routes after the IPv4 ones
        node.routes += ["2001:db8:122::/64 dev eth0 proto kernel metric 256 pref medium",
                        f"{subnet6(n)}/64 dev cni0 proto kernel metric 256 pref medium"]
        node.routes += [f"{subnet6(o)}/64 via {subnet6(o)} dev flannel-v6.1 metric 1024 onlink "
                        "pref medium" for _, o in others]
        node.routes += [f"fe80::/64 dev {d} proto kernel metric 256 pref medium"
                        for d in ("eth0", "cni0", "flannel-v6.1")]
        node.routes += [f"default via {GATEWAY6} dev eth0 metric 1024 pref medium",
                        "local ::1 dev lo table local proto kernel metric 0 pref medium",
                        f"local {node.ip6} dev eth0 table local proto kernel metric 0 pref medium",
                        f"local {subnet6(n)} dev flannel-v6.1 table local proto kernel metric 0 "
                        "pref medium",
                        f"local {subnet6(n)}1 dev cni0 table local proto kernel metric 0 pref "
                        "medium",
                        "multicast ff00::/8 dev eth0 table local proto kernel metric 256 pref "
                        "medium"]
        node.neigh += [f"{subnet6(o)} dev flannel-v6.1 lladdr {vtep6[o_name]} PERMANENT"
                       for o_name, o in others]
        node.neigh += [f"{GATEWAY6} dev eth0 lladdr {GATEWAY6_MAC} router REACHABLE"]
        node.neigh += [f"{node_ip6(o)} dev eth0 lladdr {mac('eth0/' + o_name)} STALE"
                       for o_name, o in others]
        node.neigh += [f"{p.ip6} dev cni0 lladdr {p.mac} REACHABLE"
                       for p in ex.pods if p.node == node.name and p.labels.get("app") == "web"]
        node.fdb += [f"{vtep6[o_name]} dev flannel-v6.1 dst {node_ip6(o)} self permanent"
                     for o_name, o in others]
        node.ip6tables = _ip6tables(node.name, n, svc)
        ex.extra_files[f"nodes/{node.name}/ip-6-rule.txt"] = ("0:\tfrom all lookup local\n"
                                                               "32766:\tfrom all lookup main\n")
    ex.manifest = {**ex.manifest, "cluster": "flannel-dualstack-example",
                   "service_cidr": f"{ex.manifest['service_cidr']},{SERVICE6}",
                   "description": (
                       "flannel-vxlan made dual-stack: Flannel v0.25 with EnableIPv6 "
                       f"(IPv6Network {NETWORK6}): flannel.1 (VXLAN over IPv4) and flannel-v6.1 "
                       "(VXLAN over IPv6, VNI 1, UDP 8472), cni0 with both families, "
                       "kube-proxy in iptables mode for both (ip6tables). The Service "
                       "default/web (10.43.120.15 and fd00:10:43::78:f, port 80 -> 8080) has "
                       "one backend on each node.")}
    ex.header = ex.header.replace("with Flannel\n# in VXLAN mode", "with Flannel\n# dual-stack "
                                  "(VXLAN for both families)")
    ex.provenance = {**ex.provenance}
    for node in ex.nodes:
        base = f"nodes/{node.name}/"
        ex.provenance[base + "ip-6-rule.txt"] = {"origin": "synthesised",
                                                 "detail": "the kernel's default IPv6 rules"}
        ex.provenance[base + "ip6tables-save.txt"] = {
            "origin": "adapted", "detail": "kube-proxy v1.28's IPv6 rules as tools/kube_proxy_gen "
            "writes them (no localnet rule), Flannel's FLANNEL-POSTRTG / FLANNEL-FWD for the IPv6 "
            "network (pkg/trafficmngr/iptables), ip6tables-save form"}
        for f in ("ip-route.txt", "ip-neigh.txt", "bridge-fdb.txt", "ip-link.txt"):
            old = ex.provenance[base + f]
            ex.provenance[base + f] = {**old, "detail": old["detail"] + "; IPv6: flannel-v6.1 "
                                       "as pkg/backend/vxlan (vxlan.go, vxlan_network.go) writes it"}
    return ex


def _ip6tables(node: str, n: int, svc) -> str:
    mangle, flt, nat = kube.kube_proxy_tables([svc], NETWORK6, node)
    flt.add("FORWARD", '-m comment --comment "flanneld forward" -j FLANNEL-FWD')
    flt.add("FLANNEL-FWD", f'-s {NETWORK6} -m comment --comment "flanneld forward" -j ACCEPT')
    flt.add("FLANNEL-FWD", f'-d {NETWORK6} -m comment --comment "flanneld forward" -j ACCEPT')
    nat.add("POSTROUTING", '-m comment --comment "flanneld masq" -j FLANNEL-POSTRTG')
    masq = '-m comment --comment "flanneld masq"'
    own = f"{subnet6(n)}/64"
    nat.add("FLANNEL-POSTRTG", f"-m mark --mark 0x4000/0x4000 {masq} -j RETURN")
    nat.add("FLANNEL-POSTRTG", f"-s {own} -d {NETWORK6} {masq} -j RETURN")
    nat.add("FLANNEL-POSTRTG", f"-s {NETWORK6} -d {own} {masq} -j RETURN")
    nat.add("FLANNEL-POSTRTG", f"! -s {NETWORK6} -d {own} {masq} -j RETURN")
    nat.add("FLANNEL-POSTRTG", f"-s {NETWORK6} ! -d ff00::/8 {masq} -j MASQUERADE --random-fully")
    nat.add("FLANNEL-POSTRTG", f"! -s {NETWORK6} -d {NETWORK6} {masq} -j MASQUERADE "
            "--random-fully")
    text = "\n".join(line for t in (mangle, flt, nat) for line in t.render("ip6tables-save"))
    return text + "\n"
