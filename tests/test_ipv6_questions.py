"""Audit, diff, HTML and policy naming over IPv6, on the dual-stack Antrea example and copies
of it changed one IPv6 fact at a time (an IPv6 route, an IPv6 tunnel flow, an IPv6 Endpoint)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
DUAL = ROOT / "traceflow" / "examples" / "antrea-dualstack"
CLIENT = "client-6c8b7d5d8f-hv2kw"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _copy(tmp_path: Path, node: str, file: str, drop) -> Path:
    copy = tmp_path / "changed"
    shutil.copytree(DUAL, copy)
    path = copy / "nodes" / node / file
    lines = path.read_text().splitlines(keepends=True)
    kept = [l for l in lines if not drop(l)]
    assert len(kept) == len(lines) - 1, "exactly one line is removed"
    path.write_text("".join(kept))
    return copy


def audit(bundle: Path) -> dict:
    r = invoke("audit", "--bundle", bundle, "-o", "json")
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_the_audit_asks_both_families_and_finds_no_drift_on_the_example():
    doc = audit(DUAL)
    services = {p["service"] for p in doc["pairs"]}
    assert "default/web:80/TCP" in services and "default/web:80/TCP (IPv6)" in services
    assert doc["findings"] == []
    v6 = [p for p in doc["pairs"] if p["service"] == "default/web:80/TCP (IPv6)"]
    v4 = [p for p in doc["pairs"] if p["service"] == "default/web:80/TCP"]
    assert [p["verdict"] for p in v6] == [p["verdict"] for p in v4]


def test_a_missing_ipv6_route_to_a_peer_pod_cidr_is_drift(tmp_path):
    bundle = _copy(tmp_path, "node1", "ip-route.txt",
                   lambda l: l.startswith("fd00:10:10:1::/64 via"))
    findings = [f for f in audit(bundle)["findings"] if f["kind"] == "peer-route"]
    assert [f["subject"] for f in findings] == ["node1 -> node2 pods fd00:10:10:1::/64"]


def test_a_missing_ipv6_tunnel_flow_is_drift(tmp_path):
    bundle = _copy(tmp_path, "node1", "ovs-flows.txt",
                   lambda l: "ipv6_dst=fd00:10:10:1::/64" in l and "tun_ipv6_dst" in l)
    findings = [f for f in audit(bundle)["findings"] if f["kind"] == "peer-route"]
    assert any("fd00:10:10:1::/64" in f["subject"] and "tunnel flow" in f["message"]
               for f in findings), findings


def test_an_ipv6_backend_missing_from_the_group_is_drift_and_a_changed_walk(tmp_path):
    """node1's IPv6 group for web loses its remote bucket: the audit's backend check names
    the IPv6 Endpoint, and `diff` lists the IPv6 question whose walk changed."""
    copy = tmp_path / "changed"
    shutil.copytree(DUAL, copy)
    groups = copy / "nodes" / "node1" / "ovs-groups.txt"
    text = groups.read_text()
    old = [l for l in text.splitlines() if l.startswith(" group_id=11,")][0]
    cut = old.split(",bucket=bucket_id:1,")[0]
    groups.write_text(text.replace(old, cut))
    findings = audit(copy)["findings"]
    assert any("fd00:10:10:1::6" in f["message"] and "(IPv6)" in f["subject"]
               for f in findings), findings
    r = invoke("diff", DUAL, copy, "-o", "json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    changed = json.dumps(doc)
    assert "fd00:10:96::a" in changed or "(IPv6)" in changed


def test_a_policy_drop_over_ipv6_names_the_policy():
    r = invoke("pod-to-svc", "db-755c6d9d8f-ddvjx", "web", "-6", "--bundle", DUAL, "-o", "json")
    if r.exit_code == 2:     # the db pod's name, as the example has it
        import yaml
        pods = yaml.safe_load((DUAL / "k8s" / "pods.yaml").read_text())["items"]
        db = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith("db-"))
        r = invoke("pod-to-svc", db, "web", "-6", "--bundle", DUAL, "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["query"]["family"] == "ipv6"
    drops = [p for p in doc["paths"] if p["disposition"] == "dropped-policy"]
    assert drops and all(p["policies"] == ["default/web"] for p in drops)


def test_html_shows_both_families_and_ipv6_headers():
    r = invoke("pod-to-svc", CLIENT, "web", "--family", "both", "--bundle", DUAL, "-o", "html")
    assert r.exit_code == 0, r.output
    page = r.stdout
    assert page.count("<html") == 1 and page.rstrip().endswith("</html>")
    assert "IPv4 delivered, IPv6 delivered" in page
    assert 'id="ipv4"' in page and 'id="ipv6"' in page
    assert "fd00:10:96::a" in page and "10.105.31.235" in page
