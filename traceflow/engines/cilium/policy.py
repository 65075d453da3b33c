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
from .records import PolicyEntry, PolicyRows, UnreadableRow

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
# PORT/PROTO as `cilium bpf policy get` prints a key (pkg/maps/policymap/policymap.go
# PortProtoString, 1.17): ``ANY`` (prefix 0), a bare protocol ``TCP`` / ``47`` (prefix 8: the
# protocol, any port), ``80/TCP`` (the full prefix), ``8064-8095/TCP`` (a partial port prefix,
# 1.16+; 1.14 and 1.15 printed it ``0x1f80/11/TCP``: the port in hex, the port prefix bits);
# before 1.14 ``ANY`` for any port 0 and ``N/PROTO`` otherwise (ICMP types as the port). Protocols by name (u8proto: ANY, ICMP,
# TCP, UDP, ICMPv6, SCTP) or, for the others, by number.
_PORT = re.compile(r"^(?:(?:0x(?P<hex>[0-9a-fA-F]+)/(?P<bits>\d+)|(?P<p>\d+)(?:-(?P<e>\d+))?)/)?"
                   r"(?P<proto>[A-Za-z][A-Za-z0-9]*|\d+)$")
_INVALID = re.compile(r"<INVALID PREFIX LENGTH: (\d+)>")
_PROTO_NUMBERS = {"0": "ANY", "1": "ICMP", "6": "TCP", "17": "UDP", "58": "ICMPV6", "132": "SCTP"}
_PROTO_NAMES = ("ANY", "ICMP", "TCP", "UDP", "ICMPV6", "SCTP")


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


def parse_policy_get(text: str, path: str, version=None) -> PolicyRows:
    """Every endpoint's policy-map entries (text form; `-n` recommended), as PolicyRows: the
    entries, and ``.unreadable`` for the rows (or sections) traceflow cannot read. One
    unreadable row makes only the verdicts of its endpoint unknown (issue 22): it is kept,
    located, instead of refusing the file."""
    if is_json(text):
        raise InputError("the JSON form of `cilium bpf policy get` is not read (its keys are in "
                         "network byte order with version-specific prefix lengths): collect "
                         "`cilium bpf policy get --all -n` as text", path)
    return policy_rows(lines(text, path))


def policy_rows(sources) -> PolicyRows:
    """The entries and unreadable rows of `bpf policy get` lines (Sources, in file order):
    the whole file, or (traceflow.engines.cilium.keyed) the lines before the first map and
    the sections of one endpoint's maps; each section header starts afresh."""
    rows: list[list] = []
    unreadable: list[UnreadableRow] = []
    cols = None
    bad_layout = None       # the unknown header of this section, its rows are unreadable
    endpoint = None
    map_name = None
    last = None             # last row: continuation label lines extend it
    for src in sources:
        line = src.text.rstrip()
        s = line.strip()
        m = re.match(r"^Endpoint ID:\s*(\d+)$", s)
        if m:
            endpoint, cols, last, bad_layout, map_name = int(m.group(1)), None, None, None, None
            continue
        m = re.match(r"^Path:\s*(\S+)$", s)
        if m:
            map_name = m.group(1)
            continue
        m = re.match(r"^(?P<path>\S*cilium_policy(?:_v2)?_(?P<id>\d+)):?$", s)
        if m:           # older --all: the map path names the endpoint
            map_name, endpoint, cols, last, bad_layout = m.group("path"), int(m.group("id")), \
                None, None, None
            continue
        if s.startswith("Policy stats empty") or s == "no maps found":
            continue
        h = _header(s)
        if h is not None:
            if h not in _KNOWN_LAYOUTS:
                cols, bad_layout = None, src
                unreadable.append(UnreadableRow(endpoint, None, src, "a column layout "
                                                "traceflow does not know", map_name))
            else:
                cols, bad_layout = h, None
            continue
        if bad_layout is not None:
            unreadable.append(UnreadableRow(endpoint, _direction_of(s), src,
                                            f"under the header at line {bad_layout.line}, whose "
                                            "column layout traceflow does not know", map_name))
            continue
        if cols is None:
            unreadable.append(UnreadableRow(endpoint, _direction_of(s), src,
                                            "a row before any table header", map_name))
            continue
        tokens = _INVALID.sub(r"<INVALID:\1>", s).split()
        if line[:1].isspace() and len(tokens) == 1 and last is not None \
                and "LABELS (source:key[=value])" in cols:
            last[1].append(tokens[0])          # a further label of the row above
            last[2].append(src)
            continue
        if len(tokens) != len(cols):
            unreadable.append(UnreadableRow(endpoint, _direction_of(s), src,
                                            f"{len(tokens)} cells under {len(cols)} columns",
                                            map_name))
            last = None
            continue
        row = dict(zip(cols, tokens))
        last = [row, [], [src], endpoint, map_name]
        rows.append(last)
    entries = []
    for r in rows:
        try:
            entries.append(_entry(*r))
        except InputError as e:
            unreadable.append(UnreadableRow(r[3], _direction_of(r[2][0].text.strip()), r[2][0],
                                            e.reason, r[4]))
    return PolicyRows(entries, unreadable)


def _direction_of(text: str) -> str | None:
    """The direction a row names, when it names one (to keep an unreadable row's reach to
    that direction)."""
    m = re.search(r"\b(Ingress|Egress)\b", text)
    return m.group(1).lower() if m else None


def strict(rows: PolicyRows) -> PolicyRows:
    """The rows, refusing the first unreadable one as a located error (for callers that
    want the whole file readable)."""
    if rows.unreadable:
        u = rows.unreadable[0]
        raise bad(u.source, "cilium bpf policy get", u.reason)
    return rows


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
    port, port_end, proto = _port_proto(row["PORT/PROTO"], src)
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


def _port_proto(cell: str, src) -> tuple:
    """(port, last port, protocol) of a PORT/PROTO cell; protocol None for any."""
    m = re.fullmatch(r"<INVALID:(\d+)>", cell)
    if m:
        raise bad(src, "cilium bpf policy get", f"Cilium printed an invalid prefix length "
                  f"({m.group(1)}) for this key: what it matches is not known")
    pm = _PORT.match(cell)
    if not pm:
        raise bad(src, "cilium bpf policy get", f"port {cell!r}")
    proto = pm.group("proto").upper()
    proto = _PROTO_NUMBERS.get(proto, proto)
    if not proto.isdigit() and proto not in _PROTO_NAMES:
        raise bad(src, "cilium bpf policy get", f"protocol {pm.group('proto')!r}")
    if proto == "ICMPV6":
        proto = "ICMPv6"
    if pm.group("hex"):
        # 1.14/1.15: 0x<port>/<port prefix bits>/<proto>, one aligned block of ports
        bits = int(pm.group("bits"))
        if not 0 < bits <= 16:
            raise bad(src, "cilium bpf policy get", f"port prefix {bits} in {cell!r}")
        port = int(pm.group("hex"), 16)
        port_end = port + (0xFFFF >> bits)
    else:
        port = int(pm.group("p")) if pm.group("p") else None
        port_end = int(pm.group("e")) if pm.group("e") else port
    if port is not None and not (0 <= port <= 65535 and 0 <= (port_end or 0) <= 65535):
        raise bad(src, "cilium bpf policy get", f"port {cell!r} out of range")
    if port == 0 and port_end in (0, None):
        port = port_end = None
    return port, port_end, (None if proto == "ANY" else proto)
