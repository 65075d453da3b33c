"""Antrea support bundles (`antctl supportbundle` output) are accepted wherever a bundle is.

The support bundle here is assembled in Antrea's layout (pkg/support/dump*.go,
pkg/antctl/raw/supportbundle): agent_<node>.tar.gz with ``flows``, ``ovsports``, ``route``,
``address``, ``rule``, ``link``, ``agentinfo``, logs; a ``clusterinfo`` file of ``#pods`` /
``#nodes`` YAML documents. Its file contents are the example bundle's node files.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.bundle.reader import Bundle
from traceflow.cli.app import app, example_path

EXAMPLE = example_path()
runner = CliRunner()
MAP = {"flows": "ovs-flows.txt", "ovsports": "ovs-show.txt", "route": "ip-route.txt",
       "address": "ip-addr.txt", "rule": "ip-rule.txt"}


def _tgz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _agent(node: str, pod: str) -> dict[str, bytes]:
    files = {k: (EXAMPLE / "nodes" / node / v).read_bytes() for k, v in MAP.items()}
    files["agentinfo"] = yaml.safe_dump({"version": "v0.10.0", "podRef": {
        "kind": "Pod", "namespace": "kube-system", "name": pod},
        "nodeRef": {"name": node}}).encode()
    files["logs/agent/antrea-agent.log"] = b"I0101 not read\n"
    files["goroutinestacks"] = b"goroutine 1\n"
    return files


def _clusterinfo() -> bytes:
    pods = yaml.safe_load((EXAMPLE / "k8s" / "pods.yaml").read_text())
    pods["items"][0]["spec"]["containers"][0]["env"] = [{"name": "TOKEN", "value": "s3cret"}]
    nodes = yaml.safe_load((EXAMPLE / "k8s" / "nodes.yaml").read_text())
    out = ""
    for name, doc in (("pods", pods), ("nodes", nodes), ("deployments", {"items": []})):
        out += f"#{name}\n" + yaml.safe_dump(doc) + "---\n"
    return out.encode()


@pytest.fixture()
def support_dir(tmp_path):
    d = tmp_path / "support-bundles_20240510T184554Z"
    d.mkdir()
    (d / "agent_worker1.tar.gz").write_bytes(_tgz(_agent("worker1", "antrea-agent-f76q2")))
    (d / "agent_worker2.tar.gz").write_bytes(_tgz(_agent("worker2", "antrea-agent-fv5x9")))
    (d / "controller.tar.gz").write_bytes(_tgz({"controllerinfo": b"x"}))
    (d / "clusterinfo").write_bytes(_clusterinfo())
    return d


def test_support_bundle_folder_maps_onto_the_bundle_layout(support_dir):
    b = Bundle.open(support_dir)
    m = b.manifest
    assert m["format"] == "traceflow-bundle/v1" and m["cni"] == "antrea"
    assert m["cni_version"] == "v0.10.0"
    assert m["collected_at"] == "2024-05-10T18:45:54Z"
    assert m["nodes"]["worker1"] == {"agent_pod": "kube-system/antrea-agent-f76q2",
                                     "tunnel_dev": "genev_sys_6081"}
    assert b.node_names() == ["worker1", "worker2"]
    for node in ("worker1", "worker2"):
        for support_name, file in MAP.items():
            assert b.raw(f"nodes/{node}/{file}") == (EXAMPLE / "nodes" / node / file).read_bytes()
            assert m["files"][f"nodes/{node}/{file}"].startswith(
                f"agent_{node}.tar.gz: {support_name} (")
    assert not any("log" in n or "goroutine" in n for n in b.names())
    lacks = "\n".join(m["lacks"])
    assert "ip-neigh.txt: neighbours" in lacks and "tc.txt: tc filters" in lacks
    assert "k8s/services.yaml" in lacks and "k8s/pods.yaml" not in lacks
    pods = b.text("k8s/pods.yaml")
    assert "frontend" in pods and "s3cret" not in pods


def test_support_bundle_traces_what_it_can_and_names_what_it_lacks(support_dir):
    r = runner.invoke(app, ["route-get", "worker1", "10.222.2.34", "--bundle", str(support_dir),
                            "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    hops = [h for p in doc["paths"] for leg in p["legs"] for h in leg["hops"]]
    assert any("10.222.2.0/24" in (h["rule"] or "") for h in hops)
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(support_dir)])
    assert r.exit_code == 2
    assert "service default/backendsvc not found" in r.stderr
    assert "k8s/services.yaml" in r.stderr


def test_support_bundle_as_tarball_single_agent_and_extracted(support_dir, tmp_path):
    whole = tmp_path / "sb.tar.gz"
    with tarfile.open(whole, "w:gz") as tar:
        tar.add(support_dir, arcname=support_dir.name)
    assert Bundle.open(whole).node_names() == ["worker1", "worker2"]
    lone = Bundle.open(support_dir / "agent_worker2.tar.gz")
    assert lone.node_names() == ["worker2"]
    assert lone.raw("nodes/worker2/ovs-flows.txt") == \
        (EXAMPLE / "nodes/worker2/ovs-flows.txt").read_bytes()
    assert "k8s/pods.yaml: Pods" in "\n".join(lone.manifest["lacks"])
    ext = tmp_path / "extracted"
    for name, data in _agent("worker1", "antrea-agent-f76q2").items():
        p = ext / "agent_worker1" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    b = Bundle.open(ext)
    assert b.node_names() == ["worker1"]
    assert b.raw("nodes/worker1/ip-route.txt") == \
        (EXAMPLE / "nodes/worker1/ip-route.txt").read_bytes()


def test_route_table_all_wins_and_bad_names_are_skipped(tmp_path):
    d = tmp_path / "sb"
    d.mkdir()
    agent = _agent("worker1", "a")
    agent["route-table-all"] = b"default via 10.0.0.1 dev eth0\n"
    (d / "agent_worker1.tar.gz").write_bytes(_tgz(agent))
    (d / "agent_Bad..Name.tar.gz").write_bytes(_tgz(_agent("worker2", "b")))
    b = Bundle.open(d)
    assert b.raw("nodes/worker1/ip-route.txt") == b"default via 10.0.0.1 dev eth0\n"
    assert b.node_names() == ["worker1"]
    assert any("not a valid node name" in n for n in b.manifest["collection_notes"])


def test_corrupt_agent_tarball_is_a_located_error(tmp_path):
    d = tmp_path / "sb"
    d.mkdir()
    (d / "agent_worker1.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
    r = runner.invoke(app, ["route-get", "worker1", "10.0.0.1", "--bundle", str(d)])
    assert r.exit_code == 2 and "agent_worker1.tar.gz" in r.stderr
