"""Every malformed input named in issue 25 ends in exit 2 with the file and line (or key path)
or the option name, never a traceback (exit 4) and never a silently accepted value; plus a
sweep over every manifest key and every k8s field a trace reads, with hostile values."""

from __future__ import annotations

import copy
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path
from traceflow.model.errors import InputError

runner = CliRunner()
EXAMPLES = example_path().parent
ANTREA = EXAMPLES / "antrea-encap-kube-proxy"
CILIUM = EXAMPLES / "cilium-vxlan-policy"
TRACE = ["pod-to-svc", "frontend", "backendsvc"]
CTRACE = ["pod-to-svc", "shop/frontend", "shop/web"]

# `FILE, line N: ...`, `FILE: key.path: ...`, or an option / argument name first
_LOCATED = [re.compile(r"^\S+, line \d+: "),
            re.compile(r"^\S+: [A-Za-z_][\w-]*(\[\d+\])?(\.[\w-]+(\[\d+\])?)+: "),
            re.compile(r"^(--[\w-]+|DST|SOURCE|DESTINATION|SERVICE|NODE): ")]


def located(stderr: str) -> bool:
    msg = next((ln.removeprefix("traceflow: error: ") for ln in stderr.splitlines()
                if ln.startswith("traceflow: error: ")), "")
    return any(rx.match(msg) for rx in _LOCATED)


def copy_of(src: Path, tmp: Path) -> Path:
    dst = tmp / "b"
    shutil.copytree(src, dst)
    return dst


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def assert_located(r, *words):
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    assert located(r.stderr), r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def _edit_yaml(path: Path, fn) -> None:
    doc = yaml.safe_load(path.read_text())
    fn(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _pod(doc, name):
    return next(i for i in doc["items"] if i["metadata"]["name"] == name)


# ---- issue 25, item 5: errors that named no file, line or option --------------------------------

def test_huge_number_in_sysctl(tmp_path):
    b = copy_of(ANTREA, tmp_path)
    (b / "nodes/worker1/sysctl.txt").write_text(f"net.ipv4.conf.all.rp_filter = {'9' * 5000}\n")
    assert_located(run(*TRACE, "--bundle", b), "nodes/worker1/sysctl.txt, line 1",
                   "out of range")


@pytest.mark.parametrize("args, option", [
    (["nf-trace", "worker1", "--src", "10.222.1.48", "--dst", "../../etc/passwd", "--dport", "80"],
     "--dst"),
    (["nf-trace", "worker1", "--src", "1.2.3", "--dst", "10.0.0.1", "--dport", "80"], "--src"),
    (["route-get", "worker1", "../../etc/passwd"], "DST"),
    (["route-get", "worker1", "10.0.0.1", "--from", "x"], "--from"),
])
def test_ip_options_name_the_option(args, option):
    r = run(*args, "--bundle", ANTREA)
    assert_located(r, f"{option}: ")


@pytest.mark.parametrize("key, value, line", [("cni", "antreaX", 5),
                                              ("format", "traceflow-bundle/v9", 2)])
def test_manifest_cni_and_format_name_the_line(tmp_path, key, value, line):
    b = copy_of(ANTREA, tmp_path)
    m = b / "manifest.yaml"
    m.write_text(re.sub(rf"(?m)^{key}: .*$", f"{key}: {value}", m.read_text()))
    assert_located(run(*TRACE, "--bundle", b), f"manifest.yaml, line {line}", value)


@pytest.mark.parametrize("field, value, words", [
    (("status", "phase"), "10.0.0.0/33", ["status.phase", "not Running"]),
    (("status", "podIP"), None, ["status.podIP", "has no IP"]),
    (("spec", "nodeName"), None, ["spec.nodeName", "not scheduled"]),
    (("metadata", "name"), "fr0ntend", ["did you mean: fr0ntend (k8s/pods.yaml, line",
                                        "metadata.name"]),
    (("metadata", "name"), "Front End!", ["Front End!"]),
    (("metadata", "name"), "x" * 300, ["no valid Kubernetes name"]),
    (("metadata", "namespace"), "defau1t", ["it exists in namespace defau1t"]),
])
def test_damaged_pod_names_its_line_and_field(tmp_path, field, value, words):
    b = copy_of(ANTREA, tmp_path)

    def fn(doc):
        obj = _pod(doc, "frontend")
        if value is None:
            obj[field[0]].pop(field[1], None)
        else:
            obj[field[0]][field[1]] = value
    _edit_yaml(b / "k8s/pods.yaml", fn)
    r = run(*TRACE, "--bundle", b)
    assert_located(r, *words)
    assert "k8s/pods.yaml, line" in r.stderr


def test_damaged_pod_in_jsonl_names_its_line(tmp_path):
    b = copy_of(ANTREA, tmp_path)
    items = yaml.safe_load((b / "k8s/pods.yaml").read_text())["items"]
    _pod({"items": items}, "frontend")["status"]["phase"] = "Pending"
    (b / "k8s/pods.yaml").unlink()
    (b / "k8s/pods.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    r = run(*TRACE, "--bundle", b)
    assert_located(r, "k8s/pods.jsonl, line 1", "not Running")


@pytest.mark.parametrize("content", ["", "\n\n", "apiVersion: v1\nkind: List\nitems: []\n"])
def test_empty_pods_yaml_says_it_is_empty(tmp_path, content):
    b = copy_of(ANTREA, tmp_path)
    (b / "k8s/pods.yaml").write_text(content)
    r = run(*TRACE, "--bundle", b)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "empty" in r.stderr and "k8s/pods.yaml" in r.stderr, r.stderr
    if not content.strip():
        assert_located(r, "k8s/pods.yaml, line 1")


def test_service_without_ports_and_damaged_service_name(tmp_path):
    b = copy_of(ANTREA, tmp_path)

    def no_ports(doc):
        next(i for i in doc["items"] if i["metadata"]["name"] == "backendsvc")["spec"]["ports"] = []
    _edit_yaml(b / "k8s/services.yaml", no_ports)
    assert_located(run(*TRACE, "--bundle", b), "spec.ports", "has no ports")
    shutil.copy(ANTREA / "k8s/services.yaml", b / "k8s/services.yaml")

    def rename(doc):
        next(i for i in doc["items"]
             if i["metadata"]["name"] == "backendsvc")["metadata"]["name"] = "backendsv"
    _edit_yaml(b / "k8s/services.yaml", rename)
    assert_located(run(*TRACE, "--bundle", b), "did you mean: backendsv (k8s/services.yaml, line")


# ---- issue 25, item 6: crashes and accepted garbage ---------------------------------------------

def test_a_deeply_nested_index_value_is_discarded_and_rebuilt(tmp_path):
    env = {"TRACEFLOW_CACHE_DIR": str(tmp_path / "cache"), "TRACEFLOW_NO_INDEX": ""}
    b = copy_of(ANTREA, tmp_path)
    first = run(*TRACE, "--bundle", b, "-o", "json", env=env)
    assert first.exit_code == 0, first.output
    dbs = sorted((tmp_path / "cache").rglob("*.sqlite"))
    assert dbs
    deep = "[" * 100_000 + "]" * 100_000
    for db in dbs:
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'value'", (deep,))
    for _ in range(2):          # the bad index does not persist across commands
        r = run(*TRACE, "--bundle", b, "-o", "json", env=env)
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["paths"] == json.loads(first.stdout)["paths"]
    for db in dbs:
        if db.exists():
            with sqlite3.connect(db) as conn:
                values = [v for (v,) in conn.execute("SELECT value FROM meta WHERE key='value'")]
            assert deep not in values


def test_a_cilium_backend_pod_object_that_is_empty(tmp_path):
    b = copy_of(CILIUM, tmp_path)
    text = (b / "k8s/pods.yaml").read_text()
    i = text.index("- apiVersion: v1\n  kind: Pod\n  metadata: {name: web-0")
    j = text.index("- apiVersion: v1", i + 5)
    (b / "k8s/pods.yaml").write_text(text[:i] + "- {}\n" + text[j:])
    r = run(*CTRACE, "--bundle", b, "-o", "json")
    assert r.exit_code == 1, r.output                      # not 4, not "delivered"
    doc = json.loads(r.stdout)
    assert any("is not traced: no pod of k8s/pods.yaml has that address" in w
               for w in doc["warnings"])
    assert "unknown" in {p["verdict"] for p in doc["paths"]}


def test_audit_with_a_node_folder_the_manifest_does_not_list(tmp_path):
    b = copy_of(CILIUM, tmp_path)
    (b / "nodes/worker9").mkdir()
    shutil.copy(b / "nodes/worker1/ip-route.txt", b / "nodes/worker9/ip-route.txt")
    r = run("audit", "--bundle", b)
    assert r.exit_code in (0, 1), r.output
    assert "internal error" not in r.output


@pytest.mark.parametrize("text, words", [
    ("suite: x\nexpectations: " + "[" * 2000 + "]" * 2000 + "\n", ["line 2", "nested"]),
    ("suite: x\nexpectations:\n" + "  " * 0 + "".join("- " for _ in range(2000)) + "x\n",
     ["line 3", "nested"]),
])
def test_a_suite_nested_2000_deep(tmp_path, text, words):
    suite = tmp_path / "s.yaml"
    suite.write_text(text)
    assert_located(run("check", suite, "--bundle", ANTREA), *words)


def test_a_suite_with_bad_utf8_names_the_line(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_bytes(b"suite: x\nexpectations:\n  - name: a\xff\n")
    assert_located(run("check", suite, "--bundle", ANTREA), "line 3", "not UTF-8")
    suite.write_bytes(b'suite: x\nexpectations:\n  - name: "a\x01"\n')
    assert_located(run("check", suite, "--bundle", ANTREA), "line 3", "not allowed")


@pytest.mark.parametrize("line", [
    "10.79.1.1 dev ens160 lladdr 5c:5e:ab:d0:1f:c1 REACHABLE 10.79.1.1 dev ens160 lladdr "
    "5c:5e:ab:d0:1f:c1 FAILED",
    "10.79.1.1 dev ens160 lladdr 5c:5e:ab:d0:1f:c1 REACHABLE dev eth0",
])
def test_glued_ip_neigh_records_are_a_located_error(line):
    from traceflow.engines.neigh import parse_ip_neigh
    with pytest.raises(InputError) as e:
        parse_ip_neigh(f"10.0.0.9 dev eth0 lladdr 00:11:22:33:44:55 STALE\n{line}\n", "n.txt")
    assert e.value.file == "n.txt" and e.value.line == 2 and "glued" in e.value.reason


def test_glued_ip_neigh_in_a_trace(tmp_path):
    b = copy_of(ANTREA, tmp_path)
    p = b / "nodes/worker1/ip-neigh.txt"
    lines = p.read_text().splitlines()
    lines[0] = lines[0] + " " + lines[0]
    p.write_text("\n".join(lines) + "\n")
    assert_located(run(*TRACE, "--bundle", b), "nodes/worker1/ip-neigh.txt, line 1")


def test_ipcache_tunnel_endpoint_300_1_1_1(tmp_path):
    b = copy_of(CILIUM, tmp_path)
    p = b / "nodes/worker1/cilium-bpf-ipcache-list.txt"
    p.write_text(p.read_text().replace("tunnelendpoint=192.168.1.12", "tunnelendpoint=300.1.1.1"))
    assert_located(run(*CTRACE, "--bundle", b), "cilium-bpf-ipcache-list.txt, line 2",
                   "300.1.1.1")


@pytest.mark.parametrize("how", ["empty", "missing"])
def test_missing_or_empty_ip_rule_is_said(tmp_path, how):
    b = copy_of(ANTREA, tmp_path)
    if how == "empty":
        (b / "nodes/worker1/ip-rule.txt").write_text("")
    else:
        (b / "nodes/worker1/ip-rule.txt").unlink()
    r = run(*TRACE, "--bundle", b, "-o", "json")
    assert r.exit_code == 0, r.output
    w = json.loads(r.stdout)["warnings"]
    assert any(f"nodes/worker1/ip-rule.txt is {how}: the kernel's default rules" in x for x in w)


def test_a_zero_byte_capture_is_noted(tmp_path):
    b = copy_of(ANTREA, tmp_path)
    (b / "nodes/worker1/ip-neigh.txt").write_text("")
    r = run(*TRACE, "--bundle", b, "-o", "json")
    w = json.loads(r.stdout)["warnings"]
    assert any("nodes/worker1/ip-neigh.txt is empty (0 bytes)" in x for x in w), w


def test_pods_yaml_and_a_disagreeing_jsonl_state_the_rule(tmp_path):
    b = copy_of(ANTREA, tmp_path)
    items = yaml.safe_load((b / "k8s/pods.yaml").read_text())["items"][:1]
    (b / "k8s/pods.jsonl").write_text(json.dumps(items[0]) + "\n")
    r = run(*TRACE, "--bundle", b, "-o", "json")
    assert r.exit_code == 0
    assert any("k8s/pods.yaml and k8s/pods.jsonl are both in the bundle: k8s/pods.yaml is read"
               in x for x in json.loads(r.stdout)["warnings"])


@pytest.mark.parametrize("text, line", [
    ('apiVersion: v1\nkind: ConfigMap\ndata:\n  routing-mode: "tun\x01nel"\n', 4),
    ("apiVersion: v1\nkind: ConfigMap\ndata:\n  routing-mode: [tunnel\n", 5),
    ("apiVersion: v1\nkind: ConfigMap\ndata: " + "[" * 2000 + "\n", 3),
])
def test_cilium_config_errors_name_the_line(tmp_path, text, line):
    b = copy_of(CILIUM, tmp_path)
    (b / "k8s/cilium-config.yaml").write_text(text)
    r = run(*CTRACE, "--bundle", b)
    assert_located(r, f"k8s/cilium-config.yaml, line {line}")
    assert "position" not in r.stderr


# ---- the sweep: every manifest key and every k8s field a trace reads -----------------------------

HOSTILE = [7, ["x"], {"a": {"b": 1}}, "10.0.0.0/33", "", "../../etc/passwd", -1, True]


def _outcome_ok(r) -> None:
    assert r.exit_code != 4 and "Traceback" not in r.output, r.output
    if r.exit_code == 2:
        assert located(r.stderr), r.stderr


MANIFEST_KEYS = ["format", "cluster", "collected_at", "cni", "cni_version", "kube_proxy",
                 "service_cidr", "nodes", "files", "lacks", "collection_errors",
                 "collection_notes", "query", "truncated", "not_installed", "dropped_keys",
                 "provenance", "description"]


@pytest.mark.parametrize("key", MANIFEST_KEYS)
def test_sweep_manifest_keys(tmp_path, key):
    b = copy_of(ANTREA, tmp_path)
    m = yaml.safe_load((b / "manifest.yaml").read_text())
    for value in HOSTILE:
        doc = dict(m, **{key: value})
        (b / "manifest.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        r = run(*TRACE, "--bundle", b, "-o", "json")
        _outcome_ok(r)


# (file, object name, key path): what a trace reads of each kind
K8S_FIELDS = [
    ("pods", "frontend", ("metadata", "name")), ("pods", "frontend", ("metadata", "namespace")),
    ("pods", "frontend", ("metadata", "labels")), ("pods", "frontend", ("spec", "nodeName")),
    ("pods", "frontend", ("spec", "hostNetwork")), ("pods", "frontend", ("spec", "containers")),
    ("pods", "frontend", ("status", "phase")), ("pods", "frontend", ("status", "podIP")),
    ("pods", "backend1", ("status", "podIP")), ("pods", "backend1", ("metadata", "name")),
    ("services", "backendsvc", ("metadata", "name")),
    ("services", "backendsvc", ("spec", "clusterIP")),
    ("services", "backendsvc", ("spec", "ports")), ("services", "backendsvc", ("spec", "type")),
    ("services", "backendsvc", ("spec", "selector")),
    ("services", "backendsvc", ("spec", "sessionAffinity")),
    ("nodes", "worker1", ("metadata", "name")), ("nodes", "worker1", ("status", "addresses")),
    ("nodes", "worker1", ("spec", "podCIDR")),
    ("endpointslices", None, ("endpoints",)), ("endpointslices", None, ("metadata", "labels")),
    ("networkpolicies", None, ("spec", "podSelector")),
    ("networkpolicies", None, ("spec", "ingress")),
]


@pytest.mark.parametrize("kind, name, path", K8S_FIELDS,
                         ids=[f"{k}:{n}:{'.'.join(p)}" for k, n, p in K8S_FIELDS])
def test_sweep_k8s_fields(tmp_path, kind, name, path):
    b = copy_of(ANTREA, tmp_path)
    f = b / "k8s" / f"{kind}.yaml"
    if not f.exists():
        pytest.skip(f"the example has no {kind}")
    base = yaml.safe_load(f.read_text())
    for value in HOSTILE:
        doc = copy.deepcopy(base)
        objs = [i for i in doc["items"] if name is None or i["metadata"].get("name") == name]
        if not objs:
            pytest.skip(f"no {name} in {kind}")
        node = objs[0]
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = value
        f.write_text(yaml.safe_dump(doc, sort_keys=False))
        _outcome_ok(run(*TRACE, "--bundle", b, "-o", "json"))
