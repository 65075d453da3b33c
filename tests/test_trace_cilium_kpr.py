"""Cilium 1.8, kube-proxy replacement, native routing (the examples/cilium-kpr-native bundle,
built from a published walk of this path): `traceflow pod-to-svc` must meet the walk's eight
steps in order, and edits of the bundle must change the verdict truthfully.

No Cilium agent or BPF program can run here: the expectations come from the walk and from
Cilium's source (bpf_lxc.c, bpf_host.c, lib/lb.h, lib/policy.h), not from traceflow."""

from pathlib import Path

import pytest

from cilium_walks import copy_example, path_to, run, trace

EXAMPLE = Path(__file__).resolve().parent.parent / "traceflow" / "examples" / "cilium-kpr-native"


@pytest.fixture(scope="module")
def doc():
    code, doc = trace(EXAMPLE, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 0
    return doc


@pytest.fixture
def bundle(tmp_path):
    return copy_example("cilium-kpr-native", tmp_path)


def leg(path, direction):
    (l,) = [l for l in path["legs"] if l["direction"] == direction]
    return l


def test_every_backend_slot_is_a_branch_with_its_weight(doc):
    assert doc["verdict"] == "delivered"
    assert sorted(p["endpoint"] for p in doc["paths"]) == ["default/pod3", "default/pod4"]
    assert [p["weight"] for p in doc["paths"]] == [0.5, 0.5]
    for p in doc["paths"]:
        assert p["choices"] == [f"node1 from-container: backend "
                                f"{'10.1.2.14' if p['endpoint'] == 'default/pod4' else '10.1.2.13'}:80 "
                                "(50% of new connections, random)"]


def _step(hops, start, pred, what):
    for i in range(start, len(hops)):
        if pred(hops[i]):
            return i
    raise AssertionError(f"step not found after hop {start}: {what}\n" +
                         "\n".join(f"{h['node']} {h['component']} {h.get('program')} {h['effect']}"
                                   for h in hops))


def test_the_eight_steps_of_the_walk_in_order(doc):
    req = leg(path_to(doc, "default/pod4"), "request")
    hops = req["hops"]
    # 1. the pod's route to its gateway and the ARP entry naming the lxc MAC
    i = _step(hops, 0, lambda h: h["component"] == "pod" and h["rule"].startswith("default via 10.1.1.1"),
              "pod route")
    assert hops[i]["source"]["file"] == "pods/default/pod1/ip-route.txt"
    i = _step(hops, i, lambda h: h["component"] == "neigh" and "3e:74:f2:60:ab:9b" in h["effect"], "pod ARP")
    assert "lxc00aa" in hops[i]["effect"] and hops[i]["rule"].startswith("10.1.1.1 dev eth0 lladdr 3e:74:f2:60:ab:9b")
    # 2. from-container on lxc00aa: service lookup, the backend, DNAT, egress policy
    i = _step(hops, i, lambda h: h.get("program") == "from-container" and h["map"] == "cilium_lb4_services_v2",
              "service lookup")
    assert hops[i]["entry"] == "10.224.1.1:80       0.0.0.0:0 (7) [ClusterIP]"
    assert hops[i]["source"] == {"file": "nodes/node1/cilium-bpf-lb-list.txt", "line": 4}
    assert "socket LB is off" in hops[i]["effect"]
    assert any("bpf_lxc.o:[from-container]" in n and "tc.txt:3" in n for n in hops[i]["notes"])
    i = _step(hops, i, lambda h: h.get("map") == "cilium_lb4_backends", "backend")
    assert hops[i]["changed"]["nw_dst"] == ["10.224.1.1", "10.1.2.14"]
    assert hops[i]["source"]["line"] == 5
    i = _step(hops, i, lambda h: h.get("map") == "cilium_policy_02215", "egress policy")
    assert "egress policy of endpoint 2215" in hops[i]["effect"] and "allowed" in hops[i]["effect"]
    assert hops[i]["entry"] == "Egress      0          ANY          NONE         0       0"
    assert any("L3+L4 -> L4-only -> L3-only -> allow-all" in n for n in hops[i]["notes"])
    i = _step(hops, i, lambda h: h.get("program") == "from-container" and "TC_ACT_OK" in h["effect"],
              "pass to the kernel (legacy host routing)")
    # 3. the kernel route on node1 (default via bond0) and its neighbour
    i = _step(hops, i, lambda h: h["component"] == "route" and h["node"] == "node1", "kernel route")
    assert hops[i]["rule"].startswith("default via 10.255.255.1 dev bond0")
    i = _step(hops, i, lambda h: h["component"] == "neigh" and h["node"] == "node1", "neighbour")
    assert "00:00:5e:00:01:0c" in hops[i]["effect"]
    # 4. to-netdev on bond0
    i = _step(hops, i, lambda h: h.get("program") == "to-netdev" and h["node"] == "node1", "to-netdev")
    assert any("bpf_netdev_bond0.o:[to-netdev]" in n for n in hops[i]["notes"])
    # 5. the underlay to the node owning the pod CIDR, stated as an assumption
    i = _step(hops, i, lambda h: h["component"] == "underlay", "underlay")
    assert hops[i]["node"] == "node2"
    assert any("assumed" in n and "10.1.2.0/24" in n for n in hops[i]["notes"])
    # 6. from-netdev on node2 resolves the source identity from the ipcache
    i = _step(hops, i, lambda h: h.get("program") == "from-netdev" and h["map"] == "cilium_ipcache",
              "from-netdev identity")
    assert hops[i]["node"] == "node2" and "identity 21324" in hops[i]["effect"]
    assert hops[i]["source"] == {"file": "nodes/node2/cilium-bpf-ipcache-list.txt", "line": 2}
    assert hops[i]["entry"] == "10.1.1.11/32        21324 0 10.255.255.11"
    # 7. the tail call into the endpoint's policy program with the ingress verdict
    i = _step(hops, i, lambda h: h.get("program") == "policy" and h["map"] == "cilium_policy_01081",
              "ingress policy")
    assert "ingress policy of endpoint 1081" in hops[i]["effect"] and "allowed" in hops[i]["effect"]
    assert any("allow-all lookup found the entry" in n for n in hops[i]["notes"])
    assert any("tail call from from-host" in n for n in hops[i - 1]["notes"])
    # 8. delivery to the backend pod
    i = _step(hops, i, lambda h: h["component"] == "pod" and "delivered" in h["effect"], "delivery")
    assert "default/pod4" in hops[i]["effect"] and "lxc00dd" in hops[i]["effect"]
    assert i == len(hops) - 1


def test_the_reply_is_reverse_nat_ed_back_to_the_service_address(doc):
    rep = leg(path_to(doc, "default/pod4"), "reply")
    hops = rep["hops"]
    assert hops[0]["node"] == "node2" and hops[0]["component"] == "pod"
    ct = [h for h in hops if h.get("map") == "cilium_ct4_global"]
    assert "CT_REPLY" in ct[0]["effect"] and ct[0]["node"] == "node2"
    rev = [h for h in ct if "lb4_rev_nat" in h["effect"]]
    assert len(rev) == 1 and rev[0]["node"] == "node1"
    assert rev[0]["changed"]["nw_src"] == ["10.1.2.14", "10.224.1.1"]
    assert hops[-1]["component"] == "pod" and "default/pod1" in hops[-1]["effect"]
    assert hops[-1]["packet"]["nw_src"] == "10.224.1.1" and hops[-1]["packet"]["tp_src"] == 80
    # replies skip the egress policy
    assert not any(h.get("map", "") and h["map"].startswith("cilium_policy") for h in hops)


def test_bpf_hops_carry_program_map_and_entry_keys(doc):
    for p in doc["paths"]:
        for l in p["legs"]:
            for h in l["hops"]:
                if h["component"] == "bpf":
                    assert {"program", "map", "entry"} <= set(h)
                else:
                    assert "program" not in h


def test_legacy_host_routing_crosses_the_kernel_s_netfilter(doc):
    hops = leg(path_to(doc, "default/pod4"), "request")["hops"]
    fwd = [h for h in hops if h["component"] == "iptables" and h["chain"] == "CILIUM_FORWARD"]
    assert fwd and fwd[0]["node"] == "node1" and "-i lxc+" in fwd[0]["rule"]
    assert fwd[0]["source"]["file"] == "nodes/node1/iptables-save.txt"
    # the masquerade rule does not apply inside native-routing-cidr
    assert not any("MASQUERADE" in (h["effect"] or "") for h in hops)
    # node2's from-netdev passes the packet to the kernel (legacy host routing): node2's
    # FORWARD chain is crossed on the way to cilium_host (issue 22 item 5)
    assert any(h["component"] == "iptables" and h["node"] == "node2"
               and h["chain"] == "CILIUM_FORWARD" for h in hops)
    assert doc["warnings"] == []


def test_the_kernel_stack_without_netfilter_rules_is_said(bundle):
    (bundle / "nodes/node1/iptables-save.txt").unlink()
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 0
    assert any(w.startswith("node1: no iptables-save.txt") for w in doc["warnings"])


# ---- mutations ---------------------------------------------------------------------------------

def _edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


def test_ingress_policy_entry_removed_drops_at_the_policy_program(bundle):
    # the backend's map now allows only identity 9999 (an L3-only entry): the client's identity
    # 21324 finds no L3+L4, L4-only, L3-only or allow-all entry -> DROP_POLICY
    _edit(bundle / "nodes/node2/cilium-bpf-policy-get.txt",
          "cilium_policy_01081:\n\nDIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   BYTES   PACKETS\n"
          "Ingress     0          ANY          NONE         0       0",
          "cilium_policy_01081:\n\nDIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   BYTES   PACKETS\n"
          "Ingress     9999       ANY          NONE         0       0")
    _edit(bundle / "k8s/networkpolicies.yaml", "items: []", """items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: backend-from-monitoring, namespace: default}
  spec:
    podSelector: {matchLabels: {app: backend}}
    policyTypes: [Ingress]
    ingress:
    - from: [{podSelector: {matchLabels: {app: monitoring}}}]
""")
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 1 and doc["verdict"] == "partial"
    assert path_to(doc, "default/pod3")["verdict"] == "delivered"
    p = path_to(doc, "default/pod4")
    assert p["verdict"] == "dropped"
    drop = p["drop"]
    assert drop["node"] == "node2" and drop["component"] == "bpf" and drop["table"] == "policy"
    assert drop["reason"].startswith("DROP_POLICY: ingress policy of endpoint 1081")
    assert "identity 21324 (k8s:app=client" in drop["reason"]
    assert "default/backend-from-monitoring" in drop["reason"]
    last = leg(p, "request")["hops"][-1]
    assert last["program"] == "policy" and last["map"] == "cilium_policy_01081"
    assert last["entry"] is None     # no entry matched
    # the endpoint list still says enforcement is Disabled: the disagreement is said
    assert "ingress enforcement is Disabled for endpoint 1081" in drop["reason"]


def test_l3_l4_entry_for_the_client_allows_before_the_wildcard(bundle):
    _edit(bundle / "nodes/node2/cilium-bpf-policy-get.txt",
          "cilium_policy_01081:\n\nDIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   BYTES   PACKETS\n"
          "Ingress     0          ANY          NONE         0       0",
          "cilium_policy_01081:\n\nDIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   BYTES   PACKETS\n"
          "Ingress     21324      80/TCP       NONE         0       0")
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 0
    hops = leg(path_to(doc, "default/pod4"), "request")["hops"]
    (pol,) = [h for h in hops if h.get("map") == "cilium_policy_01081"]
    assert pol["entry"] == "Ingress     21324      80/TCP       NONE         0       0"
    assert any("L3+L4 lookup found the entry" in n for n in pol["notes"])


def test_service_without_backends_is_dropped_at_from_container(bundle):
    for node in ("node1", "node2"):
        _edit(bundle / f"nodes/{node}/cilium-bpf-lb-list.txt",
              "10.224.1.1:80       0.0.0.0:0 (7) [ClusterIP]\n                    10.1.2.14:80 (7)\n"
              "                    10.1.2.13:80 (7)\n",
              "10.224.1.1:80       0.0.0.0:0 (7) [ClusterIP]\n")
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 1 and doc["verdict"] == "dropped"
    (p,) = doc["paths"]
    assert p["drop"]["node"] == "node1" and p["drop"]["table"] == "from-container"
    assert p["drop"]["reason"].startswith("DROP_NO_SERVICE: service 10.224.1.1:80 has no backends")
    assert p["drop"]["rule"] == "10.224.1.1:80       0.0.0.0:0 (7) [ClusterIP]"
    last = leg(p, "request")["hops"][-1]
    assert last["program"] == "from-container" and last["source"]["line"] == 4


def test_socket_lb_on_first_packet_already_carries_the_backend(bundle):
    for node in ("node1", "node2"):
        _edit(bundle / f"nodes/{node}/cilium-status.txt", "HostPort, ExternalIPs, SessionAffinity]",
              "HostPort, ExternalIPs, HostReachableServices (TCP, UDP), SessionAffinity]")
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 0 and sorted(p["endpoint"] for p in doc["paths"]) == ["default/pod3", "default/pod4"]
    hops = leg(path_to(doc, "default/pod4"), "request")["hops"]
    sock = [h for h in hops if h.get("program") == "cil_sock4_connect"]
    assert sock and "HostReachableServices" in sock[0]["effect"] and "connect()" in sock[0]["effect"]
    (xlate,) = [h for h in sock if h["map"] == "cilium_lb4_backends"]
    assert xlate["changed"]["nw_dst"] == ["10.224.1.1", "10.1.2.14"]
    # from-container sees the backend address and does no service lookup
    fc = [h for h in hops if h.get("program") == "from-container"]
    assert fc[0]["packet"]["nw_dst"] == "10.1.2.14"
    assert not any(h["map"] == "cilium_lb4_services_v2" for h in fc)
    assert "translated at connect()" in fc[0]["effect"]
    # the reply still comes back from the service address (connect() translated it)
    rep = leg(path_to(doc, "default/pod4"), "reply")["hops"]
    assert rep[-1]["packet"]["nw_src"] == "10.224.1.1"


def test_pod_to_pod_goes_without_the_service_lookup(bundle):
    code, doc = trace(bundle, "pod-to-pod", "default/pod1", "default/pod4")
    assert code == 0
    (p,) = doc["paths"]
    hops = leg(p, "request")["hops"]
    (lookup,) = [h for h in hops if h.get("map") == "cilium_lb4_services_v2"]
    assert "no service entry" in lookup["effect"]
    assert leg(p, "reply")["hops"][-1]["packet"]["nw_src"] == "10.1.2.14"


def test_missing_ipcache_file_names_it(bundle):
    (bundle / "nodes/node2/cilium-bpf-ipcache-list.txt").unlink()
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 1 and doc["verdict"] == "unknown"
    for p in doc["paths"]:
        assert p["drop"]["node"] == "node2"
        assert "needs nodes/node2/cilium-bpf-ipcache-list.txt" in p["drop"]["reason"]


def test_missing_tc_listing_is_unknown_not_a_guess(bundle):
    (bundle / "nodes/node1/tc.txt").unlink()
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 1 and doc["verdict"] == "unknown"
    (p,) = doc["paths"]
    assert "tc.txt and bpftool-net.txt are absent" in p["drop"]["reason"]


def test_garbled_policy_line_makes_only_that_endpoints_verdict_unknown(bundle):
    """Issue 22 item 2: one unreadable line of `bpf policy get` makes only the decisions that
    need it unknown (the old expectation, exit 2 for every trace of the node, was wrong)."""
    path = bundle / "nodes/node2/cilium-bpf-policy-get.txt"
    text = path.read_text()
    # the first section is endpoint 1081 (pod4); endpoint 3405 (pod3) is untouched
    assert text.index("cilium_policy_01081") < text.index("cilium_policy_03405")
    path.write_text(text.replace("Ingress     0          ANY          NONE         0       0",
                                 "Ingress     zero       ANY", 1))
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 1 and doc["verdict"] == "partial"
    pod4, pod3 = path_to(doc, "default/pod4"), path_to(doc, "default/pod3")
    assert pod3["verdict"] == "delivered"
    assert pod4["verdict"] == "unknown" and pod4["disposition"] == "unknown"
    reason = pod4["drop"]["reason"]
    assert reason.startswith("ingress policy of endpoint 1081 (cilium_policy_01081)")
    assert "nodes/node2/cilium-bpf-policy-get.txt:" in reason and "cells under" in reason


def test_garbled_lb_list_is_exit_2(bundle):
    path = bundle / "nodes/node1/cilium-bpf-lb-list.txt"
    path.write_text(path.read_text() + "this is not a service line\n")
    result = run(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert result.exit_code == 2
    assert "nodes/node1/cilium-bpf-lb-list.txt" in result.output and "Traceback" not in result.output


def test_unknown_cni_is_refused(bundle):
    _edit(bundle / "manifest.yaml", "cni: cilium", "cni: weave-net")
    result = run(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert result.exit_code == 2 and "weave-net" in result.output


def test_socket_lb_not_stated_is_an_assumption_said_aloud(bundle):
    for node in ("node1", "node2"):
        (bundle / f"nodes/{node}/cilium-status.txt").unlink()
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 0
    hops = leg(path_to(doc, "default/pod4"), "request")["hops"]
    (lookup,) = [h for h in hops if h.get("map") == "cilium_lb4_services_v2"]
    assert "socket LB is not stated in the bundle: per-packet assumed" in lookup["effect"]
    assert any("socket LB is on: per-packet" in w for w in doc["warnings"])


def test_routing_mode_not_stated_is_unknown_not_a_guess(bundle):
    for node in ("node1", "node2"):
        (bundle / f"nodes/{node}/cilium-status.txt").unlink()
    (bundle / "k8s/cilium-config.yaml").unlink()
    code, doc = trace(bundle, "pod-to-svc", "default/pod1", "default/svc1")
    assert code == 1 and doc["verdict"] == "unknown"
    for p in doc["paths"]:
        assert p["drop"]["table"] == "from-container"
        assert "routing mode (tunnel or native) is not stated" in p["drop"]["reason"]
