"""Parser for ``ip addr`` / ``ip link`` (``ip addr show``, ``ip -d [-s] link``, ``-o``): the
node's interfaces and their addresses, as ``Interface`` / ``Address`` records (parse.py).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from traceflow.engines.routing.parse import Address, Interface, _lines, _Tokens
from traceflow.model.errors import InputError, Source

# "2: eth0@if5: <BROADCAST,UP> mtu 1500 ..." (name may carry "@peer")
_LINK_HEAD = re.compile(r"^(\d+):\s+([^\s:@]+)(?:@([^\s:]+))?:\s+<([^>]*)>\s*(.*)$")
# "2: eth0    inet 10.0.0.1/24 ..." (ip -o addr)
_ONELINE_ADDR = re.compile(r"^(\d+):\s+(\S+?)\s+(inet6?\s.*)$")
_LINK_KINDS = {"veth", "vxlan", "geneve", "dummy", "bridge", "bond", "openvswitch", "vrf",
               "macvlan", "macvtap", "ipvlan", "ipip", "gre", "gretap", "ip6gre", "sit",
               "wireguard", "tun", "tap", "team", "vlan", "ifb", "nlmon", "xfrm", "bareudp",
               "ip6tnl", "vti", "erspan"}
_ADDR_KEYS = {"brd", "peer", "scope", "metric", "label", "valid_lft", "preferred_lft"}


@dataclass
class _LinkDraft:
    fields: dict
    addresses: list = field(default_factory=list)
    altnames: list = field(default_factory=list)
    details: list = field(default_factory=list)
    detail_sources: list = field(default_factory=list)


def parse_ip_addr(text: str, name: str) -> list[Interface]:
    """Parse ``ip addr show`` / ``ip a`` / ``ip link show`` / ``ip -d [-s] link`` (and ``-o``)."""
    drafts: list[_LinkDraft] = []
    for source in _lines(text, name):
        parts = source.text.split("\\")
        head = parts[0]
        if head[:1].isspace():
            if not drafts:
                raise InputError.at(source, "indented line before any interface")
            _link_detail(head, source, drafts[-1])
        else:
            _link_head(head, source, drafts)
        for part in parts[1:]:
            _link_detail(part, source, drafts[-1])
    return [_finish_link(d) for d in drafts]


def _link_head(line: str, source: Source, drafts: list) -> None:
    match = _LINK_HEAD.match(line)
    if match:
        index, ifname, link, flags, rest = match.groups()
        fields = {"index": int(index), "name": ifname, "source": source, "link": link,
                  "flags": frozenset(f for f in flags.split(",") if f)}
        fields.update(_link_attrs(_Tokens(rest.split(), source)))
        drafts.append(_LinkDraft(fields))
        return
    match = _ONELINE_ADDR.match(line)
    if match:      # ip -o addr: one line per address, the device named on each
        index, ifname, rest = int(match.group(1)), match.group(2).split("@")[0], match.group(3)
        if not drafts or drafts[-1].fields["index"] != index:
            drafts.append(_LinkDraft({"index": index, "name": ifname, "source": source}))
        _link_detail(rest, source, drafts[-1])
        return
    raise InputError.at(source, "not an 'ip addr' / 'ip link' line "
                                "(expected 'INDEX: NAME: <FLAGS> ...')")


def _link_attrs(tokens: _Tokens) -> dict:
    attrs: dict = {}
    while tokens:
        word = tokens.next()
        if word == "mtu":
            attrs["mtu"] = tokens.decode(word, int)
        elif word == "state":
            attrs["state"] = tokens.value(word)
        elif word == "master":
            attrs["master"] = tokens.value(word)
        elif word in ("qdisc", "group", "qlen", "mode", "link-netnsid"):
            tokens.value(word)
    return attrs


def _link_detail(line: str, source: Source, draft: _LinkDraft) -> None:
    words = line.split()
    if not words:
        return
    first = words[0]
    if first in ("inet", "inet6"):
        draft.addresses.append(_parse_address(words, source))
    elif first.startswith("link/"):
        _link_layer(words, draft)
    elif first == "altname":
        draft.altnames += words[1:]
    else:
        # valid_lft, RX:/TX: statistics, "veth", "vxlan id 5 ...", "openvswitch_slave" ...
        if first in _LINK_KINDS and "kind" not in draft.fields:
            draft.fields["kind"] = first
        draft.details.append(line.strip())
        draft.detail_sources.append(Source(source.file, source.line, line))


def _link_layer(words: list[str], draft: _LinkDraft) -> None:
    """``link/ether MAC brd ... [link-netns NAME | link-netnsid N] [promiscuity ...]``."""
    draft.fields["link_type"] = words[0].split("/", 1)[1]
    if len(words) > 1 and re.fullmatch(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2})+", words[1]):
        draft.fields["mac"] = words[1].lower()
    for key in ("link-netns", "link-netnsid"):
        if key in words[:-1]:
            draft.fields["link_netns"] = words[words.index(key) + 1]
    # "ip -d link" puts details on the link/ line: "... promiscuity 0 ... veth ..."
    kinds = [w for w in words[2:] if w in _LINK_KINDS]
    if kinds and "kind" not in draft.fields:
        draft.fields["kind"] = kinds[0]


def _parse_address(words: list[str], source: Source) -> Address:
    tokens = _Tokens(words[1:], source)
    family = 4 if words[0] == "inet" else 6
    local = tokens.value(words[0])
    addr_text, _, length = local.partition("/")
    try:
        addr = ipaddress.ip_address(addr_text)
        prefixlen = int(length) if length else addr.max_prefixlen
    except ValueError:
        raise InputError.at(source, f"bad address {local!r}") from None
    fields: dict = {"family": family, "address": str(addr), "prefixlen": prefixlen,
                    "source": source}
    flags = set()
    rest = []
    while tokens:
        word = tokens.next()
        if word == "brd":
            fields["broadcast"] = tokens.value(word)
        elif word == "peer":
            fields["peer"] = tokens.value(word)
        elif word == "scope":
            fields["scope"] = tokens.value(word)
        elif word in _ADDR_KEYS:
            tokens.value(word)
        else:
            rest.append(word)
    # IPv4 lines end with the label (the device name, or "name:alias"); IPv6 lines have none.
    if family == 4 and rest and not _is_address_flag(rest[-1]):
        fields["label"] = rest.pop()
    flags.update(rest)
    return Address(**fields, flags=frozenset(flags))


_ADDRESS_FLAGS = {"secondary", "dynamic", "noprefixroute", "tentative", "deprecated",
                  "permanent", "mngtmpaddr", "temporary", "nodad", "optimistic", "dadfailed",
                  "home", "stable-privacy", "autojoin", "noprefixroute"}


def _is_address_flag(word: str) -> bool:
    return word in _ADDRESS_FLAGS


def _finish_link(draft: _LinkDraft) -> Interface:
    return Interface(**draft.fields, altnames=tuple(draft.altnames),
                     addresses=tuple(draft.addresses), details=tuple(draft.details),
                     detail_sources=tuple(draft.detail_sources))
