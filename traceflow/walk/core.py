"""The solver's loop: walk a packet through Locations, asking a component at each.

The walk is a sequence of *locations* (a node's host stack at an interface, an OVS bridge at
an input port, a BPF program on a device's hook, ...). The component that handles a location
turns the packet into one or more outcomes with weights (load-balancer choices), each leading
to the next location or to an end (delivered, dropped, unknown). Which components exist is
the CNI's business (the Datapath given to the walk); the kernel host stack is shared. Conntrack
state travels with each branch per node, so the reply leg sees the entries the request leg
committed and NAT is undone where the real datapath undoes it.
"""

from __future__ import annotations

from traceflow.bundle import kube
from traceflow.model.errors import InputError
from traceflow.model.packet import PROTO_NUMBERS, Packet
from traceflow.bundle.snapshot import Missing, Snapshot
from traceflow.model.trace import Drop, Hop, Leg, Path, Trace, Verdict
from traceflow.walk.host import HostStack
from traceflow.walk.state import MAX_LOCATIONS, AtHost, Branch, Query, describe


class Walk:
    """The walk over one snapshot: ``Walk(snapshot, datapath, checks).trace(Query)``.

    ``datapath``: the CNI's Datapath class (traceflow.walk.datapath), instantiated with this
    walk. ``checks``: what looks at a finished trace before its warnings are gathered, each
    ``check(walk, query, trace)`` (the NetworkPolicies as written against the paths, see
    traceflow.questions.solver). The walk itself knows no CNI and no policy."""

    def __init__(self, snapshot: Snapshot, datapath: type, checks: tuple = ()):
        self.snap = snapshot
        self.cluster = snapshot.cluster
        self.cni = snapshot.conventions
        self.warnings: list[str] = []
        self.checks = tuple(checks)
        self.host = HostStack(self)
        self.datapath = datapath(self)
        # location type -> the component's step(branch, location, query) -> [(branch, next)]
        self.components = {AtHost: self.host.step, **self.datapath.components()}

    # ---- public -------------------------------------------------------------------------
    def trace(self, q: Query) -> Trace:
        trace = Trace(q.as_dict())
        self.query = q
        first = self._initial_packet(q)
        start = Branch([Leg("request", Verdict.UNKNOWN, [], describe(first, q))])
        if q.service is None:       # pod-to-pod: the destination pod, hostNetwork ones too
            start.target = q.destination_label
        branches = self._walk_leg(start, q.source, first, q)
        paths = []
        for b in branches:
            verdict, drop, endpoint = b.end
            if verdict == Verdict.DELIVERED and q.reply and not isinstance(endpoint, kube.Pod):
                # delivered to an address no pod object of the bundle describes (an object
                # without name or IP, an endpoint outside the cluster): no reply to walk
                why = (f"the reply from {endpoint or 'the endpoint'} is not traced: no pod of "
                       "k8s/pods.yaml has that address (a damaged or missing pod object?)")
                self.warnings.append(why)
                path = self._path(b, endpoint)
                path.verdict = Verdict.UNKNOWN
                path.drop = path.drop or Drop("?", "pod", None, None, why)
                paths.append(path)
            elif verdict == Verdict.DELIVERED and q.reply:
                for rb in self._reply(b, endpoint, q):
                    paths.append(self._path(rb, endpoint))
            else:
                paths.append(self._path(b, endpoint))
        if q.endpoint:
            paths = [p for p in paths if _endpoint_matches(p.endpoint, q.endpoint)]
            if not paths:
                raise InputError(f"no path reaches endpoint {q.endpoint!r}", "--endpoint")
        trace.paths = paths
        for check in self.checks:
            check(self, q, trace)
        trace.warnings = list(dict.fromkeys(self.warnings + trace.warnings))
        from traceflow.bundle.collected import annotate   # lists not collected, truncated files
        annotate(self.snap, trace)
        return trace

    def _path(self, b: Branch, endpoint) -> Path:
        verdict, drop, _ = b.end
        if verdict == Verdict.DELIVERED:
            b.set_verdicts(Verdict.DELIVERED, only_unknown=True)
        name = endpoint.key if isinstance(endpoint, kube.Pod) else (endpoint or b.target)
        return Path(name, round(b.weight, 6), verdict, drop, b.legs, b.choices)

    # ---- the first packet ------------------------------------------------------------------
    def _initial_packet(self, q: Query) -> Packet:
        return Packet(nw_src=q.source.ip, nw_dst=q.dst_ip, nw_proto=PROTO_NUMBERS[q.protocol.lower()],
                      tp_src=q.src_port, tp_dst=q.dst_port,
                      tcp_flags="syn" if q.protocol == "TCP" else None)

    def _walk_leg(self, branch: Branch, pod: kube.Pod, packet: Packet, q: Query) -> list[Branch]:
        """From a pod's eth0 (or a hostNetwork pod's node stack) to wherever the packet ends."""
        if pod.host_network:        # sent by the node's own stack, not through the CNI
            from traceflow.walk import hostnet
            try:
                starts = hostnet.send(self.host, branch, pod, packet, AtHost)
            except Missing as miss:
                return [self.missing(branch, pod.node or "?", "route", miss)]
            return [d for b, loc in starts for d in ([b] if loc is None else self._run(b, loc, q))]
        try:
            start = self.datapath.leave_pod(branch, pod, packet, q)
        except Missing as miss:
            return [self.missing(branch, pod.node or "?", "pod", miss)]
        if start is None:
            return [branch]
        return self._run(branch, start, q)

    # ---- the walk ---------------------------------------------------------------------------
    def _run(self, branch: Branch, start, q: Query) -> list[Branch]:
        done: list[Branch] = []
        work = [(branch, start)]
        while work:
            b, loc = work.pop(0)
            b.steps += 1
            component = self.datapath.component_name(loc)
            if b.steps > MAX_LOCATIONS:
                b.add(Hop(getattr(loc, "node", "?"), component, None, None,
                          "the packet keeps going round: loop detected", unknown=True))
                done.append(b.finish(Verdict.UNKNOWN, Drop(loc.node, component, None, None,
                                                           "forwarding loop")))
                continue
            step = self.components.get(type(loc))
            if step is None:   # a datapath handing on to a place nobody models is a bug
                raise TypeError(f"no component handles {type(loc).__name__}")
            try:
                outcomes = step(b, loc, q)
            except Missing as miss:
                done.append(self.missing(b, loc.node, component, miss))
                continue
            for nb, nloc in outcomes:
                if nloc is None:
                    done.append(nb)
                else:
                    work.append((nb, nloc))
        return done

    def missing(self, b: Branch, node: str, component: str, miss: Missing) -> Branch:
        b.add(Hop(node, component, None, None, f"cannot continue: {miss}", unknown=True))
        return b.finish(Verdict.UNKNOWN, Drop(node, component, None, None, str(miss)))

    # ---- reply --------------------------------------------------------------------------------
    def _reply(self, b: Branch, server: kube.Pod, q: Query) -> list[Branch]:
        b.set_verdicts(Verdict.DELIVERED)
        request_pkt = b.final_packet
        rb = b.fork()
        rb.end = None
        reply = request_pkt.reversed()
        rb.start_leg("reply", describe(reply, None))
        results = []
        for done in self._walk_leg(rb, server, reply, q):
            verdict, drop, endpoint = done.end
            if verdict == Verdict.DELIVERED:
                got = done.final_packet
                if endpoint is not q.source and endpoint != q.source:
                    done.finish(Verdict.DROPPED, Drop(endpoint.node if endpoint else "?", "pod",
                                                      None, None,
                                                      f"the reply reaches {endpoint.key if endpoint else '?'} "
                                                      f"instead of {q.source.key}"))
                elif (got.nw_src, got.tp_src) != (q.dst_ip, q.dst_port):
                    last = next(done.leg.last_hops())
                    done.finish(Verdict.DROPPED, Drop(last.node, "pod", None, None,
                                                      f"the reply arrives from {got.nw_src}:{got.tp_src}, "
                                                      f"but {q.source.key} talked to {q.dst_ip}:{q.dst_port}: "
                                                      "the un-NAT did not happen, the client resets"))
            done.end = (done.end[0], done.end[1], server)
            results.append(done)
        return results

    # ---- kept for callers of the one-class solver ------------------------------------------
    def _arp_via_ovs(self, node_name, node, dev, target):
        got = self.datapath.answer_arp(node_name, node, dev, target)
        return got[0] if got else None


def _endpoint_matches(endpoint: str | None, pin: str) -> bool:
    if endpoint is None:
        return False
    return endpoint == pin or endpoint.split("/")[-1] == pin
