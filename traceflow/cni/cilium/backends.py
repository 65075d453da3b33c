"""Which backends Cilium balances a Service VIP:port to (the audit compares them with the
EndpointSlices): the service map Cilium's from-container reads (`bpf lb list`, else `service
list`, else the statedb frontends): the slots a new connection can take, as the trace's service
lookup finds them, each an equal share (Maglev: its lookup-table share).
"""

from __future__ import annotations

from traceflow.walk.datapath import Balanced


class CiliumLbReader:
    datapath = "cilium lb map"

    def __init__(self, snap):
        self.snap = snap
        self._nodes: dict = {}

    def applies(self, node) -> bool:
        return self.snap.cni == "cilium"

    def balanced(self, node, client_ip: str, vip: str, port: int, proto: str):
        from traceflow.engines.cilium.lookup import service_lookup
        from traceflow.cni.cilium.node import CiliumNode
        cn = self._nodes.get(node.name)
        if cn is None:
            cn = self._nodes[node.name] = CiliumNode(self.snap, node)
        hit = service_lookup(cn.services, vip, port, proto, version=cn.version)
        if hit is None:
            return None
        slots = list(hit.candidates)
        shares = None
        if (cn.settings.lb_algorithm or "random").lower() == "maglev":
            _, ids, by_id = cn.maglev_shares(hit.service, slots)
            shares = [by_id[i] for i in ids] if by_id else None
        if shares is None:             # random: each active slot 1/count (Maglev unknown: said
            shares = [1 / len(slots)] * len(slots) if slots else []
        return [Balanced(b.ip, b.port, share, b.source or hit.service.source,
                         f"cilium service {vip}:{port} slot {b.slot}: {b.ip}:{b.port}")
                for b, share in zip(slots, shares)]
