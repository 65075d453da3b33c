"""Cilium ENI mode on AWS (the examples/cilium-eni bundle, built from a published walk of this
path): `traceflow pod-to-pod` must follow the walk: the pod's route and static ARP, the lxc,
from-container handing the packet to the kernel, the `ip rule` picking the ENI's table and the
VPC gateway, node2's `to <pod> lookup main` rule, the lxc egress program with the ingress
policy, delivery. Expectations come from the walk and Cilium's source, not from traceflow."""

from pathlib import Path

import pytest

from cilium_walks import copy_example, trace

EXAMPLE = Path(__file__).resolve().parent.parent / "traceflow" / "examples" / "cilium-eni"


@pytest.fixture(scope="module")
def doc():
    code, doc = trace(EXAMPLE, "pod-to-pod", "default/pod1", "default/pod2")
    assert code == 0
    return doc


@pytest.fixture
def bundle(tmp_path):
    return copy_example("cilium-eni", tmp_path)


def hops_of(doc, direction="request"):
    (p,) = doc["paths"]
    (l,) = [l for l in p["legs"] if l["direction"] == direction]
    return l["hops"]


def test_the_walk_in_order(doc):
    hops = hops_of(doc)
    want = [
        ("node1", "pod", lambda h: h["rule"].strip() == "default via 10.5.2.191 dev eth0"),
        ("node1", "neigh", lambda h: h["rule"].startswith("10.5.2.191 dev eth0 lladdr 86:05:d4:99:a9:f5")
         and "lxc050ba70e11a8" in h["effect"]),
        ("node1", "bpf", lambda h: h["program"] == "from-container" and h["map"] == "cilium_policy_01419"),
        ("node1", "bpf", lambda h: h["program"] == "from-container" and "endpoint routes" in h["effect"]
         and "TC_ACT_OK" in h["effect"]),
        ("node1", "route", lambda h: h["table"] == "11" and h["rule"].strip() == "default via 10.5.2.1 dev eth1 table 11"
         and any(n.startswith("rule 111 `from 10.5.2.11 lookup 11`") for n in h["notes"])),
        ("node1", "neigh", lambda h: h["table"] == "eth1" and "10.5.2.1" in h["effect"]),
        ("node2", "underlay", lambda h: any("VPC" in n and "assumed" in n for n in h["notes"])),
        ("node2", "route", lambda h: h["rule"].strip() == "10.5.2.22 dev lxcd86fc95bf974 scope link"
         and any(n.startswith("rule 20 `from all to 10.5.2.22 lookup main`") for n in h["notes"])),
        ("node2", "neigh", lambda h: h["table"] == "lxcd86fc95bf974"),
        ("node2", "bpf", lambda h: h["program"] == "to-container" and h["map"] == "cilium_policy_03152"
         and "ingress policy of endpoint 3152" in h["effect"] and "allowed" in h["effect"]),
        ("node2", "pod", lambda h: "delivered to default/pod2" in h["effect"]),
    ]
    i = 0
    for node, component, pred in want:
        while i < len(hops) and not (hops[i]["node"] == node and hops[i]["component"] == component
                                     and pred(hops[i])):
            i += 1
        assert i < len(hops), f"missing, in order: {node} {component}"
    # the whole leg is on these two nodes, and no BPF program runs on eth0/eth1
    assert not any(h.get("program") in ("to-netdev", "from-netdev") for h in hops)


def test_the_ingress_policy_runs_on_the_lxc_egress_hook(doc):
    hops = hops_of(doc)
    (first,) = [h for h in hops if h.get("program") == "to-container" and h["map"] is None]
    assert any("bpf_lxc.o:[to-container]" in n and "tc.txt" in n for n in first["notes"])
    assert any("to-container on lxcd86fc95bf974 egress" in n for n in first["notes"])


def test_the_reply_takes_pod2_s_own_eni_table(doc):
    hops = hops_of(doc, "reply")
    (route,) = [h for h in hops if h["component"] == "route" and h["node"] == "node2"]
    assert any(n.startswith("rule 111 `from 10.5.2.22 lookup 11`") for n in route["notes"])
    ct = [h for h in hops if h.get("map") == "cilium_ct4_global"]
    assert [h["node"] for h in ct] == ["node2", "node1"]
    assert hops[-1]["packet"]["nw_src"] == "10.5.2.22"


def test_without_the_eni_rule_the_pod_leaves_by_the_main_table(bundle):
    path = bundle / "nodes/node1/ip-rule.txt"
    path.write_text(path.read_text().replace("111:\tfrom 10.5.2.11 lookup 11\n", ""))
    code, doc = trace(bundle, "pod-to-pod", "default/pod1", "default/pod2")
    (route,) = [h for h in hops_of(doc) if h["component"] == "route" and h["node"] == "node1"]
    assert route["table"] == "main" and route["rule"].startswith("10.5.2.0/24 dev eth0")


def test_egress_deny_entry_drops_at_from_container(bundle):
    path = bundle / "nodes/node1/cilium-bpf-policy-get.txt"
    path.write_text(path.read_text().replace(
        "Allow    Egress      0          ANY          NONE         0       0",
        "Deny     Egress      30551      ANY          NONE         0       0\n"
        "Allow    Egress      0          ANY          NONE         0       0"))
    code, doc = trace(bundle, "pod-to-pod", "default/pod1", "default/pod2")
    assert code == 1
    (p,) = doc["paths"]
    assert p["drop"]["node"] == "node1" and p["drop"]["table"] == "from-container"
    assert p["drop"]["reason"].startswith("DROP_POLICY_DENY: egress policy of endpoint 1419")
    assert "identity 30551 (k8s:app=pod2" in p["drop"]["reason"]
    assert p["drop"]["rule"] == "Deny     Egress      30551      ANY          NONE         0       0"
