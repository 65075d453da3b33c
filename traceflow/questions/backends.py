"""Which backends a node's datapath balances a Service VIP:port to, per datapath.

Each reader answers ``balanced(node, vip, port, proto)`` with the backends and their share of
new connections, each with the bundle line it comes from, or None when that datapath does not
handle the VIP on that node. The audit compares the answers with the EndpointSlices. Readers:

- ``NetfilterReader``: kube-proxy iptables / nftables (the KUBE-SVC/KUBE-SEP chains or the
  service/endpoint chains), by running the node's rules for a SYN: every DNAT branch and its
  statistic/numgen share, exactly as a trace would see it.
- ``IpvsReader``: the IPVS virtual server's real servers and weights.
- ``OvsGroupReader``: an OVS select group the Service flow sends to; the CNI says how a bucket
  names its endpoint (Antrea: the endpoint IP in reg3, port in reg4[0..15]).

- ``CiliumLbReader``: the service map Cilium's from-container reads (`bpf lb list`, else
  `service list`, else the statedb frontends): the slots a new connection can take, as the
  trace's service lookup finds them, each an equal share (Maglev: its lookup-table share).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from traceflow.model.errors import Source
from traceflow.model.packet import PROTO_NUMBERS, Packet


@dataclass(frozen=True)
class Balanced:
    ip: str
    port: int | None
    share: float                    # of new connections, 0..1
    source: Source | None           # the rule / real server / bucket line
    text: str                       # that line, or a short description


class NetfilterReader:
    datapath = "netfilter"

    def __init__(self, snap):
        self.snap = snap

    def applies(self, node) -> bool:
        return node.netfilter is not None

    def balanced(self, node, client_ip: str, vip: str, port: int, proto: str):
        from traceflow.engines.netfilter.engine import NodeContext, evaluate_hook
        rs = node.netfilter
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


# Antrea's select-group buckets: the endpoint IP in reg3, the port in reg4[0..15]
_REG3 = re.compile(r"(?:set_field:(0x[0-9a-f]+)->reg3|load:(0x[0-9a-f]+)->NXM_NX_REG3\[\])")
_REG4 = re.compile(r"(?:set_field:(0x[0-9a-f]+)/0xffff->reg4|load:(0x[0-9a-f]+)->NXM_NX_REG4\[0\.\.15\])")
_GROUP = re.compile(r"\bgroup:(\d+)")


class OvsGroupReader:
    datapath = "ovs-group"

    def __init__(self, snap):
        self.snap = snap
        self._index: dict = {}

    def applies(self, node) -> bool:
        return node._file("ovs-groups.txt") is not None and node._file("ovs-flows.txt") is not None

    def _service_flows(self, node) -> dict:
        """(vip, port, proto) -> (group id, Source of the flow) from the flows' group actions."""
        if node.name in self._index:
            return self._index[node.name]
        text, name = node._file("ovs-flows.txt")
        out = {}
        for lineno, line in enumerate(text.splitlines(), 1):
            g = _GROUP.search(line)
            if not g or "nw_dst=" not in line:
                continue
            match = line.split("actions=")[0]
            fields = dict(p.strip().partition("=")[::2] for p in match.replace(" ", ",").split(","))
            vip, port = fields.get("nw_dst"), fields.get("tp_dst")
            proto = next((p for p in ("tcp", "udp", "sctp") if f",{p}," in f",{match},"
                          or f" {p}," in match), None)
            if vip and port and proto and port.isdigit():
                out.setdefault((vip, int(port), proto.upper()),
                               (int(g.group(1)), Source(name, lineno, line.strip())))
        self._index[node.name] = out
        return out

    def balanced(self, node, client_ip: str, vip: str, port: int, proto: str):
        found = self._service_flows(node).get((vip, port, proto.upper()))
        if found is None:
            return None
        gid, flow_src = found
        group = node.bridge.groups.get(gid)
        if group is None:
            return [Balanced("(no such group)", None, 0.0, flow_src,
                             f"the flow sends to group {gid}, which ovs-groups.txt lacks")]
        total = sum(b.weight for b in group.buckets) or 1
        out = []
        for b in group.buckets:
            ip_m, port_m = _REG3.search(b.text), _REG4.search(b.text)
            if not ip_m:
                continue        # a bucket that names no endpoint (e.g. "no endpoint" marking)
            value = int(ip_m.group(1) or ip_m.group(2), 16)
            ip = ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))
            p = int(port_m.group(1) or port_m.group(2), 16) if port_m else None
            out.append(Balanced(ip, p, b.weight / total, group.source,
                                f"group {gid} bucket {b.bucket_id}: {b.text.strip()}"))
        return out



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
        hit = service_lookup(cn.services, vip, port, proto)
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
