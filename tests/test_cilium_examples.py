"""Consistency of the Cilium example bundles: every file has provenance, the seed text kept
verbatim is there, and the files of one node agree with each other (an lxc device's MAC in
ip-addr.txt, cilium_lxc, and the pod's neighbour entry; identities in the endpoint list and
the ipcache; a policy map per endpoint) as they do on a real node."""

from pathlib import Path

import pytest
import yaml

from traceflow.bundle.reader import Bundle
from traceflow.cni.cilium.node import CiliumNode
from traceflow.cni import open_snapshot

EXAMPLES = Path(__file__).resolve().parent.parent / "traceflow" / "examples"
NAMES = ["cilium-kpr-native", "cilium-eni", "cilium-vxlan-policy"]


def files_of(bundle: Path) -> set:
    return {str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()
            and p.name not in ("manifest.yaml", "README.md")}


@pytest.mark.parametrize("name", NAMES)
def test_every_file_has_provenance(name):
    bundle = EXAMPLES / name
    manifest = yaml.safe_load((bundle / "manifest.yaml").read_text())
    assert manifest["cni"] == "cilium" and manifest["format"] == "traceflow-bundle/v1"
    prov = manifest.get("provenance") or {}
    files = files_of(bundle)
    assert sorted(files - set(prov)) == []
    assert sorted(set(prov) - files) == []
    for entry in prov.values():
        assert entry["origin"] in ("seed", "adapted", "synthesised", "mixed")
        assert entry["detail"].strip()


SEED_LINES = {
    "cilium-kpr-native": {
        "nodes/node1/tc.txt": [
            "bpf_lxc.o:[from-container] direct-action not_in_hw tag 3855f578c6616972",
            "bpf_netdev_bond0.o:[to-netdev] direct-action not_in_hw tag b536a7e2744a4cdb"],
        "nodes/node2/tc.txt": ["bpf_netdev_bond0.o:[from-netdev] direct-action not_in_hw tag 75f509de02b2dfaf"],
        "nodes/node1/ip-addr.txt": ["699: lxc00aa@if698:", "link/ether 3e:74:f2:60:ab:9b",
                                    "inet 10.1.1.1/32", "link/ether 3e:7d:6b:32:44:8e"],
        "nodes/node1/ip-route.txt": ["default via 10.255.255.1 dev bond0"],
        "nodes/node1/ip-neigh.txt": ["10.255.255.1 dev bond0 lladdr 00:00:5e:00:01:0c"],
        "pods/default/pod1/ip-addr.txt": ["698: eth0@if699:", "link/ether 5e:d9:e5:0d:a1:ed"],
    },
    "cilium-eni": {
        "nodes/node1/tc.txt": ["bpf_lxc.o:[from-container] direct-action not_in_hw tag db59e2ea8177ded3"],
        "nodes/node2/tc.txt": ["bpf_lxc.o:[from-container] direct-action not_in_hw tag c17fab4b3f874a54"],
        "nodes/node1/ip-rule.txt": ["9:\tfrom all fwmark 0x200/0xf00 lookup 2004"],
        "nodes/node2/ip-rule.txt": ["20:\tfrom all to 10.5.2.22 lookup main", "111:\tfrom 10.5.2.22 lookup 11"],
        "nodes/node2/ip-route.txt": ["10.5.2.22 dev lxcd86fc95bf974 scope link"],
        "pods/default/pod1/ip-addr.txt": ["42: eth0@if43:", "link/ether ee:14:d3:9a:62:42",
                                          "inet 10.5.2.11/32 brd 10.5.2.11 scope global eth0"],
    },
}


@pytest.mark.parametrize("name", sorted(SEED_LINES))
def test_text_kept_from_the_walks_is_there(name):
    for path, needles in SEED_LINES[name].items():
        text = (EXAMPLES / name / path).read_text()
        for needle in needles:
            assert needle in text, (path, needle)


@pytest.mark.parametrize("name", NAMES)
def test_the_files_of_each_node_agree(name):
    snap = open_snapshot(Bundle.open(EXAMPLES / name))
    for node_name in snap.bundle.node_names():
        cn = CiliumNode(snap, snap.node(node_name))
        cn.maps.parse_all()
        ids = {e.endpoint_id for e in cn.policy}
        for ip, rec in cn.lxc.items():
            dev = cn.device_of(rec)
            assert dev and dev.startswith("lxc"), (node_name, ip)
            assert snap.node(node_name).interface(dev).mac == rec.node_mac.lower()
            ep = cn.endpoints[ip]
            assert ep.endpoint_id == rec.endpoint_id
            own = [e for e in cn.ipcache if e.prefix == f"{ip}/32"]
            assert own and own[0].identity == ep.identity and not own[0].tunnel_endpoint
            assert rec.endpoint_id in ids, f"no policy map for endpoint {rec.endpoint_id}"
            pod = snap.cluster.pod_by_ip(ip)
            assert pod is not None and pod.node == node_name
            files = snap.pod_files(pod)
            if "ip-neigh.txt" in files:
                assert rec.node_mac.lower() in files["ip-neigh.txt"][0]
            if "ip-addr.txt" in files:
                assert rec.mac.lower() in files["ip-addr.txt"][0]
        # every pod of this node is a Cilium endpoint here
        for pod in snap.cluster.pods:
            if pod.node == node_name and not pod.host_network and pod.ip:
                assert pod.ip in cn.lxc, (node_name, pod.key)


@pytest.mark.parametrize("name", NAMES)
def test_the_example_suite(name, tmp_path):
    """Each Cilium example has a check suite (issue 24): the deliberately failing expectations
    fail, every other holds, and the JUnit report has one case each."""
    import json

    from typer.testing import CliRunner

    from traceflow.cli.app import app
    suite = EXAMPLES / name / "checks.yaml"
    junit = tmp_path / "report.xml"
    res = CliRunner().invoke(app, ["check", str(suite), "--bundle", str(EXAMPLES / name), "-o",
                                   "json", "--junit", str(junit)])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    names = [e["name"] for e in yaml.safe_load(suite.read_text())["expectations"]]
    deliberate = {n for n in names if n.startswith("deliberately failing")}
    assert deliberate
    assert {r["name"] for r in doc["results"] if not r["passed"]} == deliberate
    assert {r["name"] for r in doc["results"]} == set(names)
    from xml.etree import ElementTree as ET
    assert len(ET.parse(junit).getroot().findall("testcase")) == len(names)
