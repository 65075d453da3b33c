"""ipsets looked up as the kernel hashes them (ip_set_hash_gen.h): a big set's entries compiled
once into dicts keyed by their (masked) addresses and ports, by shape (a sequence of element
kinds: an address with its prefix length, a protocol:port); the entries of other forms (port
ranges, interfaces, ``tcpudp``) tested one by one as ``iptables_matches.ipset_contains`` does.
The answer is the one ``ipset_contains`` gives entry by entry (tests/test_scale_lookups.py).
The entry-by-entry test of one entry (``_set_entry_hit``) is here too."""

from __future__ import annotations

import re

from traceflow.engines.netfilter.iptables_values import _address, _in_network, _network
from traceflow.model.packet import PROTO_NUMBERS, Packet

_SET_PORT = re.compile(r"^(?:(?P<proto>[a-z]+):)?(?P<port>\d+)(?:-(?P<hi>\d+))?$")

_BYTE = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_QUAD = re.compile(rf"{_BYTE}\.{_BYTE}\.{_BYTE}\.{_BYTE}(?:/(3[0-2]|[12]?[0-9]))?")
SLOW = object()                # a packet the hashed set cannot decide alone
_HASHED: dict = {}              # (id(members), flags) -> (members, len, _HashedSet)


def hashed(members: list[str], flags: tuple[str, ...]) -> "_HashedSet":
    key = (id(members), flags)
    got = _HASHED.get(key)
    if got is None or got[0] is not members or got[1] != len(members):
        if len(_HASHED) > 256:
            _HASHED.clear()
        got = _HASHED[key] = (members, len(members), _HashedSet(members, flags))
    return got[2]


def _quad_bits(element: str) -> int:
    """``_set_entry_bits`` of one element (a prefix's length; 0 for a port)."""
    quad = _QUAD.fullmatch(element)
    if quad is not None:
        return int(quad[5]) if quad[5] is not None else 32
    try:
        return _network(element).prefixlen
    except ValueError:
        return 0


class _HashedSet:
    """A set's entries by shape: for each sequence of element kinds (an address with its
    prefix length, a protocol:port), a dict from the entry's values to (prefix bits,
    nomatch) entries; entries of other forms in ``rest``, tested one by one."""

    def __init__(self, members: list[str], flags: tuple[str, ...]):
        self.flags = flags
        self.shapes: dict = {}          # shape -> {key: [(bits, nomatch)]}
        self.rest: list[str] = []
        for member in members:
            words = member.split()
            if not words:
                continue
            shaped = self._shape(words[0])
            if shaped is None:
                self.rest.append(member)
                continue
            shape, key, bits = shaped
            self.shapes.setdefault(shape, {}).setdefault(key, []).append(
                (bits, "nomatch" in words[1:]))

    def _shape(self, entry: str):
        shape, key = [], []
        elements = entry.split(",")
        bits = sum(_quad_bits(e) for e in elements[len(self.flags):])   # as _set_entry_bits
        for element, flag in zip(elements, self.flags):
            quad = _QUAD.fullmatch(element)
            if quad is not None:      # a dotted IPv4 address or network: read without ipaddress
                length = int(quad[5]) if quad[5] is not None else 32
                value = (int(quad[1]) << 24) | (int(quad[2]) << 16) | (int(quad[3]) << 8) \
                    | int(quad[4])
                if length > 32:
                    return None
                shape.append(("net", flag, 4, length))
                key.append(value >> (32 - length) << (32 - length) if length else 0)
                bits += length
                continue
            try:
                net = _network(element)
            except ValueError:
                port = _SET_PORT.match(element)
                if not port or port["hi"] or not port["proto"] or port["proto"] == "tcpudp" \
                        or port["proto"] not in PROTO_NUMBERS:
                    return None                   # a range, any protocol, an interface ...
                shape.append(("port", flag))
                key.append((PROTO_NUMBERS[port["proto"]], int(port["port"])))
                continue
            shape.append(("net", flag, net.version, net.prefixlen))
            key.append(int(net.network_address))
            bits += net.prefixlen
        return tuple(shape), tuple(key), bits

    def contains(self, packet: Packet):
        """As ``ipset_contains``; SLOW when the packet lacks a value an entry needs."""
        hits: list = []
        for shape, table in self.shapes.items():
            key = []
            for part in shape:
                side = "src" if part[1] == "src" else "dst"
                if part[0] == "port":
                    value = getattr(packet, f"tp_{side}")
                    if value is None or packet.nw_proto is None:
                        return SLOW
                    key.append((packet.nw_proto, value))
                    continue
                addr = getattr(packet, f"nw_{side}")
                if addr is None:
                    return SLOW
                try:
                    ip = _address(addr)
                except ValueError:
                    return SLOW
                if ip.version != part[2]:
                    key = None
                    break
                bits = ip.max_prefixlen
                key.append(int(ip) >> (bits - part[3]) << (bits - part[3]) if part[3] else 0)
            if key is not None:
                hits.extend(table.get(tuple(key), ()))
        undecidable = False
        for member in self.rest:
            words = member.split()
            hit = _set_entry_hit(words[0], self.flags, packet)
            if hit is None:
                undecidable = True
            elif hit:
                hits.append((_set_entry_bits(words[0]), "nomatch" in words[1:]))
        if hits:
            most = max(bits for bits, _ in hits)
            return not any(nomatch for bits, nomatch in hits if bits == most)
        return None if undecidable else False


def _set_entry_bits(entry: str) -> int:
    """How specific an entry is: the prefix lengths of its addresses (an address alone is a
    full-length prefix)."""
    bits = 0
    for element in entry.split(","):
        try:
            bits += _network(element).prefixlen
        except ValueError:
            continue                                  # a port or an interface
    return bits


def _set_entry_hit(entry: str, flags: tuple[str, ...], packet: Packet) -> bool | None:
    """One entry (``10.0.0.0/8``, ``10.0.0.1,tcp:80``, ``10.0.0.1,udp:53,10.0.0.2``)."""
    results = []
    for element, flag in zip(entry.split(","), flags):
        port_only = flag.startswith("port-")      # bitmap:port
        side = "src" if flag.removeprefix("port-") == "src" else "dst"
        results.append(_set_element_hit(element, ("port-" if port_only else "") + side, packet))
    if False in results:
        return False
    return None if None in results else True


def _set_element_hit(element: str, side: str, packet: Packet) -> bool | None:
    if side.startswith("port-"):                      # bitmap:port: the element is a port
        return _port_element_hit(element, side[5:], packet)
    try:
        return _in_network(getattr(packet, f"nw_{side}"), _network(element))
    except ValueError:
        pass
    return _port_element_hit(element, side, packet)


def _port_element_hit(element: str, side: str, packet: Packet) -> bool | None:
    port = _SET_PORT.match(element)
    if not port:
        return None                                   # interface names, MACs: not modelled
    proto = port["proto"]
    if proto and proto != "tcpudp" and PROTO_NUMBERS.get(proto) != packet.nw_proto:
        return False
    value = getattr(packet, f"tp_{side}")
    lo = int(port["port"])
    return None if value is None else lo <= value <= int(port["hi"] or lo)
