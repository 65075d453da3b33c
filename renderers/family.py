"""``--family both``: one question walked over IPv4 and over IPv6, side by side.

The summary first says how each family ended, from the typed paths (verdict, disposition,
the hop where a path stopped): ``IPv4 delivered, IPv6 dropped at 1.12 node1 iptables
filter/KUBE-SERVICES``; then each family's trace as the single-family renderers show it. JSON
(docs/trace-json-v1.md, "Both families"): ``{"schema": ..., "family": "both", "comparison":
[...], "traces": {"ipv4": <trace>, "ipv6": <trace>}}``, each trace the v1 document.
"""

from __future__ import annotations

import json

from renderers import walk
from traceflow.model.trace import Verdict

SCHEMA = "traceflow.trace-families/v1"
NAMES = {4: "IPv4", 6: "IPv6"}


def family_outcome(trace) -> dict:
    """How one family's trace ended: verdict, and for the first path that did not arrive,
    where and why (the same hop reference the single-family summary gives)."""
    n = len(trace.paths)
    delivered = [p for p in trace.paths if Verdict(p.verdict) is Verdict.DELIVERED]
    out = {"verdict": trace.verdict.value, "paths": n, "delivered": len(delivered)}
    for index, path in enumerate(trace.paths, 1):
        if Verdict(path.verdict) is Verdict.DELIVERED:
            continue
        stop = walk.stop_hop(path, index)
        out["first_stop"] = {
            "path": index, "outcome": walk.outcome_word(path),
            "disposition": walk.disposition(path),
            "hop": stop.ref if stop is not None else None,
            "node": stop.hop.node if stop is not None else None,
            "where": walk.location(stop.hop) if stop is not None else None,
            "reason": walk.stop_reason(path, stop)}
        break
    return out


def phrase(family: int, outcome: dict) -> str:
    """``IPv4 delivered`` / ``IPv6 dropped at 1.12 node1 iptables filter/KUBE-SERVICES``."""
    name = NAMES[family]
    stop = outcome.get("first_stop")
    if outcome["verdict"] == Verdict.DELIVERED.value or stop is None:
        return f"{name} {outcome['verdict']}"
    at = f" at {stop['hop']} {stop['node']} {stop['where']}" if stop["hop"] else ""
    if outcome["verdict"] == Verdict.PARTIAL.value:
        return (f"{name} partial: {outcome['delivered']} of {outcome['paths']} paths "
                f"delivered, path {stop['path']} {stop['outcome']}{at}")
    return f"{name} {stop['outcome']}{at}"


def summary_lines(comparison) -> list[str]:
    outcomes = {f: family_outcome(t) for f, t in comparison.traces.items()}
    lines = [", ".join(phrase(f, outcomes[f]) for f in (4, 6))]
    for f in (4, 6):
        stop = outcomes[f].get("first_stop")
        if stop is not None and outcomes[f]["verdict"] != Verdict.DELIVERED.value:
            lines.append(f"{NAMES[f]} why: {stop['reason']}")
    if not comparison.differs:
        lines.append("both families end the same way")
    return lines


def comparison_to_dict(comparison) -> dict:
    from renderers.json_out import trace_to_dict
    return {"schema": SCHEMA, "family": "both",
            "verdict": comparison.verdict.value,
            "comparison": summary_lines(comparison),
            "outcomes": {NAMES[f].lower(): family_outcome(t)
                         for f, t in comparison.traces.items()},
            "traces": {NAMES[f].lower(): trace_to_dict(t)
                       for f, t in comparison.traces.items()}}


def render_json(comparison) -> str:
    return json.dumps(comparison_to_dict(comparison), indent=2, ensure_ascii=False)


def render_text(comparison, console, about, verbose: bool = False, wide: bool = False) -> None:
    from renderers.text import render_text as single, render_text_summary
    console.print(f"families: {summary_lines(comparison)[0]}", markup=False, highlight=False)
    for line in summary_lines(comparison)[1:]:
        console.print(f"  {line}", markup=False, highlight=False)
    for f in (4, 6):
        console.print("")
        console.print(f"=== {NAMES[f]} ===", markup=False, highlight=False)
        trace = comparison.traces[f]
        if wide:
            from renderers.table import render_table
            render_text_summary(trace, console, about)
            render_table(trace, console, ascii_only=not console.is_terminal)
        else:
            single(trace, console, about, verbose=verbose)


def render_html(comparison, about) -> str:
    """One page: the comparison, then each family's report (the single-family HTML's body)."""
    import html
    import re
    from renderers.html_out import render_html as single
    pages = {f: single(t, about) for f, t in comparison.traces.items()}
    head = re.search(r"(?s)^(.*?<body[^>]*>)", pages[4])
    start = head.group(1) if head else "<!DOCTYPE html><html><body>"
    parts = [start, "<section class=\"families\"><h1>Both families</h1><ul>"]
    parts += [f"<li>{html.escape(line)}</li>" for line in summary_lines(comparison)]
    parts.append("</ul></section>")
    for f in (4, 6):
        body = re.search(r"(?s)<body[^>]*>(.*)</body>", pages[f])
        parts.append(f"<section class=\"family\" id=\"{NAMES[f].lower()}\"><h1>{NAMES[f]}</h1>")
        parts.append(body.group(1) if body else pages[f])
        parts.append("</section>")
    parts.append("</body></html>\n")
    return "".join(parts)
