"""`nft list ruleset` read lazily (traceflow.engines.netfilter.nft_lazy): the same verdicts and rule hits
as the whole-text parser on every nft listing the tests hold, only the blocks a walk uses parsed,
bad input still a located error, and the block layout kept in the bundle index."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from traceflow.bundle import index as bundleindex
from traceflow.engines.netfilter import NodeContext, nft_lazy, nft_parse
from traceflow.engines.netfilter.iptables import RuleSyntaxError
from traceflow.engines.netfilter.nft_lazy import LazyNftRuleset, from_layout, open_nft_ruleset
from traceflow.engines.netfilter.nft_parse import parse_nft_ruleset
from traceflow.model.packet import Packet

ROOT = Path(__file__).resolve().parents[1]
KP_NFT = ROOT / "traceflow" / "examples" / "kube-proxy-nftables"
NODE_IPS = {"node1": "192.168.10.11", "node2": "192.168.10.12", "node3": "192.168.10.13"}
NFT_FILES = sorted([*KP_NFT.glob("nodes/*/nft.txt"),
                    *(p for p in (ROOT / "tests" / "data").rglob("nft*") if p.is_file())])
HOOKS = ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _model(rs) -> dict:
    """Everything the parsers produce, as plain values (reads every lazy block)."""
    out = {}
    for key, t in rs.tables.items():
        out[key] = (t.family, t.name, t.source, t.comment, t.flags, t.objects,
                    {n: (c.name, c.source, c.type, c.hook, c.priority, c.priority_text, c.policy,
                         c.device, c.comment, c.rules) for n, c in t.chains.items()},
                    {n: (s.name, s.kind, s.source, s.key_types, s.data_type, s.flags, s.comment,
                         s.properties, s.elements) for n, s in t.sets.items()})
    return out


def _summary(branches) -> list:
    return [(round(b.weight, 9), b.verdict, b.packet.nw_dst, b.packet.tp_dst, b.packet.nw_src,
             b.packet.tp_src, b.packet.mark, b.nat, b.connmark, sorted(b.ct_state),
             [(s.table, s.chain, s.rule.source if s.rule else None, s.effect, s.unknown,
               s.matched) for s in b.steps]) for b in branches]


def _addresses_and_ports(rs) -> tuple[list[str], list[int]]:
    """Addresses and ports named in the ruleset's sets, maps and rules."""
    addrs, ports = set(), set()

    def take(text):
        for word in str(text).replace(",", " ").replace(":", " ").split():
            parts = word.split(".")
            if len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts):
                addrs.add(word)
            elif word.isdigit() and 0 < int(word) < 65536:
                ports.add(int(word))
    for t in rs.tables.values():
        for s in t.sets.values():
            for e in s.elements:
                take(e.text)
        for c in t.chains.values():
            for r in c.rules:
                take(r.text)
    return sorted(addrs), sorted(ports)


def _packets(rs, node_ip: str, count: int, seed: int):
    rng = random.Random(seed)
    addrs, ports = _addresses_and_ports(rs)
    addrs = addrs or ["10.0.0.1"]
    ports = ports or [80]
    sources = ["10.244.1.5", "10.244.2.7", "192.168.10.11", "198.51.100.7", "203.0.113.9"]
    for _ in range(count):
        roll = rng.random()
        if roll < 0.6:                                   # a Service VIP (or any named address)
            dst, dport = rng.choice(addrs), rng.choice(ports)
        elif roll < 0.8:                                 # a NodePort on this node
            dst, dport = node_ip, rng.choice(ports)
        else:                                            # anything
            dst = f"{rng.choice((10, 172, 192, 203))}.{rng.randrange(256)}.{rng.randrange(256)}" \
                  f".{rng.randrange(1, 255)}"
            dport = rng.randrange(1, 65536)
        proto = rng.choice((6, 6, 6, 17, 132))
        yield Packet(nw_src=rng.choice(sources), nw_dst=dst, nw_proto=proto,
                     tp_src=rng.randrange(1024, 65536), tp_dst=dport,
                     mark=rng.choice((0, 0, 0x4000))), rng.choice(HOOKS)


@pytest.mark.parametrize("path", NFT_FILES, ids=_id)
def test_lazy_and_eager_give_the_same_walks(path):
    text = path.read_text()
    name = _id(path)
    eager = parse_nft_ruleset(text, name)
    lazy = open_nft_ruleset(text, name)
    assert isinstance(lazy, LazyNftRuleset)          # every listing here is nft's own layout
    for hook in HOOKS:
        for family in ("ip", "ip6", "bridge"):
            assert ([(t.label, c.name) for t, c in lazy.base_chains(hook, family)]
                    == [(t.label, c.name) for t, c in eager.base_chains(hook, family)])
    assert lazy.blocks_read == []
    node_ip = NODE_IPS.get(path.parent.name, "192.168.10.11")
    ctx = NodeContext(node="n", local_addresses={node_ip, "10.244.1.1", "127.0.0.1"})
    walks = 0
    for pkt, hook in _packets(eager, node_ip, 150, seed=len(text)):
        want = eager.evaluate_hook(hook, pkt.copy(), ctx)
        got = lazy.evaluate_hook(hook, pkt.copy(), ctx)
        assert _summary(got) == _summary(want), (hook, pkt)
        walks += bool(want)
    assert walks > 100
    assert _model(lazy) == _model(eager)
    assert sorted(map(str, lazy.diagnostics)) == sorted(map(str, eager.diagnostics))
    assert lazy.caveats == eager.caveats


def test_every_service_vip_and_nodeport_of_the_example_walks_the_same():
    path = KP_NFT / "nodes/node2/nft.txt"
    text = path.read_text()
    eager = parse_nft_ruleset(text, "nft.txt")
    lazy = open_nft_ruleset(text, "nft.txt")
    ctx = NodeContext(node="node2", local_addresses={NODE_IPS["node2"], "10.244.2.1"})
    keys = []
    for name in ("service-ips", "no-endpoint-services", "firewall-ips"):
        keys += [(e.key[0].text, e.key[1].text, int(e.key[2].text))
                 for e in eager.table("ip", "kube-proxy").sets[name].elements]
    for name in ("service-nodeports", "no-endpoint-nodeports"):
        keys += [(NODE_IPS["node2"], e.key[0].text, int(e.key[1].text))
                 for e in eager.table("ip", "kube-proxy").sets[name].elements]
    assert len(keys) > 300
    for dst, proto, port in keys:
        for src in ("10.244.1.5", "198.51.100.7"):
            pkt = Packet(nw_src=src, nw_dst=dst, nw_proto={"tcp": 6, "udp": 17}[proto],
                         tp_src=40000, tp_dst=port)
            want = eager.evaluate_hook("PREROUTING", pkt.copy(), ctx)
            assert _summary(lazy.evaluate_hook("PREROUTING", pkt.copy(), ctx)) == _summary(want)


class _Spy:
    """Counts the whole-text parser's block readers, called for each block parsed."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        real_chain, real_set = nft_parse._FileReader.chain, nft_parse._FileReader.set
        spy = self

        def chain(reader, table):
            spy.calls.append("chain " + reader.toks[reader.i + 1].text)
            return real_chain(reader, table)

        def set_(reader, table, kind):
            spy.calls.append(f"{kind} " + reader.toks[reader.i + 1].text)
            return real_set(reader, table, kind)
        monkeypatch.setattr(nft_parse._FileReader, "chain", chain)
        monkeypatch.setattr(nft_parse._FileReader, "set", set_)


def test_a_chain_or_set_never_entered_is_never_parsed(monkeypatch):
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    eager = parse_nft_ruleset(text, "nft.txt")
    table = eager.table("ip", "kube-proxy")
    spy = _Spy(monkeypatch)
    lazy = open_nft_ruleset(text, "nft.txt")
    at_open = list(spy.calls)
    # at open: the base chains and the one chain with a comment (reject-chain), nothing else
    assert sorted(at_open) == sorted(f"chain {c.name}" for c in table.chains.values()
                                     if c.is_base or c.comment)
    assert len(at_open) < 10 < len(table.chains) + len(table.sets)
    kube_dns = Packet(nw_src="10.244.1.5", nw_dst="10.96.0.10", nw_proto=17, tp_src=40000,
                      tp_dst=53)
    ctx = NodeContext(node="node1", local_addresses={NODE_IPS["node1"]})
    lazy.evaluate_hook("PREROUTING", kube_dns, ctx)
    read = spy.calls[len(at_open):]
    assert read == lazy.blocks_read
    assert len(read) == len(set(read))                  # each block once
    assert "map service-ips" in read and "chain services" in read
    service = [r for r in read if r.startswith("chain service-")]
    assert service == ["chain " + next(c for c in table.chains if "kube-dns/udp/dns" in c
                                       and c.startswith("service-"))]
    assert len(read) <= 8, read                          # of ~1,000 chains, sets and maps
    assert not any(r.startswith("set affinity-") for r in read)
    # the same packet again parses nothing more
    lazy.evaluate_hook("PREROUTING", kube_dns, ctx)
    assert spy.calls[len(at_open):] == read


def _with_line_after(text: str, anchor: str, line: str) -> tuple[str, int]:
    lines = text.split("\n")
    n = next(i for i, t in enumerate(lines) if t.strip().startswith(anchor)) + 1
    lines.insert(n, line)
    return "\n".join(lines), n + 1


def test_a_malformed_line_in_a_chain_the_walk_enters_is_a_located_error():
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    bad, number = _with_line_after(text, "chain services {", "\t\tfrobnicate 10.0.0.1 accept")
    lazy = open_nft_ruleset(bad, "nodes/node1/nft.txt")
    lazy.raise_for_errors()                              # not found at open: never read yet
    pkt = Packet(nw_src="10.244.1.5", nw_dst="10.96.0.10", nw_proto=17, tp_src=4000, tp_dst=53)
    with pytest.raises(RuleSyntaxError) as err:
        lazy.evaluate_hook("PREROUTING", pkt, NodeContext(node="node1"))
    assert (err.value.file, err.value.line) == ("nodes/node1/nft.txt", number)
    assert err.value.text.strip() == "frobnicate 10.0.0.1 accept"
    assert "not an nftables rule" in err.value.reason
    # asked again: the same error, recorded once
    with pytest.raises(RuleSyntaxError) as again:
        lazy.evaluate_hook("PREROUTING", pkt, NodeContext(node="node1"))
    assert str(again.value) == str(err.value)
    assert [d.line for d in lazy.syntax_errors] == [number]
    # the whole-text parser finds the same error
    eager = parse_nft_ruleset(bad, "nodes/node1/nft.txt")
    assert [(d.line, d.reason) for d in eager.syntax_errors] == [(number, err.value.reason)]


def test_a_bad_element_in_a_map_the_walk_reads_is_a_located_error():
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    bad = text.replace("10.96.0.10 . udp . 53 :", "10.96.0.10 . udp . 53 : goto", 1)
    number = bad[:bad.index("10.96.0.10 . udp . 53 :")].count("\n") + 1
    lazy = open_nft_ruleset(bad, "nft.txt")
    lazy.raise_for_errors()
    pkt = Packet(nw_src="10.244.1.5", nw_dst="10.96.0.99", nw_proto=6, tp_src=4000, tp_dst=80)
    with pytest.raises(RuleSyntaxError) as err:
        lazy.evaluate_hook("PREROUTING", pkt, NodeContext(node="node1"))
    assert err.value.line == number and "service-ips" in err.value.reason


def test_a_malformed_line_in_a_chain_never_entered_is_not_read():
    """What the docstring says: inside a regular chain, only brace balance is checked at open."""
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    table = parse_nft_ruleset(text, "x").table("ip", "kube-proxy")
    other = next(c for c in table.chains if c.startswith("endpoint-"))
    bad, number = _with_line_after(text, f"chain {other} {{", "\t\tgarbage here")
    lazy = open_nft_ruleset(bad, "nft.txt")
    pkt = Packet(nw_src="10.244.1.5", nw_dst="10.96.0.10", nw_proto=17, tp_src=4000, tp_dst=53)
    assert lazy.evaluate_hook("PREROUTING", pkt, NodeContext(node="node1"))
    with pytest.raises(RuleSyntaxError) as err:
        lazy.table("ip", "kube-proxy").chains[other].rules
    assert err.value.line == number


@pytest.mark.parametrize("change, reason", [
    (lambda t: t.replace("\tchain services {", "\tchain services {{", 1), "not an nftables rule"),
    (lambda t: t.replace("jump services", 'jump "services', 1), "unterminated string"),
    (lambda t: t.replace("\tchain services {", "\tchian services {", 1), "not a table item"),
    (lambda t: "garbage\n" + t, "not `nft list` output"),
    (lambda t: t + "}\n", "unbalanced `}`"),
])
def test_structural_errors_are_found_at_open(change, reason):
    text = change((KP_NFT / "nodes/node1/nft.txt").read_text())
    eager = parse_nft_ruleset(text, "nft.txt")
    lazy = open_nft_ruleset(text, "nft.txt")
    assert lazy.syntax_errors and reason in lazy.syntax_errors[0].reason
    assert [str(d) for d in lazy.syntax_errors] == [str(d) for d in eager.syntax_errors]


def test_text_not_laid_out_like_nft_prints_it_is_read_whole():
    text = ("table ip t { chain c { type filter hook input priority 0; policy drop; "
            "ip saddr 10.0.0.1 accept; } }\n")
    rs = open_nft_ruleset(text, "one-line.txt")
    assert not isinstance(rs, LazyNftRuleset)
    assert _model(rs) == _model(parse_nft_ruleset(text, "one-line.txt"))


# ---- the layout in the bundle index ----------------------------------------------------------


def test_layout_round_trip(monkeypatch):
    for path in NFT_FILES:
        text = path.read_text()
        lazy = open_nft_ruleset(text, "n.txt")
        layout = json.loads(json.dumps(lazy.layout))
        again = from_layout(text, "n.txt", layout)
        assert _model(again) == _model(parse_nft_ruleset(text, "n.txt")), path


def _digest(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_index_keeps_the_layout_and_the_next_open_skips_the_pass(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path))
    text = (KP_NFT / "nodes/node3/nft.txt").read_text()
    want = _model(parse_nft_ruleset(text, "nft.txt"))
    first = bundleindex.parse_nft_ruleset(text, "nft.txt")
    assert bundleindex.load_blob("nft-layout", _digest(text)) == json.loads(
        json.dumps(first.layout))

    def no_pass(_text):
        raise AssertionError("the lines were read again")
    monkeypatch.setattr(nft_lazy, "_scan", no_pass)
    second = bundleindex.parse_nft_ruleset(text, "nft.txt")
    assert isinstance(second, LazyNftRuleset)
    assert _model(second) == want


def _shifted(layout: dict, by: int) -> dict:
    out = json.loads(json.dumps(layout))
    for table in out["tables"]:
        for entry in table[4]:
            entry[3] += by
    return out


@pytest.mark.parametrize("bad_layout", [
    lambda other, own: other,                                    # another text's layout
    lambda other, own: dict(own, size=own["size"] + 1),
    lambda other, own: dict(own, format="traceflow-nft-layout/0"),
    lambda other, own: _shifted(own, 1),                         # offsets off by one
    lambda other, own: {**own, "tables": [[t[0], t[1], t[2] + 1, t[3], t[4]]
                                          for t in own["tables"]]},  # line numbers off
    lambda other, own: {**own, "tables": "x"},
    lambda other, own: {**own, "tables": [["ip", "kube-proxy", 1, 0, [["chain", "x", 1]]]]},
    lambda other, own: [1, 2, 3],
])
def test_a_stale_foreign_or_corrupt_layout_is_ignored(monkeypatch, tmp_path, bad_layout):
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path))
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    # the same size, other bytes: node1's text with two chain names swapped in place
    other = (KP_NFT / "nodes/node2/nft.txt").read_text()
    own = open_nft_ruleset(text, "x").layout
    foreign = open_nft_ruleset(other, "x").layout
    bundleindex.store_blob("nft-layout", _digest(text), bad_layout(foreign, own))
    got = bundleindex.parse_nft_ruleset(text, "nodes/node1/nft.txt")
    assert _model(got) == _model(parse_nft_ruleset(text, "nodes/node1/nft.txt"))
    # and the good layout is stored again for the next command
    assert bundleindex.load_blob("nft-layout", _digest(text)) == json.loads(json.dumps(own))


def test_a_layout_of_the_same_size_but_other_blocks_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path))
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    # same length: two blocks' headers swap kinds-of-name; the offsets of the old text fit
    swapped = text.replace("chain filter-input {", "chain filter-inpux {", 1)
    assert len(swapped) == len(text)
    bundleindex.store_blob("nft-layout", _digest(swapped), open_nft_ruleset(text, "x").layout)
    got = bundleindex.parse_nft_ruleset(swapped, "nft.txt")
    assert "filter-inpux" in got.table("ip", "kube-proxy").chains
    assert _model(got) == _model(parse_nft_ruleset(swapped, "nft.txt"))


def test_no_index_still_reads_lazily(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEFLOW_NO_INDEX", "1")
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    rs = bundleindex.parse_nft_ruleset(text, "nft.txt")
    assert isinstance(rs, LazyNftRuleset) and rs.blocks_read == []
    assert list(tmp_path.iterdir()) == []


def test_nf_trace_on_a_bundle_with_a_bad_rule_in_the_walked_chain_exits_2(tmp_path):
    dest = tmp_path / "kp"
    shutil.copytree(KP_NFT, dest)
    nft = dest / "nodes/node1/nft.txt"
    bad, number = _with_line_after(nft.read_text(), "chain services {", "\t\tbogus 10.0.0.1 drop")
    nft.write_text(bad)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEFLOW_CACHE_DIR": str(tmp_path / "c")}
    args = [sys.executable, "-m", "traceflow", "nf-trace", "node1", "--src", "10.244.1.5",
            "--dst", "10.96.0.10", "--dport", "53", "--protocol", "udp", "--bundle", str(dest)]
    for _ in range(2):                       # without, then with the stored layout
        r = subprocess.run(args, capture_output=True, text=True, env=env)
        assert r.returncode == 2, r.stdout
        assert f"nodes/node1/nft.txt, line {number}" in r.stderr
        assert "Traceback" not in r.stderr
    nft.write_text(bad.replace("\t\tbogus 10.0.0.1 drop\n", "", 1))
    r = subprocess.run(args + ["-o", "json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {p["verdict"] for p in doc["paths"]} == {"delivered"}


def test_layout_names_every_block_of_a_kube_proxy_table():
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    eager = parse_nft_ruleset(text, "x").table("ip", "kube-proxy")
    entries = open_nft_ruleset(text, "x").layout["tables"][0][4]
    lazy_names = {(kind, name) for kind, name, *_ in entries if kind != "item"}
    assert lazy_names == ({("chain", c.name) for c in eager.chains.values()
                           if not (c.is_base or c.comment)}
                          | {(s.kind, s.name) for s in eager.sets.values()})


# ---- big maps of plain elements: read element by element ---------------------------------------


def test_every_map_read_element_by_element_gives_the_same_walks(monkeypatch):
    """With the size threshold at 0, every map and set of the examples whose elements are all
    plain literals takes the element-by-element path."""
    monkeypatch.setattr(nft_lazy, "_PLAIN_MIN", 0)
    for path in KP_NFT.glob("nodes/*/nft.txt"):
        text = path.read_text()
        eager = parse_nft_ruleset(text, "nft.txt")
        lazy = open_nft_ruleset(text, "nft.txt")
        kinds = {n: type(s.elements).__name__
                 for n, s in lazy.table("ip", "kube-proxy").sets.items()}
        assert kinds["service-ips"] == kinds["no-endpoint-services"] == "_PlainElements"
        assert kinds["service-nodeports"] == "_PlainElements"
        lazy = open_nft_ruleset(text, "nft.txt")
        node_ip = NODE_IPS[path.parent.name]
        ctx = NodeContext(node="n", local_addresses={node_ip})
        for pkt, hook in _packets(eager, node_ip, 200, seed=7):
            want = eager.evaluate_hook(hook, pkt.copy(), ctx)
            assert _summary(lazy.evaluate_hook(hook, pkt.copy(), ctx)) == _summary(want)
        assert _model(lazy) == _model(eager)


def _generated(services: int) -> tuple[str, str, int]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.nft_scale import ruleset_text
    return ruleset_text(services)


def test_a_big_generated_table_parses_only_the_packets_elements(monkeypatch):
    text, vip, port = _generated(1500)
    eager = parse_nft_ruleset(text, "nft.txt")
    table = eager.table("ip", "kube-proxy")
    assert len(table.sets["service-ips"].elements) > 1400
    calls = []
    real = nft_lazy._read_element

    def read_element(rd, dtypes, data):
        calls.append(rd.peek().line)
        return real(rd, dtypes, data)
    monkeypatch.setattr(nft_lazy, "_read_element", read_element)
    lazy = open_nft_ruleset(text, "nft.txt")
    ctx = NodeContext(node="node1", local_addresses={NODE_IPS["node1"], "10.244.1.1"})
    pkt = Packet(nw_src="10.244.1.5", nw_dst=vip, nw_proto=6, tp_src=40000, tp_dst=port)
    want = eager.evaluate_hook("PREROUTING", pkt.copy(), ctx)
    got = lazy.evaluate_hook("PREROUTING", pkt.copy(), ctx)
    assert _summary(got) == _summary(want)
    assert want[0].packet.nw_dst != vip                  # DNATed to an endpoint
    hit = next(e for e in table.sets["service-ips"].elements if e.key[0].text == vip)
    assert calls == [hit.line]                           # one element of 1,500 parsed
    assert len(lazy.blocks_read) <= 8
    # NodePorts, other VIPs and misses: the same as the whole-text parser
    for pkt, hook in _packets(eager, NODE_IPS["node1"], 150, seed=3):
        want = eager.evaluate_hook(hook, pkt.copy(), ctx)
        assert _summary(lazy.evaluate_hook(hook, pkt.copy(), ctx)) == _summary(want)


def test_a_map_with_one_element_not_plain_is_read_whole_and_errors_are_located(monkeypatch):
    monkeypatch.setattr(nft_lazy, "_PLAIN_MIN", 0)
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    # the last element of service-ips with a data part that is not a verdict
    last = text.index(" }", text.index("map service-ips {"))
    start = text.rindex(": ", 0, last) + 2
    bad = text[:start] + "frobnicate x" + text[last:]
    number = bad[:start].count("\n") + 1
    lazy = open_nft_ruleset(bad, "nft.txt")
    pkt = Packet(nw_src="10.244.1.5", nw_dst="10.96.0.10", nw_proto=17, tp_src=4000, tp_dst=53)
    with pytest.raises(RuleSyntaxError) as err:
        lazy.evaluate_hook("PREROUTING", pkt, NodeContext(node="node1"))
    assert err.value.line == number
    assert [(d.line, d.reason) for d in parse_nft_ruleset(bad, "nft.txt").syntax_errors] == [
        (number, err.value.reason)]


def _with_handles(text: str) -> str:
    """The listing as `nft -a list ruleset` prints it: `# handle N` after tables, chains, sets
    and rules."""
    out, handle, in_chain = [], 1, False
    for line in text.split("\n"):
        code = line.strip()
        if code.startswith(("table ", "chain ", "set ", "map ")) and code.endswith("{"):
            in_chain = code.startswith("chain ")
            line += f" # handle {handle}"
        elif code == "}":
            in_chain = False
        elif in_chain and code and not code.startswith(("type ", "comment ")):
            line += f" # handle {handle}"
        handle += 1
        out.append(line)
    return "\n".join(out)


def test_a_listing_with_handles_is_read_lazily_and_the_same():
    text = _with_handles((KP_NFT / "nodes/node1/nft.txt").read_text())
    assert text.count("# handle") > 1000
    eager = parse_nft_ruleset(text, "nft.txt")
    lazy = open_nft_ruleset(text, "nft.txt")
    assert isinstance(lazy, LazyNftRuleset)
    ctx = NodeContext(node="node1", local_addresses={NODE_IPS["node1"]})
    for pkt, hook in _packets(eager, NODE_IPS["node1"], 150, seed=11):
        want = eager.evaluate_hook(hook, pkt.copy(), ctx)
        assert _summary(lazy.evaluate_hook(hook, pkt.copy(), ctx)) == _summary(want)
    assert _model(lazy) == _model(eager)
    assert any(r.handle for c in eager.table("ip", "kube-proxy").chains.values() for r in c.rules)
    assert _model(from_layout(text, "nft.txt", json.loads(json.dumps(lazy.layout)))) == \
        _model(eager)


# ---- damaged listings: the lazy reading is the whole-text parser's, or its located error -------


def _mutated(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        p = rng.randrange(len(text))
        roll = rng.random()
        if roll < 0.3:
            text = text[:p] + text[p + 1:]
        elif roll < 0.6:
            text = text[:p] + rng.choice(["{", "}", '"', "#", ";", "\n", "x ", "chain ",
                                          " handle 3", "type ", 'comment "a"']) + text[p:]
        else:
            text = text[:p] + text[min(len(text), p + rng.randint(1, 40)):]
    return text


@pytest.mark.parametrize("plain_min", [0, 64])
def test_damaged_listings_read_lazily_are_the_same_or_the_same_located_error(monkeypatch,
                                                                            plain_min):
    monkeypatch.setattr(nft_lazy, "_PLAIN_MIN", plain_min)
    bases = [p.read_text() for p in sorted((ROOT / "tests/data/realworld/nft").glob("*"))]
    rng = random.Random(plain_min)
    outcomes = {"same": 0, "error": 0, "read whole": 0}
    for _ in range(250):
        text = _mutated(rng.choice(bases), rng)
        eager = parse_nft_ruleset(text, "nft.txt")
        lazy = open_nft_ruleset(text, "nft.txt")
        if not isinstance(lazy, LazyNftRuleset):
            outcomes["read whole"] += 1
            continue
        try:
            model = _model(lazy)
        except RuleSyntaxError as exc:     # the first error of the blocks, as located by both
            assert any(d.line == exc.line and exc.reason.startswith(d.reason)
                       for d in eager.syntax_errors), str(exc)
            outcomes["error"] += 1
            continue
        assert model == _model(eager)
        assert sorted(map(str, lazy.diagnostics)) == sorted(map(str, eager.diagnostics))
        assert lazy.caveats == eager.caveats
        outcomes["same"] += 1
    assert min(outcomes.values()) > 10, outcomes


def test_a_brace_closing_a_block_in_the_middle_of_a_line_is_read_like_nft_does():
    text = (KP_NFT / "nodes/node1/nft.txt").read_text()
    joined = text.replace("\n\t}\n\n\tchain services {", "\n\t}    chain services {", 1)
    assert joined != text
    lazy = open_nft_ruleset(joined, "nft.txt")
    assert _model(lazy) == _model(parse_nft_ruleset(joined, "nft.txt"))
    assert "services" in lazy.table("ip", "kube-proxy").chains


def test_a_numgen_modulus_that_is_not_a_number_is_not_modelled_not_a_crash():
    text = "table ip t {\n chain c {\n  numgen random mod o vmap { 0 : accept }\n }\n}\n"
    for rs in (parse_nft_ruleset(text, "nft.txt"), open_nft_ruleset(text, "nft.txt")):
        rule = rs.table("ip", "t").chains["c"].rules[0]
        assert "expected a modulus, found `o`" in rule.exprs[0].reason
