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


# ============================================================== the real Open vSwitch

# every direction above; each OVS pass the walk makes on them is replayed on a real switch
ORACLE_QUESTIONS = [
    (CLIENT, "192.168.77.102:30004"), (CLIENT, "192.168.77.103:30306"),
    (CLIENT, "192.168.77.102:30307"), (CLIENT, "192.168.77.103:30307"),
    (CLIENT, "192.168.77.151:80"), (CLIENT, "192.168.77.150:80", "--via", "node2"),
    (WEB1, "1.1.1.1:443"), (WEB2, "1.1.1.1:443"), (CLIENT_POD, "1.1.1.1:443"),
    (DB, "1.1.1.1:443"), (WEB1, "1.1.1.1:80"),
]
MAX_CT = 6


@contextlib.contextmanager
def recorded_passes():
    """Every OVS pass the Antrea datapath simulates while the block runs: (node, the leg's
    direction, the state the packet entered with, the runs)."""
    import traceflow.cni.antrea.datapath as datapath
    real_simulate, real_ovs = datapath.simulate, datapath.AntreaDatapath._ovs
    seen, direction = [], []

    def recording(bridge, state, conntrack, start=0, annotator=None, **kw):
        runs = real_simulate(bridge, state, conntrack, start, annotator, **kw)
        if state.get("dl_type") == 0x0800:      # not the ARP responder's lookups
            seen.append((annotator.node, direction[-1], dict(state), runs))
        return runs

    def ovs_step(self, b, loc, q):
        direction.append(b.leg.direction)
        return real_ovs(self, b, loc, q)
    datapath.simulate, datapath.AntreaDatapath._ovs = recording, ovs_step
    try:
        yield seen
    finally:
        datapath.simulate, datapath.AntreaDatapath._ovs = real_simulate, real_ovs


def _ct_names(bits: int) -> str:
    from traceflow.engines.ovs import fields as F
    return ",".join(name for name, bit in F.CT_STATE_BITS.items() if bits & bit) or "trk"


def _spec(state: dict, overrides: dict, dp_hash: int | None) -> str:
    """An ofproto/trace flow from a simulator state (the packet as it enters OVS)."""
    from traceflow.engines.ovs import fields as F
    s = dict(state, **overrides)
    proto = {6: "tcp", 17: "udp", 1: "icmp"}[s["nw_proto"]]
    parts = [proto, f"in_port={s['in_port']}"]
    for key in ("dl_src", "dl_dst"):
        parts.append(f"{key}={F.format_value(F.FIELDS[key], s[key])}")
    for key in ("nw_src", "nw_dst", "tun_src", "tun_dst"):
        if s.get(key):
            parts.append(f"{key}={ipaddress.IPv4Address(s[key])}")
    for key in ("tp_src", "tp_dst", "nw_ttl"):
        parts.append(f"{key}={s[key]}")
    for key in ("pkt_mark", "ct_mark", "ct_label"):
        if s.get(key):
            parts.append(f"{key}={hex(s[key])}")
    if dp_hash is not None:
        parts.append(f"dp_hash={dp_hash}")
    return ",".join(parts)


def _dp_hash(bridge, choices) -> int | None:
    """A dp_hash for which OVS's select groups pick the walk's buckets (OVS 3.1's dp_hash
    selection, tests/test_ovs_differential_pipelines.webster_bucket)."""
    from test_ovs_differential_pipelines import webster_bucket
    if not choices:
        return 1
    for h in range(1, 64):
        if all(webster_bucket(bridge.groups[g], h) == b for g, b, _ in choices):
            return h
    raise AssertionError(f"no dp_hash selects {choices}")


def _stages(run) -> list[list]:
    out: list[list] = []
    for hit in run.hits:
        while len(out) <= hit.stage:
            out.append([])
        out[hit.stage].append(hit)
    return out


def _start(stage: list) -> dict:
    """The headers and conntrack fields a stage started with, as the walk had them (from the
    first hit that carries them: a ct() hit's own fields are its action's)."""
    keys = ("nw_src", "nw_dst", "tp_src", "tp_dst")
    first = stage[0].state_after or {}
    got = {k: first.get(k) for k in keys}
    with_ct = next((h.state_after for h in stage if h.state_after and "ct_state" in h.state_after),
                   None)
    if with_ct is not None:
        got.update(ct_state=with_ct["ct_state"], ct_mark=with_ct.get("ct_mark", 0),
                   ct_label=with_ct.get("ct_label", 0))
    return got


def compare_pass(ovs, bridge, state: dict, run, direction: str) -> int:
    """ofproto/trace vs the walk's run, stage by stage; returns the stages compared.

    ofproto/trace applies a ct() commit's explicit NAT and ct_mark itself, but knows nothing
    of an existing connection: for a pass that meets one (ct_state +est), the ct_mark and
    ct_label the walk's conntrack gave the last lookup are given with the packet (no commit changes it in
    such a pass), and a stage whose headers an un-NAT changed is traced again with those
    headers (the registers before it come from Classifier, by in_port) and compared from the
    stage that resumes at the same table."""
    from traceflow.engines.ovs import fields as F
    stages = _stages(run)
    starts = [_start(s) for s in stages]
    assert stages and all(stages), "a run with an empty stage"
    default = "trk,est,rpl" if direction == "reply" else "trk,new"
    ct_next = [_ct_names(s["ct_state"]) if "ct_state" in s else default for s in starts[1:]]
    known = [s for s in starts[1:] if "ct_state" in s]
    over = {}
    if any(s["ct_state"] & F.CT_STATE_BITS["est"] for s in known):
        over["ct_mark"], over["ct_label"] = known[-1]["ct_mark"], known[-1]["ct_label"]
    dp_hash = _dp_hash(bridge, run.choices)
    main = ovs.trace(_spec(state, over, dp_hash), ct_next)
    keys = ("nw_src", "nw_dst", "tp_src", "tp_dst")
    theirs = None
    for k, stage in enumerate(stages):
        ours = [(h.table, h.flow.priority if h.flow else None) for h in stage]
        theirs = main.stages[k] if k < len(main.stages) else None
        want = starts[k]
        unnated = k and (theirs is None or any(theirs.flow.get(key, 0) != (want.get(key) or 0)
                                               for key in keys))
        if unnated and (theirs is None or ours != [(h.table, h.priority) for h in theirs.hits]):
            # the un-NAT-ed headers decide this stage: trace them (a changed source would not
            # pass SpoofGuard again, so only a translated destination is traced so)
            aligned = ovs.trace(_spec(state, dict(over, **{key: want[key] for key in keys}),
                                      dp_hash), [ct_next[k - 1]] * MAX_CT)
            theirs = next((s for s in aligned.stages[1:]
                           if s.hits and s.hits[0].table == ours[0][0]), None)
        assert theirs is not None, (state, k, ours)
        assert ours == [(h.table, h.priority) for h in theirs.hits], (k, ours, theirs.hits)
    outs = sorted(str(o.port) for o in run.outputs)
    assert outs == sorted(str(o) for o in theirs.outputs), (outs, theirs.outputs)
    if run.outputs and run.outputs[0].port != "CONTROLLER":
        final = run.outputs[0].state
        for key in ("pkt_mark", "tun_dst"):
            assert final.get(key, 0) == theirs.final.get(key, 0), (key, final, theirs.final)
    return len(stages)


def test_every_ovs_pass_agrees_with_the_real_open_vswitch():
    import ovs_oracle as oracle
    with recorded_passes() as passes:
        for question in ORACLE_QUESTIONS:
            trace(*question)
    assert len(passes) >= 30
    assert {d for _, d, _, _ in passes} == {"request", "reply"}
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    snap = open_snapshot(Bundle.open(V2))
    compared = stages = 0
    for node in ("node1", "node2"):
        try:
            ovs = oracle.PrivateOvs.start_node(V2 / "nodes" / node)
        except oracle.OvsUnavailable as exc:
            pytest.skip(str(exc))
        try:
            bridge = snap.node(node).bridge
            for at, direction, state, runs in passes:
                if at != node:
                    continue
                for run in runs:
                    stages += compare_pass(ovs, bridge, state, run, direction)
                    compared += 1
        finally:
            ovs.close()
    assert compared >= 30 and stages >= 90, (compared, stages)

