"""An nftables ruleset as a whole: its tables by name, the base chains a packet meets at a hook
in priority order, and ``evaluate_hook`` (runs the simulator, nft_sim). The tables, chains,
sets and rule expressions it holds are nft_model's. See ``traceflow.engines.netfilter.nft``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traceflow.engines.netfilter.context import NodeContext
from traceflow.engines.netfilter.engine import Branch
from traceflow.engines.netfilter.iptables import Diagnosed
from traceflow.engines.netfilter.nft_model import _IP_FAMILIES, HOOKS, NftChain, NftTable
from traceflow.engines.netfilter.nft_sim import _Simulator
from traceflow.model.errors import InputError
from traceflow.model.packet import Packet


@dataclass
class NftRuleset(Diagnosed):
    name: str                          # the bundle file it was read from
    tables: dict[str, NftTable] = field(default_factory=dict)   # "ip kube-proxy" -> table
    diagnostics: list[InputError] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    def table(self, family: str, name: str) -> NftTable | None:
        return self.tables.get(f"{family} {name}")

    def chains(self):
        for table in self.tables.values():
            yield from ((table, chain) for chain in table.chains.values())

    def rules(self):
        """Every (table, chain, rule), in file order per chain."""
        for table, chain in self.chains():
            for rule in chain.rules:
                yield table, chain, rule

    def hooked_chains(self):
        """The chains that may be base chains, in file order (all of them here)."""
        return self.chains()

    def base_chains(self, hook: str, family: str = "ip") -> list[tuple[NftTable, NftChain]]:
        """Base chains a packet of ``family`` meets at ``hook``, in the order they run."""
        hook = _hook_name(hook)
        families = _IP_FAMILIES.get(family, (family,))
        found = [(t, c) for t, c in self.hooked_chains()
                 if c.hook == hook and t.family in families and c.priority is not None]
        return sorted(found, key=lambda tc: tc[1].priority)    # stable: file order on ties

    def evaluate_hook(self, hook: str, packet: Packet, ctx: NodeContext) -> list[Branch]:
        """Run ``packet`` through every base chain attached to ``hook`` (PREROUTING, input...)."""
        return _Simulator(self).run(_hook_name(hook), packet, ctx)


def _hook_name(hook: str) -> str:
    name = hook.lower()
    if name not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}; expected one of {', '.join(HOOKS)} "
                         "(or their iptables names)")
    return name
