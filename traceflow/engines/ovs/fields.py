"""OpenFlow fields as ovs-ofctl spells them: names, aliases, widths and value codecs.

Every field value inside the simulator is an int (IPs, MACs, registers alike) so that a
match is one ``(value & mask) == want`` test. ``FIELDS`` is the one table that knows how a
name in a dump maps to a field, how wide it is and how to read and print its values.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    name: str          # canonical name (ovs-ofctl's match name)
    bits: int
    kind: str          # "int" | "ipv4" | "ipv6" | "mac" | "ct_state"
    # a view of other fields (read and written through ``view_read``/``view_write``, matched
    # as the pieces ``view_match`` gives): "vlan_vid", "dl_vlan", "vlan_pcp" (of vlan_tci),
    # "xreg" / "xxreg" (of two or four 32-bit registers), "port11" (actset_output as OXM
    # reads it); None for a field the packet state holds itself
    view: str | None = None


def _f(name: str, bits: int, kind: str = "int", view: str | None = None) -> Field:
    return Field(name, bits, kind, view)


_CANONICAL = [
    # the OpenFlow port (16 bits, NXM_OF_IN_PORT); OXM reads it as an OpenFlow 1.1 port
    _f("in_port", 16), _f("in_port_oxm", 32, view="port11"),
    _f("dl_src", 48, "mac"), _f("dl_dst", 48, "mac"), _f("dl_type", 16),
    _f("dl_vlan", 12), _f("vlan_tci", 16), _f("nw_src", 32, "ipv4"), _f("nw_dst", 32, "ipv4"),
    _f("nw_proto", 8), _f("nw_ttl", 8), _f("nw_tos", 8), _f("ip_dscp", 6), _f("nw_ecn", 2),
    _f("nw_frag", 2), _f("tp_src", 16), _f("tp_dst", 16), _f("tcp_flags", 12),
    _f("icmp_type", 8), _f("icmp_code", 8),
    _f("arp_op", 16), _f("arp_spa", 32, "ipv4"), _f("arp_tpa", 32, "ipv4"),
    _f("arp_sha", 48, "mac"), _f("arp_tha", 48, "mac"),
    _f("ipv6_src", 128, "ipv6"), _f("ipv6_dst", 128, "ipv6"), _f("nd_target", 128, "ipv6"),
    _f("tun_id", 64), _f("tun_src", 32, "ipv4"), _f("tun_dst", 32, "ipv4"),
    _f("tun_ipv6_src", 128, "ipv6"), _f("tun_ipv6_dst", 128, "ipv6"),
    _f("metadata", 64), _f("pkt_mark", 32), _f("dp_hash", 32), _f("recirc_id", 32),
    _f("ct_state", 32, "ct_state"), _f("ct_zone", 16), _f("ct_mark", 32), _f("ct_label", 128),
    _f("ct_nw_src", 32, "ipv4"), _f("ct_nw_dst", 32, "ipv4"), _f("ct_nw_proto", 8),
    _f("ct_tp_src", 16), _f("ct_tp_dst", 16), _f("conj_id", 32),
    # the packet holds the OpenFlow port (16 bits, OFPP_UNSET when the action set has no
    # output); OXM reads it as an OpenFlow 1.1 port (32 bits), hence a view for reads
    _f("actset_output", 32, view="port11"),
    _f("nd_sll", 48, "mac"), _f("nd_tll", 48, "mac"),
    # the inner VLAN header's TCI (OVS keeps two, flow->vlans[0..1]; "Final flow:" prints
    # the inner one as vlan_tci1)
    _f("vlan_tci1", 16),
    # views of vlan_tci (lib/meta-flow.c mf_get_value/mf_set_flow_value, lib/flow.c
    # flow_set_vlan_vid/flow_set_dl_vlan/flow_set_vlan_pcp)
    _f("vlan_vid", 12, view="vlan_vid"), _f("dl_vlan", 12, view="dl_vlan"),
    _f("vlan_pcp", 3, view="vlan_pcp"), _f("dl_vlan_pcp", 3, view="vlan_pcp"),
    _f("ipv6_label", 20), _f("ct_ipv6_src", 128, "ipv6"), _f("ct_ipv6_dst", 128, "ipv6"),
]
_CANONICAL += [_f(f"reg{i}", 32) for i in range(16)]
# OpenFlow 1.5's packet registers and Nicira's 128-bit registers overlay the 32-bit ones:
# xreg<N> is reg<2N> (most significant half) and reg<2N+1>; xxreg<N> is reg<4N> .. reg<4N+3>
# (include/openvswitch/meta-flow.h, checked on OVS 3.1: ofproto/trace prints an xreg0 match
# as reg0=...,reg1=...)
_CANONICAL += [_f(f"xreg{i}", 64, view="xreg") for i in range(8)]
_CANONICAL += [_f(f"xxreg{i}", 128, view="xxreg") for i in range(4)]
_CANONICAL += [_f(f"tun_metadata{i}", 64) for i in range(64)]

FIELDS: dict[str, Field] = {f.name: f for f in _CANONICAL}

# Other spellings of the same field: OpenFlow 1.2+ (OXM) names and the NXM/OXM
# identifiers that load/move/set_field use ("NXM_NX_REG0" -> reg0).
_ALIASES = {
    "eth_src": "dl_src", "eth_dst": "dl_dst", "eth_type": "dl_type",
    "ip_src": "nw_src", "ip_dst": "nw_dst", "ip_proto": "nw_proto", "ip_ttl": "nw_ttl",
    "tcp_src": "tp_src", "tcp_dst": "tp_dst", "udp_src": "tp_src", "udp_dst": "tp_dst",
    "sctp_src": "tp_src", "sctp_dst": "tp_dst", "icmpv4_type": "icmp_type",
    "icmpv4_code": "icmp_code", "icmpv6_type": "icmp_type", "icmpv6_code": "icmp_code",
    "NXM_NX_IPV6_LABEL": "ipv6_label", "OXM_OF_IPV6_FLABEL": "ipv6_label",
    "OXM_OF_IPV6_SRC": "ipv6_src", "OXM_OF_IPV6_DST": "ipv6_dst",
    "NXM_NX_ND_TARGET": "nd_target", "OXM_OF_IPV6_ND_TARGET": "nd_target",
    "ipv6_nd_target": "nd_target", "NXM_NX_ICMPV6_TYPE": "icmp_type",
    "NXM_NX_ICMPV6_CODE": "icmp_code", "OXM_OF_ICMPV6_TYPE": "icmp_type",
    "OXM_OF_ICMPV6_CODE": "icmp_code", "NXM_OF_ICMP_TYPE": "icmp_type",
    "NXM_OF_ICMP_CODE": "icmp_code", "NXM_NX_CT_IPV6_SRC": "ct_ipv6_src",
    "NXM_NX_CT_IPV6_DST": "ct_ipv6_dst",
    "tun_ipv4_src": "tun_src", "tun_ipv4_dst": "tun_dst", "tunnel_id": "tun_id",
    "NXM_OF_IN_PORT": "in_port", "OXM_OF_IN_PORT": "in_port_oxm",
    "NXM_OF_ETH_SRC": "dl_src", "NXM_OF_ETH_DST": "dl_dst", "NXM_OF_ETH_TYPE": "dl_type",
    "OXM_OF_ETH_SRC": "dl_src", "OXM_OF_ETH_DST": "dl_dst",
    "NXM_OF_VLAN_TCI": "vlan_tci", "OXM_OF_VLAN_VID": "vlan_vid",
    "NXM_OF_IP_SRC": "nw_src", "NXM_OF_IP_DST": "nw_dst", "NXM_OF_IP_PROTO": "nw_proto",
    "OXM_OF_IPV4_SRC": "nw_src", "OXM_OF_IPV4_DST": "nw_dst", "NXM_NX_IP_TTL": "nw_ttl",
    "NXM_OF_IP_TOS": "nw_tos",
    "NXM_OF_TCP_SRC": "tp_src", "NXM_OF_TCP_DST": "tp_dst", "NXM_OF_UDP_SRC": "tp_src",
    "NXM_OF_UDP_DST": "tp_dst", "OXM_OF_TCP_SRC": "tp_src", "OXM_OF_TCP_DST": "tp_dst",
    "OXM_OF_UDP_SRC": "tp_src", "OXM_OF_UDP_DST": "tp_dst",
    "NXM_OF_ARP_OP": "arp_op", "NXM_OF_ARP_SPA": "arp_spa", "NXM_OF_ARP_TPA": "arp_tpa",
    "NXM_NX_ARP_SHA": "arp_sha", "NXM_NX_ARP_THA": "arp_tha",
    "OXM_OF_ARP_OP": "arp_op", "OXM_OF_ARP_SPA": "arp_spa", "OXM_OF_ARP_TPA": "arp_tpa",
    "NXM_NX_IPV6_SRC": "ipv6_src", "NXM_NX_IPV6_DST": "ipv6_dst",
    "NXM_NX_TUN_ID": "tun_id", "ONFOXM_ET_ACTSET_OUTPUT": "actset_output",
    "OXM_OF_VLAN_PCP": "vlan_pcp", "NXM_NX_TUN_IPV6_SRC": "tun_ipv6_src",
    "NXM_NX_TUN_IPV6_DST": "tun_ipv6_dst", "NXM_NX_TUN_IPV4_SRC": "tun_src", "NXM_NX_TUN_IPV4_DST": "tun_dst",
    "OXM_OF_METADATA": "metadata", "NXM_NX_PKT_MARK": "pkt_mark", "NXM_NX_DP_HASH": "dp_hash",
    "NXM_NX_CT_STATE": "ct_state", "NXM_NX_CT_ZONE": "ct_zone", "NXM_NX_CT_MARK": "ct_mark",
    "NXM_NX_CT_LABEL": "ct_label", "NXM_NX_CT_NW_SRC": "ct_nw_src",
    "NXM_NX_CT_NW_DST": "ct_nw_dst", "NXM_NX_CT_NW_PROTO": "ct_nw_proto",
    "NXM_NX_CT_TP_SRC": "ct_tp_src", "NXM_NX_CT_TP_DST": "ct_tp_dst",
    "NXM_NX_CONJ_ID": "conj_id", "NXM_NX_ND_SLL": "nd_sll", "NXM_NX_ND_TLL": "nd_tll",
    "OXM_OF_IPV6_ND_SLL": "nd_sll", "OXM_OF_IPV6_ND_TLL": "nd_tll",
    "ipv6_nd_sll": "nd_sll", "ipv6_nd_tll": "nd_tll",
}
_ALIASES.update({f"NXM_NX_REG{i}": f"reg{i}" for i in range(16)})
_ALIASES.update({f"OXM_OF_PKT_REG{i}": f"xreg{i}" for i in range(8)})
_ALIASES.update({f"NXM_NX_XREG{i}": f"xreg{i}" for i in range(8)})
_ALIASES.update({f"NXM_NX_XXREG{i}": f"xxreg{i}" for i in range(4)})
_ALIASES.update({f"NXM_NX_TUN_METADATA{i}": f"tun_metadata{i}" for i in range(64)})

# Shorthand protocol keywords: what each one implies.
PROTOCOLS: dict[str, dict[str, int]] = {
    "ip": {"dl_type": 0x0800}, "ipv4": {"dl_type": 0x0800},
    "icmp": {"dl_type": 0x0800, "nw_proto": 1}, "tcp": {"dl_type": 0x0800, "nw_proto": 6},
    "udp": {"dl_type": 0x0800, "nw_proto": 17}, "sctp": {"dl_type": 0x0800, "nw_proto": 132},
    "igmp": {"dl_type": 0x0800, "nw_proto": 2},
    "arp": {"dl_type": 0x0806}, "rarp": {"dl_type": 0x8035},
    "ipv6": {"dl_type": 0x86DD}, "tcp6": {"dl_type": 0x86DD, "nw_proto": 6},
    "udp6": {"dl_type": 0x86DD, "nw_proto": 17}, "sctp6": {"dl_type": 0x86DD, "nw_proto": 132},
    "icmp6": {"dl_type": 0x86DD, "nw_proto": 58},
}

TCP_FLAG_BITS = {"fin": 0x001, "syn": 0x002, "rst": 0x004, "psh": 0x008, "ack": 0x010,
                 "urg": 0x020, "ece": 0x040, "cwr": 0x080, "ns": 0x100}
# OpenFlow's reserved port numbers as ovs-ofctl names them (OFPP_*, 16-bit form).
RESERVED_PORTS = {"IN_PORT": 0xfff8, "TABLE": 0xfff9, "NORMAL": 0xfffa, "FLOOD": 0xfffb,
                  "ALL": 0xfffc, "CONTROLLER": 0xfffd, "LOCAL": 0xfffe, "NONE": 0xffff,
                  "UNSET": 0xfff7}
LOCAL_PORT = RESERVED_PORTS["LOCAL"]
UNSET_PORT = RESERVED_PORTS["UNSET"]     # OFPP_UNSET: actset_output of an empty action set
# The packet state holds actset_output as the port XOR OFPP_UNSET, so that a packet without
# the key (every packet until a write_actions: its state is copied at every hop, one key
# more is not free) is UNSET; matches on it are written the same way (view_match).
ACTSET_OUTPUT = "actset_output"


def actset_output_value(port: int) -> int:
    """What the state holds for an action set whose output is ``port``."""
    return port ^ UNSET_PORT
VLAN_CFI = 0x1000                        # the "VLAN header present" bit of vlan_tci

CT_STATE_BITS = {"new": 0x01, "est": 0x02, "rel": 0x04, "rpl": 0x08, "inv": 0x10,
                 "trk": 0x20, "snat": 0x40, "dnat": 0x80}


# ---- register overlays: xregN = reg(2N):reg(2N+1), xxregN = reg(4N)..reg(4N+3), the first
# register in the most significant bits (OVS lib/flow.h flow_get_xreg / flow_get_xxreg).
# The simulator keeps each name's value; after a write to one, ``sync_registers`` brings the
# others that share its bits up to date, so a load to xxreg3 is seen by a match on reg12
# (Antrea's IPv6 Endpoint IP: loaded into xxreg3, matched as reg12..reg15 in dumps).
_REG_OF = {f"reg{i}": i for i in range(16)}
_XREG_OF = {f"xreg{i}": i for i in range(8)}
_XXREG_OF = {f"xxreg{i}": i for i in range(4)}
OVERLAID = frozenset(_REG_OF) | frozenset(_XREG_OF) | frozenset(_XXREG_OF)
_M32, _M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


def sync_registers(state: dict, name: str) -> None:
    """After ``name`` (a reg, xreg or xxreg) was written in ``state``: its overlays."""
    if name in _REG_OF:
        i = _REG_OF[name]
        regs = [state.get(f"reg{j}", 0) for j in range(i & ~3, (i & ~3) + 4)]
        x = i // 2
        state[f"xreg{x}"] = (state.get(f"reg{2 * x}", 0) << 32) | state.get(f"reg{2 * x + 1}", 0)
        state[f"xxreg{i // 4}"] = (regs[0] << 96) | (regs[1] << 64) | (regs[2] << 32) | regs[3]
        return
    if name in _XREG_OF:
        x = _XREG_OF[name]
        value = state.get(name, 0)
        state[f"reg{2 * x}"], state[f"reg{2 * x + 1}"] = (value >> 32) & _M32, value & _M32
        base = (x // 2) * 2
        state[f"xxreg{x // 2}"] = ((state.get(f"xreg{base}", 0) << 64)
                                  | state.get(f"xreg{base + 1}", 0))
        return
    if name in _XXREG_OF:
        n = _XXREG_OF[name]
        value = state.get(name, 0)
        for k in range(4):
            state[f"reg{4 * n + k}"] = (value >> (96 - 32 * k)) & _M32
        state[f"xreg{2 * n}"], state[f"xreg{2 * n + 1}"] = (value >> 64) & _M64, value & _M64


def lookup(name: str) -> Field | None:
    """The field a name refers to, or None when the name is not a field we know."""
    f = FIELDS.get(name)
    if f is None:
        alias = _ALIASES.get(name)
        f = FIELDS.get(alias) if alias else None
    return f


def full_mask(field: Field) -> int:
    return (1 << field.bits) - 1


def parse_int(text: str) -> int:
    return int(text, 0)


def parse_mac(text: str) -> int:
    if len(text) == 17 and text[2::3] == ":::::":   # the usual zero-padded form: fast path
        try:
            return int(text.replace(":", ""), 16)
        except ValueError:
            raise ValueError(f"bad MAC address {text!r}") from None
    parts = text.split(":")
    if len(parts) != 6 or not all(1 <= len(p) <= 2 for p in parts):
        raise ValueError(f"bad MAC address {text!r}")
    try:
        return int("".join(p.zfill(2) for p in parts), 16)
    except ValueError:
        raise ValueError(f"bad MAC address {text!r}") from None


def parse_ipv4(text: str) -> int:
    parts = text.split(".")
    if len(parts) == 4 and all(p.isdigit() and len(p) <= 3 for p in parts):
        a, b, c, d = (int(p) for p in parts)
        if a < 256 and b < 256 and c < 256 and d < 256:
            return (a << 24) | (b << 16) | (c << 8) | d
    raise ValueError(f"bad IPv4 address {text!r}")


def parse_value(field: Field, text: str) -> tuple[int, int]:
    """Read ``value[/mask]`` as written after ``field=`` in a match; returns (value, mask).
    A view's value and mask are the view's own (``view_match`` turns them into pieces)."""
    if field.kind == "ct_state":
        return parse_ct_state(text)
    if field.name == "tcp_flags" and (text[:1] in "+-[" or text[:1].isalpha()):
        return _parse_tcp_flags(text)
    if field.name in ("in_port", "in_port_oxm", "actset_output") \
            and text.upper() in RESERVED_PORTS:
        return RESERVED_PORTS[text.upper()], full_mask(field)
    if field.view is not None and field.view not in ("xreg", "xxreg"):
        return _parse_view_value(field, text)
    value_text, _, mask_text = text.partition("/")
    if field.kind == "ipv4":
        if mask_text:
            if "." in mask_text:
                mask = parse_ipv4(mask_text)
            else:
                plen = int(mask_text)
                mask = ((1 << 32) - 1) ^ ((1 << (32 - plen)) - 1)
        else:
            mask = full_mask(field)
        return parse_ipv4(value_text) & mask, mask
    if field.kind == "ipv6":
        if mask_text:
            if ":" in mask_text:
                mask = int(ipaddress.IPv6Address(mask_text))
            else:
                plen = int(mask_text)
                mask = ((1 << 128) - 1) ^ ((1 << (128 - plen)) - 1)
        else:
            mask = full_mask(field)
        return int(ipaddress.IPv6Address(value_text)) & mask, mask
    if field.kind == "mac":
        mask = parse_mac(mask_text) if mask_text else full_mask(field)
        return parse_mac(value_text) & mask, mask
    mask = parse_int(mask_text) if mask_text else full_mask(field)
    return parse_int(value_text) & mask, mask


def parse_flag_names(text: str, bits: dict, what: str) -> int:
    """``trk|rpl`` / ``syn|psh`` (exact flags, as ofproto/trace and Final flow print them)."""
    value = 0
    for name in text.split("|"):
        if name not in bits:
            raise ValueError(f"bad {what} flag {name!r}")
        value |= bits[name]
    return value


def parse_ct_state(text: str) -> tuple[int, int]:
    """``-new+trk`` or ``+est+rpl`` or ``0x21/0x21`` or ``trk|rpl`` -> (value, mask)."""
    if text[:1].isalpha():
        return parse_flag_names(text, CT_STATE_BITS, "ct_state"), 0xFF
    if text[:1] not in "+-":
        value_text, _, mask_text = text.partition("/")
        mask = parse_int(mask_text) if mask_text else 0xFF
        return parse_int(value_text) & mask, mask
    value = mask = 0
    i = 0
    while i < len(text):
        sign = text[i]
        j = i + 1
        while j < len(text) and text[j] not in "+-":
            j += 1
        flag = text[i + 1:j]
        if sign not in "+-" or flag not in CT_STATE_BITS:
            raise ValueError(f"bad ct_state flag {text[i:j]!r}")
        bit = CT_STATE_BITS[flag]
        mask |= bit
        if sign == "+":
            value |= bit
        i = j
    return value, mask


_TCP_FLAG = re.compile(r"[a-z]+|\[([0-9a-fA-F]+)\]")


def _tcp_flag_bit(name: str) -> int:
    """One tcp_flags flag: a name, or a bit without one written ``[200]`` (its value in hex,
    as OVS prints the bits 0x200, 0x400, 0x800: lib/packets.c packet_tcp_flag_to_string)."""
    m = _TCP_FLAG.fullmatch(name)
    if m and m.group(1) is not None:
        bit = int(m.group(1), 16)
        if bit and not bit & (bit - 1) and bit <= 0x800:
            return bit
    elif m and name in TCP_FLAG_BITS:
        return TCP_FLAG_BITS[name]
    raise ValueError(f"bad tcp_flags flag {name!r}")


def _parse_tcp_flags(text: str) -> tuple[int, int]:
    """``syn|ack|[200]`` (exact) or ``+syn-ack+[800]`` (those bits only), as ovs-ofctl and
    ofproto/trace write tcp_flags."""
    if text[:1] not in "+-":
        value = 0
        for name in text.split("|"):
            value |= _tcp_flag_bit(name)
        return value, full_mask(FIELDS["tcp_flags"])
    value = mask = 0
    for sign, name in re.findall(r"([+-])([a-z]+|\[[0-9a-fA-F]+\])", text):
        bit = _tcp_flag_bit(name)
        mask |= bit
        value |= bit if sign == "+" else 0
    if re.sub(r"[+-](?:[a-z]+|\[[0-9a-fA-F]+\])", "", text):
        raise ValueError(f"bad tcp_flags {text!r}")
    return value, mask


# ---- views: fields that live in other fields ----------------------------------------------

_PCP_SHIFT = 13


def _parse_view_value(field: Field, text: str) -> tuple[int, int]:
    value_text, slash, mask_text = text.partition("/")
    value = parse_int(value_text)
    if field.view == "vlan_vid":          # the VID and the "present" bit, maskable
        mask = parse_int(mask_text) if slash else VLAN_CFI | 0xFFF
        if value & ~(VLAN_CFI | 0xFFF):
            raise ValueError(f"{value:#x} is not a vlan_vid (at most 0x1fff)")
        return value, mask
    if slash:
        raise ValueError(f"{field.name} takes no mask")
    if field.view == "dl_vlan":
        if value != 0xFFFF and value > 0xFFF:     # 0xffff: no VLAN header (OFP10_VLAN_NONE)
            raise ValueError(f"{value:#x} is not a VLAN id")
        return value, 0xFFF
    if field.view == "vlan_pcp":
        if value > 7:
            raise ValueError(f"{value} is not a VLAN priority (0-7)")
        return value, 7
    if field.view == "port11":        # an OpenFlow 1.1 port number: reserved ports from 0xffffff00
        if value >= 0xFFFFFF00:
            value -= 0xFFFF0000
        elif value > 0xFFFF:
            raise ValueError(f"{value:#x} is not an OpenFlow port")
        return value, full_mask(field)
    raise ValueError(f"{field.name} cannot be matched")


def _reg_pieces(field: Field) -> list[tuple[Field, int]]:
    """(register, its lowest bit in the view) of an xreg/xxreg, most significant first."""
    n = field.bits // 32
    first = int(field.name.lstrip("x").removeprefix("reg")) * n
    return [(FIELDS[f"reg{first + i}"], 32 * (n - 1 - i)) for i in range(n)]


def view_match(field: Field, value: int, mask: int) -> list[tuple[Field, int, int]]:
    """A match on ``field`` as (field the packet holds, value, mask) pieces: one per register
    of an xreg/xxreg (a piece with no bits to match is left out), vlan_tci for the VLAN
    views (lib/match.c match_set_vlan_vid_masked, match_set_dl_vlan, match_set_dl_vlan_pcp)."""
    view = field.view
    if view is None:
        return [(field, value & mask, mask)]
    if view == "port11":     # the packet holds the 16-bit port (actset_output: XOR UNSET)
        if field.name == ACTSET_OUTPUT:
            return [(field, actset_output_value(value), full_mask(field))]
        return [(FIELDS["in_port"], value, full_mask(FIELDS["in_port"]))]
    if view in ("xreg", "xxreg"):
        out = []
        for reg, low in _reg_pieces(field):
            m = (mask >> low) & 0xFFFFFFFF
            if m:
                out.append((reg, (value >> low) & m, m))
        return out
    tci = FIELDS["vlan_tci"]
    if view == "vlan_vid":
        m = mask & (VLAN_CFI | 0xFFF)
        return [(tci, value & m, m)]
    if view == "dl_vlan":
        return [(tci, 0 if value == 0xFFFF else VLAN_CFI | (value & 0xFFF), VLAN_CFI | 0xFFF)]
    # vlan_pcp: the priority bits, and the header present
    return [(tci, ((value & 7) << _PCP_SHIFT) | VLAN_CFI, 0xE000 | VLAN_CFI)]


def view_read(state: dict, field: Field) -> int:
    """The value of a view field (lib/meta-flow.c mf_get_value)."""
    view = field.view
    if view in ("xreg", "xxreg"):
        value = 0
        for reg, low in _reg_pieces(field):
            value |= state.get(reg.name, 0) << low
        return value
    if view == "port11":
        port = (state.get(ACTSET_OUTPUT, 0) ^ UNSET_PORT if field.name == ACTSET_OUTPUT
                else state.get("in_port", 0))
        return port + 0xFFFF0000 if port >= 0xFF00 else port
    tci = state.get("vlan_tci", 0)
    if view == "vlan_vid":
        return tci & (VLAN_CFI | 0xFFF)
    if view == "dl_vlan":
        return tci & 0xFFF
    return (tci >> _PCP_SHIFT) & 7


def view_write(state: dict, field: Field, value: int, mask: int) -> None:
    """Write ``value`` under ``mask`` (in the view's bits) into a view field, as
    mf_set_flow_value_masked does: read the view, merge, set the whole view (setting a VLAN
    id or priority makes the header present: lib/flow.c flow_set_dl_vlan, flow_set_vlan_pcp;
    vlan_vid carries the present bit itself: flow_set_vlan_vid)."""
    view = field.view
    if view in ("xreg", "xxreg"):
        for reg, low in _reg_pieces(field):
            m = (mask >> low) & 0xFFFFFFFF
            if m:
                state[reg.name] = (state.get(reg.name, 0) & ~m) | ((value >> low) & m)
        return
    if view == "port11":
        raise ValueError(f"{field.name} is read-only here")
    new = (view_read(state, field) & ~mask) | (value & mask)
    tci = state.get("vlan_tci", 0)
    if view == "vlan_vid":
        state["vlan_tci"] = (tci & ~(VLAN_CFI | 0xFFF)) | (new & (VLAN_CFI | 0xFFF))
    elif view == "dl_vlan":
        state["vlan_tci"] = (tci & ~0xFFF) | VLAN_CFI | (new & 0xFFF)
    else:
        state["vlan_tci"] = (tci & ~0xE000) | VLAN_CFI | ((new & 7) << _PCP_SHIFT)


def format_ct_state(value: int, mask: int | None = None) -> str:
    """ct_state bits as ovs-ofctl prints them: ``+new+trk`` (or ``-new+trk`` with a mask)."""
    out = []
    for name, bit in CT_STATE_BITS.items():
        if mask is None:
            if value & bit:
                out.append("+" + name)
        elif mask & bit:
            out.append(("+" if value & bit else "-") + name)
    return "".join(out) or "0"


def format_value(field: Field, value: int) -> str:
    if field.kind == "ipv4":
        return str(ipaddress.IPv4Address(value & 0xFFFFFFFF))
    if field.kind == "mac":
        raw = f"{value:012x}"
        return ":".join(raw[i:i + 2] for i in range(0, 12, 2))
    if field.kind == "ipv6":
        return str(ipaddress.IPv6Address(value))
    if field.kind == "ct_state":
        return format_ct_state(value)
    return hex(value)


def parse_value_for_field(field: Field, text: str) -> int:
    """A value as written in set_field/load sources: int for ints, dotted for IPs, MAC syntax."""
    if field.kind == "ipv4" and "." in text:
        return parse_ipv4(text)
    if field.kind == "mac" and ":" in text:
        return parse_mac(text)
    if field.kind == "ipv6" and ":" in text:
        return int(ipaddress.IPv6Address(text))
    return parse_int(text)
