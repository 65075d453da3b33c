"""``bridge fdb show``: the forwarding database of bridges and VXLAN devices.

Lines as iproute2 prints them (bridge/fdb.c ``print_fdb``)::

    2a:5e:8c:13:d4:02 dev veth3c1f0a2b master cni0
    0e:e4:1c:26:88:55 dev veth3c1f0a2b vlan 1 master cni0 permanent
    33:33:00:00:00:01 dev eth0 self permanent
    aa:0b:e2:4f:10:7c dev flannel.1 dst 192.168.1.12 self permanent
    00:00:00:00:00:00 dev vxlan0 dst 10.0.0.2 via eth1 self permanent

A ``master BR`` entry says which port of bridge BR a MAC is behind (learned, or the port's own
address when ``permanent``); a ``dst`` entry on a VXLAN device says where the device sends a
frame for that MAC (the remote VTEP); the all-zero MAC is the default for unknown ones.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from traceflow.model.errors import InputError, Source

_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_VALUED = {"dev", "dst", "vlan", "master", "port", "vni", "src_vni", "via", "nhid", "used",
           "updated"}
_FLAGS = {"self", "router", "extern_learn", "offload", "sticky", "use", "local"}
_STATES = {"permanent", "static", "dynamic", "stale", "noarp", "reachable"}
ZERO_MAC = "00:00:00:00:00:00"


@dataclass(frozen=True)
class FdbEntry:
    mac: str                        # lower case
    dev: str | None                 # None: `bridge fdb show dev X` (the command named it)
    source: Source
    master: str | None = None       # the bridge whose table holds it (a port entry)
    dst: str | None = None          # a VXLAN device's remote address for this MAC
    vni: int | None = None
    port: int | None = None
    vlan: int | None = None
    via: str | None = None
    flags: frozenset = frozenset()  # self, router, extern_learn ...
    state: str | None = None        # permanent, static, stale ... (None: learned)

    @property
    def text(self) -> str:
        return self.source.text.strip()


def parse_bridge_fdb(text: str, name: str) -> list[FdbEntry]:
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        out.append(_entry(Source(name, number, raw)))
    return out


def _entry(source: Source) -> FdbEntry:
    words = source.text.split()
    if not _MAC.match(words[0]):
        raise InputError.at(source, "not a 'bridge fdb show' line (expected 'MAC [dev DEVICE] "
                                    "[dst IP] [master BRIDGE] ...')")
    fields: dict = {}
    flags = set()
    state = None
    i = 1
    while i < len(words):
        word = words[i]
        if word in _VALUED and i + 1 < len(words):
            value = words[i + 1]
            if word == "master":
                fields["master"] = value
            elif word == "dst":
                try:
                    fields["dst"] = str(ipaddress.ip_address(value))
                except ValueError:
                    raise InputError.at(source, f"bad dst address {value!r}") from None
            elif word in ("vni", "port", "vlan"):
                if not value.isdigit():
                    raise InputError.at(source, f"bad {word} {value!r}")
                fields[word] = int(value)
            elif word in ("dev", "via"):
                fields[word] = value
            i += 2
            continue
        if word in _STATES:
            state = word
        elif word in _FLAGS:
            flags.add(word)
        # other words (counters of `-s`, future flags) do not change where a frame goes
        i += 1
    if "dev" in words and "dev" not in fields:
        raise InputError.at(source, "'dev' needs a value")
    fields.setdefault("dev", None)
    return FdbEntry(words[0].lower(), source=source, flags=frozenset(flags), state=state,
                    **fields)


def lookup(entries: list[FdbEntry], dev: str, mac: str, bridge: bool = False
           ) -> FdbEntry | None:
    """The entry the kernel uses for ``mac``: on bridge ``dev`` (``bridge``: the ports'
    entries whose master is ``dev``), or on the VXLAN device ``dev`` (its own ``self``
    entries; the all-zero MAC is the default destination, vxlan_xmit's fallback)."""
    mac = mac.lower()
    if bridge:
        hits = [e for e in entries if e.master == dev and e.mac == mac]
        return hits[0] if hits else None
    own = [e for e in entries if e.dev in (dev, None) and e.master is None]
    for want in (mac, ZERO_MAC):
        hits = [e for e in own if e.mac == want and e.dst is not None]
        if hits:
            return hits[0]
    return None
