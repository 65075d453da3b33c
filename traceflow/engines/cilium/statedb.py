"""The 1.17+ statedb load-balancing tables: `cilium-dbg shell -- db/show frontends|backends|
services`, as the table (columns located from the header) or ``--format=json`` (JSON objects one
after another, shaped as in Cilium's pkg/loadbalancer/tests/testdata/marshalling.txtar).

The frontends table shows at most 5 backends (``+ N more ...``): such a service comes back with
``truncated = N``, never as a silent partial list; the JSON form is complete.
"""

from __future__ import annotations

import json
import re

from traceflow.model.errors import InputError, Source

from .common import (ADDR, PROTO as _PROTO, SERVICE_TYPES, bad, ip as _ip, is_json, json_error,
                     json_source, lines, load_json)
from .records import DbBackend, DbService, LbBackend, LbService


def _table(text: str, path: str, required: tuple, what: str):
    """Rows of a `db/show` table as (Source, {column: cell}); columns are located from the
    header (tabwriter pads every cell to the column start)."""
    it = iter(lines(text, path))
    first = next(it, None)
    if first is None:
        return []
    cols = [(m.start(), m.group(0)) for m in re.finditer(r"\S+", first.text)]
    names = [c for _, c in cols]
    if any(r not in names for r in required):
        raise bad(first, what, f"expected a header with the columns {', '.join(required)}")
    rows = []
    for src in it:
        row = {}
        for i, (start, col) in enumerate(cols):
            end = cols[i + 1][0] if i + 1 < len(cols) else None
            cell = src.text[start:end] if len(src.text) > start else ""
            # a cell never starts mid-word: if the column start splits a word, the row is not
            # aligned with the header
            if start > 0 and len(src.text) > start and not src.text[start - 1].isspace() \
                    and not src.text[start].isspace():
                raise bad(src, what, f"column {col!r} does not line up with the header")
            row[col] = cell.strip()
        rows.append((src, row))
    return rows


_CELL_ADDR = re.compile(r"^" + ADDR + _PROTO.format("proto") + r"(?P<scope>/i)?"
                        r"(?:\s+\((?P<state>[a-z-]+)\))?$")


def _addr(cell: str, src: Source, what: str):
    m = _CELL_ADDR.match(cell.strip())
    if not m:
        raise bad(src, what, f"{cell!r} is not ADDRESS:PORT/PROTO")
    return m


def parse_db_frontends(text: str, path: str, version=None) -> list[LbService]:
    """`cilium-dbg shell -- db/show frontends` (1.17+): the table or ``--format=json``.

    The table shows at most 5 backends per frontend (``+ N more ...``): such services come back
    with ``truncated = N`` (the backends shown are only a part); collect the JSON form."""
    if is_json(text):
        return _db_json(text, path, _frontend_from_json)
    what = "db/show frontends"
    out = []
    for src, row in _table(text, path, ("Address", "Type", "ServiceName", "Backends"), what):
        m = _addr(row["Address"], src, what)
        cell = row.get("Backends", "")
        truncated = 0
        t = re.search(r"\s*\+\s*(\d+)\s+more\s*\.\.\.\s*$", cell)
        if t:
            truncated = int(t.group(1))
            cell = cell[:t.start()]
        backends = []
        for n, b in enumerate((b for b in cell.split(",") if b.strip()), 1):
            bm = _addr(b, src, what)
            backends.append(LbBackend(_ip(bm.group("ip")), int(bm.group("port")),
                                      bm.group("proto"), bm.group("state"), None, src))
        if row["Type"] not in SERVICE_TYPES:
            raise bad(src, what, f"unknown frontend type {row['Type']!r}")
        out.append(LbService(_ip(m.group("ip")), int(m.group("port")), m.group("proto"),
                             row["Type"], tuple(backends), src, name=row.get("ServiceName") or None,
                             scope="internal" if m.group("scope") else "external",
                             truncated=truncated, sources=(src,)))
    return out


def _db_json(text: str, path: str, build):
    """A `db/show --format=json` document: a JSON array, or JSON objects one after another."""
    objs = []
    if text.lstrip().startswith("["):
        data = load_json(text, path)
        objs = data
    else:
        dec = json.JSONDecoder()
        pos, s = 0, text
        while True:
            while pos < len(s) and s[pos].isspace():
                pos += 1
            if pos >= len(s):
                break
            try:
                obj, pos = dec.raw_decode(s, pos)
            except RecursionError:
                raise InputError("JSON nested too deeply", path) from None
            except json.JSONDecodeError as e:
                line = s.count("\n", 0, e.pos) + 1
                raise InputError(f"not valid JSON: {e.msg}", path, line,
                                 s.splitlines()[line - 1] if s.splitlines() else "") from None
            objs.append(obj)
    out = []
    for i, obj in enumerate(objs, 1):
        if not isinstance(obj, dict):
            raise json_error(path, f"object {i}", "expected a JSON object")
        try:
            out.append(build(obj, json_source(path, i, obj)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise json_error(path, f"object {i}", f"missing or bad field {e}") from None
    return out


def _json_addr(v):
    """An address in statedb JSON: "10.0.0.1:80/TCP" or {"AddrCluster"/"Addr", "Port", "Protocol"}."""
    if isinstance(v, str):
        m = _CELL_ADDR.match(v)
        if not m:
            raise ValueError(v)
        return _ip(m.group("ip")), int(m.group("port")), m.group("proto"), \
            "internal" if m.group("scope") else "external"
    addr = v.get("AddrCluster", v.get("Addr", v.get("IP")))
    scope = v.get("Scope", 0)
    return (_ip(str(addr)), int(v["Port"]), v.get("Protocol"),
            "internal" if scope in (1, "internal", "i") else "external")


def _name(v):
    if isinstance(v, str) or v is None:
        return v
    return f"{v['Namespace']}/{v['Name']}" if v.get("Namespace") else v["Name"]


# BackendState numbers in statedb JSON (pkg/loadbalancer BackendState)
_STATES = {0: "active", 1: "terminating", 2: "quarantined", 3: "maintenance",
           4: "terminating-not-serving"}


def _state(b: dict) -> str | None:
    st = b.get("State")
    if b.get("Unhealthy") is True:
        return "quarantined"
    if isinstance(st, int):
        if st not in _STATES:
            raise ValueError(f"State {st}")
        return _STATES[st]
    return st if isinstance(st, str) else None


def _frontend_from_json(obj: dict, src: Source) -> LbService:
    fip, fport, proto, scope = _json_addr(obj["Address"])
    if "Backends" not in obj:
        raise KeyError("Backends")
    backends = []
    for n, b in enumerate(obj.get("Backends") or [], 1):
        bip, bport, bproto, _ = _json_addr(b["Address"] if isinstance(b, dict) else b)
        backends.append(LbBackend(bip, bport, bproto, _state(b) if isinstance(b, dict) else None,
                                  None, src, weight=b.get("Weight") if isinstance(b, dict) else None))
    kind = obj.get("Type")
    if kind not in SERVICE_TYPES:
        raise ValueError(f"Type {kind!r}")
    return LbService(fip, fport, proto, kind, tuple(backends), src,
                     name=_name(obj.get("ServiceName")), scope=scope, sources=(src,),
                     service_id=obj.get("ID"))


def parse_db_backends(text: str, path: str, version=None) -> list[DbBackend]:
    """`db/show backends` (1.17+), table or JSON: address, state, the services it serves."""
    what = "db/show backends"
    if is_json(text):
        def build(obj, src):
            bip, bport, bproto, _ = _json_addr(obj["Address"])
            inst = obj.get("Instances") or obj.get("ReferencedBy") or []
            names, state, node = [], _state(obj), obj.get("NodeName")
            for x in (inst if isinstance(inst, list) else list(inst)):
                if isinstance(x, dict) and "k" in x:     # {"k": {ServiceName}, "v": {State ...}}
                    names.append(_name(x["k"]["ServiceName"]))
                    state = state or _state(x.get("v") or {})
                    node = node or (x.get("v") or {}).get("NodeName")
                else:
                    names.append(_name(x) if isinstance(x, dict) else str(x))
            return DbBackend(bip, bport, bproto, state, tuple(names), node, src)
        return _db_json(text, path, build)
    out = []
    for src, row in _table(text, path, ("Address",), what):
        m = _addr(row["Address"], src, what)
        refs = row.get("Instances", row.get("ReferencedBy", row.get("Service", "")))
        names = tuple(re.sub(r"\s*[\[(].*$", "", r).strip() for r in refs.split(", ") if r.strip())
        state = row.get("State") or None
        if state is None and "Instances" in row:
            # 1.18+ marks a non-active instance "default/web [terminating] (http)"
            st = re.search(r"\[([a-z-]+)\]", refs)
            state = st.group(1) if st else "active"
        out.append(DbBackend(_ip(m.group("ip")), int(m.group("port")), m.group("proto"),
                             state, names, row.get("NodeName") or None, src))
    return out


def parse_db_services(text: str, path: str, version=None) -> list[DbService]:
    """`db/show services` (1.17+), table or JSON: traffic policies and session affinity."""
    what = "db/show services"
    if is_json(text):
        def build(obj, src):
            if not isinstance(obj.get("SessionAffinity", False), bool):
                raise ValueError("SessionAffinity")
            return DbService(_name(obj["Name"]), obj.get("ExtTrafficPolicy"),
                             obj.get("IntTrafficPolicy"), bool(obj.get("SessionAffinity")),
                             str(obj.get("SessionAffinityTimeout")) if obj.get("SessionAffinity")
                             else None, (), src)
        return _db_json(text, path, build)
    out = []
    for src, row in _table(text, path, ("Name", "Source"), what):
        if "TrafficPolicy" in row:
            tp = row["TrafficPolicy"]
            m = re.match(r"^Ext=(\w+), Int=(\w+)$", tp)
            ext, int_ = (m.group(1), m.group(2)) if m else (tp or None, tp or None)
        elif "ExtTrafficPolicy" in row:
            ext, int_ = row.get("ExtTrafficPolicy") or None, row.get("IntTrafficPolicy") or None
        else:
            raise bad(src, what, "no TrafficPolicy column")
        flags = tuple(f.strip() for f in re.split(r",\s*(?=[A-Z][A-Za-z]+=)", row.get("Flags", ""))
                      if f.strip())
        aff = next((f.split("=", 1)[1] for f in flags if f.startswith("SessionAffinity=")), None)
        if aff is None and row.get("SessionAffinity"):
            aff = row["SessionAffinity"]
        out.append(DbService(row["Name"], ext, int_, aff is not None, aff, flags, src))
    return out
