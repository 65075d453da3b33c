"""nftables simulator: one hook's base chains in priority order, returning the same
``Branch``/``Step`` values as the iptables engine. See ``traceflow.engines.netfilter.nft``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

from traceflow.engines.netfilter.engine import (MAX_BRANCHES, MAX_DEPTH, Branch, NodeContext, Step,
                                                Walk, _Budget, _randomised, nat_rewrite)
from traceflow.engines.netfilter.nft_model import (ABSENT, CHAIN_MEANINGS, Cmp, Elements, Limit,
                                                   Nat, NftChain, NftElement, NftRule, NftTable,
                                                   Notrack, Passive, Selector, SetRef, SetStmt,
                                                   Unknown, VMap, Verdict, VerdictStmt, XtMatch,
                                                   _ADDR_TYPES, _CT_STATES, _address)
from traceflow.engines.netfilter.nft_lookup import _lookup
from traceflow.engines.netfilter.numgen import numgen_groups
from traceflow.model import reads as _reads
from traceflow.model.packet import Packet

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


def _icmp(fld: str, proto: int = 1):
    """ICMP (1) or ICMPv6 (58) type/code: ``tp_src``/``tp_dst``, as OVS keeps them."""
    def get(p: Packet, ctx: NodeContext):
        if p.nw_proto is None:
            return None
        return getattr(p, fld) if p.nw_proto == proto else ABSENT
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
    "icmpv6_type": _icmp("tp_src", 58), "icmpv6_code": _icmp("tp_dst", 58),
    "flowlabel": lambda p, c: p.ipv6_label if _is_v6(p) else ABSENT,
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
    def __init__(self, ruleset):          # an NftRuleset (nft_ruleset.py)
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
        recorder = _reads.active()
        if recorder is not None:    # a question sharing traces: every rule here may be read
            recorder.nft_chain(walk.ctx, table, chain, walk.packet)
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
        flags = f" ({', '.join(expr.flags)}: source port may be randomised; shown unchanged)" \
            if {"random", "fully-random", "random-fully"} & set(expr.flags) else ""
        kind = {"dnat": "DNAT", "snat": "SNAT"}.get(expr.kind, "MASQUERADE")
        hit.effects.append(nat_rewrite(walk, kind, expr.to) + ("" if kind == "DNAT" else flags))
        if kind != "DNAT":
            _randomised(walk, expr.flags)
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
