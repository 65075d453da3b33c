"""iptables model: rulesets, chains, rules, typed matches (each can say whether a packet matches)
and targets. Parsed by ``iptables_parse`` (iptables-save) and ``iptables_list`` (-L -n).
"""

from __future__ import annotations

import functools
import ipaddress
import re
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
    """Is the packet in the set? The most specific entry holding it decides, as the kernel's
    hash:net types look prefixes up longest first (ip_set_hash_gen.h, mtype_test_cidrs): a
    ``nomatch`` entry excludes, a narrower ordinary entry inside it includes again. None if
    an entry is undecidable and no entry decides."""
    hits: list[tuple[int, bool]] = []              # (entry's prefix bits, entry is nomatch)
    undecidable = False
    for member in members:
        words = member.split()
        if not words:
            continue
        hit = _set_entry_hit(words[0], flags, packet)
        if hit is None:
            undecidable = True
        elif hit:
            hits.append((_set_entry_bits(words[0]), "nomatch" in words[1:]))
    if hits:
        most = max(bits for bits, _ in hits)
        return not any(nomatch for bits, nomatch in hits if bits == most)
    return None if undecidable else False


def _set_entry_bits(entry: str) -> int:
    """How specific an entry is: the prefix lengths of its addresses (an address alone is a
    full-length prefix)."""
    bits = 0
    for element in entry.split(","):
        try:
            bits += _network(element).prefixlen
        except ValueError:
            continue                                  # a port or an interface
    return bits


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

    # The engine reads rules one at a time through these, so that a chain parsed lazily
    # (iptables_parse.LazyChain) parses only the rules a walk looks at.
    def rule_count(self) -> int:
        return len(self.rules)

    def rule_at(self, index: int) -> Rule:
        return self.rules[index]

    def cannot_match(self, index: int, packet) -> bool:
        """True when rule ``index`` is known, without parsing it, not to match ``packet``."""
        return False


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
    for table in ruleset.tables.values():
        for chain in table.chains.values():
            _resolve_rule_targets(table, chain.rules, ruleset.diagnostics)


def _resolve_rule_targets(table: Table, rules: list, diagnostics: list) -> None:
    for rule in rules:
        if rule.unknown_target or rule.target is None:
            continue
        spec = TARGETS.get(rule.target)
        if spec is None and rule.target not in table.chains:
            rule.unknown_target = (f"target {rule.target} is not modelled (and is not a chain "
                                   f"of table {table.name})")
        elif spec is not None and spec.requires and not rule.target_args.get(spec.requires):
            rule.unknown_target = f"target {rule.target} without its {spec.requires} argument"
        if rule.unknown_target:
            diagnostics.append(NotModelled.at(rule.source, rule.unknown_target))
