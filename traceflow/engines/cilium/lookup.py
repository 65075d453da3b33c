"""Cilium's datapath decisions over the parsed maps, as the BPF programs make them.

Pure functions of parsed records (``traceflow.engines.cilium.records``): which service entry a packet
hits and which backend slots it can take (``lb4_lookup_service`` / ``lb4_local``, bpf/lib/lb.h),
which policy-map entry decides a verdict (``__policy_can_access``, bpf/lib/policy.h, per
version), which ipcache entry describes an address (``ipcache_lookup4``, an LPM lookup).
The datapath module (``traceflow.cni.cilium.datapath``) turns these into hops.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

# bpf/lib/common.h: drop reasons by name (the names Cilium's monitor and Hubble print)
DROP_POLICY = "DROP_POLICY"                         # -133
DROP_NO_SERVICE = "DROP_NO_SERVICE"                 # -158
DROP_NO_TUNNEL_ENDPOINT = "DROP_NO_TUNNEL_ENDPOINT"  # -160
DROP_NO_FIB = "DROP_NO_FIB"                         # -169
DROP_POLICY_DENY = "DROP_POLICY_DENY"               # -181
DROP_POLICY_AUTH_REQUIRED = "DROP_POLICY_AUTH_REQUIRED"  # -189
DROP_CODES = {DROP_POLICY: -133, DROP_NO_SERVICE: -158, DROP_NO_TUNNEL_ENDPOINT: -160,
              DROP_NO_FIB: -169, DROP_POLICY_DENY: -181, DROP_POLICY_AUTH_REQUIRED: -189}

# reserved security identities (pkg/identity/numericidentity.go)
RESERVED = {0: "unknown (any)", 1: "reserved:host", 2: "reserved:world", 3: "reserved:unmanaged",
            4: "reserved:health", 5: "reserved:init", 6: "reserved:remote-node",
            7: "reserved:kube-apiserver", 8: "reserved:ingress"}


# ---- ipcache --------------------------------------------------------------------------------

def ipcache_lookup(entries, ip: str):
    """The longest-prefix ipcache entry holding ``ip`` (None when none does)."""
    addr = ipaddress.ip_address(ip)
    best, best_len = None, -1
    for e in entries:
        try:
            net = ipaddress.ip_network(e.prefix, strict=False)
        except ValueError:
            continue
        if addr.version == net.version and addr in net and net.prefixlen > best_len:
            best, best_len = e, net.prefixlen
    return best


# ---- services -------------------------------------------------------------------------------

@dataclass
class ServiceHit:
    service: object                 # LbService (the entry the lookup found)
    scope_note: str                 # why this scope's entry
    candidates: tuple               # LbBackend, the slots a new connection can take
    note: str = ""                  # terminating/quarantined slots left out, ...


def service_lookup(services, ip: str, port: int, proto: str, from_cluster: bool = True):
    """``lb4_lookup_service``: the entry for (address, port[, proto]), the internal-scope twin
    (`/i`) for east-west traffic of a two-scope service. None when no entry exists (the packet
    is not for a service)."""
    matches = [s for s in services if s.frontend_ip == ip and s.port == port
               and (s.protocol is None or s.protocol.upper() in (proto.upper(), "ANY"))]
    if not matches:
        return None
    external = [s for s in matches if getattr(s, "scope", "external") != "internal"]
    internal = [s for s in matches if getattr(s, "scope", "external") == "internal"]
    if internal and from_cluster:
        svc = internal[0]
        why = ("two-scope service: traffic from inside the cluster uses the internal-scope "
               "entry (`/i`), whose slots follow internalTrafficPolicy")
    else:
        svc = (external or internal)[0]
        why = "the service entry for the destination address and port"
    flags = {f.lower() for f in getattr(svc, "flags", ())}
    if "local" in flags or "internallocal" in flags:
        why += "; its traffic policy is Local: only this node's backends are in the slots"
    active = [b for b in svc.backends if (getattr(b, "state", None) or "active") == "active"]
    note = ""
    if len(active) != len(svc.backends):
        left = [f"{b.ip}:{b.port} ({b.state})" for b in svc.backends if b not in active]
        if active:
            note = "not candidates for new connections: " + ", ".join(left)
        else:
            # lb4_local: terminating backends are used only when no active one is left
            active = [b for b in svc.backends if (b.state or "") == "terminating"]
            note = ("no active backend: terminating ones still serve ("
                    + ", ".join(left) + ")")
    return ServiceHit(svc, why, tuple(active), note)


def maglev_shares(table, ids: list) -> dict | None:
    """Backend id -> share of new connections from the Maglev lookup table (entries of that id
    / table size), or None when there is no table or an id is unknown."""
    if table is None or not table.backend_ids or any(i is None for i in ids):
        return None
    total = len(table.backend_ids)
    return {i: table.backend_ids.count(i) / total for i in ids}


# ---- policy ---------------------------------------------------------------------------------

@dataclass
class PolicyVerdict:
    allowed: bool
    entry: object | None            # the PolicyEntry that decided (None: no entry matched)
    drop: str | None                # DROP_* when not allowed
    how: str                        # which lookup found it, in plain English
    tried: tuple = ()               # the lookups tried, in order
    proxy_port: int | None = None   # the entry redirects to the L7 proxy on this port
    unknown: str | None = None      # the map cannot decide (an unreadable row): why
    notes: tuple = ()               # assumptions the ranking made


PROTO_NUMBER = {"TCP": 6, "UDP": 17, "SCTP": 132, "ICMP": 1, "ICMPV6": 58, "ANY": 0}


def _proto_num(proto) -> int:
    if proto is None:
        return 0
    p = str(proto).upper()
    return int(p) if p.isdigit() else PROTO_NUMBER.get(p, -1)


def _prefix(e) -> int:
    """The key's prefix over (protocol, port): the PREFIX column (1.14+), else what the
    printed key implies (0 any, 8 a protocol, 24 a port)."""
    if e.prefix_len is not None:
        return e.prefix_len
    if e.port is not None:
        end = getattr(e, "port_end", None)
        if end is not None and end != e.port:
            size = end - e.port + 1
            return 24 - (size.bit_length() - 1)
        return 24
    return 8 if e.protocol not in (None, "ANY") else 0


def _lpm_match(e, proto: str, port: int | None) -> bool:
    """Whether the LPM key matches a packet (bpf/lib/policy.h struct policy_key: the prefix
    covers 8 protocol bits, then port bits; the lookup is made with the full prefix)."""
    plen = _prefix(e)
    if plen <= 0:
        return True
    if _proto_num(e.protocol) != _proto_num(proto):
        return False
    if plen <= 8:
        return True
    if port is None:
        return False
    bits = min(plen - 8, 16)
    mask = ((1 << bits) - 1) << (16 - bits)
    return ((e.port or 0) & mask) == (port & mask)


def _port_ok(e, port: int | None, proto: str) -> bool:
    """An entry's protocol and port against a packet's (printed-key semantics)."""
    return _lpm_match(e, proto, port)


def _ident_ok(e, identity: int) -> bool:
    return e.identity is None or e.identity == 0 or e.identity == identity


def _wild(e) -> bool:
    return e.identity in (None, 0)


def policy_verdict(entries, direction: str, identity: int, port: int | None, proto: str,
                   version, unreadable=()) -> PolicyVerdict:
    """``__policy_can_access`` (bpf/lib/policy.h) over one endpoint's policy map.

    ``unreadable``: rows of this endpoint and direction traceflow could not read; any of them
    could be the entry the datapath finds, so the verdict is unknown (naming them).

    1.8 - 1.13 (hash map): exact lookups in order L3+L4, L4-only, L3-only, allow-all; the
    first entry found decides (1.9+: a deny entry drops).
    1.14 - 1.16 (LPM map, policy.h at the 1.16 branch point): one longest-prefix lookup for the
    identity and one for the wildcard identity; precedence id/proto/port, ANY/proto/port,
    id/proto/ANY, ANY/proto/ANY, id/ANY/ANY, ANY/ANY/ANY; the chosen entry's deny drops.
    1.17+ (policy.h at the 1.17 branch point, __policy_can_access): the identity's entry wins
    at once when it is a deny; else the wildcard entry wins when it is a deny, when there is
    no identity entry, when its proxy-port priority is higher, or on equal priority when its
    prefix is longer; otherwise the identity's entry."""
    if unreadable:
        rows = ", ".join(u.where for u in unreadable[:3])
        why = (f"the policy map has rows traceflow cannot read ({rows}: "
               f"{unreadable[0].reason}); any of them could be the entry the datapath finds")
        return PolicyVerdict(False, None, None, why, ("LPM",), unknown=why)
    mine = [e for e in entries if e.direction == direction]
    if any(e.precedence is not None for e in mine):
        return _ranked_by_precedence(mine, identity, port, proto, version)
    if version is None or not version.at_least(1, 14):
        return _hash_lookups(mine, identity, port, proto)
    l3 = _longest([e for e in mine if not _wild(e) and e.identity == identity], proto, port)
    l4 = _longest([e for e in mine if _wild(e)], proto, port)
    if version.at_least(1, 17):
        return _decide_1_17(l3, l4)
    return _decide_1_14(l3, l4)


def _longest(cands, proto, port):
    """The LPM trie's answer: the matching entry with the longest prefix (None: none)."""
    hits = [e for e in cands if _lpm_match(e, proto, port)]
    return max(hits, key=_prefix) if hits else None


_KINDS = {"L3": ("id/proto/port (L3+L4)", "id/proto/ANY (L3-proto)", "id/ANY/ANY (L3-only)"),
          "L4": ("ANY/proto/port (L4-only)", "ANY/proto/ANY (protocol-only)",
                 "ANY/ANY/ANY (allow-all)")}


def _kind(e, side: str) -> str:
    plen = _prefix(e)
    i = 0 if plen > 8 else 1 if plen > 0 else 2
    return _KINDS[side][i]


def _finish(e, side: str, how: str, notes=()) -> PolicyVerdict:
    what = f"{how}: the {_kind(e, side)} entry decides"
    if e.verdict == "deny":
        return PolicyVerdict(False, e, DROP_POLICY_DENY, what, ("LPM",), notes=tuple(notes))
    if e.auth_type and str(e.auth_type).lower() not in ("disabled", "none", "-", "0"):
        return PolicyVerdict(False, e, DROP_POLICY_AUTH_REQUIRED,
                             what + f"; it requires authentication ({e.auth_type})", ("LPM",),
                             notes=tuple(notes))
    return PolicyVerdict(True, e, None, what, ("LPM",), proxy_port=e.proxy_port,
                         notes=tuple(notes))


def _no_entry() -> PolicyVerdict:
    return PolicyVerdict(False, None, DROP_POLICY,
                         "no entry matches the identity (or the wildcard) and the port",
                         ("LPM",))


def _decide_1_14(l3, l4) -> PolicyVerdict:
    how = "LPM lookups for the identity and the wildcard (1.14-1.16 precedence)"
    order = ((l3, "L3", lambda e: _prefix(e) > 8), (l4, "L4", lambda e: _prefix(e) > 8),
             (l3, "L3", lambda e: _prefix(e) > 0), (l4, "L4", lambda e: _prefix(e) > 0),
             (l3, "L3", lambda e: True), (l4, "L4", lambda e: True))
    for e, side, ok in order:
        if e is not None and ok(e):
            return _finish(e, side, how)
    return _no_entry()


def _decide_1_17(l3, l4) -> PolicyVerdict:
    how = "LPM lookups for the identity and the wildcard (1.17 precedence: deny first)"
    if l3 is not None and l3.verdict == "deny":
        return _finish(l3, "L3", how)
    if l4 is None:
        return _finish(l3, "L3", how) if l3 is not None else _no_entry()
    notes = []
    if l3 is None or l4.verdict == "deny":
        return _finish(l4, "L4", how)
    # proxy-port priority is not printed: a redirecting entry outranks one that does not
    # (policy.h: "giving precedence to proxy redirect over non-proxy redirect"); two
    # redirecting entries are taken as equal
    p3, p4 = bool(l3.proxy_port), bool(l4.proxy_port)
    if p3 and p4:
        notes.append("both entries redirect to the proxy and `bpf policy get` does not print "
                     "their proxy-port priority: equal priority assumed")
    if p4 and not p3:
        return _finish(l4, "L4", how, notes)
    if p3 and not p4:
        return _finish(l3, "L3", how, notes)
    if _prefix(l4) > _prefix(l3):
        return _finish(l4, "L4", how, notes)
    return _finish(l3, "L3", how, notes)


def _hash_lookups(mine, identity, port, proto) -> PolicyVerdict:
    """1.8-1.13: exact hash lookups (policy.h of those versions)."""
    p = _proto_num(proto)
    keys = (("L3+L4", identity, p, port), ("L4-only", 0, p, port),
            ("L3-only", identity, 0, 0), ("allow-all", 0, 0, 0))
    tried = []
    for name, ident, kproto, kport in keys:
        tried.append(name)
        hit = next((e for e in mine if (e.identity or 0) == ident
                    and _proto_num(e.protocol) == kproto and (e.port or 0) == (kport or 0)), None)
        if hit is not None:
            if hit.verdict == "deny":
                return PolicyVerdict(False, hit, DROP_POLICY_DENY,
                                     f"{name} lookup found a deny entry", tuple(tried))
            return PolicyVerdict(True, hit, None, f"{name} lookup found the entry",
                                 tuple(tried), proxy_port=hit.proxy_port)
    return PolicyVerdict(False, None, DROP_POLICY,
                         "no entry in any of the lookups (" + " -> ".join(tried) + ")",
                         tuple(tried))


def _ranked_by_precedence(mine, identity, port, proto, version) -> PolicyVerdict:
    """Maps printed with a precedence column: the highest precedence matching entry."""
    cands = [e for e in mine if _ident_ok(e, identity) and _lpm_match(e, proto, port)]
    if not cands:
        return _no_entry()

    def rank(e):
        deny_first = 1 if e.verdict == "deny" else 0
        return (e.precedence or 0, deny_first, _prefix(e), 0 if _wild(e) else 1)
    best = max(cands, key=rank)
    return _finish(best, "L4" if _wild(best) else "L3",
                   "the highest precedence entry for the identity or the wildcard")
