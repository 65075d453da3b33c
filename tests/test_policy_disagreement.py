"""Flows that allow what the NetworkPolicy as written denies are noted on the delivered path
(the drop-side counterpart, flows dropping what a policy allows, is in
test_trace_mutations.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

runner = CliRunner()


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "b"
    shutil.copytree(example_path(), root)
    return root


def trace(root) -> dict:
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(root),
                            "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_as_shipped_policies_and_flows_agree(bundle):
    doc = trace(bundle)
    assert doc["verdict"] == "delivered"
    assert not any("disagree" in w for w in doc.get("warnings", []))


def test_delivered_although_the_policy_denies_is_noted_on_every_path(bundle):
    pols = yaml.safe_load((bundle / "k8s/networkpolicies.yaml").read_text())
    for item in pols["items"]:
        if item["metadata"]["name"] == "backendpolicy":
            item["spec"]["ingress"] = []          # the flows still allow frontend -> 80
    (bundle / "k8s/networkpolicies.yaml").write_text(yaml.safe_dump(pols))
    doc = trace(bundle)
    assert doc["verdict"] == "delivered"
    for path in doc["paths"]:
        request = next(l for l in path["legs"] if l["direction"] == "request")
        notes = " ".join(request["hops"][-1]["notes"])
        assert "default/backendpolicy" in notes and "yet the datapath delivers" in notes
        assert "TCP/80 from 10.222.1.48" in notes
    assert any("disagree with the policy" in w for w in doc["warnings"])


def test_egress_denial_is_noted_too(bundle):
    pols = yaml.safe_load((bundle / "k8s/networkpolicies.yaml").read_text())
    for item in pols["items"]:
        if item["metadata"]["name"] == "frontendpolicy":
            item["spec"]["egress"] = [{"ports": [{"port": 53, "protocol": "UDP"}]}]
    (bundle / "k8s/networkpolicies.yaml").write_text(yaml.safe_dump(pols))
    doc = trace(bundle)
    assert any("default/frontendpolicy" in w and "Egress" in w for w in doc["warnings"])
