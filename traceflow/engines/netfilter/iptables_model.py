"""iptables model: rulesets, chains, rules and targets. A rule's matches are typed
(``iptables_matches``), its values too (``iptables_values``). Parsed by ``iptables_parse``
(iptables-save) and ``iptables_list`` (-L -n).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from traceflow.engines.netfilter.iptables_matches import CommentMatch, Match
from traceflow.engines.netfilter.iptables_values import (MASK32, ConnmarkOp, Diagnosed,
                                                         NotModelled, mark_op, nat_to,
                                                         port_range)
from traceflow.model.errors import InputError, Source

TABLES = ("raw", "mangle", "nat", "filter", "security")
BUILTIN_CHAINS = ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")


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

    def next_candidate(self, index: int, packet) -> int:
        """The first rule from ``index`` on that is not known (without parsing it) to miss
        ``packet``; ``rule_count()`` when there is none."""
        return index


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
