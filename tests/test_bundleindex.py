"""The bundle index (traceflow.bundle.index): the second command on a bundle reads its
Kubernetes objects from the index and gets the same cluster; a changed, corrupt or foreign
index is never trusted; two processes at once are safe; the cache stays within its budget;
bad input is still a located error; k8s/<kind>.jsonl bundles read like YAML ones."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from traceflow.bundle.reader import Bundle
from traceflow.bundle import index as bundleindex
from traceflow.model.errors import InputError
from traceflow.bundle.kube import load_cluster

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "traceflow" / "examples" / "antrea-encap-kube-proxy"
KUBE_PROXY = ROOT / "traceflow" / "examples" / "kube-proxy-iptables"


def _cache() -> Path:
    return Path(os.environ["TRACEFLOW_CACHE_DIR"])


def _indexes() -> list[Path]:
    """Every file in the cache (Kubernetes layouts and objects, node files' layouts)."""
    return sorted(_cache().glob("bundle-*.sqlite")) if _cache().exists() else []


def _plain(cluster):
    return (cluster.pods, cluster.services, cluster.nodes, cluster.policies, cluster.endpoints)


@pytest.fixture(autouse=True)
def _stored_at_once(monkeypatch):
    """These tests read the index as soon as a file is read; a command stores what it
    located after it answers (tests/test_scale_index.py)."""
    monkeypatch.setattr(bundleindex, "STORE_AT_ONCE", True)


@pytest.fixture
def bundle(tmp_path):
    dest = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, dest)
    return dest


def _blobs(kind: str) -> list[Path]:
    return sorted(_cache().glob(f"bundle-{kind}-*.sqlite")) if _cache().exists() else []


def test_second_open_reads_the_layout_and_gets_the_same_cluster(bundle, monkeypatch):
    want = _plain(load_cluster(Bundle.open(bundle).text))
    first = bundleindex.load_cluster(Bundle.open(bundle))
    assert len(_blobs("k8s-layout")) == 1
    assert _plain(first) == want
    # the second open locates nothing: the layout says where each object is
    from traceflow.bundle import kubecatalog
    monkeypatch.setattr(kubecatalog, "scan_yaml", lambda *a: pytest.fail("located again"))
    second = bundleindex.load_cluster(Bundle.open(bundle))
    assert second.find_pod("default", "backend2").ip == "10.222.2.34"
    assert _plain(second) == want
    assert len(second.pods) == 10 and second.endpoints["default/backendsvc"]


def test_a_file_read_whole_is_kept_as_json_for_the_next_command(bundle, monkeypatch):
    want = _plain(load_cluster(Bundle.open(bundle).text))
    assert _plain(bundleindex.load_cluster(Bundle.open(bundle))) == want   # reads all
    assert len(_blobs("k8s-items")) >= 3        # pods, services, endpointslices
    # the next command's whole read comes from the stored objects, not from the YAML
    from traceflow.bundle import kubecatalog
    monkeypatch.setattr(kubecatalog, "_read_whole", lambda cat: pytest.fail("parsed again"))
    c = bundleindex.load_cluster(Bundle.open(bundle))
    assert _plain(c) == want


def test_layout_lines_point_at_the_items(bundle):
    from traceflow.bundle.kubecatalog import Objects
    objects = Objects(Bundle.open(bundle).text)
    cat = objects.catalog("k8s/pods.yaml")
    text = (bundle / "k8s/pods.yaml").read_text().splitlines()
    i, = cat.find("name", "backend2")
    line = cat.line(i)
    assert text[line - 1] == "- apiVersion: v1"
    assert "name: backend2" in "\n".join(text[line - 1:line + 20])


def test_a_tarball_is_indexed_like_its_folder(bundle, tmp_path):
    import tarfile
    tgz = tmp_path / "bundle.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(bundle, arcname="bundle")
    assert Bundle.open(tgz).content_hash("k8s/") == Bundle.open(bundle).content_hash("k8s/")
    want = _plain(bundleindex.load_cluster(Bundle.open(bundle)))
    assert _plain(bundleindex.load_cluster(Bundle.open(tgz))) == want
    assert len(_blobs("k8s-layout")) == 1


def test_a_change_of_content_is_a_new_index(bundle):
    bundleindex.load_cluster(Bundle.open(bundle))
    pods = bundle / "k8s/pods.yaml"
    text = pods.read_text()
    stat = pods.stat()
    changed = text.replace("10.222.1.48", "10.222.1.49")        # same size
    assert len(changed) == len(text)
    pods.write_text(changed)
    os.utime(pods, ns=(stat.st_atime_ns, stat.st_mtime_ns))    # same mtime too
    cluster = bundleindex.load_cluster(Bundle.open(bundle))
    assert cluster.pod("frontend", "default").ip == "10.222.1.49"
    assert cluster.pod_by_ip("10.222.1.49").name == "frontend"
    assert len(_blobs("k8s-layout")) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign", "offsets"])
def test_a_corrupt_or_foreign_index_is_ignored_and_rebuilt(bundle, tmp_path, damage):
    want = _plain(load_cluster(Bundle.open(bundle).text))
    b = Bundle.open(bundle)
    digest = b.content_hash("k8s/")
    path = bundleindex._blob_path("k8s-layout", digest)
    if damage == "foreign":
        other = tmp_path / "other"
        shutil.copytree(KUBE_PROXY, other)
        bundleindex.load_cluster(Bundle.open(other))
        os.replace(_blobs("k8s-layout")[0], path)   # another bundle's layout under this name
    elif damage == "offsets":
        bundleindex.load_cluster(b)
        layout = bundleindex.load_blob("k8s-layout", digest)
        flat = layout["k8s/pods.yaml"]["items"]
        flat[0] += 3                                # no longer where an item starts
        bundleindex.store_blob("k8s-layout", digest, layout)
    else:
        bundleindex.load_cluster(b)
        data = path.read_bytes()
        path.write_bytes(b"not sqlite at all" * 100 if damage == "garbage" else data[:4096])
    c = bundleindex.load_cluster(Bundle.open(bundle))
    assert c.find_pod("default", "frontend") == next(p for p in want[0] if p.name == "frontend")
    assert _plain(c) == want
    assert bundleindex.load_blob("k8s-layout", digest) is not None     # rebuilt, and valid


def test_no_index_when_turned_off(bundle, monkeypatch):
    monkeypatch.setenv("TRACEFLOW_NO_INDEX", "1")
    assert bundleindex.load_cluster(Bundle.open(bundle)).pod("frontend", "default")
    assert _indexes() == []


def test_an_unwritable_cache_only_costs_the_index(bundle, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(blocker / "cache"))   # under a file
    assert bundleindex.load_cluster(Bundle.open(bundle)).pod("frontend", "default")


def test_the_cache_keeps_to_its_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEFLOW_CACHE_MB", "0.015")    # 15 KB: room for one small index
    for i in range(3):
        dest = tmp_path / f"b{i}"
        shutil.copytree(EXAMPLE, dest)
        with open(dest / "k8s/nodes.yaml", "a") as f:
            f.write(f"# copy {i}\n")
        bundleindex.load_cluster(Bundle.open(dest))
    assert len(_indexes()) == 1


def test_two_processes_at_once(bundle):
    cmd = [sys.executable, "-m", "traceflow", "pod-to-svc", "frontend", "backendsvc",
           "-o", "json", "--bundle", str(bundle)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs[0][1]
    verdicts = {json.loads(o)["verdict"] for o, _ in outs}
    assert verdicts == {"delivered"}
    # (a trace searches the Kubernetes files, it does not locate them: what the three write
    # at once is the two nodes' flow layouts)
    assert len(_blobs("ovs-flows")) == 2
    assert not list(_cache().glob(".tmp-*"))             # no half-written index left


def test_a_bad_object_is_a_located_error_when_a_command_reads_it(bundle):
    """Objects are checked when read: a bad port in the Service the trace asks for is exit 2
    with its file and line; the same bad port in a Service no command reads is not in the
    way of a trace (it is reported by whatever reads it, e.g. `audit`)."""
    svc = bundle / "k8s/services.yaml"
    svc.write_text(svc.read_text().replace("    - port: 80\n", "    - port: eighty\n", 1))
    cluster = bundleindex.load_cluster(Bundle.open(bundle))
    with pytest.raises(InputError) as err:
        cluster.service("backendsvc", "default")
    assert err.value.file == "k8s/services.yaml" and err.value.line
    assert (bundle / "k8s/services.yaml").read_text().splitlines()[err.value.line - 1] \
        == "    - port: eighty"
    with pytest.raises(InputError):
        cluster.services                            # reading all of them meets it too
    r = subprocess.run([sys.executable, "-m", "traceflow", "pod-to-svc", "frontend",
                        "backendsvc", "--bundle", str(bundle)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2
    assert f"k8s/services.yaml, line {err.value.line}" in r.stderr


def test_invalid_yaml_in_an_object_read_is_located_in_the_whole_file(bundle):
    pods = bundle / "k8s/pods.yaml"
    lines = pods.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line == "    name: frontend")
    lines[n] = "    name: [frontend"                 # an unclosed flow sequence
    pods.write_text("\n".join(lines) + "\n")
    cluster = bundleindex.load_cluster(Bundle.open(bundle))
    with pytest.raises(InputError) as err:
        cluster.pod("frontend", "default")
    assert err.value.file == "k8s/pods.yaml"
    assert abs(err.value.line - (n + 1)) <= 2, (err.value.line, n + 1)


def _to_jsonl(bundle: Path, kind: str) -> None:
    src = bundle / f"k8s/{kind}.yaml"
    items = yaml.safe_load(src.read_text())["items"]
    (bundle / f"k8s/{kind}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    src.unlink()


def test_k8s_objects_as_json_lines_read_like_yaml(bundle, monkeypatch):
    monkeypatch.setenv("TRACEFLOW_NO_INDEX", "1")
    want = _plain(load_cluster(Bundle.open(bundle).text))
    for kind in ("pods", "services", "endpointslices"):
        _to_jsonl(bundle, kind)
    assert _plain(load_cluster(Bundle.open(bundle).text)) == want


@pytest.mark.parametrize("bad,reason", [
    ('{"kind": "Pod", "metadata": ', "invalid JSON"),
    ('["not", "an", "object"]', "expected a JSON object"),
    ('{"kind": "Pod", "metadata": {"name": "x", "labels": "oops"}}', "labels"),
])
def test_bad_json_lines_are_located_errors(bundle, bad, reason):
    _to_jsonl(bundle, "pods")
    path = bundle / "k8s/pods.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(3, bad)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=reason) as err:
        bundleindex.load_cluster(Bundle.open(bundle))
    assert (err.value.file, err.value.line) == ("k8s/pods.jsonl", 4)


def test_a_bad_rule_in_a_chain_the_trace_enters_is_a_located_error(tmp_path):
    dest = tmp_path / "kp"
    shutil.copytree(KUBE_PROXY, dest)
    save = dest / "nodes/node1/iptables-save.txt"
    lines = save.read_text().splitlines()
    nat = lines.index("*nat")
    n = next(i for i, line in enumerate(lines) if i > nat and line.startswith("-A KUBE-SERVICES "))
    lines.insert(n, "-A KUBE-SERVICES -p tcp -m tcp --dport zz -j ACCEPT")
    save.write_text("\n".join(lines) + "\n")
    r = subprocess.run([sys.executable, "-m", "traceflow", "nf-trace", "node1", "--src",
                        "10.244.1.5", "--dst", "10.109.44.20", "--dport", "80", "--bundle",
                        str(dest)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stdout
    assert f"nodes/node1/iptables-save.txt, line {n + 1}" in r.stderr


def test_stored_objects_that_are_not_objects_are_not_trusted(bundle):
    want = _plain(load_cluster(Bundle.open(bundle).text))
    b = Bundle.open(bundle)
    digest = b.content_hash("k8s/")
    _plain(bundleindex.load_cluster(b))              # reads all: stores the objects
    key = bundleindex._items_key(digest, "k8s/pods.yaml")
    bundleindex.store_blob("k8s-items", key, [[1, 2]])
    assert _plain(bundleindex.load_cluster(Bundle.open(bundle))) == want
    bundleindex.store_blob("k8s-items", key, [{"metadata": {"name": 5}}])   # one, not ten
    assert _plain(bundleindex.load_cluster(Bundle.open(bundle))) == want
