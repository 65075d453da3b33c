"""Cilium 1.16 in tunnel mode (the examples/cilium-vxlan-policy bundle): socket LB, VXLAN,
tcx attachments, LPM policy maps, and a NetworkPolicy that admits one client and denies
another. Expectations follow Cilium's source (bpf_sock.c, bpf_lxc.c, bpf_overlay.c,
lib/policy.h); no Cilium agent runs here."""

from pathlib import Path

import pytest

from cilium_walks import copy_example, path_to, trace

EXAMPLE = Path(__file__).resolve().parent.parent / "traceflow" / "examples" / "cilium-vxlan-policy"


@pytest.fixture
def bundle(tmp_path):
    return copy_example("cilium-vxlan-policy", tmp_path)


def hops(path, direction="request"):
    (l,) = [l for l in path["legs"] if l["direction"] == direction]
    return l["hops"]


def test_frontend_reaches_both_backends_with_the_backend_chosen_at_connect():
    code, doc = trace(EXAMPLE, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 0 and doc["verdict"] == "delivered"
    # the shuffled 1.16 `bpf lb list` groups by key: both backends belong to 10.96.120.15:80
    assert sorted(p["endpoint"] for p in doc["paths"]) == ["shop/web-0", "shop/web-1"]
    assert [p["weight"] for p in doc["paths"]] == [0.5, 0.5]
    remote = hops(path_to(doc, "shop/web-0"))
    sock = [h for h in remote if h.get("program") == "cil_sock4_connect"]
    assert "Socket LB:              Enabled" in sock[0]["effect"]
    assert sock[0]["source"] == {"file": "nodes/worker1/cilium-bpf-lb-list.txt", "line": 4}
    (xlate,) = [h for h in sock if h["map"] == "cilium_lb4_backends"]
    # (the key column is as wide as the widest key plus 3, as cilium-dbg's tabwriter pads it:
    # the example's NodePort keys widened it)
    assert xlate["entry"] == "10.96.120.15:80 (1)        10.0.2.45:8080 (7) (1)"
    assert xlate["changed"]["nw_dst"] == ["10.96.120.15", "10.0.2.45"]
    assert xlate["changed"]["tp_dst"] == [80, 8080]
    first = [h for h in remote if h.get("program") == "from-container"][0]
    assert first["packet"]["nw_dst"] == "10.0.2.45" and "translated at connect()" in first["effect"]
    assert any("cil_from_container" in n and "bpftool-net.txt" in n for n in first["notes"])
    # VXLAN to worker2 with the source identity in the VNI; from-overlay reads it back
    (encap,) = [h for h in remote if h.get("map") == "cilium_ipcache" and h["node"] == "worker1"]
    assert "tunnel endpoint 192.168.1.12" in encap["effect"]
    assert encap["packet"]["tun_dst"] == "192.168.1.12"
    assert encap["entry"].endswith("tunnelendpoint=192.168.1.12, flags=hastunnel")
    (decap,) = [h for h in remote if h.get("program") == "from-overlay"]
    assert decap["node"] == "worker2" and "identity 15211" in decap["effect"]
    (pol,) = [h for h in remote if h.get("map") == "cilium_policy_02718"]
    assert pol["entry"].startswith("Allow    Ingress     15211      8080/TCP")
    assert any("LPM lookup (1.14+)" in n for n in pol["notes"])
    assert any("allowed by NetworkPolicy shop/web-from-frontend" in n for n in pol["notes"])
    # the reply goes back through the tunnel; the application sees the service address
    rep = hops(path_to(doc, "shop/web-0"), "reply")
    assert [h["node"] for h in rep if h["component"] == "underlay"] == ["worker1"]
    assert rep[-1]["packet"]["nw_src"] == "10.96.120.15"
    # the local backend: a tail call into its policy program, no tunnel
    local = hops(path_to(doc, "shop/web-1"))
    assert not any(h.get("program") in ("to-overlay", "from-overlay") for h in local)
    assert any(h.get("map") == "cilium_lxc" and "ipv4_local_delivery" in h["effect"] for h in local)


def test_the_denied_client_is_dropped_at_each_backend_naming_identity_and_policy():
    code, doc = trace(EXAMPLE, "pod-to-svc", "shop/batch", "shop/web")
    assert code == 1 and doc["verdict"] == "dropped"
    for endpoint, node, ep in (("shop/web-0", "worker2", 2718), ("shop/web-1", "worker1", 1187)):
        p = path_to(doc, endpoint)
        drop = p["drop"]
        assert drop["node"] == node and drop["component"] == "bpf" and drop["table"] == "policy"
        assert drop["reason"].startswith(f"DROP_POLICY: ingress policy of endpoint {ep}")
        assert "identity 28802 (k8s:io.kubernetes.pod.namespace=shop, k8s:role=batch)" in drop["reason"]
        assert "shop/web-from-frontend" in drop["reason"]
        assert hops(p)[-1]["map"] == f"cilium_policy_{ep:05d}"


def test_socket_lb_off_moves_the_lookup_into_from_container(bundle):
    for n in ("worker1", "worker2"):
        f = bundle / f"nodes/{n}/cilium-status.txt"
        f.write_text(f.read_text().replace("Socket LB:              Enabled",
                                           "Socket LB:              Disabled"))
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 0
    h = hops(path_to(doc, "shop/web-0"))
    assert not any(x.get("program") == "cil_sock4_connect" for x in h)
    (lookup,) = [x for x in h if x.get("map") == "cilium_lb4_services_v2"]
    assert lookup["program"] == "from-container" and "socket LB is off" in lookup["effect"]
    # per-packet LB: the reply is reverse-NAT-ed by lb4_rev_nat in the client's policy program
    rep = hops(path_to(doc, "shop/web-0"), "reply")
    (rev,) = [x for x in rep if "lb4_rev_nat" in x["effect"]]
    assert rev["changed"]["nw_src"] == ["10.0.2.45", "10.96.120.15"]


def test_ipcache_without_the_peer_tunnel_endpoint_is_unknown_with_the_reason(bundle):
    f = bundle / "nodes/worker1/cilium-bpf-ipcache-list.txt"
    text = f.read_text()
    text = text.replace("10.0.2.45/32        identity=41007 encryptkey=0 tunnelendpoint=192.168.1.12, flags=hastunnel\n", "")
    text = text.replace("10.0.2.0/24         identity=2 encryptkey=0 tunnelendpoint=192.168.1.12, flags=hastunnel\n", "")
    f.write_text(text)
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 1 and doc["verdict"] == "partial"
    p = path_to(doc, "shop/web-0")
    assert p["verdict"] == "unknown"
    assert p["drop"]["node"] == "worker1" and p["drop"]["table"] == "from-container"
    assert p["drop"]["reason"].startswith("DROP_NO_TUNNEL_ENDPOINT: tunnel mode, but the ipcache has "
                                          "no tunnel endpoint for 10.0.2.45")
    assert "Pod address of worker2" in p["drop"]["reason"]
    assert path_to(doc, "shop/web-1")["verdict"] == "delivered"


def test_tcx_without_bpftool_listing_is_unknown(bundle):
    (bundle / "nodes/worker1/bpftool-net.txt").unlink()
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 1 and doc["verdict"] == "unknown"
    for p in doc["paths"]:
        assert "only `bpftool net show` lists attachments" in p["drop"]["reason"]


def test_maglev_without_its_table_says_so(bundle):
    for n in ("worker1", "worker2"):
        f = bundle / f"nodes/{n}/cilium-status.txt"
        f.write_text(f.read_text().replace("Backend Selection:      Random", "Backend Selection:      Maglev"))
    (bundle / "k8s/cilium-config.yaml").write_text(
        (bundle / "k8s/cilium-config.yaml").read_text().replace("bpf-lb-algorithm: random",
                                                                "bpf-lb-algorithm: maglev"))
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    (lookup,) = [h for h in hops(path_to(doc, "shop/web-0")) if h.get("map") == "cilium_lb4_services_v2"]
    assert any("Maglev" in n and "not known" in n for n in lookup["notes"])
    assert all("maglev" in c for p in doc["paths"] for c in p["choices"])


def test_policy_deny_entry_wins_in_1_17_ranking():
    from traceflow.engines.cilium.common import CiliumVersion
    from traceflow.engines.cilium.lookup import policy_verdict
    from traceflow.engines.cilium.records import PolicyEntry
    from traceflow.model.errors import Source
    src = Source("p.txt", 1, "x")
    allow = PolicyEntry(1, "ingress", 28802, 8080, None, "TCP", "allow", src, prefix_len=24)
    deny = PolicyEntry(1, "ingress", None, None, None, None, "deny", src, prefix_len=0)
    v16 = policy_verdict([allow, deny], "ingress", 28802, 8080, "TCP", CiliumVersion(1, 16))
    v17 = policy_verdict([allow, deny], "ingress", 28802, 8080, "TCP", CiliumVersion(1, 17))
    assert v16.allowed and v16.entry is allow          # longest prefix wins
    assert not v17.allowed and v17.drop == "DROP_POLICY_DENY" and v17.entry is deny


def test_client_ip_affinity_is_modelled_as_the_first_connection(bundle):
    f = bundle / "k8s/services.yaml"
    f.write_text(f.read_text().replace("    type: ClusterIP\n", "    type: ClusterIP\n    sessionAffinity: ClientIP\n"))
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    (xlate,) = [h for h in hops(path_to(doc, "shop/web-0")) if h.get("map") == "cilium_lb4_backends"]
    assert any("session affinity (ClientIP)" in n and "first connection" in n for n in xlate["notes"])
    code, doc = trace(EXAMPLE, "pod-to-svc", "shop/frontend", "shop/web")
    (xlate,) = [h for h in hops(path_to(doc, "shop/web-0")) if h.get("map") == "cilium_lb4_backends"]
    assert not any("affinity" in n for n in xlate["notes"])


def test_native_routing_with_bpf_host_routing_skips_netfilter(bundle):
    """Switched to native routing: from-container asks the FIB (bpf_fib_lookup, honouring the
    kernel's rules and routes) and redirects to eth0; no netfilter hook is crossed."""
    for n, peer_cidr, peer_ip in (("worker1", "10.0.2.0/24", "192.168.1.12"),
                                  ("worker2", "10.0.1.0/24", "192.168.1.11")):
        st = bundle / f"nodes/{n}/cilium-status.txt"
        st.write_text(st.read_text().replace("Network: Tunnel [vxlan]   Host: BPF",
                                             "Network: Native   Host: BPF"))
        rt = bundle / f"nodes/{n}/ip-route.txt"
        lines = [l for l in rt.read_text().splitlines(True) if not l.startswith(peer_cidr)]
        rt.write_text("".join(lines) + f"{peer_cidr} via {peer_ip} dev eth0 proto bird \n")
        (bundle / f"nodes/{n}/iptables-save.txt").write_text(
            "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n")
    cfg = bundle / "k8s/cilium-config.yaml"
    cfg.write_text(cfg.read_text().replace("routing-mode: tunnel", "routing-mode: native")
                   .replace("  tunnel-protocol: vxlan\n", "  ipv4-native-routing-cidr: 10.0.0.0/16\n"))
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 0, doc
    h = hops(path_to(doc, "shop/web-0"))
    fib = [x for x in h if x.get("program") == "from-container" and "bpf_fib_lookup" in x["effect"]]
    assert fib and "netfilter" in fib[0]["effect"]
    (route,) = [x for x in h if x["component"] == "route" and x["node"] == "worker1"]
    assert route["rule"].startswith("10.0.2.0/24 via 192.168.1.12 dev eth0")
    assert not any(x["component"] == "iptables" for x in h)   # FORWARD DROP is never met
    assert [x["node"] for x in h if x.get("program") == "to-netdev"] == ["worker1"]
    assert any(x.get("program") == "from-netdev" and x["node"] == "worker2" for x in h)
    assert not any(x.get("program") in ("to-overlay", "from-overlay") for x in h)


def _maglev(bundle):
    for n in ("worker1", "worker2"):
        f = bundle / f"nodes/{n}/cilium-status.txt"
        f.write_text(f.read_text().replace("Backend Selection:      Random", "Backend Selection:      Maglev"))
        (bundle / f"nodes/{n}/cilium-bpf-lb-maglev-list.txt").write_text(
            "SVC ID   LOOKUP TABLE\n[7]/v4   [11 12 11 11 12 11 11]\n[1]/v4   [5 5 5 5 5 5 5]\n")


def test_maglev_shares_come_from_the_lookup_table(bundle):
    _maglev(bundle)
    for n in ("worker1", "worker2"):
        (bundle / f"nodes/{n}/cilium-bpf-lb-list-frontends.txt").write_text(
            "SERVICE ADDRESS         BACKEND ID\n"
            "10.96.120.15:80 (0)     0 2[0] (7) [0x0 0x0]\n"
            "10.96.120.15:80 (2)     12 0[0] (7) [0x0 0x0]\n"
            "10.96.120.15:80 (1)     11 0[0] (7) [0x0 0x0]\n")
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    # slot 1 (10.0.2.45) is backend 11: 5 of the 7 entries; slot 2 (10.0.1.52) is 12: 2 of 7
    assert path_to(doc, "shop/web-0")["weight"] == round(5 / 7, 6)
    assert path_to(doc, "shop/web-1")["weight"] == round(2 / 7, 6)
    (lookup,) = [h for h in hops(path_to(doc, "shop/web-0")) if h.get("map") == "cilium_lb4_services_v2"]
    assert any("shares from the lookup table" in n and "cilium-bpf-lb-maglev-list.txt:2" in n
               for n in lookup["notes"])


def test_maglev_table_without_backend_ids_says_so(bundle):
    _maglev(bundle)
    for n in ("worker1", "worker2"):
        (bundle / f"nodes/{n}/cilium-bpf-lb-list-frontends.txt").unlink()
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    assert [p["weight"] for p in doc["paths"]] == [0.5, 0.5]
    (lookup,) = [h for h in hops(path_to(doc, "shop/web-0")) if h.get("map") == "cilium_lb4_services_v2"]
    assert any("does not say which id each backend has" in n for n in lookup["notes"])


def test_a_cilium_network_policy_selecting_the_backend_is_named(bundle):
    (bundle / "k8s/networkpolicies.yaml").write_text("apiVersion: v1\nkind: List\nitems: []\n")
    (bundle / "k8s/ciliumnetworkpolicies.yaml").write_text("""apiVersion: v1
kind: List
items:
- apiVersion: cilium.io/v2
  kind: CiliumNetworkPolicy
  metadata: {name: web-ingress, namespace: shop}
  spec:
    endpointSelector: {matchLabels: {app: web}}
    ingress:
    - fromEndpoints: [{matchLabels: {role: frontend}}]
      toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
- apiVersion: cilium.io/v2
  kind: CiliumNetworkPolicy
  metadata: {name: other-namespace, namespace: default}
  spec:
    endpointSelector: {matchLabels: {app: web}}
    ingress: [{}]
""")
    code, doc = trace(bundle, "pod-to-svc", "shop/batch", "shop/web")
    assert code == 1
    for p in doc["paths"]:
        assert p["drop"]["reason"].startswith("DROP_POLICY")
        assert "CiliumNetworkPolicy shop/web-ingress selects" in p["drop"]["reason"]
        assert "other-namespace" not in p["drop"]["reason"]


def _count(bundle, node: str, count: int):
    """Set the slot count of 10.96.120.15:80 in `bpf lb list --frontends` (slot 0's
    ``0 N[0]``): the slots a new connection can take are 1..count."""
    f = bundle / f"nodes/{node}/cilium-bpf-lb-list-frontends.txt"
    text = f.read_text()
    old = "0 2[0] (7) [0x0 0x0]"
    assert text.count(old) == 1
    f.write_text(text.replace(old, f"0 {count}[0] (7) [0x0 0x0]"))


def test_a_slot_whose_backend_is_gone_is_a_dropped_branch(bundle):
    for n in ("worker1", "worker2"):
        f = bundle / f"nodes/{n}/cilium-bpf-lb-list.txt"
        f.write_text(f.read_text() + "10.96.120.15:80 (3)        backend 13 not found\n")
        _count(bundle, n, 3)
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 1 and doc["verdict"] == "partial"
    assert sorted(p["weight"] for p in doc["paths"]) == [round(1 / 3, 6)] * 3
    (lost,) = [p for p in doc["paths"] if p["verdict"] == "dropped"]
    assert lost["drop"]["reason"].startswith("slot 3 of 10.96.120.15:80 points to backend id 13")
    assert lost["drop"]["reason"].endswith("connect() fails, no packet is sent")
    assert lost["drop"]["node"] == "worker1" and lost["drop"]["table"] == "cil_sock4_connect"


def test_a_service_without_backends_fails_connect_under_socket_lb(bundle):
    for n in ("worker1", "worker2"):
        f = bundle / f"nodes/{n}/cilium-bpf-lb-list.txt"
        f.write_text("".join(l for l in f.read_text().splitlines(True)
                             if not (l.startswith("10.96.120.15:80 (1)") or l.startswith("10.96.120.15:80 (2)"))))
        _count(bundle, n, 0)
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    (p,) = doc["paths"]
    assert p["verdict"] == "dropped" and p["drop"]["table"] == "cil_sock4_connect"
    assert "cil_sock4_connect finds no backend and connect() fails" in p["drop"]["reason"]


def test_geneve_tunnel_uses_cilium_geneve_and_udp_6081(bundle):
    for n in ("worker1", "worker2"):
        for name in ("cilium-status.txt", "bpftool-net.txt", "ip-addr.txt", "tc.txt"):
            f = bundle / f"nodes/{n}/{name}"
            f.write_text(f.read_text().replace("vxlan", "geneve"))
    cfg = bundle / "k8s/cilium-config.yaml"
    cfg.write_text(cfg.read_text().replace("tunnel-protocol: vxlan", "tunnel-protocol: geneve"))
    code, doc = trace(bundle, "pod-to-svc", "shop/frontend", "shop/web")
    assert code == 0
    h = hops(path_to(doc, "shop/web-0"))
    (to,) = [x for x in h if x.get("program") == "to-overlay"]
    assert "GENEVE" in to["effect"] and "UDP 6081" in to["effect"] and "cilium_geneve" in to["effect"]
    (frm,) = [x for x in h if x.get("program") == "from-overlay"]
    assert frm["node"] == "worker2" and "cilium_geneve" in frm["effect"]
