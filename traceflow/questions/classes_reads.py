"""What one walk read of a client's own values, and what may be renamed: the half of
traceflow.questions.classes that a walk feeds.

- ``Identity``/``_Values``: a client's node, address, MAC and OVS port;
- ``Recorder``: the decisions of one walk that read them (the hooks of traceflow.model.reads);
- ``canonical_flow``: a flow with the client's own values as placeholders (one pod's
  SpoofGuard flow and another's are then the same);
- ``BridgeFacts``: per bridge, whether a port number is only ever the port's own.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F

SELF_IP, SELF_MAC, SELF_PORT = "<own address>", "<own MAC>", "<own port>"
_NOTHING = frozenset()
_REGISTERS = frozenset([f"reg{i}" for i in range(16)] + [f"xreg{i}" for i in range(8)]
                       + [f"xxreg{i}" for i in range(4)])
# identity-typed OVS fields: a flow with an exact match on one of them equal to a client's value
# is that client's own flow
_IP_FIELDS = frozenset({"nw_src", "nw_dst", "arp_spa", "arp_tpa"})
_MAC_FIELDS = frozenset({"dl_src", "dl_dst", "arp_sha", "arp_tha"})
_ADDRESS_SOURCE_FIELDS = frozenset({"nw_src", "nw_dst", "arp_spa", "arp_tpa", "dl_src", "dl_dst",
                                    "arp_sha", "arp_tha", "in_port", "ipv6_src", "ipv6_dst",
                                    "nd_target", "nd_sll", "nd_tll"})


@dataclass(frozen=True)
class Identity:
    """What is a client's own in the datapath: its node, address, and on an OVS node its MAC
    and port (None where the datapath has none, e.g. a host-only bundle)."""

    node: str
    ip: str
    mac: str | None = None
    port: int | None = None
    port_name: str | None = None

    @functools.cached_property
    def ip_int(self) -> int:
        return int(ipaddress.IPv4Address(self.ip))

    @functools.cached_property
    def mac_int(self) -> int | None:
        return int(self.mac.replace(":", ""), 16) if self.mac else None

    @classmethod
    def of(cls, node: str, ip: str, mac: str | None = None, port: int | None = None,
           port_name: str | None = None) -> "Identity | None":
        try:
            if ipaddress.ip_address(ip).version != 4:
                return None
        except ValueError:
            return None
        return cls(node, ip, mac.lower() if mac else None, port, port_name)


class _Values:
    """A client's identity as the walk's values: ints for OVS state, text for packets."""

    __slots__ = ("ident", "ip", "ip_int", "mac", "mac_int", "port", "port_name")

    def __init__(self, ident: Identity):
        self.ident = ident
        self.ip, self.ip_int = ident.ip, ident.ip_int
        self.mac, self.mac_int = ident.mac, ident.mac_int
        self.port, self.port_name = ident.port, ident.port_name


# ---- what one walk read --------------------------------------------------------------------------

class Recorder:
    """The decisions of one walk that read the client's own values (the hooks of
    traceflow.model.reads call it). ``opaque`` names a read that cannot be replayed for
    another client: the trace is then that client's alone."""

    def __init__(self, ident: Identity, cluster):
        self.v = _Values(ident)
        self.cluster = cluster
        self.ovs: dict = {}          # (id(bridge), table, fields, key) -> (bridge, table, state, answer)
        self.bridges: dict = {}      # id -> Bridge visited
        self.nf: dict = {}           # (id(chain), ...) -> (chain, packet, ctx)
        self.nft: dict = {}
        self.routes: dict = {}       # node name -> NodeModel (a lookup read the client's address)
        self.neigh: dict = {}        # (node, dev) -> NodeModel
        self.selecting: set = set()  # policy types asked whether they select the client
        self.peers: dict = {}        # (id(policy), id(peer)) -> (policy, peer)
        self.opaque: str | None = None
        self.plan: "_Plan | None" = None     # made when another client is first compared

    # -- hooks ---------------------------------------------------------------------------------
    def ovs_lookup(self, bridge, table, fields: tuple, key: tuple, state: dict, answer) -> None:
        v = self.v
        bid = id(bridge)
        if bid not in self.bridges:
            self.bridges[bid] = bridge
        own = bridge.node == v.ident.node and v.port is not None
        for name, value in zip(fields, key):
            if value == v.ip_int or (value == v.mac_int and value is not None) or \
                    (own and value == v.port and (name == "in_port" or name in _REGISTERS)):
                break
        else:
            return
        k = (bid, table, fields, key)
        if k not in self.ovs:
            places = tuple((name, kind) for name, value in state.items()
                           for kind in (_place(name, value, v, own),) if kind is not None)
            self.ovs[k] = (bridge, table, dict(state), answer[0], _ambiguous(answer[1]), k,
                           places)

    def nf_chain(self, ctx, table: str, chain, packet) -> None:
        v = self.v
        if v.ip not in (packet.nw_src, packet.nw_dst) and \
                (v.mac is None or v.mac not in (str(packet.dl_src).lower(),
                                                str(packet.dl_dst).lower())):
            return
        k = (id(chain), packet.nw_src == v.ip, packet.nw_dst == v.ip)
        if k not in self.nf:
            self.nf[k] = (chain, packet.copy(), ctx)

    def nft_chain(self, ctx, table, chain, packet) -> None:
        v = self.v
        if v.ip not in (packet.nw_src, packet.nw_dst):
            return
        k = (id(chain), packet.nw_src == v.ip, packet.nw_dst == v.ip)
        if k not in self.nft:
            self.nft[k] = (table, chain, packet.copy(), ctx)

    def route(self, node_name: str, node, src, dst) -> None:
        if self.v.ip in (src, dst):
            self.routes[node_name] = node

    def neighbour(self, node_name: str, node, dev: str, nexthop: str) -> None:
        if nexthop == self.v.ip:
            self.neigh[(node_name, dev)] = node

    def policies_selecting(self, pod, policy_type: str) -> None:
        if getattr(pod, "ip", None) == self.v.ip:
            self.selecting.add(policy_type)

    def peer_matches(self, policy, peer, ip: str) -> None:
        if ip == self.v.ip:
            self.peers[(id(policy), id(peer))] = (policy, peer)

    def unsupported(self, why: str) -> None:
        self.opaque = self.opaque or why


def _place(name: str, value, v: _Values, own_bridge: bool) -> str | None:
    """Which of the client's own values a field of an OVS state holds (by value: an address
    or MAC anywhere, the port number only in in_port or a register of its own bridge)."""
    if value == v.ip_int:
        return "ip"
    if v.mac_int is not None and value == v.mac_int:
        return "mac"
    if own_bridge and v.port is not None and value == v.port and \
            (name == "in_port" or name in _REGISTERS):
        return "port"
    return None


def _ambiguous(notes) -> bool:
    return any(str(n).startswith("ambiguous") for n in notes or ())


# ---- a flow as the client's own -----------------------------------------------------------------

def canonical_flow(flow, v: _Values):
    """The flow with the client's own address, MAC and port (number or name) in its matches
    and in its full-width writes replaced by placeholders: the SpoofGuard flow of one pod and
    of another are then the same. None stays None."""
    if flow is None:
        return None
    matches = []
    for m in flow.matches:
        if m.value is None:           # in_port by name
            matches.append((m.field.name, SELF_PORT if m.port_name == v.port_name
                            else m.port_name, m.mask))
            continue
        matches.append((m.field.name, _own_value(m.field.name, m.field.bits, m.value,
                                                 m.mask == F.full_mask(m.field), v), m.mask))
    acts = tuple(_canonical_action(a, v) for a in flow.actions)
    return (flow.table, flow.priority, flow.conj_id, tuple(matches), acts)


def _own_value(name: str, bits: int, value, full: bool, v: _Values):
    if not full:
        return value
    if value == v.ip_int and (name in _IP_FIELDS or name in _REGISTERS or bits == 32):
        return SELF_IP
    if v.mac_int is not None and value == v.mac_int:
        return SELF_MAC
    if v.port is not None and value == v.port and (name == "in_port" or name in _REGISTERS):
        return SELF_PORT
    return value


def _canonical_action(act, v: _Values):
    kind = type(act)
    if kind is A.Load:
        dst = act.dst
        full = dst.start == 0 and dst.end == dst.field.bits - 1
        return ("load", _own_value(dst.field.name, dst.field.bits, act.value, full, v), str(dst))
    if kind is A.SetField:
        return ("set_field", _own_value(act.field.name, act.field.bits, act.value,
                                        act.mask is None, v), act.mask, act.field.name)
    if kind is A.Output and act.port is not None:
        port = act.port
        own = (v.port is not None and port == str(v.port)) or port == v.port_name
        return ("output", SELF_PORT if own else port, act.max_len)
    if kind is A.Resubmit and act.port is not None:
        own = (v.port is not None and act.port == str(v.port)) or act.port == v.port_name
        return ("resubmit", SELF_PORT if own else act.port, act.table, act.goto)
    return repr(act)


# ---- what a bridge does with values: may one client's port be renamed to another's? -------------

class BridgeFacts:
    """Per bridge, once: whether any flow copies part of an address-like field (then no
    renaming is safe on it), whether a register's low bits can receive a copied value (then a
    port number in a register may not be a port), and every place a number is written as a
    constant (a port number written by a flow that is not that port's own is a constant that
    happens to equal it, not the port)."""

    def __init__(self, bridge):
        self.partial_copy: str | None = None
        self.copied_into_registers = False
        self.writes: dict[int, list] = {}      # value -> [(own values of the flow, how)]
        flows = bridge.flows
        for table in flows.table_ids():
            for flow in flows.table(table):
                self._flow(flow.matches, flow.actions, bridge)
        for group in bridge.groups.values():
            for bucket in group.buckets:
                self._flow((), bucket.actions, bridge)

    def _flow(self, matches, actions, bridge) -> None:
        own = set()
        for m in matches:
            if m.value is None and m.port_name is not None:
                number = bridge.port_number(m.port_name)
                if number is not None:
                    own.add(("port", number))
            elif m.mask == F.full_mask(m.field):
                if m.field.name == "in_port":
                    own.add(("port", m.value))
                elif m.field.name in _IP_FIELDS:
                    own.add(("ip", m.value))
                elif m.field.name in _MAC_FIELDS:
                    own.add(("mac", m.value))
        self._actions(actions, frozenset(own))

    def _actions(self, actions, own) -> None:
        for act in actions:
            kind = type(act)
            if kind is A.Load:
                full = act.dst.start == 0 and act.dst.end == act.dst.field.bits - 1
                self.writes.setdefault(act.value, []).append(
                    (own, "register" if full and act.dst.field.name in _REGISTERS else "other"))
            elif kind is A.SetField:
                self.writes.setdefault(act.value, []).append(
                    (own, "register" if act.mask is None and act.field.name in _REGISTERS
                     else "other"))
            elif kind is A.Output and act.port is not None and act.port.isdigit():
                self.writes.setdefault(int(act.port), []).append((own, "port"))
            elif kind is A.Resubmit and act.port is not None and act.port.isdigit():
                self.writes.setdefault(int(act.port), []).append((own, "port"))
            elif kind is A.Move:
                src, dst = act.src, act.dst
                whole = (src.start == 0 and src.end == src.field.bits - 1 and dst.start == 0
                         and dst.end == dst.field.bits - 1)
                if src.field.name in _ADDRESS_SOURCE_FIELDS and not whole:
                    self.partial_copy = self.partial_copy or f"move:{src}->{dst}"
                if dst.field.name in _REGISTERS and dst.start < 16 and \
                        src.field.name != "in_port":
                    self.copied_into_registers = True
            elif kind is A.Clone:
                self._actions(act.actions, own)

    def port_safe(self, v: _Values) -> bool:
        """The client's port number is only ever its own here: matched as in_port or in a
        register, and written (whole register, output, resubmit) only by its own flows."""
        if v.port is None:
            return True
        if self.copied_into_registers:
            return False
        mine = {("port", v.port), ("ip", v.ip_int)} | ({("mac", v.mac_int)} if v.mac_int else set())
        for own, how in self.writes.get(v.port, ()):
            if how == "other" or not (own & mine):
                return False
        return True
