"""nftables: parsing `nft list ruleset` output and simulating hooks (kube-proxy nftables mode).

The real-world corpus (tests/data/realworld/nft) must parse without syntax errors, with concrete
facts checked per file; a kube-proxy ruleset written here (the shape of kube-proxy's own
expected output in pkg/proxy/nftables) checks the simulation: numgen endpoint choice, NodePort
only to local addresses, masquerade only when marked.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from traceflow.model.errors import InputError
from traceflow.engines.netfilter.engine import NodeContext
from traceflow.engines.netfilter.iptables import NotModelled, RuleSyntaxError
from traceflow.engines.netfilter.nft import (AddrPattern, Cmp, IntPattern, Nat, NftRuleset, SetStmt,
                                             Unknown, VerdictStmt, VMap, XtMatch, parse_nft_ruleset)
from traceflow.model.packet import Packet

DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
NFT_DIR = DATA / "realworld" / "nft"
K3S = "mirzahilmi-k3s_nft-list-table-ip-kube-proxy.txt"
IMROC = "imroc-ack-cilium-ipvs_nft-list-ruleset.txt"


def tcp(src: str, dst: str, dport: int = 80, sport: int = 40000, proto: int = 6) -> Packet:
    return Packet(nw_src=src, nw_dst=dst, nw_proto=proto, tp_src=sport, tp_dst=dport)


def chains(branch) -> list[str]:
    """The chains the branch's steps went through, without repeats in a row."""
    out: list[str] = []
    for step in branch.steps:
        if not out or out[-1] != step.chain:
            out.append(step.chain)
    return out


def realworld(name: str) -> NftRuleset:
    return parse_nft_ruleset((NFT_DIR / name).read_text(), f"nodes/n1/{name}")


def corpus() -> list[str]:
    return sorted(p.name for p in NFT_DIR.iterdir()) if NFT_DIR.is_dir() else []


# --- the real-world corpus --------------------------------------------------------------------


@pytest.mark.parametrize("name", corpus())
def test_every_realworld_nft_file_parses_without_syntax_errors(name):
    ruleset = realworld(name)
    assert ruleset.syntax_errors == []
    ruleset.raise_for_errors()
    assert sum(1 for _ in ruleset.rules()) > 0


def test_k3s_kube_proxy_table():
    ruleset = realworld(K3S)
    assert list(ruleset.tables) == ["ip kube-proxy"]
    table = ruleset.table("ip", "kube-proxy")
    assert table.comment == "rules for kube-proxy"
    assert len(table.chains) == 43
    assert sum(len(c.rules) for c in table.chains.values()) == 77
    assert {n: len(s.elements) for n, s in table.sets.items()} == {
        "service-ips": 9, "service-nodeports": 1, "nodeport-ips": 1, "cluster-ips": 7,
        "no-endpoint-services": 2, "no-endpoint-nodeports": 0, "firewall-ips": 0}
    assert ruleset.diagnostics == []
    # a concatenated map element and its verdict
    service_ips = table.sets["service-ips"]
    assert service_ips.kind == "map"
    assert service_ips.key_types == ("ipv4_addr", "inet_proto", "inet_service")
    assert service_ips.data_type == "verdict"
    dns = service_ips.elements[1]
    assert dns.text == "10.43.0.10 . udp . 53 : goto service-FY5PMXPG-kube-system/kube-dns/udp/dns"
    assert dns.line == 18
    assert dns.key == (AddrPattern("10.43.0.10", 4, 0x0A2B000A, 0x0A2B000A),
                       IntPattern("udp", 17, 17), IntPattern("53", 53, 53))
    assert (dns.data.kind, dns.data.target) == ("goto",
                                                "service-FY5PMXPG-kube-system/kube-dns/udp/dns")
    # per-element comments
    no_ep = table.sets["no-endpoint-services"].elements[0]
    assert no_ep.comment == "riset/otelcol-opentelemetry-collector:otlp"
    # base chains: named priorities with offsets
    base = {c.name: (c.type, c.hook, c.priority) for c in table.chains.values() if c.is_base}
    assert base == {"nat-prerouting": ("nat", "prerouting", -100),
                    "filter-prerouting": ("filter", "prerouting", -110),
                    "filter-input": ("filter", "input", -110),
                    "filter-forward": ("filter", "forward", -110),
                    "filter-output": ("filter", "output", -110),
                    "filter-output-post-dnat": ("filter", "output", -90),
                    "nat-output": ("nat", "output", -100),
                    "nat-postrouting": ("nat", "postrouting", 100)}
    assert table.chains["reject-chain"].comment == \
        "helper for @no-endpoint-services / @no-endpoint-nodeports"
    # the 9-way numgen vmap of the NodePort service
    rule = table.chains["service-P6J77WGM-riset/hellopod-np-svc/tcp/"].rules[1]
    assert rule.source.line == 47
    (vmap,) = rule.exprs
    assert isinstance(vmap, VMap) and vmap.key[0].modulus == 9
    assert len(vmap.table.items) == 9
    assert vmap.table.items[8].data.target == \
        "endpoint-ZWSL4UYY-riset/hellopod-np-svc/tcp/__10.42.5.164/8080"
    masq = table.chains["masquerading"].rules
    assert [type(e) for e in masq[0].exprs] == [Cmp, VerdictStmt]
    assert masq[0].exprs[0].key[0].ops == (("&", 0x4000),)
    assert isinstance(masq[1].exprs[0], SetStmt)
    assert isinstance(masq[2].exprs[0], Nat) and masq[2].exprs[0].flags == ("fully-random",)


def test_k3s_cluster_ip_and_node_port():
    ruleset = realworld(K3S)
    (dns,) = ruleset.evaluate_hook("PREROUTING", tcp("10.42.1.5", "10.43.0.10", 53, proto=17),
                                   NodeContext(node="n1"))
    assert (dns.verdict, dns.packet.nw_dst, dns.packet.tp_dst) == ("ACCEPT", "10.42.0.171", 53)
    assert dns.nat.translated == ("10.42.0.171", 53)
    assert chains(dns)[-3:] == ["services", "service-FY5PMXPG-kube-system/kube-dns/udp/dns",
                                "endpoint-S4FSIJI2-kube-system/kube-dns/udp/dns__10.42.0.171/53"]
    assert dns.packet.mark == 0                       # a pod source is not masqueraded
    branches = ruleset.evaluate_hook("PREROUTING", tcp("192.168.1.5", "10.34.4.246", 30000),
                                     NodeContext(node="n1", local_addresses={"10.34.4.246"}))
    assert len(branches) == 9
    assert sum(b.weight for b in branches) == pytest.approx(1.0)
    assert {b.packet.tp_dst for b in branches} == {8080}
    assert all(b.packet.mark == 0x4000 for b in branches)
    # an unallocated cluster IP is dropped in the forward hook
    (drop,) = ruleset.evaluate_hook("FORWARD", tcp("10.42.1.5", "10.43.99.10"),
                                    NodeContext(node="n1"))
    assert drop.verdict == "DROP"
    assert drop.steps[-1].effect == "drop (Drop traffic to unallocated ClusterIPs)"
    # a service without endpoints is rejected through the no-endpoint-services vmap
    (reject,) = ruleset.evaluate_hook("FORWARD", tcp("10.42.1.5", "10.43.21.102", 4317),
                                      NodeContext(node="n1"))
    assert reject.verdict == "REJECT"
    assert chains(reject) == ["filter-forward", "service-endpoints-check", "reject-chain"]


def test_imroc_iptables_nft_ruleset():
    ruleset = realworld(IMROC)
    assert list(ruleset.tables) == ["ip nat", "ip6 nat", "ip mangle", "ip filter", "ip6 mangle",
                                    "ip6 filter", "ip raw"]
    assert {k: len(t.chains) for k, t in ruleset.tables.items()} == {
        "ip nat": 13, "ip6 nat": 10, "ip mangle": 9, "ip filter": 14, "ip6 mangle": 7,
        "ip6 filter": 10, "ip raw": 4}
    assert sum(1 for _ in ruleset.rules()) == 100
    nat = ruleset.table("ip", "nat")
    # `# match-set ...` is an iptables-nft extension nft can only print as a comment
    rule = nat.chains["KUBE-SERVICES"].rules[1]
    assert rule.source.line == 29
    assert [type(e).__name__ for e in rule.exprs] == ["Cmp", "XtMatch", "Passive", "VerdictStmt"]
    xt = rule.exprs[1]
    assert isinstance(xt, XtMatch)
    assert (xt.match.set_name, xt.match.flags) == ("KUBE-CLUSTER-IP", ("dst", "dst"))
    assert rule.exprs[-1].verdict.target == "KUBE-MARK-MASQ"
    whole_line = nat.chains["KUBE-SERVICES"].rules[3]      # a rule that starts with `#`
    assert isinstance(whole_line.exprs[0], XtMatch) and whole_line.source.line == 31
    # TPROXY is a target nft cannot translate: kept, and UNKNOWN when reached
    tproxy = ruleset.table("ip", "mangle").chains["CILIUM_PRE_mangle"].rules[3]
    assert isinstance(tproxy.exprs[-1], Unknown) and tproxy.exprs[-1].statement
    not_modelled = [d for d in ruleset.diagnostics if isinstance(d, NotModelled)]
    assert [d.line for d in not_modelled] == [139, 142, 143]
    assert any("iptables extensions" in c for c in ruleset.caveats)
    masq = ruleset.table("ip6", "nat").chains["KUBE-POSTROUTING"].rules[2]
    assert masq.exprs[-1].flags == ("random-fully",)


def test_imroc_match_set_reads_the_ipsets():
    ruleset = realworld(IMROC)
    syn = tcp("192.168.1.5", "172.16.0.10")
    ipsets = {"KUBE-CLUSTER-IP": ["172.16.0.10,tcp:80"]}
    # nat OUTPUT of a host process: the ipset decides KUBE-MARK-MASQ then accept
    (out,) = ruleset.evaluate_hook("OUTPUT", syn, NodeContext(node="n1", out_iface="eth0",
                                                              ipsets=ipsets))
    assert out.verdict == "ACCEPT"
    marked = [s for s in out.steps if s.chain == "KUBE-MARK-MASQ"]
    assert marked and "mark 0x0 -> 0x4000" in marked[0].effect
    accepted = [s for s in out.steps if s.chain == "KUBE-SERVICES" and s.effect == "accept"]
    assert accepted[0].matched == ("match-set KUBE-CLUSTER-IP",)
    # without ipset.txt the same rule cannot be decided, and the step says what is missing
    (unknown,) = ruleset.evaluate_hook("OUTPUT", syn, NodeContext(node="n1", out_iface="eth0"))
    assert unknown.verdict == "UNKNOWN"
    assert "ipset KUBE-CLUSTER-IP is not in the bundle" in unknown.steps[-1].effect
    assert ":29 `ip saddr != 10.0.0.0/8" in unknown.steps[-1].effect


def test_imroc_notrack_skips_nat_and_socket_match_is_unknown():
    ruleset = realworld(IMROC)
    (dns,) = ruleset.evaluate_hook("OUTPUT", tcp("10.0.0.5", "169.254.20.10", 53, proto=17),
                                   NodeContext(node="n1", out_iface="eth0"))
    assert dns.verdict == "ACCEPT"
    assert "UNTRACKED" in dns.ct_state
    skipped = [s for s in dns.steps if s.table == "ip nat"]
    assert [s.effect for s in skipped] == [
        ("nat chain not consulted: not the first packet of a connection (conntrack applies any "
        "NAT)")]
    assert dns.packet.mark == 0xC00            # CILIUM_OUTPUT: mark and 0xfffff0ff xor 0xc00
    # prerouting has no output interface (oifname is ""), then `# socket --transparent` stops it
    (pre,) = ruleset.evaluate_hook("PREROUTING", tcp("192.168.1.5", "172.16.0.10"),
                                   NodeContext(node="n1", in_iface="eth0"))
    assert pre.verdict == "UNKNOWN"
    assert pre.steps[-1].unknown
    assert pre.steps[-1].rule.source.line == 139
    assert "socket --transparent" in pre.steps[-1].effect


# --- kube-proxy nftables mode, written the way `nft list table ip kube-proxy` prints it -------

KUBE_PROXY = """\
table ip kube-proxy {
	comment "rules for kube-proxy"

	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 172.30.0.41 }
	}

	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
	}

	map service-nodeports {
		type inet_proto . inet_service : verdict
		comment "NodePort traffic"
		elements = { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}

	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}

	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
		fib daddr type local ip daddr != 127.0.0.0/8 jump nodeports comment "kubernetes service nodeports"
	}

	chain nodeports {
		meta l4proto . th dport vmap @service-nodeports
	}

	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}

	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}

	chain service-ULMVA6XW-ns1/svc1/tcp/p80 {
		ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
		numgen random mod 3 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80, 1 : goto endpoint-UNZV3OEC-ns1/svc1/tcp/p80__10.180.0.4/80, 2 : goto endpoint-5RFCDDV7-ns1/svc1/tcp/p80__10.180.2.5/8080 }
	}

	chain external-ULMVA6XW-ns1/svc1/tcp/p80 {
		jump mark-for-masquerade
		goto service-ULMVA6XW-ns1/svc1/tcp/p80
	}

	chain endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 {
		ip saddr 10.180.0.1 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.180.0.1:80
	}

	chain endpoint-UNZV3OEC-ns1/svc1/tcp/p80__10.180.0.4/80 {
		ip saddr 10.180.0.4 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.180.0.4:80
	}

	chain endpoint-5RFCDDV7-ns1/svc1/tcp/p80__10.180.2.5/8080 {
		ip saddr 10.180.2.5 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.180.2.5:8080
	}
}
"""
NODE_IP = "192.168.0.2"
SERVICE = "service-ULMVA6XW-ns1/svc1/tcp/p80"
ENDPOINTS = ["endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80",
             "endpoint-UNZV3OEC-ns1/svc1/tcp/p80__10.180.0.4/80",
             "endpoint-5RFCDDV7-ns1/svc1/tcp/p80__10.180.2.5/8080"]


@pytest.fixture(scope="module")
def kube_proxy() -> NftRuleset:
    ruleset = parse_nft_ruleset(KUBE_PROXY, "nodes/worker1/nft.txt")
    ruleset.raise_for_errors()
    assert ruleset.diagnostics == []
    return ruleset


def ctx(**kwargs) -> NodeContext:
    return NodeContext(node="worker1", local_addresses={NODE_IP}, **kwargs)


def test_cluster_ip_three_endpoints_by_numgen(kube_proxy):
    syn = tcp("10.0.0.2", "172.30.0.41", 80)
    branches = kube_proxy.evaluate_hook("PREROUTING", syn, ctx())
    assert [b.verdict for b in branches] == ["ACCEPT"] * 3
    assert [b.weight for b in branches] == [pytest.approx(1 / 3)] * 3
    assert [(b.packet.nw_dst, b.packet.tp_dst) for b in branches] == [
        ("10.180.0.1", 80), ("10.180.0.4", 80), ("10.180.2.5", 8080)]
    assert [b.nat.translated for b in branches] == [
        ("10.180.0.1", 80), ("10.180.0.4", 80), ("10.180.2.5", 8080)]
    assert all(b.nat.kind == "DNAT" and b.nat.original == ("172.30.0.41", 80) for b in branches)
    assert [chains(b) for b in branches] == [["nat-prerouting", "services", SERVICE, ep]
                                             for ep in ENDPOINTS]
    first = branches[0]
    assert all(s.table == "ip kube-proxy" for s in first.steps)
    assert first.steps[0].effect == "jump to services"
    assert first.steps[1].effect == (
        "ip daddr . meta l4proto . th dport 172.30.0.41 . tcp . 80 found in @service-ips: "
        "element `172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80` (line 13); "
        f"goto {SERVICE}")
    assert first.steps[1].matched == ("ip daddr . meta l4proto . th dport",)
    assert first.steps[2].effect == f"numgen random mod 3 = 0 (probability 1/3); goto {ENDPOINTS[0]}"
    assert first.steps[3].effect == "DNAT 172.30.0.41:80 -> 10.180.0.1:80"
    assert first.steps[3].matched == ("meta l4proto",)
    dnat_rule = first.steps[3].rule
    assert (dnat_rule.source.file, dnat_rule.source.line) == ("nodes/worker1/nft.txt", 68)
    assert dnat_rule.text == "meta l4proto tcp dnat to 10.180.0.1:80"
    assert "DNAT" in first.ct_state
    # a pod source is not marked for masquerade; the caller's packet is untouched
    assert all(b.packet.mark == 0 for b in branches)
    assert syn.nw_dst == "172.30.0.41"


def test_cluster_ip_from_outside_the_pod_cidr_is_marked(kube_proxy):
    branches = kube_proxy.evaluate_hook("PREROUTING", tcp("203.0.113.2", "172.30.0.41"), ctx())
    assert len(branches) == 3
    assert all(b.packet.mark == 0x4000 for b in branches)
    mark = [s for s in branches[0].steps if s.chain == "mark-for-masquerade"]
    assert [s.effect for s in mark] == [
        ("MARK `meta mark set meta mark | 0x00004000`: mark 0x0 -> 0x4000 "
        "(mark-for-masquerade: masquerade on the way out)")]
    assert branches[0].steps[2].matched == ("ip daddr", "tcp dport", "ip saddr")
    # hairpin: the endpoint itself is marked only on its own branch
    hairpin = kube_proxy.evaluate_hook("PREROUTING", tcp("10.180.0.4", "172.30.0.41"), ctx())
    assert [b.packet.mark for b in hairpin] == [0, 0x4000, 0]


def test_node_port_only_for_local_destinations(kube_proxy):
    branches = kube_proxy.evaluate_hook("PREROUTING", tcp("203.0.113.2", NODE_IP, 3001), ctx())
    assert [(b.packet.nw_dst, b.packet.tp_dst) for b in branches] == [
        ("10.180.0.1", 80), ("10.180.0.4", 80), ("10.180.2.5", 8080)]
    assert [b.weight for b in branches] == [pytest.approx(1 / 3)] * 3
    assert all(b.packet.mark == 0x4000 for b in branches)
    assert chains(branches[2]) == [
        "nat-prerouting", "services", "nodeports", "external-ULMVA6XW-ns1/svc1/tcp/p80",
        "mark-for-masquerade", "external-ULMVA6XW-ns1/svc1/tcp/p80", SERVICE, ENDPOINTS[2]]
    fib = [s for s in branches[0].steps if s.effect.startswith("jump to nodeports")]
    assert fib[0].matched == ("fib daddr type", "ip daddr")
    assert fib[0].effect == "jump to nodeports (kubernetes service nodeports)"
    # the same port on an address that is not the node's: no NodePort, nothing changes
    (other,) = kube_proxy.evaluate_hook("PREROUTING", tcp("203.0.113.2", "192.168.0.99", 3001),
                                        ctx())
    assert other.verdict == "ACCEPT" and other.nat is None
    assert (other.packet.nw_dst, other.packet.tp_dst, other.packet.mark) == ("192.168.0.99",
                                                                             3001, 0)
    assert "nodeports" not in chains(other)
    assert other.steps[-1].effect.startswith("policy accept of base chain nat-prerouting")


def test_masquerade_only_when_marked(kube_proxy):
    (marked,) = kube_proxy.evaluate_hook(
        "POSTROUTING", Packet(nw_src="203.0.113.2", nw_dst="10.180.0.4", nw_proto=6,
                              tp_src=40000, tp_dst=80, mark=0x4000),
        ctx(masquerade_ip=NODE_IP, out_iface="eth0"))
    assert marked.verdict == "ACCEPT"
    assert marked.packet.nw_src == NODE_IP
    assert marked.packet.mark == 0                          # the xor clears the bit
    assert marked.nat.kind == "MASQUERADE"
    assert marked.nat.translated == (NODE_IP, 40000)
    assert chains(marked) == ["nat-postrouting", "masquerading"]
    assert marked.steps[-1].effect.startswith("MASQUERADE 203.0.113.2:40000 -> 192.168.0.2:40000")
    (plain,) = kube_proxy.evaluate_hook("POSTROUTING", tcp("10.0.0.2", "10.180.0.4"),
                                        ctx(masquerade_ip=NODE_IP))
    assert plain.nat is None and plain.packet.nw_src == "10.0.0.2"
    assert [s.effect for s in plain.steps][1] == "return: back to the calling chain"


def test_nat_chains_only_for_new_connections(kube_proxy):
    (established,) = kube_proxy.evaluate_hook(
        "PREROUTING", tcp("10.0.0.2", "172.30.0.41"), ctx(ct_state={"ESTABLISHED"}))
    assert established.nat is None and established.packet.nw_dst == "172.30.0.41"
    assert established.steps[0].effect.startswith("nat chain not consulted")


def test_output_hook_uses_nat_output(kube_proxy):
    branches = kube_proxy.evaluate_hook("OUTPUT", tcp(NODE_IP, "172.30.0.41"), ctx())
    assert len(branches) == 3 and chains(branches[0])[0] == "nat-output"
    # a node process is outside the pod CIDR: marked for masquerade
    assert all(b.packet.mark == 0x4000 for b in branches)


# --- constructs beyond kube-proxy -------------------------------------------------------------

FIREWALL = """\
table inet filter {
	set allowed {
		type ipv4_addr
		flags interval
		elements = { 10.0.0.0/8, 192.168.1.10-192.168.1.20 }
	}

	chain input {
		type filter hook input priority filter; policy drop;
		iifname "lo" accept
		ct state established,related accept
		ip saddr @allowed tcp dport { 22, 8000-8100 } accept
		iifname "lxc*" udp dport 53 accept
		ip saddr != { 172.16.0.0/12 } icmp type echo-request accept
		ip daddr 10.9.9.9 osf name "Linux" drop
		meta skuid 1000 accept
	}
}
table ip early {
	chain pre {
		type filter hook input priority -200; policy accept;
		ip saddr 6.6.6.6 drop
	}
}
"""


@pytest.fixture(scope="module")
def firewall() -> NftRuleset:
    ruleset = parse_nft_ruleset(FIREWALL, "nodes/n1/nft.txt")
    ruleset.raise_for_errors()
    return ruleset


def test_sets_prefixes_ranges_and_wildcards(firewall):
    def verdict(packet, **kw):
        branches = firewall.evaluate_hook("INPUT", packet, NodeContext(node="n1", **kw))
        assert len(branches) == 1
        return branches[0].verdict, branches[0].steps[-1]

    assert verdict(tcp("10.1.2.3", "10.0.0.1", 22), in_iface="eth0")[0] == "ACCEPT"
    assert verdict(tcp("192.168.1.15", "10.0.0.1", 8050), in_iface="eth0")[0] == "ACCEPT"
    assert verdict(tcp("192.168.1.15", "10.0.0.1", 8101), in_iface="eth0")[1].unknown
    assert verdict(tcp("10.1.2.3", "10.0.0.1", 53, proto=17), in_iface="lxc12ab")[0] == "ACCEPT"
    result, step = verdict(tcp("10.1.2.3", "10.0.0.1", 53, proto=17), in_iface="lo")
    assert result == "ACCEPT" and step.matched == ("iifname",)
    echo = Packet(nw_src="8.8.8.8", nw_dst="10.0.0.1", nw_proto=1, tp_src=8, tp_dst=0)
    assert verdict(echo, in_iface="eth0")[0] == "ACCEPT"
    # established traffic is accepted by the ct state list
    result, step = verdict(tcp("8.8.8.8", "10.0.0.1", 9999), in_iface="eth0",
                           ct_state={"ESTABLISHED"})
    assert result == "ACCEPT" and step.matched == ("ct state",)
    # the earlier base chain (priority -200) runs first
    first, _ = verdict(tcp("6.6.6.6", "10.0.0.1", 22), in_iface="eth0")
    assert first == "DROP"


def test_unknown_expression_stops_as_unknown_naming_the_line(firewall):
    (branch,) = firewall.evaluate_hook("INPUT", tcp("8.8.8.8", "10.0.0.1", 9999),
                                       NodeContext(node="n1", in_iface="eth0"))
    assert branch.verdict == "UNKNOWN"
    step = branch.steps[-1]
    assert step.unknown and step.table == "inet filter" and step.chain == "input"
    assert step.rule.source.line == 16
    assert step.effect == ("cannot decide nodes/n1/nft.txt:16 `meta skuid 1000 accept`: "
                           "`meta skuid` is not modelled; the trace stops here")
    # `osf name` is not modelled either, but its rule certainly misses another address
    assert all(s.rule is None or s.rule.source.line != 15 for s in branch.steps)
    # both are reported when the file is read
    lines = [d.line for d in firewall.diagnostics if isinstance(d, NotModelled)]
    assert lines == [15, 16]


def test_unknown_statement_is_kept_and_unknown_when_reached():
    ruleset = parse_nft_ruleset(
        "table ip t {\n chain c {\n  type filter hook prerouting priority 0;\n"
        "  tcp dport 80 tproxy to :50080 accept\n  tcp dport 81 queue num 3\n }\n}\n", "x.txt")
    ruleset.raise_for_errors()
    (hit,) = ruleset.evaluate_hook("PREROUTING", tcp("1.1.1.1", "2.2.2.2", 80), NodeContext())
    assert hit.verdict == "UNKNOWN" and "x.txt:4" in hit.steps[-1].effect
    assert "statement `tproxy` is not modelled" in hit.steps[-1].effect
    (queued,) = ruleset.evaluate_hook("PREROUTING", tcp("1.1.1.1", "2.2.2.2", 81), NodeContext())
    assert queued.verdict == "UNKNOWN" and "queue" in queued.steps[-1].effect
    (other,) = ruleset.evaluate_hook("PREROUTING", tcp("1.1.1.1", "2.2.2.2", 82), NodeContext())
    assert other.verdict == "ACCEPT"


def test_first_nat_binding_skips_later_nat_chains():
    ruleset = parse_nft_ruleset("""\
table ip a {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		tcp dport 80 dnat to 10.1.1.1:8080
	}
}
table ip b {
	chain pre {
		type nat hook prerouting priority dstnat + 5; policy accept;
		tcp dport 80 dnat to 10.2.2.2
	}
	chain filt {
		type filter hook prerouting priority -300; policy accept;
		meta mark set 0x10 counter
	}
}
""", "x.txt")
    ruleset.raise_for_errors()
    (branch,) = ruleset.evaluate_hook("PREROUTING", tcp("1.1.1.1", "2.2.2.2", 80), NodeContext())
    assert (branch.packet.nw_dst, branch.packet.tp_dst, branch.packet.mark) == ("10.1.1.1",
                                                                                8080, 0x10)
    assert [s.table + "/" + s.chain for s in branch.steps] == ["ip b/filt", "ip b/filt",
                                                               "ip a/pre", "ip b/pre"]
    assert branch.steps[-1].effect.startswith("nat chain not consulted: an earlier nat chain")


def test_ip_table_ignores_ipv6_and_inet_sees_both():
    ruleset = parse_nft_ruleset("table ip4only {\n chain c {\n  type filter hook input "
                                "priority 0; policy drop;\n }\n}\n"
                                "table inet both {\n chain c {\n  type filter hook input "
                                "priority 10; policy accept;\n  ip6 saddr ::1 drop\n }\n}\n",
                                "x.txt")
    v6 = Packet(dl_type=0x86DD, nw_src="::1", nw_dst="::1", nw_proto=6, tp_src=1, tp_dst=2)
    (branch,) = ruleset.evaluate_hook("input", v6, NodeContext())
    assert branch.verdict == "DROP" and branch.steps[-1].table == "inet both"
    (v4,) = ruleset.evaluate_hook("input", tcp("1.1.1.1", "2.2.2.2"), NodeContext())
    assert v4.verdict == "DROP" and v4.steps[-1].table == "ip ip4only"
    with pytest.raises(ValueError):
        ruleset.evaluate_hook("ingress", v4.packet, NodeContext())


def test_nft_dash_a_handles_and_multiline_sets():
    ruleset = parse_nft_ruleset("""\
table ip filter { # handle 3
	# Warning: table ip filter is managed by iptables-nft, do not touch!
	chain FORWARD { # handle 1
		type filter hook forward priority filter; policy accept;
		ip daddr { 10.0.0.1,
			   10.0.0.2 } counter packets 0 bytes 0 drop # handle 7
	}
}
""", "x.txt")
    ruleset.raise_for_errors()
    rule = ruleset.table("ip", "filter").chains["FORWARD"].rules[0]
    assert rule.handle == 7 and rule.source.line == 5
    assert rule.text == ("ip daddr { 10.0.0.1, 10.0.0.2 } counter packets 0 bytes 0 drop "
                         "# handle 7")
    (branch,) = ruleset.evaluate_hook("FORWARD", tcp("1.1.1.1", "10.0.0.2"), NodeContext())
    assert branch.verdict == "DROP"


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, line, words", [
    ("table ip t {\n chain c {\n  this is not nft\n }\n}\n", 3, "not an nftables rule"),
    ("table ip t {\n chain c {\n  type filter hook input priority 0;\n  accept\n", 2,
     "never closed"),
    ("table ip t {\n}\n}\n", 3, "unbalanced `}`"),
    ("garbage line\ntable ip t {\n}\n", 1, "expected `table FAMILY NAME {`"),
    ('table ip t {\n chain c {\n  ip saddr 1.1.1.1 comment "open\n }\n}\n', 3,
     "unterminated string"),
    ("table ip t {\n chain c {\n  type filter hook input priority ;\n }\n}\n", 3,
     "bad base chain header"),
    ("table ip t {\n set s {\n  type ipv4_addr\n  elements = { 1.1.1.1 2.2.2.2 }\n }\n}\n", 4,
     "expected `,` between elements"),
    ("table ip t {\n  bogus thing\n}\n", 2, "not a table item"),
])
def test_syntax_errors_name_file_and_line(text, line, words):
    ruleset = parse_nft_ruleset(text, "nodes/n1/nft.txt")
    with pytest.raises(InputError) as raised:
        ruleset.raise_for_errors()
    error = raised.value
    assert isinstance(error, RuleSyntaxError)
    assert (error.file, error.line) == ("nodes/n1/nft.txt", line)
    assert words in error.reason
    assert error.text == text.split("\n")[line - 1]
    assert f"nodes/n1/nft.txt, line {line}" in str(error)


def test_a_bad_line_does_not_hide_the_rest():
    ruleset = parse_nft_ruleset("table ip t {\n chain c {\n  type filter hook input priority 0;"
                                "\n  ??? \n  tcp dport 22 drop\n }\n}\n", "x.txt")
    assert len(ruleset.syntax_errors) == 1
    assert len(ruleset.table("ip", "t").chains["c"].rules) == 1


# --- speed ------------------------------------------------------------------------------------


def generated_kube_proxy(services: int) -> str:
    """kube-proxy's shape: a service chain with a 3-way numgen vmap, 3 endpoint chains each."""
    out = ["table ip kube-proxy {",
           "\tchain nat-prerouting {",
           "\t\ttype nat hook prerouting priority dstnat; policy accept;",
           "\t\tjump services", "\t}",
           "\tchain services {", "\t\tip daddr . meta l4proto . th dport vmap @service-ips", "\t}",
           "\tchain mark-for-masquerade {", "\t\tmeta mark set meta mark | 0x00004000", "\t}"]
    elements = []
    for s in range(services):
        vip = f"10.96.{s // 250}.{s % 250 + 1}"
        svc = f"service-S{s:06d}-ns/svc{s}/tcp/http"
        elements.append(f"{vip} . tcp . 80 : goto {svc}")
        eps = [(f"endpoint-E{s:06d}{k}-ns/svc{s}/tcp/http__10.244.{s % 200}.{k + 1}/8080",
                f"10.244.{s % 200}.{k + 1}") for k in range(3)]
        out += [f"\tchain {svc} {{",
                (f"\t\tip daddr {vip} tcp dport 80 ip saddr != 10.244.0.0/16 jump "
                "mark-for-masquerade"),
                "\t\tnumgen random mod 3 vmap { "
                + ", ".join(f"{k} : goto {name}" for k, (name, _) in enumerate(eps)) + " }",
                "\t}"]
        for name, ip in eps:
            out += [f"\tchain {name} {{", f"\t\tip saddr {ip} jump mark-for-masquerade",
                    f"\t\tmeta l4proto tcp dnat to {ip}:8080", "\t}"]
    out += ["\tmap service-ips {", "\t\ttype ipv4_addr . inet_proto . inet_service : verdict",
            "\t\telements = { " + ",\n\t\t\t     ".join(elements) + " }", "\t}", "}"]
    return "\n".join(out) + "\n"


def test_five_thousand_rules_parse_and_the_service_is_found():
    """5,003 rules of 625 Services (its speed is measured by benchmarks/nft_scale.py)."""
    text = generated_kube_proxy(625)
    ruleset = parse_nft_ruleset(text, "big.txt")
    assert ruleset.diagnostics == []
    assert sum(1 for _ in ruleset.rules()) == 5003
    branches = ruleset.evaluate_hook("PREROUTING", tcp("10.244.9.9", "10.96.2.124"),
                                     NodeContext())
    assert [(b.packet.nw_dst, b.packet.tp_dst) for b in branches] == [
        ("10.244.23.1", 8080), ("10.244.23.2", 8080), ("10.244.23.3", 8080)]


def test_session_affinity_set_pins_a_known_client():
    """kube-proxy's affinity: `ip saddr @affinity-X goto endpoint-X` before the numgen choice."""
    ruleset = parse_nft_ruleset("""\
table ip kube-proxy {
	set affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 3h
		elements = { 10.0.0.7 timeout 3h expires 2h59m50s }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 172.30.0.45 tcp dport 80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
	}

	chain service-HVFWP5L3-ns5/svc5/tcp/p80 {
		ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
		numgen random mod 2 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80, 1 : goto endpoint-X2-ns5/svc5/tcp/p80__10.180.0.9/80 }
	}

	chain endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 {
		update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
		meta l4proto tcp dnat to 10.180.0.3:80
	}

	chain endpoint-X2-ns5/svc5/tcp/p80__10.180.0.9/80 {
		meta l4proto tcp dnat to 10.180.0.9:80
	}
}
""", "x.txt")
    ruleset.raise_for_errors()
    affinity = ruleset.table("ip", "kube-proxy").sets[
        "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"]
    assert affinity.dynamic and affinity.elements[0].expires == "2h59m50s"
    (pinned,) = ruleset.evaluate_hook("PREROUTING", tcp("10.0.0.7", "172.30.0.45"), NodeContext())
    assert pinned.packet.nw_dst == "10.180.0.3" and pinned.weight == 1.0
    assert "dynamic set (session affinity)" in pinned.steps[1].effect
    assert "records the packet in dynamic set" in pinned.steps[2].effect
    fresh = ruleset.evaluate_hook("PREROUTING", tcp("10.0.0.8", "172.30.0.45"), NodeContext())
    assert [(b.weight, b.packet.nw_dst) for b in fresh] == [(0.5, "10.180.0.3"),
                                                            (0.5, "10.180.0.9")]
