"""Cilium with kube-proxy replacement for traffic from and to outside the cluster (issue 19),
on the examples/cilium-vxlan-policy bundle (1.16.8: VXLAN, BPF host routing, BPF masquerade with
ip-masq-agent, bpf-lb-mode snat) and edits of it (native routing with DSR, hybrid, egress
gateway policies, no-backend response).

No Cilium program can run here: each step is asserted from the trace's JSON and follows the
Cilium source line named beside it (Cilium 1.17, the v1.17 branch point; the functions are the
same in 1.16): bpf/bpf_host.c (cil_from_netdev, handle_ipv4_cont, cil_to_netdev),
bpf/lib/nodeport.h (nodeport_lb4 2685, nodeport_svc_lb4 2512, tail_nodeport_nat_egress_ipv4
2378, tail_nodeport_ipv4_dsr 1946, nodeport_dsr_ingress_ipv4 2003,
tail_nodeport_nat_ingress_ipv4 2288, nodeport_rev_dnat_ingress_ipv4 2100), bpf/lib/nat.h
(snat_v4_needs_masquerade 555, __snat_try_keep_port 64), bpf/lib/egress_gateway.h, bpf/bpf_lxc.c
(the NodePort reply of a local backend, 1081)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cilium_walks import copy_example, path_to, trace

EXAMPLE = Path(__file__).resolve().parent.parent / "traceflow" / "examples" / "cilium-vxlan-policy"
CLIENT = "203.0.113.7"


def hops(path, direction="request"):
    return [h for l in path["legs"] if l["direction"] == direction for h in l["hops"]]


def one(hs, pred, what=""):
    got = [h for h in hs if pred(h)]
    assert len(got) == 1, (what, [h["effect"][:90] for h in hs])
    return got[0]


@pytest.fixture(scope="module")
def nodeport():
    code, doc = trace(EXAMPLE, "trace", CLIENT, "192.168.1.11:30080")
    assert code == 0
    return doc


def test_nodeport_cluster_policy_one_branch_per_backend(nodeport):
    """nodeport_lb4 on cil_from_netdev (nodeport.h 2685) finds the routable NodePort entry
    of the node's address (nodeport.txtar: one per node address, the 0.0.0.0 surrogate is not
    routable) and lb4_local picks a slot: each backend half of new connections."""
    assert nodeport["verdict"] == "delivered"
    assert sorted((p["endpoint"], p["weight"]) for p in nodeport["paths"]) == [
        ("shop/web-0", 0.5), ("shop/web-1", 0.5)]
    for p in nodeport["paths"]:
        assert p["disposition"] == "delivered-pod"
        svc = one(hops(p), lambda h: h.get("map") == "cilium_lb4_services_v2", "lookup")
        assert svc["program"] == "from-netdev" and svc["node"] == "worker1"
        assert svc["entry"].startswith("192.168.1.11:30080 (0)") and svc["entry"].endswith("[NodePort]")
        assert "nodeport_svc_lb4" in svc["effect"] and "external scope" in svc["effect"]


def test_local_backend_keeps_the_client_address_and_answers_through_revnat(nodeport):
    p = path_to(nodeport, "shop/web-1")
    req = hops(p)
    xlate = one(req, lambda h: h.get("map") == "cilium_lb4_backends", "DNAT")
    assert xlate["changed"]["nw_dst"] == ["192.168.1.11", "10.0.1.52"]
    assert "nw_src" not in xlate["changed"]                        # no SNAT: local backend
    local = one(req, lambda h: "is local (__lookup_ip4_endpoint)" in h["effect"])
    assert "node_port" in local["effect"]
    # handle_ipv4_cont -> ipv4_local_delivery (bpf_host.c line 801): the world identity meets
    # web-1's policy (the CiliumNetworkPolicy web-from-world's entry)
    pol = one(req, lambda h: h.get("map") == "cilium_policy_01187")
    assert "identity 2 (reserved:world)" in pol["effect"] and "allowed" in pol["effect"]
    assert pol["entry"].startswith("Allow    Ingress     2          8080/TCP")
    # the reply: ct_state->node_port -> CILIUM_CALL_IPV4_NODEPORT_REVNAT (bpf_lxc.c 1081):
    # lb4_rev_nat and fib_redirect straight to the client, no SNAT in to-netdev after it
    rep = hops(p, "reply")
    rev = one(rep, lambda h: "NODEPORT_REVNAT" in h["effect"])
    assert rev["program"] == "from-container"
    assert rev["changed"]["nw_src"] == ["10.0.1.52", "192.168.1.11"]
    assert rev["changed"]["tp_src"] == [8080, 30080]
    assert any("ctx_snat_done" in h["effect"] for h in rep if h.get("program") == "to-netdev")
    assert rep[-1]["detail"] == "exit" and rep[-1]["packet"]["nw_src"] == "192.168.1.11"
    assert p["legs"][-1]["disposition"] == "left-cluster"


def test_remote_backend_in_tunnel_mode_is_snated_to_cilium_host_with_the_world_identity(nodeport):
    """tail_nodeport_nat_egress_ipv4 (nodeport.h 2378): in tunnel mode the SNAT address is
    IPV4_GATEWAY (cilium_host's) and the tunnel key carries WORLD_ID (line 2470: "a request
    from outside must not pass as the cluster's"); the port is kept (__snat_try_keep_port,
    nat.h 64: 54321 is in 32768-65535)."""
    p = path_to(nodeport, "shop/web-0")
    req = hops(p)
    snat = one(req, lambda h: "tail_nodeport_nat_egress_ipv4" in h["effect"])
    assert snat["changed"]["nw_src"] == [CLIENT, "10.0.1.94"] and "tp_src" not in snat["changed"]
    assert "bpf-lb-mode snat" in snat["effect"] and "cilium-status.txt:31" in snat["effect"]
    encap = one(req, lambda h: "nodeport_add_tunnel_encap" in h["effect"])
    assert encap["packet"]["tun_dst"] == "192.168.1.12"
    decap = one(req, lambda h: h.get("program") == "from-overlay")
    assert decap["node"] == "worker2" and "identity 2 (reserved:world)" in decap["effect"]
    # the reply comes back through the tunnel: rev SNAT, rev DNAT, out to the client
    rep = hops(p, "reply")
    rsnat = one(rep, lambda h: "snat_v4_rev_nat" in h["effect"])
    assert rsnat["node"] == "worker1" and rsnat["program"] == "from-overlay"
    assert rsnat["changed"]["nw_dst"] == ["10.0.1.94", CLIENT]
    rdnat = one(rep, lambda h: "nodeport_rev_dnat_ingress_ipv4" in h["effect"])
    assert rdnat["changed"]["nw_src"] == ["10.0.2.45", "192.168.1.11"]
    exit_ = rep[-1]
    assert exit_["node"] == "worker1" and exit_["detail"] == "exit"
    assert (exit_["packet"]["nw_src"], exit_["packet"]["tp_src"]) == ("192.168.1.11", 30080)
    assert nodeport["warnings"] == []


def test_local_policy_node_without_endpoint_rejects_and_node_with_one_delivers():
    """externalTrafficPolicy Local: the external-scope entry holds only the node's own
    backends (nodeport_lb4 looks up the external scope, lb4_lookup_service(&key, false)); on
    worker1 count 0 -> DROP_NO_SERVICE, which 1.15+ answers by default with ICMP port
    unreachable (nodeport.h line 2575: tail_no_service_ipv4)."""
    code, doc = trace(EXAMPLE, "trace", CLIENT, "192.168.1.11:30081")
    (p,) = doc["paths"]
    assert code == 1 and p["verdict"] == "dropped" and p["disposition"] == "rejected"
    assert p["drop"]["table"] == "from-netdev" and p["drop"]["node"] == "worker1"
    assert "ICMP port unreachable" in p["drop"]["reason"]
    assert "default reject (Cilium 1.15+" in p["drop"]["reason"]
    svc = one(hops(p), lambda h: h.get("map") == "cilium_lb4_services_v2")
    assert "[NodePort, Local, two-scopes]" in svc["entry"] and "count 0" in svc["effect"]
    code, doc = trace(EXAMPLE, "trace", CLIENT, "192.168.1.12:30081")
    (p,) = doc["paths"]
    assert code == 0 and p["endpoint"] == "shop/api-0" and p["disposition"] == "delivered-pod"
    delivered = hops(p)[-1]
    assert delivered["packet"]["nw_src"] == CLIENT        # Local keeps the client's address


def test_no_backend_response_drop(tmp_path):
    b = copy_example("cilium-vxlan-policy", tmp_path)
    cfg = b / "k8s/cilium-config.yaml"
    cfg.write_text(cfg.read_text().replace("  routing-mode: tunnel\n",
                                           "  routing-mode: tunnel\n  service-no-backend-response: drop\n"))
    code, doc = trace(b, "trace", CLIENT, "192.168.1.11:30081")
    (p,) = doc["paths"]
    assert p["disposition"] == "no-backend" and p["drop"]["reason"].startswith("DROP_NO_SERVICE")
    assert "service-no-backend-response: drop" in p["drop"]["reason"]


def test_loadbalancer_ip_enters_each_node_or_the_one_named():
    code, doc = trace(EXAMPLE, "trace", CLIENT, "172.18.255.20:80")
    assert code == 0 and len(doc["paths"]) == 4
    assert sorted(round(p["weight"], 2) for p in doc["paths"]) == [0.25] * 4
    code, doc = trace(EXAMPLE, "trace", CLIENT, "172.18.255.20:80", "--via", "worker2")
    assert {h["node"] for p in doc["paths"] for h in hops(p)
            if h.get("map") == "cilium_lb4_services_v2"} == {"worker2"}
    for p in doc["paths"]:
        svc = one(hops(p), lambda h: h.get("map") == "cilium_lb4_services_v2")
        assert svc["entry"].startswith("172.18.255.20:80 (0)") and "[LoadBalancer]" in svc["entry"]


def test_a_cluster_ip_from_outside_is_dropped_as_not_routable():
    """nodeport_svc_lb4 (nodeport.h line 2535): an entry without the routable flag (ClusterIP,
    the NodePort surrogate) -> DROP_IS_CLUSTER_IP."""
    code, doc = trace(EXAMPLE, "trace", CLIENT, "10.96.120.15:80", "--via", "worker1")
    (p,) = doc["paths"]
    assert p["disposition"] == "dropped-rule"
    assert p["drop"]["reason"].startswith("DROP_IS_CLUSTER_IP") and "non-routable" in p["drop"]["rule"]


def _native(bundle: Path, mode: str, dispatch: str = "IP Option/Extension"):
    """The example switched to native routing (BGP-style routes to the peer's pod CIDR, no
    tunnel endpoints) and the NodePort mode set in `cilium status`."""
    for n, peer_cidr, peer_ip in (("worker1", "10.0.2.0/24", "192.168.1.12"),
                                  ("worker2", "10.0.1.0/24", "192.168.1.11")):
        st = bundle / f"nodes/{n}/cilium-status.txt"
        text = st.read_text().replace("Network: Tunnel [vxlan]   Host: BPF", "Network: Native   Host: BPF")
        text = text.replace("  Mode:                   SNAT",
                            f"  Mode:                   {mode}\n    DSR Dispatch Mode:    {dispatch}")
        st.write_text(text)
        rt = bundle / f"nodes/{n}/ip-route.txt"
        kept = [l for l in rt.read_text().splitlines(True) if not l.startswith(peer_cidr)]
        rt.write_text("".join(kept) + f"{peer_cidr} via {peer_ip} dev eth0 proto bird \n")
        ic = bundle / f"nodes/{n}/cilium-bpf-ipcache-list.txt"
        ic.write_text(re.sub(r"tunnelendpoint=192\.168\.1\.1[12], flags=hastunnel",
                             "tunnelendpoint=0.0.0.0, flags=<none>", ic.read_text()))
    cfg = bundle / "k8s/cilium-config.yaml"
    cfg.write_text(cfg.read_text().replace("routing-mode: tunnel", "routing-mode: native")
                   .replace("  tunnel-protocol: vxlan\n", ""))


def test_dsr_keeps_the_client_address_and_the_backend_node_answers(tmp_path):
    """bpf-lb-mode dsr: tail_nodeport_ipv4_dsr (nodeport.h 1946) keeps the client's address
    and adds the DSR option (dsr_set_opt4, 1522); the backend's node reads it
    (nodeport_extract_dsr_v4, 1743), records the mapping (snat_v4_create_dsr), and its
    to-netdev rewrites the reply's source to the service address (nodeport_rev_dnat_fwd_ipv4):
    the reply leaves by worker2, not by worker1."""
    b = copy_example("cilium-vxlan-policy", tmp_path)
    _native(b, "DSR")
    code, doc = trace(b, "trace", CLIENT, "192.168.1.11:30080")
    assert code == 0
    p = path_to(doc, "shop/web-0")
    req = hops(p)
    dsr = one(req, lambda h: "tail_nodeport_ipv4_dsr" in h["effect"])
    assert dsr["packet"]["nw_src"] == CLIENT and "192.168.1.11:30080" in dsr["effect"]
    assert not any("tail_nodeport_nat_egress_ipv4" in h["effect"] for h in req)
    ing = one(req, lambda h: "nodeport_dsr_ingress_ipv4" in h["effect"])
    assert ing["node"] == "worker2" and ing["program"] == "from-netdev"
    pol = one(req, lambda h: h.get("map") == "cilium_policy_02718")
    assert "identity 2 (reserved:world)" in pol["effect"]
    rep = hops(p, "reply")
    rev = one(rep, lambda h: "nodeport_rev_dnat_fwd_ipv4" in h["effect"])
    assert rev["node"] == "worker2" and rev["program"] == "to-netdev"
    assert rev["changed"]["nw_src"] == ["10.0.2.45", "192.168.1.11"]
    assert rep[-1]["node"] == "worker2" and rep[-1]["packet"]["tp_src"] == 30080
    assert any("leaves the cluster by worker2, not by worker1" in w for w in doc["warnings"])


def test_hybrid_is_dsr_for_tcp_and_snat_for_udp(tmp_path):
    """nodeport_uses_dsr (nodeport.h 53): hybrid mode takes DSR for TCP only. The 1.16 keys
    have no protocol, so UDP to the same NodePort finds the entry too."""
    b = copy_example("cilium-vxlan-policy", tmp_path)
    _native(b, "Hybrid")
    _, tcp = trace(b, "trace", CLIENT, "192.168.1.11:30080")
    assert any("tail_nodeport_ipv4_dsr" in h["effect"] for h in hops(path_to(tcp, "shop/web-0")))
    _, udp = trace(b, "trace", CLIENT, "192.168.1.11:30080", "--protocol", "udp", "--no-reply")
    web0 = [p for p in udp["paths"] if p["endpoint"] == "shop/web-0"]
    assert web0 and any("tail_nodeport_nat_egress_ipv4" in h["effect"] for h in hops(web0[0]))
    snat = one(hops(web0[0]), lambda h: "tail_nodeport_nat_egress_ipv4" in h["effect"])
    # native routing: the direct-routing device's address (IPV4_DIRECT_ROUTING)
    assert snat["changed"]["nw_src"] == [CLIENT, "192.168.1.11"]


def test_dsr_over_geneve_dispatch_is_unknown_not_a_guess(tmp_path):
    b = copy_example("cilium-vxlan-policy", tmp_path)
    _native(b, "DSR", "Geneve")
    code, doc = trace(b, "trace", CLIENT, "192.168.1.11:30080")
    p = path_to(doc, "shop/web-0")
    assert p["verdict"] == "unknown" and "dispatch geneve" in p["drop"]["reason"]
    assert path_to(doc, "shop/web-1")["verdict"] == "delivered"


# ---- pods to outside: BPF masquerade, ip-masq-agent, egress gateway ------------------------

def test_pod_to_outside_is_masqueraded_by_bpf_and_its_answer_comes_back():
    """snat_v4_needs_masquerade (nat.h 555): a local endpoint's packet to a world address
    outside the SNAT exclusion CIDR (10.0.0.0/16, `cilium status` Masquerading) and outside
    ip-masq-agent's prefixes is SNATed to the device's address in to-netdev; the answer is
    reverse-SNATed by tail_nodeport_nat_ingress_ipv4 in from-netdev."""
    code, doc = trace(EXAMPLE, "trace", "shop/frontend", "1.1.1.1:443")
    (p,) = doc["paths"]
    assert code == 0 and p["disposition"] == "left-cluster"
    req = hops(p)
    # tunnel mode: no tunnel endpoint for a world address -> "deliver via native device"
    # (bpf_lxc.c 1271), BPF host routing's fib_redirect_v4: never unknown (issue 22 item 6)
    nte = one(req, lambda h: "DROP_NO_TUNNEL_ENDPOINT" in h["effect"])
    assert not nte.get("unknown") and "deliver via the native device" in nte["effect"]
    masq = one(req, lambda h: "BPF masquerade to eth0's address 192.168.1.11" in h["effect"])
    assert masq["program"] == "to-netdev" and masq["changed"]["nw_src"] == ["10.0.1.21", "192.168.1.11"]
    assert "tp_src" not in masq["changed"]
    assert req[-1]["packet"]["nw_src"] == "192.168.1.11" and req[-1]["detail"] == "exit"
    rep = hops(p, "reply")
    rsnat = one(rep, lambda h: "snat_v4_rev_nat" in h["effect"])
    assert rsnat["node"] == "worker1" and rsnat["changed"]["nw_dst"] == ["192.168.1.11", "10.0.1.21"]
    assert p["legs"][-1]["disposition"] == "delivered-pod"


def test_ip_masq_agent_prefix_is_not_masqueraded():
    code, doc = trace(EXAMPLE, "trace", "shop/frontend", "172.18.5.5:443")
    (p,) = doc["paths"]
    skip = one(hops(p), lambda h: h.get("program") == "to-netdev")
    assert "not needed" in skip["effect"] and "ip-masq-agent prefix 172.16.0.0/12" in skip["effect"]
    assert skip["source"]["file"] == "nodes/worker1/cilium-bpf-ipmasq-list.txt"
    assert hops(p)[-1]["packet"]["nw_src"] == "10.0.1.21"


def _egress(bundle: Path, rows: str):
    for n in ("worker1", "worker2"):
        (bundle / f"nodes/{n}/cilium-bpf-egress-list.txt").write_text(
            "Source IP   Destination CIDR   Egress IP       Gateway IP\n" + rows)


def test_egress_gateway_sends_the_pod_through_the_gateway_node(tmp_path):
    """egress_gw_handle_packet in cil_to_netdev (egress_gateway.h 225): a policy match whose
    gateway is another node goes there through the tunnel; the gateway's from-overlay SNATs to
    the egress IP (bpf_overlay.c 432); the answer goes back through the tunnel
    (egress_gw_reply_needs_redirect_hook, nodeport.h 2141)."""
    b = copy_example("cilium-vxlan-policy", tmp_path)
    _egress(b, "10.0.1.21   0.0.0.0/0          192.168.1.240   192.168.1.12\n")
    code, doc = trace(b, "trace", "shop/frontend", "1.1.1.1:443")
    (p,) = doc["paths"]
    assert code == 0 and p["disposition"] == "left-cluster"
    req = hops(p)
    gw = one(req, lambda h: "egress_gw_handle_packet" in h["effect"])
    assert gw["node"] == "worker1" and gw["packet"]["tun_dst"] == "192.168.1.12"
    assert gw["source"] == {"file": "nodes/worker1/cilium-bpf-egress-list.txt", "line": 2}
    snat = one(req, lambda h: "egress_gw_snat_needed_hook" in h["effect"])
    assert snat["node"] == "worker2" and snat["changed"]["nw_src"] == ["10.0.1.21", "192.168.1.240"]
    assert req[-1]["node"] == "worker2" and req[-1]["packet"]["nw_src"] == "192.168.1.240"
    rep = hops(p, "reply")
    assert one(rep, lambda h: "egress_gw_reply_needs_redirect_hook" in h["effect"])["node"] == "worker2"
    assert rep[-1]["node"] == "worker1" and "shop/frontend" in rep[-1]["effect"]


def test_egress_gateway_without_a_gateway_node_drops(tmp_path):
    b = copy_example("cilium-vxlan-policy", tmp_path)
    _egress(b, "10.0.1.21   0.0.0.0/0          192.168.1.240   Not Found\n")
    _, doc = trace(b, "trace", "shop/frontend", "1.1.1.1:443")
    (p,) = doc["paths"]
    assert p["disposition"] == "dropped-rule"
    assert p["drop"]["reason"].startswith("DROP_NO_EGRESS_GATEWAY")


def test_egress_gateway_enabled_without_its_map_is_unknown_naming_the_file(tmp_path):
    b = copy_example("cilium-vxlan-policy", tmp_path)
    cfg = b / "k8s/cilium-config.yaml"
    cfg.write_text(cfg.read_text().replace("  enable-tcx: \"true\"\n",
                                           "  enable-tcx: \"true\"\n  enable-ipv4-egress-gateway: \"true\"\n"))
    _, doc = trace(b, "trace", "shop/frontend", "1.1.1.1:443")
    (p,) = doc["paths"]
    assert p["verdict"] == "unknown"
    assert "nodes/worker1/cilium-bpf-egress-list.txt" in p["drop"]["reason"]
    # a destination inside the cluster is never the gateway's business
    _, doc = trace(b, "pod-to-svc", "shop/frontend", "shop/web")
    assert doc["verdict"] == "delivered"


def test_iptables_masquerade_where_cilium_uses_it():
    """Cilium 1.8 with iptables masquerading and legacy host routing (cilium-kpr-native): the
    kernel's CILIUM_POST_nat masquerades a pod's packet leaving the native-routing CIDR; the
    BPF to-netdev translates nothing."""
    code, doc = trace(EXAMPLE.parent / "cilium-kpr-native", "trace", "default/pod1", "1.1.1.1:443")
    (p,) = doc["paths"]
    assert code == 0 and p["disposition"] == "left-cluster"
    req = hops(p)
    masq = one(req, lambda h: h["component"] == "iptables" and h["chain"] == "CILIUM_POST_nat"
               and "MASQUERADE" in (h["rule"] or ""))
    assert masq["node"] == "node1"
    netdev = one(req, lambda h: h.get("program") == "to-netdev")
    assert "masquerading is iptables'" in netdev["effect"]
    assert req[-1]["packet"]["nw_src"] == "10.255.255.11"
