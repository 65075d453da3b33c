"""Calico's diagnostics read as a bundle (traceflow/bundle/foreign/calico_diags.py): an archive
laid out as calicoctl writes it (calicoctl/commands/cluster/diags.go: calico-diagnostics-<ts>/
cluster/kubernetes/<kind>.yaml, cluster/calico-system/calico-system.yaml; node/diags.go
runDiags: diags-<ts>.tar.gz with diagnostics/hostname, ipv4_route, ipv4_addr, ipv4_tables,
ipsets), holding the calico-vxlan example's objects and node outputs. No calicoctl runs here:
the layout is checked at source level (the files and commands named above)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.bundle.reader import Bundle
from traceflow.cli.app import app

EXAMPLE = Path(__file__).resolve().parents[1] / "traceflow" / "examples" / "calico-vxlan"
runner = CliRunner()


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def diags(folder: Path, with_cluster: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if with_cluster:
        top = "calico-diagnostics-20260303_140500"
        cluster = {f"{top}/cluster/kubernetes/{k}.yaml": (EXAMPLE / "k8s" / f"{k}.yaml")
                   .read_bytes() for k in ("pods", "services", "endpointslices", "nodes",
                                           "networkpolicies")}
        cluster[f"{top}/cluster/calico-system/calico-system.yaml"] = (
            b"apiVersion: v1\nkind: List\nitems:\n- kind: DaemonSet\n  spec:\n    template:\n"
            b"      spec:\n        containers:\n        - name: calico-node\n"
            b"          image: docker.io/calico/node:v3.28.2\n")
        cluster[f"{top}/nodes/worker-1/calico-system/calico-node-x.log"] = b"felix log\n"
        (folder / f"{top}.tar.gz").write_bytes(_tar(cluster))
    for i, node in enumerate(("cp-1", "worker-1", "worker-2")):
        d = EXAMPLE / "nodes" / node
        main = "".join(l + "\n" for l in (d / "ip-route.txt").read_text().splitlines()
                       if "table " not in l)
        files = {"diagnostics/date": b"Tue Mar  3 14:05:00 UTC 2026\n",
                 "diagnostics/hostname": f"{node}\n".encode(),
                 "diagnostics/ipv4_route": main.encode(),
                 "diagnostics/ipv4_addr": (d / "ip-addr.txt").read_bytes(),
                 "diagnostics/ipv4_tables": (d / "iptables-save.txt").read_bytes(),
                 "diagnostics/ipsets": (d / "ipset.txt").read_bytes()}
        (folder / f"diags-20260303_14050{i}.tar.gz").write_bytes(_tar(files))
    return folder


def test_diags_read_as_a_bundle(tmp_path):
    b = Bundle.open(diags(tmp_path / "d"))
    m = b.manifest
    assert (m["cni"], m["cni_version"], m["kube_proxy"]) == ("calico", "v3.28.2", "iptables")
    assert b.raw("nodes/worker-2/iptables-save.txt") == \
        (EXAMPLE / "nodes/worker-2/iptables-save.txt").read_bytes()
    assert m["files"]["nodes/worker-1/ip-route.txt"].endswith(
        "ipv4_route (ip -4 route (main table only))")
    assert any("bridge-fdb.txt" in line for line in m["lacks"])
    assert yaml.safe_load(b.raw("k8s/networkpolicies.yaml"))["items"][0]["metadata"]["name"] \
        == "web-from-frontend"


def test_diags_trace_names_the_policy_and_what_the_diags_lack(tmp_path):
    bundle = diags(tmp_path / "d")
    res = runner.invoke(app, ["pod-to-svc", "shop/batch-7b9c5f6d8-q8w3z", "shop/web",
                              "--bundle", str(bundle), "-o", "json"])
    paths = {p["endpoint"]: p for p in json.loads(res.stdout)["paths"]}
    # the local backend: dropped at worker-1's cali-tw chain, the policy named from the rules
    assert paths["shop/web-1"]["disposition"] == "dropped-policy"
    assert paths["shop/web-1"]["policies"] == ["shop/web-from-frontend"]
    # the remote one is routed into vxlan.calico, whose next hop's MAC (ip neigh) and VTEP
    # (bridge fdb) the diags do not hold: unknown, naming the file
    assert paths["shop/web-0"]["verdict"] == "unknown"
    assert "nodes/worker-1/ip-neigh.txt" in paths["shop/web-0"]["drop"]["reason"]


def test_node_diags_without_the_cluster_archive_say_what_is_missing(tmp_path):
    b = Bundle.open(diags(tmp_path / "d", with_cluster=False))
    assert any(line.startswith("k8s/pods.yaml") for line in b.manifest["lacks"])


def test_a_node_archive_without_hostname_is_skipped_with_a_note(tmp_path):
    folder = diags(tmp_path / "d")
    (folder / "diags-20260303_140509.tar.gz").write_bytes(
        _tar({"diagnostics/ipv4_tables": b"*filter\nCOMMIT\n"}))
    b = Bundle.open(folder)
    assert any("no usable diagnostics/hostname" in n for n in b.manifest["collection_notes"])
