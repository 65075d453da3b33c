"""The component commands on any bundle: nf-trace dispatches on the node's kube-proxy mode and
rule files (iptables, nftables, IPVS with its ipsets and iptables rules); nf-trace and route-get
do not need a CNI traceflow models; marks are read in decimal or hex.

The three kube-proxy example bundles describe one cluster (tools/generate_kube_proxy.py),
so for a sample of service ports on every node, nf-trace must find the
same verdict and endpoints in each. Where IPVS balances is the one documented difference: the
kernel's IPVS schedules a new connection at LOCAL_IN (net/netfilter/ipvs/ip_vs_core.c,
ip_vs_ops4), after routing to the virtual address that kube-ipvs0 holds, so an nf-trace at
PREROUTING follows the packet to INPUT and IPVS, and at INPUT IPVS gives the endpoints that
iptables/nftables mode gives at PREROUTING; a Service without endpoints is rejected there by
IPVS ("no destination available"), where the other modes reject it in FORWARD.
"""

from __future__ import annotations

import json
import os
import random
import sys
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))   # not installed
import generate_kube_proxy as gen  # noqa: E402
from traceflow.bundle.reader import Bundle
from traceflow.cli.app import app
from traceflow.questions.components import nf_component_trace
from traceflow.bundle.snapshot import Snapshot
from traceflow.cni import open_snapshot

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
CLIENT = "192.168.50.7"
PER_NODE = int(os.environ.get("TRACEFLOW_NF_SAMPLE", "4"))   # per node; more via env
runner = CliRunner()


@cache
def snap(mode: str) -> Snapshot:
    return open_snapshot(Bundle.open(EXAMPLES / f"kube-proxy-{mode}"))


def sample() -> list:
    """Per node: PER_NODE service ports with endpoints and as many without, seeded."""
    cluster = gen.build_cluster()
    out = []
    for node in cluster.nodes:
        views = sorted((v for v in gen.port_views(cluster, node.name)
                        if not v.svc.affinity_timeout), key=lambda v: v.name + v.proto)
        with_eps = [v for v in views if v.has_endpoints]
        out += [(node.name, v) for v in random.Random(f"nf/{node.name}").sample(with_eps, PER_NODE)]
        out += [(node.name, v) for v in [v for v in views if not v.has_endpoints][:PER_NODE]]
    return out


def outcome(mode: str, node: str, view, hook: str) -> tuple:
    t = nf_component_trace(snap(mode), node, hook, CLIENT, view.svc.cluster_ip,
                           view.proto.lower(), 41000, view.port.port, None, None, 0)
    return t.verdict.value, tuple(sorted((p.endpoint, round(p.weight, 6)) for p in t.paths))


def expected_endpoints(view) -> set:
    return {f"{ep.ip}:{view.port.target_port}" for ep in view.cluster_endpoints}


CASES = sample()


@pytest.mark.parametrize("node,view", CASES, ids=[f"{n}-{v.name}-{v.proto}" for n, v in CASES])
def test_nf_trace_same_answer_in_every_kube_proxy_mode(node, view):
    ipt = {h: outcome("iptables", node, view, h) for h in
           ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")}
    if view.has_endpoints:   # the seeded cluster's own answer, not the code's
        assert ipt["PREROUTING"][0] == "delivered"
        assert {e for e, _ in ipt["PREROUTING"][1]} == expected_endpoints(view)
    else:
        assert ipt["PREROUTING"][1] == ((None, 1.0),) and ipt["FORWARD"][0] == "dropped"
    for hook, want in ipt.items():
        got = outcome("nftables", node, view, hook)
        if hook == "INPUT" and not view.has_endpoints:
            # kube-proxy's own difference: nftables mode checks no-endpoint services in
            # filter-input too (endpoints-check), iptables mode only in FORWARD and OUTPUT
            assert got[0] == "dropped"
            continue
        assert got == want, hook
    ipvs = {h: outcome("ipvs", node, view, h) for h in ipt}
    assert ipvs["OUTPUT"] == ipt["OUTPUT"] and ipvs["POSTROUTING"] == ipt["POSTROUTING"]
    if view.has_endpoints:
        assert ipvs["PREROUTING"] == ipt["PREROUTING"]
        assert ipvs["INPUT"] == ipt["PREROUTING"]     # IPVS balances at LOCAL_IN
        assert ipvs["FORWARD"] == ipt["FORWARD"]
    else:                                             # rejected by IPVS, not by FORWARD
        assert ipvs["PREROUTING"][0] == ipvs["INPUT"][0] == "dropped"


def test_service_without_endpoints_at_forward_is_rejected_in_nftables_mode():
    cluster = gen.build_cluster()
    node = cluster.nodes[0].name
    view = next(v for v in gen.port_views(cluster, node) if not v.has_endpoints)
    t = nf_component_trace(snap("nftables"), node, "FORWARD", CLIENT, view.svc.cluster_ip,
                           view.proto.lower(), 41000, view.port.port, None, None, 0)
    (path,) = t.paths
    assert path.verdict.value == "dropped" and path.legs[0].hops
    assert all(h.component == "nft" for h in path.legs[0].hops)
    assert "reject" in path.drop.reason.lower()


def test_nf_trace_ipvs_shows_the_balancing_step():
    cluster = gen.build_cluster()
    node = cluster.nodes[0].name
    view = next(v for v in gen.port_views(cluster, node)
                if len(v.cluster_endpoints) > 1 and not v.svc.affinity_timeout)
    t = nf_component_trace(snap("ipvs"), node, "PREROUTING", CLIENT, view.svc.cluster_ip,
                           view.proto.lower(), 41000, view.port.port, None, None, 0)
    assert len(t.paths) == len(view.cluster_endpoints)
    for path in t.paths:
        comps = [h.component for h in path.legs[0].hops]
        assert comps[-1] == "ipvs" and "iptables" in comps
        assert any("kube-ipvs0" in n for h in path.legs[0].hops for n in h.notes)


IPTABLES = """\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 10.244.2.7:53
COMMIT
"""


def small_bundle(tmp_path: Path, cni: str | None) -> Path:
    """One node's routes and rules, with the manifest's cni set (or left out)."""
    root = tmp_path / "b"
    node = root / "nodes" / "n1"
    node.mkdir(parents=True)
    (root / "manifest.yaml").write_text(
        'format: traceflow-bundle/v1\ncluster: t\ncollected_at: "2026-11-22T10:00:00Z"\n'
        + (f"cni: {cni}\n" if cni else ""))
    (node / "ip-route.txt").write_text(
        "default via 192.168.10.1 dev ens192\n"
        "192.168.10.0/24 dev ens192 proto kernel scope link src 192.168.10.11\n")
    (node / "iptables-save.txt").write_text(IPTABLES)
    return root


@pytest.mark.parametrize("cni", ["cilium", None])
def test_route_get_and_nf_trace_need_no_cni(tmp_path, cni):
    bundle = small_bundle(tmp_path, cni)
    r = runner.invoke(app, ["route-get", "n1", "10.244.2.5", "--bundle", str(bundle),
                            "-o", "json"])
    # a bundle reader that wants the manifest's cni key for component commands is the
    # regression this test is for: it fails, it does not skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["paths"][0]["endpoint"] == "ens192"
    r = runner.invoke(app, ["nf-trace", "n1", "--src", CLIENT, "--dst", "10.96.0.10",
                            "--dport", "53", "--bundle", str(bundle), "-o", "json"])
    assert r.exit_code == 0, r.output
    assert [p["endpoint"] for p in json.loads(r.stdout)["paths"]] == ["10.244.2.7:53"]


def test_end_to_end_commands_still_say_which_cni_they_need(tmp_path):
    bundle = small_bundle(tmp_path, None)
    r = runner.invoke(app, ["pod-to-pod", "a/b", "c/d", "--bundle", str(bundle)])
    said = r.stderr.lower()
    assert r.exit_code == 2, r.stderr
    for cni in ("antrea", "cilium", "flannel", "calico", "aws vpc cni", "azure cni"):
        assert cni in said, r.stderr


def test_mark_in_hex_or_decimal(tmp_path):
    bundle = small_bundle(tmp_path, "antrea")
    rules = bundle / "nodes/n1/ip-rule.txt"
    rules.write_text("0:\tfrom all lookup local\n100:\tfrom all fwmark 0x10 lookup 77\n"
                     "32766:\tfrom all lookup main\n32767:\tfrom all lookup default\n")
    routes = bundle / "nodes/n1/ip-route.txt"
    routes.write_text(routes.read_text() + "blackhole 10.244.2.0/24 table 77\n")
    got = {}
    for mark in ("0x10", "16", "0"):
        r = runner.invoke(app, ["route-get", "n1", "10.244.2.5", "--mark", mark,
                                "--bundle", str(bundle), "-o", "json"])
        assert r.exit_code in (0, 1), r.output
        got[mark] = json.loads(r.stdout)["paths"][0]["verdict"]
    assert got == {"0x10": "dropped", "16": "dropped", "0": "delivered"}
    r = runner.invoke(app, ["route-get", "n1", "10.244.2.5", "--mark", "0xzz",
                            "--bundle", str(bundle)])
    assert r.exit_code == 2 and "--mark" in r.stderr and "0xzz" in r.stderr


def test_nf_trace_without_rules_names_the_files_it_needs(tmp_path):
    bundle = small_bundle(tmp_path, "cilium")
    (bundle / "nodes/n1/iptables-save.txt").unlink()
    r = runner.invoke(app, ["nf-trace", "n1", "--src", CLIENT, "--dst", "10.96.0.10",
                            "--bundle", str(bundle)])
    assert r.exit_code == 2
    assert "nft.txt" in r.stderr and "iptables-save.txt" in r.stderr and "n1" in r.stderr


def test_ovs_trace_bad_ct_next_is_refused(tmp_path):
    from traceflow.cli.app import example_path
    r = runner.invoke(app, ["ovs-trace", "worker1", "in_port=1,ip", "--ct-next", "trk,bogus",
                            "--bundle", str(example_path())])
    assert r.exit_code == 2 and "--ct-next" in r.stderr and "bogus" in r.stderr
