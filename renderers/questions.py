"""Text and JSON output of `check`, `audit` and `diff`: a summary first, then the details.

Text goes through Rich (colour on a terminal, plain when piped); JSON documents carry a
``schema`` name so machines can tell them apart.
"""

from __future__ import annotations

import json

from renderers.json_out import trace_to_dict


def escape(text: str) -> str:
    """Rich's markup escape, Rich loaded for text only (-o json does not load it)."""
    from rich.markup import escape as rich_escape
    return rich_escape(text)


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


def render_check_text(report, console: Console) -> None:
    n, bad = len(report.results), len(report.failed)
    style = "bold red" if bad else "bold green"
    console.print(f"[{style}]{'FAIL' if bad else 'PASS'}[/]: {n - bad}/{n} hold — suite "
                  f"{escape(report.suite.title)} on {escape(report.bundle)} "
                  f"({report.traced} distinct traces, {report.seconds:.2f} s)")
    scopes = {r.scope for r in report.results}
    if "service-translation" in scopes:
        console.print("[yellow]note[/]: host-only bundle: verdicts cover the Service "
                      "translation on the client's node, not the pod-to-pod forwarding")
    for r in report.results:
        mark = "[green]ok  [/]" if r.passed else "[red]FAIL[/]"
        console.print(f"{mark} {escape(r.expectation.name)} [dim]\\[{escape(r.source)} -> "
                      f"{escape(r.destination)}][/] expect {r.expectation.expect}: "
                      f"{escape(r.observed)}")
        if not r.passed:
            console.print(f"     [dim]{escape(report.suite.file)}:{r.expectation.line}[/]")
            for d in r.details:
                console.print(f"     - {escape(d)}")


# ---- audit -----------------------------------------------------------------------------------
def audit_to_dict(report) -> dict:
    return report.to_dict()


def render_audit_text(report, console: Console) -> None:
    d = report.head()           # the pairs stay in their spool: grouped below, not listed
    s = d["summary"]
    bad = s["pairs_not_delivered"] + s["findings"]
    style = "bold yellow" if bad else "bold green"
    console.print(f"[{style}]audit[/] {escape(d['bundle'])}: {s['service_ports']} service ports x "
                  f"{s['client_groups']} client groups = {s['pairs']} pairs "
                  f"({s['distinct_traces']} traces, {s['seconds']:.2f} s)")
    if s.get("pod_questions"):
        console.print(f"  {s['pod_questions']} pod questions answered by {s['distinct_traces']} "
                      f"traces: each stands for {s['questions_per_trace']} on average"
                      + (f", up to {s['most_shared'][0]['stands_for']}" if s["most_shared"] else ""))
    console.print(f"  delivered {s['pairs_delivered']}, not delivered {s['pairs_not_delivered']} "
                  f"(dropped {s['by_verdict'].get('dropped', 0)}, partial "
                  f"{s['by_verdict'].get('partial', 0)}, unknown {s['by_verdict'].get('unknown', 0)})")
    console.print(f"  drift findings: {s['findings']}"
                  + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(s["by_kind"].items())) + ")"
                     if s["by_kind"] else ""))
    for note in d["notes"]:
        console.print(f"  [dim]note: {escape(note)}[/]")
    if d["findings"]:
        console.print("\n[bold]Drift[/]")
        for f in d["findings"]:
            console.print(f"[yellow]{escape(f['kind'])}[/] {escape(f['subject'])}: "
                          f"{escape(f['message'])}")
            for e in f.get("evidence", []):
                console.print(f"    {escape(e)}")
    groups = report.groups      # (disposition, reason) -> [count, first pairs]
    if groups:
        console.print("\n[bold]Pairs not delivered[/] (grouped by disposition and reason)")
        for (disposition, reason), (count, pairs) in sorted(groups.items(),
                                                            key=lambda kv: -kv[1][0]):
            label = f"{disposition}: " if disposition else ""
            console.print(f"[red]{count}[/] x {escape(label + reason)}")
            for p in pairs:
                console.print(f"    {escape(p.client)} -> {escape(p.service)} [{p.verdict}]")
            if count > len(pairs):
                console.print(f"    ... and {count - len(pairs)} more (-o json lists all)")


# ---- diff ------------------------------------------------------------------------------------
GROUPS_SHOWN = 12           # groups of changed questions listed (then "N more")
RAW_SHOWN = 12              # raw-change groups listed


def render_diff_text(report, console: Console, paths: bool = False) -> None:
    """The summary, the changed questions grouped (traceflow.questions.diff: by how they
    changed and where the walks first diverge), the raw changes counted per node and
    component; ``paths``: every changed question and raw change as well."""
    d = report.to_dict()
    s = d["summary"]
    console.print(f"[bold]diff[/] {escape(d['before'])} -> {escape(d['after'])}: "
                  f"{s['questions']} questions, {s['changed']} changed "
                  f"({s['verdict_changed']} verdict, "
                  + (f"{s['disposition_changed']} disposition, "
                     if s.get("disposition_changed") else "")
                  + f"{s['path_changed']} path only); "
                  f"{s['raw_changes']} raw changes ({s['raw_used']} on a traced path)")
    groups = d["groups"]
    for g in groups[:GROUPS_SHOWN]:
        colour = "red" if g["kind"] == "verdict" else "yellow"
        nodes = f" on {', '.join(g['nodes'][:4])}" + (" ..." if len(g["nodes"]) > 4 else "") \
            if g["nodes"] else ""
        console.print(f"\n[{colour}]{g['count']}[/] x {escape(g['cause'])}{escape(nodes)}")
        dv = g.get("divergence")
        if dv:
            for side in ("before", "after"):
                h = dv[side]
                console.print(f"  {side:6} {escape(h['at'] or '-')}: "
                              f"{escape(h['rule'] or h['effect'] or '-')}")
        if g["kind"] != "path" or paths:
            for q in g["examples"]:
                console.print(f"    {escape(q)}")
            if g["more"] and not paths:
                console.print(f"    ... and {g['more']} more (--paths lists them)")
    if len(groups) > GROUPS_SHOWN:
        rest = sum(g["count"] for g in groups[GROUPS_SHOWN:])
        console.print(f"\n... {len(groups) - GROUPS_SHOWN} more groups ({rest} questions; "
                      "--paths or -o json lists them)")
    if d["raw_groups"]:
        console.print("\n[bold]Raw changes[/] (used by a traced path first)")
        for r in d["raw_groups"][:RAW_SHOWN]:
            used = "[red]used[/]" if r["used"] else "[dim]unused[/]"
            console.print(f"{used} {escape(r['node'])} {escape(r['component'])}: "
                          f"+{r['added']} -{r['removed']}")
        if len(d["raw_groups"]) > RAW_SHOWN:
            console.print(f"... {len(d['raw_groups']) - RAW_SHOWN} more (--paths lists them)")
    if not paths:
        return
    for c in d["changed"]:
        console.print(f"\n[yellow]{escape(c['question'])}[/]: {c['before_verdict']} -> "
                      f"{c['after_verdict']}")
        dv = c.get("divergence")
        if dv:
            console.print(f"  first divergence: {escape(dv['where'])}")
            for side in ("before", "after"):
                h = dv[side]
                console.print(f"  {side:6} {escape(h['at'] or '-')}: {escape(h['rule'] or h['effect'] or '-')}")
            for side, chosen in (dv.get("choices") or {}).items():
                console.print(f"  {side:6} branch: {escape('; '.join(chosen) or '-')}")
            for line in dv.get("diff", []):
                colour = "red" if line.startswith("-") else "green" if line.startswith("+") else "dim"
                console.print(f"    [{colour}]{escape(line)}[/]")
        for note in c.get("paths", []):
            console.print(f"  - {escape(note)}")
    if d["raw"]:
        console.print("\n[bold]Raw changes[/]")
        for r in d["raw"]:
            used = "[red]used[/]" if r["used"] else "[dim]unused[/]"
            console.print(f"{used} {r['change']} {escape(r['where'])}: {escape(r['text'])}")


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2)
