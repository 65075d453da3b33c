"""nftables, read lazily: ``nft list ruleset`` text -> an ``NftRuleset`` whose chains, sets and
maps are parsed when a walk first uses them (a jump, goto or vmap into a chain, an ``@set`` or
``@map`` lookup). A node with 20,000 Services in kube-proxy's nftables mode lists ~500,000
lines; a trace reads a dozen chains and a few maps of them.

Opening (``open_nft_ruleset``) is one pass over the lines with plain string tests that finds
the blocks (``table``, and in it ``chain``/``set``/``map`` and their line ranges), following
braces outside strings and ``#`` comments. What the open pass finds, as the whole-text parser
(``nft_parse.parse_nft_ruleset``) would, in the diagnostics ``raise_for_errors()`` raises:

- everything about the structure: a line outside any table, a table or block header that is
  not ``table [FAMILY] NAME {`` / ``chain|set|map NAME {`` on a line of its own, unbalanced
  braces, a ``}`` that closes a block in the middle of a line, an unterminated string
  anywhere, the same table, chain or set listed twice. Any of these makes the open pass hand
  the whole text to the whole-text parser, so the errors (and every other diagnostic) are
  exactly its own;
- table items other than chains, sets and maps (``comment``, ``flags``, flowtables,
  counters... objects), which are parsed at open;
- chains that hold a base-chain header (``type ... hook ...``), ``policy``, ``devices``, a
  chain ``comment``, or a ``#`` comment other than ``# handle N`` (iptables-nft extensions):
  those are parsed at open, so that ``base_chains`` and the iptables-nft caveat need no other
  chain (a dozen chains in kube-proxy's table).

Found only when the block is read (a located ``RuleSyntaxError``, exit 2, raised by the walk
that reads it; also added to ``diagnostics``): a rule that is not nftables, a bad element,
type or property of a set or map -- everything inside a regular chain, set or map.
A block is read with the whole-text parser's own code over its lines, so what it holds is
identical to what the whole-text parser gives. One exception to "read whole": a set or map of
64 lines or more whose every element is a plain literal, one a line, of exactly the shape
``10.96.0.10 . udp . 53 [comment "..."] : goto CHAIN,`` (kube-proxy's service-ips, one element
per Service port) is read element by element: its header and type when first used, then only
the elements whose literal is the packet's key. Such an element cannot hold a syntax error
(the shape is checked for every element when the map is first used); a map with any other
element is read whole.

``layout``/``from_layout``: where the blocks are (JSON), so that the next command on the same
text (traceflow.bundle.index, keyed by the text's SHA-256) skips the pass over the lines.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from traceflow.model.errors import InputError, Source
from traceflow.engines.netfilter.iptables import RuleSyntaxError
from traceflow.engines.netfilter.nft_model import (FAMILIES, NftChain, NftElement, NftSet, NftTable,
                                                   _strip_quotes)
from traceflow.engines.netfilter.nft_ruleset import NftRuleset
from traceflow.engines.netfilter.nft_parse import _FileReader, parse_nft_ruleset
from traceflow.engines.netfilter.nft_rules import _read_element, _RuleReader, _tokenize

LAYOUT_FORMAT = "traceflow-nft-layout/1"

_NAME = r'(?:"(?:[^"\\\n]|\\.)*"|[^\s{};,()"#]+)'
_TABLE_HEAD = re.compile(rf"table\s+({_NAME})(?:\s+({_NAME}))?\s*{{\s*(?:#.*)?")
_BLOCK_HEAD = re.compile(rf"(chain|set|map)\s+({_NAME})\s*{{\s*(?:#.*)?")
# a statement of a chain that is not a rule: the chain is parsed at open (see the docstring)
_HEADERISH = re.compile(r"(?:^|;)\s*(?:type|policy|comment|devices)\b")
_HEADER_WORDS = ("type", "policy", "comment", "devices")
_HANDLE_TAIL = re.compile(r"\s#\s*handle\s+\d+\s*$")


class _Fallback(Exception):
    """The text is not laid out the way ``nft list`` prints it: read it whole instead."""


@dataclass
class LazyNftRuleset(NftRuleset):
    """An NftRuleset whose regular chains, sets and maps are read on first use."""

    blocks_read: list[str] = field(default_factory=list)     # "chain X", "map Y", in order
    layout: dict | None = None                               # where the blocks are (JSON)
    text: str = field(default="", repr=False)
    headed: list = field(default_factory=list, repr=False)   # the chains read at open

    def hooked_chains(self):
        """Only the chains read at open can be base chains (a lazy chain has no hook): a
        hook's walk does not look through 60,000 chains for them."""
        return self.headed


class _Block:
    """Where one chain, set or map is in the text (a plain class: 60,000 of them at open)."""

    __slots__ = ("kind", "name", "line", "start", "end", "table", "ruleset", "error")

    def __init__(self, kind: str, name: str, line: int, start: int, end: int, table: NftTable,
                 ruleset: LazyNftRuleset):
        self.kind, self.name, self.line, self.start, self.end = kind, name, line, start, end
        self.table, self.ruleset = table, ruleset
        self.error: InputError | None = None       # what reading it raised (raised again)

    def source(self) -> Source:
        """The header line, as the whole-text parser's ``Source``."""
        text = self.ruleset.text
        eol = text.find("\n", self.start)
        return Source(self.ruleset.name, self.line,
                      text[self.start:eol if eol >= 0 else len(text)].rstrip("\r"))

    def read(self, leave_out: tuple[int, int, int] | None = None):
        """The block parsed by the whole-text parser's code (``parse``); its diagnostics added
        to the ruleset's; its first syntax error raised (located: file, line, text)."""
        if self.error is None:
            return self.record(*self.parse(leave_out))
        raise self.error

    def record(self, found, diagnostics: list):
        self.ruleset.diagnostics.extend(diagnostics)
        self.ruleset.blocks_read.append(f"{self.kind} {self.name}")
        errors = [d for d in diagnostics if isinstance(d, RuleSyntaxError)]
        if not errors:
            return found
        first = errors[0]
        more = f" (and {len(errors) - 1} more syntax errors)" if len(errors) > 1 else ""
        self.error = RuleSyntaxError(first.reason + more, first.file, first.line, first.text)
        raise self.error

    def parse(self, leave_out: tuple[int, int, int] | None = None):
        """(the chain or set, its diagnostics); ``leave_out`` (start offset, end offset, first
        line after it) is a stretch of lines not read (a map's plain elements, read one by one
        on demand: ``_PlainElements``)."""
        rs = self.ruleset
        if leave_out is None:
            reader = _FileReader(rs.text, rs.name, self.start, self.end, self.line)
        else:
            cut, resume, resume_line = leave_out
            reader = _FileReader(rs.text, rs.name, self.start, cut, self.line)
            rest = rs.text[resume:self.end]
            reader.toks += _tokenize(rest, resume_line, resume)[0]
            reader.lines += [""] * (resume_line - self.line - len(reader.lines))
            reader.lines += rest.split("\n")
        scratch = NftTable(self.table.family, self.table.name, self.table.source)
        if self.kind == "chain":
            reader.chain(scratch)
            found = scratch.chains
        else:
            reader.set(scratch, self.kind)
            found = scratch.sets
        reader.skip_blank(in_chain=self.kind == "chain")
        if reader.peek() is not None or list(found) != [self.name]:
            self._disagree()
        return found[self.name], reader.ruleset.diagnostics

    def _disagree(self) -> None:
        """The parser ends the block elsewhere than the open pass did (a `}` in the middle of
        a line closes it early): the text's structure is broken, or the stored layout is
        not this text's. Raise what the whole-text parser finds first."""
        rs = self.ruleset
        whole = parse_nft_ruleset(rs.text, rs.name)
        whole.raise_for_errors()
        raise InputError(f"the stored layout of this file does not match line {self.line}: "
                         "remove traceflow's index cache (or set TRACEFLOW_NO_INDEX=1)", rs.name)


def _on_first_use(key: str) -> property:
    """A field read from the block the first time any such field is asked for (a property,
    since the dataclass keeps a class-level default for most fields)."""
    def get(self):
        found = self.__dict__
        if key not in found:
            self._load()
        return found[key]

    def put(self, value) -> None:
        self.__dict__[key] = value
    return property(get, put)


def _header_source(self) -> Source:
    found = self.__dict__.get("_source")
    if found is None:
        found = self.__dict__["_source"] = self._block.source()
    return found


def _set_source(self, value: Source) -> None:
    self.__dict__["_source"] = value


class LazyChain(NftChain):
    """A regular chain (no hook, policy, device or comment: those chains are read at open;
    the class defaults of NftChain say None for them) whose rules are parsed on first use."""

    rules = _on_first_use("rules")
    source = property(_header_source, _set_source)

    def __init__(self, block: _Block):
        self.name = block.name
        self._block = block

    def _load(self) -> None:
        block = self._block
        chain = block.read()
        if (chain.hook, chain.type, chain.policy, chain.device, chain.comment) != (None,) * 5:
            raise InputError(f"chain {chain.name} holds a chain header the open pass did not "
                             "see", block.ruleset.name, block.line)
        self.rules = chain.rules


_SET_FIELDS = ("key_types", "data_type", "flags", "comment", "properties", "elements")


class LazySet(NftSet):
    """A set or map whose type, flags and elements are parsed on first use."""

    key_types = _on_first_use("key_types")
    data_type = _on_first_use("data_type")
    flags = _on_first_use("flags")
    comment = _on_first_use("comment")
    properties = _on_first_use("properties")
    elements = _on_first_use("elements")

    source = property(_header_source, _set_source)

    def __init__(self, block: _Block):
        self.name = block.name
        self.kind = block.kind
        self._block = block

    def _load(self) -> None:
        if self._block.error is not None:
            raise self._block.error
        plain = _plain_elements(self._block)
        if plain is not None:
            found, elements = plain
            found.elements = elements
        else:
            found = self._block.read()
        for key in _SET_FIELDS:
            setattr(self, key, getattr(found, key))


# A big map or set of kube-proxy's (service-ips: one element per Service port) is read element
# by element when every element is a plain literal of this exact shape, one per line: such an
# element is well formed (no syntax error can hide in it) and holds exactly the packets whose
# key is its literal, so a lookup parses only the elements with the packet's key.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_PLAIN_PART = {
    "ipv4_addr": rf"({_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET})",
    "inet_proto": r"(tcp|udp|sctp)",
    "inet_service": (r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}"
                     r"|655[0-2][0-9]|6553[0-5])"),
}
_PLAIN_PROTO = {"tcp": 6, "udp": 17, "sctp": 132}
_PLAIN_DATA = r' : (?:(?:goto|jump) [^\s{};,()"#]+|drop|accept|return|continue)'
_PLAIN_MIN = 64            # smaller sets are read whole: a lookup reads them all anyway
_TYPE_LINE = re.compile(r"type ([a-z0-9_]+(?: \. [a-z0-9_]+)*)(?: : (verdict))?")


def _plain_elements(block: _Block):
    """(the set without its elements, _PlainElements) when every element of the block is a
    plain literal one per line; None otherwise (then the block is read whole)."""
    text = block.ruleset.text
    body = text[block.start:block.end].split("\n")
    if len(body) < _PLAIN_MIN:
        return None
    first = next((k for k, line in enumerate(body) if line.lstrip().startswith("elements = { ")),
                 None)
    if first is None:
        return None
    dtypes = data = None
    for line in body[1:first]:
        found = _TYPE_LINE.fullmatch(line.strip())
        if found is not None:
            dtypes, data = found[1].split(" . "), found[2]
    if (dtypes is None or any(t not in _PLAIN_PART for t in dtypes)
            or (data is not None) != (block.kind == "map")):
        return None
    last = len(body) - 1
    while last > first and not body[last].strip():
        last -= 1
    if body[last].strip() != "}" or last - 1 < first:
        return None
    shape = re.compile(r" \. ".join(_PLAIN_PART[t] for t in dtypes) + r'(?: comment "[^"\\\n]*")?'
                       + (_PLAIN_DATA if data else ""))
    keys = []
    for k in range(first, last):
        item = body[k].strip()
        if k == first:
            item = item[len("elements = { "):]
        item = item[:-2] if k == last - 1 and item.endswith(" }") else \
            item[:-1] if k < last - 1 and item.endswith(",") else None
        found = shape.fullmatch(item) if item is not None else None
        if found is None:
            return None
        keys.append(tuple(_PLAIN_PROTO[v] if t == "inet_proto" else
                          int(v) if t == "inet_service" else v
                          for t, v in zip(dtypes, found.groups())))
    offsets = [block.start]
    for line in body[:last + 1]:
        offsets.append(offsets[-1] + len(line) + 1)
    found, diagnostics = block.parse((offsets[first], offsets[last], block.line + last))
    if list(found.key_types) != dtypes or found.data_type != data or found.elements:
        return None                  # not what the type line said: read the block whole
    block.record(found, diagnostics)
    lines = [(block.line + k, offsets[k]) for k in range(first, last)]
    return found, _PlainElements(block.ruleset, tuple(dtypes), data, keys, lines)


class _PlainElements(Sequence):
    """A set's or map's plain elements (see above), each parsed by the whole-text parser's
    element reader when first used; ``candidates`` gives the ones a key can be in."""

    def __init__(self, ruleset: LazyNftRuleset, dtypes: tuple[str, ...], data: str | None,
                 keys: list[tuple], lines: list[tuple[int, int]]):
        self._rs = ruleset
        self._dtypes = dtypes
        self._data = data
        self._keys = keys
        self._lines = lines
        self._parsed: list[NftElement | None] = [None] * len(keys)
        self._index: dict[tuple, list[int]] | None = None

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._element(k) for k in range(len(self))[i]]
        return self._element(range(len(self))[i])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None

    def candidates(self, values: tuple) -> list[NftElement] | None:
        """The elements (in file order) that may hold ``values`` -- exactly those whose literal
        is the packet's key, since no other can --; None if ``values`` are not of the key's
        kinds (then look through all)."""
        if len(values) != len(self._dtypes):
            return None
        key = []
        for value, dtype in zip(values, self._dtypes):
            if dtype == "ipv4_addr":
                if not isinstance(value, ipaddress.IPv4Address):
                    return None
                key.append(str(value))
            elif type(value) is int:
                key.append(value)
            else:
                return None
        if self._index is None:
            index: dict[tuple, list[int]] = {}
            for k, found in enumerate(self._keys):
                index.setdefault(found, []).append(k)
            self._index = index
        return [self._element(k) for k in self._index.get(tuple(key), ())]

    def _element(self, k: int) -> NftElement:
        element = self._parsed[k]
        if element is None:
            number, start = self._lines[k]
            end = self._rs.text.find("\n", start)
            toks = _tokenize(self._rs.text[start:end if end >= 0 else None], number, start)[0]
            if toks and toks[0].text == "elements":
                toks = toks[3:]                      # elements = {
            toks = toks[:-1]                         # , or }
            rd = _RuleReader(toks, self._rs.text, Source(self._rs.name, number, ""), [])
            element = _read_element(rd, self._dtypes, self._data)
            if rd.peek() is not None:
                raise InputError("the stored layout of this file does not match line "
                                 f"{number}: remove traceflow's index cache", self._rs.name)
            self._parsed[k] = element
        return element


# ---------------------------------------------------------------------------------------------
# The open pass


def _shape(code: str) -> tuple[str, bool, bool]:
    """(the line without strings and comments, whether it holds a `#` comment other than
    ``# handle N``, whether a string is unterminated) -- for the rare line with `"` or `#`."""
    toks, bad = _tokenize(code)
    if bad:
        return "", False, True
    out, hashed = [], False
    for tok in toks:
        if tok.kind == "h":
            hashed = hashed or not re.fullmatch(r"#\s*handle\s+\d+\s*", tok.text)
        elif tok.kind == "s":
            out.append('S')
        else:
            out.append(tok.text)
    return " ".join(out), hashed, False


_BRACE = re.compile(r"[{}]")


def _braces(code: str, nest: int) -> int:
    """The braces open after this line; _Fallback if a `}` closes more than were open (the
    parser would end the block there, in the middle of the line)."""
    for brace in _BRACE.findall(code):
        nest += 1 if brace == "{" else -1
        if nest < 0:
            raise _Fallback
    return nest


def _scan(text: str) -> list:
    """The tables and their entries, as ``layout["tables"]``; raises _Fallback."""
    tables: list = []
    table_keys: set[str] = set()
    entries: list = []
    names: set[tuple[str, str]] = set()
    depth = 0                 # 0 top, 1 in a table, 2 in a chain/set/map, 3 in a table item
    nest = 0                  # braces open inside the block or item
    entry: list | None = None
    eager = in_chain = False
    pos = 0
    number = 0
    for number, line in enumerate(text.split("\n"), 1):
        start, pos = pos, pos + len(line) + 1
        code = line.strip()
        hashed = False
        if '"' in code or "#" in code:
            tail = _HANDLE_TAIL.search(code) if '"' not in code else None
            if tail is not None and "#" not in code[:tail.start()]:
                code = code[:tail.start()].rstrip()
            else:
                code, hashed, bad = _shape(code)
                if bad:
                    raise _Fallback
        if depth == 2:
            if code == "}" and nest == 0:
                entry[4] = pos
                entries.append(entry)
                if eager:
                    entry[0], entry[1] = "item", ""
                depth = 1
                continue
            if "{" in code or "}" in code:
                nest = _braces(code, nest)
            if (in_chain and not eager
                    and (hashed or ((";" in code or code.startswith(_HEADER_WORDS))
                                    and _HEADERISH.search(code)))):
                eager = True
            continue
        if depth == 3:
            nest = _braces(code, nest)
            if nest == 0:
                entry[4] = pos
                entries.append(entry)
                depth = 1
            continue
        if not code.strip("; \t"):
            continue
        if depth == 0:
            found = _TABLE_HEAD.fullmatch(code)
            if found is None:
                raise _Fallback
            if found[2] is None:
                family, name = "ip", _strip_quotes(found[1])
            elif found[1] in FAMILIES:
                family, name = found[1], _strip_quotes(found[2])
            else:
                raise _Fallback
            if f"{family} {name}" in table_keys:
                raise _Fallback
            table_keys.add(f"{family} {name}")
            entries = []
            names = set()
            tables.append([family, name, number, start, entries])
            depth = 1
            continue
        # depth 1: in a table
        if code == "}":
            depth = 0
            continue
        found = _BLOCK_HEAD.fullmatch(code)
        if found is not None:
            kind, name = found[1], _strip_quotes(found[2])
            key = ("chain" if kind == "chain" else "set", name)
            if key in names:
                raise _Fallback
            names.add(key)
            entry = [kind, name, number, start, 0]
            depth, nest, eager, in_chain = 2, 0, False, kind == "chain"
            continue
        entry = ["item", "", number, start, 0]
        nest = _braces(code, 0)
        if nest == 0:
            entry[4] = pos
            entries.append(entry)
        else:
            depth = 3
    if depth != 0:
        raise _Fallback
    return tables


def open_nft_ruleset(text: str, name: str) -> NftRuleset:
    """``nft list ruleset`` text, read lazily (see the module docstring); a text not laid out
    the way nft prints it is read whole (``parse_nft_ruleset``)."""
    try:
        return _build(text, name, _scan(text))
    except _Fallback:
        return parse_nft_ruleset(text, name)


def _build(text: str, name: str, tables: list) -> LazyNftRuleset:
    rs = LazyNftRuleset(name, text=text)
    xt_rules = 0
    for family, table_name, line, start, entries in tables:
        eol = text.find("\n", start)
        head = text[start:eol if eol >= 0 else len(text)].rstrip("\r")
        table = rs.tables[f"{family} {table_name}"] = NftTable(family, table_name,
                                                               Source(name, line, head))
        for kind, entry_name, eline, estart, eend in entries:
            if kind == "item":           # parsed now, with the whole-text parser's own code
                reader = _FileReader(text, name, estart, eend, eline)
                reader.ruleset = rs
                while True:
                    reader.skip_blank()
                    tok = reader.peek()
                    if tok is None:
                        break
                    reader.table_item(table, tok)
                xt_rules += reader.xt_rules
                continue
            block = _Block(kind, entry_name, eline, estart, eend, table, rs)
            if kind == "chain":
                if entry_name in table.chains:
                    raise _Fallback        # also defined by a table item parsed above
                table.chains[entry_name] = LazyChain(block)
            else:
                if entry_name in table.sets:
                    raise _Fallback
                table.sets[entry_name] = LazySet(block)
    rs.headed = [(t, c) for t in rs.tables.values() for c in t.chains.values()
                 if not isinstance(c, LazyChain)]
    if xt_rules:
        rs.caveats.append(
            f"{xt_rules} rules use iptables extensions that nft shows only as "
            "`# ...` comments (iptables-nft): `match-set` is read against the ipsets; the "
            "others stop the trace as UNKNOWN")
    rs.layout = {"format": LAYOUT_FORMAT, "size": len(text), "tables": tables}
    return rs


# ---------------------------------------------------------------------------------------------
# The stored layout


def from_layout(text: str, name: str, layout: dict) -> LazyNftRuleset:
    """The lazily read ruleset of ``text`` from its stored ``layout``, without the pass over
    the lines. A layout that does not fit the text (another text, a corrupt or hand-edited
    index) raises ValueError (then read the text: ``open_nft_ruleset``)."""
    if layout.get("format") != LAYOUT_FORMAT or layout.get("size") != len(text):
        raise ValueError("not this text's layout")
    tables = layout["tables"]
    if not isinstance(tables, list):
        raise ValueError("tables")
    size = len(text)
    prev_line, prev_off = 1, 0
    for family, table_name, line, start, entries in tables:
        if not (type(line) is int and type(start) is int and prev_off <= start < size
                and (start == 0 or text[start - 1] == "\n")
                and text.count("\n", prev_off, start) == line - prev_line):
            raise ValueError("table offsets")
        eol = text.find("\n", start)
        found = _TABLE_HEAD.fullmatch(text[start:eol if eol >= 0 else size].strip())
        if found is None or [family, table_name] != (
                ["ip", _strip_quotes(found[1])] if found[2] is None
                else [found[1], _strip_quotes(found[2])]):
            raise ValueError("table header")
        if not isinstance(entries, list):
            raise ValueError("entries")
        prev_line, prev_off = line, start
        for kind, entry_name, eline, estart, eend in entries:
            # where it starts and ends, and its line number, fit the text
            if not (type(eline) is int and type(estart) is int and type(eend) is int
                    and prev_off <= estart < eend <= size + 1 and text[estart - 1] == "\n"
                    and text.count("\n", prev_off, estart) == eline - prev_line):
                raise ValueError("offsets")
            if kind != "item":
                # the header names this block: `chain NAME {`; the last line is `}`
                head = estart
                while text[head] in " \t":
                    head += 1
                after = head + len(kind) + 1 + len(entry_name)
                if not (type(entry_name) is str and text.startswith(kind + " ", head)
                        and text.startswith(entry_name, head + len(kind) + 1)
                        and text[after:after + 1] in (" ", "{")):
                    eol = text.find("\n", estart)
                    found = _BLOCK_HEAD.fullmatch(text[estart:eol].strip())     # quoted name
                    if found is None or (found[1], _strip_quotes(found[2])) != (kind,
                                                                                 entry_name):
                        raise ValueError("block header")
                last = text.rfind("\n", estart, eend - 1) + 1
                if text[last:eend].strip() != "}":
                    raise ValueError("block end")
            elif entry_name != "":
                raise ValueError("item")
            prev_off = eend - 1 if eend > size else eend
            prev_line = eline + text.count("\n", estart, prev_off)
    try:
        return _build(text, name, tables)
    except _Fallback:
        raise ValueError("not this text's layout") from None
