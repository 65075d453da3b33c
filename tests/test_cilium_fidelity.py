"""Cilium as its own programs decide (issue 22, the Cilium section), one test per item, each
following the Cilium 1.17 source file and line named in it (the v1.17 branch point, VERSION
1.17.0-dev; cilium/cilium read with the search tools). The bundles are
examples/cilium-vxlan-policy and its copy in 1.17's output formats (cilium_walks.as_1_17)."""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

import pytest

from cilium_walks import as_1_17, copy_example, path_to, run, trace
from traceflow.engines.cilium.common import CiliumVersion
from traceflow.engines.cilium.lookup import (jhash_3words, maglev_index, maglev_seed_jhash0,
                                             policy_verdict)
from traceflow.engines.cilium.policy import parse_policy_get

V16, V17 = CiliumVersion(1, 16), CiliumVersion(1, 17)


def hops(path, direction="request"):
    return [h for l in path["legs"] if l["direction"] == direction for h in l["hops"]]


@pytest.fixture
def b117(tmp_path):
    return as_1_17(copy_example("cilium-vxlan-policy", tmp_path))


# ---- item 2: a protocol-only row, parsed and ranked as the datapath does -------------------

HEAD = ("Endpoint ID: 1187\nPath: /sys/fs/bpf/tc/globals/cilium_policy_v2_01187\n\n"
        "POLICY   DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   AUTH TYPE   BYTES   PACKETS   PREFIX\n")


def rows(*lines):
    return parse_policy_get(HEAD + "\n".join(lines) + "\n", "cilium-bpf-policy-get.txt")


def test_a_bare_protocol_is_the_protocol_with_any_port():
    """pkg/maps/policymap/policymap.go PortProtoString (1.17 line 290): prefix 0 or 8 prints
    the protocol alone; the key holds the protocol, any port."""
    (e,) = rows("Allow    Ingress     15211      TCP          NONE         disabled    0       0         8")
    assert (e.protocol, e.port, e.prefix_len, e.protocol_only) == ("TCP", None, 8, True)
    for port in (1, 80, 8080, 65535):
        assert policy_verdict([e], "ingress", 15211, port, "TCP", V17).allowed
    assert not policy_verdict([e], "ingress", 15211, 53, "UDP", V17).allowed


def test_a_protocol_only_deny_beats_an_l3_l4_allow_from_1_17():
    """bpf/lib/policy.h __policy_can_access (1.17 lines 133-157): the identity's entry (L3+L4
    allow) is not a deny, the wildcard lookup finds the protocol-only deny, and "the found
    l4policy is chosen if ... it is a deny policy". 1.16 (policy.h at the 1.16 branch point)
    takes the identity's entry with a port first."""
    allow, deny = rows(
        "Allow    Ingress     15211      8080/TCP     NONE         disabled    0       0         24",
        "Deny     Ingress     0          TCP          NONE         disabled    0       0         8")
    v17 = policy_verdict([allow, deny], "ingress", 15211, 8080, "TCP", V17)
    assert not v17.allowed and v17.drop == "DROP_POLICY_DENY" and v17.entry is deny
    assert "ANY/proto/ANY (protocol-only)" in v17.how
    v16 = policy_verdict([allow, deny], "ingress", 15211, 8080, "TCP", V16)
    assert v16.allowed and v16.entry is allow


def test_an_l4_allow_beats_a_protocol_only_allow_on_its_port():
    """Equal proxy-port priority: the wildcard entry wins with the longer prefix (1.17
    line 156); the L4 entry's proxy port is the one the packet gets."""
    l3proto, l4 = rows(
        "Allow    Ingress     15211      TCP          NONE         disabled    0       0         8",
        "Allow    Ingress     0          8080/TCP     NONE         disabled    0       0         24")
    v = policy_verdict([l3proto, l4], "ingress", 15211, 8080, "TCP", V17)
    assert v.allowed and v.entry is l4 and "ANY/proto/port (L4-only)" in v.how
    v = policy_verdict([l3proto, l4], "ingress", 15211, 9090, "TCP", V17)
    assert v.allowed and v.entry is l3proto and "id/proto/ANY (L3-proto)" in v.how


def test_a_protocol_only_row_in_a_bundle_decides_a_trace(b117):
    pol = b117 / "nodes/worker1/cilium-bpf-policy-get.txt"
    text = pol.read_text()
    row = "Allow    Ingress     15211      8080/TCP     NONE         disabled    18620   214       24"
    assert text.count(row) == 1
    pol.write_text(text.replace(row, row + "\nDeny     Ingress     0          TCP          NONE         "
                                      "disabled    0       0         8"))
    code, doc = trace(b117, "pod-to-pod", "shop/frontend", "shop/web-1", "--port", "8080", "--no-reply")
    (p,) = doc["paths"]
    assert p["disposition"] == "dropped-policy" and p["drop"]["reason"].startswith("DROP_POLICY_DENY")
    last = hops(p)[-1]
    assert last["map"] == "cilium_policy_v2_01187" and last["entry"].startswith("Deny     Ingress     0          TCP")


def test_an_unreadable_row_is_kept_located_and_decides_nothing_else():
    got = rows("Allow    Ingress     15211      8080/TCP     NONE         disabled    0       0         24",
               "Allow    Sideways    0          ANY          NONE         disabled    0       0         0",
               "Allow    Ingress     0          <INVALID PREFIX LENGTH: 30>   NONE   disabled   0   0   30")
    assert len(got) == 1 and [(u.source.line, u.endpoint_id) for u in got.unreadable] == [(6, 1187), (7, 1187)]
    assert "direction 'Sideways'" in got.unreadable[0].reason
    assert "invalid prefix length (30)" in got.unreadable[1].reason
    v = policy_verdict(got, "ingress", 15211, 8080, "TCP", V17,
                       unreadable=[u for u in got.unreadable if u.direction in (None, "ingress")])
    assert v.unknown and "cilium-bpf-policy-get.txt:7" in v.unknown


# ---- item 3: service-no-backend-response: reject ------------------------------------------

def _no_backends(bundle: Path, socket_lb: bool):
    for n in ("worker1", "worker2"):
        lb = bundle / f"nodes/{n}/cilium-bpf-lb-list.txt"
        lb.write_text("".join(l for l in lb.read_text().splitlines(True)
                              if not l.startswith(("10.96.120.15:80/TCP (1)", "10.96.120.15:80/TCP (2)"))))
        fr = bundle / f"nodes/{n}/cilium-bpf-lb-list-frontends.txt"
        fr.write_text(fr.read_text().replace("0 2[0] (7) [0x0 0x0]", "0 0[0] (7) [0x0 0x0]"))
        if not socket_lb:
            st = bundle / f"nodes/{n}/cilium-status.txt"
            st.write_text(st.read_text().replace("Socket LB:              Enabled",
                                                 "Socket LB:              Disabled"))


def test_no_backend_is_rejected_at_from_container(b117):
    """bpf_lxc.c (1.17 line 118): lb4_local's DROP_NO_SERVICE tail-calls
    CILIUM_CALL_IPV4_NO_SERVICE when SERVICE_NO_BACKEND_RESPONSE is defined, i.e.
    service-no-backend-response reject, the default (pkg/defaults ServiceNoBackendResponse);
    __tail_no_service_ipv4 (lb.h line 1918) answers ICMP port unreachable out of the lxc
    (bpf/tests/tc_lxc_lb4_no_backend.c expects exactly this: CTX_ACT_REDIRECT, ICMP
    DEST_UNREACH / PORT_UNREACH back to the client)."""
    _no_backends(b117, socket_lb=False)
    code, doc = trace(b117, "pod-to-svc", "shop/frontend", "shop/web")
    (p,) = doc["paths"]
    assert code == 1 and p["verdict"] == "dropped" and p["disposition"] == "rejected"
    assert p["drop"]["table"] == "from-container"
    assert "ICMP port unreachable" in p["drop"]["reason"] and "connection refused" in p["drop"]["reason"]
    assert any("tail_no_service_ipv4" in h["effect"] for h in hops(p))


def test_no_backend_before_1_15_is_a_drop(tmp_path):
    b = as_1_17(copy_example("cilium-vxlan-policy", tmp_path))
    _no_backends(b, socket_lb=False)
    for f in [b / "manifest.yaml"] + [b / f"nodes/{n}/cilium-status.txt" for n in ("worker1", "worker2")]:
        f.write_text(f.read_text().replace("1.17.3", "1.14.9"))
    _, doc = trace(b, "pod-to-svc", "shop/frontend", "shop/web")
    (p,) = doc["paths"]
    assert p["disposition"] == "no-backend" and p["drop"]["reason"].startswith("DROP_NO_SERVICE")
    assert "has no service-no-backend-response" in p["drop"]["reason"]


def test_no_backend_under_socket_lb_fails_connect_at_once(b117):
    """bpf_sock.c (1.17 line 287): count 0 -> -EHOSTUNREACH, returned to connect()."""
    _no_backends(b117, socket_lb=True)
    _, doc = trace(b117, "pod-to-svc", "shop/frontend", "shop/web")
    (p,) = doc["paths"]
    assert p["drop"]["table"] == "cil_sock4_connect" and "EHOSTUNREACH" in p["drop"]["reason"]


# ---- item 4: TCP to a UDP-only Service port --------------------------------------------------

def test_tcp_to_a_udp_only_port_is_ordinary_traffic(b117):
    """lb4_lookup_service (lb.h 1.17 line 1343): the key carries the protocol, and without an
    entry for it (nor an ANY one) the packet is no service's: no DNAT."""
    svc = b117 / "k8s/services.yaml"
    svc.write_text(svc.read_text().replace(
        "ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]",
        "ports: [{name: http, port: 80, protocol: UDP, targetPort: 8080}]", 1))
    for n in ("worker1", "worker2"):
        for name in ("cilium-bpf-lb-list.txt", "cilium-bpf-lb-list-frontends.txt"):
            f = b117 / f"nodes/{n}/{name}"
            text = f.read_text().replace("10.96.120.15:80/TCP", "10.96.120.15:80/UDP")
            f.write_text(text.replace("8080/TCP (7)", "8080/UDP (7)"))
    code, doc = trace(b117, "pod-to-svc", "shop/frontend", "shop/web", "--port", "80", "--protocol", "tcp")
    assert any("has no port 80 over TCP" in w and "no DNAT" in w for w in doc["warnings"])
    (p,) = doc["paths"]
    req = hops(p)
    assert not any("nw_dst" in (h.get("changed") or {}) for h in req)
    sock = [h for h in req if h.get("map") == "cilium_lb4_services_v2"]
    assert sock and "has a service entry for UDP only" in " ".join(sock[0]["notes"])
    assert p["disposition"] == "left-cluster"          # routed on out of the node, unknown beyond


# ---- item 5: native routing with legacy host routing: see test_trace_cilium_kpr.py
#      (test_the_eight_steps_of_the_walk_in_order: TC_ACT_OK, node2's route and
#      CILIUM_FORWARD, cil_from_host's local delivery)


# ---- item 6 ------------------------------------------------------------------------------------

def test_1_17_policy_maps_are_named_by_their_path_line(b117):
    code, doc = trace(b117, "pod-to-svc", "shop/batch", "shop/web")
    for p in doc["paths"]:
        assert hops(p)[-1]["map"] in ("cilium_policy_v2_01187", "cilium_policy_v2_02718")
        assert "cilium_policy_v2_0" in p["drop"]["reason"]


def test_hairpin_through_its_own_service_is_snated_to_the_loopback_address(b117):
    """lb4_local (lb.h 1.17 line 1817): the backend is the client itself -> source
    IPV4_LOOPBACK (169.254.42.1 by default) and the CT loopback flag; bpf_lxc.c skips the
    egress policy (hairpin_flow, line 971) and the ingress policy (line 1951); the reply's
    reverse NAT restores both addresses (__lb4_rev_nat with loopback)."""
    for n in ("worker1", "worker2"):
        st = b117 / f"nodes/{n}/cilium-status.txt"
        st.write_text(st.read_text().replace("Socket LB:              Enabled", "Socket LB:              Disabled"))
    code, doc = trace(b117, "pod-to-svc", "shop/web-1", "shop/web", "--endpoint", "web-1")
    (p,) = doc["paths"]
    assert code == 0 and p["endpoint"] == "shop/web-1"
    req = hops(p)
    xlate = [h for h in req if h.get("map") == "cilium_lb4_backends"][0]
    assert xlate["changed"]["nw_src"] == ["10.0.1.52", "169.254.42.1"]
    assert xlate["changed"]["nw_dst"] == ["10.96.120.15", "10.0.1.52"]
    assert not any((h.get("map") or "").startswith("cilium_policy") for h in req)
    assert any("egress policy is skipped" in h["effect"] for h in req)
    assert any("ingress policy is skipped" in h["effect"] for h in req)
    rep = hops(p, "reply")
    rev = [h for h in rep if "lb4_rev_nat" in h["effect"]][0]
    assert rev["changed"]["nw_src"] == ["10.0.1.52", "10.96.120.15"]
    assert rev["changed"]["nw_dst"] == ["169.254.42.1", "10.0.1.52"]
    assert rep[-1]["packet"]["nw_src"] == "10.96.120.15"


def test_hairpin_under_socket_lb_stays_in_the_pod(b117):
    code, doc = trace(b117, "pod-to-svc", "shop/web-1", "shop/web", "--endpoint", "web-1", "--no-reply")
    (p,) = doc["paths"]
    assert p["disposition"] == "delivered-pod" and "over lo in its own network namespace" in hops(p)[-1]["effect"]


def test_a_policy_entry_with_a_proxy_port_redirects_to_envoy(b117):
    """bpf_lxc.c: an allowing entry with a proxy port sends the packet to the proxy
    (ctx_redirect_to_proxy4, 1.17 line 1126 on egress; the ingress policy's proxy_port):
    "redirected to the L7 proxy (Envoy) on port N", not a delivery."""
    pol = b117 / "nodes/worker1/cilium-bpf-policy-get.txt"
    row = "Allow    Ingress     15211      8080/TCP     NONE         disabled    18620   214       24"
    pol.write_text(pol.read_text().replace(row, row.replace("NONE ", "15001", 1)))
    code, doc = trace(b117, "pod-to-pod", "shop/frontend", "shop/web-1", "--port", "8080")
    (p,) = doc["paths"]
    assert code == 1 and p["verdict"] == "unknown"
    assert p["drop"]["reason"].startswith("redirected to the L7 proxy (Envoy) on port 15001")
    assert "nodes/worker1/cilium-bpf-policy-get.txt" in p["drop"]["reason"]
    assert not any("delivered" in h["effect"] for h in hops(p))


def test_a_world_destination_without_tunnel_endpoint_goes_out_of_the_native_device(b117):
    """bpf_lxc.c (1.17 line 1271): DROP_NO_TUNNEL_ENDPOINT from encap_and_redirect_lxc means
    "Deliver via native device": fib_redirect_v4 with BPF host routing."""
    _, doc = trace(b117, "trace", "shop/frontend", "1.1.1.1:443", "--no-reply")
    (p,) = doc["paths"]
    assert p["verdict"] == "delivered" and p["disposition"] == "left-cluster"
    assert not any(h.get("unknown") for h in hops(p))


# ---- item 7: Maglev per 5-tuple, session affinity -----------------------------------------

def test_jhash_matches_cilium_s_own_vectors():
    """bpf/tests/jhash_test.c (1.17): jhash_3words(123, 234, 345, 456) == 2698615579 and
    jhash_3words(0, 0, 0, 0) == 459859287."""
    assert jhash_3words(123, 234, 345, 456) == 2698615579
    assert jhash_3words(0, 0, 0, 0) == 459859287


def _index_by_struct(src: str, sport: int, dport: int, seed0: int, size: int) -> int:
    """The same index written from the tuple's bytes: saddr and the two ports as the BPF
    program reads them on a little-endian machine (ipv4_ct_tuple: dport holds the packet's
    source port, lb4_extract_tuple / ipv4_load_l4_ports)."""
    saddr = struct.unpack("<I", ipaddress.ip_address(src).packed)[0]
    tuple_dport = struct.unpack("<H", struct.pack(">H", sport))[0]
    tuple_sport = struct.unpack("<H", struct.pack(">H", dport))[0]
    return jhash_3words(saddr, (tuple_dport << 16) | tuple_sport, 6, seed0) % size


def test_maglev_index_is_the_hash_of_the_tuple():
    seed0 = maglev_seed_jhash0("JLfvgnHc2kaSUFaI")
    for sport in (1024, 40000, 54321, 65535):
        assert maglev_index("10.0.1.21", sport, 80, 6, seed0, 251) == \
            _index_by_struct("10.0.1.21", sport, 80, seed0, 251)


def _full_maglev(bundle: Path, size: int = 251):
    """A whole lookup table (bpf-lb-maglev-table-size 251): entries alternate by index so
    each source port lands on a known backend."""
    table = [11 if i % 3 else 12 for i in range(size)]
    for n in ("worker1", "worker2"):
        st = bundle / f"nodes/{n}/cilium-status.txt"
        st.write_text(st.read_text().replace("Backend Selection:      Random",
                                             f"Backend Selection:      Maglev (Table Size: {size})"))
        (bundle / f"nodes/{n}/cilium-bpf-lb-maglev-list.txt").write_text(
            "SVC ID   LOOKUP TABLE\n[7]/v4   [" + " ".join(map(str, table)) + "]\n")
        st.write_text(st.read_text().replace("Socket LB:              Enabled", "Socket LB:              Disabled"))
    return table


@pytest.mark.parametrize("sport", [40000, 40001, 40002, 54321])
def test_maglev_picks_the_one_backend_of_the_5_tuple(b117, sport):
    """lb4_select_backend_id_maglev (lb.h 1.17 line 1429): backend_ids[hash_from_tuple_v4 %
    LB_MAGLEV_LUT_SIZE]: one backend per 5-tuple, not shares. Backend ids 11 (web-0) and 12
    (web-1) from `--frontends`; the seed is the default (no bpf-lb-maglev-hash-seed)."""
    table = _full_maglev(b117)
    seed0 = maglev_seed_jhash0("JLfvgnHc2kaSUFaI")
    want = {11: "shop/web-0", 12: "shop/web-1"}[table[_index_by_struct("10.0.1.21", sport, 80, seed0, 251)]]
    code, doc = trace(b117, "pod-to-svc", "shop/frontend", "shop/web", "--src-port", str(sport), "--no-reply")
    assert [(p["endpoint"], p["weight"]) for p in doc["paths"]] == [(want, 1.0)]
    (lookup,) = [h for h in hops(doc["paths"][0]) if h.get("map") == "cilium_lb4_services_v2"]
    assert any("entry" in n and "of the 251-entry table" in n and "the default seed" in n
               for n in lookup["notes"])


def test_maglev_with_a_partial_table_gives_shares_and_says_why(b117):
    _full_maglev(b117, 251)
    for n in ("worker1", "worker2"):
        st = b117 / f"nodes/{n}/cilium-status.txt"
        st.write_text(st.read_text().replace("(Table Size: 251)", "(Table Size: 16381)"))
    _, doc = trace(b117, "pod-to-svc", "shop/frontend", "shop/web", "--no-reply")
    assert len(doc["paths"]) == 2
    (lookup,) = [h for h in hops(doc["paths"][0]) if h.get("map") == "cilium_lb4_services_v2"]
    assert any("251 entries, not the table size 16381" in n for n in lookup["notes"])


def test_session_affinity_flag_in_the_map(b117):
    """lb4_local (lb.h 1.17 line 1730): with the sessionAffinity flag the client's backend
    comes from cilium_lb4_affinity first; the map is not collected: the first connection."""
    for n in ("worker1", "worker2"):
        lb = b117 / f"nodes/{n}/cilium-bpf-lb-list.txt"
        lb.write_text(lb.read_text().replace("(7) (0) [ClusterIP, non-routable] ",
                                             "(7) (0) [ClusterIP, sessionAffinity, non-routable] "))
    _, doc = trace(b117, "pod-to-svc", "shop/frontend", "shop/web", "--no-reply")
    for p in doc["paths"]:
        (x,) = [h for h in hops(p) if h.get("map") == "cilium_lb4_backends"]
        assert any("lb4_affinity_backend_id_by_addr" in n and "first connection" in n for n in x["notes"])


def test_the_policy_map_name_comes_from_the_path_line_then_the_version():
    """The bundle's `Path:` line names the map; without one, the version does
    (pkg/maps/policymap MapName: ``cilium_policy_v2_`` from 1.17)."""
    from traceflow.cni.cilium.node import CiliumNode
    from traceflow.engines.cilium import load_node

    def node(version, text):
        n = CiliumNode.__new__(CiliumNode)
        n.name = "n1"
        n.maps = load_node({"cilium-bpf-policy-get.txt": text}, version)
        return n
    rows = ("POLICY   DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   AUTH TYPE   BYTES   "
            "PACKETS   PREFIX\nAllow    Ingress     0          ANY          NONE         disabled    "
            "0       0         0\n")
    with_path = f"Endpoint ID: 412\nPath: /sys/fs/bpf/tc/globals/cilium_policy_v2_00412\n\n{rows}"
    assert node("1.16.8", with_path).policy_map_name(412) == "cilium_policy_v2_00412"
    bare = f"Endpoint ID: 412\n\n{rows}"
    assert node("1.17.3", bare).policy_map_name(412) == "cilium_policy_v2_00412"
    assert node("1.16.8", bare).policy_map_name(412) == "cilium_policy_00412"
