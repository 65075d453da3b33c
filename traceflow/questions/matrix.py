"""The audit's questions, generated lazily and answered as a stream.

The matrix is every Service port asked from every client group (pods grouped by namespace and
labels, one pod per node of the group; ``--all-pods``: every pod alone). It is never held as
a list: ``Matrix.pairs()`` yields the pairs in a fixed order (Service ports in key order, then
client groups in key order), so a run, a part of one (the nodes of one worker) and the merged
parts give the same pairs in the same order. Each pod's trace is reduced at once to a
``PodResult`` (what a pair's verdict is combined from) and its findings; traces are not kept.
"""

from __future__ import annotations

from typing import NamedTuple

from traceflow.model.trace import Verdict
from traceflow.questions.select import Destination


def client_groups(cluster, all_pods: bool = False) -> list[tuple[str, list]]:
    """[(label, pods to trace)]: one pod per node of each namespace+labels group."""
    usable = sorted((p for p in cluster.pods if p.ip and p.node and p.phase == "Running"
                     and not p.host_network), key=lambda p: p.key)
    if all_pods:
        return [(p.key, [p]) for p in usable]
    groups: dict = {}
    for p in usable:
        label = p.namespace + "/{" + ",".join(f"{k}={v}" for k, v in sorted(p.labels.items())) + "}"
        per_node = groups.setdefault(label, {})
        per_node.setdefault(p.node, p)
    return [(label, [per_node[n] for n in sorted(per_node)]) for label, per_node in
            sorted(groups.items())]


def service_ports(cluster) -> list[Destination]:
    """Every Service port at every cluster IP: a dual-stack Service's IPv6 one too."""
    out = []
    for svc in sorted(cluster.services, key=lambda s: s.key):
        if not svc.cluster_ip or svc.cluster_ip == "None":
            continue
        for ip in svc.addresses or (svc.cluster_ip,):
            for sp in svc.ports:
                out.append(Destination("service", svc.key, ip, sp.port, sp.protocol.upper(),
                                       service=svc))
    return out


def pair_label(dst: Destination) -> str:
    return f"{dst.label}:{dst.port}/{dst.protocol}" + (" (IPv6)" if ":" in dst.ip else "")


class Matrix:
    """Service ports x client groups, counted up front and generated on demand."""

    def __init__(self, cluster, all_pods: bool = False):
        self.groups = client_groups(cluster, all_pods)
        self.ports = service_ports(cluster)

    @property
    def pairs_total(self) -> int:
        return len(self.ports) * len(self.groups)

    @property
    def questions_total(self) -> int:
        """Pod traces asked (a pair asks one per node its group runs on)."""
        return len(self.ports) * sum(len(pods) for _, pods in self.groups)

    def nodes(self) -> list[str]:
        return sorted({p.node for _, pods in self.groups for p in pods})

    def questions_on(self, nodes) -> int:
        return len(self.ports) * sum(1 for _, pods in self.groups for p in pods
                                     if p.node in nodes)

    def pairs(self, start: int = 0):
        """(index, client label, pods, destination), from pair ``start`` on."""
        n = len(self.groups)
        if not n:
            return
        for d in range(start // n, len(self.ports)):
            dst = self.ports[d]
            for g in range(start % n if d == start // n else 0, n):
                label, pods = self.groups[g]
                yield d * n + g, label, pods, dst


class PodResult(NamedTuple):
    """One pod's trace of one pair, reduced to what the pair's answer needs (a tuple: an
    audit sends millions of them from its workers)."""

    verdict: str
    bad: tuple | None           # (reason, detail, disposition, policies its drop names) of its
    #                             first undelivered path
    disposition: str | None     # its first path's disposition (a delivered pair says it)
    host_only: bool             # answered for the Service translation only (host-only bundle)
    traced_as: str              # the pod whose trace answered (itself, or its class's)

    def traced_by(self, who: str) -> "PodResult":
        """The same result, answered by ``who``'s trace."""
        if who == self.traced_as:
            return self
        return PodResult(self.verdict, self.bad, self.disposition, self.host_only, who)


def pod_result(trace, pod_key: str) -> PodResult:
    from traceflow.questions.check import describe_path
    from traceflow.questions.runner import SCOPE_SERVICE
    bad = None
    first = None
    for p in trace.paths:
        if first is None and p.disposition is not None:
            first = str(p.disposition)
        if bad is None and p.verdict != Verdict.DELIVERED:
            d = p.drop
            reason = (f"{d.component}{' ' + str(d.table) if d.table else ''}: {d.reason}"
                      if d else str(p.verdict))
            bad = (reason, describe_path(p),
                   str(p.disposition) if p.disposition is not None else None,
                   tuple(d.policies) if d is not None else ())
    return PodResult(str(trace.verdict), bad, first, trace.query.get("scope") == SCOPE_SERVICE,
                     trace.query.get("shares_trace_of") or pod_key)


def combine(results: list[PodResult]) -> tuple[str, str, str, str | None, list]:
    """(verdict, grouping reason, one detailed line, disposition, policies) of one pair over
    its pods' results: the disposition, reason and the policies its drop names of its first
    path that was not delivered."""
    verdicts = {r.verdict for r in results}
    if verdicts == {"delivered"}:
        firsts = [r.disposition for r in results if r.disposition is not None]
        return "delivered", "", "", firsts[0] if firsts else None, []
    if len(verdicts) == 1:
        verdict = verdicts.pop()
    elif "delivered" in verdicts or "partial" in verdicts:
        verdict = "partial"
    else:
        verdict = "unknown" if "unknown" in verdicts else "dropped"
    for r in results:
        if r.bad is not None:
            return verdict, r.bad[0], r.bad[1], r.bad[2], list(r.bad[3])
    return verdict, verdict, "", None, []


class Answered(NamedTuple):
    """What a worker sends for one pod of one pair (ordered by pair, then pod: the
    workers' streams merge as tuples)."""

    index: int                  # the pair's index in the matrix
    position: int               # the pod's place in the pair's pods
    result: PodResult
    findings: list | tuple = ()     # the policy findings of its trace
