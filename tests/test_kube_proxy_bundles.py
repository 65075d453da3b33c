"""The generated kube-proxy example bundles: they parse, and traceflow reads kube-proxy's intent.

``tools/generate_kube_proxy.py`` renders one synthetic cluster as kube-proxy writes
it in iptables, nftables and IPVS mode. Here traceflow reads the shipped files and, for a
deterministic sample of 50 service ports on every node, must find exactly what the cluster
description says: every ready endpoint reachable with equal shares summing to 1, NodePorts with
externalTrafficPolicy Local going to local endpoints only (and dropped where there is none),
services without endpoints rejected in the filter table. The generator must be reproducible:
regenerating gives the shipped files byte for byte.
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))   # not installed
import generate_kube_proxy as gen  # noqa: E402
from traceflow.engines.netfilter import NodeContext, evaluate_hook, parse_iptables_save
from traceflow.engines.netfilter.ipset import parse_ipset_list
from traceflow.engines.netfilter.iptables import NotModelled, RuleSyntaxError
from traceflow.model.packet import PROTO_NUMBERS, Packet

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
BUNDLES = {mode: EXAMPLES / f"kube-proxy-{mode}" for mode in gen.MODES}
CLIENT = "192.168.50.7"                  # outside the cluster (not a node, not a pod)
SAMPLE = 50
TOLERANCE = 1e-6


@cache
def cluster() -> gen.Cluster:
    return gen.build_cluster()


@cache
def ruleset(mode: str, node: str):
    path = BUNDLES[mode] / "nodes" / node / "iptables-save.txt"
    return parse_iptables_save(path.read_text(), f"nodes/{node}/iptables-save.txt")


def node_context(node: gen.NodeSpec, **extra) -> NodeContext:
    return NodeContext(node=node.name, local_addresses={node.ip, node.gateway_ip, "127.0.0.1"},
                       in_iface="ens192", **extra)


def packet(dst: str, port: gen.Port, dport: int | None = None, src: str = CLIENT) -> Packet:
    proto = PROTO_NUMBERS[port.protocol.lower()]
    return Packet(nw_src=src, nw_dst=dst, nw_proto=proto, tp_src=41000,
                  tp_dst=port.port if dport is None else dport,
                  tcp_flags="syn" if proto == 6 else None)


def dnat_shares(branches) -> dict[tuple[str, int], float]:
    """DNAT target -> total weight, for the ACCEPTed branches that were translated."""
    shares: dict[tuple[str, int], float] = defaultdict(float)
    for b in branches:
        assert b.verdict == "ACCEPT", _explain(b)
        if b.nat is not None and b.nat.kind == "DNAT":
            shares[b.nat.translated] += b.weight
    return dict(shares)


def _explain(branch) -> str:
    return f"verdict {branch.verdict}:\n" + "\n".join(
        f"  {s.table}/{s.chain}: {s.effect}" for s in branch.steps)


def assert_equal_shares(shares: dict, expected: set, what: str) -> None:
    assert set(shares) == expected, f"{what}: DNAT targets {sorted(shares)} != {sorted(expected)}"
    assert abs(sum(shares.values()) - 1.0) < TOLERANCE, f"{what}: weights sum to {shares}"
    for target, weight in shares.items():
        assert abs(weight - 1.0 / len(expected)) < TOLERANCE, f"{what}: {target} gets {weight}"


def sampled_views() -> list[gen.PortView]:
    """50 service ports with ready endpoints per node (session affinity has its own test)."""
    out = []
    for node in cluster().nodes:
        views = [v for v in gen.port_views(cluster(), node.name)
                 if v.has_endpoints and not v.svc.affinity_timeout]
        views.sort(key=lambda v: v.name + v.proto)
        out += random.Random(f"sample/{node.name}").sample(views, SAMPLE)
    return out


# ---------------------------------------------------------------------------------------------
# The files


def test_generator_is_deterministic_and_shipped_bundles_are_current(tmp_path):
    gen.write_bundles(tmp_path)
    for mode, shipped in BUNDLES.items():
        fresh = tmp_path / f"kube-proxy-{mode}"
        names = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        # checks.yaml is the hand-written example suite beside the generated files
        shipped_names = sorted(p.relative_to(shipped) for p in shipped.rglob("*")
                               if p.is_file() and p.name != "checks.yaml")
        assert names == shipped_names, f"{mode}: file lists differ"
        for rel in names:
            assert (fresh / rel).read_bytes() == (shipped / rel).read_bytes(), (
                f"{shipped / rel} differs from what the generator writes now: run "
                "python tools/generate_kube_proxy.py traceflow/examples")


def test_cluster_has_every_kind_of_service():
    summary = gen._summary(cluster())
    assert 290 <= summary["services"] <= 310
    assert 35 <= summary["NodePort"] <= 45 and 8 <= summary["LoadBalancer"] <= 12
    for key in ("externalIPs", "externalTrafficPolicy Local", "sessionAffinity ClientIP",
                "without endpoints"):
        assert summary[key] >= 3, key
    assert any(len(s.ports) > 1 for s in cluster().services)
    assert any(p.protocol == "UDP" for s in cluster().services for p in s.ports)
    for node in cluster().nodes:   # comments on every rule: below the large-cluster threshold
        assert not gen.large_cluster_mode(gen.port_views(cluster(), node.name))


def test_manifests_say_how_the_bundle_was_made():
    import yaml
    for mode, root in BUNDLES.items():
        doc = yaml.safe_load((root / "manifest.yaml").read_text())
        assert doc["format"] == "traceflow-bundle/v1" and doc["kube_proxy"] == mode
        assert doc["cni"] in ("antrea", "cilium")
        assert "generate_kube_proxy" in doc["description"]


@pytest.mark.parametrize("mode", ["iptables", "ipvs"])
@pytest.mark.parametrize("node", [n.name for n in gen.NODES])
def test_iptables_save_parses_without_errors(mode, node):
    rs = ruleset(mode, node)
    assert not [d for d in rs.diagnostics if isinstance(d, RuleSyntaxError)]
    assert not [d for d in rs.diagnostics if isinstance(d, NotModelled)], rs.diagnostics[:5]


@pytest.mark.parametrize("node", [n.name for n in gen.NODES])
def test_iptables_save_parses_with_zero_diagnostics(node):
    assert ruleset("iptables", node).diagnostics == []


@pytest.mark.parametrize("node", [n.name for n in gen.NODES])
def test_nft_and_host_files_parse(node):
    from traceflow.engines.netfilter import nft
    path = BUNDLES["nftables"] / "nodes" / node / "nft.txt"
    rs = nft.parse_nft_ruleset(path.read_text(), f"nodes/{node}/nft.txt")
    assert rs.diagnostics == []
    sets = parse_ipset_list((BUNDLES["ipvs"] / "nodes" / node / "ipset.txt").read_text(),
                            f"nodes/{node}/ipset.txt")
    assert sets["KUBE-CLUSTER-IP"] and sets["KUBE-IPVS-IPS"]
    from traceflow.engines import routing
    for mode in gen.MODES:
        root = BUNDLES[mode] / "nodes" / node
        routing.parse_ip_addr((root / "ip-addr.txt").read_text(), "ip-addr.txt")
        routing.parse_ip_routes((root / "ip-route.txt").read_text(), "ip-route.txt")
        routing.parse_ip_rules((root / "ip-rule.txt").read_text(), "ip-rule.txt")


# ---------------------------------------------------------------------------------------------
# What traceflow reads from the iptables-mode rules


def test_sampled_service_ports_reach_every_endpoint_with_equal_shares():
    checked = defaultdict(int)
    for v in sampled_views():
        node = cluster().node(v.node)
        rs, ctx = ruleset("iptables", v.node), node_context(node)
        every = {(e.ip, v.port.target_port) for e in v.cluster_endpoints}
        shares = dnat_shares(evaluate_hook(rs, "PREROUTING",
                                           packet(v.svc.cluster_ip, v.port), ctx))
        assert_equal_shares(shares, every, f"{v.node} {v.name} cluster IP")
        checked["cluster IP"] += 1
        external = ({(e.ip, v.port.target_port) for e in v.local_endpoints}
                    if v.svc.etp_local else every)
        # a client the loadBalancerSourceRanges let in (see test_lb_source_ranges_are_enforced)
        src = "203.0.113.77" if v.svc.lb_source_ranges else CLIENT
        for ip in (*v.svc.external_ips, *v.svc.lb_ips):
            branches = evaluate_hook(rs, "PREROUTING", packet(ip, v.port, src=src), ctx)
            if external:
                assert_equal_shares(dnat_shares(branches), external, f"{v.name} -> {ip}")
                checked["external/LB IP"] += 1
        if v.port.node_port and external:
            branches = evaluate_hook(rs, "PREROUTING",
                                     packet(node.ip, v.port, v.port.node_port), ctx)
            assert_equal_shares(dnat_shares(branches), external, f"{v.node} {v.name} NodePort")
            masquerade = {bool(b.packet.mark & gen.MASQ_MARK) for b in branches}
            assert masquerade == {not v.svc.etp_local}, f"{v.name}: masquerade mark {masquerade}"
            checked["NodePort"] += 1
    assert checked["cluster IP"] == SAMPLE * len(gen.NODES)
    assert checked["NodePort"] >= 10 and checked["external/LB IP"] >= 1, dict(checked)


def test_cluster_ip_masquerades_only_traffic_from_outside_the_cluster_cidr():
    v = next(v for v in gen.port_views(cluster(), "node1")
             if v.svc.role == "clusterip-3-endpoints")
    rs, ctx = ruleset("iptables", "node1"), node_context(cluster().node("node1"))
    for src, marked in ((CLIENT, True), ("10.244.2.9", False)):
        branches = evaluate_hook(rs, "PREROUTING", packet(v.svc.cluster_ip, v.port, src=src), ctx)
        assert {bool(b.packet.mark & gen.MASQ_MARK) for b in branches} == {marked}


def test_services_without_endpoints_are_rejected_in_the_filter_table():
    seen = 0
    for node in cluster().nodes:
        rs = ruleset("iptables", node.name)
        for v in gen.port_views(cluster(), node.name):
            if v.has_endpoints:
                continue
            pkt = packet(v.svc.cluster_ip, v.port)
            nat = evaluate_hook(rs, "PREROUTING", pkt, node_context(node))
            assert [b.nat for b in nat] == [None]          # nothing to DNAT to
            for hook, ctx in (("FORWARD", node_context(node, out_iface="ens192")),
                              ("OUTPUT", node_context(node))):
                branches = evaluate_hook(rs, hook, pkt, ctx)
                assert [b.verdict for b in branches] == ["REJECT"], _explain(branches[0])
            for ip in (*v.svc.external_ips, *v.svc.lb_ips):
                branches = evaluate_hook(rs, "FORWARD", packet(ip, v.port),
                                         node_context(node, out_iface="ens192"))
                assert [b.verdict for b in branches] == ["REJECT"]
            if v.port.node_port:
                branches = evaluate_hook(rs, "INPUT", packet(node.ip, v.port, v.port.node_port),
                                         node_context(node))
                assert [b.verdict for b in branches] == ["REJECT"], _explain(branches[0])
            seen += 1
    assert seen >= 3 * len(gen.NODES)


def test_etp_local_node_ports_go_to_local_endpoints_only():
    with_local = without_local = 0
    for node in cluster().nodes:
        rs = ruleset("iptables", node.name)
        for v in gen.port_views(cluster(), node.name):
            if not (v.svc.etp_local and v.port.node_port and v.has_endpoints):
                continue
            pkt = packet(node.ip, v.port, v.port.node_port)
            branches = evaluate_hook(rs, "PREROUTING", pkt, node_context(node))
            local = {(e.ip, v.port.target_port) for e in v.local_endpoints}
            if local:
                assert_equal_shares(dnat_shares(branches), local, f"{node.name} {v.name}")
                assert not any(b.packet.mark & gen.MASQ_MARK for b in branches), (
                    "ETP Local keeps the client address")
                with_local += 1
            else:
                assert [b.nat for b in branches] == [None]
                verdicts = evaluate_hook(rs, "INPUT", pkt, node_context(node))
                assert [b.verdict for b in verdicts] == ["DROP"], _explain(verdicts[0])
                without_local += 1
    assert with_local >= 3 and without_local >= 3


def test_lb_source_ranges_are_enforced():
    svc = gen.scenario(cluster(), "lb-source-ranges")
    port, lb_ip = svc.ports[0], svc.lb_ips[0]
    node = cluster().node("node2")
    rs = ruleset("iptables", "node2")
    allowed = evaluate_hook(rs, "PREROUTING", packet(lb_ip, port, src="203.0.113.77"),
                            node_context(node))
    assert_equal_shares(dnat_shares(allowed), {(e.ip, port.target_port) for e in svc.endpoints},
                        "allowed source")
    other = packet(lb_ip, port, src=CLIENT)
    assert [b.nat for b in evaluate_hook(rs, "PREROUTING", other, node_context(node))] == [None]
    branches = evaluate_hook(rs, "FORWARD", other, node_context(node, out_iface="ens192"))
    assert [b.verdict for b in branches] == ["DROP"]


def test_session_affinity_service_is_traceable():
    v = next(v for v in gen.port_views(cluster(), "node1") if v.svc.role == "session-affinity")
    rs, ctx = ruleset("iptables", "node1"), node_context(cluster().node("node1"))
    shares = dnat_shares(evaluate_hook(rs, "PREROUTING", packet(v.svc.cluster_ip, v.port), ctx))
    assert_equal_shares(shares, {(e.ip, v.port.target_port) for e in v.cluster_endpoints},
                        v.name)


def test_ipvs_mode_rules_mark_outside_traffic_to_cluster_ips_and_accept_it():
    node = cluster().node("node1")
    rs = ruleset("ipvs", "node1")
    sets = parse_ipset_list((BUNDLES["ipvs"] / "nodes/node1/ipset.txt").read_text(), "ipset.txt")
    v = next(v for v in gen.port_views(cluster(), "node1")
             if v.svc.role == "clusterip-3-endpoints")
    branches = evaluate_hook(rs, "PREROUTING", packet(v.svc.cluster_ip, v.port),
                             node_context(node, ipsets=sets))
    assert [b.verdict for b in branches] == ["ACCEPT"]
    assert branches[0].packet.mark & gen.MASQ_MARK
    assert branches[0].nat is None                 # IPVS, not netfilter, picks the endpoint
    ipvs = (BUNDLES["ipvs"] / "nodes/node1/ipvs.txt").read_text()
    assert f"TCP  {v.svc.cluster_ip}:{v.port.port} rr\n" in ipvs
    for ep in v.cluster_endpoints:
        assert f"  -> {ep.ip}:{v.port.target_port} " in ipvs


def test_ipvs_tables_send_sampled_ports_to_every_endpoint():
    """The IPVS bundle, read by traceflow's ipvsadm reader: round robin over every ready
    endpoint for a cluster IP; ETP Local node ports to local endpoints only."""
    from traceflow.engines.netfilter import ipvs
    tables = {}
    for v in sampled_views():
        if v.node not in tables:
            path = BUNDLES["ipvs"] / "nodes" / v.node / "ipvs.txt"
            tables[v.node] = ipvs.parse_ipvsadm(path.read_text(), f"nodes/{v.node}/ipvs.txt")
            assert tables[v.node].diagnostics == []
        table = tables[v.node]
        every = {(e.ip, v.port.target_port) for e in v.cluster_endpoints}
        assert_equal_shares(dnat_shares(table.evaluate(packet(v.svc.cluster_ip, v.port))),
                            every, f"ipvs {v.node} {v.name}")
        local = {(e.ip, v.port.target_port) for e in v.local_endpoints}
        if v.port.node_port and (local or not v.svc.etp_local):
            node_ip = cluster().node(v.node).ip
            branches = table.evaluate(packet(node_ip, v.port, v.port.node_port))
            assert_equal_shares(dnat_shares(branches), local if v.svc.etp_local else every,
                                f"ipvs {v.node} {v.name} NodePort")


def test_nftables_mode_gives_the_same_endpoints_as_iptables_mode():
    """The same cluster in kube-proxy's nftables mode: traceflow's nft engine must send every
    sampled port to the same endpoints, in equal shares, as the iptables mode does."""
    from traceflow.engines.netfilter.nft import parse_nft_ruleset
    rulesets = {}
    for v in sampled_views():
        if v.node not in rulesets:
            path = BUNDLES["nftables"] / "nodes" / v.node / "nft.txt"
            rulesets[v.node] = parse_nft_ruleset(path.read_text(), f"nodes/{v.node}/nft.txt")
            rulesets[v.node].raise_for_errors()
        node = cluster().node(v.node)
        ctx = node_context(node)
        pkt = packet(v.svc.cluster_ip, v.port)
        nft = dnat_shares(rulesets[v.node].evaluate_hook("PREROUTING", pkt, ctx))
        ipt = dnat_shares(evaluate_hook(ruleset("iptables", v.node), "PREROUTING", pkt, ctx))
        assert nft.keys() == ipt.keys(), f"{v.node} {v.name}"
        for target in nft:
            assert abs(nft[target] - ipt[target]) < TOLERANCE, f"{v.node} {v.name} {target}"
