"""A persistent index of a bundle, so that the second command on a bundle starts from what the
first one learnt instead of reading 100 MB again.

Why: a 20,000-Service bundle holds ~60 MB of ``kubectl get -o yaml`` and 100,000-line flow and
iptables dumps; a trace needs a few objects, tables and chains of them. SQLite (stdlib
``sqlite3``) holds each stored value: one file, written atomically, and never executing code
when a hostile file is read (pickle would).

- Kubernetes objects: where each object of ``k8s/*`` is in its file and the keys lookups use
  (traceflow.kubecatalog's layout), so that a command parses only the objects it asks for; and,
  once a command has read a whole file (``audit``, completion), its checked objects as JSON.
  Keyed by the content hash of ``k8s/`` (``Bundle.content_hash("k8s/")``: SHA-256 of every
  file's name, size and bytes, streamed; 0.1 s for 60 MB): same bytes, same index; node
  files are not part of it (a 100-node bundle costs no more to key than a 2-node one).
- Node files (iptables-save, nft list ruleset, flow dumps): each file's layout keyed by the
  SHA-256 of its text.
- Where: ``$TRACEFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/traceflow``, else
  ``~/.cache/traceflow``; ``TRACEFLOW_NO_INDEX=1`` turns it off. At most
  ``TRACEFLOW_CACHE_MB`` (default 1024) MB: the least recently used files are removed.
- Trust: a stored value whose schema or key differ, or that SQLite cannot read, is ignored,
  removed and rebuilt; a layout that does not fit its file (sizes, offsets) is not used; it
  names only bundle-relative files and is never used to open a path. Objects read back go
  through the same checks and model building as YAML does.
- Concurrency: each value is written to a temporary file and renamed into place, so two
  traceflow processes on one bundle each read either nothing or a complete value.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
from pathlib import Path

SCHEMA = "traceflow-index/3"
K8S_FILES = ("k8s/pods.yaml", "k8s/services.yaml", "k8s/endpointslices.yaml",
             "k8s/endpoints.yaml")


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


# ---- Kubernetes objects ----------------------------------------------------------------------

def load_cluster(bundle):
    """The bundle's Cluster over its located objects (traceflow.kube.located_cluster): the
    layouts from the index when there is one, else located now and stored for the next
    command."""
    from traceflow.kube import located_cluster
    from traceflow.kubecatalog import Objects, layout_to_json
    if not enabled():
        return located_cluster(Objects(bundle.text))
    digest = bundle.content_hash("k8s/")
    layouts = load_blob("k8s-layout", digest)
    objects = Objects(bundle.text, layouts if isinstance(layouts, dict) else None,
                      whole=lambda name: _stored_items(digest, name),
                      keep_whole=lambda name, items: _store_items(digest, name, items))
    if not isinstance(layouts, dict):
        # the big files located now (that is the first command's cost), so that the next
        # command starts from their layouts
        for name in K8S_FILES:
            objects.catalog(name)
        found = {name: layout_to_json(cat) for name, cat in objects.located.items()}
        store_blob("k8s-layout", digest, {k: v for k, v in found.items() if v is not None})
    return located_cluster(objects)


def _items_key(digest: str, name: str) -> str:
    return f"{digest}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def _stored_items(digest: str, name: str):
    value = load_blob("k8s-items", _items_key(digest, name))
    return value if isinstance(value, list) and all(isinstance(i, dict) for i in value) else None


def _store_items(digest: str, name: str, items: list) -> None:
    """A file's checked objects as JSON, when JSON gives them back unchanged (a YAML
    timestamp or a non-string key would not be)."""
    try:
        json.dumps(items, separators=(",", ":"))
    except (TypeError, ValueError):
        return
    if _plain_keys(items):
        store_blob("k8s-items", _items_key(digest, name), items)


def _plain_keys(value, depth: int = 0) -> bool:
    if depth > 100:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_keys(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain_keys(v, depth + 1) for v in value)
    return True


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


def parse_nft_ruleset(text: str, name: str):
    """A node's ``nft list ruleset``, read lazily (netfilter.nft_lazy): the first time, one
    pass over the lines finds where each table, chain, set and map is, and that layout is
    stored keyed by the SHA-256 of the text; later commands take it from the index (checked
    against the text: a layout that does not fit is ignored and the text read again)."""
    from traceflow.netfilter.nft_lazy import from_layout, open_nft_ruleset
    if not enabled():
        return open_nft_ruleset(text, name)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    layout = load_blob("nft-layout", digest)
    if isinstance(layout, dict):
        try:
            return from_layout(text, name, layout)
        except (ValueError, TypeError, KeyError, IndexError):
            pass                       # a layout that does not fit: read the file
    ruleset = open_nft_ruleset(text, name)
    layout = getattr(ruleset, "layout", None)
    if layout is not None and not ruleset.syntax_errors:
        store_blob("nft-layout", digest, layout)
    return ruleset
