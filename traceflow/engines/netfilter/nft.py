"""nftables: the model (tables, chains, rules, sets and maps), its parser and its simulator.

Input is what ``nft list ruleset`` (or ``nft list table ip kube-proxy``) prints, with or without
``-a`` handles, including iptables-nft tables whose xtables extensions nft can only show as
``# match-set KUBE-CLUSTER-IP dst,dst`` comments.

Parsing keeps every rule, with its ``Source`` (file, line, text). What is not modelled becomes an
``Unknown`` expression that the simulator turns into an UNKNOWN step (and a ``NotModelled``
diagnostic); what is not nftables at all (garbage lines, unbalanced braces, unterminated strings)
is a ``RuleSyntaxError`` diagnostic that ``NftRuleset.raise_for_errors()`` raises.

The grammar is table-driven: ``_PAYLOAD``/``_META``/``_CT`` map selectors (``ip daddr``,
``meta l4proto``, ``ct state``) to a value type and a getter; ``_STATEMENTS`` maps statement
keywords to their readers; set element values are compiled into ``Pattern`` values by type.

``NftRuleset.evaluate_hook`` runs the base chains attached to a hook in priority order and
returns the same ``Branch``/``Step``/``NatAction`` values as the iptables engine: one branch per
outcome, forking only at ``numgen`` (kube-proxy's endpoint choice), weights multiplied along.

The code lives in ``nft_model`` (tables, chains, sets, rule expressions), ``nft_ruleset``
(a ruleset as a whole, its hooks, ``evaluate_hook``), ``nft_parse`` (reading the file) with
``nft_rules`` (reading the rules), ``nft_sim`` (running a packet through it) with
``nft_lookup`` (set and map elements) and ``numgen``; this module gathers their public names.
``nft_lazy`` reads a listing lazily (chains, sets and maps parsed on first use, with
``nft_parse``'s code): what a trace uses (``traceflow.bundle.index.parse_nft_ruleset``).
"""

from __future__ import annotations

from traceflow.engines.netfilter.nft_model import (ABSENT, AddrPattern, BRIDGE_PRIORITY_NAMES,
                                                   CHAIN_MEANINGS, Cmp, Elements, Expr, FAMILIES,
                                                   FibTypePattern, HOOKS, IfacePattern, IntPattern,
                                                   Limit, NamePattern, Nat, NftChain, NftElement,
                                                   NftRule, NftSet, NftTable, Notrack,
                                                   PRIORITY_NAMES, Passive, Pattern, RawPattern,
                                                   Selector, SetRef, SetStmt, Unknown, VMap,
                                                   Verdict, VerdictStmt, XtMatch,
                                                   pattern)  # noqa: F401
from traceflow.engines.netfilter.nft_parse import parse_nft_ruleset  # noqa: F401
from traceflow.engines.netfilter.nft_lookup import _lookup  # noqa: F401
from traceflow.engines.netfilter.nft_ruleset import NftRuleset  # noqa: F401
from traceflow.engines.netfilter.nft_sim import NEXT, Outcome, RETURN  # noqa: F401
