"""``iptables [-t T] -L -n [-v]`` parser: the human listing of one table, read into the same
``Ruleset`` as iptables-save (lossy: see ``Ruleset.caveats``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from traceflow.model.errors import InputError, Source
from traceflow.engines.netfilter.iptables_matches import (AddrTypeMatch, CommentMatch,
                                                          ConnmarkMatch, FragmentMatch, ICMP_TYPES,
                                                          IcmpMatch, LengthMatch, LimitMatch,
                                                          MacMatch, MarkMatch, Match,
                                                          MultiportMatch, PortMatch, RecentMatch,
                                                          SetMatch, TcpFlagsMatch, UnknownMatch)
from traceflow.engines.netfilter.iptables_model import (Chain, Rule, Ruleset, Table,
                                                        _resolve_targets)
from traceflow.engines.netfilter.iptables_values import (ConnmarkOp, MASK32, RuleSyntaxError, mark,
                                                         mark_op, nat_to, port_range)
from traceflow.engines.netfilter.iptables_grammar import (CORE_OPTIONS, Decoder, MODULES, Opt,
                                                          _CONNTRACK, _physdev, _proto, _states,
                                                          _statistic)
from traceflow.engines.netfilter.iptables_parse import _Syntax, _note_not_modelled

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
    limit = None
    if words.peek() in ("limit-in", "limit-out"):
        limit = words.take().rpartition("-")[2]
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
