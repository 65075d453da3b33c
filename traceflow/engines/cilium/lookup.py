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


def _port_ok(e, port: int | None, proto: str) -> bool:
    if e.protocol not in (None, "ANY") and e.protocol.upper() != proto.upper():
        return False
    if e.port is None:
        return True
    if port is None:
        return False
    end = getattr(e, "port_end", None)
    if end is not None and end != e.port:
        return e.port <= port <= end          # a port range (1.14+ prints it as one row)
    plen = e.prefix_len
    if plen is None or plen >= 24:
        return e.port == port
    bits = max(0, plen - 8)          # the prefix counts 8 protocol bits, then port bits
    mask = ((1 << bits) - 1) << (16 - bits) if bits else 0
    return (e.port & mask) == (port & mask)


def _ident_ok(e, identity: int) -> bool:
    return e.identity is None or e.identity == 0 or e.identity == identity


def policy_verdict(entries, direction: str, identity: int, port: int | None, proto: str,
                   version) -> PolicyVerdict:
    """``__policy_can_access`` over one endpoint's policy map.

    1.8 - 1.13 (hash map): four exact lookups in order L3+L4, L4-only, L3-only, allow-all;
    the first entry found decides (1.9+: a deny entry drops). 1.14+ (LPM map): every entry
    matching (identity or wildcard, direction, protocol, port prefix) is a candidate; the
    longest prefix wins, an exact identity breaks ties (1.17+: any matching deny ranks first;
    a precedence field, where printed, ranks before both)."""
    mine = [e for e in entries if e.direction == direction]
    if version is None or not version.at_least(1, 14):
        keys = (("L3+L4", lambda e: e.identity not in (None, 0) and e.port is not None),
                ("L4-only", lambda e: e.identity in (None, 0) and e.port is not None),
                ("L3-only", lambda e: e.identity not in (None, 0) and e.port is None),
                ("allow-all", lambda e: e.identity in (None, 0) and e.port is None))
        tried = []
        for name, shape in keys:
            tried.append(name)
            hit = next((e for e in mine if shape(e) and _ident_ok(e, identity)
                        and _port_ok(e, port, proto)), None)
            if hit is not None:
                if hit.verdict == "deny":
                    return PolicyVerdict(False, hit, DROP_POLICY_DENY,
                                         f"{name} lookup found a deny entry", tuple(tried))
                return PolicyVerdict(True, hit, None, f"{name} lookup found the entry",
                                     tuple(tried))
        return PolicyVerdict(False, None, DROP_POLICY,
                             "no entry in any of the lookups (" + " -> ".join(tried) + ")",
                             tuple(tried))
    cands = [e for e in mine if _ident_ok(e, identity) and _port_ok(e, port, proto)]
    if not cands:
        return PolicyVerdict(False, None, DROP_POLICY,
                             "no entry matches the identity (or the wildcard) and the port",
                             ("LPM",))

    def rank(e):
        plen = e.prefix_len if e.prefix_len is not None else (24 if e.port is not None else
                                                              (8 if e.protocol not in (None, "ANY") else 0))
        deny_first = 1 if (version.at_least(1, 17) and e.verdict == "deny") else 0
        return (e.precedence or 0, deny_first, plen, 1 if e.identity not in (None, 0) else 0)
    best = max(cands, key=rank)
    how = "longest-prefix match over the entries for the identity and the wildcard"
    if best.verdict == "deny":
        return PolicyVerdict(False, best, DROP_POLICY_DENY, how, ("LPM",))
    if best.auth_type and str(best.auth_type).lower() not in ("disabled", "none", "-", "0"):
        return PolicyVerdict(False, best, DROP_POLICY_AUTH_REQUIRED,
                             how + f"; it requires authentication ({best.auth_type})", ("LPM",))
    return PolicyVerdict(True, best, None, how, ("LPM",))
