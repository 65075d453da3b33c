"""The trace as a capture (``-o pcap``): pcapng, one section per path, one packet per hop that
changes it, the hop's number, node, component, table and effect as the packet's comment, the
device it is on as its interface (``NODE:DEVICE``, which `--pcap` reads back as where it was
seen; ``NODE COMPONENT`` where the trace names no device, e.g. inside an OVS bridge).

A packet inside a tunnel (``tun_src``/``tun_dst``) is written with its outer headers: outer
IPv4 and UDP to the tunnel's port (Geneve 6081, or VXLAN 4789 where the tunnel hop says vxlan),
the tunnel header (Geneve: protocol TEB) and the inner Ethernet frame, so Wireshark and
tcpdump decode the encapsulation as on the wire; the outer MACs and UDP source port, which
the trace does not know, are written as 00:00:00:00:00:00 and a hash of the inner flow (the
comment says so). TCP flags are the leg's: SYN on a request, SYN-ACK on a reply, the
captured flags on a captured packet's leg.

The container is written here (draft-ietf-opsawg-pcapng: SHB, IDB with if_name and
if_description, EPB with opt_comment); scapy builds the frames (lazily imported: its layers
alone, ~0.3 s) and is what the tests read the file back with, besides tcpdump.
"""

from __future__ import annotations

import struct
import zlib
from datetime import datetime

from renderers import walk
from traceflow import __version__
from traceflow.model.trace import Trace

BLOCK_SHB, BLOCK_IDB, BLOCK_EPB = 0x0A0D0D0A, 1, 6
LINKTYPE_ETHERNET = 1
TUNNEL_PORTS = {"geneve": 6081, "vxlan": 4789}
UNKNOWN_MAC = "00:00:00:00:00:00"


def render_pcapng(trace: Trace, about=None) -> bytes:
    """The whole trace as pcapng bytes."""
    layers = _Layers()
    base = _base_time(about)
    capture = (trace.query or {}).get("capture") or {}
    interfaces: dict = {}               # name -> its description, in first-use order
    sections = []
    for index, path in enumerate(trace.paths, 1):
        packets, previous = [], None
        leg_of = _legs(path)
        for h in walk.numbered(path, index):
            headers = walk.headers(h.hop.packet)
            if not headers or not headers.get("nw_src"):
                continue
            key = tuple(sorted(headers.items()))
            if key == previous:
                continue              # unchanged: the packet of an earlier hop
            previous = key
            # NODE:DEVICE reads back as where it was seen (--pcap); without a device, a name
            # that names no device
            name = f"{h.hop.node}:{h.hop.device}" if h.hop.device else \
                f"{h.hop.node} {h.hop.component}"
            interfaces.setdefault(name, _describe(h.hop))
            flags = _flags(path.legs[h.leg], leg_of[h.leg], capture)
            frame, note = layers.frame(headers, flags, _tunnel_kind(path, h))
            comment = (f"{h.ref} {h.hop.node} {h.hop.component}"
                       f"{' ' + str(h.hop.table) if h.hop.table is not None else ''}"
                       f"{' (' + h.hop.table_name + ')' if h.hop.table_name else ''}: "
                       f"{h.hop.effect}"
                       + (f" [{h.hop.source.file}:{h.hop.source.line}]" if h.hop.source else "")
                       + (f"; {note}" if note else ""))
            packets.append((name, base + h.number * 1000, frame, comment))
        sections.append((f"traceflow path {index}/{len(trace.paths)}: {path.endpoint or 'none'} "
                         f"({walk.percent(path.weight)}) {walk.outcome_word(path)}; "
                         f"{walk.query_line(trace.query or {})}", packets))
    ids = {name: i for i, name in enumerate(interfaces)}
    out = bytearray()
    for comment, packets in sections:
        out += _shb(comment)
        # interface ids are per section; every section declares every interface of the file
        # in one order, so a reader that keeps one list for the whole file (scapy's
        # RawPcapNgReader does not reset it at a new section) names them alike
        for name, text in interfaces.items():
            out += _idb(name, text)
        for name, micros, frame, text in packets:
            out += _epb(ids[name], micros, frame, text)
    return bytes(out)


def _legs(path) -> list:
    """Per leg: its ordinal among the legs of the same direction run ('request', 'reply',
    then the captured packet's leg after a reply)."""
    out, seen_reply = [], False
    for leg in path.legs:
        if leg.direction == "reply":
            seen_reply = True
            out.append("reply")
        else:
            out.append("captured" if seen_reply else "request")
    return out


def _flags(leg, which: str, capture: dict) -> str:
    if which == "captured" and capture.get("tcp_flags"):
        return capture["tcp_flags"]
    if which == "reply":
        captured_reply = capture.get("direction") == "reply" and capture.get("tcp_flags")
        return captured_reply or "syn,ack"
    return "syn"


def _tunnel_kind(path, h) -> str:
    """The tunnel's kind from the hop that encapsulated (component tunnel, table geneve or
    vxlan), the nearest one before this hop; Geneve when the trace does not say."""
    hops = [x for x in walk.numbered(path, 1)[:h.number]]
    for x in reversed(hops):
        if x.hop.component == "tunnel" and str(x.hop.table) in TUNNEL_PORTS:
            return str(x.hop.table)
        if x.hop.detail == "capture" and str(x.hop.table) in TUNNEL_PORTS:
            return str(x.hop.table)
    return "geneve"


def _describe(hop) -> str:
    place = {"ovs": "OVS bridge", "iptables": "host stack", "nft": "host stack",
             "route": "host stack", "neigh": "host stack", "pod": "pod's interface",
             "tunnel": "tunnel", "underlay": "network between nodes", "bpf": "BPF hook",
             "capture": "where the packet was captured"}.get(hop.component, hop.component)
    return f"{hop.node} {hop.device or ''} ({place})".replace("  ", " ")


def _base_time(about) -> int:
    """Microseconds: the bundle's collected_at (the trace has no time of its own), else 0."""
    text = getattr(about, "collected_at", None)
    if text:
        try:
            return int(datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
                       * 1_000_000)
        except ValueError:
            pass
    return 0


class _Layers:
    """Frames from a hop's headers, with scapy's layers (imported on first use)."""

    def __init__(self):
        from scapy.contrib.geneve import GENEVE
        from scapy.layers.inet import IP, TCP, UDP
        from scapy.layers.l2 import Ether
        from scapy.layers.sctp import SCTP
        from scapy.layers.vxlan import VXLAN
        self.Ether, self.IP, self.TCP, self.UDP, self.SCTP = Ether, IP, TCP, UDP, SCTP
        self.GENEVE, self.VXLAN = GENEVE, VXLAN

    def inner(self, h: dict, flags: str):
        ip = self.IP(src=h["nw_src"], dst=h["nw_dst"], ttl=max(0, min(255, int(h.get("nw_ttl")
                                                                               or 64))))
        proto, sport, dport = h.get("nw_proto"), h.get("tp_src") or 0, h.get("tp_dst") or 0
        if proto == 6:
            letters = "".join({"syn": "S", "ack": "A", "fin": "F", "rst": "R", "psh": "P",
                               "urg": "U", "ece": "E", "cwr": "C"}.get(f, "")
                              for f in flags.split(","))
            l4 = self.TCP(sport=sport, dport=dport, flags=letters or "S", seq=1)
        elif proto == 17:
            l4 = self.UDP(sport=sport, dport=dport)
        elif proto == 132:
            l4 = self.SCTP(sport=sport, dport=dport)
        else:
            ip.proto = proto or 0
            l4 = None
        frame = self.Ether(src=h.get("dl_src") or UNKNOWN_MAC, dst=h.get("dl_dst") or UNKNOWN_MAC)
        return frame / ip / l4 if l4 is not None else frame / ip

    def frame(self, h: dict, flags: str, kind: str) -> tuple[bytes, str | None]:
        inner = self.inner(h, flags)
        if not h.get("tun_src") or not h.get("tun_dst"):
            return bytes(inner), None
        sport = 49152 + zlib.crc32(repr((h.get("nw_src"), h.get("nw_dst"), h.get("tp_src"),
                                         h.get("tp_dst"))).encode()) % 16384
        outer = self.Ether(src=UNKNOWN_MAC, dst=UNKNOWN_MAC) / \
            self.IP(src=h["tun_src"], dst=h["tun_dst"], ttl=64, flags="DF") / \
            self.UDP(sport=sport, dport=TUNNEL_PORTS.get(kind, 6081))
        head = self.VXLAN(vni=0, flags="Instance") if kind == "vxlan" else \
            self.GENEVE(vni=0, proto=0x6558)
        note = (f"outer {kind} {h['tun_src']} -> {h['tun_dst']}; the outer MACs and UDP source "
                "port are not in the trace (written as zeros and a hash of the inner flow)")
        return bytes(outer / head / inner), note


# ---- pcapng blocks (little-endian) -------------------------------------------------------------

def _pad(raw: bytes) -> bytes:
    return raw + b"\x00" * (-len(raw) % 4)


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + _pad(value)


def _options(*options: bytes) -> bytes:
    return b"".join(options) + struct.pack("<HH", 0, 0) if options else b""


def _block(kind: int, body: bytes, options: bytes = b"") -> bytes:
    body = _pad(body) + options
    length = 12 + len(body)
    return struct.pack("<II", kind, length) + body + struct.pack("<I", length)


def _text(value: str) -> bytes:
    return value.encode("utf-8", "replace")


def _shb(comment: str) -> bytes:
    body = struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)
    return _block(BLOCK_SHB, body, _options(_option(1, _text(comment)),
                                            _option(4, _text(f"traceflow {__version__}"))))


def _idb(name: str, description: str) -> bytes:
    body = struct.pack("<HHI", LINKTYPE_ETHERNET, 0, 262144)
    return _block(BLOCK_IDB, body, _options(_option(2, _text(name)),
                                            _option(3, _text(description)),
                                            _option(9, b"\x06")))


def _epb(interface: int, micros: int, frame: bytes, comment: str) -> bytes:
    body = struct.pack("<IIIII", interface, (micros >> 32) & 0xFFFFFFFF, micros & 0xFFFFFFFF,
                       len(frame), len(frame)) + frame
    return _block(BLOCK_EPB, body, _options(_option(1, _text(comment))))
