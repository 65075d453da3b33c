"""Parsers for iproute2 outputs: ``ip rule``, ``ip route`` (``ip addr`` / ``ip link``: addr.py),
and the records all of them return.

Each parser takes ``(text, name)`` (``name`` is the bundle-relative file name) and returns
plain records that keep their ``source`` (file, line, raw text). A line that matches no known
form raises ``InputError`` naming the file, line and text. Attributes that do not change a
routing decision but that we do not know (new iproute2 keywords) are kept in ``extra``: a
newer iproute2 must not make a bundle unreadable.

Addresses are held as ``Prefix`` values (family, integer, length) so the lookup compares
integers, never strings.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cached_property
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from traceflow.model.errors import InputError, Source

# What `ip rule list` shows on a node nobody changed.
DEFAULT_IP_RULES = "0:\tfrom all lookup local\n32766:\tfrom all lookup main\n" \
                   "32767:\tfrom all lookup default\n"

# Well-known table ids (include/uapi/linux/rtnetlink.h); iproute2 prints these names.
TABLE_NAMES = {0: "unspec", 253: "default", 254: "main", 255: "local"}

# Route scopes, as numbers: the kernel compares them with < and >.
SCOPES = {"global": 0, "universe": 0, "site": 200, "link": 253, "host": 254, "nowhere": 255}

ROUTE_TYPES = ("unicast", "local", "broadcast", "anycast", "multicast", "blackhole",
               "unreachable", "prohibit", "throw", "nat", "xresolve")

IP_PROTOCOLS = {"icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50,
                "ah": 51, "ipv6-icmp": 58, "icmpv6": 58, "sctp": 132}


# --------------------------------------------------------------------------- value types

@dataclass(frozen=True)
class Prefix:
    """An IPv4 or IPv6 prefix as integers: ``addr in prefix`` is two integer operations."""

    family: int      # 4 or 6
    value: int       # network address
    length: int

    @property
    def bits(self) -> int:
        return 32 if self.family == 4 else 128

    @cached_property
    def mask(self) -> int:
        return ((1 << self.length) - 1) << (self.bits - self.length)

    def contains(self, family: int, addr: int) -> bool:
        return family == self.family and (addr & self.mask) == self.value

    @classmethod
    def parse(cls, text: str) -> "Prefix":
        """``10.0.0.0/24``, ``10.0.0.1`` (a host), ``default``, ``fe80::/64``."""
        if text == "default":
            raise ValueError("'default' has no family; use Prefix.default(family)")
        net = ipaddress.ip_network(text, strict=False)
        return cls(net.version, int(net.network_address), net.prefixlen)

    @classmethod
    def default(cls, family: int) -> "Prefix":
        return cls(family, 0, 0)

    def __str__(self) -> str:
        if self.length == 0:
            return "default"
        addr = ipaddress.ip_address(self.value) if self.family == 4 else \
            ipaddress.IPv6Address(self.value)
        return str(addr) if self.length == self.bits else f"{addr}/{self.length}"


@dataclass(frozen=True)
class Mark:
    """``fwmark VALUE/MASK``: a packet mark ``m`` matches when ``(m ^ value) & mask == 0``."""

    value: int
    mask: int = 0xFFFFFFFF

    def __contains__(self, mark: int) -> bool:
        return ((mark ^ self.value) & self.mask) == 0

    def __str__(self) -> str:
        return f"{self.value:#x}" if self.mask == 0xFFFFFFFF else f"{self.value:#x}/{self.mask:#x}"


def table_name(token: str) -> str:
    """iproute2 prints well-known tables by name; numbers and names must compare equal."""
    if token.isdigit():
        return TABLE_NAMES.get(int(token), str(int(token)))
    return token


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class IpRule:
    """One ``ip rule`` line. ``action`` is lookup, goto, nop, unreachable, prohibit or blackhole."""

    priority: int
    action: str | None
    source: Source
    table: str | None = None            # for "lookup"
    goto: int | None = None             # for "goto": the target priority
    invert: bool = False                # "not": the whole selector is negated
    src: Prefix | None = None           # None: "from all"
    dst: Prefix | None = None
    tos: int | None = None
    fwmark: Mark | None = None
    iif: str | None = None
    iif_detached: bool = False          # the device does not exist: the selector never matches
    oif: str | None = None
    oif_detached: bool = False
    l3mdev: bool = False
    uidrange: tuple[int, int] | None = None
    ipproto: int | None = None
    sport: tuple[int, int] | None = None
    dport: tuple[int, int] | None = None
    suppress_prefixlength: int | None = None
    protocol: str | None = None         # who installed the rule: a label, not a selector
    unknown: str | None = None          # a selector or action we do not model: lookup says so
    extra: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return self.source.text


@dataclass(frozen=True)
class NextHop:
    """One path of a route: a gateway and/or device, with a weight for multipath."""

    gateway: str | None
    dev: str | None
    weight: int = 1
    flags: frozenset = frozenset()      # onlink, dead, linkdown, pervasive ...
    source: Source | None = None        # the "nexthop ..." continuation line, if any

    @property
    def onlink(self) -> bool:
        return "onlink" in self.flags

    @property
    def dead(self) -> bool:
        return "dead" in self.flags


@dataclass(frozen=True)
class Route:
    """One route of ``ip route``. Multipath routes carry their paths in ``nexthops``."""

    family: int
    type: str
    dst: Prefix
    table: str
    source: Source
    gateway: str | None = None
    dev: str | None = None
    proto: str | None = None
    scope: str | None = None            # as printed; None means global (iproute2 omits it)
    prefsrc: str | None = None          # the "src" attribute: preferred source address
    metric: int = 0
    tos: int = 0
    src_prefix: Prefix | None = None    # IPv6 source-specific routes ("from ...")
    flags: frozenset = frozenset()
    nexthops: tuple[NextHop, ...] = ()  # multipath only; () when the route has one path
    attrs: tuple[tuple[str, str], ...] = ()   # mtu, advmss, pref, expires, ...: kept, not used
    extra: tuple[str, ...] = ()         # words we do not know, in order

    @property
    def text(self) -> str:
        return self.source.text

    @property
    def scope_value(self) -> int:
        return scope_number(self.scope) if self.scope else 0

    @property
    def onlink(self) -> bool:
        return "onlink" in self.flags

    def paths(self) -> tuple[NextHop, ...]:
        """The route's paths: its nexthops, or one path made of its own gateway and dev."""
        if self.nexthops:
            return self.nexthops
        return (NextHop(self.gateway, self.dev, 1, self.flags & PATH_FLAGS),)


@dataclass(frozen=True)
class Address:
    """One ``inet`` / ``inet6`` line of ``ip addr``."""

    family: int
    address: str
    prefixlen: int
    source: Source
    scope: str = "global"
    broadcast: str | None = None
    peer: str | None = None
    label: str | None = None
    flags: frozenset = frozenset()      # secondary, dynamic, noprefixroute, tentative ...

    @property
    def secondary(self) -> bool:
        return "secondary" in self.flags

    @property
    def scope_value(self) -> int:
        return scope_number(self.scope)

    @cached_property
    def value(self) -> int:
        return int(ipaddress.ip_address(self.address))

    @cached_property
    def network(self) -> Prefix:
        return Prefix.parse(f"{self.address}/{self.prefixlen}")

    @property
    def text(self) -> str:
        return self.source.text


@dataclass(frozen=True)
class Interface:
    """One device of ``ip addr`` / ``ip link`` (with its addresses, if the output has them)."""

    index: int
    name: str
    source: Source
    link: str | None = None             # what followed '@': "if9", "cilium_host", "NONE"
    flags: frozenset = frozenset()      # UP, LOWER_UP, NOARP, ...
    mtu: int | None = None
    state: str | None = None            # operstate: UP, DOWN, UNKNOWN
    master: str | None = None
    link_type: str | None = None        # "ether", "loopback", "none", ...
    mac: str | None = None
    link_netns: str | None = None
    kind: str | None = None             # veth, vxlan, geneve, dummy, openvswitch ... (ip -d)
    altnames: tuple[str, ...] = ()
    addresses: tuple[Address, ...] = ()
    details: tuple[str, ...] = ()       # other indented lines, kept verbatim
    detail_sources: tuple = ()          # where each of ``details`` was read (Source)

    @property
    def text(self) -> str:
        return self.source.text

    @property
    def is_up(self) -> bool:
        return "UP" in self.flags

    def ipv4(self) -> tuple[Address, ...]:
        return tuple(a for a in self.addresses if a.family == 4)

    def ipv6(self) -> tuple[Address, ...]:
        return tuple(a for a in self.addresses if a.family == 6)

    def of_family(self, family: int) -> tuple[Address, ...]:
        return tuple(a for a in self.addresses if a.family == family)


PATH_FLAGS = frozenset({"onlink", "dead", "linkdown", "pervasive"})


def scope_number(scope: str) -> int:
    return SCOPES[scope] if scope in SCOPES else int(scope)


# --------------------------------------------------------------------------- helpers

def _lines(text: str, name: str) -> Iterator[Source]:
    """Sources of the non-blank lines (1-based numbers; CR of CRLF files dropped)."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield Source(name, number, line)


class _Tokens:
    """A cursor over a line's words, raising located errors."""

    def __init__(self, words: list[str], source: Source):
        self.words, self.pos, self.source = words, 0, source

    def __bool__(self) -> bool:
        return self.pos < len(self.words)

    def peek(self) -> str | None:
        return self.words[self.pos] if self.pos < len(self.words) else None

    def next(self) -> str:
        word = self.peek()
        self.pos += 1
        return word

    def value(self, keyword: str) -> str:
        if self.peek() is None:
            raise InputError.at(self.source, f"'{keyword}' needs a value")
        return self.next()

    def decode(self, keyword: str, decoder: Callable[[str], object]):
        raw = self.value(keyword)
        try:
            return decoder(raw)
        except ValueError:
            raise InputError.at(self.source, f"bad value {raw!r} for '{keyword}'") from None


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def _proto(text: str) -> int:
    return IP_PROTOCOLS[text] if text in IP_PROTOCOLS else int(text)


def _address(text: str) -> str:
    return str(ipaddress.ip_address(text))


def _prefix_or_all(text: str) -> Prefix | None:
    return None if text == "all" else Prefix.parse(text)


def _mark(text: str) -> Mark:
    value, _, mask = text.partition("/")
    return Mark(int(value, 0), int(mask, 0) if mask else 0xFFFFFFFF)


# --------------------------------------------------------------------------- ip rule

_RULE_LINE = re.compile(r"^\s*(\d+):\s*(.*)$")

# selector keyword -> (IpRule field, decoder)
_RULE_SELECTORS = {
    "from": ("src", _prefix_or_all),
    "to": ("dst", _prefix_or_all),
    "tos": ("tos", lambda v: int(v, 16)),
    "dsfield": ("tos", lambda v: int(v, 16)),
    "fwmark": ("fwmark", _mark),
    "iif": ("iif", str),
    "oif": ("oif", str),
    "uidrange": ("uidrange", _range),
    "ipproto": ("ipproto", _proto),
    "sport": ("sport", _range),
    "dport": ("dport", _range),
    "suppress_prefixlength": ("suppress_prefixlength", int),
    "proto": ("protocol", str),
    "protocol": ("protocol", str),
}
_RULE_REJECTS = ("unreachable", "prohibit", "blackhole")
# Selectors the kernel has but a snapshot cannot evaluate: the lookup reports "unknown".
_RULE_UNMODELLED = {"tun_id", "suppress_ifgroup", "flowlabel", "dscp", "map-to", "nat"}
_RULE_IGNORED = {"realms"}   # accounting only: does not change the decision
_RULE_KEYWORDS = (set(_RULE_SELECTORS) | _RULE_UNMODELLED | _RULE_IGNORED | set(_RULE_REJECTS)
                  | {"not", "l3mdev", "lookup", "table", "goto", "nop"})


def parse_ip_rules(text: str, name: str) -> list[IpRule]:
    """Parse ``ip rule list`` / ``ip rule show`` output, in the kernel's order."""
    return [_parse_rule(src) for src in _lines(text, name)]


def _parse_rule(source: Source) -> IpRule:
    match = _RULE_LINE.match(source.text)
    if not match:
        raise InputError.at(source, "not an 'ip rule' line (expected 'PRIORITY: selector action')")
    fields: dict = {"priority": int(match.group(1)), "action": None, "source": source}
    unknown, extra = [], []
    tokens = _Tokens(match.group(2).split(), source)
    while tokens:
        word = tokens.next()
        if word in _RULE_SELECTORS:
            name, decoder = _RULE_SELECTORS[word]
            fields[name] = tokens.decode(word, decoder)
            if word in ("iif", "oif") and tokens.peek() == "[detached]":
                tokens.next()
                fields[f"{word}_detached"] = True
        elif word == "not":
            fields["invert"] = True
        elif word == "l3mdev":
            fields["l3mdev"] = True
        elif word in ("lookup", "table"):
            fields["action"], fields["table"] = "lookup", table_name(tokens.value(word))
            # iproute2 shows an l3mdev rule as "lookup [l3mdev-table]": the VRF picks the table
            fields["l3mdev"] = fields.get("l3mdev") or fields["table"] == "[l3mdev-table]"
        elif word == "goto":
            fields["action"], fields["goto"] = "goto", tokens.decode(word, int)
            if tokens.peek() == "[unresolved]":
                tokens.next()
        elif word == "nop" or word in _RULE_REJECTS:
            fields["action"] = word
        elif word in _RULE_IGNORED:
            extra += [word, tokens.value(word)]
        elif word in _RULE_UNMODELLED:
            value = tokens.value(word)
            unknown.append(f"'{word} {value}' is not modelled")
            extra += [word, value]
        else:
            # a new keyword: take the next word as its value unless it is a keyword we know
            words = [word]
            if tokens.peek() is not None and tokens.peek() not in _RULE_KEYWORDS:
                words.append(tokens.next())
            unknown.append(f"unknown keyword '{' '.join(words)}'")
            extra += words
    if fields["action"] is None and not unknown:
        unknown.append("the rule has no action")
    return IpRule(**fields, unknown="; ".join(unknown) or None, extra=tuple(extra))


# --------------------------------------------------------------------------- ip route

# Attributes with one value that the lookup does not need: kept in Route.attrs.
_ROUTE_ATTRS = {"pref", "expires", "error", "hoplimit", "advmss", "initcwnd", "initrwnd",
                "rtt", "rttvar", "rto_min", "reordering", "window", "cwnd", "ssthresh",
                "realms", "features", "quickack", "fastopen_no_cookie", "ttl-propagate",
                "nhid", "uid", "congctl", "as", "mtu", "age", "used", "users"}
_ROUTE_FLAGS = {"onlink", "pervasive", "linkdown", "dead", "offload", "trap", "rt_offload",
                "rt_trap", "rt_offload_failed", "notify", "unresolved"}
# Words that end an "encap ..." description (whose own words, like "src", must not be
# mistaken for route attributes).
_ENCAP_END = {"via", "dev", "nhid", "table", "proto", "scope", "metric", "onlink", "weight"}
_V6_ONLY = {"pref", "expires", "hoplimit", "error"}


@dataclass
class _RouteDraft:
    """A route being read: plain mutable fields, turned into a frozen Route at the end."""

    fields: dict
    nexthops: list = field(default_factory=list)
    attrs: list = field(default_factory=list)
    extra: list = field(default_factory=list)
    flags: set = field(default_factory=set)


class RoutingTables:
    """All routes of a node, by table name, with per-table prefix indexes for the lookup."""

    def __init__(self, routes: Iterable[Route] = (), notes: Iterable[str] = ()):
        self.routes: list[Route] = list(routes)
        self.notes: list[str] = list(notes)     # e.g. ignored "cache" lines
        self._by_table: dict[str, list[Route]] = {}
        for route in self.routes:
            self._by_table.setdefault(route.table, []).append(route)
        self._indexes: dict = {}

    def names(self) -> list[str]:
        return list(self._by_table)

    def table(self, name: str) -> list[Route]:
        return self._by_table.get(table_name(name), [])

    def __contains__(self, name: str) -> bool:
        return table_name(name) in self._by_table

    def __iter__(self) -> Iterator[Route]:
        return iter(self.routes)

    def __len__(self) -> int:
        return len(self.routes)

    def merge(self, *others: "RoutingTables") -> "RoutingTables":
        """One set of tables from several dumps (e.g. one file per ``ip route show table N``)."""
        routes, notes = list(self.routes), list(self.notes)
        for other in others:
            routes += other.routes
            notes += other.notes
        return RoutingTables(routes, notes)

    def index(self, names: str | tuple[str, ...], family: int) -> "PrefixIndex | None":
        """The longest-prefix-match index of one table, or of several searched as one (the
        kernel merges local and main while no rule was added), built on first use."""
        names = (names,) if isinstance(names, str) else names
        key = (names, family)
        if key not in self._indexes:
            routes = [r for name in names for r in self._by_table.get(name, ())
                      if r.family == family]
            self._indexes[key] = PrefixIndex(routes, 32 if family == 4 else 128) if routes else None
        return self._indexes[key]


def _table_id(name: str) -> int:
    ids = {v: k for k, v in TABLE_NAMES.items()}
    return ids.get(name, int(name) if name.isdigit() else 0)


class PrefixIndex:
    """Routes bucketed by prefix length, then by network integer.

    The lookup walks lengths from longest to shortest and does one dict lookup per length.
    Within a bucket the kernel's alias order holds: higher table id first (when tables are
    merged), then routes with a TOS, then lowest metric; equal keys keep dump order.
    """

    def __init__(self, routes: list[Route], bits: int):
        self.buckets: dict[int, dict[int, list[Route]]] = {}
        for route in routes:
            bucket = self.buckets.setdefault(route.dst.length, {})
            bucket.setdefault(route.dst.value, []).append(route)
        for bucket in self.buckets.values():
            for key, same in bucket.items():
                bucket[key] = sorted(same, key=lambda r: (-_table_id(r.table), -r.tos, r.metric))
        self.lengths = sorted(self.buckets, reverse=True)
        self.masks = {n: ((1 << n) - 1) << (bits - n) for n in self.lengths}

    def candidates(self, addr: int) -> Iterator[list[Route]]:
        """Route lists whose prefix contains ``addr``, longest prefix first."""
        for length in self.lengths:
            same = self.buckets[length].get(addr & self.masks[length])
            if same:
                yield same


def parse_ip_routes(text: str, name: str, default_table: str = "main",
                    family: int | None = None) -> RoutingTables:
    """Parse ``ip route show table all``, ``ip route``, ``ip route show table X``, ``ip -6 route``.

    Routes without a ``table`` attribute belong to ``default_table`` (``main`` for a plain
    ``ip route`` and ``table all``; pass the table for ``ip route show table X`` outputs).
    ``family`` 6 reads ``ip -6 route`` output: a line that names no address (``unreachable
    default dev lo ...``) is IPv6 there.
    """
    default_table = table_name(default_table)
    drafts: list[_RouteDraft] = []
    notes: list[str] = []
    family_hint = family or 4
    for source in _lines(text, name):
        # iproute2 -o joins continuation lines with a backslash
        parts = source.text.split("\\")
        head, rest = parts[0], parts[1:]
        if head[:1].isspace():
            _route_continuation(head, source, drafts, notes)
        else:
            draft = _parse_route_head(head, source, default_table, family_hint)
            family_hint = draft.fields["family"]
            drafts.append(draft)
        for part in rest:
            _route_continuation(part, source, drafts, notes)
    return RoutingTables([_finish_route(d) for d in drafts], notes)


def _route_continuation(part: str, source: Source, drafts: list, notes: list) -> None:
    words = part.split()
    if not words:
        return
    if words[0] == "cache":
        notes.append(f"{source.file}:{source.line}: route cache line ignored")
        return
    if words[0] == "nexthop" and drafts:
        drafts[-1].nexthops.append(_parse_nexthop(_Tokens(words[1:], source), source))
        return
    raise InputError.at(source, "not an 'ip route' line (indented, but not 'nexthop ...')")


def _parse_route_head(line: str, source: Source, default_table: str,
                      family_hint: int) -> _RouteDraft:
    tokens = _Tokens(line.split(), source)
    route_type = "unicast"
    if tokens.peek() in ROUTE_TYPES:
        route_type = tokens.next()
    dst_text = tokens.peek()
    if dst_text is None:
        raise InputError.at(source, "not an 'ip route' line (no destination)")
    tokens.next()
    draft = _RouteDraft({"type": route_type, "table": default_table, "source": source})
    if dst_text != "default":
        try:
            draft.fields["dst"] = Prefix.parse(dst_text)
        except ValueError:
            raise InputError.at(source, f"not an 'ip route' line ({dst_text!r} is not a "
                                        "destination)") from None
    while tokens:
        _route_word(tokens.next(), tokens, draft, source)
    family = _route_family(draft, family_hint)
    draft.fields["family"] = family
    draft.fields.setdefault("dst", Prefix.default(family))
    return draft


def _route_word(word: str, tokens: _Tokens, draft: _RouteDraft, source: Source) -> None:
    """Read one attribute of a route line into the draft."""
    fields = draft.fields
    if word == "via":
        fields["gateway"] = _via(tokens, source, draft)
    elif word in ("dev", "proto", "scope"):
        fields[word] = tokens.value(word)
    elif word == "table":
        fields["table"] = table_name(tokens.value(word))
    elif word == "src":
        fields["prefsrc"] = tokens.decode(word, _address)
    elif word == "metric" or word == "priority":
        fields["metric"] = tokens.decode(word, int)
    elif word in ("tos", "dsfield"):
        fields["tos"] = tokens.decode(word, lambda v: int(v, 16))
    elif word == "from":
        fields["src_prefix"] = tokens.decode(word, Prefix.parse)
    elif word in _ROUTE_FLAGS:
        draft.flags.add(word)
    elif word in _ROUTE_ATTRS:
        value = tokens.value(word)
        if value == "lock":            # "mtu lock 1400": the metric is locked
            value = f"lock {tokens.value(word)}"
        draft.attrs.append((word, value))
    elif word == "nexthop":            # -o output keeps nexthops on the route line
        draft.nexthops.append(_parse_nexthop(tokens, source))
    elif word == "encap":
        words = []
        while tokens and tokens.peek() not in _ENCAP_END:
            words.append(tokens.next())
        draft.extra += ["encap", *words]
    else:
        draft.extra.append(word)


def _via(tokens: _Tokens, source: Source, draft: "_RouteDraft | None" = None) -> str:
    """``via 10.0.0.1``, or ``via inet6 fe80::1``: iproute2 names the gateway's family only
    when it differs from the route's (an IPv4 route over an IPv6 next hop, RFC 5549)."""
    if tokens.peek() in ("inet", "inet6"):
        other = tokens.next()
        if draft is not None:
            draft.fields["family"] = 6 if other == "inet" else 4
    return tokens.decode("via", _address)


def _parse_nexthop(tokens: _Tokens, source: Source) -> NextHop:
    gateway = dev = None
    weight, flags = 1, set()
    while tokens:
        word = tokens.next()
        if word == "via":
            gateway = _via(tokens, source)
        elif word == "dev":
            dev = tokens.value(word)
        elif word == "weight":
            weight = tokens.decode(word, int)
        elif word == "nexthop":        # -o: the next path starts on the same line
            tokens.pos -= 1
            break
        elif word in _ROUTE_FLAGS:
            flags.add(word)
        # anything else on a nexthop line (realms, encap ...) does not choose the path
    return NextHop(gateway, dev, weight, frozenset(flags), source)


def _route_family(draft: _RouteDraft, hint: int) -> int:
    """IPv4 or IPv6: from an address on the line, IPv6-only attributes, else the line before
    (``ip route show table all`` lists IPv4 routes, then IPv6 ones)."""
    fields = draft.fields
    if "family" in fields:                       # set by "via inet6 ..."
        return fields["family"]
    for key in ("dst", "src_prefix"):
        if key in fields:
            return fields[key].family
    for key in ("prefsrc", "gateway"):
        if key in fields:
            return 6 if ":" in fields[key] else 4
    if any(key in _V6_ONLY for key, _ in draft.attrs):
        return 6
    return hint


def _finish_route(draft: _RouteDraft) -> Route:
    nexthops = tuple(draft.nexthops)
    if len(nexthops) == 1 and not draft.fields.get("dev"):
        # one "nexthop" line (a route using a nexthop object): it is the route's only path
        hop = nexthops[0]
        draft.fields.update(gateway=hop.gateway, dev=hop.dev)
        draft.flags |= hop.flags
        nexthops = ()
    return Route(**draft.fields, flags=frozenset(draft.flags), nexthops=nexthops,
                 attrs=tuple(draft.attrs), extra=tuple(draft.extra))
