"""`traceflow audit`: every Service port from every client group, and intent-vs-datapath drift.

Clients are pods grouped by namespace and labels (``--all-pods``: each pod alone); a group is
traced from one pod per node it runs on, so a node-specific fault is not hidden by the group.
The pairs are generated lazily and answered as a stream (traceflow.questions.matrix), by one
process or by workers given whole nodes (traceflow.questions.parallel); clients the datapath
cannot tell apart share one trace (traceflow.questions.classes). Drift findings compare what
Kubernetes asks for with what the datapath would do (traceflow.questions.drift).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# (the drift findings and the matrix are imported from here too)
from traceflow.questions.drift import Finding, PolicyCache, backend_drift  # noqa: F401
from traceflow.questions.drift import expected_endpoints, peer_route_drift  # noqa: F401
from traceflow.questions.drift import pod_gateway_drift, policy_drift, policy_intent  # noqa: F401
from traceflow.questions.matrix import client_groups, pair_label, service_ports  # noqa: F401
from traceflow.questions.runner import Progress


@dataclass
class Pair:
    client: str                     # group label (or pod key)
    pods: list                      # the pods traced for it
    service: str                    # ns/name:port/PROTO
    verdict: str
    reason: str = ""
    detail: str = ""
    disposition: str | None = None  # the first undelivered path's (traceflow.trace.Disposition)
    policies: list = field(default_factory=list)  # dropped-policy: the policies its drop names
    traced_as: list = field(default_factory=list)   # per pod: whose trace answered it
    index: int = 0                  # its place in the matrix

    def to_dict(self) -> dict:
        return {"client": self.client, "pods": self.pods, "service": self.service,
                "verdict": self.verdict, "reason": self.reason, "detail": self.detail,
                "disposition": self.disposition, "policies": list(self.policies),
                "traced_as": self.traced_as}


class _PairText:
    """``to_dict()`` as ``json.dumps(..., separators=(",", ":"))`` writes it, without the
    braces: an audit writes millions of pairs, whose client groups, Services, verdicts and
    empty reasons are a few texts each, encoded once."""

    MAX_KEPT = 100_000

    def __init__(self):
        import json
        self._dumps = json.dumps
        self._kept: dict = {}

    def _text(self, value) -> str:
        got = self._kept.get(value)
        if got is None:
            if len(self._kept) >= self.MAX_KEPT:
                self._kept.clear()
            got = self._kept[value] = self._dumps(value, separators=(",", ":"))
        return got

    def __call__(self, pair: "Pair") -> str:
        text, dumps = self._text, self._dumps
        return (f'"client":{text(pair.client)},"pods":{text(tuple(pair.pods))},'
                f'"service":{text(pair.service)},"verdict":{text(pair.verdict)},'
                f'"reason":{text(pair.reason)},"detail":{text(pair.detail)},'
                f'"disposition":{text(pair.disposition)},'
                f'"policies":{text(tuple(pair.policies))},'
                f'"traced_as":{dumps(pair.traced_as, separators=(",", ":"))}')


PARALLEL_MIN = 2000             # fewer pod questions than this: not worth forking workers
EXAMPLES_PER_GROUP = 8          # pairs kept per (disposition, reason) for people to read
MOST_SHARED = 5


class AuditReport:
    """The audit's answer, built as pairs stream in: counts, drift findings, pairs that were
    not delivered grouped by disposition and reason (with a few examples each), and every
    pair spooled to a temporary file (or written as it comes, ``sink``), never held in memory.
    """

    def __init__(self, bundle: str, sink=None):
        self.bundle = bundle
        self.findings: list = []
        self.notes: list = []
        self.service_ports = 0
        self.client_groups = 0
        self.traced = 0
        self.shared = 0
        self.questions = 0
        self.seconds = 0.0
        self.pairs_count = 0
        self.by_verdict: dict = {}
        self.by_disposition: dict = {}
        self.groups: dict = {}          # (disposition, reason) -> [count, [Pair ...]]
        self.endings: dict = {}         # (verdict, disposition) -> pairs not delivered
        self.stands_for: dict = {}      # (traced pod, service) -> questions it answered
        self._sink = sink
        self._spool = None
        self._pair_text = _PairText()

    @property
    def problems(self) -> bool:
        """Drift found (pairs not delivered are reported, not failed: policies deny by design)."""
        return bool(self.findings)

    def add(self, pair: Pair) -> None:
        self.pairs_count += 1
        self.by_verdict[pair.verdict] = self.by_verdict.get(pair.verdict, 0) + 1
        if pair.disposition:
            self.by_disposition[pair.disposition] = self.by_disposition.get(pair.disposition,
                                                                            0) + 1
        if pair.verdict != "delivered":
            ending = (pair.verdict, pair.disposition)
            self.endings[ending] = self.endings.get(ending, 0) + 1
            slot = self.groups.setdefault((pair.disposition or "", pair.reason), [0, []])
            slot[0] += 1
            if len(slot[1]) < EXAMPLES_PER_GROUP:
                slot[1].append(pair)
        for who in pair.traced_as:
            key = (who, pair.service)
            self.stands_for[key] = self.stands_for.get(key, 0) + 1
        if self._sink is not None:
            self._sink(pair)
            return
        if self._spool is None:
            import tempfile
            self._spool = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self._spool.write("{" + self._pair_text(pair) + "}\n")

    @property
    def pairs(self) -> list[dict]:
        """Every pair (read back from the spool: for small audits and tests)."""
        return list(self.iter_pairs())

    def iter_pairs(self):
        import json
        if self._spool is None:
            return
        self._spool.flush()
        self._spool.seek(0)
        for line in self._spool:
            yield json.loads(line)
        self._spool.seek(0, 2)

    def policy_names(self) -> list[str]:
        """The policies the drops of the pairs kept as examples name (what the text shows)."""
        return [n for _, pairs in self.groups.values() for p in pairs for n in p.policies]

    def most_shared(self) -> list[dict]:
        top = sorted(self.stands_for.items(), key=lambda kv: (-kv[1], kv[0]))[:MOST_SHARED]
        return [{"trace": f"{who} -> {service}", "stands_for": n} for (who, service), n in top]

    def summary(self) -> dict:
        return {"service_ports": self.service_ports, "client_groups": self.client_groups,
                "pairs": self.pairs_count,
                "pairs_delivered": self.by_verdict.get("delivered", 0),
                "pairs_not_delivered": self.pairs_count - self.by_verdict.get("delivered", 0),
                "by_verdict": self.by_verdict, "by_disposition": self.by_disposition,
                "findings": len(self.findings),
                "by_kind": _by_kind(self.findings), "distinct_traces": self.traced,
                "seconds": round(self.seconds, 3),
                "pod_questions": self.questions, "shared_traces": self.shared,
                "questions_per_trace": round(self.questions / self.traced, 2)
                if self.traced else 0.0,
                "most_shared": self.most_shared()}

    def head(self) -> dict:
        """The document without its pairs."""
        return {"schema": "traceflow.audit/v1", "bundle": self.bundle,
                "summary": self.summary(), "notes": self.notes,
                "findings": [{"kind": f.kind, "subject": f.subject, "message": f.message,
                              "evidence": f.evidence} for f in self.findings]}

    def to_dict(self) -> dict:
        return {**self.head(), "pairs": self.pairs}

    def write_json(self, out) -> None:
        """``to_dict()`` as ``json.dumps(..., indent=2)`` writes it, the pairs streamed from
        the spool (the same bytes, in bounded memory)."""
        import json
        marker = "\0pairs\0"
        head = json.dumps({**self.head(), "pairs": marker}, indent=2)
        before, after = head.split(json.dumps(marker), 1)
        out.write(before)
        first = True
        for pair in self.iter_pairs():
            out.write(("[\n    " if first else ",\n    ")
                      + json.dumps(pair, indent=2).replace("\n", "\n    "))
            first = False
        out.write("[]" if first else "\n  ]")
        out.write(after)
        out.write("\n")


class jsonl_writer:
    """``-o jsonl``: one JSON object per line, written as the audit goes: ``pair`` lines in
    matrix order (with their ``index``), then ``finding`` lines, a ``trace`` line per trace
    (the pod traced, the Service port, how many pod questions it answered) and the
    ``summary`` last (docs/scale.md)."""

    def __init__(self, out, bundle: str):
        import json
        self.out, self._dumps = out, json.dumps
        self._pair_text = _PairText()
        self._line({"type": "audit", "schema": "traceflow.audit.jsonl/v1", "bundle": bundle})

    def _line(self, doc: dict) -> None:
        self.out.write(self._dumps(doc, separators=(",", ":")) + "\n")

    def pair(self, pair: "Pair") -> None:
        self.out.write(f'{{"type":"pair","index":{pair.index},{self._pair_text(pair)}}}\n')

    def close(self, report: "AuditReport") -> None:
        for f in report.findings:
            self._line({"type": "finding", "kind": f.kind, "subject": f.subject,
                        "message": f.message, "evidence": f.evidence})
        for (who, service), n in sorted(report.stands_for.items()):
            self._line({"type": "trace", "source": who, "service": service, "stands_for": n})
        self._line({"type": "summary", **report.summary(), "notes": report.notes})
        self.out.flush()


def _by_kind(findings) -> dict:
    by_kind: dict = {}
    for f in findings:
        by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
    return by_kind


# ---- the matrix ------------------------------------------------------------------------------
def matrix(snap, all_pods: bool = False):
    """Every (client label, pods, destination), lazily (traceflow.questions.matrix)."""
    from traceflow.questions.matrix import Matrix
    for _, label, pods, dst in Matrix(snap.cluster, all_pods).pairs():
        yield label, pods, dst


def run_audit(snap, name: str, all_pods: bool = False, progress: bool | None = None,
              tracer=None, jobs: int = 1, nodes=None, max_pairs: int | None = None,
              max_seconds: float | None = None, sink=None, share: bool = True,
              announce=None) -> AuditReport:
    """The audit, streamed: ``sink(pair)`` gets each pair as it is answered (else they are
    spooled for ``write_json``); ``jobs`` worker processes split the nodes; ``nodes`` limits
    the clients to the pods of those nodes; ``max_pairs``/``max_seconds`` refuse (exit 2,
    with the estimate) a question too big for them; ``announce(text)`` hears the size and
    the estimate up front."""
    from traceflow.model.errors import InputError
    from traceflow.questions.matrix import Matrix, combine
    from traceflow.questions.parallel import Workers, answer_nodes, node_findings, partition
    t0 = time.monotonic()
    report = AuditReport(name, sink)
    cluster = snap.cluster
    mx = Matrix(cluster, all_pods)
    every_node = sorted(set(snap.bundle.node_names()) | set(mx.nodes()))
    if nodes is not None:
        unknown = sorted(set(nodes) - set(every_node))
        if unknown:
            raise InputError(f"no node {', '.join(unknown)} in the bundle (it has "
                             f"{', '.join(every_node[:8])}{' ...' if len(every_node) > 8 else ''})",
                             "--nodes")
        every_node = sorted(nodes)
    chosen = frozenset(every_node)
    report.service_ports, report.client_groups = len(mx.ports), len(mx.groups)
    questions = mx.questions_on(chosen)
    size = (f"{mx.pairs_total:,} pairs ({len(mx.ports):,} service ports x {len(mx.groups):,} "
            f"client groups): {questions:,} pod questions from {len(mx.nodes())} nodes")
    if announce is not None:
        announce(f"audit: {size}")
    if max_pairs is not None and mx.pairs_total > max_pairs:
        raise InputError(f"the audit asks {size}, more than --max-pairs {max_pairs:,}: raise "
                         "the limit, or split it by node (--nodes, see docs/scale.md)",
                         "--max-pairs")
    parts = partition(mx, every_node, max(1, jobs) if questions >= PARALLEL_MIN else 1)
    findings: dict = {}
    host_only = False
    counts = report.by_verdict
    bar = Progress(questions, "audit", progress, status=lambda: (
        f"delivered {counts.get('delivered', 0):,}, not {report.pairs_count - counts.get('delivered', 0):,}"
        f"; {report.traced or stats.get('traced', 0):,} traces"))
    stats: dict = {"traced": 0, "shared": 0}
    workers = None
    if len(parts) > 1:
        workers = Workers(snap, mx, parts, share)
        stream = workers.answers()
    else:
        stream = answer_nodes(snap, mx, chosen if nodes is not None else None, share, stats)
    n_groups = len(mx.groups)

    def said(text):             # (the counter's line wiped first)
        if announce is not None:
            bar.clear()
            announce(text)
    try:
        current, results, pods_of = None, [], []
        clock: dict = {}            # when the first Service port was answered
        for answer in stream:
            bar.step()
            if answer.index != current:
                if current is not None:
                    _emit(report, mx, current, pods_of, results, combine)
                current, results, pods_of = answer.index, [], []
                elapsed = time.monotonic() - t0
                _check_time(max_seconds, elapsed, answer.index, mx.pairs_total, n_groups,
                            said, clock)
            results.append(answer.result)
            pods_of.append(answer.position)
            host_only = host_only or answer.result.host_only
            for f in answer.findings:
                findings.setdefault(f.key(), f)
        if current is not None:
            _emit(report, mx, current, pods_of, results, combine)
    finally:
        bar.close()
        if workers is not None:
            workers.close()
    if workers is not None:
        stats = workers.stats
        extra = workers.findings
    else:
        extra = node_findings(snap, chosen if nodes is not None else None)
    if host_only:
        report.notes.append("host-only bundle (no OVS flows): pairs cover the Service "
                            "translation on the client's node; NetworkPolicy drift is not "
                            "checked there")
    for f in extra:
        findings.setdefault(f.key(), f)
    report.findings = sorted(findings.values(), key=lambda f: (f.kind, f.subject))
    report.traced, report.shared = stats.get("traced", 0), stats.get("shared", 0)
    report.questions = questions
    report.seconds = time.monotonic() - t0
    return report


def _emit(report: AuditReport, mx, index: int, positions: list, results: list, combine) -> None:
    label, pods, dst = _pair_at(mx, index)
    verdict, reason, detail, disposition, policies = combine(results)
    report.add(Pair(label, [pods[i].key for i in positions], pair_label(dst), verdict, reason,
                    detail, disposition, policies, [r.traced_as for r in results], index))


def _pair_at(mx, index: int):
    n = len(mx.groups)
    label, pods = mx.groups[index % n]
    return label, pods, mx.ports[index // n]


def _check_time(limit: float | None, elapsed: float, index: int, total: int, per_port: int,
                announce, clock: dict) -> None:
    """The time the whole audit will take, estimated once the second Service port is
    answered (every client group asked twice); over ``--max-seconds``, it stops and says so.

    The rate is the second port's: the first pays for reading each node's flows and rules
    the first time a trace meets them, once for the whole audit (measured on the first
    port, the 5,000-pod audit's estimate was five times its real time, docs/scale.md)."""
    if limit is not None and elapsed > limit:     # over already: a rough estimate will do
        _too_long(elapsed * total / max(index, 1), index, total, limit)
    if index < per_port:
        return
    if "first" not in clock:
        clock["first"] = (elapsed, index)
        return
    first, first_index = clock["first"]
    if index < first_index + per_port or "said" in clock:
        return
    clock["said"] = True
    rate = (elapsed - first) / (index - first_index)
    estimate = elapsed + rate * (total - index)
    if announce is not None:
        announce(f"audit: about {estimate:,.0f} s in all (measured on the second service "
                 "port)")
    if limit is not None and estimate > limit * 1.5:
        _too_long(estimate, index, total, limit)


def _too_long(estimate: float, index: int, total: int, limit: float) -> None:
    from traceflow.model.errors import InputError
    raise InputError(f"the audit would take about {estimate:,.0f} s (measured over its first "
                     f"{index:,} of {total:,} pairs), more than --max-seconds {limit:g}: raise "
                     "the limit, use more workers (-j), or split it by node (--nodes, see "
                     "docs/scale.md)", "--max-seconds")


