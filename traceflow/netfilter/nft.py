"""nftables: the model (tables, chains, rules, sets and maps), its parser and its simulator.

Input is what ``nft list ruleset`` (or ``nft list table ip kube-proxy``) prints, with or without
``-a`` handles, including iptables-nft tables whose xtables extensions nft can only show as
``# match-set KUBE-CLUSTER-IP dst,dst`` comments.

Parsing keeps every rule, with its ``Source`` (file, line, text). What is not modelled becomes an
``Unknown`` expression that the simulator turns into an UNKNOWN step (and a ``NotModelled``
diagnostic); what is not nftables at all (garbage lines, unbalanced braces, unterminated strings)
is a ``RuleSyntaxError`` diagnostic that ``NftRuleset.raise_for_errors()`` raises.

The grammar is table-driven: ``_PAYLOAD``/``_META``/``_CT`` map selectors (``ip daddr``,
``meta l4proto``, ``ct state``) to a value type and a getter; ``_STATEMENTS`` maps statement
keywords to their readers; set element values are compiled into ``Pattern`` values by type.

``NftRuleset.evaluate_hook`` runs the base chains attached to a hook in priority order and
returns the same ``Branch``/``Step``/``NatAction`` values as the iptables engine: one branch per
outcome, forking only at ``numgen`` (kube-proxy's endpoint choice), weights multiplied along.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from traceflow.errors import InputError, Source
from traceflow.netfilter.engine import (MAX_BRANCHES, MAX_DEPTH, Branch, NatAction, NodeContext,
                                        Step, Walk, _Budget,
                                        _hostport, _range_note)
from traceflow.netfilter.iptables import (
    Diagnosed,
    NatTo,
    NotModelled,
    RuleSyntaxError,
    SetMatch,
    nat_to,
)
from traceflow.netfilter.numgen import numgen_groups
from traceflow.packet import PROTO_NUMBERS, Packet

FAMILIES = ("ip", "ip6", "inet", "arp", "bridge", "netdev")
HOOKS = ("prerouting", "input", "forward", "output", "postrouting")
# the families whose base chains see an IPv4 / IPv6 packet at the five IP hooks
_IP_FAMILIES = {"ip": ("ip", "inet"), "ip6": ("ip6", "inet")}
PRIORITY_NAMES = {"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50,
                  "srcnat": 100}
BRIDGE_PRIORITY_NAMES = {"dstnat": -300, "filter": -200, "out": 100, "srcnat": 300}

# what well-known marking chains mean, shown next to their mark step
CHAIN_MEANINGS = {"mark-for-masquerade": "masquerade on the way out",
                  "KUBE-MARK-MASQ": "masquerade on the way out",
                  "KUBE-MARK-DROP": "drop in the filter table"}


class _Unparsed(ValueError):
    """A construct inside a rule that the reader cannot split into known expressions."""


# ---------------------------------------------------------------------------------------------
# Value types: what a set element or a right-hand side means, and whether a packet value is in it


_PROTOCOLS = {**PROTO_NUMBERS, "icmpv6": 58, "ipv6-icmp": 58, "udplite": 136, "dccp": 33,
              "gre": 47, "esp": 50, "ah": 51, "igmp": 2, "ipip": 4, "ospf": 89, "vrrp": 112}
_SERVICES = {"ftp": 21, "ssh": 22, "telnet": 23, "smtp": 25, "domain": 53, "http": 80,
             "kerberos": 88, "pop3": 110, "ntp": 123, "imap": 143, "snmp": 161, "bgp": 179,
             "ldap": 389, "https": 443, "microsoft-ds": 445, "syslog": 514, "ldaps": 636,
             "dns": 53, "http-alt": 8080}
_ICMP_TYPES = {"echo-reply": 0, "destination-unreachable": 3, "redirect": 5,
               "echo-request": 8, "router-advertisement": 9, "router-solicitation": 10,
               "time-exceeded": 11, "parameter-problem": 12}
_CT_STATES = frozenset({"new", "established", "related", "invalid", "untracked"})
_CT_STATUSES = frozenset({"expected", "seen-reply", "assured", "confirmed", "snat", "dnat",
                          "dying"})
# fib address types this simulator can tell; the others need the routing table
_FIB_DECIDABLE = frozenset({"local", "broadcast", "multicast", "unicast"})
_FIB_TYPES = _FIB_DECIDABLE | {"anycast", "blackhole", "unreachable", "prohibit", "throw", "nat",
                               "xresolve", "unspec"}
_NAME_TYPES = {"ct_state": _CT_STATES, "ct_status": _CT_STATUSES,
               "ct_dir": frozenset({"original", "reply"}), "fib_addrtype": _FIB_TYPES,
               "nf_proto": frozenset({"ipv4", "ipv6"}),
               "ether_type": frozenset({"ip", "ip6", "arp", "vlan", "8021q"})}
_INT_TYPES = {"inet_service": _SERVICES, "inet_proto": _PROTOCOLS, "mark": {}, "integer": {},
              "icmp_type": _ICMP_TYPES, "ct_mark": {}}
_ADDR_TYPES = ("ipv4_addr", "ipv6_addr")

ABSENT = object()   # the header a selector reads is not in this packet: the expression misses


class Pattern:
    """One value on the right-hand side (or one component of a set element)."""

    text: str

    def contains(self, value) -> bool | None:
        raise NotImplementedError

    def bounds(self) -> tuple[int, int] | None:
        """(low, high) as integers, for < > <= >= comparisons; None when not ordered."""
        return None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class AddrPattern(Pattern):
    """An address, a prefix (``10.0.0.0/8``) or a range (``10.0.0.1-10.0.0.9``)."""

    text: str
    version: int
    lo: int
    hi: int

    def contains(self, value) -> bool | None:
        """``value``: an ip_address (the simulator converts the packet's address once)."""
        return value.version == self.version and self.lo <= int(value) <= self.hi

    def bounds(self):
        return self.lo, self.hi


@dataclass(frozen=True)
class IntPattern(Pattern):
    """A number or a range: ports, protocols, marks, numgen values, ICMP types."""

    text: str
    lo: int
    hi: int

    def contains(self, value) -> bool | None:
        return self.lo <= value <= self.hi

    def bounds(self):
        return self.lo, self.hi


@dataclass(frozen=True)
class NamePattern(Pattern):
    """Symbolic values (``new,established``, ``local``): the packet value is a set of names."""

    text: str
    names: frozenset[str]

    def contains(self, value) -> bool | None:
        return bool(self.names & value)


@dataclass(frozen=True)
class FibTypePattern(Pattern):
    """``fib ... type local``: local/broadcast/multicast are decided; route types are not."""

    text: str
    names: frozenset[str]

    def contains(self, value) -> bool | None:
        if self.names & value:
            return True
        if value == {"unicast"} and self.names - _FIB_DECIDABLE:
            return None          # unicast vs blackhole/unreachable/...: needs the routes
        return False


@dataclass(frozen=True)
class IfacePattern(Pattern):
    """An interface name; a trailing ``*`` is a prefix wildcard (``"lxc*"``)."""

    text: str
    name: str
    prefix: bool

    def contains(self, value) -> bool | None:
        return value.startswith(self.name) if self.prefix else value == self.name


@dataclass(frozen=True)
class RawPattern(Pattern):
    """A value the simulator cannot interpret: matching against it is never decided."""

    text: str
    reason: str

    def contains(self, value) -> bool | None:
        return None


@functools.lru_cache(maxsize=8192)
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def _strip_quotes(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def _int(text: str, names: dict[str, int]) -> int:
    low = text.lower()
    if low in names:
        return names[low]
    return int(low, 0)


def pattern(dtype: str, text: str) -> Pattern:
    """Compile one value written in a rule or a set element, for a value type."""
    raw = _strip_quotes(text)
    try:
        if dtype in _ADDR_TYPES:
            return _addr_pattern(text, raw)
        if dtype in _INT_TYPES:
            names = _INT_TYPES[dtype]
            if raw.lower() in names:
                return IntPattern(text, names[raw.lower()], names[raw.lower()])
            lo, sep, hi = raw.partition("-")
            low = _int(lo, names)
            return IntPattern(text, low, _int(hi, names) if sep else low)
        if dtype == "ifname":
            prefix = raw.endswith("*") and not raw.endswith("\\*")
            return IfacePattern(text, raw[:-1] if prefix else raw.replace("\\*", "*"), prefix)
        if dtype == "fib_addrtype":
            names = frozenset(n.strip() for n in raw.split(","))
            if names <= _FIB_TYPES:
                return FibTypePattern(text, names)
        elif dtype in _NAME_TYPES:
            names = frozenset(n.strip() for n in raw.split(","))
            if names <= _NAME_TYPES[dtype]:
                return NamePattern(text, names)
    except ValueError:
        pass
    return RawPattern(text, f"value `{text}` of type {dtype} is not modelled")


def _addr_pattern(text: str, raw: str) -> AddrPattern:
    if "/" in raw:
        net = ipaddress.ip_network(raw, strict=False)
        return AddrPattern(text, net.version, int(net.network_address),
                           int(net.broadcast_address))
    lo, sep, hi = raw.partition("-")
    first = ipaddress.ip_address(lo)
    last = ipaddress.ip_address(hi) if sep else first
    if first.version != last.version:
        raise ValueError(raw)
    return AddrPattern(text, first.version, int(first), int(last))


# ---------------------------------------------------------------------------------------------
# Selectors: what a rule reads from the packet or its context


@dataclass(frozen=True)
class Selector:
    """``ip daddr``, ``meta l4proto``, ``ct state``, ``fib daddr type``, ``numgen random mod 3``.

    ``getter`` names the function in ``_GETTERS``; None when the selector parses but is not
    modelled (every comparison on it is then undecided). ``ops`` are bitwise operations applied
    to the value first (``meta mark & 0x4000``).
    """

    text: str
    dtype: str
    getter: str | None
    ops: tuple[tuple[str, int], ...] = ()
    modulus: int = 0                   # numgen
    offset: int = 0
    header: str = ""                   # payload selectors: the header they read (``tcp``)

    def __str__(self) -> str:
        return self.text + "".join(f" {op} {value:#x}" for op, value in self.ops)


# (header, field) -> (value type, getter)
_PAYLOAD: dict[tuple[str, str], tuple[str, str | None]] = {
    ("ip", "saddr"): ("ipv4_addr", "saddr4"), ("ip", "daddr"): ("ipv4_addr", "daddr4"),
    ("ip", "protocol"): ("inet_proto", "protocol4"), ("ip", "ttl"): ("integer", "ttl"),
    ("ip6", "saddr"): ("ipv6_addr", "saddr6"), ("ip6", "daddr"): ("ipv6_addr", "daddr6"),
    ("ip6", "nexthdr"): ("inet_proto", "protocol6"), ("ip6", "hoplimit"): ("integer", "ttl"),
    ("tcp", "sport"): ("inet_service", "tcp_sport"), ("tcp", "dport"): ("inet_service", "tcp_dport"),
    ("udp", "sport"): ("inet_service", "udp_sport"), ("udp", "dport"): ("inet_service", "udp_dport"),
    ("sctp", "sport"): ("inet_service", "sctp_sport"),
    ("sctp", "dport"): ("inet_service", "sctp_dport"),
    ("th", "sport"): ("inet_service", "th_sport"), ("th", "dport"): ("inet_service", "th_dport"),
    ("icmp", "type"): ("icmp_type", "icmp_type"), ("icmp", "code"): ("integer", "icmp_code"),
}
# headers whose other fields parse but are not modelled
_PAYLOAD_HEADERS = frozenset({"ip", "ip6", "tcp", "udp", "udplite", "sctp", "dccp", "th",
                              "icmp", "icmpv6", "igmp", "ether", "vlan", "arp", "ah", "esp",
                              "comp", "gre", "gretap", "geneve", "vxlan", "hbh", "rt", "rt0",
                              "rt2", "srh", "frag", "dst", "mh", "exthdr", "tcpopt", "ipopt",
                              "auth", "ipsec", "tunnel"})
_META: dict[str, tuple[str, str | None]] = {
    "mark": ("mark", "mark"), "l4proto": ("inet_proto", "l4proto"),
    "iifname": ("ifname", "iifname"), "oifname": ("ifname", "oifname"),
    "iif": ("ifname", "iifname"), "oif": ("ifname", "oifname"),
    "nfproto": ("nf_proto", "nfproto"), "protocol": ("ether_type", "ether_type"),
}
# meta keys that may be written without ``meta``
_META_SHORT = frozenset({"mark", "iif", "oif", "iifname", "oifname", "iiftype", "oiftype",
                         "skuid", "skgid", "nftrace", "rtclassid", "ibriport", "obriport",
                         "ibrname", "obrname", "pkttype", "cpu", "iifgroup", "oifgroup",
                         "cgroup", "priority"})
_CT: dict[str, tuple[str, str | None]] = {
    "state": ("ct_state", "ct_state"), "status": ("ct_status", "ct_status"),
    "mark": ("mark", "ct_mark"), "direction": ("ct_dir", "ct_dir"),
}
_SELECTOR_HEADS = (_PAYLOAD_HEADERS | {"meta", "ct", "fib", "numgen", "jhash", "symhash",
                                       "socket", "osf", "rt"} | _META_SHORT)

_BITWISE = {"&": "&", "and": "&", "|": "|", "or": "|", "^": "^", "xor": "^", "<<": "<<",
            ">>": ">>"}
_RELATIONS = {"==": "==", "eq": "==", "!=": "!=", "ne": "!=", "<": "<", "lt": "<", ">": ">",
              "gt": ">", "<=": "<=", "le": "<=", ">=": ">=", "ge": ">="}


# ---------------------------------------------------------------------------------------------
# Expressions and statements of a rule


@dataclass(frozen=True)
class SetRef:
    name: str


@dataclass(frozen=True)
class Verdict:
    kind: str                          # accept drop reject return continue jump goto queue
    target: str | None = None          # chain of jump/goto; "with ..." of reject

    def __str__(self) -> str:
        if self.kind == "reject" and self.target:
            return f"reject {self.target}"
        return f"{self.kind} {self.target}" if self.target else self.kind


@dataclass(frozen=True)
class NftElement:
    """A set or map element: key components (``10.0.0.1 . tcp . 80``) and its data."""

    key: tuple[Pattern, ...]
    data: Verdict | str | None
    text: str
    line: int
    comment: str | None = None
    expires: str | None = None


@dataclass(frozen=True)
class Elements:
    """An anonymous set or map written in the rule: ``{ 10.0.0.0/8, 192.168.0.0/16 }``."""

    items: tuple[NftElement, ...]


@dataclass(frozen=True)
class Cmp:
    """A match: ``key [op] rhs``, e.g. ``ip daddr != 10.0.0.0/8``, ``ct state new``."""

    key: tuple[Selector, ...]
    op: str                            # "==" "!=" "<" ">" "<=" ">="
    rhs: SetRef | Elements
    text: str


@dataclass(frozen=True)
class VMap:
    """``key vmap @map`` / ``key vmap { v : verdict, ... }``: the element's verdict applies."""

    key: tuple[Selector, ...]
    table: SetRef | Elements
    text: str


@dataclass(frozen=True)
class SetStmt:
    """``meta mark set meta mark | 0x4000``, ``ct mark set ct mark and 0x80``."""

    target: Selector
    base: Selector | int
    ops: tuple[tuple[str, int], ...]
    text: str


@dataclass(frozen=True)
class Nat:
    kind: str                          # "dnat" | "snat" | "masquerade"
    to: NatTo | None
    flags: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class VerdictStmt:
    verdict: Verdict
    text: str


@dataclass(frozen=True)
class Notrack:
    text: str


@dataclass(frozen=True)
class Passive:
    """No effect on the packet's path: counter, log, nftrace, dynamic set updates."""

    text: str
    note: str = ""


@dataclass(frozen=True)
class Limit:
    text: str
    over: bool


@dataclass(frozen=True)
class XtMatch:
    """An iptables-nft extension nft shows only as a comment; ``match-set`` is modelled."""

    match: SetMatch
    text: str


@dataclass(frozen=True)
class Unknown:
    text: str
    reason: str
    statement: bool = False


Expr = Cmp | VMap | SetStmt | Nat | VerdictStmt | Notrack | Passive | Limit | XtMatch | Unknown


# ---------------------------------------------------------------------------------------------
# The model


@dataclass
class NftRule:
    exprs: list[Expr]
    source: Source
    text: str                          # the rule as it reads in the bundle
    handle: int | None = None
    comment: str | None = None


@dataclass
class NftChain:
    name: str
    source: Source
    type: str | None = None            # base chains: "filter" | "nat" | "route"
    hook: str | None = None
    priority: int | None = None
    priority_text: str | None = None   # as written: "dstnat - 10"
    policy: str | None = None          # base chains: "accept" (default) | "drop"
    device: str | None = None
    comment: str | None = None
    rules: list[NftRule] = field(default_factory=list)

    @property
    def is_base(self) -> bool:
        return self.hook is not None

    @property
    def header(self) -> str:
        return (f"type {self.type} hook {self.hook} priority {self.priority_text}; "
                f"policy {self.policy or 'accept'}")


@dataclass
class NftSet:
    name: str
    kind: str                          # "set" | "map"
    source: Source
    key_types: tuple[str, ...] = ()
    data_type: str | None = None       # maps: "verdict", "ipv4_addr", ...
    flags: tuple[str, ...] = ()
    comment: str | None = None
    properties: dict[str, str] = field(default_factory=dict)   # timeout, size, policy ...
    elements: list[NftElement] = field(default_factory=list)

    @property
    def dynamic(self) -> bool:
        return "dynamic" in self.flags or "timeout" in self.flags or "timeout" in self.properties


@dataclass
class NftTable:
    family: str
    name: str
    source: Source
    comment: str | None = None
    flags: tuple[str, ...] = ()
    chains: dict[str, NftChain] = field(default_factory=dict)
    sets: dict[str, NftSet] = field(default_factory=dict)
    objects: list[tuple[str, str, Source]] = field(default_factory=list)  # kept, not modelled

    @property
    def label(self) -> str:
        return f"{self.family} {self.name}"


@dataclass
class NftRuleset(Diagnosed):
    name: str                          # the bundle file it was read from
    tables: dict[str, NftTable] = field(default_factory=dict)   # "ip kube-proxy" -> table
    diagnostics: list[InputError] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    def table(self, family: str, name: str) -> NftTable | None:
        return self.tables.get(f"{family} {name}")

    def chains(self):
        for table in self.tables.values():
            yield from ((table, chain) for chain in table.chains.values())

    def rules(self):
        """Every (table, chain, rule), in file order per chain."""
        for table, chain in self.chains():
            for rule in chain.rules:
                yield table, chain, rule

    def base_chains(self, hook: str, family: str = "ip") -> list[tuple[NftTable, NftChain]]:
        """Base chains a packet of ``family`` meets at ``hook``, in the order they run."""
        hook = _hook_name(hook)
        families = _IP_FAMILIES.get(family, (family,))
        found = [(t, c) for t, c in self.chains()
                 if c.hook == hook and t.family in families and c.priority is not None]
        return sorted(found, key=lambda tc: tc[1].priority)    # stable: file order on ties

    def evaluate_hook(self, hook: str, packet: Packet, ctx: NodeContext) -> list[Branch]:
        """Run ``packet`` through every base chain attached to ``hook`` (PREROUTING, input...)."""
        return _Simulator(self).run(_hook_name(hook), packet, ctx)


def _hook_name(hook: str) -> str:
    name = hook.lower()
    if name not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}; expected one of {', '.join(HOOKS)} "
                         "(or their iptables names)")
    return name


# ---------------------------------------------------------------------------------------------
# Tokens


class _Tok(NamedTuple):
    kind: str        # "w" word, "s" string, "p" punctuation, "h" # comment, "nl" newline
    text: str
    line: int
    pos: int
    end: int


_TOKEN = re.compile(r"""
    (?P<nl>\n)
  | (?P<ws>[ \t\r\f\v]+)
  | (?P<s>"(?:[^"\\\n]|\\.)*")
  | (?P<bad>"[^\n]*)
  | (?P<h>\#[^\n]*)
  | (?P<p>[{};,()])
  | (?P<w>[^\s{};,()"#]+)
""", re.VERBOSE)


def _tokenize(text: str, line: int = 1, base: int = 0) -> tuple[list[_Tok], list[int]]:
    """Tokens, and the lines holding an unterminated string."""
    toks: list[_Tok] = []
    bad: list[int] = []
    for found in _TOKEN.finditer(text):
        kind = found.lastgroup
        if kind == "nl":
            toks.append(_Tok("nl", "\n", line, base + found.start(), base + found.end()))
            line += 1
        elif kind == "bad":
            bad.append(line)
        elif kind != "ws":
            toks.append(_Tok(kind, found.group(), line, base + found.start(), base + found.end()))
    return toks, bad


# ---------------------------------------------------------------------------------------------
# Reading rules


_VERDICT_WORDS = frozenset({"accept", "drop", "reject", "return", "continue", "jump", "goto",
                            "queue"})
_STATEMENT_WORDS = frozenset({"counter", "log", "limit", "comment", "dnat", "snat",
                              "masquerade", "redirect", "notrack", "update", "add", "delete",
                              "tproxy", "dup", "fwd", "synproxy", "quota", "flow", "xt",
                              "last"}) | _VERDICT_WORDS
# a word where an expression or statement may begin: where an unreadable stretch ends
_RESYNC = _STATEMENT_WORDS | _SELECTOR_HEADS
_NAT_FLAGS = frozenset({"random", "fully-random", "random-fully", "persistent", "netmap",
                        "prefix"})


class _RuleReader:
    """Reads one rule's tokens into expressions (``parse``); ``_Unparsed`` marks garbage."""

    def __init__(self, toks: list[_Tok], text: str, source: Source, notes: list[str]):
        self.toks = toks
        self.text = text                   # the whole file: expression texts are slices of it
        self.source = source
        self.notes = notes                 # NotModelled reasons for this rule
        self.i = 0
        self.handle: int | None = None
        self.comment: str | None = None

    # -- cursor helpers

    def peek(self, ahead: int = 0) -> _Tok | None:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else None

    def word(self, ahead: int = 0) -> str | None:
        tok = self.peek(ahead)
        return tok.text if tok is not None and tok.kind in ("w", "p", "s") else None

    def take(self, what: str = "a value") -> _Tok:
        tok = self.peek()
        if tok is None or tok.kind == "h":
            raise _Unparsed(f"expected {what} at the end of the rule")
        self.i += 1
        return tok

    def span(self, start: int) -> str:
        first, last = self.toks[start], self.toks[max(start, self.i - 1)]
        return " ".join(self.text[first.pos:last.end].split())

    # -- the rule

    def parse(self) -> list[Expr]:
        exprs: list[Expr] = []
        first = True
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "h":
                self._hash(tok, exprs)
                continue
            if tok.kind == "p" and tok.text == ";":
                self.i += 1
                continue
            start = self.i
            if first and (tok.kind != "w" or tok.text not in _RESYNC):
                raise _Unparsed(f"`{tok.text}` does not start an nftables expression or "
                                "statement")
            first = False
            try:
                expr = self._expr()
            except _Unparsed as exc:
                self.i = start + 1
                self._skip_to_resync()
                expr = Unknown(self.span(start), f"cannot read `{self.span(start)}`: {exc}")
            if isinstance(expr, Unknown):
                self.notes.append(expr.reason)
            elif isinstance(expr, (Cmp, VMap)):
                self.notes += [f"`{sel}` is not modelled: the rule stops a trace that reaches "
                               "it as UNKNOWN" for sel in expr.key if sel.getter is None]
            if expr is not None:
                exprs.append(expr)
        return exprs

    def _skip_to_resync(self) -> None:
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "h" or (tok.kind == "w" and tok.text in _RESYNC):
                return
            if tok.text == "{" and tok.kind == "p":
                self._skip_braces()
                continue
            self.i += 1

    def _skip_braces(self) -> None:
        depth = 0
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            self.i += 1
            if tok.kind == "p" and tok.text == "{":
                depth += 1
            elif tok.kind == "p" and tok.text == "}":
                depth -= 1
                if depth == 0:
                    return

    def _hash(self, tok: _Tok, exprs: list[Expr]) -> None:
        """``# handle 12`` (nft -a), or an iptables-nft extension shown as a comment."""
        self.i += 1
        body = tok.text[1:].strip()
        handle = re.fullmatch(r"handle (\d+)", body)
        if handle:
            self.handle = int(handle[1])
            return
        xt_text, rest = _split_xt(tok.text, tok.line, tok.pos)
        if xt_text:
            exprs.append(_xt_expr(xt_text))
            if isinstance(exprs[-1], Unknown):
                self.notes.append(exprs[-1].reason)
        if rest:
            self.toks[self.i:self.i] = rest

    def _expr(self) -> Expr | None:
        head = self.word()
        if head in _STATEMENTS:
            return _STATEMENTS[head](self)
        start = self.i
        key = self._key()
        nxt = self.word()
        if nxt == "vmap":
            self.i += 1
            return VMap(key, self._table(key), self.span(start))
        if nxt == "set":
            return self._set_stmt(start, key)
        if nxt == "map":
            raise _Unparsed("a map lookup outside a statement")
        op = "=="
        if nxt in _RELATIONS and self.peek().kind == "w":
            op = _RELATIONS[nxt]
            self.i += 1
        rhs = self._rhs(key)
        return Cmp(key, op, rhs, self.span(start))

    # -- selectors

    def _key(self) -> tuple[Selector, ...]:
        """One selector or a concatenation ``a . b . c``, each with its bitwise operations."""
        parts = [self._selector()]
        while self.word() == ".":
            self.i += 1
            parts.append(self._selector())
        return tuple(parts)

    def _selector(self) -> Selector:
        start = self.i
        head = self.take("a selector").text
        if head == "meta":
            key = self.take("a meta key").text
            dtype, getter = _META.get(key, ("raw", None))
        elif head in _META_SHORT:
            key = head
            dtype, getter = _META.get(key, ("raw", None))
        elif head == "ct":
            key = self.take("a ct key").text
            if key in ("original", "reply"):
                key += " " + self.take("a ct field").text
                if key.split()[1] in ("ip", "ip6"):
                    key += " " + self.take("an address field").text
            dtype, getter = _CT.get(key, ("raw", None))
        elif head == "fib":
            return self._fib(start)
        elif head == "numgen":
            return self._numgen(start)
        elif head in ("jhash", "symhash"):
            self._skip_hash_args()
            return self._with_ops(Selector(self.span(start), "integer", None))
        elif head in ("socket", "osf", "rt"):
            self.take(f"a {head} key")
            dtype, getter = "raw", None
        elif head in _PAYLOAD_HEADERS:
            fld = self.take(f"a {head} field").text
            dtype, getter = _PAYLOAD.get((head, fld), ("raw", None))
            return self._with_ops(Selector(self.span(start), dtype, getter, header=head))
        else:
            raise _Unparsed(f"`{head}` is not a selector")
        return self._with_ops(Selector(self.span(start), dtype, getter))

    def _with_ops(self, sel: Selector) -> Selector:
        ops = []
        while self.word() in _BITWISE:
            op = _BITWISE[self.take().text]
            operand = self._operand()
            if operand is None:
                sel = dataclasses.replace(sel, getter=None)
            else:
                ops.append((op, operand))
        return dataclasses.replace(sel, ops=tuple(ops)) if ops else sel

    def _operand(self) -> int | None:
        """A constant after & | ^; a parenthesised flag list gives None (not modelled)."""
        tok = self.take("an operand")
        if tok.text == "(":
            while self.word() not in (")", None):
                self.i += 1
            self.take("`)`")
            return None
        try:
            return int(tok.text, 0)
        except ValueError:
            return None

    def _fib(self, start: int) -> Selector:
        flags = [self.take("a fib flag").text]
        while self.word() == ".":
            self.i += 1
            flags.append(self.take("a fib flag").text)
        result = self.take("a fib result").text
        if result != "type" or flags[0] not in ("saddr", "daddr"):
            return Selector(self.span(start), "raw", None)
        getter = f"fib_{flags[0]}" + ("_iif" if "iif" in flags else "")
        if set(flags[1:]) - {"iif", "mark"}:
            getter = None
        return Selector(self.span(start), "fib_addrtype", getter)

    def _numgen(self, start: int) -> Selector:
        mode = self.take("numgen random|inc").text
        if self.take("`mod`").text != "mod":
            raise _Unparsed("numgen without `mod N`")
        modulus = int(self.take("a modulus").text, 0)
        offset = 0
        if self.word() == "offset":
            self.i += 1
            offset = int(self.take("an offset").text, 0)
        if mode not in ("random", "inc") or modulus < 1:
            raise _Unparsed(f"numgen {mode} mod {modulus}")
        return Selector(self.span(start), "integer", "numgen", (), modulus, offset)

    def _skip_hash_args(self) -> None:
        while self.word() not in (None, "mod"):
            self.i += 1
        for _ in range(2):
            self.take("`mod N`")
        while self.word() in ("seed", "offset"):
            self.i += 2

    # -- right-hand sides

    def _rhs(self, key: tuple[Selector, ...]) -> SetRef | Elements:
        tok = self.take("a value")
        if tok.kind == "w" and tok.text.startswith("@"):
            return SetRef(tok.text[1:])
        if tok.kind == "p" and tok.text == "{":
            return Elements(tuple(self._elements(key, verdicts=False)))
        if tok.kind not in ("w", "s"):
            raise _Unparsed(f"unexpected `{tok.text}`")
        self.i -= 1
        items = [self._element(key, verdicts=False, in_braces=False)]
        while self.word() == ",":
            self.i += 1
            items.append(self._element(key, verdicts=False, in_braces=False))
        return Elements(tuple(items))

    def _table(self, key: tuple[Selector, ...]) -> SetRef | Elements:
        tok = self.take("a map")
        if tok.kind == "w" and tok.text.startswith("@"):
            return SetRef(tok.text[1:])
        if tok.kind == "p" and tok.text == "{":
            return Elements(tuple(self._elements(key, verdicts=True)))
        raise _Unparsed("vmap needs @map or { ... }")

    def _elements(self, key, verdicts: bool) -> list[NftElement]:
        """Elements up to the closing ``}`` (the ``{`` is already taken)."""
        items = []
        while True:
            word = self.word()
            if word is None:
                raise _Unparsed("unclosed `{`")
            if word == "}":
                self.i += 1
                return items
            if word == ",":
                self.i += 1
                continue
            items.append(self._element(key, verdicts))

    def _element(self, key, verdicts: bool, in_braces: bool = True) -> NftElement:
        return _read_element(self, tuple(s.dtype for s in key), "verdict" if verdicts else None,
                            in_braces)

    # -- statements

    def _set_stmt(self, start: int, key: tuple[Selector, ...]) -> Expr:
        """``KEY set VALUE [op CONST ...]``; VALUE is a constant or a mark selector."""
        self.i += 1                                       # "set"
        target = key[0]
        if len(key) != 1 or target.ops:
            raise _Unparsed("`set` on a concatenation or a masked value")
        base: Selector | int | None
        if self.word() in _SELECTOR_HEADS:
            inner = self._selector()
            base, ops, readable = dataclasses.replace(inner, ops=()), inner.ops, inner.getter
        else:
            tok = self.take("a value")
            try:
                base = int(tok.text, 0)
            except ValueError:
                base = None
            rest = self._with_ops(Selector("", "mark", "const"))
            ops, readable = rest.ops, rest.getter
        text = self.span(start)
        modelled_base = isinstance(base, int) or (isinstance(base, Selector)
                                                  and base.getter in ("mark", "ct_mark"))
        if target.getter in ("mark", "ct_mark") and modelled_base and readable:
            return SetStmt(target, base, tuple(ops), text)
        if target.text in ("meta nftrace", "nftrace", "meta priority", "priority",
                           "ct helper"):
            return Passive(text, f"{target.text} has no effect on the packet's path")
        return Unknown(text, f"`{text}` is not modelled", statement=True)


def _read_element(rd: _RuleReader, dtypes: tuple[str, ...], data_type: str | None,
                 in_braces: bool = True) -> NftElement:
    """``key [. key ...] [timeout T] [expires T] [comment "c"] [counter ...] [: data]``.

    Element options exist only inside braces: in ``ip daddr 10.0.0.1 counter accept`` the
    counter is a statement of the rule.
    """
    start = rd.i
    line = rd.peek().line
    parts = [rd.take("an element").text]
    while rd.word() == ".":
        rd.i += 1
        parts.append(rd.take("an element component").text)
    comment = expires = None
    while in_braces and rd.word() in ("timeout", "expires", "comment", "counter", "packets",
                                      "bytes"):
        opt = rd.take().text
        if opt == "counter":
            continue
        value = rd.take(f"the value of {opt}").text
        if opt == "comment":
            comment = _strip_quotes(value)
        elif opt == "expires":
            expires = value
    data: Verdict | str | None = None
    if rd.word() == ":":
        rd.i += 1
        if data_type == "verdict":
            data = _verdict(rd)
        else:
            dstart = rd.i
            rd.take("map data")
            while rd.word() == ".":
                rd.i += 2
            data = rd.span(dstart)
    if len(parts) == len(dtypes):
        key = tuple(pattern(t, p) for t, p in zip(dtypes, parts))
    else:
        reason = (f"element `{' . '.join(parts)}` has {len(parts)} components; the key has "
                  f"{len(dtypes)}")
        key = tuple(RawPattern(p, reason) for p in parts)
    return NftElement(key, data, rd.span(start), line, comment, expires)


def _verdict(rd: _RuleReader) -> Verdict:
    kind = rd.take("a verdict").text
    if kind not in _VERDICT_WORDS:
        raise _Unparsed(f"`{kind}` is not a verdict")
    if kind in ("jump", "goto"):
        return Verdict(kind, _strip_quotes(rd.take("a chain name").text))
    if kind == "reject" and rd.word() == "with":
        start = rd.i
        rd.i += 1
        rd.take("a reject type")
        if rd.word() == "type":
            rd.i += 1
            rd.take("a reject code")
        elif rd.word() not in _RESYNC and rd.word() not in (None, ";", "}", ","):
            rd.take()
        return Verdict(kind, rd.span(start))
    if kind == "queue":
        while rd.word() in ("num", "flags", "bypass", "fanout", "to"):
            rd.i += 1 if rd.word() in ("bypass", "fanout") else 2
    return Verdict(kind)


def _st_verdict(rd: _RuleReader) -> Expr:
    start = rd.i
    verdict = _verdict(rd)
    if verdict.kind == "queue":
        return Unknown(rd.span(start), "queue to userspace is not modelled", statement=True)
    return VerdictStmt(verdict, rd.span(start))


def _st_counter(rd: _RuleReader) -> Expr:
    start = rd.i
    rd.i += 1
    while rd.word() in ("packets", "bytes", "name"):
        rd.i += 2
    return Passive(rd.span(start))


def _st_log(rd: _RuleReader) -> Expr:
    start = rd.i
    rd.i += 1
    while rd.word() in ("prefix", "level", "flags", "group", "snaplen", "queue-threshold"):
        rd.i += 2
        while rd.word() == ",":
            rd.i += 2
    return Passive(rd.span(start))


def _st_limit(rd: _RuleReader) -> Expr:
    start = rd.i
    rd.i += 1
    over = False
    while rd.word() is not None and rd.word() not in _RESYNC:
        over = over or rd.word() == "over"
        rd.i += 1
    return Limit(rd.span(start), over)


def _st_comment(rd: _RuleReader) -> Expr | None:
    rd.i += 1
    rd.comment = _strip_quotes(rd.take("a comment string").text)
    return None


def _st_nat(rd: _RuleReader) -> Expr:
    start = rd.i
    kind = rd.take().text
    to = None
    if kind in ("dnat", "snat"):
        if rd.word() in ("ip", "ip6"):
            rd.i += 1
        if rd.word() != "to":
            raise _Unparsed(f"{kind} without `to`")
        rd.i += 1
        target = rd.take("a NAT address").text
        if rd.word() in (".", "map") or target in _SELECTOR_HEADS:
            rd._skip_to_resync()
            return Unknown(rd.span(start), f"{kind} to a mapped address is not modelled",
                           statement=True)
        if target.count(":") > 1 and not target.startswith("["):
            target = f"[{target}]"                       # a bare IPv6 address
        try:
            to = nat_to(target)
        except ValueError as exc:
            raise _Unparsed(str(exc)) from None
    elif kind in ("masquerade", "redirect") and rd.word() == "to":
        rd.i += 1
        ports = rd.take("`:port`").text
        try:
            to = nat_to(ports)
        except ValueError as exc:
            raise _Unparsed(str(exc)) from None
    flags = []
    while rd.word() in _NAT_FLAGS or (flags and rd.word() == ","):
        word = rd.take().text
        if word != ",":
            flags.append(word)
    text = rd.span(start)
    if kind == "redirect":
        return Unknown(text, "redirect (DNAT to the incoming interface's address) is not "
                             "modelled", statement=True)
    return Nat(kind, to, tuple(flags), text)


def _st_notrack(rd: _RuleReader) -> Expr:
    rd.i += 1
    return Notrack("notrack")


def _st_set_update(rd: _RuleReader) -> Expr:
    start = rd.i
    verb = rd.take().text
    ref = rd.take("a set reference").text
    if not ref.startswith("@"):
        raise _Unparsed(f"{verb} needs @set")
    if rd.word() == "{":
        rd._skip_braces()
    text = rd.span(start)
    return Passive(text, f"records the packet in dynamic set {ref} (session affinity for later "
                         "connections); not simulated")


def _st_unknown(rd: _RuleReader) -> Expr:
    start = rd.i
    word = rd.take().text
    rd._skip_to_resync()
    return Unknown(rd.span(start), f"statement `{word}` is not modelled", statement=True)


_STATEMENTS: dict[str, Callable[[_RuleReader], Expr | None]] = {
    **{v: _st_verdict for v in _VERDICT_WORDS},
    "counter": _st_counter, "log": _st_log, "limit": _st_limit, "comment": _st_comment,
    "dnat": _st_nat, "snat": _st_nat, "masquerade": _st_nat, "redirect": _st_nat,
    "notrack": _st_notrack, "update": _st_set_update, "add": _st_set_update,
    "delete": _st_set_update,
    **{w: _st_unknown for w in ("tproxy", "dup", "fwd", "synproxy", "quota", "flow", "xt",
                                "last")},
}


# iptables-nft: nft prints extensions it cannot translate as ``# match-set NAME dst,dst``


# where the nft text resumes after an extension's comment; narrower than _RESYNC because
# extension options use words like ``dst`` (``match-set S dst,dst``) that are also headers
_XT_RESYNC = (_STATEMENT_WORDS - {"redirect"}) | {"meta", "ip", "ip6", "ct", "tcp", "udp",
                                                  "sctp", "th", "iifname", "oifname", "iif",
                                                  "oif", "fib", "mark"}


def _split_xt(text: str, line: int, pos: int) -> tuple[str, list[_Tok]]:
    """The extension's text and the tokens of the nft expressions after it on the line.

    A target (``# TPROXY redirect ...``, upper case like every xtables target) ends the rule.
    """
    body = text[1:]
    words = body.split()
    if not words or words[0].isupper():
        return body.strip(), []
    toks, _ = _tokenize(body, line, pos + 1)
    for k, tok in enumerate(toks):
        if tok.kind == "w" and tok.text in _XT_RESYNC and k > 0:
            return body[:tok.pos - pos - 1].strip(), toks[k:]
    return body.strip(), []


def _xt_expr(text: str) -> Expr:
    words = text.split()
    negated = words[:1] == ["!"]
    if negated:
        words = words[1:]
    if len(words) == 3 and words[0] == "match-set":
        flags = tuple(words[2].split(","))
        return XtMatch(SetMatch("match-set", words[1], flags, negated=negated), text)
    what = "target" if words and words[0].isupper() else "match"
    return Unknown(f"# {text}", f"iptables-nft {what} `{text}` is shown by nft only as a "
                                "comment: not modelled", statement=what == "target")


def _is_xt_line(text: str) -> bool:
    body = text[1:].strip()
    if not body or body.split()[0].endswith(":") or body.startswith("handle "):
        return False
    xt_text, rest = _split_xt(text, 0, 0)
    return bool(xt_text and rest)


# ---------------------------------------------------------------------------------------------
# Reading the file: tables, chains, sets


class _FileReader:
    def __init__(self, text: str, name: str):
        self.text = text
        self.name = name
        self.lines = text.split("\n")
        self.toks, bad = _tokenize(text)
        self.i = 0
        self.ruleset = NftRuleset(name)
        self.xt_rules = 0
        for line in bad:
            self.error(line, "unterminated string (missing closing `\"`)")

    # -- helpers

    def source(self, line: int) -> Source:
        return Source(self.name, line, self.lines[line - 1].rstrip("\r"))

    def error(self, line: int, reason: str) -> None:
        found = self.ruleset.diagnostics
        if found and found[-1].line == line and found[-1].reason == reason:
            return       # the same problem again on the same line (100,000 stray `}`): once
        found.append(RuleSyntaxError.at(self.source(line), reason))

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def skip_blank(self, in_chain: bool = False) -> None:
        """Newlines and comment lines (in a chain, a comment line may be an iptables-nft rule)."""
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "nl" or (tok.kind == "p" and tok.text == ";") or tok.kind == "h" and not (in_chain and _is_xt_line(tok.text)):
                self.i += 1
            else:
                return

    def line(self) -> list[_Tok]:
        """Tokens up to the end of the line or ``;`` (braces may span lines); stops before an
        unmatched ``}``."""
        out: list[_Tok] = []
        opened: list[_Tok] = []
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "nl":
                self.i += 1
                if not opened:
                    break
                continue
            if tok.kind == "p":
                if tok.text == ";" and not opened:
                    self.i += 1
                    break
                if tok.text == "{":
                    opened.append(tok)
                elif tok.text == "}":
                    if not opened:
                        break
                    opened.pop()
            out.append(tok)
            self.i += 1
        if opened:
            self.error(opened[0].line, "`{` is never closed (unbalanced braces)")
        return out

    def block_open(self, words: list[_Tok], what: str) -> bool:
        """The header line ends in ``{``: consume it (and any ``# handle``)."""
        tok = self.peek()
        if tok is not None and tok.kind == "p" and tok.text == "{":
            self.i += 1
            while self.peek() is not None and self.peek().kind == "h":
                self.i += 1
            return True
        line = tok.line if tok is not None else words[-1].line
        self.error(line, f"expected `{{` after {what}")
        self.skip_statement()
        return False

    def skip_statement(self) -> None:
        """The rest of the statement, with any ``{ ... }`` block it opens."""
        self.line()

    def reader(self, toks: list[_Tok], source: Source, notes: list[str]) -> _RuleReader:
        return _RuleReader(toks, self.text, source, notes)

    def span_text(self, toks: list[_Tok]) -> str:
        text = self.text[toks[0].pos:toks[-1].end]
        return " ".join(text.split()) if "\n" in text else text.strip()

    # -- top level

    def read(self) -> NftRuleset:
        while True:
            self.skip_blank()
            tok = self.peek()
            if tok is None:
                break
            if tok.kind == "p" and tok.text == "}":
                self.error(tok.line, "unbalanced `}`: no block is open here")
                self.i += 1
                continue
            if tok.kind == "w" and tok.text == "table":
                self.table()
                continue
            self.error(tok.line, "not `nft list` output: expected `table FAMILY NAME {`")
            self.skip_statement()
        if self.xt_rules:
            self.ruleset.caveats.append(
                f"{self.xt_rules} rules use iptables extensions that nft shows only as "
                "`# ...` comments (iptables-nft): `match-set` is read against the ipsets; the "
                "others stop the trace as UNKNOWN")
        return self.ruleset

    def table(self) -> None:
        start = self.peek()
        self.i += 1
        words = []
        while self.peek() is not None and self.peek().kind in ("w", "s"):
            words.append(self.toks[self.i])
            self.i += 1
        if len(words) == 1:
            family, name = "ip", _strip_quotes(words[0].text)
        elif len(words) == 2 and words[0].text in FAMILIES:
            family, name = words[0].text, _strip_quotes(words[1].text)
        else:
            self.error(start.line, "expected `table [FAMILY] NAME {` with FAMILY one of "
                       + ", ".join(FAMILIES))
            self.skip_statement()
            return
        if not self.block_open(words or [start], f"table {family} {name}"):
            return
        key = f"{family} {name}"
        table = self.ruleset.tables.get(key)
        if table is None:
            table = self.ruleset.tables[key] = NftTable(family, name, self.source(start.line))
        while True:
            self.skip_blank()
            tok = self.peek()
            if tok is None:
                self.error(start.line, f"table {key} is never closed (missing `}}`)")
                return
            if tok.kind == "p" and tok.text == "}":
                self.i += 1
                return
            self.table_item(table, tok)

    def table_item(self, table: NftTable, tok: _Tok) -> None:
        word = tok.text if tok.kind == "w" else None
        if word == "chain":
            self.chain(table)
        elif word in ("set", "map"):
            self.set(table, word)
        elif word in ("comment", "flags"):
            toks = self.line()
            values = tuple(_strip_quotes(t.text) for t in toks[1:] if t.text != ",")
            if word == "comment" and len(values) == 1:
                table.comment = values[0]
            elif word == "flags":
                table.flags = values
            else:
                self.error(tok.line, "expected `comment \"TEXT\"`")
        elif word in ("flowtable", "counter", "quota", "limit", "secmark", "synproxy", "ct",
                      "tunnel"):
            toks = self.line()
            kind = " ".join(t.text for t in toks[:2]) if word == "ct" else word
            name = toks[2 if word == "ct" else 1].text if len(toks) > 1 else "?"
            table.objects.append((kind, _strip_quotes(name), self.source(tok.line)))
            self.ruleset.diagnostics.append(NotModelled.at(
                self.source(tok.line), f"{kind} object {name} is kept but not modelled"))
        else:
            self.error(tok.line, f"`{tok.text}` is not a table item (expected chain, set, map, "
                       "comment, flags or a stateful object)")
            self.skip_statement()

    def chain(self, table: NftTable) -> None:
        start = self.toks[self.i]
        self.i += 1
        tok = self.peek()
        if tok is None or tok.kind not in ("w", "s"):
            self.error(start.line, "expected a chain name after `chain`")
            self.skip_statement()
            return
        self.i += 1
        name = _strip_quotes(tok.text)
        if not self.block_open([tok], f"chain {name}"):
            return
        chain = table.chains.get(name)
        if chain is None:
            chain = table.chains[name] = NftChain(name, self.source(start.line))
        while True:
            self.skip_blank(in_chain=True)
            tok = self.peek()
            if tok is None:
                self.error(start.line, f"chain {name} is never closed (missing `}}`)")
                return
            if tok.kind == "p" and tok.text == "}":
                self.i += 1
                return
            toks = self.line()
            if toks:
                self.chain_line(table, chain, toks)

    def chain_line(self, table: NftTable, chain: NftChain, toks: list[_Tok]) -> None:
        first = toks[0].text if toks[0].kind == "w" else None
        if first == "type":
            self.chain_header(table, chain, toks)
        elif first == "policy" and len(toks) == 2:
            chain.policy = toks[1].text
            if chain.policy not in ("accept", "drop"):
                self.error(toks[0].line, f"bad chain policy {chain.policy!r}")
        elif first == "comment" and len(toks) == 2 and toks[1].kind == "s" and not chain.rules:
            chain.comment = _strip_quotes(toks[1].text)
        elif first == "devices":
            chain.device = " ".join(t.text for t in toks[2:] if t.kind in ("w", "s"))
        else:
            self.rule(chain, toks)

    def chain_header(self, table: NftTable, chain: NftChain, toks: list[_Tok]) -> None:
        words = [t.text for t in toks]
        line = toks[0].line
        try:
            if words[2] != "hook":
                raise ValueError(words[2])
            chain.type, chain.hook = words[1], words[3]
            k = words.index("priority")
            between = words[4:k]
            if between[:1] == ["device"] and len(between) == 2:
                chain.device = _strip_quotes(between[1])
            elif between[:1] == ["devices"]:
                chain.device = " ".join(_strip_quotes(w) for w in between[1:]
                                        if w not in ("=", "{", "}", ","))
            elif between:
                raise ValueError(" ".join(between))
            chain.priority_text = " ".join(words[k + 1:])
            chain.priority = _priority(chain.priority_text, table.family)
        except (IndexError, ValueError):
            self.error(line, "bad base chain header (expected `type T hook H [device D] "
                       "priority P;`)")
            chain.hook = None
            return
        if chain.type not in ("filter", "nat", "route"):
            self.error(line, f"unknown chain type {chain.type!r}")
        if chain.hook not in HOOKS + ("ingress", "egress"):
            self.error(line, f"unknown hook {chain.hook!r}")

    def rule(self, chain: NftChain, toks: list[_Tok]) -> None:
        source = self.source(toks[0].line)
        text = self.span_text(toks)
        notes: list[str] = []
        rd = self.reader(list(toks), source, notes)
        try:
            exprs = rd.parse()
        except _Unparsed as exc:
            self.error(toks[0].line, f"not an nftables rule: {exc}")
            return
        if any(isinstance(e, XtMatch) or (isinstance(e, Unknown) and e.text.startswith("#"))
               for e in exprs):
            self.xt_rules += 1
        chain.rules.append(NftRule(exprs, source, text, rd.handle, rd.comment))
        for note in notes:
            self.ruleset.diagnostics.append(NotModelled.at(source, note))

    def set(self, table: NftTable, kind: str) -> None:
        start = self.toks[self.i]
        self.i += 1
        tok = self.peek()
        if tok is None or tok.kind not in ("w", "s"):
            self.error(start.line, f"expected a {kind} name")
            self.skip_statement()
            return
        self.i += 1
        name = _strip_quotes(tok.text)
        if not self.block_open([tok], f"{kind} {name}"):
            return
        nft_set = table.sets[name] = NftSet(name, kind, self.source(start.line))
        while True:
            self.skip_blank()
            tok = self.peek()
            if tok is None:
                self.error(start.line, f"{kind} {name} is never closed (missing `}}`)")
                return
            if tok.kind == "p" and tok.text == "}":
                self.i += 1
                return
            toks = self.line()
            if toks:
                self.set_line(nft_set, toks)

    def set_line(self, nft_set: NftSet, toks: list[_Tok]) -> None:
        word = toks[0].text
        line = toks[0].line
        if word == "type":
            types = [t.text for t in toks[1:]]
            key, _, data = " ".join(types).partition(" : ")
            nft_set.key_types = tuple(k.strip() for k in key.split(" . "))
            nft_set.data_type = data.strip() or None
            if not all(nft_set.key_types) or (nft_set.kind == "map") != bool(data):
                self.error(line, f"bad {nft_set.kind} type")
        elif word == "typeof":
            self.set_typeof(nft_set, toks)
        elif word == "flags":
            nft_set.flags = tuple(t.text for t in toks[1:] if t.text != ",")
        elif word == "comment" and len(toks) == 2:
            nft_set.comment = _strip_quotes(toks[1].text)
        elif word == "elements":
            self.set_elements(nft_set, toks)
        elif word in ("timeout", "gc-interval", "size", "policy", "auto-merge", "counter",
                      "quota", "devices"):
            nft_set.properties[word] = " ".join(t.text for t in toks[1:])
        else:
            self.error(line, f"`{word}` is not a {nft_set.kind} property")

    def set_typeof(self, nft_set: NftSet, toks: list[_Tok]) -> None:
        notes: list[str] = []
        rd = self.reader(toks[1:], self.source(toks[0].line), notes)
        try:
            key = rd._key()
            if rd.word() == ":":
                rd.i += 1
                data = "verdict" if rd.word() == "verdict" else rd._key()[0].dtype
                nft_set.data_type = data
        except _Unparsed as exc:
            self.error(toks[0].line, f"bad typeof: {exc}")
            return
        nft_set.key_types = tuple(s.dtype for s in key)

    def set_elements(self, nft_set: NftSet, toks: list[_Tok]) -> None:
        if len(toks) < 3 or toks[1].text != "=" or toks[2].text != "{" or toks[-1].text != "}":
            self.error(toks[0].line, "expected `elements = { ... }`")
            return
        notes: list[str] = []
        rd = self.reader(toks[3:-1], self.source(toks[0].line), notes)
        data_type = nft_set.data_type if nft_set.kind == "map" else None
        while rd.peek() is not None:
            if rd.word() == ",":
                rd.i += 1
                continue
            line = rd.peek().line
            try:
                nft_set.elements.append(_read_element(rd, nft_set.key_types, data_type))
            except (_Unparsed, ValueError) as exc:
                self.error(line, f"bad element of {nft_set.kind} {nft_set.name}: {exc}")
                while rd.peek() is not None and rd.word() != ",":
                    rd.i += 1
                continue
            if rd.peek() is not None and rd.word() != ",":
                self.error(rd.peek().line, f"expected `,` between elements of {nft_set.name}, "
                           f"found `{rd.peek().text}`")
                while rd.peek() is not None and rd.word() != ",":
                    rd.i += 1


def _priority(text: str, family: str) -> int:
    """``dstnat``, ``-110``, ``dstnat - 10``, ``filter + 5``, ``mangle-5``."""
    names = BRIDGE_PRIORITY_NAMES if family == "bridge" else PRIORITY_NAMES
    found = re.fullmatch(r"\s*([a-z]+|-?\d+)\s*(?:([+-])\s*(\d+))?\s*", text)
    if not found:
        raise ValueError(text)
    base = names[found[1]] if found[1] in names else int(found[1])
    if found[2]:
        base += int(found[3]) if found[2] == "+" else -int(found[3])
    return base


def parse_nft_ruleset(text: str, name: str) -> NftRuleset:
    """Read ``nft list ruleset`` / ``nft list table ...`` output into an NftRuleset.

    Syntax problems are collected in ``diagnostics`` (``raise_for_errors()`` raises the first);
    constructs that are kept but not modelled are ``NotModelled`` diagnostics.
    """
    return _FileReader(text, name).read()


# ---------------------------------------------------------------------------------------------
# Simulation


_TRANSPORT = frozenset({6, 17, 132, 136, 33})       # protocols with ports (th sport/dport)


def _is_v6(packet: Packet) -> bool:
    return packet.dl_type == 0x86DD or bool(packet.nw_dst and ":" in packet.nw_dst)


def _addr_types(addr: str, ctx: NodeContext) -> frozenset[str]:
    ip = ipaddress.ip_address(addr)
    if addr in ctx.local_addresses:
        return frozenset({"local"})
    if addr in ctx.broadcast_addresses or addr == "255.255.255.255":
        return frozenset({"broadcast"})
    if ip.is_multicast:
        return frozenset({"multicast"})
    return frozenset({"unicast"})


def _port(proto: int | None, side: str):
    def get(p: Packet, ctx: NodeContext):
        if p.nw_proto is None:
            return None
        if (p.nw_proto not in _TRANSPORT) if proto is None else p.nw_proto != proto:
            return ABSENT
        return getattr(p, f"tp_{side}")
    return get


def _ip(side: str, v6: bool):
    def get(p: Packet, ctx: NodeContext):
        if _is_v6(p) != v6:
            return ABSENT
        return getattr(p, f"nw_{side}")
    return get


def _ct_state(p: Packet, ctx: NodeContext):
    states = frozenset(s.lower() for s in ctx.ct_state) & _CT_STATES
    return states or None


def _ct_status(p: Packet, ctx: NodeContext):
    known = {s.lower() for s in ctx.ct_state}
    return frozenset(known & {"dnat", "snat"})


def _fib(side: str, iif: bool):
    def get(p: Packet, ctx: NodeContext):
        addr = getattr(p, f"nw_{side}")
        return None if addr is None else _addr_types(addr, ctx)
    return get


def _icmp(fld: str):
    def get(p: Packet, ctx: NodeContext):
        if p.nw_proto is None:
            return None
        return getattr(p, fld) if p.nw_proto == 1 else ABSENT
    return get


_GETTERS: dict[str, Callable[[Packet, NodeContext], object]] = {
    "saddr4": _ip("src", False), "daddr4": _ip("dst", False),
    "saddr6": _ip("src", True), "daddr6": _ip("dst", True),
    "protocol4": lambda p, c: ABSENT if _is_v6(p) else p.nw_proto,
    "protocol6": lambda p, c: p.nw_proto if _is_v6(p) else ABSENT,
    "l4proto": lambda p, c: p.nw_proto,
    "ttl": lambda p, c: p.nw_ttl,
    "tcp_sport": _port(6, "src"), "tcp_dport": _port(6, "dst"),
    "udp_sport": _port(17, "src"), "udp_dport": _port(17, "dst"),
    "sctp_sport": _port(132, "src"), "sctp_dport": _port(132, "dst"),
    "th_sport": _port(None, "src"), "th_dport": _port(None, "dst"),
    "icmp_type": _icmp("tp_src"), "icmp_code": _icmp("tp_dst"),
    "mark": lambda p, c: p.mark, "ct_mark": lambda p, c: c.connmark,
    "iifname": lambda p, c: c.in_iface, "oifname": lambda p, c: c.out_iface,
    "nfproto": lambda p, c: frozenset({"ipv6" if _is_v6(p) else "ipv4"}),
    "ether_type": lambda p, c: frozenset({"ip6" if _is_v6(p) else "ip"}),
    "ct_state": _ct_state, "ct_status": _ct_status,
    "ct_dir": lambda p, c: frozenset({c.ct_dir.lower()}),
    "fib_saddr": _fib("src", False), "fib_daddr": _fib("dst", False),
    "fib_saddr_iif": _fib("src", True), "fib_daddr_iif": _fib("dst", True),
}

# header -> (IP version it needs, protocol it needs): ``tcp flags`` never matches a UDP packet,
# even though tcp flags are not modelled
_HEADER_NEEDS: dict[str, tuple[int | None, int | frozenset | None]] = {
    "ip": (4, None), "ip6": (6, None), "icmp": (4, 1), "igmp": (4, 2), "icmpv6": (6, 58),
    "tcp": (None, 6), "udp": (None, 17), "sctp": (None, 132), "udplite": (None, 136),
    "dccp": (None, 33), "esp": (None, 50), "ah": (None, 51), "gre": (None, 47),
    "th": (None, _TRANSPORT),
}


def _has_header(packet: Packet, header: str) -> bool | None:
    version, proto = _HEADER_NEEDS.get(header, (None, None))
    if version is not None and (6 if _is_v6(packet) else 4) != version:
        return False
    if proto is None:
        return True
    if packet.nw_proto is None:
        return None
    return packet.nw_proto in proto if isinstance(proto, frozenset) else packet.nw_proto == proto


# interfaces a packet does not have at a hook: nft then compares against "" (index 0)
_NO_IFACE = {"prerouting": ("oifname",), "input": ("oifname",), "output": ("iifname",)}

_WHY_UNKNOWN = {
    "iifname": "the input interface is not known here",
    "oifname": "the output interface is not known here",
    "ct_state": "the connection's conntrack state is not known here",
    "l4proto": "the packet has no IP protocol",
}


def _apply_ops(value: int, ops) -> int:
    for op, operand in ops:
        if op == "&":
            value &= operand
        elif op == "|":
            value |= operand
        elif op == "^":
            value ^= operand
        elif op == "<<":
            value <<= operand
        else:
            value >>= operand
    return value & 0xFFFFFFFF


@dataclass
class _Walk(Walk):
    """The iptables walk, plus what nft's NAT needs: whether this hook already bound a NAT."""

    nat_bound: bool = False            # a NAT binding was made at this hook
    hook: str = ""


NEXT = "NEXT"          # the rule did not end the chain: go on with the next rule
RETURN = "RETURN"      # leave this chain
Outcome = tuple[_Walk, str]


@dataclass
class _Hit:
    """What a rule has done so far for one branch: effects and the matches that decided it."""

    effects: list[str] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)

    def copy(self) -> _Hit:
        return _Hit(list(self.effects), list(self.matched))


class _Simulator:
    def __init__(self, ruleset: NftRuleset):
        self.ruleset = ruleset

    def run(self, hook: str, packet: Packet, ctx: NodeContext) -> list[Branch]:
        if ctx.ct_orig is None and "NEW" in ctx.ct_state and hook in ("prerouting", "output"):
            ctx = dataclasses.replace(ctx, ct_orig=packet.copy())
        chains = self.ruleset.base_chains(hook, "ip6" if _is_v6(packet) else "ip")
        outcomes = self._base(chains, 0, _Walk(1.0, packet.copy(), ctx, hook=hook,
                                                budget=_Budget()))
        return [Branch(w.weight, w.packet, verdict, w.steps, w.nat, w.ctx.connmark,
                       frozenset(w.ctx.ct_state)) for w, verdict in outcomes]

    # -- base chains in priority order: accept hands the packet to the next one

    def _base(self, chains, index: int, walk: _Walk) -> list[Outcome]:
        if index == len(chains):
            return [(walk, "ACCEPT")]
        table, chain = chains[index]
        if chain.type == "nat":
            skip = None
            if "NEW" not in walk.ctx.ct_state or "UNTRACKED" in walk.ctx.ct_state:
                skip = ("nat chain not consulted: not the first packet of a connection "
                        "(conntrack applies any NAT)")
            elif walk.nat_bound:
                skip = ("nat chain not consulted: an earlier nat chain at this hook already "
                        "set up the connection's NAT")
            if skip:
                walk.steps.append(Step(table.label, chain.name, None, skip))
                return self._base(chains, index + 1, walk)
        results: list[Outcome] = []
        for w, outcome in self._chain(table, chain, walk, 0):
            if outcome == RETURN:
                policy = chain.policy or "accept"
                w.steps.append(Step(table.label, chain.name, None,
                                    f"policy {policy} of base chain {chain.name} "
                                    f"({chain.header})"))
                outcome = policy.upper()
            if outcome == "ACCEPT":
                results += self._base(chains, index + 1, w)
            else:
                results.append((w, outcome))
        return results

    # -- chains and rules

    def _chain(self, table: NftTable, chain: NftChain, walk: _Walk, depth: int) -> list[Outcome]:
        if depth > MAX_DEPTH:
            return [self._stop(walk, table, chain, None,
                               f"chain loop: more than {MAX_DEPTH} nested jumps (at {chain.name})")]
        return self._rules(table, chain, 0, walk, depth)

    def _rules(self, table, chain, start: int, walk: _Walk, depth: int) -> list[Outcome]:
        index = start
        while index < len(chain.rules):
            outcomes = self._rule(table, chain, chain.rules[index], 0, walk, _Hit(), depth, None)
            if len(outcomes) == 1 and outcomes[0][1] == NEXT:
                walk, index = outcomes[0][0], index + 1
                continue
            # several branches go on: that is nesting, bounded like jumps (no recursion whose
            # depth follows the input)
            results: list[Outcome] = []
            for w, outcome in outcomes:
                if outcome != NEXT:
                    results.append((w, outcome))
                elif depth + 1 > MAX_DEPTH:
                    results.append(self._stop(w, table, chain, None, f"more than {MAX_DEPTH} "
                                              f"nested branch points (at {chain.name})"))
                else:
                    results += self._rules(table, chain, index + 1, w, depth + 1)
            return results
        return [(walk, RETURN)]

    def _rule(self, table, chain, rule: NftRule, i: int, walk: _Walk, hit: _Hit, depth: int,
              fixed: int | None) -> list[Outcome]:
        """Expressions from ``i`` on; ``fixed`` is the numgen value of expression ``i``."""
        exprs = rule.exprs
        while i < len(exprs):
            expr = exprs[i]
            if isinstance(expr, (Cmp, VMap)) and fixed is None:
                numgen = next((s for s in expr.key if s.getter == "numgen"), None)
                if numgen is not None:
                    return self._fork(table, chain, rule, i, walk, hit, depth, numgen)
            if isinstance(expr, VMap):
                return self._vmap(table, chain, rule, i, walk, hit, depth, fixed)
            if isinstance(expr, (Cmp, XtMatch, Unknown, Limit)) and not (
                    isinstance(expr, Unknown) and expr.statement):
                result, why = self._match(table, expr, walk, fixed)
                if result is None and self._later_miss(table, rule, i + 1, walk):
                    result = False
                if result is None:
                    return [self._stop(walk, table, chain, rule, why, hit)]
                if result is False:
                    if isinstance(expr, Limit):
                        hit.effects.append(f"`{expr.text}`: assumed under the rate limit, so "
                                           "this rule is not taken")
                    return [self._miss(walk, table, chain, rule, hit)]
                if isinstance(expr, Limit):
                    hit.effects.append(f"`{expr.text}`: rate limit not modelled, assumed under "
                                       "the limit")
                elif not isinstance(expr, Unknown):
                    hit.matched.append(_match_name(expr))
                    hit.effects += self._dynamic_note(table, expr)
                i, fixed = i + 1, None
                continue
            outcome = self._statement(table, chain, rule, expr, walk, hit)
            if outcome is not None:
                return self._verdict(table, chain, rule, walk, hit, depth, outcome)
            i, fixed = i + 1, None
        self._step(walk, table, chain, rule, hit,
                   None if hit.effects else "no verdict: counted only, next rule")
        return [(walk, NEXT)]

    def _fork(self, table, chain, rule, i, walk, hit, depth, numgen: Selector) -> list[Outcome]:
        """One branch per distinct outcome of the numgen value, weighted by how many values
        lead to it: `numgen random mod 65535 vmap { 0 : goto A, 1 : goto B }` is three
        branches (A, B, no verdict), never 65,535 walks."""
        n = numgen.modulus
        groups, why = numgen_groups(self, table, rule.exprs[i], numgen, walk)
        if groups is None:
            return [self._stop(walk, table, chain, rule, why, hit)]
        results: list[Outcome] = []
        for value, count, shown in groups:
            budget = walk.budget
            if budget is not None:
                budget.forks += 1
                if budget.forks > MAX_BRANCHES:
                    results.append(self._stop(walk.fork(count / n), table, chain, rule,
                                              f"more than {MAX_BRANCHES} load-balancing "
                                              "branches at this hook: the rest are not traced",
                                              hit))
                    break
            w, h = walk.fork(count / n), hit.copy()
            prob = f"1/{n}" if count == 1 else f"{count}/{n}"
            h.effects.append(f"{numgen.text} {shown} (probability {prob})")
            results += self._rule(table, chain, rule, i, w, h, depth, value)
        return results

    @staticmethod
    def _dynamic_note(table: NftTable, expr) -> list[str]:
        """A hit in a dynamic set (kube-proxy session affinity) depends on when it was read."""
        if not (isinstance(expr, Cmp) and isinstance(expr.rhs, SetRef)):
            return []
        found = table.sets.get(expr.rhs.name)
        if found is None or not found.dynamic:
            return []
        return [(f"@{found.name} is a dynamic set (session affinity): its elements are as "
                "collected, and they expire")]

    def _later_miss(self, table, rule: NftRule, start: int, walk: _Walk) -> bool:
        """A later plain match that certainly misses makes the whole rule miss (it is an AND)."""
        for expr in rule.exprs[start:]:
            if isinstance(expr, (Cmp, XtMatch)):
                if isinstance(expr, Cmp) and any(s.getter == "numgen" for s in expr.key):
                    continue
                if self._match(table, expr, walk, None)[0] is False:
                    return True
            elif isinstance(expr, Unknown) and not expr.statement:
                continue
            elif not isinstance(expr, (Limit, Passive)):
                return False             # a statement may change what later matches see
        return False

    # -- matches

    def _match(self, table, expr, walk: _Walk, fixed: int | None) -> tuple[bool | None, str]:
        if isinstance(expr, Unknown):
            return None, expr.reason
        if isinstance(expr, Limit):
            return (False, "") if expr.over else (True, "")
        if isinstance(expr, XtMatch):
            result = expr.match.check(walk.packet, walk.ctx)
            return result, (expr.match.undecided(walk.packet, walk.ctx) if result is None else "")
        values, why = self._key(expr.key, walk, fixed)
        if values is ABSENT:
            return False, ""
        if values is None:
            return None, why
        items, why = self._items(table, expr.rhs)
        if items is None:
            return None, why
        if expr.op in ("<", ">", "<=", ">="):
            return self._order(expr, values, items)
        element, why = _lookup(items, values)
        if element is None and why:
            return None, f"`{expr.text}`: {why}"
        found = element is not None
        return (found if expr.op == "==" else not found), ""

    def _order(self, expr: Cmp, values, items) -> tuple[bool | None, str]:
        bounds = items[0].key[0].bounds() if len(items) == 1 and len(values) == 1 else None
        value = values[0]
        if bounds is None:
            return None, f"`{expr.text}`: ordered comparison not modelled for this value"
        if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            value = int(value)
        lo, hi = bounds
        return {"<": value < lo, ">": value > hi, "<=": value <= hi,
                ">=": value >= lo}[expr.op], ""

    def _key(self, key: tuple[Selector, ...], walk: _Walk, fixed: int | None):
        """The packet's values for a key; ABSENT if a header is missing; None + why if unknown."""
        values = []
        for sel in key:
            present = _has_header(walk.packet, sel.header) if sel.header else True
            if present is False:
                return ABSENT, ""
            if present is None:
                return None, f"`{sel}`: the packet has no IP protocol"
        for sel in key:
            if sel.getter is None:
                return None, f"`{sel}` is not modelled"
            if sel.getter == "numgen":
                value = fixed
            elif sel.getter in ("fib_saddr_iif", "fib_daddr_iif"):
                value = _GETTERS[sel.getter](walk.packet, walk.ctx)
                if value == {"local"}:
                    return None, (f"`{sel}`: whether the address belongs to the input "
                                  "interface is not modelled")
            elif sel.getter in _NO_IFACE.get(walk.hook, ()):
                value = ""                   # no such interface yet (or any more) at this hook
            else:
                value = _GETTERS[sel.getter](walk.packet, walk.ctx)
            if value is ABSENT:
                return ABSENT, ""
            if value is None:
                return None, _WHY_UNKNOWN.get(sel.getter, f"the packet has no value for `{sel}`")
            if sel.dtype in _ADDR_TYPES:
                try:
                    value = _address(value)
                except ValueError:
                    return None, f"`{sel}`: {value!r} is not an IP address"
            elif sel.ops:
                value = _apply_ops(value, sel.ops)
            values.append(value)
        return tuple(values), ""

    def _items(self, table: NftTable, rhs) -> tuple[tuple[NftElement, ...] | list | None, str]:
        if isinstance(rhs, Elements):
            return rhs.items, ""
        found = table.sets.get(rhs.name)
        if found is None:
            return None, f"set @{rhs.name} is not in table {table.label}"
        return found.elements, ""

    def _vmap(self, table, chain, rule, i, walk, hit, depth, fixed) -> list[Outcome]:
        expr: VMap = rule.exprs[i]
        values, why = self._key(expr.key, walk, fixed)
        if values is ABSENT:
            return [self._miss(walk, table, chain, rule, hit)]
        if values is None:
            return [self._stop(walk, table, chain, rule, why)]
        items, why = self._items(table, expr.table)
        if items is None:
            return [self._stop(walk, table, chain, rule, why)]
        element, why = _lookup(items, values)
        if element is None and why:
            return [self._stop(walk, table, chain, rule, f"`{expr.text}`: {why}")]
        keytext = " . ".join(str(s) for s in expr.key)
        where = f"@{expr.table.name}" if isinstance(expr.table, SetRef) else "the verdict map"
        if element is None:
            hit.effects.append(f"{keytext} {_shown(values, expr.key)} not in {where}: no verdict")
            return self._rule(table, chain, rule, i + 1, walk, hit, depth, None)
        hit.matched.append(keytext)
        if not isinstance(expr.table, Elements) or not any(s.getter == "numgen" for s in expr.key):
            note = f" ({element.comment})" if element.comment else ""
            hit.effects.append(f"{keytext} {_shown(values, expr.key)} found in "
                               f"{where}: element `{element.text}` (line {element.line}){note}")
        if not isinstance(element.data, Verdict):
            return [self._stop(walk, table, chain, rule, f"{where} holds no verdicts")]
        return self._verdict(table, chain, rule, walk, hit, depth, element.data)

    # -- statements

    def _statement(self, table, chain, rule, expr, walk: _Walk, hit: _Hit) -> Verdict | str | None:
        """Apply a statement; a Verdict (or "UNKNOWN: why") ends the rule."""
        if isinstance(expr, Passive):
            if expr.note:
                hit.effects.append(f"`{expr.text}`: {expr.note}")
            return None
        if isinstance(expr, VerdictStmt):
            return expr.verdict
        if isinstance(expr, SetStmt):
            self._set(chain, expr, walk, hit)
            return None
        if isinstance(expr, Nat):
            return self._nat(table, chain, expr, walk, hit)
        if isinstance(expr, Notrack):
            walk.ctx = dataclasses.replace(walk.ctx, ct_state={"UNTRACKED"})
            hit.effects.append("notrack: not tracked by conntrack (state UNTRACKED, no NAT "
                               "from here)")
            return None
        if isinstance(expr, Unknown):
            return f"UNKNOWN:{expr.reason}"
        raise AssertionError(f"unhandled expression {expr!r}")

    def _set(self, chain: NftChain, expr: SetStmt, walk: _Walk, hit: _Hit) -> None:
        def read(sel):
            return walk.packet.mark if sel.getter == "mark" else walk.ctx.connmark
        base = expr.base if isinstance(expr.base, int) else read(expr.base)
        new = _apply_ops(base, expr.ops)
        meaning = CHAIN_MEANINGS.get(chain.name)
        why = f" ({chain.name}: {meaning})" if meaning else ""
        if expr.target.getter == "mark":
            old, walk.packet.mark = walk.packet.mark, new
            hit.effects.append(f"MARK `{expr.text}`: mark {old:#x} -> {new:#x}{why}")
        else:
            old = walk.ctx.connmark
            walk.ctx = dataclasses.replace(walk.ctx, connmark=new)
            hit.effects.append(f"CONNMARK `{expr.text}`: connmark {old:#x} -> {new:#x}")

    def _nat(self, table, chain, expr: Nat, walk: _Walk, hit: _Hit) -> Verdict | str:
        p = walk.packet
        flags = f" ({', '.join(expr.flags)}: source port may be randomised; shown unchanged)" \
            if {"random", "fully-random", "random-fully"} & set(expr.flags) else ""
        if expr.kind == "dnat":
            before = (p.nw_dst, p.tp_dst)
            p.nw_dst = expr.to.addr or p.nw_dst
            p.tp_dst = expr.to.ports.lo if expr.to.ports else p.tp_dst
            walk.nat = NatAction("DNAT", before, (p.nw_dst, p.tp_dst))
            walk.add_ct_state("DNAT")
            hit.effects.append(f"DNAT {_hostport(*before)} -> {_hostport(p.nw_dst, p.tp_dst)}"
                               f"{_range_note(expr.to)}")
        elif expr.kind == "snat":
            before = (p.nw_src, p.tp_src)
            p.nw_src = expr.to.addr or p.nw_src
            p.tp_src = expr.to.ports.lo if expr.to.ports else p.tp_src
            walk.nat = NatAction("SNAT", before, (p.nw_src, p.tp_src))
            walk.add_ct_state("SNAT")
            hit.effects.append(f"SNAT {_hostport(*before)} -> {_hostport(p.nw_src, p.tp_src)}"
                               f"{_range_note(expr.to)}{flags}")
        else:
            ip = walk.ctx.masquerade_ip
            before = (p.nw_src, p.tp_src)
            if expr.to is not None and expr.to.ports:
                p.tp_src = expr.to.ports.lo
            if ip is None:
                new = ("the address of the out interface" + (f" {walk.ctx.out_iface}"
                       if walk.ctx.out_iface else "") + " (not known here; source left unchanged)")
            else:
                p.nw_src = ip
                new = _hostport(ip, p.tp_src)
            walk.nat = NatAction("MASQUERADE", before, (ip, p.tp_src))
            walk.add_ct_state("SNAT")
            hit.effects.append(f"MASQUERADE {_hostport(*before)} -> {new}{flags}")
        walk.nat_bound = True
        return Verdict("accept")

    def _verdict(self, table, chain, rule, walk: _Walk, hit: _Hit, depth: int,
                 verdict: Verdict | str) -> list[Outcome]:
        if isinstance(verdict, str):                       # "UNKNOWN:why"
            return [self._stop(walk, table, chain, rule, verdict.partition(":")[2], hit)]
        kind = verdict.kind
        why = f" ({rule.comment})" if rule.comment else ""
        if kind in ("jump", "goto"):
            target = table.chains.get(verdict.target)
            if target is None:
                return [self._stop(walk, table, chain, rule,
                                   f"chain {verdict.target} is not in table {table.label}", hit)]
            self._step(walk, table, chain, rule, hit,
                       f"{'jump to' if kind == 'jump' else 'goto'} {verdict.target}{why}")
            results = []
            for w, outcome in self._chain(table, target, walk, depth + 1):
                if outcome == RETURN and kind == "jump":
                    outcome = NEXT
                results.append((w, outcome))
            return results
        if kind == "return":
            self._step(walk, table, chain, rule, hit, "return: back to the calling chain")
            return [(walk, RETURN)]
        if kind == "continue":
            self._step(walk, table, chain, rule, hit, "continue: next rule")
            return [(walk, NEXT)]
        if kind == "accept" and any(e.startswith(("DNAT", "SNAT", "MASQUERADE"))
                                    for e in hit.effects):
            self._step(walk, table, chain, rule, hit, None)
            return [(walk, "ACCEPT")]
        self._step(walk, table, chain, rule, hit, f"{verdict}{why}")
        return [(walk, kind.upper())]

    # -- steps

    def _step(self, walk: _Walk, table, chain, rule, hit: _Hit, last: str | None) -> None:
        effects = hit.effects + ([last] if last else [])
        walk.steps.append(Step(table.label, chain.name, rule, "; ".join(effects),
                               matched=tuple(dict.fromkeys(hit.matched))))

    def _miss(self, walk: _Walk, table, chain, rule, hit: _Hit) -> Outcome:
        """The rule does not match; a step only if it already did something (or forked)."""
        if hit.effects:
            self._step(walk, table, chain, rule, hit, "then a match fails: next rule")
        return walk, NEXT

    def _stop(self, walk: _Walk, table, chain, rule, reason: str,
              hit: _Hit | None = None) -> Outcome:
        where = f" {rule.source.file}:{rule.source.line} `{rule.text}`" if rule else ""
        done = "; ".join(hit.effects) + "; " if hit and hit.effects else ""
        walk.steps.append(Step(table.label, chain.name, rule,
                               f"{done}cannot decide{where}: {reason}; the trace stops here",
                               unknown=True, matched=tuple(hit.matched) if hit else ()))
        return walk, "UNKNOWN"


def _lookup(items, values) -> tuple[NftElement | None, str]:
    """The first element holding ``values``; else (None, why) if some element is undecidable."""
    if len(items) > 16 and len(values) == 1 and isinstance(values[0], int):
        exact = _exact_index(items)
        if exact is not None:
            return exact.get(values[0]), ""
    undecided = ""
    for element in items:
        if len(element.key) != len(values):
            undecided = undecided or f"element `{element.text}` does not fit the key"
            continue
        result = True
        for pat, value in zip(element.key, values):
            hit = pat.contains(value)
            if hit is False:
                result = False
                break
            if hit is None:
                result = None
                undecided = undecided or getattr(pat, "reason", f"value `{pat}` not modelled")
        if result:
            return element, ""
    return None, undecided


_EXACT: dict[int, tuple[object, dict | None]] = {}


def _exact_index(items) -> dict | None:
    """value -> first element, for a big map of single integers (kube-proxy's numgen vmap with
    one element per endpoint): each branch's look-up is then O(1), not O(endpoints)."""
    cached = _EXACT.get(id(items))
    if cached is not None and cached[0] is items:
        return cached[1]
    index: dict | None = {}
    for element in items:
        pat = element.key[0] if len(element.key) == 1 else None
        if not isinstance(pat, IntPattern) or pat.lo != pat.hi:
            index = None
            break
        index.setdefault(pat.lo, element)
    if len(_EXACT) > 256:
        _EXACT.clear()
    _EXACT[id(items)] = (items, index)
    return index


def _match_name(expr) -> str:
    if isinstance(expr, XtMatch):
        return f"match-set {expr.match.set_name}"
    return " . ".join(s.text for s in expr.key)


_PROTO_SHOWN = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmpv6"}


def _shown(values, key: tuple[Selector, ...]) -> str:
    """The packet's key values as nft writes them: ``10.43.0.10 . tcp . 53``."""
    out = []
    for value, sel in zip(values, key):
        if isinstance(value, frozenset):
            out.append(",".join(sorted(value)))
        elif sel.dtype == "inet_proto" and not sel.ops:
            out.append(_PROTO_SHOWN.get(value, str(value)))
        elif sel.dtype == "mark" or sel.ops:
            out.append(f"{value:#x}")
        else:
            out.append(str(value))
    return " . ".join(out)



