"""The real kernel is the reference: `route_lookup` must answer what `ip route get` answers.

A private network namespace gets realistic policy routing (Cilium-ENI-like per-pod rules,
an Antrea gateway with onlink routes, a WireGuard-style suppress rule, marks, iif/oif
rules, reject rules and routes, throw, goto, metrics, multipath, a custom local route,
rp_filter and forwarding settings). Its `ip rule list`, `ip route show table all` and
`ip addr show` outputs are parsed with our parsers, then thousands of random queries are
asked of both the kernel (`ip -batch`) and `Router.lookup`, and compared.

Veth pairs whose peers live in a second private "sink" namespace stand in for devices
(this kernel has no dummy/vrf link types). Only the two namespaces created here are ever
touched, and no packet is sent: `ip route get` only asks the routing code.

TRACEFLOW_ROUTE_QUERIES=20000 runs a longer comparison; TRACEFLOW_ROUTE_SEED another mix.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from dataclasses import dataclass

import pytest

from traceflow.engines.routing import (Router, Sysctls, parse_ip_addr, parse_ip_routes,
                                       parse_ip_rules)

# per scenario; two scenarios, so 10,000 queries compared with `ip route get` by default
QUERIES = int(os.environ.get("TRACEFLOW_ROUTE_QUERIES", "5000"))
SEED = int(os.environ.get("TRACEFLOW_ROUTE_SEED", "20261122"))

@dataclass(frozen=True)
class Scenario:
    """A node: devices (veths), addresses, routes, rules (`ip` batch lines), sysctls, and
    the address pools the random queries draw from."""

    name: str
    devices: tuple
    addresses: tuple
    routes: tuple
    rules: tuple
    rp_filter: dict                 # device -> value (net.ipv4.conf.all.rp_filter is 0)
    no_forwarding: frozenset
    local_sources: tuple
    other_sources: tuple
    edge_destinations: tuple
    expected_outcomes: frozenset    # kernel answers the query mix must produce

    def sysctls(self) -> dict:
        return {dev: Sysctls(forwarding=dev not in self.no_forwarding,
                             rp_filter=self.rp_filter.get(dev, 0))
                for dev in (*self.devices, "lo")}


POLICY = Scenario(
    name="policy",
    devices=("ens160", "eth1", "eth2", "antrea-gw0", "lxc716f4afaa7f3", "lxc97a68878aebe"),
    addresses=(
        "addr add 10.255.0.1/32 dev lo",           # a routed loopback address (BGP style)
        "addr add 10.79.1.20/24 dev ens160",
        "addr add 10.79.1.21/24 dev ens160",       # becomes a secondary address
        "addr add 192.168.50.2/24 dev eth2",
        "addr add 10.222.1.1/24 dev antrea-gw0",   # eth1 and the lxc devices keep no IPv4
    ),
    routes=(
        # main: an Antrea node's routes plus Cilium ENI endpoint routes
        "route add default via 10.79.1.1 dev ens160 proto static metric 100",
        "route add default via 192.168.50.1 dev eth2 metric 200",
        "route add 10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink",
        "route add 10.222.3.0/24 via 10.222.3.1 dev antrea-gw0 onlink",
        "route add 10.222.0.0/16 via 10.79.1.50 dev ens160 metric 50",
        "route add 172.16.0.0/12 via 10.79.1.2 dev ens160 metric 10",
        "route add 172.16.0.0/12 via 192.168.50.3 dev eth2 metric 5",
        "route add 172.16.5.0/24 nexthop via 10.79.1.3 dev ens160 weight 1"
        " nexthop via 192.168.50.4 dev eth2 weight 3",
        "route add 10.0.0.2 dev lxc716f4afaa7f3 proto kernel scope link",
        "route add 10.0.0.239 dev lxc97a68878aebe proto kernel scope link",
        "route add unreachable 10.222.200.0/24",
        "route add blackhole 10.222.201.0/24",
        "route add prohibit 10.222.202.0/24",
        "route add 198.18.0.0/15 via 10.79.1.5 dev ens160 metric 300",
        "route add 198.18.0.0/16 dev eth2 scope link",
        "route add local 10.250.0.0/16 dev lo table local",    # AnyIP: a hand-made local route
        # per-ENI table (Cilium): the gateway's link route first, then the default
        "route add 10.0.0.253 dev eth1 proto kernel scope link table 10",
        "route add default via 10.0.0.253 dev eth1 proto kernel table 10",
        "route add default via 192.168.50.1 dev eth2 table 11",
        "route add throw 10.0.0.0/8 table 11",
        "route add blackhole 10.79.9.0/24 table 11",
        "route add 203.0.113.0/25 via 10.79.1.9 dev ens160 table 12",
        "route add unreachable 100.64.0.0/10 table 13",
        "route add 10.0.0.0/8 via 10.79.1.77 dev ens160 table 13",
        "route add 100.64.0.0/10 via 10.222.1.254 dev antrea-gw0 table 14",
        "route add throw 100.64.1.0/24 table 14",
        "route add default via 192.168.50.254 dev eth2 table 16",
        "route add 192.0.2.0/24 via 192.168.50.7 dev eth2 table 17",
        "route add default via 10.79.1.18 dev ens160 table 18",
        "route add default via 10.79.1.19 dev ens160 table 19",
        "route add local default dev lo scope host table 2004",  # Cilium's proxy table
        "route add 198.18.0.0/15 via 10.79.1.5 dev ens160 table 2005",
        "route add default dev eth2 scope link table 51820",     # WireGuard-style table
    ),
    rules=(
        "rule add pref 9 fwmark 0x200/0xf00 lookup 2004",
        "rule add pref 10 fwmark 0xa00/0xf00 lookup 2005",
        "rule add pref 20 to 10.0.0.2 lookup main",
        "rule add pref 20 to 10.0.0.239 lookup main",
        "rule add pref 30 iif eth2 lookup 11",
        "rule add pref 40 iif lo to 203.0.113.0/24 lookup 12",
        "rule add pref 50 to 198.51.100.0/24 unreachable",
        "rule add pref 51 to 198.51.101.0/24 blackhole",
        "rule add pref 52 to 198.51.102.0/24 prohibit",
        "rule add pref 60 from 10.222.1.0/24 goto 110",
        "rule add pref 61 from 10.222.9.0/24 goto 9999",          # unresolved: ignored
        "rule add pref 62 fwmark 0x2a00/0xff00 goto 32767",       # to the empty "default" table
        "rule add pref 65 from 10.222.0.0/16 lookup 13",
        "rule add pref 70 oif eth2 lookup 16",
        "rule add pref 80 uidrange 1000-2000 lookup 19",
        "rule add pref 85 ipproto tcp dport 443 lookup 18",
        "rule add pref 90 nop",
        "rule add pref 96 not iif lo lookup 17",
        "rule del pref 0",                                         # Cilium moves local to 100
        "rule add pref 100 lookup local",
        "rule add pref 110 from 10.222.1.0/24 to 100.64.0.0/10 lookup 14",
        "rule add pref 111 from 10.0.0.2 lookup 10",
        "rule add pref 111 from 10.0.0.239 lookup 10",
        "rule add pref 111 from 10.79.1.21 lookup 11",
        "rule add pref 200 lookup main suppress_prefixlength 0",
        "rule add pref 201 not fwmark 0xca6c lookup 51820",
    ),
    rp_filter={"ens160": 2, "eth2": 1},          # loose on the uplink, strict on eth2
    no_forwarding=frozenset({"eth1"}),
    local_sources=("10.79.1.20", "10.79.1.21", "192.168.50.2", "10.222.1.1", "10.255.0.1",
                   "127.0.0.1", "10.250.3.4"),
    other_sources=("10.0.0.2", "10.0.0.239", "10.222.1.48", "10.222.9.7", "10.222.2.34",
                   "172.16.5.9", "172.20.0.1", "8.8.8.8", "192.168.50.9", "10.79.1.99",
                   "100.64.1.5", "198.18.3.3", "10.250.9.9"),
    edge_destinations=("10.79.1.255", "10.222.1.255", "127.0.0.1", "127.5.5.5", "10.79.1.20",
                       "10.79.1.21", "10.255.0.1", "10.222.1.1", "255.255.255.255",
                       "224.0.0.5", "239.1.2.3", "10.250.0.1"),
    expected_outcomes=frozenset({"unicast", "local", "broadcast", "multicast",
                                 "Network is unreachable", "No route to host",
                                 "Permission denied", "Invalid argument"}),
)

# A plain Antrea node: nobody touched the rules, so the kernel's source check takes its
# shortcut (only the node's own addresses are martian) unless rp_filter is on.
ANTREA = Scenario(
    name="antrea",
    devices=("ens160", "antrea-gw0", "eth1"),
    addresses=("addr add 10.79.1.20/24 dev ens160",
               "addr add 10.222.1.1/24 dev antrea-gw0",
               "addr add 192.168.60.2/24 dev eth1"),
    routes=("route add default via 10.79.1.1 dev ens160 proto dhcp src 10.79.1.20 metric 100",
            "route add 10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink",
            "route add 10.222.3.0/24 via 10.222.3.1 dev antrea-gw0 onlink",
            "route add 169.254.0.253 dev antrea-gw0 scope link",
            "route add 192.168.0.0/16 via 192.168.60.1 dev eth1 metric 10",
            "route add unreachable 10.222.200.0/24",
            "route add blackhole 10.222.201.0/24",
            "route add prohibit 10.222.202.0/24",
            "route add throw 10.222.203.0/24"),
    rules=(),
    rp_filter={"eth1": 1},
    no_forwarding=frozenset(),
    local_sources=("10.79.1.20", "10.222.1.1", "192.168.60.2", "127.0.0.1"),
    other_sources=("10.222.1.48", "10.222.2.34", "10.79.1.99", "8.8.8.8", "192.168.60.9",
                   "192.168.7.7", "169.254.0.253"),
    edge_destinations=("10.79.1.255", "10.222.1.255", "127.0.0.1", "10.79.1.20",
                       "10.222.1.1", "255.255.255.255", "224.0.0.5"),
    expected_outcomes=frozenset({"unicast", "local", "broadcast", "Invalid argument",
                                 "Network is unreachable", "No route to host",
                                 "Permission denied"}),
)

MARKS = [0x200, 0xa00, 0xca6c, 0x1, 0x201, 0xf00, 0x2a00, 0xca6d]


# --------------------------------------------------------------------------- namespace


def _ip(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True,
                          check=check)


def _why_not_runnable() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return "needs iproute2 ('ip')"
    probe = f"tf-probe-{uuid.uuid4().hex[:8]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' fails here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class KernelNode:
    scenario: Scenario
    ns: str
    rules_text: str
    routes_text: str
    addr_text: str


@pytest.fixture(scope="module", params=[POLICY, ANTREA], ids=lambda s: s.name)
def node(request):
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    scenario = request.param
    tag = uuid.uuid4().hex[:8]
    ns, sink = f"tf-route-{tag}", f"tf-sink-{tag}"
    created = []
    try:
        for name in (ns, sink):
            _ip("netns", "add", name)
            created.append(name)
        _build(scenario, ns, sink)
        yield KernelNode(scenario, ns, _ip("-n", ns, "rule", "list").stdout,
                         _ip("-n", ns, "route", "show", "table", "all").stdout,
                         _ip("-n", ns, "addr", "show").stdout)
    finally:
        for name in reversed(created):
            _ip("netns", "del", name, check=False)


def _build(scenario: Scenario, ns: str, sink: str) -> None:
    links = ["link set lo up"]
    for number, dev in enumerate(scenario.devices):
        links += [f"link add name {dev} type veth peer name p{number} netns {sink}",
                  f"link set {dev} up"]
    _batch(ns, links + list(scenario.addresses))
    _batch(sink, [f"link set p{n} up" for n in range(len(scenario.devices))])
    _sysctls(scenario, ns)
    _batch(ns, list(scenario.routes + scenario.rules))


def _batch(ns: str, commands: list[str]) -> None:
    result = _ip("-n", ns, "-batch", "-", stdin="\n".join(commands) + "\n", check=False)
    assert result.returncode == 0, f"setting up {ns} failed:\n{result.stderr}"


def _sysctls(scenario: Scenario, ns: str) -> None:
    conf = "/proc/sys/net/ipv4/conf"
    writes = [f"echo 1 > {conf}/all/forwarding", f"echo 0 > {conf}/all/rp_filter"]
    writes += [f"echo {v} > {conf}/{d}/rp_filter" for d, v in scenario.rp_filter.items()]
    writes += [f"echo 0 > {conf}/{d}/forwarding" for d in scenario.no_forwarding]
    result = subprocess.run(["ip", "netns", "exec", ns, "sh", "-ec", "; ".join(writes)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- queries


@dataclass(frozen=True)
class Query:
    dst: str
    src: str | None = None
    iif: str | None = None
    oif: str | None = None
    mark: int = 0
    uid: int | None = None
    proto: str | None = None      # "tcp" / "udp", with dport
    dport: int | None = None

    def command(self) -> str:
        words = ["route", "get", self.dst]
        if self.src:
            words += ["from", self.src]
        if self.iif:
            words += ["iif", self.iif]
        if self.oif:
            words += ["oif", self.oif]
        if self.mark:
            words += ["mark", hex(self.mark)]
        if self.uid is not None and not self.iif:
            words += ["uid", str(self.uid)]
        if self.proto:
            words += ["ipproto", self.proto, "dport", str(self.dport)]
        return " ".join(words)


def _destination_pool(tables, rules) -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix the node routes or selects on: queries aim at and around them."""
    prefixes = set()
    for prefix in [r.dst for r in tables] + [p for r in rules for p in (r.src, r.dst)]:
        if prefix is not None and prefix.family == 4:
            prefixes.add(ipaddress.ip_network((prefix.value, prefix.length)))
    return sorted(prefixes, key=str)


def _address_in(rng: random.Random, net: ipaddress.IPv4Network) -> str:
    if net.prefixlen == 0:
        return _random_unicast(rng)
    roll = rng.random()
    if roll < 0.15:
        value = int(net.network_address)
    elif roll < 0.3:
        value = int(net.broadcast_address)
    else:
        value = int(net.network_address) + rng.randrange(net.num_addresses)
    return str(ipaddress.IPv4Address(value))


def _random_unicast(rng: random.Random) -> str:
    while True:
        value = rng.randrange(1 << 24, 224 << 24)
        if value >> 24 not in (0, 127):
            return str(ipaddress.IPv4Address(value))


def _queries(scenario: Scenario, count: int, pool: list) -> list[Query]:
    """A deterministic mix: ~40% forwarded (iif + from), the rest sent by the node, some
    with a local source, an output device, a mark, a uid or a TCP/UDP port."""
    rng = random.Random(SEED)
    queries = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.04:
            dst = rng.choice(scenario.edge_destinations)
        elif roll < 0.14:
            dst = _random_unicast(rng)
        else:
            dst = _address_in(rng, rng.choice(pool))
        mark = rng.choice(MARKS) if rng.random() < 0.3 else 0
        proto = dport = None
        if rng.random() < 0.1:
            proto, dport = rng.choice([("tcp", 443), ("tcp", 80), ("udp", 443)])
        if rng.random() < 0.4 and not ipaddress.ip_address(dst).is_multicast:
            queries.append(Query(dst, _forwarded_source(rng, scenario, pool),
                                 iif=rng.choice(scenario.devices), mark=mark, proto=proto,
                                 dport=dport))
            continue
        src = None
        if rng.random() < 0.45:
            src = rng.choice(scenario.local_sources if rng.random() < 0.85
                             else scenario.other_sources)
        oif = rng.choice(scenario.devices) if rng.random() < 0.1 else None
        uid = rng.choice([1500, 999, 2001, 1000]) if rng.random() < 0.12 else 0
        queries.append(Query(dst, src, oif=oif, mark=mark, uid=uid, proto=proto, dport=dport))
    return queries


def _forwarded_source(rng: random.Random, scenario: Scenario, pool: list) -> str:
    roll = rng.random()
    if roll < 0.02:
        return "0.0.0.0"                                   # a martian
    if roll < 0.4:
        return _address_in(rng, rng.choice(pool)).replace("255.255.255.255", "8.8.4.4")
    return rng.choice(scenario.other_sources + scenario.local_sources[:2] + ("127.0.0.1",))


# --------------------------------------------------------------------------- the kernel's answers


def _kernel_answers(ns: str, queries: list[Query]) -> list[dict]:
    """Run every query through one `ip -batch`; each answer is a dict (or {"error": ...})."""
    script = "\n".join(q.command() for q in queries) + "\n"
    result = _ip("-n", ns, "-d", "-o", "-force", "-batch", "-", stdin=script, check=False)
    errors = _batch_errors(result.stderr)
    answers, lines = [], iter(result.stdout.splitlines())
    for number in range(1, len(queries) + 1):
        if number in errors:
            answers.append({"error": errors[number]})
        else:
            answers.append(_parse_route_get(next(lines)))
    assert next(lines, None) is None, "more answers than queries"
    return answers


def _batch_errors(stderr: str) -> dict[int, str]:
    """`ip -force -batch` reports each failure as its messages, then 'Command failed -:N'."""
    errors, pending = {}, []
    for line in stderr.splitlines():
        if line.startswith("Command failed -:"):
            message = " / ".join(pending)
            errors[int(line.rsplit(":", 1)[1])] = message.replace("RTNETLINK answers: ", "")
            pending = []
        elif line.strip():
            pending.append(line.strip())
    return errors


def _parse_route_get(line: str) -> dict:
    """`unicast 8.8.8.8 from 10.0.0.1 via 10.0.0.254 dev eth0 table main src 10.0.0.1 ...`"""
    words = line.split("\\")[0].split()
    answer = {"kind": words[0], "dst": words[1]}
    for key in ("from", "via", "dev", "table", "src"):
        if key in words:
            answer[key] = words[words.index(key) + 1]
    return answer


# --------------------------------------------------------------------------- comparison


def _router(node: KernelNode, with_local_addresses: bool = False) -> Router:
    """The node's Router; ``with_local_addresses``: also given the node's IPv4 addresses, as
    a bundle's node model gives them (traceflow.bundle.snapshot NodeModel.local_addresses,
    what `route-get` and the host walk pass)."""
    rules = parse_ip_rules(node.rules_text, "ip-rule.txt")
    tables = parse_ip_routes(node.routes_text, "ip-route.txt")
    interfaces = parse_ip_addr(node.addr_text, "ip-addr.txt")
    local = ({a.address for i in interfaces for a in i.addresses if a.family == 4}
             if with_local_addresses else None)
    return Router(rules, tables, interfaces, local, sysctls=node.scenario.sysctls())


def _ours(router: Router, query: Query):
    return router.lookup(query.dst, query.src, query.iif, query.oif, query.mark,
                         uid=query.uid,
                         proto={"tcp": 6, "udp": 17}.get(query.proto, 17),  # ip route get: UDP
                         dport=query.dport or 0, sport=0)


def _disagreement(router: Router, kernel: dict, ours) -> str | None:
    if ours.kind == "unknown" and "multipath" in ours.reason:
        # Source validation differs between branches: the kernel's hash picked one of them.
        branches = [(gw, dev) for _, gw, dev in ours.nexthops]
        if kernel.get("error") == "Invalid argument" or \
                (kernel.get("via"), kernel.get("dev")) in branches:
            return None
        return f"kernel {kernel} is none of the multipath branches {branches}"
    if "error" in kernel:
        if ours.error != kernel["error"]:
            return f"kernel refuses ({kernel['error']}), we say {ours.kind} ({ours.error})"
        return None
    if ours.error or ours.kind != kernel["kind"]:
        return f"kind: kernel {kernel['kind']}, ours {ours.kind} ({ours.error})"
    paths = [(gw, dev) for _, gw, dev in ours.nexthops]
    if (kernel.get("via"), kernel.get("dev")) not in paths:
        return f"path: kernel via {kernel.get('via')} dev {kernel.get('dev')}, ours {paths}"
    if kernel.get("table") != ours.table:
        return f"table: kernel {kernel.get('table')}, ours {ours.table}"
    if "src" in kernel and kernel["src"] != _our_source(router, ours, kernel):
        return f"source: kernel {kernel['src']}, ours {ours.prefsrc}"
    return None


def _our_source(router: Router, ours, kernel: dict) -> str | None:
    """Our source address; for multipath, the one of the branch the kernel's hash took."""
    if ours.prefsrc or len(ours.nexthops) == 1:
        return ours.prefsrc
    return ours.route.prefsrc or router.source_address(kernel["dev"], kernel.get("via"),
                                                       ours.route.scope or "global")


def test_dumps_parse(node):
    rules = parse_ip_rules(node.rules_text, "ip-rule.txt")
    tables = parse_ip_routes(node.routes_text, "ip-route.txt")
    interfaces = parse_ip_addr(node.addr_text, "ip-addr.txt")
    assert not [r for r in rules if r.unknown]
    assert {"main", "local"} <= set(tables.names())
    assert any(r.family == 6 for r in tables)          # `table all` lists IPv6 routes too
    assert {i.name for i in interfaces} >= set(node.scenario.devices) | {"lo"}
    if node.scenario is POLICY:
        assert [r.priority for r in rules][:3] == [9, 10, 20]
        assert {"10", "11", "2004", "51820"} <= set(tables.names())
        assert any(r.nexthops for r in tables)          # the multipath route
        ens160 = next(i for i in interfaces if i.name == "ens160")
        assert [a.secondary for a in ens160.ipv4()] == [False, True]


def test_route_lookup_agrees_with_kernel(node):
    """Every query, by a Router given the node's addresses as ip-addr.txt lists them, and by
    one also given them as a bundle's node model does (a multicast or broadcast from one of
    them lost its device there until issue 22)."""
    router = _router(node)
    queries = _queries(node.scenario, QUERIES, _destination_pool(router.tables, router.rules))
    answers = _kernel_answers(node.ns, queries)
    failures, outcomes, kinds = [], {}, set()
    for with_local in (False, True):
        router = _router(node, with_local)
        for query, kernel in zip(queries, answers):
            ours = _ours(router, query)
            if not with_local:
                outcome = kernel.get("error") or kernel["kind"]
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                kinds.add(ours.kind)
            problem = _disagreement(router, kernel, ours)
            if problem:
                failures.append(_report(query, kernel, ours, problem, router)
                                + ("\n  (local addresses given)" if with_local else ""))
    print(f"\n{node.scenario.name}: {len(queries)} queries, kernel answers: {outcomes}")
    assert not failures, f"{len(failures)} of {len(queries)} disagree:\n\n" + \
        "\n\n".join(failures[:8])
    # the mix must exercise the interesting answers, not only the default route
    assert node.scenario.expected_outcomes <= set(outcomes)
    if node.scenario is POLICY:
        assert {"blackhole", "unreachable", "prohibit", "no-route", "invalid"} <= kinds


def _report(query: Query, kernel: dict, ours, problem: str, router: Router) -> str:
    rules = "\n".join(f"      {r.text.strip()}" for r in router.rules)
    steps = "\n".join(f"      {s}" for s in ours.steps)
    return (f"ip route get: {query.command()}\n  {problem}\n  kernel: {kernel}\n"
            f"  ours: {ours.kind} dev={ours.dev} via={ours.gateway} table={ours.table} "
            f"src={ours.prefsrc} error={ours.error}\n  reason: {ours.reason}\n"
            f"  steps:\n{steps}\n  rules:\n{rules}")


# --------------------------------------------------------------------------- IPv6, multicast

# A dual-stack node with IPv6 forwarding on (so the kernel adds the subnet-router anycast
# routes), DAD off (link-local addresses usable at once), a route with a preferred source.
DUAL = Scenario(
    name="dual-stack",
    devices=("ens160", "eth1"),
    addresses=("addr add 10.79.1.20/24 dev ens160", "addr add 192.168.60.2/24 dev eth1",
               "addr add fd00:10::20/64 dev ens160", "addr add fd00:10::21/64 dev ens160",
               "addr add 2001:db8:1::2/64 dev eth1"),
    routes=("route add default via 10.79.1.1 dev ens160",
            "route add default via fd00:10::1 dev ens160",
            "route add 2001:db8:7::/48 via fd00:10::1 dev ens160 src fd00:10::21"),
    rules=(), rp_filter={}, no_forwarding=frozenset(), local_sources=(), other_sources=(),
    edge_destinations=(), expected_outcomes=frozenset())


@pytest.fixture(scope="module")
def dual_node():
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:8]
    ns, sink = f"tf-route6-{tag}", f"tf-sink6-{tag}"
    created = []
    try:
        for name in (ns, sink):
            _ip("netns", "add", name)
            created.append(name)
        conf = "/proc/sys/net/ipv6/conf"
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-ec",
                        f"echo 0 > {conf}/default/accept_dad; echo 0 > {conf}/all/accept_dad; "
                        f"echo 1 > {conf}/all/forwarding"], check=True)
        _build(DUAL, ns, sink)
        yield KernelNode(DUAL, ns, _ip("-n", ns, "rule", "list").stdout + _ip(
            "-n", ns, "-6", "rule", "list").stdout,
            _ip("-n", ns, "route", "show", "table", "all").stdout
            + _ip("-n", ns, "-6", "route", "show", "table", "all").stdout,
            _ip("-n", ns, "addr", "show").stdout)
    finally:
        for name in reversed(created):
            _ip("netns", "del", name, check=False)


def _link_local(addr_text: str, dev: str) -> str:
    iface = next(i for i in parse_ip_addr(addr_text, "ip-addr.txt") if i.name == dev)
    return next(a.address for a in iface.addresses if a.family == 6 and a.scope == "link")


def dual_queries(node: KernelNode) -> list[Query]:
    ll0, ll1 = _link_local(node.addr_text, "ens160"), _link_local(node.addr_text, "eth1")
    v6 = [
        Query(ll0, "2001:db8:9::9", iif="eth1"),      # link-local of another device
        Query(ll0, "fe80::9", iif="ens160"), Query(ll0, "fe80::9", iif="eth1"),
        Query(ll1, "fe80::9", iif="eth1"), Query(ll0), Query(ll0, oif="eth1"),
        Query("fe80::99"), Query("fe80::99", oif="eth1"),
        Query("::1", "2001:db8:9::9", iif="eth1"),   # ::1 on a non-loopback device
        Query("::1", "2001:db8:9::9", iif="ens160"), Query("::1"), Query("::1", oif="eth1"),
        Query("2001:db8:1::", "fd00:10::9", iif="ens160"), Query("2001:db8:1::"),  # anycast
        Query("fd00:10::"), Query("fd00:10::20", "fd00:10::99", iif="eth1"),
        Query("2001:db8:7::5"), Query("2001:db8:9::5"), Query("2001:db8:1::77"),  # sources
        Query("fd00:10::5"), Query("fd00:10::20"),
        Query("ff02::1"), Query("ff02::1", oif="eth1"), Query("ff05::5"),          # multicast
        Query("ff02::1", "2001:db8:1::2"), Query("ff05::5", "fd00:10::20"),
        Query("ff0e::1"),
        # the unspecified address: its scope is invalid, every address fits, the narrowest
        # (the device's link-local one) wins (ipv6_dev_get_saddr, RFC 6724 rule 2)
        Query("::"), Query("::", oif="ens160"),
    ]
    v4 = [Query(dst, src) for dst in ("255.255.255.255", "224.0.0.5", "239.1.2.3",
                                      "10.79.1.255")
          for src in ("10.79.1.20", "192.168.60.2", "127.0.0.1", None)]
    v4 += [Query("224.0.0.5", oif="eth1"), Query("255.255.255.255", oif="eth1"),
           Query("224.0.0.5", "192.168.60.2", oif="ens160")]
    return v6 + v4


def test_ipv6_multicast_and_broadcast_agree_with_kernel(dual_node):
    """Also given the node's addresses as a bundle's node model does: multicast and broadcast
    from 127.0.0.1 leave by lo, from a device's address by that device."""
    queries = dual_queries(dual_node)
    answers = _kernel_answers(dual_node.ns, queries)
    failures = []
    for with_local in (False, True):
        router = _router(dual_node, with_local)
        for query, kernel in zip(queries, answers):
            ours = _ours(router, query)
            problem = _disagreement(router, kernel, ours)
            if problem:
                failures.append(_report(query, kernel, ours, problem, router)
                                + ("\n  (local addresses given)" if with_local else ""))
    unspecified = [a for q, a in zip(queries, answers) if q.dst == "::" and "src" in a]
    assert unspecified and all(a["src"].startswith("fe80:") for a in unspecified), unspecified
    print(f"\ndual-stack: {2 * len(queries) - len(failures)}/{2 * len(queries)} IPv6, multicast "
          "and broadcast queries agree with the kernel")
    assert not failures, f"{len(failures)} of {len(queries)} disagree:\n\n" + \
        "\n\n".join(failures[:8])
