"""cilium-dbg outputs: every real-world capture parses, with the facts it shows; bad lines fail."""

from pathlib import Path

import pytest

from traceflow.cilium import parse as C
from traceflow.errors import InputError

DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
REAL = DATA / "realworld" / "cilium"


def read(name):
    return (REAL / name).read_text(), name


def test_service_list_with_multiple_backends():
    svcs = C.parse_service_list(*read("kwx4957-week4_cilium-dbg-service-list.txt"))
    by_front = {(s.frontend_ip, s.port): s for s in svcs if s.protocol == "TCP"}
    dns = by_front[("10.96.0.10", 53)]
    assert dns.type == "ClusterIP" and dns.service_id == 16
    assert [(b.ip, b.port, b.state) for b in dns.backends] == [
        ("172.20.0.56", 53, "active"), ("172.20.0.244", 53, "active")]
    lb = by_front[("192.168.10.212", 80)]
    assert lb.type == "LoadBalancer" and len(lb.backends) == 3
    assert by_front[("0.0.0.0", 30003)].type == "NodePort"


def test_services_without_backends_in_three_formats():
    for name, parser in [("imroc-tke-cilium_service-list_no-backends.txt", C.parse_service_list),
                         ("imroc-tke-cilium_bpf-lb-list_empty-backends.txt", C.parse_bpf_lb_list),
                         ("imroc-tke-cilium_shell-db-show-frontends.txt", C.parse_db_frontends)]:
        svcs = parser(*read(name))
        assert {(s.frontend_ip, s.port, s.type) for s in svcs} == {
            ("10.15.1.8", 443, "LoadBalancer"), ("0.0.0.0", 30965, "NodePort"),
            ("192.168.60.179", 443, "ClusterIP")}
        assert all(not s.backends for s in svcs)
    fronts = C.parse_db_frontends(*read("imroc-tke-cilium_shell-db-show-frontends.txt"))
    assert {s.name for s in fronts} == {"default/kubernetes-intranet"}
    lb = C.parse_bpf_lb_list(*read("imroc-tke-cilium_bpf-lb-list_empty-backends.txt"))
    assert dict((s.port, s.flags) for s in lb)[30965] == ("non-routable",)


def test_bpf_lb_list_backend_slots():
    text = ("SERVICE ADDRESS        BACKEND ADDRESS (REVNAT_ID) (SLOT)\n"
            "10.96.0.10:53/UDP (0)  0.0.0.0:0 (2) (0) [ClusterIP, non-routable]\n"
            "10.96.0.10:53/UDP (1)  10.0.1.53:53/UDP (2) (1)\n"
            "10.96.0.10:53/UDP (2)  10.0.2.53:53/UDP (2) (2)\n")
    (svc,) = C.parse_bpf_lb_list(text, "cilium-bpf-lb-list.txt")
    assert svc.type == "ClusterIP" and [(b.ip, b.number) for b in svc.backends] == [
        ("10.0.1.53", 1), ("10.0.2.53", 2)]


@pytest.mark.parametrize("name, count", [
    ("kwx4957-week1_cilium-map-get-cilium_ipcache_tunnel.txt", 19),
    ("kwx4957-week4_cilium-dbg-bpf-ipcache-list.txt", 22),
    ("kwx4957-week4_cilium-dbg-map-get-cilium_ipcache_v2.txt", 25)])
def test_ipcache_formats(name, count):
    entries = C.parse_ipcache(*read(name))
    assert len(entries) == count
    tunnelled = [e for e in entries if e.tunnel_endpoint]
    assert tunnelled and all(e.identity >= 1 for e in entries)


def test_ipcache_facts_and_ipmasq_and_endpoints():
    e = {x.prefix: x for x in C.parse_ipcache(*read("kwx4957-week4_cilium-dbg-bpf-ipcache-list.txt"))}
    assert e["172.20.2.0/24"].tunnel_endpoint == "192.168.20.100" and e["172.20.2.0/24"].flags == ("hastunnel",)
    assert e["172.20.0.53/32"].tunnel_endpoint is None and e["172.20.0.53/32"].identity == 2163
    masq = [p for p, _ in C.parse_ipmasq_list(*read("kwx4957-week3_cilium-dbg-bpf-ipmasq-list.txt"))]
    assert masq == ["169.254.0.0/16", "10.10.1.0/24", "10.10.2.0/24"]
    eps = {x.endpoint_id: x for x in C.parse_endpoint_list(*read("kwx4957-week4_cilium-dbg-endpoint-list.txt"))}
    assert eps[200].ipv4 == "172.20.1.219" and eps[200].identity == 2219
    assert "k8s:io.kubernetes.pod.namespace=default" in eps[200].labels
    assert eps[234].labels == ("reserved:host",) and eps[234].ipv4 is None


@pytest.mark.parametrize("parser, line", [
    (C.parse_service_list, "garbage here"),
    (C.parse_ipcache, "10.0.0.0/8 notidentity=3"),
    (C.parse_ipmasq_list, "10.0.0.0"),
    (C.parse_bpf_lb_list, "10.96.0.10:53 (0) nonsense"),
])
def test_bad_lines_are_located_errors(parser, line):
    with pytest.raises(InputError) as err:
        parser("\n" + line + "\n", "nodes/n1/cilium-x.txt")
    assert err.value.file == "nodes/n1/cilium-x.txt" and err.value.line == 2
    assert err.value.text == line
