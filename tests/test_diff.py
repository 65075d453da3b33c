"""`traceflow diff`: an example against a copy with one change names exactly the questions
whose verdict or path changed, the first divergent hop with its line in each bundle, and the
raw change, used ones first."""

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SEED = EXAMPLES / "antrea-encap-kube-proxy"


def diff(before, after, *extra):
    res = runner.invoke(app, ["diff", str(before), str(after), "-o", "json", *extra])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.output)


def test_identical_bundles_have_no_changes(tmp_path):
    shutil.copytree(SEED, tmp_path / "same")
    code, doc = diff(SEED, tmp_path / "same")
    assert code == 0 and doc["changed"] == [] and doc["raw"] == []
    assert doc["summary"]["questions"] > 0


def test_removed_allow_flow(tmp_path):
    after = tmp_path / "after"
    shutil.copytree(SEED, after)
    flows = after / "nodes/worker1/ovs-flows.txt"
    lines = flows.read_text().splitlines(keepends=True)
    # line 39: frontend's egress allow (conjunction 1: TCP 80 to role=backend)
    assert "table=50, priority=190,conj_id=1,ip" in lines[38]
    flows.write_text("".join(lines[:38] + lines[39:]))
    code, doc = diff(SEED, after)
    assert code == 1
    # only the frontend's connections that rule allowed: TCP 80 to backendsvc
    assert [c["question"] for c in doc["changed"]] == [
        "default/{role=frontend} -> default/backendsvc:80/TCP"]
    c = doc["changed"][0]
    assert (c["before_verdict"], c["after_verdict"], c["kind"]) == ("delivered", "dropped", "verdict")
    dv = c["divergence"]
    assert (dv["before"]["file"], dv["before"]["line"]) == ("nodes/worker1/ovs-flows.txt", 39)
    assert dv["after"]["file"] == "nodes/worker1/ovs-flows.txt"
    assert "conj_id=1" in dv["before"]["rule"] and "conj_id=1" not in dv["after"]["rule"]
    assert any(line.startswith("-") and "conj_id=1" in line for line in dv["diff"])
    assert doc["raw"] == [{"change": "-", "where": "nodes/worker1/ovs-flows.txt:39",
                           "node": "worker1", "component": "ovs flows",
                           "text": lines[38].strip(), "used": True}]


def test_changed_route(tmp_path):
    after = tmp_path / "after"
    shutil.copytree(SEED, after)
    routes = after / "nodes/worker1/ip-route.txt"
    text = routes.read_text()
    routes.write_text(text.replace("10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink",
                                   "10.222.2.0/24 via 10.79.1.202 dev ens160"))
    code, doc = diff(SEED, after)
    assert code == 1
    # Service traffic is DNAT-ed in worker1's host stack and routed there: every question
    # from a worker1 client through a Service to an endpoint on worker2 (backend2, the
    # second coredns) changes. Worker1 clients: frontend, backend1 (role=backend's worker1
    # pod), octant, coredns-4qzxk; Services with a worker2 endpoint: backendsvc and
    # kube-dns's three ports.
    clients = ["default/{role=backend} (default/backend1)", "default/{role=frontend}",
               "kube-system/{app=antrea,component=antrea-octant,pod-template-hash=6d56b6df4f}",
               "kube-system/{k8s-app=kube-dns,pod-template-hash=f9fd979d6} "
               "(kube-system/coredns-f9fd979d6-4qzxk)"]
    services = ["default/backendsvc:80/TCP", "kube-system/kube-dns:53/UDP",
                "kube-system/kube-dns:53/TCP", "kube-system/kube-dns:9153/TCP"]
    assert sorted(c["question"] for c in doc["changed"]) == sorted(
        f"{c} -> {s}" for c in clients for s in services)
    for c in doc["changed"]:
        dv = c["divergence"]
        assert (dv["before"]["file"], dv["before"]["line"]) == ("nodes/worker1/ip-route.txt", 5)
        assert (dv["after"]["file"], dv["after"]["line"]) == ("nodes/worker1/ip-route.txt", 5)
        assert dv["diff"] == ["@@ -1 +1 @@",
                              "-10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink",
                              "+10.222.2.0/24 via 10.79.1.202 dev ens160"]
    assert [(r["change"], r["where"], r["used"]) for r in doc["raw"]] == [
        ("-", "nodes/worker1/ip-route.txt:5", True), ("+", "nodes/worker1/ip-route.txt:5", True)]


def test_removed_endpoint(tmp_path):
    before = EXAMPLES / "antrea-proxy-v1"
    after = tmp_path / "after"
    shutil.copytree(before, after)
    groups = after / "nodes/node1/ovs-groups.txt"
    bucket = (",bucket=bucket_id:1,weight:100,actions=set_field:0xa0a0102->reg3,"
              "set_field:0x20fb/0xffff->reg4,resubmit(,41)")
    assert groups.read_text().count(bucket) == 1
    groups.write_text(groups.read_text().replace(bucket, ""))
    code, doc = diff(before, after)
    assert code == 1
    # node1's clients (client, web-2xq4z, coredns) lose web-sticky's second backend; node2's
    # web pod uses node2's groups and does not change
    assert sorted(c["question"] for c in doc["changed"]) == sorted([
        "default/{app=client} -> default/web-sticky:443/TCP",
        "default/{app=web,pod-template-hash=6f8d9c7b5} (default/web-6f8d9c7b5-2xq4z) -> "
        "default/web-sticky:443/TCP",
        "kube-system/{k8s-app=kube-dns,pod-template-hash=6d4b75cb6d} -> "
        "default/web-sticky:443/TCP"])
    for c in doc["changed"]:
        assert "path to default/web-6f8d9c7b5-9kfwp (delivered) only before" in c["paths"]
        assert c["divergence"]["choices"]["before"][0].startswith("node1 OVS group 5: bucket 1")
    raw = doc["raw"]
    assert [(r["change"], r["where"], r["used"]) for r in raw] == [
        ("-", "nodes/node1/ovs-groups.txt:4", True), ("+", "nodes/node1/ovs-groups.txt:4", True)]


def test_diff_with_a_suite(tmp_path):
    after = tmp_path / "after"
    shutil.copytree(SEED, after)
    code, doc = diff(SEED, after, "--suite", str(SEED / "checks.yaml"))
    assert code == 0 and doc["summary"]["questions"] == 9


def test_bad_bundle_exit_2(tmp_path):
    res = runner.invoke(app, ["diff", str(SEED), str(tmp_path / "nope")])
    assert res.exit_code == 2 and "Traceback" not in res.output
