"""Parsing iptables-save and `iptables -L` output into the rule model.

The real-world corpus (tests/data/realworld) must parse without syntax errors, and concrete facts
per file are checked so a parser that silently drops or misreads rules fails.
"""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path

import pytest

from traceflow.model.errors import InputError
from traceflow.engines.netfilter.iptables import (AddrMatch, AddrTypeMatch, CommentMatch,
                                                  ConnmarkOp, CtStateMatch, IfaceMatch, LimitMatch,
                                                  MarkMatch, NatTo, NotModelled, PortMatch,
                                                  PortRange, ProtoMatch, RuleSyntaxError, SetMatch,
                                                  StatisticMatch, UnknownMatch, parse_iptables_list,
                                                  parse_iptables_save, tokenize)

DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
REALWORLD = DATA / "realworld"

GREP_FILTERED = "imroc-ack-cilium_iptables-save-grep-cilium.txt"


def save_file(name: str, **kwargs):
    path = REALWORLD / "iptables-save" / name
    return parse_iptables_save(path.read_text(), path.name, **kwargs)


def list_file(name: str, table: str = "nat"):
    path = REALWORLD / "iptables-list" / name
    return parse_iptables_list(path.read_text(), path.name, table)


def kinds(rule) -> list[type]:
    return [type(m) for m in rule.matches]


def only(rule, cls):
    found = [m for m in rule.matches if isinstance(m, cls)]
    assert len(found) == 1, (cls, rule.matches)
    return found[0]


# --- the whole corpus ------------------------------------------------------------------------


def corpus(kind: str) -> list[str]:
    folder = REALWORLD / kind
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("name", corpus("iptables-save"))
def test_every_iptables_save_file_parses_without_syntax_errors(name):
    # the grep-filtered file has no *table header: readable only when the caller names a table
    kwargs = {"default_table": "filter"} if name == GREP_FILTERED else {}
    ruleset = save_file(name, **kwargs)
    assert ruleset.syntax_errors == []
    ruleset.raise_for_errors()
    assert sum(1 for _ in ruleset.rules()) > 10


@pytest.mark.parametrize("name", corpus("iptables-list"))
def test_every_iptables_list_file_parses_without_syntax_errors(name):
    ruleset = list_file(name, "filter" if "filter" in name else "nat")
    assert ruleset.syntax_errors == []
    assert ruleset.diagnostics == []        # every word of these listings is modelled
    assert sum(1 for _ in ruleset.rules()) > 10


# --- iptables-save files ---------------------------------------------------------------------


def test_kind_iptables_save_facts():
    rs = save_file("ericpuwang_kind-v1.23.5_iptables-save.txt")
    assert rs.diagnostics == []
    assert {t: len(tb.chains) for t, tb in rs.tables.items()} == {"mangle": 7, "filter": 10,
                                                                   "nat": 29}
    nat = rs.tables["nat"]
    assert nat.chains["PREROUTING"].policy == "ACCEPT"
    assert nat.chains["KUBE-SERVICES"].policy is None

    masq = nat.chains["KUBE-SVC-3CRYVFGPLWYNKULQ"].rules[0]
    assert masq.target == "KUBE-MARK-MASQ"
    src = [m for m in masq.matches if isinstance(m, AddrMatch) and m.field == "nw_src"][0]
    assert src.negated and src.cidr == ipaddress.ip_network("10.244.0.0/16")
    assert only(masq, PortMatch).ranges == (PortRange(80, 80),)
    assert only(masq, CommentMatch).text == "default/traefik:web cluster IP"
    assert masq.source.line == 115 and masq.text.startswith("-A KUBE-SVC-3CRYVFGPLWYNKULQ ! -s")

    pick = nat.chains["KUBE-SVC-TCOU7JCQXEZGVUNU"].rules[1]
    assert pick.target == "KUBE-SEP-6E7XQMQ4RAYOWTTM"
    assert only(pick, StatisticMatch).probability == pytest.approx(0.5)

    dnat = nat.chains["DOCKER_OUTPUT"].rules[0]
    assert dnat.target == "DNAT" and str(dnat.target_args["to"]) == "127.0.0.11:42845"
    snat = nat.chains["DOCKER_POSTROUTING"].rules[1]
    assert snat.target_args["to"] == NatTo("192.168.31.191", None, PortRange(53, 53))

    post = nat.chains["KUBE-POSTROUTING"].rules
    assert only(post[0], MarkMatch).negated and post[0].target == "RETURN"
    assert post[1].target_args["mark"].apply(0x4321) == 0x0321      # --set-xmark 0x4000/0x0: xor
    assert post[2].target == "MASQUERADE" and post[2].target_args["flags"] == ("random-fully",)

    nodeports = nat.chains["KUBE-SERVICES"].rules[-1]
    addrtype = only(nodeports, AddrTypeMatch)
    assert (addrtype.name, addrtype.types, addrtype.negated) == ("--dst-type", ("LOCAL",), False)
    kind_masq = nat.chains["POSTROUTING"].rules[2]
    assert only(kind_masq, AddrTypeMatch).negated                  # ! --dst-type LOCAL

    firewall = rs.tables["filter"].chains["KUBE-FIREWALL"].rules[1]
    state = only(firewall, CtStateMatch)
    assert state.negated and state.states == {"RELATED", "ESTABLISHED", "DNAT"}


def test_counters_form_iptables_save_c():
    rs = save_file("g00ntar-cilium-sysdump-k3s_iptables-save-c.txt")
    assert rs.diagnostics == []
    assert list(rs.tables) == ["filter", "mangle", "nat"]
    first = rs.tables["filter"].chains["INPUT"].rules[0]
    assert first.target == "KUBE-FIREWALL"
    assert first.text == "[222346:304356942] -A INPUT -j KUBE-FIREWALL"
    assert first.source.line == 8                      # after the comment, *filter, 5 chains
    dns = rs.tables["nat"].chains["PREROUTING"].rules[0]
    assert only(dns, ProtoMatch).proto == 17
    assert only(dns, PortMatch).ranges == (PortRange(53, 53),)
    assert str(dns.target_args["to"]) == "192.168.5.2:49336"


def test_grep_filtered_save_is_one_located_error_without_default_table():
    rs = save_file(GREP_FILTERED)
    assert len(rs.syntax_errors) == 1
    err = rs.syntax_errors[0]
    assert (err.file, err.line, err.text) == (GREP_FILTERED, 1, ":CILIUM_POST_nat - [0:0]")
    assert "*table" in err.reason and "39 more" in err.reason
    with pytest.raises(InputError) as raised:
        rs.raise_for_errors()
    assert raised.value.line == 1


def test_grep_filtered_save_reads_into_default_table_with_a_caveat():
    rs = save_file(GREP_FILTERED, default_table="mangle")
    assert list(rs.tables) == ["mangle"]
    chains = rs.tables["mangle"].chains
    assert len(chains["CILIUM_FORWARD"].rules) == 6
    assert chains["PREROUTING"].policy is None                 # never declared in the file
    assert any("no *table header" in c for c in rs.caveats)
    lxc = chains["CILIUM_FORWARD"].rules[2]
    assert only(lxc, IfaceMatch).iface == "lxc+"
    notrack = chains["CILIUM_OUTPUT_raw"].rules[0]
    assert notrack.target == "CT" and notrack.target_args == {"notrack": True}
    restore = chains["CILIUM_PRE_mangle"].rules[2].target_args["connmark"]
    assert restore == ConnmarkOp("restore", None, 0x80, 0x80)
    # -m socket and -j TPROXY are kept and reported, not dropped
    reasons = [(d.line, d.reason) for d in rs.diagnostics]
    assert reasons == [(11, "match module 'socket' is not modelled"),
                       (14, "target TPROXY is not modelled"),
                       (15, "target TPROXY is not modelled")]
    assert all(isinstance(d, NotModelled) for d in rs.diagnostics)
    assert chains["CILIUM_PRE_mangle"].rules[3].unknown_target == "target TPROXY is not modelled"


# --- iptables -L files -----------------------------------------------------------------------


def test_antrea_worker1_listing_facts():
    rs = list_file("antrea-packet-walks_worker1_iptables-t-nat-L-n.txt")
    nat = rs.tables["nat"]
    assert len(nat.chains) == 31
    assert nat.chains["PREROUTING"].policy == "ACCEPT"
    assert nat.chains["KUBE-MARK-MASQ"].policy is None
    assert any("-v" in c for c in rs.caveats)                  # interfaces are not shown

    svc = nat.chains["KUBE-SVC-EKL7ZEFK3VFJKKGJ"].rules
    assert [r.target for r in svc] == ["KUBE-SEP-6PRWOLZVS5LKSHLK", "KUBE-SEP-R5BOSGFC7D2XSIZA"]
    assert only(svc[0], StatisticMatch).probability == pytest.approx(0.5)
    assert kinds(svc[1]) == [CommentMatch]

    sep = nat.chains["KUBE-SEP-R5BOSGFC7D2XSIZA"].rules
    assert only(sep[0], AddrMatch).cidr == ipaddress.ip_network("10.222.2.34/32")
    assert sep[1].target == "DNAT" and str(sep[1].target_args["to"]) == "10.222.2.34:80"
    assert sep[1].source.line == 91

    antrea = nat.chains["ANTREA-POSTROUTING"].rules[0]
    ipset = only(antrea, SetMatch)
    assert (ipset.set_name, ipset.flags, ipset.negated) == ("ANTREA-POD-IP", ("dst",), True)
    assert only(antrea, CommentMatch).text == "Antrea: masquerade pod to external packets"
    assert nat.chains["KUBE-MARK-MASQ"].rules[0].target_args["mark"].apply(0) == 0x4000
    assert nat.chains["KUBE-POSTROUTING"].rules[1].target_args["mark"].apply(0x4001) == 0x1


def test_antrea_worker2_listing_facts():
    nat = list_file("antrea-packet-walks_worker2_iptables-t-nat-L-n.txt").tables["nat"]
    assert len(nat.chains) == 33
    frontend = nat.chains["KUBE-SEP-3CFGSU2LP4O527CE"].rules[1]
    assert str(frontend.target_args["to"]) == "10.222.1.48:80"
    antrea = nat.chains["ANTREA-POSTROUTING"].rules[0]
    assert only(antrea, AddrMatch).cidr == ipaddress.ip_network("10.222.2.0/24")


def test_verbose_nat_listing_facts():
    rs = list_file("xiazemin-docker-desktop-linuxkit_iptables-t-nat-nvL.txt")
    nat = rs.tables["nat"]
    assert len(nat.chains) == 56 and rs.caveats == []
    post = nat.chains["POSTROUTING"].rules
    docker = post[2]                                   # MASQUERADE all -- * !docker0 172.17.0.0/16
    out = only(docker, IfaceMatch)
    assert (out.name, out.iface, out.negated) == ("-o", "docker0", True)
    cni = post[5]
    assert cni.target == "CNI-0d314787d804206fd0db3f98"
    assert only(cni, CommentMatch).text.startswith('name: "default" id: "d56bc6d2512b')
    masq = nat.chains["KUBE-POSTROUTING"].rules[2]
    assert masq.target_args == {"flags": ("random-fully",), "to_ports": None}
    assert len(nat.chains["desktop"].rules) == 32
    xlb = nat.chains["KUBE-XLB-D7TXZ2ONB4DT7BQA"].rules[0]
    assert only(xlb, AddrTypeMatch).field == "nw_src"


def test_verbose_filter_listing_facts():
    rs = list_file("xiazemin-docker-desktop-linuxkit_iptables-t-filter-nvL.txt", "filter")
    chains = rs.tables["filter"].chains
    assert len(chains) == 15
    assert len(chains["FORWARD"].rules) == 13
    bridge = chains["FORWARD"].rules[7]                 # ACCEPT all -- docker0 !docker0
    ifaces = {(m.name, m.iface, m.negated) for m in bridge.matches}
    assert ifaces == {("-i", "docker0", False), ("-o", "docker0", True)}
    firewall = chains["KUBE-FIREWALL"].rules[1]
    assert only(firewall, CtStateMatch).negated
    assert {str(m) for m in firewall.matches if isinstance(m, AddrMatch)} == {
        "! -s 127.0.0.0/8", "-d 127.0.0.0/8"}


def test_both_formats_give_the_same_matches():
    listed = list_file("antrea-packet-walks_worker1_iptables-t-nat-L-n.txt").tables["nat"]
    saved = parse_iptables_save("\n".join([
        "*nat", ":KUBE-SERVICES - [0:0]", ":KUBE-MARK-MASQ - [0:0]",
        '-A KUBE-SERVICES ! -s 10.222.0.0/16 -d 10.104.65.133/32 -p tcp -m comment --comment '
        '"default/backendsvc: cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ',
        "COMMIT"]), "save.txt").tables["nat"]
    from_list = listed.chains["KUBE-SERVICES"].rules[8]
    from_save = saved.chains["KUBE-SERVICES"].rules[0]
    assert set(from_list.matches) == set(from_save.matches)
    assert from_list.target == from_save.target == "KUBE-MARK-MASQ"


# --- grammar details -------------------------------------------------------------------------


def one_rule(rule_text: str, table: str = "filter"):
    rs = parse_iptables_save(f"*{table}\n:INPUT ACCEPT [0:0]\n:X - [0:0]\n{rule_text}\nCOMMIT\n",
                             "t.txt")
    chain = rule_text.split()[1]
    return rs, rs.tables[table].chains[chain].rules[0]


def test_both_negation_spellings_mean_the_same():
    _, new = one_rule("-A INPUT ! -s 10.0.0.0/8 -p tcp -m tcp ! --dport 22 -j ACCEPT")
    _, old = one_rule("-A INPUT -s ! 10.0.0.0/8 -p tcp -m tcp --dport ! 22 -j ACCEPT")
    assert new.matches == old.matches
    assert only(new, AddrMatch).negated and only(new, PortMatch).negated


def test_implicit_protocol_module_options():
    _, rule = one_rule("-A INPUT -p udp --dport 53 -j ACCEPT")
    assert only(rule, PortMatch).ranges == (PortRange(53, 53),)


def test_port_lists_and_ranges():
    _, rule = one_rule("-A INPUT -p tcp -m multiport --dports 80,443,8000:8080 -j ACCEPT")
    assert only(rule, PortMatch).ranges == (PortRange(80, 80), PortRange(443, 443),
                                            PortRange(8000, 8080))


@pytest.mark.parametrize("option, before, after", [
    ("--set-xmark 0x4000/0x4000", 0x1, 0x4001),
    ("--set-xmark 0x4000/0x0", 0x4001, 0x0001),      # xor
    ("--set-mark 0x10", 0xff, 0x10),
    ("--set-mark 0x1/0xf", 0xf3, 0xf1),
    ("--or-mark 0x4000", 0x1, 0x4001),
    ("--and-mark 0xff", 0x1234, 0x34),
    ("--xor-mark 0x4000", 0x4001, 0x1),
])
def test_mark_operations_follow_the_kernel(option, before, after):
    _, rule = one_rule(f"-A INPUT -j MARK {option}")
    assert rule.target_args["mark"].apply(before) == after


def test_nat_targets():
    _, dnat = one_rule("-A X -p tcp -j DNAT --to-destination 10.0.0.1-10.0.0.3:8000-8010", "nat")
    assert dnat.target_args["to"] == NatTo("10.0.0.1", "10.0.0.3", PortRange(8000, 8010))
    _, masq = one_rule("-A X -j MASQUERADE --to-ports 1024-2048 --random", "nat")
    assert masq.target_args == {"to_ports": PortRange(1024, 2048), "flags": ("random",)}
    _, snat = one_rule("-A X -j SNAT --to-source 192.0.2.1", "nat")
    assert snat.target_args["to"] == NatTo("192.0.2.1") and snat.target_args["flags"] == ()


def test_limit_is_kept_as_an_always_match_with_a_caveat():
    _, rule = one_rule("-A INPUT -m limit --limit 5/min --limit-burst 10 -j LOG --log-prefix "
                       '"dropped: "')
    limit = only(rule, LimitMatch)
    assert limit.check(None, None) is True and "not modelled" in limit.caveat()
    assert rule.target_args == {"log-prefix": "dropped: "}


def test_unknown_module_is_kept_and_reported_not_a_syntax_error():
    rs, rule = one_rule("-A INPUT -p tcp -m frobnicate --frob 1 --twiddle -m tcp --dport 80 "
                        "-j ACCEPT")
    assert rs.syntax_errors == []
    unknown = only(rule, UnknownMatch)
    assert unknown.text == "-m frobnicate --frob 1 --twiddle"
    assert unknown.reason == "match module 'frobnicate' is not modelled"
    assert only(rule, PortMatch).ranges == (PortRange(80, 80),)   # the rest still read
    assert [(d.line, d.reason) for d in rs.diagnostics] == [
        (4, "match module 'frobnicate' is not modelled")]


def test_unknown_option_of_known_module_and_unknown_target():
    rs, rule = one_rule("-A INPUT -m tcp -p tcp --dport 80 --frob 2 -j TEE --gateway 1.2.3.4")
    assert rs.syntax_errors == []
    assert only(rule, UnknownMatch).reason == "option --frob 2 of match 'tcp' is not modelled"
    assert rule.unknown_target == "target TEE is not modelled"


def test_jump_to_a_missing_chain_is_reported():
    rs, rule = one_rule("-A INPUT -j NOWHERE")
    assert "NOWHERE is not modelled (and is not a chain of table filter)" in rule.unknown_target
    assert rs.syntax_errors == [] and len(rs.diagnostics) == 1


BAD = "\n".join([
    "*filter",                                              # 1
    ":INPUT ACCEPT [0:0]",                                  # 2
    "-A INPUT -s 10.0.0.1/32 -j ACCEPT",                    # 3
    "this is not iptables",                                 # 4
    "-A",                                                   # 5
    '-A INPUT -m comment --comment "unterminated -j DROP',  # 6
    "-A INPUT -p tcp -m tcp --dport",                       # 7
    "-A INPUT -s 10.0.0.300 -j DROP",                       # 8
    "COMMIT",
])


def test_syntax_errors_name_line_and_text_and_keep_the_rules():
    rs = parse_iptables_save(BAD, "nodes/w1/iptables-save.txt")
    errors = [(e.line, e.text) for e in rs.syntax_errors]
    assert errors == [(4, "this is not iptables"), (5, "-A"),
                      (6, '-A INPUT -m comment --comment "unterminated -j DROP'),
                      (7, "-A INPUT -p tcp -m tcp --dport"),
                      (8, "-A INPUT -s 10.0.0.300 -j DROP")]
    assert all(e.file == "nodes/w1/iptables-save.txt" for e in rs.syntax_errors)
    assert "closing quotation" in rs.syntax_errors[2].reason
    assert "truncated" in rs.syntax_errors[3].reason
    # rules on lines 6-8 are kept (as undecidable) so a trace through them says UNKNOWN
    rules = rs.tables["filter"].chains["INPUT"].rules
    assert [r.source.line for r in rules] == [3, 6, 7, 8]
    assert all(isinstance(r.matches[0], UnknownMatch) for r in rules[1:])
    with pytest.raises(InputError) as raised:
        rs.raise_for_errors()
    err = raised.value
    assert (err.file, err.line, err.text) == ("nodes/w1/iptables-save.txt", 4,
                                              "this is not iptables")
    assert "4 more syntax errors" in str(err) and "line 4" in str(err)


def test_rule_before_any_table_header():
    rs = parse_iptables_save("-A INPUT -j ACCEPT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", "x")
    assert [(e.line, e.text) for e in rs.syntax_errors] == [(1, "-A INPUT -j ACCEPT")]
    assert isinstance(rs.syntax_errors[0], RuleSyntaxError)


def test_list_format_bad_lines():
    text = "\n".join([
        "Chain INPUT (policy DROP)",
        "target     prot opt source               destination",
        "ACCEPT     all  --  10.0.0.0/8           0.0.0.0/0",
        "garbage here",
        "",
        "ACCEPT     all  --  0.0.0.0/0            0.0.0.0/0",
    ])
    rs = parse_iptables_list(text, "l.txt", "filter")
    assert [(e.line, e.text) for e in rs.syntax_errors] == [
        (4, "garbage here"), (6, "ACCEPT     all  --  0.0.0.0/0            0.0.0.0/0")]
    assert rs.tables["filter"].chains["INPUT"].policy == "DROP"
    assert len(rs.tables["filter"].chains["INPUT"].rules) == 2   # line 3, and line 4 kept


def test_list_format_empty_target_and_unknown_words():
    text = "\n".join([
        "Chain FORWARD (policy ACCEPT)",
        "target     prot opt source               destination",
        "           all  --  0.0.0.0/0            0.0.0.0/0            /* count only */",
        "ACCEPT     tcp  --  0.0.0.0/0            0.0.0.0/0            "
        "owner UID match 0 tcp dpt:22",
    ])
    rs = parse_iptables_list(text, "l.txt", "filter")
    counted, owner = rs.tables["filter"].chains["FORWARD"].rules
    assert counted.target is None and only(counted, CommentMatch).text == "count only"
    assert only(owner, UnknownMatch).text == "owner UID match 0"
    assert only(owner, PortMatch).ranges == (PortRange(22, 22),)
    assert rs.syntax_errors == [] and len(rs.diagnostics) == 1


def test_tokenize_matches_shell_quoting():
    for text in ['-m comment --comment "default/backendsvc: cluster IP" -j X',
                 '--comment "say \\"hi\\"" x', "--log-prefix 'a b' -j LOG", 'a\\ b c',
                 '--comment ""']:
        assert tokenize(text) == shlex.split(text)
    with pytest.raises(ValueError):
        tokenize('--comment "open')


def kube_proxy_save(services: int) -> str:
    """A kube-proxy-shaped nat table: 2 + 2 * 3 = 8 rules per service."""
    decl, rules = [":PREROUTING ACCEPT [0:0]", ":KUBE-SERVICES - [0:0]",
                   ":KUBE-MARK-MASQ - [0:0]"], []
    for i in range(services):
        svc, ip = f"KUBE-SVC-{i:012d}", f"10.96.{i // 256}.{i % 256}"
        decl.append(f":{svc} - [0:0]")
        rules.append(f'-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment "ns/s{i}:http '
                     f'cluster IP" -m tcp --dport 80 -j {svc}')
        rules.append(f'-A {svc} ! -s 10.244.0.0/16 -d {ip}/32 -p tcp -m comment --comment '
                     f'"ns/s{i}:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ')
        for e in range(2):
            sep = f"KUBE-SEP-{i:08d}{e:04d}"
            decl.append(f":{sep} - [0:0]")
            stat = " -m statistic --mode random --probability 0.50000000000" if e == 0 else ""
            rules.append(f'-A {svc} -m comment --comment "ns/s{i}:http"{stat} -j {sep}')
            rules.append(f'-A {sep} -s 10.244.{e}.{i % 250}/32 -m comment --comment "ns/s{i}:http"'
                         f" -j KUBE-MARK-MASQ")
            rules.append(f'-A {sep} -p tcp -m comment --comment "ns/s{i}:http" -m tcp -j DNAT '
                         f"--to-destination 10.244.{e}.{i % 250}:8080")
    return "\n".join(["*nat", *decl, *rules, "COMMIT", ""])


def test_parse_10k_rules():
    """10,000 kube-proxy rules parse without a diagnostic (their speed: benchmarks/run.py)."""
    text = kube_proxy_save(1250)                        # 1250 * 8 = 10000 rules
    rs = parse_iptables_save(text, "big.txt")
    assert sum(1 for _ in rs.rules()) == 10000 and rs.diagnostics == []
