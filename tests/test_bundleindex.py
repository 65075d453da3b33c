"""The bundle index (traceflow.bundleindex): the second command on a bundle reads its
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

from collectors.bundle import Bundle
from traceflow import bundleindex
from traceflow.errors import InputError
from traceflow.kube import load_cluster

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "traceflow" / "examples" / "antrea-encap-kube-proxy"
KUBE_PROXY = ROOT / "traceflow" / "examples" / "kube-proxy-iptables"


def _cache() -> Path:
    return Path(os.environ["TRACEFLOW_CACHE_DIR"])


def _indexes() -> list[Path]:
    """The Kubernetes indexes (not the per-file layouts, ``bundle-<kind>-<digest>.sqlite``)."""
    return sorted(p for p in _cache().glob("bundle-*.sqlite")
                  if len(p.name) == len("bundle-.sqlite") + 64) if _cache().exists() else []


def _plain(cluster):
    return (cluster.pods, cluster.services, cluster.nodes, cluster.policies, cluster.endpoints)


@pytest.fixture
def bundle(tmp_path):
    dest = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, dest)
    return dest


def test_second_open_reads_the_index_and_gets_the_same_cluster(bundle):
    want = _plain(load_cluster(Bundle.open(bundle).text))
    first = bundleindex.load_cluster(Bundle.open(bundle))
    assert len(_indexes()) == 1
    # the index is what the second open reads: with the YAML gone from the reader, the
    # cluster still comes back whole
    b = Bundle.open(bundle)
    b.text = lambda name, real=b.text: None if name.startswith("k8s/") else real(name)
    second = bundleindex.load_cluster(b)
    assert _plain(first) == want
    assert _plain(second) == want
    assert len(second.pods) == 10 and second.endpoints["default/backendsvc"]


def test_index_rows_keep_file_and_line(bundle):
    bundleindex.load_cluster(Bundle.open(bundle))
    import sqlite3
    conn = sqlite3.connect(_indexes()[0])
    line, = conn.execute("SELECT line FROM objects WHERE file = 'k8s/pods.yaml' AND "
                         "name = 'backend2'").fetchone()
    conn.close()
    text = (bundle / "k8s/pods.yaml").read_text().splitlines()
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
    assert len(_indexes()) == 1


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
    assert len(_indexes()) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign"])
def test_a_corrupt_or_foreign_index_is_ignored_and_rebuilt(bundle, tmp_path, damage):
    want = _plain(load_cluster(Bundle.open(bundle).text))
    b = Bundle.open(bundle)
    path = bundleindex._path_for(b.content_hash("k8s/"))
    if damage == "foreign":
        other = tmp_path / "other"
        shutil.copytree(KUBE_PROXY, other)
        bundleindex.load_cluster(Bundle.open(other))
        os.replace(_indexes()[0], path)        # another bundle's index under this one's name
    else:
        bundleindex.load_cluster(b)
        data = path.read_bytes()
        path.write_bytes(b"not sqlite at all" * 100 if damage == "garbage" else data[:4096])
    assert _plain(bundleindex.load_cluster(Bundle.open(bundle))) == want
    again = bundleindex.open_index(b.content_hash("k8s/"))
    assert again is not None                    # rebuilt, and now valid
    again.close()


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
    monkeypatch.setenv("TRACEFLOW_CACHE_MB", "0.05")     # 50 KB: room for one small index
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
    assert len(_indexes()) == 1
    assert not list(_cache().glob(".tmp-*"))             # no half-written index left


def test_bad_yaml_is_a_located_error_and_leaves_no_index(bundle):
    svc = bundle / "k8s/services.yaml"
    svc.write_text(svc.read_text().replace("    - port: 80\n", "    - port: eighty\n", 1))
    with pytest.raises(InputError) as err:
        bundleindex.load_cluster(Bundle.open(bundle))
    assert err.value.file == "k8s/services.yaml" and err.value.line
    assert _indexes() == []
    r = subprocess.run([sys.executable, "-m", "traceflow", "pod-to-svc", "frontend",
                        "backendsvc", "--bundle", str(bundle)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2
    assert f"k8s/services.yaml, line {err.value.line}" in r.stderr


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


def test_an_index_with_a_malformed_cluster_is_not_trusted(bundle):
    import sqlite3
    want = _plain(load_cluster(Bundle.open(bundle).text))
    bundleindex.load_cluster(Bundle.open(bundle))
    path = _indexes()[0]
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'cluster'", ('{"pods": [[1, 2]]}',))
    conn.commit()
    conn.close()
    assert _plain(bundleindex.load_cluster(Bundle.open(bundle))) == want
    conn = sqlite3.connect(path)                     # and it was rebuilt
    (value,), = conn.execute("SELECT value FROM meta WHERE key = 'cluster'").fetchall()
    conn.close()
    assert value != '{"pods": [[1, 2]]}'
