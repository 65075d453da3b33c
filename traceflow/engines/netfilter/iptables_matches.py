"""iptables matches: frozen values that can say whether a packet matches (None = the bundle
cannot tell), one class per match module or option, and ipset membership. Parsed by
``iptables_parse`` (iptables-save) and ``iptables_list`` (-L -n); read by the engine.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from traceflow.engines.netfilter.context import NodeContext
from traceflow.engines.netfilter.ipset_hash import SLOW, hashed, _set_entry_bits, _set_entry_hit
from traceflow.engines.netfilter.iptables_values import Mark, PortRange, _address, _in_network
from traceflow.model.packet import PROTO_NAMES, Packet



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
    """addrtype ``--src-type``/``--dst-type``: LOCAL from ``ctx.local_addresses``.

    ``--limit-iface-in``/``-out`` asks about the address on the packet's input (output)
    interface only (xt_addrtype.c ``addrtype_mt_v1``: ``inet_dev_addr_type(net, dev, addr)``,
    a lookup restricted to that device): LOCAL when the address is one of that interface's
    own, from ``ctx.interface_addresses`` (the node's ip-addr.txt)."""

    field: str                       # "nw_src" | "nw_dst"
    types: tuple[str, ...]
    limit_iface: str | None = None   # "in" | "out" (--limit-iface-in/out) | None

    def _test(self, packet, ctx):
        addr = getattr(packet, self.field)
        if addr is None:
            return None
        if self.limit_iface:
            local = self._local_on_iface(addr, ctx)
            if local is None:
                return None
            ctx = _OnIface(local, ctx.broadcast_addresses)
        hits = {t: self._is_type(t, addr, ctx) for t in self.types}
        if True in hits.values():
            return True
        return None if None in hits.values() else False

    def _local_on_iface(self, addr: str, ctx) -> set[str] | None:
        iface = ctx.in_iface if self.limit_iface == "in" else ctx.out_iface
        known = getattr(ctx, "interface_addresses", None)
        if iface is None or known is None or iface not in known:
            return None
        return known[iface]

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
            iface = ctx.in_iface if self.limit_iface == "in" else ctx.out_iface
            if iface is None:
                return (f"--limit-iface-{self.limit_iface}: the packet's "
                        f"{'input' if self.limit_iface == 'in' else 'output'} interface is "
                        "not known here")
            return (f"--limit-iface-{self.limit_iface}: the addresses of {iface} are not in "
                    f"the bundle (needs nodes/{ctx.node or '<node>'}/ip-addr.txt)")
        return f"the packet has no {self.field}"

    def __str__(self):
        return (f"-m addrtype {self.bang}{self.name} {','.join(self.types)}"
                + (f" --limit-iface-{self.limit_iface}" if self.limit_iface else ""))


@dataclass(frozen=True)
class _OnIface:
    """The addresses addrtype sees when limited to one interface."""
    local_addresses: set
    broadcast_addresses: set


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
        return ipset_contains(ctx.ipsets[self.set_name], self.flags, packet, ctx.ipsets)

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
        # xt_physdev.c physdev_mt: the bridge ports of a bridged frame (br_netfilter); the
        # output port is known from FORWARD on (at PREROUTING it is not chosen yet)
        phys_in = getattr(ctx, "physdev_in", None)
        phys_out = getattr(ctx, "physdev_out", None)
        if phys_in is None:
            return None
        for option, value, neg in self.options:
            if option == "--physdev-is-in":
                hit = True
            elif option in ("--physdev-is-out", "--physdev-is-bridged"):
                hit = phys_out is not None
            elif option in ("--physdev-in", "--physdev-out"):
                dev = phys_in if option == "--physdev-in" else phys_out
                if dev is None:
                    hit = False
                else:
                    hit = dev.startswith(value[:-1]) if value and value.endswith("+") \
                        else dev == value
            else:
                return None
            if hit == neg:
                return False
        return True

    def undecided(self, packet, ctx):
        return ("the packet is bridged (br_netfilter), but its bridge ports are not known "
                "here: physdev cannot be decided")

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
    proto = 1                        # ICMP; Icmp6Match: ICMPv6 (58)

    def _test(self, packet, ctx):
        if packet.nw_proto != self.proto:
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


# ip6tables' icmp6 type names (libxt_icmp6 / libip6t_icmp6.c), with their (type, code)
ICMPV6_TYPES = {
    "destination-unreachable": (1, None), "no-route": (1, 0),
    "communication-prohibited": (1, 1), "beyond-scope": (1, 2), "address-unreachable": (1, 3),
    "port-unreachable": (1, 4), "failed-policy": (1, 5), "reject-route": (1, 6),
    "packet-too-big": (2, None), "time-exceeded": (3, None), "ttl-exceeded": (3, None),
    "ttl-zero-during-transit": (3, 0), "ttl-zero-during-reassembly": (3, 1),
    "parameter-problem": (4, None), "bad-header": (4, 0), "unknown-header-type": (4, 1),
    "unknown-option": (4, 2), "echo-request": (128, None), "ping": (128, None),
    "echo-reply": (129, None), "pong": (129, None),
    "router-solicitation": (133, None), "router-advertisement": (134, None),
    "neighbour-solicitation": (135, None), "neighbor-solicitation": (135, None),
    "neighbour-advertisement": (136, None), "neighbor-advertisement": (136, None),
    "redirect": (137, None)}


@dataclass(frozen=True)
class Icmp6Match(IcmpMatch):
    """ip6tables' icmp6 ``--icmpv6-type``: the ICMPv6 type/code are ``tp_src``/``tp_dst``."""

    proto = 58

    def undecided(self, packet, ctx):
        return "the packet has no ICMPv6 type/code (tp_src/tp_dst)"

    def __str__(self):
        code = f"/{self.code}" if self.code is not None else ""
        return f"{self.bang}--icmpv6-type {'any' if self.type is None else self.type}{code}"


@dataclass(frozen=True)
class ExtHeaderMatch(Match):
    """An ip6tables match on an IPv6 extension header (``-m frag``, ``rt``, ``hbh``, ``dst``,
    ``mh``, ``srh``). The traced packet carries none (a first packet of a TCP/UDP/SCTP
    connection: next header is the transport), and without the header the kernel's match
    returns false whatever its options say, ``!`` included (frag_mt6, rt_mt6, hbh_mt6: the
    header is not found -> false)."""

    header: str

    def check(self, packet, ctx):
        return False if packet.family == 6 else None

    def _test(self, packet, ctx):
        return False

    def undecided(self, packet, ctx):
        return f"-m {self.header} is an IPv6 extension-header match, in an IPv4 rule set"

    def __str__(self):
        return f"-m {self.header}"


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

HASH_FROM = 32                  # sets of more members than this are hashed (ipset_hash.py)


def ipset_contains(members: list[str], flags: tuple[str, ...], packet: Packet,
                   sets: dict | None = None, depth: int = 0) -> bool | None:
    """Is the packet in the set? The most specific entry holding it decides, as the kernel's
    hash:net types look prefixes up longest first (ip_set_hash_gen.h, mtype_test_cidrs): a
    ``nomatch`` entry excludes, a narrower ordinary entry inside it includes again. None if
    an entry is undecidable and no entry decides.

    The set's type (``members.type`` when the listing says it) decides what a member is:
    ``list:set`` members are other sets, the packet is in it when it is in one of them
    (ip_set_list_set.c ``list_set_ktest``, in order, the flags passed on); ``bitmap:port``
    members are ports (``80`` or a range ``80-88``) matched against the port the flag
    names. A bigger set of addresses, prefixes and ports is looked up as the kernel hashes
    it: its entries compiled once into dicts keyed by their (masked) addresses and ports
    (``ipset_hash.py``); the entries that do not hash (port ranges, interfaces, ``tcpudp``)
    are tested one by one, as here."""
    kind = getattr(members, "type", None) or ""
    if kind == "list:set":
        return _list_set_contains(members, flags, packet, sets, depth)
    if kind == "bitmap:port":
        flags = tuple(f"port-{f}" for f in flags)
    elif len(members) > HASH_FROM:          # looked up as the kernel hashes it (ipset_hash.py)
        got = hashed(members, flags).contains(packet)
        if got is not SLOW:
            return got
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


def _list_set_contains(members: list[str], flags: tuple[str, ...], packet: Packet,
                       sets: dict | None, depth: int) -> bool | None:
    if sets is None or depth > 8:        # the kernel refuses list:set loops; so does this
        return None
    undecided = False
    for member in members:
        name = member.split()[0] if member.split() else ""
        if name not in sets:
            undecided = True
            continue
        got = ipset_contains(sets[name], flags, packet, sets, depth + 1)
        if got:
            return True
        undecided = undecided or got is None
    return None if undecided else False
