"""AntreaProxy (proxyAll) and Antrea Egress end to end on examples/antrea-v2: traffic from a
client outside the cluster to NodePorts and LoadBalancer IPs, and from Pods to an address
outside it, with their replies.

What the trace must show, from the JSON (the expectations come from Antrea's own code, cited
at each test): the host's iptables part (nat ANTREA-PREROUTING's DNAT of ANTREA-NODEPORT-IP to
the virtual NodePort IP 169.254.0.252, raw NOTRACK of ANTREA-EXTERNAL-IP, ANTREA-POSTROUTING's
Egress SNAT by mark and the Pod CIDR's masquerade: pkg/agent/route/route_linux.go
restoreIptablesData), OVS's part (NodePortMark, ServiceLB's external frontends, SNATMark/SNAT to
the gateway for a remote endpoint of an externally reached Service: pipeline.go
gatewaySNATFlows; the Local group without local endpoints: serviceEndpointGroup's
SvcNoEpRegMark bucket; EgressMark's mark or tunnel to the Egress IP: snatRuleFlow,
snatIPFromTunnelFlow), the reply's un-NAT, and typed dispositions.

Every OVS pass the walk makes on these questions is then replayed on a real Open vSwitch
(``ofproto/trace`` on a private switch loaded with the node's tables, groups and flows, as
tests/test_antrea_pipelines.py does): same packet, same bucket (dp_hash), the conntrack states
the walk's own conntrack gave (``--ct-next``), hop for hop. ofproto/trace cannot un-NAT an
existing connection (``ct(nat)`` without a range) nor know its ct_mark: a stage that starts
after such an un-NAT is traced with the headers and ct_mark the walk's conntrack gave it, and
compared from the stage that resumes at the same table. The host side is compared with the
kernel in tests/test_antrea_outside_kernel.py.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
V2 = EXAMPLES / "antrea-v2"
V1 = EXAMPLES / "antrea-proxy-v1"
CLIENT = "203.0.113.7"
WEB1, WEB2 = "default/web-7975b6c6c-8ltqd", "default/web-7975b6c6c-w9rfz"
DB, CLIENT_POD = "default/db-755c6d9d8f-tpz4x", "default/client-6c8b7d5d8f-hv2kw"
runner = CliRunner()


def trace(*args, bundle=V2, code=None) -> dict:
    result = runner.invoke(app, ["trace", *args, "--bundle", str(bundle), "-o", "json"])
    assert result.exit_code in (0, 1), result.output
    if code is not None:
        assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def legs(path):
    """direction -> the legs of that direction as one (a packet re-entering OVS from the host
    starts a new leg of the same direction): every hop in order, the last leg's end."""
    out: dict = {}
    for leg in path["legs"]:
        got = out.setdefault(leg["direction"], {"hops": [], "disposition": None,
                                                "left_cluster": None})
        got["hops"] = got["hops"] + leg["hops"]
        got["disposition"] = leg["disposition"] or got["disposition"]
        got["left_cluster"] = leg["left_cluster"] or got["left_cluster"]
    return out


def hops(leg, component=None, node=None):
    return [h for h in leg["hops"] if (component is None or h["component"] == component)
            and (node is None or h["node"] == node)]


def ovs_names(leg, node):
    return [h["table_name"] for h in hops(leg, "ovs", node)]


def first_ovs(leg, node):
    """The packet as it enters OVS on ``node``: the headers after the hop before the first
    OVS hop there."""
    seq = leg["hops"]
    i = next(i for i, h in enumerate(seq) if h["component"] == "ovs" and h["node"] == node)
    return seq[i - 1]["packet"]


def path_to(doc, endpoint):
    (path,) = [p for p in doc["paths"] if p["endpoint"] == endpoint]
    return path


# ============================================================== NodePort from outside

def test_nodeport_cluster_remote_endpoint_is_snated_to_the_gateway_and_the_reply_unnated():
    """db-nodeport (Cluster) entering node2, db on node1: ANTREA-PREROUTING DNATs to
    169.254.0.252 (route_linux.go "DNAT external to NodePort packets"), NodePortMark marks it,
    ServiceLB's tp_dst=30306 flow picks group 19 and loads ToExternalAddressRegMark; to the
    tunnel, SNATMark (FromGateway+ToTunnel+ToExternalAddress, gatewaySNATFlows) and SNAT
    translate the source to node2's gateway 10.10.1.1. The reply is un-SNATed (UnSNAT, zone
    65521), un-DNATed (ConntrackZone, zone 65520) and un-DNATed again by node2's conntrack."""
    doc = trace(CLIENT, "192.168.77.103:30306", code=0)
    (path,) = doc["paths"]
    assert path["endpoint"] == DB and path["disposition"] == "delivered-pod"
    req, rep = legs(path)["request"], legs(path)["reply"]
    dnat = next(h for h in hops(req, "iptables", "node2") if h["chain"] == "ANTREA-PREROUTING"
                and "DNAT" in h["effect"])
    assert "DNAT 192.168.77.103:30306 -> 169.254.0.252:30306" in dnat["effect"]
    assert dnat["source"]["file"] == "nodes/node2/iptables-save.txt"
    assert "--match-set ANTREA-NODEPORT-IP dst,dst" in dnat["rule"]
    entering = first_ovs(req, "node2")
    assert (entering["nw_src"], entering["nw_dst"], entering["tp_dst"]) == (CLIENT, "169.254.0.252", 30306)
    names = ovs_names(req, "node2")
    # NodePortMark's matching flow ends the resubmit (no goto): SessionAffinity once, not twice
    assert names[:11] == ["PipelineRootClassifier", "Classifier", "SpoofGuard", "UnSNAT",
                          "ConntrackZone", "ConntrackState", "PreRoutingClassifier",
                          "NodePortMark", "SessionAffinity", "ServiceLB", "EndpointDNAT"]
    mark = hops(req, "ovs", "node2")[7]
    assert mark["rule"].endswith("nw_dst=169.254.0.252 actions=set_field:0x80000/0x80000->reg4")
    assert "reg4[19]=0x1: Service: destination is a NodePort address" in mark["notes"]
    lb = next(h for h in hops(req, "ovs", "node2") if h["table_name"] == "ServiceLB")
    assert "tp_dst=30306" in lb["rule"] and "group 19" in lb["effect"]
    assert "reg4[21]=0x1: Service: destination is an external IP" in lb["notes"]
    snat = next(h for h in hops(req, "ovs", "node2") if h["table_name"] == "SNAT")
    assert "conntrack zone 65521: SNAT" in snat["effect"] and "-> 10.10.1.1:54321" in snat["effect"]
    tunnel = next(h for h in req["hops"] if h["component"] == "tunnel")
    assert "192.168.77.103 -> 192.168.77.102" in tunnel["effect"]
    delivered = req["hops"][-1]
    assert delivered["packet"]["nw_src"] == "10.10.1.1"          # the client address is lost
    assert (delivered["packet"]["nw_dst"], delivered["packet"]["tp_dst"]) == ("10.10.0.25", 3306)
    # the reply: node1 -> tunnel -> node2's UnSNAT (zone 65521) and ConntrackZone (zone 65520)
    # (a ct() hop's translation shows on the packet of the pass it recirculates to)
    node2 = hops(rep, "ovs", "node2")
    i = next(i for i, h in enumerate(node2) if h["table_name"] == "UnSNAT")
    assert "zone 65521: un-NAT" in node2[i]["effect"], node2[i]["effect"]
    assert node2[i + 1]["table_name"] == "ConntrackZone" and node2[i + 1]["packet"]["nw_dst"] == CLIENT
    assert "zone 65520: un-NAT" in node2[i + 1]["effect"]
    after = node2[i + 2]["packet"]
    assert (after["nw_src"], after["tp_src"]) == ("169.254.0.252", 30306)
    host = next(h for h in hops(rep, "iptables", "node2") if h["chain"] == "conntrack")
    assert "192.168.77.103:30306" in host["effect"]
    assert rep["disposition"] == "left-cluster"
    assert (rep["left_cluster"]["src"], rep["left_cluster"]["src_port"]) == ("192.168.77.103", 30306)
    assert (rep["left_cluster"]["node"], rep["left_cluster"]["device"]) == ("node2", "eth0")


def test_nodeport_cluster_keeps_the_client_address_only_for_the_local_endpoint():
    """sample-nodeport (Cluster, web) entering node1: the local bucket keeps 203.0.113.7,
    which the web policy's ipBlock admits; the remote bucket is SNATed to 10.10.0.1, which it
    does not: dropped by default/web's ingress default deny on node2 (the client address lost
    to the Cluster policy's SNAT, named)."""
    doc = trace(CLIENT, "192.168.77.102:30004", code=1)
    assert sorted(p["endpoint"] for p in doc["paths"]) == [WEB1, WEB2]
    local, remote = path_to(doc, WEB1), path_to(doc, WEB2)
    assert local["disposition"] == "delivered-pod" and local["weight"] == 0.5
    got = legs(local)["request"]["hops"][-1]["packet"]
    assert (got["nw_src"], got["nw_dst"]) == (CLIENT, "10.10.0.24")
    assert all(h["table_name"] != "SNAT" or "SNAT" not in h["effect"]
               for h in hops(legs(local)["request"], "ovs"))
    ingress = next(h for h in hops(legs(local)["request"], "ovs", "node1")
                   if h["table_name"] == "IngressRule")
    assert "conjunction 3: all 3 clauses matched" in ingress["notes"]
    assert "ip,nw_src=203.0.113.0/24" in " ".join(ingress["notes"])
    assert remote["disposition"] == "dropped-policy"
    assert remote["drop"]["node"] == "node2" and remote["policies"] == ["default/web"]
    assert "from 10.10.0.1" in remote["drop"]["reason"]
    exit_reply = legs(local)["reply"]
    assert (exit_reply["left_cluster"]["src"], exit_reply["left_cluster"]["src_port"]) == ("192.168.77.102", 30004)


@pytest.mark.parametrize("node_ip,entry", [("192.168.77.102", "node1"), ("192.168.77.103", "node2")])
def test_nodeport_local_with_and_without_a_local_endpoint(node_ip, entry):
    """db-nodeport-local (externalTrafficPolicy Local, db on node1 only): the priority-200
    ServiceLB flow (external clients) goes to the local group; node1's holds db (delivered,
    no SNAT, the client address kept), node2's holds only the SvcNoEpRegMark bucket
    (serviceEndpointGroup with no endpoints): EndpointDNAT sends it to the agent, which
    resets it (rejected)."""
    doc = trace(CLIENT, f"{node_ip}:30307")
    (path,) = doc["paths"]
    req = legs(path)["request"]
    lb = next(h for h in hops(req, "ovs", entry) if h["table_name"] == "ServiceLB")
    assert lb["priority"] == 200 and "group 21" in lb["effect"]
    if entry == "node1":
        assert path["disposition"] == "delivered-pod" and path["endpoint"] == DB
        assert req["hops"][-1]["packet"]["nw_src"] == CLIENT
        assert not any(h["table_name"] == "SNAT" and "SNAT" in h["effect"] for h in hops(req, "ovs"))
        rep = legs(path)["reply"]
        assert (rep["left_cluster"]["src"], rep["left_cluster"]["src_port"]) == ("192.168.77.102", 30307)
    else:
        assert path["disposition"] == "rejected" and path["verdict"] == "dropped"
        assert "externalTrafficPolicy: Local and node2 has no local endpoint" in path["drop"]["reason"]
        assert "reg0[14]=0x1: Service without Endpoints (SvcNoEpRegMark): sent to the agent" in \
            lb["notes"]
        assert path["endpoint"] is None


# ============================================================== LoadBalancer from outside

def test_loadbalancer_local_on_both_nodes_untracked_by_the_host():
    """sample-service-etp-local (192.168.77.151, Local): no --via, one branch per node; each
    host leaves it untracked (raw ANTREA-PREROUTING NOTRACK of ANTREA-EXTERNAL-IP), so no NAT
    table, routes it via 169.254.0.253 into antrea-gw0 (addExternalIPConfigsRoute); OVS's
    priority-200 flow (external client: no FromLocalRegMark) uses the node's local group 18."""
    doc = trace(CLIENT, "192.168.77.151:80", code=0)
    assert sorted(p["endpoint"] for p in doc["paths"]) == [WEB1, WEB2]
    for path, node, ip in ((path_to(doc, WEB1), "node1", "10.10.0.24"),
                           (path_to(doc, WEB2), "node2", "10.10.1.6")):
        req, rep = legs(path)["request"], legs(path)["reply"]
        assert {h["node"] for h in req["hops"] if h["component"] == "ovs"} == {node}
        notrack = next(h for h in hops(req, "iptables", node) if "NOTRACK" in h["effect"])
        assert "ANTREA-EXTERNAL-IP dst" in notrack["rule"]
        assert any("untracked" in h["effect"] for h in hops(req, "iptables", node)
                   if h["chain"] == "POSTROUTING")
        route = next(h for h in hops(req, "route", node))
        assert route["rule"] == "192.168.77.151 via 169.254.0.253 dev antrea-gw0"
        lb = next(h for h in hops(req, "ovs", node) if h["table_name"] == "ServiceLB")
        assert lb["priority"] == 200 and "group 18" in lb["effect"]
        assert req["hops"][-1]["packet"]["nw_src"] == CLIENT
        assert req["hops"][-1]["packet"]["nw_dst"] == ip
        # the reply: un-DNATed by OVS to the LB IP, untracked by the host, out of eth0
        assert any("ANTREA-EXTERNAL-IP src" in (h["rule"] or "") for h in hops(rep, "iptables", node))
        assert not any(h["chain"] == "conntrack" for h in hops(rep, "iptables", node))
        assert (rep["left_cluster"]["src"], rep["left_cluster"]["src_port"]) == ("192.168.77.151", 80)
        assert rep["left_cluster"]["node"] == node


def test_loadbalancer_cluster_via_node2():
    doc = trace(CLIENT, "192.168.77.150:80", "--via", "node2", code=1)
    local, remote = path_to(doc, WEB2), path_to(doc, WEB1)
    assert local["disposition"] == "delivered-pod"
    assert remote["disposition"] == "dropped-policy"
    snat = next(h for h in hops(legs(remote)["request"], "ovs", "node2") if h["table_name"] == "SNAT")
    assert "-> 10.10.1.1:54321" in snat["effect"]
    assert doc["query"]["destination_endpoint"]["frontend"] == "loadbalancer"
    assert doc["query"]["via"] == "node2"


# ============================================================== Egress

@pytest.mark.parametrize("source,left_as,node,tunnel", [
    (WEB1, "192.168.77.112", "node1", None),                # Egress IP on its own node
    (WEB2, "192.168.77.112", "node1", "192.168.77.112"),    # Egress IP on the other node
    (CLIENT_POD, "192.168.77.113", "node2", "192.168.77.113"),
    (DB, "192.168.77.102", "node1", None),                  # no Egress: masqueraded
])
def test_pod_to_outside_leaves_with_its_egress_ip(source, left_as, node, tunnel):
    """EgressMark (snatRuleFlow): a local Egress IP's mark in pkt_mark[0..7], or the tunnel to
    a remote Egress IP itself; the Node holding the IP marks tunnelled packets
    (snatIPFromTunnelFlow, tun_dst=<IP>) and its ANTREA-POSTROUTING SNATs by mark
    ("SNAT Pod to external packets"). Without an Egress the Pod CIDR's masquerade applies."""
    doc = trace(source, "1.1.1.1:443", code=0)
    (path,) = doc["paths"]
    assert path["disposition"] == "left-cluster" and path["verdict"] == "delivered"
    assert path["left_cluster"]["src"] == left_as and path["left_cluster"]["node"] == node
    assert path["left_cluster"]["dst"] == "1.1.1.1" and path["left_cluster"]["device"] == "eth0"
    req, rep = legs(path)["request"], legs(path)["reply"]
    tunnels = [h for h in req["hops"] if h["component"] == "tunnel"]
    if tunnel:
        (tun,) = tunnels
        assert f"-> {tunnel} UDP/6081 to {node}" in tun["effect"]
        assert any(f"{tunnel} is on {node}'s antrea-egress0" in n and "Egress egress-" in n
                   for n in tun["notes"])
        mark_hop = next(h for h in hops(req, "ovs", node) if h["table_name"] == "EgressMark")
        assert f"tun_dst={tunnel}" in mark_hop["rule"]
    else:
        assert not tunnels
    snat = next(h for h in hops(req, "iptables", node) if h["chain"] == "ANTREA-POSTROUTING"
                and ("SNAT" in h["effect"] or "MASQUERADE" in h["effect"]))
    if source == DB:
        assert "masquerade Pod to external packets" in snat["rule"]
    else:
        egress = next(h for h in hops(req, "ovs", node) if h["table_name"] == "EgressMark"
                      and h["changed"].get("mark"))
        assert egress["packet"]["mark"] == 1
        assert any(f"SNATs it to {left_as}" in n for n in egress["notes"])
        assert "-m mark --mark 0x1/0xff -j SNAT" in snat["rule"]
        assert snat["source"]["file"] == f"nodes/{node}/iptables-save.txt"
    # the reply arrives where the request left, is un-SNATed and reaches the Pod
    assert rep["hops"][0]["node"] == node and rep["hops"][0]["detail"] == "entry"
    assert rep["disposition"] == "delivered-pod"
    last = rep["hops"][-1]["packet"]
    assert (last["nw_src"], last["tp_src"]) == ("1.1.1.1", 443)


def test_egress_does_not_bypass_the_network_policy():
    doc = trace(WEB1, "1.1.1.1:80", code=1)
    (path,) = doc["paths"]
    assert path["disposition"] == "dropped-policy" and path["policies"] == ["default/web"]
    assert path["drop"]["table"] == "15"          # EgressDefaultRule, before EgressMark


def _copy(tmp_path, bundle=V2) -> Path:
    dst = tmp_path / bundle.name
    shutil.copytree(bundle, dst)
    return dst


def _drop_lines(path: Path, needle: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    kept = [l for l in lines if needle not in l]
    assert len(kept) < len(lines), needle
    path.write_text("".join(kept))


def test_egress_object_and_flows_disagree_is_said(tmp_path):
    """egress-web selects web, whose Egress IP node1 holds; without node1's EgressMark flow for
    the web Pod the packet gets no mark and leaves masqueraded: the trace still follows the
    flows, and a warning says the Egress and the flows disagree."""
    bundle = _copy(tmp_path)
    _drop_lines(bundle / "nodes/node1/ovs-flows.txt", 'in_port="web-7975-274540" actions=set_field:0x1/0xff->pkt_mark')
    doc = trace(WEB1, "1.1.1.1:443", bundle=bundle)
    (path,) = doc["paths"]
    assert path["left_cluster"]["src"] == "192.168.77.102"              # what the datapath does
    assert any("Egress egress-web" in w and "no SNAT mark" in w for w in doc["warnings"])
    clean = trace(WEB1, "1.1.1.1:443")
    assert not any("Egress" in w for w in clean["warnings"])


def test_egress_ip_held_only_by_the_status_is_followed_and_said(tmp_path):
    bundle = _copy(tmp_path)
    text = (bundle / "nodes/node2/ip-addr.txt").read_text()
    (bundle / "nodes/node2/ip-addr.txt").write_text(text.split("7: antrea-egress0")[0])
    doc = trace(CLIENT_POD, "1.1.1.1:443", bundle=bundle)
    (path,) = doc["paths"]
    tun = next(h for h in legs(path)["request"]["hops"] if h["component"] == "tunnel")
    assert any("held by node2 (status.egressNode; no ip-addr.txt of the bundle shows" in n
               for n in tun["notes"])
    # with neither the address nor the object, where the tunnel goes is not known: unknown
    (bundle / "k8s/egresses.yaml").unlink()
    doc = trace(CLIENT_POD, "1.1.1.1:443", bundle=bundle)
    (path,) = doc["paths"]
    assert path["verdict"] == "unknown" and path["disposition"] == "unknown"
    assert "tunnel to 192.168.77.113" in path["drop"]["reason"]


def test_bad_egress_object_is_a_located_error(tmp_path):
    bundle = _copy(tmp_path)
    path = bundle / "k8s/egresses.yaml"
    path.write_text(path.read_text().replace("egressIP: 192.168.77.113\n    externalIPPool",
                                             "egressIP: 192.168.77.999\n    externalIPPool"))
    result = runner.invoke(app, ["trace", CLIENT_POD, "1.1.1.1:443", "--bundle", str(bundle)])
    assert result.exit_code == 2, result.output
    assert "k8s/egresses.yaml" in result.output and "192.168.77.999" in result.output


# ============================================================== what the bundle lacks

def test_proxyall_without_the_host_rules_is_unknown_naming_the_files(tmp_path):
    """v1.4's example has no iptables/ipset: AntreaProxy's DNAT of the NodePort happens there,
    so the answer is unknown naming the files, not a host that seems to drop it."""
    doc = trace(CLIENT, "192.168.77.100:30001", bundle=V1)
    (path,) = doc["paths"]
    assert path["disposition"] == "unknown"
    assert "needs nodes/node1/iptables-save.txt" in path["drop"]["reason"]
    assert "nodes/node1/ipset.txt" in path["drop"]["reason"]
    bundle = _copy(tmp_path)
    (bundle / "nodes/node1/ipset.txt").unlink()
    doc = trace(CLIENT, "192.168.77.102:30004", bundle=bundle)
    assert all(p["disposition"] == "unknown" for p in doc["paths"])
    assert "needs nodes/node1/ipset.txt" in doc["paths"][0]["drop"]["reason"]
    assert "iptables-save.txt" not in doc["paths"][0]["drop"]["reason"]


# ============================================================== check, audit, diff

def test_check_audit_and_diff_on_the_new_directions(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(f"""expectations:
  - name: Local NodePort without a local endpoint
    from: {CLIENT}
    to: 192.168.77.103:30307
    expect: rejected
  - name: web leaves with its Egress IP
    from: app=web
    to: 1.1.1.1:443
    expect: left-cluster
  - name: LoadBalancer at node1
    from: {CLIENT}
    to: 192.168.77.151:80
    via: node1
    expect: delivered-pod
""")
    res = runner.invoke(app, ["check", str(suite), "--bundle", str(V2), "-o", "json"])
    assert res.exit_code == 0, res.output
    assert all(r["passed"] for r in json.loads(res.stdout)["results"])
    audit = runner.invoke(app, ["audit", "--bundle", str(V2), "-o", "json"])
    assert audit.exit_code in (0, 1), audit.output
    assert json.loads(audit.stdout)["findings"] == []   # no drift
    # after: node1 loses its Egress SNAT rule: web's connections leave masqueraded
    after = _copy(tmp_path)
    _drop_lines(after / "nodes/node1/iptables-save.txt", "SNAT Pod to external packets")
    res = runner.invoke(app, ["diff", str(V2), str(after), "--suite", str(suite), "-o", "json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    changed = json.dumps(doc)
    assert "web leaves with its Egress IP" in changed or "1.1.1.1" in changed
    assert "iptables-save.txt" in changed
