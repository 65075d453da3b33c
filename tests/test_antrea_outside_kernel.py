"""AntreaProxy's and Egress's host side, the real kernel against `traceflow trace` itself.

For each node of examples/antrea-v2, a private "node" namespace is wired as the bundle says:
eth0 with the node's address to a "client" namespace (the router 192.168.77.1, holding the
outside client 203.0.113.7 and the outside server 1.1.1.1), antrea-gw0 with the gateway address
to an "ovs" namespace standing in for the OVS bridge (its side has Antrea's global virtual MAC
aa:bb:cc:dd:ee:ff and holds, as local addresses, everything the host hands to OVS: the virtual
NodePort IP 169.254.0.252, the LoadBalancer IPs, the Pods), the bundle's routes
(nodes/<node>/ip-route.txt, main table: 169.254.0.252 and the LoadBalancer IPs via
169.254.0.253 dev antrea-gw0 ...) and permanent neighbours, the Egress IP the node holds. The
node's ipsets (`ipset list` of ipset.txt, recreated) and iptables (`iptables-restore` of
iptables-save.txt) are loaded as they are.

The client sends TCP SYNs (scapy) to a NodePort and to a LoadBalancer IP; the "ovs" namespace
sends a Pod's SYN to 1.1.1.1:443 into antrea-gw0. What OVS would do is not the kernel's: the
Egress mark OVS sets in pkt_mark (EgressMark's set_field:0x1/0xff->pkt_mark) cannot cross a
namespace (the skb mark is scrubbed), so one test-only mangle rule stands in for it, set on
exactly the Pods traceflow says OVS marks. The kernel's answer is read back from conntrack's
NEW events (the node's: the DNAT/SNAT as a reply tuple, or no entry when untracked; the ovs
namespace's: what arrived at OVS; the client's: the source an outside server sees) and from
the reset the client (or the Pod) gets back (its source: the reply's un-NAT).

Each is compared with `traceflow trace ... -o json`: the packet its request leg hands to OVS
(after the host's DNAT, or untouched), the mark it leaves OVS with into the host, the address
it leaves the cluster with, and the address the reply leaves with.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from test_kernel_outside import _SENDER, _events
from test_netfilter_kernel import _run, _why_not_runnable
from traceflow.cli.app import app

V2 = Path(__file__).resolve().parents[1] / "traceflow" / "examples" / "antrea-v2"
CLIENT, SERVER, ROUTER = "203.0.113.7", "1.1.1.1", "192.168.77.1"
NODES = {"node1": ("192.168.77.102", "10.10.0.1", "192.168.77.112"),
         "node2": ("192.168.77.103", "10.10.1.1", "192.168.77.113")}
PEER_GATEWAY = {"node1": "10.10.1.1", "node2": "10.10.0.1"}
OVS_SIDE = ["169.254.0.252", "192.168.77.150", "192.168.77.151", "10.10.0.24", "10.10.0.25",
            "10.10.0.26", "10.10.1.6"]


@dataclass(frozen=True)
class Lab:
    name: str
    node: str
    client: str
    ovs: str


def _ipset_restore(text: str) -> str:
    """`ipset list` -> `ipset restore` input (create each set, add its members)."""
    out, current = [], None
    for block in text.strip().split("\n\n"):
        head = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        current = head["Name"]
        family = re.search(r"family (\S+)", head["Header"]).group(1)
        out.append(f"create {current} {head['Type']} family {family}")
        members = block.split("Members:")[1].split()
        out += [f"add {current} {m}" for m in members]
    return "\n".join(out) + "\n"


def _build(lab: Lab) -> None:
    node_ip, gw_ip, egress_ip = NODES[lab.name]
    d = V2 / "nodes" / lab.name
    main = []
    for line in (d / "ip-route.txt").read_text().splitlines():
        if line.startswith(("broadcast", "local", "multicast", "fe80", "::")) or ":" in line:
            continue
        if "proto kernel" in line:
            continue                      # made by the addresses below
        main.append("route add " + line)
    main.sort(key=lambda r: " via " in r)      # gateways' own routes (scope link) first
    neigh = [f"neigh replace {line.split()[0]} dev antrea-gw0 lladdr aa:bb:cc:dd:ee:ff nud permanent"
             for line in (d / "ip-neigh.txt").read_text().splitlines()
             if "dev antrea-gw0" in line]
    _run("ip", "-n", lab.node, "-batch", "-", stdin="\n".join([
        f"link add eth0 type veth peer name wan netns {lab.client}",
        f"link add antrea-gw0 type veth peer name gw netns {lab.ovs}",
        f"addr add {node_ip}/24 dev eth0", f"addr add {gw_ip}/24 dev antrea-gw0",
        f"addr add {egress_ip}/32 dev lo",          # antrea-egress0's (no dummy devices here)
        "link set lo up", "link set eth0 up", "link set antrea-gw0 up", *main, *neigh]) + "\n")
    _run("ip", "-n", lab.client, "-batch", "-", stdin="\n".join([
        f"addr add {ROUTER}/24 dev wan", f"addr add {CLIENT}/32 dev lo",
        f"addr add {SERVER}/32 dev lo", "link set lo up", "link set wan up",
        f"route add 192.168.77.150/32 via {node_ip}",     # the network hands the LB IPs
        f"route add 192.168.77.151/32 via {node_ip}"]) + "\n")   # to this node (--via)
    _run("ip", "-n", lab.ovs, "-batch", "-", stdin="\n".join(
        ["link set gw address aa:bb:cc:dd:ee:ff", "link set lo up", "link set gw up",
         f"route add {gw_ip}/32 dev gw", f"route add default via {gw_ip} dev gw"]
        # the peer Node's gateway: OVS's ARP responder answers for it (ARPResponder table)
        + [f"addr add {ip}/32 dev lo" for ip in OVS_SIDE + [PEER_GATEWAY[lab.name]]]) + "\n")
    off = [f"net.ipv4.conf.{x}.rp_filter=0" for x in ("all", "default")]
    _run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", *off, ns=lab.node)
    for ns in (lab.client, lab.ovs):
        _run("sysctl", "-q", "-w", *off, ns=ns)
        # a rule that needs conntrack: the kernel tracks connections in a namespace only then
        _run("nft", "-f", "-", ns=ns, stdin="table ip lab {\n chain pre {\n type filter hook "
             "prerouting priority 0; policy accept;\n ct state new counter\n }\n}\n")
    _run("ipset", "restore", ns=lab.node, stdin=_ipset_restore((d / "ipset.txt").read_text()))
    _run("iptables-restore", ns=lab.node, stdin=(d / "iptables-save.txt").read_text())


@pytest.fixture(scope="module", params=sorted(NODES))
def lab(request):
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:8]
    lab = Lab(request.param, f"tfa-{tag}-node", f"tfa-{tag}-client", f"tfa-{tag}-ovs")
    made = []
    try:
        for ns in (lab.node, lab.client, lab.ovs):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        _build(lab)
        yield lab
    finally:
        for ns in made:
            _run("ip", "netns", "del", ns, check=False)


@dataclass(frozen=True)
class Probe:
    src: str
    dst: str
    sport: int
    dport: int


def _send(ns: str, probes: list[Probe]) -> dict:
    done = _run(sys.executable, "-c", _SENDER, ns=ns, timeout=120,
                stdin=json.dumps([[dataclasses.asdict(p) for p in probes], 1.5]))
    lines = done.stdout.strip().splitlines()
    assert lines, f"the sender said nothing: {done.stderr}"
    return json.loads(lines[-1])


def _key(p: Probe) -> tuple:
    return ("tcp", p.src, p.sport, p.dst, p.dport)


@cache
def traced(*args: str) -> dict:
    result = CliRunner().invoke(app, ["trace", *args, "--bundle", str(V2), "-o", "json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def _request_hops(path: dict) -> list:
    return [h for leg in path["legs"] if leg["direction"] == "request" for h in leg["hops"]]


def _into_ovs(path: dict, node: str) -> dict:
    """The packet the host hands to OVS on ``node`` (the hop before the first OVS hop)."""
    seq = _request_hops(path)
    i = next(i for i, h in enumerate(seq) if h["component"] == "ovs" and h["node"] == node)
    return seq[i - 1]["packet"]


def _out_of_ovs(path: dict, node: str) -> dict:
    """The packet OVS hands to the host on ``node``: its last OVS hop before the host."""
    seq = _request_hops(path)
    last = max(i for i, h in enumerate(seq) if h["component"] == "ovs" and h["node"] == node)
    return seq[last]["packet"]


def _reply_left(path: dict) -> dict | None:
    """Where the reply left the cluster (None: no reply, e.g. a path dropped on the way)."""
    replies = [leg for leg in path["legs"] if leg["direction"] == "reply"]
    return replies[-1]["left_cluster"] if replies else None


# the questions each node answers from outside: (destination, extra args)
FRONTENDS = {"node1": [("192.168.77.102:30004", ()), ("192.168.77.102:30307", ()),
                       ("192.168.77.151:80", ("--via", "node1"))],
             "node2": [("192.168.77.103:30306", ()), ("192.168.77.150:80", ("--via", "node2"))]}
# the Pods whose packets leave the cluster by each node: (pod, its IP, the source traceflow
# starts from)
LEAVING = {"node1": [("default/web-7975b6c6c-8ltqd", "10.10.0.24"),
                     ("default/web-7975b6c6c-w9rfz", "10.10.1.6"),
                     ("default/db-755c6d9d8f-tpz4x", "10.10.0.25")],
           "node2": [("default/client-6c8b7d5d8f-hv2kw", "10.10.0.26")]}


def test_from_outside_the_host_dnats_or_leaves_untracked_as_traceflow_says(lab):
    node_ip = NODES[lab.name][0]
    probes, sport = [], 41000
    for dst, _ in FRONTENDS[lab.name]:
        ip, port = dst.split(":")
        probes.append(Probe(CLIENT, ip, sport, int(port)))
        sport += 1
    with _events(lab.node) as node_ct, _events(lab.ovs) as ovs_ct:
        answers = _send(lab.client, probes)
    for probe, (dst, extra) in zip(probes, FRONTENDS[lab.name]):
        doc = traced(CLIENT, dst, "--src-port", str(probe.sport), *extra)
        paths = [p for p in doc["paths"] if any(h["component"] == "ovs" and h["node"] == lab.name
                                                 for h in _request_hops(p))]
        assert paths, doc
        for path in paths:
            handed = _into_ovs(path, lab.name)
            # what reached the OVS side, as the kernel forwarded it
            arrived = [k for k in ovs_ct if k[1] == CLIENT and k[2] == probe.sport]
            assert arrived == [("tcp", handed["nw_src"], handed["tp_src"], handed["nw_dst"],
                                handed["tp_dst"])], (dst, arrived, handed)
            nat = node_ct.get(_key(probe))
            untracked = any("NOTRACK" in h["effect"] for h in _request_hops(path)
                            if h["node"] == lab.name)
            if untracked:                 # raw NOTRACK: the kernel has no entry at all
                assert nat is None, (dst, nat)
                assert handed["nw_dst"] == probe.dst
            else:                         # the DNAT is the reply tuple's source
                assert nat is not None and (nat[0], nat[2]) == (handed["nw_dst"], handed["tp_dst"])
                assert nat[1] == CLIENT   # no SNAT on the host
            # the OVS side's reset comes back un-NATed: the client sees the address it used
            answer = answers.get(f"{CLIENT}:{probe.sport}")
            assert answer and answer[0].startswith("tcp R"), answer
            left = _reply_left(path)
            if left is not None:          # a path whose reply leaves the cluster from here
                assert (left["src"], left["src_port"]) == (answer[1], answer[2])
                assert left["src"] in (probe.dst, node_ip)


def test_egress_snat_and_masquerade_match_the_kernel(lab):
    egress_ip = NODES[lab.name][2]
    probes, marked, docs = [], [], []
    for i, (pod, ip) in enumerate(LEAVING[lab.name]):
        doc = traced(pod, f"{SERVER}:443", "--src-port", str(42000 + i))
        (path,) = doc["paths"]
        out = _out_of_ovs(path, lab.name)
        assert out["nw_src"] == ip
        if out["mark"] & 0xFF:
            marked.append(ip)
        probes.append(Probe(ip, SERVER, 42000 + i, 443))
        docs.append(path)
    # OVS's pkt_mark, as traceflow says OVS sets it, stands in as a mangle rule (test only)
    for ip in marked:
        _run("iptables", "-t", "mangle", "-I", "PREROUTING", "-i", "antrea-gw0", "-s", ip,
             "-j", "MARK", "--set-xmark", "0x1/0xff", ns=lab.node)
    try:
        with _events(lab.node) as node_ct, _events(lab.client) as seen_outside:
            answers = _send(lab.ovs, probes)
    finally:
        for ip in marked:
            _run("iptables", "-t", "mangle", "-D", "PREROUTING", "-i", "antrea-gw0", "-s", ip,
                 "-j", "MARK", "--set-xmark", "0x1/0xff", ns=lab.node, check=False)
    for probe, path in zip(probes, docs):
        left = path["left_cluster"]
        assert path["disposition"] == "left-cluster" and left["node"] == lab.name
        outside = [k for k in seen_outside if k[3] == SERVER and k[2] == probe.sport]
        assert outside == [("tcp", left["src"], left["src_port"], SERVER, 443)], (probe, outside)
        reply = node_ct[_key(probe)]
        assert reply[1] == left["src"]            # the kernel's SNAT / masquerade target
        assert left["src"] == (egress_ip if probe.src in marked else NODES[lab.name][0])
        # the server's reset comes back to the Pod, un-SNATed by the node's conntrack
        answer = answers.get(f"{probe.src}:{probe.sport}")
        assert answer and answer[0].startswith("tcp R") and answer[1] == SERVER, (probe, answers, node_ct, seen_outside)
        reply_leg = [leg for leg in path["legs"] if leg["direction"] == "reply"][-1]
        assert reply_leg["hops"][-1]["packet"]["nw_dst"] == probe.src
    assert marked, "no Pod of this node is marked for Egress"
