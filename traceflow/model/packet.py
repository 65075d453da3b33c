"""The packet being traced: headers as OVS names them, plus host-side metadata.

Engines copy a Packet, change the copy and return it, so every hop can show the headers
after it and what changed (``diff``).

Both IP families: ``nw_src``/``nw_dst`` hold an IPv4 or an IPv6 address (OVS reads them as
``ipv6_src``/``ipv6_dst`` when ``dl_type`` is 0x86dd), ``nw_proto`` is IPv6's next header and
``nw_ttl`` its hop limit (OVS's own reading of ``nw_ttl`` for IPv6), ``ipv6_label`` the flow
label. An ICMP or ICMPv6 type and code are ``tp_src``/``tp_dst``, as OVS keeps them; neighbour
discovery adds ``nd_target`` and the link-layer option ``nd_sll`` (NS) / ``nd_tll`` (NA). The
family follows the addresses: a Packet built with IPv6 addresses is 0x86dd.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

PROTO_NUMBERS = {"icmp": 1, "tcp": 6, "udp": 17, "sctp": 132, "icmpv6": 58}
PROTO_NAMES = {v: k for k, v in PROTO_NUMBERS.items()}
# protocol names as iptables prints them: xtables' own table (libxtables xtables_chain_protos)
# first, then the /etc/protocols names getprotobynumber() gives (iptables-save of Calico's
# IPIP rules says `-p ipencap`, Debian's name for 4; others print `ipip` or the number)
IP_PROTOCOL_NAMES = {**PROTO_NUMBERS, "udplite": 136, "icmpv6": 58, "ipv6-icmp": 58,
                     "icmp6": 58, "esp": 50, "ah": 51, "ipv6-mh": 135, "mh": 135, "ipencap": 4,
                     "ipip": 4, "ip-encap": 4, "gre": 47, "igmp": 2, "ipv6": 41, "ospf": 89,
                     "ospfigp": 89, "vrrp": 112, "pim": 103, "dccp": 33, "l2tp": 115, "ipcomp": 108,
                     "ipv6-route": 43, "ipv6-frag": 44, "ipv6-nonxt": 59, "ipv6-opts": 60,
                     "ggp": 3, "egp": 8, "rsvp": 46, "etherip": 97, "encap": 98,
                     "mpls-in-ip": 137, "hip": 139, "shim6": 140, "wesp": 141, "rohc": 142}

ETH_IP, ETH_IPV6 = 0x0800, 0x86DD
# ICMPv6 types (RFC 4443, RFC 4861) that the walk names
ICMPV6_ECHO_REQUEST, ICMPV6_ECHO_REPLY = 128, 129
ICMPV6_NS, ICMPV6_NA = 135, 136
_ECHO_ANSWER = {8: 0, ICMPV6_ECHO_REQUEST: ICMPV6_ECHO_REPLY}   # ICMP / ICMPv6 echo -> reply


def family_of(address: str | None) -> int | None:
    """4 or 6 for an address as the walk writes it (no parsing: an IPv6 address has a colon)."""
    if not address:
        return None
    return 6 if ":" in address else 4


@dataclass
class Tunnel:
    """Outer headers of an encapsulated packet (Geneve/VXLAN)."""

    kind: str            # "geneve" | "vxlan" | ...
    src: str             # outer source IP (the sending node)
    dst: str             # outer destination IP (the receiving node)
    vni: int = 0
    dport: int = 6081


_new = object.__new__


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
    ipv6_label: int = 0                 # IPv6 flow label (20 bits)
    nd_target: str | None = None        # ICMPv6 neighbour solicitation/advertisement target
    nd_sll: str | None = None           # NS: the source link-layer address option
    nd_tll: str | None = None           # NA: the target link-layer address option

    # headers shown in traces, in this order (an IPv6 packet adds SHOWN_V6 after them)
    SHOWN = ("dl_src", "dl_dst", "nw_src", "nw_dst", "nw_proto", "tp_src", "tp_dst", "nw_ttl",
             "mark")
    SHOWN_V6 = ("ipv6_label",)
    SHOWN_ND = ("nd_target", "nd_sll", "nd_tll")

    def __post_init__(self) -> None:
        # the family follows the addresses: an IPv6 address makes the frame IPv6 (0x86dd)
        if self.dl_type == ETH_IP and (family_of(self.nw_src) == 6
                                       or family_of(self.nw_dst) == 6):
            self.dl_type = ETH_IPV6

    @property
    def family(self) -> int:
        """4 or 6: IPv6 when the frame says so (0x86dd)."""
        return 6 if self.dl_type == ETH_IPV6 else 4

    @property
    def is_v6(self) -> bool:
        return self.dl_type == ETH_IPV6

    def copy(self) -> "Packet":
        # the fields copied and two of them copied deeper: the same as dataclasses.replace,
        # several times cheaper (a walk copies the packet at every hop)
        out = _new(type(self))
        fields = self.__dict__.copy()
        fields["extra"] = dict(self.extra)
        out.__dict__ = fields
        if self.tunnel is not None:
            out.tunnel = dataclasses.replace(self.tunnel)
        return out

    @property
    def proto_name(self) -> str:
        return PROTO_NAMES.get(self.nw_proto or -1, str(self.nw_proto)).upper()

    def headers(self) -> dict:
        """The shown headers as a plain dict (for JSON and for diffs)."""
        out = {name: getattr(self, name) for name in self.SHOWN}
        if self.dl_type == ETH_IPV6:      # an IPv4 packet's headers stay as they always were
            out.update((name, getattr(self, name)) for name in self.SHOWN_V6)
            if self.nw_proto == 58 and self.nd_target is not None:
                out.update((name, getattr(self, name)) for name in self.SHOWN_ND)
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
        return diff_headers(before.headers(), self.headers())

    def reversed(self) -> "Packet":
        """The reply's headers: addresses and ports swapped (L2 filled in by the replier); an
        ICMP/ICMPv6 echo request is answered by an echo reply (type and code are not ports).
        The replier's flow label is its own: 0 here, as the request's."""
        if self.nw_proto in (1, 58):
            tp_src, tp_dst = _ECHO_ANSWER.get(self.tp_src, self.tp_src), self.tp_dst
        else:
            tp_src, tp_dst = self.tp_dst, self.tp_src
        return dataclasses.replace(self, dl_src=self.dl_dst, dl_dst=self.dl_src,
                                   nw_src=self.nw_dst, nw_dst=self.nw_src,
                                   tp_src=tp_src, tp_dst=tp_dst, nw_ttl=64,
                                   tcp_flags="syn,ack" if self.nw_proto == 6 else None,
                                   mark=0, tunnel=None, extra={}, ipv6_label=0,
                                   nd_target=None, nd_sll=None, nd_tll=None)

    def five_tuple(self) -> tuple:
        return (self.nw_proto, self.nw_src, self.tp_src, self.nw_dst, self.tp_dst)


def diff_headers(old: dict, new: dict) -> dict:
    """The headers whose value differs between two ``Packet.headers()``: name -> (old, new)."""
    if old == new:
        return {}
    return {k: (old.get(k), new.get(k)) for k in set(old) | set(new) if old.get(k) != new.get(k)}
