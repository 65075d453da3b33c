"""Every error message issue 24 changed, one case each: it exits 2 (or 3 for no cluster),
names the file and line or the option it is about, and says what to type instead.

The review behind it: every InputError/CollectionError the CLI and the question resolvers
raise was read against "names the file/option and says what to type"; the messages below
were the ones that did not (a bare "not found" for a typo of an address, a port written as
kubectl prints it refused, a FLOW error blamed on a file "<flow>", an option missing without
saying which value to give, no hint where a cluster is missing, ...).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

SEED = str(example_path())
EX = os.path.dirname(SEED)
runner = CliRunner()


def refused(*args, code: int = 2, env: dict | None = None) -> str:
    r = runner.invoke(app, list(args), env=env)
    assert r.exit_code == code, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    return " ".join((r.stderr or r.output).split())


# (command, what the message must say: the option/file, and what to type)
CASES = [
    # addresses that are none: said as such, with the option, not as a pod "not found"
    (["trace", "203.0.113.300", "192.168.10.11:31901", "--bundle", SEED],
     ["SOURCE: '203.0.113.300' is not an IPv4 address", "0-255"]),
    (["trace", "frontend", "1.1.1.1/24", "--bundle", SEED],
     ["DESTINATION: '1.1.1.1/24' is a prefix: give one address (1.1.1.1)"]),
    (["route-get", "worker1", "10.0.0.0/8", "--bundle", SEED],
     ["DST: '10.0.0.0/8' is not an IPv4 or IPv6 address: give one address"]),
    # what people type for a port or a kind, answered with what to type
    (["pod-to-svc", "frontend", "backendsvc:80", "--bundle", SEED],
     ["SERVICE: backendsvc:80", "write backendsvc --port 80",
      "traceflow trace SOURCE svc/backendsvc:80"]),
    (["pod-to-svc", "frontend", "10.104.65.133:80", "--bundle", SEED],
     ["write 10.104.65.133 --port 80"]),
    (["trace", "frontend", "backendsvc:80", "--bundle", SEED],
     ["DESTINATION", "backendsvc is a Service: write svc/backendsvc:80"]),
    (["trace", "frontend", "svc:80", "--bundle", SEED],
     ["DESTINATION", "write svc/NAME:80 for a Service"]),
    (["trace", "default/deploy/x", "svc/backendsvc", "--bundle", SEED],
     ["SOURCE: default/deploy/x", "write deploy/x -n default"]),
    (["pod-to-svc", "frontend", "backendsvc", "--port", "80/XYZ", "--bundle", SEED],
     ["--port: '80/XYZ' is not a port", "NUMBER/PROTOCOL (80/TCP)"]),
    (["pod-to-svc", "frontend", "backendsvc", "--port", "80/UDP", "--protocol", "tcp",
      "--bundle", SEED],
     ["--port 80/UDP says UDP but --protocol says TCP"]),
    # the component commands: the argument or option, and the values it takes
    (["ovs-trace", "worker1", "in_port=frontend,tcp", "--bundle", SEED],
     ["FLOW: no port 'frontend' on the bridge: give in_port= one of", "frontend-a3ba2f"]),
    (["ovs-trace", "worker1", "in_port=1,ip,nw_dst=10.0.0.1/33", "--bundle", SEED],
     ["FLOW: 'nw_dst=10.0.0.1/33': an IPv4 prefix length is 0-32"]),
    (["ovs-trace", "worker1", "in_port=1,ip,nw_src=10.0.0.300", "--bundle", SEED],
     ["FLOW: bad value for nw_src"]),
    (["ovs-trace", "master", "in_port=1", "--bundle", SEED],
     ["NODE: node 'master' is in k8s/nodes.yaml but its files were not collected",
      "give one of worker1, worker2"]),
    (["nf-trace", "worker1", "--src", "10.222.1.48", "--dst", "10.104.65.133",
      "--bundle", SEED],
     ["--dport: which destination port? give --dport N",
      "traceflow nf-trace worker1 --src 10.222.1.48 --dst 10.104.65.133 --dport 80"]),
    (["nf-trace", "worker1", "--src", "1.1.1.1", "--dst", "2.2.2.2", "--dport", "80",
      "--hook", "FOO", "--bundle", SEED],
     ["--hook: unknown hook 'FOO': give one of PREROUTING, INPUT"]),
    (["route-get", "worker1", "10.0.0.1", "--iif", "zz", "--bundle", SEED],
     ["--iif: no device 'zz' on worker1: give one of", "antrea-gw0"]),
    # check, audit
    (["audit", "--bundle", SEED, "--fail-on", "dropped,nope"],
     ["--fail-on 'dropped,nope': 'nope' is not an outcome", "--fail-on dropped,unknown"]),
    (["rbac", "--bundle", SEED, "--app-exec", "frontend"],
     ["--app-exec: 'frontend': give NAMESPACE/POD,... (e.g. default/frontend"]),
    (["collect", "--output", "/tmp/x.tar.gz", "--parallel", "0"],
     ["--parallel 0: give 1 or more"]),
]


@pytest.mark.parametrize("args,needles", CASES, ids=lambda x: " ".join(x[:3])
                         if isinstance(x, list) and x and x[0] in
                         ("trace", "pod-to-svc", "ovs-trace", "nf-trace", "route-get",
                          "audit", "rbac", "collect") else None)
def test_message(args, needles):
    msg = refused(*args)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in: {msg}"


def test_a_protocol_the_service_does_not_serve_is_traced_as_the_datapath_does():
    """A Service port the bundle has over TCP only, asked over UDP, is not refused: no Service
    entry (iptables KUBE-SERVICES / Cilium's lb map) matches UDP, so the packet goes on to the
    ClusterIP unchanged, and the trace says so (issue 22: answer what the datapath does)."""
    r = subprocess.run([sys.executable, "-m", "traceflow", "pod-to-svc", "frontend", "backendsvc",
                        "--port", "80/UDP", "--bundle", SEED, "-o", "json"], capture_output=True,
                       text=True, env={**os.environ, "KUBECONFIG": os.devnull}, timeout=120)
    doc = json.loads(r.stdout)
    assert any("has no port 80 over UDP (it has 80/TCP): the datapath finds no Service entry"
               in w for w in doc["warnings"]), doc["warnings"]
    seen = [h["packet"]["nw_dst"] for p in doc["paths"] for leg in p["legs"]
            for h in leg["hops"] if leg["direction"] == "request" and h.get("packet")]
    assert seen and set(seen) == {"10.104.65.133"}, seen      # never translated


def test_a_bare_pair_of_ends_says_to_name_the_command():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "traceflow", "frontend", "backendsvc"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "'frontend' is not a command: to trace from frontend to backendsvc, write " \
           "`traceflow trace frontend backendsvc`" in r.stderr
    typo = subprocess.run([sys.executable, "-m", "traceflow", "tarce", "a", "b"],
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and "Did you mean 'trace'" in typo.stdout + typo.stderr


@pytest.mark.parametrize("args,offline", [
    (["check", f"{SEED}/checks.yaml"], "check a bundle instead: traceflow check SUITE.yaml "
                                       "--bundle PATH"),
    (["rbac"], "take the agent pods from a bundle's manifest instead: traceflow rbac "
               "--bundle PATH"),
])
def test_no_cluster_points_at_the_bundle(args, offline, tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path),
           "KUBERNETES_SERVICE_HOST": ""}
    msg = refused(*args, code=3, env=env)
    assert "cannot load Kubernetes credentials" in msg and offline in msg


def test_an_unreadable_flow_action_is_located(tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(SEED, bundle)
    flows = bundle / "nodes/worker1/ovs-flows.txt"
    lines = flows.read_text().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if 'in_port="frontend-a3ba2f" actions=' in line)
    lines[n] = lines[n].rstrip("\n").removesuffix(")") + "\n"      # resubmit(,10
    flows.write_text("".join(lines))
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle),
                  env={"TRACEFLOW_NO_INDEX": "1"})
    assert f"nodes/worker1/ovs-flows.txt, line {n + 1}: unreadable action 'resubmit(,10'" in msg
    assert 'in_port="frontend-a3ba2f"' in msg                   # the line's text


def test_an_unmodelled_action_blames_no_policy_and_says_where(tmp_path):
    """A valid action traceflow does not model: unknown (exit 1) with the flow's file:line in
    the summary, and no NetworkPolicy warning (the packet there had not met the Service's
    translation yet: what the policies say of it means nothing)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(SEED, bundle)
    flows = bundle / "nodes/worker1/ovs-flows.txt"
    lines = flows.read_text().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if 'in_port="frontend-a3ba2f" actions=' in line)
    lines[n] = lines[n].replace("resubmit(,10)", "push_mpls:0x8847,resubmit(,10)")
    flows.write_text("".join(lines))
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle)],
                      env={"TRACEFLOW_NO_INDEX": "1", "COLUMNS": "100"})
    assert r.exit_code == 1, r.output
    out = " ".join(r.stdout.split())
    assert "why: the trace met something it does not model" in out
    assert f"push_mpls:0x8847' is not modelled" in out
    assert f"(nodes/worker1/ovs-flows.txt:{n + 1})" in out
    assert "NetworkPolicy" not in out.split("more:")[0]


def test_command_summaries_are_one_line():
    """`traceflow --help` lists each command with its first paragraph: a sentence that breaks
    in the middle (a docstring's hard line break) reads as two half-sentences there."""
    import typer.main
    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        first = (cmd.help or "").strip().split("\n\n")[0]
        assert first and "\n" not in first and first.endswith("."), (name, first)


def test_completion_offers_only_nodes_a_component_command_takes():
    """k8s/nodes.yaml lists master, whose files the example does not hold: ovs-trace, nf-trace
    and route-get refuse it, so their NODE completion does not offer it."""
    import subprocess
    import sys
    for command in ("ovs-trace", "nf-trace", "route-get"):
        r = subprocess.run([sys.executable, "-m", "traceflow", "__complete", command,
                            "--bundle", SEED, ""], capture_output=True, text=True, timeout=60)
        assert r.stdout.split() == ["worker1", "worker2"], (command, r.stdout)


def test_junit_failures_lead_with_the_answer(tmp_path):
    """A CI's test report shows the failure message first: the policy and what it allows,
    then what was expected and the datapath's detail."""
    from xml.etree import ElementTree as ET
    report = tmp_path / "checks.xml"
    r = runner.invoke(app, ["check", f"{SEED}/checks.yaml", "--bundle", SEED, "--junit",
                            str(report)])
    assert r.exit_code == 1
    failures = [c.find("failure") for c in ET.parse(report).getroot().iter("testcase")
                if c.find("failure") is not None]
    assert failures
    wrong = next(f for f in failures if "frontendpolicy" in f.get("type") + f.get("message")
                 and "backendpolicy" in f.get("message"))
    assert wrong.get("message").startswith("denied by NetworkPolicy default/backendpolicy: "
                                           "allows ingress only from role=frontend on TCP/80")
    assert "why: denied by NetworkPolicy default/backendpolicy" in wrong.text
