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
_SKIP_LINE = re.compile(r"^\s*(NXST_FLOW|OFPST_FLOW|OFPST_TABLE|NXST_TABLE|OFPT_|$)")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z?\s+")
_DOC_NUMBER = re.compile(r"^\d+\.\s+(?=\S+=)")   # "3. table=..." as design docs number flows
_TABLE = re.compile(r"(?:^|[\s,])table=([^,\s]+)")


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
        out = tuple(m.text for m in self.matches)
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
    for token in A.split_top(head.replace(", ", ",")):
        key, eq, value = token.partition("=")
        key = key.strip()
        if not eq:
            if key in F.PROTOCOLS:
                protocol = key
                for name, v in F.PROTOCOLS[key].items():
                    fld = F.FIELDS[name]
                    matches.append(MatchField(fld, v, F.full_mask(fld), key))
                continue
            raise InputError.at(source, f"unknown match keyword {key!r}")
        if key == "table":
            table = _table_id(value)
        elif key == "priority":
            priority = int(value)
        elif key == "cookie":
            cookie = int(value.split("/")[0], 0)
        elif key in _HEADER_KEYS:
            continue
        elif key == "conj_id":
            conj_id = int(value, 0)
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
    if fld.name == "in_port" and not value[:1].isdigit():
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
        for lineno, line in logical_lines(text):
            if _SKIP_LINE.match(line) or line.lstrip().startswith("#"):
                continue
            m = _TABLE.search(line.split("actions=", 1)[0])
            table = _table_id(m.group(1)) if m else 0
            self._raw.setdefault(table, []).append((lineno, line))

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
        """The flows of a table that can match ``state``, in priority order: every flow for
        small tables; for big ones, the flows an exact-match index on their most common
        exact field cannot rule out (a superset of the matching flows, so lookups are exact)."""
        flows = self.table(table)
        if len(flows) < _INDEX_MIN:
            return flows
        index = self._indexes.get(table)
        if index is None:
            index = self._indexes[table] = _TableIndex(flows)
        return index.candidates(state)

    def __len__(self) -> int:
        return sum(len(v) for v in self._raw.values())


_INDEX_MIN = 64


class _TableIndex:
    """flows keyed by the value of one field they all (mostly) match exactly, e.g. nw_dst in
    L3Forwarding or dl_dst in L2ForwardingCalc; flows without it stay in ``rest``."""

    def __init__(self, flows: list[Flow]):
        counts: dict = {}
        for f in flows:
            for m in f.matches:
                if m.value is not None and m.mask == F.full_mask(m.field) and m.field.name != "dl_type":
                    counts[m.field.name] = counts.get(m.field.name, 0) + 1
        self.field = max(counts, key=counts.get) if counts else None
        self.by_value: dict[int, list] = {}
        self.rest: list = []
        for pos, f in enumerate(flows):
            key = next((m.value for m in f.matches if self.field and m.field.name == self.field
                        and m.value is not None and m.mask == F.full_mask(m.field)), None)
            if key is None:
                self.rest.append((pos, f))
            else:
                self.by_value.setdefault(key, []).append((pos, f))

    def candidates(self, state: dict) -> list[Flow]:
        if self.field is None:
            return [f for _, f in self.rest]
        hits = self.by_value.get(state.get(self.field, 0), [])
        return [f for _, f in heapq.merge(hits, self.rest, key=lambda pf: pf[0])]
