"""Live traces on what was collected (issue 25, item 7): a trace straight after live collection
and a trace of the saved bundle give the same answer; IP and `svc/` sources resolve by the
bundle's rules; `traceflow rbac --app-exec` grants what `--app-exec` collection does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_kube_api import FakeKubeAPI  # noqa: E402

from traceflow.cli.app import app, example_path  # noqa: E402

runner = CliRunner()
EXAMPLE = example_path()


@pytest.fixture()
def fake(tmp_path):
    api = FakeKubeAPI()
    api.start()
    api.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield api
    finally:
        api.stop()


def _live(fake, *args):
    return runner.invoke(app, [*args, "--kubeconfig", str(fake.kubeconfig)])


def _offline(bundle, *args):
    return runner.invoke(app, [*args, "--bundle", str(bundle)])


def _answer(doc: dict) -> dict:
    return {k: doc[k] for k in ("query", "verdict", "paths", "warnings")}


@pytest.mark.parametrize("args", [
    ("pod-to-svc", "frontend", "backendsvc", "--app-exec"),
    ("pod-to-svc", "10.222.1.48", "backendsvc"),               # the source by its pod IP
    ("pod-to-pod", "frontend", "10.222.2.34", "--port", "80"),  # the destination by IP
])
def test_live_trace_equals_the_saved_bundle_trace(fake, tmp_path, args):
    saved = tmp_path / "saved.tgz"
    live = _live(fake, *args, "-o", "json", "--save-bundle", str(saved))
    assert live.exit_code in (0, 1), live.output
    offline = _offline(saved, *[a for a in args if a != "--app-exec"], "-o", "json")
    assert offline.exit_code == live.exit_code, offline.output
    assert _answer(json.loads(live.stdout)) == _answer(json.loads(offline.stdout))
    # and the same as the example bundle the fake cluster serves
    ref = _offline(EXAMPLE, *[a for a in args if a != "--app-exec"], "-o", "json")
    assert json.loads(ref.stdout)["verdict"] == json.loads(live.stdout)["verdict"]


def test_ip_source_resolves_like_a_bundle(fake):
    live = _live(fake, "pod-to-svc", "10.222.1.48", "backendsvc", "-o", "json")
    ref = _offline(EXAMPLE, "pod-to-svc", "10.222.1.48", "backendsvc", "-o", "json")
    assert live.exit_code == ref.exit_code == 0, live.output
    assert json.loads(live.stdout)["query"] == json.loads(ref.stdout)["query"]


@pytest.mark.parametrize("source", ["svc/backendsvc", "10.104.65.133"])
def test_service_as_source_is_refused_with_the_bundle_message(fake, source):
    live = _live(fake, "pod-to-svc", source, "backendsvc")
    ref = _offline(EXAMPLE, "pod-to-svc", source, "backendsvc")
    assert live.exit_code == ref.exit_code == 2, live.output
    assert "Service" in ref.stderr and "not a pod" in ref.stderr
    assert live.stderr.strip().splitlines()[-1] == ref.stderr.strip().splitlines()[-1]
    assert fake.execs == []                     # refused before any node is touched


# ---- rbac --app-exec -------------------------------------------------------------------------

def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _exec_allowed(docs: list[dict], namespace: str, pod: str) -> bool:
    for d in docs:
        if d["kind"] != "Role" or d["metadata"].get("namespace") != namespace:
            continue
        for rule in d["rules"]:
            if "pods/exec" in rule["resources"] and "create" in rule["verbs"] \
                    and pod in rule.get("resourceNames", []):
                return True
    return False


def test_rbac_app_exec_grants_exactly_the_pods_app_exec_uses(fake):
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "-o", "json", "--app-exec")
    assert r.exit_code == 0, r.output
    used = {(e["namespace"], e["pod"]) for e in fake.execs if e["namespace"] != "kube-system"}
    assert used == {("default", "frontend"), ("default", "backend1"), ("default", "backend2")}
    pods = ",".join(f"{ns}/{p}" for ns, p in sorted(used))
    g = _live(fake, "rbac", "--app-exec", pods)
    assert g.exit_code == 0, g.output
    docs = _docs(g.stdout)
    assert all(_exec_allowed(docs, ns, p) for ns, p in used)
    assert not _exec_allowed(docs, "default", "coredns-f9fd979d6-4qzxk")
    assert not _exec_allowed(docs, "kube-system", "frontend")
    # without the option: no exec on any application pod
    plain = _docs(_live(fake, "rbac").stdout)
    assert not any(_exec_allowed(plain, ns, p) for ns, p in used)


def test_rbac_app_exec_from_a_bundle_and_bad_values(fake, tmp_path):
    saved = tmp_path / "s.tgz"
    r = _live(fake, "pod-to-svc", "frontend", "backendsvc", "--app-exec",
              "--save-bundle", str(saved))
    assert r.exit_code == 0, r.output
    g = runner.invoke(app, ["rbac", "--bundle", str(saved), "--app-exec", "bundle"])
    assert g.exit_code == 0, g.output
    assert _exec_allowed(_docs(g.stdout), "default", "frontend")
    bad = runner.invoke(app, ["rbac", "--bundle", str(saved), "--app-exec", "../etc"])
    assert bad.exit_code == 2 and "--app-exec" in bad.stderr
