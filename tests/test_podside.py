"""Pod-side files traced as they are: a pod's own ip-route.txt / ip-neigh.txt decide its first
hop. A wrong gateway or a missing route is a drop with its reason and line; a route by another
device is shown as that device (unknown: not traced); the warning names exactly the files
that are absent. Behaviour of the pod's kernel: ip_route_output (no route -> ENETUNREACH,
nothing sent) and neighbour resolution (an unanswered ARP request -> the packet is dropped
after the retries, net/core/neighbour.c); the routing itself is traceflow.engines.routing, which
tests/test_routing_kernel.py holds to the real kernel."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

runner = CliRunner()
POD = Path("pods/default/frontend")


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "b"
    shutil.copytree(example_path(), root)
    return root


def trace(root: Path) -> tuple[int, dict]:
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(root),
                            "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def first_hops(doc: dict) -> list[dict]:
    return [p["legs"][0]["hops"][0] for p in doc["paths"]]


def test_files_as_shipped_are_used_and_no_warning_claims_them_absent(bundle):
    code, doc = trace(bundle)
    assert code == 0
    for hop in first_hops(doc):
        assert hop["rule"] == "default via 10.222.1.1 dev eth0"
        assert "4e:99:08:c1:53:be" in hop["effect"]
    assert not any("frontend" in w and "no pods/" in w for w in doc.get("warnings", []))


def test_wrong_gateway_is_a_drop_with_its_line(bundle):
    (bundle / POD / "ip-route.txt").write_text(
        "default via 10.222.1.99 dev eth0\n"
        "10.222.1.0/24 dev eth0 proto kernel scope link src 10.222.1.48\n")
    code, doc = trace(bundle)
    assert code == 1
    (path,) = doc["paths"]
    assert path["verdict"] == "dropped"
    reason = path["drop"]["reason"]
    assert "10.222.1.99" in reason and "10.222.1.1" in reason and "line 1" in reason


def test_no_default_route_is_a_drop(bundle):
    (bundle / POD / "ip-route.txt").write_text(
        "10.222.1.0/24 dev eth0 proto kernel scope link src 10.222.1.48\n")
    code, doc = trace(bundle)
    (path,) = doc["paths"]
    assert code == 1 and path["verdict"] == "dropped"
    assert "no usable route" in path["drop"]["reason"]


def test_other_device_is_shown_as_is(bundle):
    (bundle / POD / "ip-route.txt").write_text(
        "default via 10.30.0.1 dev eth1\n"
        "10.222.1.0/24 dev eth0 proto kernel scope link src 10.222.1.48\n"
        "10.30.0.0/24 dev eth1 proto kernel scope link src 10.30.0.5\n")
    code, doc = trace(bundle)
    (path,) = doc["paths"]
    assert path["verdict"] == "unknown" and "eth1" in path["drop"]["reason"]
    assert "eth0" not in first_hops(doc)[0]["rule"]


def test_neighbour_file_absent_the_warning_says_only_that(bundle):
    (bundle / POD / "ip-neigh.txt").unlink()
    code, doc = trace(bundle)
    assert code == 0
    warnings = " ".join(doc.get("warnings", []))
    assert "ip-neigh.txt" in warnings and "no pods/default/frontend/ip-route.txt" not in warnings


def test_both_files_absent_falls_back_to_the_cni_with_a_warning(bundle):
    for f in ("ip-route.txt", "ip-neigh.txt"):
        (bundle / POD / f).unlink()
    code, doc = trace(bundle)
    assert code == 0
    assert any("ip-route.txt and ip-neigh.txt" in w for w in doc.get("warnings", []))


def test_spoofguard_mismatch_ends_in_the_spoofguard_drop(bundle):
    """The flows bind frontend's port and MAC to another IP (a stale IP after a restart):
    the pod is found by its MAC and its packet is dropped by the SpoofGuard table, as OVS
    does (table 10's ip flow for the port does not match nw_src; the priority-0 drop does)."""
    flows = bundle / "nodes/worker1/ovs-flows.txt"
    text = flows.read_text()
    assert "nw_src=10.222.1.48 actions=resubmit(,30)" in text
    flows.write_text(text.replace("nw_src=10.222.1.48 actions=resubmit(,30)",
                                  "nw_src=10.222.1.148 actions=resubmit(,30)")
                     .replace("arp_spa=10.222.1.48,", "arp_spa=10.222.1.148,"))
    code, doc = trace(bundle)
    assert code == 1
    for path in doc["paths"]:
        assert path["verdict"] == "dropped"
        assert (path["drop"]["component"], path["drop"]["table"]) == ("ovs", "10")
        assert any("SpoofGuard mismatch" in n for n in first_hops({"paths": [path]})[0]["notes"])
