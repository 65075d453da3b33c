"""Lazily parsed iptables-save (what a trace uses) gives exactly the branches of the eager
parse, for every Service of the 301-service kube-proxy example, and parses only the rules
a walk looks at."""

from __future__ import annotations

import hashlib
import ipaddress
from pathlib import Path

import pytest
import yaml

from traceflow.bundle import index as bundleindex
from traceflow.engines.netfilter import NodeContext, evaluate_hook
from traceflow.engines.netfilter.iptables_parse import LazyChain, parse_iptables_save
from traceflow.model.packet import Packet

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "traceflow" / "examples" / "kube-proxy-iptables"
SAVE = "nodes/node1/iptables-save.txt"


def _services():
    doc = yaml.safe_load((BUNDLE / "k8s/services.yaml").read_text())
    for item in doc["items"]:
        spec = item["spec"]
        ip = spec.get("clusterIP")
        if not ip or ip == "None" or ipaddress.ip_address(ip).version != 4:
            continue
        for port in spec.get("ports") or []:
            yield ip, int(port["port"]), (port.get("protocol") or "TCP").lower()


def _summary(branches):
    return [(round(b.weight, 9), b.verdict, b.packet.nw_dst, b.packet.tp_dst,
             [(s.table, s.chain, s.rule.source.line if s.rule else None, s.effect, s.matched)
              for s in b.steps]) for b in branches]


@pytest.mark.parametrize("how", ["lazy", "from the index"])
def test_lazy_and_eager_give_the_same_branches_for_every_service(how):
    text = (BUNDLE / SAVE).read_text()
    eager = parse_iptables_save(text, SAVE)
    if how == "lazy":
        lazy = parse_iptables_save(text, SAVE, lazy=True)
    else:
        first = bundleindex.parse_iptables_save(text, SAVE)
        bundleindex.store_pending()         # stores the layout (a command: once it answered)
        lazy = bundleindex.parse_iptables_save(text, SAVE)      # reads it
        assert first is not lazy
        assert bundleindex.load_blob("iptables-save", hashlib.sha256(text.encode())
                                     .hexdigest()) is not None
    services = list(_services())
    assert len(services) > 300
    for ip, port, proto in services:
        pkt = Packet(nw_src="10.244.1.5", nw_dst=ip, nw_proto=6 if proto == "tcp" else 17
                     if proto == "udp" else 132, tp_src=54321, tp_dst=port)
        ctx = NodeContext(node="node1")
        assert _summary(evaluate_hook(lazy, "PREROUTING", pkt, ctx)) == \
            _summary(evaluate_hook(eager, "PREROUTING", pkt, ctx)), (ip, port, proto)


def test_a_walk_parses_only_the_rules_it_looks_at():
    text = (BUNDLE / SAVE).read_text()
    lazy = parse_iptables_save(text, SAVE, lazy=True)
    ip, port, _ = next(_services())
    evaluate_hook(lazy, "PREROUTING", Packet(nw_src="10.244.1.5", nw_dst=ip, nw_proto=6,
                                             tp_src=54321, tp_dst=port),
                  NodeContext(node="node1"))
    services = lazy.tables["nat"].chains["KUBE-SERVICES"]
    assert isinstance(services, LazyChain)
    parsed = sum(r is not None for r in services._parsed)
    assert 0 < parsed < services.rule_count() / 10
    untouched = [c for c in lazy.tables["nat"].chains.values()
                 if isinstance(c, LazyChain) and not any(c._parsed or ())]
    assert len(untouched) > 100


def test_a_layout_that_does_not_fit_the_file_is_not_used():
    text = (BUNDLE / SAVE).read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()
    bundleindex.store_blob("iptables-save", digest,
                           {"tables": [["nat", [["KUBE-SERVICES", None, [10 ** 9]]]]],
                            "caveats": []})
    rs = bundleindex.parse_iptables_save(text, SAVE)
    assert rs.tables["nat"].chains["KUBE-SERVICES"].rule_count() > 300


def test_kube_services_is_walked_from_candidate_to_candidate():
    """``next_candidate`` skips exactly the service rules for other addresses: every rule
    that is not of the service shape, and every rule for the packet's address (two ports of
    one Service are two rules), is still visited, in order."""
    text = (BUNDLE / SAVE).read_text()
    lazy = parse_iptables_save(text, SAVE, lazy=True)
    chain = lazy.tables["nat"].chains["KUBE-SERVICES"]
    shapes = chain._service_destinations()
    count = chain.rule_count()
    assert any(d is None for d in shapes) and sum(d is not None for d in shapes) > 300
    by_ip: dict = {}
    for d in shapes:
        if d is not None:
            by_ip[d] = by_ip.get(d, 0) + 1
    two_ports = next(ip for ip, n in by_ip.items() if n > 1)
    for dst in (two_ports, next(iter(by_ip)), "10.255.255.254", None):
        pkt = Packet(nw_src="10.244.1.5", nw_dst=dst, nw_proto=6, tp_src=54321, tp_dst=80)
        visited, index = [], 0
        while (index := chain.next_candidate(index, pkt)) < count:
            visited.append(index)
            index += 1
        assert visited == [i for i, d in enumerate(shapes)
                           if d is None or dst is None or d == dst], dst
