"""A persistent index of a bundle, so that the second command on a bundle starts from what the
first one learnt instead of reading 100 MB again.

Why: a 20,000-Service bundle holds ~60 MB of ``kubectl get -o yaml`` and 100,000-line flow and
iptables dumps; a trace needs a few objects, tables and chains of them. SQLite (stdlib
``sqlite3``) holds each stored value: one file, written atomically, and never executing code
when a hostile file is read (pickle would).

- Kubernetes objects: where each object of ``k8s/*`` is in its file and the keys lookups use
  (traceflow.bundle.kubecatalog's layout), so that a command parses only the objects it asks for; and,
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
    """The bundle's Cluster over its located objects (traceflow.bundle.kube.located_cluster): the
    layouts from the index when there is one, else located now and stored for the next
    command."""
    from traceflow.bundle.kube import located_cluster
    from traceflow.bundle.kubecatalog import Objects
    if not enabled():
        return located_cluster(Objects(bundle.text))
    digest = bundle.content_hash("k8s/")
    layouts = load_blob("k8s-layout", digest)
    objects = Objects(bundle.text, layouts if isinstance(layouts, dict) else None,
                      whole=lambda name: _stored_items(digest, name),
                      keep_whole=lambda name, items: _store_items(digest, name, items))
    if not isinstance(layouts, dict) and STORE_AT_ONCE:
        from traceflow.bundle.kubecatalog import layout_to_json
        for name in K8S_FILES:          # every big file located now and stored
            cat = objects.catalog(name)
            if cat is not None:
                cat.locate()
        found = {name: layout_to_json(cat) for name, cat in objects.located.items()}
        store_blob("k8s-layout", digest, {k: v for k, v in found.items() if v is not None})
        return located_cluster(objects)
    # the files this command locates (one that reads them all; a trace only searches them
    # for what it looks up: kubecatalog._Search) are stored after it answers, for the next
    _later_k8s(objects, digest, layouts if isinstance(layouts, dict) else {})
    return located_cluster(objects)


def _later_k8s(objects, digest: str, stored: dict) -> None:
    import atexit
    import weakref
    if not (_PENDING or _PENDING_K8S or _PENDING_BLOBS):
        atexit.register(store_pending)
    _PENDING_K8S.append((weakref.ref(objects), digest, set(stored), stored))


_PENDING_K8S: list = []


def _store_k8s_layouts() -> None:
    from traceflow.bundle.kubecatalog import layout_to_json
    while _PENDING_K8S:
        ref, digest, had, stored = _PENDING_K8S.pop()
        objects = ref()
        if objects is None:
            continue
        found = {name: layout_to_json(cat) for name, cat in objects.located.items()}
        found = {k: v for k, v in found.items() if v is not None}
        if set(found) - had:
            store_blob("k8s-layout", digest, {**stored, **found})


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


def load_blob(kind: str, digest: str, walked: bool = True):
    """The JSON value stored for ``kind`` and this content hash, or None (absent, foreign,
    corrupt: then removed, to be rebuilt). ``walked``: the caller walks the value
    recursively, so it is checked not to nest past any index traceflow writes (a layout
    whose reader only looks keys up skips the walk over its 100,000 numbers)."""
    def read(conn: sqlite3.Connection):
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        if meta.get("schema") != SCHEMA or meta.get("bundle") != f"{kind}:{digest}":
            raise ValueError("not this file's index")
        value = json.loads(meta["value"])
        if walked and not _plain_keys(value):   # nested past any index traceflow writes
            raise ValueError("a stored value nested too deep")
        return value
    return _read_sqlite(_blob_path(kind, digest), read)


def _read_sqlite(path: Path, read):
    """``read(conn)`` of the SQLite file at ``path`` opened read-only, or None when there is
    no file or ``read`` finds it is not what it should be (another schema, bundle or
    machine; corrupt): then the file is removed, to be written again."""
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            value = read(conn)
        finally:
            conn.close()
    except (sqlite3.Error, KeyError, ValueError, TypeError, RecursionError, MemoryError):
        _remove(path)              # a bad index is discarded, and rebuilt by this command
        return None
    try:
        os.utime(path)             # least recently used goes first when the cache is full
    except OSError:
        pass
    return value


def store_blob(kind: str, digest: str, value) -> None:
    """Store a JSON value for ``kind`` and this content hash (atomically; silently not when
    the cache cannot be written)."""
    def fill(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.executemany("INSERT INTO meta VALUES (?, ?)",
                         [("schema", SCHEMA), ("bundle", f"{kind}:{digest}"),
                          ("value", json.dumps(value, separators=(",", ":")))])
    _write_sqlite(_blob_path(kind, digest), fill)


def _write_sqlite(path: Path, fill) -> None:
    """A SQLite file at ``path``, written whole or not at all: ``fill(conn)`` into a
    temporary file beside it, renamed into place (so a reader sees the old file, no file, or
    the complete new one); nothing when the cache cannot be written."""
    folder = path.parent
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
        fill(conn)
        conn.commit()
        conn.close()
        os.replace(tmp, path)
    except (sqlite3.Error, OSError, TypeError, ValueError, OverflowError):
        _remove(Path(tmp))
        return
    _prune(folder, keep=path)


def parse_iptables_save(text: str, name: str):
    """A node's iptables-save, read lazily (netfilter.iptables_parse.LazyChain): the first time,
    every line's shape is checked and where each chain's rules are is stored, keyed by the
    SHA-256 of the text; later commands take the layout from the index instead of passing over
    200,000 lines."""
    from traceflow.engines.netfilter.iptables_parse import from_save_layout, parse_iptables_save as parse
    from traceflow.engines.netfilter.iptables_parse import save_layout
    if not enabled():
        return parse(text, name, lazy=True)
    digest = _text_digest(text)
    layout = load_blob("iptables-save", digest)
    if layout is not None:
        try:
            return from_save_layout(text, name, layout)
        except (ValueError, TypeError, KeyError, IndexError):
            pass                       # a layout that does not fit: read the file
    ruleset = parse(text, name, lazy=True)
    if STORE_AT_ONCE:
        layout = save_layout(ruleset)
        if layout is not None:
            store_blob("iptables-save", digest, layout)
    else:           # after the command answered (as flow layouts)
        _later_store("iptables-save", digest, ruleset, save_layout)
    return ruleset


def parse_nft_ruleset(text: str, name: str):
    """A node's ``nft list ruleset``, read lazily (netfilter.nft_lazy): the first time, one
    pass over the lines finds where each table, chain, set and map is, and that layout is
    stored keyed by the SHA-256 of the text; later commands take it from the index (checked
    against the text: a layout that does not fit is ignored and the text read again)."""
    from traceflow.engines.netfilter.nft_lazy import from_layout, open_nft_ruleset
    if not enabled():
        return open_nft_ruleset(text, name)
    digest = _text_digest(text)
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


def text_layout(kind: str, text: str, build):
    """A node file's layout (a JSON value: where the lines of each key are, e.g. a CNI's BPF
    map dump read by key), keyed by the SHA-256 of its text like the iptables layouts: the
    stored one, else ``build(text)`` now, stored after the command answered. ``build`` gives
    None for a file it does not lay out (nothing is stored). The caller checks that a stored
    layout fits its text."""
    if not enabled():
        return build(text)
    digest = _text_digest(text)
    layout = load_blob(kind, digest, walked=False)
    if isinstance(layout, dict):
        return layout
    layout = build(text)
    if layout is not None:
        if STORE_AT_ONCE:
            store_blob(kind, digest, layout)
        else:
            _later_store(kind, digest, layout, lambda value: value, held=True)
    return layout


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
    digest = hashlib.sha256()
    step = 1 << 20
    for start in range(0, len(text), step):
        digest.update(text[start:start + step].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def load_flow_dump(text: str, name: str):
    """A node's FlowDump: from its stored layout when there is one that fits the text, else
    read from the text (and its layout stored for the next command)."""
    from traceflow.engines.ovs.flows import FlowDump
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
            _later(dump, path, digest, dump.indexed_tables())
            return dump
    dump = FlowDump(text, name)
    dump.digest = digest
    if STORE_AT_ONCE:                  # every big table indexed and stored now
        try:
            layout = dump.layout()
        except (ValueError, TypeError, KeyError, IndexError, OverflowError):
            layout = None
        if layout is not None:
            _store_flow_layout(path, digest, layout)
        return dump
    _later(dump, path, digest, -1)
    return dump


# Flow layouts are stored after the command has answered (atexit), with the indexes of the
# tables its walks visited only: building every big table's index first would put a pass
# over every line of every table before the answer. A layout loaded by a later command that
# visits more tables is stored again, with theirs.
_PENDING: list = []
# everything located, indexed and stored as soon as a file is read (the index's own tests);
# else a command stores what it located and indexed after it answers
STORE_AT_ONCE = False


def _later(dump, path: Path, digest: str, indexed: int) -> None:
    import weakref
    if not (_PENDING or _PENDING_K8S or _PENDING_BLOBS):
        import atexit
        atexit.register(store_pending)
    # weakly: a dump nobody uses any more (a long test session's) is not kept for this
    _PENDING.append((weakref.ref(dump), path, digest, indexed))


_PENDING_BLOBS: list = []


def _later_store(kind: str, digest: str, source, make, held: bool = False) -> None:
    """Store ``make(source)`` as blob ``kind``/``digest`` after the command answered;
    ``source`` is held weakly, or (``held``) kept until then."""
    import weakref
    if not (_PENDING or _PENDING_K8S or _PENDING_BLOBS):
        import atexit
        atexit.register(store_pending)
    _PENDING_BLOBS.append((kind, digest, (lambda: source) if held else weakref.ref(source),
                           make))


def store_pending() -> None:
    """Store what this command learnt about its bundle (after it answered: atexit): the
    Kubernetes files it located, the flow dumps that gained an index, the rulesets' layouts."""
    while _PENDING_BLOBS:
        kind, digest, ref, make = _PENDING_BLOBS.pop()
        source = ref()
        value = make(source) if source is not None else None
        if value is not None:
            store_blob(kind, digest, value)
    _store_k8s_layouts()
    while _PENDING:
        ref, path, digest, indexed = _PENDING.pop()
        dump = ref()
        if dump is None or dump.indexed_tables() <= indexed:
            continue                   # nothing new since it was loaded
        try:
            layout = dump.layout(built_only=True)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError):
            layout = None              # not laid out: read every time, as without an index
        if layout is not None:
            _store_flow_layout(path, digest, layout)


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

    def fill(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value)")
        conn.execute("CREATE TABLE tables (seq INTEGER, name TEXT, numbers BLOB, field TEXT, "
                     "values_low BLOB, values_high BLOB, prios BLOB, indexed BLOB, "
                     "rest_prios BLOB, rest_numbers BLOB)")
        conn.executemany("INSERT INTO tables VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO meta VALUES (?, ?)",
                         [("schema", SCHEMA), ("bundle", f"{_FLOWS_KIND}:{digest}"),
                          ("byteorder", sys.byteorder), ("lines", layout["lines"]),
                          ("skipped", skipped)])
    _write_sqlite(path, fill)


def _load_flow_layout(path: Path, digest: str) -> dict | None:
    """The stored layout of the dump with this digest, or None (absent; foreign, corrupt or
    from a machine of another byte order: then removed, to be rebuilt)."""
    import sys

    def read(conn: sqlite3.Connection) -> dict:
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        if meta.get("schema") != SCHEMA or meta.get("bundle") != f"{_FLOWS_KIND}:{digest}" \
                or meta.get("byteorder") != sys.byteorder or type(meta.get("lines")) is not int:
            raise ValueError("not this dump's layout")
        rows = conn.execute("SELECT name, numbers, field, values_low, values_high, prios, "
                            "indexed, rest_prios, rest_numbers FROM tables ORDER BY seq")
        tables = [_table_from_row(*row) for row in rows]
        return {"lines": meta["lines"], "skipped": _unpack(meta["skipped"], _NUMBERS),
                "tables": tables}
    return _read_sqlite(path, read)


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
