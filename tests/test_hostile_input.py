"""Hostile and broken bundles: every case that once crashed, hung or blew up memory is here.

Each ends in a trace or in exit 2 naming the file, the line (or key path) and the text; a
bug ends in exit 4 with a crash report; nothing reads outside the bundle.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.bundle.reader import Bundle
from traceflow.cli.app import app, example_path
from traceflow.model.errors import InputError

EXAMPLE = example_path()
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
TRACE = ["pod-to-svc", "frontend", "backendsvc", "-o", "json"]


def copy_example(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, bundle)
    return bundle


def edit(bundle: Path, name: str, fn) -> None:
    p = bundle / name
    p.write_text(fn(p.read_text()))


def trace(bundle: Path, env=None):
    return runner.invoke(app, [*TRACE, "--bundle", str(bundle)], env=env)


def sub(pattern: str, repl: str, count: int = 1):
    def fn(text: str) -> str:
        new = re.sub(pattern, repl, text, count=count, flags=re.M)
        assert new != text, pattern
        return new
    return fn


# ---- bad shapes and values: exit 2 with file, line, path -------------------------------------

CASES = {
    # NetworkPolicies that once loaded and crashed when a drop was explained
    "matchLabels string": ("k8s/networkpolicies.yaml",
                           sub(r"^(\s+)matchLabels:\n\s+role: frontend",
                               r"\1matchLabels: role=frontend"),
                           "items[0].spec.podSelector.matchLabels: expected a mapping"),
    "ports: x": ("k8s/networkpolicies.yaml",
                 sub(r"^(\s+- )ports:\n(\s+- port: 80\n\s+protocol: TCP)", r"\1ports: x"),
                 "items[0].spec.egress[0].ports: expected a list"),
    "from: -1": ("k8s/networkpolicies.yaml",
                 sub(r"^(\s+)- from:\n\s+- podSelector:\n\s+matchLabels:\n\s+role: frontend\n",
                     r"\1- from: -1\n"),
                 "items[1].spec.ingress[0].from: expected a list, got a number"),
    "endPort: x": ("k8s/networkpolicies.yaml",
                   sub(r"^(\s+)- port: 80\n", r"\1- port: 80\n\1  endPort: x\n"),
                   "endPort: expected a port number, got a string"),
    "ipBlock /33": ("k8s/networkpolicies.yaml",
                    sub(r"^(\s+)- podSelector:\n\s+matchLabels:\n\s+role: backend",
                        r"\1- ipBlock: {cidr: 10.0.0.0/33}"),
                    "'10.0.0.0/33' is not a CIDR"),
    # manifest nodes: of the wrong shape once crashed the tunnel step
    "nodes: x": ("manifest.yaml", lambda t: t + "\nnodes: x\n", "nodes: expected a mapping"),
    "nodes: [a]": ("manifest.yaml", lambda t: t + "\nnodes: [a]\n", "nodes: expected a mapping"),
    "nodes: {worker1: null}": ("manifest.yaml", lambda t: t + "\nnodes: {worker1: null}\n",
                               "nodes.worker1: expected a mapping, got null"),
    # Kubernetes fields of the wrong type
    "nodeName: []": ("k8s/pods.yaml", sub(r"nodeName: \S+", "nodeName: []"),
                     "spec.nodeName: expected a string, got a list"),
    "name: -1": ("k8s/pods.yaml", sub(r"name: frontend$", "name: -1"),
                 "metadata.name: expected a string, got a number"),
    "podIP mapping": ("k8s/pods.yaml", sub(r"podIP: \S+", "podIP: {a: 1}"),
                      "status.podIP: expected an IP address, got a mapping"),
    # bad values
    "podCIDR /-1": ("k8s/nodes.yaml", sub(r"podCIDR: (\S+)/\d+", r"podCIDR: \1/-1"),
                    "spec.podCIDR: '10.222.0.0/-1' is not a CIDR"),
    "clusterIP 300.1.1.1": ("k8s/services.yaml", sub(r"clusterIP: \S+", "clusterIP: 300.1.1.1"),
                            "spec.clusterIP: '300.1.1.1' is not an IP address"),
    "cookie=0x-1": ("nodes/worker1/ovs-flows.txt", sub(r"cookie=0x[0-9a-f]+", "cookie=0x-1"),
                    "bad cookie value '0x-1'"),
    "3-octet MAC": ("pods/default/frontend/ip-neigh.txt", sub(r"lladdr \S+", "lladdr aa:bb:cc"),
                    "bad link-layer address 'aa:bb:cc'"),
    "7-octet MAC": ("pods/default/frontend/ip-neigh.txt",
                    sub(r"lladdr \S+", "lladdr aa:bb:cc:dd:ee:ff:00"),
                    "bad link-layer address"),
    "lladdr an IPv6 address": ("pods/default/frontend/ip-neigh.txt",
                               sub(r"lladdr \S+", "lladdr 4e::8:c1:53:be"),
                               "link-layer address '4e::8:c1:53:be' is not an Ethernet MAC"),
    "NUL byte in YAML": ("k8s/pods.yaml", lambda t: t.replace("kind: Pod", "kind: P\x00od", 1),
                         "invalid YAML: character"),
    "YAML nested 1,000 deep (flow)": ("k8s/pods.yaml",
                                      lambda t: "items: " + "[" * 1000 + "]" * 1000 + "\n",
                                      "nested too deeply"),
    "YAML nested 1,000 deep (block)": ("k8s/pods.yaml",
                                       lambda t: "items:\n" + "".join(" " * i + "- \n"
                                                                      for i in range(1000)),
                                       "nested too deeply"),
    "YAML nested 100,000 deep": ("k8s/services.yaml",
                                 lambda t: "items: " + "[" * 100_000 + "]" * 100_000 + "\n",
                                 "nested too deeply"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_shape_or_value_is_located(tmp_path, case):
    name, fn, expected = CASES[case]
    bundle = copy_example(tmp_path)
    edit(bundle, name, fn)
    r = trace(bundle)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert expected in r.stderr, r.stderr
    assert re.search(rf"{re.escape(name)}, line \d+: ", r.stderr), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.output


def test_the_line_named_is_the_offending_line(tmp_path):
    bundle = copy_example(tmp_path)
    edit(bundle, "k8s/services.yaml", sub(r"clusterIP: \S+", "clusterIP: 300.1.1.1"))
    r = trace(bundle)
    line = int(re.search(r"line (\d+)", r.stderr).group(1))
    assert (bundle / "k8s/services.yaml").read_text().splitlines()[line - 1].strip() \
        == "clusterIP: 300.1.1.1"


def test_a_valid_policy_with_every_field_still_loads(tmp_path):
    """The shapes accept what Kubernetes accepts: named ports, endPort, ipBlock with except,
    matchExpressions, namespaceSelector."""
    bundle = copy_example(tmp_path)
    doc = yaml.safe_load((bundle / "k8s/networkpolicies.yaml").read_text())
    doc["items"].append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                         "metadata": {"name": "all-fields", "namespace": "default"},
                         "spec": {"podSelector": {"matchExpressions": [
                             {"key": "role", "operator": "In", "values": ["x"]}]},
                             "policyTypes": ["Ingress"],
                             "ingress": [{"from": [
                                 {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                                 {"namespaceSelector": {}, "podSelector": {"matchLabels": {}}}],
                                 "ports": [{"port": "http"}, {"port": 8000, "endPort": 8080,
                                                              "protocol": "UDP"}]}]}})
    (bundle / "k8s/networkpolicies.yaml").write_text(yaml.safe_dump(doc))
    r = trace(bundle)
    assert r.exit_code == 0, r.output


# ---- Antrea support bundles -------------------------------------------------------------------

def _tgz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _support_bundle(tmp_path: Path, agentinfo: bytes, clusterinfo: bytes | None) -> Path:
    d = tmp_path / "support-bundles_20240510T184554Z"
    d.mkdir()
    files = {"flows": (EXAMPLE / "nodes/worker1/ovs-flows.txt").read_bytes(),
             "ovsports": (EXAMPLE / "nodes/worker1/ovs-show.txt").read_bytes(),
             "agentinfo": agentinfo}
    (d / "agent_worker1.tar.gz").write_bytes(_tgz(files))
    if clusterinfo is not None:
        (d / "clusterinfo").write_bytes(clusterinfo)
    return d


def test_support_bundle_agentinfo_podref_string(tmp_path):
    d = _support_bundle(tmp_path, b"version: v1.15.0\npodRef: x\n", None)
    r = runner.invoke(app, ["route-get", "worker1", "10.0.0.1", "--bundle", str(d)])
    assert r.exit_code == 2, r.output
    assert "agent_worker1.tar.gz: agentinfo, line 2: podRef: expected a mapping" in r.stderr


def test_support_bundle_clusterinfo_items_number(tmp_path):
    info = b"#pods\napiVersion: v1\nitems: 1\n---\n#nodes\nitems: []\n"
    d = _support_bundle(tmp_path, b"version: v1.15.0\n", info)
    r = runner.invoke(app, ["route-get", "worker1", "10.0.0.1", "--bundle", str(d)])
    assert r.exit_code == 2, r.output
    assert "clusterinfo, line 3: items: expected a list, got a number" in r.stderr, r.stderr


# ---- archives -----------------------------------------------------------------------------------

def _tar_of(folder: Path, out: Path, extra=None) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname="bundle")
        for info, data in extra or ():
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def test_truncated_targz_is_a_located_error(tmp_path):
    whole = _tar_of(EXAMPLE, tmp_path / "b.tar.gz").read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    r = runner.invoke(app, [*TRACE, "--bundle", str(cut)])
    assert r.exit_code == 2, r.output
    assert f"{cut}: not a readable .tar.gz (truncated or corrupt" in r.stderr


def test_truncated_targz_with_debug_shows_the_traceback(tmp_path):
    whole = _tar_of(EXAMPLE, tmp_path / "b.tar.gz").read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    r = subprocess.run([sys.executable, "-m", "traceflow", *TRACE, "--bundle", str(cut)],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "TRACEFLOW_DEBUG": "1", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    assert "Traceback (most recent call last)" in r.stderr
    assert "not a readable .tar.gz" in r.stderr and "Aborted" not in r.stderr


def test_stray_absolute_and_non_regular_members_are_ignored_and_said(tmp_path):
    link = tarfile.TarInfo("bundle/nodes/worker1/ip-route-link.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    fifo = tarfile.TarInfo("bundle/nodes/worker1/fifo")
    fifo.type = tarfile.FIFOTYPE
    absolute = tarfile.TarInfo("/etc/cron.d/evil")
    absolute.size = 3
    climbing = tarfile.TarInfo("bundle/../../evil")
    climbing.size = 3
    path = _tar_of(EXAMPLE, tmp_path / "b.tar.gz",
                   [(link, None), (fifo, None), (absolute, b"x\n\n"), (climbing, b"y\n\n")])
    r = runner.invoke(app, [*TRACE, "--bundle", str(path)])
    assert r.exit_code == 0, r.output        # the top folder is still found and stripped
    assert "ip-route-link.txt: not a regular file (a link or device); ignored" in r.stderr
    assert "fifo: not a regular file" in r.stderr
    assert "/etc/cron.d/evil: a path outside the bundle; ignored" in r.stderr
    assert "bundle/../../evil: a path outside the bundle; ignored" in r.stderr


def test_size_limit_per_file_is_configurable_and_clear(tmp_path):
    path = _tar_of(EXAMPLE, tmp_path / "b.tar.gz")
    r = runner.invoke(app, [*TRACE, "--bundle", str(path)], env={"TRACEFLOW_MAX_FILE_MB": "0.01"})
    assert r.exit_code == 2
    assert re.search(r"error: \S+: file is 0\.\d+ MB, more than the 0\.01 MB a bundle file may "
                     r"hold \(raise TRACEFLOW_MAX_FILE_MB", r.stderr), r.stderr
    r = runner.invoke(app, [*TRACE, "--bundle", str(tmp_path / "b.tar.gz")],
                      env={"TRACEFLOW_MAX_FILE_MB": "1"})
    assert r.exit_code == 0


def _peak_rss_of(code: str) -> tuple[int, str]:
    """Run ``code`` in a fresh interpreter; (peak RSS in MB, its stdout)."""
    # VmHWM is this interpreter's own high-water mark (getrusage's ru_maxrss would carry the
    # forking pytest process's peak across exec)
    wrapper = code + ("\nimport re\nprint('RSS', re.search(r'VmHWM:\\s*(\\d+)', "
                      "open('/proc/self/status').read()).group(1))\n")
    r = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr
    rss_kb = int(re.search(r"RSS (\d+)", r.stdout).group(1))
    return rss_kb // 1024, r.stdout


class _Zeros(io.RawIOBase):
    def __init__(self, size: int):
        self.left = size

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n

    def readable(self) -> bool:
        return True


def _bomb(tmp_path: Path, size: int) -> Path:
    """The example bundle plus one ``size``-byte member of zeros (a gzip bomb: a few hundred
    KB compressed)."""
    out = tmp_path / "bomb.tar.gz"
    with tarfile.open(out, "w:gz", compresslevel=1) as tar:
        tar.add(EXAMPLE, arcname="bundle")
        info = tarfile.TarInfo("bundle/nodes/worker1/huge.txt")
        info.size = size
        tar.addfile(info, io.BufferedReader(_Zeros(size), 1 << 20))
    return out


def test_gzip_bomb_member_is_never_read_and_memory_stays_bounded(tmp_path):
    size = 512 * 1024 * 1024
    bomb = _bomb(tmp_path, size)
    assert bomb.stat().st_size < 3 * 1024 * 1024
    rss, out = _peak_rss_of(
        "from traceflow.bundle.reader import Bundle\n"
        "from traceflow.cni import open_snapshot\n"
        "from traceflow.questions.solver import Query, Solver\n"
        f"b = Bundle.open({str(bomb)!r})\n"
        "assert 'nodes/worker1/huge.txt' in b.names()\n"
        "s = open_snapshot(b); c = s.cluster; svc = c.service('backendsvc', 'default')\n"
        "t = Solver(s).trace(Query('pod-to-svc', c.pod('frontend', 'default'), svc.cluster_ip,"
        " 80, 'TCP', 54321, svc.key, svc))\n"
        "print('VERDICT', t.verdict)\n")
    assert "VERDICT" in out
    assert rss < 250, f"peak RSS {rss} MB while tracing a bundle with a {size >> 20} MB member"


def _sparse_member(name: str, realsize: int) -> bytes:
    """An old-GNU sparse member: 512 bytes stored, ``realsize`` bytes when extracted."""
    info = tarfile.TarInfo(name)
    info.type, info.size = tarfile.GNUTYPE_SPARSE, 512
    buf = bytearray(info.tobuf(tarfile.GNU_FORMAT)[:512])

    def octal(n: int) -> bytes:
        return b"%011o\0" % n
    buf[386:398], buf[398:410], buf[482], buf[483:495] = octal(0), octal(512), 0, octal(realsize)
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % sum(buf)
    return bytes(buf) + b"x" * 512


def test_sparse_member_of_1gb_costs_no_memory_and_is_refused_when_read(tmp_path):
    import gzip
    plain = io.BytesIO()
    tar = tarfile.open(fileobj=plain, mode="w", format=tarfile.GNU_FORMAT)
    tar.add(EXAMPLE, arcname="bundle")
    member = _sparse_member("bundle/nodes/worker1/sparse.txt", 1 << 30)
    tar.fileobj.write(member)
    tar.offset += len(member)
    tar.close()
    path = tmp_path / "sparse.tar.gz"
    path.write_bytes(gzip.compress(plain.getvalue()))
    assert path.stat().st_size < 200_000
    rss, out = _peak_rss_of(
        "from traceflow.bundle.reader import Bundle\n"
        "from traceflow.model.errors import InputError\n"
        f"b = Bundle.open({str(path)!r})\n"
        "assert 'nodes/worker1/sparse.txt' in b.names()\n"
        "from traceflow.cni import open_snapshot\n"
        "s = open_snapshot(b); s.cluster; s.node('worker1')\n"
        "try:\n    b.raw('nodes/worker1/sparse.txt')\n"
        "except InputError as e:\n    print('REFUSED', e)\n")
    assert "REFUSED nodes/worker1/sparse.txt: file is 1024 MB, more than the 256 MB" in out
    assert rss < 200, f"peak RSS {rss} MB"


def test_gzip_bomb_member_read_on_purpose_hits_the_limit(tmp_path):
    bomb = _bomb(tmp_path, 64 * 1024 * 1024)
    b = Bundle.open(bomb)
    os.environ["TRACEFLOW_MAX_FILE_MB"] = "16"
    try:
        with pytest.raises(InputError, match=r"file is 64 MB, more than the 16 MB"):
            b.raw("nodes/worker1/huge.txt")
    finally:
        del os.environ["TRACEFLOW_MAX_FILE_MB"]


def test_archive_bigger_than_the_bundle_limit_stops_early(tmp_path):
    bomb = _bomb(tmp_path, 64 * 1024 * 1024)
    started = time.perf_counter()
    with pytest.raises(InputError, match="larger than 32 MB uncompressed"):
        os.environ["TRACEFLOW_MAX_BUNDLE_MB"] = "32"
        try:
            Bundle.open(bomb)
        finally:
            del os.environ["TRACEFLOW_MAX_BUNDLE_MB"]
    assert time.perf_counter() - started < 10


# ---- folders and symlinks -----------------------------------------------------------------------

def test_symlink_out_of_a_folder_bundle_is_never_followed(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRET-HASH-MARKER:19000:0:99999:7:::\n")
    bundle = copy_example(tmp_path)
    route = bundle / "nodes/worker1/ip-route.txt"
    route.unlink()
    route.symlink_to(secret)
    (bundle / "nodes/worker2/escape").symlink_to(tmp_path, target_is_directory=True)
    r = trace(bundle)
    assert "SECRET-HASH-MARKER" not in r.output
    assert "nodes/worker1/ip-route.txt: a symlink pointing outside the bundle; ignored" in r.stderr
    assert "nodes/worker2/escape: a symlinked folder; ignored" in r.stderr
    b = Bundle.open(bundle)
    assert not b.has("nodes/worker1/ip-route.txt")
    assert not any("shadow" in n for n in b.names())


def test_symlink_inside_the_bundle_works(tmp_path):
    bundle = copy_example(tmp_path)
    real = bundle / "k8s" / "pods-real.yaml"
    (bundle / "k8s/pods.yaml").rename(real)
    (bundle / "k8s/pods.yaml").symlink_to("pods-real.yaml")
    r = trace(bundle)
    assert r.exit_code == 0, r.output


# ---- the last resort ----------------------------------------------------------------------------

def test_internal_error_has_its_own_exit_code_and_a_crash_report(tmp_path, monkeypatch):
    from traceflow.questions import solver

    def boom(self, q):
        raise RuntimeError("simulated bug")
    monkeypatch.setattr(solver.Solver, "trace", boom)
    r = runner.invoke(app, [*TRACE, "--bundle", str(EXAMPLE)],
                      env={"TRACEFLOW_CRASH_DIR": str(tmp_path)})
    assert r.exit_code == 4, r.output
    assert "internal error (RuntimeError: simulated bug): this is a bug in traceflow" in r.stderr
    report = Path(re.search(r"the traceback is in (\S+)\.", r.stderr).group(1))
    assert report.parent == tmp_path
    text = report.read_text()
    assert "Traceback (most recent call last)" in text and "simulated bug" in text
    assert "Traceback" not in r.stderr


def test_debug_shows_the_traceback_for_every_exception(monkeypatch):
    from traceflow.questions import solver

    def boom(self, q):
        raise KeyError("simulated")
    monkeypatch.setattr(solver.Solver, "trace", boom)
    r = runner.invoke(app, [*TRACE, "--bundle", str(EXAMPLE)], env={"TRACEFLOW_DEBUG": "1"})
    assert r.exit_code == 4 and "Traceback (most recent call last)" in r.stderr
    r = runner.invoke(app, [*TRACE, "--bundle", "/nonexistent/bundle"],
                      env={"TRACEFLOW_DEBUG": "1"})
    assert r.exit_code == 2 and "Traceback (most recent call last)" in r.stderr
    assert "bundle not found" in r.stderr


def test_renderer_failure_is_caught(tmp_path, monkeypatch):
    import renderers.json_out

    def broken(trace):
        raise TypeError("renderer bug")
    monkeypatch.setattr(renderers.json_out, "render_json", broken)
    r = runner.invoke(app, [*TRACE, "--bundle", str(EXAMPLE)],
                      env={"TRACEFLOW_CRASH_DIR": str(tmp_path)})
    assert r.exit_code == 4, r.output
    assert "internal error (TypeError: renderer bug)" in r.stderr
