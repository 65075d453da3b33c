"""iptables rules: the model (rulesets, chains, rules, typed matches) and its two parsers.

Two inputs give the same model:

* ``iptables-save`` (also ``-c``): the exact rule syntax, every table.
* ``iptables [-t T] -L -n [-v]``: the human listing of one table. It is lossy: without ``-v``
  the interface columns are missing, so the parser records that in ``Ruleset.caveats``.

Nothing is dropped silently. A construct we do not model becomes an ``UnknownMatch`` (or
``Rule.unknown_target``) that the engine turns into an UNKNOWN step, plus a ``NotModelled``
diagnostic. A line that is not a rule at all is a ``RuleSyntaxError`` diagnostic; callers that
want exit code 2 call ``Ruleset.raise_for_errors()``.

The grammars are the tables ``CORE_OPTIONS``, ``MODULES``, ``TARGETS`` (iptables-save) and
``LIST_WORDS`` (list format): keyword -> decoder.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from traceflow.errors import InputError, Source
from traceflow.packet import PROTO_NAMES, PROTO_NUMBERS, Packet

if TYPE_CHECKING:  # the engine owns the context; matches only read it
    from traceflow.netfilter.engine import NodeContext

TABLES = ("raw", "mangle", "nat", "filter", "security")
BUILTIN_CHAINS = ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")
MASK32 = 0xFFFFFFFF


class RuleSyntaxError(InputError):
    """A line that cannot be read as a rule (garbage, truncated, bad quoting or value)."""


class NotModelled(InputError):
    """A well-formed construct the simulator does not model: kept, reported at trace time."""


class Diagnosed:
    """Parsed input that keeps located diagnostics instead of stopping at the first bad line.

    ``syntax_error`` is the diagnostic class that means "not this format at all" (exit 2).
    """

    syntax_error: type = RuleSyntaxError
    diagnostics: list

    @property
    def syntax_errors(self) -> list[InputError]:
        return [d for d in self.diagnostics if isinstance(d, self.syntax_error)]

    def raise_for_errors(self) -> None:
        """Raise the first syntax error (for callers that exit with code 2 on bad input)."""
        errors = self.syntax_errors
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more syntax errors)" if len(errors) > 1 else ""
            raise self.syntax_error(first.reason + more, first.file, first.line, first.text)


# ---------------------------------------------------------------------------------------------
# Value types


@functools.lru_cache(maxsize=8192)
def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text, strict=False)


@functools.lru_cache(maxsize=8192)
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def _in_network(value: str | None, net) -> bool | None:
    return None if value is None else _address(value) in net


@dataclass(frozen=True)
class PortRange:
    lo: int
    hi: int

    def __contains__(self, port: int) -> bool:
        return self.lo <= port <= self.hi

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


def port_range(text: str) -> PortRange:
    """``80``, ``1000:2000`` (iptables), ``1000-2000`` (NAT targets), ``:1024``, ``1024:``."""
    lo, sep, hi = text.replace("-", ":").partition(":")
    low = int(lo) if lo else 0
    high = (int(hi) if hi else 65535) if sep else low
    if not 0 <= low <= high <= 65535:
        raise ValueError(f"bad port range {text!r}")
    return PortRange(low, high)


@dataclass(frozen=True)
class Mark:
    """``value/mask`` as in ``--mark 0x4000/0x4000``: matches when ``mark & mask == value``."""

    value: int
    mask: int = MASK32

    def __contains__(self, mark: int) -> bool:
        return mark & self.mask == self.value

    def __str__(self) -> str:
        return f"{self.value:#x}" if self.mask == MASK32 else f"{self.value:#x}/{self.mask:#x}"


def mark(text: str) -> Mark:
    value, _, mask = text.partition("/")
    return Mark(int(value, 0), int(mask, 0) if mask else MASK32)


@dataclass(frozen=True)
class MarkOp:
    """A mark change in the kernel's form ``new = (old & ~mask) ^ value``; ``verb`` as written."""

    verb: str           # "set-xmark" | "set-mark" | "or" | "and" | "xor" | ...
    value: int
    mask: int

    def apply(self, old: int) -> int:
        return ((old & ~self.mask) ^ self.value) & MASK32

    def __str__(self) -> str:
        if self.verb == "and":
            return f"and {~self.mask & MASK32:#x}"
        if self.verb in ("or", "xor") or (self.verb == "set" and self.mask == MASK32):
            return f"{self.verb} {self.value:#x}"
        return f"{self.verb} {self.value:#x}/{self.mask:#x}"


def mark_op(verb: str, text: str) -> MarkOp:
    """Normalise MARK/CONNMARK operations the way libxt_MARK does."""
    value, _, mask_text = text.partition("/")
    v = int(value, 0)
    m = int(mask_text, 0) if mask_text else MASK32
    verb = verb.lstrip("-")
    if verb in ("set-xmark", "xset"):
        return MarkOp("set-xmark", v, m)
    verb = verb.removesuffix("-mark")
    return {"set": MarkOp("set", v, m | v if mask_text else MASK32),
            "or": MarkOp("or", v, v),
            "and": MarkOp("and", 0, ~v & MASK32),
            "xor": MarkOp("xor", v, 0)}[verb]


@dataclass(frozen=True)
class ConnmarkOp:
    """CONNMARK: set the connection mark, save skb mark into it, or restore it into the skb."""

    kind: str                    # "set" | "save" | "restore"
    op: MarkOp | None = None     # for "set"
    nfmask: int = MASK32
    ctmask: int = MASK32

    def apply(self, nfmark: int, ctmark: int) -> tuple[int, int]:
        """(skb mark, connmark) after the operation (xt_connmark v2 semantics)."""
        if self.kind == "set":
            return nfmark, self.op.apply(ctmark)
        if self.kind == "save":
            return nfmark, ((ctmark & ~self.ctmask) ^ (nfmark & self.nfmask)) & MASK32
        return ((nfmark & ~self.nfmask) ^ (ctmark & self.ctmask)) & MASK32, ctmark

    def __str__(self) -> str:
        if self.kind == "set":
            return str(self.op)
        if self.nfmask == self.ctmask == MASK32:
            return self.kind
        return f"{self.kind} nfmask {self.nfmask:#x} ctmask {self.ctmask:#x}"


@dataclass(frozen=True)
class NatTo:
    """``--to-destination``/``--to-source``/``to:``: an address range and a port range."""

    addr: str | None
    addr_hi: str | None = None
    ports: PortRange | None = None

    def __str__(self) -> str:
        addr = (self.addr or "") + (f"-{self.addr_hi}" if self.addr_hi else "")
        if ":" in addr:
            addr = f"[{addr}]"
        if self.ports is None:
            return addr
        return f"{addr}:{str(self.ports).replace(':', '-')}"


_NAT_TO = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<v4>[0-9.]+(?:-[0-9.]+)?))?"   # [v6] or v4[-v4]
                     r"(?::(?P<ports>[0-9-]+))?$")                                # :port[-port]


def nat_to(text: str) -> NatTo:
    found = _NAT_TO.match(text)
    if not found or not (found["v6"] or found["v4"] or found["ports"]):
        raise ValueError(f"bad NAT address {text!r}")
    lo, _, hi = (found["v6"] or found["v4"] or "").partition("-")
    for a in (lo, hi):
        if a:
            _address(a)
    return NatTo(lo or None, hi or None, port_range(found["ports"]) if found["ports"] else None)


# ---------------------------------------------------------------------------------------------
# Matches: frozen values that can say whether a packet matches (None = the bundle cannot tell)


@dataclass(frozen=True)
class Match:
    """One condition of a rule.

    ``name`` is the option as written in iptables-save syntax (``-s``, ``--dport``,
    ``--ctstate``), or the module name where the option alone is ambiguous or the module
    takes several options (``connmark``, ``physdev``). Both parsers use the same names.
    """

    name: str
    negated: bool = field(default=False, kw_only=True)

    def check(self, packet: Packet, ctx: "NodeContext") -> bool | None:
        hit = self._test(packet, ctx)
        return None if hit is None else hit != self.negated

    def _test(self, packet: Packet, ctx: "NodeContext") -> bool | None:
        raise NotImplementedError

    def undecided(self, packet: Packet, ctx: "NodeContext") -> str:
        """Why ``check`` returned None, in plain English."""
        return f"'{self}' cannot be decided for this packet"

    def caveat(self) -> str | None:
        """A note the trace must show when this match is assumed rather than modelled."""
        return None

    @property
    def bang(self) -> str:
        return "! " if self.negated else ""


@dataclass(frozen=True)
class AddrMatch(Match):
    field: str                       # "nw_src" | "nw_dst"
    cidr: ipaddress.IPv4Network | ipaddress.IPv6Network

    def _test(self, packet, ctx):
        return _in_network(getattr(packet, self.field), self.cidr)

    def undecided(self, packet, ctx):
        return f"the packet has no {self.field}"

    def __str__(self):
        return f"{self.bang}{self.name} {self.cidr}"


@dataclass(frozen=True)
class ProtoMatch(Match):
    proto: int

    def _test(self, packet, ctx):
        return None if packet.nw_proto is None else packet.nw_proto == self.proto

    def undecided(self, packet, ctx):
        return "the packet has no IP protocol"

    def __str__(self):
        return f"{self.bang}-p {PROTO_NAMES.get(self.proto, self.proto)}"


_PORT_PROTOS = {6, 17, 132, 136}      # tcp, udp, sctp, udplite


def _port_test(packet: Packet, fields: tuple[str, ...], ranges) -> bool | None:
    if packet.nw_proto not in _PORT_PROTOS:
        return False
    values = [getattr(packet, f) for f in fields]
    if any(v is None for v in values):
        return None
    return any(v in r for v in values for r in ranges)


@dataclass(frozen=True)
class PortMatch(Match):
    """tcp/udp/sctp ``--sport``/``--dport`` and multiport ``--sports``/``--dports``."""

    field: str                       # "tp_src" | "tp_dst"
    ranges: tuple[PortRange, ...]

    def _test(self, packet, ctx):
        return _port_test(packet, (self.field,), self.ranges)

    def undecided(self, packet, ctx):
        return f"the packet has no {self.field}"

    def __str__(self):
        return f"{self.bang}{self.name} {','.join(map(str, self.ranges))}"


@dataclass(frozen=True)
class MultiportMatch(Match):
    """multiport ``--ports``: source or destination port in the list."""

    ranges: tuple[PortRange, ...]

    def _test(self, packet, ctx):
        hits = [_port_test(packet, (f,), self.ranges) for f in ("tp_src", "tp_dst")]
        return True if True in hits else (None if None in hits else False)

    def __str__(self):
        return f"{self.bang}--ports {','.join(map(str, self.ranges))}"


@dataclass(frozen=True)
class IfaceMatch(Match):
    """``-i``/``-o``; a trailing ``+`` is a prefix wildcard (``lxc+``)."""

    field: str                       # "in_iface" | "out_iface" (NodeContext attributes)
    iface: str

    def _test(self, packet, ctx):
        actual = getattr(ctx, self.field)
        if actual is None:
            return None
        if self.iface.endswith("+"):
            return actual.startswith(self.iface[:-1])
        return actual == self.iface

    def undecided(self, packet, ctx):
        which = "input" if self.field == "in_iface" else "output"
        return f"the {which} interface is not known here"

    def __str__(self):
        return f"{self.bang}{self.name} {self.iface}"


@dataclass(frozen=True)
class FragmentMatch(Match):
    """``-f``: second and later fragments. Traced packets are never such fragments."""

    def _test(self, packet, ctx):
        return False

    def __str__(self):
        return f"{self.bang}-f"


_DECIDABLE_ADDRTYPES = {"LOCAL", "BROADCAST", "MULTICAST", "UNICAST"}


@dataclass(frozen=True)
class AddrTypeMatch(Match):
    """addrtype ``--src-type``/``--dst-type``: LOCAL from ``ctx.local_addresses``."""

    field: str                       # "nw_src" | "nw_dst"
    types: tuple[str, ...]
    limit_iface: bool = False        # --limit-iface-in/out: only addresses of that interface

    def _test(self, packet, ctx):
        addr = getattr(packet, self.field)
        if addr is None:
            return None
        hits = {t: self._is_type(t, addr, ctx) for t in self.types}
        if True in hits.values():
            return None if self.limit_iface else True   # which interface owns it is not modelled
        return None if None in hits.values() else False

    @staticmethod
    def _is_type(kind: str, addr: str, ctx) -> bool | None:
        ip = _address(addr)
        local = addr in ctx.local_addresses
        broadcast = addr in ctx.broadcast_addresses or addr == "255.255.255.255"
        return {"LOCAL": local, "BROADCAST": broadcast, "MULTICAST": ip.is_multicast,
                "UNICAST": not (local or broadcast or ip.is_multicast)}.get(kind)

    def undecided(self, packet, ctx):
        odd = [t for t in self.types if t not in _DECIDABLE_ADDRTYPES]
        if odd:
            return f"address type {','.join(odd)} needs the routing table (not modelled)"
        if self.limit_iface:
            return "--limit-iface-in/out: which interface owns the address is not modelled"
        return f"the packet has no {self.field}"

    def __str__(self):
        return (f"-m addrtype {self.bang}{self.name} {','.join(self.types)}"
                + (" --limit-iface-in" if self.limit_iface else ""))


@dataclass(frozen=True)
class MarkMatch(Match):
    """mark ``--mark value/mask`` on the skb mark."""

    mark: Mark

    def _test(self, packet, ctx):
        return packet.mark in self.mark

    def __str__(self):
        return f"-m mark {self.bang}--mark {self.mark}"


@dataclass(frozen=True)
class ConnmarkMatch(Match):
    """connmark ``--mark value/mask`` on the connection's mark (``ctx.connmark``)."""

    mark: Mark

    def _test(self, packet, ctx):
        return ctx.connmark in self.mark

    def __str__(self):
        return f"-m connmark {self.bang}--mark {self.mark}"


@dataclass(frozen=True)
class CtStateMatch(Match):
    """conntrack ``--ctstate`` / state ``--state``: any of the states."""

    states: frozenset[str]

    def _test(self, packet, ctx):
        return bool(self.states & set(ctx.ct_state))

    def __str__(self):
        return f"{self.bang}{self.name} {','.join(sorted(self.states))}"


@dataclass(frozen=True)
class CtDirMatch(Match):
    direction: str                   # "ORIGINAL" | "REPLY"

    def _test(self, packet, ctx):
        return ctx.ct_dir == self.direction

    def __str__(self):
        return f"{self.bang}--ctdir {self.direction}"


@dataclass(frozen=True)
class CtTupleMatch(Match):
    """conntrack ``--ctorigsrc/--ctorigdst[port]``: the connection's original tuple."""

    field: str                       # Packet attribute of the original tuple
    value: object                    # a network for addresses, a PortRange for ports

    def _test(self, packet, ctx):
        if ctx.ct_orig is None:
            return None
        actual = getattr(ctx.ct_orig, self.field)
        if actual is None:
            return None
        if isinstance(self.value, PortRange):
            return actual in self.value
        return _in_network(actual, self.value)

    def undecided(self, packet, ctx):
        return "the connection's original tuple is not known here (NodeContext.ct_orig)"

    def __str__(self):
        return f"{self.bang}{self.name} {self.value}"


@dataclass(frozen=True)
class SetMatch(Match):
    """set ``--match-set NAME src,dst``: members come from ``ctx.ipsets`` (``ipset list``)."""

    set_name: str
    flags: tuple[str, ...]

    def _test(self, packet, ctx):
        if ctx.ipsets is None or self.set_name not in ctx.ipsets:
            return None
        return ipset_contains(ctx.ipsets[self.set_name], self.flags, packet)

    def undecided(self, packet, ctx):
        if ctx.ipsets is None or self.set_name not in ctx.ipsets:
            node = ctx.node or "<node>"
            return (f"ipset {self.set_name} is not in the bundle "
                    f"(needs nodes/{node}/ipset.txt)")
        return f"a member of ipset {self.set_name} has a form that is not modelled"

    def __str__(self):
        return f"{self.bang}--match-set {self.set_name} {','.join(self.flags)}"


@dataclass(frozen=True)
class StatisticMatch(Match):
    """statistic: the engine forks here instead of deciding (``probability``)."""

    mode: str                        # "random" | "nth"
    chance: float                    # as written: --probability p, or 1/--every n

    @property
    def probability(self) -> float:
        return 1.0 - self.chance if self.negated else self.chance

    def _test(self, packet, ctx):
        return None

    def undecided(self, packet, ctx):
        return "statistic is a random choice: the engine forks the trace here"

    def __str__(self):
        return f"-m statistic --mode {self.mode} {self.bang}{self.name} {self.chance:.11g}"


@dataclass(frozen=True)
class CommentMatch(Match):
    text: str

    def _test(self, packet, ctx):
        return True

    def __str__(self):
        return f'--comment "{self.text}"'


@dataclass(frozen=True)
class PhysdevMatch(Match):
    """physdev: bridge ports. A packet that is not bridged matches only negated options."""

    options: tuple[tuple[str, str | None, bool], ...]   # (option, value, negated)

    def _test(self, packet, ctx):
        if not ctx.bridged:
            return all(neg for _, _, neg in self.options)
        return None

    def undecided(self, packet, ctx):
        return "the packet is bridged (br_netfilter): physdev bridge ports are not modelled"

    def __str__(self):
        words = [("! " if neg else "") + opt + (f" {val}" if val else "")
                 for opt, val, neg in self.options]
        return "-m physdev " + " ".join(words)


@dataclass(frozen=True)
class MacMatch(Match):
    mac: str

    def _test(self, packet, ctx):
        return packet.dl_src.lower() == self.mac.lower()

    def __str__(self):
        return f"-m mac {self.bang}--mac-source {self.mac}"


@dataclass(frozen=True)
class LengthMatch(Match):
    """length: needs ``packet.extra['length']`` (traced packets usually carry none)."""

    range: PortRange

    def _test(self, packet, ctx):
        length = packet.extra.get("length")
        return None if length is None else length in self.range

    def undecided(self, packet, ctx):
        return "match 'length' needs the packet length, which the trace does not carry"

    def __str__(self):
        return f"-m length {self.bang}--length {self.range}"


@dataclass(frozen=True)
class LimitMatch(Match):
    """limit: always matches (the traced packet is assumed under the rate); the step says so."""

    rate: str
    burst: int | None = None

    def _test(self, packet, ctx):
        return True

    def caveat(self):
        return f"rate limit {self.rate} not modelled: assumed under the limit"

    def __str__(self):
        burst = f" --limit-burst {self.burst}" if self.burst else ""
        return f"-m limit --limit {self.rate}{burst}"


@dataclass(frozen=True)
class RecentMatch(Match):
    """recent: kube-proxy's ClientIP session affinity (``--set`` in KUBE-SEP, ``--rcheck`` in
    KUBE-SVC). The kernel's lists (/proc/net/xt_recent) are not in a bundle, so the trace is
    of a client with no entry yet: a first connection, which the statistic rules place and
    ``--set`` then pins. ``ctx.recent`` (list name -> addresses) decides it when known."""

    list_name: str
    action: str                      # set | rcheck | update | remove
    side: str = "source"             # source | dest
    seconds: int | None = None

    def _test(self, packet, ctx):
        if self.action == "set":
            return True
        known = ctx.recent
        addr = packet.nw_src if self.side == "source" else packet.nw_dst
        return bool(known) and addr in known.get(self.list_name, ())

    def caveat(self):
        if self.action == "set":
            return (f"session affinity: remember this client in {self.list_name}"
                    + (f" for {self.seconds} s" if self.seconds else ""))
        return (f"session affinity: assumed a first connection (no {self.list_name} entry for "
                "this client); later connections within the timeout stick to its backend")

    def __str__(self):
        secs = f" --seconds {self.seconds}" if self.seconds else ""
        return f"-m recent --name {self.list_name} --{self.action}{secs}"


ICMP_TYPES = {"echo-reply": (0, None), "destination-unreachable": (3, None),
              "network-unreachable": (3, 0), "host-unreachable": (3, 1),
              "protocol-unreachable": (3, 2), "port-unreachable": (3, 3),
              "fragmentation-needed": (3, 4), "redirect": (5, None), "echo-request": (8, None),
              "time-exceeded": (11, None), "parameter-problem": (12, None), "any": (None, None)}


@dataclass(frozen=True)
class IcmpMatch(Match):
    """icmp ``--icmp-type``; as in OVS, the packet's ICMP type/code are ``tp_src``/``tp_dst``."""

    type: int | None                 # None = any
    code: int | None = None

    def _test(self, packet, ctx):
        if packet.nw_proto != 1:
            return False
        if self.type is None:
            return True
        if packet.tp_src is None or (self.code is not None and packet.tp_dst is None):
            return None
        return packet.tp_src == self.type and (self.code is None or packet.tp_dst == self.code)

    def undecided(self, packet, ctx):
        return "the packet has no ICMP type/code (tp_src/tp_dst)"

    def __str__(self):
        code = f"/{self.code}" if self.code is not None else ""
        return f"{self.bang}--icmp-type {'any' if self.type is None else self.type}{code}"


@dataclass(frozen=True)
class TcpFlagsMatch(Match):
    """tcp ``--tcp-flags MASK COMP`` / ``--syn``, against ``packet.tcp_flags`` ("syn,ack")."""

    mask: frozenset[str]
    comp: frozenset[str]

    def _test(self, packet, ctx):
        if packet.nw_proto != 6:
            return False
        if packet.tcp_flags is None:
            return None
        flags = {f.strip().upper() for f in packet.tcp_flags.split(",") if f.strip()}
        return flags & self.mask == self.comp

    def undecided(self, packet, ctx):
        return "the packet has no TCP flags"

    def __str__(self):
        mask, comp = ",".join(sorted(self.mask)), ",".join(sorted(self.comp)) or "NONE"
        return f"{self.bang}--tcp-flags {mask} {comp}"


@dataclass(frozen=True)
class UnknownMatch(Match):
    """Anything not modelled or not readable: never decided, so the trace stops as UNKNOWN."""

    text: str
    reason: str

    def _test(self, packet, ctx):
        return None

    def undecided(self, packet, ctx):
        return self.reason

    def __str__(self):
        return self.text


# --- ipset membership ------------------------------------------------------------------------

_SET_PORT = re.compile(r"^(?:(?P<proto>[a-z]+):)?(?P<port>\d+)(?:-(?P<hi>\d+))?$")


def ipset_contains(members: list[str], flags: tuple[str, ...], packet: Packet) -> bool | None:
    """Is the packet in the set? ``nomatch`` entries exclude; None if an entry is undecidable."""
    decided: list[tuple[bool, bool]] = []          # (entry matches, entry is nomatch)
    undecidable = False
    for member in members:
        words = member.split()
        if not words:
            continue
        hit = _set_entry_hit(words[0], flags, packet)
        if hit is None:
            undecidable = True
        else:
            decided.append((hit, "nomatch" in words[1:]))
    if any(hit and nomatch for hit, nomatch in decided):
        return False
    if any(hit and not nomatch for hit, nomatch in decided):
        return True
    return None if undecidable else False


def _set_entry_hit(entry: str, flags: tuple[str, ...], packet: Packet) -> bool | None:
    """One entry (``10.0.0.0/8``, ``10.0.0.1,tcp:80``, ``10.0.0.1,udp:53,10.0.0.2``)."""
    results = []
    for element, flag in zip(entry.split(","), flags):
        side = "src" if flag == "src" else "dst"
        results.append(_set_element_hit(element, side, packet))
    if False in results:
        return False
    return None if None in results else True


def _set_element_hit(element: str, side: str, packet: Packet) -> bool | None:
    try:
        return _in_network(getattr(packet, f"nw_{side}"), _network(element))
    except ValueError:
        pass
    port = _SET_PORT.match(element)
    if not port:
        return None                                   # interface names, MACs: not modelled
    proto = port["proto"]
    if proto and proto != "tcpudp" and PROTO_NUMBERS.get(proto) != packet.nw_proto:
        return False
    value = getattr(packet, f"tp_{side}")
    lo = int(port["port"])
    return None if value is None else lo <= value <= int(port["hi"] or lo)


# ---------------------------------------------------------------------------------------------
# The model


@dataclass
class Rule:
    matches: list[Match]
    target: str | None               # ACCEPT, DNAT, a chain name ...; None = no target
    target_args: dict
    source: Source
    text: str                        # the line as it reads in the bundle, stripped
    goto: bool = False               # -g: RETURN from the target returns to our caller
    unknown_target: str | None = None   # why the target cannot be simulated

    @property
    def comment(self) -> str | None:
        return next((m.text for m in self.matches if isinstance(m, CommentMatch)), None)


@dataclass
class Chain:
    name: str
    policy: str | None               # built-in chains: ACCEPT/DROP; user chains: None
    rules: list[Rule] = field(default_factory=list)


@dataclass
class Table:
    name: str
    chains: dict[str, Chain] = field(default_factory=dict)

    def chain(self, name: str, policy: str | None = None) -> Chain:
        """The chain, created on first mention (a declaration may set its policy later)."""
        found = self.chains.get(name)
        if found is None:
            found = self.chains[name] = Chain(name, policy)
        elif policy is not None:
            found.policy = policy
        return found


@dataclass
class Ruleset(Diagnosed):
    name: str                        # the bundle file it was read from
    tables: dict[str, Table] = field(default_factory=dict)
    diagnostics: list[InputError] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)   # what the input format hides

    def table(self, name: str) -> Table:
        return self.tables.setdefault(name, Table(name))

    def rules(self):
        """Every (table, chain, rule), in file order per chain."""
        for table in self.tables.values():
            for chain in table.chains.values():
                for rule in chain.rules:
                    yield table, chain, rule


# ---------------------------------------------------------------------------------------------
# Targets: their option grammar and how options become ``Rule.target_args``

TERMINAL_TARGETS = ("ACCEPT", "DROP", "REJECT", "RETURN")
PASSIVE_TARGETS = ("LOG", "NFLOG", "TRACE", "CHECKSUM", "TCPMSS")   # do not change the path


def _nat_args(option: str):
    def build(opts: dict[str, tuple]) -> dict:
        flags = tuple(o.lstrip("-") for o in opts if o != option)
        return {"to": nat_to(opts[option][0]) if option in opts else None, "flags": flags}
    return build


def _masquerade_args(opts: dict[str, tuple]) -> dict:
    ports = opts.get("--to-ports")
    return {"to_ports": port_range(ports[0]) if ports else None,
            "flags": tuple(o.lstrip("-") for o in opts if o != "--to-ports")}


def _mark_args(opts: dict[str, tuple]) -> dict:
    if len(opts) != 1:                 # zero or several operations: Rule.unknown_target says so
        return {}
    (verb, args), = opts.items()
    return {"mark": mark_op(verb, args[0])}


def _connmark_args(opts: dict[str, tuple]) -> dict:
    both = int(opts["--mask"][0], 0) if "--mask" in opts else MASK32
    nfmask = int(opts["--nfmask"][0], 0) if "--nfmask" in opts else both
    ctmask = int(opts["--ctmask"][0], 0) if "--ctmask" in opts else both
    for kind in ("save", "restore"):
        if f"--{kind}-mark" in opts:
            return {"connmark": ConnmarkOp(kind, None, nfmask, ctmask)}
    sets = [(o, a) for o, a in opts.items() if o in _MARK_OPTS]
    return {"connmark": ConnmarkOp("set", mark_op(sets[0][0], sets[0][1][0]))} if sets else {}


def _raw_args(opts: dict[str, tuple]) -> dict:
    return {name.lstrip("-"): (args[0] if len(args) == 1 else True) for name, args in opts.items()}


@dataclass(frozen=True)
class TargetSpec:
    options: dict[str, int]                        # option -> number of arguments
    build: Callable[[dict[str, tuple]], dict]      # options as written -> Rule.target_args
    requires: str | None = None                    # target_args key that must be present


_MARK_OPTS = {"--set-xmark": 1, "--set-mark": 1, "--and-mark": 1, "--or-mark": 1, "--xor-mark": 1}

TARGETS: dict[str, TargetSpec] = {
    "ACCEPT": TargetSpec({}, _raw_args),
    "DROP": TargetSpec({}, _raw_args),
    "RETURN": TargetSpec({}, _raw_args),
    "REJECT": TargetSpec({"--reject-with": 1}, _raw_args),
    "DNAT": TargetSpec({"--to-destination": 1, "--random": 0, "--persistent": 0},
                       _nat_args("--to-destination"), "to"),
    "SNAT": TargetSpec({"--to-source": 1, "--random": 0, "--random-fully": 0, "--persistent": 0},
                       _nat_args("--to-source"), "to"),
    "MASQUERADE": TargetSpec({"--to-ports": 1, "--random": 0, "--random-fully": 0},
                             _masquerade_args),
    "MARK": TargetSpec(_MARK_OPTS, _mark_args, "mark"),
    "CONNMARK": TargetSpec({**_MARK_OPTS, "--save-mark": 0, "--restore-mark": 0, "--mask": 1,
                            "--nfmask": 1, "--ctmask": 1}, _connmark_args, "connmark"),
    "NOTRACK": TargetSpec({}, _raw_args),
    "CT": TargetSpec({"--notrack": 0}, _raw_args, "notrack"),
    "LOG": TargetSpec({"--log-prefix": 1, "--log-level": 1, "--log-tcp-sequence": 0,
                       "--log-tcp-options": 0, "--log-ip-options": 0, "--log-uid": 0,
                       "--log-macdecode": 0}, _raw_args),
    "NFLOG": TargetSpec({"--nflog-group": 1, "--nflog-prefix": 1, "--nflog-range": 1,
                         "--nflog-size": 1, "--nflog-threshold": 1}, _raw_args),
    "TRACE": TargetSpec({}, _raw_args),
    "CHECKSUM": TargetSpec({"--checksum-fill": 0}, _raw_args),
    "TCPMSS": TargetSpec({"--set-mss": 1, "--clamp-mss-to-pmtu": 0}, _raw_args),
}


def _resolve_targets(ruleset: Ruleset) -> None:
    """After a table is read: a target is built-in, a chain of the table, or not modelled."""
    for table, _chain, rule in ruleset.rules():
        if rule.unknown_target or rule.target is None:
            continue
        spec = TARGETS.get(rule.target)
        if spec is None and rule.target not in table.chains:
            rule.unknown_target = (f"target {rule.target} is not modelled (and is not a chain "
                                   f"of table {table.name})")
        elif spec is not None and spec.requires and not rule.target_args.get(spec.requires):
            rule.unknown_target = f"target {rule.target} without its {spec.requires} argument"
        if rule.unknown_target:
            ruleset.diagnostics.append(NotModelled.at(rule.source, rule.unknown_target))


# ---------------------------------------------------------------------------------------------
# iptables-save grammar: core options and match modules, option -> decoder


@dataclass(frozen=True)
class Opt:
    """One option as written: ``! --dport 80`` -> Opt("--dport", ("80",), True)."""

    name: str
    args: tuple[str, ...]
    negated: bool

    @property
    def text(self) -> str:
        return " ".join((["!"] if self.negated else []) + [self.name]
                        + [shlex.quote(a) for a in self.args])


Decoder = Callable[[Opt], "Match | None"]


def _addr(field_name: str) -> Decoder:
    name = "-s" if field_name == "nw_src" else "-d"
    return lambda o: AddrMatch(name, field_name, _network(o.args[0]), negated=o.negated)


def _proto(o: Opt) -> Match | None:
    value = o.args[0].lower()
    if value in ("all", "0"):
        return None
    number = PROTO_NUMBERS.get(value, None if not value.isdigit() else int(value))
    if number is None:
        return UnknownMatch("-p", o.text, f"protocol {value!r} is not modelled", negated=False)
    return ProtoMatch("-p", number, negated=o.negated)


def _iface(field_name: str) -> Decoder:
    name = "-i" if field_name == "in_iface" else "-o"
    return lambda o: IfaceMatch(name, field_name, o.args[0], negated=o.negated)


CORE_OPTIONS: dict[str, tuple[int, Decoder]] = {
    "-s": (1, _addr("nw_src")), "--source": (1, _addr("nw_src")), "--src": (1, _addr("nw_src")),
    "-d": (1, _addr("nw_dst")), "--destination": (1, _addr("nw_dst")),
    "--dst": (1, _addr("nw_dst")),
    "-p": (1, _proto), "--protocol": (1, _proto),
    "-i": (1, _iface("in_iface")), "--in-interface": (1, _iface("in_iface")),
    "-o": (1, _iface("out_iface")), "--out-interface": (1, _iface("out_iface")),
    "-f": (0, lambda o: FragmentMatch("-f", negated=o.negated)),
    "--fragment": (0, lambda o: FragmentMatch("-f", negated=o.negated)),
}


def _ports(field_name: str) -> Decoder:
    def decode(o: Opt) -> Match:
        ranges = tuple(port_range(p) for p in o.args[0].split(","))
        return PortMatch(o.name, field_name, ranges, negated=o.negated)
    return decode


def _not_modelled(what: str) -> Decoder:
    return lambda o: UnknownMatch(o.name, o.text, f"{what} {o.name} is not modelled")


def _ignored(o: Opt) -> None:
    """Options that do not change whether a packet matches (e.g. counter updates)."""
    return None


def _tcp_flags(o: Opt) -> Match:
    names = [set() if a.upper() == "NONE" else
             {"SYN", "ACK", "FIN", "RST", "URG", "PSH"} if a.upper() == "ALL" else
             {f.upper() for f in a.split(",")} for a in o.args]
    return TcpFlagsMatch("--tcp-flags", frozenset(names[0]), frozenset(names[1]), negated=o.negated)


def _syn(o: Opt) -> Match:
    return TcpFlagsMatch("--syn", frozenset({"SYN", "RST", "ACK", "FIN"}), frozenset({"SYN"}),
                         negated=o.negated)


def _icmp_type(o: Opt) -> Match:
    value = o.args[0]
    if value in ICMP_TYPES:
        kind, code = ICMP_TYPES[value]
    else:
        kind_text, _, code_text = value.partition("/")
        kind, code = int(kind_text), int(code_text) if code_text else None
    return IcmpMatch("--icmp-type", kind, code, negated=o.negated)


def _states(o: Opt) -> Match:
    return CtStateMatch(o.name, frozenset(s.upper() for s in o.args[0].split(",")),
                        negated=o.negated)


def _ct_tuple(field_name: str, is_port: bool) -> Decoder:
    def decode(o: Opt) -> Match:
        value = port_range(o.args[0]) if is_port else _network(o.args[0])
        return CtTupleMatch(o.name, field_name, value, negated=o.negated)
    return decode


_TCP_UDP: dict[str, tuple[int, Decoder]] = {
    "--dport": (1, _ports("tp_dst")), "--destination-port": (1, _ports("tp_dst")),
    "--sport": (1, _ports("tp_src")), "--source-port": (1, _ports("tp_src")),
}

_CONNTRACK: dict[str, tuple[int, Decoder]] = {
    "--ctstate": (1, _states),
    "--ctdir": (1, lambda o: CtDirMatch("--ctdir", o.args[0].upper(), negated=o.negated)),
    "--ctorigsrc": (1, _ct_tuple("nw_src", False)), "--ctorigdst": (1, _ct_tuple("nw_dst", False)),
    "--ctorigsrcport": (1, _ct_tuple("tp_src", True)),
    "--ctorigdstport": (1, _ct_tuple("tp_dst", True)),
    **{opt: (1, _not_modelled("conntrack option")) for opt in (
        "--ctstatus", "--ctproto", "--ctreplsrc", "--ctrepldst", "--ctreplsrcport",
        "--ctrepldstport", "--ctexpire")},
}


def _per_option(table: dict[str, tuple[int, Decoder]]) -> Callable[[list[Opt]], list[Match]]:
    def build(opts: list[Opt]) -> list[Match]:
        return [m for m in (table[o.name][1](o) for o in opts) if m is not None]
    return build


def _addrtype(opts: list[Opt]) -> list[Match]:
    limit = any(o.name.startswith("--limit-iface") for o in opts)
    return [AddrTypeMatch(o.name, "nw_src" if o.name == "--src-type" else "nw_dst",
                          tuple(t.upper() for t in o.args[0].split(",")), limit, negated=o.negated)
            for o in opts if o.name in ("--src-type", "--dst-type")]


def _statistic(opts: list[Opt]) -> list[Match]:
    by_name = {o.name: o for o in opts}
    mode = by_name["--mode"].args[0] if "--mode" in by_name else "random"
    needed = "--every" if mode == "nth" else "--probability"
    if needed not in by_name:
        raise ValueError(f"statistic --mode {mode} without {needed}")
    if mode == "nth":
        every = by_name["--every"]
        return [StatisticMatch("--every", "nth", 1.0 / int(every.args[0]), negated=every.negated)]
    prob = by_name["--probability"]
    chance = float(prob.args[0])
    if not 0.0 <= chance <= 1.0:
        raise ValueError(f"probability {chance} outside 0..1")
    return [StatisticMatch("--probability", "random", chance, negated=prob.negated)]


def _physdev(opts: list[Opt]) -> list[Match]:
    return [PhysdevMatch("physdev", tuple((o.name, o.args[0] if o.args else None, o.negated)
                                          for o in opts))]


def _recent(opts: list[Opt]) -> list[Match]:
    by_name = {o.name: (o.args[0] if o.args else None) for o in opts}
    action = next((a for a in ("set", "rcheck", "update", "remove") if f"--{a}" in by_name), None)
    if action is None:
        return [UnknownMatch("recent", "-m recent",
                             "recent without --set/--rcheck/--update/--remove")]
    side = "dest" if "--rdest" in by_name else "source"
    secs = by_name.get("--seconds")
    neg = any(o.negated for o in opts if o.name == f"--{action}")
    return [RecentMatch("recent", by_name.get("--name") or "DEFAULT", action, side,
                        int(secs) if secs else None, negated=neg)]


def _limit(opts: list[Opt]) -> list[Match]:
    by_name = {o.name: o.args[0] for o in opts}
    burst = by_name.get("--limit-burst")
    return [LimitMatch("--limit", by_name.get("--limit", "3/hour"), int(burst) if burst else None)]


@dataclass(frozen=True)
class ModuleSpec:
    """A ``-m`` module: its options (-> number of arguments) and how they become matches."""

    options: dict[str, int]
    build: Callable[[list[Opt]], list[Match]]


def _module(table: dict[str, tuple[int, Decoder]]) -> ModuleSpec:
    return ModuleSpec({opt: nargs for opt, (nargs, _) in table.items()}, _per_option(table))


MODULES: dict[str, ModuleSpec] = {
    "tcp": _module({**_TCP_UDP, "--tcp-flags": (2, _tcp_flags), "--syn": (0, _syn),
                    "--tcp-option": (1, _not_modelled("tcp option"))}),
    "udp": _module(_TCP_UDP),
    "udplite": _module(_TCP_UDP),
    "sctp": _module({**_TCP_UDP, "--chunk-types": (2, _not_modelled("sctp option"))}),
    "icmp": _module({"--icmp-type": (1, _icmp_type)}),
    "multiport": _module({
        "--dports": (1, _ports("tp_dst")), "--destination-ports": (1, _ports("tp_dst")),
        "--sports": (1, _ports("tp_src")), "--source-ports": (1, _ports("tp_src")),
        "--ports": (1, lambda o: MultiportMatch("--ports", tuple(
            port_range(p) for p in o.args[0].split(",")), negated=o.negated))}),
    "comment": _module({"--comment": (1, lambda o: CommentMatch("--comment", o.args[0]))}),
    "mark": _module({"--mark": (1, lambda o: MarkMatch("--mark", mark(o.args[0]),
                                                       negated=o.negated))}),
    "connmark": _module({"--mark": (1, lambda o: ConnmarkMatch("connmark", mark(o.args[0]),
                                                               negated=o.negated))}),
    "conntrack": _module(_CONNTRACK),
    "state": _module({"--state": (1, _states)}),
    "set": _module({
        "--match-set": (2, lambda o: SetMatch("--match-set", o.args[0],
                                              tuple(o.args[1].split(",")), negated=o.negated)),
        **{opt: (0, _ignored) for opt in ("--update-counters", "--update-subcounters",
                                          "--no-update-counters", "--no-update-subcounters")},
        "--return-nomatch": (0, _not_modelled("set option")),
        **{opt: (1, _not_modelled("set option")) for opt in (
            "--packets-eq", "--packets-lt", "--packets-gt", "--bytes-eq", "--bytes-lt",
            "--bytes-gt")}}),
    "mac": _module({"--mac-source": (1, lambda o: MacMatch("--mac-source", o.args[0],
                                                           negated=o.negated))}),
    "length": _module({"--length": (1, lambda o: LengthMatch("--length", port_range(o.args[0]),
                                                             negated=o.negated))}),
    "addrtype": ModuleSpec({"--src-type": 1, "--dst-type": 1, "--limit-iface-in": 0,
                            "--limit-iface-out": 0}, _addrtype),
    "statistic": ModuleSpec({"--mode": 1, "--probability": 1, "--every": 1, "--packet": 1},
                            _statistic),
    "physdev": ModuleSpec({"--physdev-in": 1, "--physdev-out": 1, "--physdev-is-in": 0,
                           "--physdev-is-out": 0, "--physdev-is-bridged": 0}, _physdev),
    "limit": ModuleSpec({"--limit": 1, "--limit-burst": 1}, _limit),
    "recent": ModuleSpec({"--name": 1, "--set": 0, "--rcheck": 0, "--update": 0, "--remove": 0,
                          "--seconds": 1, "--reap": 0, "--hitcount": 1, "--rttl": 0,
                          "--rsource": 0, "--rdest": 0, "--mask": 1}, _recent),
}

# -p tcp lets tcp's options be used without -m tcp (iptables loads the module implicitly)
IMPLICIT_MODULES = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 136: "udplite"}


# --- the rule tokenizer and walker -----------------------------------------------------------


# a shell word: runs of plain characters, "double-quoted" (backslash escapes), 'single-quoted'
_WORD = re.compile(r"""(?:[^\s"'\\]+|"(?:[^"\\]|\\.)*"|'[^']*'|\\.)+""", re.S)
_PIECE = re.compile(r""""((?:[^"\\]|\\.)*)"|'([^']*)'|\\(.)|([^"'\\]+)""", re.S)
_DQ_ESCAPE = re.compile(r"""\\([\\"$`])""")


def tokenize(text: str) -> list[str]:
    """Words with POSIX shell quoting, as iptables-save writes them (``--comment "a b"``).

    Same result as ``shlex.split`` (which was 60% of the parse time). Raises ValueError on an
    unterminated quote.
    """
    if '"' not in text and "'" not in text and "\\" not in text:
        return text.split()                       # fast path: nothing quoted
    words, end = [], 0
    for found in _WORD.finditer(text):
        start, word = found.start(), found[0]
        if start > end and not text[end:start].isspace():
            raise ValueError("no closing quotation")
        if '"' in word or "'" in word or "\\" in word:
            word = "".join(_unquote(p) for p in _PIECE.finditer(word))
        words.append(word)
        end = found.end()
    if text[end:].strip():
        raise ValueError("no closing quotation")
    return words


def _unquote(piece: re.Match) -> str:
    double, single, escaped, plain = piece.groups()
    if double is not None:
        return _DQ_ESCAPE.sub(r"\1", double)
    return next(p for p in (single, escaped, plain) if p is not None)


class _Syntax(ValueError):
    """The rule does not follow the grammar: a syntax error at this line."""


@dataclass
class _Bucket:
    """Options collected for one ``-m`` module (or an unknown one) until the rule ends."""

    module: str
    spec: ModuleSpec | None
    opts: list[Opt] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)        # options not in the grammar

    def matches(self) -> list[Match]:
        if self.spec is None:
            text = " ".join(["-m", self.module] + self.unknown)
            reason = f"match module '{self.module}' is not modelled"
            return [UnknownMatch(self.module, text, reason)]
        out = self.spec.build(self.opts) if self.opts else []
        return out + [UnknownMatch(self.module, u,
                                   f"option {u} of match '{self.module}' is not modelled")
                      for u in self.unknown]


@dataclass
class _ParsedRule:
    items: list = field(default_factory=list)      # Match or _Bucket, in the order written
    target: str | None = None
    target_opts: dict[str, tuple] = field(default_factory=dict)
    target_unknown: list[str] = field(default_factory=list)
    goto: bool = False


class _Cursor:
    """Reads the words of one rule left to right."""

    def __init__(self, words: list[str]):
        self.words, self.pos = words, 0

    def more(self) -> bool:
        return self.pos < len(self.words)

    def peek(self) -> str | None:
        return self.words[self.pos] if self.more() else None

    def take(self) -> str:
        self.pos += 1
        return self.words[self.pos - 1]

    def bang(self) -> bool:
        if self.peek() == "!":
            self.pos += 1
            return True
        return False

    def args(self, option: str, count: int) -> tuple[bool, tuple[str, ...]]:
        """``count`` arguments; also accepts the old spelling ``--opt ! value``."""
        negated = count > 0 and self.bang()
        if self.pos + count > len(self.words):
            raise _Syntax(f"option {option} needs {count} argument(s): the line is truncated")
        values = tuple(self.words[self.pos:self.pos + count])
        self.pos += count
        return negated, values

    def free_args(self) -> list[str]:
        """Arguments of an option we do not know: the words up to the next option."""
        taken = []
        while self.more() and not self.peek().startswith("-"):
            taken.append(self.take())
        return taken


_STRUCTURAL = ("-m", "--match", "-j", "--jump", "-g", "--goto")


def parse_rule_words(words: list[str]) -> _ParsedRule:
    """The words after ``-A CHAIN`` -> matches and target, per the grammar tables."""
    rule, cur = _ParsedRule(), _Cursor(words)
    bucket: _Bucket | None = None
    while cur.more():
        negated = cur.bang()
        word = cur.take() if cur.more() else None
        if word is None:
            raise _Syntax("'!' at the end of the rule")
        if word in _STRUCTURAL and negated:
            raise _Syntax(f"'!' cannot negate {word}")
        if word in ("-m", "--match"):
            name = cur.args(word, 1)[1][0]
            bucket = _Bucket(name, MODULES.get(name))
            rule.items.append(bucket)
        elif word in ("-j", "--jump", "-g", "--goto"):
            _read_target(cur, word, rule)
            bucket = None
        elif word in CORE_OPTIONS:
            nargs, decode = CORE_OPTIONS[word]
            bang, args = cur.args(word, nargs)
            rule.items.append(decode(Opt(word, args, negated or bang)))
        elif word.startswith("-"):
            _read_module_option(cur, word, negated, bucket, rule)
        else:
            raise _Syntax(f"unexpected word {word!r}")
    return rule


def _read_module_option(cur: _Cursor, word: str, negated: bool, bucket: _Bucket | None,
                        rule: _ParsedRule) -> None:
    """An option belongs to the last -m module, else to the module implied by -p."""
    if word == "-c":                               # -c PKTS BYTES inside the rule (old -c form)
        cur.args(word, 2)
        return
    if bucket is not None and bucket.spec is None:
        bucket.unknown.append(" ".join((["!"] if negated else []) + [word] + cur.free_args()))
        return
    owner = bucket if bucket is not None and word in bucket.spec.options else None
    if owner is None:
        owner = _implicit_bucket(rule, word)
    if owner is None:
        text = " ".join((["!"] if negated else []) + [word] + cur.free_args())
        if bucket is None:
            raise _Syntax(f"option {word} outside any match module")
        bucket.unknown.append(text)
        return
    bang, args = cur.args(word, owner.spec.options[word])
    owner.opts.append(Opt(word, args, negated or bang))


def _implicit_bucket(rule: _ParsedRule, word: str) -> _Bucket | None:
    protos = [m.proto for m in rule.items if isinstance(m, ProtoMatch) and not m.negated]
    module = IMPLICIT_MODULES.get(protos[-1]) if protos else None
    if module is None or word not in MODULES[module].options:
        return None
    bucket = _Bucket(module, MODULES[module])
    rule.items.append(bucket)
    return bucket


def _read_target(cur: _Cursor, word: str, rule: _ParsedRule) -> None:
    if rule.target is not None:
        raise _Syntax("two targets in one rule")
    rule.target = cur.args(word, 1)[1][0]
    rule.goto = word in ("-g", "--goto")
    spec = TARGETS.get(rule.target)
    while cur.more() and cur.peek().startswith("--") and cur.peek() not in _STRUCTURAL:
        option = cur.take()
        if spec is not None and option in spec.options:
            rule.target_opts[option] = cur.args(option, spec.options[option])[1]
        else:
            rule.target_unknown.append(" ".join([option] + cur.free_args()))


def build_rule(words: list[str], source: Source, diagnostics: list[InputError]) -> Rule:
    """A Rule from the words after the chain name. Problems become diagnostics, never crashes."""
    try:
        parsed = parse_rule_words(words)
        matches = [m for item in parsed.items
                   for m in (item.matches() if isinstance(item, _Bucket) else [item])
                   if m is not None]
        target_args, unknown_target = _target_args(parsed)
    except (_Syntax, ValueError, KeyError) as exc:
        reason = str(exc) if isinstance(exc, _Syntax) else f"cannot read rule: {exc}"
        diagnostics.append(RuleSyntaxError.at(source, reason))
        return Rule([UnknownMatch("syntax", source.text.strip(), reason)], None, {}, source,
                    source.text.strip())
    rule = Rule(matches, parsed.target, target_args, source, source.text.strip(), parsed.goto,
                unknown_target)
    _note_not_modelled(rule, diagnostics)
    return rule


def _target_args(parsed: _ParsedRule) -> tuple[dict, str | None]:
    spec = TARGETS.get(parsed.target)
    if parsed.target_unknown and spec is None:
        return {}, f"target {parsed.target} is not modelled"
    if parsed.target_unknown:
        return {}, (f"option {', '.join(parsed.target_unknown)} of target {parsed.target} "
                    f"is not modelled")
    return (spec.build(parsed.target_opts) if spec else {}), None


def _note_not_modelled(rule: Rule, diagnostics: list[InputError]) -> None:
    for m in rule.matches:
        if isinstance(m, UnknownMatch):
            diagnostics.append(NotModelled.at(rule.source, m.reason))
    if rule.unknown_target:
        diagnostics.append(NotModelled.at(rule.source, rule.unknown_target))


# ---------------------------------------------------------------------------------------------
# iptables-save


_CHAIN_DECL = re.compile(r"^:(\S+)\s+(\S+)(?:\s+\[\d+:\d+\])?\s*$")
_COUNTERS = re.compile(r"^\[\d+:\d+\]\s+")


class _SaveReader:
    """Line-by-line state of ``parse_iptables_save``: the current table and its chains."""

    def __init__(self, name: str, default_table: str | None):
        self.ruleset = Ruleset(name)
        self.default_table = default_table
        self.table: Table | None = None
        self.headerless: list[Source] = []     # lines before any *table (grep-filtered output)

    def feed(self, source: Source) -> None:
        line = source.text.strip()
        if not line or line.startswith("#"):
            return
        if line.startswith("*"):
            self._table_header(source, line[1:].strip())
        elif line == "COMMIT":
            if self.table is None:
                self._error(source, "COMMIT outside a *table section")
            self.table = None
        elif line.startswith(":"):
            self._chain_decl(source, line)
        elif _COUNTERS.match(line) or line.startswith("-A"):
            self._rule(source, _COUNTERS.sub("", line, count=1))
        else:
            self._error(source, "not an iptables-save line (expected *table, :chain, -A or COMMIT)")

    def finish(self) -> Ruleset:
        if self.headerless and self.default_table is None:
            first = self.headerless[0]
            more = len(self.headerless) - 1
            self._error(first, "rule or chain outside any *table section (grep-filtered "
                        "iptables-save? pass default_table to read such lines)"
                        + (f"; {more} more such lines ignored" if more else ""))
        elif self.headerless:
            self.ruleset.caveats.append(
                f"{len(self.headerless)} lines had no *table header and were read into table "
                f"{self.default_table!r} as asked; the output looks filtered, so chains may be "
                f"incomplete and rules of other tables mixed in")
        _resolve_targets(self.ruleset)
        return self.ruleset

    def _current(self, source: Source) -> Table | None:
        if self.table is not None:
            return self.table
        self.headerless.append(source)
        return self.ruleset.table(self.default_table) if self.default_table else None

    def _table_header(self, source: Source, name: str) -> None:
        if not re.fullmatch(r"[a-z_]+", name):
            self._error(source, f"bad table header {name!r}")
            return
        self.table = self.ruleset.table(name)

    def _chain_decl(self, source: Source, line: str) -> None:
        found = _CHAIN_DECL.match(line)
        if not found:
            self._error(source, "bad chain declaration (expected ':CHAIN POLICY [pkts:bytes]')")
            return
        table = self._current(source)
        if table is not None:
            policy = found[2]
            table.chain(found[1], None if policy == "-" else policy)

    def _rule(self, source: Source, line: str) -> None:
        head = line.split(None, 2)
        if head[0] != "-A" or len(head) < 2:
            self._error(source, "truncated rule: '-A' without a chain name" if head[0] == "-A"
                        else f"unsupported command {head[0]!r} (iptables-save has only -A)")
            return
        table = self._current(source)
        if table is None:
            return
        try:
            words = tokenize(head[2]) if len(head) > 2 else []
        except ValueError as exc:
            reason = f"cannot split rule into words: {exc}"
            self._error(source, reason)
            rule = Rule([UnknownMatch("syntax", line, reason)], None, {}, source, line)
        else:
            rule = build_rule(words, source, self.ruleset.diagnostics)
        table.chain(head[1]).rules.append(rule)

    def _error(self, source: Source, reason: str) -> None:
        self.ruleset.diagnostics.append(RuleSyntaxError.at(source, reason))


def parse_iptables_save(text: str, name: str, default_table: str | None = None) -> Ruleset:
    """Read ``iptables-save`` output (all tables; ``-c`` counters allowed).

    Lines outside any ``*table`` section (e.g. ``iptables-save | grep cilium``) cannot be placed
    in a table: we do not guess one from chain names. They are one syntax error unless the
    caller names ``default_table``, in which case they are read into it and a caveat says so.
    """
    if default_table is not None and default_table not in TABLES:
        raise ValueError(f"default_table must be one of {TABLES}")
    reader = _SaveReader(name, default_table)
    for number, line in enumerate(text.splitlines(), 1):
        reader.feed(Source(name, number, line))
    return reader.finish()


# ---------------------------------------------------------------------------------------------
# iptables -L -n [-v]: the listing of one table


_CHAIN_HEADER = re.compile(r"^Chain (\S+) \((?:policy (\S+)[^)]*|\d+ references)\)\s*$")
_COLUMNS = re.compile(r"^\s*(pkts\s+bytes\s+)?target\s+prot\s+opt\s+(in\s+out\s+)?"
                      r"source\s+destination\s*$")
_COUNTER = re.compile(r"^\d+[KMGTPE]?$")
_OPT_COLUMN = re.compile(r"^(--|-f|!f)$")
_EXTRA_TOKEN = re.compile(r"/\* (.*?) \*/|\S+")
_ANY = ("0.0.0.0/0", "::/0", "anywhere")


@dataclass
class _Listing:
    """State of ``parse_iptables_list``: the chain being read and the column layout."""

    ruleset: Ruleset
    table: Table
    chain: Chain | None = None
    verbose: bool | None = None            # has pkts/bytes and in/out columns


def parse_iptables_list(text: str, name: str, table: str = "nat") -> Ruleset:
    """Read ``iptables -t TABLE -L -n`` or ``-nvL`` output into a one-table Ruleset."""
    state = _Listing(Ruleset(name), Table(table))
    state.ruleset.tables[table] = state.table
    for number, line in enumerate(text.splitlines(), 1):
        _list_line(state, Source(name, number, line))
    if state.verbose is False:
        state.ruleset.caveats.append(
            "`iptables -L` without -v hides interface matches (-i/-o): rules are read as "
            "matching any interface")
    _resolve_targets(state.ruleset)
    return state.ruleset


def _list_line(state: _Listing, source: Source) -> None:
    line = source.text
    if not line.strip():
        state.chain = None
        return
    header = _CHAIN_HEADER.match(line.strip())
    if header:
        state.chain = state.table.chain(header[1], header[2])
        return
    columns = _COLUMNS.match(line)
    if columns:
        state.verbose = bool(columns[1]) if state.verbose is None else state.verbose
        return
    if state.chain is None:
        _list_error(state, source, "rule line outside a chain (expected 'Chain NAME (...)')")
        return
    try:
        rule = _list_rule(source, bool(state.verbose), state.ruleset.diagnostics)
    except _Syntax as exc:
        _list_error(state, source, str(exc))
        rule = Rule([UnknownMatch("syntax", line.strip(), str(exc))], None, {}, source,
                    line.strip())
    state.chain.rules.append(rule)


def _list_error(state: _Listing, source: Source, reason: str) -> None:
    state.ruleset.diagnostics.append(RuleSyntaxError.at(source, reason))


def _list_rule(source: Source, verbose: bool, diagnostics: list[InputError]) -> Rule:
    """``[pkts bytes] [target] prot opt [in out] source destination [extras]``."""
    fields = source.text.split()
    if verbose:
        if len(fields) < 2 or not all(_COUNTER.match(f) for f in fields[:2]):
            raise _Syntax("expected packet and byte counters first (iptables -L -v)")
        fields = fields[2:]
    # an empty target column is allowed: then the second word is the opt column
    has_target = not (len(fields) > 1 and _OPT_COLUMN.match(fields[1]))
    width = (4 if verbose else 2) + 2 + has_target      # target? prot opt [in out] src dst
    if len(fields) < width or not _OPT_COLUMN.match(fields[1 + has_target]):
        raise _Syntax("not a rule line of `iptables -L`: too few columns")
    target = fields[0] if has_target else None
    prot, opt, *rest = fields[has_target:width]
    matches = _list_columns(prot, opt, rest, verbose)
    extras = _extras_text(source.text, verbose, has_target)
    more, target_args = _list_extras(extras, target)
    rule = Rule(matches + more, target, target_args, source, source.text.strip())
    _note_not_modelled(rule, diagnostics)
    return rule


def _extras_text(line: str, verbose: bool, has_target: bool) -> str:
    """Whatever follows the destination column (comments keep their inner spacing)."""
    skip = (2 if verbose else 0) + has_target + 2 + (2 if verbose else 0) + 2
    parts = line.split(None, skip)
    return parts[skip] if len(parts) > skip else ""


def _negatable(value: str) -> tuple[bool, str]:
    return (True, value[1:]) if value.startswith("!") else (False, value)


def _list_columns(prot: str, opt: str, rest: list[str], verbose: bool) -> list[Match]:
    matches: list[Match | None] = []
    neg, value = _negatable(prot)
    matches.append(_proto(Opt("-p", (value,), neg)))
    if opt != "--":
        matches.append(FragmentMatch("-f", negated=opt.startswith("!")))
    if verbose:
        for option, value in zip(("-i", "-o"), rest[:2]):
            neg, value = _negatable(value)
            if value != "*":
                matches.append(CORE_OPTIONS[option][1](Opt(option, (value,), neg)))
        rest = rest[2:]
    for option, value in zip(("-s", "-d"), rest):
        neg, value = _negatable(value)
        if value not in _ANY:
            matches.append(_list_address(option, value, neg))
    return [m for m in matches if m is not None]


def _list_address(option: str, value: str, negated: bool) -> Match:
    try:
        return CORE_OPTIONS[option][1](Opt(option, (value,), negated))
    except ValueError:
        return UnknownMatch(option, f"{option} {value}",
                            f"address {value!r} is a name, not an address (list without -n?)")


# --- list extras: the human rendering of modules and targets, word -> decoder ---------------


@dataclass
class _Words:
    """The extra words of one list-format rule, read left to right."""

    tokens: list[tuple[str, str | None]]    # (word, comment text or None)
    pos: int = 0
    matches: list[Match] = field(default_factory=list)
    target_args: dict = field(default_factory=dict)

    def more(self) -> bool:
        return self.pos < len(self.tokens)

    def peek(self) -> str | None:
        return self.tokens[self.pos][0] if self.more() else None

    def take(self) -> str:
        self.pos += 1
        if self.pos > len(self.tokens):
            raise _Syntax("the rule's extra words end too early")
        return self.tokens[self.pos - 1][0]

    def take_negatable(self) -> tuple[bool, str]:
        if self.peek() == "!":
            self.pos += 1
            return True, self.take()
        return _negatable(self.take())


ListDecoder = Callable[[_Words, bool], None]


def _l_ports(words: _Words, negated: bool) -> None:
    """``tcp dpt:80 spts:1000:2000 flags:0x17/0x02`` (the bare ``tcp`` is -m tcp alone)."""
    names = {"dpt": ("--dport", "tp_dst"), "dpts": ("--dport", "tp_dst"),
             "spt": ("--sport", "tp_src"), "spts": ("--sport", "tp_src")}
    while words.more() and words.peek().split(":", 1)[0] in (*names, "flags", "option="):
        key, _, value = words.take().partition(":")
        neg, value = _negatable(value)
        if key == "flags":
            mask, _, comp = value.partition("/")
            words.matches.append(TcpFlagsMatch("--tcp-flags", _tcp_bits(mask), _tcp_bits(comp),
                                               negated=neg))
        else:
            name, attr = names[key]
            words.matches.append(PortMatch(name, attr, (port_range(value),), negated=neg))


_TCP_BITS = {0x01: "FIN", 0x02: "SYN", 0x04: "RST", 0x08: "PSH", 0x10: "ACK", 0x20: "URG"}


def _tcp_bits(text: str) -> frozenset[str]:
    value = int(text, 16)
    return frozenset(name for bit, name in _TCP_BITS.items() if value & bit)


def _l_multiport(words: _Words, negated: bool) -> None:
    kind = words.take()                                    # dports | sports | ports
    neg, value = words.take_negatable()
    ranges = tuple(port_range(p) for p in value.split(","))
    if kind == "ports":
        words.matches.append(MultiportMatch("--ports", ranges, negated=neg))
    else:
        attr = "tp_dst" if kind == "dports" else "tp_src"
        words.matches.append(PortMatch(f"--{kind}", attr, ranges, negated=neg))


def _l_addrtype(words: _Words, negated: bool) -> None:
    """``ADDRTYPE match dst-type LOCAL [limit-in]`` (negation: ``dst-type !LOCAL``)."""
    if words.peek() == "match":
        words.take()
    found = []
    while words.peek() in ("src-type", "dst-type"):
        option = "--" + words.take()
        neg, types = words.take_negatable()
        found.append((option, neg, types))
    limit = words.peek() in ("limit-in", "limit-out")
    if limit:
        words.take()
    for option, neg, types in found:
        words.matches.append(AddrTypeMatch(option, "nw_src" if option == "--src-type" else "nw_dst",
                                           tuple(types.split(",")), limit, negated=neg))


def _l_mark(kind: str) -> ListDecoder:
    """``mark match [!] 0x4000/0x4000`` and ``connmark match ...``."""
    def decode(words: _Words, negated: bool) -> None:
        if words.peek() == "match":
            words.take()
        neg, value = words.take_negatable()
        cls, name = (MarkMatch, "--mark") if kind == "mark" else (ConnmarkMatch, "connmark")
        words.matches.append(cls(name, mark(value), negated=neg or negated))
    return decode


def _l_states(name: str) -> ListDecoder:
    def decode(words: _Words, negated: bool) -> None:
        words.matches.append(_states(Opt(name, (words.take(),), negated)))
    return decode


def _l_conntrack(name: str, decoder: Decoder) -> ListDecoder:
    def decode(words: _Words, negated: bool) -> None:
        words.matches.append(decoder(Opt(name, (words.take(),), negated)))
    return decode


def _l_set(words: _Words, negated: bool) -> None:
    set_name, flags = words.take(), words.take()
    words.matches.append(SetMatch("--match-set", set_name, tuple(flags.split(",")),
                                  negated=negated))


def _l_statistic(words: _Words, negated: bool) -> None:
    """``statistic mode random [!] probability 0.5`` / ``mode nth every 3 [packet 0]``."""
    opts = []
    while words.peek() in ("mode", "probability", "every", "packet", "!"):
        neg = words.peek() == "!" and bool(words.take())
        option = words.take()
        opts.append(Opt(f"--{option}", (words.take(),), neg))
    words.matches.extend(_statistic(opts))


def _l_physdev(words: _Words, negated: bool) -> None:
    """``PHYSDEV match --physdev-in eth0 ! --physdev-is-bridged``."""
    if words.peek() == "match":
        words.take()
    opts = []
    while words.peek() == "!" or (words.peek() or "").startswith("--physdev"):
        neg = words.peek() == "!" and bool(words.take())
        option = words.take()
        value = words.take() if MODULES["physdev"].options.get(option) == 1 else None
        opts.append(Opt(option, (value,) if value else (), neg))
    words.matches.extend(_physdev(opts))


def _l_mac(words: _Words, negated: bool) -> None:
    neg, value = words.take_negatable()
    words.matches.append(MacMatch("--mac-source", value, negated=neg or negated))


def _l_length(words: _Words, negated: bool) -> None:
    neg, value = words.take_negatable()
    words.matches.append(LengthMatch("--length", port_range(value), negated=neg or negated))


def _l_limit(words: _Words, negated: bool) -> None:
    """``limit: avg 3/hour burst 5`` (or ``limit: up to ...``)."""
    rate, burst = "?", None
    while words.peek() in ("avg", "up", "to", "burst"):
        key = words.take()
        if key in ("avg", "to"):
            rate = words.take()
        elif key == "burst":
            burst = int(words.take())
    words.matches.append(LimitMatch("--limit", rate, burst))


def _l_recent(words: _Words, negated: bool) -> None:
    """``recent: CHECK seconds: 10800 reap name: KUBE-SEP-X side: source mask: 255.255.255.255``."""
    action = {"SET": "set", "CHECK": "rcheck", "UPDATE": "update", "REMOVE": "remove"}.get(
        words.take() or "", None)
    name, side, secs = "DEFAULT", "source", None
    while words.peek() in ("seconds:", "reap", "name:", "side:", "mask:", "hit_count:", "TTL-Match"):
        key = words.take()
        if key == "seconds:":
            secs = int(words.take())
        elif key == "name:":
            name = words.take()
        elif key == "side:":
            side = words.take()
        elif key in ("mask:", "hit_count:"):
            words.take()
    if action is None:
        words.matches.append(UnknownMatch("recent", "recent:", "unreadable recent match"))
        return
    words.matches.append(RecentMatch("recent", name, action, side, secs, negated=negated))


def _l_icmp(words: _Words, negated: bool) -> None:
    """``icmptype 8 [code 0]`` (with -n), ``icmp !type 8`` or ``icmp echo-request``."""
    neg, word = words.take_negatable()
    if word == "type":
        word = words.take()
    code = None
    if words.peek() == "code":
        words.take()
        code = int(words.take())
    if word.isdigit():
        kind, named_code = int(word), None
    else:
        kind, named_code = ICMP_TYPES.get(word, (None, None))
    if kind is None and word != "any":
        raise _Syntax(f"unknown ICMP type {word!r}")
    words.matches.append(IcmpMatch("--icmp-type", kind, code if code is not None else named_code,
                                   negated=neg or negated))


def _l_icmptype(words: _Words, negated: bool) -> None:
    words.tokens.insert(words.pos, ("type", None))
    _l_icmp(words, negated)


def _l_nat_to(words: _Words, negated: bool) -> None:
    """DNAT/SNAT ``to:10.222.2.34:80`` (the word itself carries the value)."""
    word = words.tokens[words.pos - 1][0]
    words.target_args.setdefault("to", nat_to(word.split(":", 1)[1]))
    words.target_args.setdefault("flags", ())


def _l_flag(words: _Words, negated: bool) -> None:
    """``random``, ``random-fully``, ``persistent`` of the NAT targets."""
    flag = words.tokens[words.pos - 1][0]
    words.target_args["flags"] = words.target_args.get("flags", ()) + (flag,)


def _l_masq(words: _Words, negated: bool) -> None:
    """``masq ports: 1000-2000``."""
    if words.take() != "ports:":
        raise _Syntax("expected 'masq ports: RANGE'")
    words.target_args["to_ports"] = port_range(words.take())


def _l_mark_target(words: _Words, negated: bool) -> None:
    """``MARK or 0x4000``, ``MARK set 0x1``, ``MARK xset 0x4000/0x4000``, ``MARK and 0x...``."""
    verb = words.take()
    words.target_args["mark"] = mark_op(verb, words.take())


def _l_connmark_target(words: _Words, negated: bool) -> None:
    """``CONNMARK save|restore [mask M | nfmask M ctmask ~M]`` or ``CONNMARK xset V/M``."""
    verb = words.take()
    if verb not in ("save", "restore"):
        words.target_args["connmark"] = ConnmarkOp("set", mark_op(verb, words.take()))
        return
    masks = {"nfmask": MASK32, "ctmask": MASK32}
    while words.peek() in ("mask", "nfmask", "ctmask"):
        key, value = words.take(), words.take()
        number = (~int(value[1:], 0) & MASK32) if value.startswith("~") else int(value, 0)
        for k in (("nfmask", "ctmask") if key == "mask" else (key,)):
            masks[k] = number
    words.target_args["connmark"] = ConnmarkOp(verb, None, masks["nfmask"], masks["ctmask"])


def _l_reject(words: _Words, negated: bool) -> None:
    words.target_args["reject-with"] = words.take()


def _l_rest_is_target(key: str) -> ListDecoder:
    """LOG and friends print their options last: keep them as written."""
    def decode(words: _Words, negated: bool) -> None:
        rest = []
        while words.more():
            rest.append(words.take())
        words.target_args[key] = " ".join(rest)
    return decode


def _l_ct(words: _Words, negated: bool) -> None:
    if words.peek() == "notrack":
        words.take()
        words.target_args["notrack"] = True


LIST_WORDS: dict[str, ListDecoder] = {
    "tcp": _l_ports, "udp": _l_ports, "sctp": _l_ports, "udplite": _l_ports,
    "multiport": _l_multiport,
    "ADDRTYPE": _l_addrtype,
    "mark": _l_mark("mark"), "connmark": _l_mark("connmark"),
    "ctstate": _l_states("--ctstate"), "state": _l_states("--state"),
    "ctdir": _l_conntrack("--ctdir", _CONNTRACK["--ctdir"][1]),
    **{word: _l_conntrack(f"--{word}", _CONNTRACK[f"--{word}"][1]) for word in (
        "ctorigsrc", "ctorigdst", "ctorigsrcport", "ctorigdstport", "ctstatus", "ctproto",
        "ctreplsrc", "ctrepldst", "ctexpire")},
    "match-set": _l_set,
    "statistic": _l_statistic,
    "PHYSDEV": _l_physdev,
    "MAC": _l_mac,
    "length": _l_length,
    "limit:": _l_limit,
    "recent:": _l_recent,
    "icmp": _l_icmp, "icmptype": _l_icmptype,
    "to:": _l_nat_to,
    "random": _l_flag, "random-fully": _l_flag, "persistent": _l_flag,
    "masq": _l_masq,
    "MARK": _l_mark_target,
    "CONNMARK": _l_connmark_target,
    "reject-with": _l_reject,
    "LOG": _l_rest_is_target("log"),
    "NFLOG": _l_rest_is_target("nflog"),
    "CT": _l_ct,
}


def _list_key(word: str) -> str:
    """``to:1.2.3.4:80`` is looked up as ``to:``; other words as themselves."""
    if word in LIST_WORDS:
        return word
    head = word.split(":", 1)[0] + ":"
    return head if ":" in word and head in LIST_WORDS else word


def _list_extras(text: str, target: str | None) -> tuple[list[Match], dict]:
    """The extras column -> matches and target arguments, via ``LIST_WORDS``."""
    words = _Words([(m[0], m[1]) for m in _EXTRA_TOKEN.finditer(text)])
    while words.more():
        word, comment = words.tokens[words.pos]
        if comment is not None:
            words.pos += 1
            words.matches.append(CommentMatch("--comment", comment))
            continue
        negated = word == "!"
        if negated:
            words.pos += 1
            word = words.peek() or ""
        decoder = LIST_WORDS.get(_list_key(word))
        if decoder is None:
            words.matches.append(_l_unknown(words, negated))
            continue
        words.pos += 1
        try:
            decoder(words, negated)
        except (ValueError, KeyError, IndexError) as exc:
            raise _Syntax(f"cannot read {word!r}: {exc}") from None
    args = dict(words.target_args)
    if target in ("DNAT", "SNAT", "MASQUERADE"):       # same shape as the iptables-save decoders
        args.setdefault("flags", ())
    if target == "MASQUERADE":
        args.setdefault("to_ports", None)
    return words.matches, args


def _l_unknown(words: _Words, negated: bool) -> UnknownMatch:
    """Unrecognised words up to the next word we know: one UnknownMatch, never dropped."""
    start = words.pos
    words.pos += 1                                       # the unknown word itself
    while (words.more() and words.tokens[words.pos][1] is None and words.peek() != "!"
           and _list_key(words.peek()) not in LIST_WORDS):
        words.pos += 1
    seen = [w for w, _ in words.tokens[start:words.pos]]
    text = " ".join((["!"] if negated else []) + seen)
    return UnknownMatch(seen[0] if seen else "!", text, f"'{text}' in the listing is not modelled")
