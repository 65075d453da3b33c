"""The glue between the OVS simulator (traceflow.engines.ovs) and the walk: a packet as the
simulator's field state and back, and a table hit as a trace hop. No CNI knowledge: any
datapath with an OVS bridge (and `ovs-trace`) uses it."""

from __future__ import annotations

import functools
import ipaddress

from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.runs import TableHit
from traceflow.model.packet import Packet, diff_headers
from traceflow.bundle.snapshot import NodeModel
from traceflow.model.trace import Hop


def to_state(pkt: Packet, in_port: int) -> dict:
    state = {"in_port": in_port, "dl_type": pkt.dl_type, "dl_src": F.parse_mac(pkt.dl_src),
             "dl_dst": F.parse_mac(pkt.dl_dst), "nw_ttl": pkt.nw_ttl, "pkt_mark": pkt.mark}
    if pkt.is_v6:
        # OVS keeps an IPv6 packet's addresses in ipv6_src/ipv6_dst (nw_src/nw_dst are
        # IPv4-only fields), its hop limit in nw_ttl, its flow label in ipv6_label
        for key, value in (("ipv6_src", pkt.nw_src), ("ipv6_dst", pkt.nw_dst),
                           ("nd_target", pkt.nd_target)):
            if value:
                state[key] = int(ipaddress.IPv6Address(value))
        state["ipv6_label"] = pkt.ipv6_label
        for key, value in (("nd_sll", pkt.nd_sll), ("nd_tll", pkt.nd_tll)):
            if value:
                state[key] = F.parse_mac(value)
    else:
        if pkt.nw_src:
            state["nw_src"] = _v4(pkt.nw_src)
        if pkt.nw_dst:
            state["nw_dst"] = _v4(pkt.nw_dst)
    if pkt.nw_proto is not None:
        state["nw_proto"] = pkt.nw_proto
    if pkt.tp_src is not None:
        state["tp_src"] = pkt.tp_src
    if pkt.tp_dst is not None:
        state["tp_dst"] = pkt.tp_dst
    if pkt.nw_proto in (1, 58):
        # the packet keeps an ICMP/ICMPv6 type and code in tp_src/tp_dst (as OVS's struct
        # flow does); the simulator matches them as icmp_type/icmp_code
        state["icmp_type"], state["icmp_code"] = pkt.tp_src or 0, pkt.tp_dst or 0
    for key in ("tun_src", "tun_dst"):
        value = pkt.extra.get(key)
        if value and ":" in value:         # an IPv6 underlay: the tunnel's IPv6 fields
            state[f"tun_ipv6_{key[4:]}"] = int(ipaddress.IPv6Address(value))
        elif value:
            state[key] = _v4(value)
    return state


@functools.lru_cache(maxsize=65536)     # (a walk enters bridges with the same few addresses)
def _v4(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


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
    src, dst = ("ipv6_src", "ipv6_dst") if template.is_v6 else ("nw_src", "nw_dst")
    if src in state and template.nw_src is not None:
        pkt.nw_src = _text(src, state[src])
    if dst in state and template.nw_dst is not None:
        pkt.nw_dst = _text(dst, state[dst])
    if template.is_v6:
        if "ipv6_label" in state:
            pkt.ipv6_label = state["ipv6_label"]
        if "nd_target" in state and template.nd_target is not None:
            pkt.nd_target = _text("nd_target", state["nd_target"])
        for key in ("nd_sll", "nd_tll"):
            if key in state and getattr(template, key) is not None:
                setattr(pkt, key, _text(key, state[key]))
    for key in ("tp_src", "tp_dst", "nw_ttl"):
        if key in state and getattr(template, key) is not None:
            setattr(pkt, key, state[key])
    if "pkt_mark" in state:
        # OVS's pkt_mark is the skb mark: a packet output to an internal port (a gateway into
        # the host) carries the mark a flow set, which the host's rules and fwmark ip rules see
        # (Antrea's Egress: EgressMark's set_field:0x1/0xff->pkt_mark, matched by iptables)
        pkt.mark = state["pkt_mark"]
    if template.nw_proto in (1, 58):
        pkt.tp_src = state.get("icmp_type", pkt.tp_src)
        pkt.tp_dst = state.get("icmp_code", pkt.tp_dst)
    pkt.extra = {k: v for k, v in pkt.extra.items() if k not in ("tun_src", "tun_dst")}
    return pkt


def _hop(node: str, hit: TableHit, headers: dict, changed: dict, model: NodeModel) -> Hop:
    """One OVS table hit as a trace hop: the flow, its table name, what it did and changed."""
    flow = hit.flow
    name = model.annotator.table_name(hit.table) if isinstance(hit.table, int) else None
    effect = "; ".join(hit.effects) if hit.effects else "no action"
    return Hop(node, "ovs", str(hit.table), flow.text if flow else None, effect,
               priority=flow.priority if flow else None, table_name=name,
               source=flow.source if flow else None, packet=headers,
               changed=changed, matched=flow.match_texts() if flow else (),
               notes=list(hit.notes), unknown=hit.unknown is not None,
               detail="ovs-group" if flow is not None and flow.uses_group else "ovs-flow")


# what from_state reads of a state: two states equal on these give equal packets
_PACKET_FIELDS = ("dl_src", "dl_dst", "nw_src", "nw_dst", "ipv6_src", "ipv6_dst", "ipv6_label",
                  "nd_target", "nd_sll", "nd_tll", "tp_src", "tp_dst", "nw_ttl", "pkt_mark",
                  "icmp_type", "icmp_code")


def ovs_hops(node: str, hits: list, state: dict, first: Packet,
             model: NodeModel) -> list[Hop]:
    """The hops of one run through the bridge, ``first`` the packet that entered it. A hit
    that left the packet's fields as the hit before it did shows the same packet (most
    tables only read and jump), so each packet is built and its headers read once."""
    hops = []
    before, before_headers, before_key = first, first.headers(), None
    for hit in hits:
        after = hit.state_after or state
        key = tuple(map(after.get, _PACKET_FIELDS))
        if key == before_key:
            hops.append(_hop(node, hit, dict(before_headers), {}, model))
            continue
        pkt = from_state(after, before)
        headers = pkt.headers()
        hops.append(_hop(node, hit, headers, diff_headers(before_headers, headers), model))
        before, before_headers, before_key = pkt, headers, key
    return hops
