"""Many questions over one bundle: one Snapshot (each node parsed once), one trace per
distinct question, and a progress line on a terminal for long runs.

On a host-only bundle (a node without OVS flows, like the generated kube-proxy examples) a
pod's trace cannot leave the pod; there the question is answered for the part the bundle
holds, the Service translation on the client's node (``host_service_trace``), and the trace
says so in its warnings and its ``scope``.
"""

from __future__ import annotations

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
    """Answers (source, destination) questions over one Snapshot, each once; clients of one
    node that the datapath cannot tell apart share one trace (traceflow.questions.classes).

    ``share=False`` traces every client itself (what the class tests compare with)."""

    MAX_CACHED = 4096           # answers kept for questions asked again (check, diff)
    MAX_SLOTS = 2048            # destinations whose representatives are kept
    MAX_REPRESENTATIVES = 16    # classes kept per node and destination

    def __init__(self, snapshot: Snapshot, share: bool = True):
        from traceflow.questions.classes import Classes
        from traceflow.questions.solver import Solver
        quiet_gc()          # (check and diff too: a third of their CPU went to the collector)
        self.snap = snapshot
        self.solver = Solver(snapshot)
        self.share = share
        self.classes = Classes(snapshot)
        self._cache: dict[tuple, Trace] = {}
        self._slots: dict = {}      # (node, destination, src port, via) -> [_Representative]
        self._identities: dict = {}
        self._values: dict = {}     # identity -> its values, as the class checks read them
        self.traced = 0             # distinct questions actually traced
        self.shared = 0             # questions answered by another client's trace
        self._ovs: dict = {}        # node -> has OVS flows
        self.asked = 0

    def release(self) -> None:
        """Forget the representatives and answers kept so far (an audit calls it when it
        moves on to the next destination: none of them will be asked again)."""
        self._slots.clear()
        self._cache.clear()
        self.classes.release()

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
        got = self._classed(pod, dst, src_port, via)
        if len(self._cache) >= self.MAX_CACHED:
            self._cache.clear()
        self._cache[key] = got
        return got

    # -- classes of clients ------------------------------------------------------------------
    def _classed(self, pod, dst: Destination, src_port: int, via: str | None) -> Trace:
        from traceflow.model.reads import recording
        from traceflow.questions.classes import Recorder, _Values
        # (an IPv6 question is traced alone: the identity holds the IPv4 address, MAC and port)
        ident = self.identity(pod) if self.share and ":" not in dst.ip else None
        if ident is None:
            self.traced += 1
            return self._trace(pod, dst, src_port, via)
        values = self._values.get(ident)
        if values is None:
            values = self._values[ident] = _Values(ident)
        slot_key = (pod.node, dst.ip, dst.port, dst.protocol, dst.kind, src_port, via,
                    dst.label)
        slot = self._slots.get(slot_key)
        if slot is None:
            if len(self._slots) >= self.MAX_SLOTS:
                self._slots.pop(next(iter(self._slots)))
            slot = self._slots[slot_key] = []
        for rep in slot:
            if pod.key in rep.endpoints or pod.key == dst.label:
                break           # a backend of the destination: its address is also the far end
            if self.classes.port_safe(rep.recorder, values) and \
                    self.classes.same(rep.recorder, rep.values, values):
                self.shared += 1
                rep.stands_for += 1
                if slot[0] is not rep:      # the class met most recently is asked first
                    slot.remove(rep)
                    slot.insert(0, rep)
                return Trace(dict(rep.trace.query, source=pod.key,
                                  shares_trace_of=rep.trace.query.get("source")),
                             rep.trace.paths, rep.trace.warnings)
        recorder = Recorder(ident, self.snap.cluster)
        with recording(recorder):
            trace = self._trace(pod, dst, src_port, via)
        self.traced += 1
        endpoints = {str(p.endpoint) for p in trace.paths if p.endpoint}
        if len(slot) < self.MAX_REPRESENTATIVES and pod.key not in endpoints and \
                pod.key != dst.label and self.classes.shareable(recorder) is None and \
                self.classes.port_safe(recorder, values):
            slot.append(_Representative(values, recorder, trace, endpoints))
        return trace

    def identity(self, pod):
        """A pod client's own values in the datapath (None: it is traced alone): its address,
        and on a node with the CNI's datapath the MAC and port that datapath gives it."""
        from traceflow.questions.classes import Identity
        if not isinstance(pod, Pod) or _unusable(pod) or pod.host_network:
            return None
        got = self._identities.get(pod.key, False)
        if got is not False:
            return got
        got = None
        if not self.snap.pod_files(pod):         # pod-side files are the pod's own
            if not self._has_ovs(pod.node):
                got = Identity.of(pod.node, pod.ip)       # host-only: the address alone
            else:
                try:
                    own = self.solver.datapath.source_identity(pod)
                except Missing:
                    own = None
                if own is not None:
                    got = Identity.of(pod.node, pod.ip, *own)
        self._identities[pod.key] = got
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


def quiet_gc() -> None:
    """For a question of many traces: what is loaded so far is moved out of the cyclic
    collector's sight (gc.freeze: the bundle's models hold no garbage) and young objects are
    collected less often; a trace's objects hold no reference cycles worth chasing early."""
    import gc
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)


class _Representative:
    """A client traced with its reads recorded, and who shares its trace."""

    __slots__ = ("values", "recorder", "trace", "endpoints", "stands_for")

    def __init__(self, values, recorder, trace: Trace, endpoints: set):
        self.values, self.recorder, self.trace = values, recorder, trace
        self.endpoints = endpoints
        self.stands_for = 1


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


class Progress:
    """A one-line counter on stderr when it is a terminal (silent otherwise or when short):
    done/total, rate, time left, and a running summary (``status``) when given."""

    def __init__(self, total: int, what: str, enabled: bool | None = None, status=None):
        self.total, self.what, self.done = total, what, 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.status = status            # () -> short text, e.g. "delivered 120, dropped 3"
        self._last = 0.0
        self._start = time.monotonic()
        self._width = 0

    def step(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last >= 0.2 or self.done == self.total:
            self._last = now
            elapsed = max(now - self._start, 1e-6)
            rate = self.done / elapsed
            left = (self.total - self.done) / rate if rate > 0 else 0
            line = (f"\r{self.what}: {self.done:,}/{self.total:,} ({rate:,.0f}/s, "
                    f"{_duration(left)} left)")
            if self.status is not None:
                line += f" {self.status()}"
            line = line[:_columns()]            # one line of the terminal, never wrapped
            self._width = max(self._width, len(line))
            sys.stderr.write(line.ljust(self._width) + " ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.clear()

    def clear(self) -> None:
        """Wipe the counter's line (before something else is said on stderr)."""
        if self.enabled and self._width:
            sys.stderr.write("\r" + " " * min(max(60, self._width + 1), _columns()) + "\r")
            sys.stderr.flush()


def _columns() -> int:
    """The terminal's width less one (the cursor's cell)."""
    import shutil
    return max(20, shutil.get_terminal_size((80, 24)).columns - 1)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
