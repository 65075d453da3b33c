"""What a route lookup reads and answers: the packet being routed (``_Flow``), the steps it
records (``_Steps``), what the policy lookup found (``_Hit``), its answer (``RouteDecision``),
a device's routing sysctls (``Sysctls``), the kernel's error texts, and address helpers.
Shared by the router (lookup.py) and its source-address checks (source.py).
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from traceflow.engines.routing.parse import IpRule, NextHop, Route

KINDS = ("unicast", "local", "anycast", "broadcast", "multicast", "blackhole", "unreachable",
         "prohibit", "no-route", "invalid", "unknown")

# What `ip route get` prints after "RTNETLINK answers: " for each errno.
ENETUNREACH = "Network is unreachable"
EHOSTUNREACH = "No route to host"
EACCES = "Permission denied"
EINVAL = "Invalid argument"

# Route types that end the lookup with an error: kind, errno (fib_props[] in fib_semantics.c)
_REJECT_ROUTES = {"blackhole": ("blackhole", EINVAL), "unreachable": ("unreachable", EHOSTUNREACH),
                  "prohibit": ("prohibit", EACCES), "nat": ("invalid", EINVAL)}
# Rule actions (fib4_rule_action); note a rule's "unreachable" is ENETUNREACH, not EHOSTUNREACH.
_REJECT_RULES = {"blackhole": ("blackhole", EINVAL), "unreachable": ("unreachable", ENETUNREACH),
                 "prohibit": ("prohibit", EACCES)}
_DEFAULT_RULES = {(0, "local"), (32766, "main"), (32767, "default")}

LOOPBACK = "lo"
_LBCAST = 0xFFFFFFFF


@dataclass(frozen=True)
class Sysctls:
    """The ``net.ipv4.conf`` values that decide a forwarded packet's fate, for its input
    device (the kernel combines ``all`` and the device: max for rp_filter, or for the rest).
    Defaults are a Kubernetes node's: forwarding on, the kernel's own defaults otherwise."""

    forwarding: bool = True
    rp_filter: int = 0              # 0 off, 1 strict, 2 loose
    accept_local: bool = False
    send_redirects: bool = True
    src_valid_mark: bool = False
    route_localnet: bool = False


@dataclass
class RouteDecision:
    kind: str                       # one of KINDS
    table: str | None               # the table that decided, by name ("main", "10")
    route: Route | None             # the route that decided (.text, .source)
    rule: IpRule | None             # the rule that led there
    dev: str | None                 # output device; "lo" for local delivery (as the kernel says)
    gateway: str | None             # None when directly connected
    prefsrc: str | None             # source address a local sender would use
    onlink: bool
    nexthops: list                  # [(share, gateway, dev)]: one per path, shares sum to 1
    steps: list                     # plain-English account of the rules and tables consulted
    reason: str                     # plain-English summary
    error: str | None = None        # what `ip route get` answers instead ("No route to host")


@dataclass
class _Flow:
    family: int
    dst: int
    src: int                        # 0: not chosen yet (locally generated, no source given)
    iif: str | None                 # "lo" for locally generated packets, as in the kernel
    oif: str | None
    mark: int = 0
    tos: int = 0
    proto: int | None = None
    sport: int | None = None
    dport: int | None = None
    uid: int | None = None          # None: unknown (matters only for uidrange rules)


@dataclass
class _Hit:
    """What the policy lookup found: a route, a rejection, or an undecidable rule."""

    route: Route | None = None
    path: NextHop | None = None     # the path that passed the output-device check
    table: str | None = None
    rule: IpRule | None = None
    kind: str | None = None         # for rejections
    error: str | None = None
    unknown: str | None = None


class _Steps:
    """Collects steps; runs of rules skipped for the same reason become one line.

    A skip records only the selector that failed; the packet's value is written out when
    the run ends, so walking hundreds of non-matching rules stays cheap."""

    def __init__(self, flow: _Flow):
        self.flow = flow
        self.lines: list[str] = []
        self._run: list = []        # [(rule, selector)]

    def skip(self, rule: IpRule, selector: str) -> None:
        if self._run and self._run[-1][1] != selector:
            self._flush()
        self._run.append((rule, selector))

    def add(self, line: str) -> None:
        self._flush()
        self.lines.append(line)

    def done(self) -> list[str]:
        self._flush()
        return self.lines

    def _flush(self) -> None:
        if not self._run:
            return
        rule, selector = self._run[0]
        value = _packet_value(self.flow, selector)
        if len(self._run) == 1:
            self.lines.append(f"rule {_rule_text(rule)}: skipped, {value} does not match "
                              f"'{selector}'")
        else:
            first, last = self._run[0][0].priority, self._run[-1][0].priority
            self.lines.append(f"rules {first}..{last} ({len(self._run)} rules): skipped, "
                              f"{value} matches none of their '{selector}'")
        self._run = []


class _Quiet(_Steps):
    """Steps nobody reads (the reverse lookup of a source check)."""

    def __init__(self):
        super().__init__(None)

    def skip(self, rule: IpRule, selector: str) -> None:
        pass

    def add(self, line: str) -> None:
        pass


def _packet_value(flow: _Flow, selector: str) -> str:
    """The packet's side of a failed selector, in words."""
    fam = flow.family
    values = {
        "iif": lambda: (f"input device {flow.iif}" if flow.iif != LOOPBACK
                        else "input device lo (a locally generated packet)"),
        "oif": lambda: f"output device {flow.oif or '(none given)'}",
        "fwmark": lambda: f"mark {flow.mark:#x}",
        "from": lambda: f"source {_fmt(fam, flow.src)}",
        "to": lambda: f"destination {_fmt(fam, flow.dst)}",
        "tos": lambda: f"tos {flow.tos:#x}",
        "l3mdev": lambda: "a packet outside any VRF",
        "uidrange": lambda: f"uid {flow.uid}",
        "ipproto": lambda: f"ipproto {flow.proto}",
        "sport": lambda: f"sport {flow.sport}",
        "dport": lambda: f"dport {flow.dport}",
        "not ...": lambda: "the packet (which matches what 'not' negates)",
    }
    return values[selector]()


def _rule_text(rule: IpRule) -> str:
    return " ".join(rule.text.split()).replace(": ", " `", 1) + "`"


@functools.lru_cache(maxsize=65536)     # (a walk formats and parses the same few addresses)
def _fmt(family: int, value: int) -> str:
    return str(ipaddress.IPv4Address(value) if family == 4 else ipaddress.IPv6Address(value))


def _is_multicast(v: int) -> bool:
    return (v >> 28) == 0xE


def _is_loopback(v: int) -> bool:
    return (v >> 24) == 127


def _v6_strict(v: int) -> bool:
    """rt6_need_strict: link-local unicast, multicast and ::1 destinations only take routes
    through the interface given (the input device, or the output device asked for)."""
    return (v >> 118) == 0x3FA or (v >> 120) == 0xFF or v == 1


def _v6_scope(v: int) -> int:
    """__ipv6_addr_src_scope, ordered: -1 invalid (::, the unspecified address: every
    scope fits it, so the narrowest wins, RFC 6724 rule 2), 1 node-local (::1), 2 link,
    5 site, 14 global."""
    if v == 0:
        return -1
    if v == 1:
        return 1
    if (v >> 120) == 0xFF:
        return (v >> 112) & 0xF
    if (v >> 118) == 0x3FA:
        return 2
    if (v >> 118) == 0x3FB:
        return 5
    return 14


def _common_prefix(a: int, b: int) -> int:
    return 128 - (a ^ b).bit_length()


def _is_local_multicast(v: int) -> bool:
    return (v >> 8) == 0xE00000


@functools.lru_cache(maxsize=65536)
def _parse_addr(text: str) -> tuple[int, int]:
    addr = ipaddress.ip_address(text)
    return addr.version, int(addr)


def _addr_value(text: str | None) -> int:
    return int(ipaddress.ip_address(text)) if text else 0
