"""The hop of the kernel's conntrack translating a packet of a connection it already NAT-ed
(at PREROUTING, INPUT or POSTROUTING): shared by the host stack (host.py) and the local
delivery to hostNetwork pods (hostnet.py)."""

from __future__ import annotations

from traceflow.model.packet import Packet
from traceflow.model.trace import Hop
from traceflow.walk.state import fmt as _fmt


def ct_hop(node: str, entry, is_reply: bool, before: Packet, after: Packet, hook: str) -> Hop:
    """The kernel's conntrack translating a packet of a connection it already NAT-ed."""
    undnat = is_reply and "dst" in (entry.nat or "") and after.nw_src != before.nw_src
    what = " (un-DNAT)" if undnat else (" (un-SNAT)" if is_reply else "")
    return Hop(node, "iptables", "nat", _ct_text(entry),
               f"{'reply of' if is_reply else 'packet of'} a NAT-ed connection: conntrack "
               f"{'restores' if is_reply else 'applies'} the translation at {hook}: "
               f"{_fmt(before)} -> {_fmt(after)}{what}",
               chain="conntrack", packet=after.headers(), changed=after.diff(before),
               notes=[f"connection committed by {entry.where}"])


def _ct_text(entry) -> str:
    o, r = entry.orig, entry.reply
    return (f"conntrack: {o[1]}:{o[2]} -> {o[3]}:{o[4]} (reply {r[1]}:{r[2]} -> {r[3]}:{r[4]}) "
            f"[{entry.nat or 'no'} NAT]")
