"""`traceflow check`: a suite's expectations against traces, one result per expectation and
source pod (a selector fans out to every pod it selects)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from traceflow.model.errors import InputError
from traceflow.questions.runner import Progress, Tracer
from traceflow.questions.select import Resolver
from traceflow.questions.suite import Expectation, Suite
from traceflow.model.trace import Drop, Path, Trace, Verdict

_POLICY_NAMES = re.compile(r"NetworkPolicy ((?:[\w.-]+/[\w.-]+)(?:, [\w.-]+/[\w.-]+)*)")


@dataclass
class Result:
    expectation: Expectation
    source: str                     # namespace/pod
    destination: str                # what it resolved to
    passed: bool
    observed: str                   # e.g. "delivered on 2/2 paths"
    message: str = ""               # why it failed (drop reason, node, component, table, rule)
    details: list = field(default_factory=list)   # one line per failing path
    seconds: float = 0.0
    trace: Trace | None = None
    scope: str = "end-to-end"

    @property
    def verdict(self) -> str:
        return str(self.trace.verdict) if self.trace else "unknown"


@dataclass
class Report:
    suite: Suite
    bundle: str
    results: list = field(default_factory=list)
    seconds: float = 0.0
    traced: int = 0

    @property
    def failed(self) -> list:
        return [r for r in self.results if not r.passed]


def resolve(suite: Suite, resolver: Resolver) -> list[tuple]:
    """Every (expectation, source pod, destination); a bad reference is a bad suite (exit 2)
    naming the suite's file, the expectation's line and key."""
    out = []
    for i, exp in enumerate(suite.expectations):
        where = f"expectations[{i}]"
        try:
            pods = resolver.sources(exp.source, exp.namespace, f"{where}.from")
        except InputError as err:
            raise InputError(f"{where}.from: {err.reason}", suite.file,
                             exp.line_of("from")) from None
        try:
            dst = resolver.destination(exp.destination, exp.namespace, exp.port, exp.protocol,
                                       f"{where}.to")
        except InputError as err:
            raise InputError(f"{where}.to: {err.reason}", suite.file,
                             exp.line_of("to")) from None
        for pod in pods:
            out.append((exp, pod, dst))
    return out


def run_check(suite: Suite, tracer: Tracer, bundle_name: str, progress: bool | None = None) -> Report:
    t0 = time.monotonic()
    resolver = Resolver(tracer.snap.cluster)
    work = resolve(suite, resolver)
    report = Report(suite, bundle_name)
    bar = Progress(len(work), "check", progress if progress is not None else None)
    if len(work) < 50 and progress is None:
        bar.enabled = False
    for exp, pod, dst in work:
        s = time.monotonic()
        trace = tracer.trace(pod, dst, exp.src_port)
        passed, observed, message, details = evaluate(exp, trace)
        report.results.append(Result(exp, pod.key, f"{dst.label} ({dst.ip}:{dst.port}/"
                                                   f"{dst.protocol})", passed, observed, message,
                                     details, time.monotonic() - s, trace,
                                     trace.query.get("scope", "end-to-end")))
        bar.step()
    bar.close()
    report.seconds = time.monotonic() - t0
    report.traced = tracer.traced
    return report


def evaluate(exp: Expectation, trace: Trace) -> tuple[bool, str, str, list]:
    """(passed, what was observed, failure message, per-path details)."""
    paths = trace.paths
    counts = {}
    for p in paths:
        counts[str(p.verdict)] = counts.get(str(p.verdict), 0) + 1
    observed = ", ".join(f"{v} on {n}/{len(paths)} path{'s' if len(paths) > 1 else ''}"
                         for v, n in sorted(counts.items())) or "no path"
    unknown = [p for p in paths if p.verdict == Verdict.UNKNOWN]
    known = [p for p in paths if p.verdict != Verdict.UNKNOWN]
    if exp.expect == "unknown":
        bad = known
        return _result(not bad and bool(paths), observed, bad, "expected unknown")
    if unknown and not exp.allow_unknown:
        return _result(False, observed, unknown, "the trace could not decide (unknown; set "
                       "allow-unknown: true to accept it)")
    if not known:
        if exp.allow_unknown and unknown:
            return True, observed + " (allowed)", "", []
        return _result(False, observed, paths, "no path")
    if exp.expect == "delivered":
        bad = [p for p in known if p.verdict != Verdict.DELIVERED]
        if exp.branches == "any":
            ok = len(bad) < len(known)
            return _result(ok, observed, [] if ok else bad, "expected delivered on at least one "
                           "branch")
        return _result(not bad, observed, bad, "expected delivered on every branch")
    if exp.expect == "dropped":
        bad = [p for p in known if p.verdict != Verdict.DROPPED]
        return _result(not bad, observed, bad, "expected dropped")
    # dropped-by-policy
    bad = []
    for p in known:
        if p.verdict != Verdict.DROPPED:
            bad.append(p)
            continue
        is_policy, names = policy_of(p.drop)
        if not is_policy or (exp.policy and not any(_same_policy(exp.policy, n, exp.namespace)
                                                    for n in names)):
            bad.append(p)
    want = f"dropped by NetworkPolicy {exp.policy}" if exp.policy else "dropped by a NetworkPolicy"
    return _result(not bad, observed, bad, f"expected {want}")


def _same_policy(want: str, got: str, namespace: str) -> bool:
    return (want if "/" in want else f"{namespace}/{want}") == got


def policy_of(drop: Drop | None) -> tuple[bool, list[str]]:
    """(is this a NetworkPolicy drop, the policies it names)."""
    if drop is None:
        return False, []
    named = getattr(drop, "policy", None)       # a field some datapaths may set
    if named:
        return True, [named] if isinstance(named, str) else list(named)
    reason = drop.reason or ""
    names = [n for m in _POLICY_NAMES.finditer(reason) for n in m.group(1).split(", ")]
    return ("default-deny" in reason or "NetworkPolicy" in reason), names


def _result(ok: bool, observed: str, bad: list, why: str) -> tuple[bool, str, str, list]:
    if ok:
        return True, observed, "", []
    details = [describe_path(p) for p in bad]
    message = f"{why}, got {observed}" + (f": {details[0]}" if details else "")
    return False, observed, message, details


def describe_path(p: Path) -> str:
    """One line: the verdict, where it ended (node, component, table, rule, file:line), why."""
    via = f" via {p.endpoint}" if p.endpoint else ""
    if p.drop is None:
        return f"{p.verdict}{via}"
    d = p.drop
    where = f"on {d.node}, {d.component}" + (f" table {d.table}" if d.table else "")
    src = drop_source(p)
    rule = f", rule `{d.rule.strip()}`" if d.rule else ""
    at = f" ({src.file}:{src.line})" if src else ""
    return f"{p.verdict}{via} {where}{rule}{at}: {d.reason}"


def drop_source(p: Path):
    """The bundle file:line of the rule that ended the path, from its last matching hop."""
    d = p.drop
    if d is None:
        return None
    for leg in reversed(p.legs):
        for hop in reversed(leg.hops):
            if hop.node == d.node and hop.source is not None and (d.rule is None
                                                                  or hop.rule == d.rule):
                return hop.source
    return None
