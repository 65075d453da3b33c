"""`traceflow check`: a suite's expectations against traces, one result per expectation and
source pod (a selector fans out to every pod it selects)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from traceflow.model.errors import InputError
from traceflow.questions.runner import Progress, Tracer, source_endpoint_of
from traceflow.questions.select import Resolver
from traceflow.questions.suite import DISPOSITIONS, Expectation, Suite
from traceflow.model.trace import Disposition, Drop, Path, Trace, Verdict


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
    failing: list = field(default_factory=list)   # the failing paths, as ``details`` says them

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


def resolve(suite: Suite, resolver: Resolver, node_names=None) -> list[tuple]:
    """Every (expectation, source, destination): a source is a pod, or a node's or outside
    client's Endpoint. A bad reference is a bad suite (exit 2) naming the suite's file, the
    expectation's line and key."""
    from traceflow.questions.ends import entry_nodes
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
            try:    # an outside client needs a node to enter by: checked now, not mid-run
                if dst.endpoint is not None or exp.via is not None or \
                        source_endpoint_of(pod).kind.value == "external":
                    entry_nodes(resolver.cluster, source_endpoint_of(pod), dst_endpoint(dst),
                                exp.via, node_names if node_names is not None else ())
            except InputError as err:
                key = "via" if "via" in exp.key_lines else "to"
                raise InputError(f"{where}.{key}: {err.reason}", suite.file,
                                 exp.line_of(key)) from None
            out.append((exp, pod, dst))
    return out


def dst_endpoint(dst):
    """The typed end of a suite destination (traceflow.walk.endpoints)."""
    from traceflow.questions.runner import destination_endpoint_of
    return destination_endpoint_of(dst)


def run_check(suite: Suite, tracer: Tracer, bundle_name: str, progress: bool | None = None) -> Report:
    t0 = time.monotonic()
    resolver = Resolver(tracer.snap.cluster, tracer.snap.service_cidr)
    work = resolve(suite, resolver, tracer.snap.bundle.node_names())
    report = Report(suite, bundle_name)
    bar = Progress(len(work), "check", progress if progress is not None else None)
    if len(work) < 50 and progress is None:
        bar.enabled = False
    for exp, pod, dst in work:
        for family, fsrc, fdst in _families(exp, pod, dst, resolver, suite.file):
            s = time.monotonic()
            trace = tracer.trace(fsrc, fdst, exp.src_port, exp.via)
            passed, observed, message, details = evaluate(exp, trace)
            key = pod.key + (f" ({'IPv6' if family == 6 else 'IPv4'})"
                             if exp.family == "both" else "")
            where = (f"[{fdst.ip}]" if ":" in fdst.ip else fdst.ip)
            report.results.append(Result(exp, key, f"{fdst.label} ({where}:{fdst.port}/"
                                                   f"{fdst.protocol})", passed, observed,
                                         message, details, time.monotonic() - s, trace,
                                         trace.query.get("scope", "end-to-end"),
                                         failing_paths(trace, details)))
        bar.step()
    bar.close()
    report.seconds = time.monotonic() - t0
    report.traced = tracer.traced
    return report


def _families(exp: Expectation, pod, dst, resolver, file: str) -> list[tuple]:
    """[(family, source, destination)] of one question: as resolved, or with ``family:``
    the named ends re-addressed in that family (both: one question per family). A named end
    without an address of the family fails the suite, naming the expectation's line."""
    from traceflow.questions import family as fam
    if exp.family is None:
        return [(None, pod, dst)]
    out = []
    for f in ((4, 6) if exp.family == fam.BOTH else (exp.family,)):
        try:
            out.append((f, _source_in(pod, f, resolver), _destination_in(dst, f, resolver)))
        except InputError as err:
            raise InputError(f"{err.reason} (family: {exp.family})", file,
                             exp.line_of("family")) from None
    return out


def _source_in(pod, family: int, resolver):
    from traceflow.questions import family as fam
    from traceflow.bundle.kube import Pod
    if isinstance(pod, Pod):
        fam.pod_address(pod, family)
        return pod
    return fam.readdress(resolver.cluster, pod, family) if fam._fam(pod.address) != family \
        else pod


def _destination_in(dst, family: int, resolver):
    import dataclasses
    from traceflow.questions import family as fam
    if fam._fam(dst.ip) == family:
        return dst
    if dst.endpoint is not None:
        end = fam.readdress(resolver.cluster, dst.endpoint, family)
        return dataclasses.replace(dst, ip=end.address, endpoint=end)
    if dst.service is not None:
        return dataclasses.replace(dst, ip=fam.service_address(dst.service, family))
    if dst.pod is not None:
        return dataclasses.replace(dst, ip=fam.pod_address(dst.pod, family))
    raise InputError(f"{dst.ip} is an {fam.NAMES[fam._fam(dst.ip)]} address, not "
                     f"{fam.NAMES[family]}", "family")


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
    if exp.expect in DISPOSITIONS:
        # a disposition the walk decided (left-cluster, loop) counts even on an unknown verdict
        unknown = [p for p in paths if _disposition(p) in (None, Disposition.UNKNOWN)]
        known = [p for p in paths if all(p is not u for u in unknown)]
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
    return _disposition_result(exp, known, observed)


def _disposition_result(exp: Expectation, known: list, observed: str) -> tuple:
    """A disposition expected (dropped-by-policy is dropped-policy): compared with each
    path's typed disposition, never with its reason text."""
    want = Disposition("dropped-policy" if exp.expect == "dropped-by-policy" else exp.expect)
    bad = []
    for p in known:
        got = _disposition(p)
        if got is not want:
            bad.append(p)
        elif want is Disposition.DROPPED_POLICY and exp.policy:
            _, names = policy_of(p.drop)
            if not any(_same_policy(exp.policy, n, exp.namespace) for n in names):
                bad.append(p)
    if exp.expect == "dropped-by-policy" or want is Disposition.DROPPED_POLICY:
        what = (f"dropped by NetworkPolicy {exp.policy}" if exp.policy
                else "dropped by a NetworkPolicy")
    else:
        what = want.value
    if exp.branches == "any":
        ok = len(bad) < len(known)
        return _result(ok, _observed_dispositions(known) if not ok else observed,
                       [] if ok else bad, f"expected {what} on at least one branch")
    return _result(not bad, observed if not bad else _observed_dispositions(known), bad,
                   f"expected {what}")


def _disposition(p: Path) -> Disposition | None:
    d = p.disposition
    if d is None:
        return None
    return d if isinstance(d, Disposition) else Disposition(str(d))


def _observed_dispositions(paths: list) -> str:
    counts: dict = {}
    for p in paths:
        key = str(_disposition(p) or p.verdict)
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{d} on {n}/{len(paths)} path{'s' if len(paths) > 1 else ''}"
                     for d, n in sorted(counts.items())) or "no path"


def _same_policy(want: str, got: str, namespace: str) -> bool:
    return (want if "/" in want else f"{namespace}/{want}") == got


def policy_of(drop: Drop | None) -> tuple[bool, list[str]]:
    """(is this a NetworkPolicy drop, the policies it names): the drop's typed disposition
    and the policies its datapath named, never its reason text."""
    if drop is None:
        return False, []
    return drop.disposition is Disposition.DROPPED_POLICY, list(drop.policies)


def _result(ok: bool, observed: str, bad: list, why: str) -> tuple[bool, str, str, list]:
    if ok:
        return True, observed, "", []
    details = [describe_path(p) for p in bad]
    message = f"{why}, got {observed}" + (f": {details[0]}" if details else "")
    return False, observed, message, details


def failing_paths(trace: Trace, details: list) -> list:
    """The path each line of ``details`` describes (None when none), in its order: for views
    that show the typed end of a failing path."""
    by_line: dict = {}
    for p in trace.paths:
        by_line.setdefault(describe_path(p), p)
    return [by_line.get(d) for d in details]


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
