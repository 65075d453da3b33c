"""Cilium over IPv6 on the dual-stack example (traceflow/examples/cilium-dualstack) and copies
of it changed one fact at a time. No Cilium runs here: each assertion follows the Cilium source
it cites (read at 1.17.0-dev, commit b095517e; traceflow/cni/cilium/family.py lists the lines).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
DUAL = ROOT / "traceflow" / "examples" / "cilium-dualstack"
runner = CliRunner()
WEB6 = "fd00:96::15"


def run(*args, bundle=DUAL, code=(0, 1)):
    r = runner.invoke(app, [str(a) for a in args] + ["--bundle", str(bundle)])
    assert r.exit_code in code, r.output
    return r


def trace(*args, bundle=DUAL) -> dict:
    return json.loads(run(*args, "-o", "json", bundle=bundle).stdout)


def path_to(doc, pod):
    return next(p for p in doc["paths"] if p["endpoint"] == pod)


def planted(tmp_path, node, name, edit) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(DUAL, copy)
    f = copy / "nodes" / node / name
    f.write_text(edit(f.read_text()))
    return copy


def test_ipv6_pod_to_service_hop_by_hop():
    doc = trace("pod-to-svc", "shop/frontend", "shop/web", "-6")
    assert doc["verdict"] == "delivered"
    assert {p["endpoint"]: p["weight"] for p in doc["paths"]} == {"shop/web-0": 0.5,
                                                                  "shop/web-1": 0.5}
    remote = path_to(doc, "shop/web-0")
    req, reply = remote["legs"]
    hops = req["hops"]
    # every hop of both legs carries the IPv6 packet, never an IPv4 one
    assert all(":" in h["packet"]["nw_src"] for leg in remote["legs"] for h in leg["hops"]
               if h.get("packet"))
    # the pod's first hop: cilium_host's IPv6 router address, answered by the lxc MAC
    assert "via its gateway fd00:10:0:1::5e" in hops[0]["effect"]
    # bpf_sock.c cil_sock6_connect (line 1083): lb6_lookup_service on the lb6 map at connect()
    svc = hops[2]
    assert (svc["program"], svc["map"]) == ("cil_sock6_connect", "cilium_lb6_services_v2")
    assert svc["entry"].startswith(f"[{WEB6}]:80 (0)") and "[::]:0 (24) (0)" in svc["entry"]
    be = hops[3]
    assert be["map"] == "cilium_lb6_backends"
    assert be["changed"] == {"nw_dst": [WEB6, "fd00:10:0:2::2d"], "tp_dst": [80, 8080]}
    assert any(n.startswith("lb6_local") for n in be["notes"])
    # bpf_lxc.c handle_ipv6_from_lxc (line 434): policy_can_egress6 on the same policy map,
    # then the ipcache's tunnel endpoint (line 471) and encap_and_redirect_lxc (line 720)
    enc = next(h for h in hops if h.get("map") == "cilium_ipcache")
    assert enc["entry"].startswith("fd00:10:0:2::2d/128") and "tunnelendpoint=192.168.1.12" \
        in enc["entry"]
    # an IPv6 packet in VXLAN over the IPv4 underlay: the outer header is the nodes' IPv4
    assert enc["changed"]["tun_src"][1] == "192.168.1.11"
    assert enc["changed"]["tun_dst"][1] == "192.168.1.12"
    assert enc["changed"]["tun_id"][1] == 15211            # the source identity in the VNI
    progs = [h["program"] for h in hops if h["component"] == "bpf"]
    assert progs[-3:] == ["from-overlay", "policy", "policy"]
    allow = hops[-2]
    assert allow["map"] == "cilium_policy_02718" and "15211" in allow["entry"]
    # the reply: CT_REPLY in from-container (cilium_ct6_global), back through the tunnel, and
    # the client's ipv6_policy (bpf_lxc.c line 1535) sees it from the connected backend
    assert next(h for h in reply["hops"] if h.get("packet"))["packet"]["nw_src"] == \
        "fd00:10:0:2::2d"
    assert any(h.get("map") == "cilium_ct6_global" for h in reply["hops"])
    assert not any("cilium_ct4_global" in json.dumps(h) or "lb4_" in json.dumps(h)
                   for leg in remote["legs"] for h in leg["hops"])


def test_ipv6_local_backend_is_delivered_by_tail_call():
    doc = trace("pod-to-svc", "shop/frontend", "shop/web", "-6")
    hops = path_to(doc, "shop/web-1")["legs"][0]["hops"]
    local = next(h for h in hops if h.get("map") == "cilium_lxc")
    # bpf/lib/l3.h ipv6_local_delivery (line 125): the cilium_lxc entry of the IPv6 key
    assert "ipv6_local_delivery" in local["effect"]
    assert local["entry"].startswith("[fd00:10:0:1::34]:0") and "id=1187" in local["entry"]


def test_ipv6_policy_drop_is_named_by_its_network_policy():
    doc = trace("pod-to-svc", "shop/batch", "shop/web", "-6")
    assert doc["verdict"] == "dropped"
    for p in doc["paths"]:
        assert p["disposition"] == "dropped-policy"
        assert "shop/web-from-frontend" in p["policies"]
        # the policy map is keyed by identity (bpf/lib/policy.h): batch's 28802 has no entry
        assert p["drop"]["reason"].startswith("DROP_POLICY: ingress policy of endpoint")
        assert "denies identity 28802" in p["drop"]["reason"]
        assert "fd00:10:0:1::25" in p["drop"]["reason"]


def test_family_both_agrees_on_the_example():
    r = run("pod-to-svc", "shop/frontend", "shop/web", "--family", "both")
    assert r.stdout.startswith("families: IPv4 delivered, IPv6 delivered")


def test_a_missing_lb6_backend_shows_as_ipv4_delivered_ipv6_dropped(tmp_path):
    """web-0's lb6 slot is gone from worker1's map while --frontends still counts 2: lb6_local
    picks slot 1 for half the new connections and lb6_lookup_backend finds nothing (lb.h lines
    900, 650): DROP_NO_SERVICE. IPv4's lb4 map is whole."""
    bundle = planted(tmp_path, "worker1", "cilium-bpf-lb-list.txt", lambda t: "".join(
        ln for ln in t.splitlines(True) if not ln.startswith(f"[{WEB6}]:80 (1)")))
    r = run("pod-to-svc", "shop/frontend", "shop/web", "--family", "both", bundle=bundle)
    assert r.exit_code == 1
    text = " ".join(r.stdout.split())
    assert text.startswith("families: IPv4 delivered, IPv6 partial: 1 of 2 paths delivered"), \
        text[:200]
    assert "dropped at 1.4 worker1 bpf cil_sock6_connect" in text[:300]
    doc = trace("pod-to-svc", "shop/frontend", "shop/web", "-6", bundle=bundle)
    lost = next(p for p in doc["paths"] if p["verdict"] == "dropped")
    assert lost["disposition"] == "no-backend" and lost["weight"] == 0.5


def test_a_missing_ipv6_ipcache_entry(tmp_path):
    """Without web-0's /128 the LPM ipcache still finds the remote pod CIDR's /64 with its
    tunnel endpoint (delivered); without both, only ::/0 (world-ipv6, no tunnel endpoint) is
    left: the pod address of worker2 is not reachable through the tunnel (bpf_lxc.c line 725,
    DROP_NO_TUNNEL_ENDPOINT), said unknown, never the IPv4 answer."""
    one = planted(tmp_path / "a", "worker1", "cilium-bpf-ipcache-list.txt", lambda t: "".join(
        ln for ln in t.splitlines(True) if not ln.startswith("fd00:10:0:2::2d/128")))
    doc = trace("pod-to-pod", "shop/frontend", "shop/web-0", "--port", "8080", "-6", bundle=one)
    assert doc["verdict"] == "delivered"
    enc = next(h for h in doc["paths"][0]["legs"][0]["hops"] if h.get("map") == "cilium_ipcache")
    assert enc["entry"].startswith("fd00:10:0:2::/64")
    both = planted(tmp_path / "b", "worker1", "cilium-bpf-ipcache-list.txt", lambda t: "".join(
        ln for ln in t.splitlines(True) if not ln.startswith(("fd00:10:0:2::2d/128",
                                                              "fd00:10:0:2::/64"))))
    doc = trace("pod-to-pod", "shop/frontend", "shop/web-0", "--port", "8080", "-6",
                bundle=both)
    assert doc["verdict"] == "unknown"
    assert "DROP_NO_TUNNEL_ENDPOINT" in doc["paths"][0]["drop"]["reason"]
    assert "::/0" in doc["paths"][0]["drop"]["reason"]
    v4 = trace("pod-to-pod", "shop/frontend", "shop/web-0", "--port", "8080", "-4", bundle=both)
    assert v4["verdict"] == "delivered"


def test_an_ipv6_underlay(tmp_path):
    """An ipcache whose tunnel endpoints are the nodes' IPv6 addresses: the outer header is
    IPv6 (the node's InternalIP of that family) and the peer's from-overlay takes it."""
    bundle = planted(tmp_path, "worker1", "cilium-bpf-ipcache-list.txt", lambda t: "\n".join(
        ln.replace("tunnelendpoint=192.168.1.12", "tunnelendpoint=2001:db8:1::12")
        if ln.startswith("fd00:") else ln for ln in t.splitlines()) + "\n")
    doc = trace("pod-to-pod", "shop/frontend", "shop/web-0", "--port", "8080", "-6",
                bundle=bundle)
    assert doc["verdict"] == "delivered"
    hops = doc["paths"][0]["legs"][0]["hops"]
    enc = next(h for h in hops if h.get("map") == "cilium_ipcache")
    assert enc["changed"]["tun_src"][1] == "2001:db8:1::11"
    assert enc["changed"]["tun_dst"][1] == "2001:db8:1::12"
    assert any(h["node"] == "worker2" and h.get("program") == "from-overlay" for h in hops)


def test_what_is_not_modelled_over_ipv6_is_unknown_with_the_reason():
    # nodeport_lb6 (nodeport.h line 1393): a NodePort from outside over IPv6
    doc = trace("trace", "2001:db8:99::7", "[2001:db8:1::11]:30080")
    assert doc["verdict"] == "unknown"
    assert "nodeport_lb6" in doc["paths"][0]["drop"]["reason"]
    assert trace("trace", "203.0.113.7", "192.168.1.11:30080")["verdict"] == "delivered"
    # snat_v6_needs_masquerade (nat.h line 1309): a pod to an IPv6 address outside
    doc = trace("trace", "shop/frontend", "[2001:4860::8888]:443")
    assert doc["verdict"] == "unknown"
    drop = doc["paths"][0]["drop"]
    assert "snat_v6_needs_masquerade" in drop["reason"] and drop["component"] == "bpf"
    assert trace("trace", "shop/frontend", "1.1.1.1:443")["paths"][0]["disposition"] == \
        "left-cluster"
