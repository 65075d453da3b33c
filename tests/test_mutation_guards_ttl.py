"""The TTL of every host hop, against the kernel of a namespace router.

Three namespaces: a client (10.10.1.2), a router "r" (10.10.1.1 on vc, 10.10.2.1 on vs,
forwarding on) and a server (10.10.2.2). The router's iptables mark packets in mangle
PREROUTING and FORWARD and masquerade them in nat POSTROUTING, so that traceflow shows the
packet at each of those hooks. An nftables table of the router's and the server's own (not in
the bundle) counts the packets by TTL at every hook: that is the kernel's answer, together
with the TTL the server receives.

traceflow's bundle is what the router's kernel prints (`ip addr`, `ip route show table all`,
`ip rule`, `ip neigh`, `iptables-save`), plus an OVS bridge with only Antrea's gateway port
(the lab has no OVS). Two walks, each compared hop by hop with the kernel:

* a datagram the client sends through the router (traceflow's host walk from ``vc``): TTL 64
  at PREROUTING, 63 from the forwarding decision on (FORWARD, POSTROUTING, the neighbour hop),
  and 63 at the server;
* a datagram a hostNetwork pod of the router sends (``pod-to-pod`` from it): 64 everywhere,
  the node's own packets are not forwarded.
"""

from __future__ import annotations

import re
import sys

import pytest

from host_walk import request_hops, walk_from_host
from kernel_lab import Namespaces, run, traceflow_json, why_not, write_bundle
from traceflow.model.packet import Packet

PORT = 9999
OVS_SHOW = """\
OFPT_FEATURES_REPLY (xid=0x2): dpid:0000000000000001
n_tables:254, n_buffers:0
capabilities: FLOW_STATS TABLE_STATS PORT_STATS QUEUE_STATS ARP_MATCH_IP
actions: output enqueue set_vlan_vid set_vlan_pcp strip_vlan mod_dl_src mod_dl_dst mod_nw_src mod_nw_dst mod_nw_tos mod_tp_src mod_tp_dst
 2(antrea-gw0): addr:02:00:00:00:00:02
     config:     0
     state:      0
     speed: 0 Mbps now, 0 Mbps max
"""
PODS = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: agent, namespace: lab}
  spec: {hostNetwork: true, nodeName: r, containers: [{name: agent, image: agent}]}
  status: {phase: Running, podIP: 10.10.1.1, hostIP: 10.10.1.1}
- apiVersion: v1
  kind: Pod
  metadata: {name: server, namespace: lab}
  spec: {nodeName: s, containers: [{name: server, image: server}]}
  status: {phase: Running, podIP: 10.10.2.2, hostIP: 10.10.2.2}
"""
NODES = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: r}
  spec: {}
  status: {addresses: [{type: InternalIP, address: 10.10.1.1}]}
"""
RULES = f"""\
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -p udp -m udp --dport {PORT} -j MARK --set-xmark 0x1/0x1
-A FORWARD -p udp -m udp --dport {PORT} -j MARK --set-xmark 0x2/0x2
-A OUTPUT -p udp -m udp --dport {PORT} -j MARK --set-xmark 0x4/0x4
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -o vs -p udp -m udp --dport {PORT} -j MASQUERADE
COMMIT
"""
TTLS = (62, 63, 64)


def _counting_table(hooks: tuple[str, ...]) -> str:
    """nft: one chain per hook, one counter per TTL, for this test's datagrams only."""
    chains = []
    for hook in hooks:
        rules = "\n".join(f"        udp dport {PORT} ip ttl {t} counter" for t in TTLS)
        chains.append(f"    chain {hook} {{\n        type filter hook {hook} priority -400;\n"
                      f"{rules}\n    }}")
    return "table ip ttlobs {\n" + "\n".join(chains) + "\n}\n"


def kernel_ttls(ns: str) -> dict[str, int]:
    """hook -> the TTL the test's datagram had there (exactly one counter per hook moved)."""
    out, chain = {}, None
    for line in run("nft", "list", "table", "ip", "ttlobs", ns=ns).stdout.splitlines():
        m = re.match(r"\s*chain (\w+)", line)
        if m:
            chain = m.group(1)
        m = re.search(r"ip ttl (\d+) counter packets (\d+)", line)
        if m and int(m.group(2)):
            assert chain not in out, f"{chain}: datagrams with several TTLs"
            out[chain] = int(m.group(1))
    run("nft", "delete", "table", "ip", "ttlobs", ns=ns)
    return out


def observe(lab: dict) -> None:
    """Fresh counters in the router and the server (they are not in the bundle)."""
    run("nft", "-f", "-", ns=lab["r"], stdin=_counting_table(
        ("prerouting", "forward", "output", "postrouting")))
    run("nft", "-f", "-", ns=lab["server"], stdin=_counting_table(("prerouting",)))


_SEND = ("import socket,sys; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); "
         "s.setsockopt(socket.IPPROTO_IP,socket.IP_TTL,64); "
         f"s.sendto(b'ttl',(sys.argv[1],{PORT}))")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = why_not("nft", "iptables-restore", "iptables-save")
    if reason:
        pytest.skip(reason)
    with Namespaces("client", "r", "server") as ns:
        c, r, s = ns["client"], ns["r"], ns["server"]
        run("ip", "-n", r, "-batch", "-", stdin=(
            f"link add vc type veth peer name eth0 netns {c}\n"
            f"link add vs type veth peer name eth0 netns {s}\n"
            "link set lo up\nlink set vc up\nlink set vs up\n"
            "addr add 10.10.1.1/24 dev vc\naddr add 10.10.2.1/24 dev vs\n"))
        for name, addr, gw in ((c, "10.10.1.2/24", "10.10.1.1"), (s, "10.10.2.2/24", "10.10.2.1")):
            run("ip", "-n", name, "-batch", "-", stdin=(
                f"link set lo up\nlink set eth0 up\naddr add {addr} dev eth0\n"
                f"route add default via {gw}\n"))
        run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", ns=r)
        server_mac = run("cat", "/sys/class/net/eth0/address", ns=s).stdout.strip()
        run("ip", "neigh", "replace", "10.10.2.2", "dev", "vs", "lladdr", server_mac,
            "nud", "permanent", ns=r)
        run("iptables-restore", ns=r, stdin=RULES)
        files = {"ip-addr.txt": run("ip", "addr", "show", ns=r).stdout,
                 "ip-route.txt": run("ip", "route", "show", "table", "all", ns=r).stdout,
                 "ip-rule.txt": run("ip", "rule", "show", ns=r).stdout,
                 "ip-neigh.txt": run("ip", "neigh", "show", ns=r).stdout,
                 "iptables-save.txt": run("iptables-save", ns=r).stdout,
                 "ovs-show.txt": OVS_SHOW, "ovs-flows.txt": ""}
        bundle = write_bundle(tmp_path_factory.mktemp("ttl") / "b", "r", files, cni="antrea")
        (bundle / "k8s").mkdir()
        (bundle / "k8s" / "pods.yaml").write_text(PODS)
        (bundle / "k8s" / "nodes.yaml").write_text(NODES)
        yield {"client": c, "r": r, "server": s, "bundle": bundle}


def _hook_of(hop: dict) -> str | None:
    """The netfilter hook an iptables hop ran at (its built-in chain), else None."""
    if hop["component"] != "iptables":
        return None
    return {"PREROUTING": "prerouting", "FORWARD": "forward", "OUTPUT": "output",
            "POSTROUTING": "postrouting"}.get(hop["chain"])


def _assert_hops_have_kernel_ttls(doc: dict, router: dict, server: int, first_ttl: int):
    (path,) = doc["paths"]
    hops = request_hops(path)
    seen = [(h["component"], h.get("chain"), h["packet"]["nw_ttl"]) for h in hops
            if h["packet"] is not None]
    shown = ", ".join(f"{c}{'/' + ch if ch else ''}: TTL {t}" for c, ch, t in seen)
    assert hops[0]["packet"] is None or hops[0]["packet"]["nw_ttl"] == first_ttl, shown
    checked = set()
    for hop in hops:
        hook = _hook_of(hop)
        if hook is not None and hop["packet"] is not None:
            assert hop["packet"]["nw_ttl"] == router[hook], (
                f"{hop['table']}/{hop['chain']}: traceflow TTL {hop['packet']['nw_ttl']}, the "
                f"kernel's {router[hook]} ({shown})")
            checked.add(hook)
    (neigh,) = [h for h in hops if h["component"] == "neigh"]
    assert neigh["packet"]["nw_ttl"] == router["postrouting"] == server, (
        f"leaving the router: traceflow TTL {neigh['packet']['nw_ttl']}, the kernel's "
        f"{router['postrouting']}, the server received {server} ({shown})")
    assert path["drop"]["component"] == "underlay", path["drop"]
    return checked


def test_a_forwarded_packet_loses_one_ttl_at_the_forwarding_decision(lab):
    observe(lab)
    run(sys.executable, "-c", _SEND, "10.10.2.2", ns=lab["client"])
    router, server = kernel_ttls(lab["r"]), kernel_ttls(lab["server"])
    assert router == {"prerouting": 64, "forward": 63, "postrouting": 63}, router
    assert server == {"prerouting": 63}, server
    doc = walk_from_host(lab["bundle"], "r", "vc", Packet(
        nw_src="10.10.1.2", nw_dst="10.10.2.2", nw_proto=17, tp_src=40000, tp_dst=PORT,
        nw_ttl=64))
    checked = _assert_hops_have_kernel_ttls(doc, router, server["prerouting"], 64)
    assert checked == {"prerouting", "forward", "postrouting"}, checked


def test_a_packet_the_node_sends_keeps_its_ttl(lab):
    observe(lab)
    run(sys.executable, "-c", _SEND, "10.10.2.2", ns=lab["r"])
    router, server = kernel_ttls(lab["r"]), kernel_ttls(lab["server"])
    assert router == {"output": 64, "postrouting": 64}, router
    assert server == {"prerouting": 64}, server
    doc = traceflow_json("pod-to-pod", "lab/agent", "lab/server", "--port", str(PORT),
                         "--protocol", "udp", "--no-reply", "--bundle", str(lab["bundle"]))
    checked = _assert_hops_have_kernel_ttls(doc, router, server["prerouting"], 64)
    assert checked == {"output", "postrouting"}, checked
