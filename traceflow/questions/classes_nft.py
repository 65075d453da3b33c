"""An nftables chain asked again for another client (traceflow.questions.classes): every
expression of its rules that reads an address — ``ip saddr``/``daddr`` compared or looked up
in a set or a verdict map, ``fib saddr/daddr type``, an iptables-nft ``match-set`` — is
evaluated by the simulator itself for the other client's packet; the tuple of answers is the
key. Expressions that read no address give every client the same answer and are skipped.
"""

from __future__ import annotations

from traceflow.engines.netfilter.nft_model import Cmp, SetStmt, Unknown, VMap, XtMatch

_ADDRESS_GETTERS = frozenset({"saddr4", "daddr4", "saddr6", "daddr6", "fib_saddr", "fib_daddr",
                              "fib_saddr_iif", "fib_daddr_iif"})


def _reads_address(expr) -> bool:
    if isinstance(expr, (Cmp, VMap)):
        return any(s.getter in _ADDRESS_GETTERS or s.getter is None for s in expr.key)
    return isinstance(expr, (XtMatch, Unknown))


def nft_chain_key(table, chain, packet, ctx, src: bool, dst: bool) -> tuple:
    """The answers of ``chain``'s address-reading expressions for ``packet``."""
    from traceflow.engines.netfilter.nft_lookup import _lookup
    from traceflow.engines.netfilter.nft_sim import _Simulator, _Walk
    sim = _Simulator(None)
    walk = _Walk(1.0, packet, ctx)
    out = []
    for rule in chain.rules:
        for expr in rule.exprs:
            if isinstance(expr, SetStmt) or not _reads_address(expr):
                continue     # a set update records the source for later packets: decides nothing now
            if isinstance(expr, VMap):
                values, _ = sim._key(expr.key, walk, None)
                if values is None or not isinstance(values, tuple):
                    out.append(("vmap", values))
                    continue
                items, _ = sim._items(table, expr.table)
                element, why = _lookup(items, values) if items is not None else (None, "none")
                out.append(("vmap", id(element) if element is not None else why))
            else:
                out.append(sim._match(table, expr, walk, None)[0])
    return tuple(out)
