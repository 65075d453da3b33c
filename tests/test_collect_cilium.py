"""Live collection of a Cilium cluster, against the protocol-level fake API server
(tests/fake_kube_api.py): Cilium agent pods whose exec runs the collector's real script with
stub binaries printing real captured outputs (tests/data/realworld/) where they exist.

No real Cilium agent or BPF can run here: what is tested is the protocol (REST, the exec
websocket), the commands and their arguments, the file names and bytes, and the manifest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_kube_api import CILIUM_DEVICES, REALWORLD, cilium_cluster  # noqa: E402

from collectors import agents as A  # noqa: E402
from traceflow.bundle.reader import Bundle  # noqa: E402
from traceflow.cli.app import app  # noqa: E402

runner = CliRunner()

# The files of a Cilium node, as cilium-notes / bundle-v1 name them (written out here, not
# taken from the collector's tables).
CILIUM_TEXT = ["cilium-status", "cilium-bpf-lb-list", "cilium-service-list",
               "cilium-bpf-lb-maglev-list", "cilium-bpf-ipcache-list", "cilium-endpoint-list",
               "cilium-bpf-endpoint-list", "cilium-bpf-policy-get", "cilium-identity-list",
               "cilium-bpf-ct-list-global", "cilium-bpf-nat-list", "cilium-bpf-tunnel-list",
               "cilium-bpf-ipmasq-list", "cilium-bpf-egress-list"]
CILIUM_DB = ["cilium-db-frontends", "cilium-db-backends", "cilium-db-services"]
HOST = ["iptables-save.txt", "ip-rule.txt", "ip-route.txt", "ip-neigh.txt", "ip-addr.txt",
        "ip-link.txt", "tc.txt", "bpftool-net.txt"]
REAL = {   # bundle file -> the real capture the agent printed
    "cilium-bpf-lb-list.txt": "cilium/imroc-tke-cilium_bpf-lb-list_empty-backends.txt",
    "cilium-service-list.txt": "cilium/kwx4957-week4_cilium-dbg-service-list.txt",
    "cilium-bpf-ipcache-list.txt": "cilium/kwx4957-week4_cilium-dbg-bpf-ipcache-list.txt",
    "cilium-endpoint-list.txt": "cilium/kwx4957-week4_cilium-dbg-endpoint-list.txt",
    "cilium-bpf-ipmasq-list.txt": "cilium/kwx4957-week3_cilium-dbg-bpf-ipmasq-list.txt",
    "cilium-db-frontends.txt": "cilium/imroc-tke-cilium_shell-db-show-frontends.txt",
    "ip-rule.txt": "iproute/kwx4957-week8_cilium_ip-rule-show.txt",
    "ip-route.txt": "iproute/kwx4957-week8_cilium-native-routing_ip-route.txt",
    "iptables-save.txt": "iptables-save/g00ntar-cilium-sysdump-k3s_iptables-save-c.txt",
}


def _start(tmp_path, **kw):
    api = cilium_cluster(**kw)
    api.start()
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    return api


@pytest.fixture()
def fake(tmp_path):
    api = _start(tmp_path)
    try:
        yield api
    finally:
        api.stop()


def _collect(api, out: Path, *extra):
    return runner.invoke(app, ["collect", "frontend", "backendsvc", "-o", str(out),
                               "--kubeconfig", str(api.kubeconfig), *extra])


def test_cilium_bundle_has_every_file_with_the_right_names(fake, tmp_path):
    out = tmp_path / "cilium.tar.gz"
    r = _collect(fake, out)
    assert r.exit_code == 0, r.stderr
    b = Bundle.open(out)
    m = b.manifest
    assert m["cni"] == "cilium" and m["cni_version"] == "v1.18.1"
    assert m["nodes"]["worker1"]["agent_pod"] == "kube-system/cilium-x7k2q"
    assert "collection_errors" not in m
    expected = sorted([f"{n}.txt" for n in CILIUM_TEXT + CILIUM_DB]
                      + [f"{n}.json" for n in CILIUM_TEXT + CILIUM_DB] + HOST)
    for node in ("worker1", "worker2"):
        got = sorted(n.split("/", 2)[2] for n in b.names() if n.startswith(f"nodes/{node}/"))
        assert got == expected, node
        for f, real in REAL.items():      # byte for byte what the agent printed
            assert b.raw(f"nodes/{node}/{f}") == (REALWORLD / real).read_bytes(), f
    assert b.raw("nodes/worker1/cilium-status.txt").startswith(b"KVStore:")
    assert m["files"]["nodes/worker1/cilium-bpf-lb-list.txt"] == \
        "cilium-dbg bpf lb list  (exec kube-system/cilium-x7k2q -c cilium-agent)"
    assert m["files"]["nodes/worker2/cilium-bpf-lb-list.json"].startswith(
        "cilium-dbg bpf lb list -o json  (exec kube-system/cilium-p9m4z")
    assert m["files"]["nodes/worker1/cilium-db-frontends.json"].startswith(
        "cilium-dbg shell -- db/show --format=json frontends")
    # one batched exec per agent, in cilium-agent, with constant arguments only
    execs = [e for e in fake.execs if e["namespace"] == "kube-system"]
    assert sorted((e["pod"], e["container"]) for e in execs) == [
        ("cilium-p9m4z", "cilium-agent"), ("cilium-x7k2q", "cilium-agent")]
    assert all(e["namespace"] == "kube-system" for e in fake.execs)
    for e in execs:
        assert e["command"][:3] == ["sh", "-c", A.SCRIPT]
        assert e["command"][5] == "cli:cilium-dbg"
        assert all(i in A.ITEMS for i in e["command"][6:])


def test_tc_sections_and_bpftool_for_tcx(fake, tmp_path):
    out = tmp_path / "b"
    assert _collect(fake, out).exit_code == 0
    tc = (out / "nodes" / "worker1" / "tc.txt").read_bytes()
    headers = [line for line in tc.split(b"\n") if line.startswith(b"### ")]
    assert headers == [f"### tc filter show dev {d} {h}".encode()
                       for d in CILIUM_DEVICES for h in ("ingress", "egress")]
    assert tc.count(b"filter protocol") == 0          # tcx: tc shows nothing ...
    net = (out / "nodes" / "worker1" / "bpftool-net.txt").read_bytes()
    assert b"lxc4b1e2f6a7c8d(9) tcx/ingress cil_from_container" in net   # ... bpftool does


def test_cilium_config_is_the_one_configmap_read_and_only_its_data(fake, tmp_path):
    out = tmp_path / "b"
    assert _collect(fake, out).exit_code == 0
    cm = yaml.safe_load((out / "k8s" / "cilium-config.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"] == {"name": "cilium-config",
                                                            "namespace": "kube-system"}
    assert cm["data"]["routing-mode"] == "tunnel" and cm["data"]["enable-tcx"] == "true"
    cm_requests = [p for _m, p in fake.requests if "configmaps" in p]
    assert cm_requests == ["/api/v1/namespaces/kube-system/configmaps/cilium-config"]
    blob = b"".join(f.read_bytes() for f in out.rglob("*") if f.is_file())
    assert b"not-for-traceflow" not in blob and b"helm" not in blob


def test_cilium_config_forbidden_is_a_warning(fake, tmp_path):
    fake.forbidden = [r"/configmaps/"]
    out = tmp_path / "b"
    r = _collect(fake, out)
    assert r.exit_code == 0, r.stderr
    assert "k8s/cilium-config.yaml not collected" in r.stderr and "traceflow rbac" in r.stderr
    assert not (out / "k8s" / "cilium-config.yaml").exists()


def test_cilium_before_1_15_uses_the_cilium_cli_and_tc(tmp_path):
    api = _start(tmp_path, version="v1.14.5", cli="cilium", tcx=False)
    # a listing this version cannot print as JSON: the stub refuses the arguments
    del api.custom_images["worker1"]["cilium"]["bpf policy get --all -n -o json"]
    try:
        out = tmp_path / "old"
        r = _collect(api, out)
        assert r.exit_code == 0, r.stderr
        b = Bundle.open(out)
        assert b.manifest["cni_version"] == "v1.14.5"
        names = {n.split("/", 2)[2] for n in b.names() if n.startswith("nodes/worker2/")}
        assert names == ({f"{n}.txt" for n in CILIUM_TEXT} | {f"{n}.json" for n in CILIUM_TEXT}
                         | set(HOST))                       # no statedb tables before 1.17
        # the missing JSON form is recorded, not an error, and not shouted on stderr
        assert not b.has("nodes/worker1/cilium-bpf-policy-get.json")
        assert b.has("nodes/worker1/cilium-bpf-policy-get.txt")
        assert any(n.startswith("nodes/worker1/cilium-bpf-policy-get.json not collected: exit "
                                "code 2: cilium: fake image: unsupported arguments")
                   for n in b.manifest["collection_notes"])
        assert "cilium-bpf-policy-get.json" not in r.stderr
        assert b.manifest["files"]["nodes/worker2/cilium-service-list.txt"].startswith(
            "cilium service list  (exec kube-system/cilium-p9m4z -c cilium-agent)")
        assert {e["command"][5] for e in api.execs} == {"cli:cilium"}
        tc = b.raw("nodes/worker1/tc.txt")
        assert (b"### tc filter show dev lxc4b1e2f6a7c8d ingress\nfilter protocol all pref 1 "
                b"bpf chain 0 \n") in tc
        assert b"cil_from_container-lxc4b1e2f6a7c8d direct-action" in tc
    finally:
        api.stop()


def test_version_from_cilium_status_when_the_image_has_no_tag(tmp_path):
    api = _start(tmp_path, tagged=False)
    try:
        out = tmp_path / "b"
        r = _collect(api, out)
        assert r.exit_code == 0, r.stderr
        m = Bundle.open(out).manifest
        assert m["cni"] == "cilium" and m["cni_version"] == "v1.18.1"    # from `status`
        assert {e["command"][5] for e in api.execs} == {"cli:auto"}
        assert m["files"]["nodes/worker1/cilium-bpf-lb-list.txt"].startswith(
            "cilium-dbg (or cilium) bpf lb list  (exec")
        assert not (out / "nodes" / "worker1" / "cilium-db-frontends.txt").exists()
    finally:
        api.stop()


def test_rbac_for_cilium_names_the_agents_and_cilium_config(fake, tmp_path):
    r = runner.invoke(app, ["rbac", "--kubeconfig", str(fake.kubeconfig)])
    assert r.exit_code == 0, r.stderr
    role = next(d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"],
         "resourceNames": ["cilium-p9m4z", "cilium-x7k2q"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
         "resourceNames": ["cilium-config"]}]
    # and every request of a collection is allowed by it, RBAC semantics (resourceNames)
    import re
    from test_collect_kube import _allowed
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    fake.requests.clear()
    assert _collect(fake, tmp_path / "b").exit_code == 0
    for _m, path in fake.requests:
        m = re.match(r"^/(?:api/v1|apis/([^/]+)/[^/]+)(?:/namespaces/([^/]+))?/([^/]+)"
                     r"(?:/([^/]+))?(?:/([^/]+))?$", path.split("?", 1)[0])
        group, ns, resource, name, sub = m.groups()
        verb = "create" if sub == "exec" else ("get" if name else "list")
        assert _allowed(docs, group or "", f"{resource}/{sub}" if sub else resource, verb, ns,
                        name), path


@pytest.mark.parametrize("image, cli, has_db", [
    ("quay.io/cilium/cilium:v1.8.2", "cilium", False),
    ("quay.io/cilium/cilium:v1.14.5@sha256:" + "0" * 64, "cilium", False),
    ("quay.io/cilium/cilium:v1.15.0", "cilium-dbg", False),
    ("quay.io/cilium/cilium:v1.17.3", "cilium-dbg", True),
    ("quay.io/cilium/cilium@sha256:" + "0" * 64, "auto", False),
    ("quay.io/cilium/cilium:latest", "auto", False),
])
def test_the_cli_and_files_follow_the_agent_version(image, cli, has_db):
    agent = A.Agent("cilium", "kube-system", "cilium-abcde", "n1", ("cilium-agent",), image)
    [(container, items)] = agent.plan()
    assert container == "cilium-agent" and items[0] == f"cli:{cli}"
    assert ("cilium-db-frontends.json" in items) == has_db
    assert ("cilium-bpf-lb-maglev-list.txt" in items) == (image.split(":")[-1] != "v1.8.2")
    assert {"cilium-bpf-lb-list.txt", "cilium-bpf-lb-list.json", "tc.txt",
            "bpftool-net.txt", "ip-route.txt"} <= set(items)
    A.script_argv("ab" * 12, items)        # every item is one the script knows


def test_unknown_cli_selector_is_refused():
    with pytest.raises(ValueError):
        A.script_argv("ab" * 12, ["cli:bash", "cilium-bpf-lb-list.txt"])
