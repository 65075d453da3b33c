"""One captured frame, typed: its link addressing, network and transport headers, and the
outer header of the tunnel it travelled in; decoded from the frame's bytes.

A frame traceflow cannot use is a ``CaptureError`` naming the file and the frame (Wireshark's
1-based numbering) and why: ARP, a later fragment (no ports), a protocol the walk does not
trace, an encapsulation other than VXLAN/Geneve, a truncated header, IPv6 (not modelled yet).

The network layer is chosen by EtherType (or the version nibble of a raw-IP capture) from
``NETWORK_DECODERS``; IPv6 is one entry there today (a refusal), so adding it means one decoder
returning a ``Network`` with ``version=6`` (hop limit as ``ttl``, next header as ``proto``).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from traceflow.model.errors import InputError
from traceflow.model.packet import PROTO_NAMES, Packet, Tunnel

# link types (https://www.tcpdump.org/linktypes.html)
LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_IPV4 = 1, 101, 228
LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2 = 113, 276
LINKTYPE_NAMES = {0: "NULL (BSD loopback)", 1: "EN10MB (Ethernet)", 101: "RAW (IP)",
                  105: "IEEE802_11 (Wi-Fi)", 113: "LINUX_SLL (Linux cooked)",
                  127: "IEEE802_11_RADIOTAP", 228: "IPV4", 229: "IPV6",
                  276: "LINUX_SLL2 (Linux cooked v2)"}
READ_LINKTYPES = (LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_LINUX_SLL,
                  LINKTYPE_LINUX_SLL2)

ETH_IPV4, ETH_ARP, ETH_IPV6 = 0x0800, 0x0806, 0x86DD
VLAN_TYPES = (0x8100, 0x88A8, 0x9100)          # 802.1Q, 802.1ad (QinQ), the old QinQ value
ETHERTYPE_NAMES = {ETH_ARP: "ARP", 0x8035: "RARP", ETH_IPV6: "IPv6", 0x88CC: "LLDP",
                   0x8847: "MPLS", 0x8848: "MPLS", 0x8863: "PPPoE", 0x8864: "PPPoE",
                   0x88E5: "MACsec", 0x8906: "FCoE"}
TEB = 0x6558                                    # transparent Ethernet bridging (Geneve payload)

# UDP destination ports of the tunnels whose inner packet is traced (the outer header becomes
# the tunnel hop): Geneve (RFC 8926), VXLAN (RFC 7348) and Linux's/Cilium's default 8472
GENEVE_PORTS = (6081,)
VXLAN_PORTS = (4789, 8472)
# IP protocols that carry another packet, refused by name
ENCAPSULATIONS = {4: "IP-in-IP", 41: "IPv6-in-IPv4", 47: "GRE", 50: "ESP (IPsec)",
                  51: "AH (IPsec)", 115: "L2TPv3"}
TRACED_PROTOCOLS = (6, 17, 132)                 # TCP, UDP, SCTP: what the walk traces
TCP_FLAG_BITS = (("fin", 0x01), ("syn", 0x02), ("rst", 0x04), ("psh", 0x08), ("ack", 0x10),
                 ("urg", 0x20), ("ece", 0x40), ("cwr", 0x80))
FLAG_ORDER = ("syn", "ack", "fin", "rst", "psh", "urg", "ece", "cwr")


class CaptureError(InputError):
    """A capture traceflow cannot read, or a frame of it it cannot use: file, frame, reason."""

    def __init__(self, reason: str, file: str | None, frame: int | None = None,
                 text: str | None = None):
        self.frame = frame
        super().__init__(reason, file, None, text)

    def __str__(self) -> str:
        where = self.file or "<capture>"
        if getattr(self, "frame", None) is not None:
            where += f", frame {self.frame}"
        msg = f"{where}: {self.reason}"
        if self.text is not None:
            msg += f"\n    {self.text.rstrip()}"
        return msg


@dataclass(frozen=True)
class Link:
    """Link-layer addressing: Ethernet's two MACs and VLAN tags (outermost first). A Linux
    cooked capture holds only the sender's address; a raw-IP capture none (``None``)."""
    src: str | None
    dst: str | None
    vlans: tuple = ()


@dataclass(frozen=True)
class Network:
    """The IP header's fields a trace uses. ``ttl`` is None when the text did not show it
    (tcpdump without -v)."""
    version: int
    src: str
    dst: str
    proto: int
    ttl: int | None
    fragment_offset: int = 0
    more_fragments: bool = False


@dataclass(frozen=True)
class Transport:
    proto: int
    sport: int | None
    dport: int | None
    flags: frozenset | None = None      # TCP flags by name; None: not shown (or not TCP)

    @property
    def flag_text(self) -> str | None:
        if self.flags is None:
            return None
        return ",".join(f for f in FLAG_ORDER if f in self.flags) or "none"


@dataclass(frozen=True)
class Outer:
    """The tunnel a frame was captured in: outer link, IP and UDP, and the tunnel's VNI."""
    kind: str                          # geneve | vxlan
    link: Link | None
    network: Network
    sport: int | None
    dport: int
    vni: int

    def tunnel(self) -> Tunnel:
        return Tunnel(self.kind, self.network.src, self.network.dst, self.vni, self.dport)

    def text(self) -> str:
        return (f"{self.kind.upper() if self.kind == 'vxlan' else 'Geneve'} "
                f"{self.network.src} -> {self.network.dst} UDP/{self.dport} VNI {self.vni}")


@dataclass(frozen=True)
class Frame:
    file: str                          # the capture file, or "--tcpdump"
    number: int                        # 1-based, as Wireshark and tcpdump -# number them
    link: Link | None
    network: Network
    transport: Transport
    outer: Outer | None = None
    interface: str | None = None       # pcapng if_name, tcpdump -i any's interface
    direction: str | None = None       # "in" | "out": pcapng epb_flags, a cooked capture's
    #                                    packet type, tcpdump -i any's In/Out
    time: float | None = None

    @property
    def ref(self) -> str:
        return "the --tcpdump line" if self.file == "--tcpdump" else \
            f"{self.file} frame {self.number}"

    def error(self, reason: str) -> CaptureError:
        return CaptureError(reason, self.file, None if self.file == "--tcpdump" else self.number)

    @property
    def syn(self) -> bool:
        f = self.transport.flags
        return f is not None and "syn" in f and "ack" not in f

    @property
    def syn_ack(self) -> bool:
        f = self.transport.flags
        return f is not None and {"syn", "ack"} <= f

    def flow(self) -> str:
        n, t = self.network, self.transport
        name = str(PROTO_NAMES.get(n.proto, n.proto)).upper()
        return f"{n.src}:{t.sport} -> {n.dst}:{t.dport} {name}"

    def packet(self) -> Packet:
        """The captured packet as the walk carries it (the inner one of a tunnel frame)."""
        n, t = self.network, self.transport
        p = Packet(nw_src=n.src, nw_dst=n.dst, nw_proto=n.proto,
                   nw_ttl=n.ttl if n.ttl is not None else 64, tp_src=t.sport, tp_dst=t.dport,
                   tcp_flags=t.flag_text if n.proto == 6 else None)
        if self.link is not None:
            p.dl_src = self.link.src or p.dl_src
            p.dl_dst = self.link.dst or p.dl_dst
        return p

    def taken(self) -> list:
        """What the trace takes from this frame, in words (the summary's ``taken:``)."""
        n, t = self.network, self.transport
        out = [f"{self.flow()}"]
        if n.proto == 6:
            out.append(f"TCP flags {t.flag_text.upper()}" if t.flags is not None
                       else "TCP flags not shown (a SYN assumed)")
        out.append(f"TTL {n.ttl}" if n.ttl is not None else "TTL not shown (64 assumed)")
        if self.link is not None and (self.link.src or self.link.dst):
            out.append(f"MACs {self.link.src or '?'} > {self.link.dst or '?'}")
        if self.link is not None and self.link.vlans:
            out.append("VLAN " + ", ".join(str(v) for v in self.link.vlans))
        if n.more_fragments:
            out.append("the first fragment of a fragmented datagram")
        if self.outer is not None:
            out.append(f"outer {self.outer.text()}")
        if self.interface:
            out.append(f"interface {self.interface}")
        if self.direction:
            out.append("received (in)" if self.direction == "in" else "sent (out)")
        return out


# ---- decoding the bytes of one frame ------------------------------------------------------------

class _Bytes:
    """The frame's bytes, every read checked against the captured length."""

    def __init__(self, data: bytes, file: str, number: int):
        self.data, self.file, self.number = data, file, number

    def need(self, offset: int, size: int, what: str) -> bytes:
        if offset + size > len(self.data):
            raise CaptureError(f"truncated: the {what} needs {size} bytes at offset {offset}, "
                               f"the frame holds {len(self.data)} (captured with a short "
                               "snap length? tcpdump -s 0 keeps whole frames)", self.file,
                               self.number)
        return self.data[offset:offset + size]

    def fail(self, reason: str) -> CaptureError:
        return CaptureError(reason, self.file, self.number)


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def decode(data: bytes, linktype: int, file: str, number: int, interface: str | None = None,
           direction: str | None = None, time: float | None = None) -> Frame:
    """The frame ``number`` of ``file`` (link type ``linktype``) as a typed Frame."""
    b = _Bytes(data, file, number)
    if linktype == LINKTYPE_ETHERNET:
        link, ethertype, offset = _ethernet(b, 0)
    elif linktype == LINKTYPE_LINUX_SLL:
        link, ethertype, offset, cooked_dir = _sll(b)
        direction = direction or cooked_dir
    elif linktype == LINKTYPE_LINUX_SLL2:
        link, ethertype, offset, cooked_dir = _sll2(b)
        direction = direction or cooked_dir
    elif linktype in (LINKTYPE_RAW, LINKTYPE_IPV4):
        version = b.need(0, 1, "IP version")[0] >> 4
        link, offset = None, 0
        ethertype = {4: ETH_IPV4, 6: ETH_IPV6}.get(version)
        if ethertype is None:
            raise b.fail(f"a raw-IP frame with IP version {version}: not IPv4")
    else:
        name = LINKTYPE_NAMES.get(linktype, "unknown")
        raise CaptureError(f"link type {linktype} ({name}) is not read: traceflow reads "
                           "Ethernet, Linux cooked (SLL, SLL2) and raw-IP captures", file, number)
    network, transport, outer = _network(b, ethertype, offset, inner=False)
    if outer is not None:            # the frame is a tunnel's: the inner packet is the one traced
        outer_link = link
        link, network, transport = outer[0], outer[1], outer[2]
        outer = Outer(outer[3], outer_link, outer[4], outer[5], outer[6], outer[7])
    return Frame(file, number, link, network, transport, outer, interface, direction, time)


def _ethernet(b: _Bytes, offset: int) -> tuple:
    head = b.need(offset, 14, "Ethernet header")
    dst, src = _mac(head[0:6]), _mac(head[6:12])
    ethertype = struct.unpack("!H", head[12:14])[0]
    offset += 14
    vlans = []
    while ethertype in VLAN_TYPES:
        tag = b.need(offset, 4, "VLAN tag")
        tci, ethertype = struct.unpack("!HH", tag)
        vlans.append(tci & 0x0FFF)
        offset += 4
    return Link(src, dst, tuple(vlans)), ethertype, offset


# Linux cooked captures (tcpdump -i any): the packet type says which way it went
# (include/uapi/linux/if_packet.h: PACKET_HOST 0 ... PACKET_OUTGOING 4)
_COOKED_DIRECTION = {0: "in", 1: "in", 2: "in", 3: "in", 4: "out"}


def _sll(b: _Bytes) -> tuple:
    head = b.need(0, 16, "Linux cooked (SLL) header")
    pkttype, hatype, halen = struct.unpack("!HHH", head[0:6])
    addr = head[6:6 + min(halen, 8)]
    ethertype = struct.unpack("!H", head[14:16])[0]
    src = _mac(addr) if hatype == 1 and halen == 6 else None
    return Link(src, None), ethertype, 16, _COOKED_DIRECTION.get(pkttype)


def _sll2(b: _Bytes) -> tuple:
    head = b.need(0, 20, "Linux cooked v2 (SLL2) header")
    ethertype = struct.unpack("!H", head[0:2])[0]
    hatype = struct.unpack("!H", head[8:10])[0]
    pkttype, halen = head[10], head[11]
    addr = head[12:12 + min(halen, 8)]
    src = _mac(addr) if hatype == 1 and halen == 6 else None
    return Link(src, None), ethertype, 20, _COOKED_DIRECTION.get(pkttype)


def _network(b: _Bytes, ethertype: int, offset: int, inner: bool) -> tuple:
    decoder = NETWORK_DECODERS.get(ethertype)
    if decoder is None:
        name = ETHERTYPE_NAMES.get(ethertype, f"EtherType 0x{ethertype:04x}")
        what = "an ARP frame (address resolution, no IP packet to trace)" \
            if ethertype == ETH_ARP else f"a {name} frame, not IPv4"
        raise b.fail(f"{what}: pick an IPv4 frame (--frame N, or --filter 'ip and tcp')")
    return decoder(b, offset, inner)


def _ipv6(b: _Bytes, offset: int, inner: bool) -> tuple:
    raise b.fail("an IPv6 packet: IPv6 is not modelled yet (traceflow traces IPv4); pick an "
                 "IPv4 frame (--frame N, or --filter ip)")


def _ipv4(b: _Bytes, offset: int, inner: bool) -> tuple:
    head = b.need(offset, 20, "IPv4 header")
    ver_ihl, _tos, total, _ident, frag, ttl, proto = struct.unpack("!BBHHHBB", head[0:10])
    if ver_ihl >> 4 != 4:
        raise b.fail(f"the IPv4 header's version is {ver_ihl >> 4}")
    ihl = (ver_ihl & 0x0F) * 4
    if ihl < 20:
        raise b.fail(f"the IPv4 header length is {ihl} bytes (at least 20)")
    b.need(offset, ihl, "IPv4 header with its options")
    src = str(ipaddress.IPv4Address(head[12:16]))
    dst = str(ipaddress.IPv4Address(head[16:20]))
    frag_offset, more = (frag & 0x1FFF) * 8, bool(frag & 0x2000)
    network = Network(4, src, dst, proto, ttl, frag_offset, more)
    if frag_offset:
        raise b.fail(f"a fragment ({src} -> {dst}, offset {frag_offset}) without its transport "
                     "header: the ports are in the first fragment; pick that one")
    # the payload ends where the IP header says, not at the frame's end (Ethernet padding)
    end = offset + total if total >= ihl else len(b.data)
    transport, outer = _transport(b, network, offset + ihl, min(end, len(b.data)), inner)
    return network, transport, outer


def _transport(b: _Bytes, network: Network, offset: int, end: int, inner: bool) -> tuple:
    proto = network.proto
    name = PROTO_NAMES.get(proto, str(proto)).upper()
    if proto in ENCAPSULATIONS:
        raise b.fail(f"an encapsulated packet ({ENCAPSULATIONS[proto]}, IP protocol {proto}): "
                     "traceflow reads the inner packet of VXLAN and Geneve only")
    if proto == 1:
        raise b.fail(f"an ICMP packet ({network.src} -> {network.dst}): traceflow traces TCP, "
                     "UDP and SCTP")
    if proto not in TRACED_PROTOCOLS:
        raise b.fail(f"IP protocol {proto} ({network.src} -> {network.dst}): traceflow traces "
                     "TCP, UDP and SCTP")
    size = {6: 14, 17: 8, 132: 4}[proto]
    head = b.need(offset, size, f"{name} header")
    sport, dport = struct.unpack("!HH", head[0:4])
    if proto == 6:
        bits = head[13]
        flags = frozenset(n for n, bit in TCP_FLAG_BITS if bits & bit)
        return Transport(6, sport, dport, flags), None
    if proto == 17 and (dport in GENEVE_PORTS or dport in VXLAN_PORTS):
        if inner:
            raise b.fail("a tunnel inside a tunnel: not read")
        return Transport(17, sport, dport), _tunnel(b, network, sport, dport, offset + 8)
    return Transport(proto, sport, dport), None


def _tunnel(b: _Bytes, outer_net: Network, sport: int, dport: int, offset: int) -> tuple:
    """The inner packet of a Geneve (RFC 8926 section 3.4) or VXLAN (RFC 7348 section 5)
    frame: (inner link, network, transport, kind, outer network, sport, dport, vni)."""
    if dport in GENEVE_PORTS:
        head = b.need(offset, 8, "Geneve header")
        opt_len = (head[0] & 0x3F) * 4
        protocol = struct.unpack("!H", head[2:4])[0]
        vni = int.from_bytes(head[4:7], "big")
        start, kind = offset + 8 + opt_len, "geneve"
        b.need(offset, 8 + opt_len, "Geneve options")
        if protocol == TEB:
            link, ethertype, start = _ethernet(b, start)
        elif protocol == ETH_IPV4:
            link, ethertype = None, ETH_IPV4
        else:
            raise b.fail(f"a Geneve frame carrying protocol 0x{protocol:04x}: not read")
    else:
        head = b.need(offset, 8, "VXLAN header")
        if not head[0] & 0x08:
            raise b.fail("a VXLAN header without a valid VNI (the I flag is not set)")
        vni = int.from_bytes(head[4:7], "big")
        kind = "vxlan"
        link, ethertype, start = _ethernet(b, offset + 8)
    network, transport, _ = _network(b, ethertype, start, inner=True)
    return link, network, transport, kind, outer_net, sport, dport, vni


NETWORK_DECODERS = {ETH_IPV4: _ipv4, ETH_IPV6: _ipv6}
