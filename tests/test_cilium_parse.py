"""Cilium inputs: every real-world capture parses with the facts it shows; each version's format
(fixtures under tests/data/cilium/<version>/) groups and reads right, in any line order; text and
JSON forms agree; bad input is an error naming file and line."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from traceflow.engines.cilium import CiliumVersion, detect_version, load_node
from traceflow.engines.cilium import attach, conntrack, lb, maps, policy
from traceflow.engines.cilium import parse as C
from traceflow.engines.cilium import settings as S
from traceflow.model.errors import InputError

HERE = Path(__file__).resolve().parent
REAL = HERE / "data" / "realworld" / "cilium"
FIX = HERE / "data" / "cilium"


def read(name):
    return (REAL / name).read_text(), name


def fx(version, name):
    path = FIX / version / name
    return path.read_text(), f"{version}/{name}"


def grouping(services):
    """(address, port, protocol, scope) -> (type, ((backend ip, port, slot), ...)); backends
    without a slot (<=1.11 prints none) as a sorted tuple."""
    out = {}
    for s in services:
        bes = tuple((b.ip, b.port, b.slot) for b in s.backends)
        if any(b.slot is None for b in s.backends):
            bes = tuple(sorted(bes))
        out[s.key] = (s.type, bes)
    return out


# ---- real-world captures ----------------------------------------------------------------------

REAL_PARSERS = {
    "imroc-tke-cilium_bpf-lb-list_empty-backends.txt": lb.parse_lb_list,
    "imroc-tke-cilium_service-list_no-backends.txt": lb.parse_service_list,
    "imroc-tke-cilium_shell-db-show-frontends.txt": lb.parse_db_frontends,
    "kwx4957-week1_cilium-map-get-cilium_ipcache_tunnel.txt": maps.parse_ipcache,
    "kwx4957-week3_cilium-dbg-bpf-ipmasq-list.txt": maps.parse_ipmasq_list,
    "kwx4957-week4_cilium-dbg-bpf-ipcache-list.txt": maps.parse_ipcache,
    "kwx4957-week4_cilium-dbg-endpoint-list.txt": maps.parse_endpoint_list,
    "kwx4957-week4_cilium-dbg-map-get-cilium_ipcache_v2.txt": maps.parse_ipcache,
    "kwx4957-week4_cilium-dbg-service-list.txt": lb.parse_service_list,
}


def test_every_realworld_file_has_a_parser():
    assert sorted(p.name for p in REAL.iterdir()) == sorted(REAL_PARSERS)


@pytest.mark.parametrize("name", sorted(REAL_PARSERS))
def test_every_realworld_file_parses_every_line(name):
    text, path = read(name)
    records = REAL_PARSERS[name](text, path, CiliumVersion(1, 18))
    assert records
    data_lines = [n for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    cited = {src.line for r in records for src in (getattr(r, "sources", ()) or (r.source,))}
    cited |= {b.source.line for r in records for b in getattr(r, "backends", ())}
    header = 2 if "endpoint-list" in name else 1          # `endpoint list` has a two-line header
    assert set(data_lines) - cited == set(data_lines[:header])   # every other line is in a record
    assert all(r.source.file == path for r in records)


def test_service_list_with_multiple_backends():
    svcs = C.parse_service_list(*read("kwx4957-week4_cilium-dbg-service-list.txt"))
    by_front = {(s.frontend_ip, s.port, s.protocol): s for s in svcs}
    dns = by_front[("10.96.0.10", 53, "TCP")]
    assert dns.type == "ClusterIP" and dns.service_id == 16
    assert [(b.ip, b.port, b.state, b.number) for b in dns.backends] == [
        ("172.20.0.56", 53, "active", 1), ("172.20.0.244", 53, "active", 2)]
    assert dns.backends[1].source.line == 12
    assert by_front[("10.96.0.10", 53, "UDP")].service_id == 17
    lb_ = by_front[("192.168.10.212", 80, "TCP")]
    assert lb_.type == "LoadBalancer" and len(lb_.backends) == 3
    assert by_front[("0.0.0.0", 30003, "TCP")].type == "NodePort"


def test_services_without_backends_in_three_formats():
    for name, parser in [("imroc-tke-cilium_service-list_no-backends.txt", C.parse_service_list),
                         ("imroc-tke-cilium_bpf-lb-list_empty-backends.txt", C.parse_bpf_lb_list),
                         ("imroc-tke-cilium_shell-db-show-frontends.txt", C.parse_db_frontends)]:
        svcs = parser(*read(name))
        assert {(s.frontend_ip, s.port, s.protocol, s.type) for s in svcs} == {
            ("10.15.1.8", 443, "TCP", "LoadBalancer"), ("0.0.0.0", 30965, "TCP", "NodePort"),
            ("192.168.60.179", 443, "TCP", "ClusterIP")}
        assert all(not s.backends and not s.truncated for s in svcs)
    fronts = C.parse_db_frontends(*read("imroc-tke-cilium_shell-db-show-frontends.txt"))
    assert {s.name for s in fronts} == {"default/kubernetes-intranet"}
    bpf = {s.port: s for s in C.parse_bpf_lb_list(*read("imroc-tke-cilium_bpf-lb-list_empty-backends.txt"))}
    assert bpf[30965].flags == ("non-routable",) and bpf[30965].rev_nat == 12
    assert bpf[443].rev_nat in (14, 15)


@pytest.mark.parametrize("name, count", [
    ("kwx4957-week1_cilium-map-get-cilium_ipcache_tunnel.txt", 19),
    ("kwx4957-week4_cilium-dbg-bpf-ipcache-list.txt", 22),
    ("kwx4957-week4_cilium-dbg-map-get-cilium_ipcache_v2.txt", 25)])
def test_ipcache_formats(name, count):
    entries = C.parse_ipcache(*read(name))
    assert len(entries) == count
    assert all(e.tunnel_endpoint is None or "," not in e.tunnel_endpoint for e in entries)
    assert any(e.tunnel_endpoint for e in entries) and all(e.identity >= 1 for e in entries)


def test_ipcache_facts_and_ipmasq_and_endpoints():
    e = {x.prefix: x for x in C.parse_ipcache(*read("kwx4957-week4_cilium-dbg-bpf-ipcache-list.txt"))}
    assert e["172.20.2.0/24"].tunnel_endpoint == "192.168.20.100" and e["172.20.2.0/24"].flags == ("hastunnel",)
    assert e["172.20.0.53/32"].tunnel_endpoint is None and e["172.20.0.53/32"].identity == 2163
    m = {x.prefix: x for x in C.parse_ipcache(*read("kwx4957-week1_cilium-map-get-cilium_ipcache_tunnel.txt"))}
    assert m["172.20.2.23/32"].state == "sync" and m["172.20.2.23/32"].tunnel_endpoint == "192.168.10.100"
    masq = [p for p, _ in C.parse_ipmasq_list(*read("kwx4957-week3_cilium-dbg-bpf-ipmasq-list.txt"))]
    assert masq == ["169.254.0.0/16", "10.10.1.0/24", "10.10.2.0/24"]
    eps = {x.endpoint_id: x for x in C.parse_endpoint_list(*read("kwx4957-week4_cilium-dbg-endpoint-list.txt"))}
    assert eps[200].ipv4 == "172.20.1.219" and eps[200].identity == 2219
    assert "k8s:io.kubernetes.pod.namespace=default" in eps[200].labels and len(eps[200].sources) == 5
    assert eps[234].labels == ("reserved:host",) and eps[234].ipv4 is None


# ---- bpf lb list: each version's format, grouped by key -------------------------------------

WEB = (("10.0.1.21", 8080), ("10.0.2.22", 8080), ("10.0.2.23", 8080))
DNS = (("10.0.1.53", 53), ("10.0.2.53", 53))


def _slotted(pairs):
    return tuple((ip, port, n) for n, (ip, port) in enumerate(pairs, 1))


def _unslotted(pairs):
    return tuple(sorted((ip, port, None) for ip, port in pairs))


EXPECTED_LB = {
    "1.8": {
        ("10.96.100.10", 80, None, "external"): ("ClusterIP", _unslotted(WEB)),
        ("10.96.0.1", 443, None, "external"): ("ClusterIP", (("192.168.1.10", 6443, None),)),
        ("0.0.0.0", 30080, None, "external"): ("NodePort", _unslotted(WEB)),
        ("10.96.200.1", 80, None, "external"): ("ClusterIP", ()),
        ("10.96.0.10", 53, None, "external"): ("ClusterIP", _unslotted(DNS)),
    },
    "1.14": {
        ("10.96.100.10", 80, None, "external"): ("ClusterIP", _slotted(WEB)),
        ("10.96.0.1", 443, None, "external"): ("ClusterIP", (("192.168.1.10", 6443, 1),)),
        ("0.0.0.0", 30080, None, "external"): ("NodePort", _slotted(WEB)),
        ("10.96.200.1", 80, None, "external"): ("ClusterIP", ()),
        ("10.96.0.10", 53, None, "external"): ("ClusterIP", _slotted(DNS)),
    },
    "1.16": {
        ("10.96.100.10", 80, None, "external"): ("ClusterIP", _slotted(WEB)),
        ("10.96.0.1", 443, None, "external"): ("ClusterIP", (("192.168.1.10", 6443, 1),)),
        ("0.0.0.0", 30080, None, "external"): ("NodePort", (("10.0.1.21", 8080, 1),)),
        ("0.0.0.0", 30080, None, "internal"): ("NodePort", _slotted(WEB)),
        ("10.96.200.1", 80, None, "external"): ("ClusterIP", ()),
        ("10.96.0.10", 53, None, "external"): ("ClusterIP", _slotted(DNS)),
    },
    "1.18": {
        ("10.96.100.10", 80, "TCP", "external"): ("ClusterIP", _slotted(WEB)),
        ("10.96.0.1", 443, "TCP", "external"): ("ClusterIP", (("192.168.1.10", 6443, 1),)),
        ("10.96.200.1", 80, "TCP", "external"): ("ClusterIP", ()),
        ("10.96.0.10", 53, "UDP", "external"): ("ClusterIP", _slotted(DNS)),
        ("10.96.0.10", 53, "TCP", "external"): ("ClusterIP", _slotted(DNS)),
        ("10.96.50.50", 443, "TCP", "external"): ("ClusterIP", ()),
    },
}
EXPECTED_LB["1.10"] = EXPECTED_LB["1.8"]


@pytest.mark.parametrize("version", sorted(EXPECTED_LB))
def test_bpf_lb_list_groups_by_key_in_every_version(version):
    svcs = lb.parse_lb_list(*fx(version, "cilium-bpf-lb-list.txt"), CiliumVersion.parse(version))
    assert grouping(svcs) == EXPECTED_LB[version]
    for s in svcs:   # every backend's line carries the service's rev-NAT id
        assert all(b.rev_nat == s.rev_nat for b in s.backends)
        assert s.source.text.split()[-1].startswith("[") or "L7LB" in s.source.text \
            or s.source.text.rstrip().endswith("]")


def test_bpf_lb_list_flags_revnat_and_l7_port():
    v14 = {s.key: s for s in lb.parse_lb_list(*fx("1.14", "cilium-bpf-lb-list.txt"))}
    web = v14[("10.96.100.10", 80, None, "external")]
    assert web.rev_nat == 4 and web.flags == ("non-routable",) and web.source.line == 4
    assert [b.source.line for b in web.backends] == [3, 5, 2]          # slot order, not line order
    v16 = {s.key: s for s in lb.parse_lb_list(*fx("1.16", "cilium-bpf-lb-list.txt"))}
    assert v16[("0.0.0.0", 30080, None, "external")].flags == ("Local", "two-scopes")
    assert v16[("0.0.0.0", 30080, None, "internal")].rev_nat == 7
    v18 = {s.key: s for s in lb.parse_lb_list(*fx("1.18", "cilium-bpf-lb-list.txt"))}
    l7 = v18[("10.96.50.50", 443, "TCP", "external")]
    assert l7.l7_proxy_port == 13502 and l7.flags == ("non-routable", "l7-load-balancer")
    assert all(b.protocol == "UDP" for b in v18[("10.96.0.10", 53, "UDP", "external")].backends)


def _rows(version):
    text, path = fx(version, "cilium-bpf-lb-list.txt")
    lines = text.splitlines()
    return lines[0], lines[1:], path


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_shuffled_per_slot_lb_list_groups_the_same(rnd):
    """1.16+ prints every slot on its own line in Go-map (random) order: any order groups alike."""
    for version in ("1.16", "1.18"):
        header, rows, path = _rows(version)
        rows = rows[:]
        rnd.shuffle(rows)
        got = lb.parse_lb_list("\n".join([header] + rows) + "\n", path)
        assert grouping(got) == EXPECTED_LB[version]
        # the -o json form of the same map, its keys in that order too
        doc = {}
        for r in rows:
            key, value = r.split("  ", 1)
            doc.setdefault(key.strip(), []).append(value.strip())
        assert grouping(lb.parse_lb_list(json.dumps(doc), path)) == EXPECTED_LB[version]


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False))
def test_shuffled_groups_of_continuation_format_group_the_same(rnd):
    """Before 1.16 a key line leads its continuation lines; the groups come in any order and the
    slot-0 entry may be anywhere inside its group."""
    for version in ("1.8", "1.14"):
        header, rows, path = _rows(version)
        groups = []
        for r in rows:
            if r[:1].isspace():
                groups[-1].append(r.strip())
            else:
                groups.append(r.split(None, 1))
                groups[-1] = [groups[-1][0], groups[-1][1].strip()]
        out = [header]
        rnd.shuffle(groups)
        for key, *entries in groups:
            rnd.shuffle(entries)
            out.append(f"{key:<20} {entries[0]}")
            out += [" " * 21 + e for e in entries[1:]]
        assert grouping(lb.parse_lb_list("\n".join(out) + "\n", path)) == EXPECTED_LB[version]
        # -o json: one key per service, its entries in dump order
        doc = {key: entries for key, *entries in groups}
        assert grouping(lb.parse_lb_list(json.dumps(doc), path)) == EXPECTED_LB[version]


def test_the_old_positional_misgrouping_cannot_happen():
    """The DNS service's backend line after the API server's master line stays with DNS."""
    text = ("SERVICE ADDRESS           BACKEND ADDRESS (REVNAT_ID) (SLOT)\n"
            "10.96.0.1:443/TCP (0)     0.0.0.0:0 (1) (0) [ClusterIP, non-routable]\n"
            "10.96.0.10:53/UDP (1)     10.0.1.53:53/UDP (2) (1)\n"
            "10.96.0.10:53/UDP (0)     0.0.0.0:0 (2) (0) [ClusterIP, non-routable]\n"
            "10.96.0.1:443/TCP (1)     192.168.1.10:6443/TCP (1) (1)\n")
    g = grouping(lb.parse_lb_list(text, "x"))
    assert g[("10.96.0.1", 443, "TCP", "external")][1] == (("192.168.1.10", 6443, 1),)
    assert g[("10.96.0.10", 53, "UDP", "external")][1] == (("10.0.1.53", 53, 1),)


# outputs as printed in GitHub threads (trailing spaces kept): cilium/cilium#3905 (2018, the
# slot-0 entry without flags), #10402 (1.7), PR 31503 (1.15, with an L7 proxy port)
@pytest.mark.parametrize("text, expected", [
    ("SERVICE ADDRESS        BACKEND ADDRESS          \n"
     "10.96.0.1:443          0.0.0.0:0 (0)            \n"
     "                       192.168.36.11:6443 (1)   \n"
     "10.110.217.87:80       10.10.1.129:80 (20)      \n"
     "                       10.10.0.239:80 (20)      \n"
     "                       0.0.0.0:0 (0)            \n",
     {("10.96.0.1", 443): (None, ("192.168.36.11",), None),
      ("10.110.217.87", 80): (None, ("10.10.0.239", "10.10.1.129"), None)}),
    ("SERVICE ADDRESS       BACKEND ADDRESS                       \n"
     "100.72.178.101:80     100.64.5.159:8000 (14)                \n"
     "                      100.64.3.128:8000 (14)                \n"
     "                      0.0.0.0:0 (14) [ClusterIP]            \n"
     "10.88.58.5:443        10.234.32.131:11000 (3)               \n"
     "                      0.0.0.0:0 (3) [ExternalIPs]           \n",
     {("100.72.178.101", 80): ("ClusterIP", ("100.64.3.128", "100.64.5.159"), None),
      ("10.88.58.5", 443): ("ExternalIPs", ("10.234.32.131",), None)}),
    ("SERVICE ADDRESS     BACKEND ADDRESS (REVNAT_ID) (SLOT)\n"
     "10.96.252.10:443    172.18.0.2:4244 (22) (1)\n"
     "                    0.0.0.0:0 (22) (0) [ClusterIP, InternalLocal, non-routable]\n"
     "172.18.0.2:32646    0.0.0.0:0 (33) (0) [NodePort, l7-load-balancer] (L7LB Proxy Port: 15735)\n",
     {("10.96.252.10", 443): ("ClusterIP", ("172.18.0.2",), None),
      ("172.18.0.2", 32646): ("NodePort", (), 15735)}),
])
def test_lb_lists_from_github_threads(text, expected):
    got = {(s.frontend_ip, s.port): (s.type, tuple(sorted(b.ip for b in s.backends)), s.l7_proxy_port)
           for s in lb.parse_lb_list(text, "cilium-bpf-lb-list.txt")}
    assert got == expected


def test_service_list_with_ipv6_and_no_protocol():
    # as printed in cilium/cilium#33076
    text = ("ID    Frontend                                            Service Type   Backend\n"
            "1     [ffff:fff:fff:701::2:dceb]:80                       ClusterIP      1 => [ffff:fff:fff:700:0:2:7:2c53]:80 (active)\n"
            "                                                                         2 => [ffff:fff:fff:700:0:2:7:949c]:80 (active)\n"
            "2     10.7.14.194:9000                                    ClusterIP      1 => 10.7.10.209:9000 (active)\n")
    got = lb.parse_service_list(text, "cilium-service-list.txt")
    assert [(s.frontend_ip, s.port, s.protocol, [(b.ip, b.state) for b in s.backends]) for s in got] == [
        ("ffff:fff:fff:701::2:dceb", 80, None, [("ffff:fff:fff:700:0:2:7:2c53", "active"),
                                                ("ffff:fff:fff:700:0:2:7:949c", "active")]),
        ("10.7.14.194", 9000, None, [("10.7.10.209", "active")])]


@pytest.mark.parametrize("version", ["1.16", "1.18"])
def test_lb_list_json_agrees_with_text(version):
    text = lb.parse_lb_list(*fx(version, "cilium-bpf-lb-list.txt"))
    js = lb.parse_lb_list(*fx(version, "cilium-bpf-lb-list.json"))
    assert grouping(js) == grouping(text) == EXPECTED_LB[version]
    assert {s.key: (s.flags, s.rev_nat, s.l7_proxy_port) for s in js} == \
        {s.key: (s.flags, s.rev_nat, s.l7_proxy_port) for s in text}


def test_lb_frontends_form():
    text = ("SERVICE ADDRESS         BACKEND ID\n"
            "10.96.0.10:53/UDP (0)   0 2[0] (2) [0x0 0x0]\n"
            "10.96.0.10:53/UDP (1)   17 0[0] (2) [0x0 0x0]\n"
            "10.96.100.10:80 (0)     0 3 (4) [0x10 0x0]\n")
    got = lb.parse_lb_frontends(text, "f")
    assert [(f.frontend_ip, f.protocol, f.slot, f.backend_id, f.count, f.qcount, f.rev_nat, f.flags)
            for f in got] == [("10.96.0.10", "UDP", 0, 0, 2, 0, 2, 0), ("10.96.0.10", "UDP", 1, 17, 0, 0, 2, 0),
                              ("10.96.100.10", None, 0, 0, 3, None, 4, 0x10)]
    with pytest.raises(InputError, match="--frontends"):
        lb.parse_lb_list(text, "f")


# ---- service list, statedb tables, maglev ------------------------------------------------------

def test_service_list_formats_and_json_agreement():
    v8 = {s.service_id: s for s in lb.parse_service_list(*fx("1.8", "cilium-service-list.txt"))}
    assert v8[2].protocol is None and [(b.ip, b.state) for b in v8[2].backends] == [
        ("10.0.1.53", None), ("10.0.2.53", None)]
    assert v8[6].backends == ()
    text = lb.parse_service_list(*fx("1.14", "cilium-service-list.txt"))
    js = lb.parse_service_list(*fx("1.14", "cilium-service-list.json"))
    view = lambda svcs: {(s.service_id, s.frontend_ip, s.port, s.protocol, s.type):
                         tuple((b.ip, b.port, b.protocol, b.state, b.slot) for b in s.backends) for s in svcs}
    assert view(js) == view(text)
    assert view(text)[(4, "10.96.100.10", 80, "TCP", "ClusterIP")][2][3] == "terminating"
    assert {s.name for s in js} >= {"default/web", "kube-system/kube-dns"}
    v16 = {s.service_id: s for s in lb.parse_service_list(*fx("1.16", "cilium-service-list.txt"))}
    assert [b.preferred for b in v16[2].backends] == [True, False]
    assert v16[7].scope == "internal" and len(v16[7].backends) == 3 and v16[5].scope == "external"


def test_db_frontends_truncated_table_is_flagged_and_json_is_complete():
    table = {s.name: s for s in lb.parse_db_frontends(*fx("1.18", "cilium-db-frontends.txt"))}
    big = table["default/big"]
    assert big.truncated == 3 and len(big.backends) == 5       # never a silent partial list
    assert big.truncation_note == ("1.18/cilium-db-frontends.txt:6: the table shows 5 of 8 backends of "
                                   "10.96.150.7:80; collect `cilium-dbg shell -- db/show --format=json "
                                   "frontends` for all of them")
    assert table["default/web"].truncation_note is None
    assert all(s.truncated == 0 for n, s in table.items() if n != "default/big")
    js = {s.name: s for s in lb.parse_db_frontends(*fx("1.18", "cilium-db-frontends.json"))}
    assert js["default/big"].truncated == 0 and len(js["default/big"].backends) == 8
    assert js["default/big"].backends[-1].state == "terminating"
    shown = [(b.ip, b.port) for b in big.backends]
    assert shown == [(b.ip, b.port) for b in js["default/big"].backends][:5]
    for name in ("default/kubernetes", "kube-system/kube-dns", "default/web", "default/empty"):
        assert [(b.ip, b.port, b.protocol) for b in table[name].backends] == \
               [(b.ip, b.port, b.protocol) for b in js[name].backends]
        assert table[name].key == js[name].key


def test_db_backends_and_services():
    bes = {(b.ip, b.port): b for b in lb.parse_db_backends(*fx("1.18", "cilium-db-backends.txt"))}
    assert bes[("10.0.2.23", 8080)].state == "terminating" and bes[("10.0.1.21", 8080)].state == "active"
    assert bes[("10.0.1.53", 53)].services == ("kube-system/kube-dns",)
    svcs = {s.name: s for s in lb.parse_db_services(*fx("1.18", "cilium-db-services.txt"))}
    web = svcs["default/web"]
    assert (web.ext_traffic_policy, web.int_traffic_policy, web.session_affinity,
            web.session_affinity_timeout) == ("Local", "Cluster", True, "3h0m0s")
    assert svcs["default/kubernetes"].ext_traffic_policy == "Cluster" and not svcs["default/kubernetes"].session_affinity


def test_maglev_tables():
    tables = {t.service_id: t for t in lb.parse_maglev_list(*fx("1.14", "cilium-bpf-lb-maglev-list.txt"))}
    assert tables[4].backend_ids.count(3) == 6 and len(tables[4].backend_ids) == 17
    assert set(tables[2].backend_ids) == {7, 8} and tables[2].family == "v4"


# ---- ipcache, tunnels, endpoints, identities ----------------------------------------------------

def test_ipcache_each_version():
    old = {e.prefix: e for e in maps.parse_ipcache(*fx("1.8", "cilium-bpf-ipcache-list.txt"))}
    assert (old["10.0.2.22/32"].identity, old["10.0.2.22/32"].tunnel_endpoint) == (2219, "192.168.1.12")
    assert old["10.0.1.21/32"].tunnel_endpoint is None
    v14 = {e.prefix: e for e in maps.parse_ipcache(*fx("1.14", "cilium-bpf-ipcache-list.txt"))}
    assert v14["10.0.2.0/24"].node_id == 2 and v14["10.0.2.0/24"].tunnel_endpoint == "192.168.1.12"
    v16 = {e.prefix: e for e in maps.parse_ipcache(*fx("1.16", "cilium-bpf-ipcache-list.txt"))}
    assert v16["10.0.2.22/32"].tunnel_endpoint == "192.168.1.12"          # the comma is gone
    assert v16["10.0.1.21/32"].tunnel_endpoint is None and v16["10.0.1.21/32"].flags == ()
    text = maps.parse_ipcache(*fx("1.18", "cilium-bpf-ipcache-list.txt"))
    js = maps.parse_ipcache(*fx("1.18", "cilium-bpf-ipcache-list.json"))
    view = lambda es: [(e.prefix, e.identity, e.tunnel_endpoint, e.flags) for e in es]
    assert view(js) == view(text)
    assert ("10.0.3.0/24", 2, "fd00:10::13", ("hastunnel",)) in view(text)


def test_ipmasq_json_forms_agree_with_text():
    text = [e.prefix for e in maps.parse_ipmasq_list(*read("kwx4957-week3_cilium-dbg-bpf-ipmasq-list.txt"))]
    new = maps.parse_ipmasq_list('["169.254.0.0/16", "10.10.1.0/24", "10.10.2.0/24"]', "m.json")
    old = maps.parse_ipmasq_list('[{"IP": "169.254.0.0", "Mask": "//8AAA=="}, {"IP": "10.10.1.0", "Mask": '
                                 '"////AA=="}, {"IP": "10.10.2.0", "Mask": "////AA=="}]', "m.json")
    assert [e.prefix for e in new] == [e.prefix for e in old] == text


def test_tunnel_endpoints_and_identities():
    t = maps.parse_tunnel_list(*fx("1.8", "cilium-bpf-tunnel-list.txt"))
    assert [(x.prefix, x.endpoint) for x in t] == [("10.0.2.0", "192.168.1.12"), ("10.0.3.0", "192.168.1.13")]
    ids = {i.identity: i for i in maps.parse_identity_list(*fx("1.10", "cilium-identity-list.txt"))}
    assert ids[2219].labels[0] == "k8s:app=web" and len(ids[2219].labels) == 4 and ids[1].labels == ("reserved:host",)
    eps = {e.endpoint_id: e for e in maps.parse_endpoint_list(*fx("1.10", "cilium-endpoint-list.txt"))}
    assert (eps[2215].policy_ingress, eps[2215].identity, eps[2215].ipv4) == ("Enabled", 2219, "10.0.1.21")


def test_endpoint_and_identity_json_agree_with_text():
    view = lambda eps: [(e.endpoint_id, e.policy_ingress, e.policy_egress, e.identity, e.labels, e.ipv4, e.status)
                        for e in eps]
    assert view(maps.parse_endpoint_list(*fx("1.10", "cilium-endpoint-list.json"))) == \
        view(maps.parse_endpoint_list(*fx("1.10", "cilium-endpoint-list.txt")))
    ids = lambda xs: [(i.identity, i.labels) for i in xs]
    assert ids(maps.parse_identity_list(*fx("1.10", "cilium-identity-list.json"))) == \
        ids(maps.parse_identity_list(*fx("1.10", "cilium-identity-list.txt")))


def test_endpoint_in_policy_audit_mode():
    (ep,) = maps.parse_endpoint_list("ENDPOINT   POLICY\n12   Disabled (Audit)   Enabled   300   k8s:a=b   "
                                     "10.0.0.1   ready\n", "e")
    assert (ep.policy_ingress, ep.policy_egress, ep.identity, ep.ipv4) == ("Disabled (Audit)", "Enabled", 300, "10.0.0.1")


def test_bpf_endpoint_list_versions():
    v8 = {e.ip: e for e in maps.parse_bpf_endpoint_list(*fx("1.8", "cilium-bpf-endpoint-list.txt"))}
    assert (v8["10.0.1.21"].endpoint_id, v8["10.0.1.21"].ifindex, v8["10.0.1.21"].sec_id) == (2215, 699, None)
    assert v8["10.0.1.21"].mac == "5E:D9:E5:0D:A1:ED" and not v8["10.0.1.21"].is_host
    assert v8["192.168.1.11"].is_host and v8["10.0.1.1"].is_host
    v14 = {e.ip: e for e in maps.parse_bpf_endpoint_list(*fx("1.14", "cilium-bpf-endpoint-list.txt"))}
    assert v14["10.0.1.53"].sec_id == 4711 and v14["10.0.1.53"].ifindex == 12


# ---- policy maps ------------------------------------------------------------------------------

def _pol(entries):
    return [(e.endpoint_id, e.direction, e.identity, e.port, e.port_end, e.protocol, e.verdict,
             e.proxy_port, e.prefix_len) for e in entries]


def test_policy_get_1_8_layout():
    got = policy.parse_policy_get(*fx("1.8", "cilium-bpf-policy-get.txt"))
    assert _pol(got) == [
        (2215, "ingress", 21324, 8080, 8080, "TCP", "allow", None, None),
        (2215, "ingress", None, 8080, 8080, "TCP", "allow", None, None),
        (2215, "ingress", 1, None, None, None, "allow", None, None),
        (2215, "egress", None, None, None, None, "allow", None, None),
        (310, "ingress", None, None, None, None, "allow", None, None),
        (310, "egress", None, None, None, None, "allow", None, None)]
    assert got[0].packets == 44 and got[0].source.line == 4


def test_policy_get_labels_layout_keeps_every_label():
    got = policy.parse_policy_get(*fx("1.10", "cilium-bpf-policy-get.txt"))
    assert [(e.direction, e.identity, e.labels, e.port) for e in got] == [
        ("ingress", 1, None, None),
        ("ingress", None, "k8s:app=client k8s:io.cilium.k8s.policy.cluster=default "
                          "k8s:io.kubernetes.pod.namespace=default", 8080),
        ("egress", None, None, None)]


def test_policy_get_1_14_deny_range_prefix_proxy():
    got = policy.parse_policy_get(*fx("1.14", "cilium-bpf-policy-get.txt"))
    assert _pol(got) == [
        (2215, "ingress", 1, None, None, None, "allow", None, 0),
        (2215, "ingress", 21324, 8080, 8080, "TCP", "allow", None, 24),
        (2215, "ingress", 30001, 8080, 8080, "TCP", "deny", None, 24),
        (2215, "ingress", None, 8000, 8191, "TCP", "allow", None, 11),
        (2215, "egress", None, None, None, None, "allow", None, 0),
        (310, "ingress", None, 53, 53, "UDP", "allow", 15001, 24),
        (310, "egress", None, None, None, None, "allow", None, 0)]
    assert got[0].map_name.endswith("cilium_policy_02215")


# rows as printed in GitHub threads (trailing spaces kept): cilium/cilium#3114 (1.0),
# cilium/cilium PR 7958 (1.6), cilium/cilium#40247 (1.17)
@pytest.mark.parametrize("text, expected", [
    ("DIRECTION   LABELS (source:key[=value])   PORT/PROTO   BYTES   PACKETS   \n"
     "Ingress     12345                         80/TCP       0       0    \n",
     [("ingress", 12345, 80, "TCP", "allow")]),
    ("DIRECTION   LABELS (source:key[=value])   PORT/PROTO   PROXY PORT   BYTES   PACKETS   \n"
     "Ingress     reserved:host                 ANY          NONE         0       0         \n"
     "Egress      reserved:world                ANY          NONE         70      1         \n",
     [("ingress", 1, None, None, "allow"), ("egress", 2, None, None, "allow")]),
    ("POLICY   DIRECTION   LABELS (source:key[=value])                                                         PORT/PROTO        PROXY PORT   AUTH TYPE   BYTES        PACKETS    PREFIX   \n"
     "Allow    Ingress     reserved:unknown                                                                    8/ICMP            NONE         disabled    1965348      29778      24       \n"
     "Allow    Ingress     reserved:unknown                                                                    53/TCP            NONE         disabled    0            0          24       \n",
     [("ingress", None, 8, "ICMP", "allow"), ("ingress", None, 53, "TCP", "allow")]),
])
def test_policy_get_rows_from_github_threads(text, expected):
    got = policy.parse_policy_get(text, "cilium-bpf-policy-get.txt")
    assert [(e.direction, e.identity, e.port, e.protocol, e.verdict) for e in got] == expected
    assert all(e.labels is None for e in got)


def test_policy_get_1_18_cookie_and_missing_counters():
    got = policy.parse_policy_get(*fx("1.18", "cilium-bpf-policy-get.txt"))
    assert [(e.verdict, e.identity, e.cookie, e.bytes) for e in got] == [
        ("allow", 1, 0, None), ("deny", 30001, 17, None), ("allow", 21324, 12, None), ("allow", None, 0, None)]


# ---- conntrack, NAT ---------------------------------------------------------------------------

def test_ct_entries_each_version():
    v8 = conntrack.parse_ct_list(*fx("1.8", "cilium-bpf-ct-list-global.txt"))
    assert [(e.protocol, e.kind, e.src_ip, e.dst_ip, e.rev_nat) for e in v8] == [
        ("TCP", "SVC", "10.96.100.10", "10.0.1.30", 4), ("TCP", "OUT", "10.0.2.22", "10.0.1.30", 4),
        ("ICMP", "OUT", "192.168.1.12", "10.0.1.30", 0)]
    assert v8[1].src_sec_id == 21324 and v8[1].get("flagnames") == ("seennonsyn",)
    assert v8[2].get("related") == "1" and v8[0].expires == 17049
    v16 = conntrack.parse_ct_list(*fx("1.16", "cilium-bpf-ct-list-global.txt"))
    assert (v16[0].kind, v16[0].src_ip, v16[0].dst_ip, v16[0].backend_id) == ("SVC", "10.0.1.30", "10.96.100.10", 2)
    v18 = conntrack.parse_ct_list(*fx("1.18", "cilium-bpf-ct-list-global.txt"))
    assert v18[1].get("natport") == "0" and v18[1].get("ifindex") is None


# lines as printed in GitHub threads: cilium/cilium#4384 and #3558 (<=1.7 field names, IPv6 in
# brackets), #40820 (1.18: IPv6 without brackets)
def test_ct_lines_from_github_threads():
    old = conntrack.parse_ct_list(
        "TCP IN 10.10.1.111:10054 -> 10.10.1.1:35330  expires=44067 rx_packets=6 rx_bytes=540 tx_packets=4 "
        "tx_bytes=450 flags=10 revnat=0 src_sec_id=1\n"
        "ICMP IN [f00d::a0f:0:0:4264]:0 -> [f00d::a0f:0:0:1150]:0 related  expires=2446 rx_packets=1 rx_bytes=86 "
        "tx_packets=0 tx_bytes=0 flags=10 revnat=0 proxyport=0 src_sec_id=55058\n", "ct.txt")
    assert [(e.kind, e.src_ip, e.src_port, e.dst_port, e.src_sec_id, e.get("rxpackets")) for e in old] == [
        ("IN", "10.10.1.111", 10054, 35330, 1, "6"), ("IN", "f00d::a0f:0:0:4264", 0, 0, 55058, "1")]
    (new,) = conntrack.parse_ct_list(
        "TCP SVC 2603:8080:c0f0:d2e0:99f2:9195:c043:304f:44564 -> 2a03:3f40:88:1::24:80 expires=26806933 "
        "Packets=0 Bytes=0 RxFlagsSeen=0x00 LastRxReport=0 TxFlagsSeen=0x1b LastTxReport=26806929 Flags=0x0013 "
        "[ RxClosing TxClosing SeenNonSyn ] RevNAT=218 SourceSecurityID=0 BackendID=98\n", "ct.txt")
    assert (new.src_ip, new.src_port, new.dst_ip, new.dst_port, new.rev_nat, new.backend_id) == (
        "2603:8080:c0f0:d2e0:99f2:9195:c043:304f", 44564, "2a03:3f40:88:1::24", 80, 218, 98)
    assert new.get("flagnames") == ("rxclosing", "txclosing", "seennonsyn")


def test_tunnel_keys_of_every_generation():
    t = maps.parse_tunnel_list("TUNNEL            VALUE       \n10.15.0.0         10.0.2.15   \n"
                               "10.0.2.0:0   192.168.1.2:0\n[f00d::]:0   10.0.2.15:0\n10.0.3.0@2:0   10.0.2.16:0\n", "t")
    assert [(x.prefix, x.endpoint) for x in t] == [("10.15.0.0", "10.0.2.15"), ("10.0.2.0", "192.168.1.2"),
                                                   ("f00d::", "10.0.2.15"), ("10.0.3.0", "10.0.2.16")]
    with pytest.raises(InputError, match="brackets") as err:       # is the last group the key?
        maps.parse_tunnel_list("TUNNEL   VALUE\nf00d::a0f:0:0:0   10.0.2.15\n", "t")
    assert err.value.line == 2


def test_nat_entries():
    v14 = conntrack.parse_nat_list(*fx("1.14", "cilium-bpf-nat-list.txt"))
    assert [(e.direction, e.xlate, e.to_ip, e.to_port, e.get("hostlocal")) for e in v14] == [("OUT", "XLATE_SRC", "192.168.1.11", 41234, "0"), ("IN", "XLATE_DST", "10.0.1.30", 41234, "0")]
    v16 = conntrack.parse_nat_list(*fx("1.16", "cilium-bpf-nat-list.txt"))
    assert dict(v16[0].fields) == {"created": "120sec ago", "needsct": "1"}


# ---- status, config, settings ----------------------------------------------------------------

def _settings(version):
    d = FIX / version
    node = load_node(lambda p: (d / ("cilium-config.yaml" if p == "k8s/cilium-config.yaml" else p)).read_text()
                     if (d / ("cilium-config.yaml" if p == "k8s/cilium-config.yaml" else p)).exists() else None,
                     version)
    s = node.settings
    return {k: getattr(s, k) for k in ("kpr", "kpr_mode", "socket_lb", "socket_lb_hostns_only", "session_affinity",
                                       "routing", "tunnel_protocol", "host_routing", "masquerade", "lb_algorithm",
                                       "endpoint_routes", "ipam", "native_routing_cidr", "tcx", "datapath_mode")}, s


@pytest.mark.parametrize("version, expected", [
    ("1.8", dict(kpr=True, kpr_mode="probe", socket_lb=False, socket_lb_hostns_only=None, session_affinity=True,
                 routing="native", tunnel_protocol=None, host_routing="legacy", masquerade="iptables",
                 lb_algorithm=None, endpoint_routes=False, ipam="kubernetes", native_routing_cidr="10.0.0.0/16",
                 tcx=False, datapath_mode="veth")),
    ("1.10", dict(kpr=True, kpr_mode="strict", socket_lb=True, socket_lb_hostns_only=None, session_affinity=True,
                  routing="native", tunnel_protocol=None, host_routing="legacy", masquerade="iptables",
                  lb_algorithm="random", endpoint_routes=True, ipam="eni", native_routing_cidr="10.0.0.0/16",
                  tcx=False, datapath_mode=None)),
    ("1.14", dict(kpr=True, kpr_mode="true", socket_lb=True, socket_lb_hostns_only=False, session_affinity=True,
                  routing="native", tunnel_protocol=None, host_routing="bpf", masquerade="bpf",
                  lb_algorithm="maglev", endpoint_routes=None, ipam="cluster-pool",
                  native_routing_cidr="10.0.0.0/16", tcx=False, datapath_mode=None)),
    ("1.16", dict(kpr=True, kpr_mode="true", socket_lb=True, socket_lb_hostns_only=True, session_affinity=True,
                  routing="tunnel", tunnel_protocol="vxlan", host_routing="bpf", masquerade="bpf",
                  lb_algorithm="random", endpoint_routes=None, ipam="cluster-pool", native_routing_cidr=None,
                  tcx=True, datapath_mode="veth")),
    ("1.18", dict(kpr=True, kpr_mode="true", socket_lb=False, socket_lb_hostns_only=False, session_affinity=True,
                  routing="native", tunnel_protocol=None, host_routing="legacy", masquerade="iptables",
                  lb_algorithm="random", endpoint_routes=False, ipam="kubernetes",
                  native_routing_cidr="10.0.0.0/16", tcx=True, datapath_mode="netkit")),
])
def test_settings_per_version(version, expected):
    got, s = _settings(version)
    assert got == expected
    assert s.source_of("kpr").file in ("cilium-status.txt", "k8s/cilium-config.yaml")


def test_status_wins_over_config_and_names_its_line():
    _, s = _settings("1.16")
    assert s.source_of("routing").file == "cilium-status.txt"
    assert s.source_of("routing").text.startswith("Routing:")
    assert s.source_of("tcx").text.startswith("Attach Mode:")            # status, not enable-tcx
    assert s.source_of("ipam").file == "k8s/cilium-config.yaml" and s.source_of("ipam").line == 11
    assert s.source_of("ipam").text.strip() == "ipam: cluster-pool"


def test_version_detection():
    assert detect_version("v1.16.8", "Cilium:   Ok   1.14.0 (v1.14.0-abc)") == CiliumVersion(1, 16, 8)
    assert detect_version(None, fx("1.14", "cilium-status.txt")[0]) == CiliumVersion(1, 14, 0)
    assert detect_version(None, fx("1.8", "cilium-status.txt")[0]) is None       # 1.8 prints "Ok OK"
    assert detect_version(None, None) is None
    with pytest.raises(InputError, match="cni_version"):
        detect_version("latest", None)


# ---- attachments ------------------------------------------------------------------------------

def test_tc_program_names_per_version():
    view = lambda progs: [(p.dev, p.hook, p.program) for p in progs]
    assert view(attach.parse_tc(*fx("1.8", "tc.txt"))) == [
        ("lxc00aa", "ingress", "from-container"), ("bond0", "ingress", "from-netdev"), ("bond0", "egress", "to-netdev")]
    v10 = attach.parse_tc(*fx("1.10", "tc.txt"))
    assert ("lxc050ba70e11a8", "egress", "to-container") in view(v10) and v10[0].prog_id == 2901
    assert ("cilium_host", "egress", "from-host") in view(v10)
    assert view(attach.parse_tc(*fx("1.14", "tc.txt")))[:3] == [
        ("lxc9c2e4a1b", "ingress", "from-container"), ("eth0", "ingress", "from-netdev"), ("eth0", "egress", "to-netdev")]
    assert attach.parse_tc(*fx("1.16", "tc.txt")) == []           # tcx: tc shows nothing
    v13 = attach.parse_tc("### tc filter show dev lxcab12 ingress\n"
                          "filter protocol all pref 1 bpf chain 0 handle 0x1 cilium-lxcab12 direct-action not_in_hw id 88 tag 1a2b jited\n"
                          "### tc filter show dev cilium_vxlan egress\n"
                          "filter protocol all pref 1 bpf chain 0 handle 0x1 cilium-vxlan direct-action not_in_hw id 90 tag 3c4d jited\n",
                          "tc.txt")
    assert view(v13) == [("lxcab12", "ingress", "from-container"), ("cilium_vxlan", "egress", "to-overlay")]


# as printed in cilium/cilium#17468 (1.10, trailing spaces kept) and #41393 (1.17: a foreign
# flower filter beside Cilium's tcx programs)
def test_tc_and_bpftool_lines_from_github_threads():
    tc = attach.parse_tc(
        "### tc filter show dev lxc5869b5857a3d ingress\n"
        "filter protocol all pref 1 bpf chain 0 \n"
        "filter protocol all pref 1 bpf chain 0 handle 0x1 bpf_lxc.o:[from-container] direct-action not_in_hw id 15843 tag a7a920f725fab0ef jited \n"
        "### tc filter show dev lxc5869b5857a3d egress\n"
        "### tc filter show dev lan ingress\n"
        "filter parent ffff: protocol ip pref 49152 flower chain 0\n"
        "filter parent ffff: protocol ip pref 49152 flower chain 0 handle 0x1\n"
        "  src_mac 00:11:22:33:44:55\n"
        "  not_in_hw\n", "tc.txt")
    assert [(p.dev, p.hook, p.program, p.prog_id, p.tag) for p in tc] == [
        ("lxc5869b5857a3d", "ingress", "from-container", 15843, "a7a920f725fab0ef")]
    net = attach.parse_bpftool_net(
        "xdp:\n\ntc:\ncilium_net(2) clsact/ingress bpf_host_cilium_net.o:[to-host] id 15871\n"
        "lan(2) tcx/ingress cil_from_netdev prog_id 680 link_id 12\n"
        "lan(2) tcx/egress cil_to_netdev prog_id 688 link_id 15\n", "bpftool-net.txt")
    assert [(p.dev, p.hook, p.program, p.attach, p.prog_id) for p in net] == [
        ("cilium_net", "ingress", "to-host", "tc", 15871), ("lan", "ingress", "from-netdev", "tcx", 680),
        ("lan", "egress", "to-netdev", "tcx", 688)]


def test_bpftool_tcx_and_netkit():
    v16 = attach.parse_bpftool_net(*fx("1.16", "bpftool-net.txt"))
    assert [(p.dev, p.hook, p.program, p.attach) for p in v16 if p.dev in ("eth0", "cilium_vxlan", "lxc9c2e4a1b")] == [
        ("cilium_vxlan", "ingress", "from-overlay", "tcx"), ("cilium_vxlan", "egress", "to-overlay", "tcx"),
        ("eth0", "ingress", "from-netdev", "tcx"), ("eth0", "egress", "to-netdev", "tcx"),
        ("lxc9c2e4a1b", "ingress", "from-container", "tcx")]
    v18 = attach.parse_bpftool_net(*fx("1.18", "bpftool-net.txt"))
    assert [(p.hook, p.program, p.attach, p.prog_id) for p in v18 if p.dev.startswith("lxc")] == [
        ("peer", "from-container", "netkit", 2230), ("primary", "to-container", "netkit", 2236)]


# ---- the loader -------------------------------------------------------------------------------

def test_load_node_reads_lazily_prefers_json_and_names_bundle_paths():
    calls = []
    d = FIX / "1.18"

    def reader(path):
        calls.append(path)
        local = d / path.removeprefix("nodes/n1/")
        return local.read_text() if local.exists() else None

    node = load_node(reader, "v1.18.1", node_dir="nodes/n1/")
    assert calls == []                                   # nothing read before it is asked for
    fronts = node.db_frontends
    assert node.path_of("db_frontends") == "nodes/n1/cilium-db-frontends.json"
    assert all(s.truncated == 0 for s in fronts) and fronts[0].source.file == "nodes/n1/cilium-db-frontends.json"
    assert node.tunnels is None and node.nat is None     # absent files are None, not []
    assert node.lb_services[0].source.file == "nodes/n1/cilium-bpf-lb-list.json"
    assert node.version == CiliumVersion(1, 18, 1)
    assert set(node.parse_all()) >= {"lb_services", "db_frontends", "ipcache", "policy", "status", "bpftool_net"}


def test_load_node_from_a_mapping_and_the_compat_names():
    files = {"cilium-bpf-lb-list.txt": fx("1.14", "cilium-bpf-lb-list.txt")[0],
             "cilium-status.txt": fx("1.14", "cilium-status.txt")[0]}
    node = load_node(files)
    assert node.version == CiliumVersion(1, 14, 0) and len(node.lb_services) == 5
    assert node.settings.host_routing == "bpf" and node.settings.routing is None
    assert C.PARSERS["cilium-bpf-lb-list.txt"] is lb.parse_lb_list
    with pytest.raises(InputError, match="cni_version"):
        load_node(files, "not-a-version")


def test_manifest_and_agent_versions_must_agree():
    files = {"cilium-status.txt": fx("1.14", "cilium-status.txt")[0]}
    assert load_node(files, "v1.14.3").version == CiliumVersion(1, 14, 3)
    with pytest.raises(InputError, match="manifest says Cilium 1.16.0 but the agent reports 1.14.0") as err:
        load_node(files, "1.16").version
    assert err.value.file == "cilium-status.txt" and err.value.line == 7


def test_slots_whose_backend_is_missing_are_kept_apart():
    text = ("SERVICE ADDRESS           BACKEND ADDRESS (REVNAT_ID) (SLOT)\n"
            "10.96.0.10:53/UDP (0)     0.0.0.0:0 (2) (0) [ClusterIP, non-routable]\n"
            "10.96.0.10:53/UDP (2)     backend 17 not found\n"
            "10.96.0.10:53/UDP (1)     10.0.1.53:53/UDP (2) (1)\n")
    (svc,) = lb.parse_lb_list(text, "x")
    assert svc.missing == ((2, 17),) and [b.slot for b in svc.backends] == [1]
    old = ("SERVICE ADDRESS     BACKEND ADDRESS (REVNAT_ID) (SLOT)\n"
           "10.96.0.10:53       0.0.0.0:0 (2) (0) [ClusterIP]\n"
           "                    backend 17 not found\n")
    assert lb.parse_lb_list(old, "x")[0].missing == ((None, 17),)


# ---- bad input: always a located error --------------------------------------------------------

def _strict_policy(text, path):
    """`bpf policy get` keeps an unreadable row aside (issue 22: it makes only its endpoint's
    verdicts unknown, test_cilium_policy_rows.py); strict() refuses it, located."""
    return policy.strict(policy.parse_policy_get(text, path))


LB_HEAD = "SERVICE ADDRESS        BACKEND ADDRESS (REVNAT_ID) (SLOT)\n"


@pytest.mark.parametrize("parser, text, line, match", [
    (lb.parse_lb_list, "SERVICE   BACKEND\n10.0.0.1:80 (0)  0.0.0.0:0 (1) (0) [ClusterIP]\n", 1, "header"),
    (lb.parse_lb_list, LB_HEAD + "10.96.0.10:53 (0) nonsense\n", 2, "neither"),
    (lb.parse_lb_list, LB_HEAD + "    10.0.1.5:53 (2) (1)\n", 2, "continuation"),
    (lb.parse_lb_list, LB_HEAD + "10.96.0.10:53/UDP (1)  10.0.1.5:53/UDP (2) (1)\n", 2, "no slot-0"),
    (lb.parse_lb_list, LB_HEAD + "10.96.0.10:53 (0)  0.0.0.0:0 (2) (0) [ClusterIP]\n"
                                 "10.96.0.10:53 (1)  10.0.1.5:53 (2) (1)\n10.96.0.10:53 (1)  10.0.2.5:53 (2) (1)\n",
     4, "appears twice"),
    (lb.parse_lb_list, LB_HEAD + "10.96.0.10:53 (2)  10.0.1.5:53 (2) (1)\n", 2, "slot 2 in the key"),
    (lb.parse_lb_list, LB_HEAD + "10.96.0.10:53/XYZ (0)  0.0.0.0:0 (2) (0) [ClusterIP]\n", 2, "protocol"),
    (lb.parse_service_list, "ID   Frontend   Service Type   Backend\ngarbage here\n", 2, "not a"),
    (lb.parse_service_list, "ID   Frontend   Service Type   Backend\n1  10.0.0.1:80/TCP  Gateway\n", 2, "service type"),
    (lb.parse_service_list, "ID   Frontend   Service Type   Backend\n1  10.0.0.1:80/TCP  ClusterIP  1 -> 10.0.0.2:80\n", 2, "backend"),
    (lb.parse_db_frontends, "Address   Typ   ServiceName   Backends\n", 1, "header"),
    (lb.parse_db_frontends, "Address             Type        ServiceName   Backends\n"
                            "10.96.0.1:443/TCP   ClusterIP   default/k     10.0.0.1:6443/TCP, garbage\n", 2, "ADDRESS"),
    (lb.parse_maglev_list, "SVC ID   LOOKUP TABLE\n[4]/v4   1 2 3\n", 2, "not a"),
    (maps.parse_ipcache, "IP PREFIX/ADDRESS   IDENTITY\n10.0.0.0/8  notidentity=3\n", 2, "not a"),
    (maps.parse_ipcache, "IP PREFIX/ADDRESS   IDENTITY\n10.0.0.0/8  identity=3 color=blue\n", 2, "unknown field"),
    (maps.parse_ipcache, "10.0.0.0/8  identity=3\n", 1, "header"),
    (maps.parse_ipcache, "IP PREFIX/ADDRESS   IDENTITY\n10.0.0.0/8  identity=3 encryptkey=0   sync\n", 2, "after the value"),
    (maps.parse_ipmasq_list, "IP PREFIX/ADDRESS\n10.0.0.0\n", 2, "not a"),
    (maps.parse_endpoint_list, "ENDPOINT  POLICY\n12  Enabled  Disabled  300  k8s:a=b  10.0.0.1  sleeping\n", 2, "status"),
    (maps.parse_bpf_endpoint_list, "IP ADDRESS   LOCAL ENDPOINT INFO\n10.0.0.1:0   id=1 color=red\n", 2, "not a"),
    (maps.parse_identity_list, "ID   LABELS\nfoo bar baz\n", 2, "not a"),
    (maps.parse_tunnel_list, "TUNNEL   VALUE\n10.0.2.0:0\n", 2, "not a"),
    (_strict_policy, "DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   COLOR\n", 1, "not a"),
    (_strict_policy, "DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   BYTES   PACKETS\n"
                              "Sideways    0          ANY          NONE         0       0\n", 2, "direction"),
    (_strict_policy, "DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   BYTES   PACKETS\n"
                              "Ingress     0          ANY          NONE         0\n", 2, "cells"),
    (_strict_policy, "Ingress     0          ANY          NONE         0       0\n", 1, "header"),
    (conntrack.parse_ct_list, "TCP OUT 10.0.0.1:1 -> 10.0.0.2:2 expires=5 RevNAT=1 junk\n", 1, "name=value"),
    (conntrack.parse_ct_list, "TCP OUT 10.0.0.1:1 -> 10.0.0.2:2 RevNAT=1\n", 1, "expires"),
    (conntrack.parse_nat_list, "TCP OUT 10.0.0.1:1 -> 10.0.0.2:2 XLATE_SRC 10.0.0.9:1 garbage\n", 1, "not a"),
    (attach.parse_tc, "filter protocol all pref 1 bpf\n", 1, "before the first"),
    (attach.parse_tc, "### tc filter show dev eth0 ingress\nfilter protocol all pref 1 bpf chain 0 handle 0x1 "
                      "my_prog direct-action not_in_hw id 3\n", 2, "my_prog"),
    (attach.parse_bpftool_net, "tc:\neth0(2) tcx/ingress some_other_prog prog_id 4 link_id 5\n", 2, "some_other_prog"),
    (S.parse_status, "KubeProxyReplacement:   Sometimes\n", 1, "Sometimes"),
    (S.parse_status, "Routing:   Network: Carrier-Pigeon   Host: BPF\n", 1, "routing"),
])
def test_bad_input_is_a_located_error(parser, text, line, match):
    with pytest.raises(InputError, match=match) as err:
        parser(text, "nodes/n1/cilium-x.txt")
    assert err.value.file == "nodes/n1/cilium-x.txt" and err.value.line == line
    assert err.value.text == text.splitlines()[line - 1]


@pytest.mark.parametrize("parser", [lb.parse_lb_list, maps.parse_ipcache, policy.parse_policy_get,
                                    conntrack.parse_nat_list, attach.parse_tc])
def test_an_overlong_line_is_refused_before_any_pattern_runs(parser):
    text = "\n" + "10.0.0.0/8  identity=3 a=" + "x " * 20000 + "\n"
    with pytest.raises(InputError, match="longer than") as err:
        parser(text, "nodes/n1/x.txt")
    assert (err.value.file, err.value.line) == ("nodes/n1/x.txt", 2) and len(err.value.text) < 300


@pytest.mark.parametrize("parser, text, match", [
    (lb.parse_lb_list, '["not", "a", "map"]', "list of entry strings"),
    (lb.parse_lb_list, '{"10.0.0.1:80 (0)": ["0.0.0.0:0 (1) (0) [ClusterIP]"],', "not valid JSON"),
    (lb.parse_service_list, '[{"spec": {"id": 1}}]', "service 1"),
    (lb.parse_db_frontends, '{"Address": {"AddrCluster": "10.0.0.1", "Port": 80, "Protocol": "TCP", "Scope": 0},'
                            ' "Type": "ClusterIP", "ServiceName": "a/b"}', "Backends"),
    (maps.parse_ipcache, '{"10.0.0.0/8": ["identity=x"]}', "not a number"),
    (policy.parse_policy_get, '[{"EndpointID": "1"}]', "JSON form"),
    (S.parse_status, "Hello:  world\n", "not `cilium status`"),
    (lb.parse_lb_list, "[" * 100000, "nested too deeply"),
    (lb.parse_db_frontends, '{"a":' * 100000, "nested too deeply"),
    (maps.parse_ipmasq_list, '[{"IP": "10.0.0.0", "Mask": "/wD/AA=="}]', "not a prefix"),
])
def test_bad_json_and_unknown_documents_name_the_file(parser, text, match):
    with pytest.raises(InputError, match=match) as err:
        parser(text, "nodes/n1/x.json")
    assert err.value.file == "nodes/n1/x.json"


@pytest.mark.parametrize("text, line, match", [
    ("data:\n  routing-mode: sideways\n", 2, "routing-mode"),
    ("data:\n  enable-bpf-masquerade: maybe\n", 2, "true/false"),
    ("data:\n  kube-proxy-replacement: sometimes\n", 2, "kube-proxy-replacement"),
    ("data:\n  tunnel-protocol: gre\n", 2, "tunnel-protocol"),
    ("data: [1, 2\n", 2, "YAML"),
])
def test_bad_config_values_name_the_key_line(text, line, match):
    with pytest.raises(InputError, match=match) as err:
        S.merge_settings(None, S.parse_config(text, "k8s/cilium-config.yaml"))
    assert err.value.file == "k8s/cilium-config.yaml" and err.value.line == line
