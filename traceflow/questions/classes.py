"""Equivalence classes of clients: pods the datapath cannot tell apart share one trace.

A question over many pairs (audit, check, diff) traces one client, its representative, with
a ``Recorder`` active (``traceflow.model.reads``): every decision of the walk that read a value
of the client's own (its address, its MAC, its OVS port) says so — an OVS lookup with the
values of every field its candidate flows match on, a netfilter chain entered, a route or a
neighbour looked up for that address, a NetworkPolicy asked whether it selects the client or
whether a peer covers it. Another client of the same node then shares the trace when every one
of those decisions, made again with its own values in place of the representative's, comes out
the same; "the same" for an OVS lookup means the same flow, or the client's own flow of the
same table, priority, matches and actions with its own address, MAC and port in the places of
the representative's (SpoofGuard, L3Forwarding, L2ForwardingCalc flows are one per pod).

Why that is the same answer: the walk is a function of the packet and of those decisions; two
walks whose decisions agree at every step, with each client's own values in the same places,
are the same walk with one client's values renamed to the other's (the verdict, every path's
disposition, node, component and table are equal; the text names the representative). What
cannot be renamed safely keeps the client to itself (its own trace): a client that is a
backend of the destination (its address then also comes from the other side), pod-side files,
a datapath that gives no identity (only OVS datapaths with one port per pod do), a port number
that the flows also use as a constant, a flow that copies part of an address (``move``) — see
``port_safety``.
"""

from __future__ import annotations

import dataclasses
import ipaddress

from traceflow.engines.ovs import fields as F
# (what a walk read, and the flows as a client's own: re-exported for the runner and tests)
from traceflow.questions.classes_reads import (  # noqa: F401
    _NOTHING, BridgeFacts, Identity, Recorder, _ambiguous, _Values, canonical_flow)


# ---- keys: the decisions made again with another client's values ----------------------------------

# How much each cache keeps. The caches of a client's own answers (its signature at a list of
# flows, its answer at a lookup several destinations' walks make, a flow as its own, its
# "met before" group) hold about 110 entries per client whatever the destination: the
# clients one process answers are asked them again at every destination, so a cache smaller
# than that working set is emptied and refilled at every few destinations. Measured on the
# 5,000-pod audit, one worker answers 2,500 clients: 280,000 signatures, 260,000 answers at
# recurring lookups, so 200,000 entries made it recompute them all the time (12% of its CPU,
# docs/scale.md). A million keeps the clients of up to ~9,000 pods per process (some 200 MB
# per cache at most); the caches of one destination's lookups are emptied as it is done.
PER_CLIENT_KEPT = 1_000_000
KEPT = 200_000                 # entries of the other caches (answers of one destination, mostly)
ANALYSES_KEPT = 20_000          # lists of flows analysed, per generation (see _constraints)


class Classes:
    """Per snapshot: the static facts and the cached answers keys are built from."""

    def __init__(self, snapshot):
        self.snap = snapshot
        self.cluster = snapshot.cluster
        self._bridge_facts: dict = {}
        self._outcomes: dict = {}
        self._canonical: dict = {}
        self._by_client: dict = {}
        self._recurring: dict = {}
        self._seen: dict = {}           # an OVS lookup's key -> in how many plans it is
        self._analyses: dict = {}       # (flows, places) -> their _Constraints, this generation
        self._old_analyses: dict = {}   # and the last generation (see _constraints)
        self._chain_analyses: dict = {}
        self._chains: dict = {}
        self._route_class: dict = {}
        self._neigh_class: dict = {}
        self._policy_class: dict = {}
        self._signatures: dict = {}
        self._rep_signatures: dict = {}  # a representative's lookup -> its own signature
        self._lookup_numbers: dict = {}  # a recorded lookup's key -> its number
        self._quicks: dict = {}          # (lookup number, places) -> (its _Quick or None,)
        self._next_lookup = 0
        self._groups: dict = {}         # (lookup, answer) sets -> number
        self._next_group = 0
        self._again: dict = {}          # (set number, client address) -> all the same?
        self._port_safe: dict = {}

    def release(self) -> None:
        """Forget the answers at lookups that only one destination's walks made so far (an
        audit calls it when that destination is done: the answers at lookups made again are
        kept apart, in ``_recurring``)."""
        self._by_client.clear()

    def bridge_facts(self, bridge) -> BridgeFacts:
        got = self._bridge_facts.get(id(bridge))
        if got is None or got[0] is not bridge:
            got = self._bridge_facts[id(bridge)] = (bridge, BridgeFacts(bridge))
        return got[1]

    # -- can this client share at all ---------------------------------------------------------
    def shareable(self, rec: Recorder) -> str | None:
        """Why a representative's reads cannot be replayed for anyone (None: they can)."""
        if rec.opaque:
            return rec.opaque
        for bridge in rec.bridges.values():
            facts = self.bridge_facts(bridge)
            if facts.partial_copy:
                return f"{bridge.node}: {facts.partial_copy} copies part of an address"
        return None

    def port_safe(self, rec: Recorder, v: _Values) -> bool:
        for bridge in rec.bridges.values():
            if bridge.node != v.ident.node:
                continue
            key = (id(bridge), v.ip, v.port)
            got = self._port_safe.get(key)
            if got is None or got[0] is not bridge:
                got = self._port_safe[key] = (bridge, self.bridge_facts(bridge).port_safe(v))
            if not got[1]:
                return False
        return True

    # -- the key --------------------------------------------------------------------------------
    def same(self, rec: Recorder, rep: _Values, other: _Values) -> bool:
        """Whether every decision ``rec`` holds comes out the same for ``other`` as for the
        representative (each with its own values). The cheap decisions are asked first."""
        plan = rec.plan
        if plan is None:
            plan = rec.plan = self._plan(rec, rep)
        ip = other.ip_int
        if plan.prefixes and \
                tuple((ip & mask) == net for net, mask in plan.prefixes) != plan.rep_prefixes:
            return False
        if (other.ip in plan.destinations) != plan.rep_destination:
            return False
        for name, node, want in plan.routes:
            if self.route_class(name, node, other.ip) != want:
                return False
        for name, dev, node, want in plan.neigh:
            if self.neigh_class(name, node, dev, other) != want:
                return False
        if plan.policy is not None and \
                self._policy_of(rec, plan.policy_key, other) != plan.policy:
            return False
        for chain, pkt, ctx, matches, want in plan.nf:
            if self._nf_key(chain, pkt, ctx, matches, rep, other) != want:
                return False
        for table, chain, pkt, ctx, want in plan.nft:
            if self._nft_key(table, chain, pkt, ctx, rep, other) != want:
                return False
        values = {"ip": other.ip_int, "mac": other.mac_int, "port": other.port}
        # lookups no flow of which names the client (most of them, for most clients): one
        # test of its values against every value their flows name, once their common
        # answer is known to be the representative's
        unnamed = plan.unnamed
        if unnamed.ok is not True or any(values[kind] in named
                                         for kind, named in unnamed.named.items()):
            if not self._each(unnamed.entries, rep, other, values):
                return False
            if unnamed.ok is None:
                unnamed.settle()
        if plan.again is not None:
            # lookups an earlier representative's walk made too (the client's own flows):
            # their answers for this client, as one
            key = (plan.again, other.ip)
            got = self._again.get(key)
            if got is None:
                if len(self._again) > PER_CLIENT_KEPT:
                    self._again.clear()
                got = self._again[key] = self._each(plan.again_entries, rep, other, values)
            if not got:
                return False
        return self._each(plan.ovs, rep, other, values)

    def _each(self, entries, rep: _Values, other: _Values, values: dict) -> bool:
        for entry, want, quick in entries:
            unnamed = quick is not None and quick.applies(entry, other, values)
            if unnamed and quick.empty is not None:
                got = quick.empty       # no flow there names the client: as any such client
            else:
                got = self._ovs_outcome(entry, rep, other)
                if unnamed:
                    quick.empty = got
            if got != want:
                return False
        return True

    def _plan(self, rec: Recorder, rep: _Values) -> "_Plan":
        """The representative's decisions, in the form asked of each other client, with the
        representative's own answers."""
        plan = _Plan()
        prefixes: dict = {}
        destinations: set = set()
        for chain, pkt, ctx in rec.nf.values():
            src, dst = pkt.nw_src == rep.ip, pkt.nw_dst == rep.ip
            matches, dst_values = self._chain_matches(chain, src, dst)
            if dst:
                destinations |= dst_values
            rest = []
            for m in matches:
                field = getattr(m, "field", None)
                if type(m).__name__ == "AddrMatch" and m.cidr.version == 4 and \
                        ((field == "nw_src" and src) or (field == "nw_dst" and dst)):
                    prefixes[(int(m.cidr.network_address), int(m.cidr.netmask))] = None
                else:
                    rest.append(m)
            if rest:
                rest = tuple(rest)
                plan.nf.append((chain, pkt, ctx, rest,
                                self._nf_key(chain, pkt, ctx, rest, rep, rep)))
        plan.prefixes = tuple(prefixes)
        plan.rep_prefixes = tuple((rep.ip_int & mask) == net for net, mask in plan.prefixes)
        plan.destinations = frozenset(destinations)
        plan.rep_destination = rep.ip in plan.destinations
        plan.routes = [(name, node, self.route_class(name, node, rep.ip))
                       for name, node in rec.routes.items()]
        plan.neigh = [(name, dev, node, self.neigh_class(name, node, dev, rep))
                      for (name, dev), node in rec.neigh.items()]
        plan.policy_key = (frozenset(rec.selecting), tuple(sorted(rec.peers)))
        plan.policy = (self._policy_of(rec, plan.policy_key, rep)
                       if rec.selecting or rec.peers else None)
        plan.nft = [(table, chain, pkt, ctx, self._nft_key(table, chain, pkt, ctx, rep, rep))
                    for table, chain, pkt, ctx in rec.nft.values()]
        seen = self._seen
        if len(seen) > 500_000:
            seen.clear()
        unnamed, again, rest = [], [], []
        rep_values = {"ip": rep.ip_int, "mac": rep.mac_int, "port": rep.port}
        entries = [self._numbered(entry) for entry in rec.ovs.values()]
        for entry in entries:
            asked = (entry, self._ovs_outcome(entry, rep, rep), self._quick(entry))
            quick = asked[2]
            if quick is not None and quick.indexed is None and \
                    not any(rep_values[kind] in quick.exact for _, kind in entry[6]):
                unnamed.append(asked)       # (the representative is named by none of them)
            elif entry[5] in seen:
                again.append(asked)
            else:
                rest.append(asked)
        for entry in entries:
            seen[entry[5]] = seen.get(entry[5], 0) + 1
        plan.unnamed = _Unnamed(unnamed)
        plan.again_entries = tuple(again)
        plan.again = self._group_id(tuple((e[5], want) for e, want, _ in again)) \
            if again else None
        plan.ovs = rest
        return plan

    def _numbered(self, entry: tuple) -> tuple:
        """The recorded lookup with its key (bridge, table, the values of every field its
        flows read) as a number: the caches of answers per client are keyed by it, and a
        number is hashed at once (the key, here, once per plan). A number is never given
        twice, so a key forgotten and met again only misses what was kept for it."""
        where = entry[5]
        number = self._lookup_numbers.get(where)
        if number is None:
            if len(self._lookup_numbers) > 500_000:
                self._lookup_numbers.clear()
            self._next_lookup += 1
            number = self._lookup_numbers[where] = self._next_lookup
        return entry[:5] + (number,) + entry[6:]

    def _group_id(self, lookups: tuple) -> int:
        """A small number for a set of (lookup, answer): the key of their answers for a
        client (hashed once, here, not for every client asked)."""
        got = self._groups.get(lookups)
        if got is None:
            if len(self._groups) > 100_000:
                self._groups.clear()
                self._again.clear()
            got = self._groups[lookups] = self._next_group = self._next_group + 1
        return got

    # OVS: the lookup again with the other client's values in the representative's places.
    # Only the flows that constrain one of those places can answer differently; the client's
    # answer depends on which of them its own values satisfy (the same flows, or its own
    # flows of the same shape: its "signature"), so it is looked up once per signature.
    def _ovs_outcome(self, entry, rep: _Values, other: _Values):
        bridge, table, state, flow, ambiguous, where, places = entry
        if other is rep:
            return (self.canonical(flow, rep), ambiguous)
        mine = (where, other.ip)        # the same lookup (another destination's walk, often)
        # a lookup several representatives' walks made (the client's own flows, the reply's
        # delivery: not the destination's) is kept apart from the many made once
        cache = self._recurring if self._seen.get(where, 0) > 1 else self._by_client
        got = cache.get(mine)
        if got is not None:
            return got
        got = cache[mine] = self._ovs_fresh(entry, other, rep)
        if len(cache) > (PER_CLIENT_KEPT if cache is self._recurring else KEPT):
            cache.clear()
        return got

    def _ovs_fresh(self, entry, other: _Values, rep: _Values | None = None):
        bridge, table, state, flow, ambiguous, where, places = entry
        values = {"ip": other.ip_int, "mac": other.mac_int, "port": other.port}
        mine = {name: values[kind] for name, kind in places}
        # the other client's state, read through (no copy of the state unless it is looked
        # up: most clients' signature is one already answered); the constraints read only
        # the client's own places
        table_id = bridge.table_id(table)
        flows = bridge.flows.candidates(table_id, _Overlay(mine, state))
        analysis = self._constraints(bridge, flows, tuple(mine))
        # (which of those flows the client's values satisfy depends on the flows and the
        # values only: the same for every destination's walk through them)
        known = self._signatures.get((id(analysis), other.ip))
        if known is not None and known[0] is analysis:
            signature = known[1]
        else:
            signature = self._signature(analysis, mine, other)
            if len(self._signatures) > PER_CLIENT_KEPT:
                self._signatures.clear()
            self._signatures[(id(analysis), other.ip)] = (analysis, signature)
        key = (where, signature)
        got = self._outcomes.get(key)
        if got is None:
            if rep is not None and signature == self._own_signature(entry, rep):
                # the flows that constrain those places are, one for one, the ones the
                # representative's values satisfied (each with its own values), and every
                # other candidate reads neither: its lookup, renamed
                got = (self.canonical(flow, rep), ambiguous)
            else:
                hit, notes = self._lookup(bridge, table, {**state, **mine})
                got = (self.canonical(hit, other), _ambiguous(notes))
            if len(self._outcomes) > KEPT:
                self._outcomes.clear()
            self._outcomes[key] = got
        return got

    def _signature(self, analysis: "_Constraints", mine: dict, v: _Values) -> frozenset:
        """The flows that constrain a client's places and that its values ``mine`` satisfy,
        each as the client's own (``v``)."""
        satisfied = analysis.satisfied(mine)
        return frozenset(self.canonical(f, v) for f in satisfied) if satisfied else _NOTHING

    def _own_signature(self, entry, rep: _Values) -> frozenset:
        """The signature of the representative's own lookup (as ``_ovs_fresh`` makes one
        for another client)."""
        bridge, table, state, _, _, where, places = entry
        got = self._rep_signatures.get(where)
        if got is None:
            mine = {name: state.get(name) for name, _ in places}
            flows = bridge.flows.candidates(bridge.table_id(table), state)
            got = self._signature(self._constraints(bridge, flows, tuple(mine)), mine, rep)
            if len(self._rep_signatures) > 100_000:
                self._rep_signatures.clear()
            self._rep_signatures[where] = got
        return got

    def _quick(self, entry) -> "_Quick | None":
        """For a lookup whose candidates do not depend on the client's own values (the
        table's index is on another field) and whose flows constrain those values only
        exactly: the values they name. A client naming none of them gets the answer every
        such client gets (no flow there can tell them apart), computed once."""
        bridge, table, state, _, _, number, places = entry
        # (the same lookup in another representative's plan: the same flows, values and
        # common answer)
        known = self._quicks.get((number, places))
        if known is not None:
            return known[0]
        table_id = bridge.table_id(table)
        flows = bridge.flows.candidates(table_id, state)
        probe = bridge.flows.candidates(table_id, _Overlay({n: -1 for n, _ in places}, state))
        # (when the table's index is on one of those places, a client whose value it does
        # not hold gets the same flows as the probe: the ones without the indexed field)
        analysis = self._constraints(bridge, probe, tuple(n for n, _ in places))
        got = None if analysis.masked else \
            _Quick(analysis.exact_values, None if probe is flows else (table_id, len(probe)))
        if len(self._quicks) > KEPT:
            self._quicks.clear()
        self._quicks[(number, places)] = (got,)
        return got

    def canonical(self, flow, v: _Values):
        if flow is None:
            return None
        key = (id(flow), v.ip)
        got = self._canonical.get(key)
        if got is None or got[0] is not flow:
            if len(self._canonical) > PER_CLIENT_KEPT:
                self._canonical.clear()
            got = self._canonical[key] = (flow, canonical_flow(flow, v))
        return got[1]

    def _constraints(self, bridge, flows: list, places: tuple) -> "_Constraints":
        """The analysis of a list of flows, one object per list as long as it is in use: the
        clients' signatures are kept under it, so it is never made twice while asked. (Two
        generations: a full one becomes the old one, and what is asked from the old one
        moves to the new; most lists are one destination's and are not asked again.)"""
        key = (id(flows), places)
        got = self._analyses.get(key)
        if got is None or got[0] is not flows:
            got = self._old_analyses.get(key)
            if got is None or got[0] is not flows:
                got = (flows, _Constraints(bridge, flows, places))
            if len(self._analyses) >= ANALYSES_KEPT:
                self._old_analyses, self._analyses = self._analyses, {}
            self._analyses[key] = got
        return got[1]

    def _lookup(self, bridge, table, state):
        from traceflow.engines.ovs.pipeline import lookup_answer
        return lookup_answer(bridge, table, state)

    # netfilter: the chain's address-reading matches with the other client's packet
    def _nf_key(self, chain, pkt, ctx, matches: tuple, rep: _Values, other: _Values) -> tuple:
        key = (id(chain), pkt.nw_src == rep.ip, pkt.nw_dst == rep.ip, other.ip)
        got = self._chains.get(key)
        if got is None:
            opkt, octx = _swap_packet(pkt, ctx, rep, other)
            if len(self._chains) > KEPT:
                self._chains.clear()
            got = self._chains[key] = tuple(m.check(opkt, octx) for m in matches)
        return got

    def _chain_matches(self, chain, src: bool, dst: bool):
        key = (id(chain), src, dst)
        got = self._chain_analyses.get(key)
        if got is None or got[0] is not chain:
            matches, dst_values = _address_matches(chain, src, dst)
            got = self._chain_analyses[key] = (chain, matches, dst_values)
        return got[1], got[2]

    def _nft_key(self, table, chain, pkt, ctx, rep: _Values, other: _Values) -> tuple:
        src, dst = pkt.nw_src == rep.ip, pkt.nw_dst == rep.ip
        key = ("nft", id(chain), src, dst, other.ip)
        got = self._chains.get(key)
        if got is None:
            from traceflow.questions.classes_nft import nft_chain_key
            opkt, octx = _swap_packet(pkt, ctx, rep, other)
            if len(self._chains) > KEPT:
                self._chains.clear()
            got = self._chains[key] = nft_chain_key(table, chain, opkt, octx, src, dst)
        return got

    def route_class(self, name: str, node, ip: str) -> tuple:
        """Which routes and rules contain ``ip`` on ``node``, and whether it is local: a route
        lookup reads an address only through these."""
        key = (name, ip)
        got = self._route_class.get(key)
        if got is None:
            value = int(ipaddress.IPv4Address(ip))
            routes = frozenset(id(r) for r in node.routes
                               if r.family == 4 and r.dst.contains(4, value))
            rules = tuple((r.src.contains(4, value) if r.src is not None else None,
                           r.dst.contains(4, value) if r.dst is not None else None)
                          for r in node.ip_rules)
            got = self._route_class[key] = (routes, rules, ip in node.local_addresses)
        return got

    def neigh_class(self, name: str, node, dev: str, v: _Values) -> tuple:
        key = (name, dev, v.ip)
        got = self._neigh_class.get(key)
        if got is None:
            from traceflow.engines.neigh import ethernet_mac, resolve
            neigh = node.neighbours
            if neigh is None:
                got = (None,)
            else:
                res = resolve(neigh, v.ip, dev)
                entry = res.neighbour
                mac = ethernet_mac(entry) if entry is not None else None
                got = (res.usable, entry is not None,
                       (mac or "").lower() == (v.mac or "") if mac else None,
                       tuple(entry.states) if entry is not None else None)
            self._neigh_class[key] = got
        return got

    def _policy_of(self, rec: Recorder, asked: tuple, v: _Values) -> tuple:
        """The NetworkPolicies as written, asked what the walk asked about the client
        (``asked``: the policy types and peers the walk asked, as the plan keeps them)."""
        key = (asked, v.ip)
        got = self._policy_class.get(key)
        if got is None:
            if len(self._policy_class) > 100_000:
                self._policy_class.clear()
            got = self._policy_class[key] = self._policy_class_of(rec, v)
        return got

    def _policy_class_of(self, rec: Recorder, v: _Values) -> tuple:
        from traceflow.bundle import kube
        pod = self.cluster.pod_by_ip(v.ip)
        selecting = tuple(frozenset(id(p) for p in self.cluster.policies_selecting(pod, t))
                          if pod is not None else None for t in sorted(rec.selecting))
        peers = tuple(kube.peer_covers(self.cluster, policy, peer, v.ip)
                      for _, (policy, peer) in sorted(rec.peers.items()))
        return selecting, peers


class _Quick:
    """The exact values a lookup's flows want in the client's places, and the answer of a
    client naming none of them (once one was asked)."""

    __slots__ = ("exact", "empty", "indexed")

    def __init__(self, exact: set, indexed: tuple | None):
        self.exact, self.empty = exact, None
        self.indexed = indexed          # (table, how many flows a client unnamed by the index gets)

    def applies(self, entry, other: "_Values", values: dict) -> bool:
        """Whether no flow of the lookup names the client (its answer is the unnamed one)."""
        places = entry[6]
        if any(values[kind] in self.exact for _, kind in places):
            return False
        if self.indexed is None:
            return True
        table, size = self.indexed
        flows = entry[0].flows.candidates(table, _Overlay(
            {name: values[kind] for name, kind in places}, entry[2]))
        return len(flows) == size


class _Overlay:
    """A state with some fields replaced, for ``get`` only (what candidates() asks)."""

    __slots__ = ("mine", "state")

    def __init__(self, mine: dict, state: dict):
        self.mine, self.state = mine, state

    def get(self, key, default=None):
        got = self.mine.get(key, _ABSENT)
        return self.state.get(key, default) if got is _ABSENT else got


_ABSENT = object()


class _Plan:
    """A representative's recorded decisions as another client is asked them (Classes.same):
    the address prefixes netfilter rules test (one tuple of memberships), the destinations
    of kube-proxy's service rules, then routes, neighbours, policies, other netfilter matches,
    nftables chains and OVS lookups, each with the representative's own answer."""

    __slots__ = ("prefixes", "rep_prefixes", "destinations", "rep_destination", "routes",
                 "neigh", "policy", "policy_key", "nf", "nft", "ovs", "unnamed", "again",
                 "again_entries")

    def __init__(self):
        self.nf: list = []


class _Unnamed:
    """A plan's OVS lookups whose candidate flows name the client's own values only exactly
    and do not depend on them (``_Quick`` with no index on them): the values they name, by
    kind, and whether their common answer (a client named by none of them) is known to be
    the representative's at every one (None: not known yet)."""

    __slots__ = ("entries", "named", "ok")

    def __init__(self, entries: list):
        self.entries = tuple(entries)
        self.named: dict = {}
        for entry, _, quick in entries:
            for _, kind in entry[6]:
                self.named.setdefault(kind, set()).update(quick.exact)
        self.ok = None if entries else True

    def settle(self) -> None:
        """Once every lookup's common answer is known: whether they all equal the
        representative's (then a client naming none of the values shares all of them)."""
        if all(quick.empty is not None for _, _, quick in self.entries):
            self.ok = all(quick.empty == want for _, want, quick in self.entries)


class _Constraints:
    """The flows of one candidate list that constrain one of the places where the client's
    own values are (fields of the lookup's state): indexed by the exact value they want
    there, with masked ones kept apart."""

    def __init__(self, bridge, flows: list, places: tuple):
        self.exact: dict = {}           # (field, value) -> [flow]
        self.masked: list = []          # (flow, [(field, value, mask)])
        wanted = set(places)
        for flow in flows:
            cons = []
            for m in flow.matches:
                if m.field.name not in wanted:
                    continue
                value = m.value
                if value is None:
                    value = bridge.port_number(m.port_name) if m.port_name else None
                    if value is None:
                        continue        # an unknown port name: no packet has it
                cons.append((m.field.name, value, m.mask))
            if not cons:
                continue
            exact = next(((f, v) for f, v, mask in cons
                          if mask == F.full_mask(F.FIELDS[f])), None)
            if exact is not None:
                self.exact.setdefault(exact, []).append((flow, cons))
            else:
                self.masked.append((flow, cons))
        self.fields = sorted({f for f, _ in self.exact})
        # the values those flows want there exactly (one set, shared by every lookup of
        # these flows: a _Quick of each recorded lookup refers to it)
        self.exact_values = frozenset(value for (_, value) in self.exact)

    def satisfied(self, state: dict) -> list:
        """The flows whose constraints on those places ``state`` meets."""
        out = []
        for name in self.fields:
            for flow, cons in self.exact.get((name, state.get(name)), ()):
                if all((state.get(f, 0) & mask) == v for f, v, mask in cons):
                    out.append(flow)
        for flow, cons in self.masked:
            if all((state.get(f, 0) & mask) == v for f, v, mask in cons):
                out.append(flow)
        return out


def _swap_packet(pkt, ctx, rep: _Values, other: _Values):
    """The packet (and the connection's original tuple) with ``other``'s address and MAC
    where ``rep``'s are."""
    out = pkt.copy()
    for name in ("nw_src", "nw_dst"):
        if getattr(out, name) == rep.ip:
            setattr(out, name, other.ip)
    if rep.mac:
        for name in ("dl_src", "dl_dst"):
            if str(getattr(out, name) or "").lower() == rep.mac:
                setattr(out, name, other.mac)
    orig = getattr(ctx, "ct_orig", None)
    if orig is not None and rep.ip in (orig.nw_src, orig.nw_dst):
        swapped, _ = _swap_packet(orig, None, rep, other)
        ctx = dataclasses.replace(ctx, ct_orig=swapped)
    return out, ctx


# iptables matches that never read an address or MAC (anything else is asked again)
_NOT_ADDRESS = ("ProtoMatch", "PortMatch", "MultiportMatch", "IfaceMatch", "FragmentMatch",
                "MarkMatch", "ConnmarkMatch", "CtStateMatch", "CtDirMatch", "StatisticMatch",
                "CommentMatch", "PhysdevMatch", "LengthMatch", "LimitMatch")


def _address_matches(chain, src: bool, dst: bool) -> tuple[tuple, frozenset]:
    """The matches of ``chain`` that may read the client's address (on the side it is on) or
    MAC; kube-proxy's service rules (``-d VIP/32 -p tcp --dport N -j KUBE-SVC-...``, kept
    unparsed by the lazy reader) only as their destination addresses."""
    out = []
    dst_values = set()
    service = getattr(chain, "_service_destinations", None)
    known = service() if service is not None else None
    for i in range(chain.rule_count()):
        if known is not None and known[i] is not None:
            dst_values.add(known[i])
            continue
        for m in chain.rule_at(i).matches:
            name = type(m).__name__
            if name in _NOT_ADDRESS:
                continue
            field = getattr(m, "field", None)
            if name == "AddrMatch" and ((field == "nw_src" and not src) or
                                        (field == "nw_dst" and not dst)):
                continue
            out.append(m)
    return tuple(out), frozenset(dst_values)
