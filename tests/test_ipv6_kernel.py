"""The real kernel is the reference for IPv6 netfilter and NAT: ip6tables and the nftables ip6
and inet families, loaded into network namespaces, against traceflow's walk of the same rules.

kube-proxy's IPv6 rules: the dual-stack example bundle (tools/generate_kube_proxy.py,
kube_proxy_gen/dualstack.py) in iptables and nftables mode, node1's ``ip6tables-save.txt`` /
``nft.txt`` loaded into a private "node" namespace wired as node1 is in IPv6: 2001:db8:10::11
on ens192 (a veth to a "client" namespace), antrea-gw0's fd00:10:244:1::1 towards a sink that
stands for a local pod, and the other nodes' pod CIDRs routed to two more sinks. Crafted IPv6
TCP SYNs and UDP datagrams (scapy) hit a ClusterIP, a NodePort, a LoadBalancer IP, an
externalIP, externalTrafficPolicy Local NodePorts with and without a local endpoint,
loadBalancerSourceRanges and Services without endpoints, from a client, from a pod and from
the node itself. ``conntrack -L -f ipv6`` says what the kernel did (the reply tuple gives the
DNAT target and whether the source was masqueraded); an ICMPv6 port unreachable seen by the
sender is a REJECT, no answer a DROP. traceflow's prediction is its own host walk of the same
bundle (tests/host_walk.py): every kernel outcome must be among its branches, the branch
weights must be the shares the loaded rules give (read back from the kernel), and the
kernel's draws must fit them (chi-square, p = 1e-6).

A hand-written ``inet`` ruleset (filter and nat in one table for both families, ICMPv6 types,
the flow label, ``dnat ip6 to``, ``snat ip6 to``, ``masquerade``) is checked the same way,
packet by packet; the generated files must be what the kernel prints back (ip6tables-save,
nft list ruleset, ipset list with family inet6 sets).

Only the namespaces created here get traffic; they are deleted at teardown.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from host_walk import request_hops, walk_from_host, walk_from_pod
from kernel_lab import run, why_not
from traceflow.bundle.reader import Bundle
from traceflow.cni import open_snapshot
from traceflow.model.packet import Packet

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))   # not installed
import generate_kube_proxy as gen  # noqa: E402
from kube_proxy_gen import dualstack as ds  # noqa: E402

PACKETS = 80
NODE = "node1"
NODE_IP = "2001:db8:10::11"
CLIENT_IP = "2001:db8:10::100"
POD_IP = "fd00:10:244:1::77"          # a pod on node1 (the local sink namespace)
REPLY_WAIT = 1.0
CHI2_CRITICAL = {1: 23.928, 2: 27.631, 3: 30.665, 4: 33.377, 5: 35.888}  # p = 1e-6, as
# tests/test_netfilter_kernel.py (which says why)
# the node namespace: interface -> (node address, subnet behind it, its sink's address)
LINKS = {"gw1": ("fd00:10:244:1::1/64", "fd00:10:244:1::/64", f"{POD_IP}/64"),
         "gw2": ("fd00:172:31:2::1/64", "fd00:10:244:2::/64", "fd00:172:31:2::2/64"),
         "gw3": ("fd00:172:31:3::1/64", "fd00:10:244:3::/64", "fd00:172:31:3::2/64")}
NODE_POD = "kube-system/kube-apiserver-node1"     # the node's own stack: a hostNetwork pod
IIF = {"client": "ens192", "pod": "antrea-gw0"}

Outcome = tuple   # (verdict, DNAT target "[ip]:port" or None, masqueraded?)


# ---------------------------------------------------------------------------------------------
# The bundles and the lab


@cache
def dual() -> ds.DualCluster:
    return ds.build_dualstack()


@cache
def bundle_dir(mode: str) -> Path:
    """The dual-stack bundle of ``mode``: the shipped one (iptables), else generated."""
    if mode == gen.DUALSTACK_SHIPPED:
        return Path(__file__).resolve().parents[1] / "traceflow" / "examples" / \
            "kube-proxy-dualstack"
    import tempfile
    root = Path(tempfile.mkdtemp(prefix="tf-dualstack-"))
    gen._write(root, gen.dualstack_bundle_files(mode, dual()), {})
    return root


@cache
def snapshot(mode: str):
    return open_snapshot(Bundle.open(bundle_dir(mode)))


def node_file(mode: str, name: str) -> str:
    return (bundle_dir(mode) / "nodes" / NODE / name).read_text()


@dataclass(frozen=True)
class Lab:
    node: str
    client: str
    sinks: dict


@pytest.fixture(scope="module")
def lab():
    reason = why_not("ip6tables-restore", "ip6tables-save", "nft", "conntrack")
    if reason:
        pytest.skip(reason)
    try:
        import scapy  # noqa: F401
    except ImportError:
        pytest.skip("scapy is not installed")
    tag = uuid.uuid4().hex[:8]
    lab = Lab(f"tf6-{tag}-node", f"tf6-{tag}-client",
              {dev: f"tf6-{tag}-sink{dev[-1]}" for dev in LINKS})
    made = []
    try:
        for ns in (lab.node, lab.client, *lab.sinks.values()):
            run("ip", "netns", "add", ns)
            made.append(ns)
        _build(lab)
        yield lab
    finally:
        for ns in made:
            run("ip", "netns", "del", ns, check=False)


def _build(lab: Lab) -> None:
    quiet = ["net.ipv6.conf.all.accept_ra=0", "net.ipv6.conf.default.accept_ra=0",
             "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"]
    for ns in (lab.node, lab.client, *lab.sinks.values()):
        run("sysctl", "-q", "-w", *quiet, ns=ns)
    node = [f"link add ens192 type veth peer name eth0 netns {lab.client}",
            f"addr add {NODE_IP}/64 dev ens192 nodad", "link set lo up", "link set ens192 up"]
    for dev, (address, subnet, sink) in LINKS.items():
        node += [f"link add {dev} type veth peer name eth0 netns {lab.sinks[dev]}",
                 f"addr add {address} dev {dev} nodad", f"link set {dev} up"]
        if dev != "gw1":
            node.append(f"route add {subnet} via {sink.split('/')[0]} dev {dev}")
    node.append(f"route add default via {CLIENT_IP} dev ens192")
    run("ip", "-n", lab.node, "-batch", "-", stdin="\n".join(node) + "\n")
    run("ip", "-n", lab.client, "-batch", "-", stdin=(
        f"addr add {CLIENT_IP}/64 dev eth0 nodad\nlink set lo up\nlink set eth0 up\n"
        f"route add default via {NODE_IP}\n"))
    for dev, (address, _, sink) in LINKS.items():
        run("ip", "-n", lab.sinks[dev], "-batch", "-", stdin=(
            f"addr add {sink} dev eth0 nodad\nlink set lo up\nlink set eth0 up\n"
            f"route add default via {address.split('/')[0]}\n"))
    run("sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1", "net.ipv6.icmp.ratelimit=0",
        ns=lab.node)


# ---------------------------------------------------------------------------------------------
# The cases: the IPv6 twins of tests/test_netfilter_kernel.py's


@dataclass(frozen=True)
class Case:
    name: str
    role: str
    target: str                     # cluster | nodeport | lb | external
    count: int
    sources: tuple = (CLIENT_IP,)
    sender: str = "client"          # client | pod | node
    distribution: bool = False

    @property
    def service(self):
        return next(s for s in dual().v6.services if s.role == self.role)

    @property
    def port(self):
        return self.service.ports[0]

    @property
    def proto(self) -> str:
        return self.port.protocol.lower()

    @property
    def destination(self) -> tuple:
        svc, port = self.service, self.port
        return {"cluster": (svc.cluster_ip, port.port), "nodeport": (NODE_IP, port.node_port),
                "lb": (svc.lb_ips[0] if svc.lb_ips else "", port.port),
                "external": (svc.external_ips[0] if svc.external_ips else "", port.port)
                }[self.target]


SMALL = 16
CASES = [
    Case("clusterip-3-endpoints", "clusterip-3-endpoints", "cluster", PACKETS,
         distribution=True),
    Case("clusterip-from-a-pod", "clusterip-3-endpoints", "cluster", SMALL, (POD_IP,), "pod"),
    Case("udp-dns", "udp-dns", "cluster", PACKETS // 2, distribution=True),
    Case("nodeport-5-endpoints", "nodeport", "nodeport", PACKETS, distribution=True),
    Case("loadbalancer-ip", "loadbalancer", "lb", SMALL),
    Case("external-ip", "external-ip", "external", SMALL),
    Case("etp-local-nodeport-with-local-endpoint", "etp-local-with-local-endpoint", "nodeport",
         SMALL),
    Case("etp-local-nodeport-without-local-endpoint", "etp-local-without-local-endpoint",
         "nodeport", 6),
    Case("lb-source-range-allowed", "lb-source-ranges", "lb", SMALL, ("2001:db8:5100::77",)),
    Case("lb-source-range-denied", "lb-source-ranges", "lb", 6),
    Case("clusterip-from-the-node", "clusterip-3-endpoints", "cluster", SMALL, (NODE_IP,),
         "node"),
    Case("no-endpoints-cluster-ip", "no-endpoints", "cluster", 4),
    Case("no-endpoints-nodeport", "nodeport-no-endpoints", "nodeport", 4),
]


@dataclass(frozen=True)
class Probe:
    case: str
    src: str
    dst: str
    proto: str
    sport: int
    dport: int


def probes() -> dict:
    out, sport = {}, 30000
    for case in CASES:
        dst, dport = case.destination
        out[case.name] = []
        for i in range(case.count):
            out[case.name].append(Probe(case.name, case.sources[i % len(case.sources)], dst,
                                        case.proto, sport, dport))
            sport += 1
    return out


_SENDER = r"""
import json, sys
from scapy.all import IPv6, TCP, UDP, conf
from scapy.layers.inet6 import ICMPv6DestUnreach
from scapy.supersocket import L3RawSocket6
conf.L3socket6 = L3RawSocket6
conf.verb = 0
probes, wait = json.load(sys.stdin)
packets = []
for p in probes:
    l4 = (TCP(sport=p["sport"], dport=p["dport"], flags="S", seq=1000) if p["proto"] == "tcp"
          else UDP(sport=p["sport"], dport=p["dport"]) / b"traceflow")
    packets.append(IPv6(src=p["src"], dst=p["dst"], hlim=64, fl=p.get("fl", 0)) / l4)
# through the raw IPv6 socket, so the node's own packets take its OUTPUT path (sr() alone
# picks a link-layer socket for IPv6 and would skip the sender's own stack)
sock = L3RawSocket6()
answered, _ = sock.sr(packets, timeout=wait, verbose=0)
sock.close()
out = {}
for sent, got in answered:
    key = "%s:%d" % (sent[IPv6].src, sent.sport)
    if ICMPv6DestUnreach in got:
        out[key] = "icmp6 %d/%d" % (got[ICMPv6DestUnreach].type, got[ICMPv6DestUnreach].code)
    elif TCP in got:
        out[key] = "tcp " + str(got[TCP].flags)
    else:
        out[key] = "other"
print(json.dumps(out))
"""


def send(ns: str, batch: list) -> dict:
    if not batch:
        return {}
    done = run(sys.executable, "-c", _SENDER, ns=ns, timeout=120,
               stdin=json.dumps([[dataclasses.asdict(p) if not isinstance(p, dict) else p
                                  for p in batch], REPLY_WAIT]))
    return json.loads(done.stdout.strip().splitlines()[-1])


_TUPLE = re.compile(r"src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)")


def conntrack6(ns: str) -> dict:
    """(proto, src, sport, dst, dport) of the original direction -> the reply tuple."""
    entries = {}
    for line in run("conntrack", "-L", "-f", "ipv6", "-o", "extended", ns=ns,
                    check=False).stdout.splitlines():
        fields = line.split()
        tuples = _TUPLE.findall(line)
        if len(fields) < 3 or len(tuples) < 2:
            continue
        (src, dst, sport, dport), reply = tuples[0], tuples[1]
        entries[(fields[2], src, int(sport), dst, int(dport))] = (
            reply[0], reply[1], int(reply[2]), int(reply[3]))
    return entries


def _hp(ip: str, port) -> str:
    return f"[{ip}]:{port}"


def kernel_outcome(p: Probe, entries: dict, answers: dict) -> Outcome:
    reply = entries.get((p.proto, p.src, p.sport, p.dst, p.dport))
    if reply is not None:
        rsrc, rdst, rsport, _ = reply
        dnat = None if (rsrc, rsport) == (p.dst, p.dport) else _hp(rsrc, rsport)
        return "ACCEPT", dnat, rdst != p.src
    answer = answers.get(f"{p.src}:{p.sport}")
    if answer == "icmp6 1/4":          # ICMPv6 destination unreachable, port unreachable
        return "REJECT", None, False
    assert answer is None, f"{p}: unexpected answer {answer}"
    return "DROP", None, False


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def observed(request, lab):
    """Load one mode's node1 rules (both families), send every case, read conntrack."""
    mode = request.param
    run("nft", "flush", "ruleset", ns=lab.node)
    run("conntrack", "-F", ns=lab.node, check=False)
    if mode == "iptables":
        run("ip6tables-restore", ns=lab.node, stdin=node_file(mode, "ip6tables-save.txt"))
    else:
        run("nft", "-f", "-", ns=lab.node, stdin=node_file(mode, "nft.txt"))
    batches = probes()
    answers = {}
    for sender, ns in (("client", lab.client), ("pod", lab.sinks["gw1"]), ("node", lab.node)):
        answers.update(send(ns, [p for c in CASES if c.sender == sender
                                 for p in batches[c.name]]))
    entries = conntrack6(lab.node)
    outcomes = {name: [kernel_outcome(p, entries, answers) for p in batch]
                for name, batch in batches.items()}
    loaded = (run("ip6tables-save", ns=lab.node).stdout if mode == "iptables"
              else run("nft", "list", "table", "ip6", "kube-proxy", ns=lab.node).stdout)
    yield mode, outcomes, loaded
    run("nft", "flush", "ruleset", ns=lab.node)


# ---------------------------------------------------------------------------------------------
# traceflow's prediction: its host walk on the same bundle


def host_walk(mode: str, case: Case, src: str) -> dict:
    dst, dport = case.destination
    pkt = Packet(nw_src=src, nw_dst=dst, nw_proto=6 if case.proto == "tcp" else 17,
                 tp_src=40000, tp_dst=dport, tcp_flags="syn" if case.proto == "tcp" else None)
    assert pkt.family == 6
    if case.sender == "node":
        return walk_from_pod(snapshot(mode), NODE_POD, pkt)
    return walk_from_host(snapshot(mode), NODE, IIF[case.sender], pkt)


def path_outcome(path: dict, component: str) -> Outcome:
    hops = request_hops(path)
    nf = [h for h in hops if h["component"] in ("iptables", "nft")]
    assert {h["component"] for h in nf} <= {component}
    dnat = masq = None
    for h in nf:
        if h.get("packet"):
            assert "ipv6_label" in h["packet"], "an IPv6 hop shows the IPv6 headers"
        if "nw_dst" in h["changed"] and dnat is None and h["chain"] != "conntrack":
            dnat = _hp(h["packet"]["nw_dst"], h["packet"]["tp_dst"])
        if "nw_src" in h["changed"] or h["effect"].startswith(("MASQUERADE", "SNAT")):
            masq = True
    drop = path["drop"]
    if drop is not None and drop["component"] in ("iptables", "nft"):
        if path["verdict"] == "unknown":
            return "UNKNOWN", dnat, bool(masq)
        return drop["reason"].split(" ", 1)[0].split(":", 1)[0], None, False
    return "ACCEPT", dnat, bool(masq)


def predict(mode: str, case: Case, src: str) -> dict:
    component = "iptables" if mode == "iptables" else "nft"
    out: dict = defaultdict(float)
    for path in host_walk(mode, case, src)["paths"]:
        out[path_outcome(path, component)] += path["weight"]
    return dict(out)


def loaded_shares(mode: str, loaded: str, proto: str, targets: set) -> dict:
    """DNAT target -> its share of new connections by the rules the kernel loaded: the
    statistic probabilities in order (ip6tables) or the numgen map (nftables)."""
    found = []
    if mode == "iptables":
        sep = {chain: to for chain, p, to in re.findall(
            r"^-A (KUBE-SEP-\w+) .*-p (\w+) .*-j DNAT .*--to-destination (\S+)", loaded, re.M)
            if p == proto}
        chains: dict = defaultdict(list)
        for chain, middle, target in re.findall(
                r"^-A (KUBE-SVC-\w+|KUBE-SVL-\w+) (.*)-j (KUBE-SEP-\w+)\s*$", loaded, re.M):
            chains[chain].append((middle, sep.get(target)))
        for rules in chains.values():
            if {t for _, t in rules} != targets:
                continue
            shares, rest = {}, 1.0
            for middle, target in rules:
                m = re.search(r"--probability ([0-9.]+)", middle)
                p = float(m.group(1)) if m else 1.0
                shares[target] = shares.get(target, 0.0) + rest * p
                rest *= 1.0 - p
            found.append(shares)
    else:
        dnat, chain = {}, None
        for line in loaded.splitlines():
            m = re.match(r"\s*chain (\S+) \{", line)
            chain = m.group(1) if m else chain
            m = re.search(r"meta l4proto (\w+) dnat to (\S+)", line)
            if m and m.group(1) == proto:
                dnat[chain] = m.group(2)
        for modulus, elements in re.findall(r"numgen random mod (\d+) vmap \{([^}]*)\}", loaded):
            goto = [dnat.get(c) for _, c in re.findall(r"(\d+) : goto ([^,\s]+)", elements)]
            if set(goto) == targets:
                found.append({t: goto.count(t) / int(modulus) for t in targets})
    assert found, f"no service chain of the loaded rules sends {proto} to {sorted(targets)}"
    return found[0]


def _show(outcomes: dict) -> str:
    return ", ".join(f"{v} {d or '-'}{' masq' if m else ''}: {w:.3g}"
                     for (v, d, m), w in sorted(outcomes.items(), key=lambda i: str(i[0])))


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_ipv6_nat_matches_traceflow(observed, case):
    mode, outcomes, loaded = observed
    kernel = Counter(outcomes[case.name])
    assert sum(kernel.values()) == case.count
    predicted = predict(mode, case, case.sources[0])
    assert not any(v == "UNKNOWN" for v, _, _ in predicted), _show(predicted)
    assert abs(sum(predicted.values()) - 1.0) < 1e-5, _show(predicted)
    possible = {o for o, w in predicted.items() if w > 0}
    strays = {o: n for o, n in kernel.items() if o not in possible}
    assert not strays, f"{mode} kernel did {strays}, traceflow predicts {_show(predicted)}"
    if case.distribution and len(possible) > 1:
        shares: dict = defaultdict(float)
        for (_, target, _), w in predicted.items():
            shares[target] += w
        exact = loaded_shares(mode, loaded, case.proto, set(shares))
        off = {d: (shares.get(d, 0.0), p) for d, p in exact.items()
               if abs(shares.get(d, 0.0) - p) > 1e-5}
        assert not off, f"endpoint -> (traceflow's weight, the loaded rules' share) {off}"
        total = sum(kernel.values())
        stat = sum((kernel.get(o, 0) - total * w) ** 2 / (total * w)
                   for o, w in predicted.items())
        df = len(predicted) - 1
        assert stat < CHI2_CRITICAL[df], (f"{mode} kernel {dict(kernel)} does not fit "
                                          f"{_show(predicted)} (chi-square {stat:.1f})")
    if case.count >= 20 and len(possible) > 1:
        assert len(kernel) > 1


def test_kernel_prints_the_generated_ipv6_rules_back(lab):
    """ip6tables-save / nft list of what was loaded equals the dual-stack bundles' files
    (modulo counters, dates and the kernel's hash order): the generator writes what the
    tools print, in both families."""
    from test_netfilter_kernel import _normalise_nft, _normalise_save
    run("nft", "flush", "ruleset", ns=lab.node)
    text = node_file("iptables", "ip6tables-save.txt")     # IPVS mode's: with its ipsets
    run("ip6tables-restore", ns=lab.node, stdin=text)
    printed = run("ip6tables-save", ns=lab.node).stdout
    assert _normalise_save(printed) == _normalise_save(text)
    run("nft", "flush", "ruleset", ns=lab.node)
    text = node_file("nftables", "nft.txt")
    run("nft", "-f", "-", ns=lab.node, stdin=text)
    printed = run("nft", "list", "ruleset", ns=lab.node).stdout
    assert _normalise_nft(printed) == _normalise_nft(text)
    run("nft", "flush", "ruleset", ns=lab.node)


def test_ipvs_mode_inet6_ipsets_load_and_print_back():
    """The dual-stack IPVS bundle's ipset.txt (KUBE-* family inet and KUBE-6-* family inet6)
    and both rule files load together and print back unchanged."""
    from test_netfilter_kernel import _ipset_restore, _normalise_ipset, _normalise_save
    reason = why_not("ipset", "ip6tables-restore")
    if reason:
        pytest.skip(reason)
    ns = f"tf6-{uuid.uuid4().hex[:8]}-ipvs"
    run("ip", "netns", "add", ns)
    try:
        sets = node_file("ipvs", "ipset.txt")
        assert "family inet6" in sets and "Name: KUBE-6-CLUSTER-IP" in sets
        run("ipset", "restore", ns=ns, stdin=_ipset_restore(sets))
        for tool, name in (("iptables", "iptables-save.txt"), ("ip6tables", "ip6tables-save.txt")):
            text = node_file("ipvs", name)
            run(f"{tool}-restore", ns=ns, stdin=text)
            assert _normalise_save(run(f"{tool}-save", ns=ns).stdout) == _normalise_save(text)
        assert _normalise_ipset(run("ipset", "list", ns=ns).stdout) == _normalise_ipset(sets)
    finally:
        run("ip", "netns", "del", ns, check=False)


# ---------------------------------------------------------------------------------------------
# A hand-written inet ruleset: one table for both families, packet by packet


INET_RULESET = """\
table inet fw {
\tset allowed6 { type ipv6_addr; flags interval; elements = { 2001:db8:10::/64 } }
\tchain input {
\t\ttype filter hook input priority filter; policy drop;
\t\tct state established,related accept
\t\ticmpv6 type { echo-request, nd-neighbor-solicit, nd-neighbor-advert } accept
\t\tip6 saddr @allowed6 tcp dport { 22, 80 } accept
\t\tip6 nexthdr udp udp dport 53 accept
\t\ttcp dport 8443 reject with icmpx admin-prohibited
\t}
\tchain forward {
\t\ttype filter hook forward priority filter; policy accept;
\t\tip6 daddr fd00:10:244:3::/64 tcp dport 9999 drop
\t\tip6 flowlabel 4660 drop
\t\tip6 hoplimit 1 drop
\t}
}
table inet nat {
\tchain pre {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tip6 daddr fd00:10:96::80 tcp dport 80 dnat ip6 to [fd00:10:244:2::5]:8080
\t\tip daddr 10.96.0.80 tcp dport 80 dnat ip to 10.244.2.5:8080
\t}
\tchain post {
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tip6 saddr 2001:db8:10::/64 ip6 daddr fd00:10:244:3::/64 masquerade
\t\tip6 saddr 2001:db8:10::/64 ip6 daddr fd00:10:244:2::/64 snat ip6 to fd00:172:31:2::1
\t}
}
"""

# (name, source, destination, protocol, destination port, flow label, hook walked)
INET_PROBES = [
    ("dnat-service", CLIENT_IP, "fd00:10:96::80", "tcp", 80, 0),
    ("masquerade-to-node3", CLIENT_IP, "fd00:10:244:3::9", "tcp", 5000, 0),
    ("snat-to-node2", CLIENT_IP, "fd00:10:244:2::9", "udp", 5000, 0),
    ("forward-drop-port", CLIENT_IP, "fd00:10:244:3::9", "tcp", 9999, 0),
    ("forward-drop-flowlabel", CLIENT_IP, "fd00:10:244:3::9", "tcp", 5001, 4660),
    ("input-allowed-ssh", CLIENT_IP, NODE_IP, "tcp", 22, 0),
    ("input-dns", CLIENT_IP, NODE_IP, "udp", 53, 0),
    ("input-default-drop", CLIENT_IP, NODE_IP, "tcp", 25, 0),
    ("input-reject", CLIENT_IP, NODE_IP, "tcp", 8443, 0),
]


def _inet_bundle(tmp: Path) -> Path:
    from kernel_lab import write_bundle
    addr = (f"1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN group "
            "default qlen 1000\n    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"
            "    inet6 ::1/128 scope host \n       valid_lft forever preferred_lft forever\n")
    for i, (dev, cidr) in enumerate([("ens192", f"{NODE_IP}/64")] +
                                    [(d, a) for d, (a, _, _) in LINKS.items()], 2):
        addr += (f"{i}: {dev}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state "
                 f"UP group default qlen 1000\n    link/ether 02:00:00:00:00:0{i} brd "
                 f"ff:ff:ff:ff:ff:ff\n    inet6 {cidr} scope global \n       valid_lft "
                 "forever preferred_lft forever\n")
    routes = [f"{NODE_IP.rsplit(':', 2)[0]}::/64 dev ens192 proto kernel metric 256 pref medium"]
    routes += [f"{sub} dev {d} proto kernel metric 256 pref medium" if d == "gw1" else
               f"{a.split('::')[0]}::/64 dev {d} proto kernel metric 256 pref medium\n"
               f"{sub} via {s.split('/')[0]} dev {d} metric 1024 pref medium"
               for d, (a, sub, s) in LINKS.items()]
    routes.append(f"default via {CLIENT_IP} dev ens192 metric 1024 pref medium")
    routes += [f"local {a.split('/')[0]} dev {d} table local proto kernel metric 0 pref medium"
               for d, (a, _, _) in [("ens192", (f"{NODE_IP}/64", 0, 0)), *LINKS.items()]]
    neigh = "\n".join([f"{CLIENT_IP} dev ens192 lladdr 02:00:00:00:01:00 REACHABLE",
                       "fd00:172:31:2::2 dev gw2 lladdr 02:00:00:00:02:02 REACHABLE",
                       "fd00:172:31:3::2 dev gw3 lladdr 02:00:00:00:02:03 REACHABLE"]) + "\n"
    return write_bundle(tmp, "lab", {"nft.txt": INET_RULESET, "ip-addr.txt": addr,
                                     "ip-route.txt": "\n".join(routes) + "\n",
                                     "ip-neigh.txt": neigh},
                        cni="antrea", kube_proxy="nftables")


def test_inet_family_rules_match_the_kernel(lab, tmp_path):
    """Each probe through a kernel holding the inet ruleset, and through traceflow's host walk
    of the same ruleset: accepted or dropped or rejected alike, with the same NAT."""
    run("nft", "flush", "ruleset", ns=lab.node)
    run("conntrack", "-F", ns=lab.node, check=False)
    run("nft", "-f", "-", ns=lab.node, stdin=INET_RULESET)
    batch = [{"case": n, "src": s, "dst": d, "proto": p, "sport": 41000 + i, "dport": port,
              "fl": fl} for i, (n, s, d, p, port, fl) in enumerate(INET_PROBES)]
    answers = send(lab.client, batch)
    entries = conntrack6(lab.node)
    snap = open_snapshot(Bundle.open(_inet_bundle(tmp_path)))
    try:
        for probe in batch:
            p = Probe(probe["case"], probe["src"], probe["dst"], probe["proto"],
                      probe["sport"], probe["dport"])
            answer = answers.get(f"{p.src}:{p.sport}")
            if p.dst == NODE_IP and answer in ("tcp RA", "icmp6 1/4"):
                # the node's own stack answered (no socket listens): INPUT let it through
                kernel = ("ACCEPT", None, False)
            elif answer == "icmp6 1/1":       # reject with icmpx admin-prohibited
                kernel = ("REJECT", None, False)
            else:
                kernel = kernel_outcome(p, entries, answers)
                if kernel[0] == "ACCEPT" and p.dst == NODE_IP:
                    kernel = ("ACCEPT", None, False)
            pkt = Packet(nw_src=p.src, nw_dst=p.dst, nw_proto=6 if p.proto == "tcp" else 17,
                         tp_src=p.sport, tp_dst=p.dport, ipv6_label=probe["fl"],
                         tcp_flags="syn" if p.proto == "tcp" else None)
            walked = walk_from_host(snap, "lab", "ens192", pkt)
            got = {path_outcome(path, "nft") for path in walked["paths"]}
            assert got == {kernel}, f"{p.case}: kernel {kernel}, traceflow {got}"
    finally:
        run("nft", "flush", "ruleset", ns=lab.node)
