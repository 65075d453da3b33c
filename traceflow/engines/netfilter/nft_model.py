"""nftables model: tables, chains, rules, sets and maps, and the values they compare
(``Pattern``), as parsed from ``nft list ruleset``. See ``traceflow.engines.netfilter.nft``.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, field

from traceflow.engines.netfilter.iptables import NatTo, SetMatch
from traceflow.model.errors import Source
from traceflow.model.packet import PROTO_NUMBERS

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
              "gre": 47, "esp": 50, "ah": 51, "igmp": 2, "ipip": 4, "ipencap": 4, "ospf": 89,
              "vrrp": 112, "ipv6": 41, "sctp": 132, "pim": 103, "comp": 108, "mh": 135}
_SERVICES = {"ftp": 21, "ssh": 22, "telnet": 23, "smtp": 25, "domain": 53, "http": 80,
             "kerberos": 88, "pop3": 110, "ntp": 123, "imap": 143, "snmp": 161, "bgp": 179,
             "ldap": 389, "https": 443, "microsoft-ds": 445, "syslog": 514, "ldaps": 636,
             "dns": 53, "http-alt": 8080}
_ICMP_TYPES = {"echo-reply": 0, "destination-unreachable": 3, "redirect": 5,
               "echo-request": 8, "router-advertisement": 9, "router-solicitation": 10,
               "time-exceeded": 11, "parameter-problem": 12}
# nft's icmpv6 type names (src/proto.c, icmp6_type_tbl)
_ICMPV6_TYPES = {"destination-unreachable": 1, "packet-too-big": 2, "time-exceeded": 3,
                 "parameter-problem": 4, "echo-request": 128, "echo-reply": 129,
                 "mld-listener-query": 130, "mld-listener-report": 131,
                 "mld-listener-done": 132, "mld-listener-reduction": 132,
                 "nd-router-solicit": 133, "nd-router-advert": 134, "nd-neighbor-solicit": 135,
                 "nd-neighbor-advert": 136, "nd-redirect": 137, "router-renumbering": 138,
                 "ind-neighbor-solicit": 141, "ind-neighbor-advert": 142,
                 "mld2-listener-report": 143}
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
              "icmp_type": _ICMP_TYPES, "icmpv6_type": _ICMPV6_TYPES, "ct_mark": {}}
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
    ("ip6", "flowlabel"): ("integer", "flowlabel"),
    ("tcp", "sport"): ("inet_service", "tcp_sport"), ("tcp", "dport"): ("inet_service", "tcp_dport"),
    ("udp", "sport"): ("inet_service", "udp_sport"), ("udp", "dport"): ("inet_service", "udp_dport"),
    ("sctp", "sport"): ("inet_service", "sctp_sport"),
    ("sctp", "dport"): ("inet_service", "sctp_dport"),
    ("th", "sport"): ("inet_service", "th_sport"), ("th", "dport"): ("inet_service", "th_dport"),
    ("icmp", "type"): ("icmp_type", "icmp_type"), ("icmp", "code"): ("integer", "icmp_code"),
    ("icmpv6", "type"): ("icmpv6_type", "icmpv6_type"),
    ("icmpv6", "code"): ("integer", "icmpv6_code"),
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
