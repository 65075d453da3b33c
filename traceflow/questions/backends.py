"""Which backends a node's datapath balances a Service VIP:port to, per datapath.

Each reader answers ``balanced(node, vip, port, proto)`` with the backends and their share of
new connections, each with the bundle line it comes from, or None when that datapath does not
handle the VIP on that node. The audit compares the answers with the EndpointSlices. Readers:

- ``NetfilterReader``: kube-proxy iptables / nftables (the KUBE-SVC/KUBE-SEP chains or the
  service/endpoint chains), by running the node's rules for a SYN: every DNAT branch and its
  statistic/numgen share, exactly as a trace would see it.
- ``IpvsReader``: the IPVS virtual server's real servers and weights.

A CNI's own load balancer is read by the readers its package adds (``traceflow.cni.
backend_readers``: an OVS select group's buckets, a BPF service map); they answer the same
``balanced`` with the same ``Balanced`` rows (traceflow.walk.datapath).
"""

from __future__ import annotations

from traceflow.model.packet import PROTO_NUMBERS, Packet
from traceflow.walk.datapath import Balanced  # noqa: F401  (the rows every reader answers)


class NetfilterReader:
    datapath = "netfilter"

    def __init__(self, snap):
        self.snap = snap

    def applies(self, node) -> bool:
        return node.netfilter is not None

    def balanced(self, node, client_ip: str, vip: str, port: int, proto: str):
        from traceflow.engines.netfilter.engine import NodeContext, evaluate_hook
        rs = node.netfilter_for(6 if ":" in vip else 4)      # ip6tables-save for IPv6
        if rs is None:
            return None
        pkt = Packet(nw_src=client_ip, nw_dst=vip, nw_proto=PROTO_NUMBERS[proto.lower()],
                     tp_src=54321, tp_dst=port)
        ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets,
                          node=node.name, ct_state={"NEW"}, ct_dir="ORIGINAL")
        if hasattr(rs, "evaluate_hook"):
            branches, kind = rs.evaluate_hook("PREROUTING", pkt, ctx), "nft"
        else:
            branches, kind = evaluate_hook(rs, "PREROUTING", pkt, ctx), "iptables"
        out, rejected = [], False
        for b in branches:
            if b.nat is not None and b.nat.kind == "DNAT" and b.nat.translated \
                    and b.nat.translated[0]:
                step = _last_nat_step(b.steps)
                rule = step.rule if step is not None else None
                out.append(Balanced(b.nat.translated[0], b.nat.translated[1], b.weight,
                                    getattr(rule, "source", None),
                                    f"{kind} {step.chain}: {getattr(rule, 'text', '')}".strip()
                                    if step else kind))
            elif b.verdict in ("REJECT", "DROP"):
                rejected = True
        if out or rejected:
            return out
        return None


def _last_nat_step(steps):
    for s in reversed(steps):
        text = (getattr(s.rule, "text", "") or "") if s.rule is not None else ""
        if "DNAT" in text or "dnat" in text:
            return s
    return steps[-1] if steps else None


class IpvsReader:
    datapath = "ipvs"

    def __init__(self, snap):
        self.snap = snap

    def applies(self, node) -> bool:
        return node.ipvs is not None

    def balanced(self, node, client_ip: str, vip: str, port: int, proto: str):
        pkt = Packet(nw_src=client_ip, nw_dst=vip, nw_proto=PROTO_NUMBERS[proto.lower()],
                     tp_src=54321, tp_dst=port)
        svc, _, _ = node.ipvs.lookup(pkt)
        if svc is None:
            return None
        servers = [rs for rs in svc.real_servers if rs.endpoint.ip]
        total = sum(rs.weight or 0 for rs in servers)
        return [Balanced(rs.endpoint.ip, rs.endpoint.port,
                         (rs.weight or 0) / total if total else 0.0, rs.source, rs.text.strip())
                for rs in servers]
