"""The glue between the OVS simulator (traceflow.engines.ovs) and the walk: a packet as the
simulator's field state and back, and a table hit as a trace hop. No CNI knowledge: any
datapath with an OVS bridge (and `ovs-trace`) uses it."""

from __future__ import annotations

import ipaddress

from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.runs import TableHit
from traceflow.model.packet import Packet
from traceflow.bundle.snapshot import NodeModel
from traceflow.model.trace import Hop


def to_state(pkt: Packet, in_port: int) -> dict:
    state = {"in_port": in_port, "dl_type": pkt.dl_type, "dl_src": F.parse_mac(pkt.dl_src),
             "dl_dst": F.parse_mac(pkt.dl_dst), "nw_ttl": pkt.nw_ttl, "pkt_mark": pkt.mark}
    if pkt.nw_src:
        state["nw_src"] = int(ipaddress.IPv4Address(pkt.nw_src))
    if pkt.nw_dst:
        state["nw_dst"] = int(ipaddress.IPv4Address(pkt.nw_dst))
    if pkt.nw_proto is not None:
        state["nw_proto"] = pkt.nw_proto
    if pkt.tp_src is not None:
        state["tp_src"] = pkt.tp_src
    if pkt.tp_dst is not None:
        state["tp_dst"] = pkt.tp_dst
    for key in ("tun_src", "tun_dst"):
        if pkt.extra.get(key):
            state[key] = int(ipaddress.IPv4Address(pkt.extra[key]))
    return state


_TEXTS: dict = {}        # (field, int) -> its text: a walk formats the same few addresses


def _text(name: str, value: int) -> str:
    key = (name, value)
    got = _TEXTS.get(key)
    if got is None:
        if len(_TEXTS) > 100_000:
            _TEXTS.clear()
        got = _TEXTS[key] = F.format_value(F.FIELDS[name], value)
    return got


def from_state(state: dict, template: Packet) -> Packet:
    pkt = template.copy()
    if "dl_src" in state:
        pkt.dl_src = _text("dl_src", state["dl_src"])
    if "dl_dst" in state:
        pkt.dl_dst = _text("dl_dst", state["dl_dst"])
    if "nw_src" in state and template.nw_src is not None:
        pkt.nw_src = _text("nw_src", state["nw_src"])
    if "nw_dst" in state and template.nw_dst is not None:
        pkt.nw_dst = _text("nw_dst", state["nw_dst"])
    for key in ("tp_src", "tp_dst", "nw_ttl"):
        if key in state and getattr(template, key) is not None:
            setattr(pkt, key, state[key])
    if "pkt_mark" in state:
        # OVS's pkt_mark is the skb mark: a packet output to an internal port (a gateway into
        # the host) carries the mark a flow set, which the host's rules and fwmark ip rules see
        # (Antrea's Egress: EgressMark's set_field:0x1/0xff->pkt_mark, matched by iptables)
        pkt.mark = state["pkt_mark"]
    pkt.extra = {k: v for k, v in pkt.extra.items() if k not in ("tun_src", "tun_dst")}
    return pkt


def ovs_hop(node: str, hit: TableHit, pkt: Packet, before: Packet, model: NodeModel) -> Hop:
    """One OVS table hit as a trace hop: the flow, its table name, what it did and changed."""
    flow = hit.flow
    name = model.annotator.table_name(hit.table) if isinstance(hit.table, int) else None
    effect = "; ".join(hit.effects) if hit.effects else "no action"
    return Hop(node, "ovs", str(hit.table), flow.text if flow else None, effect,
               priority=flow.priority if flow else None, table_name=name,
               source=flow.source if flow else None, packet=pkt.headers(),
               changed=pkt.diff(before), matched=flow.match_texts() if flow else (),
               notes=list(hit.notes), unknown=hit.unknown is not None,
               detail="ovs-group" if flow is not None and _uses_group(flow) else "ovs-flow")


def _uses_group(flow) -> bool:
    """Whether the flow's actions send the packet to a group (a select group's buckets)."""
    from traceflow.engines.ovs.actions import Group
    try:
        return any(isinstance(a, Group) for a in flow.actions)
    except ValueError:
        return False
