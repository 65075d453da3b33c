"""`traceflow audit`: nothing drifts on the unmodified examples; drift planted in copies (a
stale KUBE-SEP chain, a missing group bucket, a policy whose flows were not updated, a node
missing a peer route or tunnel flow, a pod with a wrong gateway ARP entry) is found with the
bundle line it comes from."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def audit(bundle, *extra):
    res = runner.invoke(app, ["audit", "--bundle", str(bundle), "-o", "json", *extra])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.output)


def copy(name, tmp_path) -> Path:
    dst = tmp_path / name
    shutil.copytree(EXAMPLES / name, dst)
    return dst


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} not once in {path}"
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("bundle", ["antrea-encap-kube-proxy", "antrea-proxy-v1", "antrea-v2",
                                    "kube-proxy-iptables", "cilium-kpr-native", "cilium-eni",
                                    "cilium-vxlan-policy", "flannel-vxlan", "calico-vxlan",
                                    "aws-vpc-cni", "azure-cni"])
def test_unmodified_examples_have_no_drift(bundle):
    code, doc = audit(EXAMPLES / bundle)
    assert code == 0
    assert doc["findings"] == []
    s = doc["summary"]
    assert s["pairs"] == s["service_ports"] * s["client_groups"]
    # every pair that is not delivered says why
    assert all(p["reason"] for p in doc["pairs"] if p["verdict"] != "delivered")


def test_seed_matrix_and_reasons():
    _, doc = audit(EXAMPLES / "antrea-encap-kube-proxy")
    pairs = {(p["client"], p["service"]): p for p in doc["pairs"]}
    assert pairs[("default/{role=frontend}", "default/backendsvc:80/TCP")]["verdict"] == "delivered"
    # backendpolicy lets backends talk to nothing: the branch to the other backend is dropped
    p = pairs[("default/{role=backend}", "default/backendsvc:80/TCP")]
    assert p["verdict"] == "partial" and "EgressDefaultRule" in p["reason"]
    assert p["pods"] == ["default/backend1", "default/backend2"]   # one pod per node


def test_all_pods_flag():
    _, grouped = audit(EXAMPLES / "antrea-encap-kube-proxy")
    _, each = audit(EXAMPLES / "antrea-encap-kube-proxy", "--all-pods")
    assert grouped["summary"]["client_groups"] == 4
    # the Running, non-host-network pods with an IP: frontend, backend1/2, 2 coredns, octant
    assert each["summary"]["client_groups"] == 6


def test_stale_kube_sep_chain(tmp_path):
    b = copy("kube-proxy-iptables", tmp_path)
    # node1's KUBE-SEP chain still DNATs to a pod IP the EndpointSlice no longer lists
    edit(b / "nodes/node1/iptables-save.txt", "-j DNAT --to-destination 10.244.3.65:8080",
         "-j DNAT --to-destination 10.244.3.99:8080")
    code, doc = audit(b)
    assert code == 1
    got = {(f["subject"], f["message"].split(",")[0]) for f in doc["findings"]}
    assert got == {
        ("analytics/api-primary:80/TCP on node1",
         "netfilter balances to 10.244.3.99:8080"),
        ("analytics/api-primary:80/TCP on node1",
         "the EndpointSlices list 10.244.3.65:8080 but netfilter never balances to it (missing backend)"),
    }
    stale = next(f for f in doc["findings"] if "10.244.3.99" in f["message"])
    assert stale["evidence"][0].startswith("nodes/node1/iptables-save.txt:1789:")


def test_stale_cilium_lb_map_slot(tmp_path):
    b = copy("cilium-vxlan-policy", tmp_path)
    # worker1's service map still has a slot for a backend the EndpointSlice no longer lists
    edit(b / "nodes/worker1/cilium-bpf-lb-list.txt", "10.0.2.45:8080 (7) (1)",
         "10.0.2.99:8080 (7) (1)")
    code, doc = audit(b)
    assert code == 1
    got = {(f["subject"], f["message"].split(",")[0]) for f in doc["findings"]}
    assert got == {
        ("shop/web:80/TCP on worker1", "cilium lb map balances to 10.0.2.99:8080"),
        ("shop/web:80/TCP on worker1",
         "the EndpointSlices list 10.0.2.45:8080 but cilium lb map never balances to it "
         "(missing backend)"),
    }
    stale = next(f for f in doc["findings"] if "10.0.2.99" in f["message"])
    assert stale["evidence"][0].startswith("nodes/worker1/cilium-bpf-lb-list.txt:6:")


def test_cilium_pairs_are_traced_end_to_end():
    """A Cilium bundle has no OVS flows, yet its pods' packets are walked through the BPF
    programs: the policy denial of shop/batch is found, not a host-only approximation."""
    code, doc = audit(EXAMPLES / "cilium-vxlan-policy")
    assert code == 0 and not any("host-only" in n for n in doc.get("notes", []))
    batch = next(p for p in doc["pairs"] if "role=batch" in p["client"]
                 and p["service"].startswith("shop/web:"))
    assert batch["verdict"] == "dropped" and "DROP_POLICY" in batch["reason"]


def test_missing_group_bucket(tmp_path):
    b = copy("antrea-proxy-v1", tmp_path)
    edit(b / "nodes/node1/ovs-groups.txt",
         ",bucket=bucket_id:1,weight:100,actions=set_field:0xa0a0102->reg3,"
         "set_field:0x20fb/0xffff->reg4,resubmit(,41)", "")
    code, doc = audit(b)
    assert code == 1
    assert len(doc["findings"]) == 1
    f = doc["findings"][0]
    assert f["kind"] == "backends" and f["subject"] == "default/web-sticky:443/TCP on node1"
    assert "10.10.1.2:8443" in f["message"] and "missing backend" in f["message"]
    assert any(e.startswith("nodes/node1/ovs-groups.txt:4:") for e in f["evidence"])


def test_unequal_bucket_weights(tmp_path):
    b = copy("antrea-proxy-v1", tmp_path)
    edit(b / "nodes/node1/ovs-groups.txt",
         "bucket=bucket_id:1,weight:100,actions=set_field:0xa0a0102->reg3,set_field:0x20fb",
         "bucket=bucket_id:1,weight:300,actions=set_field:0xa0a0102->reg3,set_field:0x20fb")
    _, doc = audit(b)
    assert [f["message"] for f in doc["findings"]] == [
        "ovs-group splits new connections unequally (10.10.0.4 25%, 10.10.1.2 75%)"]


def test_policy_whose_flows_were_not_updated(tmp_path):
    b = copy("antrea-encap-kube-proxy", tmp_path)
    # the policy now admits the frontend on 8080 only; the flows still allow port 80
    text = (b / "k8s/networkpolicies.yaml").read_text()
    i = text.index("name: backendpolicy")
    j = text.index("- port: 80", i)
    (b / "k8s/networkpolicies.yaml").write_text(text[:j] + "- port: 8080" + text[j + 10:])
    code, doc = audit(b)
    assert code == 1
    assert sorted(f["subject"] for f in doc["findings"]) == [
        "default/frontend -> default/backend1:80/TCP",
        "default/frontend -> default/backend2:80/TCP"]
    for f in doc["findings"]:
        assert f["kind"] == "policy"
        assert "deliver a connection the NetworkPolicies as written deny" in f["message"]
        assert "default/backendpolicy" in f["message"]


def test_node_missing_peer_route(tmp_path):
    b = copy("antrea-encap-kube-proxy", tmp_path)
    edit(b / "nodes/worker1/ip-route.txt", "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink\n",
         "")
    code, doc = audit(b)
    assert code == 1
    routes = [f for f in doc["findings"] if f["kind"] == "peer-route"]
    assert len(routes) == 1
    assert routes[0]["subject"] == "worker1 -> worker2 pods 10.222.2.0/24"
    assert "falls to the default route" in routes[0]["message"]
    assert routes[0]["evidence"] == ["nodes/worker1/ip-route.txt:1: default via 10.79.1.1 dev "
                                     "ens160 proto static"]


def test_node_missing_tunnel_flow(tmp_path):
    b = copy("antrea-encap-kube-proxy", tmp_path)
    flows = b / "nodes/worker1/ovs-flows.txt"
    lines = flows.read_text().splitlines(keepends=True)
    assert "nw_dst=10.222.2.0/24" in lines[50]          # line 51: the tunnel flow to worker2
    flows.write_text("".join(lines[:50] + lines[51:]))
    _, doc = audit(b)
    tunnel = [f for f in doc["findings"] if "tunnel flow" in f["message"]]
    assert [f["subject"] for f in tunnel] == ["worker1 -> worker2 pods 10.222.2.0/24"]


def test_pod_gateway_arp_disagrees(tmp_path):
    b = copy("antrea-encap-kube-proxy", tmp_path)
    edit(b / "pods/default/frontend/ip-neigh.txt", "lladdr 4e:99:08:c1:53:be",
         "lladdr 4e:99:08:c1:53:00")
    _, doc = audit(b)
    gw = [f for f in doc["findings"] if f["kind"] == "pod-gateway"]
    assert len(gw) == 1 and gw[0]["subject"] == "default/frontend"
    assert "4e:99:08:c1:53:00" in gw[0]["message"] and "4e:99:08:c1:53:be" in gw[0]["message"]
    assert gw[0]["evidence"][0].startswith("pods/default/frontend/ip-neigh.txt:1:")


def test_audit_needs_a_bundle():
    res = runner.invoke(app, ["audit"], env={"TRACEFLOW_BUNDLE": ""})
    assert res.exit_code == 2 and "--bundle" in res.output
