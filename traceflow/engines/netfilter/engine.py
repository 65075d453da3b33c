"""Simulate one netfilter hook over a parsed Ruleset: which rules a packet hits, in order.

``evaluate_hook`` runs the tables attached to a hook in kernel priority order and returns one
``Branch`` per outcome. Branches fork only at ``-m statistic`` (kube-proxy's endpoint choice);
their weights multiply along the way, and they come out in rule order, so output is
deterministic. Whatever the bundle cannot decide (a match or target we do not model, an ipset
that was not collected, an unknown interface) ends that branch as UNKNOWN with a step naming
the rule and the reason: a rule is never silently taken as a hit or a miss.

Conntrack is not simulated here: NAT rules run only for a NEW connection (later packets are
translated by conntrack, which is the caller's job), and the caller passes the connection's
state in ``NodeContext``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from traceflow.engines.netfilter.context import NodeContext
from traceflow.engines.netfilter.iptables import (PASSIVE_TARGETS, Chain, CommentMatch, NatTo,
                                                  RecentMatch, Rule, Ruleset, StatisticMatch, Table)
from traceflow.model import reads as _reads
from traceflow.model.packet import Packet

MAX_DEPTH = 64

# tables attached to each hook, in kernel priority order (raw -300, mangle -150, nat DNAT -100,
# filter 0, security 50, nat SNAT 100)
HOOK_TABLES: dict[str, tuple[str, ...]] = {
    "PREROUTING": ("raw", "mangle", "nat"),
    "INPUT": ("mangle", "filter", "security", "nat"),
    "FORWARD": ("mangle", "filter", "security"),
    "OUTPUT": ("raw", "mangle", "nat", "filter", "security"),
    "POSTROUTING": ("mangle", "nat"),
}

# what well-known marking chains mean, shown next to their MARK step
CHAIN_MEANINGS = {
    "KUBE-MARK-MASQ": "masquerade on the way out",
    "KUBE-MARK-DROP": "drop in the filter table",
}


@dataclass(frozen=True)
class NatAction:
    """An address translation: (ip, port) before and after. ip None = not known here."""

    kind: str                             # "DNAT" | "SNAT" | "MASQUERADE"
    original: tuple[str | None, int | None]
    translated: tuple[str | None, int | None]
    random_port: bool = False             # --random[-fully]: the kernel picks the port at run
    #                                       time (nf_nat_l4proto_unique_tuple); shown unchanged


@dataclass(frozen=True)
class Step:
    """One rule the packet hit (or a built-in chain's policy), and what it did."""

    table: str
    chain: str
    rule: Rule | None                     # None for a policy or a table-level note
    effect: str                           # plain English
    unknown: bool = False
    matched: tuple[str, ...] = ()         # the match options that decided the hit


@dataclass
class Branch:
    weight: float
    packet: Packet
    verdict: str                          # "ACCEPT" | "DROP" | "REJECT" | "UNKNOWN"
    steps: list[Step]
    nat: NatAction | None = None
    connmark: int = 0
    ct_state: frozenset[str] = frozenset()   # conntrack state after the hook (e.g. + "DNAT")


@dataclass
class Walk:
    """The state of one branch while it runs: its own packet copy, context and steps."""

    weight: float
    packet: Packet
    ctx: NodeContext
    steps: list[Step] = field(default_factory=list)
    nat: NatAction | None = None
    budget: "_Budget | None" = None       # shared by every fork of one hook evaluation

    def fork(self, share: float) -> "Walk":
        """A copy for one side of a branch (a subclass's own fields are copied too)."""
        return dataclasses.replace(self, weight=self.weight * share, packet=self.packet.copy(),
                                   steps=list(self.steps))

    def add_ct_state(self, state: str) -> None:
        self.ctx = dataclasses.replace(self.ctx, ct_state=set(self.ctx.ct_state) | {state})


# outcomes of running a chain for one branch
CONTINUE = "CONTINUE"        # go on with the next rule of this chain
RETURN = "RETURN"            # leave this chain (RETURN rule, or fell off the end)
Outcome = tuple[Walk, str]  # str: CONTINUE, RETURN or a verdict


def evaluate_hook(ruleset: Ruleset, hook: str, packet: Packet, ctx: NodeContext) -> list[Branch]:
    """Run ``packet`` through every table of ``ruleset`` attached to ``hook``."""
    if hook not in HOOK_TABLES:
        raise ValueError(f"unknown hook {hook!r}; expected one of {', '.join(HOOK_TABLES)}")
    if ctx.ct_orig is None and "NEW" in ctx.ct_state and hook in ("PREROUTING", "OUTPUT"):
        ctx = dataclasses.replace(ctx, ct_orig=packet.copy())   # first hook of a new connection
    tables = [ruleset.tables[t] for t in HOOK_TABLES[hook]
              if t in ruleset.tables and hook in ruleset.tables[t].chains]
    outcomes = _run_tables(tables, hook, Walk(1.0, packet.copy(), ctx, budget=_Budget()))
    return [Branch(w.weight, w.packet, verdict, w.steps, w.nat, w.ctx.connmark,
                   frozenset(w.ctx.ct_state)) for w, verdict in outcomes]


def _run_tables(tables: list[Table], hook: str, walk: Walk) -> list[Outcome]:
    """ACCEPT in one table hands the packet to the next table; any other verdict is final."""
    if not tables:
        return [(walk, "ACCEPT")]
    table, rest = tables[0], tables[1:]
    if table.name == "nat" and not _nat_applies(walk.ctx):
        why = ("the packet is untracked (NOTRACK in raw): no conntrack entry, no NAT"
               if "UNTRACKED" in walk.ctx.ct_state else
               "not the first packet of a connection (conntrack applies any NAT)")
        walk.steps.append(Step("nat", hook, None, f"nat table not consulted: {why}"))
        return _run_tables(rest, hook, walk)
    results: list[Outcome] = []
    for w, verdict in _run_builtin(table, hook, walk):
        results += _run_tables(rest, hook, w) if verdict == "ACCEPT" else [(w, verdict)]
    return results


def _nat_applies(ctx: NodeContext) -> bool:
    return "NEW" in ctx.ct_state and "UNTRACKED" not in ctx.ct_state


def _run_builtin(table: Table, hook: str, walk: Walk) -> list[Outcome]:
    """A built-in chain: falling off its end (or RETURN) applies its policy."""
    chain = table.chains[hook]
    results = []
    for w, outcome in _run_chain(table, chain, walk, 0):
        if outcome != RETURN:
            results.append((w, outcome))
        elif chain.policy is None:
            results.append(_stop(w, table, chain, None, f"the policy of built-in chain {hook} "
                                 f"in table {table.name} is not in the bundle"))
        else:
            w.steps.append(Step(table.name, hook, None, f"policy {chain.policy} of chain {hook}"))
            results.append((w, chain.policy))
    return results


def _run_chain(table: Table, chain: Chain, walk: Walk, depth: int) -> list[Outcome]:
    recorder = _reads.active()
    if recorder is not None:        # a question sharing traces: every rule here may be read
        recorder.nf_chain(walk.ctx, table.name, chain, walk.packet)
    if depth > MAX_DEPTH:
        return [_stop(walk, table, chain, None,
                      f"chain loop: more than {MAX_DEPTH} nested jumps (at {chain.name})")]
    return _run_rules(table, chain, 0, walk, depth)


def _run_rules(table: Table, chain: Chain, start: int, walk: Walk, depth: int) -> list[Outcome]:
    """Rules from ``start`` on, in a loop (never one call per rule: kube-proxy chains hold one
    statistic rule per endpoint). A statistic rule forks off the branch that takes it; the
    branch that goes past keeps looping, and the rules it went past are summarised in one step
    when it leaves the run, so steps grow linearly with the endpoints, not quadratically."""
    results: list[Outcome] = []
    passed: list[tuple[Rule, float]] = []   # statistic rules this walk went past, in a row
    index = start
    count = chain.rule_count()
    while True:
        index = chain.next_candidate(index, walk.packet)
        if index >= count:
            break
        rule = chain.rule_at(index)
        decision = _decide(rule, walk)
        if decision is None:
            assumption = _assumed_miss(rule, walk)
            if assumption:
                _passed_step(walk, table, chain, passed)
                passed = []
                walk.steps.append(Step(table.name, chain.name, rule, assumption))
            index += 1
            continue
        _passed_step_if(walk, table, chain, passed, decision)
        if isinstance(decision, str):
            passed = []
            results.append(_stop(walk, table, chain, rule, decision))
            return results
        probability, matched = decision
        if probability >= 1.0:
            passed = []
            outcomes = _apply(table, chain, rule, walk, matched, depth)
            if len(outcomes) == 1 and outcomes[0][1] == CONTINUE:
                walk, index = outcomes[0][0], index + 1
                continue
            return results + _then(table, chain, index, outcomes, depth)
        if not _budget_ok(walk):
            _passed_step(walk, table, chain, passed)
            results.append(_stop(walk, table, chain, rule, f"more than {MAX_BRANCHES} "
                                 "load-balancing branches at this hook: the rest are not traced"))
            return results
        taken = walk.fork(probability)
        _passed_step(taken, table, chain, passed)
        results += _then(table, chain, index, _apply(table, chain, rule, taken, matched, depth,
                                                     probability), depth)
        walk = walk.fork(1.0 - probability)
        passed.append((rule, probability))
        index += 1
    _passed_step(walk, table, chain, passed)
    results.append((walk, RETURN))
    return results


def _passed_step_if(walk: Walk, table: Table, chain: Chain, passed: list, decision) -> None:
    """Before a rule that is not another statistic choice, summarise the run just passed."""
    if isinstance(decision, str) or decision[0] >= 1.0:
        _passed_step(walk, table, chain, passed)


def _passed_step(walk: Walk, table: Table, chain: Chain, passed: list) -> None:
    """One step for a run of statistic rules not taken (one per chain visit, not per rule)."""
    if not passed:
        return
    if len(passed) == 1:
        rule, probability = passed[0]
        walk.steps.append(Step(table.name, chain.name, rule,
                               f"probability {probability:.4g} not taken: next rule"))
        return
    first, last = passed[0][0], passed[-1][0]
    walk.steps.append(Step(table.name, chain.name, last,
                           f"{len(passed)} statistic rules not taken (lines "
                           f"{first.source.line}-{last.source.line} of {last.source.file}, "
                           f"probabilities {passed[0][1]:.4g} ... {passed[-1][1]:.4g}): "
                           "next rule"))


# Forks allowed per hook evaluation: a real Service has at most a few thousand endpoints; a
# rule set that forks more (statistic rules that continue, each doubling the branches) would
# exhaust memory, so the rest ends as unknown, said so.
MAX_BRANCHES = 20_000


@dataclass
class _Budget:
    forks: int = 0


def _budget_ok(walk: Walk) -> bool:
    budget = walk.budget
    if budget is None:
        budget = walk.budget = _Budget()
    budget.forks += 1
    return budget.forks <= MAX_BRANCHES


def _then(table: Table, chain: Chain, index: int, outcomes: list[Outcome],
          depth: int) -> list[Outcome]:
    """After a hit: CONTINUE resumes this chain after the rule; anything else propagates.
    Resuming after a fork counts as nesting, so recursion stays bounded by MAX_DEPTH."""
    results = []
    for w, outcome in outcomes:
        if outcome != CONTINUE:
            results.append((w, outcome))
        elif len(outcomes) > 1 and depth + 1 > MAX_DEPTH:
            results.append(_stop(w, table, chain, None, f"more than {MAX_DEPTH} nested "
                                 f"branch points (at {chain.name})"))
        else:
            results += _run_rules(table, chain, index + 1, w, depth + (len(outcomes) > 1))
    return results


def _decide(rule: Rule, walk: Walk) -> None | str | tuple[float, tuple[str, ...]]:
    """None: miss. str: why it cannot be decided. Else (probability of a hit, deciding matches).

    A definite miss on any match wins over an undecidable one (the rule is an AND).
    """
    probability, matched, undecided = 1.0, [], None
    for m in rule.matches:
        if isinstance(m, StatisticMatch):
            probability *= m.probability
            matched.append(m.name)
            continue
        hit = m.check(walk.packet, walk.ctx)
        if hit is False:
            return None
        if hit is None:
            undecided = undecided or m.undecided(walk.packet, walk.ctx)
        elif not isinstance(m, CommentMatch):
            matched.append(m.name)
    if undecided:
        return undecided
    if rule.unknown_target:
        return rule.unknown_target
    return (probability, tuple(matched)) if probability > 0.0 else None


def _assumed_miss(rule: Rule, walk: Walk) -> str | None:
    """The caveat of a rule missed only because of state the bundle lacks (session affinity's
    recent lists): the trace must say what it assumed, not skip the rule silently."""
    assumed = [m for m in rule.matches if isinstance(m, RecentMatch) and m.action != "set"
               and not walk.ctx.recent]
    if not assumed:
        return None
    others = [m for m in rule.matches if m not in assumed and not isinstance(m, StatisticMatch)]
    if any(m.check(walk.packet, walk.ctx) is not True for m in others if not isinstance(m, CommentMatch)):
        return None
    return assumed[0].caveat() + ": rule not taken"


def _stop(walk: Walk, table: Table, chain: Chain, rule: Rule | None, reason: str) -> Outcome:
    where = f" {rule.source.file}:{rule.source.line} `{rule.text}`" if rule else ""
    walk.steps.append(Step(table.name, chain.name, rule,
                           f"cannot decide{where}: {reason}; the trace stops here", unknown=True))
    return walk, "UNKNOWN"


# ---------------------------------------------------------------------------------------------
# Targets: what a hit does to the branch


def _apply(table: Table, chain: Chain, rule: Rule, walk: Walk, matched: tuple[str, ...],
           depth: int, probability: float = 1.0) -> list[Outcome]:
    def step(effect: str) -> None:
        if probability < 1.0:
            effect = f"probability {probability:.4g}: take this branch, {effect}"
        caveats = [c for c in (m.caveat() for m in rule.matches) if c]
        walk.steps.append(Step(table.name, chain.name, rule, "; ".join([effect, *caveats]),
                               matched=matched))

    target = rule.target
    if target is None:
        step("no target: counted only, next rule")
        return [(walk, CONTINUE)]
    action = _TARGET_ACTIONS.get(target)
    if action is not None:
        return [(walk, action(chain, rule, walk, step))]
    if target in PASSIVE_TARGETS:
        step(f"{target}: no effect on the packet's path")
        return [(walk, CONTINUE)]
    return _jump(table, chain, rule, walk, step, depth)


def _jump(table: Table, chain: Chain, rule: Rule, walk: Walk, step, depth: int) -> list[Outcome]:
    """``-j CHAIN`` returns here (CONTINUE); ``-g CHAIN`` returns to our caller (RETURN)."""
    if rule.target not in table.chains:
        missing = f"chain {rule.target} is not in table {table.name}"
        return [_stop(walk, table, chain, rule, missing)]
    why = f" ({rule.comment})" if rule.comment else ""
    step(f"{'goto' if rule.goto else 'jump to'} {rule.target}{why}")
    results = []
    for w, outcome in _run_chain(table, table.chains[rule.target], walk, depth + 1):
        if outcome == RETURN:
            outcome = RETURN if rule.goto else CONTINUE
        results.append((w, outcome))
    return results


# A target action records its step and returns the outcome (a verdict, CONTINUE or RETURN).
# Signature: (chain, rule, walk, step) where ``step(effect)`` appends the rule's Step.


def _verdict(name: str):
    def act(chain: Chain, rule: Rule, walk: Walk, step) -> str:
        reject_with = rule.target_args.get("reject-with")
        detail = f" with {reject_with}" if reject_with else ""
        why = f" ({rule.comment})" if rule.comment else ""
        step(f"{name}{detail}{why}")
        return name
    return act


def _return(chain: Chain, rule: Rule, walk: Walk, step) -> str:
    step("RETURN: back to the calling chain")
    return RETURN


def nat_rewrite(walk: Walk, kind: str, to: NatTo | None) -> str:
    """Rewrite the walk's packet as DNAT / SNAT / MASQUERADE to ``to`` do (MASQUERADE: the out
    interface's address, unresolved when the caller lacks it) and record the translation for
    conntrack; returns "KIND before -> after". Both the iptables and nft simulators use it."""
    p = walk.packet
    ports = to.ports if to is not None else None
    if kind == "DNAT":
        before = (p.nw_dst, p.tp_dst)
        p.nw_dst = to.addr or p.nw_dst
        p.tp_dst = ports.lo if ports else p.tp_dst
        after, new = (p.nw_dst, p.tp_dst), _hostport(p.nw_dst, p.tp_dst)
    else:
        before = (p.nw_src, p.tp_src)
        p.tp_src = ports.lo if ports else p.tp_src
        ip = walk.ctx.masquerade_ip if kind == "MASQUERADE" else (to.addr or p.nw_src)
        if ip is None:
            new = ("the address of the out interface" + (f" {walk.ctx.out_iface}"
                   if walk.ctx.out_iface else "") + " (not known here; source left unchanged)")
        else:
            p.nw_src = ip
            new = _hostport(ip, p.tp_src)
        after = (ip, p.tp_src)
    walk.nat = NatAction(kind, before, after)
    walk.add_ct_state("DNAT" if kind == "DNAT" else "SNAT")
    note = _range_note(to) if kind != "MASQUERADE" and to is not None else ""
    return f"{kind} {_hostport(*before)} -> {new}{note}"


def _dnat(chain: Chain, rule: Rule, walk: Walk, step) -> str:
    step(nat_rewrite(walk, "DNAT", rule.target_args["to"]))
    return "ACCEPT"


def _snat(chain: Chain, rule: Rule, walk: Walk, step) -> str:
    step(nat_rewrite(walk, "SNAT", rule.target_args["to"]) + _port_note(rule))
    _randomised(walk, rule.target_args.get("flags", ()))
    return "ACCEPT"


def _randomised(walk: Walk, flags) -> None:
    """--random / --random-fully: the source port the kernel picks is not predictable."""
    if walk.nat is not None and {"random", "random-fully", "fully-random"} & set(flags):
        walk.nat = dataclasses.replace(walk.nat, random_port=True)


def _masquerade(chain: Chain, rule: Rule, walk: Walk, step) -> str:
    ports = rule.target_args.get("to_ports")
    step(nat_rewrite(walk, "MASQUERADE", NatTo(None, ports=ports) if ports else None)
         + _port_note(rule))
    _randomised(walk, rule.target_args.get("flags", ()))
    return "ACCEPT"


def _mark(chain: Chain, rule: Rule, walk: Walk, step) -> str:
    op = rule.target_args["mark"]
    walk.packet.mark = op.apply(walk.packet.mark)
    meaning = CHAIN_MEANINGS.get(chain.name)
    if meaning:
        why = f" ({chain.name}: {meaning})"
    else:
        why = f" ({rule.comment})" if rule.comment else ""
    step(f"MARK {op} -> mark {walk.packet.mark:#x}{why}")
    return CONTINUE


def _connmark(chain: Chain, rule: Rule, walk: Walk, step) -> str:
    op = rule.target_args["connmark"]
    mark, connmark = op.apply(walk.packet.mark, walk.ctx.connmark)
    walk.packet.mark = mark
    walk.ctx = dataclasses.replace(walk.ctx, connmark=connmark)
    step(f"CONNMARK {op} -> mark {mark:#x}, connmark {connmark:#x}")
    return CONTINUE


def _notrack(chain: Chain, rule: Rule, walk: Walk, step) -> str:
    walk.ctx = dataclasses.replace(walk.ctx, ct_state={"UNTRACKED"})
    step(f"{rule.target}: not tracked by conntrack (state UNTRACKED, no NAT from here)")
    return CONTINUE


_TARGET_ACTIONS = {
    "ACCEPT": _verdict("ACCEPT"), "DROP": _verdict("DROP"), "REJECT": _verdict("REJECT"),
    "RETURN": _return, "DNAT": _dnat, "SNAT": _snat, "MASQUERADE": _masquerade,
    "MARK": _mark, "CONNMARK": _connmark, "NOTRACK": _notrack, "CT": _notrack,
}


def _hostport(ip: str | None, port: int | None) -> str:
    ip = ip or "?"
    if port is None:
        return ip
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _range_note(to: NatTo) -> str:
    ranged = to.addr_hi or (to.ports and to.ports.hi != to.ports.lo)
    return f" (range {to}: the kernel picks one; traced with the first)" if ranged else ""


def _port_note(rule: Rule) -> str:
    flags = rule.target_args.get("flags", ())
    if "random-fully" in flags or "random" in flags:
        return " (source port randomised by --random[-fully]: shown unchanged)"
    return ""
