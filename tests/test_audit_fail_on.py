"""`audit --fail-on`: the pair outcomes that fail a job, by verdict or typed disposition; the
audit of a bundle without Services says so; the API server's Service whose endpoint is the
control-plane node itself is delivered to that node's own stack, not "not delivered"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

EXAMPLES = Path(example_path()).parent
V2 = str(EXAMPLES / "antrea-v2")
runner = CliRunner()


def _audit(*args):
    r = runner.invoke(app, ["audit", *args])
    assert "Traceback" not in r.output
    return r


def test_fail_on_names_the_outcomes_that_fail():
    doc = json.loads(_audit("--bundle", V2, "-o", "json").stdout)
    dispositions = {p["disposition"] for p in doc["pairs"] if p["verdict"] != "delivered"}
    assert dispositions == {"rejected", "dropped-policy"}      # idle has no endpoints
    assert _audit("--bundle", V2).exit_code == 0                # no drift: drops are listed
    failed = _audit("--bundle", V2, "--fail-on", "dropped,unknown")
    assert failed.exit_code == 1
    n = sum(1 for p in doc["pairs"] if p["verdict"] != "delivered")
    assert f"audit: {n} pair(s) ended in an outcome --fail-on names" in failed.stdout
    # by disposition: only the pairs that ended so
    rejected = _audit("--bundle", V2, "--fail-on", "rejected")
    assert rejected.exit_code == 1 and "audit: 3 pair(s)" in rejected.stdout
    assert _audit("--bundle", V2, "--fail-on", "no-route,table-miss,unknown").exit_code == 0


def test_policy_pairs_lead_with_the_policy_and_what_it_allows():
    r = _audit("--bundle", V2, "--width", "100")
    text = " ".join(r.stdout.split())
    assert ("dropped-policy: denied by NetworkPolicy default/web: allows ingress only from "
            "app=client or 203.0.113.0/24 on TCP/80 and egress only to app=db on TCP/3306; "
            "or to 1.1.1.0/24 on TCP/443") in text
    doc = json.loads(_audit("--bundle", V2, "-o", "json").stdout)
    assert {tuple(p["policies"]) for p in doc["pairs"]
            if p["disposition"] == "dropped-policy"} == {("default/web",)}


def test_the_api_servers_endpoint_on_its_node_is_delivered_to_that_node():
    doc = json.loads(_audit("--bundle", V2, "-o", "json").stdout)
    api = [p for p in doc["pairs"] if p["service"] == "default/kubernetes:443/TCP"
           and p["client"].startswith("default/{app=client")]
    assert [p["verdict"] for p in api] == ["delivered"]
    assert api[0]["disposition"] == "delivered-host"


def test_a_bundle_without_services_says_there_is_nothing_to_audit(tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(V2, bundle)
    (bundle / "k8s/services.yaml").write_text("apiVersion: v1\nkind: List\nitems: []\n")
    (bundle / "k8s/endpointslices.yaml").write_text("apiVersion: v1\nkind: List\nitems: []\n")
    r = _audit("--bundle", str(bundle), "--width", "100")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "0 pairs" in text and "the bundle has no Service with a cluster IP " \
                                  "(k8s/services.yaml): there are no pairs to audit" in text
