"""The big BPF map dumps read by key: a trace parses the lines it asks for, not 50,000.

A cluster of 20k Services and 50k ipcache entries prints 60k lines of `bpf lb list` (and as
many of `--frontends`), 50k of `bpf ipcache list` and 10k of `bpf policy get` on every node; a
trace asks a few frontends, a few addresses and one or two endpoints' policy maps. One pass
over a file's lines (its *layout*, a JSON value the bundle index stores keyed by the text's
SHA-256, as it stores iptables layouts) finds where each key's lines are:

- `bpf lb list` and `--frontends` (one line per slot: 1.16+): the lines of each frontend
  (address, port); the lines of a frontend are grouped by the same code as the whole file
  (lb._group), so each LbService is the one the whole parse makes.
- `bpf ipcache list`: the lines of each IPv4 prefix by its length and network; a lookup
  reads the prefixes that can hold the address (one per length present), longest first as
  ``ipcache_lookup4``'s LPM does; prefixes not laid out (IPv6, ``@cluster``, host bits set)
  are read for every lookup.
- `bpf policy get --all`: each endpoint's sections (a map's header starts afresh, so a
  section parses alone as in the whole file), and the lines before the first section.

The pass checks every line's whole shape with the whole parser's own patterns (and, for
`bpf lb list`, the grouping rules: one slot-0 entry per frontend, no slot twice); a file with
any line or form it does not lay out (another version's layout, a continuation line, JSON,
a line separator other than newline, a bad line) has no layout (None), and the caller parses
it whole as before, so a bad line gives the same located error.
"""

from __future__ import annotations

import re
import socket

from traceflow.model.errors import InputError, Source

from . import lb as _lb
from . import maps as _maps
from . import policy as _policy
from .common import MAX_LINE, PROTOS, is_json

LAYOUT_VERSION = 1
# str.splitlines() splits on these too (common.lines numbers lines by it): a file holding one
# is not laid out (its line numbers would differ)
_OTHER_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

_ADDR = r"(?:\[[0-9a-fA-F:.]+\]|[0-9.]+|[0-9a-fA-F:]+)"
_PROTO = r"[A-Z][A-Za-z0-9]*"
# lb._split_key_value then lb._KEY on the key, in one pattern (no whitespace before the key: a
# continuation line is not laid out)
_LB_KEY = (r"(?P<key>(?P<kip>" + _ADDR + r"):(?P<kport>\d+)(?:/(?P<kproto>" + _PROTO
           + r"))?(?P<kscope>/i)?(?:\s\((?P<kslot>\d+)\))?)")
# the three entries lb._group knows (lb._MASTER, lb._NOT_FOUND, lb._BACKEND)
_LB_LINE = re.compile(
    r"^" + _LB_KEY + r"\s+(?:"
    r"(?P<master>(?:0\.0\.0\.0|\[::\]|::):0\s+\(\d+\)(?:\s+\((?P<mslot>\d+)\))?"
    r"(?:\s+\[[^\]]*\])?(?:\s+\(L7LB Proxy Port: \d+\))?)"
    r"|(?P<missing>backend \d+ not found)"
    r"|(?:" + _ADDR + r":\d+(?:/(?P<bproto>" + _PROTO + r"))?\s+\(\d+\)"
    r"(?:\s+\((?P<bslot>\d+)\))?))\s*$")
_FE_LINE = re.compile(
    r"^" + _LB_KEY + r"\s+\d+(?:\s+\d+(?:\[\d+\])?)?\s+\(\d+\)\s+"
    r"\[(?:FLAGS:\s*0x[0-9a-fA-F]+|0x[0-9a-fA-F]+\s+0x[0-9a-fA-F]+)\]\s*$")
_KNOWN_PROTOS = frozenset(p.upper() for p in PROTOS)

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_V4 = rf"(?:{_OCTET}\.){{3}}{_OCTET}"
# maps._KV_VALUE without a State column (the `list` form), every value key=value of a known
# field, numbers that int() reads, a tunnel endpoint that is an IPv4 address or 0.0.0.0
_NODEID = r"nodeid=(?:0[xX][0-9a-fA-F]+|0|[1-9]\d*)"
_IPCACHE_LINE = re.compile(
    r"^\s*(?P<prefix>[0-9a-fA-F:.]+/\d+)(?P<cluster>@\d+)?\s+identity=\d+,?"
    r"(?:\s+encryptkey=\d+,?)?(?:\s+tunnelendpoint=" + _V4 + r",?)?(?:\s+" + _NODEID + r",?)?"
    r"(?:\s+flags=[\x21-\x3c\x3e-\x7e]*)?(?:\s+" + _NODEID + r",?)?\s*$", re.A)
_V4_PREFIX = re.compile(rf"^({_V4})/(\d+)$", re.A)

_POLICY_SECTION = re.compile(r"^[^\S\n]*(?:Endpoint ID:|\S*cilium_policy)", re.M)


def _rows(text: str) -> list[str] | None:
    """The file's lines as common.lines numbers them (1-based: rows[n - 1]), or None when it
    cannot be laid out (JSON, another line separator, a line too long)."""
    if is_json(text) or _OTHER_BREAKS.search(text):
        return None
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    if rows and max(map(len, rows)) > MAX_LINE:
        return None
    return rows


def _header_then(rows: list[str], header: re.Pattern) -> int | None:
    """The index of the first row after the header (the first non-blank row), or None."""
    for i, raw in enumerate(rows):
        if raw.strip():
            return i + 1 if header.match(raw.rstrip()) else None
    return None


# ---- bpf lb list, --frontends ---------------------------------------------------------------

_LB_HEADER = re.compile(r"^SERVICE ADDRESS\s+BACKEND ADDRESS(?:\s+\(REVNAT_ID\)\s+\(SLOT\))?\s*$")
_FE_HEADER = re.compile(r"^SERVICE ADDRESS\s+BACKEND ID\s*$")


def _matched_lines(text: str, header, line) -> tuple | None:
    """(the rows, [(line number, match of ``line``)]) of a dump that opens with ``header``,
    or None when it does not, or a line that is not blank does not match (parse it whole)."""
    rows = _rows(text)
    first = _header_then(rows, header) if rows is not None else None
    if first is None:
        return None
    out = []
    match = line.match
    for n, raw in enumerate(rows[first:], first + 1):
        m = match(raw)
        if m is None:
            if raw.strip():
                return None
            continue
        out.append((n, m))
    return rows, out


def lb_layout(text: str) -> dict | None:
    """{"lines": N, "keys": {"address port": [line numbers]}} of `bpf lb list` with a slot in
    every key (1.16+), or None (parse it whole)."""
    matched = _matched_lines(text, _LB_HEADER, _LB_LINE)
    if matched is None:
        return None
    rows, lines = matched
    keys: dict = {}
    masters, slots, groups = set(), set(), set()
    for n, m in lines:
        kslot, proto = m.group("kslot"), m.group("kproto")
        if kslot is None or (proto is not None and proto.upper() not in _KNOWN_PROTOS):
            return None
        kip, kport = m.group("kip").strip("[]"), int(m.group("kport"))
        gkey = (kip, kport, proto, m.group("kscope"))
        groups.add(gkey)
        if m.group("master") is not None:
            mslot = m.group("mslot")
            if kslot != "0" or (mslot is not None and mslot != "0") or gkey in masters:
                return None
            masters.add(gkey)
        elif m.group("missing") is None:
            bslot, bproto = m.group("bslot"), m.group("bproto")
            if (bslot is not None and int(bslot) != int(kslot)) or (gkey, int(kslot)) in slots \
                    or (bproto is not None and bproto.upper() not in _KNOWN_PROTOS):
                return None
            slots.add((gkey, int(kslot)))
        keys.setdefault(f"{kip} {kport}", []).append(n)
    if groups - masters:
        return None                 # slots without the service's slot-0 entry
    return {"v": LAYOUT_VERSION, "lines": len(rows), "keys": keys}


def frontends_layout(text: str) -> dict | None:
    """The same layout of `bpf lb list --frontends` (1.16+: a slot in every key)."""
    matched = _matched_lines(text, _FE_HEADER, _FE_LINE)
    if matched is None:
        return None
    rows, lines = matched
    keys: dict = {}
    for n, m in lines:
        if m.group("kslot") is None:
            return None
        keys.setdefault(f"{m.group('kip').strip('[]')} {int(m.group('kport'))}", []).append(n)
    return {"v": LAYOUT_VERSION, "lines": len(rows), "keys": keys}


class _Keyed:
    """Lines of one file by key, parsed on first use per key. A stored layout whose numbers
    do not fit the file (a damaged index) is not trusted: the file is parsed whole instead."""

    def __init__(self, text: str, path: str, layout: dict):
        self.path, self.text = path, text
        self.rows = text.split("\n")
        if self.rows and self.rows[-1] == "":
            self.rows.pop()
        if not isinstance(layout, dict) or layout.get("v") != LAYOUT_VERSION \
                or layout.get("lines") != len(self.rows):
            raise ValueError("the layout is not this file's")
        self.layout = layout
        self._cache: dict = {}
        self._whole = None

    def _lines(self, numbers) -> list[int]:
        """Line numbers from the layout, checked (ValueError: the layout does not fit)."""
        if not isinstance(numbers, (list, tuple)) or not all(
                type(n) is int and 0 < n <= len(self.rows) for n in numbers):
            raise ValueError("the layout does not fit the file")
        return list(numbers)

    def _get(self, table: str, key: str) -> list[int]:
        found = self.layout.get(table)
        if not isinstance(found, dict):
            raise ValueError("the layout does not fit the file")
        return self._lines(found.get(key, ()))

    def _source(self, n: int) -> Source:
        return Source(self.path, n, self.rows[n - 1])

    def _rows_of(self, numbers) -> list:
        """(Source, key text, value text) of `bpf lb list` lines, as lb.parse_lb_list splits
        them."""
        rows = []
        for n in numbers:
            src = self._source(n)
            rows.append((src, *_lb._split_key_value(src, src.text.rstrip())))
        return rows

    def whole(self, parse):
        if self._whole is None:
            self._whole = parse(self.text, self.path)
        return self._whole


class _ByFrontend(_Keyed):
    """A dump keyed by frontend: ``at(address, port)`` -> its entries as the whole parse
    makes them, in file order (``_whole_parse``, ``_build``: the whole parse, and the entries
    of some rows)."""

    def _whole_parse(self, text: str, path: str) -> list:
        raise NotImplementedError

    def _build(self, rows: list) -> list:
        raise NotImplementedError

    def at(self, ip: str, port: int) -> list:
        key = f"{ip} {port}"
        if key not in self._cache:
            def from_whole():
                return [e for e in self.whole(self._whole_parse)
                        if (e.frontend_ip, e.port) == (ip, port)]
            try:
                numbers = self._get("keys", key)
            except ValueError:
                self._cache[key] = from_whole()
                return self._cache[key]
            try:
                found = self._build(self._rows_of(numbers))
            except InputError:      # lines of a damaged layout: the whole parse says
                found = [None]
            if any(e is None or (e.frontend_ip, e.port) != (ip, port) for e in found):
                found = from_whole()                                  # a damaged layout
            self._cache[key] = found
        return self._cache[key]


class LbIndex(_ByFrontend):
    """`bpf lb list` by frontend: ``at(address, port)`` -> the LbServices of that address and
    port (every protocol and scope), as the whole parse makes them, in file order."""

    def _whole_parse(self, text: str, path: str) -> list:
        return _lb.parse_lb_list(text, path)

    def _build(self, rows: list) -> list:
        return _lb._group(rows, self.path)


class FrontendIndex(_ByFrontend):
    """`bpf lb list --frontends` by frontend: ``at(address, port)`` -> its LbFrontendSlots."""

    def _whole_parse(self, text: str, path: str) -> list:
        return _lb.parse_lb_frontends(text, path)

    def _build(self, rows: list) -> list:
        return _lb.frontend_slots(rows)


# ---- bpf ipcache list ------------------------------------------------------------------------

_IPCACHE_HEADER = re.compile(r"^\s*IP PREFIX/ADDRESS\s+IDENTITY\s*$")


def _v4_int(text: str) -> int:
    return int.from_bytes(socket.inet_aton(text), "big")


def ipcache_layout(text: str) -> dict | None:
    """{"lines": N, "nets": {"length": {"network as an integer": [line numbers]}}, "other":
    [line numbers]} of `bpf ipcache list` (1.12+ key=value values), or None."""
    matched = _matched_lines(text, _IPCACHE_HEADER, _IPCACHE_LINE)
    if matched is None:
        return None
    rows, lines = matched
    nets: dict = {}
    other = []
    v4 = _V4_PREFIX.match
    for n, m in lines:
        p = v4(m.group("prefix")) if m.group("cluster") is None else None
        length = int(p.group(2)) if p else 33
        if length > 32:
            other.append(n)          # IPv6, another cluster's, not a prefix: every lookup
            continue
        net = _v4_int(p.group(1))
        if net & ((1 << (32 - length)) - 1):
            other.append(n)          # host bits set (ip_network(strict=False) clears them)
            continue
        nets.setdefault(str(length), {}).setdefault(str(net), []).append(n)
    return {"v": LAYOUT_VERSION, "lines": len(rows), "nets": nets, "other": other}


class IpcacheIndex(_Keyed):
    """`bpf ipcache list` by address: ``candidates(ip)`` -> the entries whose prefix may hold
    it (in file order), for lookup.ipcache_lookup to choose the longest from."""

    def candidates(self, ip: str) -> list:
        if ip not in self._cache:
            try:
                numbers = self._numbers(ip)
            except ValueError:
                self._cache[ip] = self.whole(_maps.parse_ipcache)
                return self._cache[ip]
            try:
                out = [_maps._ipcache_entry(self.rows[n - 1].strip(), self._source(n))
                       for n in sorted(numbers)]
            except InputError:      # lines of a damaged layout: the whole parse says
                out = None
            if out is None or not self._fits(ip, out, set(numbers) - set(self.layout["other"])):
                out = self.whole(_maps.parse_ipcache)        # a damaged layout
            self._cache[ip] = out
        return self._cache[ip]

    @staticmethod
    def _fits(ip: str, entries: list, keyed_lines: set) -> bool:
        """Each entry the layout filed under a network holding ``ip`` does hold it."""
        import ipaddress
        addr = ipaddress.ip_address(ip)
        for e in entries:
            if e.source.line in keyed_lines:
                net = ipaddress.ip_network(e.prefix, strict=False)
                if addr.version != net.version or addr not in net:
                    return False
        return True

    def _numbers(self, ip: str) -> list[int]:
        numbers = self._lines(self.layout.get("other"))
        try:
            addr = _v4_int(ip) if _V4_PREFIX.match(f"{ip}/32") else None
        except OSError:
            addr = None
        if addr is not None:
            nets = self.layout.get("nets")
            if not isinstance(nets, dict):
                raise ValueError("the layout does not fit the file")
            for length in nets:
                if not (isinstance(length, str) and length.isdigit() and int(length) <= 32):
                    raise ValueError("the layout does not fit the file")
                bits = 32 - int(length)
                numbers += self._get_in(nets[length], str(addr >> bits << bits))
        return numbers

    def _get_in(self, table, key: str) -> list[int]:
        if not isinstance(table, dict):
            raise ValueError("the layout does not fit the file")
        return self._lines(table.get(key, ()))


# ---- bpf policy get --all --------------------------------------------------------------------

def policy_layout(text: str) -> dict | None:
    """{"lines": N, "first": the first section's line, "sections": [[endpoint, first line,
    last line], ...]} of `bpf policy get --all`, or None. A section starts where the whole
    parse starts one (policy.policy_rows: ``Endpoint ID: N`` or a map path ending in
    ``cilium_policy_NNNNN``); everything it reads resets there."""
    rows = _rows(text)
    if rows is None:
        return None
    starts = []
    line, at = 1, 0
    for m in _POLICY_SECTION.finditer(text):
        line += text.count("\n", at, m.start())
        at = m.start()
        endpoint = _section_of(rows[line - 1])
        if endpoint is not None:
            starts.append((endpoint, line))
    sections = [[ep, first, (starts[i + 1][1] - 1 if i + 1 < len(starts) else len(rows))]
                for i, (ep, first) in enumerate(starts)]
    return {"v": LAYOUT_VERSION, "lines": len(rows),
            "first": starts[0][1] if starts else len(rows) + 1, "sections": sections}


class PolicyIndex(_Keyed):
    """`bpf policy get --all` by endpoint: ``of(endpoint id)`` -> PolicyRows of the lines
    before the first section and of that endpoint's sections: its entries and the unreadable
    rows that may be its, as the whole parse gives them (in the same order)."""

    def of(self, endpoint_id: int):
        if endpoint_id not in self._cache:
            try:
                spans = self._spans(endpoint_id)
            except ValueError:
                self._cache[endpoint_id] = self.whole(_policy.parse_policy_get)
                return self._cache[endpoint_id]

            def sources():
                for first, last in spans:
                    for n in range(first, last + 1):
                        if self.rows[n - 1].strip():
                            yield self._source(n)
            self._cache[endpoint_id] = _policy.policy_rows(sources())
        return self._cache[endpoint_id]

    def _spans(self, endpoint_id: int) -> list[tuple[int, int]]:
        first, sections = self.layout.get("first"), self.layout.get("sections")
        if type(first) is not int or not 0 < first <= len(self.rows) + 1 \
                or not isinstance(sections, list):
            raise ValueError("the layout does not fit the file")
        spans = [(1, first - 1)]
        for section in sections:
            if not (isinstance(section, list) and len(section) == 3):
                raise ValueError("the layout does not fit the file")
            ep, start, last = section
            if ep == endpoint_id:
                self._lines([start, last])
                if _section_of(self.rows[start - 1]) != endpoint_id:
                    raise ValueError("the layout does not fit the file")
                spans.append((start, last))
        return spans


def _section_of(raw: str) -> int | None:
    """The endpoint a line starts a section of (as policy.policy_rows reads it), or None."""
    s = raw.strip()
    e = re.match(r"^Endpoint ID:\s*(\d+)$", s)
    if e is None and re.match(r"^Path:\s*(\S+)$", s) is None:
        e = re.match(r"^\S*cilium_policy(?:_v2)?_(\d+):?$", s)
    return int(e.group(1)) if e is not None else None
