"""calico-dualstack: calico-vxlan (kernel_cni_gen.calico) with a second, IPv6 pool
(fd00:10:244::/48, blocks of /122, vxlanMode Always), as Calico runs dual-stack.

What Calico adds for IPv6 (projectcalico/calico):
- in the pod: the address as a /128 and ``default via fe80::ecee:eeff:feee:eeee dev eth0``,
  the host veth's link-local address (cni-plugin/pkg/dataplane/linux/dataplane_linux.go:
  ``hostSideMACAsIPv6LL``, ``ip.AddRoute(r, hostIPv6Addr, contVeth)``); on the node
  ``<pod address> dev cali...`` and ``proxy_ndp`` 1 on the veth (configureSysctls);
- ``vxlan-v6.calico`` (felix/dataplane/linux/dataplanedefs/dataplane_defs.go
  ``VXLANIfaceNameV6``; VNI 4096, port 4789, local: the node's IPv6 address) with the node's
  IPv6 VXLAN tunnel address from its block, ``<block> via <remote tunnel address> dev
  vxlan-v6.calico onlink``, a permanent neighbour and FDB entry per remote node
  (felix/dataplane/linux/vxlan_mgr.go, the same as IPv4's);
- ip6tables: the same chains, with ``cali60`` IP sets and ``Allow IPv6 VXLAN packets from
  allowed hosts`` (felix/rules/static.go), no IPIP rule.
"""

from __future__ import annotations

import base64
import hashlib

from kernel_cni_gen import calico
from kernel_cni_gen.bundle import Example
from kernel_cni_gen.host import Iface, link_local, mac

POOL6 = "fd00:10:244::/48"
SERVICE6 = "fd00:10:96::/112"
GATEWAY6 = "2001:db8:56::1"
VETH_LL = link_local(calico.VETH_MAC)          # fe80::ecee:eeff:feee:eeee


def block6(n: int) -> str:
    return f"fd00:10:244:{n + 1:x}::"


def node_ip6(n: int) -> str:
    return f"2001:db8:56::{10 + n}"


def build() -> Example:
    ex = calico.build()
    ex.name = "calico-dualstack"
    names = [name for name, _, _ in calico.NODES]
    vtep6 = {name: mac(f"vxlan-v6.calico/{name}") for name in names}
    v4_base = {name: block.split("/")[0] for name, _, block in calico.NODES}
    for pod in ex.pods:
        n = names.index(pod.node)
        offset = int(pod.ip.rsplit(".", 1)[1]) - int(v4_base[pod.node].rsplit(".", 1)[1])
        pod.ip6, pod.prefixlen6 = f"{block6(n)}{offset:x}", 128
        pod.routes += [f"{pod.ip6} dev eth0 proto kernel metric 256 pref medium",
                       "fe80::/64 dev eth0 proto kernel metric 256 pref medium",
                       f"default via {VETH_LL} dev eth0 metric 1024 pref medium"]
        pod.neigh += [f"{VETH_LL} dev eth0 lladdr {calico.VETH_MAC} router STALE"]
    svc = ex.services[0]
    svc.cluster_ip6 = "fd00:10:96::78:f"
    frontends = [p for p in ex.pods if p.labels.get("role") == "frontend"]
    pi_chain = calico.limited("cali-pi-", "shop/knp.default.web-from-frontend")
    digest = base64.urlsafe_b64encode(hashlib.sha224(
        b"projectcalico.org/orchestrator == 'k8s' && role == 'frontend'").digest()).decode()[:23]
    for node in ex.nodes:
        n = names.index(node.name)
        tunnel6 = block6(n)
        node.ip6 = node_ip6(n)
        node.annotations.update({"projectcalico.org/IPv6Address": f"{node.ip6}/64",
                                 "projectcalico.org/IPv6VXLANTunnelAddr": tunnel6})
        eth0 = node.iface("eth0")
        eth0.addrs += [(node.ip6, 64, None), (link_local(eth0.mac), 64, None)]
        mine = [p for p in ex.pods if p.node == node.name]
        for iface in node.ifaces:
            if iface.kind == "veth":
                iface.addrs += [(VETH_LL, 64, None)]
        vx6 = Iface(max(i.index for i in node.ifaces) + 1, "vxlan-v6.calico", "vxlan",
                    vtep6[node.name], [(tunnel6, 128, None),
                                       (link_local(vtep6[node.name]), 64, None)], 1430,
                    vxlan={"id": calico.VNI, "local": node.ip6, "dev": "eth0",
                           "port": calico.VXLAN_PORT}, state="UNKNOWN")
        node.ifaces.append(vx6)
        others = [(o, names.index(o)) for o in names if o != node.name]
        node.routes += ["2001:db8:56::/64 dev eth0 proto kernel metric 256 pref medium",
                        f"blackhole {block6(n)}/122 dev lo proto 80 metric 1024 pref medium"]
        node.routes += [f"{p.ip6} dev {p.host_veth} metric 1024 pref medium" for p in mine]
        node.routes += [f"{block6(o)}/122 via {block6(o)} dev vxlan-v6.calico proto 80 metric "
                        "1024 onlink pref medium" for _, o in others]
        node.routes += [f"fe80::/64 dev {d} proto kernel metric 256 pref medium"
                        for d in ["eth0", "vxlan-v6.calico"] + [p.host_veth for p in mine]]
        node.routes += [f"default via {GATEWAY6} dev eth0 metric 1024 pref medium",
                        "local ::1 dev lo table local proto kernel metric 0 pref medium",
                        f"local {node.ip6} dev eth0 table local proto kernel metric 0 pref medium",
                        f"local {tunnel6} dev vxlan-v6.calico table local proto kernel metric 0 "
                        "pref medium",
                        "multicast ff00::/8 dev eth0 table local proto kernel metric 256 pref "
                        "medium"]
        node.neigh += [f"{block6(o)} dev vxlan-v6.calico lladdr {vtep6[o_name]} PERMANENT"
                       for o_name, o in others]
        node.neigh += [f"{GATEWAY6} dev eth0 lladdr 52:54:00:ae:41:01 router REACHABLE"]
        node.neigh += [f"{node_ip6(o)} dev eth0 lladdr {mac('eth0/' + o_name)} REACHABLE"
                       for o_name, o in others]
        node.neigh += [f"{p.ip6} dev {p.host_veth} lladdr {p.mac} REACHABLE" for p in mine]
        node.fdb += [f"{vtep6[o_name]} dev vxlan-v6.calico dst {node_ip6(o)} self permanent"
                     for o_name, o in others]
        node.ip6tables = calico._iptables(node.name, mine, svc, pi_chain, "cali60s:" + digest,
                                          pool6=POOL6)
        node.ipset = calico._ipsets("cali40s:" + digest, frontends, v6={
            "nodes": [node_ip6(names.index(o)) for o in names], "pool": POOL6,
            "set": "cali60s:" + digest})
        ex.extra_files[f"nodes/{node.name}/ip-6-rule.txt"] = ("0:\tfrom all lookup local\n"
                                                               "32766:\tfrom all lookup main\n")
    ex.manifest = {**ex.manifest, "cluster": "calico-dualstack-example",
                   "service_cidr": f"{ex.manifest['service_cidr']},{SERVICE6}",
                   "description": (
                       "calico-vxlan made dual-stack: Calico v3.28.2 with a second IP pool "
                       f"{POOL6} (vxlanMode Always: vxlan-v6.calico over the nodes' IPv6 "
                       "addresses), the pods' IPv6 gateway the host veth's link-local address "
                       "fe80::ecee:eeff:feee:eeee, felix's and kube-proxy's rules in both "
                       "iptables and ip6tables. The Service shop/web (10.96.120.15 and "
                       "fd00:10:96::78:f, port 80 -> 8080) has web-1 on worker-1 and web-0 on "
                       "worker-2; web-from-frontend admits role=frontend only, in both "
                       "families.")}
    ex.header = ex.header.replace("VXLAN mode with\n# a NetworkPolicy",
                                  "VXLAN mode, dual-stack,\n# with a NetworkPolicy")
    for node in ex.nodes:
        base = f"nodes/{node.name}/"
        ex.provenance[base + "ip-6-rule.txt"] = {"origin": "synthesised",
                                                 "detail": "the kernel's default IPv6 rules"}
        ex.provenance[base + "ip6tables-save.txt"] = {
            "origin": "adapted", "detail": "felix's chains as for iptables-save.txt, in their "
            "IPv6 form (cali60 sets, `Allow IPv6 VXLAN packets from allowed hosts`, "
            "felix/rules/static.go), kube-proxy's IPv6 rules; ip6tables-save form"}
        for f in ("ip-route.txt", "ip-neigh.txt", "bridge-fdb.txt", "ip-link.txt", "ip-addr.txt",
                  "ipset.txt"):
            old = ex.provenance[base + f]
            ex.provenance[base + f] = {**old, "detail": old["detail"] + "; IPv6: vxlan-v6.calico "
                                       "and the /128 pod routes as felix and the CNI plugin "
                                       "write them (see tools/kernel_cni_gen/calico_dualstack.py)"}
    return ex
