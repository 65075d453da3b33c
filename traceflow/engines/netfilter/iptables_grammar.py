"""iptables-save grammar: core options, match modules and targets (keyword -> decoder), as
iptables_parse.py reads a rule's words into matches."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable

from traceflow.engines.netfilter.iptables_matches import (AddrMatch, AddrTypeMatch, CommentMatch,
                                                          ConnmarkMatch, CtDirMatch, CtStateMatch,
                                                          CtTupleMatch, ExtHeaderMatch,
                                                          FragmentMatch, ICMP_TYPES, ICMPV6_TYPES,
                                                          Icmp6Match, IcmpMatch, IfaceMatch,
                                                          LengthMatch,
                                                          LimitMatch, MacMatch, MarkMatch, Match,
                                                          MultiportMatch, PhysdevMatch, PortMatch,
                                                          ProtoMatch, RecentMatch, SetMatch,
                                                          StatisticMatch, TcpFlagsMatch,
                                                          UnknownMatch)
from traceflow.engines.netfilter.iptables_values import _network, mark, port_range
from traceflow.model.packet import IP_PROTOCOL_NAMES

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
    number = IP_PROTOCOL_NAMES.get(value, int(value) if value.isdigit() else None)
    if number is None or not 0 <= number <= 255:
        return UnknownMatch("-p", o.text, f"protocol {value!r} is not one iptables knows "
                                          "(not in /etc/protocols as Linux ships it)",
                            negated=False)
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


def _icmpv6_type(o: Opt) -> Match:
    value = o.args[0]
    if value in ICMPV6_TYPES:
        kind, code = ICMPV6_TYPES[value]
    else:
        kind_text, _, code_text = value.partition("/")
        kind, code = int(kind_text), int(code_text) if code_text else None
    return Icmp6Match("--icmpv6-type", kind, code, negated=o.negated)


def _ext_header(name: str) -> "ModuleSpec":
    """An IPv6 extension-header match module: whatever its options, the traced packet has no
    such header, so it never matches (see ExtHeaderMatch)."""
    options = {"frag": {"--fragid": 1, "--fraglen": 1, "--fragres": 0, "--fragfirst": 0,
                        "--fragmore": 0, "--fraglast": 0},
               "rt": {"--rt-type": 1, "--rt-segsleft": 1, "--rt-len": 1, "--rt-0-res": 0,
                      "--rt-0-addrs": 1, "--rt-0-not-strict": 0},
               "hbh": {"--hbh-len": 1, "--hbh-opts": 1},
               "dst": {"--dst-len": 1, "--dst-opts": 1},
               "mh": {"--mh-type": 1}}[name]
    return ModuleSpec(options, lambda opts: [ExtHeaderMatch(name, name)])


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
    limit = next((o.name.rpartition("-")[2] for o in opts
                  if o.name in ("--limit-iface-in", "--limit-iface-out")), None)
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
    "icmp6": _module({"--icmpv6-type": (1, _icmpv6_type)}),
    **{name: _ext_header(name) for name in ("frag", "rt", "hbh", "dst", "mh")},
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
IMPLICIT_MODULES = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 136: "udplite", 58: "icmp6"}


# --- the rule tokenizer and walker -----------------------------------------------------------


# a shell word: runs of plain characters, "double-quoted" (backslash escapes), 'single-quoted'
