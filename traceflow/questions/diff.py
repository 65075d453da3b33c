"""`traceflow diff BEFORE AFTER`: two bundles of one cluster asked the same questions.

For each question (a suite's expectations, or the audit matrix) both walks are compared path
by path; a question changed when its verdict or a path's hops changed, and the report names
the first hop where the walks diverge with the flow/rule/route on each side (file:line in
each bundle). Raw changes (flows, rules, routes... added or removed, per node and component)
come after, those a traced path used first.
"""

from __future__ import annotations

import difflib
import re
import time
from collections import Counter
from dataclasses import dataclass, field

from traceflow.questions.runner import Tracer

# per-snapshot counters that change without any change of behaviour
_VOLATILE = [
    re.compile(r"\b(?:duration=[0-9.]+s|n_packets=\d+|n_bytes=\d+|idle_age=\d+|hard_age=\d+"
               r"|idle_timeout=\d+|packet_count=\d+|byte_count=\d+),?\s*"),
    re.compile(r"\[\d+:\d+\]"),                    # iptables-save counters
]
COMPONENTS = {"ovs-flows.txt": "ovs flows", "ovs-groups.txt": "ovs groups",
              "ovs-show.txt": "ovs ports", "iptables-save.txt": "iptables",
              "iptables-nat-list.txt": "iptables", "nft.txt": "nft", "ipvs.txt": "ipvs",
              "ip-route.txt": "routes", "ip-rule.txt": "ip rules", "ip-neigh.txt": "neighbours",
              "ip-addr.txt": "addresses", "ipset.txt": "ipsets", "sysctl.txt": "sysctls"}
MAX_RAW = 2000          # raw changes listed (the count is always exact)
EXAMPLES_PER_GROUP = 5  # changed questions named per group (-o json and --paths list all)


@dataclass
class Question:
    label: str                      # "client -> service:port/PROTO"
    pod_key: str                    # the source's key: a pod's, node/NAME, an address
    destination: object             # select.Destination in BEFORE
    source: object = None           # a node's or outside client's Endpoint (None: a pod)
    via: str | None = None
    src_port: int = 54321


@dataclass
class Change:
    question: str
    before_verdict: str
    after_verdict: str
    kind: str                       # verdict | disposition | path
    divergence: dict | None = None
    paths: list = field(default_factory=list)      # per-endpoint changes, plain English
    before_dispositions: list = field(default_factory=list)   # per path, in path order
    after_dispositions: list = field(default_factory=list)


@dataclass
class RawChange:
    change: str                     # "+" added in AFTER, "-" removed from BEFORE
    file: str
    line: int
    node: str
    component: str
    text: str
    used: bool = False


@dataclass
class DiffReport:
    before: str
    after: str
    questions: int = 0
    changed: list = field(default_factory=list)
    raw: list = field(default_factory=list)
    raw_total: int = 0
    seconds: float = 0.0

    def groups(self) -> list[dict]:
        """The changed questions grouped by how they changed and where the walks first
        diverge (component, table, the rule on each side; the nodes listed): verdict changes
        first, then dispositions, then path-only changes; the biggest groups first."""
        found: dict = {}
        for c in self.changed:
            key = _group_key(c)
            g = found.get(key)
            if g is None:
                g = found[key] = {"kind": c.kind, "cause": _cause(c),
                                  "divergence": _where(c.divergence), "count": 0, "nodes": [],
                                  "examples": []}
            g["count"] += 1
            node = (c.divergence or {}).get("node")
            if node and node not in g["nodes"]:
                g["nodes"].append(node)
            if len(g["examples"]) < EXAMPLES_PER_GROUP:
                g["examples"].append(c.question)
        order = {"verdict": 0, "disposition": 1, "path": 2}
        out = sorted(found.values(), key=lambda g: (order.get(g["kind"], 3), -g["count"],
                                                    g["cause"], str(g["divergence"])))
        for g in out:
            g["nodes"].sort()
            g["more"] = g["count"] - len(g["examples"])
        return out

    def raw_groups(self) -> list[dict]:
        """The raw changes counted per node, component and whether a traced path used them
        (used first)."""
        found: dict = {}
        for r in self.raw:
            key = (not r.used, r.node, r.component)
            g = found.setdefault(key, {"node": r.node, "component": r.component,
                                       "used": r.used, "added": 0, "removed": 0})
            g["added" if r.change == "+" else "removed"] += 1
        return [found[k] for k in sorted(found)]

    def to_dict(self) -> dict:
        return {
            "schema": "traceflow.diff/v1", "before": self.before, "after": self.after,
            "groups": self.groups(), "raw_groups": self.raw_groups(),
            "summary": {"questions": self.questions, "changed": len(self.changed),
                        "verdict_changed": sum(c.kind == "verdict" for c in self.changed),
                        "disposition_changed": sum(c.kind == "disposition"
                                                   for c in self.changed),
                        "path_changed": sum(c.kind == "path" for c in self.changed),
                        "raw_changes": self.raw_total,
                        "raw_used": sum(r.used for r in self.raw),
                        "seconds": round(self.seconds, 3)},
            "changed": [{"question": c.question, "kind": c.kind,
                         "before_verdict": c.before_verdict, "after_verdict": c.after_verdict,
                         "before_dispositions": c.before_dispositions,
                         "after_dispositions": c.after_dispositions,
                         "divergence": c.divergence, "paths": c.paths} for c in self.changed],
            "raw": [{"change": r.change, "where": f"{r.file}:{r.line}", "node": r.node,
                     "component": r.component, "text": r.text, "used": r.used}
                    for r in self.raw[:MAX_RAW]],
        }


# ---- questions ----------------------------------------------------------------------------------
def suite_questions(suite, snap) -> list[tuple[Question, object]]:
    from traceflow.questions.check import resolve
    from traceflow.questions.select import Resolver
    from traceflow.bundle.kube import Pod
    out = []
    for exp, pod, dst in resolve(suite, Resolver(snap.cluster, snap.service_cidr),
                                 snap.bundle.node_names()):
        out.append(Question(f"{exp.name} [{pod.key}]", pod.key, dst,
                            None if isinstance(pod, Pod) else pod, exp.via, exp.src_port))
    return out


def matrix_questions(snap, all_pods: bool) -> list[Question]:
    from traceflow.questions.audit import matrix, pair_label
    out = []
    for label, pods, dst in matrix(snap, all_pods):
        for pod in pods:
            who = label if len(pods) == 1 else f"{label} ({pod.key})"
            out.append(Question(f"{who} -> {pair_label(dst)}", pod.key, dst))
    return out


def _source_in_after(q: Question, after_snap):
    """The question's source in AFTER: the pod by key; a node by name; an outside address."""
    from traceflow.walk.endpoints import Kind
    if q.source is None:
        return next((p for p in after_snap.cluster.pods if p.key == q.pod_key), None)
    if q.source.kind is Kind.NODE:
        return q.source if any(n.name == q.source.node for n in after_snap.cluster.nodes) \
            else None
    return q.source


def _in_after(q: Question, after_snap):
    """The same question in AFTER's cluster: the pod by key, the destination by name."""
    from traceflow.model.errors import InputError
    from traceflow.questions.select import Destination, Resolver
    pod = _source_in_after(q, after_snap)
    dst = q.destination
    if dst.endpoint is not None:     # a typed end: resolved again as written
        ep = dst.endpoint
        ref = (f"node/{ep.node}:{dst.port}" if ep.kind.value == "node"
               else f"{ep.address}:{dst.port}")
        try:
            return pod, Resolver(after_snap.cluster, after_snap.service_cidr).destination(
                ref, "default", None, dst.protocol, "to")
        except InputError:
            return pod, None
    if dst.kind == "service":
        svc = next((s for s in after_snap.cluster.services if s.key == dst.label), None)
        if svc is None or not svc.cluster_ip:
            return pod, None
        dst = Destination("service", svc.key, svc.cluster_ip, dst.port, dst.protocol, service=svc)
    elif dst.kind == "pod":
        target = next((p for p in after_snap.cluster.pods if p.key == dst.label), None)
        if target is None or not target.ip:
            return pod, None
        dst = Destination("pod", target.key, target.ip, dst.port, dst.protocol, pod=target)
    return pod, dst


# ---- comparing walks ------------------------------------------------------------------------------
def _hop_key(h) -> tuple:
    return (h.node, h.component, str(h.table), (h.rule or "").strip(), h.unknown)


def _hops(path) -> list:
    return [h for leg in path.legs for h in leg.hops]


def _signature(trace) -> list:
    return sorted((str(p.endpoint), str(p.verdict), _dispo(p), tuple(_hop_key(h) for h in _hops(p)))
                  for p in trace.paths)


def _dispo(path) -> str:
    """A path's typed disposition (how it ended), compared as such, not from its text."""
    d = getattr(path, "disposition", None)
    return "" if d is None else str(getattr(d, "value", d))


def _dispositions(trace) -> list:
    return sorted(_dispo(p) for p in trace.paths)


def _first_divergence(bp, ap) -> tuple[int, object, object]:
    bh, ah = _hops(bp), _hops(ap)
    for i in range(max(len(bh), len(ah))):
        b = bh[i] if i < len(bh) else None
        a = ah[i] if i < len(ah) else None
        if b is None or a is None or _hop_key(b) != _hop_key(a):
            return i, b, a
    return -1, None, None


def _hop_dict(h) -> dict:
    if h is None:
        return {"at": None, "rule": None, "effect": "(the walk ends before this hop)"}
    where = f"{h.source.file}:{h.source.line}" if h.source else None
    table = f" table {h.table}" if h.table not in (None, "None") else ""
    return {"at": f"{h.node} {h.component}{table}" + (f" ({where})" if where else ""),
            "file": h.source.file if h.source else None,
            "line": h.source.line if h.source else None,
            "rule": h.rule, "effect": h.effect}


def compare(question: str, bt, at) -> Change | None:
    if str(bt.verdict) == str(at.verdict) and _signature(bt) == _signature(at):
        return None
    kind = ("verdict" if str(bt.verdict) != str(at.verdict) else
            "disposition" if _dispositions(bt) != _dispositions(at) else "path")
    change = Change(question, str(bt.verdict), str(at.verdict), kind,
                    before_dispositions=[_dispo(p) for p in bt.paths],
                    after_dispositions=[_dispo(p) for p in at.paths])
    # pair paths by endpoint, then by the longest shared prefix of hops
    b_paths, a_paths = list(bt.paths), list(at.paths)
    pairs = []
    for bp in list(b_paths):
        match = next((ap for ap in a_paths if ap.endpoint == bp.endpoint), None)
        if match is not None:
            pairs.append((bp, match))
            b_paths.remove(bp)
            a_paths.remove(match)
    for bp in b_paths:
        change.paths.append(f"path to {bp.endpoint or '?'} ({bp.verdict}) only before")
    for ap in a_paths:
        change.paths.append(f"path to {ap.endpoint or '?'} ({ap.verdict}) only after")
    for bp in b_paths:
        best = max(at.paths, key=lambda ap: _first_divergence(bp, ap)[0], default=None)
        if best is not None:
            pairs.append((bp, best))
    for ap in a_paths:
        best = max(bt.paths, key=lambda bp: _first_divergence(bp, ap)[0], default=None)
        if best is not None:
            pairs.append((best, ap))
    first = None
    for bp, ap in pairs:
        if str(bp.verdict) != str(ap.verdict) or _dispo(bp) != _dispo(ap):
            change.paths.append(f"path to {bp.endpoint or '?'}: {bp.verdict}"
                                + (f" ({_dispo(bp)})" if _dispo(bp) else "") + f" -> {ap.verdict}"
                                + (f" ({_dispo(ap)})" if _dispo(ap) else ""))
        i, bh, ah = _first_divergence(bp, ap)
        if i >= 0 and (first is None or i < first[0]):
            first = (i, bh, ah, bp, ap)
    if first is not None:
        i, bh, ah, bp, _ = first
        ref = bh or ah
        change.divergence = {
            "where": f"hop {i + 1} on {ref.node} ({ref.component}), path to {bp.endpoint or '?'}",
            "node": ref.node,
            "before": _hop_dict(bh), "after": _hop_dict(ah),
            **({"choices": {"before": list(bp.choices), "after": list(first[4].choices)}}
               if list(bp.choices) != list(first[4].choices) else {}),
            "diff": list(difflib.unified_diff([(bh.rule or bh.effect) if bh else ""],
                                              [(ah.rule or ah.effect) if ah else ""],
                                              "before", "after", lineterm="", n=0))[2:],
        }
    return change


def _cause(c: Change) -> str:
    """How the question changed, in a few words: the verdicts, the dispositions."""
    if c.kind == "verdict":
        return f"{c.before_verdict} -> {c.after_verdict}"
    if c.kind == "disposition":
        return (f"{', '.join(sorted(set(c.before_dispositions))) or '-'} -> "
                f"{', '.join(sorted(set(c.after_dispositions))) or '-'}")
    return f"still {c.after_verdict}, by another path"


def _where(divergence: dict | None) -> dict | None:
    """The first divergence without its node and path: the same step for every client."""
    if not divergence:
        return None
    out = {}
    for side in ("before", "after"):
        h = divergence.get(side) or {}
        at = h.get("at") or ""
        node = divergence.get("node")
        if node and at.startswith(node + " "):
            at = at[len(node) + 1:]
        out[side] = {"at": at.split(" (")[0] if at else None, "rule": h.get("rule"),
                     "effect": h.get("effect")}
    return out


def _group_key(c: Change) -> tuple:
    return (c.kind, _cause(c), repr(_where(c.divergence)))


# ---- raw changes ----------------------------------------------------------------------------------
def _norm(line: str) -> str:
    for rx in _VOLATILE:
        line = rx.sub("", line)
    return line.strip()


def raw_changes(before_bundle, after_bundle) -> list[RawChange]:
    out = []
    names = sorted(set(before_bundle.names()) | set(after_bundle.names()))
    for name in names:
        parts = name.split("/")
        if parts[0] == "nodes" and len(parts) == 3:
            node, component = parts[1], COMPONENTS.get(parts[2], parts[2])
        elif parts[0] == "k8s":
            node, component = "-", "kubernetes " + parts[-1].removesuffix(".yaml")
        elif parts[0] == "pods" and len(parts) >= 4:
            node, component = "/".join(parts[1:3]), "pod " + COMPONENTS.get(parts[-1], parts[-1])
        else:
            continue
        bt = before_bundle.text(name) or ""
        at = after_bundle.text(name) or ""
        if bt == at:
            continue
        bl = [(i, l) for i, l in enumerate(bt.splitlines(), 1) if l.strip() and not l.startswith("#")]
        al = [(i, l) for i, l in enumerate(at.splitlines(), 1) if l.strip() and not l.startswith("#")]
        bcount, acount = Counter(_norm(l) for _, l in bl), Counter(_norm(l) for _, l in al)
        removed, added = bcount - acount, acount - bcount
        for lines, delta, sign in ((bl, removed, "-"), (al, added, "+")):
            for i, l in lines:
                n = _norm(l)
                if delta.get(n, 0) > 0:
                    delta[n] -= 1
                    out.append(RawChange(sign, name, i, node, component, l.strip()))
    return out


_GROUP_CHOICE = re.compile(r"^(\S+) OVS group (\d+):")
_GROUP_LINE = re.compile(r"group_id=(\d+)")
_GROUP_ACTION = re.compile(r"\bgroup:(\d+)")


def _used_sources(traces) -> set:
    """(file, line) of every hop's rule, (node, "group", id) of every group a branch chose a
    bucket of (group buckets are choices, not hops), and (file, "conjunction", id) of
    every conjunction a hit flow completed: its clause flows decided the hit too."""
    used = set()
    for t in traces:
        for p in t.paths:
            for h in _hops(p):
                if h.source is not None:
                    used.add((h.source.file, h.source.line))
                    if h.component == "ovs" and "conj_id=" in (h.rule or ""):
                        conj = _conj_id(h.rule, h.source)
                        if conj is not None:    # (ids are the agent's, one per bridge)
                            used.add((h.source.file, "conjunction", conj))
                for gid in _GROUP_ACTION.findall(h.rule or ""):
                    used.add((h.node, "group", int(gid)))
            for c in p.choices:
                m = _GROUP_CHOICE.match(c)
                if m:
                    used.add((m.group(1), "group", int(m.group(2))))
    return used


def _conj_id(rule: str, source) -> int | None:
    """The conj_id a flow of the bundle matches on (the flow read as the engine reads it)."""
    from traceflow.engines.ovs.flows import parse_flow
    from traceflow.model.errors import InputError
    try:
        return parse_flow(rule, source).conj_id
    except (ValueError, InputError):
        return None


def _clauses(text: str, source) -> list[int]:
    """The conjunction ids a flow line's actions are clauses of."""
    from traceflow.engines.ovs import actions as A
    from traceflow.engines.ovs.flows import parse_flow
    from traceflow.model.errors import InputError
    try:
        flow = parse_flow(text, source)
        return [a.conj_id for a in flow.actions if isinstance(a, A.Conjunction)]
    except (ValueError, InputError):
        return []


def _is_used(r: RawChange, used: set) -> bool:
    if (r.file, r.line) in used:
        return True
    if r.component == "ovs flows" and "conjunction(" in r.text:
        from traceflow.model.errors import Source
        ids = _clauses(r.text, Source(r.file, r.line, r.text))
        if any((r.file, "conjunction", i) in used for i in ids):
            return True         # a clause of a conjunction a traced flow completed
    m = _GROUP_LINE.search(r.text) if r.component == "ovs groups" else None
    return bool(m and (r.node, "group", int(m.group(1))) in used)


# ---- the command ----------------------------------------------------------------------------------
def run_diff(before_snap, after_snap, before_name: str, after_name: str, suite=None,
             all_pods: bool = False) -> DiffReport:
    t0 = time.monotonic()
    report = DiffReport(before_name, after_name)
    qs = suite_questions(suite, before_snap) if suite is not None else \
        matrix_questions(before_snap, all_pods)
    report.questions = len(qs)
    bt_tracer, at_tracer = Tracer(before_snap), Tracer(after_snap)
    b_traces, a_traces = [], []
    for q in qs:
        pod = q.source if q.source is not None else \
            next(p for p in before_snap.cluster.pods if p.key == q.pod_key)
        bt = bt_tracer.trace(pod, q.destination, q.src_port, q.via)
        b_traces.append(bt)
        apod, adst = _in_after(q, after_snap)
        if apod is None or adst is None:
            report.changed.append(Change(q.label, str(bt.verdict), "gone", "verdict", None,
                                         ["the client or the destination is not in AFTER"]))
            continue
        at = at_tracer.trace(apod, adst, q.src_port, q.via)
        a_traces.append(at)
        change = compare(q.label, bt, at)
        if change is not None:
            report.changed.append(change)
    raw = raw_changes(before_snap.bundle, after_snap.bundle)
    used_b, used_a = _used_sources(b_traces), _used_sources(a_traces)
    for r in raw:
        r.used = _is_used(r, used_b if r.change == "-" else used_a)
    raw.sort(key=lambda r: (not r.used, r.node, r.component, r.file, r.line))
    report.raw, report.raw_total = raw, len(raw)
    report.seconds = time.monotonic() - t0
    return report
