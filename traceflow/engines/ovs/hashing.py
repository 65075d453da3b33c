"""Open vSwitch's flow hashes, for the ``bundle`` and ``bundle_load`` actions.

``bundle(fields, basis, hrw, ofport, members:...)`` picks, among the members that are up, the
one with the highest ``hash_2words(i, flow_hash)`` (highest random weight); ``active_backup``
the first member that is up (lib/bundle.c, execute_hrw / execute_ab). ``flow_hash`` is
``flow_hash_fields`` of lib/flow.c over the packet's fields. Read from OVS 3.1's sources:
lib/jhash.c (Bob Jenkins' lookup3, on little-endian words), lib/hash.h (the murmur-style
``hash_add``/``hash_finish`` of a build without SSE 4.2: Debian's and Ubuntu's packages; a
build with ``-msse4.2`` hashes with CRC32 instead and may pick another member, which
``BUILD_NOTE`` says wherever a choice depends on it).
"""

from __future__ import annotations

import struct

M32 = 0xFFFFFFFF

BUILD_NOTE = ("OVS's hash as Debian/Ubuntu build it (lib/hash.h without SSE 4.2); an "
              "ovs-vswitchd built with -msse4.2 hashes with CRC32 and may choose another member")

# NX_HASH_FIELDS_* as ovs-ofctl writes them (lib/flow.c, flow_hash_fields_to_str)
HASH_FIELDS = ("eth_src", "symmetric_l4", "symmetric_l3l4", "symmetric_l3l4+udp", "nw_src",
               "nw_dst", "symmetric_l3")


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & M32


# ---- lib/hash.h (no SSE 4.2) -------------------------------------------------------------

def hash_add(h: int, data: int) -> int:
    """mhash_add: murmur3's body step (a zero word leaves the hash unmixed but rotated)."""
    data &= M32
    if data:
        data = (data * 0xcc9e2d51) & M32
        data = _rot(data, 15)
        data = (data * 0x1b873593) & M32
        h ^= data
    h = _rot(h, 13)
    return (h * 5 + 0xe6546b64) & M32


def hash_add64(h: int, data: int) -> int:
    return hash_add(hash_add(h, data & M32), data >> 32)


def hash_finish(h: int, final: int) -> int:
    h ^= final
    h ^= h >> 16
    h = (h * 0x85ebca6b) & M32
    h ^= h >> 13
    h = (h * 0xc2b2ae35) & M32
    h ^= h >> 16
    return h


def hash_2words(x: int, y: int) -> int:
    return hash_finish(hash_add(hash_add(x, 0), y), 8)


# ---- lib/jhash.c --------------------------------------------------------------------------

def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & M32; a ^= _rot(c, 4); c = (c + b) & M32
    b = (b - a) & M32; b ^= _rot(a, 6); a = (a + c) & M32
    c = (c - b) & M32; c ^= _rot(b, 8); b = (b + a) & M32
    a = (a - c) & M32; a ^= _rot(c, 16); c = (c + b) & M32
    b = (b - a) & M32; b ^= _rot(a, 19); a = (a + c) & M32
    c = (c - b) & M32; c ^= _rot(b, 4); b = (b + a) & M32
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    c ^= b; c = (c - _rot(b, 14)) & M32
    a ^= c; a = (a - _rot(c, 11)) & M32
    b ^= a; b = (b - _rot(a, 25)) & M32
    c ^= b; c = (c - _rot(b, 16)) & M32
    a ^= c; a = (a - _rot(c, 4)) & M32
    b ^= a; b = (b - _rot(a, 14)) & M32
    c ^= b; c = (c - _rot(b, 24)) & M32
    return a, b, c


def jhash_bytes(data: bytes, basis: int) -> int:
    """jhash_bytes over ``data`` as it lies in memory, read as little-endian words."""
    n = len(data)
    a = b = c = (0xdeadbeef + n + basis) & M32
    p = 0
    while n - p >= 12:
        x, y, z = struct.unpack_from("<III", data, p)
        a, b, c = _mix((a + x) & M32, (b + y) & M32, (c + z) & M32)
        p += 12
    if p < n:
        x, y, z = struct.unpack("<III", data[p:].ljust(12, b"\0"))
        a, b, c = _final((a + x) & M32, (b + y) & M32, (c + z) & M32)
    return c


# ---- lib/flow.c ---------------------------------------------------------------------------

_IPV4, _IPV6 = 0x0800, 0x86DD
_TCP, _UDP, _SCTP = 6, 17, 132


def _be(value: int, size: int) -> bytes:
    return (value & ((1 << (8 * size)) - 1)).to_bytes(size, "big")


def _le32(value: int) -> int:
    """A big-endian 32-bit field as the little-endian word ``hash_add`` is given."""
    return int.from_bytes(_be(value, 4), "little")


def _vlan_vid(state: dict) -> int:
    # flow->vlans[i].tci & htons(VLAN_VID_MASK), XORed over both tags
    return (state.get("vlan_tci", 0) ^ state.get("vlan_tci1", 0)) & 0x0FFF


def _symmetric_l4(state: dict, basis: int) -> int:
    dl_type = state.get("dl_type", 0)
    addr = bytes(16)
    proto = port = 0
    if dl_type == _IPV4:
        addr = _be(state.get("nw_src", 0) ^ state.get("nw_dst", 0), 4) + bytes(12)
    elif dl_type == _IPV6:
        addr = _be(state.get("ipv6_src", 0) ^ state.get("ipv6_dst", 0), 16)
    if dl_type in (_IPV4, _IPV6):
        proto = state.get("nw_proto", 0)
        if proto in (_TCP, _SCTP):
            port = state.get("tp_src", 0) ^ state.get("tp_dst", 0)
    eth = _be(state.get("dl_src", 0) ^ state.get("dl_dst", 0), 6)
    # struct { union {be32; in6_addr} (16); be16 eth_type; be16 vlan_tci; be16 tp_port;
    #          eth_addr (6); u8 ip_proto; } padded to 32 bytes, zeroed first
    fields = (addr + _be(dl_type, 2) + _be(_vlan_vid(state), 2) + _be(port, 2) + eth
              + bytes([proto]) + bytes(3))
    return jhash_bytes(fields, basis)


def _symmetric_l2(state: dict, basis: int) -> int:
    eth = _be(state.get("dl_src", 0) ^ state.get("dl_dst", 0), 6)
    words = _be(state.get("dl_type", 0), 2) + _be(_vlan_vid(state), 2) + eth + bytes(2)
    h = basis
    for (w,) in struct.iter_unpack("<I", words):
        h = hash_add(h, w)
    return hash_finish(h, basis)


def _symmetric_l3l4(state: dict, basis: int, with_udp: bool) -> int:
    dl_type = state.get("dl_type", 0)
    h = basis
    if dl_type == _IPV4:
        h = hash_add(h, _le32(state.get("nw_src", 0) ^ state.get("nw_dst", 0)))
    elif dl_type == _IPV6:
        x = _be(state.get("ipv6_src", 0) ^ state.get("ipv6_dst", 0), 16)
        for (w,) in struct.iter_unpack("<Q", x):
            h = hash_add64(h, w)
    else:
        return _symmetric_l2(state, basis)
    proto = state.get("nw_proto", 0)
    h = hash_add(h, proto)
    if not state.get("nw_frag", 0) & 3 and (proto in (_TCP, _SCTP)
                                            or with_udp and proto == _UDP):
        ports = state.get("tp_src", 0) ^ state.get("tp_dst", 0)
        h = hash_add(h, int.from_bytes(_be(ports, 2), "little"))   # (uint16_t) of a be16
    return hash_finish(h, basis)


def _symmetric_l3(state: dict, basis: int) -> int:
    dl_type = state.get("dl_type", 0)
    addr = bytes(16)
    if dl_type == _IPV4:
        addr = _be(state.get("nw_src", 0) ^ state.get("nw_dst", 0), 4) + bytes(12)
    elif dl_type == _IPV6:
        addr = _be(state.get("ipv6_src", 0) ^ state.get("ipv6_dst", 0), 16)
    return jhash_bytes(addr + _be(dl_type, 2) + bytes(2), basis)


def flow_hash_fields(state: dict, fields: str, basis: int) -> int:
    """lib/flow.c flow_hash_fields: the hash of the packet's ``fields`` with ``basis``."""
    dl_type = state.get("dl_type", 0)
    if fields == "eth_src":
        return jhash_bytes(_be(state.get("dl_src", 0), 6), basis)
    if fields == "symmetric_l4":
        return _symmetric_l4(state, basis)
    if fields in ("symmetric_l3l4", "symmetric_l3l4+udp"):
        return _symmetric_l3l4(state, basis, fields.endswith("udp"))
    if fields in ("nw_src", "nw_dst"):
        if dl_type == _IPV4:
            return jhash_bytes(_be(state.get(fields, 0), 4), basis)
        if dl_type == _IPV6:
            return jhash_bytes(_be(state.get("ipv6_" + fields[3:], 0), 16), basis)
        return basis
    if fields == "symmetric_l3":
        return _symmetric_l3(state, basis)
    raise ValueError(f"unknown hash fields {fields!r}")


def hrw_choice(state: dict, fields: str, basis: int, enabled: list[bool]) -> int | None:
    """The index of the member ``bundle(..., hrw, ...)`` chooses among those ``enabled``
    (lib/bundle.c execute_hrw: the highest hash_2words(i, flow hash), the first on a tie);
    None when no member is up."""
    flow_hash = flow_hash_fields(state, fields, basis)
    best, best_hash = None, 0
    for i, up in enumerate(enabled):
        if up:
            h = hash_2words(i, flow_hash)
            if best is None or h > best_hash:
                best, best_hash = i, h
    return best
