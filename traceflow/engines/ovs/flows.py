"""Parse `ovs-ofctl dump-flows` output into flows, table by table, lazily.

A dump can hold 100k flows while a trace visits a dozen tables, so ``FlowDump`` only
indexes lines by table when it is built; a table's lines are parsed the first time the
packet reaches it (``FlowDump.table``). Every flow keeps its bundle file, line and text.

Variants read: with or without statistics, ``--names`` (quoted or bare port names),
``table=`` omitted for table 0, tables given by name, OpenFlow 1.0 and 1.5 action syntax,
``ovs-ofctl`` reply headers, and the timestamp prefix CI logs add.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import re
from array import array
from dataclasses import dataclass

from traceflow.model.errors import InputError, Source
from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F

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

    @functools.cached_property
    def conjunctions(self) -> tuple:
        """Its ``conjunction(id,k/n)`` actions (a clause of a conjunctive match)."""
        return tuple(a for a in self.actions if isinstance(a, A.Conjunction))

    @functools.cached_property
    def uses_group(self) -> bool:
        """Whether the actions send the packet to a group (False when they cannot be read:
        the lookup that meets them says why)."""
        try:
            return any(isinstance(a, A.Group) for a in self.actions)
        except ValueError:
            return False

    @functools.cached_property
    def match_plan(self) -> tuple:
        """(field name, mask, value, port name) per match: what a lookup compares, without
        the attribute hops (a lookup tests thousands of flows)."""
        return tuple((m.field.name, m.mask, m.value, m.port_name) for m in self.matches)

    def match_texts(self) -> tuple:
        return self._match_texts

    @functools.cached_property
    def _match_texts(self) -> tuple:
        # a protocol keyword ("tcp") stands for several implied fields, a view (xreg0=,
        # dl_vlan=) for pieces of others: name each once (every hop of the flow shows them)
        out = tuple(dict.fromkeys(m.text for m in self.matches if m.text not in F.PROTOCOLS))
        return ((self.protocol,) if self.protocol else ()) + out


def _strip_line(raw: str) -> str:
    line = raw.strip()
    return _DOC_NUMBER.sub("", _TIMESTAMP.sub("", line))


def parse_flow(line: str, source: Source) -> Flow:
    """Parse one dump-flows line. Raises InputError (with file/line/text) if it is not a flow."""
    text = _strip_line(line)
    idx = text.find("actions=")
    keyword = len("actions=")
    if idx < 0:
        # ovs-ofctl also reads "action=" (ofp-flow.c parse_ofp_str__); dumps print "actions="
        idx, keyword = text.find("action="), len("action=")
    if idx < 0 or (idx > 0 and text[idx - 1] not in " ,"):
        raise InputError.at(source, "flow has no 'actions=' (truncated line?)")
    head, action_text = text[:idx].rstrip(" ,"), text[idx + keyword:]
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
            matches.extend(_match(key, value.strip(), token, source))
    return Flow(table, priority, tuple(matches), action_text, source, text, cookie, conj_id,
                protocol)


def _table_id(value: str) -> int | str:
    try:
        return int(value, 0)
    except ValueError:
        return value


def _match(key: str, value: str, token: str, source: Source) -> tuple:
    """The match fields one ``key=value`` of a flow stands for: one, or the pieces of a view
    (``xreg0=`` is two registers, ``dl_vlan=`` a part of vlan_tci)."""
    try:
        return _match_cached(key, value, token)
    except _BadMatch as bad:
        raise InputError.at(source, str(bad)) from None


class _BadMatch(ValueError):
    pass


@functools.lru_cache(maxsize=131072)
def _match_cached(key: str, value: str, token: str) -> tuple:
    """Match fields from their text; cached, since dumps repeat the same matches a lot."""
    fld = F.lookup(key)
    if fld is None:
        raise _BadMatch(f"unknown match field {key!r}")
    if fld.name == "in_port" and not value[:1].isdigit() and value.upper() != "LOCAL":
        return (MatchField(fld, None, F.full_mask(fld), token, port_name=value.strip('"')),)
    if fld.name == "nw_frag":
        frag = {"no": (0, 3), "yes": (1, 1), "first": (1, 3), "later": (3, 3), "not_later": (0, 2)}
        v, m = frag.get(value, (None, None))
        if v is None:
            raise _BadMatch(f"bad nw_frag value {value!r}")
        return (MatchField(fld, v, m, token),)
    try:
        v, m = F.parse_value(fld, value)
    except ValueError as exc:
        raise _BadMatch(f"bad value for {key}: {exc}") from None
    if fld.view is None:
        return (MatchField(fld, v, m, token),)
    return tuple(MatchField(base, bv, bm, token) for base, bv, bm in F.view_match(fld, v, m))


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
    """Flows of one bridge, indexed by table at construction and parsed per table on demand.

    ``layout()`` gives where each table's lines are and the index of each big table, as arrays
    of numbers; ``from_layout`` takes it back for the same text, so a later command skips the
    pass over every line (traceflow.bundle.index stores it, keyed by the SHA-256 of the text).
    A layout is checked against the text where that is cheap (line count, every line in
    exactly one table, each table's first and last lines, sorted indexes) and each line a
    lookup reads is checked against it (table, priority, indexed value); a line that is not
    what the layout says makes the dump read its text again (``on_stale`` is told). What is
    not checked is trusted to the digest: a layout is only ever looked up by the SHA-256 of
    the text it was made from, so only one crafted to keep every count while moving a line
    that no lookup reads would go unnoticed.
    """

    def __init__(self, text: str, name: str):
        self._setup(text, name)
        self._read()

    def _setup(self, text: str, name: str) -> None:
        self.name = name
        self.digest: str | None = None    # set by whoever keys a layout by the text
        self.on_stale = None              # called when a layout turns out not to fit
        self._text = text
        self._lines: list[str] = []       # line number - 1 -> the (logical) line
        self._numbers: dict = {}          # table -> line numbers, ascending
        self._skipped: list[int] = []     # blank, comment and reply-header lines
        self._joined = False              # backslash continuations were joined
        self._renamed: dict[str, int] = {}
        self._stored: dict = {}           # table -> its index from a layout, checked when used
        self._checking = False            # the table of each line comes from a layout
        self._parsed: dict[int | str, list[Flow]] = {}
        self._indexes: dict = {}
        self._one: dict = {}       # (table, line number) -> Flow parsed from a big table

    def _read(self) -> None:
        text = self._text
        lines = text.splitlines()
        self._joined = "\\" in text
        if self._joined:               # a design doc's wrapped flows
            entries = list(logical_lines(text))
            for n, line in entries:
                lines[n - 1] = line
        else:
            entries = enumerate(lines, 1)
        numbers: dict = {}
        skipped = []
        for n, line in entries:
            # plain string tests, not a regex per line: a dump holds 100k lines
            stripped = line.lstrip()
            if not stripped or stripped[0] == "#" or stripped.startswith(_SKIP_PREFIXES):
                skipped.append(n)
                continue
            end = line.find("actions=")
            # _token_value(head, "table") without cutting the head off the line first
            at = line.find("table=", 0, end if end >= 0 else len(line))
            while at > 0 and line[at - 1] not in " ,\t":
                at = line.find("table=", at + 1, end if end >= 0 else len(line))
            if at < 0:
                value = None
            else:
                stop = line.find(",", at + 6, end if end >= 0 else len(line))
                value = line[at + 6:stop if stop >= 0 else (end if end >= 0 else len(line))]
                if " " in value or "\t" in value:
                    value = value.split()[0] if value.split() else ""
            table = _table_id(value) if value else 0
            got = numbers.get(table)
            if got is None:
                numbers[table] = [n]
            else:
                got.append(n)
        self._lines, self._numbers, self._skipped = lines, numbers, skipped

    # ---- a stored layout ---------------------------------------------------------------
    def layout(self, built_only: bool = False) -> dict | None:
        """Where this dump's lines are: ``lines`` (count), ``skipped`` (line numbers) and
        ``tables``: [table, line numbers, index or None]; an index (of a table of at least
        _INDEX_MIN lines) is ``field`` (as written) and, sorted by (value, priority, line),
        ``values``, ``prios`` (minus the priority) and ``numbers`` of the lines that have the
        field, and ``rest_prios``/``rest_numbers`` of those that do not. Building it indexes
        every big table; ``built_only``: only the tables indexed so far (those a walk
        visited; a later command indexes, and stores, the others it visits). None for a dump
        with continuation lines (never a big one)."""
        if self._joined or self._renamed:
            return None
        if self._checking and not built_only:
            return None
        tables = []
        for table, numbers in self._numbers.items():
            index = None
            if len(numbers) >= _INDEX_MIN and built_only and table in self._stored:
                index = self._stored[table]         # kept as it was stored, not yet used
            elif len(numbers) >= _INDEX_MIN and (not built_only or table in self._indexes):
                ix = self._index(table)
                index = {"field": ix.name, "values": ix.values, "prios": ix.prios,
                         "numbers": ix.numbers, "rest_prios": [p for p, _, _ in ix.rest],
                         "rest_numbers": [n for _, n, _ in ix.rest]}
            tables.append([table, numbers, index])
        return {"lines": len(self._lines), "skipped": self._skipped, "tables": tables}

    @classmethod
    def from_layout(cls, text: str, name: str, layout: dict) -> "FlowDump":
        """The dump of ``text`` with its tables from ``layout`` (see ``layout``), without a
        pass over its lines. Raises ValueError (TypeError, KeyError) when the layout does not
        fit: wrong line count, a line in no table or in two, a skipped line that is a flow."""
        self = cls.__new__(cls)
        self._setup(text, name)
        if "\\" in text:
            raise ValueError("continuation lines are read, not laid out")
        lines = self._lines = text.splitlines()
        if layout["lines"] != len(lines):
            raise ValueError("line count")
        self._skipped = _ints(layout["skipped"])
        for n in self._skipped:
            stripped = lines[n - 1].lstrip() if n > 0 else "x"
            if stripped and stripped[0] != "#" and not stripped.startswith(_SKIP_PREFIXES):
                raise ValueError(f"line {n} is not one to skip")
        for table, numbers, index in layout["tables"]:
            if type(table) not in (int, str) or table in self._numbers:
                raise ValueError(f"table {table!r}")
            self._numbers[table] = numbers = _ints(numbers)
            if not numbers:
                raise ValueError(f"table {table!r} has no lines")
            if index is not None:
                if len(numbers) < _INDEX_MIN:
                    raise ValueError(f"index of small table {table!r}")
                self._stored[table] = index
        # every line in exactly one table (or skipped): 10 ms for 100k lines
        every = sorted(itertools.chain(self._skipped, *self._numbers.values()))
        if every != list(range(1, len(lines) + 1)):
            raise ValueError("lines not laid out once each")
        # each table's first and last lines are in it (a table under another's number is
        # caught here; a line moved alone, when a lookup reads it)
        for table, numbers in self._numbers.items():
            if self._table_of(lines[numbers[0] - 1]) != table \
                    or self._table_of(lines[numbers[-1] - 1]) != table:
                raise ValueError(f"table {table!r} is not where its lines are")
        self._checking = True
        return self

    def _stale(self) -> None:
        """The layout does not fit the text: read the text, as without one."""
        renamed, digest = self._renamed, self.digest
        self._setup(self._text, self.name)
        self.digest = digest
        self._read()
        if renamed:
            self.resolve_names(renamed)

    def _checked(self, call, *args):
        try:
            return call(*args)
        except _Stale:
            notify = self.on_stale
            self._stale()
            if notify is not None:
                notify()
            return call(*args)

    # ---- tables ------------------------------------------------------------------------
    def indexed_tables(self) -> int:
        """How many big tables have an index (built, or stored and not yet used)."""
        return len(set(self._indexes) | set(self._stored))

    def table_ids(self) -> list:
        return sorted(self._numbers, key=lambda t: (isinstance(t, str), str(t) if isinstance(t, str) else t))

    def resolve_names(self, names: dict[str, int]) -> None:
        """Fold tables written by name into their numbers (from ovs-tables.txt or the CNI)."""
        for key in [k for k in self._numbers if isinstance(k, str)]:
            if key in names:
                target = names[key]
                self._renamed[key] = target
                moved = self._numbers.pop(key)
                stored = self._stored.pop(key, None)
                if target in self._numbers:
                    self._numbers[target] = sorted(itertools.chain(self._numbers[target], moved))
                    self._stored.pop(target, None)     # indexed a part of the table only
                else:
                    self._numbers[target] = moved
                    if stored is not None:
                        self._stored[target] = stored

    def has_table(self, table: int | str) -> bool:
        return table in self._numbers

    def table(self, table: int | str) -> list[Flow]:
        """Flows of one table, highest priority first (dump order kept among equals)."""
        return self._checked(self._table, table)

    def _table(self, table: int | str) -> list[Flow]:
        if table not in self._parsed:
            lines = self._lines
            numbers = self._numbers.get(table, ())
            if self._checking and any(self._table_of(lines[n - 1]) != table for n in numbers):
                raise _Stale
            flows = [parse_flow(lines[n - 1], Source(self.name, n, lines[n - 1].strip()))
                     for n in numbers]
            flows.sort(key=lambda f: -f.priority)
            self._parsed[table] = flows
        return self._parsed[table]

    def _table_of(self, line: str) -> int | str:
        end = line.find("actions=")
        value = _token_value(line if end < 0 else line[:end], "table")
        table = _table_id(value) if value else 0
        return self._renamed.get(table, table) if isinstance(table, str) else table

    def candidates(self, table: int | str, state: dict) -> list[Flow]:
        """The flows of a table that can match ``state``, highest priority first.

        Small tables: every flow. Big ones (a 100k-flow dump puts thousands of per-Pod flows
        in one table): an index on the raw lines by the value of their most common exact
        field (nw_dst in L3Forwarding, dl_dst in L2ForwardingCalc ...) narrows the lines to
        those that can match, and only those are parsed. The result is a superset of the
        matching flows in the same order, so a lookup gives the same answer either way.
        The same list comes back for the same table and value.
        """
        # the answers given before (every lookup of a warm trace), without the checks
        parsed = self._parsed.get(table)
        if parsed is not None:
            return parsed
        index = self._indexes.get(table)
        if index is not None:
            found = index.cache.get(state.get(index.field.name, 0) if index.field else None)
            if found is not None:
                return found
        return self._checked(self._candidates, table, state)

    def _candidates(self, table: int | str, state: dict) -> list[Flow]:
        if len(self._numbers.get(table, ())) < _INDEX_MIN or table in self._parsed:
            return self._table(table)
        index = self._index(table)
        key = state.get(index.field.name, 0) if index.field else None
        found = index.cache.get(key)
        if found is None:
            # parsed once per looked-up value: the lines without the field are not merged
            # and re-read on every lookup
            entries = index.candidates(key)
            if self._checking:
                self._check_entries(table, index, entries)
            found = index.cache[key] = [self._flow(table, n) for _, n, _ in entries]
        return found

    def _index(self, table) -> "_RawIndex":
        index = self._indexes.get(table)
        if index is None:
            stored = self._stored.pop(table, None)
            if stored is not None:
                try:
                    index = _RawIndex.from_layout(stored, self._numbers[table])
                except (ValueError, TypeError, KeyError, OverflowError):
                    raise _Stale from None
            else:
                lines = self._lines
                raw = [(n, lines[n - 1]) for n in self._numbers.get(table, ())]
                if self._checking and any(self._table_of(line) != table for _, line in raw):
                    raise _Stale
                index = _RawIndex(raw)
            self._indexes[table] = index
        return index

    def _check_entries(self, table, index: "_RawIndex", entries: list) -> None:
        """Each line a layout hands out is in this table, with this priority and value."""
        if entries != sorted(entries, key=lambda e: e[:2]):
            raise _Stale
        lines = self._lines
        for prio, n, value in entries:
            line = lines[n - 1]
            if self._table_of(line) != table or index.entry(line) != (prio, value):
                raise _Stale

    def _flow(self, table, lineno: int) -> Flow:
        key = (table, lineno)
        flow = self._one.get(key)
        if flow is None:
            line = self._lines[lineno - 1]
            flow = self._one[key] = parse_flow(line, Source(self.name, lineno, line.strip()))
        return flow

    def __len__(self) -> int:
        return sum(len(v) for v in self._numbers.values())

    def text_lines(self) -> list[str]:
        """The dump's lines as in the file (continuations not joined); do not modify."""
        return self._text.splitlines() if self._joined else self._lines


def _ints(seq) -> array:
    """``seq`` as an array of integers (TypeError for anything else)."""
    return seq if isinstance(seq, array) and seq.typecode in "bBhHiIlLqQ" else array("q", seq)


class _Stale(Exception):
    """A line is not where a stored layout says."""


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

    The lines with the field are kept as three parallel sequences sorted by (value, minus
    the priority, line number), so that a lookup is a binary search and the index is stored
    and loaded as arrays of numbers (``FlowDump.layout``).
    """

    def __init__(self, raw: list[tuple[int, str]]):
        step = max(1, len(raw) // _SAMPLE)
        distinct: dict[str, set] = {}
        for _, line in raw[::step]:
            head = line.split("actions=", 1)[0]
            for k, v in _KEY_VALUE.findall(head):
                if k not in _NOT_KEYS and "/" not in v:
                    distinct.setdefault(k, set()).add(v)
        # a view (dl_vlan, xreg0) is not a key of the packet's fields: never the index
        known = [k for k in sorted(distinct)
                 if F.lookup(k) is not None and F.lookup(k).view is None]
        # the most selective field; ties broken by name, so the choice is deterministic
        name = max(known, key=lambda k: len(distinct[k])) if known else None
        self._setup(name)
        keyed, rest = [], []
        # ``entry`` for every line, inlined: 25,000 lines a table (the same tests in order)
        read, fld = self._read, self.field
        probe = (name + "=") if name else None
        for n, line in raw:
            end = line.find("actions=")
            head = (line if end < 0 else line[:end]).rstrip()
            prio = _token_value(head, "priority")
            order = -int(prio) if prio and prio.isdecimal() else -32768
            value = None
            if probe is not None and probe in head:
                text = _token_value(head, name)
                if text is not None and "/" not in text:
                    value = read(fld, text.strip('"'))
            if value is None:
                rest.append((order, n, None))
            else:
                keyed.append((value, order, n))
        keyed.sort()
        rest.sort()
        self.values = [v for v, _, _ in keyed]
        self.prios = [p for _, p, _ in keyed]
        self.numbers = [n for _, _, n in keyed]
        self.rest = rest

    def _setup(self, name: str | None) -> None:
        self.name = name                      # the field as written in the flows
        self.field = F.lookup(name) if name else None
        self._read = _VALUE_READERS.get(self.field.kind, _read_int) if self.field else None
        self.cache: dict = {}       # looked-up value -> candidate flows (FlowDump fills it)

    @classmethod
    def from_layout(cls, stored: dict, numbers) -> "_RawIndex":
        """The index from its stored arrays, checked for shape: the same lines as the table,
        sorted. Raises ValueError."""
        self = cls.__new__(cls)
        name = stored["field"]
        if name is not None and (type(name) is not str or F.lookup(name) is None
                                 or F.lookup(name).view is not None):
            raise ValueError(f"index field {name!r}")
        self._setup(name)
        values = stored["values"]
        if not isinstance(values, array) and any(type(v) is not int for v in values):
            raise ValueError("index values are not integers")
        self.values, self.prios, self.numbers = values, _ints(stored["prios"]), \
            _ints(stored["numbers"])
        rest_prios, rest_numbers = _ints(stored["rest_prios"]), _ints(stored["rest_numbers"])
        if not len(self.values) == len(self.prios) == len(self.numbers) \
                or len(rest_prios) != len(rest_numbers) or (name is None and len(self.values)):
            raise ValueError("index arrays of different lengths")
        if sorted(itertools.chain(self.numbers, rest_numbers)) != list(numbers):
            raise ValueError("index lines are not the table's")
        values = list(self.values)
        if values != sorted(values):
            raise ValueError("index values not sorted")
        self.rest = [(p, n, None) for p, n in zip(rest_prios, rest_numbers)]
        if self.rest != sorted(self.rest, key=lambda e: e[:2]):
            raise ValueError("index rest not sorted")
        return self

    def entry(self, line: str) -> tuple[int, int | None]:
        """(minus the priority, the indexed field's value or None) of one raw line."""
        end = line.find("actions=")
        head = (line if end < 0 else line[:end]).rstrip()
        prio = _token_value(head, "priority")
        order = -int(prio) if prio and prio.isdecimal() else -32768
        text = _token_value(head, self.name) if self.name else None
        if text is None or "/" in text:
            return order, None
        return order, self._read(self.field, text.strip('"'))

    def candidates(self, value) -> list:
        """(minus the priority, line number, indexed value or None) of the lines that can
        match a packet whose field is ``value``, in lookup order."""
        hits: list = []
        if self.field is not None and isinstance(value, int):
            lo = bisect.bisect_left(self.values, value)
            hi = bisect.bisect_right(self.values, value, lo)
            hits = [(p, n, value) for p, n in zip(self.prios[lo:hi], self.numbers[lo:hi])]
        return list(heapq.merge(hits, self.rest, key=lambda e: e[:2]))


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
