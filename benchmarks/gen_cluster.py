"""Generate whole Antrea (encap, v0.10 numbered pipeline) + kube-proxy (iptables) clusters.

    python benchmarks/gen_cluster.py OUTDIR --pods P --services S --nodes N

Unlike ``gen_scale.py`` (one example grown to 100k flows, where only the example's pods are
wired), every pod here is a real OVS port on its node with its classifier, SpoofGuard,
L3Forwarding and L2ForwardingCalc flows, written the way the example's nodes
(``examples/antrea-encap-kube-proxy``, Antrea v0.10) have them, so an audit can trace every
client. Deterministic (no randomness: every name and address comes from an index).

- S Services (``ns-KK/svc-IIIII``, port 80 -> 8080), each selecting one Deployment of about
  P / S replicas spread over the nodes (``app: svc-IIIII``); kube-proxy's iptables rules
  (KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP) on every node, as in ``gen_scale.py``;
- namespaces: S / 25 (at least 4). Every 4th namespace is isolated for ingress
  (``deny-ingress`` selects every pod, ``allow-same-namespace`` lets its own pods in): table
  90 conjunctions (source addresses x local ports) and table 100 drops, as Antrea v0.10
  renders them; two namespaces (ns-01, ns-09) may send only to their own pods and to DNS
  (``egress-same-namespace``): table 50 conjunctions and table 60 drops;
- each node: its pod CIDR 10.222.N.0/24 on antrea-gw0, a route and a tunnel flow per peer.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gen_scale import _hash16  # noqa: E402

CLUSTER_CIDR = "10.222.0.0/16"
FIRST_SVC_IP = ipaddress.IPv4Address("10.100.0.0")
GLOBAL_MAC = "aa:bb:cc:dd:ee:ff"
TUN_PORT, GW_PORT, FIRST_POD_PORT = 1, 2, 3


def _mac(prefix: int, n: int) -> str:
    return f"{prefix:02x}:{(n >> 32) & 255:02x}:{(n >> 24) & 255:02x}:{(n >> 16) & 255:02x}:" \
           f"{(n >> 8) & 255:02x}:{n & 255:02x}"


def _suffix(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


class Cluster:
    def __init__(self, pods: int, services: int, nodes: int):
        assert 1 <= nodes <= 250 and services >= 1 and pods >= services
        self.nodes = [f"worker{n}" for n in range(1, nodes + 1)]
        self.namespaces = [f"ns-{k:02d}" for k in range(max(4, services // 25))]
        self.services = []      # (ns, name, ip)
        self.pods = []          # dict(name, ns, app, node, ip, mac, port, port_name)
        per_node: dict = {n: [] for n in self.nodes}
        replicas = [pods // services + (1 if i < pods % services else 0) for i in range(services)]
        k = 0
        for i in range(services):
            ns = self.namespaces[i % len(self.namespaces)]
            name = f"svc-{i:05d}"
            self.services.append((ns, name, str(FIRST_SVC_IP + i)))
            for r in range(replicas[i]):
                node = self.nodes[k % nodes]
                local = per_node[node]
                n_idx = self.nodes.index(node) + 1
                ip = str(ipaddress.IPv4Address(f"10.222.{n_idx}.0") + 2 + len(local))
                pod = f"{name}-{_suffix(name, 10)}-{_suffix(name + str(r), 5)}"
                port_name = f"{pod[:8]}-{_suffix(pod, 6)}"
                p = {"name": pod, "ns": ns, "app": name, "node": node, "ip": ip,
                     "mac": _mac(0xf2, k + 1), "port": FIRST_POD_PORT + len(local),
                     "port_name": port_name, "veth_mac": _mac(0x9e, k + 1)}
                local.append(p)
                self.pods.append(p)
                k += 1
        assert all(len(v) <= 250 for v in per_node.values()), "over 250 pods on a node"
        self.per_node = per_node

    # ---- per node facts ----------------------------------------------------------------------
    def node_index(self, node: str) -> int:
        return self.nodes.index(node) + 1

    def node_ip(self, node: str) -> str:
        n = self.node_index(node)
        return f"10.79.{n // 200}.{n % 200 + 10}"

    def gw_ip(self, node: str) -> str:
        return f"10.222.{self.node_index(node)}.1"

    def gw_mac(self, node: str) -> str:
        return _mac(0x4e, 0x99000000 + self.node_index(node))

    def cidr(self, node: str) -> str:
        return f"10.222.{self.node_index(node)}.0/24"

    def isolated(self, ns: str) -> bool:
        return self.namespaces.index(ns) % 4 == 0

    def egress_limited(self, ns: str) -> bool:
        return self.namespaces.index(ns) in (1, 9)


# ---- OVS ---------------------------------------------------------------------------------------
C_CLS, C_SG, C_L3, C_L2, C_POL, C_BASE = ("0x1030000000000", "0x1030000000000", "0x1030000000000",
                                          "0x1030000000000", "0x1050000000000", "0x1000000000000")


def ovs_flows(c: Cluster, node: str) -> str:
    gw_mac, gw_ip = c.gw_mac(node), c.gw_ip(node)
    gw_hex = "0x" + gw_mac.replace(":", "").lstrip("0")
    local = c.per_node[node]
    t0 = [f"cookie={C_BASE}, priority=200,in_port=\"antrea-gw0\" actions="
          "load:0x1->NXM_NX_REG0[0..15],resubmit(,10)",
          f"cookie={C_BASE}, priority=200,in_port=\"antrea-tun0\" actions="
          "load:0->NXM_NX_REG0[0..15],load:0x1->NXM_NX_REG0[19],resubmit(,30)"]
    t0 += [f"cookie={C_CLS}, priority=190,in_port=\"{p['port_name']}\" actions="
           "load:0x2->NXM_NX_REG0[0..15],resubmit(,10)" for p in local]
    t0.append(f"cookie={C_BASE}, priority=0 actions=drop")
    t10 = [f"cookie={C_BASE}, table=10, priority=200,ip,in_port=\"antrea-gw0\" actions=resubmit(,30)",
           f"cookie={C_BASE}, table=10, priority=200,arp,in_port=\"antrea-gw0\",arp_spa={gw_ip},"
           f"arp_sha={gw_mac} actions=resubmit(,20)"]
    t10 += [f"cookie={C_SG}, table=10, priority=200,arp,in_port=\"{p['port_name']}\","
            f"arp_spa={p['ip']},arp_sha={p['mac']} actions=resubmit(,20)" for p in local]
    t10 += [f"cookie={C_SG}, table=10, priority=200,ip,in_port=\"{p['port_name']}\","
            f"dl_src={p['mac']},nw_src={p['ip']} actions=resubmit(,30)" for p in local]
    t10.append(f"cookie={C_BASE}, table=10, priority=0 actions=drop")
    t20 = []
    for peer in c.nodes:
        if peer != node:
            pgw = c.gw_ip(peer)
            t20.append(f"cookie=0x1020000000000, table=20, priority=200,arp,arp_tpa={pgw},arp_op=1 "
                       "actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],mod_dl_src:" + GLOBAL_MAC +
                       ",load:0x2->NXM_OF_ARP_OP[],move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],"
                       "load:0xaabbccddeeff->NXM_NX_ARP_SHA[],move:NXM_OF_ARP_SPA[]->"
                       f"NXM_OF_ARP_TPA[],load:{hex(int(ipaddress.IPv4Address(pgw)))}->"
                       "NXM_OF_ARP_SPA[],IN_PORT")
    t20 += [f"cookie={C_BASE}, table=20, priority=190,arp actions=NORMAL",
            f"cookie={C_BASE}, table=20, priority=0 actions=drop"]
    t30 = [f"cookie={C_BASE}, table=30, priority=200,ip actions=ct(table=31,zone=65520)"]
    t31 = [f"cookie={C_BASE}, table=31, priority=210,ct_state=-new+trk,ct_mark=0x20,ip,"
           "reg0=0x1/0xffff actions=resubmit(,40)",
           f"cookie={C_BASE}, table=31, priority=200,ct_state=-new+trk,ct_mark=0x20,ip actions="
           f"load:{gw_hex}->NXM_OF_ETH_DST[],resubmit(,40)",
           f"cookie={C_BASE}, table=31, priority=190,ct_state=+inv+trk,ip actions=drop",
           f"cookie={C_BASE}, table=31, priority=0 actions=resubmit(,40)"]
    t40 = [f"cookie=0x1040000000000, table=40, priority=200,ip,nw_dst=10.96.0.0/12 actions="
           f"mod_dl_dst:{gw_mac},load:0x{GW_PORT:x}->NXM_NX_REG1[],load:0x1->NXM_NX_REG0[16],"
           "resubmit(,105)",
           f"cookie={C_BASE}, table=40, priority=0 actions=resubmit(,50)"]
    t50, t60, t90, t100 = _policy_flows(c, node)
    t70 = [f"cookie={C_BASE}, table=70, priority=200,ip,dl_dst={GLOBAL_MAC},nw_dst={gw_ip} "
           f"actions=mod_dl_dst:{gw_mac},resubmit(,80)"]
    t70 += [f"cookie={C_L3}, table=70, priority=200,ip,dl_dst={GLOBAL_MAC},nw_dst={p['ip']} "
            f"actions=mod_dl_src:{gw_mac},mod_dl_dst:{p['mac']},dec_ttl,resubmit(,80)" for p in local]
    for peer in c.nodes:
        if peer != node:
            t70.append(f"cookie=0x1020000000000, table=70, priority=200,ip,nw_dst={c.cidr(peer)} "
                       f"actions=dec_ttl,mod_dl_src:{gw_mac},mod_dl_dst:{GLOBAL_MAC},"
                       f"load:0x{TUN_PORT:x}->NXM_NX_REG1[],load:0x1->NXM_NX_REG0[16],"
                       f"load:{hex(int(ipaddress.IPv4Address(c.node_ip(peer))))}->"
                       "NXM_NX_TUN_IPV4_DST[],resubmit(,105)")
    t70.append(f"cookie={C_BASE}, table=70, priority=0 actions=resubmit(,80)")
    t80 = [f"cookie={C_BASE}, table=80, priority=200,dl_dst={gw_mac} actions="
           f"load:0x{GW_PORT:x}->NXM_NX_REG1[],load:0x1->NXM_NX_REG0[16],resubmit(,90)"]
    t80 += [f"cookie={C_L2}, table=80, priority=200,dl_dst={p['mac']} actions="
            f"load:{hex(p['port'])}->NXM_NX_REG1[],load:0x1->NXM_NX_REG0[16],resubmit(,90)"
            for p in local]
    t80.append(f"cookie={C_BASE}, table=80, priority=0 actions=resubmit(,90)")
    t90 = [f"cookie={C_BASE}, table=90, priority=210,ct_state=-new+est,ip actions=resubmit(,105)",
           f"cookie={C_BASE}, table=90, priority=210,ip,nw_src={gw_ip} actions=resubmit(,105)"] + t90
    t90.append(f"cookie={C_BASE}, table=90, priority=0 actions=resubmit(,100)")
    t100.append(f"cookie={C_BASE}, table=100, priority=0 actions=resubmit(,105)")
    t105 = [f"cookie={C_BASE}, table=105, priority=200,ct_state=+new+trk,ip,reg0=0x1/0xffff "
            "actions=ct(commit,table=110,zone=65520,exec(load:0x20->NXM_NX_CT_MARK[]))",
            f"cookie={C_BASE}, table=105, priority=190,ct_state=+new+trk,ip actions="
            "ct(commit,table=110,zone=65520)",
            f"cookie={C_BASE}, table=105, priority=0 actions=resubmit(,110)"]
    t110 = [f"cookie={C_BASE}, table=110, priority=200,ip,reg0=0x10000/0x10000 actions="
            "output:NXM_NX_REG1[]",
            f"cookie={C_BASE}, table=110, priority=0 actions=drop"]
    t50 = [f"cookie={C_BASE}, table=50, priority=210,ct_state=-new+est,ip actions=resubmit(,70)"] \
        + t50 + [f"cookie={C_BASE}, table=50, priority=0 actions=resubmit(,60)"]
    t60.append(f"cookie={C_BASE}, table=60, priority=0 actions=resubmit(,70)")
    return "\n".join(t0 + t10 + t20 + t30 + t31 + t40 + t50 + t60 + t70 + t80 + t90 + t100
                     + t105 + t110) + "\n"


def _conj_flows(table: int, clauses: dict) -> list[str]:
    """clauses: match -> [conjunction actions]; OVS keeps one flow per match and priority."""
    return [f"cookie={C_POL}, table={table}, priority=200,{match} actions="
            + ",".join(acts) for match, acts in clauses.items()]


def _policy_flows(c: Cluster, node: str):
    local = c.per_node[node]
    by_ns: dict = {}
    for p in c.pods:
        by_ns.setdefault(p["ns"], []).append(p)
    t50: dict = {}
    t60, t90_conj, t100 = [], {}, []
    t50_ids, t90_ids = [], []
    for k, ns in enumerate(c.namespaces):
        mine = [p for p in local if p["ns"] == ns]
        if not mine:
            continue
        if c.isolated(ns):      # ingress: own namespace's pods -> local pods of ns
            cid = 1000 + k
            t90_ids.append(cid)
            for p in sorted(by_ns[ns], key=lambda p: ipaddress.IPv4Address(p["ip"])):
                t90_conj.setdefault(f"ip,nw_src={p['ip']}", []).append(f"conjunction({cid},1/2)")
            for p in mine:
                t90_conj.setdefault(f"ip,reg1={hex(p['port'])}", []).append(
                    f"conjunction({cid},2/2)")
                t100.append(f"cookie={C_BASE}, table=100, priority=200,ip,reg1={hex(p['port'])} "
                            "actions=drop")
        if c.egress_limited(ns):    # egress: local pods of ns -> own namespace, and DNS
            cid, dns = 2000 + 2 * k, 2001 + 2 * k
            t50_ids += [cid, dns]
            for p in mine:
                t50.setdefault(f"ip,nw_src={p['ip']}", []).extend(
                    [f"conjunction({cid},1/2)", f"conjunction({dns},1/2)"])
                t60.append(f"cookie={C_BASE}, table=60, priority=200,ip,nw_src={p['ip']} "
                           "actions=drop")
            for p in sorted(by_ns[ns], key=lambda p: ipaddress.IPv4Address(p["ip"])):
                t50.setdefault(f"ip,nw_dst={p['ip']}", []).append(f"conjunction({cid},2/2)")
            t50.setdefault("udp,tp_dst=53", []).append(f"conjunction({dns},2/2)")
    t50_lines = _conj_flows(50, t50) + [
        f"cookie={C_POL}, table=50, priority=190,conj_id={i},ip actions=load:{hex(i)}->"
        "NXM_NX_REG5[],resubmit(,70)" for i in t50_ids]
    t90_lines = _conj_flows(90, t90_conj) + [
        f"cookie={C_POL}, table=90, priority=190,conj_id={i},ip actions=load:{hex(i)}->"
        "NXM_NX_REG6[],resubmit(,105)" for i in t90_ids]
    return t50_lines, t60, t90_lines, t100


def ovs_show(c: Cluster, node: str) -> str:
    out = ["OFPT_FEATURES_REPLY (xid=0x2): dpid:0000c6d974e839" + f"{c.node_index(node):02x}",
           "n_tables:254, n_buffers:0",
           "capabilities: FLOW_STATS TABLE_STATS PORT_STATS QUEUE_STATS ARP_MATCH_IP",
           "actions: output enqueue set_vlan_vid set_vlan_pcp strip_vlan mod_dl_src mod_dl_dst "
           "mod_nw_src mod_nw_dst mod_nw_tos mod_tp_src mod_tp_dst"]
    ports = [(TUN_PORT, "antrea-tun0", _mac(0xf6, c.node_index(node))),
             (GW_PORT, "antrea-gw0", c.gw_mac(node))]
    ports += [(p["port"], p["port_name"], p["veth_mac"]) for p in c.per_node[node]]
    for number, name, mac in ports:
        out += [f" {number}({name}): addr:{mac}", "     config:     0", "     state:      0",
                "     speed: 0 Mbps now, 0 Mbps max"]
    out.append("OFPT_GET_CONFIG_REPLY (xid=0x4): frags=normal miss_send_len=0")
    return "\n".join(out) + "\n"


# ---- host files --------------------------------------------------------------------------------
def ip_addr(c: Cluster, node: str) -> str:
    ip = c.node_ip(node)
    n = c.node_index(node)
    return (
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN group default qlen 1000\n"
        "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"
        "    inet 127.0.0.1/8 scope host lo\n       valid_lft forever preferred_lft forever\n"
        "2: ens160: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc mq state UP group default qlen 1000\n"
        f"    link/ether {_mac(0x00, 0x50568f0000 + n)} brd ff:ff:ff:ff:ff:ff\n"
        f"    inet {ip}/16 brd 10.79.255.255 scope global ens160\n"
        "       valid_lft forever preferred_lft forever\n"
        "4: ovs-system: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN group default qlen 1000\n"
        f"    link/ether {_mac(0x9a, n)} brd ff:ff:ff:ff:ff:ff\n"
        "5: genev_sys_6081: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 65000 qdisc noqueue master "
        "ovs-system state UNKNOWN group default qlen 1000\n"
        f"    link/ether {_mac(0xb6, n)} brd ff:ff:ff:ff:ff:ff\n"
        "6: antrea-gw0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue state UNKNOWN "
        "group default qlen 1000\n"
        f"    link/ether {c.gw_mac(node)} brd ff:ff:ff:ff:ff:ff\n"
        f"    inet {c.gw_ip(node)}/24 brd 10.222.{n}.255 scope global antrea-gw0\n"
        "       valid_lft forever preferred_lft forever\n")


def ip_route(c: Cluster, node: str) -> str:
    ip, n = c.node_ip(node), c.node_index(node)
    out = ["default via 10.79.0.1 dev ens160 proto static",
           f"10.79.0.0/16 dev ens160 proto kernel scope link src {ip}"]
    for peer in c.nodes:
        if peer == node:
            out.append(f"{c.cidr(node)} dev antrea-gw0 proto kernel scope link src {c.gw_ip(node)}")
        else:
            out.append(f"{c.cidr(peer)} via {c.gw_ip(peer)} dev antrea-gw0 onlink")
    out += [f"broadcast 10.79.0.0 dev ens160 table local proto kernel scope link src {ip}",
            f"local {ip} dev ens160 table local proto kernel scope host src {ip}",
            f"broadcast 10.79.255.255 dev ens160 table local proto kernel scope link src {ip}",
            f"broadcast 10.222.{n}.0 dev antrea-gw0 table local proto kernel scope link src "
            f"{c.gw_ip(node)}",
            f"local {c.gw_ip(node)} dev antrea-gw0 table local proto kernel scope host src "
            f"{c.gw_ip(node)}",
            f"broadcast 10.222.{n}.255 dev antrea-gw0 table local proto kernel scope link src "
            f"{c.gw_ip(node)}",
            "broadcast 127.0.0.0 dev lo table local proto kernel scope link src 127.0.0.1",
            "local 127.0.0.0/8 dev lo table local proto kernel scope host src 127.0.0.1",
            "local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1",
            "broadcast 127.255.255.255 dev lo table local proto kernel scope link src 127.0.0.1"]
    return "\n".join(out) + "\n"


def ip_neigh(c: Cluster, node: str) -> str:
    out = ["10.79.0.1 dev ens160 lladdr 5c:5e:ab:d0:1f:c1 REACHABLE"]
    for peer in c.nodes:
        if peer != node:
            out.append(f"{c.gw_ip(peer)} dev antrea-gw0 lladdr {GLOBAL_MAC} PERMANENT")
            out.append(f"{c.node_ip(peer)} dev ens160 lladdr "
                       f"{_mac(0x00, 0x50568f0000 + c.node_index(peer))} REACHABLE")
    out += [f"{p['ip']} dev antrea-gw0 lladdr {p['mac']} REACHABLE" for p in c.per_node[node]]
    return "\n".join(out) + "\n"


def ipset(c: Cluster) -> str:
    members = [c.cidr(n) for n in c.nodes]
    return ("Name: ANTREA-POD-IP\nType: hash:net\nRevision: 6\nHeader: family inet hashsize 1024 "
            "maxelem 65536\nSize in memory: 600\nReferences: 1\n"
            f"Number of entries: {len(members)}\nMembers:\n" + "\n".join(members) + "\n")


def iptables_save(c: Cluster, node: str) -> str:
    from benchmarks.gen_scale import CLUSTER_CIDR as _unused  # noqa: F401 (same shape)
    chains = ["KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-SERVICES",
              "ANTREA-POSTROUTING"]
    svc_rules, rules = [], []
    eps = {}
    for p in c.pods:
        eps.setdefault((p["ns"], p["app"]), []).append(f"{p['ip']}:8080")
    for ns, name, vip in c.services:
        port_name, proto = f"{ns}/{name}:http", "tcp"
        svc_chain = "KUBE-SVC-" + _hash16(port_name + proto)
        chains.append(svc_chain)
        comment = f'-m comment --comment "{port_name} cluster IP"'
        svc_rules.append(f"-A KUBE-SERVICES -d {vip}/32 -p {proto} {comment} -m {proto} "
                         f"--dport 80 -j {svc_chain}")
        rules.append(f"-A {svc_chain} ! -s {CLUSTER_CIDR} -d {vip}/32 -p {proto} {comment} "
                     f"-m {proto} --dport 80 -j KUBE-MARK-MASQ")
        endpoints = eps.get((ns, name), [])
        for k, ep in enumerate(endpoints):
            sep = "KUBE-SEP-" + _hash16(port_name + proto + ep)
            chains.append(sep)
            left = len(endpoints) - k
            stat = (f"-m statistic --mode random --probability {1 / left:.11f} "
                    if left > 1 else "")
            cm = f'-m comment --comment "{port_name} -> {ep}"'
            rules.append(f"-A {svc_chain} {cm} {stat}-j {sep}")
            rules.append(f'-A {sep} -s {ep.rsplit(":", 1)[0]}/32 -m comment --comment '
                         f'"{port_name}" -j KUBE-MARK-MASQ')
            rules.append(f'-A {sep} -p {proto} -m comment --comment "{port_name}" -m {proto} '
                         f"-j DNAT --to-destination {ep}")
    out = ["# Generated by iptables-save v1.8.4 on Mon Sep 21 11:30:00 2020", "*nat",
           ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
           ":POSTROUTING ACCEPT [0:0]"]
    out += [f":{ch} - [0:0]" for ch in sorted(chains)]
    out += ['-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
            '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
            '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" '
            "-j KUBE-POSTROUTING",
            '-A POSTROUTING -m comment --comment "Antrea: jump to Antrea postrouting rules" '
            "-j ANTREA-POSTROUTING",
            f'-A ANTREA-POSTROUTING -s {c.cidr(node)} -m comment --comment "Antrea: masquerade '
            'pod to external packets" -m set ! --match-set ANTREA-POD-IP dst -j MASQUERADE',
            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
            '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring '
            'SNAT" -j MASQUERADE --random-fully']
    out += svc_rules
    out.append('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this '
               'must be the last rule in this chain" -m addrtype --dst-type LOCAL '
               "-j KUBE-NODEPORTS")
    out += rules
    out += ["COMMIT", "# Completed on Mon Sep 21 11:30:00 2020", ""]
    return "\n".join(out)


# ---- Kubernetes objects --------------------------------------------------------------------------
def _list(items: list[str]) -> str:
    return "apiVersion: v1\nitems:\n" + "".join(items) + \
        "kind: List\nmetadata:\n  resourceVersion: \"\"\n  selfLink: \"\"\n"


def nodes_yaml(c: Cluster) -> str:
    return _list([
        f"- apiVersion: v1\n  kind: Node\n  metadata:\n    labels:\n"
        f"      kubernetes.io/hostname: {n}\n      kubernetes.io/os: linux\n    name: {n}\n"
        f"    uid: 00000000-0000-4000-b000-{c.node_index(n):012d}\n"
        f"  spec:\n    podCIDR: {c.cidr(n)}\n    podCIDRs:\n    - {c.cidr(n)}\n"
        f"  status:\n    addresses:\n    - address: {c.node_ip(n)}\n      type: InternalIP\n"
        f"    - address: {n}\n      type: Hostname\n" for n in c.nodes])


def pods_yaml(c: Cluster) -> str:
    return _list([
        f"- apiVersion: v1\n  kind: Pod\n  metadata:\n    labels:\n      app: {p['app']}\n"
        f"    name: {p['name']}\n    namespace: {p['ns']}\n"
        f"    uid: 00000000-0000-4000-9000-{i:012d}\n"
        f"  spec:\n    containers:\n    - image: nginx:1.25\n      name: web\n"
        f"      ports:\n      - containerPort: 8080\n        name: http\n        protocol: TCP\n"
        f"    nodeName: {p['node']}\n  status:\n    hostIP: {c.node_ip(p['node'])}\n"
        f"    phase: Running\n    podIP: {p['ip']}\n    podIPs:\n    - ip: {p['ip']}\n"
        for i, p in enumerate(c.pods)])


def services_yaml(c: Cluster) -> str:
    return _list([
        f"- apiVersion: v1\n  kind: Service\n  metadata:\n    name: {name}\n    namespace: {ns}\n"
        f"    uid: 00000000-0000-4000-8000-{i:012d}\n"
        f"  spec:\n    clusterIP: {ip}\n    clusterIPs:\n    - {ip}\n    ports:\n"
        f"    - name: http\n      port: 80\n      protocol: TCP\n      targetPort: 8080\n"
        f"    selector:\n      app: {name}\n    sessionAffinity: None\n    type: ClusterIP\n"
        for i, (ns, name, ip) in enumerate(c.services)])


def endpointslices_yaml(c: Cluster) -> str:
    by_app: dict = {}
    for p in c.pods:
        by_app.setdefault((p["ns"], p["app"]), []).append(p)
    items = []
    for ns, name, _ in c.services:
        eps = "".join(
            f"  - addresses:\n    - {p['ip']}\n    conditions:\n      ready: true\n"
            f"    nodeName: {p['node']}\n    targetRef:\n      kind: Pod\n"
            f"      name: {p['name']}\n      namespace: {ns}\n"
            for p in by_app.get((ns, name), []))
        items.append(f"- addressType: IPv4\n  apiVersion: discovery.k8s.io/v1\n  endpoints:\n"
                     f"{eps}  kind: EndpointSlice\n  metadata:\n    labels:\n"
                     f"      kubernetes.io/service-name: {name}\n    name: {name}-abcde\n"
                     f"    namespace: {ns}\n  ports:\n  - name: http\n    port: 8080\n"
                     f"    protocol: TCP\n")
    return _list(items)


def networkpolicies_yaml(c: Cluster) -> str:
    items = []
    for ns in c.namespaces:
        if c.isolated(ns):
            items.append(f"- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n"
                         f"  metadata:\n    name: deny-ingress\n    namespace: {ns}\n"
                         f"  spec:\n    podSelector: {{}}\n    policyTypes:\n    - Ingress\n")
            items.append(f"- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n"
                         f"  metadata:\n    name: allow-same-namespace\n    namespace: {ns}\n"
                         f"  spec:\n    ingress:\n    - from:\n      - podSelector: {{}}\n"
                         f"    podSelector: {{}}\n    policyTypes:\n    - Ingress\n")
        if c.egress_limited(ns):
            items.append(f"- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n"
                         f"  metadata:\n    name: egress-same-namespace\n    namespace: {ns}\n"
                         f"  spec:\n    egress:\n    - to:\n      - podSelector: {{}}\n"
                         f"    - ports:\n      - port: 53\n        protocol: UDP\n"
                         f"    podSelector: {{}}\n    policyTypes:\n    - Egress\n")
    return _list(items)


def build(dest: Path, pods: int, services: int, nodes: int) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    c = Cluster(pods, services, nodes)
    (dest / "k8s").mkdir(parents=True)
    manifest = ["format: traceflow-bundle/v1", f"cluster: generated-{pods}p-{services}s-{nodes}n",
                'collected_at: "2020-09-21T11:30:00Z"', "cni: antrea", "cni_version: v0.10.0",
                "kube_proxy: iptables", "service_cidr: 10.96.0.0/12", "nodes:"]
    manifest += [f"  {n}: {{agent_pod: kube-system/antrea-agent-{c.node_index(n):05d}, "
                 "tunnel_dev: genev_sys_6081}" for n in c.nodes]
    (dest / "manifest.yaml").write_text("\n".join(manifest) + "\n")
    set_text = ipset(c)
    for n in c.nodes:
        d = dest / "nodes" / n
        d.mkdir(parents=True)
        (d / "ovs-flows.txt").write_text(ovs_flows(c, n))
        (d / "ovs-show.txt").write_text(ovs_show(c, n))
        (d / "ip-addr.txt").write_text(ip_addr(c, n))
        (d / "ip-route.txt").write_text(ip_route(c, n))
        (d / "ip-rule.txt").write_text("0:\tfrom all lookup local\n32766:\tfrom all lookup main\n"
                                       "32767:\tfrom all lookup default\n")
        (d / "ip-neigh.txt").write_text(ip_neigh(c, n))
        (d / "ipset.txt").write_text(set_text)
        (d / "iptables-save.txt").write_text(iptables_save(c, n))
    k8s = dest / "k8s"
    (k8s / "nodes.yaml").write_text(nodes_yaml(c))
    (k8s / "pods.yaml").write_text(pods_yaml(c))
    (k8s / "services.yaml").write_text(services_yaml(c))
    (k8s / "endpointslices.yaml").write_text(endpointslices_yaml(c))
    (k8s / "networkpolicies.yaml").write_text(networkpolicies_yaml(c))
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--pods", type=int, default=300)
    ap.add_argument("--services", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=3)
    a = ap.parse_args(argv)
    build(a.outdir, a.pods, a.services, a.nodes)
    print(a.outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
