"""Changing the bundle changes the verdict truthfully; bad input gives exit 2 with a location.

Each test edits a copy of the example bundle the way a real cluster goes wrong (a policy that
no longer allows, a lost route, a missing flow or neighbour, a truncated capture).
"""

import json
import shutil
import tarfile

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

runner = CliRunner()


@pytest.fixture
def bundle(tmp_path):
    dest = tmp_path / "bundle"
    shutil.copytree(example_path(), dest)
    return dest


def edit_lines(path, keep=None, replace=None):
    lines = path.read_text().splitlines()
    if keep is not None:
        lines = [l for l in lines if keep(l)]
    if replace is not None:
        lines = [replace(l) for l in lines]
    path.write_text("\n".join(lines) + "\n")


def trace(bundle, *extra):
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle),
                            "-o", "json", *extra])
    return r.exit_code, (json.loads(r.stdout) if r.exit_code in (0, 1) else r)


def path_to(doc, endpoint):
    return next(p for p in doc["paths"] if p["endpoint"] == endpoint)


def drop_backend2_allow_flows(bundle):
    # the flows that realise backendpolicy's ingress rule on worker2 (conjunction 1, table 90)
    edit_lines(bundle / "nodes/worker2/ovs-flows.txt",
               keep=lambda l: not ("table=90" in l and ("conjunction(1," in l or "conj_id=1" in l)))


def test_policy_without_the_allow_rule_drops_at_ingress_default(bundle):
    pols = yaml.safe_load((bundle / "k8s/networkpolicies.yaml").read_text())
    for item in pols["items"]:
        if item["metadata"]["name"] == "backendpolicy":
            item["spec"]["ingress"] = []
    (bundle / "k8s/networkpolicies.yaml").write_text(yaml.safe_dump(pols))
    drop_backend2_allow_flows(bundle)
    code, doc = trace(bundle)
    assert code == 1 and doc["verdict"] == "partial"
    p2 = path_to(doc, "default/backend2")
    assert p2["verdict"] == "dropped"
    d = p2["drop"]
    assert (d["node"], d["component"], d["table"]) == ("worker2", "ovs", "100")
    assert d["rule"].endswith("priority=200,ip,reg1=0x23 actions=drop")
    assert "default/backendpolicy" in d["reason"] and "none of its ingress rules" in d["reason"]
    assert "TCP/80 from 10.222.1.48" in d["reason"]
    assert path_to(doc, "default/backend1")["verdict"] == "delivered"
    # the request leg stops where the drop happened: no reply leg
    assert [l["direction"] for l in p2["legs"]] == ["request", "request"]


def test_flows_that_disagree_with_the_policy_are_called_out(bundle):
    drop_backend2_allow_flows(bundle)        # the policy still allows it
    code, doc = trace(bundle)
    d = path_to(doc, "default/backend2")["drop"]
    assert "backendpolicy ingress rule 1 allows TCP/80" in d["reason"]
    assert "has not" in d["reason"]


def test_missing_route_to_the_peer_pod_cidr(bundle):
    edit_lines(bundle / "nodes/worker1/ip-route.txt",
               keep=lambda l: not l.startswith("10.222.2.0/24 via"))
    code, doc = trace(bundle)
    assert code == 1 and doc["verdict"] == "partial"
    d = path_to(doc, "default/backend2")["drop"]
    assert (d["node"], d["component"], d["table"]) == ("worker1", "route", "main")
    assert d["rule"].startswith("default via 10.79.1.1 dev ens160")
    assert "10.222.2.0/24" in d["reason"] and "missing" in d["reason"]


def test_removed_l2_flow_drops_at_output_table(bundle):
    edit_lines(bundle / "nodes/worker2/ovs-flows.txt",
               keep=lambda l: not ("table=80" in l and "dl_dst=c6:f4:b5:76:10:38" in l))
    code, doc = trace(bundle)
    d = path_to(doc, "default/backend2")["drop"]
    assert (d["node"], d["component"], d["table"]) == ("worker2", "ovs", "110")
    assert d["rule"].endswith("table=110, priority=0 actions=drop")
    assert "c6:f4:b5:76:10:38" in d["reason"] and "no output port" in d["reason"]


def test_failed_neighbour_is_a_drop(bundle):
    edit_lines(bundle / "nodes/worker1/ip-neigh.txt",
               replace=lambda l: "10.222.2.1 dev antrea-gw0 FAILED" if l.startswith("10.222.2.1 ") else l)
    code, doc = trace(bundle)
    d = path_to(doc, "default/backend2")["drop"]
    assert (d["node"], d["component"]) == ("worker1", "neigh")
    assert "neighbour unreachable" in d["reason"]


def test_absent_neighbour_is_answered_by_the_ovs_arp_responder(bundle):
    edit_lines(bundle / "nodes/worker1/ip-neigh.txt", keep=lambda l: not l.startswith("10.222.2.1 "))
    code, doc = trace(bundle)
    assert code == 0
    leg = path_to(doc, "default/backend2")["legs"][0]
    neigh = next(h for h in leg["hops"] if h["component"] == "neigh")
    assert "ARP responder" in neigh["effect"] and neigh["packet"]["dl_dst"] == "aa:bb:cc:dd:ee:ff"


def test_missing_node_files_give_unknown_naming_the_file(bundle):
    (bundle / "nodes/worker2/ovs-flows.txt").unlink()
    code, doc = trace(bundle)
    assert code == 1
    p2 = path_to(doc, "default/backend2") if any(p["endpoint"] for p in doc["paths"]
                                                 if p["endpoint"] == "default/backend2") else \
        next(p for p in doc["paths"] if p["verdict"] == "unknown")
    assert p2["verdict"] == "unknown"
    assert "needs nodes/worker2/ovs-flows.txt" in p2["drop"]["reason"]


def test_unknown_action_is_unknown_not_a_crash(bundle):
    edit_lines(bundle / "nodes/worker1/ovs-flows.txt",
               replace=lambda l: l.replace("actions=ct(table=31,zone=65520)",
                                           "actions=frobnicate(42),ct(table=31,zone=65520)"))
    code, doc = trace(bundle)
    assert code == 1 and doc["verdict"] == "unknown"
    d = doc["paths"][0]["drop"]
    assert (d["node"], d["component"], d["table"]) == ("worker1", "ovs", "30")
    assert "frobnicate(42)" in d["reason"]


def test_truncated_flow_line_is_exit_2_with_file_line_and_text(bundle):
    path = bundle / "nodes/worker1/ovs-flows.txt"
    lines = path.read_text().splitlines()
    n = next(i for i, l in enumerate(lines) if "table=40" in l and "nw_dst=10.96.0.0/12" in l)
    lines[n] = lines[n][:60]
    path.write_text("\n".join(lines) + "\n")
    code, r = trace(bundle)
    assert code == 2
    assert "nodes/worker1/ovs-flows.txt" in r.stderr and f"line {n + 1}" in r.stderr
    assert lines[n] in r.stderr and "Traceback" not in r.stderr


def test_garbage_iptables_line_is_exit_2(bundle):
    path = bundle / "nodes/worker1/iptables-nat-list.txt"
    lines = path.read_text().splitlines()
    lines.insert(3, "}}}} this is not iptables output {{{{")
    path.write_text("\n".join(lines) + "\n")
    code, r = trace(bundle)
    assert code == 2
    assert "nodes/worker1/iptables-nat-list.txt" in r.stderr and "line 4" in r.stderr


def test_bad_names_and_bad_bundles(bundle, tmp_path):
    r = runner.invoke(app, ["pod-to-svc", "frontnd", "backendsvc", "--bundle", str(bundle)])
    assert r.exit_code == 2 and "did you mean: frontend" in r.stderr
    r = runner.invoke(app, ["pod-to-svc", "frontend", "nosuchsvc", "--bundle", str(bundle)])
    assert r.exit_code == 2 and "service default/nosuchsvc not found" in r.stderr
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "bundle not found" in r.stderr
    (bundle / "manifest.yaml").write_text("format: [unclosed\n")
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle)])
    assert r.exit_code == 2 and "manifest.yaml" in r.stderr and "Traceback" not in r.stderr


def test_tarball_bundle_gives_the_same_trace(bundle, tmp_path):
    tgz = tmp_path / "bundle.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(bundle, arcname="snapshot")
    code_dir, doc_dir = trace(bundle)
    code_tgz, doc_tgz = trace(tgz)
    assert code_dir == code_tgz == 0
    assert doc_dir == doc_tgz
