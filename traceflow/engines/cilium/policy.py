"""`cilium bpf policy get --all -n`: every endpoint's policy map, the table
`__policy_can_access` consults. Columns by version (read from the header, so each layout is
recognised, and a header traceflow does not know is an error):

  1.0        DIRECTION  LABELS (source:key[=value])  PORT/PROTO  BYTES  PACKETS
  <=1.5      DIRECTION  IDENTITY  PORT/PROTO  PROXY PORT  BYTES  PACKETS
  1.6-1.13   DIRECTION  LABELS (source:key[=value]) | IDENTITY (-n)  PORT/PROTO  PROXY PORT
             BYTES  PACKETS                          (1.9+ may lead with POLICY for deny entries)
  1.14-1.16  POLICY  DIRECTION  LABELS|IDENTITY  PORT/PROTO  PROXY PORT  AUTH TYPE  BYTES
             PACKETS  PREFIX
  1.17+      ... PREFIX  COOKIE; counters may print ``-``; wildcard identity ``ANY``

`--all` prints each map under ``Endpoint ID: N`` / ``Path: ...`` (older: the map path ending in
``:``). Without ``-n`` a row's further labels continue on lines holding only a label.
"""

from __future__ import annotations

import re

from traceflow.model.errors import InputError

from .common import bad, is_json, lines
from .records import PolicyEntry

_TITLES = ["POLICY", "DIRECTION", "IDENTITY", "LABELS (source:key[=value])", "PORT/PROTO",
           "PROXY PORT", "AUTH TYPE", "BYTES", "PACKETS", "PREFIX", "COOKIE"]
_KNOWN_LAYOUTS = {
    ("DIRECTION", "LABELS (source:key[=value])", "PORT/PROTO", "BYTES", "PACKETS"),     # 1.0
    ("DIRECTION", "IDENTITY", "PORT/PROTO", "PROXY PORT", "BYTES", "PACKETS"),
    ("DIRECTION", "LABELS (source:key[=value])", "PORT/PROTO", "PROXY PORT", "BYTES", "PACKETS"),
    ("POLICY", "DIRECTION", "IDENTITY", "PORT/PROTO", "PROXY PORT", "BYTES", "PACKETS"),
    ("POLICY", "DIRECTION", "LABELS (source:key[=value])", "PORT/PROTO", "PROXY PORT", "BYTES",
     "PACKETS"),
    ("POLICY", "DIRECTION", "IDENTITY", "PORT/PROTO", "PROXY PORT", "AUTH TYPE", "BYTES",
     "PACKETS", "PREFIX"),
    ("POLICY", "DIRECTION", "LABELS (source:key[=value])", "PORT/PROTO", "PROXY PORT",
     "AUTH TYPE", "BYTES", "PACKETS", "PREFIX"),
    ("POLICY", "DIRECTION", "IDENTITY", "PORT/PROTO", "PROXY PORT", "AUTH TYPE", "BYTES",
     "PACKETS", "PREFIX", "COOKIE"),
    ("POLICY", "DIRECTION", "LABELS (source:key[=value])", "PORT/PROTO", "PROXY PORT",
     "AUTH TYPE", "BYTES", "PACKETS", "PREFIX", "COOKIE"),
}
_RESERVED = {"reserved:host": 1, "reserved:world": 2, "reserved:unmanaged": 3,
             "reserved:health": 4, "reserved:init": 5, "reserved:remote-node": 6,
             "reserved:kube-apiserver": 7, "reserved:ingress": 8, "reserved:world-ipv4": 9,
             "reserved:world-ipv6": 10}
_PORT = re.compile(r"^(?:(?P<any>ANY)|(?P<p>\d+)(?:-(?P<e>\d+))?|(?P<anyp>ANY))"
                   r"(?:/(?P<proto>[A-Za-z0-9-]+))?$")


def _header(line: str):
    """The column titles of a header line, or None if it is not a policy table header."""
    rest, cols = line.strip(), []
    while rest:
        t = next((t for t in _TITLES if rest.startswith(t)), None)
        if t is None:
            return None
        cols.append(t)
        rest = rest[len(t):].lstrip()
    return tuple(cols)


def parse_policy_get(text: str, path: str, version=None) -> list[PolicyEntry]:
    """Every endpoint's policy-map entries (text form; `-n` recommended)."""
    if is_json(text):
        raise InputError("the JSON form of `cilium bpf policy get` is not read (its keys are in "
                         "network byte order with version-specific prefix lengths): collect "
                         "`cilium bpf policy get --all -n` as text", path)
    rows: list[list] = []
    cols = None
    endpoint = None
    map_name = None
    last = None             # last row: continuation label lines extend it
    for src in lines(text, path):
        line = src.text.rstrip()
        s = line.strip()
        m = re.match(r"^Endpoint ID:\s*(\d+)$", s)
        if m:
            endpoint, cols, last = int(m.group(1)), None, None
            continue
        m = re.match(r"^Path:\s*(\S+)$", s)
        if m:
            map_name = m.group(1)
            continue
        m = re.match(r"^(?P<path>\S*cilium_policy(?:_v2)?_(?P<id>\d+)):?$", s)
        if m:           # older --all: the map path names the endpoint
            map_name, endpoint, cols, last = m.group("path"), int(m.group("id")), None, None
            continue
        if s.startswith("Policy stats empty") or s == "no maps found":
            continue
        h = _header(s)
        if h is not None:
            if h not in _KNOWN_LAYOUTS:
                raise bad(src, "cilium bpf policy get", "a column layout traceflow does not know")
            cols = h
            continue
        if cols is None:
            raise bad(src, "cilium bpf policy get", "a row before any table header")
        tokens = s.split()
        if line[:1].isspace() and len(tokens) == 1 and last is not None \
                and "LABELS (source:key[=value])" in cols:
            last[1].append(tokens[0])          # a further label of the row above
            last[2].append(src)
            continue
        if len(tokens) != len(cols):
            raise bad(src, "cilium bpf policy get", f"{len(tokens)} cells under {len(cols)} columns")
        row = dict(zip(cols, tokens))
        last = [row, [], [src], endpoint, map_name]
        rows.append(last)
    return [_entry(*r) for r in rows]


def _num(v: str, src, col):
    if v == "-":
        return None
    if not v.isdigit():
        raise bad(src, "cilium bpf policy get", f"{col} {v!r} is not a number")
    return int(v)


def _entry(row: dict, more_labels: list, srcs: list, endpoint, map_name) -> PolicyEntry:
    src = srcs[0]
    direction = row["DIRECTION"].lower()
    if direction not in ("ingress", "egress"):
        raise bad(src, "cilium bpf policy get", f"direction {row['DIRECTION']!r}")
    verdict = row.get("POLICY", "Allow").lower()
    if verdict not in ("allow", "deny"):
        raise bad(src, "cilium bpf policy get", f"policy {row['POLICY']!r}")
    labels = None
    if "IDENTITY" in row:
        v = row["IDENTITY"]
        if v in ("ANY", "all", "reserved:unknown"):
            identity = None
        elif v.isdigit():
            identity = int(v) or None          # 0 is the wildcard identity
        else:
            raise bad(src, "cilium bpf policy get", f"identity {v!r} is not a number")
    else:
        first = row["LABELS (source:key[=value])"]
        all_labels = [first] + more_labels
        if first in ("ANY", "all", "reserved:unknown") or first.isdigit():
            identity = None if not first.isdigit() else (int(first) or None)
        elif len(all_labels) == 1 and first in _RESERVED:
            identity = _RESERVED[first]
        else:
            identity = None
            labels = " ".join(all_labels)
    pm = _PORT.match(row["PORT/PROTO"])
    if not pm:
        raise bad(src, "cilium bpf policy get", f"port {row['PORT/PROTO']!r}")
    port = int(pm.group("p")) if pm.group("p") else None
    port_end = int(pm.group("e")) if pm.group("e") else port
    proto = pm.group("proto")
    if proto is not None:
        proto = proto.upper()
        if proto == "ANY":
            proto = None
    if port == 0 and port_end in (0, None):
        port = port_end = None
    pp = row.get("PROXY PORT", "NONE")
    proxy = None if pp == "NONE" else _num(pp, src, "PROXY PORT")
    auth = row.get("AUTH TYPE")
    return PolicyEntry(endpoint, direction, identity, port, port_end, proto, verdict, src,
                       proxy_port=proxy or None,
                       prefix_len=_num(row["PREFIX"], src, "PREFIX") if "PREFIX" in row else None,
                       auth_type=None if auth in (None, "disabled") else auth, labels=labels,
                       bytes=_num(row["BYTES"], src, "BYTES"),
                       packets=_num(row["PACKETS"], src, "PACKETS"),
                       cookie=_num(row["COOKIE"], src, "COOKIE") if "COOKIE" in row else None,
                       map_name=map_name)
