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


# ---- OVS flow dumps ----------------------------------------------------------------------------
#
# A node's ovs-flows.txt (100k lines on a big cluster) is laid out once: which lines are in
# which table and, for each big table, its index (FlowDump.layout). The layout is kept as one
# SQLite file per dump, keyed by the SHA-256 of the dump's text, its number sequences as
# arrays of machine integers (BLOBs): loading 100k lines' layout is a few memory copies,
# where JSON would decode 500k numbers one by one (0.1 s).

_FLOWS_KIND = "ovs-flows"
_NUMBERS = "q"          # line numbers and priorities: 64-bit signed
_VALUES = "Q"           # indexed values: 64-bit unsigned, or two arrays for wider fields


def _text_digest(text: str) -> str:
    """SHA-256 of the text as UTF-8, encoded a megabyte at a time (no second copy of a
    14 MB dump in memory)."""
    import hashlib
    digest = hashlib.sha256()
    step = 1 << 20
    for start in range(0, len(text), step):
        digest.update(text[start:start + step].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def load_flow_dump(text: str, name: str):
    """A node's FlowDump: from its stored layout when there is one that fits the text, else
    read from the text (and its layout stored for the next command)."""
    from traceflow.ovs.flows import FlowDump
    if not enabled():
        return FlowDump(text, name)
    digest = _text_digest(text)
    path = _blob_path(_FLOWS_KIND, digest)
    layout = _load_flow_layout(path, digest)
    if layout is not None:
        try:
            dump = FlowDump.from_layout(text, name, layout)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError):
            _remove(path)              # does not fit this text: read it, lay it out again
        else:
            dump.digest = digest
            dump.on_stale = lambda: _remove(path)
            return dump
    dump = FlowDump(text, name)
    dump.digest = digest
    try:
        layout = dump.layout()
    except (ValueError, TypeError, KeyError, IndexError, OverflowError):
        layout = None                  # not laid out: read every time, as without an index
    if layout is not None:
        _store_flow_layout(path, digest, layout)
    return dump


def _pack_values(values) -> tuple[bytes, bytes | None]:
    """Indexed values as (low 64 bits, high bits or None)."""
    from array import array
    try:
        return array(_VALUES, values).tobytes(), None
    except OverflowError:
        mask = (1 << 64) - 1
        return (array(_VALUES, (v & mask for v in values)).tobytes(),
                array(_VALUES, (v >> 64 for v in values)).tobytes())


def _unpack(blob: bytes, code: str):
    from array import array
    out = array(code)
    if type(blob) is not bytes or len(blob) % out.itemsize:
        raise ValueError("not an array")
    out.frombytes(blob)
    return out


def _store_flow_layout(path: Path, digest: str, layout: dict) -> None:
    """Write a FlowDump layout (atomically; silently not when the cache cannot be written, or
    when a number does not fit 64 bits)."""
    import sys
    from array import array
    folder = cache_dir()
    try:
        rows = []
        for seq, (table, numbers, index) in enumerate(layout["tables"]):
            row = [seq, json.dumps(table), array(_NUMBERS, numbers).tobytes(),
                   None, None, None, None, None, None, None]
            if index is not None:
                low, high = _pack_values(index["values"])
                row[3:] = [index["field"], low, high,
                           array(_NUMBERS, index["prios"]).tobytes(),
                           array(_NUMBERS, index["numbers"]).tobytes(),
                           array(_NUMBERS, index["rest_prios"]).tobytes(),
                           array(_NUMBERS, index["rest_numbers"]).tobytes()]
            rows.append(row)
        skipped = array(_NUMBERS, layout["skipped"]).tobytes()
    except (OverflowError, TypeError, ValueError):
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".sqlite", dir=folder)
        os.close(fd)
    except OSError:
        return
    try:
        conn = sqlite3.connect(tmp)
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value)")
        conn.execute("CREATE TABLE tables (seq INTEGER, name TEXT, numbers BLOB, field TEXT, "
                     "values_low BLOB, values_high BLOB, prios BLOB, indexed BLOB, "
                     "rest_prios BLOB, rest_numbers BLOB)")
        conn.executemany("INSERT INTO tables VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO meta VALUES (?, ?)",
                         [("schema", SCHEMA), ("bundle", f"{_FLOWS_KIND}:{digest}"),
                          ("byteorder", sys.byteorder), ("lines", layout["lines"]),
                          ("skipped", skipped)])
        conn.commit()
        conn.close()
        os.replace(tmp, path)
    except (sqlite3.Error, OSError, TypeError, ValueError, OverflowError):
        _remove(Path(tmp))
        return
    _prune(folder, keep=path)


def _load_flow_layout(path: Path, digest: str) -> dict | None:
    """The stored layout of the dump with this digest, or None (absent; foreign, corrupt or
    from a machine of another byte order: then removed, to be rebuilt)."""
    import sys
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta"))
            if meta.get("schema") != SCHEMA or meta.get("bundle") != f"{_FLOWS_KIND}:{digest}" \
                    or meta.get("byteorder") != sys.byteorder or type(meta.get("lines")) is not int:
                raise ValueError("not this dump's layout")
            rows = conn.execute("SELECT name, numbers, field, values_low, values_high, prios, "
                                "indexed, rest_prios, rest_numbers FROM tables ORDER BY seq")
            tables = [_table_from_row(*row) for row in rows]
        finally:
            conn.close()
        layout = {"lines": meta["lines"], "skipped": _unpack(meta["skipped"], _NUMBERS),
                  "tables": tables}
    except (sqlite3.Error, KeyError, ValueError, TypeError):
        _remove(path)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return layout


def _table_from_row(name, numbers, field, low, high, prios, indexed, rest_prios, rest_numbers):
    table = json.loads(name)
    index = None
    if low is not None:
        values = _unpack(low, _VALUES)
        if high is not None:
            high = _unpack(high, _VALUES)
            if len(high) != len(values):
                raise ValueError("index values")
            values = [(h << 64) | v for h, v in zip(high, values)]
        index = {"field": field, "values": values, "prios": _unpack(prios, _NUMBERS),
                 "numbers": _unpack(indexed, _NUMBERS),
                 "rest_prios": _unpack(rest_prios, _NUMBERS),
                 "rest_numbers": _unpack(rest_numbers, _NUMBERS)}
    return [table, _unpack(numbers, _NUMBERS), index]


def flow_dump_derived(dump, kind: str, compute, fits):
    """A JSON value read from a flow dump's lines (e.g. the CNI's Pod ports), stored keyed by
    the dump's digest like its layout: ``compute()`` when there is none, or when the stored
    one does not pass ``fits`` (which reads again the lines it names)."""
    digest = getattr(dump, "digest", None)
    if digest is None or not enabled():
        return compute()
    value = load_blob(kind, digest)
    if value is not None:
        try:
            if fits(value):
                return value
        except (TypeError, ValueError, KeyError, IndexError):
            pass
        _remove(_blob_path(kind, digest))
    value = compute()
    store_blob(kind, digest, value)
    return value


def forget_flow_dump_derived(dump, kind: str) -> None:
    """Remove a stored ``flow_dump_derived`` value found not to fit its dump."""
    digest = getattr(dump, "digest", None)
    if digest is not None:
        _remove(_blob_path(kind, digest))
