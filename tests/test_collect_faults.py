"""Collection that keeps what it got, holds no secret and bounds its memory (issue 25).

Each fault runs `traceflow collect` in a child process against the fake API server
(tests/fake_kube_faults.py) and checks: the command ends within its deadline, writes a partial
bundle whose manifest records what is missing and why, says so clearly, and the child's own
peak RSS (VmHWM, read by the child itself at exit) stays under 300 MB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_kube_api import cilium_cluster  # noqa: E402
from fake_kube_faults import FaultyKubeAPI  # noqa: E402

from traceflow.bundle.reader import Bundle  # noqa: E402
from traceflow.cli.app import app  # noqa: E402

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
PEAK_LIMIT_MB = 300

# The child: the real CLI, then its own peak resident set size on stderr.
CHILD = r"""
import sys
from traceflow.cli.app import run
sys.argv = ["traceflow", *sys.argv[1:]]
code = 0
try:
    run()
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
finally:
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]
    sys.stderr.write(f"\nPEAK_RSS_KB={hwm}\n")
    sys.stderr.flush()
sys.exit(code)
"""


@pytest.fixture()
def fake(tmp_path):
    api = FaultyKubeAPI()
    api.start()
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield api
    finally:
        api.stop()


def _child(fake, out: Path, *args: str, deadline: float = 20, timeout: float = 4):
    cmd = [sys.executable, "-c", CHILD, "collect", "frontend", "backendsvc", "-o", str(out),
           "--kubeconfig", str(fake.kubeconfig), "--deadline", str(deadline),
           "--timeout", str(timeout), *args]
    env = dict(os.environ, TRACEFLOW_NO_INDEX="1")
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=deadline + 60,
                       cwd=ROOT)
    took = time.monotonic() - t0
    peak = int(p.stderr.rsplit("PEAK_RSS_KB=", 1)[1].split()[0]) / 1024
    return p, took, peak


def _errors(out: Path) -> list[dict]:
    return Bundle.open(out).manifest.get("collection_errors") or []


MEASURED: dict[str, tuple[float, float]] = {}


def _check_bounds(name: str, p, took: float, peak: float, deadline: float) -> None:
    MEASURED[name] = (round(peak, 1), round(took, 1))
    print(f"\n{name}: peak RSS {peak:.0f} MB, {took:.1f} s")
    assert "Traceback" not in p.stderr, p.stderr
    assert peak < PEAK_LIMIT_MB, (name, peak)
    # the deadline plus the child's start (interpreter, kubernetes client imports) and writing
    assert took < deadline + 15, (name, took)


# ---- one list fails: everything else is kept -----------------------------------------------

@pytest.mark.parametrize("fault, missing, words", [
    ("500", "api-error", "answered 500"),
    ("stall", "api-error", "did not answer networkpolicies"),
    ("cut", "api-error", "was cut off"),
    ("huge", "api-error", "larger than"),
    ("hugechunked", "api-error", "larger than"),
])
def test_one_list_fault_keeps_the_rest(fake, tmp_path, fault, missing, words):
    fake.list_faults = {r"^/apis/networking.k8s.io/v1/networkpolicies$": fault}
    out = tmp_path / "b.tgz"
    p, took, peak = _child(fake, out, deadline=20, timeout=2)
    _check_bounds(f"list {fault}", p, took, peak, 20)
    assert p.returncode == 3, p.stderr
    assert words in p.stderr, p.stderr
    assert "k8s/networkpolicies.yaml not collected" in p.stderr
    b = Bundle.open(out)
    errs = b.manifest["collection_errors"]
    entry = next(e for e in errs if e.get("kind") == "networkpolicies")
    assert entry["file"] == "k8s/networkpolicies.yaml" and entry["missing"] == missing
    assert not b.has("k8s/networkpolicies.yaml")
    # everything else is there: the other lists and both nodes
    for f in ("pods", "services", "endpointslices", "nodes"):
        assert b.has(f"k8s/{f}.yaml"), f
    assert b.node_names() == ["worker1", "worker2"]
    assert b.manifest["query"]["destination"] == "default/backendsvc"
    if fault.startswith("huge"):     # refused at the cap, not read to the end
        assert fake.sent.get(fault, 0) < 300 << 20


def test_a_list_the_query_needs_fails_the_partial_bundle_is_still_written(fake, tmp_path):
    fake.list_faults = {r"^/api/v1/services$": "500"}
    out = tmp_path / "b.tgz"
    p, took, peak = _child(fake, out)
    _check_bounds("services 500", p, took, peak, 20)
    assert p.returncode == 3
    assert "cannot resolve the destination 'backendsvc': k8s/services.yaml was not collected" \
        in p.stderr, p.stderr
    b = Bundle.open(out)
    kinds = {e.get("kind") for e in b.manifest["collection_errors"]}
    assert {"services", "query"} <= kinds
    assert b.has("k8s/pods.yaml") and b.has("k8s/nodes.yaml")
    assert "query" not in b.manifest


def test_forbidden_list_is_recorded_and_the_trace_says_so(fake, tmp_path):
    fake.forbidden = [r"^/apis/networking.k8s.io/v1/networkpolicies$"]
    out = tmp_path / "b.tgz"
    p, took, peak = _child(fake, out)
    _check_bounds("list 403", p, took, peak, 20)
    assert p.returncode == 3
    entry = next(e for e in _errors(out) if e.get("kind") == "networkpolicies")
    assert entry["missing"] == "forbidden" and entry["status"] == 403
    # a later offline trace says which conclusions that affects
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(out),
                            "-o", "json"])
    doc = json.loads(r.stdout)
    assert any("k8s/networkpolicies.yaml was not collected (forbidden" in w
               and "cannot name the NetworkPolicy" in w for w in doc["warnings"]), doc["warnings"]


def test_policy_explanation_says_the_policies_were_not_collected():
    from traceflow.bundle.kube import Cluster, Pod, policy_drop_reason
    pod = Pod(name="b", namespace="default", ip="10.0.0.2", node="n1", labels={},
              host_network=False, phase="Running")
    c = Cluster(pods=[pod])
    assert "no NetworkPolicy in the bundle selects it" in policy_drop_reason(
        c, "ingress", pod, "10.0.0.1", "TCP", 80, not_read="x", agent="the agent")
    c.policies_not_collected = "forbidden reading networkpolicies"
    why = policy_drop_reason(c, "ingress", pod, "10.0.0.1", "TCP", 80, not_read="x", agent="the agent")
    assert "NetworkPolicies were not collected (forbidden reading networkpolicies)" in why
    assert "no NetworkPolicy in the bundle selects it" not in why


def test_missing_crds_are_recorded(fake, tmp_path):
    out = tmp_path / "b.tgz"
    p, _took, _peak = _child(fake, out)
    assert p.returncode == 0, p.stderr
    m = Bundle.open(out).manifest
    assert "k8s/ciliumnetworkpolicies.yaml" in m["not_installed"]
    assert "k8s/clusternetworkpolicies.yaml" in m["not_installed"]


def test_forbidden_crd_is_recorded_as_optional(fake, tmp_path):
    fake.forbidden = [r"^/apis/cilium.io/"]
    fake.custom[("cilium.io", "v2", "ciliumnetworkpolicies")] = []
    out = tmp_path / "b.tgz"
    p, _took, _peak = _child(fake, out)
    assert p.returncode == 0, p.stderr        # a trace goes on without it, saying so
    entry = next(e for e in _errors(out) if e.get("file") == "k8s/ciliumnetworkpolicies.yaml")
    assert entry["missing"] == "forbidden" and entry["optional"] is True


def test_endless_continue_ends_at_the_deadline_with_a_partial_bundle(fake, tmp_path):
    fake.endless_continue = {"pods"}
    out = tmp_path / "b.tgz"
    p, took, peak = _child(fake, out, deadline=4)
    _check_bounds("endless continue", p, took, peak, 4)
    assert p.returncode == 3
    assert "still sending continue tokens" in p.stderr
    errs = _errors(out)
    assert next(e for e in errs if e.get("kind") == "pods")["missing"] == "deadline"
    assert any(e.get("kind") == "query" for e in errs)


# ---- exec faults ---------------------------------------------------------------------------

def test_exec_that_never_ends_keeps_the_other_node(fake, tmp_path):
    fake.hang_nodes = {"worker2"}
    out = tmp_path / "b.tgz"
    p, took, peak = _child(fake, out, deadline=20, timeout=2)
    _check_bounds("exec never ends", p, took, peak, 20)
    assert p.returncode == 3 and "worker2" in p.stderr
    b = Bundle.open(out)
    assert b.has("nodes/worker1/ovs-flows.txt")
    assert any(e.get("node") == "worker2" and "time limit" in e["reason"]
               for e in b.manifest["collection_errors"])


def test_exec_forbidden_is_recorded(fake, tmp_path):
    fake.forbidden = [r"^/api/v1/namespaces/kube-system/pods/antrea-agent-fv5x9/exec$"]
    out = tmp_path / "b.tgz"
    p, took, peak = _child(fake, out)
    _check_bounds("exec 403", p, took, peak, 20)
    assert p.returncode == 3 and "forbidden to exec" in p.stderr
    b = Bundle.open(out)
    assert b.has("nodes/worker1/ovs-flows.txt") and not b.has("nodes/worker2/ovs-flows.txt")
    assert any(e.get("node") == "worker2" and "forbidden" in e["reason"]
               for e in b.manifest["collection_errors"])


def test_exec_that_floods_is_streamed_to_disk_and_capped(fake, tmp_path):
    fake.flood_nodes = {"worker2"}
    out = tmp_path / "b"
    # a small per-file cap; the flood is read until the per-exec read cap (64 MB here)
    cmd_env = {"TRACEFLOW_COLLECT_MAX_FILE_MB": "2", "TRACEFLOW_COLLECT_MAX_OUTPUT_MB": "64"}
    os.environ.update(cmd_env)
    try:
        p, took, peak = _child(fake, out, deadline=25, timeout=15)
    finally:
        for k in cmd_env:
            os.environ.pop(k, None)
    _check_bounds("exec floods", p, took, peak, 25)
    assert p.returncode == 3, p.stderr
    b = Bundle.open(out)
    trunc = b.manifest["truncated"]
    first = next(k for k in trunc if k.startswith("nodes/worker2/"))
    assert trunc[first]["kept_bytes"] <= 2 << 20
    assert (out / first).stat().st_size == trunc[first]["kept_bytes"]
    assert b.has("nodes/worker1/ovs-flows.txt")                 # the other node is whole
    flooded = next(e for e in fake.execs if e.get("flood"))
    assert flooded["flood"] > 32 << 20                           # it really flooded


def test_ten_thousand_pods(fake, tmp_path):
    fake.page_size = 500
    fake.add_pods(10_000)
    out = tmp_path / "b.tgz"
    p, took, peak = _child(fake, out, deadline=60, timeout=30)
    _check_bounds("10,000 pods", p, took, peak, 60)
    assert p.returncode == 0, p.stderr
    b = Bundle.open(out)
    text = b.text("k8s/pods.yaml")
    assert text.count("filler-") == 10_000
    assert "annotations" not in text and "env:" not in text


# ---- no secret in a Cilium bundle ------------------------------------------------------------

SECRETS = [f"s3cr3t-{i:02d}-{'q' * 8}" for i in range(12)]


def test_no_secret_in_cilium_config_or_crds(tmp_path):
    api = cilium_cluster()
    cm = api.objects["configmaps"][0]
    cm["data"]["clustermesh-etcd-password"] = SECRETS[0]
    cm["data"]["some-operator-token"] = SECRETS[1]
    cm["binaryData"] = {"cert": SECRETS[2]}
    cm["metadata"]["annotations"]["vault"] = SECRETS[3]
    api.custom[("cilium.io", "v2", "ciliumnetworkpolicies")] = [{
        "apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
        "metadata": {"name": "l7", "namespace": "default",
                     "annotations": {"token": SECRETS[4]},
                     "managedFields": [{"f": SECRETS[5]}]},
        "spec": {"endpointSelector": {"matchLabels": {"app": "web"}},
                 "ingress": [{"fromEndpoints": [{"matchLabels": {"app": "client"}}],
                              "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}],
                                           "rules": {"http": [{"headers": [
                                               f"Authorization: Bearer {SECRETS[6]}"],
                                               "headerMatches": [{"name": "X-Key",
                                                                  "value": SECRETS[7]}]}]},
                                           "terminatingTLS": {"secret": {"name": SECRETS[8]}}}]}],
                 "unknownField": SECRETS[9]}}]
    api.custom[("cilium.io", "v2", "ciliumclusterwidenetworkpolicies")] = [{
        "metadata": {"name": "cw", "labels": {"a": "b"}},
        "specs": [{"nodeSelector": {"matchLabels": {"x": "y"}},
                   "egress": [{"toFQDNs": [{"matchName": "example.com"}],
                               "authentication": {"mode": SECRETS[10]}}]}]}]
    agent = next(p for p in api.objects["pods"] if p["metadata"]["name"].startswith("cilium-"))
    agent["spec"]["containers"][0]["env"] = [{"name": "ETCD_PASSWORD", "value": SECRETS[11]}]
    agent["spec"]["containers"][0]["args"] = [f"--token={SECRETS[11]}"]
    api.start()
    try:
        kc = api.write_kubeconfig(tmp_path / "kc")
        out = tmp_path / "c.tgz"
        r = runner.invoke(app, ["collect", "-o", str(out), "--all-nodes", "--kubeconfig",
                                str(kc)])
        assert r.exit_code in (0, 3), r.output
    finally:
        api.stop()
    import tarfile
    with tarfile.open(out) as tar:
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    assert [s for s in SECRETS if s.encode() in blob] == []
    b = Bundle.open(out)
    m = b.manifest
    # the keys a trace reads are kept; the dropped ones are named (names only)
    cfg = yaml.safe_load(b.text("k8s/cilium-config.yaml"))
    assert cfg["data"]["routing-mode"] == "tunnel"
    assert "clustermesh-etcd-password" not in cfg["data"]
    assert "data.clustermesh-etcd-password" in m["dropped_keys"]["k8s/cilium-config.yaml"]
    assert "binaryData.cert" in m["dropped_keys"]["k8s/cilium-config.yaml"]
    cnp = yaml.safe_load(b.text("k8s/ciliumnetworkpolicies.yaml"))["items"][0]
    assert cnp["spec"]["endpointSelector"] == {"matchLabels": {"app": "web"}}
    assert cnp["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["port"] == "80"
    dropped = m["dropped_keys"]["k8s/ciliumnetworkpolicies.yaml"]
    assert "spec.ingress[].toPorts[].rules" in dropped and "spec.unknownField" in dropped
    # the Cilium policy a trace names is still found
    ccnp = yaml.safe_load(b.text("k8s/ciliumclusterwidenetworkpolicies.yaml"))["items"][0]
    assert ccnp["specs"][0]["egress"][0]["toFQDNs"] == [{"matchName": "example.com"}]


def test_every_cilium_config_key_a_trace_reads_is_allowed():
    """The allow-list must follow the reader: every key settings.py reads is kept."""
    import re
    from collectors.allowlist import CILIUM_CONFIG_KEYS
    src = (ROOT / "traceflow" / "engines" / "cilium" / "settings.py").read_text()
    body = src[src.index("def merge_settings"):]
    read = set(re.findall(r'(?:c\.get|_bool\(c,)\s*\(?\s*"([a-z0-9-]+)"', body))
    read |= set(re.findall(r'for key in \(([^)]*)\)', body) and
                re.findall(r'"([a-z0-9]+(?:-[a-z0-9]+)+)"',
                           " ".join(re.findall(r'for key in \(([^)]*)\)', body))))
    assert read and read <= CILIUM_CONFIG_KEYS, sorted(read - CILIUM_CONFIG_KEYS)


def test_allow_list_is_per_cni_and_extensible():
    from collectors import allowlist as AL
    allow = AL.register(AL.CniAllowList("kernel-test", configmaps={
        ("kube-system", "kernel-cni-config"): frozenset({"mode"})}))
    try:
        kept, dropped = AL.config_map({"metadata": {"name": "kernel-cni-config"},
                                       "data": {"mode": "vxlan", "password": "x"}},
                                      allow.configmaps[("kube-system", "kernel-cni-config")])
        assert kept["data"] == {"mode": "vxlan"} and dropped == ["data.password"]
        assert AL.for_cni("kernel-test") is allow
    finally:
        AL.REGISTRY.pop("kernel-test")


def test_lists_are_written_in_pieces_as_the_same_bytes(tmp_path):
    from collectors.kube import list_document
    from collectors.live import _write_list, _yaml
    for n in (0, 1, 201, 450):
        items = [{"metadata": {"name": f"p{i}", "labels": {"a": "b: c"}},
                  "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}}
                 for i in range(n)]
        got = _write_list(tmp_path / f"{n}.yaml", items, chunk=200).read_bytes()
        assert got == _yaml(list_document(items)), n


def test_stream_splitter_is_bounded_and_exact(tmp_path):
    """300 MB through the splitter in 64 KiB pieces: the buffer never holds more than a marker,
    the per-file cap keeps exactly its bytes, and the items after a capped one are whole."""
    from collectors.spool import ItemSink, NodeBudget
    tok = "ab" * 12
    sink = ItemSink(tok, tmp_path, file_cap=1 << 20, budget=NodeBudget(8 << 20))
    block = b"x" * 65536
    sink.feed(f"### traceflow {tok} begin big.txt\n".encode())
    biggest = 0
    for _ in range((300 << 20) // len(block)):
        sink.feed(block)
        biggest = max(biggest, len(sink.buf))
    sink.feed(f"\n### traceflow {tok} end big.txt rc=0\n".encode())
    sink.feed(f"### traceflow {tok} begin small.txt\nline1\nline2".encode())
    sink.feed(f"\n### traceflow {tok} end small.txt rc=3\n".encode())
    items = sink.finish()
    assert biggest < 200
    assert items["big.txt"].rc == 0 and items["big.txt"].size == 1 << 20
    assert items["big.txt"].truncated == "the per-file cap" and items["big.txt"].seen == 300 << 20
    assert (tmp_path / "big.txt").stat().st_size == 1 << 20
    assert (tmp_path / "small.txt").read_bytes() == b"line1\nline2"
    assert items["small.txt"].rc == 3 and not items["small.txt"].truncated


# ---- a trace that reads a truncated file says so -------------------------------------------------

def _mark_truncated(bundle: Path, file: str) -> None:
    m = bundle / "manifest.yaml"
    doc = yaml.safe_load(m.read_text())
    doc["truncated"] = {file: {"kept_bytes": 1234, "reason": "cut at the per-file cap"}}
    m.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_trace_reading_a_truncated_file_says_so(tmp_path):
    import shutil
    from traceflow.cli.app import example_path
    b = tmp_path / "b"
    shutil.copytree(example_path(), b)
    _mark_truncated(b, "nodes/worker1/ovs-flows.txt")
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(b),
                            "-o", "json"])
    doc = json.loads(r.stdout)
    assert any(w.startswith("nodes/worker1/ovs-flows.txt is truncated (cut at the per-file cap; "
                            "1234 bytes kept)") for w in doc["warnings"]), doc["warnings"]
    # a file the trace does not read is not mentioned
    (b / "nodes/worker1/tc.txt").write_text("")
    _mark_truncated(b, "nodes/worker1/tc.txt")
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(b),
                            "-o", "json"])
    assert not any("truncated" in w for w in json.loads(r.stdout)["warnings"])


def test_a_drop_decided_in_a_truncated_file_is_unknown(tmp_path):
    import shutil
    from traceflow.cli.app import example_path
    b = tmp_path / "b"
    shutil.copytree(example_path().parent / "cilium-vxlan-policy", b)
    args = ["pod-to-svc", "shop/batch", "shop/web", "--bundle", str(b), "-o", "json"]
    before = json.loads(runner.invoke(app, args).stdout)
    assert "dropped" in {p["verdict"] for p in before["paths"]}
    for node in ("worker1", "worker2"):
        _mark_truncated(b, f"nodes/{node}/cilium-bpf-policy-get.txt")
        after = json.loads(runner.invoke(app, args).stdout)
        if "dropped" not in {p["verdict"] for p in after["paths"]}:
            break
    assert "dropped" not in {p["verdict"] for p in after["paths"]}
    assert "unknown" in {p["verdict"] for p in after["paths"]}
    assert any("may be in the part that was cut" in w for w in after["warnings"])
