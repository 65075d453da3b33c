"""Neighbour (ARP / NDP) entries: parse ``ip neigh show`` and resolve a next hop's MAC.

``resolve`` answers what the kernel would do with a packet whose next hop is ``ip`` on
``dev``: send it to a known MAC (``usable`` True), drop it because resolution failed
(``usable`` False), or resolve first because the snapshot has no entry (``usable`` None).
The caller decides what an unknown means for its trace.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

from traceflow.model.errors import InputError, Source

# NUD states (include/uapi/linux/neighbour.h), as iproute2 prints them.
STATES = ("INCOMPLETE", "REACHABLE", "STALE", "DELAY", "PROBE", "FAILED", "NOARP",
          "PERMANENT", "NONE")
# The kernel transmits to the cached MAC in these states (STALE/DELAY/PROBE re-confirm
# reachability in the background, they do not hold the packet back).
USABLE = {"REACHABLE", "STALE", "DELAY", "PROBE", "PERMANENT", "NOARP"}
FAILED = {"FAILED", "INCOMPLETE"}
FLAGS = {"router", "proxy", "extern_learn", "offload", "managed", "use"}
_VALUED = {"dev", "lladdr", "ref", "used", "probes", "proto", "protocol", "vni", "port",
           "via", "nhid", "src_vni"}
_LLADDR = re.compile(r"^[0-9a-fA-F]{1,2}(:[0-9a-fA-F]{1,2})+$")
# octets of the link-layer addresses `ip neigh` prints: Ethernet, EUI-64 (FireWire), InfiniBand
_LLADDR_OCTETS = (6, 8, 20)
_ETHERNET = re.compile(r"^[0-9a-f]{1,2}(:[0-9a-f]{1,2}){5}$")


@dataclass(frozen=True)
class Neighbour:
    """One ``ip neigh`` line."""

    ip: str
    dev: str | None                 # None when the output was ``ip neigh show dev X``
    source: Source
    lladdr: str | None = None
    states: tuple[str, ...] = ()
    flags: frozenset = frozenset()  # router, proxy, extern_learn ...
    extra: tuple[str, ...] = ()     # words we do not know, in order

    @property
    def text(self) -> str:
        return self.source.text

    @property
    def state(self) -> str:
        return "/".join(self.states) or "no state"

    @property
    def family(self) -> int:
        return ipaddress.ip_address(self.ip).version


@dataclass(frozen=True)
class NeighbourResult:
    neighbour: Neighbour | None
    usable: bool | None             # None: no entry; the kernel would resolve first
    reason: str

    @property
    def mac(self) -> str | None:
        if not (self.neighbour and self.usable):
            return None
        return ethernet_mac(self.neighbour)


def ethernet_mac(neighbour: Neighbour) -> str | None:
    """The entry's link-layer address as the MAC of an Ethernet header; a located error when
    it is not one (a tunnel's IP-form lladdr, or a hand-edited file)."""
    lladdr = neighbour.lladdr
    if lladdr is not None and not _ETHERNET.match(lladdr):
        raise InputError.at(neighbour.source, f"link-layer address {lladdr!r} is not an "
                            "Ethernet MAC, but this neighbour is reached over Ethernet")
    return lladdr


def parse_ip_neigh(text: str, name: str) -> list[Neighbour]:
    """Parse ``ip neigh show`` / ``ip -4 neigh`` / ``ip -s neigh`` output."""
    neighbours = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            neighbours.append(_parse_line(Source(name, number, line)))
    return neighbours


def _parse_line(source: Source) -> Neighbour:
    words = source.text.split()
    try:
        ip = str(ipaddress.ip_address(words[0]))
    except ValueError:
        raise InputError.at(source, "not an 'ip neigh' line (expected 'ADDRESS dev DEVICE "
                                    "lladdr MAC STATE')") from None
    fields: dict = {"ip": ip, "dev": None, "source": source}
    states, flags, extra = [], set(), []
    seen: set = set()
    pos = 1
    while pos < len(words):
        word = words[pos]
        if word in _VALUED:
            if pos + 1 >= len(words):
                raise InputError.at(source, f"'{word}' needs a value")
            if word in seen:
                raise InputError.at(source, f"'{word}' twice: not one 'ip neigh' line (two "
                                    "records glued together?)")
            seen.add(word)
            value = words[pos + 1]
            if word in ("dev", "lladdr"):
                fields[word] = _lladdr(value, source) if word == "lladdr" else value
            pos += 2
            continue
        if word in STATES:
            states.append(word)
        elif word in FLAGS:
            flags.add(word)
        else:
            try:
                ipaddress.ip_address(word)
            except ValueError:
                extra.append(word)
            else:
                raise InputError.at(source, f"a second address {word!r}: not one 'ip neigh' "
                                    "line (two records glued together?)")
        pos += 1
    return Neighbour(**fields, states=tuple(states), flags=frozenset(flags), extra=tuple(extra))


def _lladdr(value: str, source: Source) -> str:
    # Ethernet MACs, but also longer link-layer addresses (InfiniBand) or an IPv4
    # address for tunnel devices (ip6gre, sit).
    if _LLADDR.match(value) and value.count(":") + 1 in _LLADDR_OCTETS:
        return value.lower()
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InputError.at(source, f"bad link-layer address {value!r}") from None


@functools.lru_cache(maxsize=65536)     # (a walk resolves the same few addresses)
def _canonical(ip: str) -> tuple[str, int]:
    addr = ipaddress.ip_address(ip)
    return str(addr), addr.version


def resolve(neighbours: list[Neighbour], ip: str, dev: str,
            file: str | None = None) -> NeighbourResult:
    """What the kernel does to reach ``ip`` on ``dev``, judged from the neighbour table."""
    want, version = _canonical(ip)
    proto = "ARP" if version == 4 else "neighbour discovery"
    entries = [n for n in neighbours
               if n.ip == want and n.dev in (dev, None) and "proxy" not in n.flags]
    if not entries:
        where = file or (neighbours[0].source.file if neighbours else "the neighbour table")
        verb = "an ARP request" if proto == "ARP" else "a neighbour solicitation"
        return NeighbourResult(None, None, f"no entry for {want} on {dev} in {where}; "
                                           f"the kernel would send {verb}")
    entry = entries[0]
    states = set(entry.states)
    if states & FAILED:
        what = "failed" if "FAILED" in states else "has had no answer yet"
        return NeighbourResult(entry, False, f"neighbour unreachable: {proto} for {want} on "
                                             f"{dev} {what} ({entry.state})")
    if states & USABLE:
        if entry.lladdr:
            return NeighbourResult(entry, True, f"{want} on {dev} is {entry.lladdr} "
                                                f"({entry.state})")
        if "NOARP" in states:
            return NeighbourResult(entry, True, f"{dev} does not resolve link-layer "
                                                f"addresses: {want} needs none (NOARP)")
    return NeighbourResult(entry, None, f"the entry for {want} on {dev} has no usable "
                                        f"address ({entry.state}); the kernel would resolve "
                                        f"it with {proto}")
