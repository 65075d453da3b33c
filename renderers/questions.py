"""Text and JSON output of `check`, `audit` and `diff`: a summary first, then the details.

Text goes through Rich (colour on a terminal, plain when piped); JSON documents carry a
``schema`` name so machines can tell them apart.
"""

from __future__ import annotations

import json
from contextlib import nullcontext

from renderers.json_out import trace_to_dict

# Rich (and the renderers that use it) are imported by the text views only: -o json does
# not load it.


# ---- check ---------------------------------------------------------------------------------
def check_to_dict(report, with_traces: bool = False) -> dict:
    return {
        "schema": "traceflow.check/v1",
        "suite": report.suite.title, "file": report.suite.file, "bundle": report.bundle,
        "summary": {"expectations": len(report.suite.expectations),
                    "results": len(report.results), "passed": len(report.results) - len(report.failed),
                    "failed": len(report.failed), "distinct_traces": report.traced,
                    "seconds": round(report.seconds, 3)},
        "results": [{
            "name": r.expectation.name, "line": r.expectation.line, "source": r.source,
            "destination": r.destination, "expect": r.expectation.expect,
            **({"branches": r.expectation.branches} if r.expectation.expect == "delivered" else {}),
            **({"via": r.expectation.via} if r.expectation.via else {}),
            "dispositions": _dispositions(r.trace),
            **({"policy": r.expectation.policy} if r.expectation.policy else {}),
            "verdict": r.verdict, "scope": r.scope, "passed": r.passed, "observed": r.observed,
            "message": r.message, "details": r.details,
            **({"trace": trace_to_dict(r.trace)} if with_traces and r.trace else {}),
        } for r in report.results],
    }


def _dispositions(trace) -> list:
    """Each path's disposition, in path order (traceflow.trace.Disposition values)."""
    if trace is None:
        return []
    return [None if p.disposition is None else str(getattr(p.disposition, "value",
                                                            p.disposition))
            for p in trace.paths]


def _themed(render):
    """Run ``render`` with the ``tf.*`` styles the console lacks (any console will do)."""
    def run(report, console: Console, *args, **kwargs):
        from renderers.theme import missing_styles
        theme = missing_styles(console)
        with console.use_theme(theme) if theme else nullcontext():
            return render(report, console, *args, **kwargs)
    run.__doc__, run.__name__ = render.__doc__, render.__name__
    return run


def _out(console: Console):
    from renderers.text import _Out
    return _Out(console)


def _e(text) -> str:
    from renderers.textfit import escape as escape_text
    return escape_text("" if text is None else str(text))


@_themed
def render_check_text(report, console: Console, about=None) -> None:
    """A summary line, then one entry per result: ``ok``/``FAIL``, the expectation, who to
    whom and what was seen; a failure adds the suite's file:line and, for each failing path,
    the human answer (the policy and what it allows) then the datapath's detail. Every line
    is fitted to the terminal: long ones wrap under their label, never mid-word."""
    from renderers import walk
    out = _out(console)
    n, bad = len(report.results), len(report.failed)
    out.parts_wrapped([("FAIL" if bad else "PASS", "tf.dropped" if bad else "tf.delivered"),
                       (f": {n - bad} of {n} hold — suite {_e(report.suite.title)} on "
                        f"{_e(report.bundle)} ({report.traced} distinct traces, "
                        f"{report.seconds:.2f} s)", None)], 6)
    scopes = {r.scope for r in report.results}
    if "service-translation" in scopes:
        out.wrapped("note: ", "host-only bundle (no CNI datapath files): verdicts cover the "
                    "Service translation on the client's node, not the pod-to-pod forwarding",
                    head_style="tf.warning")
    for r in report.results:
        mark = ("ok   ", "tf.delivered") if r.passed else ("FAIL ", "tf.dropped")
        out.parts_wrapped([mark, (_e(r.expectation.name), "tf.title"),
                           (f"  {_e(r.source)} -> {_e(r.destination)}", "tf.muted"),
                           (f"  expect {r.expectation.expect}: {_e(r.observed)}", None)], 7)
        if r.passed:
            continue
        out.wrapped("       at: ", f"{_e(report.suite.file)}:{r.expectation.line}",
                    "tf.source")
        failing = list(getattr(r, "failing", None) or [])
        failing += [None] * (len(r.details) - len(failing))
        for path, detail in zip(failing, r.details):
            if path is None:
                out.wrapped("       - ", _e(detail))
                continue
            answer = _e(walk.answer(path, about))
            via = f"via {_e(path.endpoint)}: " if path.endpoint else ""
            out.wrapped("       - ", f"{via}{answer or _e(detail)}", "tf.answer")
            if answer:
                out.wrapped("         datapath: ", _e(detail))


# ---- audit -----------------------------------------------------------------------------------
def audit_to_dict(report) -> dict:
    return report.to_dict()


@_themed
def render_audit_text(report, console: Console, about=None) -> None:
    """The counts first (and how many questions each trace answered), then drift findings
    with their evidence, then the pairs that were not delivered grouped by how they ended: the
    human answer (the policy and what it allows), the datapath's reason, a few pairs (they
    stream past: ``report.groups`` keeps a count and the first ones of each group). Fitted to
    the terminal, wrapped under each label."""
    from renderers import walk
    out = _out(console)
    d = report.head()           # the pairs stay in their spool: grouped below, not listed
    s = d["summary"]
    bad = s["pairs_not_delivered"] + s["findings"]
    out.parts_wrapped([("audit", "tf.unknown" if bad else "tf.delivered"),
                       (f" {_e(d['bundle'])}: {s['pairs']} pairs ({s['service_ports']} service "
                        f"ports x {s['client_groups']} client groups), "
                        f"{s['distinct_traces']} traces, {s['seconds']:.2f} s", None)], 2)
    if not s["service_ports"]:
        out.wrapped("  note: ", "the bundle has no Service with a cluster IP "
                    "(k8s/services.yaml): there are no pairs to audit; trace one connection "
                    "with `traceflow trace SOURCE DESTINATION --bundle ...`",
                    head_style="tf.warning")
    if s.get("pod_questions"):
        out.wrapped("  ", f"{s['pod_questions']} pod questions answered by "
                    f"{s['distinct_traces']} traces: each stands for "
                    f"{s['questions_per_trace']} on average"
                    + (f", up to {s['most_shared'][0]['stands_for']}" if s["most_shared"]
                       else ""))
    by = s["by_verdict"]
    out.wrapped("  ", f"delivered {s['pairs_delivered']}, not delivered "
                f"{s['pairs_not_delivered']} (dropped {by.get('dropped', 0)}, partial "
                f"{by.get('partial', 0)}, unknown {by.get('unknown', 0)})")
    out.wrapped("  ", f"drift findings: {s['findings']}"
                + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(s["by_kind"].items())) + ")"
                   if s["by_kind"] else ""))
    for note in d["notes"]:
        out.wrapped("  note: ", _e(note))
    if d["findings"]:
        out.blank()
        out.line(("Drift", "tf.title"))
        for f in d["findings"]:
            out.parts_wrapped([(_e(f["kind"]), "tf.warning"),
                               (f" {_e(f['subject'])}: {_e(f['message'])}", None)], 4)
            for e in f.get("evidence", []):
                out.wrapped("    ", _e(e), "tf.source")
    groups = report.groups      # (disposition, reason) -> [count, first pairs]
    if not groups:
        return
    out.blank()
    out.line(("Pairs not delivered", "tf.title"),
             (" (grouped by how they ended)", "tf.muted"))
    words = about.policies if about is not None else None
    for (disposition, reason), (count, pairs) in sorted(groups.items(),
                                                        key=lambda kv: -kv[1][0]):
        first = pairs[0]
        if disposition == "dropped-policy" and first.policies:
            answer = walk.policy_answer(first.policies, words)
        else:
            answer = walk.DISPOSITION_ANSWERS.get(disposition, "")
        label = f"{disposition}: " if disposition else ""
        out.parts_wrapped([(f"{count} x ", "tf.dropped"),
                           (_e(label + (answer or reason)), "tf.answer")], 4)
        if answer:
            out.wrapped("    datapath: ", _e(reason))
        for p in pairs:
            out.parts_wrapped([(f"    {_e(p.client)} -> {_e(p.service)} [{p.verdict}]",
                                "tf.muted")], 8)
        if count > len(pairs):
            out.wrapped("    ", f"... and {count - len(pairs)} more (-o json lists all)",
                        "tf.muted")


# ---- diff ------------------------------------------------------------------------------------
GROUPS_SHOWN = 12           # groups of changed questions listed (then "N more")
RAW_SHOWN = 12              # raw-change groups listed


@_themed
def render_diff_text(report, console: Console, paths: bool = False) -> None:
    """The counts, the changed questions grouped (traceflow.questions.diff: by how they
    changed and where the walks first diverge, the rule on each side with file:line), the raw
    changes counted per node and component, used ones first; ``paths``: every changed
    question (with the diff of the two walks) and raw change as well. Fitted to the
    terminal."""
    out = _out(console)
    d = report.to_dict()
    s = d["summary"]
    out.parts_wrapped([("diff", "tf.title"),
                       (f" {_e(d['before'])} -> {_e(d['after'])}: {s['questions']} questions, "
                        f"{s['changed']} changed ({s['verdict_changed']} verdict, "
                        + (f"{s['disposition_changed']} disposition, "
                           if s.get("disposition_changed") else "")
                        + f"{s['path_changed']} path only); {s['raw_changes']} raw changes "
                        f"({s['raw_used']} on a traced path)", None)], 2)
    groups = d["groups"]
    for g in groups[:GROUPS_SHOWN]:
        nodes = (f" on {', '.join(g['nodes'][:4])}" + (" ..." if len(g["nodes"]) > 4 else "")
                 if g["nodes"] else "")
        out.blank()
        out.parts_wrapped([(f"{g['count']} x ", "tf.dropped" if g["kind"] == "verdict"
                            else "tf.warning"),
                           (_e(g["cause"] + nodes), None)], 4)
        dv = g.get("divergence")
        if dv:
            for side in ("before", "after"):
                h = dv[side]
                out.wrapped(f"  {side:6} ", f"{_e(h['at'] or '-')}: "
                            f"{_e(h['rule'] or h['effect'] or '-')}")
        if g["kind"] != "path" or paths:
            for q in g["examples"]:
                out.wrapped("    ", _e(q), "tf.muted")
            if g["more"] and not paths:
                out.wrapped("    ", f"... and {g['more']} more (--paths lists them)", "tf.muted")
    if len(groups) > GROUPS_SHOWN:
        rest = sum(g["count"] for g in groups[GROUPS_SHOWN:])
        out.blank()
        out.wrapped("", f"... {len(groups) - GROUPS_SHOWN} more groups ({rest} questions; "
                    "--paths or -o json lists them)", "tf.muted")
    if d["raw_groups"]:
        out.blank()
        out.line(("Raw changes", "tf.title"), (" (used by a traced path first)", "tf.muted"))
        for r in d["raw_groups"][:RAW_SHOWN]:
            out.parts_wrapped([("used" if r["used"] else "unused",
                                "tf.dropped" if r["used"] else "tf.muted"),
                               (f" {_e(r['node'])} {_e(r['component'])}: +{r['added']} "
                                f"-{r['removed']}", None)], 4)
        if len(d["raw_groups"]) > RAW_SHOWN:
            out.wrapped("", f"... {len(d['raw_groups']) - RAW_SHOWN} more (--paths lists "
                        "them)", "tf.muted")
    if not paths:
        return
    for c in d["changed"]:
        out.blank()
        out.parts_wrapped([(_e(c["question"]), "tf.warning"),
                           (f": {c['before_verdict']} -> {c['after_verdict']}", None)], 2)
        dv = c.get("divergence")
        if dv:
            out.wrapped("  first divergence: ", _e(dv["where"]))
            for side in ("before", "after"):
                h = dv[side]
                out.wrapped(f"  {side:6} ", f"{_e(h['at'] or '-')}: "
                            f"{_e(h['rule'] or h['effect'] or '-')}")
            for side, chosen in (dv.get("choices") or {}).items():
                out.wrapped(f"  {side:6} branch: ", _e("; ".join(chosen) or "-"))
            for line in dv.get("diff", []):
                style = ("tf.dropped" if line.startswith("-") else
                         "tf.delivered" if line.startswith("+") else "tf.muted")
                out.wrapped("    ", _e(line), style)
        for note in c.get("paths", []):
            out.wrapped("  - ", _e(note))
    if d["raw"]:
        out.blank()
        out.line(("Raw changes", "tf.title"))
        for r in d["raw"]:
            out.parts_wrapped([("used" if r["used"] else "unused",
                                "tf.dropped" if r["used"] else "tf.muted"),
                               (f" {r['change']} {_e(r['where'])}: {_e(r['text'])}", None)], 4)


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2)
