"""Many questions over one bundle: one Snapshot (each node parsed once), one trace per
distinct question, and a progress line on a terminal for long runs.

On a host-only bundle (a node without OVS flows, like the generated kube-proxy examples) a
pod's trace cannot leave the pod; there the question is answered for the part the bundle
holds, the Service translation on the client's node (``host_service_trace``), and the trace
says so in its warnings and its ``scope``.
"""

from __future__ import annotations

import ipaddress
import re
import sys
import time

from traceflow.bundle.kube import Pod
from traceflow.model.packet import PROTO_NUMBERS, Packet
from traceflow.questions.select import Destination
from traceflow.bundle.snapshot import Missing, Snapshot
from traceflow.model.trace import Disposition, Drop, Hop, Leg, Path, Trace, Verdict

SCOPE_FULL = "end-to-end"
SCOPE_SERVICE = "service-translation"


class Tracer:
    """Answers (source pod, destination) questions over one Snapshot, each once."""

    def __init__(self, snapshot: Snapshot):
        from traceflow.questions.solver import Solver
        self.snap = snapshot
        self.solver = Solver(snapshot)
        self._cache: dict[tuple, Trace] = {}
        self.traced = 0             # distinct questions actually traced
        self._classes: dict = {}    # host-only: (node, destination) -> [(chains, class, trace)]
        self._sources: dict = {}    # node -> SourceClasses
        self._ovs: dict = {}        # node -> has OVS flows
        self.asked = 0

    def key(self, pod, dst: Destination, src_port: int = 54321, via: str | None = None) -> tuple:
        return (pod.key, dst.ip, dst.port, dst.protocol, src_port, dst.kind, via)

    def trace(self, pod, dst: Destination, src_port: int = 54321, via: str | None = None) -> Trace:
        """The trace of one question. ``pod`` is the source: a pod, or the Endpoint of a node
        or an outside client (traceflow.walk.endpoints)."""
        self.asked += 1
        key = self.key(pod, dst, src_port, via)
        got = self._cache.get(key)
        if got is not None:
            return got
        if isinstance(pod, Pod) and pod.node and not pod.host_network \
                and not self._has_ovs(pod.node) and not _unusable(pod) and dst.endpoint is None \
                and ":" not in dst.ip:      # IPv6: source classes are read from IPv4 rules
            got = self._shared_service_trace(pod, dst, src_port)
        else:
            got = self._trace(pod, dst, src_port, via)
            self.traced += 1
        self._cache[key] = got
        return got

    def _shared_service_trace(self, pod: Pod, dst: Destination, src_port: int) -> Trace:
        """Service translations of one node for one destination: clients the rules cannot
        tell apart share one trace. Two sources are told apart only by the rules of the
        chains the walk visited (hit or not); a source match there splits the class (see
        SourceClasses), anything source-dependent it cannot read keeps every source apart."""
        slot = self._classes.setdefault((pod.node, dst.ip, dst.port, dst.protocol, src_port), [])
        for chains, cls_key, trace in slot:
            if self._source_classes(pod.node).key(chains, pod.ip) == cls_key:
                return Trace(dict(trace.query, source=pod.key, shares_trace_of=trace.query["source"]),
                             trace.paths, trace.warnings)
        trace = self._trace(pod, dst, src_port)
        self.traced += 1
        chains = frozenset(h.chain for p in trace.paths for leg in p.legs for h in leg.hops
                           if h.chain)
        slot.append((chains, self._source_classes(pod.node).key(chains, pod.ip), trace))
        return trace

    def _source_classes(self, node: str) -> "SourceClasses":
        got = self._sources.get(node)
        if got is None:
            model = self.node_model(node)
            got = self._sources[node] = SourceClasses(model.netfilter if model else None,
                                                      model.local_addresses if model else ())
        return got

    def _trace(self, pod, dst: Destination, src_port: int, via: str | None = None) -> Trace:
        from traceflow.questions.ends import entry_nodes
        from traceflow.questions.solver import Query
        from traceflow.walk.endpoints import Kind, query_kind
        if isinstance(pod, Pod):
            problem = _unusable(pod)
            if problem:
                return _unknown_trace(pod, dst, problem)
            if not pod.host_network and not self._has_ovs(pod.node) and dst.endpoint is None:
                return host_service_trace(self.snap, pod, dst, src_port)
        src = source_endpoint_of(pod, 6 if ":" in dst.ip else 4)
        end = destination_endpoint_of(dst)
        entries, assumed = entry_nodes(self.snap.cluster, src, end, via,
                                       self.snap.bundle.node_names())
        kind = query_kind(src, end)
        if dst.kind == "ip":            # an address the suite gave as is: as pod-to-pod did
            kind = "pod-to-pod" if src.kind is Kind.POD else kind
        q = Query(kind, pod if isinstance(pod, Pod) else None, dst.ip, dst.port, dst.protocol,
                  src_port, dst.label, dst.service, None, True, src, end,
                  entries[0] if via is not None and entries else None, entries,
                  tuple(dst.notes) + tuple(assumed))
        self.solver.warnings = []       # warnings are per trace
        trace = self.solver.trace(q)
        trace.query.setdefault("scope", SCOPE_FULL)
        return trace

    def _has_ovs(self, node: str) -> bool:
        """Whether a pod's packet can be followed out of the pod on this node: the node's
        files are there with the CNI's datapath (its conventions' ``datapath_files``: an
        OVS bridge's flows; BPF maps are read per file as the walk needs them, a missing one
        said in the trace)."""
        got = self._ovs.get(node)
        if got is None:
            present = node in self.snap.bundle.node_names()
            got = self._ovs[node] = present and all(
                self.snap.bundle.node_file(node, f) is not None
                for f in self.snap.conventions.datapath_files)
        return got

    def node_model(self, name: str):
        try:
            return self.snap.node(name)
        except Missing:
            return None


def source_endpoint_of(source, family: int | None = None):
    """A suite source as a typed end: a pod's Endpoint (at its address of ``family``, a
    dual-stack pod having one per family), or the Endpoint itself."""
    from traceflow.walk.endpoints import Endpoint
    return Endpoint.of_pod(source, family) if isinstance(source, Pod) else source


def destination_endpoint_of(dst: Destination):
    """A suite destination as a typed end (a Service's cluster IP, a pod, or the Endpoint
    `traceflow trace` resolved it to)."""
    from traceflow.walk.endpoints import Endpoint, Frontend, Kind
    if dst.endpoint is not None:
        return dst.endpoint
    if dst.service is not None:
        return Endpoint.of_service(dst.service, Frontend.CLUSTERIP, dst.ip, dst.port)
    if dst.pod is not None:
        return Endpoint.of_pod(dst.pod, 6 if ":" in dst.ip else 4)
    return Endpoint(Kind.POD, dst.ip, None, dst.label)


def _unusable(pod: Pod) -> str | None:
    if not pod.ip:
        return f"pod {pod.key} has no IP (phase {pod.phase})"
    if pod.phase != "Running":
        return f"pod {pod.key} is not Running (phase {pod.phase})"
    if not pod.node:
        return f"pod {pod.key} is not scheduled on a node"
    return None


def _unknown_trace(pod: Pod, dst: Destination, why: str) -> Trace:
    t = Trace(_query(pod, dst, 54321, SCOPE_FULL))
    leg = Leg("request", Verdict.UNKNOWN, [Hop(pod.node or "?", "pod", None, None, why,
                                               unknown=True)], "", Disposition.UNKNOWN)
    t.paths.append(Path(None, 1.0, Verdict.UNKNOWN, Drop(pod.node or "?", "pod", None, None, why,
                                                         Disposition.UNKNOWN),
                        [leg], [], Disposition.UNKNOWN))
    return t


def _query(pod: Pod, dst: Destination, src_port: int, scope: str) -> dict:
    return {"kind": "pod-to-svc" if dst.service else "pod-to-pod", "source": pod.key,
            "destination": dst.label, "protocol": dst.protocol, "dst_port": dst.port,
            "src_port": src_port, "dst_ip": dst.ip, "scope": scope}


def host_service_trace(snap: Snapshot, pod: Pod, dst: Destination, src_port: int) -> Trace:
    """The Service translation the client's node does (PREROUTING: iptables or nft, then
    IPVS): delivered = sent on to a backend, dropped = rejected/dropped (e.g. no endpoints)."""
    from traceflow.engines.netfilter.engine import NodeContext, evaluate_hook
    trace = Trace(_query(pod, dst, src_port, SCOPE_SERVICE))
    trace.warnings.append(f"nodes/{pod.node} has no OVS flows (host-only bundle): only the "
                          f"Service translation on {pod.node} is traced, not the pod-to-pod "
                          "forwarding")
    family = 6 if ":" in dst.ip else 4
    try:
        node = snap.node(pod.node)
        rs = node.netfilter_for(family)      # ip6tables-save for an IPv6 Service
        ipvs = node.ipvs
    except Missing as miss:
        return _unknown_trace(pod, dst, f"cannot continue: {miss}")
    pkt = Packet(nw_src=pod.address(family) or pod.ip, nw_dst=dst.ip,
                 nw_proto=PROTO_NUMBERS[dst.protocol.lower()], tp_src=src_port, tp_dst=dst.port)
    ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets, node=pod.node,
                      ct_state={"NEW"}, ct_dir="ORIGINAL")
    if rs is None:
        branches, component = [], None
    elif hasattr(rs, "evaluate_hook"):
        branches, component = rs.evaluate_hook("PREROUTING", pkt, ctx), "nft"
    else:
        branches, component = evaluate_hook(rs, "PREROUTING", pkt, ctx), "iptables"
    if not branches:
        from traceflow.engines.netfilter.engine import Branch
        branches = [Branch(1.0, pkt.copy(), "ACCEPT", [])]
    def forward(pkt):
        """The filter FORWARD hook (kube-proxy rejects Services without endpoints there)."""
        fctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets,
                           node=pod.node, ct_state={"NEW"}, ct_dir="ORIGINAL")
        if rs is None:
            return [(1.0, pkt, "ACCEPT", [])]
        got = (rs.evaluate_hook("FORWARD", pkt, fctx) if hasattr(rs, "evaluate_hook")
               else evaluate_hook(rs, "FORWARD", pkt, fctx))
        if not got:
            return [(1.0, pkt, "ACCEPT", [])]
        return [(b.weight, b.packet, b.verdict, [_step_hop(pod.node, component, s)
                                                 for s in b.steps]) for b in got]

    for nf in branches:
        hops = [_step_hop(pod.node, component, s) for s in nf.steps]
        out, weight = nf.packet, nf.weight
        sub = [(1.0, out, "ACCEPT" if nf.verdict == "ACCEPT" else nf.verdict, [])]
        if nf.verdict == "ACCEPT" and out.nw_dst == dst.ip and ipvs is not None:
            got = ipvs.evaluate(out)
            if got is not None:
                sub = [(b.weight, b.packet, b.verdict, [_step_hop(pod.node, "ipvs", s)
                                                        for s in b.steps]) for b in got]
        if ipvs is None or sub[0][3] == []:
            # forwarded on (IPVS-translated packets are delivered locally, not forwarded)
            sub = [(w * fw, fpkt, fv, more + fmore) for w, opkt, v, more in sub
                   for fw, fpkt, fv, fmore in (forward(opkt) if v == "ACCEPT"
                                               else [(1.0, opkt, v, [])])]
        for w, opkt, verdict, more in sub:
            leg = Leg("request", Verdict.UNKNOWN, hops + more,
                      f"{pod.key} -> {dst.label} ({dst.ip}:{dst.port}) on {pod.node}")
            translated = opkt.nw_dst != dst.ip or opkt.tp_dst != dst.port
            if verdict == "ACCEPT" and translated:
                v, drop = Verdict.DELIVERED, None
                target = snap.cluster.pod_by_ip(opkt.nw_dst)
                endpoint = target.key if target else f"{opkt.nw_dst}:{opkt.tp_dst}"
                # sent on to the backend the translation chose (the scope: only that is traced)
                disposition = (Disposition.DELIVERED_POD if target is not None else
                               Disposition.DELIVERED_HOST if snap.cluster.node_by_ip(opkt.nw_dst)
                               else Disposition.LEFT_CLUSTER)
            elif verdict == "ACCEPT":
                last = leg.hops[-1] if leg.hops else None
                why = (f"no Service translation on {pod.node} for {dst.ip}:{dst.port}; the rest "
                       "of the path needs the node's OVS flows")
                v, endpoint, disposition = Verdict.UNKNOWN, None, Disposition.UNKNOWN
                drop = Drop(pod.node, component or "iptables", last.table if last else None,
                            last.rule if last else None, why, disposition)
            else:
                last = leg.hops[-1] if leg.hops else None
                v = Verdict.UNKNOWN if verdict == "UNKNOWN" else Verdict.DROPPED
                disposition = {"UNKNOWN": Disposition.UNKNOWN,
                               "REJECT": Disposition.REJECTED}.get(verdict,
                                                                   Disposition.DROPPED_RULE)
                endpoint = None
                drop = Drop(pod.node, last.component if last else (component or "iptables"),
                            last.chain or last.table if last else None,
                            last.rule if last else None, last.effect if last else verdict,
                            disposition)
            leg.verdict = v
            leg.disposition = disposition
            trace.paths.append(Path(endpoint, round(weight * w, 6), v, drop, [leg], [],
                                    disposition))
    return trace


def _step_hop(node: str, component: str | None, step) -> Hop:
    rule = step.rule
    src = getattr(rule, "source", None) if rule is not None else None
    text = getattr(rule, "text", None) if rule is not None else None
    return Hop(node, component or "iptables", step.table, text, step.effect, chain=step.chain,
               detail="ipvs" if component == "ipvs" else "netfilter-rule",
               source=src, matched=tuple(step.matched), unknown=step.unknown)


_IPT_SRC = re.compile(r"(!\s+)?(?:-s|--source)\s+([0-9.]+(?:/[0-9]+)?)(?=\s|$)")
_NFT_SRC = re.compile(r"ip saddr (!= )?([0-9.]+(?:/[0-9]+)?)(?=\s|$)")
# source-dependent matches this module does not evaluate: sources stay apart
# (`-m recent` is left out: with no recent lists in the bundle the engine takes every client
# as a first connection alike, so it does not tell sources apart)
_OPAQUE = re.compile(r"--src-range|--match-set \S+ \S*src|--ctorigsrc|"
                     r"saddr\s*[@{]|saddr \.|\. ip saddr|jhash|saddr (?:!= )?[a-z$]")


_NFT_UPDATE = re.compile(r"\b(?:update|add) @\S+ \{ ip saddr")
_NFT_SET_SRC = re.compile(r"^(?:.* )?ip saddr @(\S+)(?: (?:goto|jump|accept|drop|return|counter)\b.*)?$")


def _set_members(table, name: str):
    """A set's members as (network, mask) integers; None when they cannot be read."""
    sets = getattr(table, "sets", None) or {}
    found = sets.get(name)
    if found is None:
        return None
    out = set()
    for element in found.elements:
        text = element.text.split(" expires")[0].split(" timeout")[0].strip()
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            return None
        out.add((int(net.network_address), int(net.netmask)))
    return out


_SETS_MARK = re.compile(r"-j MARK\b|--set-x?mark|meta mark set")
_MATCHES_MARK = re.compile(r"-m mark\b|-m connmark\b|meta mark (?:&|==|!=|0x)|ct mark (?:&|==|!=|0x)")
_TARGET = re.compile(r"(?:-j|-g|jump|goto)\s+(\S+)")


class SourceClasses:
    """Which source addresses a node's rules cannot tell apart, per set of visited chains.

    A rule matching the source address splits the sources by that prefix; a source match
    whose only consequence is a mark (kube-proxy's hairpin masquerade marking) does not split
    them when no visited rule matches on marks, since the mark does not change the verdict or
    the translation at this hook."""

    def __init__(self, ruleset, local_addresses=()):
        self._local = set(local_addresses)
        self._chains: dict[str, dict] = {}
        tables = list(ruleset.tables.values()) if ruleset is not None else []
        mark_only = set()
        for table in tables:
            for name, chain in table.chains.items():
                if chain.rules and all(_SETS_MARK.search(r.text) and not _MATCHES_MARK.search(r.text)
                                       for r in chain.rules):
                    mark_only.add(name)
        for table in tables:
            for name, chain in table.chains.items():
                info = self._chains.setdefault(name, {"prefixes": set(), "mark_prefixes": set(),
                                                      "opaque": False, "mark_match": False,
                                                      "src_type": False})
                for rule in chain.rules:
                    text = rule.text
                    if _MATCHES_MARK.search(text):
                        info["mark_match"] = True
                    if "--src-type" in text or "fib saddr type" in text:
                        info["src_type"] = True     # splits sources by "a local address?"
                    if _NFT_UPDATE.search(text):
                        continue    # records the source for later packets; decides nothing now
                    named = _NFT_SET_SRC.search(text)
                    if named:       # ip saddr @set: sources split by the set's listed members
                        members = _set_members(table, named.group(1))
                        if members is None:
                            info["opaque"] = True
                        else:
                            info["prefixes"].update(members)
                        continue
                    if "-s " not in text and "--source" not in text and "saddr" not in text \
                            and not _OPAQUE.search(text) or "--src-type" in text and \
                            not _IPT_SRC.search(text):
                        continue
                    found = [*_IPT_SRC.finditer(text), *_NFT_SRC.finditer(text)]
                    if _OPAQUE.search(text) or not found:
                        info["opaque"] = True
                        continue
                    target = _TARGET.search(text)
                    only_mark = bool(target and target.group(1) in mark_only) or \
                        bool(_SETS_MARK.search(text) and not target)
                    for m in found:
                        net = ipaddress.ip_network(m.group(2), strict=False)
                        key = (int(net.network_address), int(net.netmask))
                        info["mark_prefixes" if only_mark else "prefixes"].add(key)
        self._compiled: dict = {}
        self._ints: dict = {}

    def _compile(self, chains: frozenset):
        got = self._compiled.get(chains)
        if got is None:
            infos = [self._chains[c] for c in chains if c in self._chains]
            opaque = any(i["opaque"] for i in infos)
            src_type = any(i["src_type"] for i in infos)
            marks_matter = any(i["mark_match"] for i in infos)
            prefixes = set()
            for i in infos:
                prefixes |= i["prefixes"]
                if marks_matter:
                    prefixes |= i["mark_prefixes"]
            got = self._compiled[chains] = (opaque, tuple(sorted(prefixes)), src_type)
        return got

    def key(self, chains: frozenset, ip: str) -> tuple:
        opaque, prefixes, src_type = self._compile(chains)
        if opaque:
            return ("exact", ip)
        value = self._ints.get(ip)
        if value is None:
            if ":" in ip:
                return ("exact", ip)
            value = self._ints[ip] = int(ipaddress.IPv4Address(ip))
        local = (ip in self._local,) if src_type else ()
        return local + tuple((value & mask) == net for net, mask in prefixes)


class Progress:
    """A one-line counter on stderr when it is a terminal (silent otherwise or when short)."""

    def __init__(self, total: int, what: str, enabled: bool | None = None):
        self.total, self.what, self.done = total, what, 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0
        self._start = time.monotonic()

    def step(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last >= 0.2 or self.done == self.total:
            self._last = now
            rate = self.done / max(now - self._start, 1e-6)
            sys.stderr.write(f"\r{self.what}: {self.done}/{self.total} ({rate:.0f}/s)   ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()


