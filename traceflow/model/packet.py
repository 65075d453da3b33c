"""The packet being traced: headers as OVS names them, plus host-side metadata.

Engines copy a Packet, change the copy and return it, so every hop can show the headers
after it and what changed (``diff``).
"""

from __future__ import annotations

import dataclasses
from copy import copy as _shallow
from dataclasses import dataclass, field

PROTO_NUMBERS = {"icmp": 1, "tcp": 6, "udp": 17, "sctp": 132}
PROTO_NAMES = {v: k for k, v in PROTO_NUMBERS.items()}


@dataclass
class Tunnel:
    """Outer headers of an encapsulated packet (Geneve/VXLAN)."""

    kind: str            # "geneve" | "vxlan" | ...
    src: str             # outer source IP (the sending node)
    dst: str             # outer destination IP (the receiving node)
    vni: int = 0
    dport: int = 6081


@dataclass
class Packet:
    dl_src: str = "00:00:00:00:00:00"
    dl_dst: str = "00:00:00:00:00:00"
    dl_type: int = 0x0800
    nw_src: str | None = None
    nw_dst: str | None = None
    nw_proto: int | None = None
    nw_ttl: int = 64
    tp_src: int | None = None
    tp_dst: int | None = None
    tcp_flags: str | None = "syn"        # informational: first packet of a TCP connection
    mark: int = 0                       # skb->mark on the host (fwmark)
    tunnel: Tunnel | None = None        # set while the packet travels encapsulated
    extra: dict = field(default_factory=dict)  # engine-specific carried state (e.g. tun_dst)

    # headers shown in traces, in this order
    SHOWN = ("dl_src", "dl_dst", "nw_src", "nw_dst", "nw_proto", "tp_src", "tp_dst", "nw_ttl",
             "mark")

    def copy(self) -> "Packet":
        # copy.copy and two fields set again: the same as dataclasses.replace, five times
        # cheaper (a walk copies the packet at every hop)
        out = _shallow(self)
        out.extra = dict(self.extra)
        if self.tunnel is not None:
            out.tunnel = dataclasses.replace(self.tunnel)
        return out

    @property
    def proto_name(self) -> str:
        return PROTO_NAMES.get(self.nw_proto or -1, str(self.nw_proto)).upper()

    def headers(self) -> dict:
        """The shown headers as a plain dict (for JSON and for diffs)."""
        out = {name: getattr(self, name) for name in self.SHOWN}
        if self.tunnel:
            out["tun_src"] = self.tunnel.src
            out["tun_dst"] = self.tunnel.dst
            # the outer header's kind, VNI (key) and UDP port (None: not UDP, e.g. IPIP)
            out["tun_kind"] = self.tunnel.kind
            out["tun_id"] = self.tunnel.vni
            out["tun_dport"] = self.tunnel.dport or None
        return out

    def diff(self, before: "Packet") -> dict:
        """Fields whose value differs from ``before``: name -> (old, new)."""
        old, new = before.headers(), self.headers()
        return {k: (old.get(k), new.get(k)) for k in set(old) | set(new) if old.get(k) != new.get(k)}

    def reversed(self) -> "Packet":
        """The reply's headers: addresses and ports swapped (L2 filled in by the replier)."""
        return dataclasses.replace(self, dl_src=self.dl_dst, dl_dst=self.dl_src,
                                   nw_src=self.nw_dst, nw_dst=self.nw_src,
                                   tp_src=self.tp_dst, tp_dst=self.tp_src, nw_ttl=64,
                                   tcp_flags="syn,ack" if self.nw_proto == 6 else None,
                                   mark=0, tunnel=None, extra={})

    def five_tuple(self) -> tuple:
        return (self.nw_proto, self.nw_src, self.tp_src, self.nw_dst, self.tp_dst)
