"""What ``ip -d link show`` says a device is.

iproute2 prints, below a device's ``link/ether`` line, one line per link kind with that kind's
attributes (ip/iplink_vxlan.c ``vxlan_print_opt``, iplink_bridge.c, iplink_bridge_slave.c,
link_iptnl.c): ``vxlan id 1 local 192.168.1.11 dev eth0 srcport 0 0 dstport 8472 nolearning
...``, ``bridge forward_delay 1500 ...``, ``bridge_slave state forwarding ...``, ``veth``,
``ipip any remote any local any ttl inherit nopmtudisc``. Older iproute2 puts the kind on the
``link/`` line itself. ``traceflow.engines.routing.parse_ip_addr`` keeps these lines verbatim in
``Interface.details``; this module reads them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from traceflow.model.errors import InputError, Source

# the kernel's default VXLAN port when none is given (drivers/net/vxlan: IANA's 4789 only on
# request; Linux keeps the pre-IANA 8472), as iproute2 prints it
LINUX_VXLAN_PORT = 8472


@dataclass(frozen=True)
class Vxlan:
    """A VXLAN device's attributes (``vxlan id ...`` of ``ip -d link``)."""

    vni: int
    port: int                       # the UDP destination port (dstport)
    local: str | None               # the outer source address (None: the route chooses)
    remote: str | None              # a fixed remote (None: the FDB decides per MAC)
    group: str | None               # a multicast group (flood-and-learn)
    dev: str | None                 # the underlay device it is bound to
    learning: bool                  # learns remote MACs from received frames
    source: Source | None = None    # the `vxlan id ...` line


@dataclass(frozen=True)
class Tunnel:
    """An IP-in-IP style tunnel's attributes (``ipip remote any local any ...``)."""

    kind: str                       # ipip | gre | sit
    remote: str | None              # None: any (per route next hop)
    local: str | None
    source: Source | None = None


@dataclass(frozen=True)
class LinkInfo:
    """One device as the kernel sees it."""

    name: str
    index: int
    kind: str | None                # veth, bridge, vxlan, ipip, ... (None: ip addr without -d)
    mac: str | None
    master: str | None              # the bridge (or bond) it is a port of
    peer_index: int | None          # a veth's peer ifindex (``@ifN``)
    peer_netns: str | None          # ``link-netns NAME`` / ``link-netnsid N``
    flags: frozenset
    bridge_port: bool               # ``bridge_slave`` shown (a port of ``master``)
    vxlan: Vxlan | None
    tunnel: Tunnel | None
    source: Source


def link_info(iface) -> LinkInfo:
    """``iface`` (a ``traceflow.engines.routing.Interface``) with its details read."""
    vxlan = tunnel = None
    bridge_port = False
    sources = getattr(iface, "detail_sources", ()) or ()
    for i, line in enumerate(iface.details):
        words = line.split()
        if not words:
            continue
        src = sources[i] if i < len(sources) else iface.source
        if words[0] == "vxlan":
            vxlan = _vxlan(words, src or iface.source)
        elif words[0] in ("ipip", "gre", "sit") and iface.kind in (None, "ipip", "gre", "sit"):
            tunnel = _tunnel(words, src or iface.source)
        elif words[0] == "bridge_slave":
            bridge_port = True
    peer = None
    if iface.link and iface.link.startswith("if") and iface.link[2:].isdigit():
        peer = int(iface.link[2:])
    return LinkInfo(iface.name, iface.index, iface.kind, iface.mac, iface.master, peer,
                    iface.link_netns, iface.flags, bridge_port or iface.master is not None,
                    vxlan, tunnel, iface.source)


def _vxlan(words: list[str], source: Source) -> Vxlan:
    values: dict = {}
    flags = set()
    i = 1
    valued = {"id", "local", "remote", "group", "dev", "dstport", "ttl", "tos", "ageing",
              "maxaddr", "df", "flowlabel", "label"}
    while i < len(words):
        word = words[i]
        if word == "srcport":                 # srcport LOW HIGH
            i += 3
            continue
        if word in valued:
            if i + 1 >= len(words):
                raise InputError.at(source, f"vxlan: '{word}' needs a value")
            values[word] = words[i + 1]
            i += 2
            continue
        flags.add(word)
        i += 1
    if "id" not in values:
        raise InputError.at(source, "vxlan line without 'id VNI'")
    try:
        vni = int(values["id"])
        port = int(values.get("dstport", LINUX_VXLAN_PORT))
        local = _addr(values.get("local"))
        remote = _addr(values.get("remote"))
        group = _addr(values.get("group"))
    except ValueError as err:
        raise InputError.at(source, f"vxlan: bad value ({err})") from None
    return Vxlan(vni, port, local, remote, group, values.get("dev"),
                 "nolearning" not in flags, source)


def _tunnel(words: list[str], source: Source) -> Tunnel:
    values = {}
    for key in ("remote", "local"):
        if key in words[:-1]:
            values[key] = words[words.index(key) + 1]
    try:
        return Tunnel(words[0], _addr(values.get("remote")), _addr(values.get("local")), source)
    except ValueError as err:
        raise InputError.at(source, f"{words[0]}: bad address ({err})") from None


def _addr(text: str | None) -> str | None:
    if text is None or text == "any":
        return None
    return str(ipaddress.ip_address(text))
