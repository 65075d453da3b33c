"""Live collection of the kernel-datapath CNIs (Calico, Flannel, the VPC CNI), against the
protocol-level fake API server (tests/fake_kube_api.py): the agent DaemonSet pods (calico-node
in calico-system, kube-flannel in kube-flannel, aws-node in kube-system), labelled as their
manifests label them, whose exec runs the collector's real script with stub binaries printing
the example bundles' node files (written in the real outputs' forms, see each manifest's
provenance). What is tested: which agents are found, one batched exec per agent container
with constant arguments, the file names and bytes, the manifest, that the collected bundle
traces as the example does, and that `traceflow rbac` grants exec on exactly those pods, in
their namespace.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_kube_api import FakeKubeAPI  # noqa: E402

from collectors import agents as A  # noqa: E402
from traceflow.bundle.reader import Bundle  # noqa: E402
from traceflow.cli.app import app  # noqa: E402

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
# (example, namespace, agent label, container, image) as the CNIs' manifests deploy them
AGENTS = {
    "calico-vxlan": ("calico-system", {"k8s-app": "calico-node"}, "calico-node",
                     "docker.io/calico/node:v3.28.2"),
    "flannel-vxlan": ("kube-flannel", {"app": "flannel", "tier": "node"}, "kube-flannel",
                      "docker.io/flannel/flannel:v0.25.6"),
    "aws-vpc-cni": ("kube-system", {"k8s-app": "aws-node"}, "aws-node",
                    "602401143452.dkr.ecr.us-west-2.amazonaws.com/amazon-k8s-cni:v1.18.3"),
}
KERNEL_FILES = ["bridge-fdb.txt", "ip-addr.txt", "ip-link.txt", "ip-neigh.txt", "ip-route.txt",
                "ip-rule.txt", "iptables-save.txt", "sysctl.txt"]


def cluster(example: str) -> FakeKubeAPI:
    api = FakeKubeAPI(EXAMPLES / example)
    ns, labels, container, image = AGENTS[example]
    for i, node in enumerate(sorted(api.node_files)):
        api.objects["pods"].append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{container}-{i}x{i}q", "namespace": ns, "labels": labels},
            "spec": {"nodeName": node, "hostNetwork": True,
                     "containers": [{"name": container, "image": image}]},
            "status": {"phase": "Running"}})
    return api


@pytest.fixture(params=sorted(AGENTS))
def fake(request, tmp_path):
    api = cluster(request.param)
    api.start()
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.example = request.param
    try:
        yield api
    finally:
        api.stop()


def test_agents_found_and_node_files_collected(fake, tmp_path):
    ns, labels, container, image = AGENTS[fake.example]
    out = tmp_path / "b"
    r = runner.invoke(app, ["collect", "--all-nodes", "-o", str(out), "--kubeconfig",
                            str(fake.kubeconfig)])
    assert r.exit_code == 0, r.stderr
    b = Bundle.open(out)
    m = b.manifest
    assert m["cni"] == yaml.safe_load((EXAMPLES / fake.example / "manifest.yaml")
                                      .read_text())["cni"]
    assert m["cni_version"] == "v" + image.rsplit(":v", 1)[1]
    nodes = sorted(fake.node_files)
    for i, node in enumerate(nodes):
        assert m["nodes"][node]["agent_pod"] == f"{ns}/{container}-{i}x{i}q"
        for f in KERNEL_FILES:     # byte for byte what the agent printed
            assert b.raw(f"nodes/{node}/{f}") == fake.node_files[node][f], (node, f)
    assert m["files"][f"nodes/{nodes[0]}/bridge-fdb.txt"].startswith("bridge fdb show  (exec ")
    execs = [e for e in fake.execs if e["namespace"] == ns]
    assert sorted(e["container"] for e in execs) == [container] * len(nodes)
    for e in execs:
        assert e["command"][:3] == ["sh", "-c", A.SCRIPT]
        assert all(i in A.ITEMS for i in e["command"][5:])


def test_collected_bundle_traces_as_the_example(fake, tmp_path):
    out = tmp_path / "b"
    assert runner.invoke(app, ["collect", "--all-nodes", "-o", str(out), "--kubeconfig",
                               str(fake.kubeconfig)]).exit_code == 0
    query = {"calico-vxlan": ["pod-to-svc", "shop/batch-7b9c5f6d8-q8w3z", "shop/web"],
             "flannel-vxlan": ["pod-to-svc", "client-7d9c8b6f5-x2x8q", "web"],
             "aws-vpc-cni": ["pod-to-svc", "client-6f7c9d8b4-tm2qs", "api"]}[fake.example]
    got = {}
    for bundle in (out, EXAMPLES / fake.example):
        r = runner.invoke(app, [*query, "--bundle", str(bundle), "-o", "json"])
        doc = json.loads(r.stdout)
        got[bundle == out] = sorted((p["endpoint"], p["disposition"], tuple(p["policies"]))
                                    for p in doc["paths"])
    # the collected bundle has no pod-side files (no --app-exec): the first hop comes from the
    # CNI's conventions and the node's tables, to the same ends
    assert got[True] == got[False]


def test_rbac_grants_exec_on_exactly_the_agent_pods(fake, tmp_path):
    ns, labels, container, image = AGENTS[fake.example]
    r = runner.invoke(app, ["rbac", "--kubeconfig", str(fake.kubeconfig)])
    assert r.exit_code == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["metadata"] == {"name": "traceflow-agent-exec", "namespace": ns}
    (rule,) = role["rules"]
    assert rule["resources"] == ["pods/exec"]
    assert rule["resourceNames"] == sorted(f"{container}-{i}x{i}q"
                                           for i in range(len(fake.node_files)))
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == ns
    # from the collected bundle's manifest, the same grant
    out = tmp_path / "b"
    assert runner.invoke(app, ["collect", "--all-nodes", "-o", str(out), "--kubeconfig",
                               str(fake.kubeconfig)]).exit_code == 0
    r2 = runner.invoke(app, ["rbac", "--bundle", str(out)])
    (role2,) = [d for d in yaml.safe_load_all(r2.stdout) if d and d["kind"] == "Role"]
    assert role2 == role
