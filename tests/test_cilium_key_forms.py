"""Every key form Cilium prints for its policy, load-balancing and ipcache maps, per version
(issue 22): no line Cilium can print makes traceflow refuse a bundle. The fixtures in
tests/data/cilium/forms/ are written from the printers of each version (tests/data/cilium/
README.md names them): a line the datapath cannot be read from (Cilium's own
``<INVALID PREFIX LENGTH: N>``) is kept as an unreadable row of its endpoint, never a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceflow.engines.cilium import lb, maps, policy
from traceflow.engines.cilium.common import CiliumVersion
from traceflow.engines.cilium.lookup import ipcache_lookup, policy_verdict, service_lookup

FORMS = Path(__file__).resolve().parent / "data" / "cilium" / "forms"


def read(name):
    return (FORMS / name).read_text(), name


def data_rows(text: str) -> int:
    """Table rows of a policy dump (not headers, section lines, labels or notices)."""
    n = 0
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("Endpoint ID:", "Path:", "/sys/", "POLICY", "DIRECTION",
                                  "Policy stats empty")) or line[:1].isspace():
            continue
        n += 1
    return n


@pytest.mark.parametrize("name", sorted(p.name for p in FORMS.glob("policy-*.txt")))
def test_every_policy_row_is_read_or_kept_aside(name):
    text, path = read(name)
    rows = policy.parse_policy_get(text, path)
    assert len(rows) + len(rows.unreadable) == data_rows(text)
    assert all("INVALID PREFIX LENGTH" in u.source.text for u in rows.unreadable)


def _forms(name):
    return {(e.direction, e.identity, e.port, e.port_end, e.protocol, e.prefix_len): e
            for e in policy.parse_policy_get(*read(name))}


def test_policy_forms_of_1_8_and_1_13():
    """<= 1.13 (cilium/cmd/bpf_policy_get.go of 1.13): ``ANY`` for port 0, ``N/PROTO``
    otherwise, ICMP types as the port, unknown protocols by number."""
    f8 = _forms("policy-1.8.txt")
    assert ("ingress", None, 53, 53, "UDP", None) in f8 and f8[("ingress", None, 53, 53, "UDP", None)].proxy_port == 15001
    assert ("ingress", None, 132, 132, "SCTP", None) in f8
    f13 = _forms("policy-1.13.txt")
    assert ("ingress", None, 8, 8, "ICMP", None) in f13
    assert ("ingress", 7193, None, None, "ICMP", None) in f13           # 0/ICMP: every type
    assert ("ingress", None, 1234, 1234, "47", None) in f13             # GRE by number
    assert f13[("ingress", 30001, 443, 443, "TCP", None)].verdict == "deny"


def test_policy_forms_of_1_14_to_1_17():
    """pkg/maps/policymap PortProtoString: 1.14/1.15 print a partial port prefix
    ``0x1f80/11/TCP``, 1.16+ ``8064-8095/TCP``; a bare protocol is prefix 8, a bare number
    an unnamed protocol."""
    f15 = _forms("policy-1.15.txt")
    assert ("ingress", 21324, None, None, "TCP", 8) in f15
    assert ("ingress", None, 0x1f80, 0x1f80 + 31, "TCP", 19) in f15
    assert ("ingress", None, None, None, "47", 8) in f15
    assert f15[("ingress", 30001, None, None, "UDP", 8)].auth_type == "spire"
    f17 = _forms("policy-1.17.txt")
    assert ("ingress", None, 8064, 8095, "TCP", 19) in f17
    assert ("ingress", None, 128, 128, "ICMPv6", 24) in f17
    assert f17[("ingress", 21324, 8080, 8080, "TCP", 24)].proxy_port == 15001
    assert all(e.map_name.endswith("cilium_policy_v2_02215") for e in f17.values())
    # the two 1.15 partial-port forms decide the same ports
    v = CiliumVersion(1, 15)
    block = f15[("ingress", None, 0x1f80, 0x1f80 + 31, "TCP", 19)]
    for port in (8063, 8064, 8095, 8096):
        assert policy_verdict([block], "ingress", 5, port, "TCP", v).allowed == (8064 <= port <= 8095)


def test_the_labels_layout_resolves_reserved_labels():
    f = policy.parse_policy_get(*read("policy-1.10-labels.txt"))
    assert [(e.identity, e.labels) for e in f] == [
        (1, None), (2, None),
        (None, "k8s:app=client k8s:io.kubernetes.pod.namespace=default"),
        (6, None), (None, None)]


@pytest.mark.parametrize("name,services,backends", [
    ("lb-1.8.txt", 7, 6), ("lb-1.14.txt", 9, 6), ("lb-1.16.txt", 7, 5), ("lb-1.17.txt", 10, 6)])
def test_every_lb_key_form(name, services, backends):
    """cilium-dbg bpf lb list per generation: continuation lines (<= 1.15), a slot in the key
    (1.16), the protocol in the key and backends (1.17, also SCTP and ANY), ``/i`` internal
    scope, IPv6 in brackets with the ``[::]:0`` service entry, ``backend N not found``, every
    service type and flag (loopback, quarantined, dsr, 46x64, check source-range, deny,
    l7-load-balancer with its proxy port)."""
    got = lb.parse_lb_list(*read(name))
    assert len(got) == services and sum(len(s.backends) for s in got) == backends


def test_lb_forms_are_looked_up_as_the_datapath_keys_them():
    v17 = lb.parse_lb_list(*read("lb-1.17.txt"))
    udp = service_lookup(v17, "10.96.0.10", 53, "UDP")
    tcp = service_lookup(v17, "10.96.0.10", 53, "TCP")
    assert udp.service.rev_nat == 2 and tcp.service.rev_nat == 3
    assert service_lookup(v17, "10.96.95.95", 80, "UDP").service.protocol == "ANY"
    assert service_lookup(v17, "10.96.90.90", 5060, "TCP") is None      # SCTP only
    l7 = next(s for s in v17 if s.frontend_ip == "10.96.50.50")
    assert l7.l7_proxy_port == 13502
    v6 = service_lookup(v17, "fd00::10", 80, "TCP")
    assert [b.ip for b in v6.candidates] == ["fd00::1:5"]
    fr = lb.parse_lb_frontends(*read("frontends-1.17.txt"))
    assert [(f.slot, f.count, f.qcount) for f in fr if f.frontend_ip == "10.96.100.10"] == [
        (0, 2, 1), (1, 0, 0), (2, 0, 0)]
    assert next(f for f in fr if f.frontend_ip == "10.96.50.50").backend_id == 13502


@pytest.mark.parametrize("name,count", [("ipcache-1.8.txt", 4), ("ipcache-1.14.txt", 4),
                                        ("ipcache-1.17.txt", 5), ("ipcache-map-get.txt", 3)])
def test_every_ipcache_key_form(name, count):
    """pkg/maps/ipcache Key.String (a PrefixCluster: ``prefix@N`` for another cluster's
    entry) and RemoteEndpointInfo.String per generation; IPv6 prefixes and tunnel endpoints."""
    got = maps.parse_ipcache(*read(name))
    assert len(got) == count


def test_another_cluster_s_entry_is_not_this_cluster_s_address():
    got = maps.parse_ipcache(*read("ipcache-1.17.txt"))
    other = next(e for e in got if e.cluster_id == 2)
    assert other.prefix == "10.0.3.5/32"
    # the datapath looks addresses up with cluster id 0: the world entry answers
    assert ipcache_lookup(got, "10.0.3.5").identity == 2
    assert next(e for e in got if e.prefix == "10.0.2.30/32").flags == ("skiptunnel",)
