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

from traceflow.errors import InputError
from traceflow.kube import Pod
from traceflow.packet import PROTO_NUMBERS, Packet
from traceflow.questions.select import Destination
from traceflow.snapshot import Missing, Snapshot
from traceflow.trace import Drop, Hop, Leg, Path, Trace, Verdict

SCOPE_FULL = "end-to-end"
SCOPE_SERVICE = "service-translation"


class Tracer:
    """Answers (source pod, destination) questions over one Snapshot, each once."""

    def __init__(self, snapshot: Snapshot):
        from traceflow.solver import Solver
        self.snap = snapshot
        self.solver = Solver(snapshot)
        self._cache: dict[tuple, Trace] = {}
        self.traced = 0             # distinct questions actually traced
        self.asked = 0

    def key(self, pod: Pod, dst: Destination, src_port: int = 54321) -> tuple:
        return (pod.key, dst.ip, dst.port, dst.protocol, src_port)

    def trace(self, pod: Pod, dst: Destination, src_port: int = 54321) -> Trace:
        self.asked += 1
        key = self.key(pod, dst, src_port)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._trace(pod, dst, src_port)
            self.traced += 1
        return got

    def _trace(self, pod: Pod, dst: Destination, src_port: int) -> Trace:
        from traceflow.solver import Query
        problem = _unusable(pod)
        if problem:
            return _unknown_trace(pod, dst, problem)
        if not self._has_ovs(pod.node):
            return host_service_trace(self.snap, pod, dst, src_port)
        q = Query("pod-to-svc" if dst.service else "pod-to-pod", pod, dst.ip, dst.port,
                  dst.protocol, src_port, dst.label, dst.service, None, True)
        self.solver.warnings = []       # warnings are per trace
        trace = self.solver.trace(q)
        trace.query.setdefault("scope", SCOPE_FULL)
        return trace

    def _has_ovs(self, node: str) -> bool:
        return node in self.snap.bundle.node_names() and \
            self.snap.bundle.node_file(node, "ovs-flows.txt") is not None

    def node_model(self, name: str):
        try:
            return self.snap.node(name)
        except Missing:
            return None


def _unusable(pod: Pod) -> str | None:
    if not pod.ip:
        return f"pod {pod.key} has no IP (phase {pod.phase})"
    if pod.phase != "Running":
        return f"pod {pod.key} is not Running (phase {pod.phase})"
    if not pod.node:
        return f"pod {pod.key} is not scheduled on a node"
    if pod.host_network:
        return f"pod {pod.key} uses the host network (host sources are not traced yet)"
    return None


def _unknown_trace(pod: Pod, dst: Destination, why: str) -> Trace:
    t = Trace(_query(pod, dst, 54321, SCOPE_FULL))
    t.paths.append(Path(None, 1.0, Verdict.UNKNOWN, Drop(pod.node or "?", "pod", None, None, why),
                        [Leg("request", Verdict.UNKNOWN, [Hop(pod.node or "?", "pod", None, None,
                                                              why, unknown=True)])]))
    return t


def _query(pod: Pod, dst: Destination, src_port: int, scope: str) -> dict:
    return {"kind": "pod-to-svc" if dst.service else "pod-to-pod", "source": pod.key,
            "destination": dst.label, "protocol": dst.protocol, "dst_port": dst.port,
            "src_port": src_port, "dst_ip": dst.ip, "scope": scope}


def host_service_trace(snap: Snapshot, pod: Pod, dst: Destination, src_port: int) -> Trace:
    """The Service translation the client's node does (PREROUTING: iptables or nft, then
    IPVS): delivered = sent on to a backend, dropped = rejected/dropped (e.g. no endpoints)."""
    from traceflow.netfilter.engine import NodeContext, evaluate_hook
    trace = Trace(_query(pod, dst, src_port, SCOPE_SERVICE))
    trace.warnings.append(f"nodes/{pod.node} has no OVS flows (host-only bundle): only the "
                          f"Service translation on {pod.node} is traced, not the pod-to-pod "
                          "forwarding")
    try:
        node = snap.node(pod.node)
        rs = node.netfilter
        ipvs = node.ipvs
    except Missing as miss:
        return _unknown_trace(pod, dst, f"cannot continue: {miss}")
    pkt = Packet(nw_src=pod.ip, nw_dst=dst.ip, nw_proto=PROTO_NUMBERS[dst.protocol.lower()],
                 tp_src=src_port, tp_dst=dst.port)
    ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets, node=pod.node,
                      ct_state={"NEW"}, ct_dir="ORIGINAL")
    if rs is None:
        branches, component = [], None
    elif hasattr(rs, "evaluate_hook"):
        branches, component = rs.evaluate_hook("PREROUTING", pkt, ctx), "nft"
    else:
        branches, component = evaluate_hook(rs, "PREROUTING", pkt, ctx), "iptables"
    if not branches:
        from traceflow.netfilter.engine import Branch
        branches = [Branch(1.0, pkt.copy(), "ACCEPT", [])]
    for nf in branches:
        hops = [_step_hop(pod.node, component, s) for s in nf.steps]
        out, weight = nf.packet, nf.weight
        sub = [(1.0, out, "ACCEPT" if nf.verdict == "ACCEPT" else nf.verdict, [])]
        if nf.verdict == "ACCEPT" and out.nw_dst == dst.ip and ipvs is not None:
            got = ipvs.evaluate(out)
            if got is not None:
                sub = [(b.weight, b.packet, b.verdict, [_step_hop(pod.node, "ipvs", s)
                                                        for s in b.steps]) for b in got]
        for w, opkt, verdict, more in sub:
            leg = Leg("request", Verdict.UNKNOWN, hops + more,
                      f"{pod.key} -> {dst.label} ({dst.ip}:{dst.port}) on {pod.node}")
            translated = opkt.nw_dst != dst.ip or opkt.tp_dst != dst.port
            if verdict == "ACCEPT" and translated:
                v, drop = Verdict.DELIVERED, None
                target = snap.cluster.pod_by_ip(opkt.nw_dst)
                endpoint = target.key if target else f"{opkt.nw_dst}:{opkt.tp_dst}"
            elif verdict == "ACCEPT":
                last = leg.hops[-1] if leg.hops else None
                why = (f"no Service translation on {pod.node} for {dst.ip}:{dst.port}; the rest "
                       "of the path needs the node's OVS flows")
                v, endpoint = Verdict.UNKNOWN, None
                drop = Drop(pod.node, component or "iptables", last.table if last else None,
                            last.rule if last else None, why)
            else:
                last = leg.hops[-1] if leg.hops else None
                v = Verdict.UNKNOWN if verdict == "UNKNOWN" else Verdict.DROPPED
                endpoint = None
                drop = Drop(pod.node, last.component if last else (component or "iptables"),
                            last.chain or last.table if last else None,
                            last.rule if last else None, last.effect if last else verdict)
            leg.verdict = v
            trace.paths.append(Path(endpoint, round(weight * w, 6), v, drop, [leg]))
    return trace


def _step_hop(node: str, component: str | None, step) -> Hop:
    rule = step.rule
    src = getattr(rule, "source", None) if rule is not None else None
    text = getattr(rule, "text", None) if rule is not None else None
    return Hop(node, component or "iptables", step.table, text, step.effect, chain=step.chain,
               source=src, matched=tuple(step.matched), unknown=step.unknown)


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


