"""Netfilter (iptables): parse rulesets from a bundle and simulate a hook.

``iptables`` holds the parsers and the rule model; ``engine`` the simulator. Callers use::

    ruleset = parse_iptables_save(text, "nodes/worker1/iptables-save.txt")
    branches = evaluate_hook(ruleset, "PREROUTING", packet, NodeContext(node="worker1"))
"""

from traceflow.engines.netfilter.engine import (Branch, NatAction, NodeContext, Step, evaluate_hook)
from traceflow.engines.netfilter.iptables import (Chain, Match, NotModelled, Rule, RuleSyntaxError,
                                                  Ruleset, Table, UnknownMatch, parse_iptables_list,
                                                  parse_iptables_save)

__all__ = [
    "Branch", "Chain", "Match", "NatAction", "NodeContext", "NotModelled", "Rule",
    "RuleSyntaxError", "Ruleset", "Step", "Table", "UnknownMatch", "evaluate_hook",
    "parse_iptables_list", "parse_iptables_save",
]
