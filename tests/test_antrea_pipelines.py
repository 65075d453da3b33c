"""The AntreaProxy pipelines end to end: the v1.4 numbered pipeline (examples/antrea-proxy-v1)
and the current named pipeline (examples/antrea-v2).

For each bundle: the per-node OVS table sequence of every path and leg (as the pipeline
documents describe them), the select-group buckets as weighted paths, the DNAT target per
path, the un-DNAT of the reply in conntrack zone 65520, register/mark meanings by version,
the bundle's provenance, and a real Open vSwitch that must accept every flow, group and table
name and agree with traceflow on the first leg (``ofproto/trace``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "traceflow" / "examples"
V1 = EXAMPLES / "antrea-proxy-v1"
V2 = EXAMPLES / "antrea-v2"
DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
V2_CLIENT = "client-6c8b7d5d8f-hv2kw"
runner = CliRunner()


def run_json(*args):
    result = runner.invoke(app, [*args, "-o", "json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def v1_doc():
    code, doc = run_json("pod-to-svc", "client", "web", "--bundle", str(V1))
    assert code == 0, doc
    return doc


@pytest.fixture(scope="module")
def v2_doc():
    code, doc = run_json("pod-to-svc", V2_CLIENT, "web", "--bundle", str(V2))
    assert code == 0, doc
    return doc


def path_to(doc, endpoint):
    (path,) = [p for p in doc["paths"] if p["endpoint"] == endpoint]
    return path


def ovs_hops(leg, node):
    return [h for h in leg["hops"] if h["component"] == "ovs" and h["node"] == node]


def tables(leg, node):
    return [int(h["table"]) for h in ovs_hops(leg, node)]


def names(leg, node):
    return [h["table_name"] for h in ovs_hops(leg, node)]


def hop(leg, node, name, nth=0):
    return [h for h in ovs_hops(leg, node) if h["table_name"] == name][nth]


# ============================================================================ v1.4 (seed 003)

V1_LOCAL, V1_REMOTE = "default/web-6f8d9c7b5-2xq4z", "default/web-6f8d9c7b5-9kfwp"
# ServiceHairpin/ServiceConntrack/ConntrackZone/ConntrackState, then the ServiceLB chain that
# table 31's table-miss flow resubmits to (35, 40, 41), EndpointDNAT's ct(commit) to 45 ...
V1_FRONT = [0, 10, 23, 24, 30, 31, 35, 40, 41, 42, 45, 50, 60, 61, 70, 72, 80]
V1_TO_POD = [85, 90, 100, 101, 105, 108, 110]          # a local Pod: ingress policy tables
V1_TO_TUNNEL = [101, 105, 108, 110]                     # gateway / tunnel MAC skip them
V1_FROM_TUNNEL = [0, 24, 30, 31, 35, 40, 41, 42, 45, 50, 60, 61, 70, 72, 80]
V1_REPLY_POD = [0, 10, 23, 24, 30, 31, 50, 61, 70, 72, 80]   # est: 31 -> 50 -> 61
V1_REPLY_TUNNEL = [0, 24, 30, 31, 50, 61, 70, 72, 80]
V1_REPLY_TO_POD = [85, 101, 105, 108, 110]              # est: 85 (64990) -> 101


def test_v1_two_weighted_paths_both_delivered(v1_doc):
    assert v1_doc["verdict"] == "delivered"
    assert sorted(p["endpoint"] for p in v1_doc["paths"]) == [V1_LOCAL, V1_REMOTE]
    assert [p["weight"] for p in v1_doc["paths"]] == [0.5, 0.5]
    for p, bucket in ((path_to(v1_doc, V1_LOCAL), 0), (path_to(v1_doc, V1_REMOTE), 1)):
        assert p["verdict"] == "delivered" and p["drop"] is None
        assert p["choices"] == [f"node1 OVS group 9: bucket {bucket} (50% of new connections)"]
        assert [l["direction"] for l in p["legs"]] == ["request", "reply"]
        assert all(l["verdict"] == "delivered" for l in p["legs"])


def test_v1_local_endpoint_tables(v1_doc):
    request, reply = path_to(v1_doc, V1_LOCAL)["legs"]
    assert tables(request, "node1") == V1_FRONT + V1_TO_POD
    assert names(request, "node1")[:10] == [
        "Classifier", "SpoofGuard", "ServiceHairpin", "ServiceConntrack", "ConntrackZone",
        "ConntrackState", "ServiceClassifier", "SessionAffinity", "ServiceLB", "EndpointDNAT"]
    assert names(request, "node1")[-3:] == ["ConntrackCommit", "HairpinSNAT", "L2ForwardingOut"]
    assert {h["node"] for h in request["hops"]} == {"node1"}
    assert tables(reply, "node1") == V1_REPLY_POD + V1_REPLY_TO_POD
    assert request["hops"][-1]["effect"].startswith(f"delivered to {V1_LOCAL} (10.10.0.4)")


def test_v1_remote_endpoint_tables_and_tunnel(v1_doc):
    request, reply = path_to(v1_doc, V1_REMOTE)["legs"]
    assert tables(request, "node1") == V1_FRONT + V1_TO_TUNNEL
    assert tables(request, "node2") == V1_FROM_TUNNEL + V1_TO_POD
    tunnel = next(h for h in request["hops"] if h["component"] == "tunnel")
    assert "192.168.77.100 -> 192.168.77.101" in tunnel["effect"]
    l3 = hop(request, "node1", "L3Forwarding")
    assert "tun_dst 0xc0a84d65 = 192.168.77.101 (node2)" in l3["notes"]
    assert tables(reply, "node2") == V1_REPLY_POD + V1_TO_TUNNEL
    assert tables(reply, "node1") == V1_REPLY_TUNNEL + V1_REPLY_TO_POD


@pytest.mark.parametrize("endpoint,ip", [(V1_LOCAL, "10.10.0.4"), (V1_REMOTE, "10.10.1.2")])
def test_v1_dnat_in_zone_65520_and_undnat_of_the_reply(v1_doc, endpoint, ip):
    request, reply = path_to(v1_doc, endpoint)["legs"]
    dnat = hop(request, "node1", "EndpointDNAT")
    assert f"DNAT 10.10.0.3:54321 -> 10.101.112.140:80 -> 10.10.0.3:54321 -> {ip}:80" in dnat["effect"]
    assert "conntrack zone 65520" in dnat["effect"]
    # the NAT-ed packet is the recirculated one: it continues in table 45
    assert hop(request, "node1", "AntreaPolicyEgressRule")["packet"]["nw_dst"] == ip
    assert "ct_mark=0x21: Service connection DNAT-ed in OVS (AntreaProxy)" in dnat["notes"]
    delivered = request["hops"][-1]
    assert delivered["packet"]["nw_dst"] == ip
    # the reply is un-DNAT-ed by node1's ConntrackZone (zone 65520, nat)
    undnat = hop(reply, "node1", "ConntrackZone")
    assert "conntrack zone 65520: un-NAT by the existing connection" in undnat["effect"]
    assert hop(reply, "node1", "ConntrackState")["packet"]["nw_src"] == "10.101.112.140"
    assert "ct_mark=0x21: Service connection DNAT-ed in OVS (AntreaProxy)" in \
        hop(reply, "node1", "ConntrackState")["notes"]
    last = reply["hops"][-1]
    assert last["effect"].startswith("delivered to default/client (10.10.0.3)")
    assert (last["packet"]["nw_src"], last["packet"]["tp_src"]) == ("10.101.112.140", 80)


def test_v1_register_meanings(v1_doc):
    request = path_to(v1_doc, V1_REMOTE)["legs"][0]
    assert "reg4[16..18]=0x2: Service: endpoint selected" in hop(request, "node1", "ServiceLB")["notes"]
    assert "reg3=0xa0a0102: selected Service endpoint IP 10.10.1.2" in \
        hop(request, "node1", "ServiceLB")["notes"]
    assert "reg0[16]=0x1: destination MAC known (output port found)" in \
        hop(request, "node1", "L2ForwardingCalc")["notes"]
    assert "reg0[0..3]=0x0: from the tunnel (another Node)" in hop(request, "node2", "Classifier")["notes"]
    # table 35 has no table-miss flow: the resubmit returns and table 31's next resubmit goes on
    miss = hop(request, "node1", "ServiceClassifier")
    assert miss["rule"] is None and "calling flow's remaining actions go on" in miss["effect"]


def test_v1_session_affinity_learn_then_dnat():
    code, doc = run_json("pod-to-svc", "client", "web-sticky", "--bundle", str(V1))
    assert code == 0
    assert [p["weight"] for p in doc["paths"]] == [0.5, 0.5]
    for p, ip in zip(doc["paths"], ("10.10.0.4", "10.10.1.2")):
        request = p["legs"][0]
        first, second = hop(request, "node1", "ServiceLB"), hop(request, "node1", "ServiceLB", 1)
        assert "group 5 (select, 2 buckets)" in first["effect"]
        assert "reg4[16..18]=0x3: Service: endpoint selected, cache it (session affinity)" in first["notes"]
        assert second["priority"] == 190 and second["effect"].startswith("learn:")
        assert f"-> {ip}:8443" in hop(request, "node1", "EndpointDNAT")["effect"]
        assert p["verdict"] == "delivered"


# ============================================================================ v2 (named tables)

V2_LOCAL, V2_REMOTE = "default/web-7975b6c6c-8ltqd", "default/web-7975b6c6c-w9rfz"
# proxyAll: PreRoutingClassifier resubmits NodePortMark (whose table-miss flow goes on to
# SessionAffinity), then SessionAffinity again, then ServiceLB (the document's flows)
V2_FRONT = ["PipelineRootClassifier", "Classifier", "SpoofGuard", "UnSNAT", "ConntrackZone",
            "ConntrackState", "PreRoutingClassifier", "NodePortMark", "SessionAffinity",
            "SessionAffinity", "ServiceLB",
            "EndpointDNAT", "AntreaPolicyEgressRule", "EgressRule", "EgressDefaultRule",
            "EgressMetric", "L3Forwarding", "L3DecTTL", "SNATMark", "SNAT", "L2ForwardingCalc",
            "TrafficControl", "IngressSecurityClassifier"]
V2_INGRESS = ["AntreaPolicyIngressRule", "IngressRule", "IngressMetric", "ConntrackCommit", "Output"]
V2_SKIP_INGRESS = ["IngressMetric", "ConntrackCommit", "Output"]      # to the tunnel (reg0 0x10/0xf0)
V2_FROM_TUNNEL = ["PipelineRootClassifier", "Classifier"] + V2_FRONT[3:]
# an established reply: ConntrackState -> AntreaPolicyEgressRule (64990 -new+est) -> EgressMetric
V2_REPLY = ["PipelineRootClassifier", "Classifier", "SpoofGuard", "UnSNAT", "ConntrackZone",
            "ConntrackState", "AntreaPolicyEgressRule", "EgressMetric", "L3Forwarding",
            "L3DecTTL", "SNATMark", "SNAT", "L2ForwardingCalc", "TrafficControl",
            "IngressSecurityClassifier"]
V2_REPLY_INGRESS = ["AntreaPolicyIngressRule", "IngressMetric", "ConntrackCommit", "Output"]


def test_v2_two_weighted_paths_both_delivered(v2_doc):
    assert v2_doc["verdict"] == "delivered"
    assert sorted(p["endpoint"] for p in v2_doc["paths"]) == [V2_LOCAL, V2_REMOTE]
    assert [p["weight"] for p in v2_doc["paths"]] == [0.5, 0.5]
    for p, bucket in ((path_to(v2_doc, V2_LOCAL), 0), (path_to(v2_doc, V2_REMOTE), 1)):
        assert p["verdict"] == "delivered" and p["drop"] is None
        assert p["choices"] == [f"node1 OVS group 10: bucket {bucket} (50% of new connections)"]


def test_v2_local_endpoint_tables(v2_doc):
    request, reply = path_to(v2_doc, V2_LOCAL)["legs"]
    assert names(request, "node1") == V2_FRONT + V2_INGRESS
    # numbered as ovs-tables.txt says: PipelineRootClassifier 0 ... Output 30 (31 tables with
    # proxyAll's NodePortMark)
    assert tables(request, "node1")[:4] == [0, 3, 4, 5] and tables(request, "node1")[-1] == 30
    assert names(reply, "node1") == V2_REPLY + V2_REPLY_INGRESS
    est = hop(reply, "node1", "AntreaPolicyEgressRule")
    assert est["priority"] == 64990 and "ct_state=-new+est" in est["rule"]


def test_v2_remote_endpoint_tables(v2_doc):
    request, reply = path_to(v2_doc, V2_REMOTE)["legs"]
    assert names(request, "node1") == V2_FRONT + V2_SKIP_INGRESS
    assert names(request, "node2") == V2_FROM_TUNNEL + V2_INGRESS
    assert names(reply, "node2") == V2_REPLY + V2_SKIP_INGRESS
    assert names(reply, "node1") == V2_FROM_TUNNEL[:4] + V2_REPLY[5:] + V2_REPLY_INGRESS
    l3 = hop(request, "node1", "L3Forwarding")
    assert "set_field:192.168.77.103->tun_dst" in l3["rule"]
    assert "tun_dst 0xc0a84d67 = 192.168.77.103 (node2)" in l3["notes"]
    out = hop(request, "node1", "Output")
    assert "32768 (antrea-tun0)" in out["effect"]


@pytest.mark.parametrize("endpoint,ip,node", [(V2_LOCAL, "10.10.0.24", "node1"),
                                              (V2_REMOTE, "10.10.1.6", "node2")])
def test_v2_dnat_policy_and_undnat(v2_doc, endpoint, ip, node):
    request, reply = path_to(v2_doc, endpoint)["legs"]
    dnat = hop(request, "node1", "EndpointDNAT")
    assert f"-> 10.10.0.26:54321 -> {ip}:80" in dnat["effect"] and "zone 65520" in dnat["effect"]
    assert "ct_mark[4]=0x1: Service connection (ServiceCTMark)" in dnat["notes"]
    # the K8s NetworkPolicy's ingress rule (conjunction 3) admits the client on the server's node
    ingress = hop(request, node, "IngressRule")
    assert ingress["priority"] == 190 and "conj_id=3" in ingress["rule"]
    assert "conjunction 3: all 3 clauses matched" in ingress["notes"]
    assert "clause 1/3: ip,nw_src=10.10.0.26 (line" in " ".join(ingress["notes"])
    assert request["hops"][-1]["packet"]["nw_dst"] == ip
    undnat = hop(reply, "node1", "ConntrackZone")
    assert "un-NAT by the existing connection" in undnat["effect"]
    assert "ct_mark=0x10/0x10: Service connection (ServiceCTMark)" in \
        hop(reply, "node1", "ConntrackState")["notes"]
    last = reply["hops"][-1]
    assert last["effect"].startswith(f"delivered to default/{V2_CLIENT} (10.10.0.26)")
    assert (last["packet"]["nw_src"], last["packet"]["tp_src"]) == ("10.105.31.235", 80)


def test_v2_register_meanings_at_their_v2_positions(v2_doc):
    request = path_to(v2_doc, V2_REMOTE)["legs"][0]
    l2 = hop(request, "node1", "L2ForwardingCalc")
    assert "reg0[21..22]=0x1: output port found: output to the OVS port in reg1 " \
           "(OutputToOFPortRegMark)" in l2["notes"]
    assert "reg1=0x8000: output port 32768 antrea-tun0" in l2["notes"]
    assert "reg0[0..3]=0x3: from a local Pod" in hop(request, "node1", "Classifier")["notes"]
    assert "reg0[0..3]=0x1: from the tunnel (another Node)" in hop(request, "node2", "Classifier")["notes"]
    lb = hop(request, "node1", "ServiceLB")["notes"]
    assert "reg4[26]=0x1: Service: the selected Endpoint is a remote (non-hostNetwork) Pod" in lb
    assert "reg7=0xa: Service group id 10" in lb
    commit = hop(request, "node1", "ConntrackCommit")
    # exec(move:NXM_NX_REG0[0..3]->NXM_NX_CT_MARK[0..3]) reads the packet's register
    assert "copy reg0[0..3] (0x3) to ct_mark[0..3]" in commit["effect"]
    assert "ct_mark[0..3]=0x3: connection source: a local Pod" in commit["notes"]


def test_service_without_endpoints_goes_to_the_agent():
    code, doc = run_json("pod-to-svc", V2_CLIENT, "idle", "--bundle", str(V2), "--no-reply")
    assert code == 1
    (path,) = doc["paths"]
    assert path["verdict"] == "dropped"
    notes = hop(path["legs"][0], "node1", "ServiceLB")["notes"]
    assert "reg0[14]=0x1: Service without Endpoints (SvcNoEpRegMark): sent to the agent" in notes
    assert "controller" in path["drop"]["reason"]


def test_v2_ovs_trace_component_names_tables():
    spec = ("in_port=client-6-3353ef,tcp,dl_src=5e:b5:e3:a6:90:b7,dl_dst=ba:5e:d1:55:aa:c0,"
            "nw_src=10.10.0.26,nw_dst=10.105.31.235,tp_src=40000,tp_dst=80,nw_ttl=64")
    code, doc = run_json("ovs-trace", "node1", spec, "--bundle", str(V2))
    assert code == 0
    assert sorted(p["endpoint"] for p in doc["paths"]) == ["port 32768 (antrea-tun0)",
                                                           "port 37 (web-7975-274540)"]
    for p in doc["paths"]:
        hops = p["legs"][0]["hops"]
        assert all(h["table_name"] for h in hops)
        assert [h["table_name"] for h in hops][:3] == ["PipelineRootClassifier", "Classifier", "SpoofGuard"]
    text = runner.invoke(app, ["ovs-trace", "node1", spec, "--bundle", str(V2), "--width", "220"])
    assert text.exit_code == 0
    for name in ("PipelineRootClassifier", "EndpointDNAT", "L2ForwardingCalc", "Output"):
        assert name in text.stdout


@pytest.mark.parametrize("bundle,client,svc", [(V1, "client", "web"), (V2, V2_CLIENT, "web")])
def test_unknown_meaning_without_cni_version(tmp_path, bundle, client, svc):
    copy = tmp_path / bundle.name
    shutil.copytree(bundle, copy)
    manifest = (copy / "manifest.yaml").read_text()
    assert "\ncni_version:" in manifest
    (copy / "manifest.yaml").write_text(re.sub(r"\ncni_version:[^\n]*", "", manifest))
    code, doc = run_json("pod-to-svc", client, svc, "--bundle", str(copy))
    assert code == 0 and doc["verdict"] == "delivered"     # matching never depends on meanings
    # (reg1 = the output port is named whatever the version: every Antrea layout keeps it there)
    notes = [n for p in doc["paths"] for l in p["legs"] for h in l["hops"] for n in h["notes"]
             if re.match(r"(reg\d|ct_mark)", n) and not n.startswith("reg1=")]
    assert notes and all("unknown meaning (Antrea version not given in manifest.yaml)" in n
                         for n in notes)
    named = {h["table_name"] for p in doc["paths"] for l in p["legs"] for h in l["hops"]
             if h["component"] == "ovs"}
    # v2 names come from the bundle's ovs-tables.txt; v1's numbered tables stay unnamed
    assert named == ({None} if bundle == V1 else set(V2_FRONT + V2_INGRESS))


def test_unvouched_version_is_unknown_meaning():
    from traceflow.cni.antrea.conventions import AntreaAnnotator
    for version in ("v1.2.0", "v1.5.1", "v2.8.0"):
        ann = AntreaAnnotator(version, "node1", {}, {})
        note = ann.describe_write("reg0", 21, 22, 1, {})
        assert "unknown meaning for Antrea" in note, (version, note)
    assert "output port found" in AntreaAnnotator("v2.1.0", "n", {}, {}).describe_write("reg0", 21, 22, 1, {})
    assert "output port found" in AntreaAnnotator("v1.4.2", "n", {}, {}).describe_write("reg0", 16, 16, 1, {})


# ============================================================================ conventions

def _snapshot(bundle):
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    return open_snapshot(Bundle.open(bundle))


def test_pod_ports_from_spoofguard_flows():
    from traceflow.cni.antrea.conventions import node_pod_ports
    v2 = node_pod_ports(_snapshot(V2).node("node1"))
    assert v2 == {"10.10.0.26": ("client-6-3353ef", "5e:b5:e3:a6:90:b7"),
                  "10.10.0.24": ("web-7975-274540", "fa:b7:53:74:21:a6"),
                  "10.10.0.25": ("db-755c6-5080e3", "36:48:21:a2:9d:b4")}   # not the gateway's
    v1 = node_pod_ports(_snapshot(V1).node("node1"))    # dumped without --names: in_port=4 -> name
    assert v1["10.10.0.3"] == ("client-4f7a21", "ce:f2:73:e6:af:8f")


@pytest.mark.parametrize("bundle", [V1, V2])
def test_arp_responder_answers_for_the_peer_gateway(bundle):
    from traceflow.questions.solver import Solver
    snap = _snapshot(bundle)
    node = snap.node("node1")
    assert Solver(snap)._arp_via_ovs("node1", node, "antrea-gw0", "10.10.1.1") == "aa:bb:cc:dd:ee:ff"
    assert "10.10.1.1 " not in (bundle / "nodes/node1/ip-neigh.txt").read_text()


def _flow_lines(bundle, node):
    return [l.strip() for l in (bundle / "nodes" / node / "ovs-flows.txt").read_text().splitlines()
            if l.strip()]


def _table_of(line):
    m = re.search(r"(?:^|, )table=([^,]+),", line)
    return m.group(1) if m else "0"


def test_every_table_has_its_default_flow():
    for node in ("node1", "node2"):
        by_table: dict = {}
        for l in _flow_lines(V1, node):
            by_table.setdefault(_table_of(l), []).append(l)
        no_miss = {t for t, ls in by_table.items() if not any(" priority=0 " in l for l in ls)}
        assert no_miss == {"30", "35"}, node     # TableMissActionNone in pipeline.go v1.4
        names = re.findall(r'table \d+ \("(\w+)"\)', (V2 / "nodes" / node / "ovs-tables.txt").read_text())
        assert len(names) == 31
        v2_tables = {_table_of(l) for l in _flow_lines(V2, node)}
        assert v2_tables == set(names)
        for t in names:
            assert any(f"table={t}, priority=0 " in l for l in _flow_lines(V2, node)), (node, t)


def _doc_lines(text):
    out, buf = set(), ""
    for raw in text.splitlines():
        line = raw.rstrip()
        piece = re.sub(r"^\s*\d+\.\s+", "", line) if not buf else line.strip()
        if line.endswith("\\"):
            buf += piece[:-1].strip() if buf else piece[:-1].rstrip()
            continue
        out.add((buf + piece).strip())
        buf = ""
    return out


@pytest.mark.parametrize("bundle", [V1, V2])
def test_provenance_covers_every_file_and_flow_line(bundle):
    m = yaml.safe_load((bundle / "manifest.yaml").read_text())
    prov = m["provenance"]
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    assert files - {"manifest.yaml"} == set(prov)
    for name, entry in prov.items():
        assert entry["origin"] in {"seed", "synthesised", "mixed"} and entry["detail"], name
    if bundle == V1:
        doc = _doc_lines((DATA / "seeds/003_39c98c9411a238bc.txt").read_text())
    else:
        doc = set()
        for f in sorted(glob.glob(str(DATA / "antrea-samples/pipeline-*.txt"))):
            doc |= _doc_lines(Path(f).read_text())
        unit = {l.strip() for l in (DATA / "antrea-samples/unit-test-default-table-miss-flows-"
                                             "encap-ipv4.txt").read_text().splitlines()}
    for node in ("node1", "node2"):
        entry = prov[f"nodes/{node}/ovs-flows.txt"]
        cats = {k: entry.get(k, []) for k in ("doc_lines", "unit_test_lines", "realworld_lines",
                                              "adapted_lines", "synthesised_lines")}
        listed = [l for ls in cats.values() for l in ls]
        assert sorted(listed) == sorted(_flow_lines(bundle, node)), "categories must partition the file"
        for l in cats["doc_lines"]:
            body = re.sub(r"^cookie=0x[0-9a-f]+, ", "", l)
            assert body in doc or f"table=0, {body}" in doc, f"not verbatim in the document: {l}"
        for l in cats["unit_test_lines"]:
            assert l in unit
        assert len(cats["doc_lines"]) > len(cats["adapted_lines"])
    if bundle == V2:   # groups 9 and 10 are the document's, text identical
        groups = (bundle / "nodes/node1/ovs-groups.txt").read_text().splitlines()[1:]
        assert sum(g.strip() in doc for g in groups) == 2


# ============================================================================ real Open vSwitch

@contextlib.contextmanager
def private_ovs(bundle, node):
    """One private userspace OVS loaded with a node's table names, meters, groups and flows
    (groups first: a flow may not name a group that does not exist); see
    ovs_oracle.PrivateOvs.start_node."""
    import ovs_oracle as oracle
    try:
        ovs = oracle.PrivateOvs.start_node(bundle / "nodes" / node)
    except oracle.OvsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield ovs
    finally:
        ovs.close()


def _lines(text):
    return sorted(l.strip() for l in text.splitlines() if l.strip())


@pytest.mark.parametrize("bundle,node", [(V1, "node1"), (V1, "node2"), (V2, "node1"), (V2, "node2")])
def test_real_ovs_accepts_every_flow_and_dumps_the_same(bundle, node):
    d = bundle / "nodes" / node
    with private_ovs(bundle, node) as ovs:
        if bundle == V1:
            flows = ovs.ofctl("dump-flows", "br-int", "--no-stats")
            groups = ovs.ofctl("-O", "OpenFlow15", "dump-groups", "br-int")
        else:
            flows = ovs.ofctl("-O", "OpenFlow15", "dump-flows", "br-int", "--names", "--no-stats")
            groups = ovs.ofctl("-O", "OpenFlow15", "dump-groups", "br-int", "--names")
            assert ovs.ofctl("dump-tables", "br-int") == (d / "ovs-tables.txt").read_text()
            # the other accepted source of table names reads the same
            from traceflow.engines.ovs.bridge import parse_tables
            features = ovs.ofctl("-O", "OpenFlow15", "dump-table-features", "br-int")
            assert parse_tables(features, "features") == parse_tables(
                (d / "ovs-tables.txt").read_text(), "tables")
        assert _lines(flows) == _lines((d / "ovs-flows.txt").read_text())
        assert _lines(groups) == _lines((d / "ovs-groups.txt").read_text())


V1_SPEC = ("in_port=4,tcp,dl_src=ce:f2:73:e6:af:8f,dl_dst=ea:b8:5e:a6:c2:4c,nw_src=10.10.0.3,"
           "nw_dst=10.101.112.140,tp_src=54321,tp_dst=80,nw_ttl=64")
V2_SPEC = ("in_port=36,tcp,dl_src=5e:b5:e3:a6:90:b7,dl_dst=ba:5e:d1:55:aa:c0,nw_src=10.10.0.26,"
           "nw_dst=10.105.31.235,tp_src=54321,tp_dst=80,nw_ttl=64")
# one ct_state per ct(table=...) recirculation: v1 24, 30, 42 (commit+DNAT), 105 (commit);
# v2 ConntrackZone, EndpointDNAT, IngressRule (local Pod only), ConntrackCommit
CT_NEXT = ["trk,new", "trk,new", "trk,new,dnat", "trk,new,dnat"]


@pytest.mark.parametrize("bundle,spec,outputs", [(V1, V1_SPEC, {1, 5}), (V2, V2_SPEC, {32768, 37})])
def test_real_ovs_agrees_on_the_first_leg_for_every_bucket(bundle, spec, outputs):
    from traceflow.questions.components import parse_flow_spec
    from traceflow.model.conntrack import Conntrack
    from traceflow.engines.ovs import fields as F
    from traceflow.engines.ovs.pipeline import simulate
    node = _snapshot(bundle).node("node1")
    bits = F.CT_STATE_BITS
    states = [sum(bits[b] for b in s.split(",")) for s in CT_NEXT]
    ours = {}
    for run in simulate(node.bridge, parse_flow_spec(spec, node.bridge), Conntrack(), 0,
                        node.annotator, ct_next=states):
        (out,) = [o.port for o in run.outputs]
        ours[out] = [(h.table, h.flow.priority if h.flow else None) for h in run.hits]
    assert set(ours) == outputs
    theirs = {}
    with private_ovs(bundle, "node1") as ovs:
        for dp_hash in range(1, 9):      # dp_hash picks the select group's bucket
            trace = ovs.trace(f"{spec},dp_hash={dp_hash}", CT_NEXT)
            if trace.outputs:
                (out,) = trace.outputs
                theirs[out] = [(h.table, h.priority) for s in trace.stages for h in s.hits]
    assert set(theirs) == outputs, "ofproto/trace did not reach every bucket"
    for out in outputs:
        assert ours[out] == theirs[out], f"output {out}"


def test_ovs_trace_spec_without_ttl_is_ttl_zero_as_ofproto_trace():
    """ofproto/trace reads a field left out of the flow as 0: with no nw_ttl, the routed hop's
    dec_ttl raises the TTL exception (checked on the real OVS in tests/test_ovs_semantics.py)."""
    spec = ("in_port=client-6-3353ef,tcp,dl_src=5e:b5:e3:a6:90:b7,dl_dst=ba:5e:d1:55:aa:c0,"
            "nw_src=10.10.0.26,nw_dst=10.105.31.235,tp_src=40000,tp_dst=80")
    code, doc = run_json("ovs-trace", "node1", spec, "--bundle", str(V2))
    assert code == 1
    assert all("TTL expired" in p["drop"]["reason"] for p in doc["paths"])
