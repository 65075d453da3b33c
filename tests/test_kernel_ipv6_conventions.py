"""IPv6 on the kernel datapath without the pods' own files: the first hop then comes from the
CNI's conventions, per family (Flannel: cni0's IPv6 address, the bridge's MAC; Calico: the host
veth's link-local address fe80::ecee:eeff:feee:eeee, cni-plugin/pkg/dataplane/linux/
dataplane_linux.go hostSideMACAsIPv6LL, answered by the veth itself), said as a warning; and
only the CNIs whose IPv6 is modelled walk it (the others answer unknown)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"


def _trace(bundle: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "traceflow", *args, "--bundle", str(bundle),
                           "-o", "json"], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def _without_pod_routes(example: str, tmp_path: Path) -> Path:
    copy = tmp_path / example
    shutil.copytree(EXAMPLES / example, copy)
    for f in copy.glob("pods/*/*/ip-route.txt"):
        f.unlink()
    for f in copy.glob("pods/*/*/ip-neigh.txt"):
        f.unlink()
    return copy


@pytest.mark.parametrize("example, args, gateway, mac", [
    ("calico-dualstack", ("pod-to-pod", "frontend-5d8f9b7c6-4xk2p", "web-0", "-n", "shop"),
     "fe80::ecee:eeff:feee:eeee", "ee:ee:ee:ee:ee:ee"),
    ("flannel-dualstack", ("pod-to-pod", "client-7d9c8b6f5-x2x8q", "web-6b8f8d9c77-rjz2m"),
     "fd00:10:42::1", None),
])
def test_ipv6_first_hop_from_the_conventions(example, args, gateway, mac, tmp_path):
    bundle = _without_pod_routes(example, tmp_path)
    trace = _trace(bundle, *args, "--port", "8080", "--family", "6")
    (path,) = trace["paths"]
    assert path["verdict"] == "delivered", path.get("drop")
    first = path["legs"][0]["hops"][0]
    assert first["rule"] == f"default via {gateway} dev eth0", first
    if mac is None:        # the bridge cni0's MAC, from the node's ip-addr.txt
        addr = (EXAMPLES / example / "nodes/k3s-server/ip-addr.txt").read_text()
        mac = addr.split("cni0:")[1].split("link/ether ")[1].split()[0]
    assert first["packet"]["dl_dst"] == mac
    assert any("conventions" in w for w in trace.get("warnings", [])), trace.get("warnings")


@pytest.mark.parametrize("cni, name", [("aws-vpc-cni", "AWS VPC CNI"),
                                       ("azure-cni", "Azure CNI")])
def test_unmodelled_cni_answers_ipv6_unknown(cni, name, tmp_path):
    """The same dual-stack files declared as a CNI whose IPv6 is not modelled: the IPv6
    question ends unknown with the reason, the IPv4 one is still walked."""
    copy = tmp_path / "b"
    shutil.copytree(EXAMPLES / "flannel-dualstack", copy)
    manifest = copy / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("cni: flannel", f"cni: {cni}"))
    args = ("pod-to-pod", "client-7d9c8b6f5-x2x8q", "web-6b8f8d9c77-rjz2m", "--port", "8080")
    (path6,) = _trace(copy, *args, "--family", "6")["paths"]
    assert path6["verdict"] == "unknown", path6
    assert path6["drop"]["reason"].startswith("IPv6 not modelled for"), path6["drop"]
    (path4,) = _trace(copy, *args, "--family", "4")["paths"]
    assert path4["verdict"] != "unknown" or "IPv6" not in path4["drop"]["reason"]


def test_audit_of_a_dual_stack_policy_reads_the_ipv6_pod_addresses():
    """The audit compares a delivered IPv6 path with the NetworkPolicy at the port the server
    sees (8080, after the DNAT): found at the pod's IPv6 address, not taken from the Service
    port (80), which web-from-frontend does not allow (a false drift finding)."""
    done = subprocess.run([sys.executable, "-m", "traceflow", "audit", "--bundle",
                           str(EXAMPLES / "calico-dualstack")], capture_output=True, text=True,
                          timeout=120)
    said = " ".join(done.stdout.split())
    assert "(2 service ports x 3 client groups)" in said, done.stdout
    assert "delivered 2, not delivered 4 (dropped 4" in said, done.stdout
    assert "drift findings: 0" in said, done.stdout
