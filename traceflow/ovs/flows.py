"""Parse `ovs-ofctl dump-flows` output into flows, table by table, lazily.

A dump can hold 100k flows while a trace visits a dozen tables, so ``FlowDump`` only
indexes lines by table when it is built; a table's lines are parsed the first time the
packet reaches it (``FlowDump.table``). Every flow keeps its bundle file, line and text.

Variants read: with or without statistics, ``--names`` (quoted or bare port names),
``table=`` omitted for table 0, tables given by name, OpenFlow 1.0 and 1.5 action syntax,
``ovs-ofctl`` reply headers, and the timestamp prefix CI logs add.
"""

from __future__ import annotations

import functools
import heapq
import re
from dataclasses import dataclass

from traceflow.errors import InputError, Source
from traceflow.ovs import actions as A
from traceflow.ovs import fields as F

# keys of the flow header that describe the flow, not what it matches
_HEADER_KEYS = {"cookie", "duration", "table", "n_packets", "n_bytes", "idle_age", "hard_age",
                "idle_timeout", "hard_timeout", "importance", "reset_counts", "send_flow_rem",
                "no_packet_counts", "no_byte_counts", "check_overlap", "out_port", "out_group"}
_HEADER_FLAGS = {"reset_counts", "send_flow_rem", "check_overlap", "no_packet_counts",
                 "no_byte_counts", "no_readonly_table"}
_SKIP_PREFIXES = ("NXST_FLOW", "OFPST_FLOW", "OFPST_TABLE", "NXST_TABLE", "OFPT_")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z?\s+")
_DOC_NUMBER = re.compile(r"^\d+\.\s+(?=\S+=)")   # "3. table=..." as design docs number flows


@dataclass(frozen=True)
class MatchField:
    field: F.Field
    value: int | None       # None for an in_port given by a name not yet resolved
    mask: int
    text: str               # "nw_dst=10.96.0.0/12" as written
    port_name: str | None = None


@dataclass(eq=False)
class Flow:
    table: int | str
    priority: int
    matches: tuple          # of MatchField
    action_text: str
    source: Source
    text: str               # the flow as it reads in the bundle
    cookie: int = 0
    conj_id: int | None = None
    protocol: str | None = None   # "ip", "tcp", "arp" ... as written

    @functools.cached_property
    def actions(self) -> tuple:
        """Parsed on first use: a lookup reads only matches, and most flows never match."""
        return A.parse_actions(self.action_text)

    def match_texts(self) -> tuple:
        # a protocol keyword ("tcp") stands for several implied fields: name it once
        out = tuple(m.text for m in self.matches if m.text not in F.PROTOCOLS)
        return ((self.protocol,) if self.protocol else ()) + out


def _strip_line(raw: str) -> str:
    line = raw.strip()
    return _DOC_NUMBER.sub("", _TIMESTAMP.sub("", line))


def parse_flow(line: str, source: Source) -> Flow:
    """Parse one dump-flows line. Raises InputError (with file/line/text) if it is not a flow."""
    text = _strip_line(line)
    idx = text.find("actions=")
    if idx < 0 or (idx > 0 and text[idx - 1] not in " ,"):
        raise InputError.at(source, "flow has no 'actions=' (truncated line?)")
    head, action_text = text[:idx].rstrip(" ,"), text[idx + len("actions="):]
    table: int | str = 0
    priority = 32768      # OpenFlow's default when a flow gives none
    cookie = 0
    conj_id = None
    protocol = None
    matches = []
    # -O OpenFlow15 separates a bare flag from the next key with a space ("reset_counts priority=5")
    for token in (t for part in A.split_top(head.replace(", ", ",")) for t in part.split()):
        key, eq, value = token.partition("=")
        key = key.strip()
        if not eq:
            if key in _HEADER_FLAGS:      # -O OpenFlow15 prints flow flags as bare words
                continue
            if key in F.PROTOCOLS:
                protocol = key
                for name, v in F.PROTOCOLS[key].items():
                    fld = F.FIELDS[name]
                    matches.append(MatchField(fld, v, F.full_mask(fld), key))
                continue
            raise InputError.at(source, f"unknown match keyword {key!r}")
        try:
            if key == "table":
                table = _table_id(value)
            elif key == "priority":
                priority = int(value)
            elif key == "cookie":
                cookie = int(value.split("/")[0], 0)
            elif key == "conj_id":
                conj_id = int(value, 0)
        except ValueError:
            raise InputError.at(source, f"bad {key} value {value!r}") from None
        if key in ("table", "priority", "cookie", "conj_id"):
            if key == "cookie" and cookie < 0 or key == "priority" and priority < 0:
                raise InputError.at(source, f"bad {key} value {value!r}")
        elif key in _HEADER_KEYS:
            continue
        else:
            matches.append(_match(key, value.strip(), token, source))
    return Flow(table, priority, tuple(matches), action_text, source, text, cookie, conj_id,
                protocol)


def _table_id(value: str) -> int | str:
    try:
        return int(value, 0)
    except ValueError:
        return value


def _match(key: str, value: str, token: str, source: Source) -> MatchField:
    try:
        return _match_cached(key, value, token)
    except _BadMatch as bad:
        raise InputError.at(source, str(bad)) from None


class _BadMatch(ValueError):
    pass


@functools.lru_cache(maxsize=131072)
def _match_cached(key: str, value: str, token: str) -> MatchField:
    """A match field from its text; cached, since dumps repeat the same matches a lot."""
    fld = F.lookup(key)
    if fld is None:
        raise _BadMatch(f"unknown match field {key!r}")
    if fld.name == "in_port" and not value[:1].isdigit() and value.upper() != "LOCAL":
        return MatchField(fld, None, F.full_mask(fld), token, port_name=value.strip('"'))
    if fld.name == "nw_frag":
        frag = {"no": (0, 3), "yes": (1, 1), "first": (1, 3), "later": (3, 3), "not_later": (0, 2)}
        v, m = frag.get(value, (None, None))
        if v is None:
            raise _BadMatch(f"bad nw_frag value {value!r}")
        return MatchField(fld, v, m, token)
    try:
        v, m = F.parse_value(fld, value)
    except ValueError as exc:
        raise _BadMatch(f"bad value for {key}: {exc}") from None
    return MatchField(fld, v, m, token)


def logical_lines(text: str):
    """(first line number, text) with backslash continuations joined, as docs wrap flows."""
    buf, start = "", None
    for n, raw in enumerate(text.splitlines(), 1):
        if start is None:
            start = n
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            buf += stripped[:-1].strip() if buf else stripped[:-1]
            continue
        buf += raw.strip() if buf else raw
        yield start, buf
        buf, start = "", None
    if buf:
        yield start, buf


def parse_flows(text: str, name: str) -> list[Flow]:
    """Parse a whole dump eagerly (tests, validation, small dumps)."""
    dump = FlowDump(text, name)
    out = []
    for table in dump.table_ids():
        out.extend(dump.table(table))
    return out


class FlowDump:
    """Flows of one bridge, indexed by table at construction and parsed per table on demand."""

    def __init__(self, text: str, name: str):
        self.name = name
        self._raw: dict[int | str, list[tuple[int, str]]] = {}
        self._parsed: dict[int | str, list[Flow]] = {}
        self._indexes: dict = {}
        self._one: dict = {}       # (table, line number) -> Flow parsed from a big table
        lines = (enumerate(text.splitlines(), 1) if "\\" not in text   # no continuations
                 else logical_lines(text))
        raw = self._raw
        for lineno, line in lines:
            # plain string tests, not a regex per line: a dump holds 100k lines
            stripped = line.lstrip()
            if not stripped or stripped[0] == "#" or stripped.startswith(_SKIP_PREFIXES):
                continue
            end = line.find("actions=")
            value = _token_value(line if end < 0 else line[:end], "table")
            table = _table_id(value) if value else 0
            raw.setdefault(table, []).append((lineno, line))

    def table_ids(self) -> list:
        return sorted(self._raw, key=lambda t: (isinstance(t, str), str(t) if isinstance(t, str) else t))

    def resolve_names(self, names: dict[str, int]) -> None:
        """Fold tables written by name into their numbers (from ovs-tables.txt or the CNI)."""
        for key in [k for k in self._raw if isinstance(k, str)]:
            if key in names:
                self._raw.setdefault(names[key], []).extend(self._raw.pop(key))
                self._raw[names[key]].sort()

    def has_table(self, table: int | str) -> bool:
        return table in self._raw

    def table(self, table: int | str) -> list[Flow]:
        """Flows of one table, highest priority first (dump order kept among equals)."""
        if table not in self._parsed:
            flows = [parse_flow(line, Source(self.name, n, line.strip()))
                     for n, line in self._raw.get(table, [])]
            flows.sort(key=lambda f: -f.priority)
            self._parsed[table] = flows
        return self._parsed[table]

    def candidates(self, table: int | str, state: dict) -> list[Flow]:
        """The flows of a table that can match ``state``, highest priority first.

        Small tables: every flow. Big ones (a 100k-flow dump puts thousands of per-Pod flows
        in one table): an index on the raw lines by the value of their most common exact
        field (nw_dst in L3Forwarding, dl_dst in L2ForwardingCalc ...) narrows the lines to
        those that can match, and only those are parsed. The result is a superset of the
        matching flows in the same order, so a lookup gives the same answer either way.
        """
        raw = self._raw.get(table, [])
        if len(raw) < _INDEX_MIN or table in self._parsed:
            return self.table(table)
        index = self._indexes.get(table)
        if index is None:
            index = self._indexes[table] = _RawIndex(raw)
        key = state.get(index.field.name, 0) if index.field else None
        found = index.cache.get(key)
        if found is None:
            # parsed once per looked-up value: the lines without the field are not merged
            # and re-read on every lookup
            found = index.cache[key] = [self._flow(table, n, line)
                                        for _, n, line in index.candidates(key)]
        return found

    def _flow(self, table, lineno: int, line: str) -> Flow:
        key = (table, lineno)
        flow = self._one.get(key)
        if flow is None:
            flow = self._one[key] = parse_flow(line, Source(self.name, lineno, line.strip()))
        return flow

    def __len__(self) -> int:
        return sum(len(v) for v in self._raw.values())


_INDEX_MIN = 64
_SAMPLE = 256                # lines read whole to choose a table's index field
_KEY_VALUE = re.compile(r"(?:^|[\s,])([a-z_][a-z0-9_]*)=([^,\s]+)")
_NOT_KEYS = _HEADER_KEYS | {"priority", "dl_type", "eth_type", "conj_id"}


def _token_value(head: str, key: str) -> str | None:
    """The value of ``key=`` in a flow's text as a whole token (``nw_dst`` is not found in
    ``ct_nw_dst=``), up to the next comma or blank; None when absent."""
    probe = key + "="
    i = head.find(probe)
    while i > 0 and head[i - 1] not in " ,\t":
        i = head.find(probe, i + 1)
    if i < 0:
        return None
    start = i + len(probe)
    end = head.find(",", start)
    value = head[start:] if end < 0 else head[start:end]
    if " " in value or "\t" in value:
        value = value.split()[0] if value.split() else ""
    return value


class _RawIndex:
    """Raw lines of one big table keyed by one field's exact value.

    The field is the one with the most distinct exact values in a sample of the table's
    lines (nw_dst in L3Forwarding, dl_dst in L2ForwardingCalc ...); each line is then read
    with one ``str.find`` for that field and its priority, and the value converted without
    ``ipaddress``. Lines without that field exact (or whose value does not read) stay in
    ``rest`` and are always candidates, so a malformed line is still parsed, and reported,
    when the table is used. Any choice of field gives the same lookups, only faster or slower.
    """

    def __init__(self, raw: list[tuple[int, str]]):
        step = max(1, len(raw) // _SAMPLE)
        distinct: dict[str, set] = {}
        for _, line in raw[::step]:
            head = line.split("actions=", 1)[0]
            for k, v in _KEY_VALUE.findall(head):
                if k not in _NOT_KEYS and "/" not in v:
                    distinct.setdefault(k, set()).add(v)
        # the most selective field; ties broken by name, so the choice is deterministic
        name = max(sorted(distinct), key=lambda k: len(distinct[k])) if distinct else None
        self.field = F.lookup(name) if name else None
        self.cache: dict = {}       # looked-up value -> candidate flows (FlowDump fills it)
        self.by_value: dict[int, list] = {}
        self.rest: list = []
        read = _VALUE_READERS.get(self.field.kind, _read_int) if self.field else None
        for n, line in raw:
            end = line.find("actions=")
            head = (line if end < 0 else line[:end]).rstrip()
            prio = _token_value(head, "priority")
            order = (-int(prio) if prio and prio.isdigit() else -32768, n)
            text = _token_value(head, name) if name else None
            value = None
            if text is not None and "/" not in text:
                value = read(self.field, text.strip('"'))
            if value is None:
                self.rest.append((order, n, line))
            else:
                self.by_value.setdefault(value, []).append((order, n, line))
        self.rest.sort()
        for entries in self.by_value.values():
            entries.sort()

    def candidates(self, value) -> list:
        hits = self.by_value.get(value, []) if self.field else []
        return list(heapq.merge(hits, self.rest))


def _read_generic(field: F.Field, text: str) -> int | None:
    try:
        value, mask = F.parse_value(field, text)
    except ValueError:
        return None    # left in ``rest``: parsed, and reported, with the table
    return value if mask == F.full_mask(field) else None


def _read_ipv4(field: F.Field, text: str) -> int | None:
    try:
        a, b, c, d = map(int, text.split("."))
    except ValueError:
        return _read_generic(field, text)
    if max(a, b, c, d) < 256 and f"{a}.{b}.{c}.{d}" == text:   # canonical dotted quad
        return (a << 24) | (b << 16) | (c << 8) | d
    return _read_generic(field, text)


def _read_mac(field: F.Field, text: str) -> int | None:
    if len(text) == 17 and text.count(":") == 5:
        try:
            return int(text.replace(":", ""), 16)
        except ValueError:
            pass
    return _read_generic(field, text)


def _read_int(field: F.Field, text: str) -> int | None:
    try:
        value = int(text, 0)
    except ValueError:
        return _read_generic(field, text)
    return value if 0 <= value < (1 << field.bits) else _read_generic(field, text)


_VALUE_READERS = {"ipv4": _read_ipv4, "mac": _read_mac, "int": _read_int}
