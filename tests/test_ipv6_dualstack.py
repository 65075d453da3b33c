"""IPv6 and dual-stack questions on the dual-stack kube-proxy example (and copies of it
changed one fact at a time): the family from the addresses given or from -4/-6, --family both
side by side, both legs of every IPv6 walk carrying IPv6 headers, a planted IPv6-only fault
named in the comparison, and IPv6 that a datapath does not model said as unknown, never
answered as IPv4.

The kernel comparisons of the same rules are tests/test_ipv6_kernel.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.bundle.reader import Bundle
from traceflow.cli.app import app
from traceflow.cni import open_snapshot
from traceflow.model.packet import Packet

ROOT = Path(__file__).resolve().parents[1]
DUAL = ROOT / "traceflow" / "examples" / "kube-proxy-dualstack"
runner = CliRunner()
CHECKOUT6 = "fd00:10:96::5:47e9"          # shop/checkout's IPv6 cluster IP
CHECKOUT4 = "10.101.71.233"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def trace(*args, bundle=DUAL, code=(0, 1)) -> dict:
    r = invoke("trace", *args, "--bundle", bundle, "-o", "json")
    assert r.exit_code in code, r.output
    return json.loads(r.stdout)


def refused(*args, bundle=DUAL) -> str:
    r = invoke(*args, "--bundle", bundle)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    return " ".join(r.stderr.split())


def every_hop(doc: dict) -> list:
    return [h for p in doc["paths"] for leg in p["legs"] for h in leg["hops"]]


# ---- the packet model --------------------------------------------------------------------------

def test_ipv4_headers_are_unchanged_and_ipv6_headers_add_the_flow_label():
    v4 = Packet(nw_src="10.0.0.1", nw_dst="10.0.0.2", nw_proto=6, tp_src=1, tp_dst=80)
    assert list(v4.headers()) == ["dl_src", "dl_dst", "nw_src", "nw_dst", "nw_proto", "tp_src",
                                  "tp_dst", "nw_ttl", "mark"]
    assert v4.family == 4 and v4.dl_type == 0x0800
    v6 = Packet(nw_src="fd00::1", nw_dst="fd00::2", nw_proto=58, tp_src=135, tp_dst=0,
                nd_target="fd00::2", ipv6_label=0x12345)
    assert v6.family == 6 and v6.dl_type == 0x86DD
    assert v6.headers()["ipv6_label"] == 0x12345 and v6.headers()["nd_target"] == "fd00::2"
    echo = Packet(nw_src="fd00::1", nw_dst="fd00::2", nw_proto=58, tp_src=128, tp_dst=0)
    reply = echo.reversed()
    assert (reply.nw_src, reply.tp_src, reply.tp_dst, reply.family) == ("fd00::2", 129, 0, 6)


# ---- dual-stack objects ----------------------------------------------------------------------

def test_dual_stack_objects_are_found_by_either_address():
    c = open_snapshot(Bundle.open(DUAL)).cluster
    checkout = c.service_at(CHECKOUT6)
    assert checkout is not None and checkout.key == "shop/checkout"
    assert checkout.families == (4, 6) and checkout.address(4) == CHECKOUT4
    assert c.service_at("fd00:10:96::4:ba68").families == (6,)      # logging/syslog
    pod = next(p for p in c.pods if p.namespace == "shop" and p.name.startswith("checkout-"))
    assert pod.address(6) and c.pod_by_ip(pod.address(6)) == pod
    assert c.node_by_ip("2001:db8:10::12").name == "node2"
    eps = c.endpoints_of("shop/checkout")
    assert {":" in a for a, _, _ in eps} == {True, False}
    assert all(":" in a for a, _, _ in c.endpoints_of("shop/checkout", 6))


# ---- the family of a question ------------------------------------------------------------------

def test_the_family_comes_from_the_addresses_or_from_4_and_6():
    v4 = trace("node/node2", "svc/shop/checkout")
    assert v4["query"]["dst_ip"] == CHECKOUT4 and "family" not in v4["query"]
    v6 = trace("node/node2", "svc/shop/checkout", "-6")
    assert v6["query"]["dst_ip"] == CHECKOUT6 and v6["query"]["family"] == "ipv6"
    assert v6["query"]["source_endpoint"]["address"] == "2001:db8:10::12"
    typed = trace("node/node2", f"[{CHECKOUT6}]:8080")
    assert typed["query"]["dst_ip"] == CHECKOUT6


def test_an_ipv6_walk_shows_ipv6_headers_on_every_hop_request_and_reply():
    doc = trace("node/node2", "svc/shop/checkout", "-6", code=(0,))
    assert doc["verdict"] == "delivered" and len(doc["paths"]) == 3
    for path in doc["paths"]:
        assert [leg["direction"] for leg in path["legs"]][:1] == ["request"]
        assert any(leg["direction"] == "reply" for leg in path["legs"])
        for leg in path["legs"]:
            shown = [h["packet"] for h in leg["hops"] if h.get("packet")]
            assert shown
            for pkt in shown:
                assert ":" in pkt["nw_src"] and ":" in pkt["nw_dst"] and "ipv6_label" in pkt
    # the IPv6 rules decided, with their file and line
    assert any(h["source"] and h["source"]["file"].endswith("ip6tables-save.txt")
               for h in every_hop(doc))


def test_family_both_walks_both_and_says_they_agree():
    r = invoke("trace", "node/node2", "svc/shop/checkout", "--family", "both", "--bundle", DUAL)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("families: IPv4 delivered, IPv6 delivered")
    assert "=== IPv4 ===" in r.stdout and "=== IPv6 ===" in r.stdout
    doc = json.loads(invoke("trace", "node/node2", "svc/shop/checkout", "--family", "both",
                            "--bundle", DUAL, "-o", "json").stdout)
    assert doc["family"] == "both" and set(doc["traces"]) == {"ipv4", "ipv6"}
    assert doc["traces"]["ipv6"]["query"]["dst_ip"] == CHECKOUT6


def _planted(tmp_path: Path, node: str, file: str, drop_line) -> Path:
    copy = tmp_path / "planted"
    shutil.copytree(DUAL, copy)
    path = copy / "nodes" / node / file
    lines = path.read_text().splitlines(keepends=True)
    kept = [l for l in lines if not drop_line(l)]
    assert len(kept) == len(lines) - 1
    path.write_text("".join(kept))
    return copy


def test_a_missing_ipv6_route_shows_as_ipv4_delivered_ipv6_dropped(tmp_path):
    bundle = _planted(tmp_path, "node2", "ip-route.txt",
                      lambda l: l.startswith("fd00:10:244:1::/64 via"))
    r = invoke("trace", "node/node2", "svc/shop/checkout", "--family", "both", "--bundle",
               bundle)
    assert r.exit_code == 1, r.output
    text = " ".join(r.stdout.split())
    assert text.startswith("families: IPv4 delivered, IPv6 partial: 2 of 3 paths delivered, "
                           "path 1 dropped at 1.14 node2 route main"), text[:200]
    assert "fd00:10:244:1::/64 through the Antrea gateway is missing" in " ".join(r.stdout.split())


def test_a_missing_ip6tables_rule_shows_as_ipv6_dropped(tmp_path):
    """node1's ip6tables lose the jump to the nodeports chain: an IPv6 client of the NodePort
    is not translated (its packet goes up to node1's own sockets), IPv4's still is."""
    bundle = _planted(tmp_path, "node1", "ip6tables-save.txt",
                      lambda l: l.startswith("-A KUBE-SERVICES ! -d ::1/128"))
    v6 = trace("2001:db8:77::100", "[2001:db8:10::11]:31901", bundle=bundle)
    assert v6["verdict"] != "delivered"
    assert not any("nw_dst" in h["changed"] for h in every_hop(v6))      # no DNAT
    v4 = trace("203.0.113.7", "192.168.10.11:31901", bundle=bundle, code=(0,))
    assert v4["verdict"] == "delivered"


def test_without_ip6tables_save_an_ipv6_trace_is_unknown_not_an_ipv4_answer(tmp_path):
    copy = tmp_path / "no-ip6tables"
    shutil.copytree(DUAL, copy)
    (copy / "nodes" / "node2" / "ip6tables-save.txt").unlink()
    doc = trace("node/node2", "svc/shop/checkout", "-6", bundle=copy)
    assert doc["verdict"] == "unknown"
    assert "needs nodes/node2/ip6tables-save.txt" in doc["paths"][0]["drop"]["reason"]
    assert trace("node/node2", "svc/shop/checkout", "-4", bundle=copy,
                 code=(0,))["verdict"] == "delivered"


@pytest.mark.parametrize("args,needle", [
    (("trace", "node/node1", "svc/kube-system/metrics-server", "-6"),
     "Service kube-system/metrics-server has no IPv6 cluster IP (ipFamilies: IPv4)"),
    (("trace", "2001:db8:77::100", "192.168.10.11:31901"),
     "the source is IPv6 and the destination IPv4"),
    (("trace", "node/node1", f"[{CHECKOUT6}]:8080", "-4"), "asks for IPv4"),
    (("trace", "node/node1", "svc/shop/checkout", "-4", "--family", "6"),
     "ask for different families"),
    (("trace", "node/node1", "svc/shop/checkout", "--family", "7"), "give 4, 6 or both"),
    (("trace", "node/node1", "svc/shop/checkout", "--family", "both", "--hop", "1.1"),
     "give -4 or -6 with it"),
])
def test_family_refusals_say_what_to_type(args, needle):
    assert needle in refused(*args)


# ---- a datapath that does not model IPv6 ------------------------------------------------------

def test_cilium_ipv6_is_unknown_with_the_reason():
    from traceflow.questions.solver import Query, Solver
    snap = open_snapshot(Bundle.open(ROOT / "traceflow" / "examples" / "cilium-vxlan-policy"))
    pod = next(p for p in snap.cluster.pods if p.phase == "Running" and not p.host_network)
    q = Query("pod-to-external", pod, "2001:db8::5", 443, "TCP", 54321, "2001:db8::5")
    t = Solver(snap).trace(q)
    assert [p.verdict.value for p in t.paths] == ["unknown"]
    # Cilium's IPv6 is walked now (tests/test_trace_cilium_ipv6.py); this single-stack pod has
    # no IPv6 address to send from, which is said, never answered as IPv4
    assert "has no IPv6 address" in t.paths[0].drop.reason
    # the IPv4 question on the same pod is walked
    q4 = Query("pod-to-external", pod, "1.1.1.1", 443, "TCP", 54321, "1.1.1.1")
    assert "IPv6" not in str(Solver(snap).trace(q4).paths[0].drop or "")


# ---- suites ask both families ------------------------------------------------------------------

def test_the_dual_stack_suite_asks_both_families():
    r = invoke("check", DUAL / "checks.yaml", "--bundle", DUAL, "-o", "json")
    assert r.exit_code == 1, r.output          # its last expectation fails on purpose
    doc = json.loads(r.stdout)
    results = doc["results"]
    both = [x for x in results if x["name"].startswith("a node reaches the checkout")]
    assert sorted(x["source"] for x in both) == ["node/node2 (IPv4)", "node/node2 (IPv6)"]
    assert [x["name"] for x in results if not x["passed"]] == [
        "(deliberately failing) the IPv6 NodePort is expected dropped"]


def test_a_bad_family_in_a_suite_names_its_line(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text("expectations:\n  - name: x\n    from: node/node1\n"
                     "    to: svc/shop/checkout:8080\n    family: 5\n    expect: delivered\n")
    err = refused("check", suite)
    assert "line 5" in err and "family" in err


def test_the_shipped_dual_stack_bundle_is_what_the_generator_writes(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import generate_kube_proxy as gen
    gen.write_dualstack(tmp_path)
    fresh = tmp_path / "kube-proxy-dualstack"
    names = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    shipped = sorted(p.relative_to(DUAL) for p in DUAL.rglob("*")
                     if p.is_file() and p.name != "checks.yaml")
    assert names == shipped
    for rel in names:
        assert (fresh / rel).read_bytes() == (DUAL / rel).read_bytes(), rel


def test_an_ndp_proxy_entry_is_where_an_outside_ipv6_packet_arrives(tmp_path):
    """node1 proxies neighbour discovery for the IPv6 LoadBalancer IP on genev_sys_6081 (an
    `ip -6 neigh ... proxy` entry): the outside client's packet arrives on that device, not on
    the interface holding node1's InternalIP."""
    copy = tmp_path / "ndp"
    shutil.copytree(DUAL, copy)
    neigh = copy / "nodes" / "node1" / "ip-neigh.txt"
    neigh.write_text(neigh.read_text() + "2001:db8:ff::1 dev genev_sys_6081 proxy\n")
    doc = trace("2001:db8:77::100", "[2001:db8:ff::1]:80", "--via", "node1", bundle=copy)
    entry = every_hop(doc)[0]
    assert entry["detail"] == "entry" and entry["table"] == "genev_sys_6081"
    plain = trace("2001:db8:77::100", "[2001:db8:ff::1]:80", "--via", "node1")
    assert every_hop(plain)[0]["table"] == "ens192"
