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
DROP_IS_CLUSTER_IP = "DROP_IS_CLUSTER_IP"           # -174
DROP_NOT_IN_SRC_RANGE = "DROP_NOT_IN_SRC_RANGE"     # -177
DROP_NO_EGRESS_GATEWAY = "DROP_NO_EGRESS_GATEWAY"   # -194
DROP_UNROUTABLE = "DROP_UNROUTABLE"                 # -151
DROP_CODES = {DROP_POLICY: -133, DROP_NO_SERVICE: -158, DROP_NO_TUNNEL_ENDPOINT: -160,
              DROP_NO_FIB: -169, DROP_POLICY_DENY: -181, DROP_POLICY_AUTH_REQUIRED: -189,
              DROP_IS_CLUSTER_IP: -174, DROP_NOT_IN_SRC_RANGE: -177,
              DROP_NO_EGRESS_GATEWAY: -194, DROP_UNROUTABLE: -151}

# reserved security identities (pkg/identity/numericidentity.go)
RESERVED = {0: "unknown (any)", 1: "reserved:host", 2: "reserved:world", 3: "reserved:unmanaged",
            4: "reserved:health", 5: "reserved:init", 6: "reserved:remote-node",
            7: "reserved:kube-apiserver", 8: "reserved:ingress"}


# ---- ipcache --------------------------------------------------------------------------------

def ipcache_lookup(entries, ip: str):
    """The longest-prefix ipcache entry holding ``ip`` (None when none does). ``entries``: the
    parsed entries, or an IpcacheIndex (keyed.py) giving those whose prefix may hold it."""
    addr = ipaddress.ip_address(ip)
    if hasattr(entries, "candidates"):
        entries = entries.candidates(ip)
    best, best_len = None, -1
    for e in entries:
        if getattr(e, "cluster_id", 0):
            continue        # another cluster's entry: the lookup is made with cluster id 0
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
    count: int | None = None        # the slots prandom() chooses among (1..count)
    lost: tuple = ()                # (slot, backend id) within 1..count whose backend is gone
    assumed: str = ""               # what the selection assumes (no count in the bundle)


def service_lookup(services, ip: str, port: int, proto: str, from_cluster: bool = True,
                   version=None):
    """``lb4_lookup_service`` (bpf/lib/lb.h): the entry for (address, port, protocol), the
    internal-scope twin (`/i`) for east-west traffic of a two-scope service. With protocol
    differentiation (1.17: the key carries the protocol) a packet whose protocol has no entry
    falls back to an ANY entry, else is no service's; a key without a protocol (<= 1.16)
    matches every protocol. None when no entry exists (the packet is not for a service)."""
    if hasattr(services, "at"):         # read by frontend (keyed.py): this address and port's
        services = services.at(ip, port)
    matches = [s for s in services if s.frontend_ip == ip and s.port == port
               and (s.protocol is None or s.protocol.upper() == proto.upper())]
    if not matches:
        matches = [s for s in services if s.frontend_ip == ip and s.port == port
                   and s.protocol is not None and s.protocol.upper() == "ANY"]
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
    lost = tuple(getattr(svc, "missing", ()) or ())
    if svc.count is not None:
        return _by_count(svc, why, lost)
    active = [b for b in svc.backends if (getattr(b, "state", None) or "active") == "active"]
    note = ""
    assumed = ""
    if len(active) != len(svc.backends):
        left = [f"{b.ip}:{b.port} ({b.state})" for b in svc.backends if b not in active]
        if active:
            note = "not candidates for new connections: " + ", ".join(left)
        else:
            # the agent puts terminating backends in the slots only when no active one is
            # left (pkg/loadbalancer/tests/testdata/graceful-termination.txtar)
            active = [b for b in svc.backends if (b.state or "") == "terminating"]
            note = ("no active backend: terminating ones still serve ("
                    + ", ".join(left) + ")")
    elif svc.backends and not any(getattr(b, "state", None) for b in svc.backends) \
            and (version is None or version.at_least(1, 11)):
        # backend states (terminating, then quarantined) arrived with 1.11's graceful
        # termination: before it every backend in the map is an active one
        assumed = ("the bundle does not give this service's slot count (`bpf lb list "
                   "--frontends`, cilium-bpf-lb-list-frontends.txt) nor its backends' states "
                   "(`service list`): every slot is taken as one a new connection can take; "
                   "slots after the count (quarantined or terminating backends) never are")
    return ServiceHit(svc, why, tuple(active), note, len(active) + len(lost), lost, assumed)


def _by_count(svc, why: str, lost: tuple) -> ServiceHit:
    """The slots ``lb4_select_backend_id`` chooses among: ``slot = prandom() % count + 1``
    (bpf/lib/lb.h, lb4_select_backend_id_random, 1.17 line 1420): slots 1..count; the
    ``qcount`` slots after them hold quarantined or terminating backends, never chosen for a
    new connection (pkg/loadbalancer/tests/testdata/quarantined.txtar: COUNT=1 QCOUNT=1)."""
    count = svc.count
    src = svc.count_source
    at = f" ({src.file}:{src.line})" if src is not None else ""
    inside = tuple(b for b in svc.backends if b.slot is not None and 1 <= b.slot <= count)
    after = [b for b in svc.backends if b.slot is not None and b.slot > count]
    lost_in = tuple((s, i) for s, i in lost if s is not None and 1 <= s <= count)
    unslotted = [b for b in svc.backends if b.slot is None]
    notes = [f"count {count}, qcount {svc.qcount or 0}{at}: new connections take slots 1..{count}"]
    if after:
        notes.append("never chosen for a new connection: " + ", ".join(
            f"slot {b.slot} {b.ip}:{b.port}" + (f" ({b.state})" if b.state else
                                                " (quarantined or terminating)")
            for b in after))
    if unslotted:
        # <= 1.11 prints no slots: which backends are the first `count` is not said
        return ServiceHit(svc, why, tuple(svc.backends), "; ".join(notes), len(svc.backends),
                          lost_in, "this output prints no slot numbers: which backends are in "
                                   f"slots 1..{count} is not known; every one is taken")
    seen = {b.slot for b in inside} | {s for s, _ in lost_in}
    # a slot within the count that the listing lacks: the slot lookup fails (backend id 0)
    lost_in += tuple((s, None) for s in range(1, count + 1) if s not in seen)
    return ServiceHit(svc, why, inside, "; ".join(notes), count, lost_in)


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


# ---- Maglev: the backend of one 5-tuple ----------------------------------------------------

JHASH_INITVAL = 0xDEADBEEF
MAGLEV_DEFAULT_SEED = "JLfvgnHc2kaSUFaI"    # pkg/maglev/maglev.go DefaultHashSeed
MAGLEV_DEFAULT_TABLE_SIZE = 16381           # pkg/maglev/maglev.go (bpf-lb-maglev-table-size)


def _rol32(word: int, shift: int) -> int:
    return ((word << shift) | (word >> ((-shift) & 31))) & 0xFFFFFFFF


def jhash_3words(a: int, b: int, c: int, initval: int) -> int:
    """bpf/lib/jhash.h jhash_3words (the kernel's jhash): __jhash_nwords with initval +
    JHASH_INITVAL + (3 << 2), then __jhash_final. Checked against Cilium's own vectors
    (bpf/tests/jhash_test.c)."""
    m = 0xFFFFFFFF
    init = (initval + JHASH_INITVAL + (3 << 2)) & m
    a, b, c = (a + init) & m, (b + init) & m, (c + init) & m
    c ^= b; c = (c - _rol32(b, 14)) & m
    a ^= c; a = (a - _rol32(c, 11)) & m
    b ^= a; b = (b - _rol32(a, 25)) & m
    c ^= b; c = (c - _rol32(b, 16)) & m
    a ^= c; a = (a - _rol32(c, 4)) & m
    b ^= a; b = (b - _rol32(a, 14)) & m
    c ^= b; c = (c - _rol32(b, 24)) & m
    return c


def maglev_seed_jhash0(seed_b64: str) -> int:
    """SeedJhash0 of the cluster's Maglev seed (pkg/maglev/maglev.go: bytes 4..7 of the
    12-byte base64 seed, big-endian), the HASH_INIT4_SEED the datapath is compiled with."""
    import base64
    d = base64.b64decode(seed_b64, validate=True)
    if len(d) != 12:
        raise ValueError(f"the Maglev seed decodes to {len(d)} bytes, not 12")
    return int.from_bytes(d[4:8], "big")


def maglev_index(src_ip: str, src_port: int, dst_port: int, proto: int, seed0: int,
                 size: int) -> int:
    """The lookup-table index of a new connection: ``hash_from_tuple_v4(tuple) %
    LB_MAGLEV_LUT_SIZE`` (bpf/lib/lb.h lb4_select_backend_id_maglev, 1.17 line 1446;
    bpf/lib/hash.h: jhash_3words(saddr, dport << 16 | sport, nexthdr, HASH_INIT4_SEED)). The
    tuple holds the packet's big-endian fields read as little-endian words (x86): the source
    address, and the ports as lb4_extract_tuple loads them (tuple->dport is the packet's
    source port, tuple->sport its destination port)."""
    import ipaddress
    saddr = int.from_bytes(ipaddress.ip_address(src_ip).packed, "little")

    def swap16(v: int) -> int:
        return ((v & 0xFF) << 8) | (v >> 8)
    ports = ((swap16(src_port) << 16) | swap16(dst_port)) & 0xFFFFFFFF
    return jhash_3words(saddr, ports, proto, seed0) % size
