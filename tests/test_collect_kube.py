"""Live collection through the official Kubernetes client, against a protocol-level fake API
server (tests/fake_kube_api.py: real REST paths, label selectors, pagination, 401/403/404
Status bodies, the exec websocket with v5/v4 channel subprotocols; exec runs the collector's
real script with stub binaries printing the example bundle's node files).

A live `traceflow pod-to-svc frontend backendsvc` (no --bundle) must produce the same trace as
the example bundle; `collect -o x.tar.gz` must write a bundle that traces identically. Faults:
an exec that never returns (bounded by --timeout, exit 3 naming the node), RBAC 403 on
pods/exec (exit 3, says what to grant), a command missing from the agent image (recorded; the
trace goes on), an unreachable API server, bad credentials, bad queries (exit 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_kube_api import FakeKubeAPI, free_port  # noqa: E402

from collectors import agents as A  # noqa: E402
from traceflow.bundle.reader import Bundle  # noqa: E402
from collectors.live import CollectOptions, collect, write_bundle  # noqa: E402
from traceflow.cli.app import app, example_path  # noqa: E402

EXAMPLE = example_path()
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture()
def fake(tmp_path):
    api = FakeKubeAPI()
    api.start()
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture(scope="module")
def reference():
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(EXAMPLE),
                            "-o", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _live(fake, *args):
    return runner.invoke(app, [*args, "--kubeconfig", str(fake.kubeconfig)])


def _same_trace(a: dict, b: dict, why: str = "") -> None:
    assert a["query"] == b["query"], why
    assert a["verdict"] == b["verdict"], why
    if a["paths"] != b["paths"]:         # every path, leg, hop, rule, file:line and packet
        import difflib
        diff = "\n".join(difflib.unified_diff(json.dumps(b["paths"], indent=1).splitlines(),
                                              json.dumps(a["paths"], indent=1).splitlines(),
                                              lineterm="", n=1))
        pytest.fail(f"traces differ:\n{diff[:3000]}\n{why}")


# ---- the happy path ----------------------------------------------------------------------------

def test_live_trace_equals_the_bundle_trace(fake, reference):
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "-o", "json", "--app-exec")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    _same_trace(doc, reference, r.stderr)
    assert doc["verdict"] == "delivered" and len(doc["paths"]) == 2
    # the nodes the trace touches, and only those: the master's agent is never exec'd
    agent_execs = {e["pod"] for e in fake.execs if e["namespace"] == "kube-system"}
    assert agent_execs == {"antrea-agent-f76q2", "antrea-agent-fv5x9"}
    # one exec per agent container: OVS in antrea-ovs, host state in antrea-agent
    per = sorted((e["pod"], e["container"]) for e in fake.execs if e["namespace"] == "kube-system")
    assert per == [("antrea-agent-f76q2", "antrea-agent"), ("antrea-agent-f76q2", "antrea-ovs"),
                   ("antrea-agent-fv5x9", "antrea-agent"), ("antrea-agent-fv5x9", "antrea-ovs")]
    # pod-side facts from inside the source pod and the endpoints (asked for: --app-exec)
    assert {e["pod"] for e in fake.execs if e["namespace"] == "default"} == \
        {"frontend", "backend1", "backend2"}
    assert {e["subprotocol"] for e in fake.execs} == {"v5.channel.k8s.io"}


def test_no_exec_into_application_pods_without_the_flag(fake, reference):
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "-o", "json")
    assert r.exit_code == 0, r.stderr
    assert {e["namespace"] for e in fake.execs} == {"kube-system"}
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "delivered" and doc["query"] == reference["query"]
    # the first hop is derived instead, and the trace says so
    assert "derived from Antrea's conventions" in r.stdout
    b = collect(CollectOptions(kubeconfig=str(fake.kubeconfig), source="frontend",
                               destination="backendsvc", kind="pod-to-svc", log=lambda m: None))
    assert not [n for n in b.names() if n.startswith("pods/")]
    assert any("needs --app-exec" in n for n in b.manifest["collection_notes"])


def test_exec_commands_are_the_fixed_script_with_constant_arguments(fake):
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "-o", "json")
    assert r.exit_code == 0, r.stderr
    for e in fake.execs:
        cmd = e["command"]
        assert cmd[:3] == ["sh", "-c", A.SCRIPT] and cmd[3] == "traceflow"
        assert len(cmd[4]) == 24 and all(c in "0123456789abcdef" for c in cmd[4])
        assert cmd[5:] and all(item in A.ITEMS for item in cmd[5:])
    tokens = {e["command"][4] for e in fake.execs}
    assert len(tokens) == 1               # one random token per run
    import re
    for word in ("frontend", "backendsvc", "worker1", "kube-system", "antrea-agent-f76q2"):
        assert not re.search(rf"\b{word}\b", A.SCRIPT), word


def test_collect_writes_a_bundle_that_traces_identically(fake, reference, tmp_path):
    out = tmp_path / "live.tar.gz"
    r = _live(fake, "collect", "frontend", "backendsvc", "-o", str(out), "--app-exec")
    assert r.exit_code == 0, r.stderr
    assert "2 node(s)" in r.stdout
    r2 = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(out),
                             "-o", "json"])
    assert r2.exit_code == 0, r2.output
    _same_trace(json.loads(r2.stdout), reference)
    b = Bundle.open(out)
    m = b.manifest
    assert m["cni"] == "antrea" and m["cni_version"] == "v0.10.0"
    assert m["kube_proxy"] == "iptables"
    assert m["nodes"]["worker1"] == {"agent_pod": "kube-system/antrea-agent-f76q2",
                                     "tunnel_dev": "genev_sys_6081"}
    assert m["query"]["source"] == "default/frontend"
    assert m["query"]["destination"] == "default/backendsvc"
    assert m["query"]["nodes"] == ["worker1", "worker2"]
    assert "collection_errors" not in m
    assert b.node_names() == ["worker1", "worker2"]
    # byte for byte what the agents printed
    for node in ("worker1", "worker2"):
        for f in (EXAMPLE / "nodes" / node).iterdir():
            assert b.raw(f"nodes/{node}/{f.name}") == f.read_bytes(), f
    assert m["files"]["nodes/worker1/ovs-flows.txt"].startswith(
        "ovs-ofctl -O OpenFlow15 dump-flows br-int --no-stats --names  (exec "
        "kube-system/antrea-agent-f76q2 -c antrea-ovs)")
    # iptables-save is not in this image: the list format was taken instead, and said so
    assert any("iptables-save is not installed in the agent container" in n
               for n in m["collection_notes"])


def test_collect_folder_and_all_nodes(fake, tmp_path):
    out = tmp_path / "folder"
    r = _live(fake, "collect", "-o", str(out), "--all-nodes")
    # the master has no files in the example: its image has no tools at all -> exit 3
    assert r.exit_code == 3
    assert "master" in r.stderr and "ovs-ofctl is not installed in the agent container" in r.stderr
    b = Bundle.open(out)
    assert (out / "manifest.yaml").exists() and (out / "k8s" / "pods.yaml").exists()
    assert b.node_names() == ["worker1", "worker2"]
    errs = b.manifest["collection_errors"]
    assert {e["node"] for e in errs} == {"master"}
    assert all(e["file"].startswith("nodes/master/") for e in errs)


def test_pod_to_pod_on_one_node_collects_only_that_node(fake):
    r = _live(fake, "pod-to-pod", "frontend", "backend1", "-o", "json", "--app-exec")
    assert r.exit_code in (0, 1), r.stderr
    assert {e["pod"] for e in fake.execs if e["namespace"] == "kube-system"} == \
        {"antrea-agent-f76q2"}
    ref = runner.invoke(app, ["pod-to-pod", "frontend", "backend1", "--bundle", str(EXAMPLE),
                              "-o", "json"])
    _same_trace(json.loads(r.stdout), json.loads(ref.stdout))


def test_save_bundle_and_v4_protocol(tmp_path, reference):
    api = FakeKubeAPI(subprotocols=("v4.channel.k8s.io",))
    api.start()
    try:
        kc = api.write_kubeconfig(tmp_path / "kc", exec_plugin=False)
        saved = tmp_path / "saved.tar.gz"
        r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--kubeconfig", str(kc),
                                "--save-bundle", str(saved), "-o", "json", "--app-exec"])
        assert r.exit_code == 0, r.stderr
        _same_trace(json.loads(r.stdout), reference, r.stderr)
        assert {e["subprotocol"] for e in api.execs} == {"v4.channel.k8s.io"}
        assert Bundle.open(saved).manifest["query"]["source"] == "default/frontend"
    finally:
        api.stop()


SECRETS = [f"s3cr3t-{i:02d}-planted" for i in range(12)]


def _plant_secrets(fake):
    """Twelve secret values where real clusters keep them, in pods, nodes and services."""
    s = SECRETS
    pod = fake.find("pods", "default", "frontend")
    c = pod["spec"]["containers"][0]
    c["args"] = ["--password", s[0]]
    c["command"] = ["/app", f"--token={s[1]}"]
    c["env"] = [{"name": "DB_PASSWORD", "value": s[2]}]
    c["envFrom"] = [{"secretRef": {"name": s[3]}}]
    c["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": 80,
                                      "httpHeaders": [{"name": "Authorization",
                                                       "value": f"Bearer {s[4]}"}]}}
    c["lifecycle"] = {"postStart": {"exec": {"command": ["sh", "-c", f"login {s[5]}"]}}}
    pod["spec"]["volumes"] = [{"name": "v", "csi": {"driver": "secrets-store.csi.k8s.io",
                                                    "volumeAttributes": {"key": s[6]}}}]
    pod["metadata"]["annotations"] = {
        "vault.example.com/token": s[7],
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps({"env": s[8]})}
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {f"f:{s[9]}": {}}}]
    node = fake.find("nodes", None, "worker1")
    node["metadata"]["annotations"] = {"cloud.example.com/credentials": s[10]}
    svc = fake.find("services", "default", "backendsvc")
    svc["metadata"]["annotations"] = {"lb.example.com/api-key": s[11]}


def test_no_secret_reaches_the_bundle(fake, tmp_path):
    _plant_secrets(fake)
    out = tmp_path / "b.tar.gz"
    r = _live(fake, "collect", "frontend", "backendsvc", "-o", str(out), "--app-exec")
    assert r.exit_code == 0, r.stderr
    import tarfile
    with tarfile.open(out) as tar:
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    leaked = [s for s in SECRETS if s.encode() in blob]
    assert leaked == []
    for word in (b"DB_PASSWORD", b"secretRef", b"httpHeaders", b"last-applied", b"volumes",
                 b"managedFields", b"annotations"):
        assert word not in blob, word
    # what a trace reads is still there
    b = Bundle.open(out)
    pods = yaml.safe_load(b.text("k8s/pods.yaml"))["items"]
    front = next(p for p in pods if p["metadata"]["name"] == "frontend")
    assert front["status"]["podIP"] and front["spec"]["nodeName"] == "worker1"
    assert front["metadata"]["labels"] and front["spec"]["containers"][0]["name"]
    assert not any("secret" in path.lower() for _method, path in fake.requests)
    assert not any("configmaps" in path for _method, path in fake.requests)
    # every list was read page by page (the fake serves 2 items per page)
    assert any("continue=" in path for _m, path in fake.requests)


def test_allow_list_keeps_only_listed_fields():
    from collectors.kube import sanitize
    svc = {"kind": "Service", "metadata": {"name": "a", "namespace": "b",
                                           "annotations": {"x": "y"}},
           "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80, "extra": "z"}],
                    "sessionAffinity": "ClientIP", "unknownField": "secret"},
           "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4", "x": 1}]}}}
    assert sanitize(svc) == {
        "metadata": {"name": "a", "namespace": "b"},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "sessionAffinity": "ClientIP"},
        "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}}
    node = {"kind": "Node", "metadata": {"name": "n", "annotations": {
        "network.cilium.io/ipv4-pod-cidr": "10.0.1.0/24", "vault/token": "x"}}}
    assert sanitize(node) == {"metadata": {"name": "n", "annotations": {
        "network.cilium.io/ipv4-pod-cidr": "10.0.1.0/24"}}}
    # a list item without its kind but pod-shaped is cut like a pod (support bundles)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "args": ["x"]}]}}
    assert sanitize(pod) == {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}


def test_deploy_and_selector_resolution(fake):
    fake.add_deployment("default", "backend", {"role": "backend"})
    b = collect(CollectOptions(kubeconfig=str(fake.kubeconfig), source="deploy/backend",
                               log=lambda m: None))
    assert b.manifest["query"]["source"] == "default/backend1"     # first Running pod
    r = _live(fake, "collect", "-l", "role=backend", "-o", "/dev/null/x")
    assert r.exit_code == 2
    assert "ambiguous" in r.stderr and "backend1" in r.stderr and "backend2" in r.stderr
    b = collect(CollectOptions(kubeconfig=str(fake.kubeconfig), selector="role=frontend",
                               log=lambda m: None))
    assert b.manifest["query"]["source"] == "default/frontend"
    assert b.node_names() == ["worker1"]


@pytest.mark.parametrize("args, message", [
    (["pod-to-svc", "frontnd", "backendsvc"], "pod default/frontnd not found; did you mean: "
                                              "frontend"),
    (["pod-to-svc", "frontend", "backendsv"], "did you mean: backendsvc"),
    (["pod-to-svc", "frontend", "backendsvc", "--port", "htp"], "has no port 'htp'"),
    (["pod-to-svc", "Front_End", "backendsvc"], "invalid pod name 'Front_End'"),
    (["pod-to-svc", "frontend", "backendsvc", "-n", "Bad..NS"], "invalid namespace name"),
    (["pod-to-svc", "deploy/nothere", "backendsvc"], "deployment default/nothere not found"),
    (["pod-to-svc", "frontend", "backendsvc", "--context", "nope"], "context 'nope' not found"),
])
def test_bad_queries_exit_2_before_touching_nodes(fake, args, message):
    r = _live(fake, *args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert fake.execs == []


def test_pod_not_running_and_service_without_endpoints(fake):
    pod = fake.find("pods", "default", "backend1")
    pod["status"]["phase"] = "Pending"
    r = _live(fake, "pod-to-pod", "backend1", "frontend")
    assert r.exit_code == 2 and "is not Running (phase Pending)" in r.stderr
    fake.objects["services"].append({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "lonely", "namespace": "default"},
        "spec": {"clusterIP": "10.96.7.7", "ports": [{"port": 80, "protocol": "TCP"}],
                 "selector": {"app": "nothing"}, "type": "ClusterIP"}})
    r = _live(fake, "pod-to-svc", "frontend", "lonely", "-o", "json")
    assert "service default/lonely has no endpoints" in r.stderr
    assert r.exit_code in (0, 1)
    json.loads(r.stdout)


# ---- faults --------------------------------------------------------------------------------

def test_exec_that_never_returns_is_bounded_and_names_the_node(fake):
    fake.hang_nodes = {"worker2"}
    t0 = time.monotonic()
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "-o", "json", "--timeout", "3")
    took = time.monotonic() - t0
    assert took < 15, took
    assert r.exit_code == 3
    assert "worker2" in r.stderr and "did not finish within the time limit" in r.stderr
    assert "collection failed: node(s) worker2 could not be collected" in r.stderr
    doc = json.loads(r.stdout)            # the trace still went as far as it could
    assert doc["verdict"] != "delivered"
    to_b1 = next(p for p in doc["paths"] if p["endpoint"] == "default/backend1")
    assert to_b1["verdict"] == "delivered"           # worker1 only: fully traced
    assert any(p["verdict"] != "delivered" for p in doc["paths"])
    deadline = time.monotonic() + 5                  # and the stream was abandoned, not leaked
    while time.monotonic() < deadline and not any(e.get("abandoned_by_client")
                                                  for e in fake.execs):
        time.sleep(0.1)
    assert any(e.get("abandoned_by_client") for e in fake.execs)


def test_overall_deadline_bounds_everything(fake, tmp_path):
    fake.hang_nodes = {"worker1", "worker2"}
    t0 = time.monotonic()
    r = _live(fake, "collect", "frontend", "backendsvc", "-o", str(tmp_path / "b.tgz"),
              "--timeout", "30", "--deadline", "3")
    assert time.monotonic() - t0 < 12
    assert r.exit_code == 3 and "worker1" in r.stderr and "worker2" in r.stderr


def test_endless_continue_tokens_stop_at_the_deadline(fake):
    fake.endless_continue = {"pods"}
    t0 = time.monotonic()
    # (the client's imports and credential plugin take a second or two on a busy machine)
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "--deadline", "5")
    took = time.monotonic() - t0
    assert took < 12, took
    assert r.exit_code == 3
    assert "the overall --deadline passed while listing pods" in r.stderr
    assert "still sending continue tokens" in r.stderr
    assert "Traceback" not in r.output
    assert fake.execs == []


def test_an_answer_dripping_byte_by_byte_stops_at_the_deadline(fake):
    fake.drip = 0.05
    t0 = time.monotonic()
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "--deadline", "5")
    assert time.monotonic() - t0 < 12
    assert r.exit_code == 3 and "the answer was still arriving" in r.stderr


def test_a_repeated_continue_token_is_refused_at_once(fake, monkeypatch):
    from collectors import kube as K
    calls = []

    def call(self, api, method, what, *args, **kwargs):
        calls.append(kwargs.get("_continue"))
        return {"items": [], "metadata": {"continue": "same"}}
    monkeypatch.setattr(K.Kube, "_call", call)
    kube = K.Kube(str(fake.kubeconfig))
    with pytest.raises(K.CollectionError, match="keeps sending continue tokens"):
        kube.list_pods("default")
    assert calls == [None, "same"]


def test_exec_output_is_capped(fake):
    b = collect(CollectOptions(kubeconfig=str(fake.kubeconfig), source="frontend",
                               destination="backendsvc", kind="pod-to-svc", log=lambda m: None,
                               max_output=3000))
    errs = b.manifest["collection_errors"]
    assert any("printed more than 3000 bytes" in e["reason"] for e in errs), errs
    assert all(len(b.raw(n)) <= 3000 for n in b.names() if n.startswith("nodes/"))
    assert {e["node"] for e in errs} == {"worker1", "worker2"}


def test_exec_forbidden_by_rbac(fake):
    fake.forbidden = [r"^/api/v1/namespaces/kube-system/pods/[^/]+/exec$"]
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "-o", "json")
    assert r.exit_code == 3
    assert "forbidden to exec into kube-system/antrea-agent-f76q2" in r.stderr
    assert 'cannot create resource "pods/exec"' in r.stderr
    assert "deploy/rbac.yaml" in r.stderr


def test_pod_side_exec_forbidden_is_only_a_note(fake, reference):
    # the recommended RBAC grants pods/exec in kube-system only
    fake.forbidden = [r"^/api/v1/namespaces/default/pods/[^/]+/exec$"]
    b = collect(CollectOptions(kubeconfig=str(fake.kubeconfig), source="frontend",
                               destination="backendsvc", kind="pod-to-svc", log=lambda m: None,
                               app_exec=True))
    assert "collection_errors" not in b.manifest
    assert not [n for n in b.names() if n.startswith("pods/")]
    assert any("no pod-side facts" in n for n in b.manifest["collection_notes"])


def test_list_forbidden_is_exit_3(fake):
    fake.forbidden = [r"^/api/v1/pods$"]
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc")
    assert r.exit_code == 3
    assert "forbidden reading pods" in r.stderr and "deploy/rbac.yaml" in r.stderr


def test_missing_command_in_the_agent_image_without_ssh(fake, reference):
    fake.removed_binaries["worker2"] = {"iptables-save", "iptables"}
    fake.removed_binaries["worker1"] = {"ipset"}
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "-o", "json")
    assert r.exit_code == 3
    assert ("nodes/worker2/iptables-save.txt: iptables-save is not installed in the agent "
            "container (kube-system/antrea-agent-fv5x9 -c antrea-agent) (no SSH "
            "configured for a fallback)") in r.stderr
    doc = json.loads(r.stdout)                         # the trace goes on as far as it can
    assert doc["query"] == reference["query"] and doc["paths"]
    # the optional ipset on worker1 is just recorded
    b = collect(CollectOptions(kubeconfig=str(fake.kubeconfig), source="frontend",
                               destination="backendsvc", kind="pod-to-svc", log=lambda m: None))
    notes = b.manifest["collection_notes"]
    assert any(n.startswith("nodes/worker1/ipset.txt not collected: ipset is not installed")
               for n in notes)
    assert not b.has("nodes/worker1/ipset.txt") and b.has("nodes/worker2/ipset.txt")


def test_unreachable_api_server_and_bad_credentials(tmp_path):
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    t0 = time.monotonic()
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--kubeconfig", str(kc)])
    assert time.monotonic() - t0 < 10
    assert r.exit_code == 3 and "cannot reach the Kubernetes API server" in r.stderr
    api = FakeKubeAPI(token="right")
    api.start()
    try:
        kc2 = api.write_kubeconfig(tmp_path / "kc2", exec_plugin=False)
        kc2.write_text(kc2.read_text().replace("token: right", "token: wrong"))
        r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--kubeconfig", str(kc2)])
        assert r.exit_code == 3 and "unauthorized" in r.stderr
    finally:
        api.stop()


def test_no_bundle_and_no_cluster_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc"])
    assert r.exit_code == 3
    assert "cannot load Kubernetes credentials" in r.stderr


# ---- units --------------------------------------------------------------------------------------

def test_split_output_is_exact():
    t = "ab12cd34ef56ab12cd34ef56"
    out = (f"### traceflow {t} begin a.txt\nline1\nline2\n\n### traceflow {t} end a.txt rc=0\n"
           f"### traceflow {t} begin b.txt\nno newline\n### traceflow {t} end b.txt rc=3\n"
           f"### traceflow {t} begin c.txt\n### traceflow other begin x\n\n"
           f"### traceflow {t} end c.txt rc=0\n"
           f"### traceflow {t} begin d.txt\npartial").encode()
    err = f"### traceflow {t} begin b.txt\nboom\n\n### traceflow {t} end b.txt rc=3\n".encode()
    res = A.split_output(out, err, t)
    assert res["a.txt"].stdout == b"line1\nline2\n" and res["a.txt"].rc == 0
    assert res["b.txt"].stdout == b"no newline" and res["b.txt"].rc == 3
    assert res["b.txt"].error_text() == "exit code 3: boom"
    assert res["c.txt"].stdout == b"### traceflow other begin x\n"   # another token is data
    assert res["d.txt"].rc is None and "cut off" in res["d.txt"].error_text()


def test_script_runs_in_a_plain_posix_shell(tmp_path):
    """The real script, in dash, with a PATH of three stubs: markers, rc=127, the
    iptables-save -> list-format fallback, and arguments never evaluated."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ip").write_text('#!/bin/sh\n[ "$*" = "rule list" ] && printf "0:\\tfrom all lookup '
                             'local" && exit 0\nexit 5\n')
    (bin_ / "iptables").write_text("#!/bin/sh\necho \"nat $*\"\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    token = A.new_token()
    argv = A.script_argv(token, ["ip-rule.txt", "ip-route.txt", "iptables-save.txt", "nft.txt"])
    proc = subprocess.run(["/bin/sh", *argv[1:]], capture_output=True,
                          env={"PATH": str(bin_)}, timeout=10)
    assert proc.returncode == 0
    res = A.split_output(proc.stdout, proc.stderr, token)
    assert res["ip-rule.txt"].stdout == b"0:\tfrom all lookup local" and res["ip-rule.txt"].ok
    assert res["ip-route.txt"].rc == 5
    assert res["iptables-save.txt"].rc == 127
    assert res["iptables-nat-list.txt"].stdout == b"nat -t nat -L -n\n"
    assert res["nft.txt"].rc == 127
    with pytest.raises(ValueError):
        A.script_argv(token, ["ip-rule.txt; rm -rf /"])
    with pytest.raises(ValueError):
        A.script_argv("$(reboot)", ["ip-rule.txt"])


def test_write_bundle_refuses_paths_outside(tmp_path):
    from traceflow.model.errors import InputError
    with pytest.raises(InputError):
        write_bundle({"manifest.yaml": b"", "../evil": b"x"}, tmp_path / "b")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        write_bundle({"manifest.yaml": b""}, tmp_path / "full")


def test_write_bundle_never_overwrites_without_force(tmp_path):
    from traceflow.model.errors import InputError
    out = tmp_path / "x.tar.gz"
    out.write_bytes(b"precious")
    with pytest.raises(InputError, match="exists: pass --force"):
        write_bundle({"manifest.yaml": b"format: 1\n"}, out)
    assert out.read_bytes() == b"precious"
    write_bundle({"manifest.yaml": b"format: 1\n"}, out, force=True)
    import tarfile
    with tarfile.open(out) as tar:
        assert tar.getnames() == ["x/manifest.yaml"]
    assert [p.name for p in tmp_path.iterdir()] == ["x.tar.gz"]     # no temp file left


def test_write_bundle_follows_no_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    out = tmp_path / "x.tar.gz"
    # the old predictable temp path, and the target itself, as symlinks to a victim
    (tmp_path / "x.tar.gz.part").symlink_to(victim)
    write_bundle({"manifest.yaml": b"format: 1\n"}, out)
    assert victim.read_bytes() == b"keep"
    out.unlink()
    out.symlink_to(victim)
    from traceflow.model.errors import InputError
    with pytest.raises(InputError, match="exists"):
        write_bundle({"manifest.yaml": b""}, out)
    write_bundle({"manifest.yaml": b""}, out, force=True)
    assert victim.read_bytes() == b"keep" and not out.is_symlink()
    # a folder given as a symlink is refused
    (tmp_path / "dirlink").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(InputError):
        write_bundle({"manifest.yaml": b""}, tmp_path / "dirlink")


def test_collect_refuses_to_overwrite_without_force(fake, tmp_path):
    out = tmp_path / "b.tar.gz"
    out.write_bytes(b"old")
    r = _live(fake, "collect", "frontend", "backendsvc", "-o", str(out))
    assert r.exit_code == 2 and "pass --force" in r.stderr and out.read_bytes() == b"old"
    r = _live(fake, "collect", "frontend", "backendsvc", "-o", str(out), "--force")
    assert r.exit_code == 0, r.stderr
    assert Bundle.open(out).manifest["query"]["source"] == "default/frontend"


def test_cli_start_up_imports_no_kubernetes_or_paramiko():
    code = ("import sys, traceflow.cli.app, collectors.live, collectors.agents, collectors.kube, "
            "collectors.ssh\n"
            "print(','.join(m for m in ('kubernetes', 'paramiko', 'websocket') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr
    r = subprocess.run([sys.executable, "-m", "traceflow", "collect", "--help"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "--all-nodes" in r.stdout


# ---- RBAC ----------------------------------------------------------------------------------

def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _allowed(docs: list[dict], group: str, resource: str, verb: str, namespace: str | None,
             name: str | None) -> bool:
    """Kubernetes RBAC semantics for these documents: ClusterRoles bound cluster-wide, Roles in
    their namespace, resourceNames restricting by object name (a list/create without a name
    never matches a rule that has resourceNames)."""
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    rules += [r for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == namespace
              for r in d["rules"]]
    for r in rules:
        if group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]:
            names = r.get("resourceNames")
            if not names or (name is not None and name in names):
                return True
    return False


def test_deploy_rbac_is_the_read_only_part_and_grants_no_exec():
    from collectors import rbac as R
    docs = _docs((ROOT / "deploy" / "rbac.yaml").read_text())
    assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "ClusterRole",
                                         "ClusterRoleBinding"}
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == R.reader_documents(R.subject())[0]["rules"]
    for r in role["rules"]:
        assert set(r["verbs"]) <= {"get", "list"}, r
        assert not {"secrets", "configmaps", "pods/exec", "*"} & set(r["resources"]), r
        assert "*" not in r["apiGroups"]


def test_generated_rbac_grants_exec_on_the_agent_pods_only(fake, tmp_path):
    r = _live(fake, "rbac")
    assert r.exit_code == 0, r.stderr
    docs = _docs(r.stdout)
    roles = [d for d in docs if d["kind"] == "Role"]
    assert [x["metadata"]["namespace"] for x in roles] == ["kube-system"]
    agent_pods = sorted(p["metadata"]["name"] for p in fake.objects["pods"]
                        if (p["metadata"].get("labels") or {}).get("component") == "antrea-agent")
    exec_rules = [x for d in docs if d["kind"] in ("Role", "ClusterRole") for x in d["rules"]
                  if {"pods/exec", "pods/*", "*"} & set(x["resources"])]
    assert len(exec_rules) == 1 and exec_rules[0]["resourceNames"] == agent_pods
    assert set(exec_rules[0]["verbs"]) == {"create", "get"}
    others = [p for p in fake.objects["pods"] if p["metadata"]["name"] not in agent_pods]
    assert any(p["metadata"]["namespace"] == "kube-system" for p in others)   # coredns
    for p in others:   # no other pod, in kube-system or anywhere: not even by another verb
        for verb in ("create", "get"):
            assert not _allowed(docs, "", "pods/exec", verb, p["metadata"]["namespace"],
                                p["metadata"]["name"]), p["metadata"]["name"]
    for d in docs:
        for x in d.get("rules") or []:
            assert "secrets" not in x["resources"]
            assert set(x["verbs"]) <= {"get", "list", "create"}
            if "create" in x["verbs"]:
                assert x["resources"] == ["pods/exec"] and x["resourceNames"]
    # from a bundle's manifest: the same grant
    out = tmp_path / "b.tar.gz"
    assert _live(fake, "collect", "-o", str(out), "--nodes", "worker1,worker2").exit_code == 0
    r2 = runner.invoke(app, ["rbac", "--bundle", str(out), "--user", "alice"])
    assert r2.exit_code == 0, r2.output
    docs2 = _docs(r2.stdout)
    rule2 = next(x for d in docs2 if d["kind"] == "Role" for x in d["rules"])
    assert rule2["resourceNames"] == ["antrea-agent-f76q2", "antrea-agent-fv5x9"]
    assert all(d["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": "alice"}] for d in docs2 if "subjects" in d)


def test_every_request_the_collector_makes_is_allowed_by_the_generated_rbac(fake):
    import re
    docs = _docs(_live(fake, "rbac").stdout)
    fake.requests.clear()
    fake.add_deployment("default", "front", {"role": "frontend"})
    r = _live(fake, "pod-to-svc", "deploy/front", "backendsvc", "-o", "json", "--app-exec")
    assert r.exit_code == 0, r.stderr
    seen = set()
    for _method, path in fake.requests:
        p = path.split("?", 1)[0]
        m = re.match(r"^/(?:api/v1|apis/([^/]+)/[^/]+)(?:/namespaces/([^/]+))?/([^/]+)"
                     r"(?:/([^/]+))?(?:/([^/]+))?$", p)
        assert m, p
        group, ns, resource, name, sub = m.groups()
        resource = f"{resource}/{sub}" if sub else resource
        verb = "create" if sub == "exec" else ("get" if name else "list")
        seen.add((group or "", resource, ns))
        if sub == "exec" and ns != "kube-system":
            # application pods (--app-exec): never granted by traceflow's RBAC
            assert not _allowed(docs, group or "", resource, verb, ns, name)
            continue
        assert _allowed(docs, group or "", resource, verb, ns, name), (verb, path)
    assert ("apps", "deployments", "default") in seen
    assert ("", "pods/exec", "kube-system") in seen
    assert ("crd.antrea.io", "clusternetworkpolicies", None) in seen   # probed, 404: absent


def test_rbac_from_a_bundle_with_a_bad_agent_name_is_exit_2(tmp_path):
    write_bundle({"manifest.yaml": b"format: traceflow-bundle/v1\ncni: antrea\nnodes:\n  w1:\n"
                                   b"    agent_pod: 'kube-system/x; kubectl delete'\n"},
                 tmp_path / "b")
    r = runner.invoke(app, ["rbac", "--bundle", str(tmp_path / "b")])
    assert r.exit_code == 2 and "invalid pod name" in r.stderr and "agent_pod" in r.stderr


def test_rbac_without_agent_pods_is_a_clear_error(fake):
    fake.objects["pods"] = [p for p in fake.objects["pods"]
                            if (p["metadata"].get("labels") or {}).get("component")
                            != "antrea-agent"]
    r = _live(fake, "rbac")
    assert r.exit_code == 3 and "no CNI agent pods found" in r.stderr
