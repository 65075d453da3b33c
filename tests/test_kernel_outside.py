"""Traffic from outside the cluster, the real kernel against `traceflow trace` itself.

A private "node" namespace is wired as node1 of the generated kube-proxy bundles is: ens192
192.168.10.11/24 to a "client" namespace (192.168.10.1, the node's default gateway, holding the
outside clients' addresses 203.0.113.7 and 192.0.2.9), antrea-gw0 10.244.1.1/24 to a "cni"
namespace standing in for Antrea's OVS bridge and tunnels (its side has Antrea's global
virtual MAC aa:bb:cc:dd:ee:ff, answers ARP for the pods by proxy ARP, and routes the pod
network to a "pods" namespace where every backend address is local), the bundle's routes
(`10.244.2.0/24 via 10.244.2.1 dev antrea-gw0 onlink` ...) and permanent neighbours. node1's
rules are loaded (`iptables-restore` of iptables-save.txt, then `nft -f` of nft.txt).

The client sends TCP SYNs (scapy) to a NodePort with `externalTrafficPolicy: Cluster`, to
NodePorts with `Local` on a node with and without a local endpoint, to a LoadBalancer IP (with
Cluster and Local policy) and to a LoadBalancer with loadBalancerSourceRanges, from an allowed
and a denied source. The kernel's answer is read back three ways: the node's conntrack (the
DNAT target; a reply tuple towards another address than the client is the masquerade, and that
address), the pods namespace's conntrack (where the SYN arrived and with which source: the SNAT
or its absence as the pod sees it), and the answer the client got (nothing, an ICMP error, or
the pod's reset, whose source must be the address the client talked to: the reply's un-NAT).

Each is compared with what `traceflow trace CLIENT DESTINATION --bundle ... -o json` reports:
its paths (one per branch) and their weights, each path's disposition, the packet its request
leg hands to the pod (DNAT target, source after SNAT) and the packet its reply leg leaves the
cluster with. The empirical endpoint distribution must fit the weights (chi-square, p = 1e-6).

IPVS cannot load in this kernel (no ip_vs module): the IPVS walk is checked against ipvsadm's
documented semantics instead (test_ipvs_*: masquerading forward of the virtual service's real
servers, rr as equal shares, a service without real servers answering ICMP port unreachable).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from test_netfilter_kernel import CHI2_CRITICAL, _run, _why_not_runnable
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))   # not installed
import generate_kube_proxy as gen  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
TRACEFLOW = [sys.executable, "-m", "traceflow"]
NODE, NODE_IP, GW_IP = "node1", "192.168.10.11", "10.244.1.1"
CLIENT, DENIED_CLIENT = "203.0.113.7", "192.0.2.9"
ROUTER = "192.168.10.1"
PACKETS = int(os.environ.get("TRACEFLOW_KERNEL_PACKETS", "200"))
REPLY_WAIT = 1.5


@cache
def cluster() -> gen.Cluster:
    return gen.build_cluster()


@dataclass(frozen=True)
class Case:
    name: str
    role: str                  # generate_kube_proxy.SCENARIOS role
    target: str                # "nodeport" | "lb"
    count: int
    source: str = CLIENT
    distribution: bool = False

    @property
    def service(self) -> gen.Service:
        return gen.scenario(cluster(), self.role)

    @property
    def destination(self) -> tuple[str, int]:
        svc = self.service
        port = svc.ports[0]
        return (NODE_IP, port.node_port) if self.target == "nodeport" else (svc.lb_ips[0],
                                                                             port.port)

    def command(self, mode: str) -> list[str]:
        ip, port = self.destination
        via = ["--via", NODE] if self.target == "lb" else []
        return ["trace", self.source, f"{ip}:{port}", *via, "--bundle",
                str(ROOT / f"kube-proxy-{mode}"), "-o", "json"]


CASES = [
    Case("nodeport-cluster", "nodeport", "nodeport", PACKETS, distribution=True),
    Case("nodeport-local-with-local-endpoint", "etp-local-with-local-endpoint", "nodeport", 20),
    Case("nodeport-local-without-local-endpoint", "etp-local-without-local-endpoint",
         "nodeport", 10),
    Case("loadbalancer-cluster", "loadbalancer", "lb", 60, distribution=True),
    Case("loadbalancer-local-without-local-endpoint", "loadbalancer-etp-local", "lb", 10),
    Case("lb-source-range-allowed", "lb-source-ranges", "lb", 30),
    Case("lb-source-range-denied", "lb-source-ranges", "lb", 10, source=DENIED_CLIENT),
]


# ---------------------------------------------------------------------------------------------
# The lab


@dataclass(frozen=True)
class Lab:
    node: str
    client: str
    cni: str
    pods: str


def _backend_ips() -> list[str]:
    return sorted({e.ip for case in CASES for e in case.service.endpoints})


@pytest.fixture(scope="module")
def lab():
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:8]
    lab = Lab(f"tfo-{tag}-node", f"tfo-{tag}-client", f"tfo-{tag}-cni", f"tfo-{tag}-pods")
    made = []
    try:
        for ns in dataclasses.astuple(lab):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        _build(lab)
        yield lab
    finally:
        for ns in made:
            _run("ip", "netns", "del", ns, check=False)


def _build(lab: Lab) -> None:
    node = [f"link add ens192 type veth peer name eth0 netns {lab.client}",
            f"link add antrea-gw0 type veth peer name gw netns {lab.cni}",
            f"addr add {NODE_IP}/24 dev ens192", f"addr add {GW_IP}/24 dev antrea-gw0",
            "link set lo up", "link set ens192 up", "link set antrea-gw0 up",
            # the bundle's routes (nodes/node1/ip-route.txt, main table) ...
            f"route add default via {ROUTER} dev ens192",
            "route add 10.244.2.0/24 via 10.244.2.1 dev antrea-gw0 onlink",
            "route add 10.244.3.0/24 via 10.244.3.1 dev antrea-gw0 onlink",
            # ... and its permanent neighbours (nodes/node1/ip-neigh.txt)
            "neigh replace 10.244.2.1 dev antrea-gw0 lladdr aa:bb:cc:dd:ee:ff nud permanent",
            "neigh replace 10.244.3.1 dev antrea-gw0 lladdr aa:bb:cc:dd:ee:ff nud permanent"]
    _run("ip", "-n", lab.node, "-batch", "-", stdin="\n".join(node) + "\n")
    _run("ip", "-n", lab.client, "-batch", "-", stdin="\n".join([
        f"addr add {ROUTER}/24 dev eth0", f"addr add {CLIENT}/32 dev lo",
        f"addr add {DENIED_CLIENT}/32 dev lo", "link set lo up", "link set eth0 up",
        f"route add 172.18.255.0/24 via {NODE_IP}"]) + "\n")
    _run("ip", "-n", lab.cni, "-batch", "-", stdin="\n".join([
        "link set gw address aa:bb:cc:dd:ee:ff", "addr add 169.254.1.2/32 dev gw",
        f"link add p0 type veth peer name eth0 netns {lab.pods}",
        "addr add 169.254.2.1/30 dev p0", "link set lo up", "link set gw up", "link set p0 up",
        f"route add {GW_IP}/32 dev gw", "route add 10.244.0.0/16 via 169.254.2.2 dev p0",
        f"route add default via {GW_IP} dev gw"]) + "\n")
    _run("ip", "-n", lab.pods, "-batch", "-", stdin="\n".join(
        ["addr add 169.254.2.2/30 dev eth0", "link set lo up", "link set eth0 up",
         "route add default via 169.254.2.1"]
        + [f"addr add {ip}/32 dev lo" for ip in _backend_ips()]) + "\n")
    off = [f"net.ipv4.conf.{d}.rp_filter=0" for d in ("all", "default")]
    _run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0",
         "net.ipv4.conf.all.send_redirects=0", *off, ns=lab.node)
    _run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv4.conf.gw.proxy_arp=1",
         *off, ns=lab.cni)
    _run("sysctl", "-q", "-w", *off, ns=lab.pods)
    # a rule that needs conntrack: the kernel tracks connections in a namespace only then
    _run("nft", "-f", "-", ns=lab.pods, stdin="table ip lab {\n chain pre {\n type filter hook "
         "prerouting priority 0; policy accept;\n ct state new counter\n }\n}\n")
    _run("sysctl", "-q", "-w", *off, ns=lab.client)


_SENDER = r"""
import json, sys
from scapy.all import ICMP, IP, TCP, conf, sr
from scapy.supersocket import L3RawSocket
conf.L3socket = L3RawSocket
conf.verb = 0
probes, wait = json.load(sys.stdin)
packets = [IP(src=p["src"], dst=p["dst"], ttl=64) / TCP(sport=p["sport"], dport=p["dport"],
                                                         flags="S", seq=1000) for p in probes]
answered, _ = sr(packets, timeout=wait, verbose=0)
out = {}
for sent, got in answered:
    key = "%s:%d" % (sent[IP].src, sent.sport)
    if ICMP in got:
        out[key] = ["icmp %d/%d" % (got[ICMP].type, got[ICMP].code), got[IP].src, None]
    elif TCP in got:
        out[key] = ["tcp " + str(got[TCP].flags), got[IP].src, got[TCP].sport]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Probe:
    case: str
    src: str
    dst: str
    sport: int
    dport: int


def probes() -> dict[str, list[Probe]]:
    out, sport = {}, 30000
    for case in CASES:
        ip, port = case.destination
        out[case.name] = [Probe(case.name, case.source, ip, sport + i, port)
                          for i in range(case.count)]
        sport += case.count
    return out


_TUPLE = re.compile(r"src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)")


@contextlib.contextmanager
def _events(ns: str):
    """conntrack's NEW events in ``ns`` while the block runs: (proto, src, sport, dst, dport)
    of each new connection -> its reply tuple (src, dst, sport, dport)."""
    entries: dict = {}
    proc = subprocess.Popen(["ip", "netns", "exec", ns, "conntrack", "-E", "-e", "NEW", "-o",
                             "extended"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(0.5)                 # subscribed before the first packet
    try:
        yield entries
        time.sleep(0.5)             # the last events are read
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    for line in out.splitlines():
        fields = line.split()
        tuples = _TUPLE.findall(line)
        if len(tuples) < 2 or "tcp" not in fields:
            continue
        (src, dst, sport, dport), reply = tuples[0], tuples[1]
        entries[("tcp", src, int(sport), dst, int(dport))] = (reply[0], reply[1], int(reply[2]),
                                                               int(reply[3]))


# one connection as the kernel treated it: (verdict, DNAT target "ip:port", the source the pod
# saw, the answer's source "ip:port" (the pod's reset) or the ICMP error)
Outcome = tuple[str, str | None, str | None, str | None]


def _kernel(p: Probe, node_ct: dict, pod_ct: dict, answers: dict) -> Outcome:
    reply = node_ct.get(("tcp", p.src, p.sport, p.dst, p.dport))
    answer = answers.get(f"{p.src}:{p.sport}")
    if reply is None:
        if answer and answer[0] == "icmp 3/3":
            return "REJECT", None, None, None
        assert answer is None, f"{p}: unexpected answer {answer}"
        return "DROP", None, None, None
    rsrc, rdst, rsport, _ = reply
    dnat = f"{rsrc}:{rsport}"
    seen = next((src for (proto, src, _sp, dst, dport) in pod_ct
                 if proto == "tcp" and dst == rsrc and dport == rsport
                 and src == rdst), None)
    assert seen is not None, f"{p}: the node forwarded it but nothing arrived at {dnat}"
    assert answer is not None and answer[0].startswith("tcp R"), f"{p}: no reset back: {answer}"
    return "ACCEPT", dnat, seen, f"{answer[1]}:{answer[2]}"


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def kernel(request, lab):
    """Load one mode's rules into the node, send every case, read what the kernel did."""
    mode = request.param
    _run("nft", "flush", "ruleset", ns=lab.node)
    for ns in (lab.node, lab.pods):
        _run("conntrack", "-F", ns=ns, check=False)
    if mode == "iptables":
        _run("iptables-restore", ns=lab.node,
             stdin=(ROOT / "kube-proxy-iptables/nodes/node1/iptables-save.txt").read_text())
    else:
        _run("nft", "-f", "-", ns=lab.node,
             stdin=(ROOT / "kube-proxy-nftables/nodes/node1/nft.txt").read_text())
    batches = probes()
    # the pod's reset ends each connection and the kernel forgets it at once: conntrack's
    # NEW events are read as they happen instead of listing the table afterwards
    with _events(lab.node) as node_ct, _events(lab.pods) as pod_ct:
        done = _run(sys.executable, "-c", _SENDER, ns=lab.client, timeout=180,
                    stdin=json.dumps([[dataclasses.asdict(p) for c in CASES
                                       for p in batches[c.name]], REPLY_WAIT]))
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = {name: [_kernel(p, node_ct, pod_ct, answers) for p in batch]
                for name, batch in batches.items()}
    yield mode, outcomes
    _run("nft", "flush", "ruleset", ns=lab.node)


# ---------------------------------------------------------------------------------------------
# traceflow's answer, from the command itself


@cache
def traceflow(mode: str, case_name: str) -> dict:
    case = next(c for c in CASES if c.name == case_name)
    done = subprocess.run(TRACEFLOW + case.command(mode), capture_output=True, text=True,
                          timeout=120, cwd=ROOT.parent.parent,
                          env=dict(os.environ, TRACEFLOW_NO_INDEX="1"))
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def _legs(path: dict, direction: str) -> list:
    return [leg for leg in path["legs"] if leg["direction"] == direction]


def _handed_over(path: dict) -> dict:
    """The packet the request leg hands to the pod (its last hop with a packet)."""
    hops = [h for leg in _legs(path, "request") for h in leg["hops"] if h.get("packet")]
    return hops[-1]["packet"]


VERDICT_OF = {"delivered-pod": "ACCEPT", "dropped-rule": "DROP", "rejected": "REJECT"}


def predicted(doc: dict) -> dict[Outcome, float]:
    """traceflow's paths as kernel outcomes, with their weights."""
    out: dict = defaultdict(float)
    for path in doc["paths"]:
        verdict = VERDICT_OF[path["disposition"]]
        if verdict != "ACCEPT":
            out[(verdict, None, None, None)] += path["weight"]
            continue
        pkt = _handed_over(path)
        reply = _legs(path, "reply")[-1]
        assert reply["disposition"] == "left-cluster", reply
        left = reply["left_cluster"]
        assert left["dst"] == doc["query"]["source_endpoint"]["address"]
        out[("ACCEPT", f"{pkt['nw_dst']}:{pkt['tp_dst']}", pkt["nw_src"],
             f"{left['src']}:{left['src_port']}")] += path["weight"]
    return dict(out)


def _show(outcomes) -> str:
    return "; ".join(f"{o}: {w:.3g}" for o, w in sorted(outcomes.items(), key=str))


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_outside_client_matches_the_kernel(kernel, case):
    mode, outcomes = kernel
    seen = Counter(outcomes[case.name])
    assert sum(seen.values()) == case.count
    doc = traceflow(mode, case.name)
    assert doc["query"]["source_endpoint"]["kind"] == "external"
    assert doc["query"]["destination_endpoint"]["frontend"] == (
        "nodeport" if case.target == "nodeport" else "loadbalancer")
    want = predicted(doc)
    assert abs(sum(want.values()) - 1.0) < 1e-5, _show(want)     # weights are rounded to 6 places
    strays = {o: n for o, n in seen.items() if want.get(o, 0) <= 0}
    assert not strays, f"{mode}: the kernel did {strays}; traceflow says {_show(want)}"
    if case.distribution:
        assert len(seen) == len(want) > 1, f"{mode}: kernel {dict(seen)} vs {_show(want)}"
        total = sum(seen.values())
        stat = sum((seen.get(o, 0) - total * w) ** 2 / (total * w) for o, w in want.items())
        assert stat < CHI2_CRITICAL[len(want) - 1], (
            f"{mode}: kernel distribution {dict(seen)} does not fit {_show(want)} "
            f"(chi-square {stat:.1f})")
    elif case.count >= 20:
        assert set(seen) == set(want), f"{mode}: kernel {dict(seen)} vs {_show(want)}"


def test_cluster_policy_masquerades_and_local_policy_keeps_the_client(kernel):
    """The SNAT or its absence, as the pod sees it: Cluster masquerades to antrea-gw0's
    address (the output interface's, MASQUERADE), Local keeps the client's address; the reply
    always comes back from the address the client talked to."""
    mode, outcomes = kernel
    for name, source_seen in (("nodeport-cluster", GW_IP),
                              ("nodeport-local-with-local-endpoint", CLIENT)):
        case = next(c for c in CASES if c.name == name)
        ip, port = case.destination
        for verdict, _, seen, answer in outcomes[name]:
            assert (verdict, seen, answer) == ("ACCEPT", source_seen, f"{ip}:{port}"), mode
        for path in traceflow(mode, name)["paths"]:
            assert _handed_over(path)["nw_src"] == source_seen
            masq = [h for leg in _legs(path, "request") for h in leg["hops"]
                    if "MASQUERADE" in h["effect"]]
            assert bool(masq) == (source_seen == GW_IP), mode


def test_local_policy_without_a_local_endpoint_is_dropped_naming_the_rule(kernel):
    mode, outcomes = kernel
    name = "nodeport-local-without-local-endpoint"
    assert set(outcomes[name]) == {("DROP", None, None, None)}
    (path,) = traceflow(mode, name)["paths"]
    assert path["disposition"] == "dropped-rule" and path["verdict"] == "dropped"
    # iptables: KUBE-EXTERNAL-SERVICES' rule for it (proxier.go writes "has no local
    # endpoints"); nftables: the no-endpoint-nodeports verdict map of filter-input
    rule = path["drop"]["rule"]
    assert ("has no local endpoints" in rule if mode == "iptables"
            else "@no-endpoint-nodeports" in rule), rule
    assert path["drop"]["node"] == NODE


# ---------------------------------------------------------------------------------------------
# IPVS: no ip_vs module here; the walk against ipvsadm's semantics


def _ipvs(case: Case) -> dict:
    return traceflow("ipvs", case.name)


def _virtual_service(ip: str, port: int) -> list[str]:
    """The real servers ipvsadm -Ln lists under ``TCP ip:port`` in node1's ipvs.txt."""
    lines = (ROOT / "kube-proxy-ipvs/nodes/node1/ipvs.txt").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(f"TCP  {ip}:{port} "))
    out = []
    for line in lines[head + 1:]:
        if not line.startswith("  ->"):
            break
        out.append(line.split()[1])
    return out


def test_ipvs_nodeport_cluster_balances_over_the_real_servers_and_masquerades():
    """ipvsadm: `rr` gives each real server of the virtual service 192.168.10.11:NODEPORT an
    equal share, forward `Masq` DNATs to it; kube-proxy's KUBE-NODE-PORT marks the packet and
    KUBE-POSTROUTING masquerades; the reply is un-NATed back to the NodePort."""
    case = next(c for c in CASES if c.name == "nodeport-cluster")
    ip, port = case.destination
    servers = _virtual_service(ip, port)
    doc = _ipvs(case)
    got = predicted(doc)
    assert sorted(o[1] for o in got) == sorted(servers)
    assert all(abs(w - 1 / len(servers)) < 1e-6 for w in got.values())
    assert {o[2] for o in got} == {GW_IP} and {o[3] for o in got} == {f"{ip}:{port}"}
    assert all(any(h["component"] == "ipvs" and h.get("detail") == "ipvs"
                   for leg in p["legs"] for h in leg["hops"]) for p in doc["paths"])


def test_ipvs_local_policy_keeps_the_client_and_without_endpoint_rejects():
    """ETP Local: kube-proxy lists only local endpoints as real servers and returns from
    KUBE-NODE-PORT before the masquerade mark (KUBE-NODE-PORT-LOCAL-TCP); a virtual service
    without real servers makes IPVS answer ICMP port unreachable (ip_vs_leave)."""
    local = next(c for c in CASES if c.name == "nodeport-local-with-local-endpoint")
    got = predicted(_ipvs(local))
    ip, port = local.destination
    assert sorted(o[1] for o in got) == sorted(_virtual_service(ip, port))
    assert {o[2] for o in got} == {CLIENT}
    none = next(c for c in CASES if c.name == "nodeport-local-without-local-endpoint")
    ip, port = none.destination
    assert _virtual_service(ip, port) == []
    (path,) = _ipvs(none)["paths"]
    assert path["disposition"] == "rejected" and path["drop"]["component"] == "ipvs"
