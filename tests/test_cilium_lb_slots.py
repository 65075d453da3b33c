"""Which backend slots a new connection can take (issue 22 item 1), against Cilium's own
load-balancer expectations: the services map of each stage of
pkg/loadbalancer/tests/testdata/quarantined.txtar and graceful-termination.txtar (cilium/cilium,
read with the search tools; provenance in tests/data/PROVENANCE.md), written as the bundle files
`cilium-dbg bpf lb list` and `bpf lb list --frontends` print (1.17 formats), with the txtar's
`db/show backends` tables where a stage has one.

The datapath picks ``slot = prandom() % count + 1`` (bpf/lib/lb.h,
lb4_select_backend_id_random, 1.17 line 1420): slots 1..count; the qcount slots after them hold
quarantined or terminating backends and are never chosen for a new connection. The expected
slot sets below are the txtar's COUNT: the backends in slots 1..COUNT."""

from __future__ import annotations

from pathlib import Path

import pytest

from cilium_walks import copy_example, path_to, trace
from traceflow.engines.cilium import load_node
from traceflow.engines.cilium.lookup import service_lookup

DATA = Path(__file__).resolve().parent / "data" / "cilium" / "1.17" / "txtar"



def _services(stage: str, drop: tuple = ()):
    from traceflow.cni.cilium.node import CiliumNode
    d = DATA / stage
    files = {p.name: p.read_text() for p in d.iterdir() if p.name not in drop}
    node = CiliumNode.__new__(CiliumNode)
    node.name = "n1"
    node.maps = load_node(files, "1.17.0")
    return node.services


# (stage, frontend, the backends a new connection can take, the ones it never takes)
STAGES = [
    ("quarantined-maps1", "10.96.50.104", {"10.244.1.1"}, {"10.244.1.2"}),          # COUNT=1 QCOUNT=1
    ("quarantined-maps2", "10.96.50.104", {"10.244.1.1", "10.244.1.3"}, {"10.244.1.2"}),  # 2[1]
    ("quarantined-maps3", "10.96.50.104", {"10.244.1.1", "10.244.1.2", "10.244.1.3"}, set()),
    ("graceful-termination-active", "10.96.116.33", {"10.244.0.112", "10.244.0.113"}, set()),
    ("graceful-termination-terminating1", "10.96.116.33", {"10.244.0.113"}, {"10.244.0.112"}),
    # every backend terminating: the agent puts them in the counted slots (COUNT=2 QCOUNT=0)
    ("graceful-termination-terminating2", "10.96.116.33", {"10.244.0.112", "10.244.0.113"}, set()),
]


@pytest.mark.parametrize("stage, vip, chosen, never", STAGES)
def test_the_slots_cilium_expects_are_the_candidates(stage, vip, chosen, never):
    (svc,) = _services(stage)
    hit = service_lookup([svc], vip, svc.port, "TCP")
    assert {b.ip for b in hit.candidates} == chosen
    assert hit.count == len(chosen)
    assert svc.count_source is not None and svc.count_source.file == "cilium-bpf-lb-list-frontends.txt"
    for ip in never:
        assert ip in hit.note and "never chosen for a new connection" in hit.note


@pytest.mark.parametrize("stage, vip, chosen", [
    ("quarantined-maps1", "10.96.50.104", {"10.244.1.1"}),
    ("graceful-termination-terminating1", "10.96.116.33", {"10.244.0.113"})])
def test_without_the_count_backend_states_decide(stage, vip, chosen):
    """No `--frontends` in the bundle: the states `db/show backends` gives (the txtar's
    tables) leave the quarantined ([unhealthy]) and terminating backends out."""
    (svc,) = _services(stage, drop=("cilium-bpf-lb-list-frontends.txt",))
    assert svc.count is None and svc.states_source.endswith("cilium-db-backends.txt")
    hit = service_lookup([svc], vip, svc.port, "TCP")
    assert {b.ip for b in hit.candidates} == chosen and not hit.assumed


def test_without_count_or_states_the_assumption_is_said():
    (svc,) = _services("quarantined-maps1", drop=("cilium-bpf-lb-list-frontends.txt",
                                                  "cilium-db-backends.txt"))
    hit = service_lookup([svc], "10.96.50.104", 80, "TCP", version=None)
    assert {b.ip for b in hit.candidates} == {"10.244.1.1", "10.244.1.2"}
    assert "cilium-bpf-lb-list-frontends.txt" in hit.assumed and "never are" in hit.assumed


def test_a_trace_never_takes_a_slot_after_the_count(tmp_path):
    """On the cilium-vxlan-policy example: web-0 in slot 1 terminating, moved after the count
    as the agent does (graceful-termination.txtar lbmaps-terminating1: COUNT=1 QCOUNT=1, the
    active backend first): one path, to web-1, with every new connection."""
    b = copy_example("cilium-vxlan-policy", tmp_path)
    for n in ("worker1", "worker2"):
        lb = b / f"nodes/{n}/cilium-bpf-lb-list.txt"
        text = lb.read_text()
        text = (text.replace("10.96.120.15:80 (1)        10.0.2.45:8080 (7) (1)",
                             "10.96.120.15:80 (1)        10.0.1.52:8080 (7) (1)", 1)
                .replace("10.96.120.15:80 (2)        10.0.1.52:8080 (7) (2)",
                         "10.96.120.15:80 (2)        10.0.2.45:8080 (7) (2)", 1))
        lb.write_text(text)
        fr = b / f"nodes/{n}/cilium-bpf-lb-list-frontends.txt"
        fr.write_text(fr.read_text().replace("0 2[0] (7) [0x0 0x0]", "0 1[1] (7) [0x0 0x0]"))
    code, doc = trace(b, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 0
    assert [(p["endpoint"], p["weight"]) for p in doc["paths"]] == [("shop/web-1", 1.0)]
    hops = path_to(doc, "shop/web-1")["legs"][0]["hops"]
    (lookup,) = [h for h in hops if h.get("map") == "cilium_lb4_services_v2"]
    assert any("count 1, qcount 1" in n and "cilium-bpf-lb-list-frontends.txt" in n
               for n in lookup["notes"])
    assert any("slot 2 10.0.2.45:8080" in n for n in lookup["notes"])
