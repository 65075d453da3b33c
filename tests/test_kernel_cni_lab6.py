"""The real kernel as the oracle for the kernel datapath in IPv6 (Flannel dual-stack):
traceflow/examples/flannel-dualstack rebuilt as network namespaces by tests/kernel_cni_lab.py
(IPv6 addresses, `ip -6` routes, the IPv6 VXLAN device flannel-v6.1 over the nodes' IPv6
addresses, permanent IPv6 neighbours and FDB entries, ip6tables-restore), TCP SYNs sent with
scapy in both families from the client pod. Per connection the kernel's facts (the pod the SYN
reached with its addresses, the VXLAN outer headers of the SYN and of the answer on the
underlay, the answer's source) must be those of traceflow's path to that pod; a planted
difference (one node without its IPv6 route to another node's subnet) must be dropped by the
kernel in IPv6 only, and `--family both` must say so: "IPv4 delivered, IPv6 dropped at ...".
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kernel_cni_lab import CniLab, built_lab, path_facts, probe, trace_json, why_not
from test_kernel_cni_lab import assert_agree

EXAMPLE = Path(__file__).resolve().parents[1] / "traceflow" / "examples" / "flannel-dualstack"
SPORTS = list(range(42000, 42030))
CLIENT = "default/client-7d9c8b6f5-x2x8q"
REMOTE = "web-6b8f8d9c77-rjz2m"          # on k3s-agent-2, fd00:10:42:2::9 / 10.42.2.9


@pytest.fixture(scope="module")
def lab():
    yield from built_lab(EXAMPLE, ipv6=True)


def test_ipv6_pod_to_service_every_backend(lab, tmp_path):
    """IPv6 ClusterIP: kube-proxy's ip6tables DNAT to three backends, the local one over cni0,
    two over flannel-v6.1 (outer IPv6 node -> node, UDP 8472, VNI 1) both ways."""
    kernel = probe(lab, CLIENT, "fd00:10:43::78:f", 80, SPORTS, tmp_path)
    trace = trace_json(EXAMPLE, "pod-to-svc", CLIENT, "web", "--family", "6",
                       "--src-port", str(SPORTS[0]))
    reached = assert_agree(kernel, trace, client_sees=("fd00:10:43::78:f", 80))
    assert reached == {p["endpoint"] for p in trace["paths"]}, reached
    outers = {p["endpoint"]: path_facts(p)["legs"]["request"]["tunnels"] for p in trace["paths"]}
    assert outers == {
        "default/web-6b8f8d9c77-4kqzt": [],
        "default/web-6b8f8d9c77-9ftxr": [("2001:db8:122::10", "2001:db8:122::11", 8472, 1,
                                          "vxlan")],
        "default/web-6b8f8d9c77-rjz2m": [("2001:db8:122::10", "2001:db8:122::12", 8472, 1,
                                          "vxlan")]}


def test_both_families_pod_to_pod_across_nodes(lab, tmp_path):
    """The same pod in each family: IPv4 through flannel.1 with an IPv4 outer header, IPv6
    through flannel-v6.1 with an IPv6 one (never the other family's device)."""
    for dst, family, outer in (("10.42.2.9", "4", ("192.168.122.10", "192.168.122.12")),
                               ("fd00:10:42:2::9", "6", ("2001:db8:122::10",
                                                         "2001:db8:122::12"))):
        kernel = probe(lab, CLIENT, dst, 8080, SPORTS[:3], tmp_path)
        trace = trace_json(EXAMPLE, "pod-to-pod", CLIENT, REMOTE, "--port", "8080",
                           "--family", family)
        assert assert_agree(kernel, trace) == {f"default/{REMOTE}"}
        tunnels = path_facts(trace["paths"][0])["legs"]["request"]["tunnels"]
        assert tunnels == [(*outer, 8472, 1, "vxlan")], (family, tunnels)


def test_ipv6_pod_to_pod_on_the_bridge(lab, tmp_path):
    kernel = probe(lab, CLIENT, "fd00:10:42::6", 8080, SPORTS[:3], tmp_path)
    trace = trace_json(EXAMPLE, "pod-to-pod", CLIENT, "web-6b8f8d9c77-4kqzt", "--port", "8080",
                       "--family", "6")
    assert assert_agree(kernel, trace) == {"default/web-6b8f8d9c77-4kqzt"}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """flannel-dualstack with k3s-server's IPv6 route to k3s-agent-2's subnet removed (its
    IPv4 route kept): the IPv6 SYN then follows the IPv6 default route out of eth0."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    copy = tmp_path_factory.mktemp("planted") / "flannel-dualstack"
    shutil.copytree(EXAMPLE, copy)
    routes = copy / "nodes" / "k3s-server" / "ip-route.txt"
    lines = routes.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("fd00:10:42:2::/64 via")]
    assert len(kept) == len(lines) - 1
    routes.write_text("".join(kept))
    with CniLab(copy) as built:
        yield copy, built


def test_planted_missing_ipv6_route_dropped_in_ipv6_only(planted, tmp_path):
    bundle, built = planted
    v4 = probe(built, CLIENT, "10.42.2.9", 8080, SPORTS[:2], tmp_path)
    v6 = probe(built, CLIENT, "fd00:10:42:2::9", 8080, SPORTS[2:4], tmp_path)
    assert all(got["arrived"] for got in v4.values()), v4
    assert all(not got["arrived"] and not got["syn_outer"] for got in v6.values()), v6
    trace4 = trace_json(bundle, "pod-to-pod", CLIENT, REMOTE, "--port", "8080", "--family", "4")
    trace6 = trace_json(bundle, "pod-to-pod", CLIENT, REMOTE, "--port", "8080", "--family", "6")
    assert assert_agree(v4, trace4) == {f"default/{REMOTE}"}
    (path6,) = trace6["paths"]
    assert path6["verdict"] == "dropped" and path6["drop"]["node"] == "k3s-server", path6
    assert path6["disposition"] == "no-route", path6
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "traceflow", "pod-to-pod", CLIENT, REMOTE,
                           "--port", "8080", "--family", "both", "--bundle", str(bundle)],
                          capture_output=True, text=True, timeout=120)
    first = done.stdout.splitlines()[0]
    assert re.fullmatch(r"families: IPv4 delivered, IPv6 dropped at \d+\.\d+ k3s-server route",
                        first.strip()), done.stdout


# ---- Calico dual-stack: the host veth's link-local gateway, vxlan-v6.calico, ip6tables ------

CAL = Path(__file__).resolve().parents[1] / "traceflow" / "examples" / "calico-dualstack"
FRONTEND, BATCH = "shop/frontend-5d8f9b7c6-4xk2p", "shop/batch-7b9c5f6d8-q8w3z"


@pytest.fixture(scope="module")
def calico():
    yield from built_lab(CAL, ipv6=True)


def test_calico_ipv6_allowed_client_reaches_both_backends(calico, tmp_path):
    """frontend -> web over IPv6: the pod's default route via fe80::ecee:eeff:feee:eeee (the
    host veth answers the neighbour solicitation), /128 routes to cali veths, vxlan-v6.calico
    (outer IPv6, UDP 4789, VNI 4096) admitted by ip6tables' `Allow IPv6 VXLAN packets from
    allowed hosts` (cali60all-vxlan-net), the policy's cali60s: set."""
    kernel = probe(calico, FRONTEND, "fd00:10:96::78:f", 80, SPORTS, tmp_path)
    trace = trace_json(CAL, "pod-to-svc", FRONTEND, "web", "-n", "shop", "--family", "6",
                       "--src-port", str(SPORTS[0]))
    assert assert_agree(kernel, trace, client_sees=("fd00:10:96::78:f", 80)) == \
        {"shop/web-0", "shop/web-1"}
    tunnels = {p["endpoint"]: path_facts(p)["legs"]["request"]["tunnels"] for p in trace["paths"]}
    assert tunnels == {"shop/web-1": [],
                       "shop/web-0": [("2001:db8:56::11", "2001:db8:56::12", 4789, 4096,
                                       "vxlan")]}
    first = trace["paths"][0]["legs"][0]["hops"][0]
    assert first["rule"].startswith("default via fe80::ecee:eeff:feee:eeee dev eth0"), first
    assert first["packet"]["dl_dst"] == "ee:ee:ee:ee:ee:ee", first


def test_calico_ipv6_denied_client_dropped_by_the_policy(calico, tmp_path):
    """batch -> web-0 over IPv6: the SYN crosses vxlan-v6.calico, then cali-tw-* of worker-2's
    ip6tables drops it; the kernel answers nothing."""
    kernel = probe(calico, BATCH, "fd00:10:244:3::2", 8080, SPORTS[:3], tmp_path)
    trace = trace_json(CAL, "pod-to-pod", BATCH, "web-0", "-n", "shop", "--port", "8080",
                       "--family", "6")
    (path,) = trace["paths"]
    assert path["disposition"] == "dropped-policy" and path["drop"]["node"] == "worker-2"
    assert path["policies"] == ["shop/web-from-frontend"]
    for got in kernel.values():
        assert got["arrived"] == [] and got["answer"] is None, got
        assert got["syn_outer"] == path_facts(path)["legs"]["request"]["tunnels"] == \
            [("2001:db8:56::11", "2001:db8:56::12", 4789, 4096, "vxlan")]


@pytest.fixture(scope="module")
def calico_bgp(tmp_path_factory):
    """calico-dualstack with the IPv6 blocks of worker-1 and worker-2 routed to each other by
    BGP instead of VXLAN (``<block> via <node's IPv6 address> dev eth0 proto bird``, as bird6
    writes them): no overlay for IPv6 between those nodes."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    copy = tmp_path_factory.mktemp("bgp") / "calico-dualstack"
    shutil.copytree(CAL, copy)
    for node, block, peer in (("worker-1", "fd00:10:244:3::", "2001:db8:56::12"),
                              ("worker-2", "fd00:10:244:2::", "2001:db8:56::11")):
        routes = copy / "nodes" / node / "ip-route.txt"
        old = (f"{block}/122 via {block} dev vxlan-v6.calico proto 80 metric 1024 onlink "
               "pref medium")
        text = routes.read_text()
        assert old in text
        routes.write_text(text.replace(old, f"{block}/122 via {peer} dev eth0 proto bird "
                                            "metric 1024 pref medium"))
    with CniLab(copy) as built:
        yield copy, built


def test_calico_ipv6_bgp_routes_without_overlay(calico_bgp, tmp_path):
    bundle, built = calico_bgp
    kernel = probe(built, FRONTEND, "fd00:10:96::78:f", 80, SPORTS[:16], tmp_path)
    trace = trace_json(bundle, "pod-to-svc", FRONTEND, "web", "-n", "shop", "--family", "6",
                       "--src-port", str(SPORTS[0]))
    assert assert_agree(kernel, trace, client_sees=("fd00:10:96::78:f", 80)) == \
        {"shop/web-0", "shop/web-1"}
    for path in trace["paths"]:       # no tunnel on either leg: the underlay carries the pods'
        legs = path_facts(path)["legs"]
        assert legs["request"]["tunnels"] == legs["reply"]["tunnels"] == [], path["endpoint"]
