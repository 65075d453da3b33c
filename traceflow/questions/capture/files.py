"""Capture files read frame by frame: pcap (both byte orders, micro- and nanosecond) and
pcapng (sections, interfaces with their names and timestamp resolutions, enhanced, simple and
obsolete packet blocks, the direction flag), with every cut-off or corrupt place named.

The container is read here rather than by scapy's readers because they end quietly at a
truncated record (``RawPcapReader._read_packet`` returns EOF on a short header or body); a
capture cut off mid-frame must be an error naming the frame. Frames are decoded
(``frames.decode``) only when chosen.

``--filter`` is a BPF expression compiled and matched by libpcap itself (``pcap_compile`` on
a dead handle of the frame's link type, ``pcap_offline_filter``), so it selects exactly what
``tcpdump -r FILE EXPR`` would.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from traceflow.questions.capture.frames import CaptureError, Frame, decode

PCAP_MAGICS = {b"\xa1\xb2\xc3\xd4": (">", 1e-6), b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
               b"\xa1\xb2\x3c\x4d": (">", 1e-9), b"\x4d\x3c\xb2\xa1": ("<", 1e-9)}
PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
MAX_FRAME = 256 * 1024 * 1024      # a record claiming more is a corrupt file, not a frame
# pcapng block types (draft-ietf-opsawg-pcapng section 4)
SHB, IDB, PB, SPB, EPB = 0x0A0D0D0A, 1, 2, 3, 6
# epb_flags bits 0-1: 01 inbound, 10 outbound (section 4.3.1)
_EPB_DIRECTION = {1: "in", 2: "out"}


@dataclass(frozen=True)
class RawFrame:
    number: int
    linktype: int
    data: bytes
    wire_length: int
    interface: str | None = None
    direction: str | None = None
    time: float | None = None


class CaptureFile:
    """``CaptureFile(path)``: its frames (``frames()``), one decoded (``frame(n)``), those a
    BPF filter matches (``matching(expr)``)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.name = str(path)
        try:
            with open(self.path, "rb") as f:
                self.magic = f.read(4)
        except OSError as err:
            raise CaptureError(f"cannot read the capture: {err.strerror or err}", self.name) \
                from None
        if self.magic != PCAPNG_SHB and self.magic not in PCAP_MAGICS:
            what = "empty" if not self.magic else f"magic {self.magic.hex()}"
            raise CaptureError(f"not a pcap or pcapng capture ({what}): write one with "
                               "`tcpdump -w FILE` (or give the text with --tcpdump)", self.name)

    def error(self, reason: str, frame: int | None = None) -> CaptureError:
        return CaptureError(reason, self.name, frame)

    def frames(self) -> Iterator[RawFrame]:
        with open(self.path, "rb") as f:
            if self.magic == PCAPNG_SHB:
                yield from self._pcapng(f)
            else:
                yield from self._pcap(f)

    def raw(self, number: int) -> RawFrame:
        count = 0
        for raw in self.frames():
            count = raw.number
            if raw.number == number:
                return raw
        raise CaptureError(f"there is no frame {number}: the capture holds {count} frame"
                           f"{'' if count == 1 else 's'}", self.name, number)

    def frame(self, number: int) -> Frame:
        return self.decode(self.raw(number))

    def decode(self, raw: RawFrame) -> Frame:
        return decode(raw.data, raw.linktype, self.name, raw.number, raw.interface,
                      raw.direction, raw.time)

    def matching(self, expression: str) -> Iterator[RawFrame]:
        """The frames ``expression`` (tcpdump's filter language) matches, as libpcap says."""
        with BpfMatcher(expression) as match:
            for raw in self.frames():
                if match(raw):
                    yield raw

    # ---- pcap ---------------------------------------------------------------------------------
    def _pcap(self, f) -> Iterator[RawFrame]:
        endian, unit = PCAP_MAGICS[self.magic]
        head = f.read(24)
        if len(head) < 24:
            raise self.error(f"truncated: the pcap file header is {len(head)} of 24 bytes")
        _magic, _major, _minor, _zone, _sig, _snap, network = struct.unpack(endian + "4sHHiIII",
                                                                            head)
        linktype = network & 0xFFFF        # the upper bits carry the FCS length, if any
        number, offset = 0, 24
        while True:
            rec = f.read(16)
            if not rec:
                return
            number += 1
            if len(rec) < 16:
                raise self.error(f"truncated: the record header is cut off after {len(rec)} of "
                                 f"16 bytes (file offset {offset})", number)
            sec, frac, incl, orig = struct.unpack(endian + "IIII", rec)
            if incl > MAX_FRAME:
                raise self.error(f"corrupt: the record says {incl} captured bytes (file offset "
                                 f"{offset})", number)
            data = f.read(incl)
            if len(data) < incl:
                raise self.error(f"truncated: the record says {incl} captured bytes, the file "
                                 f"ends after {len(data)}", number)
            offset += 16 + incl
            yield RawFrame(number, linktype, data, orig, None, None, sec + frac * unit)

    # ---- pcapng -------------------------------------------------------------------------------
    def _pcapng(self, f) -> Iterator[RawFrame]:
        number, offset, endian = 0, 0, "<"
        interfaces: list = []               # per section: (linktype, name, tsresol)
        while True:
            head = f.read(8)
            if not head:
                return
            if len(head) < 8:
                raise self.error(f"truncated: a block header is cut off after {len(head)} bytes "
                                 f"(file offset {offset})", number + 1)
            if head[:4] == PCAPNG_SHB:
                bom = f.read(4)
                if bom == b"\x4d\x3c\x2b\x1a":
                    endian = "<"
                elif bom == b"\x1a\x2b\x3c\x4d":
                    endian = ">"
                else:
                    raise self.error(f"corrupt: a section header without a byte-order mark "
                                     f"(file offset {offset})")
                btype, length = SHB, struct.unpack(endian + "I", head[4:8])[0]
                body = bom + f.read(max(length - 16, 0))
                interfaces = []
            else:
                btype, length = struct.unpack(endian + "II", head)
                body = f.read(max(length - 12, 0))
            if length < 12 or length % 4 or length > MAX_FRAME:
                raise self.error(f"corrupt: block length {length} at file offset {offset}",
                                 number + 1)
            trailer = f.read(4)
            want = length - 12
            if len(body) < want or len(trailer) < 4:
                raise self.error(f"truncated: a block of {length} bytes at file offset {offset} "
                                 "is cut off", number + 1)
            if struct.unpack(endian + "I", trailer)[0] != length:
                raise self.error(f"corrupt: the block at file offset {offset} ends with another "
                                 "length than it starts with", number + 1)
            offset += length
            if btype == IDB:
                interfaces.append(self._idb(body, endian, offset))
            elif btype in (EPB, SPB, PB):
                number += 1
                yield self._packet(btype, body, endian, interfaces, number)

    def _idb(self, body: bytes, endian: str, offset: int) -> tuple:
        if len(body) < 8:
            raise self.error(f"corrupt: an interface description block at file offset {offset} "
                             "is too short")
        linktype = struct.unpack(endian + "H", body[0:2])[0]
        opts = _options(body[8:], endian)
        name = opts.get(2)
        resol = opts.get(9)
        tsresol = 1e-6
        if resol:
            v = resol[0]
            tsresol = 2.0 ** -(v & 0x7F) if v & 0x80 else 10.0 ** -v
        return (linktype, name.decode("utf-8", "replace") if name else None, tsresol)

    def _packet(self, btype: int, body: bytes, endian: str, interfaces: list,
                number: int) -> RawFrame:
        if btype == SPB:                     # simple packet block: interface 0, no timestamp
            if len(body) < 4:
                raise self.error("corrupt: a simple packet block is too short", number)
            iface, orig = 0, struct.unpack(endian + "I", body[0:4])[0]
            data, opts, stamp = body[4:4 + orig], {}, None
        else:
            fixed = 20
            if len(body) < fixed:
                raise self.error("corrupt: a packet block is too short", number)
            if btype == EPB:
                iface, high, low, cap, orig = struct.unpack(endian + "IIIII", body[0:20])
            else:                            # obsolete packet block (pcapng 1.0)
                iface, _drops, high, low, cap, orig = struct.unpack(endian + "HHIIII",
                                                                    body[0:20])
            if fixed + cap > len(body):
                raise self.error(f"truncated: the packet block says {cap} captured bytes, it "
                                 f"holds {len(body) - fixed}", number)
            data = body[fixed:fixed + cap]
            opts = _options(body[fixed + cap + (-cap % 4):], endian)
            stamp = (high << 32) | low
        if iface >= len(interfaces):
            raise self.error(f"corrupt: the frame names interface {iface}, the section "
                             f"describes {len(interfaces)}", number)
        linktype, name, tsresol = interfaces[iface]
        flags = opts.get(2)
        direction = None
        if flags and len(flags) >= 4:
            direction = _EPB_DIRECTION.get(struct.unpack(endian + "I", flags[:4])[0] & 3)
        return RawFrame(number, linktype, data, orig, name, direction,
                        stamp * tsresol if stamp is not None else None)


def _options(raw: bytes, endian: str) -> dict:
    """pcapng options: code -> value (the first of each code)."""
    out: dict = {}
    at = 0
    while at + 4 <= len(raw):
        code, length = struct.unpack(endian + "HH", raw[at:at + 4])
        if code == 0:
            break
        out.setdefault(code, raw[at + 4:at + 4 + length])
        at += 4 + length + (-length % 4)
    return out


# ---- BPF filters: libpcap's compiler and matcher -----------------------------------------------

class BpfMatcher:
    """``with BpfMatcher("tcp port 80") as match: match(raw_frame)``: libpcap decides."""

    def __init__(self, expression: str):
        import ctypes
        import ctypes.util
        self.expression = expression
        name = ctypes.util.find_library("pcap")
        if name is None:
            raise CaptureError("--filter needs libpcap, the library tcpdump uses (apt install "
                               "tcpdump); --frame N picks a frame without it", "--filter")
        self.ct = ctypes
        self.lib = ctypes.CDLL(name)
        self.lib.pcap_open_dead.restype = ctypes.c_void_p
        self.lib.pcap_open_dead.argtypes = [ctypes.c_int, ctypes.c_int]
        self.lib.pcap_geterr.restype = ctypes.c_char_p
        self.lib.pcap_geterr.argtypes = [ctypes.c_void_p]
        self.lib.pcap_compile.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
                                          ctypes.c_int, ctypes.c_uint32]
        self.lib.pcap_offline_filter.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                 ctypes.c_char_p]
        self.lib.pcap_freecode.argtypes = [ctypes.c_void_p]
        self.lib.pcap_close.argtypes = [ctypes.c_void_p]
        self.programs: dict = {}            # linktype -> (handle, bpf_program)

        class Header(ctypes.Structure):      # struct pcap_pkthdr
            _fields_ = [("ts_sec", ctypes.c_long), ("ts_usec", ctypes.c_long),
                        ("caplen", ctypes.c_uint32), ("len", ctypes.c_uint32)]
        self.header = Header()
        self.header_ref = ctypes.byref(self.header)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for handle, program in self.programs.values():
            self.lib.pcap_freecode(self.ct.byref(program))
            self.lib.pcap_close(handle)
        self.programs = {}

    def _program(self, linktype: int):
        if linktype not in self.programs:
            ct = self.ct

            class Program(ct.Structure):
                _fields_ = [("bf_len", ct.c_uint), ("bf_insns", ct.c_void_p)]
            handle = self.lib.pcap_open_dead(linktype, 262144)
            program = Program()
            # PCAP_NETMASK_UNKNOWN: broadcast tests are refused rather than guessed
            if self.lib.pcap_compile(handle, ct.byref(program), self.expression.encode(), 1,
                                     0xFFFFFFFF) != 0:
                why = self.lib.pcap_geterr(handle).decode("utf-8", "replace")
                self.lib.pcap_close(handle)
                raise CaptureError(f"{self.expression!r} is not a filter libpcap accepts: {why}",
                                   "--filter")
            self.programs[linktype] = (handle, program)
        return self.programs[linktype][1]

    def __call__(self, raw: RawFrame) -> bool:
        program = self._program(raw.linktype)
        self.header.caplen, self.header.len = len(raw.data), raw.wire_length
        return bool(self.lib.pcap_offline_filter(self.ct.byref(program), self.header_ref,
                                                 raw.data))
