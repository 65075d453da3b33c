"""A persistent index of a bundle's Kubernetes objects, so that the second command on a bundle
does not read its YAML again.

Why: a 20,000-Service bundle holds ~100 MB of ``kubectl get -o yaml``; reading it takes seconds
even with libyaml, while JSON rows in SQLite come back in a fraction of that. SQLite (stdlib
``sqlite3``) was picked over a JSON-lines or pickle cache because it is one file, written
atomically, read in part (one kind, one namespace) with an index, and never executes code when a
hostile file is read (pickle would).

- Key: the content hash of what the index is built from (``Bundle.content_hash("k8s/")``:
  SHA-256 of every ``k8s/`` file's name, size and bytes, streamed; 0.1 s for 60 MB). Same
  bytes, same index; any change, a new index. Node files are not hashed: nothing of them is
  in the index (a 100-node bundle costs no more to key than a 2-node one).
- Where: ``$TRACEFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/traceflow``, else
  ``~/.cache/traceflow``; ``TRACEFLOW_NO_INDEX=1`` turns it off. At most
  ``TRACEFLOW_CACHE_MB`` (default 1024) MB: the least recently used indexes are removed.
- What: each object of ``k8s/*`` as JSON with the file and line it came from, stored only once
  the whole file has passed ``traceflow.validate``: an indexed bundle is a validated bundle;
  and the facts traceflow.kube keeps of them (the Cluster, as plain JSON), so that a command
  starts without decoding 80,000 objects. SCHEMA names both layouts: change it when either
  changes.
- Trust: an index whose schema version or bundle hash differ, or that SQLite cannot read, is
  ignored and rebuilt; it names only bundle-relative files and is never used to open a path.
  Objects read back go through the same model building (and its shape guard) as YAML does.
- Concurrency: an index is written to a temporary file and renamed into place, so two
  traceflow processes on one bundle each read either no index or a complete one.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from pathlib import Path

SCHEMA = "traceflow-index/2"
K8S_FILES = ("k8s/pods.yaml", "k8s/services.yaml", "k8s/nodes.yaml", "k8s/networkpolicies.yaml",
             "k8s/endpointslices.yaml", "k8s/endpoints.yaml")


def enabled() -> bool:
    return os.environ.get("TRACEFLOW_NO_INDEX", "") not in ("1", "true", "yes")


def cache_dir() -> Path:
    explicit = os.environ.get("TRACEFLOW_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "traceflow"


def _budget() -> int:
    try:
        return int(float(os.environ.get("TRACEFLOW_CACHE_MB") or 1024) * 1024 * 1024)
    except ValueError:
        return 1024 * 1024 * 1024


class Index:
    """The Kubernetes objects of one bundle, by file, as the validated items of each file."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self._conn = conn

    def cluster(self):
        """The stored Cluster, or None when the index has none."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'cluster'").fetchone()
        return None if row is None else _cluster_from(json.loads(row[0]))

    def items(self, name: str) -> list[dict]:
        rows = self._conn.execute("SELECT json FROM objects WHERE file = ? ORDER BY seq",
                                  (name,))
        return [json.loads(j) for (j,) in rows]

    def close(self) -> None:
        self._conn.close()


def _path_for(digest: str) -> Path:
    return cache_dir() / f"bundle-{digest}.sqlite"


def open_index(digest: str) -> Index | None:
    """The complete index of the bundle with this content hash, or None (absent, foreign,
    corrupt, other schema: a corrupt or foreign file is removed so that it is rebuilt)."""
    path = _path_for(digest)
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        if meta.get("schema") != SCHEMA or meta.get("bundle") != digest \
                or meta.get("complete") != "1":
            conn.close()
            raise sqlite3.DatabaseError("not this bundle's index")
    except sqlite3.Error:
        _remove(path)
        return None
    try:
        os.utime(path)            # least recently used goes first when the cache is full
    except OSError:
        pass
    return Index(path, conn)


def write_index(digest: str, files: dict[str, list[tuple[int, dict]]],
                cluster=None) -> Path | None:
    """Store ``files``: bundle-relative name -> [(line, object)], and the Cluster built from
    them. None when it cannot be written (read-only cache, full disk): the trace goes on
    without an index."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".sqlite", dir=folder)
        os.close(fd)
    except OSError:
        return None
    try:
        conn = sqlite3.connect(tmp)
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("CREATE TABLE objects (file TEXT, seq INTEGER, line INTEGER, kind TEXT, "
                     "namespace TEXT, name TEXT, json TEXT)")
        for name, items in files.items():
            conn.executemany(
                "INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?, ?)",
                ((name, seq, line, str(obj.get("kind", "")),
                  str((obj.get("metadata") or {}).get("namespace", "")),
                  str((obj.get("metadata") or {}).get("name", "")),
                  json.dumps(obj, separators=(",", ":"), default=str))
                 for seq, (line, obj) in enumerate(items)))
        conn.execute("CREATE INDEX objects_by_file ON objects (file, seq)")
        conn.execute("CREATE INDEX objects_by_name ON objects (kind, namespace, name)")
        meta = [("schema", SCHEMA), ("bundle", digest), ("complete", "1")]
        if cluster is not None:
            meta.append(("cluster", json.dumps(_cluster_to(cluster), separators=(",", ":"))))
        conn.executemany("INSERT INTO meta VALUES (?, ?)", meta)
        conn.commit()
        conn.close()
        path = _path_for(digest)
        os.replace(tmp, path)
    except (sqlite3.Error, OSError, TypeError, ValueError):
        _remove(Path(tmp))
        return None
    _prune(folder, keep=path)
    return path


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _prune(folder: Path, keep: Path) -> None:
    """Remove the least recently used indexes beyond the cache budget."""
    try:
        found = [(p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob("bundle-*.sqlite")]
    except OSError:
        return
    total = sum(size for _, size, _ in found)
    for _, size, p in sorted(found):
        if total <= _budget():
            break
        if p != keep:
            _remove(p)
            total -= size


def load_cluster(bundle):
    """The bundle's Cluster: from its index when there is one, else from its files (then
    indexed for the next command)."""
    from traceflow.kube import k8s_items, load_cluster as build
    if not enabled():
        return build(bundle.text)
    digest = bundle.content_hash("k8s/")
    index = open_index(digest)
    if index is not None:
        try:
            cluster = index.cluster()
            return cluster if cluster is not None else build(bundle.text, items=index.items)
        except (sqlite3.Error, ValueError, TypeError, KeyError, IndexError):
            pass                          # unreadable after all: read the files
        finally:
            index.close()
    seen: dict[str, list[tuple[int, dict]]] = {}

    def items(name: str) -> list:
        lines: list = []
        got = k8s_items(bundle.text, name, lines)
        if len(lines) != len(got):        # PyYAML had to decide: no lines to record
            lines = [0] * len(got)
        seen[name] = list(zip(lines, got))
        return got
    cluster = build(bundle.text, items=items)
    write_index(digest, seen, cluster if _round_trips(cluster) else None)
    return cluster


# ---- the Cluster as plain JSON -------------------------------------------------------------

def _cluster_to(c) -> dict:
    return {
        "pods": [[p.namespace, p.name, p.ip, p.node, p.labels, p.phase, p.host_network,
                  p.owners, p.container_ports] for p in c.pods],
        "services": [[s.namespace, s.name, s.type, s.cluster_ip,
                      [[sp.name, sp.port, sp.protocol, sp.target_port, sp.node_port]
                       for sp in s.ports], s.selector] for s in c.services],
        "nodes": [[n.name, n.internal_ip, n.pod_cidrs] for n in c.nodes],
        "policies": [[p.namespace, p.name, p.pod_selector, p.policy_types, p.ingress, p.egress]
                     for p in c.policies],
        "endpoints": c.endpoints,
    }


def _cluster_from(d: dict):
    from traceflow.kube import Cluster, NetworkPolicy, Node, Pod, Service, ServicePort
    c = Cluster()
    c.pods = [Pod(ns, name, ip, node, labels, phase, host, tuple(map(tuple, owners)),
                  tuple(map(tuple, ports)))
              for ns, name, ip, node, labels, phase, host, owners, ports in d["pods"]]
    c.services = [Service(ns, name, kind, ip, tuple(ServicePort(*p) for p in ports), selector)
                  for ns, name, kind, ip, ports, selector in d["services"]]
    c.nodes = [Node(name, ip, tuple(cidrs)) for name, ip, cidrs in d["nodes"]]
    c.policies = [NetworkPolicy(ns, name, sel, tuple(types), tuple(ing), tuple(eg))
                  for ns, name, sel, types, ing, eg in d["policies"]]
    c.endpoints = {k: [tuple(e) for e in v] for k, v in d["endpoints"].items()}
    return c


def _round_trips(cluster) -> bool:
    """Whether the Cluster comes back equal from JSON (it does not when, say, a label key is
    a YAML integer): otherwise only the objects are indexed."""
    try:
        again = _cluster_from(json.loads(json.dumps(_cluster_to(cluster))))
    except (TypeError, ValueError):
        return False
    return (again.pods, again.services, again.nodes, again.policies, again.endpoints) == \
        (cluster.pods, cluster.services, cluster.nodes, cluster.policies, cluster.endpoints)


# ---- one node file's layout ------------------------------------------------------------------

def _blob_path(kind: str, digest: str) -> Path:
    return cache_dir() / f"bundle-{kind}-{digest}.sqlite"


def load_blob(kind: str, digest: str):
    """The JSON value stored for ``kind`` and this content hash, or None (absent, foreign,
    corrupt: then removed, to be rebuilt)."""
    path = _blob_path(kind, digest)
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta"))
        finally:
            conn.close()
        if meta.get("schema") != SCHEMA or meta.get("bundle") != f"{kind}:{digest}":
            raise sqlite3.DatabaseError("not this file's index")
        value = json.loads(meta["value"])
    except (sqlite3.Error, KeyError, ValueError):
        _remove(path)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return value


def store_blob(kind: str, digest: str, value) -> None:
    """Store a JSON value for ``kind`` and this content hash (atomically; silently not when
    the cache cannot be written)."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".sqlite", dir=folder)
        os.close(fd)
    except OSError:
        return
    try:
        conn = sqlite3.connect(tmp)
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.executemany("INSERT INTO meta VALUES (?, ?)",
                         [("schema", SCHEMA), ("bundle", f"{kind}:{digest}"),
                          ("value", json.dumps(value, separators=(",", ":")))])
        conn.commit()
        conn.close()
        path = _blob_path(kind, digest)
        os.replace(tmp, path)
    except (sqlite3.Error, OSError, TypeError, ValueError):
        _remove(Path(tmp))
        return
    _prune(folder, keep=path)


def parse_iptables_save(text: str, name: str):
    """A node's iptables-save, read lazily (netfilter.iptables_parse.LazyChain): the first time,
    every line's shape is checked and where each chain's rules are is stored, keyed by the
    SHA-256 of the text; later commands take the layout from the index instead of passing over
    200,000 lines."""
    import hashlib

    from traceflow.netfilter.iptables_parse import from_save_layout, parse_iptables_save as parse
    from traceflow.netfilter.iptables_parse import save_layout
    if not enabled():
        return parse(text, name, lazy=True)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    layout = load_blob("iptables-save", digest)
    if layout is not None:
        try:
            return from_save_layout(text, name, layout)
        except (ValueError, TypeError, KeyError, IndexError):
            pass                       # a layout that does not fit: read the file
    ruleset = parse(text, name, lazy=True)
    layout = save_layout(ruleset)
    if layout is not None:
        store_blob("iptables-save", digest, layout)
    return ruleset
