"""Service load-balancing inputs: `bpf lb list` (and `--frontends`), `service list`,
`bpf lb maglev list`; the 1.17+ statedb tables `db/show frontends|backends|services` are read
in statedb.py (and reachable from here).

`bpf lb list` is the map from-container's lb4_lookup_service reads. Its text is a Go map
printed in random order; from 1.16 every slot of a service is its own line (the slot is part of
the key), so backends are grouped by the key (address, port, protocol, scope) parsed from each
line, never by the line they follow. Before 1.16 a key line is followed by indented
continuation lines of the same key (Cilium's TablePrinter), which is the only place position
counts. Per version:

  <=1.11   SERVICE ADDRESS   BACKEND ADDRESS
           10.96.0.10:53     0.0.0.0:0 (5) [ClusterIP]          slot 0: the service itself
                             10.0.1.5:53 (5)                     a backend (slot not printed)
  1.12-15  ... BACKEND ADDRESS (REVNAT_ID) (SLOT); entries ``IP:port (revnat) (slot)``
  1.16     key ``10.96.0.10:53 (1)``: one line per slot
  1.17+    key and backend carry the protocol ``10.96.0.10:53/UDP (1)  10.0.1.5:53/UDP (5) (1)``,
           slot 0 may end in ``(L7LB Proxy Port: N)``; `/i` after the key marks internal scope.
"""

from __future__ import annotations

import re

from traceflow.model.errors import InputError, Source

from .common import (ADDR, PROTO, PROTOS, SERVICE_TYPES, bad, ip as _ip, is_json, json_error,
                     json_source, lines, load_json)
from .records import LbBackend, LbFrontendSlot, LbService, MaglevTable

_PROTO = PROTO

_KEY = re.compile(r"^" + ADDR.replace("?P<ip>", "?P<kip>").replace("?P<port>", "?P<kport>")
                  + _PROTO.format("kproto") + r"(?P<kscope>/i)?(?:\s\((?P<kslot>\d+)\))?$")
_MASTER = re.compile(r"^(?:0\.0\.0\.0|\[::\]|::):0\s+\((?P<revnat>\d+)\)(?:\s+\((?P<slot>\d+)\))?"
                     r"(?:\s+\[(?P<flags>[^\]]*)\])?"
                     r"(?:\s+\(L7LB Proxy Port: (?P<l7>\d+)\))?$")
_BACKEND = re.compile(r"^" + ADDR + _PROTO.format("proto")
                      + r"\s+\((?P<revnat>\d+)\)(?:\s+\((?P<slot>\d+)\))?$")
_NOT_FOUND = re.compile(r"^backend (?P<id>\d+) not found$")


_KNOWN_PROTOS = frozenset(x.upper() for x in PROTOS)


def _check_proto(p: str | None, src) -> str | None:
    if p is not None and p.upper() not in _KNOWN_PROTOS:
        raise bad(src, "cilium bpf lb list", f"unknown protocol {p!r}")
    return p


def _split_key_value(src: Source, line: str):
    """`KEY<spaces>VALUE` of a TablePrinter row; the key itself may contain one space before
    its ``(slot)``."""
    m = re.match(r"^(?P<key>\S+(?:\s\(\d+\))?)\s+(?P<value>.+?)\s*$", line)
    if not m:
        raise bad(src, "cilium bpf lb list")
    return m.group("key"), m.group("value")


def parse_lb_list(text: str, path: str, version=None) -> list[LbService]:
    """`cilium bpf lb list` (text, or its `-o json` map of key -> entries), every version."""
    if is_json(text):
        return _lb_list_json(text, path)
    rows = []           # (Source, key text, value text)
    key = None
    header_seen = False
    for src in lines(text, path):
        line = src.text.rstrip()
        if not header_seen:
            if re.match(r"^SERVICE ADDRESS\s+BACKEND ADDRESS(?:\s+\(REVNAT_ID\)\s+\(SLOT\))?\s*$",
                        line):
                header_seen = True
                continue
            if re.match(r"^SERVICE ADDRESS\s+BACKEND ID\s*$", line):
                raise InputError.at(src, "this is `cilium bpf lb list --frontends` output; "
                                         "read it with parse_lb_frontends")
            raise bad(src, "cilium bpf lb list", "expected the header "
                      "`SERVICE ADDRESS   BACKEND ADDRESS ...`")
        if line[:1].isspace():                      # continuation: same key as the row above
            if key is None:
                raise bad(src, "cilium bpf lb list", "a continuation line with no key above")
            rows.append((src, key, line.strip()))
            continue
        key, value = _split_key_value(src, line)
        rows.append((src, key, value))
    return _group(rows, path)


def _lb_list_json(text: str, path: str) -> list[LbService]:
    data = load_json(text, path)
    if not isinstance(data, dict) or not all(
            isinstance(v, list) and all(isinstance(e, str) for e in v) for v in data.values()):
        raise json_error(path, "top level", "expected an object of service key -> list of "
                                            "entry strings (`cilium bpf lb list -o json`)")
    rows = []
    n = 0
    for key in data:
        for entry in data[key]:
            n += 1
            rows.append((json_source(path, n, {key: entry}), key, entry))
    return _group(rows, path)


def _group(rows, path: str) -> list[LbService]:
    groups: dict[tuple, dict] = {}
    for src, key_text, value in rows:
        value = value.strip()       # Cilium ends a slot-0 entry with a space when no L7 port
        k = _KEY.match(key_text.strip())
        if not k:
            raise bad(src, "cilium bpf lb list", f"key {key_text!r} is not ADDRESS:PORT")
        gkey = (_ip(k.group("kip")), int(k.group("kport")),
                _check_proto(k.group("kproto"), src), "internal" if k.group("kscope") else "external")
        g = groups.setdefault(gkey, {"master": None, "slots": {}, "unslotted": [], "missing": [],
                                     "sources": []})
        g["sources"].append(src)
        key_slot = int(k.group("kslot")) if k.group("kslot") is not None else None
        m = _MASTER.match(value)
        if m:
            slot = _slot(key_slot, m.group("slot"), src)
            if slot not in (None, 0):
                raise bad(src, "cilium bpf lb list", "the service entry 0.0.0.0:0 in a slot other than 0")
            if g["master"] is not None:
                raise InputError.at(src, f"a second slot-0 entry for service {key_text.split()[0]} "
                                         f"(first at line {g['master'][0].line})")
            g["master"] = (src, m)
            continue
        m = _NOT_FOUND.match(value)
        if m:
            g["missing"].append((key_slot, int(m.group("id"))))
            continue
        m = _BACKEND.match(value)
        if not m:
            raise bad(src, "cilium bpf lb list", f"entry {value!r} is neither the service "
                      "(0.0.0.0:0 (revnat) [flags]) nor a backend (IP:port (revnat) (slot))")
        slot = _slot(key_slot, m.group("slot"), src)
        be = LbBackend(_ip(m.group("ip")), int(m.group("port")),
                       _check_proto(m.group("proto"), src), None, slot, src,
                       rev_nat=int(m.group("revnat")))
        if slot is None:
            g["unslotted"].append(be)
        elif slot in g["slots"]:
            raise InputError.at(src, f"slot {slot} of service {key_text.split()[0]} appears twice "
                                     f"(first at line {g['slots'][slot].source.line})")
        else:
            g["slots"][slot] = be
    out = []
    for (fip, fport, proto, scope), g in groups.items():
        if g["master"] is None:
            first = g["sources"][0]
            raise InputError.at(first, f"backend slots of {fip}:{fport} but no slot-0 entry "
                                       "(0.0.0.0:0 ... [flags]) for the service itself")
        src, m = g["master"]
        flags = tuple(f.strip() for f in (m.group("flags") or "").split(",") if f.strip())
        kind = next((f for f in flags if f in SERVICE_TYPES), None)
        # protocol None (<=1.16): the key has none, TCP and UDP of one port share the entry
        backends = tuple(g["slots"][s] for s in sorted(g["slots"])) + tuple(g["unslotted"])
        out.append(LbService(fip, fport, proto, kind, backends, src,
                             flags=tuple(f for f in flags if f != kind), scope=scope,
                             rev_nat=int(m.group("revnat")),
                             l7_proxy_port=int(m.group("l7")) if m.group("l7") else None,
                             missing=tuple(g["missing"]), sources=tuple(g["sources"])))
    return out


def _slot(key_slot, value_slot, src) -> int | None:
    vs = int(value_slot) if value_slot is not None else None
    if key_slot is not None and vs is not None and key_slot != vs:
        raise bad(src, "cilium bpf lb list", f"slot {key_slot} in the key but {vs} in the entry")
    return key_slot if key_slot is not None else vs


# ---- --frontends ------------------------------------------------------------------------------

_FRONTEND_VALUE = re.compile(
    r"^(?P<beid>\d+)(?:\s+(?P<count>\d+)(?:\[(?P<qcount>\d+)\])?)?\s+\((?P<revnat>\d+)\)\s+"
    r"\[(?:FLAGS:\s*(?P<oflags>0x[0-9a-fA-F]+)|(?P<flags>0x[0-9a-fA-F]+)\s+(?P<flags2>0x[0-9a-fA-F]+))\]$")


def parse_lb_frontends(text: str, path: str, version=None) -> list[LbFrontendSlot]:
    """`cilium bpf lb list --frontends`: the raw service map, one entry per (key, slot); the only
    output that shows a service's backend ``count`` (and ``qcount``, 1.16+)."""
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, dict):
            raise json_error(path, "top level", "expected an object of key -> entries")
        rows = [(json_source(path, i, {k: e}), k, e)
                for i, (k, e) in enumerate(((k, e) for k, v in data.items() for e in v), 1)]
    else:
        rows, key, header = [], None, False
        for src in lines(text, path):
            line = src.text.rstrip()
            if not header:
                if not re.match(r"^SERVICE ADDRESS\s+BACKEND ID\s*$", line):
                    raise bad(src, "cilium bpf lb list --frontends",
                              "expected the header `SERVICE ADDRESS   BACKEND ID`")
                header = True
                continue
            if line[:1].isspace():
                if key is None:
                    raise bad(src, "cilium bpf lb list --frontends")
                rows.append((src, key, line.strip()))
                continue
            key, value = _split_key_value(src, line)
            rows.append((src, key, value))
    return frontend_slots(rows)


def frontend_slots(rows) -> list[LbFrontendSlot]:
    """The `--frontends` slots of (Source, key text, value text) rows."""
    out = []
    for src, key, value in rows:
        k = _KEY.match(key.strip())
        m = _FRONTEND_VALUE.match(value.strip()) if k else None
        if not m:
            raise bad(src, "cilium bpf lb list --frontends")
        out.append(LbFrontendSlot(
            _ip(k.group("kip")), int(k.group("kport")), k.group("kproto"),
            "internal" if k.group("kscope") else "external",
            int(k.group("kslot")) if k.group("kslot") else None, int(m.group("beid")),
            int(m.group("count")) if m.group("count") else None,
            int(m.group("qcount")) if m.group("qcount") else None, int(m.group("revnat")),
            int(m.group("flags") or m.group("oflags"), 16),
            int(m.group("flags2"), 16) if m.group("flags2") else None, src))
    return out


# ---- service list -----------------------------------------------------------------------------

_SVC_ADDR = ADDR + _PROTO.format("proto") + r"(?P<scope>/i)?"
_SERVICE_HEAD = re.compile(r"^(?P<id>\d+)\s+" + _SVC_ADDR
                           + r"\s+(?P<type>[A-Za-z]+)(?:\s+(?P<rest>.*?))?\s*$")
_SERVICE_BACKEND = re.compile(r"^(?P<n>\d+)\s+=>\s+" + ADDR + _PROTO.format("proto")
                              + r"(?:\s+\((?P<state>[a-z-]+)\))?(?P<pref>\s+\(preferred\))?\s*$")


def parse_service_list(text: str, path: str, version=None) -> list[LbService]:
    """`cilium service list`: ``ID Frontend Service-Type Backend`` with ``N => IP:port/PROTO
    (state)`` backends continuing on the following lines; 1.8 prints no protocol or state,
    1.14+ may add ``(preferred)``. Also its `-o json` form."""
    if is_json(text):
        return _service_list_json(text, path)
    services: list[dict] = []
    header = False
    for src in lines(text, path):
        line = src.text.strip()
        if not header:
            if not re.match(r"^ID\s+Frontend\s+Service Type\s+Backend\s*$", line):
                raise bad(src, "cilium service list",
                          "expected the header `ID  Frontend  Service Type  Backend`")
            header = True
            continue
        m = _SERVICE_HEAD.match(line)
        if m:
            services.append({"m": m, "src": src, "backends": [], "sources": [src]})
            rest = (m.group("rest") or "").strip()
            if rest:
                services[-1]["backends"].append(_service_backend(rest, src))
            continue
        if services and src.text[:1].isspace():
            services[-1]["backends"].append(_service_backend(line, src))
            services[-1]["sources"].append(src)
            continue
        raise bad(src, "cilium service list")
    out = []
    for s in services:
        m = s["m"]
        if m.group("type") not in SERVICE_TYPES:
            raise bad(s["src"], "cilium service list", f"unknown service type {m.group('type')!r}")
        out.append(LbService(_ip(m.group("ip")), int(m.group("port")), m.group("proto"),
                             m.group("type"), tuple(s["backends"]), s["src"],
                             service_id=int(m.group("id")),
                             scope="internal" if m.group("scope") else "external",
                             rev_nat=int(m.group("id")), sources=tuple(s["sources"])))
    return out


def _service_backend(text: str, src: Source) -> LbBackend:
    m = _SERVICE_BACKEND.match(text)
    if not m:
        raise bad(src, "cilium service list", "expected a backend `N => IP:port/PROTO (state)`")
    return LbBackend(_ip(m.group("ip")), int(m.group("port")), m.group("proto"), m.group("state"),
                     int(m.group("n")), src, preferred=bool(m.group("pref")))


def _service_list_json(text: str, path: str) -> list[LbService]:
    data = load_json(text, path)
    if not isinstance(data, list):
        raise json_error(path, "top level", "expected a list of services (`service list -o json`)")
    out = []
    for i, svc in enumerate(data, 1):
        src = json_source(path, i, svc)
        try:
            spec = (svc.get("status") or {}).get("realized") or svc["spec"]
            fe = spec["frontend-address"]
            flags = spec.get("flags") or {}
            backends = []
            for n, be in enumerate(spec.get("backend-addresses") or [], 1):
                backends.append(LbBackend(be["ip"], int(be["port"]), be.get("protocol"),
                                          be.get("state"), n, src,
                                          preferred=bool(be.get("preferred")),
                                          weight=be.get("weight")))
            kind = flags.get("type")
            name = (f"{flags['namespace']}/{flags['name']}"
                    if flags.get("name") and flags.get("namespace") else flags.get("name"))
            out.append(LbService(fe["ip"], int(fe["port"]), fe.get("protocol"), kind,
                                 tuple(backends), src, service_id=spec.get("id"), name=name,
                                 scope="internal" if fe.get("scope") == "internal" else "external",
                                 rev_nat=spec.get("id"),
                                 traffic_policy=flags.get("extTrafficPolicy")
                                 or flags.get("trafficPolicy"),
                                 sources=(src,)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise json_error(path, f"service {i}", f"missing or bad field {e}") from None
    return out


# ---- maglev -----------------------------------------------------------------------------------

_MAGLEV = re.compile(r"^\[?(?P<id>\d+)\]?(?:/(?P<fam>v[46]))?\s+(?P<ids>\[[\d ]*\])\s*$")


def parse_maglev_list(text: str, path: str, version=None) -> list[MaglevTable]:
    """`cilium bpf lb maglev list`: ``SVC ID   LOOKUP TABLE`` rows ``[4]/v4   [1 2 1 ...]``: per
    service (rev-NAT id) the lookup table of backend ids, each as often as its share."""
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, dict):
            raise json_error(path, "top level", "expected an object of service id -> lookup table")
        out = []
        for i, (k, v) in enumerate(data.items(), 1):
            src = json_source(path, i, {k: v})
            ids = v if isinstance(v, list) else [v]
            try:
                backend_ids = tuple(int(x) for s in ids for x in re.split(r"[\s,\[\]]+", str(s)) if x)
                sid, _, fam = str(k).partition("/")
                out.append(MaglevTable(int(sid.strip("[]")), backend_ids, src, fam or "v4"))
            except ValueError:
                raise json_error(path, f"key {k}", "not a service id with backend ids") from None
        return out
    out = []
    header = False
    for src in lines(text, path):
        line = src.text.strip()
        if not header:
            if not re.match(r"^SVC ID\s+(LOOKUP TABLE|LUT)\s*$", line):
                raise bad(src, "cilium bpf lb maglev list",
                          "expected the header `SVC ID   LOOKUP TABLE`")
            header = True
            continue
        m = _MAGLEV.match(line)
        if not m:
            raise bad(src, "cilium bpf lb maglev list")
        ids = tuple(int(x) for x in re.split(r"[\s,\[\]]+", m.group("ids")) if x)
        out.append(MaglevTable(int(m.group("id")), ids, src, m.group("fam") or "v4"))
    return out


# the statedb tables live in statedb.py; their parsers are part of this module's API too
from .statedb import parse_db_backends, parse_db_frontends, parse_db_services  # noqa: E402,F401
