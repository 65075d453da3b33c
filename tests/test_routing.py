"""Parsers for ip rule / ip route / ip addr, and route_lookup on realistic node tables."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from traceflow.model.errors import InputError
from traceflow.engines.neigh import parse_ip_neigh
from traceflow.engines.routing import (DEFAULT_IP_RULES, Mark, Prefix, Router, Sysctls,
                                       parse_ip_addr, parse_ip_routes, parse_ip_rules, route_lookup)

REALWORLD = Path(__file__).resolve().parent / "data" / "realworld" / "iproute"


def _read(name: str) -> str:
    return (REALWORLD / name).read_text()


# --------------------------------------------------------------------------- an Antrea node

# worker1 of an Antrea (encap, noEncap-style onlink routes) cluster: `ip route show table all`
ANTREA_ROUTES = """\
default via 10.79.1.1 dev ens160 proto static
10.79.1.0/24 dev ens160 proto kernel scope link src 10.79.1.20
10.222.1.0/24 dev antrea-gw0 proto kernel scope link src 10.222.1.1
10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink
10.222.3.0/24 via 10.222.3.1 dev antrea-gw0 onlink
169.254.0.253 dev antrea-gw0 scope link
local 10.79.1.20 dev ens160 table local proto kernel scope host src 10.79.1.20
broadcast 10.79.1.255 dev ens160 table local proto kernel scope link src 10.79.1.20
local 10.222.1.1 dev antrea-gw0 table local proto kernel scope host src 10.222.1.1
broadcast 10.222.1.255 dev antrea-gw0 table local proto kernel scope link src 10.222.1.1
local 127.0.0.0/8 dev lo table local proto kernel scope host src 127.0.0.1
local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1
broadcast 127.255.255.255 dev lo table local proto kernel scope link src 127.0.0.1
fe80::/64 dev ens160 proto kernel metric 256 pref medium
fe80::/64 dev antrea-gw0 proto kernel metric 256 pref medium
local ::1 dev lo table local proto kernel metric 0 pref medium
local fe80::250:56ff:fe9a:1 dev ens160 table local proto kernel metric 0 pref medium
multicast ff00::/8 dev ens160 table local proto kernel metric 256 pref medium
"""

ANTREA_ADDR = """\
1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN group default qlen 1000
    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00
    inet 127.0.0.1/8 scope host lo
       valid_lft forever preferred_lft forever
    inet6 ::1/128 scope host
       valid_lft forever preferred_lft forever
2: ens160: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc mq state UP group default qlen 1000
    link/ether 00:50:56:9a:00:01 brd ff:ff:ff:ff:ff:ff
    altname enp3s0
    inet 10.79.1.20/24 brd 10.79.1.255 scope global ens160
       valid_lft forever preferred_lft forever
    inet6 fe80::250:56ff:fe9a:1/64 scope link
       valid_lft forever preferred_lft forever
4: genev_sys_6081: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 65000 qdisc noqueue master ovs-system state UNKNOWN group default qlen 1000
    link/ether 5e:5b:c0:11:1e:1b brd ff:ff:ff:ff:ff:ff
5: antrea-gw0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue state UNKNOWN group default qlen 1000
    link/ether 4e:99:08:c1:53:be brd ff:ff:ff:ff:ff:ff
    inet 10.222.1.1/24 brd 10.222.1.255 scope global antrea-gw0
       valid_lft forever preferred_lft forever
7: frontend-a3ba2f@if3: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue master ovs-system state UP group default
    link/ether 8a:3b:21:6c:0b:e5 brd ff:ff:ff:ff:ff:ff link-netns cni-7a1f0b2c-4d5e-6f70-8192-a3b4c5d6e7f8
"""


@pytest.fixture(scope="module")
def antrea():
    rules = parse_ip_rules(DEFAULT_IP_RULES, "nodes/worker1/ip-rule.txt")
    tables = parse_ip_routes(ANTREA_ROUTES, "nodes/worker1/ip-route.txt")
    interfaces = parse_ip_addr(ANTREA_ADDR, "nodes/worker1/ip-addr.txt")
    return Router(rules, tables, interfaces)


def test_antrea_remote_pod_goes_onlink_via_gateway(antrea):
    decision = antrea.lookup("10.222.2.34")
    assert decision.kind == "unicast"
    assert (decision.dev, decision.gateway, decision.table) == ("antrea-gw0", "10.222.2.1", "main")
    assert decision.onlink
    assert decision.prefsrc == "10.222.1.1"          # the primary address of antrea-gw0
    assert decision.reason == ("10.222.2.34 via 10.222.2.1 dev antrea-gw0 onlink "
                               "(table main, 10.222.2.0/24)")
    assert decision.route.text == "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink"
    assert (decision.route.source.file, decision.route.source.line) == \
        ("nodes/worker1/ip-route.txt", 4)
    assert decision.nexthops == [(1.0, "10.222.2.1", "antrea-gw0")]
    assert decision.rule.priority == 32766


def test_antrea_forwarded_pod_traffic(antrea):
    decision = antrea.lookup("10.222.2.34", src="10.222.1.48", iif="antrea-gw0")
    assert (decision.kind, decision.dev, decision.gateway) == \
        ("unicast", "antrea-gw0", "10.222.2.1")
    assert decision.prefsrc is None                    # a forwarded packet keeps its source
    # in and out by antrea-gw0: the kernel checks the source even with rp_filter off
    assert any("source check" in step for step in decision.steps)


def test_antrea_own_pod_cidr_is_directly_connected(antrea):
    decision = antrea.lookup("10.222.1.5", src="10.79.1.99", iif="ens160")
    assert (decision.kind, decision.dev, decision.gateway) == ("unicast", "antrea-gw0", None)
    assert decision.reason == "10.222.1.5 dev antrea-gw0 (table main, 10.222.1.0/24, directly " \
                              "connected)"


def test_antrea_default_route_and_source(antrea):
    decision = antrea.lookup("8.8.8.8")
    assert (decision.dev, decision.gateway, decision.prefsrc) == \
        ("ens160", "10.79.1.1", "10.79.1.20")
    assert decision.route.dst == Prefix.default(4)


def test_antrea_local_and_broadcast(antrea):
    local = antrea.lookup("10.222.1.1")
    assert (local.kind, local.dev, local.prefsrc) == ("local", "lo", "10.222.1.1")
    # rules untouched: the kernel searches local and main as one table and says "main"
    assert local.table == "main" and local.route.table == "local"
    assert local.rule.priority == 0
    brd = antrea.lookup("10.79.1.255")
    assert (brd.kind, brd.dev, brd.gateway) == ("broadcast", "ens160", None)


def test_antrea_martian_source(antrea):
    decision = antrea.lookup("10.222.1.48", src="10.79.1.20", iif="ens160")
    assert decision.kind == "invalid"
    assert decision.error == "Invalid argument"
    assert "10.79.1.20 is an address of this node" in decision.reason


def test_antrea_forwarding_disabled(antrea):
    router = Router(antrea.rules, antrea.tables, antrea.interfaces.values(),
                    sysctls={"ens160": Sysctls(forwarding=False)})
    decision = router.lookup("10.222.2.34", src="10.79.1.99", iif="ens160")
    assert (decision.kind, decision.error) == ("unreachable", "No route to host")
    assert "forwarding is off on ens160" in decision.reason
    assert router.lookup("10.79.1.20", src="10.79.1.99", iif="ens160").kind == "local"


def test_antrea_ipv6(antrea):
    decision = antrea.lookup("fe80::1234")
    assert (decision.kind, decision.dev) == ("unicast", "ens160")
    assert antrea.lookup("::1").kind == "local"


def test_multicast_and_broadcast_from_own_address_keep_its_device(antrea):
    """`ip route get 224.0.0.5 from 127.0.0.1` answers dev lo, a broadcast from 10.79.1.20
    dev ens160 (the device that has the address; checked on the kernel by
    tests/test_routing_kernel.py): also when the node's addresses are given as a bare list,
    as a bundle's node model gives them (until issue 22: "sent on None", or for 127.0.0.1 a
    loopback error)."""
    local = ["127.0.0.1", "10.79.1.20", "10.222.1.1"]
    for router in (antrea, Router(antrea.rules, antrea.tables, antrea.interfaces.values(), local),
                   Router(antrea.rules, antrea.tables, None, local)):
        lo = router.lookup("224.0.0.5", src="127.0.0.1")
        assert (lo.kind, lo.dev, lo.error) == ("multicast", "lo", None)
        brd = router.lookup("255.255.255.255", src="10.79.1.20")
        assert (brd.kind, brd.dev) == ("broadcast", "ens160")
        assert "sent on ens160" in brd.reason
    # an address listed as the node's but owned by no device the bundle shows: unknown
    bare = Router(antrea.rules, antrea.tables, None, ["192.0.2.9"])
    assert bare.lookup("224.0.0.5", src="192.0.2.9").kind == "unknown"


def test_ipv6_source_for_the_unspecified_address_is_link_local():
    """`ip -6 route get ::`: the scope of :: is invalid, every address fits it and the
    narrowest wins (RFC 6724 rule 2): the device's link-local address, not the global one
    listed first (the kernel's answer on this node: tests/test_routing_kernel.py)."""
    addr = ANTREA_ADDR.replace(
        "    inet6 fe80::250:56ff:fe9a:1/64 scope link\n",
        "    inet6 fd00:10::20/64 scope global\n       valid_lft forever preferred_lft forever\n"
        "    inet6 fe80::250:56ff:fe9a:1/64 scope link\n")
    routes = ANTREA_ROUTES + "default via fd00:10::1 dev ens160 metric 1024 pref medium\n"
    router = Router(parse_ip_rules(DEFAULT_IP_RULES, "ip-rule.txt"),
                    parse_ip_routes(routes, "ip-route.txt"), parse_ip_addr(addr, "ip-addr.txt"))
    decision = router.lookup("::")
    assert (decision.kind, decision.dev, decision.prefsrc) == \
        ("unicast", "ens160", "fe80::250:56ff:fe9a:1")
    assert router.lookup("2001:db8::1").prefsrc == "fd00:10::20"     # a global destination


def test_no_route_without_default():
    tables = parse_ip_routes("10.79.1.0/24 dev ens160 proto kernel scope link src 10.79.1.20\n",
                             "ip-route.txt")
    decision = route_lookup(parse_ip_rules(DEFAULT_IP_RULES, "ip-rule.txt"), tables, "8.8.8.8")
    assert (decision.kind, decision.error) == ("no-route", "Network is unreachable")
    assert decision.route is None and decision.dev is None
    assert "no route to 8.8.8.8" in decision.reason


def test_route_lookup_without_rules_assumes_kernel_defaults():
    tables = parse_ip_routes("default via 10.0.0.1 dev eth0\n", "ip-route.txt")
    decision = route_lookup([], tables, "1.1.1.1")
    assert decision.gateway == "10.0.0.1"
    assert "assuming the kernel's three default rules" in decision.steps[0]


# --------------------------------------------------------------------------- Cilium ENI


@pytest.fixture(scope="module")
def cilium_eni():
    """imroc's ACK node with Cilium in ENI mode: per-pod rules, one table per ENI."""
    prefix = "imroc-ack-cilium-eni_"
    rules = parse_ip_rules(_read(prefix + "ip-rule-list.txt"), prefix + "ip-rule-list.txt")
    tables = parse_ip_routes(_read(prefix + "ip-route-show-table-main.txt"), "main.txt")
    for table in ("10", "11"):
        name = f"{prefix}ip-route-show-table-{table}.txt"
        tables = tables.merge(parse_ip_routes(_read(name), name, default_table=table))
    interfaces = parse_ip_addr(_read(prefix + "ip-a.txt"), prefix + "ip-a.txt")
    return Router(rules, tables, interfaces)


def test_cilium_eni_rules_parse():
    rules = parse_ip_rules(_read("imroc-ack-cilium-eni_ip-rule-list.txt"), "ip-rule.txt")
    assert rules[0].fwmark == Mark(0x200, 0xF00) and rules[0].table == "2004"
    assert 0x1200 in rules[0].fwmark and 0x100 not in rules[0].fwmark
    assert str(rules[1].dst) == "10.0.0.246" and rules[1].table == "main"
    egress = [r for r in rules if r.priority == 111]
    assert [(str(r.src), r.table) for r in egress][-1] == ("10.0.0.239", "10")
    assert rules[-1].text == "32767:  from all lookup default"


def test_cilium_eni_pod_egress_uses_its_eni_table(cilium_eni):
    decision = cilium_eni.lookup("8.8.8.8", src="10.0.0.239", iif="lxc97a68878aebe")
    assert (decision.kind, decision.table, decision.dev, decision.gateway) == \
        ("unicast", "10", "eth1", "10.0.0.253")
    assert decision.rule.text == "111:    from 10.0.0.239 lookup 10"
    other = cilium_eni.lookup("8.8.8.8", src="10.0.0.243", iif="lxc716f4afaa7f3")
    assert (other.table, other.dev) == ("11", "eth2")


def test_cilium_eni_ingress_to_pod_uses_main(cilium_eni):
    decision = cilium_eni.lookup("10.0.0.244", src="172.16.0.9", iif="eth0")
    assert (decision.kind, decision.table, decision.dev) == ("unicast", "main", "lxce3437fa17974")
    assert decision.rule.priority == 20 and str(decision.rule.dst) == "10.0.0.244"
    # the steps tell which rules were passed over, runs of them on one line
    assert decision.steps[0].startswith("rule 9 `from all fwmark 0x200/0xf00 lookup 2004`")
    assert "rules 20..20 (5 rules): skipped, destination 10.0.0.244 matches none of their " \
           "'to'" in decision.steps


def test_cilium_eni_node_traffic_uses_main(cilium_eni):
    decision = cilium_eni.lookup("8.8.8.8")
    assert (decision.table, decision.dev, decision.gateway, decision.prefsrc) == \
        ("main", "eth0", "10.0.0.253", "10.0.0.238")
    # a proxy mark leads to table 2004, absent from this snapshot: the walk goes on
    marked = cilium_eni.lookup("8.8.8.8", mark=0x200)
    assert marked.table == "main"
    assert "table 2004 has no route for 8.8.8.8" in marked.steps[0]


def test_terway_per_pod_table():
    prefix = "imroc-ack-terway-default_"
    rules = parse_ip_rules(_read(prefix + "ip-rule-list.txt"), "ip-rule.txt")
    tables = parse_ip_routes(_read(prefix + "ip-route-show-table-main.txt"), "main").merge(
        parse_ip_routes(_read(prefix + "ip-route-show-table-1004.txt"), "1004", "1004"))
    decision = route_lookup(rules, tables, "1.2.3.4", src="10.0.5.103", iif="caliaec797095c6")
    assert (decision.table, decision.dev, decision.gateway, decision.onlink) == \
        ("1004", "eth1", "10.0.5.253", True)


# --------------------------------------------------------------------------- rule semantics

RULES = """\
0:\tfrom all lookup local
5:\tfrom all fwmark 0x1/0x1 goto 50
6:\tfrom all lookup 30
7:\tfrom 10.9.0.0/16 goto 9999 [unresolved]
8:\tfrom all nop
10:\tfrom all to 198.51.100.0/24 blackhole
11:\tfrom all to 198.51.101.0/24 prohibit
12:\tfrom all to 198.51.102.0/24 unreachable
20:\tfrom all iif lo to 203.0.113.0/24 lookup 20
21:\tfrom all iif eth9 [detached] lookup 20
22:\tfrom all oif eth1 lookup 21
50:\tfrom all lookup main suppress_prefixlength 0
51:\tnot from all fwmark 0xca6c lookup 51820
32766:\tfrom all lookup main
32767:\tfrom all lookup default
"""
ROUTES = """\
default via 10.0.0.1 dev eth0 metric 100
default via 10.1.0.1 dev eth1 metric 50
10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.5
10.1.0.0/24 dev eth1 proto kernel scope link src 10.1.0.5
172.16.0.0/12 via 10.0.0.2 dev eth0 metric 20
172.16.0.0/12 via 10.1.0.2 dev eth1 metric 10
172.16.1.0/24 via 10.0.0.3 dev eth0 dead linkdown
172.16.1.0/24 via 10.0.0.4 dev eth0 metric 5
192.0.2.0/24 tos 0x10 via 10.0.0.8 dev eth0
192.0.2.0/24 via 10.1.0.8 dev eth1
100.64.0.0/10 proto static metric 10
\tnexthop via 10.0.0.6 dev eth0 weight 1
\tnexthop via 10.1.0.6 dev eth1 weight 3
throw 100.64.5.0/24 table 30
100.64.6.0/24 via 10.0.0.30 dev eth0 table 30
203.0.113.0/25 via 10.0.0.20 dev eth0 table 20
default via 10.1.0.21 dev eth1 table 21
default dev eth0 scope link table 51820
"""


@pytest.fixture(scope="module")
def policy():
    return Router(parse_ip_rules(RULES, "ip-rule.txt"), parse_ip_routes(ROUTES, "ip-route.txt"))


def _where(decision):
    return decision.kind, decision.table, decision.dev, decision.gateway


def test_longest_prefix_then_lowest_metric(policy):
    assert _where(policy.lookup("172.16.9.9", mark=0xCA6C)) == \
        ("unicast", "main", "eth1", "10.1.0.2")
    # the /24 wins over the /12; its dead path is skipped, the next one by metric is used
    assert _where(policy.lookup("172.16.1.9", mark=0xCA6C)) == \
        ("unicast", "main", "eth0", "10.0.0.4")


def test_tos_routes(policy):
    assert policy.lookup("192.0.2.1", tos=0x10).gateway == "10.0.0.8"
    assert policy.lookup("192.0.2.1").gateway == "10.1.0.8"


def test_suppress_prefixlength_and_not(policy):
    # main's default route is suppressed; "not fwmark 0xca6c" then catches the packet
    decision = policy.lookup("8.8.8.8")
    assert _where(decision) == ("unicast", "51820", "eth0", None)
    assert any("suppressed (prefix length 0 <= suppress_prefixlength 0)" in s
               for s in decision.steps)
    # with the mark, "not" does not match and main is used: metric 50 beats 100
    assert _where(policy.lookup("8.8.8.8", mark=0xCA6C)) == ("unicast", "main", "eth1", "10.1.0.1")


def test_goto_skips_rules_and_unresolved_goto_is_ignored(policy):
    jumped = policy.lookup("100.64.6.1", mark=0x1)
    assert jumped.table != "30"                          # rule 6 (lookup 30) was jumped over
    assert any("jumps to priority 50" in s for s in jumped.steps)
    assert policy.lookup("100.64.6.1").table == "30"
    unresolved = policy.lookup("8.8.8.8", src="10.9.1.1", iif="eth0", mark=0xCA6C)
    assert unresolved.table == "main"
    assert any("no rule has priority 9999" in s for s in unresolved.steps)


def test_throw_hands_back_to_the_rules(policy):
    decision = policy.lookup("100.64.5.1", mark=0xCA6C)
    assert decision.table == "main"
    assert any("throws the lookup back to the rules" in s for s in decision.steps)


def test_multipath_branches(policy):
    decision = policy.lookup("100.64.9.9", mark=0xCA6C)
    assert decision.kind == "unicast" and decision.dev is None and decision.gateway is None
    assert decision.nexthops == [(0.25, "10.0.0.6", "eth0"), (0.75, "10.1.0.6", "eth1")]
    assert decision.reason.startswith("100.64.9.9 multipath: 25% via 10.0.0.6 dev eth0, "
                                      "75% via 10.1.0.6 dev eth1")
    # an output device pins one branch
    pinned = policy.lookup("100.64.9.9", oif="eth0", mark=0xCA6C)
    assert pinned.nexthops == [(1.0, "10.0.0.6", "eth0")]
    assert (pinned.dev, pinned.gateway) == ("eth0", "10.0.0.6")


@pytest.mark.parametrize("dst, kind, error", [
    ("198.51.100.1", "blackhole", "Invalid argument"),
    ("198.51.101.1", "prohibit", "Permission denied"),
    ("198.51.102.1", "unreachable", "Network is unreachable"),   # a rule's unreachable
])
def test_rule_actions(policy, dst, kind, error):
    decision = policy.lookup(dst)
    assert (decision.kind, decision.error) == (kind, error)
    assert decision.route is None and decision.rule is not None
    assert f"rejects {dst}" in decision.reason


def test_iif_lo_matches_locally_generated_only(policy):
    assert policy.lookup("203.0.113.7").table == "20"
    assert policy.lookup("203.0.113.7", src="10.0.0.77", iif="eth0").table != "20"


def test_oif_rule_and_detached_iif(policy):
    assert policy.lookup("9.9.9.9", oif="eth1").table == "21"
    decision = policy.lookup("9.9.9.9", src="10.0.0.77", iif="eth9")
    assert decision.table != "20"


def test_oif_without_a_matching_route_sends_on_link():
    rules = parse_ip_rules(DEFAULT_IP_RULES, "r")
    tables = parse_ip_routes("default via 10.0.0.1 dev eth0\n", "t")
    decision = route_lookup(rules, tables, "8.8.8.8", oif="eth1")
    assert (decision.kind, decision.dev, decision.gateway, decision.table) == \
        ("unicast", "eth1", None, None)


def test_non_local_source_is_refused(policy):
    decision = policy.lookup("8.8.8.8", src="192.0.2.99")
    assert (decision.kind, decision.error) == ("invalid", "Network is unreachable")


def test_rp_filter_strict():
    rules = parse_ip_rules(DEFAULT_IP_RULES, "r")
    tables = parse_ip_routes("10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.5\n"
                             "10.1.0.0/24 dev eth1 proto kernel scope link src 10.1.0.5\n"
                             "default via 10.0.0.1 dev eth0\n", "t")
    addrs = parse_ip_addr("2: eth0: <UP> mtu 1500\n    inet 10.0.0.5/24 scope global eth0\n"
                          "3: eth1: <UP> mtu 1500\n    inet 10.1.0.5/24 scope global eth1\n", "a")
    strict = Router(rules, tables, addrs, sysctls={"eth1": Sysctls(rp_filter=1)})
    decision = strict.lookup("10.0.0.9", src="8.8.8.8", iif="eth1")
    assert (decision.kind, decision.error) == ("invalid", "Invalid argument")
    assert "rp_filter (strict) on eth1" in decision.reason
    loose = Router(rules, tables, addrs, sysctls={"eth1": Sysctls(rp_filter=2)})
    assert loose.lookup("10.0.0.9", src="8.8.8.8", iif="eth1").kind == "unicast"


def test_undecidable_rules_report_unknown():
    rules = parse_ip_rules("0:\tfrom all lookup local\n10:\tfrom all uidrange 1000-2000 lookup 5\n"
                           "20:\tfrom 10.0.0.0/8 frobnicate 7 lookup 6\n"
                           "32766:\tfrom all lookup main\n", "ip-rule.txt")
    assert rules[2].unknown == "unknown keyword 'frobnicate 7'"
    tables = parse_ip_routes("default via 10.0.0.1 dev eth0\n", "t")
    router = Router(rules, tables)
    unknown = router.lookup("8.8.8.8")                  # who sends it? uid unknown
    assert unknown.kind == "unknown" and "uidrange" in unknown.reason
    assert router.lookup("8.8.8.8", uid=0).kind == "unicast"
    # the unknown keyword cannot matter when the rule's known selectors do not match
    assert router.lookup("8.8.8.8", src="192.0.2.1", iif="eth0").kind == "unicast"
    assert router.lookup("8.8.8.8", src="10.0.0.7", iif="eth0").kind == "unknown"


def test_lookup_is_fast_on_big_tables():
    rng = random.Random(1)
    lines = ["default via 10.0.0.1 dev eth0"] + [
        f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)} dev lxc{i} scope link"
        for i in range(20000)]
    rules = "0:\tfrom all lookup local\n" + "".join(
        f"111:\tfrom 10.0.{i // 250}.{i % 250} lookup 10\n" for i in range(500)) + \
        "32766:\tfrom all lookup main\n"
    router = Router(parse_ip_rules(rules, "r"), parse_ip_routes("\n".join(lines), "t"))
    started = time.perf_counter()
    for _ in range(1000):
        router.lookup(f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}")
    assert time.perf_counter() - started < 5.0


# --------------------------------------------------------------------------- parsers


def _parser_for(name: str):
    """Every corpus file goes to exactly one parser, chosen by its name."""
    if "neigh" in name:
        return parse_ip_neigh
    if "ip-rule" in name:
        return parse_ip_rules
    if "route" in name:
        return parse_ip_routes
    if "ip-a" in name or "link" in name:
        return parse_ip_addr
    raise AssertionError(f"no parser for {name}")


@pytest.mark.parametrize("path", sorted(REALWORLD.iterdir()), ids=lambda p: p.name)
def test_realworld_files_parse(path):
    parser = _parser_for(path.name)
    records = parser(path.read_text(), path.name)
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert len(records) > 0
    if parser is parse_ip_rules:
        assert len(records) == len(lines) and not [r for r in records if r.unknown]
    if parser is parse_ip_neigh:
        assert len(records) == len(lines) and not [r for r in records if r.extra]
    if parser is parse_ip_routes:
        assert len(records) == len(lines)               # no multipath in the corpus
        for route in records:
            assert route.source.text == lines[route.source.line - 1]


def test_realworld_addresses_and_links():
    links = parse_ip_addr(_read("imroc-ack-cilium-eni_ip-a.txt"), "ip-a.txt")
    by_name = {i.name: i for i in links}
    assert by_name["cilium_host"].link == "cilium_net"
    assert by_name["lxc_health"].link == "if9" and by_name["lxc_health"].index == 10
    eth0 = by_name["eth0"]
    assert (eth0.mac, eth0.mtu, eth0.state, eth0.altnames) == \
        ("00:16:3e:23:f5:96", 1500, "UP", ("enp0s6", "ens6"))
    inet = eth0.ipv4()[0]
    assert (inet.address, inet.prefixlen, inet.broadcast, inet.scope, inet.label) == \
        ("10.0.0.238", 24, "10.0.0.255", "global", "eth0")
    assert {"dynamic", "noprefixroute"} <= inet.flags
    assert len(by_name["kube-ipvs0"].ipv4()) == 6
    assert by_name["lxc716f4afaa7f3"].link_netns == "cni-d4cf52f7-6ac6-9aa6-8085-ead4cab5bc0d"

    detailed = parse_ip_addr(_read("imroc-ack-terway-default_ip-d-link-show.txt"), "link.txt")
    kinds = {i.name: i.kind for i in detailed}
    assert kinds["kube-ipvs0"] == "dummy" and kinds["caliaec797095c6"] == "veth"
    stats = parse_ip_addr(_read("g00ntar-cilium-sysdump-k3s_ip-d-s-link.txt"), "s.txt")
    assert [i.name for i in stats] == ["lo", "eth0"]


def test_route_parser_details():
    text = ("unreachable default dev lo table unspec proto kernel metric 4294967295 error -101 "
            "pref medium\n"
            "default via inet6 fe80::1 dev eth0 proto bgp metric 20\n"
            "10.8.0.0/16 tos 0x10 via 10.0.0.3 dev eth0 mtu lock 1400 advmss 1300 frobnicate\n"
            "10.9.0.0/16 \\\tnexthop via 10.0.0.2 dev eth0 weight 1 \\\tnexthop via 10.1.0.2 "
            "dev eth1 weight 3 onlink\n"
            "fec0::/64 dev eth0 proto kernel metric 256 expires 86315sec pref medium\n"
            "    cache\n"
            "local default dev lo scope host\n")
    tables = parse_ip_routes(text, "ip-route.txt", default_table="2004")
    unreach, rfc5549, tos, multipath, v6, local = list(tables)
    assert (unreach.type, unreach.family, unreach.table, unreach.metric) == \
        ("unreachable", 6, "unspec", 4294967295)
    assert (rfc5549.family, rfc5549.gateway, rfc5549.table) == (4, "fe80::1", "2004")
    assert tos.tos == 0x10 and ("mtu", "lock 1400") in tos.attrs and tos.extra == ("frobnicate",)
    assert [(h.gateway, h.dev, h.weight, h.onlink) for h in multipath.nexthops] == \
        [("10.0.0.2", "eth0", 1, False), ("10.1.0.2", "eth1", 3, True)]
    assert v6.family == 6 and str(v6.dst) == "fec0::/64"
    assert (local.type, local.table, local.scope, str(local.dst)) == \
        ("local", "2004", "host", "default")
    assert tables.notes == ["ip-route.txt:6: route cache line ignored"]


def test_table_names_and_numbers_are_one():
    tables = parse_ip_routes("default via 10.0.0.1 dev eth0 table 254\n", "t")
    rules = parse_ip_rules("0:\tfrom all lookup 255\n1:\tfrom all lookup 254\n", "r")
    assert tables.names() == ["main"] and [r.table for r in rules] == ["local", "main"]


@pytest.mark.parametrize("parser, text, line, reason", [
    (parse_ip_rules, "0:\tfrom all lookup local\nhello world\n", 2, "not an 'ip rule' line"),
    (parse_ip_rules, "5:\tfrom 10.0.0.300 lookup 10\n", 1, "bad value '10.0.0.300' for 'from'"),
    (parse_ip_rules, "5:\tfrom all fwmark\n", 1, "'fwmark' needs a value"),
    (parse_ip_routes, "default via 10.0.0.1 dev eth0\nError: ipv4: FIB table does not exist.\n",
     2, "not an 'ip route' line"),
    (parse_ip_routes, "10.0.0.0/24 dev eth0 metric abc\n", 1, "bad value 'abc' for 'metric'"),
    (parse_ip_routes, "10.0.0.0/24 dev eth0\n    garbage here\n", 2, "not an 'ip route' line"),
    (parse_ip_addr, "    inet 10.0.0.1/24 scope global eth0\n", 1, "indented line before"),
    (parse_ip_addr, "1: lo: <LOOPBACK> mtu 65536\n    inet 10.0.0.999/24 scope host lo\n", 2,
     "bad address"),
    (parse_ip_addr, "Device \"eth7\" does not exist.\n", 1, "not an 'ip addr' / 'ip link' line"),
])
def test_bad_input_is_located(parser, text, line, reason):
    with pytest.raises(InputError) as caught:
        parser(text, "nodes/w1/input.txt")
    error = caught.value
    assert (error.file, error.line) == ("nodes/w1/input.txt", line)
    assert error.text == text.splitlines()[line - 1]
    assert reason in error.reason
    assert str(error).startswith(f"nodes/w1/input.txt, line {line}: ")


def test_oneline_formats():
    addrs = parse_ip_addr("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever "
                          "preferred_lft forever\n2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 "
                          "scope global eth0\\       valid_lft forever preferred_lft forever\n",
                          "ip-o-addr.txt")
    assert [(i.name, i.ipv4()[0].address) for i in addrs] == [("lo", "127.0.0.1"),
                                                              ("eth0", "10.0.0.5")]
    links = parse_ip_addr("2: eth0: <BROADCAST,UP> mtu 1500 qdisc mq state UP mode DEFAULT "
                          "group default qlen 1000\\    link/ether 52:54:00:12:34:56 brd "
                          "ff:ff:ff:ff:ff:ff\n", "ip-o-link.txt")
    assert links[0].mac == "52:54:00:12:34:56" and links[0].is_up
