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

The code lives in ``iptables_values`` (ports, marks, NAT targets, diagnostics),
``iptables_matches`` (the matches), ``iptables_model`` (rules, chains, tables, targets),
``iptables_parse`` (iptables-save) and ``iptables_list`` (-L -n); this module gathers their
public names.
"""

from __future__ import annotations

from traceflow.engines.netfilter.iptables_matches import (AddrMatch, AddrTypeMatch, CommentMatch,
                                                          ConnmarkMatch, CtDirMatch, CtStateMatch,
                                                          CtTupleMatch, FragmentMatch, ICMP_TYPES,
                                                          IcmpMatch, IfaceMatch, LengthMatch,
                                                          LimitMatch, MacMatch, MarkMatch, Match,
                                                          MultiportMatch, PhysdevMatch, PortMatch,
                                                          ProtoMatch, RecentMatch, SetMatch,
                                                          StatisticMatch, TcpFlagsMatch,
                                                          UnknownMatch,
                                                          ipset_contains)  # noqa: F401
from traceflow.engines.netfilter.iptables_model import (BUILTIN_CHAINS, Chain, PASSIVE_TARGETS,
                                                        Rule, Ruleset, TABLES, TARGETS,
                                                        TERMINAL_TARGETS, Table,
                                                        TargetSpec)  # noqa: F401
from traceflow.engines.netfilter.iptables_values import (ConnmarkOp, Diagnosed, MASK32, Mark,
                                                         MarkOp, NatTo, NotModelled, PortRange,
                                                         RuleSyntaxError, mark, mark_op, nat_to,
                                                         port_range)  # noqa: F401
from traceflow.engines.netfilter.iptables_parse import (CORE_OPTIONS, Decoder, IMPLICIT_MODULES,
                                                        MODULES, ModuleSpec, Opt, build_rule,
                                                        parse_iptables_save, parse_rule_words,
                                                        tokenize)  # noqa: F401
from traceflow.engines.netfilter.iptables_list import LIST_WORDS, ListDecoder, parse_iptables_list  # noqa: F401
