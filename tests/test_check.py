"""`traceflow check`: the example suites on their bundles (the deliberately failing
expectations fail, every other holds), JUnit output validated against two published JUnit
schemas, and bad suites rejected with file, line and key (exit 2)."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app

xmlschema = pytest.importorskip("xmlschema")

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCHEMAS = Path(__file__).parent / "data" / "junit"
BUNDLES = ["antrea-encap-kube-proxy", "antrea-proxy-v1", "antrea-v2", "kube-proxy-iptables",
           "kube-proxy-nftables", "kube-proxy-ipvs", "flannel-vxlan", "calico-vxlan",
           "aws-vpc-cni", "azure-cni", "flannel-dualstack", "calico-dualstack"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("bundle", BUNDLES)
def test_example_suite(bundle, tmp_path):
    suite = EXAMPLES / bundle / "checks.yaml"
    junit = tmp_path / "report.xml"
    res = run("check", suite, "--bundle", EXAMPLES / bundle, "-o", "json", "--junit", junit)
    assert res.exit_code == 1, res.output          # the suites hold deliberate failures
    doc = json.loads(res.output)
    names = [e["name"] for e in yaml.safe_load(suite.read_text())["expectations"]]
    deliberate = {n for n in names if n.startswith("deliberately failing")}
    assert deliberate, "each example suite shows a failure"
    failed = {r["name"] for r in doc["results"] if not r["passed"]}
    assert failed == deliberate
    assert {r["name"] for r in doc["results"]} == set(names)   # every expectation was run
    for r in doc["results"]:
        if not r["passed"]:
            assert r["message"] and r["details"]
    # JUnit: valid for Jenkins' xUnit schema and the strict Ant schema, one testcase per result
    for xsd in ("ant-junit.xsd", "jenkins-junit-10.xsd"):
        xmlschema.XMLSchema(str(SCHEMAS / xsd)).validate(str(junit))
    from xml.etree import ElementTree as ET
    root = ET.parse(junit).getroot()
    cases = root.findall("testcase")
    assert len(cases) == len(doc["results"]) == int(root.get("tests"))
    assert int(root.get("failures")) == sum(not r["passed"] for r in doc["results"])
    assert len(root.findall("testcase/failure")) == int(root.get("failures"))


def test_failure_message_names_node_component_table_rule_and_line(tmp_path):
    junit = tmp_path / "r.xml"
    res = run("check", EXAMPLES / "antrea-encap-kube-proxy" / "checks.yaml", "--bundle",
              EXAMPLES / "antrea-encap-kube-proxy", "--junit", junit)
    assert res.exit_code == 1
    from xml.etree import ElementTree as ET
    root = ET.parse(junit).getroot()
    failure = next(c for c in root.findall("testcase")
                   if c.get("name").startswith("deliberately failing - frontend scrapes")
                   ).find("failure")
    msg = failure.get("message")
    # frontend's egress default-deny flow (hand-read from the bundle: worker1 flows line 42)
    assert "on worker1, ovs table 60" in msg
    assert "priority=200,ip,nw_src=10.222.1.48 actions=drop" in msg
    assert "nodes/worker1/ovs-flows.txt:42" in msg
    assert "NetworkPolicy default/frontendpolicy" in msg
    # the wrong-policy expectation fails although the packet is dropped by a policy
    wrong = next(c for c in root.findall("testcase")
                 if c.get("name").startswith("deliberately failing - the wrong policy"))
    assert "expected dropped by NetworkPolicy frontendpolicy" in wrong.find("failure").get("message")
    assert "default/backendpolicy" in wrong.find("failure").get("message")


def test_all_holding_suite_exits_0_and_selector_fans_out(tmp_path):
    suite = tmp_path / "ok.yaml"
    suite.write_text("""expectations:
  - name: coredns pods resolve via the service
    from: k8s-app=kube-dns
    namespace: kube-system
    to: svc/default/backendsvc:80
    expect: dropped-by-policy
  - name: frontend
    from: default/frontend
    to: 10.104.65.133:80
    expect: delivered
""")
    res = run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy", "-o", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    # the selector selects both coredns pods: one result each
    assert sorted(r["source"] for r in doc["results"]) == [
        "default/frontend", "kube-system/coredns-f9fd979d6-4qzxk",
        "kube-system/coredns-f9fd979d6-w8vd2"]


def test_unknown_fails_unless_allowed(tmp_path):
    base = """expectations:
  - name: api
    from: frontend
    to: svc/kubernetes:443
    expect: delivered
"""
    suite = tmp_path / "s.yaml"
    suite.write_text(base)
    res = run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy", "-o", "json")
    assert res.exit_code == 1
    r = json.loads(res.output)["results"][0]
    assert r["verdict"] == "unknown" and "could not decide" in r["message"]
    suite.write_text(base + "    allow-unknown: true\n")
    res = run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy", "-o", "json")
    assert res.exit_code == 0, res.output


def test_branches_any_versus_all(tmp_path):
    # role=backend -> backendsvc: backend1's own branch is delivered (hairpin), the branch to
    # backend2 is dropped by backendpolicy's egress default deny
    body = """expectations:
  - name: b
    from: backend1
    to: svc/backendsvc:80
    expect: delivered
"""
    suite = tmp_path / "s.yaml"
    suite.write_text(body)
    assert run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy").exit_code == 1
    suite.write_text(body + "    branches: any\n")
    assert run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy").exit_code == 0


BAD = [
    ("expectations:\n  - name: a\n    from: frontend\n    to: svc/backendsvc:80\n"
     "    expect: delivred\n", 5, "expectations[0].expect"),
    ("expectations:\n  - name: a\n    form: frontend\n    to: svc/backendsvc:80\n"
     "    expect: delivered\n", 3, "expectations[0].form: unknown key"),
    ("expectations:\n  - name: a\n    to: svc/backendsvc:80\n    expect: delivered\n", 2,
     "expectations[0].from: missing"),
    ("expectations:\n  - name: a\n    from: nosuchpod\n    to: svc/backendsvc:80\n"
     "    expect: delivered\n", 3, "expectations[0].from"),
    ("expectations:\n  - name: a\n    from: frontend\n    to: svc/kube-system/kube-dns\n"
     "    expect: delivered\n", 4, "several ports"),
    ("expectations:\n  - name: a\n    from: frontend\n    to: svc/backendsvc:80\n"
     "    expect: delivered\n    port: 70000\n", 6, "not a port"),
    ("expectations:\n  - name: a\n    from: [frontend\n", 4, "not valid YAML"),
    ("expectations: []\n", 1, "non-empty list"),
    ("expectations:\n  - name: a\n    from: frontend\n    to: svc/backendsvc:80\n"
     "    expect: dropped\n    policy: x\n", 6, "only applies to expect: dropped-by-policy"),
    ("expectations:\n  - name: a\n    from: app=\n    to: svc/backendsvc:80\n"
     "    expect: delivered\n", 3, "selects no Running pod"),
]


@pytest.mark.parametrize("text,line,needle", BAD)
def test_bad_suite_exit_2_with_file_line_key(text, line, needle, tmp_path):
    suite = tmp_path / "bad.yaml"
    suite.write_text(text)
    res = run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert f"{suite}, line {line}" in res.output
    assert needle in res.output


def test_unreadable_suite_exit_2(tmp_path):
    res = run("check", tmp_path / "missing.yaml", "-b", EXAMPLES / "antrea-encap-kube-proxy")
    assert res.exit_code == 2 and "cannot read the suite" in res.output
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    res = run("check", binary, "-b", EXAMPLES / "antrea-encap-kube-proxy")
    assert res.exit_code == 2 and "not UTF-8" in res.output


def test_many_expectations_trace_each_question_once(tmp_path):
    lines = ["expectations:"]
    for i in range(200):
        lines += [f"  - name: e{i}", "    from: frontend", "    to: svc/backendsvc:80",
                  "    expect: delivered"]
    suite = tmp_path / "many.yaml"
    suite.write_text("\n".join(lines) + "\n")
    res = run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy", "-o", "json")
    assert res.exit_code == 0
    doc = json.loads(res.output)
    assert doc["summary"]["results"] == 200 and doc["summary"]["distinct_traces"] == 1


def test_readme_suite_holds_on_the_seed_example(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("## Many questions at once")[1].split("```yaml")[1].split("```")[0]
    suite = tmp_path / "readme.yaml"
    suite.write_text(block)
    res = run("check", suite, "-b", EXAMPLES / "antrea-encap-kube-proxy")
    assert res.exit_code == 0, res.output
    # issue 24: the CI job moved out of the README into a file the tests run as written
    ci = (Path(__file__).resolve().parent.parent / "docs/ci/github-actions.yml").read_text()
    steps = yaml.safe_load(ci)["jobs"]["datapath-smoke"]["steps"]
    assert any("traceflow check" in (s.get("run") or "") and "--junit" in s["run"] for s in steps)


def test_shared_traces_keep_sources_the_rules_tell_apart(tmp_path):
    # host-only bundle: clients of one node share a trace unless a rule tells them apart.
    # A FORWARD rule rejecting one pod's address must drop that pod only.
    import shutil
    b = tmp_path / "kp"
    shutil.copytree(EXAMPLES / "kube-proxy-iptables", b)
    rules = b / "nodes/node3/iptables-save.txt"
    text = rules.read_text()
    first_forward = "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load"
    assert text.count(first_forward) == 1
    rules.write_text(text.replace(first_forward, "-A FORWARD -s 10.244.3.64/32 -j REJECT\n"
                                  + first_forward))
    suite = tmp_path / "s.yaml"
    suite.write_text("namespace: analytics\nexpectations:\n  - name: e\n    from: app=api-primary\n"
                     "    to: svc/api-primary:80\n    expect: delivered\n")
    res = run("check", suite, "-b", b, "-o", "json")
    assert res.exit_code == 1
    verdicts = {r["source"]: r["verdict"] for r in json.loads(res.output)["results"]}
    assert verdicts == {"analytics/api-primary-cxgbqsz9m2-8pm2g": "dropped",    # 10.244.3.64
                        "analytics/api-primary-qfpvdp4fqr-5xhgs": "delivered",  # same node
                        "analytics/api-primary-v9rwl2n6rj-8gx54": "delivered"}


def test_progress_line_on_a_terminal_only(capsys):
    from traceflow.questions.runner import Progress
    bar = Progress(3, "audit", enabled=True)
    for _ in range(3):
        bar.step()
    bar.close()
    err = capsys.readouterr().err
    assert "audit: 3/3" in err
    quiet = Progress(3, "audit", enabled=False)
    quiet.step()
    quiet.close()
    assert capsys.readouterr().err == ""
