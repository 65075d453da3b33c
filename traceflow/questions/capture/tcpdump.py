"""The text tcpdump prints for one packet, as a Frame: ``-n`` (``IP a.p > b.q: ...``), ``-e``
(the MACs, EtherType and VLAN tags), ``-v`` (the IP header in parentheses, the addresses on
the next line), ``-i any`` (the interface and In/Out in front; with ``-e`` only the sender's
MAC), timestamps in any of tcpdump's forms, Geneve (one line) and VXLAN (the inner packet on
the next line) with the outer header.

What the line does not show is not invented: without ``-v`` there is no TTL (the frame's is
None, 64 assumed and said), without ``-e`` no MACs. The transport protocol is read from the
line: ``Flags [...]`` is TCP, ``UDP, length`` UDP, ``sctp`` SCTP, ``-v``'s ``proto``; a DNS
decode on port 53 is UDP (said); anything else is refused with what to capture instead.
The formats follow tcpdump 4.99's printers (print-ether.c, print-ip.c, print-tcp.c,
print-udp.c, print-geneve.c, print-vxlan.c, print-sll.c).
"""

from __future__ import annotations

import re

from traceflow.questions.capture.frames import (ETH_ARP, ETH_IPV4, ETH_IPV6, ETHERTYPE_NAMES,
                                                GENEVE_PORTS, TEB, VLAN_TYPES, VXLAN_PORTS,
                                                CaptureError, Frame, Link, Network, Outer,
                                                Transport)

WHERE = "--tcpdump"
_TIME = re.compile(r"(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:\.\d+)?\s+|\d{9,}\.\d+\s+")
_ANY = re.compile(r"(?P<iface>[\w.@:-]+)\s+(?P<dir>In|Out|B|M|P)\s+")
_IFINDEX = re.compile(r"ifindex \d+\s+")
_MAC = r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}"
_ETHER = re.compile(rf"(?P<src>{_MAC}) > (?P<dst>{_MAC}), ethertype (?P<name>[^(,]+?) "
                    r"\(0x(?P<type>[0-9a-fA-F]{4})\), length \d+: ")
_COOKED = re.compile(rf"(?P<src>{_MAC}) ethertype (?P<name>[^(,]+?) "
                     r"\(0x(?P<type>[0-9a-fA-F]{4})\), length \d+: ")
_VLAN = re.compile(r"vlan (?P<id>\d+), p \d+,(?: DEI,)? ethertype (?P<name>[^(,]+?)"
                   r"(?: \(0x(?P<type>[0-9a-fA-F]{4})\))?, ")
_WORD = re.compile(r"(?P<word>IP6|IP|ARP|RARP|LLDP|STP|LLC|MPLS|PPPoE\S*)\b,?\s*")
_IPV4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_ADDRS = re.compile(rf"(?P<src>{_IPV4})(?:\.(?P<sport>\w+))? > (?P<dst>{_IPV4})"
                    r"(?:\.(?P<dport>\w+))?: ")
_NAMES = re.compile(r"(?P<src>\S+) > (?P<dst>\S+?):? ")
_TCP_FLAGS = re.compile(r"^Flags \[(?P<flags>[^\]]*)\]")
_FLAG_CHARS = {"S": "syn", "F": "fin", "P": "psh", "R": "rst", "U": "urg", "W": "cwr",
               "E": "ece", ".": "ack"}
# print-geneve.c: the protocol only with -e or -v; the inner packet after ": " (or, with -v,
# on the next line)
_GENEVE = re.compile(r"^Geneve, Flags \[[^\]]*\], vni 0x(?P<vni>[0-9a-fA-F]+)"
                     r"(?:, proto (?P<name>\S+) \(0x(?P<proto>[0-9a-fA-F]{4})\))?"
                     r"(?:, options \[.*?\])?(?::\s*|\s+)")
_VXLAN = re.compile(r"^VXLAN, flags \[[^\]]*\] \(0x[0-9a-fA-F]+\), vni (?P<vni>\d+)\s+")
_ETHER_NAMES = {"IPv4": ETH_IPV4, "IPv6": ETH_IPV6, "ARP": ETH_ARP, "802.1Q": 0x8100,
                "802.1Q-QinQ": 0x88A8}


class _Text:
    """The packet's text, read left to right."""

    def __init__(self, text: str):
        self.original = text
        self.rest = text
        self.time: float | None = None

    def error(self, reason: str) -> CaptureError:
        return CaptureError(reason, WHERE, None, self.original)

    def take(self, pattern: re.Pattern):
        m = pattern.match(self.rest)
        if m:
            self.rest = self.rest[m.end():]
        return m


def parse_tcpdump(text: str) -> Frame:
    """One packet as tcpdump printed it (one line, or two: ``-v``, VXLAN)."""
    lines = [line for line in text.replace("\r", "").split("\n") if line.strip()]
    if not lines:
        raise CaptureError("no tcpdump line given", WHERE)
    packets = [i for i, line in enumerate(lines) if i and _TIME.match(line)]
    if packets:
        raise CaptureError(f"{len(packets) + 1} packets in the text: give one (its line, or "
                           "both lines tcpdump -v prints for it)", WHERE, None, text)
    t = _Text(" ".join(line.strip() for line in lines))
    t.take(_TIME)
    interface = direction = None
    m = t.take(_ANY)
    if m:
        interface, direction = m["iface"], {"In": "in", "Out": "out"}.get(m["dir"], "in")
    t.take(_IFINDEX)
    link, network, transport, outer = _packet(t, inner=False)
    if outer is not None:
        outer_link, outer_net, sport, dport, kind, vni = outer
        outer = Outer(kind, outer_link, outer_net, sport, dport, vni)
    return Frame(WHERE, 1, link, network, transport, outer, interface, direction)


def _packet(t: _Text, inner: bool) -> tuple:
    link, ethertype = _link(t)
    if ethertype != ETH_IPV4:
        if ethertype == ETH_ARP:
            raise t.error("an ARP packet (address resolution, no IP packet to trace)")
        if ethertype == ETH_IPV6:
            raise t.error("an IPv6 packet: IPv6 is not modelled yet (traceflow traces IPv4)")
        name = ETHERTYPE_NAMES.get(ethertype, f"EtherType 0x{ethertype:04x}")
        raise t.error(f"a {name} frame, not IPv4")
    header = _ip_header(t)
    m = t.take(_ADDRS)
    if m is None:
        names = _NAMES.match(t.rest)
        if names:
            raise t.error(f"{names['src']} > {names['dst']} are not IPv4 addresses with numeric "
                          "ports: capture with tcpdump -n (or -nn), which prints them as numbers")
        raise t.error("no 'ADDRESS.PORT > ADDRESS.PORT:' in the text: give the line tcpdump "
                      "-n prints for the packet")
    ttl, proto_number, offset, more = header
    src, dst = m["src"], m["dst"]
    if offset:
        raise t.error(f"a fragment (offset {offset}) without its transport header: the ports "
                      "are in the first fragment")
    if m["sport"] is None or m["dport"] is None:
        if t.rest.startswith("ICMP"):
            raise t.error("an ICMP packet: traceflow traces TCP, UDP and SCTP")
        raise t.error("no ports: a fragment, or a protocol without ports (traceflow traces "
                      "TCP, UDP and SCTP)")
    if not (m["sport"].isdigit() and m["dport"].isdigit()):
        raise t.error(f"ports {m['sport']} and {m['dport']} are names: capture with tcpdump -nn "
                      "(numeric ports)")
    sport, dport = int(m["sport"]), int(m["dport"])
    network = Network(4, src, dst, 0, ttl, 0, more)
    flags = t.take(_TCP_FLAGS)
    if flags is not None:
        return link, _with_proto(network, 6), _tcp(t, sport, dport, flags["flags"]), None
    geneve = t.take(_GENEVE)
    vxlan = None if geneve else t.take(_VXLAN)
    if geneve or vxlan:
        if inner:
            raise t.error("a tunnel inside a tunnel: not read")
        kind = "geneve" if geneve else "vxlan"
        ports = GENEVE_PORTS if geneve else VXLAN_PORTS
        if dport not in ports:
            raise t.error(f"a {kind} header on UDP port {dport}: not a port traceflow reads "
                          f"{kind} on ({', '.join(map(str, ports))})")
        vni = int(geneve["vni"], 16) if geneve else int(vxlan["vni"])
        if geneve and geneve["proto"] and int(geneve["proto"], 16) not in (TEB, ETH_IPV4):
            raise t.error(f"a Geneve packet carrying {geneve['name']}: not read")
        inner_link, inner_net, inner_tr, _ = _packet(t, inner=True)
        outer = (link, _with_proto(network, 17), sport, dport, kind, vni)
        return inner_link, inner_net, inner_tr, outer
    proto = proto_number
    if proto is None:
        if re.match(r"UDP\b", t.rest):
            proto = 17
        elif re.match(r"(?i)sctp\b", t.rest):
            proto = 132
        elif 53 in (sport, dport):
            proto = 17            # a DNS decode: tcpdump names TCP DNS with Flags [...]
        else:
            raise t.error("the transport protocol is not in the text: give the two lines "
                          "tcpdump -v prints (its IP header names the protocol)")
    if proto not in (6, 17, 132):
        raise t.error(f"IP protocol {proto}: traceflow traces TCP, UDP and SCTP")
    return link, _with_proto(network, proto), Transport(proto, sport, dport), None


def _with_proto(network: Network, proto: int) -> Network:
    return Network(network.version, network.src, network.dst, proto, network.ttl,
                   network.fragment_offset, network.more_fragments)


def _link(t: _Text) -> tuple:
    """(Link or None, EtherType): tcpdump -e's addresses and EtherType, VLAN tags included;
    without -e, the protocol word (IP, IP6, ARP ...)."""
    m = t.take(_ETHER) or t.take(_COOKED)
    if m is not None:
        src = m["src"].lower()
        dst = m["dst"].lower() if "dst" in m.groupdict() else None
        ethertype = int(m["type"], 16)
        vlans = []
        while ethertype in VLAN_TYPES:
            v = t.take(_VLAN)
            if v is None:
                raise t.error("a VLAN-tagged frame whose tag tcpdump did not print")
            vlans.append(int(v["id"]))
            ethertype = int(v["type"], 16) if v["type"] else _ETHER_NAMES.get(v["name"], -1)
        return Link(src, dst, tuple(vlans)), ethertype
    w = t.take(_WORD)
    if w is not None:
        word = w["word"]
        if word == "IP":
            return None, ETH_IPV4
        if word == "IP6":
            return None, ETH_IPV6
        if word in ("ARP", "RARP"):
            return None, ETH_ARP
        raise t.error(f"a {word} frame, not IPv4")
    if _ADDRS.match(t.rest) or t.rest.startswith("("):
        return None, ETH_IPV4              # tcpdump -q / an inner packet without -e
    raise t.error("not a line tcpdump prints for a packet (expected 'IP a.p > b.q: ...', or "
                  "'MAC > MAC, ethertype IPv4 ...' with -e)")


def _ip_header(t: _Text) -> tuple:
    """-v's '(tos 0x0, ttl 64, id 1, offset 0, flags [DF], proto TCP (6), length 60)':
    (ttl, protocol number, fragment offset, more fragments); Nones without -v."""
    if not t.rest.startswith("(tos"):
        return None, None, 0, False
    depth, end = 0, None
    for i, ch in enumerate(t.rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            end = i
            break
    if end is None:
        raise t.error("the IP header in parentheses (-v) is not closed")
    inside, t.rest = t.rest[1:end], t.rest[end + 1:].lstrip()
    ttl = re.search(r"\bttl (\d+)", inside)
    proto = re.search(r"\bproto \S+ \((\d+)\)", inside)
    offset = re.search(r"\boffset (\d+)", inside)
    flags = re.search(r"\bflags \[([^\]]*)\]", inside)
    return (int(ttl.group(1)) if ttl else None, int(proto.group(1)) if proto else None,
            int(offset.group(1)) if offset else 0, bool(flags and "+" in flags.group(1)))


def _tcp(t: _Text, sport: int, dport: int, text: str) -> Transport:
    if text == "none":
        return Transport(6, sport, dport, frozenset())
    unknown = [c for c in text if c not in _FLAG_CHARS]
    if unknown:
        raise t.error(f"TCP flags [{text}]: {''.join(unknown)!r} is no flag tcpdump prints")
    return Transport(6, sport, dport, frozenset(_FLAG_CHARS[c] for c in text))
