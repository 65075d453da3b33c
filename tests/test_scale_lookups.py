"""What makes big bundles cheap gives the answers the plain way gives: hashed ipsets against
testing every member, IPVS services found by address against trying every service, the
Kubernetes files searched for a value against locating every item, flow layouts stored
after the answer with the visited tables' indexes."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from traceflow.engines.netfilter import iptables_matches as M
from traceflow.model.packet import Packet

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _member(rng: random.Random) -> str:
    ip = f"10.{rng.randrange(4)}.{rng.randrange(4)}.{rng.randrange(8)}"
    kind = rng.randrange(6)
    if kind == 0:
        return f"{ip}/{rng.choice([24, 28, 30, 32])}" + (" nomatch" if rng.random() < .3 else "")
    if kind == 1:
        return f"{ip},{rng.choice(['tcp', 'udp'])}:{rng.choice([53, 80, 443])}"
    if kind == 2:
        return f"{ip},tcp:{rng.choice([80, 443])},10.{rng.randrange(4)}.0.0/16"
    if kind == 3:
        return f"{ip},tcp:80-90"                       # a range: tested one by one
    if kind == 4:
        return f"{ip},tcpudp:53"
    return f"{ip} timeout 30"


@pytest.mark.parametrize("flags", [("dst",), ("dst", "dst"), ("dst", "dst", "src"),
                                   ("src",)])
def test_hashed_sets_answer_as_every_member_tested(flags, monkeypatch):
    def one_by_one(members, flags, pkt):
        with monkeypatch.context() as m:
            m.setattr(M, "HASH_FROM", 10 ** 9)
            return M.ipset_contains(members, flags, pkt)

    rng = random.Random(len(flags) * 7 + len(flags[0]))
    for _ in range(30):
        members = [_member(rng) for _ in range(rng.randrange(40, 120))]
        for _ in range(60):
            pkt = Packet(nw_src=f"10.{rng.randrange(4)}.{rng.randrange(4)}.{rng.randrange(8)}",
                         nw_dst=f"10.{rng.randrange(4)}.{rng.randrange(4)}.{rng.randrange(8)}",
                         nw_proto=rng.choice([6, 17, 1]),
                         tp_src=rng.choice([None, 40000]), tp_dst=rng.choice([53, 80, 85, 443]))
            assert M.ipset_contains(members, flags, pkt) == one_by_one(members, flags, pkt), \
                (members, flags, pkt)
    # (the hashed path is taken: a breakage in it fails here, not only in speed)
    assert len(members) > M.HASH_FROM


def test_ipvs_services_found_by_address_as_by_trying_every_one():
    from traceflow.engines.netfilter import ipvs
    text = (EXAMPLES / "kube-proxy-ipvs/nodes/node1/ipvs.txt").read_text()
    table = ipvs.parse_ipvsadm(text, "ipvs.txt")
    rng = random.Random(5)
    addresses = [s.endpoint.ip for s in table.services if s.endpoint and s.endpoint.ip]
    assert len(addresses) > 100
    for _ in range(400):
        pkt = Packet(nw_src="10.244.1.5", nw_dst=rng.choice(addresses + ["10.1.2.3"]),
                     nw_proto=rng.choice([6, 17, 132]), tp_src=40000,
                     tp_dst=rng.choice([53, 80, 443, 8080, 9153]), mark=rng.choice([0, 0x4000]))
        indexed = table.lookup(pkt)
        linear = _linear_lookup(table, pkt)
        assert indexed == linear, pkt


def _linear_lookup(table, packet):
    """IpvsTable.lookup over every service (what it did before it looked up by address)."""
    from traceflow.engines.netfilter.ipvs import _rank, _why_unresolved
    best, undecided = None, None
    for svc in table.services:
        rank = _rank(svc, packet)
        if rank is None:
            undecided = undecided or (_why_unresolved(svc), svc)
        elif rank is not False and (best is None or rank < best[0]):
            best = (rank, svc)
    if best is not None and (best[0] < 2 or undecided is None):
        return best[1], None, None
    if undecided is not None:
        return None, undecided[0], undecided[1]
    return None, None, None


@pytest.mark.parametrize("example", ["kube-proxy-iptables", "antrea-encap-kube-proxy",
                                     "antrea-v2", "cilium-vxlan-policy"])
def test_searched_objects_are_the_located_ones(example):
    """Every pod by name and address, every Service by name and address, every Service's
    endpoints: the same from a search of the text as from the file located item by item."""
    from traceflow.bundle.kube import located_cluster
    from traceflow.bundle.kubecatalog import Objects
    from traceflow.bundle.reader import Bundle
    bundle = Bundle.open(EXAMPLES / example)
    whole = located_cluster(Objects(bundle.text))
    pods, services = whole.pods, whole.services
    searched = located_cluster(Objects(bundle.text))
    assert all(c.search is not None for c in [searched._objects.catalog("k8s/services.yaml")])
    for p in pods:
        assert searched.find_pod(p.namespace, p.name) == p
        if p.ip:
            assert searched.pods_at(p.ip) == [x for x in pods if x.ip == p.ip]
    for s in services:
        assert searched.find_service(s.namespace, s.name) == s
        assert searched.endpoints_of(s.key) == whole.endpoints.get(s.key, [])
    # nothing was located: every answer came from searches
    assert all(c.search is not None for c in searched._objects.located.values()
               if c.name.endswith(".yaml") and c.items is not None and c._whole is None)


def test_what_could_hide_a_value_is_searched_with_it(tmp_path):
    """An alias whose anchor holds the value, an escaped string: their items are
    candidates too (or the file is located), so nothing is missed."""
    from traceflow.bundle.kube import located_cluster
    from traceflow.bundle.kubecatalog import Objects
    text = (EXAMPLES / "antrea-encap-kube-proxy/k8s/pods.yaml").read_text()
    assert "&id001" in text and "*id001" in text         # the example has one already
    escaped = text.replace("    name: backend2\n", '    name: "back\\x65nd2"\n', 1)
    for variant in (text, escaped):
        files = {"k8s/pods.yaml": variant}
        whole = located_cluster(Objects(files.get)).pods
        searched = located_cluster(Objects(files.get))
        for p in whole:
            assert searched.find_pod(p.namespace, p.name) == p


def test_flow_layouts_are_stored_after_the_answer_with_the_visited_tables(tmp_path,
                                                                          monkeypatch):
    from benchmarks.synth import build
    from traceflow.bundle import index as bundleindex
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path / "cache"))
    dest = build(tmp_path / "b", 4000)
    text = (dest / "nodes/worker1/ovs-flows.txt").read_text()
    dump = bundleindex.load_flow_dump(text, "ovs-flows.txt")
    assert not list((tmp_path / "cache").glob("bundle-ovs-flows-*"))   # nothing before
    big = [t for t in dump.table_ids() if len(dump._numbers[t]) >= 64]
    assert len(big) >= 3
    dump.candidates(big[0], {})
    bundleindex.store_pending()
    again = bundleindex.load_flow_dump(text, "ovs-flows.txt")
    assert again._checking and set(again._stored) == {big[0]}     # only the visited one
    again.candidates(big[1], {})
    bundleindex.store_pending()
    third = bundleindex.load_flow_dump(text, "ovs-flows.txt")
    assert set(third._stored) == {big[0], big[1]}                  # grown by the next command
    fresh = bundleindex.FlowDump(text, "x") if hasattr(bundleindex, "FlowDump") else None
    from traceflow.engines.ovs.flows import FlowDump
    fresh = FlowDump(text, "ovs-flows.txt")
    for table in big:
        for state in ({}, {"nw_dst": 0x0a800005}, {"dl_dst": 0x0a0000000501}):
            assert [f.source.line for f in third.candidates(table, state)] == \
                [f.source.line for f in fresh.candidates(table, state)]
    shutil.rmtree(tmp_path / "cache")
