"""Simulating netfilter hooks: branches, weights, NAT, marks, verdicts and UNKNOWN stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceflow.engines.netfilter import (NodeContext, evaluate_hook, parse_iptables_list,
                                         parse_iptables_save)
from traceflow.model.packet import Packet

DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
WORKER1 = (DATA / "realworld" / "iptables-list"
           / "antrea-packet-walks_worker1_iptables-t-nat-L-n.txt")


def tcp(src: str, dst: str, sport: int = 54444, dport: int = 80, mark: int = 0) -> Packet:
    return Packet(nw_src=src, nw_dst=dst, nw_proto=6, tp_src=sport, tp_dst=dport, mark=mark)


def chains(branch) -> list[str]:
    """The chains the branch's steps went through, without repeats in a row."""
    out: list[str] = []
    for step in branch.steps:
        if not out or out[-1] != step.chain:
            out.append(step.chain)
    return out


# --- the seed: Antrea worker1, `iptables -t nat -L -n` ----------------------------------------


@pytest.fixture(scope="module")
def worker1():
    return parse_iptables_list(WORKER1.read_text(), "nodes/worker1/iptables-nat-list.txt")


def test_seed_cluster_ip_gives_two_equal_dnat_branches(worker1):
    syn = tcp("10.222.1.48", "10.104.65.133")
    branches = evaluate_hook(worker1, "PREROUTING", syn, NodeContext(node="worker1"))
    assert [b.verdict for b in branches] == ["ACCEPT", "ACCEPT"]
    assert [b.weight for b in branches] == [0.5, 0.5]
    assert [(b.packet.nw_dst, b.packet.tp_dst) for b in branches] == [
        ("10.222.1.47", 80), ("10.222.2.34", 80)]
    assert [chains(b) for b in branches] == [
        ["PREROUTING", "KUBE-SERVICES", "KUBE-SVC-EKL7ZEFK3VFJKKGJ", "KUBE-SEP-6PRWOLZVS5LKSHLK"],
        ["PREROUTING", "KUBE-SERVICES", "KUBE-SVC-EKL7ZEFK3VFJKKGJ", "KUBE-SEP-R5BOSGFC7D2XSIZA"]]
    first, second = branches
    assert first.nat.kind == "DNAT"
    assert first.nat.original == ("10.104.65.133", 80)
    assert first.nat.translated == ("10.222.1.47", 80)
    assert first.steps[-1].effect == "DNAT 10.104.65.133:80 -> 10.222.1.47:80"
    assert first.steps[1].effect == ("jump to KUBE-SVC-EKL7ZEFK3VFJKKGJ "
                                     "(default/backendsvc: cluster IP)")
    assert first.steps[1].matched == ("-p", "-d", "--dport")
    assert first.steps[2].effect.startswith("probability 0.5: take this branch")
    assert "KUBE-SEP-6PRWOLZVS5LKSHLK" in first.steps[2].effect
    # the rule steps point at the bundle lines they came from
    assert first.steps[-1].rule.source.line == 61
    assert first.steps[-1].rule.source.file == "nodes/worker1/iptables-nat-list.txt"
    # a pod source (inside 10.222.0.0/16) is not marked for masquerade
    assert all(b.packet.mark == 0 for b in branches)
    assert "DNAT" in first.ct_state
    # the caller's packet is not modified
    assert syn.nw_dst == "10.104.65.133"


def test_seed_source_outside_pod_cidr_is_marked_for_masquerade(worker1):
    branches = evaluate_hook(worker1, "PREROUTING", tcp("10.79.1.10", "10.104.65.133"),
                             NodeContext(node="worker1"))
    assert [b.weight for b in branches] == [0.5, 0.5]
    assert all(b.packet.mark == 0x4000 for b in branches)
    mark = [s for s in branches[0].steps if s.chain == "KUBE-MARK-MASQ"]
    assert [s.effect for s in mark] == [
        "MARK or 0x4000 -> mark 0x4000 (KUBE-MARK-MASQ: masquerade on the way out)"]
    assert chains(branches[0])[:4] == ["PREROUTING", "KUBE-SERVICES", "KUBE-MARK-MASQ",
                                      "KUBE-SERVICES"]


def test_seed_postrouting_masquerades_only_marked_packets(worker1):
    ctx = NodeContext(node="worker1", masquerade_ip="10.79.1.201", out_iface="genev_sys_6081",
                      ipsets={"ANTREA-POD-IP": ["10.222.0.0/16"]})
    marked, = evaluate_hook(worker1, "POSTROUTING", tcp("10.79.1.10", "10.222.2.34", mark=0x4000),
                            ctx)
    assert marked.verdict == "ACCEPT"
    assert marked.nat.kind == "MASQUERADE"
    assert (marked.packet.nw_src, marked.packet.mark) == ("10.79.1.201", 0)
    assert [s.effect for s in marked.steps[-2:]] == [
        "MARK xor 0x4000 -> mark 0x0",
        "MASQUERADE 10.79.1.10:54444 -> 10.79.1.201:54444"]

    plain, = evaluate_hook(worker1, "POSTROUTING", tcp("10.222.1.48", "10.222.2.34"), ctx)
    assert plain.verdict == "ACCEPT" and plain.nat is None
    assert plain.packet.nw_src == "10.222.1.48"
    assert plain.steps[1].effect == "RETURN: back to the calling chain"
    assert plain.steps[1].matched == ("--mark",)
    assert plain.steps[-1].effect == "policy ACCEPT of chain POSTROUTING"


def test_seed_masquerade_without_the_interface_address_stays_unresolved(worker1):
    branch, = evaluate_hook(worker1, "POSTROUTING", tcp("10.79.1.10", "10.222.2.34", mark=0x4000),
                            NodeContext(node="worker1", out_iface="ens160"))
    assert branch.packet.nw_src == "10.79.1.10"          # left unchanged, and the step says why
    assert branch.nat.translated == (None, 54444)
    assert "address of the out interface ens160 (not known here" in branch.steps[-1].effect


def test_seed_antrea_postrouting_needs_the_ipset(worker1):
    to_pod = tcp("10.222.1.48", "10.222.2.34")
    unknown, = evaluate_hook(worker1, "POSTROUTING", to_pod, NodeContext(node="worker1"))
    assert unknown.verdict == "UNKNOWN"
    last = unknown.steps[-1]
    assert last.unknown and last.chain == "ANTREA-POSTROUTING"
    assert "ipset ANTREA-POD-IP is not in the bundle (needs nodes/worker1/ipset.txt)" in last.effect
    assert "nodes/worker1/iptables-nat-list.txt:22" in last.effect
    assert "! match-set ANTREA-POD-IP dst" in last.effect      # the rule as it reads

    sets = {"ANTREA-POD-IP": ["10.222.0.0/24", "10.222.1.0/24", "10.222.2.0/24"]}
    pod, = evaluate_hook(worker1, "POSTROUTING", to_pod, NodeContext(node="worker1", ipsets=sets))
    assert pod.verdict == "ACCEPT" and pod.nat is None           # pod to pod: no masquerade
    external, = evaluate_hook(worker1, "POSTROUTING", tcp("10.222.1.48", "93.184.216.34"),
                              NodeContext(node="worker1", ipsets=sets, masquerade_ip="10.79.1.201"))
    assert external.nat.kind == "MASQUERADE" and external.packet.nw_src == "10.79.1.201"
    assert external.steps[-1].chain == "ANTREA-POSTROUTING"


# --- kube-proxy rules written as iptables-save -----------------------------------------------

KUBE = """\
# kube-proxy-shaped node: a 3-endpoint service web (10.96.0.50:80, NodePort 30080)
*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -d 192.0.2.99/32 -j CT --notrack
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-WEB - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
:KUBE-SEP-C - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.50/32 -p tcp -m comment --comment "shop/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "shop/web:http" -m tcp --dport 30080 -j KUBE-MARK-MASQ
-A KUBE-NODEPORTS -p tcp -m comment --comment "shop/web:http" -m tcp --dport 30080 -j KUBE-SVC-WEB
-A KUBE-SVC-WEB ! -s 10.244.0.0/16 -d 10.96.0.50/32 -p tcp -m comment --comment "shop/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-WEB -m comment --comment "shop/web:http -> 10.244.1.10:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-A
-A KUBE-SVC-WEB -m comment --comment "shop/web:http -> 10.244.2.20:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-B
-A KUBE-SVC-WEB -m comment --comment "shop/web:http -> 10.244.3.30:8080" -j KUBE-SEP-C
-A KUBE-SEP-A -s 10.244.1.10/32 -m comment --comment "shop/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p tcp -m comment --comment "shop/web:http" -m tcp -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-SEP-B -s 10.244.2.20/32 -m comment --comment "shop/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-B -p tcp -m comment --comment "shop/web:http" -m tcp -j DNAT --to-destination 10.244.2.20:8080
-A KUBE-SEP-C -s 10.244.3.30/32 -m comment --comment "shop/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-C -p tcp -m comment --comment "shop/web:http" -m tcp -j DNAT --to-destination 10.244.3.30:8080
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -d 10.244.3.30/32 -p tcp -m tcp --dport 8080 -m comment --comment "quarantined pod" -j DROP
-A FORWARD -s 10.244.0.0/16 -j ACCEPT
-A FORWARD -d 10.244.0.0/16 -j ACCEPT
-A OUTPUT -p tcp -m tcp --dport 25 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -m mark --mark 0x8000/0x8000 -j DROP
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
"""

NODE_IP = "192.168.1.10"
ENDPOINTS = [("10.244.1.10", 8080), ("10.244.2.20", 8080), ("10.244.3.30", 8080)]


@pytest.fixture(scope="module")
def kube():
    ruleset = parse_iptables_save(KUBE, "nodes/n1/iptables-save.txt")
    assert ruleset.diagnostics == []
    return ruleset


def node(**kwargs) -> NodeContext:
    return NodeContext(node="n1", local_addresses={NODE_IP}, **kwargs)


def test_three_endpoints_share_the_weight(kube):
    branches = evaluate_hook(kube, "PREROUTING", tcp("10.244.1.5", "10.96.0.50"), node())
    assert [b.verdict for b in branches] == ["ACCEPT"] * 3
    assert [(b.packet.nw_dst, b.packet.tp_dst) for b in branches] == ENDPOINTS
    assert sum(b.weight for b in branches) == pytest.approx(1.0, abs=1e-12)
    assert [b.weight for b in branches] == pytest.approx([1 / 3] * 3, abs=1e-9)
    assert all(b.packet.mark == 0 for b in branches)
    # the last endpoint's branch shows the two choices it did not take, in one step
    skipped = [s.effect for s in branches[2].steps if "not taken" in s.effect]
    assert skipped == ["2 statistic rules not taken (lines 32-33 of nodes/n1/iptables-save.txt, "
                       "probabilities 0.3333 ... 0.5): next rule"]
    skipped = [s.effect for s in branches[1].steps if "not taken" in s.effect]
    assert skipped == ["probability 0.3333 not taken: next rule"]


def test_deterministic_and_does_not_touch_the_input(kube):
    syn = tcp("192.168.1.77", "10.96.0.50")
    first = evaluate_hook(kube, "PREROUTING", syn, node())
    again = evaluate_hook(kube, "PREROUTING", syn, node())
    assert [(b.weight, b.packet, b.steps) for b in first] == [
        (b.weight, b.packet, b.steps) for b in again]
    assert syn == tcp("192.168.1.77", "10.96.0.50")


def test_nodeport_path_only_when_destination_is_local(kube):
    to_node = evaluate_hook(kube, "PREROUTING", tcp("203.0.113.9", NODE_IP, dport=30080), node())
    assert [(b.packet.nw_dst, b.packet.tp_dst) for b in to_node] == ENDPOINTS
    assert all(b.packet.mark == 0x4000 for b in to_node)
    assert "KUBE-NODEPORTS" in chains(to_node[0])
    nodeports_jump = next(s for s in to_node[0].steps if "KUBE-NODEPORTS" in s.effect)
    assert nodeports_jump.matched == ("--dst-type",)

    elsewhere, = evaluate_hook(kube, "PREROUTING", tcp("203.0.113.9", "192.168.1.99",
                                                       dport=30080), node())
    assert elsewhere.verdict == "ACCEPT" and elsewhere.nat is None
    assert elsewhere.packet.nw_dst == "192.168.1.99"
    assert "KUBE-NODEPORTS" not in chains(elsewhere)
    assert elsewhere.steps[-1].effect == "policy ACCEPT of chain PREROUTING"


def test_full_path_prerouting_forward_postrouting(kube):
    """Chain the hooks as a caller would: outside client -> service -> each endpoint."""
    results = []
    for pre in evaluate_hook(kube, "PREROUTING", tcp("203.0.113.9", "10.96.0.50"), node()):
        fwd_ctx = node(ct_state=set(pre.ct_state), in_iface="eth0", out_iface="antrea-gw0")
        for fwd in evaluate_hook(kube, "FORWARD", pre.packet, fwd_ctx):
            if fwd.verdict != "ACCEPT":
                results.append((pre.packet.nw_dst, fwd.verdict, None))
                continue
            post_ctx = node(ct_state=set(fwd.ct_state), masquerade_ip="10.244.0.1")
            post, = evaluate_hook(kube, "POSTROUTING", fwd.packet, post_ctx)
            results.append((pre.packet.nw_dst, post.verdict, post.packet.nw_src))
    # marked by KUBE-MARK-MASQ, so KUBE-FORWARD accepts even the "quarantined" endpoint,
    # and KUBE-POSTROUTING masquerades every branch
    assert results == [("10.244.1.10", "ACCEPT", "10.244.0.1"),
                       ("10.244.2.20", "ACCEPT", "10.244.0.1"),
                       ("10.244.3.30", "ACCEPT", "10.244.0.1")]


def test_forward_filter_verdicts(kube):
    ctx = node(in_iface="antrea-gw0", out_iface="antrea-gw0")
    quarantined, = evaluate_hook(kube, "FORWARD", tcp("10.244.1.5", "10.244.3.30", dport=8080), ctx)
    assert quarantined.verdict == "DROP"
    assert quarantined.steps[-1].effect == "DROP (quarantined pod)"
    assert quarantined.steps[-1].matched == ("-d", "-p", "--dport")

    pod, = evaluate_hook(kube, "FORWARD", tcp("10.244.1.5", "10.244.2.20", dport=8080), ctx)
    assert pod.verdict == "ACCEPT" and pod.steps[-1].matched == ("-s",)

    stranger, = evaluate_hook(kube, "FORWARD", tcp("203.0.113.9", "198.51.100.7"), ctx)
    assert stranger.verdict == "DROP"
    assert stranger.steps[-1].effect == "policy DROP of chain FORWARD"

    reply = node(ct_state={"ESTABLISHED"}, ct_dir="REPLY")
    established, = evaluate_hook(kube, "FORWARD", tcp("198.51.100.7", "203.0.113.9"), reply)
    assert established.verdict == "ACCEPT"
    assert established.steps[-1].matched == ("--ctstate",)

    invalid, = evaluate_hook(kube, "FORWARD", tcp("10.244.1.5", "10.244.2.20"),
                             node(ct_state={"INVALID"}))
    assert invalid.verdict == "DROP" and invalid.steps[-1].chain == "KUBE-FORWARD"


def test_nat_only_for_new_connections(kube):
    later, = evaluate_hook(kube, "PREROUTING", tcp("10.244.1.5", "10.96.0.50"),
                           node(ct_state={"ESTABLISHED"}))
    assert later.verdict == "ACCEPT" and later.nat is None
    assert later.packet.nw_dst == "10.96.0.50"
    assert [s.effect for s in later.steps] == [
        "policy ACCEPT of chain PREROUTING",              # raw
        "nat table not consulted: not the first packet of a connection (conntrack applies any NAT)"]


def test_notrack_in_raw_skips_nat(kube):
    untracked, = evaluate_hook(kube, "PREROUTING", tcp("10.244.1.5", "192.0.2.99"), node())
    assert untracked.ct_state == {"UNTRACKED"}
    assert [s.table for s in untracked.steps] == ["raw", "raw", "nat"]   # CT, policy, nat skipped
    assert "NOTRACK" not in untracked.steps[0].effect and "not tracked" in untracked.steps[0].effect


def test_output_runs_nat_then_filter(kube):
    from_host = evaluate_hook(kube, "OUTPUT", tcp(NODE_IP, "10.96.0.50"), node())
    assert len(from_host) == 3 and {b.verdict for b in from_host} == {"ACCEPT"}
    assert [s.table for s in from_host[0].steps][-1] == "filter"       # nat first, then filter
    smtp, = evaluate_hook(kube, "OUTPUT", tcp(NODE_IP, "198.51.100.7", dport=25), node())
    assert smtp.verdict == "REJECT"
    assert smtp.steps[-1].effect == "REJECT with icmp-port-unreachable"


def test_input_firewall_blocks_martian_localnet(kube):
    martian, = evaluate_hook(kube, "INPUT", tcp("203.0.113.9", "127.0.0.1"), node())
    assert martian.verdict == "DROP" and martian.steps[-1].chain == "KUBE-FIREWALL"
    dnat_ed, = evaluate_hook(kube, "INPUT", tcp("203.0.113.9", "127.0.0.1"),
                             node(ct_state={"NEW", "DNAT"}))
    assert dnat_ed.verdict == "ACCEPT"


# --- undecidable things stop the branch as UNKNOWN --------------------------------------------


def ruleset(*rules: str, table: str = "filter", chains: tuple[str, ...] = ()):
    decl = [f":{c} - [0:0]" for c in chains]
    text = "\n".join([f"*{table}", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]",
                      ":PREROUTING ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]", *decl, *rules,
                      "COMMIT"])
    return parse_iptables_save(text, "t.txt")


def test_unknown_module_gives_an_unknown_branch_naming_the_line():
    rs = ruleset("-A INPUT -p tcp -m frobnicate --frob 1 -j DROP")
    assert rs.syntax_errors == []
    branch, = evaluate_hook(rs, "INPUT", tcp("10.0.0.1", "10.0.0.2"), NodeContext())
    assert branch.verdict == "UNKNOWN"
    step = branch.steps[-1]
    assert step.unknown and step.rule.source.line == 6
    assert step.effect == ("cannot decide t.txt:6 `-A INPUT -p tcp -m frobnicate --frob 1 -j DROP`"
                           ": match module 'frobnicate' is not modelled; the trace stops here")
    # a definite miss on another match still decides: UDP never reaches the unknown module
    udp = Packet(nw_src="10.0.0.1", nw_dst="10.0.0.2", nw_proto=17, tp_src=1, tp_dst=53)
    assert evaluate_hook(rs, "INPUT", udp, NodeContext())[0].verdict == "ACCEPT"


def test_unknown_target_and_syntax_broken_rules_stop_the_trace():
    rs = ruleset("-A PREROUTING -p tcp -j TPROXY --on-port 1 --tproxy-mark 0x1/0x1",
                 table="mangle")
    branch, = evaluate_hook(rs, "PREROUTING", tcp("10.0.0.1", "10.0.0.2"), NodeContext())
    assert branch.verdict == "UNKNOWN"
    assert "target TPROXY is not modelled" in branch.steps[-1].effect

    broken = ruleset('-A INPUT -m comment --comment "oops -j ACCEPT')
    assert len(broken.syntax_errors) == 1
    branch, = evaluate_hook(broken, "INPUT", tcp("10.0.0.1", "10.0.0.2"), NodeContext())
    assert branch.verdict == "UNKNOWN" and "closing quotation" in branch.steps[-1].effect


def test_ipset_members_with_ports():
    rs = ruleset("-A INPUT -m set --match-set SVC dst,dst -j DROP")
    sets = {"SVC": ["10.96.0.10,udp:53", "10.96.0.1,tcp:443", "10.96.0.0/24,tcp:80 nomatch"]}
    dns = Packet(nw_src="10.0.0.1", nw_dst="10.96.0.10", nw_proto=17, tp_src=1, tp_dst=53)
    assert evaluate_hook(rs, "INPUT", dns, NodeContext(ipsets=sets))[0].verdict == "DROP"
    web = tcp("10.0.0.1", "10.96.0.1", dport=443)
    assert evaluate_hook(rs, "INPUT", web, NodeContext(ipsets=sets))[0].verdict == "DROP"
    excluded = tcp("10.0.0.1", "10.96.0.1", dport=80)
    assert evaluate_hook(rs, "INPUT", excluded, NodeContext(ipsets=sets))[0].verdict == "ACCEPT"
    missing, = evaluate_hook(rs, "INPUT", web, NodeContext(node="w2", ipsets={}))
    assert missing.verdict == "UNKNOWN"
    assert "ipset SVC is not in the bundle (needs nodes/w2/ipset.txt)" in missing.steps[-1].effect


def test_interfaces_decide_only_when_known():
    rs = ruleset("-A FORWARD -i lxc+ -j DROP")
    packet = tcp("10.0.0.1", "10.0.0.2")
    def verdict(ctx):
        return evaluate_hook(rs, "FORWARD", packet, ctx)[0].verdict
    assert verdict(NodeContext(in_iface="lxc12ab")) == "DROP"       # lxc+ is a prefix wildcard
    assert verdict(NodeContext(in_iface="eth0")) == "ACCEPT"
    unknown, = evaluate_hook(rs, "FORWARD", packet, NodeContext())
    assert unknown.verdict == "UNKNOWN"
    assert "input interface is not known" in unknown.steps[-1].effect


def test_chain_loop_is_caught():
    rs = ruleset("-A INPUT -j A", "-A A -j B", "-A B -j A", chains=("A", "B"))
    branch, = evaluate_hook(rs, "INPUT", tcp("10.0.0.1", "10.0.0.2"), NodeContext())
    assert branch.verdict == "UNKNOWN" and "chain loop" in branch.steps[-1].effect


def test_goto_returns_to_the_caller_of_the_caller():
    rs = ruleset("-A INPUT -j OUTER", "-A INPUT -j DROP", "-A OUTER -g INNER", "-A OUTER -j ACCEPT",
                 "-A INNER -j RETURN", chains=("OUTER", "INNER"))
    branch, = evaluate_hook(rs, "INPUT", tcp("10.0.0.1", "10.0.0.2"), NodeContext())
    # INNER's RETURN goes back to INPUT (skipping OUTER's ACCEPT), whose next rule drops
    assert branch.verdict == "DROP"
    assert [s.chain for s in branch.steps] == ["INPUT", "OUTER", "INNER", "INPUT"]


def test_nth_statistic_and_connmark():
    rs = ruleset("-A PREROUTING -m connmark --mark 0x80/0x80 -j MARK --set-xmark 0x200/0x200",
                 "-A PREROUTING -j CONNMARK --save-mark --nfmask 0x200 --ctmask 0x200",
                 "-A PREROUTING -m statistic --mode nth --every 4 --packet 0 -j DROP",
                 table="mangle")
    branches = evaluate_hook(rs, "PREROUTING", tcp("10.0.0.1", "10.0.0.2"),
                             NodeContext(connmark=0x80))
    assert [(b.verdict, b.weight) for b in branches] == [("DROP", 0.25), ("ACCEPT", 0.75)]
    assert all(b.packet.mark == 0x200 and b.connmark == 0x280 for b in branches)


def test_builtin_chain_without_a_known_policy_is_unknown():
    # grep-filtered iptables-save: PREROUTING is used but never declared, so no policy is known
    rs = parse_iptables_save('-A PREROUTING -m comment --comment "x" -j RETURN\n', "g.txt",
                             default_table="mangle")
    branch, = evaluate_hook(rs, "PREROUTING", tcp("10.0.0.1", "10.0.0.2"), NodeContext())
    assert branch.verdict == "UNKNOWN"
    assert "policy of built-in chain PREROUTING in table mangle is not in the bundle" in (
        branch.steps[-1].effect)


def test_unknown_hook_is_a_caller_error(kube):
    with pytest.raises(ValueError):
        evaluate_hook(kube, "INGRESS", tcp("10.0.0.1", "10.0.0.2"), node())


SESSION_AFFINITY = """*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.5/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-X
-A KUBE-SVC-X -m comment --comment "ns/svc -> 10.0.0.1:80" -m recent --name KUBE-SEP-A --mask 255.255.255.255 --rsource --rcheck --seconds 10800 --reap -j KUBE-SEP-A
-A KUBE-SVC-X -m comment --comment "ns/svc -> 10.0.0.2:80" -m recent --name KUBE-SEP-B --mask 255.255.255.255 --rsource --rcheck --seconds 10800 --reap -j KUBE-SEP-B
-A KUBE-SVC-X -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A
-A KUBE-SVC-X -j KUBE-SEP-B
-A KUBE-SEP-A -p tcp -m recent --name KUBE-SEP-A --mask 255.255.255.255 --rsource --set -m tcp -j DNAT --to-destination 10.0.0.1:80
-A KUBE-SEP-B -p tcp -m recent --name KUBE-SEP-B --mask 255.255.255.255 --rsource --set -m tcp -j DNAT --to-destination 10.0.0.2:80
COMMIT
"""


def test_session_affinity_first_connection_is_said_and_known_clients_stick():
    from traceflow.engines.netfilter.engine import NodeContext, evaluate_hook
    from traceflow.engines.netfilter.iptables import parse_iptables_save
    from traceflow.model.packet import Packet
    rs = parse_iptables_save(SESSION_AFFINITY, "iptables-save.txt")
    rs.raise_for_errors()
    pkt = Packet(nw_src="10.1.1.1", nw_dst="10.96.0.5", nw_proto=6, tp_src=1234, tp_dst=80)
    fresh = evaluate_hook(rs, "PREROUTING", pkt, NodeContext(node="n", local_addresses=set()))
    assert sorted((b.weight, b.nat.translated[0]) for b in fresh) == [(0.5, "10.0.0.1"), (0.5, "10.0.0.2")]
    effects = [s.effect for s in fresh[0].steps]
    assert any("assumed a first connection" in e for e in effects)
    assert any("remember this client in KUBE-SEP-A" in e for e in effects)
    known = evaluate_hook(rs, "PREROUTING", pkt, NodeContext(node="n", local_addresses=set(),
                                                             recent={"KUBE-SEP-B": {"10.1.1.1"}}))
    assert [(b.weight, b.nat.translated[0]) for b in known] == [(1.0, "10.0.0.2")]
