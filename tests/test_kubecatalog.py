"""Located Kubernetes objects (traceflow.bundle.kubecatalog): a lookup parses only the objects it
returns, and always finds what reading the whole file finds.

The oracle is the whole-file reader (traceflow.bundle.kube.load_cluster: libyaml + the same checks):
on every example bundle and on the same objects written in every style PyYAML can write
(flow style, indentation 4, folded long values, quoted keys, keys out of order, comments,
anchors), every pod, Service and endpoint lookup gives the same answer both ways. Bad input is
a located error when the object is read.
"""

import random
from pathlib import Path

import pytest
import yaml

from traceflow.bundle.reader import Bundle
from traceflow.model.errors import InputError
from traceflow.bundle.kube import load_cluster, located_cluster
from traceflow.bundle.kubecatalog import UNKEYED, Objects, scan_yaml, yaml_catalog

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p for p in (ROOT / "traceflow" / "examples").iterdir()
                  if (p / "manifest.yaml").exists())


def _both(read):
    return load_cluster(read), located_cluster(Objects(read))


def _same_lookups(whole, located) -> None:
    """Every lookup a trace makes, on the located cluster (nothing read whole yet), against
    the whole cluster's lists."""
    assert located._pods is None and located._services is None
    keys = [(p.namespace, p.name) for p in whole.pods] + [("default", "nope"), ("x", "y")]
    for ns, name in keys:
        want = next((p for p in whole.pods if (p.namespace, p.name) == (ns, name)), None)
        assert located.find_pod(ns, name) == want, (ns, name)
    for ip in {p.ip for p in whole.pods} | {"10.255.255.254"}:
        assert located.pods_at(ip) == [p for p in whole.pods if p.ip == ip], ip
        assert located.pod_by_ip(ip) == whole.pod_by_ip(ip)
    for s in whole.services + [None]:
        ns, name = (s.namespace, s.name) if s else ("default", "nope")
        assert located.find_service(ns, name) == next(
            (x for x in whole.services if (x.namespace, x.name) == (ns, name)), None)
        if s is not None:
            assert located.service_at(s.cluster_ip) == next(
                x for x in whole.services if x.cluster_ip == s.cluster_ip)
            assert located.endpoints_of(s.key) == whole.endpoints.get(s.key, []), s.key
    prefixes = {o[1].rsplit("-", 1)[0] + "-" for p in whole.pods for o in p.owners}
    for prefix in prefixes | {"web", "nope-", ""}:
        for ns in {p.namespace for p in whole.pods} | {None}:
            assert located.pods_owned(prefix, ns) == [
                p for p in whole.pods if (ns is None or p.namespace == ns)
                and any(o.startswith(prefix) for _, o in p.owners)], (prefix, ns)
    from traceflow.bundle.kube import deployment_pods as _deployment_pods
    for d in {"web0", "web1", "web3", "nope"}:
        for ns in {p.namespace for p in whole.pods}:
            assert _deployment_pods(located, d, ns) == _deployment_pods(whole, d, ns)
    assert located._pods is None and located._services is None, "a lookup read all"
    # and read whole, the same cluster
    assert (located.pods, located.services, located.nodes, located.policies,
            located.endpoints) == (whole.pods, whole.services, whole.nodes, whole.policies,
                                   whole.endpoints)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_looks_up_as_it_reads_whole(example):
    whole, located = _both(Bundle.open(example).text)
    assert whole.pods
    _same_lookups(whole, located)


def test_the_examples_are_located_not_read_whole():
    objects = Objects(Bundle.open(ROOT / "traceflow/examples/kube-proxy-iptables").text)
    cat = objects.catalog("k8s/pods.yaml")
    assert cat._whole is None and len(cat) > 600
    assert not any(UNKEYED in (col[i] for col in cat.columns.values())
                   for i in range(len(cat)))
    c = located_cluster(objects)
    pod = c.pods_at(cat.columns["ip"][100])[0]
    assert len(cat._parsed) == 1                 # one object parsed for the lookup
    assert c.find_pod(pod.namespace, pod.name) == pod


# ---- the same objects in other YAML styles --------------------------------------------------

def _objects(rng: random.Random, n: int = 30):
    pods, svcs, slices = [], [], []
    for i in range(n):
        ns = rng.choice(["default", "shop", "kube-system"])
        name = f"pod-{i}-" + "x" * rng.randint(0, 40)
        ip = f"10.1.{i // 200}.{i % 200 + 2}"
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns,
                            "labels": {"app": f"a{i % 3}", "tier": "web"},
                            "annotations": {"note": "a long note " * rng.randint(1, 8)}},
               "spec": {"nodeName": "node1", "containers": [
                   {"name": "c", "ports": [{"containerPort": 80, "name": "http"}]}]},
               "status": {"podIP": ip, "phase": "Running"}}
        owners = rng.choice([0, 1, 1, 1, 2])
        if owners:
            pod["metadata"]["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": rng.choice(["ReplicaSet", "DaemonSet"]),
                 "name": f"web{i % 4}-{rng.choice(['6f8d', '77bc'])}", "controller": True,
                 "uid": f"u{i}-{k}"} for k in range(owners)]
        if rng.random() < 0.2:
            pod["spec"]["hostNetwork"] = True
            pod["status"]["podIP"] = "192.168.0.10"
        pods.append(pod)
        if i % 3 == 0:
            svc = f"svc-{i}"
            svcs.append({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": svc, "namespace": ns},
                         "spec": {"clusterIP": f"10.96.0.{i + 1}", "selector": {"app": "a0"},
                                  "ports": [{"port": 80, "protocol": "TCP"}]}})
            slices.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                           "metadata": {"name": f"{svc}-abc", "namespace": ns,
                                        "labels": {"kubernetes.io/service-name": svc}},
                           "endpoints": [{"addresses": [ip],
                                          "targetRef": {"name": name, "namespace": ns}}]})
    return pods, svcs, slices


STYLES = {
    "kubectl": dict(default_flow_style=False),
    "indent4": dict(default_flow_style=False, indent=4),
    "flow-leaves": dict(default_flow_style=None),
    "all-flow": dict(default_flow_style=True),
    "narrow": dict(default_flow_style=False, width=12),        # long values folded
    "unsorted": dict(default_flow_style=False, sort_keys=False),
    "explicit": dict(default_flow_style=False, explicit_start=True, explicit_end=True),
}


def _dump(items: list, style: dict) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "items": items, "kind": "List"}, **style)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("seed", range(3))
def test_any_style_pyyaml_writes_gives_the_same_lookups(style, seed):
    pods, svcs, slices = _objects(random.Random(seed))
    files = {"k8s/pods.yaml": _dump(pods, STYLES[style]),
             "k8s/services.yaml": _dump(svcs, STYLES[style]),
             "k8s/endpointslices.yaml": _dump(slices, STYLES[style])}
    whole, located = _both(files.get)
    _same_lookups(whole, located)


TRICKS = {
    # a quoted key: the key is not read, the item is parsed for every lookup
    "quoted key": ('    name: pod-1\n', '    "name": pod-1\n'),
    # the name written twice: YAML keeps the last
    "twice": ('    name: pod-1\n', '    name: decoy\n    name: pod-1\n'),
    # a value continued on the next line (a plain multi-line scalar)
    "continued": ('    name: pod-1\n', '    name: pod-\n      1\n'),
    # metadata in flow style
    "flow metadata": ('  metadata:\n    labels:\n      app: a1\n    name: pod-1\n'
                      '    namespace: shop\n',
                      '  metadata: {labels: {app: a1}, name: pod-1, namespace: shop}\n'),
    # a comment line among the keys, and one at column 0
    "comments": ('    name: pod-1\n', '    # the name:\n#   name: decoy\n    name: pod-1\n'),
    # a quoted IP
    "quoted ip": ('    podIP: 10.1.0.3\n', "    podIP: '10.1.0.3'\n"),
    # the owner's name first in its entry, or quoted
    "owner name first": ("    - apiVersion: apps/v1\n      controller: true\n"
                         "      kind: ReplicaSet\n      name: web1-",
                         "    - name: web1-"),
    "owner quoted": ("      name: web1-", '      "name": web1-'),
    # a label in flow style on the EndpointSlice
    "flow labels": ("      kubernetes.io/service-name: svc-0\n",
                    "      {kubernetes.io/service-name: svc-0}\n"),
}


def _kubectl_files():
    pods, svcs, slices = _objects(random.Random(7), 6)
    for i, p in enumerate(pods):
        p["spec"].pop("hostNetwork", None)
        p["status"]["podIP"] = f"10.1.0.{i + 2}"
        p["metadata"]["name"] = f"pod-{i}"
    pods[1]["metadata"]["namespace"] = "shop"
    pods[1]["metadata"]["labels"] = {"app": "a1"}
    pods[1]["metadata"].pop("annotations")
    pods[1]["metadata"].pop("ownerReferences", None)
    pods[2]["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "controller": True,
                                               "kind": "ReplicaSet", "name": "web1-6f8d"}]
    return {"k8s/pods.yaml": _dump(pods, STYLES["kubectl"]),
            "k8s/services.yaml": _dump(svcs, STYLES["kubectl"]),
            "k8s/endpointslices.yaml": _dump(slices, STYLES["kubectl"])}


@pytest.mark.parametrize("trick", TRICKS)
def test_keys_written_unusually_are_still_found(trick):
    files = _kubectl_files()
    old, new = TRICKS[trick]
    name = next(f for f, t in files.items() if old in t)
    if trick == "flow labels":
        files[name] = files[name].replace("      labels:\n" + old, "      labels: " +
                                          new.strip() + "\n", 1)
        files[name] = files[name].replace("    labels:\n" + old, "    labels: " +
                                          new.strip() + "\n", 1)
    else:
        files[name] = files[name].replace(old, new, 1)
    assert files[name] != _kubectl_files()[name], "the trick was not applied"
    whole, located = _both(files.get)
    _same_lookups(whole, located)


def test_an_anchor_in_one_item_and_its_alias_in_another():
    text = _kubectl_files()["k8s/pods.yaml"]
    text = text.replace("      app: a0\n", "      app: &shared a0\n", 1)
    i = text.index("      app: a0\n")
    text = text[:i] + "      app: *shared\n" + text[i + len("      app: a0\n"):]
    files = {**_kubectl_files(), "k8s/pods.yaml": text}
    whole, located = _both(files.get)
    _same_lookups(whole, located)


def test_a_file_that_is_no_plain_list_is_read_whole():
    text = _kubectl_files()["k8s/pods.yaml"]
    for odd in (text.replace("  kind: Pod\n", '  kind: Pod\n  note: "a\tb"\n', 1),
                text.replace("\n", "\r\n"), "---\n" + text + "...\n",
                "apiVersion: v1\nitems: []\nkind: List\n"):
        cat = yaml_catalog(odd, "k8s/pods.yaml")
        assert cat._whole is not None
        assert cat.all() == yaml.safe_load(odd)["items"]


def test_scan_finds_each_item_and_its_line():
    text = _kubectl_files()["k8s/pods.yaml"]
    items, keys, rest = scan_yaml(text, "k8s/pods.yaml")
    lines = text.split("\n")
    assert len(items) == 6
    for (start, end, line), k in zip(items, keys):
        assert text[start:start + 2] == "- " and lines[line - 1].startswith("- ")
        assert f"name: {k['name']}" in text[start:end]
    assert yaml.safe_load(rest)["items"] == []


# ---- bad input --------------------------------------------------------------------------------

def test_a_bad_object_is_located_when_read_and_not_before():
    files = _kubectl_files()
    text = files["k8s/pods.yaml"]
    bad = text.replace("containerPort: 80\n", "containerPort: 80: 81\n", 1)
    whole_err = None
    try:
        load_cluster({**files, "k8s/pods.yaml": bad}.get)
    except InputError as exc:
        whole_err = exc
    assert whole_err is not None
    located = located_cluster(Objects({**files, "k8s/pods.yaml": bad}.get))
    # the first pod is broken; the others are found without reading it
    second = yaml.safe_load(text)["items"][1]["metadata"]
    assert located.find_pod(second["namespace"], second["name"]) is not None
    first = yaml.safe_load(text)["items"][0]["metadata"]
    with pytest.raises(InputError) as err:
        located.find_pod(first["namespace"], first["name"])
    assert (err.value.file, err.value.line) == (whole_err.file, whole_err.line)


def test_a_wrong_shape_names_the_item_path_and_line():
    files = _kubectl_files()
    text = files["k8s/pods.yaml"].replace("    podIP: 10.1.0.3\n", "    podIP: 10.1.0.300\n")
    located = located_cluster(Objects({**files, "k8s/pods.yaml": text}.get))
    with pytest.raises(InputError) as err:
        located.pods_at("10.1.0.300")
    assert "items[1].status.podIP" in str(err.value)
    assert text.split("\n")[err.value.line - 1] == "    podIP: 10.1.0.300"


def test_deep_nesting_inside_an_object_is_an_error_not_a_crash():
    files = _kubectl_files()
    deep = "    labels:\n      app: a1\n      deep: " + "[" * 5000 + "]" * 5000 + "\n"
    text = files["k8s/pods.yaml"].replace("    labels:\n      app: a1\n", deep, 1)
    located = located_cluster(Objects({**files, "k8s/pods.yaml": text}.get))
    with pytest.raises(InputError, match="nested too deeply"):
        located.find_pod("shop", yaml.safe_load(files["k8s/pods.yaml"])["items"][1]
                         ["metadata"]["name"])


def test_a_big_file_written_another_way_is_read_once_not_item_by_item(monkeypatch):
    """A List indented by 4 gives no keys: the first lookup reads the file whole (one parse)
    instead of parsing every item on its own, and finds the same pods."""
    from traceflow.bundle import kubecatalog
    pods, _, _ = _objects(random.Random(3), 400)
    text = _dump(pods, dict(default_flow_style=False, indent=4, width=4096))
    assert "\n-   apiVersion" in text
    calls = []
    real = kubecatalog._parse_yaml_item
    monkeypatch.setattr(kubecatalog, "_parse_yaml_item", lambda *a: calls.append(1) or real(*a))
    whole, located = _both({"k8s/pods.yaml": text}.get)
    p = whole.pods[123]
    assert located.find_pod(p.namespace, p.name) == p
    assert located.pods_at(p.ip) == [x for x in whole.pods if x.ip == p.ip]
    assert calls == []


def test_a_trace_parses_the_objects_it_touches_not_the_bundle(monkeypatch, tmp_path):
    """pod-to-svc on the 697-pod, 301-Service example parses the source pod, the Service,
    its EndpointSlices and the pods behind them: a few dozen objects, not a thousand. (The
    bundle holds host files only: the trace resolves everything, then stops at the pod's
    OVS bridge, whose flows are not in it.)"""

    from typer.testing import CliRunner

    from traceflow.bundle import kubecatalog
    from traceflow.cli.app import app
    parsed = []
    real = kubecatalog._parse_yaml_item
    monkeypatch.setattr(kubecatalog, "_parse_yaml_item",
                        lambda cat, i: parsed.append((cat.name, i)) or real(cat, i))
    monkeypatch.setattr(kubecatalog, "_read_whole", lambda cat: pytest.fail("read whole"))
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path))
    example = ROOT / "traceflow/examples/kube-proxy-iptables"
    r = CliRunner().invoke(app, ["pod-to-svc", "analytics/api-primary-cxgbqsz9m2-8pm2g",
                                 "api-primary", "-n", "analytics", "-o", "json",
                                 "--bundle", str(example)])
    assert r.exit_code == 1, r.output
    assert "10.109.44.20" in r.stdout and "ovs-flows.txt" in r.stdout
    by_file = {f: sum(1 for g, _ in parsed if g == f) for f, _ in parsed}
    same_name = sum(s["metadata"]["name"] == "api-primary" for s in yaml.safe_load(
        (example / "k8s/services.yaml").read_text())["items"])
    # the source pod; every Service named api-primary (one per namespace), nothing else
    assert by_file == {"k8s/pods.yaml": 1, "k8s/services.yaml": same_name}, by_file
    total = sum(len(Objects(Bundle.open(example).text).catalog(f) or ())
                for f in ("k8s/pods.yaml", "k8s/services.yaml", "k8s/endpointslices.yaml"))
    assert total > 1000
